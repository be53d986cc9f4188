//! `visualize_sharding`: which rank holds which block of a 1-D or 2-D DTensor, as a table
//! (like `jax.debug.visualize_array_sharding` and torch's `visualize_sharding`).
//!
//! Every rank's block comes from the layout math ([`crate::layout`], at each mesh
//! coordinate), so any rank can draw the whole picture without communicating. Blocks held by
//! several ranks (Replicate or Partial mesh dims) list all of them; ranks whose shard is empty
//! (uneven sharding) are listed under the table.
//!
//! ```
//! use dtensor_runtime::{run, distribute_tensor, Shard, visualize::visualize_sharding_plain};
//! let pictures = run(4, |ctx| {
//!     let mesh = ctx.init_device_mesh(&[2, 2], &["dp", "tp"])?;
//!     let t = ndarray::ArrayD::<f32>::zeros(vec![5, 7]);
//!     let dt = distribute_tensor(&t, &mesh, &[Shard(0), Shard(1)], None)?;
//!     visualize_sharding_plain(&dt)
//! }).unwrap();
//! assert!(pictures[0].contains("[3:5, 4:7]"));
//! assert_eq!(pictures[0], pictures[3]); // every rank draws the same picture
//! ```

use crate::dtensor::DTensor;
use crate::element::Element;
use crate::error::{Error, Result};
use crate::layout::local_shape_and_offset;
use crate::mesh::DeviceMesh;
use crate::placement::{fmt_placements, normalize_placements, Placement};
use std::ffi::OsStr;
use std::io::IsTerminal;
use std::ops::Range;

/// One block of the picture: a box of the global tensor and the ranks that hold it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardBlock {
    /// Index range of the block along each tensor dim.
    pub ranges: Vec<Range<usize>>,
    /// Global ranks holding exactly this block, ascending.
    pub ranks: Vec<usize>,
}

/// Layout of a whole DTensor, computed locally: the blocks in row-major order, and the ranks
/// whose shard is empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardingLayout {
    /// Global shape.
    pub shape: Vec<usize>,
    /// Blocks, row-major over the grid (1-D: left to right).
    pub blocks: Vec<ShardBlock>,
    /// Number of grid columns (the blocks form `blocks.len() / cols` rows).
    pub cols: usize,
    /// Ranks holding an empty shard (uneven sharding), ascending.
    pub empty_ranks: Vec<usize>,
}

/// Box characters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoxStyle {
    /// `┌─┬─┐` box drawing.
    Unicode,
    /// `+-+` and `|`, safe for any log.
    Ascii,
}

/// How [`visualize_sharding_with`] draws.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VisualizeOptions {
    /// Box characters.
    pub style: BoxStyle,
    /// Colour each distinct rank set (ANSI 256-colour backgrounds).
    pub color: bool,
    /// A first line with shape, dtype, mesh and placements.
    pub header: bool,
}

impl VisualizeOptions {
    /// For a terminal: box drawing, colour when [`color_supported`].
    pub fn terminal() -> Self {
        VisualizeOptions { style: BoxStyle::Unicode, color: color_supported(), header: true }
    }
    /// For logs: ASCII, no colour.
    pub fn plain() -> Self {
        VisualizeOptions { style: BoxStyle::Ascii, color: false, header: true }
    }
}

impl Default for VisualizeOptions {
    fn default() -> Self {
        Self::terminal()
    }
}

/// Whether stdout takes colour: it is a terminal, `NO_COLOR` is unset or empty
/// (<https://no-color.org>), and `TERM` is not `dumb`.
pub fn color_supported() -> bool {
    should_color(
        std::io::stdout().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
        std::env::var_os("TERM").as_deref(),
    )
}

/// The decision of [`color_supported`] from its inputs.
pub fn should_color(is_terminal: bool, no_color: Option<&OsStr>, term: Option<&OsStr>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty()) && term != Some(OsStr::new("dumb"))
}

/// Computes every rank's block of `dt` (no communication). Errors for tensors that are not 1-D
/// or 2-D.
pub fn sharding_layout<T: Element>(dt: &DTensor<T>) -> Result<ShardingLayout> {
    layout_of(dt.shape(), dt.device_mesh(), dt.placements())
}

