//! Repetition: `repeat` (tile) and `repeat_interleave` (GQA key/value heads).
//!
//! Both are composed of `reshape` / `expand` / `reshape`, so their sharding follows those
//! rules and autograd comes for free. `repeat`: a shard of a dim repeated more than once is
//! redistributed to Replicate first (the tiled dim is not a chunk of the input's; PyTorch
//! replicates it too); dims repeated once keep their shards. `repeat_interleave` along a
//! sharded dim keeps the shard when the dim and the result divide by the number of shards
//! (each rank's heads repeat in place, as tensor-parallel GQA needs), otherwise the reshape
//! redistributes.

use super::norm_dim;
use super::slice::unshard_dim;
use crate::dtensor::DTensor;
use crate::element::Scalar;
use crate::error::{Error, Result};

impl<T: Scalar> DTensor<T> {
    /// Tiles the tensor `repeats[i]` times along dim `i` (PyTorch `repeat`; extra leading
    /// entries add leading dims).
    pub fn repeat(&self, repeats: &[usize]) -> Result<DTensor<T>> {
        let nd = self.ndim();
        if repeats.len() < nd {
            return Err(Error::InvalidArgument {
                context: "repeat".into(),
                reason: format!("{} repeats for a tensor of {nd} dims", repeats.len()),
            });
        }
        let lead = repeats.len() - nd;
        let mut x = self.clone();
        for (e, &r) in repeats[lead..].iter().enumerate() {
            if r != 1 {
                x = unshard_dim(&x, e, "repeat")?;
            }
        }
        let mut src = vec![1usize; lead];
        src.extend_from_slice(&x.shape);
        // [.., 1, n_i, ..] expanded to [.., r_i, n_i, ..], merged to [.., r_i·n_i, ..].
        let pairs: Vec<usize> = src.iter().flat_map(|&n| [1, n]).collect();
        let wide: Vec<usize> = src.iter().zip(repeats).flat_map(|(&n, &r)| [r, n]).collect();
        let out: Vec<usize> = src
            .iter()
            .zip(repeats)
            .map(|(&n, &r)| {
                n.checked_mul(r)
                    .ok_or_else(|| Error::ShapeOverflow { context: "repeat".into(), shape: repeats.to_vec() })
            })
            .collect::<Result<_>>()?;
        x.reshape_to(&pairs)?.expand(&wide)?.reshape_to(&out)
    }

    /// Repeats every slice along `dim` `repeats` times in place (PyTorch
    /// `repeat_interleave(repeats, dim)`), e.g. key/value heads for grouped-query attention.
    pub fn repeat_interleave(&self, repeats: usize, dim: isize) -> Result<DTensor<T>> {
        let d = norm_dim("repeat_interleave", dim, self.ndim())?;
        let mut wide = self.shape.clone();
        wide.insert(d + 1, repeats);
        let mut out = self.shape.clone();
        out[d] = out[d]
            .checked_mul(repeats)
            .ok_or_else(|| Error::ShapeOverflow { context: "repeat_interleave".into(), shape: self.shape.clone() })?;
        self.unsqueeze(d as isize + 1)?.expand(&wide)?.reshape_to(&out)
    }
}
