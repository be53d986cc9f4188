//! Views: transpose, permute, reshape (and flatten, unflatten, squeeze, unsqueeze), expand,
//! contiguous.
//!
//! transpose and permute move shard dims with the dims (never communicate). reshape keeps `Shard(d)` when `d` is
//! the leading (non-1) dim of its group of merged/split dims and, for a real merge or split,
//! its size and the output's leading size divide by the number of shards (torch.chunk of the
//! merged dim then equals the merge of the chunks); otherwise the input is redistributed.
//! expand keeps shards of non-broadcast dims and can shard a broadcast dim for free.

use super::grad_kernels;
use super::slice::ALL_OPS;
use super::strategy::{partial_ops, select, DimRule, Select};
use super::{new_output, norm_dim};
use crate::autograd::record;
use crate::dtensor::DTensor;
use crate::element::Scalar;
use crate::error::{Error, Result};
use crate::layout::local_shape_and_offset;
use crate::placement::{Placement, ReduceOp};

/// Rules that map `Shard(d)` to `Shard(f(d))` and keep R and every Partial.
fn remap_rules<T: Scalar>(x: &DTensor<T>, pairs: &[(usize, usize)]) -> Vec<DimRule> {
    let mut rs = vec![DimRule::new(&[Placement::Replicate], Placement::Replicate)];
    for &(i, o) in pairs {
        rs.push(DimRule::new(&[Placement::Shard(i as isize)], Placement::Shard(o as isize)));
    }
    for op in partial_ops(&[x], &ALL_OPS) {
        rs.push(DimRule::new(&[Placement::Partial(op)], Placement::Partial(op)));
    }
    rs
}

/// Groups of input dims ↔ output dims whose sizes multiply to the same number.
fn view_groups(input: &[usize], output: &[usize]) -> Vec<(Vec<usize>, Vec<usize>)> {
    let (mut i, mut j) = (0, 0);
    let mut groups = Vec::new();
    while i < input.len() || j < output.len() {
        let (mut gi, mut gj) = (vec![], vec![]);
        let (mut pi, mut pj) = (1usize, 1usize);
        if i < input.len() {
            pi *= input[i];
            gi.push(i);
            i += 1;
        }
        if j < output.len() {
            pj *= output[j];
            gj.push(j);
            j += 1;
        }
        while pi != pj {
            if pi < pj && i < input.len() {
                pi *= input[i];
                gi.push(i);
                i += 1;
            } else if j < output.len() {
                pj *= output[j];
                gj.push(j);
                j += 1;
            } else {
                break;
            }
        }
        // Trailing size-1 dims join the group so that later groups start on real dims.
        while i < input.len() && input[i] == 1 && (j >= output.len() || output[j] != 1) {
            gi.push(i);
            i += 1;
        }
        while j < output.len() && output[j] == 1 && (i >= input.len() || input[i] != 1) {
            gj.push(j);
            j += 1;
        }
        groups.push((gi, gj));
    }
    groups
}

fn leading(dims: &[usize], shape: &[usize]) -> Option<usize> {
    dims.iter().copied().find(|&d| shape[d] != 1).or(dims.first().copied())
}

/// The output dim of input dim `d` when output dim `k` is input dim `order[k]` (permute):
/// where a `Shard(d)` goes. Also the typed layer's permute rule.
pub const fn permuted_dim(d: usize, order: &[usize]) -> usize {
    let mut k = 0;
    while k < order.len() {
        if order[k] == d {
            return k;
        }
        k += 1;
    }
    d
}

/// The reshape rule `input` → `out` (same number of elements): per group of merged / split
/// dims, (leading input dim, leading output dim, whether a shard of it must divide evenly).
/// An empty tensor has no groups (any shard is redistributed, which moves nothing).
fn view_rule(input: &[usize], out: &[usize]) -> Vec<(usize, usize, bool)> {
    if input.iter().product::<usize>() == 0 {
        return vec![];
    }
    let mut rule = vec![];
    for (gi, gj) in view_groups(input, out) {
        let (Some(li), Some(lj)) = (leading(&gi, input), leading(&gj, out)) else { continue };
        let real_i = gi.iter().filter(|&&d| input[d] != 1).count();
        let real_j = gj.iter().filter(|&&d| out[d] != 1).count();
        rule.push((li, lj, !(real_i <= 1 && real_j <= 1)));
    }
    rule
}

