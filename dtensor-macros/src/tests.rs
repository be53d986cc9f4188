//! Unit tests of parsing, validation and expansion (the trybuild tests in `ui-tests` check the
//! messages as users see them).

use crate::attr::{self, Kind, ListKind};
use crate::errors::Errors;

use quote::quote;

fn args(tokens: proc_macro2::TokenStream) -> (attr::Args, Option<String>) {
    let mut errs = Errors::default();
    let a = attr::parse_args(tokens, &mut errs);
    (a, errs.into_compile_errors().map(|e| e.to_string()))
}

#[test]
fn parses_mesh_and_placement_forms() {
    let (a, e) = args(quote!(mesh = " dp , tp ", placements = [Shard(-1), Partial(avg)], returns = [tp = Shard(0)]));
    assert!(e.is_none(), "{e:?}");
    assert_eq!(a.mesh.as_ref().map(|m| m.names.clone()), Some(vec!["dp".to_string(), "tp".to_string()]));
    let Some(ListKind::Positional(ps)) = a.placements.map(|l| l.kind) else { panic!("positional list") };
    assert!(matches!(ps[0].kind, Kind::Shard(-1)));
    assert!(matches!(ps[1].kind, Kind::Partial("Avg")));
    let Some(attr::Returns::All(attr::PlacementList { kind: ListKind::Keyed(kv), .. })) = a.returns else {
        panic!("keyed list")
    };
    assert_eq!(kv[0].0, "tp");
    assert!(matches!(kv[0].2.kind, Kind::Shard(0)));
}

#[test]
fn reports_every_bad_argument() {
    let (a, e) = args(quote!(mesh = "dp,,dp", placements = [Shard, Partial(median)], layout = 1));
    let e = e.expect("errors");
    for needle in [
        "empty mesh dim name",
        "duplicate mesh dim name `dp`",
        "`Shard` needs",
        "unknown reduce op",
        "unknown `#[distribute]` argument `layout`",
    ] {
        assert!(e.contains(needle), "missing `{needle}` in {e}");
    }
    assert!(a.had_error && a.mesh.is_none() && a.placements.is_none());
}

