//! Rotary position embeddings (RoPE): `x·cos + rotate(x)·sin` over the last dim, in the two
//! forms checkpoints use ([`RotaryStyle`]), composed of `narrow`, `reshape`, `cat`, `neg`,
//! `mul` and `add`, so their sharding and gradients come from those ops: any layout that does
//! not shard the last (feature) dim stays, a `Partial` input stays (the map is linear in `x`),
//! and no collective runs. The tables are replicated.

use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::factory::{from_fn, TensorOptions};

/// Which feature pairs a rotary embedding rotates together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RotaryStyle {
    /// Element `i` with element `i + dim/2` ("rotate half": GPT-NeoX, Hugging Face Llama,
    /// Mistral, Qwen); frequencies repeat over the two halves of a table row.
    #[default]
    Half,
    /// Element `2i` with element `2i + 1` (GPT-J, Meta's original Llama code, the complex
    /// form); each frequency appears twice in a row, side by side.
    Interleaved,
}

impl RotaryStyle {
    /// Cosine and sine tables `[seq_len, dim]` for positions `0..seq_len` with frequencies
    /// `base^(-2j/dim)` (`j` in `0..dim/2`) laid out for this style, replicated on the mesh
    /// of `opts`. For a KV cache, `narrow(0, start, len)` them to the new positions.
    pub fn tables<T: Element>(
        self,
        seq_len: usize,
        dim: usize,
        base: f64,
        opts: &TensorOptions,
    ) -> Result<(DTensor<T>, DTensor<T>)> {
        if dim == 0 || !dim.is_multiple_of(2) {
            return Err(Error::InvalidArgument {
                context: "rotary_tables".into(),
                reason: format!("dim {dim} must be even and positive"),
            });
        }
        if !(base.is_finite() && base > 0.0) {
            return Err(Error::InvalidArgument {
                context: "rotary_tables".into(),
                reason: format!("base {base} must be finite and positive"),
            });
        }
        self.tables_from_frequencies(seq_len, &default_frequencies(dim, base), opts)
    }

    /// Cosine and sine tables `[seq_len, 2·inv_freq.len()]` for positions `0..seq_len` with
    /// the given inverse frequencies (one per rotated pair, e.g. a scaled RoPE's:
    /// [`LlamaConfig::rope_frequencies`](crate::checkpoint::hf::LlamaConfig::rope_frequencies)),
    /// laid out for this style, replicated on the mesh of `opts`.
    pub fn tables_from_frequencies<T: Element>(
        self,
        seq_len: usize,
        inv_freq: &[f64],
        opts: &TensorOptions,
    ) -> Result<(DTensor<T>, DTensor<T>)> {
        if inv_freq.is_empty() || inv_freq.iter().any(|f| !f.is_finite()) {
            return Err(Error::InvalidArgument {
                context: "rotary_tables".into(),
                reason: format!("{} inverse frequencies, which must be finite and at least one", inv_freq.len()),
            });
        }
        let (half, dim) = (inv_freq.len(), 2 * inv_freq.len());
        let angle = move |i: usize| {
            let (pos, col) = (i / dim, i % dim);
            let j = match self {
                RotaryStyle::Half => col % half,
                RotaryStyle::Interleaved => col / 2,
            };
            pos as f64 * inv_freq[j]
        };
        let cos = from_fn("rotary_tables", &[seq_len, dim], opts, &|i| T::of_f64(angle(i).cos()))?;
        let sin = from_fn("rotary_tables", &[seq_len, dim], opts, &|i| T::of_f64(angle(i).sin()))?;
        Ok((cos, sin))
    }
}

/// RoPE's inverse frequencies `base^(-2j/dim)`, `j` in `0..dim/2`.
pub fn default_frequencies(dim: usize, base: f64) -> Vec<f64> {
    (0..dim / 2).map(|j| base.powf(-2.0 * j as f64 / dim as f64)).collect()
}

/// [`RotaryStyle::Half`] tables (GPT-NeoX / Llama): cosine and sine `[seq_len, dim]` with
/// frequencies `base^(-2j/dim)` repeated over both halves of a row, replicated on the mesh of
/// `opts`.
pub fn rotary_tables<T: Element>(
    seq_len: usize,
    dim: usize,
    base: f64,
    opts: &TensorOptions,
) -> Result<(DTensor<T>, DTensor<T>)> {
    RotaryStyle::Half.tables(seq_len, dim, base, opts)
}

