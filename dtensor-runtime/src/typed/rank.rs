//! Tensor-rank arithmetic at the type level, for the typed ops that change the rank
//! (`unsqueeze`, `squeeze`, `flatten`, `unflatten`).
//!
//! Stable Rust cannot write `Dt<.., { R + 1 }>` for a generic `R`, so the output rank is a
//! const parameter of the method that rustc infers from a projection on [`Rank`]:
//! `Rank<R>: RankPlus1<Out = Rank<R2>>` has exactly one solution `R2` for each listed `R`.
//! The impls cover ranks 0 to 6.

use super::matmul::Rank;

/// `Rank<R>` → `Rank<R + 1>` (`unsqueeze`, `unflatten`).
#[diagnostic::on_unimplemented(
    message = "`{Self}`: the typed layer's rank-changing ops cover tensor ranks 0 to 6",
    label = "no typed rank arithmetic for `{Self}`",
    note = "use the dynamic op on `.as_dtensor()` for higher ranks"
)]
pub trait RankPlus1 {
    /// The rank after adding one dim.
    type Out;
}

/// `Rank<R>` → `Rank<R - 1>` (`squeeze`).
#[diagnostic::on_unimplemented(
    message = "`{Self}`: typed `squeeze` needs a tensor of rank 1 to 7",
    label = "no typed rank arithmetic for `{Self}`",
    note = "use the dynamic op on `.as_dtensor()` for other ranks"
)]
pub trait RankMinus1 {
    /// The rank after removing one dim.
    type Out;
}

/// `Rank<R>` → `Rank<R - (E - S)>` for `S ≤ E < R` (`flatten` of dims `S..=E`).
#[diagnostic::on_unimplemented(
    message = "`flatten(Dims::<{S}, {E}>)` of a tensor of `{Self}` is not a dim range: it needs {S} ≤ {E} < the rank (typed ranks 1 to 6)",
    label = "dims `{S}..={E}` do not fit `{Self}`"
)]
pub trait RankMerged<const S: usize, const E: usize> {
    /// The rank after merging dims `S..=E` into one.
    type Out;
}

macro_rules! plus_minus {
    ($($r:literal => $r1:literal),*) => {$(
        impl RankPlus1 for Rank<$r> {
            type Out = Rank<$r1>;
        }
        impl RankMinus1 for Rank<$r1> {
            type Out = Rank<$r>;
        }
    )*};
}
plus_minus!(0 => 1, 1 => 2, 2 => 3, 3 => 4, 4 => 5, 5 => 6, 6 => 7);

/// `impl RankMerged<s, e> for Rank<r>` for every `s ≤ e` among the dims `0..r`: walks the dim
/// list, `$before` holding the dims below `e`.
macro_rules! merged {
    (@e $r:literal [$($before:literal)*] []) => {};
    (@e $r:literal [$($before:literal)*] [$e:literal $($after:literal)*]) => {
        $(impl RankMerged<$before, $e> for Rank<$r> {
            type Out = Rank<{ $r - ($e - $before) }>;
        })*
        impl RankMerged<$e, $e> for Rank<$r> {
            type Out = Rank<$r>;
        }
        merged!(@e $r [$($before)* $e] [$($after)*]);
    };
    ($($r:literal: [$($d:literal)*];)*) => {$(
        merged!(@e $r [] [$($d)*]);
    )*};
}
merged! {
    1: [0];
    2: [0 1];
    3: [0 1 2];
    4: [0 1 2 3];
    5: [0 1 2 3 4];
    6: [0 1 2 3 4 5];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic() {
        // These calls compile only when the projections are the stated ranks.
        fn plus<const R: usize, const R2: usize>() -> usize
        where
            Rank<R>: RankPlus1<Out = Rank<R2>>,
        {
            R2
        }
        fn merged<const R: usize, const S: usize, const E: usize, const R2: usize>() -> usize
        where
            Rank<R>: RankMerged<S, E, Out = Rank<R2>>,
        {
            R2
        }
        assert_eq!(plus::<3, 4>(), 4);
        assert_eq!(merged::<4, 1, 3, 2>(), 2);
        assert_eq!(merged::<4, 2, 2, 4>(), 4);
    }
}