fn expand(args: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> String {
    crate::distribute_impl(args, item).to_string()
}

#[test]
fn struct_expansion_types_fields_and_generates_glue() {
    let out = expand(
        quote!(mesh = "dp,tp"),
        quote! {
            pub struct Mlp {
                #[placements = [Replicate, Shard(-1)]]
                pub w: DTensor<f32, 3>,
                #[placements = [Replicate, Shard(0)]]
                pub ws: Vec<DTensor<f32>>,
                pub blocks: Vec<Block>,
                pub n: usize,
            }
        },
    );
    assert!(out.contains(":: dtensor :: typed :: Dt < f32 , (:: dtensor :: typed :: dims :: dp , :: dtensor :: typed :: dims :: tp ,) , (:: dtensor :: Replicate , :: dtensor :: Shard < 2 > ,) , 3 >"), "{out}");
    for needle in [
        "pub ws : Vec < :: dtensor :: typed :: Dt < f32",
        "pub ws : Vec < :: dtensor :: ndarray :: ArrayD < f32 > >",
        "pub blocks : < Vec < Block > as :: dtensor :: typed :: Parameters < f32 > > :: Global",
        "struct MlpGlobal",
        "fn distribute",
        "fn named_parameters",
        "# [automatically_derived] impl :: dtensor :: Module < f32 > for Mlp",
        "pub n : usize",
    ] {
        assert!(out.contains(needle), "missing `{needle}` in {out}");
    }
    assert!(!out.contains("compile_error"), "{out}");
}

#[test]
fn crate_argument_replaces_the_facade_path() {
    let out = expand(
        quote!(mesh = "tp", crate = "::my_dt", placements = [Shard(0)]),
        quote!(
            pub struct L {
                pub w: DTensor<f32>,
            }
        ),
    );
    assert!(out.contains(":: my_dt :: typed :: Dt"), "{out}");
    assert!(!out.contains(":: dtensor ::"), "{out}");
}

#[test]
fn fn_expansion_gives_arguments_their_concrete_layout_without_generics() {
    let out = expand(
        quote!(mesh = "tp", placements = [Shard(0)], returns = [Replicate]),
        quote! {
            fn f(mut x: DTensor<f64>, #[placements(Replicate)] w: &DTensor<f64>, xs: &[DTensor<f64>]) -> Result<DTensor<f64>> { todo!() }
        },
    );
    for needle in [
        "fn f (mut x : :: dtensor :: typed :: Dt < f64 , (:: dtensor :: typed :: dims :: tp ,) , (:: dtensor :: Shard < 0 > ,) , 2 >",
        "w : & :: dtensor :: typed :: Dt < f64 , (:: dtensor :: typed :: dims :: tp ,) , (:: dtensor :: Replicate ,) , 2 >",
        "xs : & [:: dtensor :: typed :: Dt < f64 , (:: dtensor :: typed :: dims :: tp ,) , (:: dtensor :: Shard < 0 > ,) , 2 >]",
        "-> Result < :: dtensor :: typed :: Dt < f64 , (:: dtensor :: typed :: dims :: tp ,) , (:: dtensor :: Replicate ,) , 2 > >",
    ] {
        assert!(out.contains(needle), "missing `{needle}` in {out}");
    }
    assert!(!out.contains("__DtLayout"), "hidden generic in {out}");
}

#[test]
fn raw_identifier_mesh_dims_are_errors_not_panics() {
    let out = expand(
        quote!(mesh = "r#dp,tp"),
        quote!(
            pub struct L {
                w: DTensor<f32>,
            }
        ),
    );
    assert!(out.contains("raw identifier"), "{out}");
}

#[test]
fn fields_not_parameters_by_syntax_are_checked_once_and_assumed_elsewhere() {
    let out = expand(
        quote!(mesh = "tp", placements = [Shard(0)]),
        quote! {
            pub struct L {
                pub w: DTensor<f32>,
                pub ws: Option<Box<DTensor<f32>>>,
                pub inner: Vec<Block>,
            }
        },
    );
    // One check at the field, and the same bound on every generated item (not on fields whose
    // syntax already makes them parameters).
    assert_eq!(out.matches("field_is_a_parameter_module_or_plain_data :: < f32 , Vec < Block > >").count(), 1, "{out}");
    let bound = "for < '__dt > Vec < Block > : :: dtensor :: typed :: Parameters < f32 >";
    assert_eq!(out.matches(bound).count(), 4, "Global struct, Parameters, inherent and Module impls: {out}");
    assert!(!out.contains("for < '__dt > Option"), "{out}");
    assert!(!out.contains("for < '__dt > :: dtensor :: typed :: Dt"), "{out}");
}

#[test]
fn integer_tensor_fields_are_one_error_and_the_stubs_stay_float() {
    let out = expand(
        quote!(mesh = "tp", placements = [Shard(0)]),
        quote! {
            pub struct Tokens {
                pub ids: DTensor<i64>,
            }
        },
    );
    assert_eq!(out.matches("compile_error").count(), 1, "{out}");
    assert!(out.contains("parameters are floating point"), "{out}");
    assert!(out.contains(":: dtensor :: Module < f32 > for Tokens"), "{out}");
}

#[test]
fn invalid_input_falls_back_to_the_plain_item_and_stubs() {
    let out = expand(
        quote!(mesh = "dp,tp"),
        quote!(
            pub struct L {
                #[placements = [Shard(3), Replicate]]
                pub w: DTensor<f32, 3>,
            }
        ),
    );
    assert!(out.contains("compile_error"), "{out}");
    assert!(out.contains("pub w : DTensor < f32 >"), "rank stripped in the fallback: {out}");
    assert!(!out.contains("placements ="), "helper attribute stripped: {out}");
    for needle in ["struct LGlobal", "fn distribute", ":: dtensor :: Module < f32 > for L"] {
        assert!(out.contains(needle), "missing stub `{needle}` in {out}");
    }
}

/// The macro cannot call the runtime at expansion time, so it keeps small copies of the
/// runtime's tables; these tests keep them equal.
#[test]
fn tables_agree_with_the_runtime() {
    assert_eq!(crate::expand::PREDEFINED_DIMS, dtensor_runtime::typed::dims::PREDEFINED);
    let runtime: Vec<(&str, String)> =
        dtensor_runtime::ReduceOp::SPELLINGS.iter().map(|(s, op)| (*s, format!("{op:?}"))).collect();
    let ours: Vec<(&str, String)> = attr::REDUCE_OPS.iter().map(|(s, m)| (*s, m.to_string())).collect();
    assert_eq!(ours, runtime, "reduce-op spellings and their markers");
    for rank in 0..5usize {
        for d in -7i64..7 {
            let runtime = dtensor_runtime::shape::normalize_dim(d as isize, rank);
            assert_eq!(crate::valid::normalize_dim(d, rank), runtime, "dim {d} rank {rank}");
        }
    }
}

/// The resting layout of `fsdp = ".."` (the types of `{Name}Shards`) is the runtime's
/// `fsdp::resting_layout`, for every parameter layout on meshes of 1 to 3 dims, ranks 0 to 4,
/// FSDP over each dim.
#[test]
fn resting_layouts_agree_with_the_runtime() {
    use crate::valid::{resting, Marker};
    use dtensor_runtime::Placement;
    let to_runtime = |m: &Marker| match m {
        Marker::Shard(d) => Placement::Shard(*d as isize),
        _ => Placement::Replicate,
    };
    let mut checked = 0;
    for ndim in 1..=3usize {
        for rank in 0..=4usize {
            // each mesh dim Replicate or Shard(0..rank)
            let choices: Vec<Marker> = std::iter::once(Marker::Replicate).chain((0..rank).map(Marker::Shard)).collect();
            for code in 0..choices.len().pow(ndim as u32) {
                let markers: Vec<Marker> =
                    (0..ndim).map(|i| choices[code / choices.len().pow(i as u32) % choices.len()]).collect();
                for pos in (0..ndim).filter(|&p| markers[p] == Marker::Replicate) {
                    let in_use: Vec<Placement> = markers.iter().map(to_runtime).collect();
                    let runtime = dtensor_runtime::fsdp::resting_layout(&in_use, rank, pos).unwrap_or(in_use);
                    let ours: Vec<Placement> = resting(&markers, rank, pos).iter().map(to_runtime).collect();
                    assert_eq!(ours, runtime, "layout {markers:?} rank {rank} fsdp dim {pos}");
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 100, "{checked}");
}

#[test]
fn fn_bodies_run_in_an_implicit_scope_unless_allowed() {
    let f = quote!(
        fn f(x: &DTensor<f32>) -> Result<DTensor<f32>> {
            todo!()
        }
    );
    let deny = expand(quote!(mesh = "tp", placements = [Shard(0)]), f.clone());
    assert!(deny.contains("forbid_implicit") && deny.contains("function : \"f\""), "{deny}");
    let allow = expand(quote!(mesh = "tp", placements = [Shard(0)], implicit = "allow"), f);
    assert!(allow.contains("allow_implicit") && !allow.contains("forbid_implicit"), "{allow}");
    let (_, e) = args(quote!(mesh = "tp", implicit = "maybe"));
    assert!(e.is_some_and(|e| e.contains("`implicit` is")));
}

#[test]
fn trait_impl_methods_keep_the_traits_signature_and_check_on_entry() {
    let out = expand(
        quote!(mesh = "tp", placements = [Shard(0)]),
        quote! {
            impl Forward<f32> for Block {
                fn forward(&self, x: &DTensor<f32>) -> Result<DTensor<f32>> { todo!() }
            }
        },
    );
    for needle in [
        "fn forward (& self , x : & DTensor < f32 >) -> Result < DTensor < f32 > >",
        "let x : & :: dtensor :: typed :: Dt < f32 , (:: dtensor :: typed :: dims :: tp ,) , (:: dtensor :: Shard < 0 > ,) , 2 > = :: dtensor :: typed :: Dt :: from_argument_ref (x , \"x\" , \"forward\" , (:: core :: file ! () , :: core :: line ! ())) ?",
        "map (:: dtensor :: typed :: Dt :: into_dtensor)",
    ] {
        assert!(out.contains(needle), "missing `{needle}` in {out}");
    }
    // In an inherent impl the method gets the typed signature.
    let out = expand(
        quote!(mesh = "tp", placements = [Shard(0)]),
        quote! {
            impl Block {
                fn forward(&self, x: &DTensor<f32>) -> Result<DTensor<f32>> { todo!() }
                fn width(&self) -> usize { 0 }
            }
        },
    );
    assert!(out.contains("x : & :: dtensor :: typed :: Dt <"), "{out}");
    assert!(out.contains("fn width (& self) -> usize { 0 }"), "{out}");
}

/// The body rewrite of `x.op(&y.redistribute()?)`: applied to the same-layout ops (nested,
/// parenthesized, in closures) with the op's kind, attributes kept on the expression; left
/// alone for an explicit target, a turbofish on the op, another method, a second argument, a
/// mutable borrow, and items nested in the body.
#[test]
fn operands_take_the_receiver_layout_only_in_the_inferred_form() {
    let rewrite = |body: proc_macro2::TokenStream| {
        let mut block: syn::Block = syn::parse2(quote!({ #body })).expect("a block");
        crate::infer::operands_take_receiver_layout(&quote!(::dtensor), &mut block);
        quote!(#block).to_string().replace(' ', "")
    };
    let count = |s: &str| s.matches("redistribute_operand::<").count();
    let s = rewrite(quote!(let z = x.add(&y.redistribute()?)?;));
    assert_eq!(count(&s), 1, "{s}");
    assert!(
        s.contains("let__dtensor_lhs=&x;__dtensor_lhs.add(&y.redistribute_operand::<::dtensor::typed::operand::Same,_,_>(__dtensor_lhs)?)"),
        "{s}"
    );
    let s = rewrite(quote!(let z = p.mul(&y.redistribute()?)?;));
    assert!(s.contains("operand::Scale"), "{s}");
    let s = rewrite(quote!(x.add(&x.mul(&(s.redistribute()?))?.redistribute()?)?.lt_mask(&w.redistribute()?)?;));
    assert_eq!(count(&s), 3, "{s}");
    let s = rewrite(quote!(let f = || a.div(&b.redistribute()?);));
    assert_eq!(count(&s), 1, "{s}");
    let s = rewrite(quote!(#[allow(unused_must_use)] x.add(&y.redistribute()?);));
    assert!(s.starts_with("{#[allow(unused_must_use)]({let__dtensor_lhs"), "{s}");
    for untouched in [
        quote!(x.add(&y.redistribute::<(Shard<0>, Replicate)>()?)?;),
        quote!(x.mul::<(Shard<0>, Replicate)>(&y.redistribute()?)?;),
        quote!(x.matmul(&w.redistribute()?)?;),
        quote!(x.add(&y.redistribute()?, 1)?;),
        quote!(x.add(&mut y.redistribute()?)?;),
        quote!(x.add(&y.redistribute()?.gelu()?)?;),
        quote!(
            fn inner() {
                x.add(&y.redistribute()?);
            }
        ),
    ] {
        let s = rewrite(untouched);
        assert_eq!(count(&s), 0, "{s}");
    }
}
