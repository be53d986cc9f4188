//! The collective fingerprint check: PyTorch's `TORCH_DISTRIBUTED_DEBUG=DETAIL`, in a
//! stronger form.
//!
//! When it is on, every typed collective on a [`DeviceMesh`](crate::DeviceMesh) first
//! all-gathers a fingerprint of the call over its group — (sequence number on that group,
//! kind, group, element type, element count, root, reduce op) — and every member compares all
//! of them. Members that issued different collectives (swapped order with equal sizes,
//! different roots, reduce ops or placements) all get [`Error::CollectiveMismatch`] naming the
//! field and both calls, instead of silently diverging. The exchange goes through the same
//! [`Communicator`], so it works on every backend (threads, MPI, NCCL staged through the host);
//! it costs one small all-gather per collective.
//!
//! Switch it on with `DTENSOR_DEBUG=detail` (read when a mesh is created) or per mesh with
//! [`DeviceMesh::set_collective_checks`](crate::DeviceMesh::set_collective_checks); every
//! rank must use the same setting.
//!
//! ```
//! use dtensor_runtime::{run, Along, Error};
//! let err = run(2, |ctx| {
//!     let mesh = ctx.init_device_mesh(&[2], &["x"])?;
//!     mesh.set_collective_checks(true);
//!     let mut buf = [1.0f32; 4];
//!     // Both ranks broadcast 4 floats, but from different roots.
//!     mesh.broadcast(Along::Dim(0), &mut buf, ctx.rank())
//! })
//! .unwrap_err();
//! assert!(matches!(err, Error::CollectiveMismatch { ref field, .. } if field == "root"), "{err}");
//! ```

use super::debug::CollectiveKind;
use super::Communicator;
use crate::error::{Error, Result};
use crate::placement::ReduceOp;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// The environment variable that switches the check on for new meshes (value `detail`).
pub const DEBUG_ENV: &str = "DTENSOR_DEBUG";

/// Whether `DTENSOR_DEBUG=detail` is set (read once per process).
pub fn enabled_by_env() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var(DEBUG_ENV).is_ok_and(|v| v.trim().eq_ignore_ascii_case("detail")))
}

/// Sequence numbers of checked collectives, per group, of one communicator.
#[derive(Debug, Default)]
pub struct Sequences(Mutex<HashMap<Vec<usize>, u64>>);

impl Sequences {
    /// The next sequence number on `group` (0, 1, 2, ...).
    pub fn next(&self, group: &[usize]) -> u64 {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = m.get_mut(group) {
            *s += 1;
            return *s;
        }
        m.insert(group.to_vec(), 0);
        0
    }
}

/// What one member says about the collective it is entering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint {
    /// Which collective on this group it is, counted by this member (0 when the backend keeps
    /// no count).
    pub seq: u64,
    /// Which collective this member is entering.
    pub kind: CollectiveKind,
    /// Element type name (`f32`, `f64`, `u64`; empty for a barrier).
    pub dtype: &'static str,
    /// Elements this member contributes.
    pub count: usize,
    /// Root rank of a broadcast or scatter (`None` for rootless collectives).
    pub root: Option<usize>,
    /// Reduction of a reducing collective (`None` for the others).
    pub op: Option<ReduceOp>,
}

const DTYPES: [&str; 4] = ["", "f32", "f64", "u64"];
const OPS: [ReduceOp; 5] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product];
/// Field names of the encoded words, in order.
const FIELDS: [&str; 8] =
    ["version", "sequence number", "kind", "group", "dtype", "element count", "root", "reduce op"];
const VERSION: u64 = 0x6474_6670_0001;

/// FNV-1a over the group's ranks: members that meet on one slot but name the group
/// differently (reordered) disagree here.
fn group_hash(group: &[usize]) -> u64 {
    group
        .iter()
        .flat_map(|r| (*r as u64).to_le_bytes())
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

impl Fingerprint {
    fn encode(&self, group: &[usize]) -> [u64; 8] {
        let kind = CollectiveKind::ALL.iter().position(|&k| k == self.kind).unwrap_or(0);
        let dtype = DTYPES.iter().position(|&d| d == self.dtype).unwrap_or(0);
        let op = self.op.and_then(|o| OPS.iter().position(|&x| x == o)).map_or(0, |i| i + 1);
        [
            VERSION,
            self.seq,
            kind as u64,
            group_hash(group),
            dtype as u64,
            self.count as u64,
            self.root.map_or(0, |r| r as u64 + 1),
            op as u64,
        ]
    }
}

/// `all_gather(words)`: a human description of one member's encoded fingerprint.
fn describe(w: &[u64]) -> String {
    let kind = CollectiveKind::ALL.get(w[2] as usize).map_or("?", |k| k.name());
    let mut s = format!("{kind} #{} ({} x {}", w[1], w[5], DTYPES.get(w[4] as usize).copied().unwrap_or("?"));
    if w[6] > 0 {
        s.push_str(&format!(", root {}", w[6] - 1));
    }
    if let Some(op) = (w[7] as usize).checked_sub(1).and_then(|i| OPS.get(i)) {
        s.push_str(&format!(", op {op}"));
    }
    s.push(')');
    s
}

/// Exchanges `fp` over `group` and fails on every member when any two members differ.
pub(crate) fn agree(comm: &dyn Communicator, group: &[usize], fp: Fingerprint) -> Result<()> {
    let mine = fp.encode(group);
    let mut all = vec![0u64; mine.len() * group.len()];
    comm.all_gather(group, bytemuck::cast_slice(&mine), bytemuck::cast_slice_mut::<_, u8>(&mut all).into())?;
    let words: Vec<&[u64]> = all.chunks(mine.len()).collect();
    for (f, field) in FIELDS.iter().enumerate() {
        if let Some(i) = words.iter().position(|w| w[f] != words[0][f]) {
            return Err(Error::CollectiveMismatch {
                rank: comm.rank(),
                group: group.to_vec(),
                field: (*field).into(),
                detail: format!(
                    "rank {} issued {} while rank {} issued {}",
                    group[i],
                    describe(words[i]),
                    group[0],
                    describe(words[0])
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_count_per_group() {
        let s = Sequences::default();
        assert_eq!((s.next(&[0, 1]), s.next(&[0, 1]), s.next(&[1, 0]), s.next(&[0, 1])), (0, 1, 0, 2));
    }

    #[test]
    fn encoding_describes_every_field() {
        let fp = Fingerprint {
            seq: 3,
            kind: CollectiveKind::Broadcast,
            dtype: "f32",
            count: 4,
            root: Some(1),
            op: Some(ReduceOp::Max),
        };
        let w = fp.encode(&[0, 1]);
        assert_eq!(describe(&w), "broadcast #3 (4 x f32, root 1, op max)");
        assert_ne!(w[3], fp.encode(&[1, 0])[3]);
        assert_eq!(describe(&Fingerprint { root: None, op: None, ..fp }.encode(&[0])), "broadcast #3 (4 x f32)");
    }
}
