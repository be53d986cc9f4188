//! The collective fingerprint check: PyTorch's `TORCH_DISTRIBUTED_DEBUG=DETAIL`, in a
//! stronger form.
//!
//! When it is on, every typed collective on a [`DeviceMesh`](crate::DeviceMesh) first
//! all-gathers a fingerprint of the call over its group — (sequence number on that group,
//! kind, group, element type, element count, root, reduce op, and a hash of the further
//! arguments that must agree: the per-member counts of a variable-size collective, what each
//! gradient bucket of an overlapped backward holds) — and every member compares all of them.
//! Members that issued different collectives (swapped order with equal sizes, different
//! roots, reduce ops, element types — every [`DType`] is told apart — counts or
//! placements) all get [`Error::CollectiveMismatch`] naming the field and both calls, instead
//! of silently diverging. The exchange goes through the same [`Communicator`], so it works on
//! every backend (threads, MPI, NCCL staged through the host); it costs one small all-gather
//! per collective.
//!
//! The check is what makes NCCL collectives safe against disagreeing arguments: the thread
//! and MPI backends compare sizes, counts, element types, reductions and roots themselves
//! before any data moves, NCCL does not (members that disagree there hang until the timeout
//! or corrupt data).
//!
//! Switch it on with `DTENSOR_DEBUG=detail` (read when a mesh is created; `off` and `info`
//! leave it off, any other value is an [`Error::InvalidArgument`]) or per mesh with
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

use super::check::REDUCE_OPS;
use super::debug::CollectiveKind;
use super::Communicator;
use crate::element::DType;
use crate::error::{Error, Result};
use crate::placement::ReduceOp;
use std::collections::HashMap;
use std::sync::Mutex;

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
    /// Element type name: a [`DType`] name (every one of [`DType::ALL`]), `u64` for metadata,
    /// empty for a barrier.
    pub dtype: &'static str,
    /// Elements this member contributes.
    pub count: usize,
    /// Root rank of a broadcast or scatter (`None` for rootless collectives).
    pub root: Option<usize>,
    /// Reduction of a reducing collective (`None` for the others).
    pub op: Option<ReduceOp>,
    /// A hash ([`hash_words`]) of the further arguments every member must pass alike: the
    /// per-member counts of `all_gather_v` / `reduce_scatter_v`, the layout of a gradient
    /// bucket (see [`BackwardOptions::overlap_grad_reduce`](crate::autograd::BackwardOptions::overlap_grad_reduce));
    /// 0 when there are none.
    pub detail: u64,
}

/// Field names of the encoded words, in order.
const FIELDS: [&str; 9] =
    ["version", "sequence number", "kind", "group", "dtype", "element count", "root", "reduce op", "arguments"];
const VERSION: u64 = 0x6474_6670_0002;

/// The element type names a fingerprint tells apart, in encoding order: none (a barrier),
/// metadata words, then every [`DType`].
fn dtype_names() -> impl Iterator<Item = &'static str> {
    ["", "u64"].into_iter().chain(DType::ALL.iter().map(|d| d.name()))
}

/// Encoding of an element type name: its index among [`dtype_names`], or (a name outside
/// them, which the runtime never passes) a hash of the name with the top bit set, so that two
/// different names never share a code.
fn dtype_code(name: &str) -> u64 {
    match dtype_names().position(|d| d == name) {
        Some(i) => i as u64,
        None => hash_words(name.bytes().map(u64::from)) | 1 << 63,
    }
}

/// FNV-1a over 64-bit words: the group's ranks (members that meet on one slot but name the
/// group differently, reordered, disagree here) and [`Fingerprint::detail`].
pub fn hash_words(words: impl IntoIterator<Item = u64>) -> u64 {
    words
        .into_iter()
        .flat_map(u64::to_le_bytes)
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

fn group_hash(group: &[usize]) -> u64 {
    hash_words(group.iter().map(|&r| r as u64))
}

impl Fingerprint {
    fn encode(&self, group: &[usize]) -> [u64; 9] {
        let kind = CollectiveKind::ALL.iter().position(|&k| k == self.kind).unwrap_or(0);
        let op = self.op.and_then(|o| REDUCE_OPS.iter().position(|&x| x == o)).map_or(0, |i| i + 1);
        [
            VERSION,
            self.seq,
            kind as u64,
            group_hash(group),
            dtype_code(self.dtype),
            self.count as u64,
            self.root.map_or(0, |r| (r as u64).saturating_add(1)),
            op as u64,
            self.detail,
        ]
    }
}

/// `all_gather(words)`: a human description of one member's encoded fingerprint.
fn describe(w: &[u64]) -> String {
    let kind = CollectiveKind::ALL.get(w[2] as usize).map_or("?", |k| k.name());
    let dtype = usize::try_from(w[4]).ok().and_then(|i| dtype_names().nth(i)).unwrap_or("?");
    let mut s = format!("{kind} #{} ({} x {dtype}", w[1], w[5]);
    if w[6] > 0 {
        s.push_str(&format!(", root {}", w[6] - 1));
    }
    if let Some(op) = (w[7] as usize).checked_sub(1).and_then(|i| REDUCE_OPS.get(i)) {
        s.push_str(&format!(", op {op}"));
    }
    if w[8] != 0 {
        s.push_str(&format!(", arguments {:#018x}", w[8]));
    }
    s.push(')');
    s
}

/// Exchanges `fp` over `group` and fails on every member when any two members differ.
pub(crate) fn agree(comm: &dyn Communicator, group: &[usize], fp: Fingerprint) -> Result<()> {
    let mine = fp.encode(group);
    let mut all = vec![0u64; mine.len() * group.len()];
    comm.all_gather(
        group,
        super::Buf::Host(bytemuck::cast_slice(&mine)),
        bytemuck::cast_slice_mut::<_, u8>(&mut all).into(),
    )?;
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
            detail: 0,
        };
        let w = fp.encode(&[0, 1]);
        assert_eq!(describe(&w), "broadcast #3 (4 x f32, root 1, op max)");
        assert_ne!(w[3], fp.encode(&[1, 0])[3]);
        assert_eq!(describe(&Fingerprint { root: None, op: None, ..fp }.encode(&[0])), "broadcast #3 (4 x f32)");
        assert_eq!(
            describe(&Fingerprint { detail: 0xab, ..fp }.encode(&[0])),
            "broadcast #3 (4 x f32, root 1, op max, arguments 0x00000000000000ab)"
        );
    }

    /// Finding 5 of issue 33: only "", f32, f64 and u64 had codes, so a bf16 collective met
    /// an f16 one unnoticed. Every pair of distinct element types now encodes differently.
    #[test]
    fn every_pair_of_dtypes_is_told_apart() {
        let names: Vec<&str> = dtype_names().collect();
        assert_eq!(names.len(), DType::ALL.len() + 2);
        for (i, a) in names.iter().enumerate() {
            for b in &names[i + 1..] {
                assert_ne!(dtype_code(a), dtype_code(b), "{a} vs {b}");
            }
            assert_eq!(
                describe(
                    &Fingerprint {
                        seq: 0,
                        kind: CollectiveKind::AllReduce,
                        dtype: a,
                        count: 1,
                        root: None,
                        op: None,
                        detail: 0
                    }
                    .encode(&[0])
                ),
                format!("all_reduce #0 (1 x {a})")
            );
        }
        assert_ne!(dtype_code("c64"), dtype_code("c128"));
    }
}
