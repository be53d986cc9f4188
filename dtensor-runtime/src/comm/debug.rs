//! `CommDebugMode`: a scope that records every collective this rank issues.
//!
//! Every typed collective on a [`DeviceMesh`](crate::DeviceMesh) reports to the recorders that
//! are active on the calling rank (thread), tagged with the stack of [`op_scope`]s it ran in.
//! That gives PyTorch's `CommDebugMode` views: total and per-kind counts
//! ([`get_total_counts`](CommDebugMode::get_total_counts),
//! [`get_comm_counts`](CommDebugMode::get_comm_counts)), a per-op breakdown, a summary table and
//! a tracing tree, and a JSON dump.
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
//!     assert_eq!(mode.count_on(CollectiveKind::AllGather, "tp"), 1);
//!     assert_eq!(mode.get_comm_counts()[&CollectiveKind::AllGather], 1);
//!     assert_eq!(mode.records()[0].op, "redistribute");
//!     Ok(())
//! }).unwrap();
//! ```

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

/// Kind of a collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CollectiveKind {
    /// All-gather: every rank receives the concatenation of all ranks' buffers.
    AllGather,
    /// All-reduce: every rank receives the reduction of all ranks' buffers.
    AllReduce,
    /// Reduce-scatter: reduce, then each rank keeps its own chunk.
    ReduceScatter,
    /// All-to-all: rank `i` sends its chunk `j` to rank `j`.
    AllToAll,
    /// Broadcast of one root rank's buffer to all ranks.
    Broadcast,
    /// Scatter: the root rank sends chunk `i` to rank `i`.
    Scatter,
    /// Barrier: synchronisation only, no data.
    Barrier,
}

impl CollectiveKind {
    /// Every kind, in display order.
    pub const ALL: [CollectiveKind; 7] = [
        CollectiveKind::AllGather,
        CollectiveKind::AllReduce,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllToAll,
        CollectiveKind::Broadcast,
        CollectiveKind::Scatter,
        CollectiveKind::Barrier,
    ];

    /// The snake-case name PyTorch's c10d uses (`all_gather`, `reduce_scatter`, ...).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::AllToAll => "all_to_all",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::Scatter => "scatter",
            CollectiveKind::Barrier => "barrier",
        }
    }
}

impl fmt::Display for CollectiveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One recorded collective.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectiveRecord {
    /// Which collective ran.
    pub kind: CollectiveKind,
    /// Name of the mesh dim it ran over (`None`: the whole mesh).
    pub mesh_dim: Option<String>,
    /// Number of ranks in the group.
    pub group_size: usize,
    /// Bytes this rank contributed.
    pub bytes: usize,
    /// The op (or redistribution) that caused it: the innermost [`op_scope`], `"user"` outside any.
    pub op: String,
    /// Every enclosing [`op_scope`], outermost first (empty outside any scope).
    pub op_path: Vec<String>,
}

impl CollectiveRecord {
    /// The mesh dim name, or `*` for the whole mesh.
    pub fn mesh_dim_label(&self) -> &str {
        self.mesh_dim.as_deref().unwrap_or("*")
    }
    /// The scope path joined by `/` (`mlp/fc1/redistribute`), `user` outside any scope.
    pub fn op_path_label(&self) -> String {
        if self.op_path.is_empty() {
            "user".to_string()
        } else {
            self.op_path.join("/")
        }
    }
}

type Sink = Arc<Mutex<Vec<CollectiveRecord>>>;
/// Stats per (kind, mesh dim label).
type KindStats = BTreeMap<(CollectiveKind, String), CommStats>;

thread_local! {
    static SINKS: RefCell<Vec<Sink>> = const { RefCell::new(Vec::new()) };
    static OPS: RefCell<Vec<Cow<'static, str>>> = const { RefCell::new(Vec::new()) };
}

