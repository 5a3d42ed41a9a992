//! ONNX `LinearAttention` (opset 27), its recurrence unrolled over the (static) sequence
//! length T into ppir ops, computed in float32:
//!
//! ```text
//! S ← exp(g_t) · S                      (gated, gated_delta)
//! v_t ← β_t · (v_t - Sᵀ k_t)            (delta, gated_delta)
//! S ← S + k_t ⊗ v_t
//! o_t = scale · q_t · S                 (each KV head's state read by its query heads)
//! ```
//!
//! with q, k, v of [B, T, H·D] unpacked to [B, H, T, D]; `present_state` is the final S.
//! Each step is a few `matmul`s, products and slices, so gradients flow through the
//! unrolled steps.

use ppir::ops::attrs::{ConcatAttrs, ShapeAttrs, TransposeAttrs, UnsqueezeAttrs};
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, Dim, OpKind, Tensor};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, unsupported, Importer, Val, BATCH_NEEDED, R};
use super::super::proto::NodeProto;
use super::attention::known;
use super::OrInvalid;

/// The longest sequence unrolled at import time.
const MAX_STEPS: usize = 4096;

impl Importer<'_> {
    /// [B, T, H·D] → [B, H, T, D] in float32.
    fn heads(&mut self, x: Val, b: i64, t: i64, h: i64) -> R<Val> {
        use OpKind as K;
        let x = self.cast_to(x, DType::F32)?;
        let split = ShapeAttrs {
            shape: vec![b, t, h, -1],
        };
        let x = self.op(K::Reshape, split.to_attrs(), &[x])?;
        let perm = TransposeAttrs {
            perm: Some(vec![0, 2, 1, 3]),
        };
        self.op(K::Transpose, perm.to_attrs(), &[x])
    }

    pub(super) fn lower_linear_attention(
        &mut self,
        node: &NodeProto,
        a: &NodeAttrs,
    ) -> R<Vec<Val>> {
        use OpKind as K;
        if self.opset < 27 {
            return Err(self.unsupported_op(node));
        }
        let (q, k, v) = (self.req(node, 0)?, self.req(node, 1)?, self.req(node, 2)?);
        let (past, decay, beta) = (
            self.input(node, 3)?,
            self.input(node, 4)?,
            self.input(node, 5)?,
        );
        let rule = a.string_or("update_rule", "gated_delta").inv()?;
        let (gating, delta) = match rule.as_str() {
            "linear" => (false, false),
            "gated" => (true, false),
            "delta" => (false, true),
            "gated_delta" => (true, true),
            r => invalid!("unknown update_rule {r:?}"),
        };
        if gating != decay.is_some() {
            let how = if gating { "needs" } else { "forbids" };
            invalid!("update_rule {rule:?} {how} the decay input");
        }
        if delta != beta.is_some() {
            let how = if delta { "needs" } else { "forbids" };
            invalid!("update_rule {rule:?} {how} the beta input");
        }
        let (Some(hq), Some(hkv)) = (a.int("q_num_heads").inv()?, a.int("kv_num_heads").inv()?)
        else {
            invalid!("attributes `q_num_heads` and `kv_num_heads` are required")
        };
        if hq <= 0 || hkv <= 0 || hq % hkv != 0 {
            invalid!("q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hkv})");
        }
        let (qt, kt, vt) = (self.ty(&q)?, self.ty(&k)?, self.ty(&v)?);
        for (name, t) in [("query", &qt), ("key", &kt), ("value", &vt)] {
            if t.rank() != 3 || !t.dtype.is_float() {
                invalid!("{name} must be a float tensor of rank 3 (B, T, H·D), not {t}");
            }
        }
        let b = match qt.dims[0] {
            Dim::Known(n) => n as i64,
            Dim::Batch => unsupported!("{}", BATCH_NEEDED),
        };
        let steps = known(qt.dims[1], "the sequence length")?;
        if steps == 0 {
            unsupported!("an empty sequence (T = 0)");
        }
        if steps > MAX_STEPS {
            unsupported!("a sequence of {steps} steps is too long to unroll (at most {MAX_STEPS})");
        }
        let t = steps as i64;
        let (qw, kw, vw) = (
            known(qt.dims[2], "query's width")? as i64,
            known(kt.dims[2], "key's width")? as i64,
            known(vt.dims[2], "value's width")? as i64,
        );
        if qw % hq != 0 || kw % hkv != 0 || vw % hkv != 0 {
            invalid!("the widths {qw}, {kw}, {vw} are not multiples of the head counts");
        }
        let (dk, dv) = (qw / hq, vw / hkv);
        if kw / hkv != dk {
            invalid!(
                "query and key heads must have the same size ({dk} and {})",
                kw / hkv
            );
        }
        let group = hq / hkv;
        let scale = a.float_or("scale", 0.0).inv()?;
        let scale = if scale == 0.0 {
            1.0 / (dk as f64).sqrt()
        } else {
            scale
        };
        let q4 = self.heads(q, b, t, hq)?;
        let k4 = self.heads(k, b, t, hkv)?;
        let v4 = self.heads(v, b, t, hkv)?;
        let swap_last = TransposeAttrs {
            perm: Some(vec![0, 1, 3, 2]),
        };
        // Per step, the decay as [B, Hkv, 1 or dk, 1] (broadcast over S's columns).
        let decay4 = match decay {
            Some(g) => {
                let gt = self.ty(&g)?;
                let last = match (gt.rank(), gt.dims.get(2).and_then(|d| d.known())) {
                    (3, Some(w)) if w as i64 == hkv => 1,
                    (3, Some(w)) if w as i64 == hkv * dk => dk,
                    _ => invalid!(
                        "decay must be [B, T, {hkv}] or [B, T, {}], not {gt}",
                        hkv * dk
                    ),
                };
                let g = self.cast_to(g, DType::F32)?;
                let split = ShapeAttrs {
                    shape: vec![b, t, hkv, last],
                };
                let g = self.op(K::Reshape, split.to_attrs(), &[g])?;
                let perm = TransposeAttrs {
                    perm: Some(vec![0, 2, 3, 1]),
                };
                // [B, Hkv, last, T]: step i is the slice i..i+1 of the last axis.
                Some(self.op(K::Transpose, perm.to_attrs(), &[g])?)
            }
            None => None,
        };
        let beta4 = match beta {
            Some(be) => {
                let bt = self.ty(&be)?;
                let hb = match (bt.rank(), bt.dims.get(2).and_then(|d| d.known())) {
                    (3, Some(w)) if w as i64 == hkv || w == 1 => w as i64,
                    _ => invalid!("beta must be [B, T, {hkv}] or [B, T, 1], not {bt}"),
                };
                let be = self.cast_to(be, DType::F32)?;
                let split = ShapeAttrs {
                    shape: vec![b, t, hb, 1],
                };
                let be = self.op(K::Reshape, split.to_attrs(), &[be])?;
                let perm = TransposeAttrs {
                    perm: Some(vec![0, 2, 1, 3]),
                };
                // [B, Hb, T, 1]
                Some(self.op(K::Transpose, perm.to_attrs(), &[be])?)
            }
            None => None,
        };
        let state_shape = [b, hkv, dk, dv];
        let state_dtype;
        let mut state = match past {
            Some(p) => {
                let pt = self.ty(&p)?;
                let want: Vec<Dim> = state_shape.iter().map(|&d| Dim::Known(d as u64)).collect();
                if pt.dims != want {
                    invalid!("past_state must have shape {state_shape:?}, not {pt}");
                }
                state_dtype = pt.dtype;
                self.cast_to(p, DType::F32)?
            }
            None => {
                state_dtype = qt.dtype;
                let n = state_shape.iter().product::<i64>() as usize;
                let shape = state_shape.iter().map(|&d| d as usize).collect();
                Val::konst(Tensor::from_f64(DType::F32, shape, vec![0.0; n]))
            }
        };
        let mut outs = Vec::with_capacity(steps);
        for i in 0..t {
            let qi = self.slice_axis(q4.clone(), 2, i, i + 1, 1)?; // [B, Hq, 1, dk]
            let ki = self.slice_axis(k4.clone(), 2, i, i + 1, 1)?; // [B, Hkv, 1, dk]
            let mut vi = self.slice_axis(v4.clone(), 2, i, i + 1, 1)?; // [B, Hkv, 1, dv]
            if let Some(g) = &decay4 {
                let gi = self.slice_axis(g.clone(), 3, i, i + 1, 1)?; // [B, Hkv, 1|dk, 1]
                let e = self.un(K::Exp, gi)?;
                state = self.binop(K::Mul, state, e)?;
            }
            if let Some(be) = &beta4 {
                let retrieved = self.op(K::MatMul, Attrs::new(), &[ki.clone(), state.clone()])?;
                let d = self.binop(K::Sub, vi, retrieved)?;
                let bi = self.slice_axis(be.clone(), 2, i, i + 1, 1)?; // [B, Hb, 1, 1]
                vi = self.binop(K::Mul, bi, d)?;
            }
            let kc = self.op(K::Transpose, swap_last.to_attrs(), &[ki])?; // [B, Hkv, dk, 1]
            let outer = self.op(K::MatMul, Attrs::new(), &[kc, vi])?;
            state = self.binop(K::Add, state, outer)?;
            let read = if group == 1 {
                state.clone()
            } else {
                let u = UnsqueezeAttrs { axes: vec![2] };
                let s5 = self.op(K::Unsqueeze, u.to_attrs(), std::slice::from_ref(&state))?;
                let wide = ShapeAttrs {
                    shape: vec![b, hkv, group, dk, dv],
                };
                let s5 = self.op(K::Expand, wide.to_attrs(), &[s5])?;
                let back = ShapeAttrs {
                    shape: vec![b, hq, dk, dv],
                };
                self.op(K::Reshape, back.to_attrs(), &[s5])?
            };
            let o = self.op(K::MatMul, Attrs::new(), &[qi, read])?; // [B, Hq, 1, dv]
            outs.push(self.with_scalar(K::Mul, o, scale)?);
        }
        let o = if outs.len() == 1 {
            outs.remove(0)
        } else {
            self.op(K::Concat, ConcatAttrs { axis: 2 }.to_attrs(), &outs)?
        };
        let perm = TransposeAttrs {
            perm: Some(vec![0, 2, 1, 3]),
        };
        let o = self.op(K::Transpose, perm.to_attrs(), &[o])?;
        let pack = ShapeAttrs {
            shape: vec![b, t, hq * dv],
        };
        let o = self.op(K::Reshape, pack.to_attrs(), &[o])?;
        let o = self.cast_to(o, qt.dtype)?;
        let present = self.cast_to(state, state_dtype)?;
        Ok(vec![o, present])
    }
}