/// Whether the input placements `ps` pass the divisibility checks of `rule`: a shard of a
/// really merged or split group's leading dim needs its size and the output's leading size to
/// divide by the number of shards (torch.chunk of the merge then equals the merge of chunks).
fn view_divides(
    rule: &[(usize, usize, bool)],
    input: &[usize],
    out: &[usize],
    mesh_shape: &[usize],
    ps: &[Placement],
) -> bool {
    rule.iter().all(|&(li, lj, divisible)| {
        if !divisible {
            return true;
        }
        let shards: usize = ps.iter().zip(mesh_shape).filter(|(p, _)| p.is_shard_on(li)).map(|(_, &n)| n).product();
        input[li].is_multiple_of(shards) && out[lj].is_multiple_of(shards)
    })
}

/// The placements a reshape `input` → `out` of a tensor with placements `ps` on a mesh of
/// `mesh_shape` keeps without any communication, or `None` when it would redistribute first.
/// The typed layer asks this before a typed view op runs.
pub fn reshape_keeps(input: &[usize], out: &[usize], mesh_shape: &[usize], ps: &[Placement]) -> Option<Vec<Placement>> {
    if input.iter().product::<usize>() != out.iter().product::<usize>() {
        return None;
    }
    let rule = view_rule(input, out);
    if !view_divides(&rule, input, out, mesh_shape, ps) {
        return None;
    }
    ps.iter()
        .map(|p| match *p {
            Placement::Shard(d) => {
                rule.iter().find(|&&(li, _, _)| li as isize == d).map(|&(_, lj, _)| Placement::Shard(lj as isize))
            }
            p => Some(p),
        })
        .collect()
}

impl<T: Scalar> DTensor<T> {
    /// Swaps two dims. Shard dims are swapped with them; never communicates.
    pub fn transpose(&self, dim0: isize, dim1: isize) -> Result<DTensor<T>> {
        let nd = self.ndim();
        let (a, b) = (norm_dim("transpose", dim0, nd)?, norm_dim("transpose", dim1, nd)?);
        let swap = |d: usize| {
            if d == a {
                b
            } else if d == b {
                a
            } else {
                d
            }
        };
        let pairs: Vec<(usize, usize)> = (0..nd).map(|d| (d, swap(d))).collect();
        let c = select("transpose", &[self], &remap_rules(self, &pairs), Select::default())?;
        let xi = &*c.inputs[0];
        let mut shape = xi.shape.clone();
        shape.swap(a, b);
        let out = new_output(xi.local.transpose(a, b)?, &xi.mesh, c.output, shape);
        Ok(record("transpose_backward", out, &[xi], move |g| Ok(vec![Some(g.transpose(a as isize, b as isize)?)])))
    }

    /// Reorders the dims: output dim `k` is input dim `dims[k]` (PyTorch `permute`; negative
    /// dims count from the end). Shard dims move with their dims; never communicates.
    pub fn permute(&self, dims: &[isize]) -> Result<DTensor<T>> {
        let nd = self.ndim();
        let axes = dims.iter().map(|&d| norm_dim("permute", d, nd)).collect::<Result<Vec<_>>>()?;
        let mut seen = axes.clone();
        seen.sort_unstable();
        if seen != (0..nd).collect::<Vec<_>>() {
            return Err(Error::InvalidArgument {
                context: "permute".into(),
                reason: format!("{dims:?} is not a permutation of the {nd} dims"),
            });
        }
        let pairs: Vec<(usize, usize)> = (0..nd).map(|a| (a, permuted_dim(a, &axes))).collect();
        let c = select("permute", &[self], &remap_rules(self, &pairs), Select::default())?;
        let xi = &*c.inputs[0];
        let shape: Vec<usize> = axes.iter().map(|&a| xi.shape[a]).collect();
        let out = new_output(xi.local.permute(&axes)?, &xi.mesh, c.output, shape);
        let mut inverse = vec![0isize; nd];
        for (k, &a) in axes.iter().enumerate() {
            inverse[a] = k as isize;
        }
        Ok(record("permute_backward", out, &[xi], move |g| Ok(vec![Some(g.permute(&inverse)?)])))
    }

    /// PyTorch `contiguous`: local shards are always row-major, so this is the tensor itself
    /// (same history).
    pub fn contiguous(&self) -> Result<DTensor<T>> {
        Ok(self.clone())
    }