pub(crate) fn record(kind: CollectiveKind, mesh_dim: Option<&str>, group_size: usize, bytes: usize) {
    SINKS.with(|s| {
        let s = s.borrow();
        // Nothing records: no allocation on the collective's path.
        if s.is_empty() {
            return;
        }
        let mesh_dim = mesh_dim.map(str::to_string);
        let op_path: Vec<String> = OPS.with(|o| o.borrow().iter().map(|x| x.to_string()).collect());
        let op = op_path.last().cloned().unwrap_or_else(|| "user".to_string());
        let rec = CollectiveRecord { kind, mesh_dim, group_size, bytes, op, op_path };
        for sink in s.iter() {
            lock(sink).push(rec.clone());
        }
    })
}

fn lock(sink: &Sink) -> std::sync::MutexGuard<'_, Vec<CollectiveRecord>> {
    // Records are only ever pushed whole, so a poisoned lock holds consistent data.
    sink.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` with `name` as the op that collectives issued inside it are attributed to.
///
/// Scopes nest: a record keeps the whole stack in [`CollectiveRecord::op_path`] and the
/// innermost name in [`CollectiveRecord::op`]. Names may be static (`"matmul"`) or built at
/// run time (`format!("layers.{i}.mlp")`).
pub fn op_scope<R>(name: impl Into<Cow<'static, str>>, f: impl FnOnce() -> R) -> R {
    OPS.with(|o| o.borrow_mut().push(name.into()));
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
///
/// Each rank (thread) records only its own calls; create one mode per rank inside the
/// closure given to [`run`](crate::run). Several modes may be active at once (nested scopes
/// each see everything issued while they are active).
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

/// Count and bytes of a group of records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommStats {
    /// Number of collectives.
    pub count: usize,
    /// Bytes this rank contributed to them.
    pub bytes: usize,
}

impl CommStats {
    fn add(&mut self, r: &CollectiveRecord) {
        self.count += 1;
        self.bytes += r.bytes;
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
    /// Every record so far, in issue order.
    pub fn records(&self) -> Vec<CollectiveRecord> {
        lock(&self.sink).clone()
    }
    /// Forgets every record.
    pub fn reset(&self) {
        lock(&self.sink).clear();
    }
    /// Number of collectives of `kind`.
    pub fn count(&self, kind: CollectiveKind) -> usize {
        lock(&self.sink).iter().filter(|r| r.kind == kind).count()
    }
    /// Number of collectives of `kind` over the mesh dim called `mesh_dim`.
    pub fn count_on(&self, kind: CollectiveKind, mesh_dim: &str) -> usize {
        lock(&self.sink).iter().filter(|r| r.kind == kind && r.mesh_dim.as_deref() == Some(mesh_dim)).count()
    }
    /// Number of collectives of `kind` attributed to op `op` (innermost scope).
    pub fn count_for_op(&self, kind: CollectiveKind, op: &str) -> usize {
        lock(&self.sink).iter().filter(|r| r.kind == kind && r.op == op).count()
    }
    /// Total number of collectives (barriers excluded).
    pub fn total(&self) -> usize {
        lock(&self.sink).iter().filter(|r| r.kind != CollectiveKind::Barrier).count()
    }
    /// PyTorch's `get_total_counts()`: same as [`total`](Self::total).
    pub fn get_total_counts(&self) -> usize {
        self.total()
    }
    /// PyTorch's `get_comm_counts()`: number of collectives per kind (kinds never issued are absent).
    pub fn get_comm_counts(&self) -> BTreeMap<CollectiveKind, usize> {
        let mut m = BTreeMap::new();
        for r in lock(&self.sink).iter() {
            *m.entry(r.kind).or_insert(0) += 1;
        }
        m
    }
    /// Total bytes this rank contributed.
    pub fn total_bytes(&self) -> usize {
        lock(&self.sink).iter().map(|r| r.bytes).sum()
    }
    /// Counts and bytes grouped by (kind, mesh dim); the whole mesh is `*`.
    pub fn by_kind(&self) -> BTreeMap<(CollectiveKind, String), (usize, usize)> {
        let mut m = BTreeMap::new();
        for r in lock(&self.sink).iter() {
            let e = m.entry((r.kind, r.mesh_dim_label().to_string())).or_insert((0, 0));
            e.0 += 1;
            e.1 += r.bytes;
        }
        m
    }
    /// Per-op breakdown: for each op (innermost scope), count and bytes per collective kind.
    pub fn by_op(&self) -> BTreeMap<String, BTreeMap<CollectiveKind, CommStats>> {
        let mut m: BTreeMap<String, BTreeMap<CollectiveKind, CommStats>> = BTreeMap::new();
        for r in lock(&self.sink).iter() {
            m.entry(r.op.clone()).or_default().entry(r.kind).or_default().add(r);
        }
        m
    }

    /// A summary table: one row per (collective, mesh dim, group size, op scope path) with
    /// count and bytes this rank sent, then a total row (barriers not counted).
    ///
    /// ```text
    /// collective      mesh dim  group  op                         count  bytes
    /// all_gather      dp        2      mlp/fc1/redistribute           1   96 B
    /// all_gather      tp        2      mlp/fc1/redistribute           1   48 B
    /// reduce_scatter  tp        2      mlp/fc2/redistribute           1  192 B
    /// total                                                           3  336 B
    /// ```
    pub fn summary(&self) -> String {
        let mut rows: BTreeMap<(CollectiveKind, String, usize, String), CommStats> = BTreeMap::new();
        for r in lock(&self.sink).iter() {
            rows.entry((r.kind, r.mesh_dim_label().to_string(), r.group_size, r.op_path_label())).or_default().add(r);
        }
        let mut table: Vec<[String; 6]> =
            vec![["collective".into(), "mesh dim".into(), "group".into(), "op".into(), "count".into(), "bytes".into()]];
        for ((k, d, g, op), s) in &rows {
            table.push([
                k.to_string(),
                d.clone(),
                g.to_string(),
                op.clone(),
                s.count.to_string(),
                human_bytes(s.bytes),
            ]);
        }
        table.push([
            "total".into(),
            String::new(),
            String::new(),
            String::new(),
            self.total().to_string(),
            human_bytes(self.total_bytes()),
        ]);
        render_table(&table, &[false, false, false, false, true, true])
    }

    /// The tracing tree (PyTorch's `generate_comm_debug_tracing_table`): every op scope
    /// path, nested by indentation, with the collectives issued directly inside it.
    ///
    /// ```text
    /// user
    ///   all_reduce  *  count 1  64 B
    /// mlp
    ///   matmul
    ///     redistribute
    ///       all_gather  tp  count 1  256 B
    /// ```
    pub fn tracing_table(&self) -> String {
        // Scope paths in first-seen order, each with its own (kind, dim) stats.
        let mut paths: Vec<(Vec<String>, KindStats)> = Vec::new();
        for r in lock(&self.sink).iter() {
            let path = if r.op_path.is_empty() { vec!["user".to_string()] } else { r.op_path.clone() };
            let i = match paths.iter().position(|(p, _)| *p == path) {
                Some(i) => i,
                None => {
                    paths.push((path, BTreeMap::new()));
                    paths.len() - 1
                }
            };
            paths[i].1.entry((r.kind, r.mesh_dim_label().to_string())).or_default().add(r);
        }
        let mut out = String::new();
        let mut printed: Vec<Vec<String>> = Vec::new();
        for (path, stats) in &paths {
            for depth in 0..path.len() {
                let prefix = path[..=depth].to_vec();
                if !printed.contains(&prefix) {
                    out.push_str(&format!("{}{}\n", "  ".repeat(depth), path[depth]));
                    printed.push(prefix);
                }
            }
            for ((k, d), s) in stats {
                out.push_str(&format!(
                    "{}{k}  {d}  count {}  {}\n",
                    "  ".repeat(path.len()),
                    s.count,
                    human_bytes(s.bytes)
                ));
            }
        }
        out
    }

    /// Every record as JSON (PyTorch's `generate_json_dump`), plus the totals:
    /// `{"total_count": n, "total_bytes": b, "comm_counts": {"all_gather": n, ...}, "records": [...]}`.
    pub fn to_json(&self) -> String {
        let records: Vec<serde_json::Value> = lock(&self.sink)
            .iter()
            .map(|r| {
                serde_json::json!({
                    "kind": r.kind.name(),
                    "mesh_dim": r.mesh_dim,
                    "group_size": r.group_size,
                    "bytes": r.bytes,
                    "op": r.op,
                    "op_path": r.op_path,
                })
            })
            .collect();
        let counts: serde_json::Map<String, serde_json::Value> =
            self.get_comm_counts().into_iter().map(|(k, n)| (k.name().to_string(), n.into())).collect();
        serde_json::json!({
            "total_count": self.total(),
            "total_bytes": self.total_bytes(),
            "comm_counts": counts,
            "records": records,
        })
        .to_string()
    }
}

