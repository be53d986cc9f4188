//! Lifts a per-mesh-dim rule trait to a whole layout (a tuple of markers, one per mesh dim).
//!
//! Each op defines its rule on one mesh dim (`Self` = the left marker, `Name` = the mesh dim
//! name, so the rule's `on_unimplemented` message can name it). The layout-level trait holds
//! exactly when the rule holds on every mesh dim, and its `Out` is the tuple of the per-dim
//! outputs. The layout-level traits carry no message of their own: rustc then reports the
//! failing per-dim rule, with its message, and notes which layout required it.
//!
//! The macros are exported (hidden) so that a user's crate can lift its own op's rule the
//! same way, through [`typed_rule!`](crate::typed_rule).

/// `lift_binary!(LayoutTrait, RuleTrait)` or, with a context type (`Rank<R>`, ...),
/// `lift_binary!(LayoutTrait, RuleTrait, ctx)`. The other operand's markers are named
/// `Placement0`, `Placement1`, ...: rustc's "consider specifying the generic argument" help
/// spells a layout it cannot infer with these names (`redistribute::<(Placement0, Placement1)>`).
#[doc(hidden)]
#[macro_export]
macro_rules! __lift_binary {
    ($(#[$doc:meta])* $TypedLayout:ident, $Rule:ident) => {
        $(#[$doc])*
        pub trait $TypedLayout<Rhs, M: $crate::typed::MeshDims>: $crate::typed::TypedLayout<M> {
            /// The output layout.
            type Out: $crate::typed::TypedLayout<M>;
        }
        $crate::__lift_binary!(@arity $TypedLayout, $Rule, []; (A0 Placement0 N0));
        $crate::__lift_binary!(@arity $TypedLayout, $Rule, []; (A0 Placement0 N0) (A1 Placement1 N1));
        $crate::__lift_binary!(@arity $TypedLayout, $Rule, []; (A0 Placement0 N0) (A1 Placement1 N1) (A2 Placement2 N2));
        $crate::__lift_binary!(@arity $TypedLayout, $Rule, []; (A0 Placement0 N0) (A1 Placement1 N1) (A2 Placement2 N2) (A3 Placement3 N3));
    };
    ($(#[$doc:meta])* $TypedLayout:ident, $Rule:ident, ctx) => {
        $(#[$doc])*
        pub trait $TypedLayout<Rhs, M: $crate::typed::MeshDims, Ctx>: $crate::typed::TypedLayout<M> {
            /// The output layout.
            type Out: $crate::typed::TypedLayout<M>;
        }
        $crate::__lift_binary!(@arity $TypedLayout, $Rule, [Ctx]; (A0 Placement0 N0));
        $crate::__lift_binary!(@arity $TypedLayout, $Rule, [Ctx]; (A0 Placement0 N0) (A1 Placement1 N1));
        $crate::__lift_binary!(@arity $TypedLayout, $Rule, [Ctx]; (A0 Placement0 N0) (A1 Placement1 N1) (A2 Placement2 N2));
        $crate::__lift_binary!(@arity $TypedLayout, $Rule, [Ctx]; (A0 Placement0 N0) (A1 Placement1 N1) (A2 Placement2 N2) (A3 Placement3 N3));
    };
    (@arity $TypedLayout:ident, $Rule:ident, []; $(($a:ident $b:ident $n:ident))+) => {
        impl<$($a, $b, $n,)+> $TypedLayout<($($b,)+), ($($n,)+)> for ($($a,)+)
        where
            $($a: $Rule<$b, $n> + $crate::typed::PlacementMarker,
              $b: $crate::typed::PlacementMarker,
              $n: $crate::typed::MeshDim,)+
            ($($a,)+): $crate::typed::TypedLayout<($($n,)+)>,
            ($(<$a as $Rule<$b, $n>>::Out,)+): $crate::typed::TypedLayout<($($n,)+)>,
        {
            type Out = ($(<$a as $Rule<$b, $n>>::Out,)+);
        }
    };
    (@arity $TypedLayout:ident, $Rule:ident, [$ctx:ident]; $(($a:ident $b:ident $n:ident))+) => {
        impl<$($a, $b, $n,)+ $ctx> $TypedLayout<($($b,)+), ($($n,)+), $ctx> for ($($a,)+)
        where
            $($a: $Rule<$b, $n, $ctx> + $crate::typed::PlacementMarker,
              $b: $crate::typed::PlacementMarker,
              $n: $crate::typed::MeshDim,)+
            ($($a,)+): $crate::typed::TypedLayout<($($n,)+)>,
            ($(<$a as $Rule<$b, $n, $ctx>>::Out,)+): $crate::typed::TypedLayout<($($n,)+)>,
        {
            type Out = ($(<$a as $Rule<$b, $n, $ctx>>::Out,)+);
        }
    };
}

/// Like [`lift_binary`] for ops of three tensors (a user's fused op: `typed_rule!(ternary ..)`).
#[doc(hidden)]
#[macro_export]
macro_rules! __lift_ternary {
    ($(#[$doc:meta])* $TypedLayout:ident, $Rule:ident) => {
        $(#[$doc])*
        pub trait $TypedLayout<B, C, M: $crate::typed::MeshDims>: $crate::typed::TypedLayout<M> {
            /// The output layout.
            type Out: $crate::typed::TypedLayout<M>;
        }
        $crate::__lift_ternary!(@all $TypedLayout, $Rule, []);
    };
    ($(#[$doc:meta])* $TypedLayout:ident, $Rule:ident, ctx) => {
        $(#[$doc])*
        pub trait $TypedLayout<B, C, M: $crate::typed::MeshDims, Ctx>: $crate::typed::TypedLayout<M> {
            /// The output layout.
            type Out: $crate::typed::TypedLayout<M>;
        }
        $crate::__lift_ternary!(@all $TypedLayout, $Rule, [Ctx]);
    };
    (@all $TypedLayout:ident, $Rule:ident, [$($ctx:ident)?]) => {
        $crate::__lift_ternary!(@arity $TypedLayout, $Rule, [$($ctx)?]; (A0 B0 C0 N0));
        $crate::__lift_ternary!(@arity $TypedLayout, $Rule, [$($ctx)?]; (A0 B0 C0 N0) (A1 B1 C1 N1));
        $crate::__lift_ternary!(@arity $TypedLayout, $Rule, [$($ctx)?]; (A0 B0 C0 N0) (A1 B1 C1 N1) (A2 B2 C2 N2));
        $crate::__lift_ternary!(@arity $TypedLayout, $Rule, [$($ctx)?]; (A0 B0 C0 N0) (A1 B1 C1 N1) (A2 B2 C2 N2) (A3 B3 C3 N3));
        // as `never_binary!`: no marker may have a single impl, or rustc infers the other
        // operands from it and reports a bare type mismatch instead of the rule's message. Two
        // hidden impls per marker, apart in both operands: a marker with no real impl under
        // some context (`Rank<2>`) would otherwise still have one.
        $crate::__lift_ternary!(@never $Rule, [$($ctx)?], $crate::typed::markers::Never);
        $crate::__lift_ternary!(@never $Rule, [$($ctx)?], ());
    };
    (@never $Rule:ident, [$($ctx:ident)?], $X:ty) => {
        #[diagnostic::do_not_recommend]
        impl<const D: usize, N $(, $ctx)?> $Rule<$X, $X, N $(, $ctx)?> for $crate::typed::Shard<D> {
            type Out = $crate::typed::Replicate;
        }
        #[diagnostic::do_not_recommend]
        impl<N $(, $ctx)?> $Rule<$X, $X, N $(, $ctx)?> for $crate::typed::Replicate {
            type Out = $crate::typed::Replicate;
        }
        #[diagnostic::do_not_recommend]
        impl<Op: $crate::typed::ReduceMarker, N $(, $ctx)?> $Rule<$X, $X, N $(, $ctx)?> for $crate::typed::Partial<Op> {
            type Out = $crate::typed::Replicate;
        }
    };
    (@arity $TypedLayout:ident, $Rule:ident, []; $(($a:ident $b:ident $c:ident $n:ident))+) => {
        impl<$($a, $b, $c, $n,)+> $TypedLayout<($($b,)+), ($($c,)+), ($($n,)+)> for ($($a,)+)
        where
            $($a: $Rule<$b, $c, $n> + $crate::typed::PlacementMarker,
              $b: $crate::typed::PlacementMarker,
              $c: $crate::typed::PlacementMarker,
              $n: $crate::typed::MeshDim,)+
            ($($a,)+): $crate::typed::TypedLayout<($($n,)+)>,
            ($(<$a as $Rule<$b, $c, $n>>::Out,)+): $crate::typed::TypedLayout<($($n,)+)>,
        {
            type Out = ($(<$a as $Rule<$b, $c, $n>>::Out,)+);
        }
    };
    (@arity $TypedLayout:ident, $Rule:ident, [$ctx:ident]; $(($a:ident $b:ident $c:ident $n:ident))+) => {
        impl<$($a, $b, $c, $n,)+ $ctx> $TypedLayout<($($b,)+), ($($c,)+), ($($n,)+), $ctx> for ($($a,)+)
        where
            $($a: $Rule<$b, $c, $n, $ctx> + $crate::typed::PlacementMarker,
              $b: $crate::typed::PlacementMarker,
              $c: $crate::typed::PlacementMarker,
              $n: $crate::typed::MeshDim,)+
            ($($a,)+): $crate::typed::TypedLayout<($($n,)+)>,
            ($(<$a as $Rule<$b, $c, $n, $ctx>>::Out,)+): $crate::typed::TypedLayout<($($n,)+)>,
        {
            type Out = ($(<$a as $Rule<$b, $c, $n, $ctx>>::Out,)+);
        }
    };
}

/// Like [`lift_binary`] for ops of one tensor.
#[doc(hidden)]
#[macro_export]
macro_rules! __lift_unary {
    ($(#[$doc:meta])* $TypedLayout:ident, $Rule:ident) => {
        $(#[$doc])*
        pub trait $TypedLayout<M: $crate::typed::MeshDims>: $crate::typed::TypedLayout<M> {
            /// The output layout.
            type Out: $crate::typed::TypedLayout<M>;
        }
        $crate::__lift_unary!(@arity $TypedLayout, $Rule, []; (A0 N0));
        $crate::__lift_unary!(@arity $TypedLayout, $Rule, []; (A0 N0) (A1 N1));
        $crate::__lift_unary!(@arity $TypedLayout, $Rule, []; (A0 N0) (A1 N1) (A2 N2));
        $crate::__lift_unary!(@arity $TypedLayout, $Rule, []; (A0 N0) (A1 N1) (A2 N2) (A3 N3));
    };
    ($(#[$doc:meta])* $TypedLayout:ident, $Rule:ident, ctx) => {
        $(#[$doc])*
        pub trait $TypedLayout<M: $crate::typed::MeshDims, Ctx>: $crate::typed::TypedLayout<M> {
            /// The output layout.
            type Out: $crate::typed::TypedLayout<M>;
        }
        $crate::__lift_unary!(@arity $TypedLayout, $Rule, [Ctx]; (A0 N0));
        $crate::__lift_unary!(@arity $TypedLayout, $Rule, [Ctx]; (A0 N0) (A1 N1));
        $crate::__lift_unary!(@arity $TypedLayout, $Rule, [Ctx]; (A0 N0) (A1 N1) (A2 N2));
        $crate::__lift_unary!(@arity $TypedLayout, $Rule, [Ctx]; (A0 N0) (A1 N1) (A2 N2) (A3 N3));
    };
    (@arity $TypedLayout:ident, $Rule:ident, []; $(($a:ident $n:ident))+) => {
        impl<$($a, $n,)+> $TypedLayout<($($n,)+)> for ($($a,)+)
        where
            $($a: $Rule<$n> + $crate::typed::PlacementMarker,
              $n: $crate::typed::MeshDim,)+
            ($($a,)+): $crate::typed::TypedLayout<($($n,)+)>,
            ($(<$a as $Rule<$n>>::Out,)+): $crate::typed::TypedLayout<($($n,)+)>,
        {
            type Out = ($(<$a as $Rule<$n>>::Out,)+);
        }
    };
    (@arity $TypedLayout:ident, $Rule:ident, [$ctx:ident]; $(($a:ident $n:ident))+) => {
        impl<$($a, $n,)+ $ctx> $TypedLayout<($($n,)+), $ctx> for ($($a,)+)
        where
            $($a: $Rule<$n, $ctx> + $crate::typed::PlacementMarker,
              $n: $crate::typed::MeshDim,)+
            ($($a,)+): $crate::typed::TypedLayout<($($n,)+)>,
            ($(<$a as $Rule<$n, $ctx>>::Out,)+): $crate::typed::TypedLayout<($($n,)+)>,
        {
            type Out = ($(<$a as $Rule<$n, $ctx>>::Out,)+);
        }
    };
}

/// One hidden, uninhabited impl of a binary rule per marker kind (see `markers::Never`).
#[doc(hidden)]
#[macro_export]
macro_rules! __never_binary {
    ($Rule:ident $(, $ctx:ident)?) => {
        #[diagnostic::do_not_recommend]
        impl<const D: usize, N $(, $ctx)?> $Rule<$crate::typed::markers::Never, N $(, $ctx)?>
            for $crate::typed::Shard<D>
        {
            type Out = $crate::typed::Replicate;
        }
        #[diagnostic::do_not_recommend]
        impl<N $(, $ctx)?> $Rule<$crate::typed::markers::Never, N $(, $ctx)?> for $crate::typed::Replicate {
            type Out = $crate::typed::Replicate;
        }
        #[diagnostic::do_not_recommend]
        impl<Op: $crate::typed::ReduceMarker, N $(, $ctx)?> $Rule<$crate::typed::markers::Never, N $(, $ctx)?>
            for $crate::typed::Partial<Op>
        {
            type Out = $crate::typed::Replicate;
        }
    };
}

pub(crate) use crate::{__lift_binary as lift_binary, __lift_unary as lift_unary, __never_binary as never_binary};