/// [`sharding_layout`] from the raw parts: global shape, mesh and placements (negative
/// shard dims count from the end; a wrong count or dim is an error).
pub fn layout_of(shape: &[usize], mesh: &DeviceMesh, placements: &[Placement]) -> Result<ShardingLayout> {
    if shape.is_empty() || shape.len() > 2 {
        return Err(Error::Unsupported {
            op: "visualize_sharding".into(),
            reason: format!("only 1-D and 2-D tensors can be drawn; this one has shape {shape:?}"),
        });
    }
    // An unnormalised `Shard(-1)` would otherwise be drawn as Replicate.
    let placements = &normalize_placements(placements, shape.len(), mesh.ndim())?;
    // (rank, box) for every mesh position.
    let mut boxes: Vec<(usize, Vec<Range<usize>>)> = Vec::with_capacity(mesh.numel());
    for &rank in mesh.ranks() {
        let coord = mesh.coordinate_of(rank)?;
        let (sz, off) = local_shape_and_offset(shape, mesh.shape(), &coord, placements);
        boxes.push((rank, off.iter().zip(&sz).map(|(&o, &s)| o..o + s).collect()));
    }
    let is_empty = shape.contains(&0); // (no product: a user-given shape may overflow it)
    let nonempty = |b: &[Range<usize>]| b.iter().all(|r| !r.is_empty());
    let mut empty_ranks: Vec<usize> = boxes.iter().filter(|(_, b)| !nonempty(b)).map(|(r, _)| *r).collect();
    empty_ranks.sort_unstable();
    if is_empty {
        // Nothing to split: one block, every rank holds (an empty view of) it.
        let mut ranks: Vec<usize> = mesh.ranks().to_vec();
        ranks.sort_unstable();
        let ranges = shape.iter().map(|&s| 0..s).collect();
        return Ok(ShardingLayout {
            shape: shape.to_vec(),
            blocks: vec![ShardBlock { ranges, ranks }],
            cols: 1,
            empty_ranks: vec![],
        });
    }
    // Grid lines of each dim: every non-empty box boundary.
    let cuts: Vec<Vec<Range<usize>>> = (0..shape.len())
        .map(|d| {
            let mut pts: Vec<usize> = vec![0, shape[d]];
            for (_, b) in boxes.iter().filter(|(_, b)| nonempty(b)) {
                pts.push(b[d].start);
                pts.push(b[d].end);
            }
            pts.sort_unstable();
            pts.dedup();
            pts.windows(2).map(|w| w[0]..w[1]).collect()
        })
        .collect();
    // A 1-D tensor is one row of blocks; a 2-D one a grid of row blocks × column blocks.
    let (rows, cols): (Vec<Option<Range<usize>>>, &[Range<usize>]) = match &cuts[..] {
        [c] => (vec![None], c),
        [r, c] => (r.iter().cloned().map(Some).collect(), c),
        _ => unreachable!("rank checked above"),
    };
    let mut blocks = Vec::with_capacity(rows.len() * cols.len());
    for r in &rows {
        for c in cols {
            let ranges: Vec<Range<usize>> = r.iter().cloned().chain([c.clone()]).collect();
            let mut ranks: Vec<usize> = boxes
                .iter()
                .filter(|(_, b)| {
                    nonempty(b) && b.iter().zip(&ranges).all(|(b, x)| b.start <= x.start && x.end <= b.end)
                })
                .map(|(rank, _)| *rank)
                .collect();
            ranks.sort_unstable();
            blocks.push(ShardBlock { ranges, ranks });
        }
    }
    Ok(ShardingLayout { shape: shape.to_vec(), blocks, cols: cols.len(), empty_ranks })
}

/// The sharding of a 1-D or 2-D DTensor as a table for a terminal: box drawing, colour when
/// stdout is a colour terminal (see [`color_supported`]).
pub fn visualize_sharding<T: Element>(dt: &DTensor<T>) -> Result<String> {
    visualize_sharding_with(dt, &VisualizeOptions::terminal())
}

/// The sharding as plain ASCII for logs (no colour, no box-drawing characters).
pub fn visualize_sharding_plain<T: Element>(dt: &DTensor<T>) -> Result<String> {
    visualize_sharding_with(dt, &VisualizeOptions::plain())
}

/// Prints [`visualize_sharding`] once per mesh: on the mesh's first rank only (as torch does).
pub fn print_sharding<T: Element>(dt: &DTensor<T>) -> Result<()> {
    let mesh = dt.device_mesh();
    if mesh.ranks().first() == Some(&mesh.rank()) {
        print!("{}", visualize_sharding(dt)?);
    }
    Ok(())
}

/// The sharding drawn with explicit options.
pub fn visualize_sharding_with<T: Element>(dt: &DTensor<T>, opts: &VisualizeOptions) -> Result<String> {
    let layout = sharding_layout(dt)?;
    let mut out = String::new();
    if opts.header {
        out.push_str(&format!(
            "DTensor {:?} {} on {}, placements {}\n",
            dt.shape(),
            T::DTYPE,
            dt.device_mesh(),
            fmt_placements(dt.placements())
        ));
        let partial: Vec<String> = dt
            .placements()
            .iter()
            .enumerate()
            .filter(|(_, p)| p.is_partial())
            .map(|(i, p)| format!("{p} on mesh dim {}", dt.device_mesh().dim_names()[i]))
            .collect();
        if !partial.is_empty() {
            out.push_str(&format!("partial: {}: a block's ranks hold values to be reduced\n", partial.join(", ")));
        }
    }
    out.push_str(&render(&layout, opts));
    Ok(out)
}