impl fmt::Display for CommDebugMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary())
    }
}

/// `1234567` → `1.18 MiB`; below 1 KiB, exact bytes.
pub fn human_bytes(b: usize) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if b < 1024 {
        return format!("{b} B");
    }
    let mut v = b as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", UNITS[u])
}

/// Left/right aligned columns separated by two spaces; `right[i]` right-aligns column `i`.
fn render_table<const N: usize>(rows: &[[String; N]], right: &[bool; N]) -> String {
    let mut w = [0usize; N];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .enumerate()
            .map(
                |(i, c)| {
                    if right[i] {
                        format!("{c:>width$}", width = w[i])
                    } else {
                        format!("{c:<width$}", width = w[i])
                    }
                },
            )
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_only_while_entered_and_keeps_op_path() {
        let mode = CommDebugMode::new();
        record(CollectiveKind::AllReduce, None, 4, 8);
        assert!(mode.records().is_empty());
        mode.scope(|| {
            record(CollectiveKind::AllReduce, None, 4, 8);
            op_scope("mlp", || {
                op_scope(format!("layer{}", 1), || record(CollectiveKind::AllGather, Some("tp"), 2, 16))
            });
        });
        record(CollectiveKind::AllReduce, None, 4, 8);
        let r = mode.records();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].op, "user");
        assert!(r[0].op_path.is_empty());
        assert_eq!(r[1].op, "layer1");
        assert_eq!(r[1].op_path, vec!["mlp".to_string(), "layer1".to_string()]);
        assert_eq!(mode.get_total_counts(), 2);
        assert_eq!(mode.total_bytes(), 24);
        assert_eq!(mode.count_for_op(CollectiveKind::AllGather, "layer1"), 1);
        let by_op = mode.by_op();
        assert_eq!(by_op["layer1"][&CollectiveKind::AllGather], CommStats { count: 1, bytes: 16 });
        let tree = mode.tracing_table();
        assert_eq!(tree, "user\n  all_reduce  *  count 1  8 B\nmlp\n  layer1\n    all_gather  tp  count 1  16 B\n");
        let json: serde_json::Value = serde_json::from_str(&mode.to_json()).unwrap();
        assert_eq!(json["total_count"], 2);
        assert_eq!(json["comm_counts"]["all_gather"], 1);
        assert_eq!(json["records"][1]["op_path"][0], "mlp");
    }

    #[test]
    fn barrier_is_counted_per_kind_but_not_in_total() {
        let mode = CommDebugMode::new();
        mode.scope(|| record(CollectiveKind::Barrier, None, 2, 0));
        assert_eq!(mode.total(), 0);
        assert_eq!(mode.get_comm_counts()[&CollectiveKind::Barrier], 1);
    }

    #[test]
    fn human_bytes_units() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1024), "1.00 KiB");
        assert_eq!(human_bytes(3 * 1024 * 1024 / 2), "1.50 MiB");
    }
}
