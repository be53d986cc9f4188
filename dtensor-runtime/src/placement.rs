//! `Placement`: how a tensor is laid out along one mesh dimension.

use crate::error::{Error, Result};
use std::fmt;

/// Reduction of a [`Placement::Partial`] tensor (and of reducing collectives).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum ReduceOp {
    /// Element-wise sum of the rank contributions (the default).
    #[default]
    Sum,
    /// Sum divided by the number of contributing ranks.
    Avg,
    /// Element-wise minimum over ranks.
    Min,
    /// Element-wise maximum over ranks.
    Max,
    /// Element-wise product over ranks.
    Product,
}

impl ReduceOp {
    /// Lower-case name as PyTorch prints it (`sum`, `avg`, ...).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Avg => "avg",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Product => "product",
        }
    }

    /// Every accepted spelling of every reduce op (`mean` and `prod` are PyTorch's aliases).
    pub const SPELLINGS: &'static [(&'static str, ReduceOp)] = &[
        ("sum", ReduceOp::Sum),
        ("avg", ReduceOp::Avg),
        ("mean", ReduceOp::Avg),
        ("min", ReduceOp::Min),
        ("max", ReduceOp::Max),
        ("product", ReduceOp::Product),
        ("prod", ReduceOp::Product),
    ];

    /// Parses any of [`SPELLINGS`](Self::SPELLINGS), case-insensitively.
    pub fn parse(s: &str) -> Option<ReduceOp> {
        Self::SPELLINGS.iter().find(|(name, _)| name.eq_ignore_ascii_case(s)).map(|&(_, op)| op)
    }
}

/// Is `op` in `ops`? (A `const fn`, so that rule tables can be evaluated at compile time.)
pub const fn contains_op(ops: &[ReduceOp], op: ReduceOp) -> bool {
    let mut i = 0;
    while i < ops.len() {
        if ops[i] as u8 == op as u8 {
            return true;
        }
        i += 1;
    }
    false
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Layout of a tensor along one mesh dimension.
///
/// ```
/// use dtensor_runtime::{Placement, ReduceOp};
/// assert_eq!(Placement::Shard(0).to_string(), "S(0)");
/// assert_eq!(Placement::Replicate.to_string(), "R");
/// assert_eq!(Placement::Partial(ReduceOp::Sum).to_string(), "P(sum)");
/// // negative dims count from the end, as in PyTorch
/// assert_eq!(Placement::Shard(-1).normalize(3).unwrap(), Placement::Shard(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Placement {
    /// Split along tensor dim `dim` (torch.chunk semantics). Negative dims count from the end.
    Shard(isize),
    /// Every rank along the mesh dim holds the full data.
    Replicate,
    /// Every rank holds a partial value; the logical value is their reduction.
    Partial(ReduceOp),
}

/// `Shard(dim)` as a free function, so code reads like PyTorch: `[Shard(0), Replicate]`.
#[allow(non_snake_case)]
pub fn Shard(dim: isize) -> Placement {
    Placement::Shard(dim)
}

/// `Partial(op)` as a free function.
#[allow(non_snake_case)]
pub fn Partial(op: ReduceOp) -> Placement {
    Placement::Partial(op)
}

/// `Replicate` as a constant, so code reads like PyTorch.
#[allow(non_upper_case_globals)]
pub const Replicate: Placement = Placement::Replicate;

impl Placement {
    /// `Partial(Sum)`, the most common partial.
    pub const PARTIAL_SUM: Placement = Placement::Partial(ReduceOp::Sum);

    /// Is this `Shard(_)`?
    pub fn is_shard(&self) -> bool {
        matches!(self, Placement::Shard(_))
    }
    /// Is this `Shard(dim)` for the given (normalised) dim?
    pub fn is_shard_on(&self, dim: usize) -> bool {
        matches!(self, Placement::Shard(d) if *d >= 0 && *d as usize == dim)
    }
    /// Is this `Replicate`?
    pub fn is_replicate(&self) -> bool {
        matches!(self, Placement::Replicate)
    }
    /// Is this `Partial(_)`?
    pub fn is_partial(&self) -> bool {
        matches!(self, Placement::Partial(_))
    }
    /// The shard dim, if this is a (normalised) `Shard`.
    pub fn shard_dim(&self) -> Option<usize> {
        match self {
            Placement::Shard(d) if *d >= 0 => Some(*d as usize),
            _ => None,
        }
    }