impl<T: Element> DTensor<T> {
    /// Rotary position embedding of `self [.., seq, dim]` in the rotate-half form (Hugging
    /// Face Llama's `apply_rotary_pos_emb`): `x·cos + rotate_half(x)·sin` with
    /// `rotate_half(x) = cat(-x₂, x₁)` over the two halves of the last dim; `cos` and `sin`
    /// broadcast to `self` (see [`rotary_tables`]).
    pub fn apply_rotary(&self, cos: &DTensor<T>, sin: &DTensor<T>) -> Result<DTensor<T>> {
        self.apply_rotary_with(cos, sin, RotaryStyle::Half)
    }

    /// Rotary position embedding in either [`RotaryStyle`], with tables of the same style
    /// ([`RotaryStyle::tables`]). The interleaved form rotates each pair `(x₂ᵢ, x₂ᵢ₊₁)` to
    /// `(x₂ᵢ·c − x₂ᵢ₊₁·s, x₂ᵢ₊₁·c + x₂ᵢ·s)`, the complex product of Meta's Llama code.
    ///
    /// ```
    /// use dtensor_runtime::{distribute_tensor, ndarray::ArrayD, ops::rotary::RotaryStyle, run, Shard, TensorOptions};
    /// run(2, |ctx| {
    ///     let mesh = ctx.init_device_mesh(&[2], &["tp"])?;
    ///     let g = ArrayD::from_shape_fn(vec![2, 3, 4], |i| (i[0] + i[1] * 2 + i[2]) as f64);
    ///     let x = distribute_tensor(&g, &mesh, &[Shard(0)], None)?; // heads sharded
    ///     let (cos, sin) = RotaryStyle::Interleaved.tables::<f64>(3, 4, 10000.0, &TensorOptions::new().mesh(&mesh))?;
    ///     let y = x.apply_rotary_with(&cos, &sin, RotaryStyle::Interleaved)?;
    ///     assert_eq!(y.placements(), x.placements());
    ///     // Position 0 is not rotated.
    ///     let (a, b) = (y.full_tensor()?, g);
    ///     assert_eq!(a.slice(ndarray::s![.., 0, ..]), b.slice(ndarray::s![.., 0, ..]));
    ///     Ok(())
    /// })
    /// .unwrap();
    /// ```
    pub fn apply_rotary_with(&self, cos: &DTensor<T>, sin: &DTensor<T>, style: RotaryStyle) -> Result<DTensor<T>> {
        let dim = *self.shape.last().unwrap_or(&0);
        if dim == 0 || !dim.is_multiple_of(2) {
            return Err(Error::InvalidArgument {
                context: "apply_rotary".into(),
                reason: format!("the last dim ({dim}) must be even and positive (shape {:?})", self.shape),
            });
        }
        // The tables must cover this tensor's positions: broadcasting `[max_positions, dim]`
        // tables against one new position would silently give `max_positions` rows.
        let seq = if self.ndim() >= 2 { self.shape[self.ndim() - 2] } else { 1 };
        for (name, t) in [("cos", cos), ("sin", sin)] {
            let n = t.ndim();
            let fits = n >= 1 && t.shape[n - 1] == dim && (n < 2 || t.shape[n - 2] == seq || t.shape[n - 2] == 1);
            if !fits || n > self.ndim() {
                return Err(Error::ShapeMismatch {
                    context: format!("apply_rotary: the {name} table must be [positions, dim] for this tensor's positions (narrow the tables to them)"),
                    expected: vec![seq, dim],
                    actual: t.shape.clone(),
                });
            }
        }
        let half = dim / 2;
        let rotated = match style {
            RotaryStyle::Half => {
                let (x1, x2) = (self.narrow(-1, 0, half)?, self.narrow(-1, half, half)?);
                super::cat::cat(&[&x2.neg()?, &x1], -1)?
            }
            RotaryStyle::Interleaved => {
                let mut pairs: Vec<isize> = self.shape.iter().map(|&s| s as isize).collect();
                pairs.pop();
                pairs.extend([half as isize, 2]);
                let p = self.reshape(&pairs)?;
                let (even, odd) = (p.narrow(-1, 0, 1)?, p.narrow(-1, 1, 1)?);
                let back: Vec<isize> = self.shape.iter().map(|&s| s as isize).collect();
                super::cat::cat(&[&odd.neg()?, &even], -1)?.reshape(&back)?
            }
        };
        self.mul(cos)?.add(&rotated.mul(sin)?)
    }
}
