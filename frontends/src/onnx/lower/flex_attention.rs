//! `FlexAttention` (domain `ai.onnx.preview`): scaled dot-product attention over rank-4
//! inputs with optional `score_mod` and `prob_mod` subgraphs, lowered inline (each
//! subgraph once, on the whole score or probability tensor):
//!
//! ```text
//! S = (Q·√scale)·(K·√scale)ᵀ            in Q's type, then in the softmax precision
//! S = score_mod(S);  P = softmax(S);  P = prob_mod(P);  Y = P·V
//! ```
//!
//! Grouped-query attention repeats each K/V head for its contiguous group of query heads.

use ppir::ops::attrs::{SoftmaxAttrs, TransposeAttrs};
use ppir::ops::OpAttrs;
use ppir::{DType, OpKind};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, Importer, Val, R};
use super::super::proto::NodeProto;
use super::attention::{float_type, known};
use super::OrInvalid;

/// The domain of `FlexAttention`.
pub const PREVIEW_DOMAIN: &str = "ai.onnx.preview";

impl Importer<'_> {
    /// A modifier subgraph applied to `x`: one input, one output of `x`'s type.
    fn apply_modifier(&mut self, a: &NodeAttrs, name: &str, x: Val) -> R<Val> {
        let Some(g) = a.graph(name).inv()? else {
            return Ok(x);
        };
        let want = self.ty(&x)?;
        let outs = self.lower_subgraph(g, std::slice::from_ref(&x))?;
        let Ok([y]) = <[Val; 1]>::try_from(outs) else {
            invalid!("the `{name}` subgraph must give exactly one output");
        };
        let got = self.ty(&y)?;
        if got != want {
            invalid!("the `{name}` subgraph must keep its input's type {want}, it gives {got}");
        }
        Ok(y)
    }

    pub(super) fn lower_flex_attention(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        use OpKind as K;
        let (q, k, v) = (self.req(node, 0)?, self.req(node, 1)?, self.req(node, 2)?);
        let (qt, kt, vt) = (self.ty(&q)?, self.ty(&k)?, self.ty(&v)?);
        for (name, t) in [("Q", &qt), ("K", &kt), ("V", &vt)] {
            if t.rank() != 4 || !t.dtype.is_float() {
                invalid!("{name} must be a float tensor of rank 4, not {t}");
            }
        }
        if kt.dtype != qt.dtype || vt.dtype != qt.dtype {
            invalid!("Q, K and V must have one element type, not {qt}, {kt}, {vt}");
        }
        let hq = known(qt.dims[1], "Q's head count")?;
        let hkv = known(kt.dims[1], "K's head count")?;
        let e = known(qt.dims[3], "the head size")?;
        if known(vt.dims[1], "V's head count")? != hkv {
            invalid!("K and V must have the same number of heads");
        }
        if kt.dims[2] != vt.dims[2] {
            invalid!("K and V must have the same sequence length");
        }
        if known(kt.dims[3], "K's head size")? != e {
            invalid!("Q and K must have the same head size");
        }
        if hkv == 0 || hq % hkv != 0 {
            invalid!("Q's head count {hq} must be a multiple of K's {hkv}");
        }
        let group = hq / hkv;
        let scale = match a.float("scale").inv()? {
            Some(s) => s,
            None => 1.0 / (e as f64).sqrt(),
        };
        let compute = match a.int("softmax_precision").inv()? {
            Some(t) => float_type("softmax_precision", t)?,
            None if qt.dtype == DType::F64 => DType::F64,
            None => DType::F32,
        };
        // √scale rounded to float32, then to Q's type (as the reference computes it).
        let root = (scale as f32).sqrt() as f64;
        let (k, v) = if group == 1 {
            (k, v)
        } else {
            (self.repeat_heads(k, group)?, self.repeat_heads(v, group)?)
        };
        let qs = self.with_scalar(K::Mul, q, root)?;
        let ks = self.with_scalar(K::Mul, k, root)?;
        let swap = TransposeAttrs {
            perm: Some(vec![0, 1, 3, 2]),
        };
        let kts = self.op(K::Transpose, swap.to_attrs(), &[ks])?;
        let scores = self.binop(K::MatMul, qs, kts)?;
        let scores = self.cast_to(scores, compute)?;
        let scores = self.apply_modifier(a, "score_mod", scores)?;
        let probs = self.op(K::Softmax, SoftmaxAttrs { axis: -1 }.to_attrs(), &[scores])?;
        let probs = self.apply_modifier(a, "prob_mod", probs)?;
        let v = self.cast_to(v, compute)?;
        let y = self.binop(K::MatMul, probs, v)?;
        self.cast_to(y, vt.dtype)
    }
}