    /// Resolves a negative shard dim against the tensor rank and checks it is in range.
    pub fn normalize(self, ndim: usize) -> Result<Placement> {
        match self {
            Placement::Shard(d) => match crate::shape::normalize_dim(d, ndim) {
                Some(nd) => Ok(Placement::Shard(nd as isize)),
                None => Err(Error::ShardDimOutOfRange { dim: d, ndim }),
            },
            p => Ok(p),
        }
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Shard(d) => write!(f, "S({d})"),
            Placement::Replicate => f.write_str("R"),
            Placement::Partial(op) => write!(f, "P({op})"),
        }
    }
}

/// Parses what `Display` writes (`S(0)`, `S(-1)`, `R`, `P(sum)`) and the long spellings
/// `Shard(0)`, `Replicate`, `Partial(avg)`; surrounding spaces are ignored.
///
/// ```
/// use dtensor_runtime::{Placement, ReduceOp};
/// for p in [Placement::Shard(1), Placement::Replicate, Placement::Partial(ReduceOp::Max)] {
///     assert_eq!(p.to_string().parse::<Placement>().unwrap(), p);
/// }
/// assert_eq!("Shard(-1)".parse::<Placement>().unwrap(), Placement::Shard(-1));
/// assert!("S(x)".parse::<Placement>().is_err());
/// ```
impl std::str::FromStr for Placement {
    type Err = Error;

    fn from_str(s: &str) -> Result<Placement> {
        let t = s.trim();
        let inner = |long: &str, short: &str| {
            let rest = t.strip_prefix(long).or_else(|| t.strip_prefix(short))?;
            rest.strip_suffix(')').map(str::trim)
        };
        let parsed = if t == "R" || t == "Replicate" {
            Some(Placement::Replicate)
        } else if let Some(d) = inner("Shard(", "S(") {
            d.parse::<isize>().ok().map(Placement::Shard)
        } else {
            inner("Partial(", "P(").and_then(ReduceOp::parse).map(Placement::Partial)
        };
        parsed.ok_or_else(|| Error::InvalidArgument {
            context: "placement".into(),
            reason: format!("cannot parse {s:?}: expected S(dim), R or P(sum|avg|min|max|product)"),
        })
    }
}

/// Why a redistribution cannot take one mesh dim from `from` to `to`, or `None` when it can.
///
/// The one legality table of redistribution: the runtime planner checks every mesh dim with
/// it, and the typed layer's `redistribute` rule is generated from it (so the two cannot
/// drift). Legality depends on the kinds and reduce ops only, never on the shard dim.
///
/// ```
/// use dtensor_runtime::{placement::transition_error, Placement, ReduceOp};
/// assert!(transition_error(Placement::Replicate, Placement::Shard(1)).is_none());
/// assert!(transition_error(Placement::Partial(ReduceOp::Sum), Placement::Partial(ReduceOp::Avg)).is_some());
/// ```
pub const fn transition_error(from: Placement, to: Placement) -> Option<&'static str> {
    match (from, to) {
        // PyTorch 2.15 allows Shard -> Partial(sum) only (each rank zero-fills outside its
        // shard); no other reduce op has a zero-cost local form.
        (Placement::Shard(_), Placement::Partial(op)) if op as u8 != ReduceOp::Sum as u8 => {
            Some("Shard -> Partial is only defined for Partial(sum) (zero-filled shards); go through Replicate")
        }
        (Placement::Partial(a), Placement::Partial(b)) if a as u8 != b as u8 => {
            Some("a Partial cannot change its reduce op; redistribute to Replicate first")
        }
        _ => None,
    }
}

/// Formats a placement list as `(S(0), R)`.
pub fn fmt_placements(ps: &[Placement]) -> String {
    let inner: Vec<String> = ps.iter().map(|p| p.to_string()).collect();
    format!("({})", inner.join(", "))
}

/// The placements of `ps` once its Partial terms are reduced: every `Partial` becomes
/// `Replicate`, shards stay. The target of a full reduction (before a checkpoint is saved)
/// and the layout of a Partial tensor's gradient.
///
/// ```
/// use dtensor_runtime::placement::without_partials;
/// use dtensor_runtime::{Placement, Replicate, Shard};
/// assert_eq!(without_partials(&[Placement::PARTIAL_SUM, Shard(0)]), vec![Replicate, Shard(0)]);
/// ```
pub fn without_partials(ps: &[Placement]) -> Vec<Placement> {
    ps.iter().map(|p| if p.is_partial() { Placement::Replicate } else { *p }).collect()
}

/// Normalises every placement against `ndim` and checks the count against the mesh.
pub fn normalize_placements(ps: &[Placement], ndim: usize, mesh_ndim: usize) -> Result<Vec<Placement>> {
    if ps.len() != mesh_ndim {
        return Err(Error::PlacementCountMismatch { given: ps.len(), mesh_ndim });
    }
    ps.iter().map(|p| p.normalize(ndim)).collect()
}
