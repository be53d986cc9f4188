//! A directory of training-state versions, saved in the background and committed atomically.
//!
//! ```text
//! root/
//!   LATEST                         the committed version's directory name (replaced atomically)
//!   step-0000000300-<nonce>/       a version: shard files, index.json, train_state.json
//!   step-0000000600-<nonce>/       a save running (or killed): no train_state.json yet
//! ```
//!
//! A save writes a new version directory; every rank writes its own shard file there and then
//! a marker (`rank-RRRRR.done`, or `rank-RRRRR.failed` with the error). The first rank waits
//! for every marker, writes `index.json` and `train_state.json`, and commits by replacing
//! `LATEST` (a synced temporary file renamed over it). A process killed at any point leaves
//! `LATEST` naming the previous version, complete; the next commit removes the leftovers.
//!
//! The markers are files, not messages, so the background writers never use the mesh's
//! communicator, which the training loop keeps using meanwhile (the ranks of one checkpoint
//! share its filesystem anyway: every rank's files go into one directory).

use super::safe_file::{is_plain_name, write_atomic, SafeDir};
use super::snapshot::Snapshot;
use super::train_state::{load_train_state, Restore, Restored, TrainState, TrainStateMeta, STATE_FILE};
use crate::element::Element;
use crate::error::{Error, Result};
use crate::mesh::{Along, DeviceMesh};
use crate::module::Module;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Name of the file in a checkpoint root naming the committed version.
pub const LATEST_FILE: &str = "LATEST";

/// Longest `LATEST` file read (a directory name).
const MAX_LATEST_BYTES: u64 = 4096;

/// Longest failure marker read (an error message).
const MAX_MARKER_BYTES: u64 = 64 << 10;

/// Written by the first rank into a version directory whose commit failed, with the reason;
/// the other ranks' writers stop waiting for the commit when they see it.
const COMMIT_FAILED: &str = "commit.failed";

/// Default of [`Checkpointer::timeout`].
pub const DEFAULT_SAVE_TIMEOUT: Duration = Duration::from_secs(600);

fn ck_err(path: &Path, reason: impl Into<String>) -> Error {
    Error::Checkpoint { path: path.display().to_string(), reason: reason.into() }
}

fn marker(rank: usize, ok: bool) -> String {
    format!("rank-{rank:05}.{}", if ok { "done" } else { "failed" })
}

/// A save in flight on this rank.
struct Pending {
    version: PathBuf,
    mesh: DeviceMesh,
    /// The writer, or why it could not start.
    thread: Result<JoinHandle<Result<()>>>,
}

/// How long each part of the last save took on this rank.
#[derive(Debug, Clone, Copy, Default)]
pub struct SaveTimes {
    /// Time the training loop was blocked: waiting for the previous save, reducing Partial
    /// tensors and copying this rank's blocks.
    pub blocking: Duration,
    /// Bytes of tensor data this rank copied and writes.
    pub bytes: usize,
}

/// Saves training states into a root directory, in the background, keeping the last committed
/// one loadable at every moment (see the module docs). Make one per rank, with the same root;
/// one training job per root.
///
/// ```
/// use dtensor_runtime::checkpoint::{Checkpointer, Restore, TrainState};
/// use dtensor_runtime::module::{distribute_module, Linear};
/// use dtensor_runtime::optim::AdamW;
/// let dir = tempfile::tempdir().unwrap();
/// dtensor_runtime::run(2, |ctx| {
///     let mesh = ctx.init_device_mesh(&[2], &["dp"])?;
///     let lin = distribute_module(Linear::<f64>::new(4, 2, true)?, &mesh, None, None, None)?;
///     let opt = AdamW::<f64>::new(1e-3);
///     let mut ck = Checkpointer::new(dir.path());
///     ck.save_async(TrainState::new(&lin, 10).optimizer(&opt))?; // returns once copied
///     // ... training goes on ...
///     ck.wait()?; // collective: every rank learns whether the save committed
///     let mut lin2 = distribute_module(Linear::<f64>::new(4, 2, true)?, &mesh, None, None, None)?;
///     let mut opt2 = AdamW::<f64>::new(1.0);
///     let r = ck.load(Restore::new(&mut lin2).optimizer(&mut opt2))?.expect("a committed state");
///     assert_eq!((r.step, opt2.lr), (10, 1e-3));
///     Ok(())
/// }).unwrap();
/// ```
pub struct Checkpointer {
    root: PathBuf,
    keep: Option<usize>,
    sync: bool,
    timeout: Duration,
    pending: Option<Pending>,
    last: SaveTimes,
}