    /// Merges dims `start..=end` into one (PyTorch `flatten`).
    pub fn flatten(&self, start: isize, end: isize) -> Result<DTensor<T>> {
        if self.ndim() == 0 {
            return self.reshape_to(&[1]);
        }
        let (s, e) = (norm_dim("flatten", start, self.ndim())?, norm_dim("flatten", end, self.ndim())?);
        if s > e {
            return Err(Error::InvalidArgument { context: "flatten".into(), reason: format!("start {s} > end {e}") });
        }
        let mut shape = self.shape[..s].to_vec();
        shape.push(self.shape[s..=e].iter().product());
        shape.extend_from_slice(&self.shape[e + 1..]);
        self.reshape_to(&shape)
    }

    /// Splits `dim` into `sizes` (one entry may be `-1`; PyTorch `unflatten`).
    pub fn unflatten(&self, dim: isize, sizes: &[isize]) -> Result<DTensor<T>> {
        let d = norm_dim("unflatten", dim, self.ndim())?;
        let mut shape: Vec<isize> = self.shape[..d].iter().map(|&s| s as isize).collect();
        shape.extend_from_slice(sizes);
        shape.extend(self.shape[d + 1..].iter().map(|&s| s as isize));
        if sizes.iter().any(|&s| s < -1) || sizes.iter().filter(|&&s| s == -1).count() > 1 {
            return Err(Error::InvalidArgument {
                context: "unflatten".into(),
                reason: format!("invalid sizes {sizes:?}: each must be >= 0, with at most one -1"),
            });
        }
        let known_dims: Vec<usize> = sizes.iter().filter(|&&s| s >= 0).map(|&s| s as usize).collect();
        let known = crate::shape::checked_numel("unflatten", &known_dims)?;
        if !sizes.contains(&-1) && known != self.shape[d] {
            return Err(Error::InvalidArgument {
                context: "unflatten".into(),
                reason: format!("sizes {sizes:?} do not multiply to dim {d} of size {}", self.shape[d]),
            });
        }
        self.reshape(&shape)
    }

    /// Removes size-1 dims: `dim` only (no-op if its size is not 1), or all when `None`
    /// (PyTorch `squeeze`).
    pub fn squeeze(&self, dim: Option<isize>) -> Result<DTensor<T>> {
        let drop: Vec<usize> = match dim {
            Some(d) => {
                let d = norm_dim("squeeze", d, self.ndim().max(1))?;
                if self.shape.get(d) == Some(&1) {
                    vec![d]
                } else {
                    vec![]
                }
            }
            None => (0..self.ndim()).filter(|&d| self.shape[d] == 1).collect(),
        };
        let shape: Vec<usize> =
            self.shape.iter().enumerate().filter(|(d, _)| !drop.contains(d)).map(|(_, &s)| s).collect();
        self.reshape_to(&shape)
    }

    /// Reshape to `shape` (one entry may be `-1`: inferred). See the module docs for when a
    /// shard survives.
    pub fn reshape(&self, shape: &[isize]) -> Result<DTensor<T>> {
        let numel = self.numel();
        let bad = |why: String| Error::InvalidArgument { context: "reshape".into(), reason: why };
        let infer: Vec<usize> = shape.iter().enumerate().filter(|(_, &s)| s == -1).map(|(i, _)| i).collect();
        if infer.len() > 1 || shape.iter().any(|&s| s < -1) {
            return Err(bad(format!("invalid target shape {shape:?}")));
        }
        let known_dims: Vec<usize> = shape.iter().filter(|&&s| s >= 0).map(|&s| s as usize).collect();
        let known = crate::shape::checked_numel("reshape", &known_dims)?;
        let mut out: Vec<usize> = shape.iter().map(|&s| s.max(0) as usize).collect();
        if let Some(&i) = infer.first() {
            if known == 0 || !numel.is_multiple_of(known) {
                return Err(bad(format!("cannot infer -1 in {shape:?} for {numel} elements")));
            }
            out[i] = numel / known;
        }
        self.reshape_to(&out)
    }

    /// PyTorch `view`: the same as [`DTensor::reshape`] (local shards are always contiguous).
    pub fn view(&self, shape: &[isize]) -> Result<DTensor<T>> {
        self.reshape(shape)
    }

