//! Inference the type system cannot do alone: in `x.add(&y.redistribute()?)` the target of
//! `redistribute` is any layout `add` accepts beside `x`'s (`Replicate + Replicate` and
//! `Replicate + Partial<Sum>` are both legal), so rustc asks for an annotation (E0283). In a
//! `#[distribute]` body that form means "`y` in the layout the op needs beside `x`'s" — `x`'s
//! own, or `Replicate` where a `Partial` `x` is multiplied or divided — and the body is rewritten
//! to say so: `({ let lhs = &x; lhs.add(&y.redistribute_operand::<Same, _, _>(lhs)?) })`
//! (`Dt::redistribute_operand`, the form of `Dt::redistribute_like` that knows the op).
//! Nothing else changes: an explicit target (`redistribute::<L>()`) or a turbofish on the op is
//! left alone, the receiver is still evaluated once and before the operand, attributes stay on
//! the expression, and every token keeps the user's span, so an illegal target is reported at
//! the user's `redistribute`. Macro calls in the body (`assert!(..)`, `vec![..]`) are token
//! streams to syn and are not rewritten.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::visit_mut::VisitMut;
use syn::{Expr, ExprMethodCall};

/// The typed methods whose operand may take a layout read off the receiver's, with the kind
/// of op (`typed::operand`): element-wise ops and comparisons of the same rank.
const OPS: &[(&str, &str)] = &[
    ("add", "Same"),
    ("sub", "Same"),
    ("mul", "Scale"),
    ("div", "Scale"),
    ("eq_mask", "Same"),
    ("ne_mask", "Same"),
    ("lt_mask", "Same"),
    ("le_mask", "Same"),
    ("gt_mask", "Same"),
    ("ge_mask", "Same"),
];

/// Rewrites every `recv.op(&arg.redistribute()?)` of `block` (closures and nested blocks
/// included) as described in the module docs.
pub(crate) fn operands_take_receiver_layout(krate: &TokenStream, block: &mut syn::Block) {
    Rewrite { krate }.visit_block_mut(block);
}

struct Rewrite<'a> {
    krate: &'a TokenStream,
}

impl VisitMut for Rewrite<'_> {
    fn visit_expr_mut(&mut self, e: &mut Expr) {
        // Inner expressions first: `a.add(&b.add(&c.redistribute()?)?.redistribute()?)`.
        syn::visit_mut::visit_expr_mut(self, e);
        if let Expr::MethodCall(call) = e {
            if let Some(new) = self.rewrite(call) {
                *e = new;
            }
        }
    }

    // Items inside the body (nested fns, impls) are the user's own scope, not this body's.
    fn visit_item_mut(&mut self, _: &mut syn::Item) {}
}

impl Rewrite<'_> {
    fn rewrite(&self, call: &mut ExprMethodCall) -> Option<Expr> {
        let kind = OPS.iter().find(|(name, _)| call.method == name)?.1;
        if call.turbofish.is_some() || call.args.len() != 1 {
            return None;
        }
        let Expr::Reference(r) = strip_parens(&call.args[0]) else { return None };
        if r.mutability.is_some() {
            return None;
        }
        let Expr::Try(t) = strip_parens(&r.expr) else { return None };
        let Expr::MethodCall(redist) = strip_parens(&t.expr) else { return None };
        if redist.method != "redistribute" || redist.turbofish.is_some() || !redist.args.is_empty() {
            return None;
        }
        // User context (rustc would point an error on a macro-context argument at the
        // attribute): a user's variable named `__dtensor_lhs` would be shadowed in the operand.
        let lhs = syn::Ident::new("__dtensor_lhs", call.method.span());
        let recv = &call.receiver;
        let method = &call.method;
        let operand = &redist.receiver;
        let q = &t.question_token;
        let at = redist.method.span();
        // The receiver's binding again, at the user's `redistribute`: rustc puts an illegal
        // target's error on this argument.
        let lhs_at = syn::Ident::new("__dtensor_lhs", at);
        let kind = syn::Ident::new(kind, at);
        let krate = self.krate;
        let target = quote_spanned!(at=>
            & #operand.redistribute_operand::<#krate::typed::operand::#kind, _, _>(#lhs_at) #q
        );
        let m_at = call.method.span();
        let block = quote_spanned!(m_at=> {
            let #lhs = &#recv;
            #lhs.#method(#target)
        });
        // In parentheses (a block at the start of a statement would end the statement there),
        // with the user's attributes on the whole expression.
        let mut paren: syn::ExprParen = syn::parse2(quote!((#block))).expect("a parenthesized block parses");
        paren.attrs = std::mem::take(&mut call.attrs);
        Some(Expr::Paren(paren))
    }
}

fn strip_parens(e: &Expr) -> &Expr {
    match e {
        Expr::Paren(p) => strip_parens(&p.expr),
        other => other,
    }
}