impl Checkpointer {
    /// A checkpointer of `root` (created at the first save). Keeps every committed version
    /// unless [`keep_last`](Self::keep_last).
    pub fn new(root: impl AsRef<Path>) -> Checkpointer {
        Checkpointer {
            root: root.as_ref().to_path_buf(),
            keep: None,
            sync: true,
            timeout: DEFAULT_SAVE_TIMEOUT,
            pending: None,
            last: SaveTimes::default(),
        }
    }

    /// Keeps only the `n` (≥ 1) most recently committed versions: each commit removes older
    /// ones (by commit time, not step number, so a run restarted from an earlier step keeps
    /// its own newest versions).
    pub fn keep_last(mut self, n: usize) -> Self {
        self.keep = Some(n.max(1));
        self
    }

    /// Whether files are synced to the disk before the commit (default on: a commit then
    /// survives a power loss, not only a killed process). Off is faster on slow disks.
    pub fn sync_files(mut self, on: bool) -> Self {
        self.sync = on;
        self
    }

    /// How long a save's writers wait for each other (the first rank for every rank's files,
    /// the others for the commit) before the save fails: default [`DEFAULT_SAVE_TIMEOUT`],
    /// longer than a collective's because one rank may write far more than the others (a
    /// replicated tensor is written by the first replica alone).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Timings of the last save on this rank.
    pub fn last_save(&self) -> SaveTimes {
        self.last
    }

    /// Saves `state` and waits until it is committed: [`save_async`](Self::save_async), then
    /// [`wait`](Self::wait). Returns the version directory.
    pub fn save<T: Element>(&mut self, state: TrainState<'_, T>) -> Result<PathBuf> {
        self.save_async(state)?;
        Ok(self.wait()?.expect("a save was started"))
    }

    /// Starts saving `state`: waits for the previous save ([`wait`](Self::wait), whose error
    /// it returns), reduces Partial tensors, copies this rank's blocks (the only part that
    /// blocks training: a later update of the model cannot change what is saved) and writes
    /// them on a background thread, which on the first rank of the mesh also commits the
    /// version once every rank has written.
    ///
    /// Collective: every rank of the model's mesh calls it with the same state layout. The
    /// ranks agree before any file is written: when one rank cannot take its copy, every rank
    /// returns an error and nothing is saved.
    pub fn save_async<T: Element>(&mut self, state: TrainState<'_, T>) -> Result<()> {
        let start = Instant::now();
        self.wait()?;
        let mesh = state.mesh()?.clone();
        // A fresh directory name every rank agrees on (the first rank's clock and process).
        let mut nonce = [0u64];
        if mesh.rank() == mesh.ranks()[0] {
            let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            nonce[0] = (t.as_nanos() as u64) ^ (u64::from(std::process::id()) << 40);
        }
        mesh.broadcast_u64(Along::All, &mut nonce, 0)?;
        let name = format!("step-{:010}-{:016x}", state.step(), nonce[0]);
        let version = self.root.join(&name);
        // Collectives first (every rank in the same order), then what may fail on one rank.
        let reduced = state.reduce_partials()?;
        let local = std::fs::create_dir_all(&version)
            .map_err(|e| ck_err(&version, format!("cannot create: {e}")))
            .and_then(|()| state.snapshot(&reduced));
        let flags = mesh.all_gather_u64(Along::All, &[u64::from(local.is_err())])?;
        let (snap, meta) = local?;
        let failed = failed_ranks(&mesh, &flags);
        if !failed.is_empty() {
            return Err(ck_err(&version, format!("nothing saved: rank(s) {failed:?} could not copy their part")));
        }
        self.last = SaveTimes { blocking: Duration::ZERO, bytes: snap.bytes() };
        let leader = mesh.rank() == mesh.ranks()[0];
        let job = Job {
            root: self.root.clone(),
            version: version.clone(),
            name,
            ranks: mesh.ranks().to_vec(),
            rank: mesh.rank(),
            keep: self.keep,
            sync: self.sync,
            timeout: self.timeout,
        };
        let (rank, marker_at) = (mesh.rank(), version.join(marker(mesh.rank(), false)));
        let thread = std::thread::Builder::new()
            .name(format!("dtensor-save-{rank}"))
            .spawn(move || job.run(snap, leader.then_some(meta)))
            .map_err(|e| {
                let e = ck_err(&version, format!("cannot start the writer thread: {e}"));
                // The first rank stops waiting for this rank's files when it sees this.
                let _ = write_atomic(&marker_at, |f| f.write_all(e.to_string().as_bytes()));
                e
            });
        self.pending = Some(Pending { version, mesh, thread });
        self.last.blocking = start.elapsed();
        Ok(())
    }