    /// Reshape to a fully known shape.
    pub fn reshape_to(&self, out: &[usize]) -> Result<DTensor<T>> {
        let input = self.shape.clone();
        if crate::shape::checked_numel("reshape", out)? != self.numel() {
            return Err(Error::ShapeMismatch {
                context: "reshape: number of elements".into(),
                expected: input,
                actual: out.to_vec(),
            });
        }
        let mesh_shape = self.mesh.shape().to_vec();
        let rule = view_rule(&input, out);
        let pairs: Vec<(usize, usize)> = rule.iter().map(|&(li, lj, _)| (li, lj)).collect();
        let valid = |ins: &[Vec<Placement>], _: &[Placement]| view_divides(&rule, &input, out, &mesh_shape, &ins[0]);
        let rules = remap_rules(self, &pairs);
        let c = select("reshape", &[self], &rules, Select { valid: Some(&valid), ..Select::default() })?;
        let xi = &*c.inputs[0];
        let (local_shape, _) = local_shape_and_offset(out, xi.mesh.shape(), xi.mesh.coordinate(), &c.output);
        let local = xi.local.reshape(&local_shape)?;
        let out_t = new_output(local, &xi.mesh, c.output, out.to_vec());
        let in_shape = xi.shape.clone();
        Ok(record("reshape_backward", out_t, &[xi], move |g| Ok(vec![Some(g.reshape_to(&in_shape)?)])))
    }

    /// Inserts a size-1 dim at `dim` (`-1`: at the end).
    pub fn unsqueeze(&self, dim: isize) -> Result<DTensor<T>> {
        let d = norm_dim("unsqueeze", dim, self.ndim() + 1)?;
        let mut shape = self.shape.clone();
        shape.insert(d, 1);
        self.reshape_to(&shape)
    }

    /// Broadcasts to `shape` (PyTorch `expand`).
    pub fn expand(&self, shape: &[usize]) -> Result<DTensor<T>> {
        expand_impl(self, shape, None)
    }

    /// Broadcasts to `like`'s shape, preferring `like`'s placements among free layouts.
    pub(crate) fn expand_like(&self, like: &DTensor<T>) -> Result<DTensor<T>> {
        expand_impl(self, &like.shape, Some(&like.placements))
    }
}

/// The Partial inputs `expand` keeps: repeating each rank's part repeats the reduced value.
const EXPAND_KEEPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min];

/// Does `expand` (and so `repeat` / `repeat_interleave`) keep a `Partial(op)` input?
pub const fn expand_keeps_partial(op: ReduceOp) -> bool {
    crate::placement::contains_op(&EXPAND_KEEPS, op)
}

fn expand_impl<T: Scalar>(x: &DTensor<T>, shape: &[usize], prefer: Option<&[Placement]>) -> Result<DTensor<T>> {
    let bad = || Error::ShapeMismatch { context: "expand".into(), expected: shape.to_vec(), actual: x.shape.clone() };
    if x.ndim() > shape.len() {
        return Err(bad());
    }
    crate::shape::checked_bytes::<T>("expand", shape)?;
    let off = shape.len() - x.ndim();
    let mut rs = vec![DimRule::new(&[Placement::Replicate], Placement::Replicate)];
    for (d, &s) in shape.iter().enumerate() {
        let src = if d >= off { x.shape[d - off] } else { 1 };
        if src == s {
            if d >= off {
                rs.push(DimRule::new(&[Placement::Shard((d - off) as isize)], Placement::Shard(d as isize)));
            } else {
                rs.push(DimRule::new(&[Placement::Replicate], Placement::Shard(d as isize)));
            }
        } else if src == 1 {
            rs.push(DimRule::new(&[Placement::Replicate], Placement::Shard(d as isize)));
        } else {
            return Err(bad());
        }
    }
    for op in partial_ops(&[x], &EXPAND_KEEPS) {
        rs.push(DimRule::new(&[Placement::Partial(op)], Placement::Partial(op)));
    }
    let c = select("expand", &[x], &rs, Select { prefer_output: prefer, ..Select::default() })?;
    let xi = &*c.inputs[0];
    let (local_shape, _) = local_shape_and_offset(shape, xi.mesh.shape(), xi.mesh.coordinate(), &c.output);
    let local = xi.local.broadcast_to(&local_shape)?;
    let out = new_output(local, &xi.mesh, c.output, shape.to_vec());
    let in_shape = xi.shape.clone();
    Ok(record("expand_backward", out, &[xi], move |g| {
        Ok(vec![Some((grad_kernels::<T>()?.sum_to)(g.clone(), &in_shape)?)])
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups() {
        assert_eq!(view_groups(&[2, 3, 4], &[6, 4]), vec![(vec![0, 1], vec![0]), (vec![2], vec![1])]);
        assert_eq!(view_groups(&[6], &[2, 3]), vec![(vec![0], vec![0, 1])]);
        assert_eq!(view_groups(&[4, 5], &[4, 1, 5]), vec![(vec![0], vec![0, 1]), (vec![1], vec![2])]);
        assert_eq!(view_groups(&[1, 4], &[4]), vec![(vec![0, 1], vec![0])]);
    }
}
