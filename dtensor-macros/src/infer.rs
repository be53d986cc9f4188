//! Inference the type system cannot do alone: in `x.add(&y.redistribute()?)` the target of
//! `redistribute` is any layout `add` accepts beside `x`'s (`Replicate + Replicate` and
//! `Replicate + Partial<Sum>` are both legal), so rustc asks for an annotation (E0283). In a
//! `#[distribute]` body that form means "`y` in `x`'s layout", and the body is rewritten to say
//! so: `{ let lhs = &x; lhs.add(&y.redistribute_like(lhs)?) }` (`Dt::redistribute_like`).
//! Nothing else changes: an explicit target (`redistribute::<L>()`) is left alone, the receiver
//! is still evaluated once and before the operand, and every token keeps the user's span, so an
//! illegal target is reported at the user's `redistribute`.

use quote::quote_spanned;
use syn::visit_mut::VisitMut;
use syn::{Expr, ExprMethodCall};

/// The typed methods whose operand may take the receiver's layout: same-rank element-wise ops
/// and comparisons (the receiver's layout is always one of the operand's legal partners).
const SAME_LAYOUT_OPS: &[&str] =
    &["add", "sub", "mul", "div", "eq_mask", "ne_mask", "lt_mask", "le_mask", "gt_mask", "ge_mask"];

/// Rewrites every `recv.op(&arg.redistribute()?)` of `block` (closures and nested blocks
/// included) as described in the module docs.
pub(crate) fn operands_take_receiver_layout(block: &mut syn::Block) {
    Rewrite.visit_block_mut(block);
}

struct Rewrite;

impl VisitMut for Rewrite {
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

impl Rewrite {
    fn rewrite(&self, call: &ExprMethodCall) -> Option<Expr> {
        if !SAME_LAYOUT_OPS.contains(&call.method.to_string().as_str()) || call.args.len() != 1 {
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
        let like = syn::Ident::new("redistribute_like", at);
        // The receiver's binding again, at the user's `redistribute`: rustc puts an illegal
        // target's error on this argument.
        let lhs_at = syn::Ident::new("__dtensor_lhs", at);
        let target = quote_spanned!(at=> & #operand.#like(#lhs_at) #q);
        let attrs = &call.attrs;
        let m_at = call.method.span();
        // In parentheses: a block at the start of a statement would end the statement there.
        Some(
            syn::parse2(quote_spanned!(m_at=> ({
                #(#attrs)*
                let #lhs = &#recv;
                #lhs.#method(#target)
            })))
            .expect("a block of a let and a method call parses"),
        )
    }
}

fn strip_parens(e: &Expr) -> &Expr {
    match e {
        Expr::Paren(p) => strip_parens(&p.expr),
        other => other,
    }
}