    /// Waits for the save in flight, if any, and returns its version directory once it is
    /// committed (`None` without a save in flight).
    ///
    /// Collective over the saved model's mesh: the ranks exchange how their part went, so every
    /// rank returns an error when any rank failed (its own error, or one naming the ranks
    /// that failed). A failed save is not committed: `LATEST` still names the previous
    /// version.
    pub fn wait(&mut self) -> Result<Option<PathBuf>> {
        let Some(p) = self.pending.take() else { return Ok(None) };
        // Every rank's writer returns once the commit is done or has failed (or after the
        // timeout), so the exchange below does not wait on the first rank's writing.
        let mine = match p.thread {
            Ok(h) => h.join().unwrap_or_else(|_| Err(ck_err(&p.version, "the writer thread panicked"))),
            Err(e) => Err(e),
        };
        let all = p.mesh.all_gather_u64(Along::All, &[u64::from(mine.is_err())])?;
        mine?;
        let failed = failed_ranks(&p.mesh, &all);
        if !failed.is_empty() {
            return Err(ck_err(
                &p.version,
                format!("the save was not committed: rank(s) {failed:?} failed (their errors say why)"),
            ));
        }
        Ok(Some(p.version))
    }

    /// The committed version directory, if any.
    pub fn latest(&self) -> Result<Option<PathBuf>> {
        latest_version(&self.root)
    }

    /// Loads the committed version into `into` (see [`load_train_state`]); `None` when the
    /// root holds no committed version yet.
    pub fn load<T: Element, M: Module<T> + ?Sized>(&self, into: Restore<'_, T, M>) -> Result<Option<Restored>> {
        match self.latest()? {
            None => Ok(None),
            Some(dir) => load_train_state(dir, into).map(Some),
        }
    }
}

impl Drop for Checkpointer {
    /// Lets a save in flight finish writing (without the collective check of `wait`), so a
    /// program that ends without `wait` still commits it when every rank has written.
    fn drop(&mut self) {
        if let Some(Pending { thread: Ok(h), .. }) = self.pending.take() {
            let _ = h.join();
        }
    }
}

/// The global ranks of `mesh` whose flag in `flags` (one per rank, mesh order) is set.
fn failed_ranks(mesh: &DeviceMesh, flags: &[u64]) -> Vec<usize> {
    mesh.ranks().iter().zip(flags).filter(|(_, &f)| f != 0).map(|(&r, _)| r).collect()
}

/// The committed version directory of checkpoint root `root` (`None`: no `LATEST` yet).
///
/// `LATEST` must name a version directory (`step-<step>-<nonce>`) that is a directory of the
/// root itself, not a link; anything else, or a `LATEST` that cannot be read, is an error
/// (never `None`, which would restart a run from scratch).
pub fn latest_version(root: impl AsRef<Path>) -> Result<Option<PathBuf>> {
    let root = root.as_ref();
    let latest = root.join(LATEST_FILE);
    match std::fs::symlink_metadata(&latest) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(ck_err(&latest, format!("cannot read: {e}"))),
        Ok(_) => {}
    }
    let mut f = SafeDir::new(root)?.open(LATEST_FILE)?;
    let text = f.read_all(MAX_LATEST_BYTES)?;
    let name = std::str::from_utf8(&text).map(str::trim).unwrap_or("");
    let is_version = is_plain_name(name)
        && version_step(name).is_some()
        && std::fs::symlink_metadata(root.join(name)).is_ok_and(|m| m.file_type().is_dir());
    if !is_version {
        return Err(ck_err(&latest, format!("does not name a version directory of the root: {name:?}")));
    }
    Ok(Some(root.join(name)))
}

