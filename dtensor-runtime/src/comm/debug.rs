//! `CommDebugMode`: a scope that records every collective this rank issues.
//!
//! ```
//! use dtensor_runtime::{run, CommDebugMode, CollectiveKind, distribute_tensor, Shard, Replicate};
//! run(2, |ctx| {
//!     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
//!     let t = ndarray::ArrayD::<f32>::zeros(vec![4, 4]);
//!     let dt = distribute_tensor(&t, &mesh, &[Shard(0)], None)?;
//!     let mode = CommDebugMode::new();
//!     let _full = mode.scope(|| dt.redistribute(&[Replicate]))?;
//!     assert_eq!(mode.count(CollectiveKind::AllGather), 1);
//!     Ok(())
//! }).unwrap();
//! ```

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// Kind of a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CollectiveKind {
    AllGather,
    AllReduce,
    ReduceScatter,
    AllToAll,
    Broadcast,
    Scatter,
    Barrier,
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::AllToAll => "all_to_all",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::Scatter => "scatter",
            CollectiveKind::Barrier => "barrier",
        })
    }
}

/// One recorded collective.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectiveRecord {
    pub kind: CollectiveKind,
    /// Name of the mesh dim it ran over (`None`: the whole mesh).
    pub mesh_dim: Option<String>,
    /// Number of ranks in the group.
    pub group_size: usize,
    /// Bytes this rank contributed.
    pub bytes: usize,
    /// The op (or redistribution) that caused it, innermost scope first.
    pub op: String,
}

type Sink = Arc<Mutex<Vec<CollectiveRecord>>>;

thread_local! {
    static SINKS: RefCell<Vec<Sink>> = const { RefCell::new(Vec::new()) };
    static OPS: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn record(kind: CollectiveKind, mesh_dim: Option<String>, group_size: usize, bytes: usize) {
    SINKS.with(|s| {
        let s = s.borrow();
        if s.is_empty() {
            return;
        }
        let op = OPS.with(|o| o.borrow().last().copied().unwrap_or("user"));
        let rec = CollectiveRecord { kind, mesh_dim, group_size, bytes, op: op.to_string() };
        for sink in s.iter() {
            sink.lock().unwrap_or_else(|e| e.into_inner()).push(rec.clone());
        }
    })
}

/// Runs `f` with `name` as the op that collectives issued inside it are attributed to.
pub fn op_scope<R>(name: &'static str, f: impl FnOnce() -> R) -> R {
    OPS.with(|o| o.borrow_mut().push(name));
    struct Pop;
    impl Drop for Pop {
        fn drop(&mut self) {
            OPS.with(|o| {
                o.borrow_mut().pop();
            });
        }
    }
    let _pop = Pop;
    f()
}

/// Records the collectives issued by this rank while a scope is active.
#[derive(Debug, Clone, Default)]
pub struct CommDebugMode {
    sink: Sink,
}

/// Keeps a [`CommDebugMode`] recording until dropped.
#[must_use = "recording stops when the guard is dropped"]
pub struct CommDebugGuard {
    sink: Sink,
}

impl Drop for CommDebugGuard {
    fn drop(&mut self) {
        SINKS.with(|s| s.borrow_mut().retain(|x| !Arc::ptr_eq(x, &self.sink)));
    }
}

impl CommDebugMode {
    /// A new, empty recorder.
    pub fn new() -> Self {
        Self::default()
    }
    /// Starts recording on this rank until the guard drops.
    pub fn enter(&self) -> CommDebugGuard {
        SINKS.with(|s| s.borrow_mut().push(Arc::clone(&self.sink)));
        CommDebugGuard { sink: Arc::clone(&self.sink) }
    }
    /// Records while `f` runs.
    pub fn scope<R>(&self, f: impl FnOnce() -> R) -> R {
        let _g = self.enter();
        f()
    }
    /// Every record so far.
    pub fn records(&self) -> Vec<CollectiveRecord> {
        self.sink.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
    /// Forgets every record.
    pub fn reset(&self) {
        self.sink.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
    /// Number of collectives of `kind`.
    pub fn count(&self, kind: CollectiveKind) -> usize {
        self.records().iter().filter(|r| r.kind == kind).count()
    }
    /// Number of collectives of `kind` over the mesh dim called `mesh_dim`.
    pub fn count_on(&self, kind: CollectiveKind, mesh_dim: &str) -> usize {
        self.records().iter().filter(|r| r.kind == kind && r.mesh_dim.as_deref() == Some(mesh_dim)).count()
    }
    /// Total number of collectives (barriers excluded).
    pub fn total(&self) -> usize {
        self.records().iter().filter(|r| r.kind != CollectiveKind::Barrier).count()
    }
    /// Total bytes this rank contributed.
    pub fn total_bytes(&self) -> usize {
        self.records().iter().map(|r| r.bytes).sum()
    }
    /// Counts and bytes grouped by (kind, mesh dim).
    pub fn by_kind(&self) -> BTreeMap<(CollectiveKind, String), (usize, usize)> {
        let mut m = BTreeMap::new();
        for r in self.records() {
            let e = m.entry((r.kind, r.mesh_dim.clone().unwrap_or_else(|| "*".into()))).or_insert((0, 0));
            e.0 += 1;
            e.1 += r.bytes;
        }
        m
    }
    /// A summary table: one line per (kind, mesh dim, op) with count and bytes.
    pub fn summary(&self) -> String {
        let mut m: BTreeMap<(String, String, String), (usize, usize)> = BTreeMap::new();
        for r in self.records() {
            let key = (r.kind.to_string(), r.mesh_dim.clone().unwrap_or_else(|| "*".into()), r.op.clone());
            let e = m.entry(key).or_insert((0, 0));
            e.0 += 1;
            e.1 += r.bytes;
        }
        let mut out = format!("{:<16} {:<8} {:<24} {:>6} {:>12}\n", "collective", "mesh dim", "op", "count", "bytes");
        for ((k, d, op), (c, b)) in &m {
            out.push_str(&format!("{k:<16} {d:<8} {op:<24} {c:>6} {b:>12}\n"));
        }
        out.push_str(&format!("{:<16} {:<8} {:<24} {:>6} {:>12}\n", "total", "", "", self.total(), self.total_bytes()));
        out
    }
}