/// `[0:3, 4:7]`.
fn range_label(ranges: &[Range<usize>]) -> String {
    let parts: Vec<String> = ranges.iter().map(|r| format!("{}:{}", r.start, r.end)).collect();
    format!("[{}]", parts.join(", "))
}

/// `rank 0`, `ranks 0,2`, `ranks 0-3,8`.
pub fn ranks_label(ranks: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        if j >= i + 2 {
            parts.push(format!("{}-{}", ranks[i], ranks[j]));
        } else {
            parts.extend(ranks[i..=j].iter().map(|r| r.to_string()));
        }
        i = j + 1;
    }
    let word = if ranks.len() == 1 { "rank" } else { "ranks" };
    format!("{word} {}", parts.join(","))
}

/// Background colours (ANSI 256) for distinct rank sets; text is drawn black on them.
const PALETTE: [u8; 12] = [153, 187, 223, 217, 183, 151, 230, 195, 224, 189, 194, 219];

struct Chars {
    h: char,
    v: char,
    // [top, middle, bottom] × [left, cross, right]
    corners: [[char; 3]; 3],
}

fn chars(style: BoxStyle) -> Chars {
    match style {
        BoxStyle::Unicode => {
            Chars { h: '─', v: '│', corners: [['┌', '┬', '┐'], ['├', '┼', '┤'], ['└', '┴', '┘']] }
        }
        BoxStyle::Ascii => Chars { h: '-', v: '|', corners: [['+'; 3]; 3] },
    }
}

fn render(layout: &ShardingLayout, opts: &VisualizeOptions) -> String {
    let ch = chars(opts.style);
    let cols = layout.cols.max(1);
    let rows = layout.blocks.len() / cols;
    // Two text lines per cell: the index range, then the ranks.
    let labels: [Vec<String>; 2] = [
        layout.blocks.iter().map(|b| range_label(&b.ranges)).collect(),
        layout.blocks.iter().map(|b| ranks_label(&b.ranks)).collect(),
    ];
    let width: Vec<usize> = (0..cols)
        .map(|c| {
            labels.iter().flat_map(|l| (0..rows).map(move |r| l[r * cols + c].chars().count())).max().unwrap_or(0) + 2
        })
        .collect();
    // Colour index per distinct rank set, in first-seen order.
    let mut sets: Vec<&[usize]> = Vec::new();
    let color_of: Vec<usize> = layout
        .blocks
        .iter()
        .map(|b| match sets.iter().position(|s| *s == b.ranks.as_slice()) {
            Some(i) => i,
            None => {
                sets.push(&b.ranks);
                sets.len() - 1
            }
        })
        .collect();
    let rule = |kind: usize| -> String {
        let [l, x, r] = ch.corners[kind];
        let segs: Vec<String> = width.iter().map(|&w| ch.h.to_string().repeat(w)).collect();
        format!("{l}{}{r}\n", segs.join(&x.to_string()))
    };
    let mut out = rule(0);
    for r in 0..rows {
        for line in &labels {
            out.push(ch.v);
            for (c, &w) in width.iter().enumerate() {
                let i = r * cols + c;
                let cell = center(&line[i], w);
                if opts.color {
                    out.push_str(&format!("\x1b[30;48;5;{}m{cell}\x1b[0m", PALETTE[color_of[i] % PALETTE.len()]));
                } else {
                    out.push_str(&cell);
                }
                out.push(ch.v);
            }
            out.push('\n');
        }
        out.push_str(&rule(if r + 1 == rows { 2 } else { 1 }));
    }
    if !layout.empty_ranks.is_empty() {
        out.push_str(&format!("empty shards: {}\n", ranks_label(&layout.empty_ranks)));
    }
    out
}

fn center(s: &str, width: usize) -> String {
    let n = s.chars().count();
    let left = (width.saturating_sub(n)) / 2;
    let right = width.saturating_sub(n + left);
    format!("{}{s}{}", " ".repeat(left), " ".repeat(right))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_labels_compress_runs() {
        assert_eq!(ranks_label(&[3]), "rank 3");
        assert_eq!(ranks_label(&[0, 2]), "ranks 0,2");
        assert_eq!(ranks_label(&[0, 1]), "ranks 0,1");
        assert_eq!(ranks_label(&[0, 1, 2, 3, 8, 10, 11, 12]), "ranks 0-3,8,10-12");
    }

    #[test]
    fn color_decision_honours_no_color_and_terminal() {
        let dumb = OsStr::new("dumb");
        let xterm = OsStr::new("xterm-256color");
        assert!(should_color(true, None, Some(xterm)));
        assert!(should_color(true, Some(OsStr::new("")), None));
        assert!(!should_color(true, Some(OsStr::new("1")), Some(xterm)));
        assert!(!should_color(false, None, Some(xterm)));
        assert!(!should_color(true, None, Some(dumb)));
    }

    #[test]
    fn center_pads_both_sides() {
        assert_eq!(center("ab", 6), "  ab  ");
        assert_eq!(center("abc", 6), " abc  ");
    }
}