/// The text of a small marker file in `dir` (read under the safe-file rules, capped).
fn read_marker(dir: &Path, name: &str) -> String {
    let read = || -> Result<String> {
        let bytes = SafeDir::new(dir)?.open(name)?.read_all(MAX_MARKER_BYTES)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    read().unwrap_or_else(|e| format!("(its marker cannot be read: {e})"))
}

/// What a rank's writer thread does.
struct Job {
    root: PathBuf,
    version: PathBuf,
    name: String,
    ranks: Vec<usize>,
    rank: usize,
    keep: Option<usize>,
    sync: bool,
    timeout: Duration,
}

impl Job {
    fn run(self, snap: Snapshot, meta: Option<TrainStateMeta>) -> Result<()> {
        let wrote = snap.write_mine(&self.version, self.sync);
        let text = match &wrote {
            Ok(_) => String::new(),
            Err(e) => e.to_string(),
        };
        write_atomic(&self.version.join(marker(self.rank, wrote.is_ok())), |f| f.write_all(text.as_bytes()))?;
        wrote?;
        match meta {
            Some(meta) => {
                let r = self.commit(&snap, &meta);
                if let Err(e) = &r {
                    // The other ranks' writers are waiting for the outcome.
                    let _ = write_atomic(&self.version.join(COMMIT_FAILED), |f| f.write_all(e.to_string().as_bytes()));
                }
                r
            }
            None => self.await_commit(),
        }
    }

    /// On the other ranks: waits until `LATEST` names this version (committed) or the first
    /// rank says the commit failed.
    fn await_commit(&self) -> Result<()> {
        let deadline = crate::comm::timeout::deadline(self.timeout);
        loop {
            if self.version.join(COMMIT_FAILED).exists() {
                let why = read_marker(&self.version, COMMIT_FAILED);
                return Err(ck_err(&self.version, format!("the first rank could not commit the save: {why}")));
            }
            if latest_version(&self.root).ok().flatten().is_some_and(|v| v == self.version) {
                return Ok(());
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Err(ck_err(
                    &self.version,
                    format!("the first rank did not commit the save within {:?}", self.timeout),
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// On the first rank: waits for every rank's marker, writes the index and the state, then
    /// replaces `LATEST`.
    fn commit(&self, snap: &Snapshot, meta: &TrainStateMeta) -> Result<()> {
        let deadline = crate::comm::timeout::deadline(self.timeout);
        let mut waiting: Vec<usize> = self.ranks.clone();
        while !waiting.is_empty() {
            for &r in &waiting {
                let failed = self.version.join(marker(r, false));
                if failed.exists() {
                    let why = read_marker(&self.version, &marker(r, false));
                    return Err(ck_err(&self.version, format!("rank {r} could not write its shards: {why}")));
                }
            }
            waiting.retain(|&r| !self.version.join(marker(r, true)).exists());
            if waiting.is_empty() {
                break;
            }
            if deadline.is_some_and(|d| Instant::now() > d) {
                return Err(ck_err(
                    &self.version,
                    format!("rank(s) {waiting:?} did not finish writing within {:?}; not committed", self.timeout),
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        snap.index().write(&self.version)?;
        let path = self.version.join(STATE_FILE);
        let text = serde_json::to_vec_pretty(meta).map_err(|e| ck_err(&path, format!("cannot encode: {e}")))?;
        write_atomic(&path, |f| f.write_all(&text))?;
        for &r in &self.ranks {
            let _ = std::fs::remove_file(self.version.join(marker(r, true)));
        }
        if self.sync {
            // The version's files and its entry in the root reach the disk before `LATEST`
            // can name it.
            sync_dir(&self.version)?;
            sync_dir(&self.root)?;
        }
        write_atomic(&self.root.join(LATEST_FILE), |f| writeln!(f, "{}", self.name))?;
        if self.sync {
            // Committed (every reader now sees the version); this only makes the rename
            // durable, so a failure here is not a failed save.
            let _ = sync_dir(&self.root);
        }
        self.collect_garbage();
        Ok(())
    }

    /// Removes the version directories that are not committed (interrupted saves), the
    /// temporary files of an interrupted commit and, with `keep`, the committed versions older
    /// (by commit time) than the `keep` newest. Best effort: what cannot be removed stays.
    fn collect_garbage(&self) {
        let Ok(entries) = std::fs::read_dir(&self.root) else { return };
        let mut committed: Vec<(std::time::SystemTime, String)> = Vec::new();
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
            if !is_dir && name.starts_with(&format!(".{LATEST_FILE}.")) && name.ends_with(".tmp") {
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            if version_step(&name).is_none() || name == self.name || !is_dir {
                continue;
            }
            match std::fs::metadata(e.path().join(STATE_FILE)).and_then(|m| m.modified()) {
                Ok(at) => committed.push((at, name)),
                Err(_) => {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        if let Some(keep) = self.keep {
            committed.sort();
            let drop = committed.len().saturating_sub(keep - 1);
            for (_, name) in &committed[..drop] {
                let _ = std::fs::remove_dir_all(self.root.join(name));
            }
        }
    }
}

/// The step of a version directory name (`step-<step>-<nonce>`), `None` for other names.
fn version_step(name: &str) -> Option<u64> {
    let rest = name.strip_prefix("step-")?;
    let (step, nonce) = rest.split_once('-')?;
    (nonce.len() == 16 && nonce.bytes().all(|b| b.is_ascii_hexdigit())).then_some(())?;
    step.parse().ok()
}

/// Syncs a directory's entries (its renames) to the disk.
fn sync_dir(dir: &Path) -> Result<()> {
    #[cfg(unix)]
    {
        let f = std::fs::File::open(dir).map_err(|e| ck_err(dir, format!("cannot open to sync: {e}")))?;
        f.sync_all().map_err(|e| ck_err(dir, format!("cannot sync: {e}")))?;
    }
    #[cfg(not(unix))]
    let _ = dir;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::train_state::{STATE_FORMAT, STATE_VERSION};

    fn job(root: &Path, timeout: Duration) -> Job {
        let name = "step-0000000001-00000000000000aa".to_string();
        let version = root.join(&name);
        std::fs::create_dir_all(&version).unwrap();
        Job { root: root.to_path_buf(), version, name, ranks: vec![0, 1], rank: 0, keep: None, sync: false, timeout }
    }

    fn meta() -> TrainStateMeta {
        TrainStateMeta {
            format: STATE_FORMAT.into(),
            version: STATE_VERSION,
            step: 1,
            dtype: "F32".into(),
            parameters: vec![],
            buffers: vec![],
            optimizer: None,
            scaler: None,
            rng: None,
            extra: None,
        }
    }

    /// A rank whose writer failed: the first rank does not commit and says which rank and why.
    #[test]
    fn a_failed_rank_stops_the_commit() {
        let root = tempfile::tempdir().unwrap();
        let j = job(root.path(), Duration::from_secs(10));
        std::fs::write(j.version.join(marker(0, true)), b"").unwrap();
        std::fs::write(j.version.join(marker(1, false)), b"disk full").unwrap();
        let snap = Snapshot::new(&crate::local_mesh());
        let e = j.commit(&snap, &meta()).unwrap_err().to_string();
        assert!(e.contains("rank 1 could not write its shards: disk full"), "{e}");
        assert!(latest_version(root.path()).unwrap().is_none(), "nothing committed");
    }

    /// A rank that never finishes (its process died): the commit gives up after the timeout.
    #[test]
    fn a_silent_rank_times_out() {
        let root = tempfile::tempdir().unwrap();
        let j = job(root.path(), Duration::from_millis(50));
        std::fs::write(j.version.join(marker(0, true)), b"").unwrap();
        let snap = Snapshot::new(&crate::local_mesh());
        let e = j.commit(&snap, &meta()).unwrap_err().to_string();
        assert!(e.contains("rank(s) [1] did not finish writing"), "{e}");
        assert!(latest_version(root.path()).unwrap().is_none(), "nothing committed");
        // Once it has, the commit goes through and names the version.
        std::fs::write(j.version.join(marker(1, true)), b"").unwrap();
        j.commit(&snap, &meta()).unwrap();
        assert_eq!(latest_version(root.path()).unwrap(), Some(j.version.clone()));
        assert!(j.version.join(STATE_FILE).exists());
    }

    #[test]
    fn version_names() {
        assert_eq!(version_step("step-0000000042-0123456789abcdef"), Some(42));
        for other in ["step-42", "step-x-0123456789abcdef", "LATEST", "step-1-0123"] {
            assert_eq!(version_step(other), None, "{other}");
        }
    }
}
