//! The transformer ops of opsets 23–25 (`Attention`, `RMSNormalization`, `RotaryEmbedding`),
//! decomposed into ppir ops (matmul, softmax, where, reshape, slice, gather, ...) so that
//! autodiff, the cost model and codegen need nothing new. Masks that depend only on shapes
//! (causal, sliding window) are built at import time; masks given as inputs
//! (`attn_mask`, `nonpad_kv_seqlen`) become run-time ops.

use std::rc::Rc;

use ppir::ops::attrs::{
    CastAttrs, ConcatAttrs, GatherAttrs, ReduceAttrs, ShapeAttrs, SliceAttrs, SoftmaxAttrs,
    TransposeAttrs, UnsqueezeAttrs,
};
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, Dim, OpKind, Tensor};

use super::super::attrs::NodeAttrs;
use super::super::import::{
    invalid, scalar, unsupported, Fail, Importer, Val, MATERIALIZE_MAX_ELEMENTS, R,
};
use super::super::proto::NodeProto;
use super::super::tensor::dtype_from_onnx;
use super::{norm_axis, OrInvalid};

/// The first opset of the default domain with these ops.
const OPSET_INTRODUCED: i64 = 23;

/// `Attention`'s `qk_matmul_output_mode`: which intermediate its fourth output shows.
#[derive(Clone, Copy, PartialEq, Eq)]
enum QkOutput {
    /// The scaled `Q·Kᵀ`.
    Raw,
    /// After the softcap.
    Softcapped,
    /// After adding the mask (and causal/window/padding bias).
    WithBias,
    /// The softmax (zero rows where every key is masked).
    Softmax,
}

/// A static dimension, or an error naming what needs it.
pub(super) fn known(d: Dim, what: &str) -> R<usize> {
    match d {
        Dim::Known(n) => usize::try_from(n)
            .map_err(|_| Fail::Invalid(format!("{what} {n} does not fit in memory"))),
        Dim::Batch => unsupported!("{what} is the symbolic batch size; fix it with --batch N"),
    }
}

/// Known sizes of every dimension, or an error naming the input.
pub(super) fn known_dims(dims: &[Dim], what: &str) -> R<Vec<usize>> {
    dims.iter().map(|&d| known(d, what)).collect()
}

/// A reshape target from dimensions: the symbolic batch size becomes -1.
pub(super) fn reshape_spec(dims: &[Dim]) -> R<Vec<i64>> {
    let spec: Vec<i64> = dims
        .iter()
        .map(|d| d.known().map_or(-1, |n| n as i64))
        .collect();
    if spec.iter().filter(|&&d| d == -1).count() > 1 {
        unsupported!("{}", super::super::import::BATCH_NEEDED);
    }
    Ok(spec)
}

/// A float element type from an ONNX type number (`stash_type`, `softmax_precision`).
pub(super) fn float_type(attr: &str, t: i64) -> R<DType> {
    match i32::try_from(t).ok().and_then(dtype_from_onnx) {
        Some(d) if d.is_float() => Ok(d),
        _ => invalid!("attribute `{attr}` must be a float type (1, 10, 11 or 16), not {t}"),
    }
}

impl Importer<'_> {
    /// The ops are new in opset 23: before it their names mean nothing in the default domain.
    fn require_opset_23(&self, node: &NodeProto) -> R<()> {
        if self.opset < OPSET_INTRODUCED {
            return Err(Fail::Onnx(super::super::OnnxError::UnsupportedOp {
                node: self.loc.clone(),
                op_type: node.op_type.clone(),
                domain: node.domain.clone(),
                opset: self.opset,
            }));
        }
        Ok(())
    }

    pub(super) fn cast_to(&mut self, x: Val, to: DType) -> R<Val> {
        if self.ty(&x)?.dtype == to {
            return Ok(x);
        }
        self.op(OpKind::Cast, CastAttrs { to }.to_attrs(), &[x])
    }

    pub(super) fn reshape_to(&mut self, x: Val, dims: &[Dim]) -> R<Val> {
        let shape = reshape_spec(dims)?;
        self.op(OpKind::Reshape, ShapeAttrs { shape }.to_attrs(), &[x])
    }

    pub(super) fn binop(&mut self, kind: OpKind, x: Val, y: Val) -> R<Val> {
        self.op(kind, Attrs::new(), &[x, y])
    }

    /// `x[.., start:end:step]` along `axis`.
    pub(super) fn slice_axis(
        &mut self,
        x: Val,
        axis: i64,
        start: i64,
        end: i64,
        step: i64,
    ) -> R<Val> {
        let attrs = SliceAttrs {
            starts: vec![start],
            ends: vec![end],
            axes: Some(vec![axis]),
            steps: Some(vec![step]),
        };
        self.op(OpKind::Slice, attrs.to_attrs(), &[x])
    }

    // ---- RMSNormalization ----

    /// `Y = X / sqrt(mean(X², axes axis..) + epsilon) · scale`, the first stage computed in
    /// `stash_type` (the opset-23 function body).
    pub(super) fn lower_rms_norm(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        self.require_opset_23(node)?;
        let (x, scale) = (self.req(node, 0)?, self.req(node, 1)?);
        let xt = self.ty(&x)?;
        if !xt.dtype.is_float() {
            invalid!("X must be a float tensor, not {}", xt.dtype);
        }
        let rank = xt.rank();
        if rank == 0 {
            invalid!("X must have rank at least 1");
        }
        let axis = norm_axis(a.int_or("axis", -1).inv()?, rank)?;
        let epsilon = a.float_or("epsilon", 1e-5).inv()?;
        let stash = float_type("stash_type", a.int_or("stash_type", 1).inv()?)?;
        let xu = self.cast_to(x, stash)?;
        let sq = self.binop(OpKind::Mul, xu.clone(), xu.clone())?;
        let reduce = ReduceAttrs {
            axes: (axis as i64..rank as i64).collect(),
            keepdims: true,
        };
        let mean = self.op(OpKind::ReduceMean, reduce.to_attrs(), &[sq])?;
        // The function body casts the float attribute to the stash type.
        let eps = Val::konst(scalar(stash, epsilon as f32 as f64));
        let mean_eps = self.binop(OpKind::Add, mean, eps)?;
        let rms = self.op(OpKind::Sqrt, Attrs::new(), &[mean_eps])?;
        let normalized = self.binop(OpKind::Div, xu, rms)?;
        let normalized = self.cast_to(normalized, xt.dtype)?;
        let scale = self.cast_to(scale, xt.dtype)?;
        self.binop(OpKind::Mul, normalized, scale)
    }

    // ---- RotaryEmbedding ----

    /// Rotates the first `rotary_embedding_dim` features of each head by the position's
    /// angles: halves (or even/odd pairs when `interleaved`) `x1, x2` become
    /// `x1·cos - x2·sin, x1·sin + x2·cos`.
    pub(super) fn lower_rotary_embedding(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        use OpKind as K;
        self.require_opset_23(node)?;
        let x = self.req(node, 0)?;
        let (mut cos, mut sin) = (self.req(node, 1)?, self.req(node, 2)?);
        let position_ids = self.input(node, 3)?;
        let interleaved = a.int_or("interleaved", 0).inv()? != 0;
        let xt = self.ty(&x)?;
        let dims = xt.dims.clone();
        // Work on [B, H, S, D] (4-D input) or [B, S, H, D] (3-D input, split into heads):
        // either way cos/sin of [B, S, r/2] broadcast once a unit axis is inserted.
        let (work, head_axis_of_cache) = match dims.len() {
            4 => (x, 1i64),
            3 => {
                let Some(heads) = a.int("num_heads").inv()? else {
                    invalid!("attribute `num_heads` is required for a 3-D input")
                };
                let hidden = known(dims[2], "the hidden size")? as i64;
                if heads <= 0 || hidden % heads != 0 {
                    invalid!("the hidden size {hidden} is not a multiple of num_heads {heads}");
                }
                let split = [
                    dims[0],
                    dims[1],
                    Dim::Known(heads as u64),
                    Dim::Known((hidden / heads) as u64),
                ];
                (self.reshape_to(x, &split)?, 2i64)
            }
            r => invalid!("the input must be 3-D or 4-D, it has rank {r}"),
        };
        let wdims = self.dims_of(&work)?;
        let head_size = known(wdims[3], "the head size")? as i64;
        let rot = match a.int_or("rotary_embedding_dim", 0).inv()? {
            0 => head_size,
            r if r > 0 && r <= head_size && r % 2 == 0 => r,
            r => invalid!(
                "rotary_embedding_dim {r} must be even and at most the head size {head_size}"
            ),
        };
        if head_size % 2 != 0 {
            invalid!("the head size {head_size} must be even");
        }
        let half = rot / 2;
        if let Some(ids) = position_ids {
            if self.ty(&ids)?.dtype.is_float() {
                invalid!("position_ids must be integers");
            }
            let g = GatherAttrs { axis: 0 }.to_attrs();
            cos = self.op(K::Gather, g.clone(), &[cos, ids.clone()])?;
            sin = self.op(K::Gather, g, &[sin, ids])?;
        }
        for (name, c) in [("cos_cache", &cos), ("sin_cache", &sin)] {
            let cd = self.dims_of(c)?;
            if cd.len() != 3 {
                invalid!(
                    "{name} must be [batch, sequence, rotary_dim/2] after position_ids, it has rank {}",
                    cd.len()
                );
            }
            if cd[2] != Dim::Known(half as u64) {
                invalid!(
                    "the last dimension of {name} must be rotary_embedding_dim/2 = {half}, not {}",
                    cd[2]
                );
            }
        }
        let dt = self.ty(&work)?.dtype;
        let un = UnsqueezeAttrs {
            axes: vec![head_axis_of_cache],
        }
        .to_attrs();
        let cos = self.cast_to(cos, dt)?;
        let sin = self.cast_to(sin, dt)?;
        let cos = self.op(K::Unsqueeze, un.clone(), &[cos])?;
        let sin = self.op(K::Unsqueeze, un, &[sin])?;

        let x_rot = if rot == head_size {
            work.clone()
        } else {
            self.slice_axis(work.clone(), 3, 0, rot, 1)?
        };
        let (x1, x2) = if interleaved {
            (
                self.slice_axis(x_rot.clone(), 3, 0, rot, 2)?,
                self.slice_axis(x_rot, 3, 1, rot, 2)?,
            )
        } else {
            (
                self.slice_axis(x_rot.clone(), 3, 0, half, 1)?,
                self.slice_axis(x_rot, 3, half, rot, 1)?,
            )
        };
        let c1 = self.binop(K::Mul, cos.clone(), x1.clone())?;
        let s2 = self.binop(K::Mul, sin.clone(), x2.clone())?;
        let real = self.binop(K::Sub, c1, s2)?;
        let s1 = self.binop(K::Mul, sin, x1)?;
        let c2 = self.binop(K::Mul, cos, x2)?;
        let imag = self.binop(K::Add, s1, c2)?;
        let rotated = if interleaved {
            // Pairs back in place: [.., r/2, 2] → [.., r].
            let un = UnsqueezeAttrs { axes: vec![4] }.to_attrs();
            let re = self.op(K::Unsqueeze, un.clone(), &[real])?;
            let im = self.op(K::Unsqueeze, un, &[imag])?;
            let pairs = self.op(K::Concat, ConcatAttrs { axis: 4 }.to_attrs(), &[re, im])?;
            let mut d = wdims.clone();
            d[3] = Dim::Known(rot as u64);
            self.reshape_to(pairs, &d)?
        } else {
            self.op(K::Concat, ConcatAttrs { axis: 3 }.to_attrs(), &[real, imag])?
        };
        let out = if rot == head_size {
            rotated
        } else {
            let rest = self.slice_axis(work, 3, rot, head_size, 1)?;
            self.op(
                K::Concat,
                ConcatAttrs { axis: 3 }.to_attrs(),
                &[rotated, rest],
            )?
        };
        if dims.len() == 3 {
            self.reshape_to(out, &dims)
        } else {
            Ok(out)
        }
    }

    // ---- Attention ----

    /// Scaled dot-product attention (Attention-23, -24 with `nonpad_kv_seqlen`, -25 with
    /// sliding windows). Outputs: `Y`, `present_key`, `present_value`, `qk_matmul_output`.
    pub(super) fn lower_attention(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Vec<Val>> {
        use OpKind as K;
        self.require_opset_23(node)?;
        let opset = self.opset;
        let (q, k, v) = (self.req(node, 0)?, self.req(node, 1)?, self.req(node, 2)?);
        let mask = self.input(node, 3)?;
        let (past_key, past_value) = (self.input(node, 4)?, self.input(node, 5)?);
        let nonpad = self.input(node, 6)?;
        if nonpad.is_some() && opset < 24 {
            invalid!("input 6 (nonpad_kv_seqlen) exists from opset 24");
        }
        if past_key.is_some() != past_value.is_some() {
            invalid!("past_key (input 4) and past_value (input 5) must be given together");
        }
        if nonpad.is_some() && past_key.is_some() {
            invalid!("nonpad_kv_seqlen (input 6) cannot be combined with past_key/past_value");
        }
        let is_causal = a.int_or("is_causal", 0).inv()? != 0;
        let q_heads = a.int("q_num_heads").inv()?;
        let kv_heads = a.int("kv_num_heads").inv()?;
        let softcap = a.float_or("softcap", 0.0).inv()?;
        let mode = match a.int_or("qk_matmul_output_mode", 0).inv()? {
            0 => QkOutput::Raw,
            1 => QkOutput::Softcapped,
            2 => QkOutput::WithBias,
            3 => QkOutput::Softmax,
            m => invalid!("qk_matmul_output_mode must be 0, 1, 2 or 3, not {m}"),
        };
        let (left, right) = if opset >= 25 {
            (
                a.int_or("left_window_size", -1).inv()?,
                a.int_or("right_window_size", -1).inv()?,
            )
        } else {
            (-1, -1)
        };
        if left < -1 || right < -1 {
            invalid!("left_window_size and right_window_size must be -1 or non-negative");
        }
        let windowed = left >= 0 || right >= 0;

        let Heads {
            q,
            k,
            v,
            dt,
            rank,
            q_heads: qh,
            kv_heads: kvh,
            head,
            sq,
        } = self.attention_heads(q, k, v, q_heads, kv_heads)?;

        // The cache: present = concat(past, new) along the sequence.
        let cat = ConcatAttrs { axis: 2 }.to_attrs();
        let (k, v, past_len) = match (past_key, past_value) {
            (Some(pk), Some(pv)) => {
                let past_len = known(self.dims_of(&pk)?[2], "the past sequence length")?;
                (
                    self.op(K::Concat, cat.clone(), &[pk, k])?,
                    self.op(K::Concat, cat, &[pv, v])?,
                    past_len,
                )
            }
            _ => (k, v, 0),
        };
        let present_key = k.clone();
        let present_value = v.clone();
        let total = known(self.dims_of(&k)?[2], "the key sequence length")?;

        // Scores: (Q·√scale)(K·√scale)ᵀ, the scale rounded to the input type as the
        // function body does.
        let scale = match a.float("scale").inv()? {
            Some(s) if s > 0.0 => s,
            Some(s) => unsupported!(
                "attribute `scale` = {s}: Q and K are each multiplied by its square root, \
                 so it must be positive"
            ),
            None => 1.0 / (head as f64).sqrt(),
        };
        let root = Val::konst(scalar(dt, scale.sqrt()));
        let qs = self.binop(K::Mul, q, root.clone())?;
        let ks = self.binop(K::Mul, k, root)?;
        let (k_rep, v_rep) = if qh == kvh {
            (ks, v)
        } else {
            (
                self.repeat_heads(ks, qh / kvh)?,
                self.repeat_heads(v, qh / kvh)?,
            )
        };
        let kt = TransposeAttrs {
            perm: Some(vec![0, 1, 3, 2]),
        };
        let kt = self.op(K::Transpose, kt.to_attrs(), &[k_rep])?;
        let qk = self.binop(K::MatMul, qs, kt)?;
        let capped = if softcap > 0.0 {
            let c = Val::konst(scalar(dt, softcap));
            let y = self.binop(K::Div, qk.clone(), c.clone())?;
            let y = self.op(K::Tanh, Attrs::new(), &[y])?;
            self.binop(K::Mul, y, c)?
        } else {
            qk.clone()
        };

        let bias = self.attention_bias(
            mask,
            nonpad,
            BiasShape {
                dt,
                sq,
                total,
                past_len,
                is_causal,
                left,
                right,
                windowed,
            },
        )?;
        let with_bias = match &bias {
            Some(b) => self.binop(K::Add, capped.clone(), b.bias.clone())?,
            None => capped.clone(),
        };

        let precision = match a.int("softmax_precision").inv()? {
            Some(t) => float_type("softmax_precision", t)?,
            None => dt,
        };
        let dead = bias.and_then(|b| b.dead_rows);
        let probs = self.masked_softmax(with_bias.clone(), dead, precision)?;
        let probs = self.cast_to(probs, dt)?;
        let y = self.binop(K::MatMul, probs.clone(), v_rep)?;
        let y = if rank == 3 { self.merge_heads(y)? } else { y };
        let wants_qk = node.output.get(3).is_some_and(|o| !o.is_empty());
        let qk_out = if wants_qk {
            match mode {
                QkOutput::Raw => qk,
                QkOutput::Softcapped => capped,
                QkOutput::WithBias => with_bias,
                QkOutput::Softmax => probs,
            }
        } else {
            Val::Opaque("qk_matmul_output is not requested".into())
        };
        Ok(vec![y, present_key, present_value, qk_out])
    }

    /// Q, K and V as `[B, heads, S, head size]` (3-D inputs split into heads), checked
    /// against each other.
    fn attention_heads(
        &mut self,
        q: Val,
        k: Val,
        v: Val,
        q_heads: Option<i64>,
        kv_heads: Option<i64>,
    ) -> R<Heads> {
        let opset = self.opset;
        let qt = self.ty(&q)?;
        let dt = qt.dtype;
        if !dt.is_float() {
            invalid!("Q must be a float tensor, not {dt}");
        }
        let rank = qt.rank();
        let (kr, vr) = (self.rank_of(&k)?, self.rank_of(&v)?);
        if kr != rank || vr != rank {
            invalid!("Q, K and V must have the same rank, got {rank}, {kr} and {vr}");
        }
        // Q, K, V as [B, heads, S, head size].
        let (q, k, v) = match rank {
            3 => {
                let (Some(qh), Some(kvh)) = (q_heads, kv_heads) else {
                    invalid!(
                        "attributes `q_num_heads` and `kv_num_heads` are required for 3-D inputs"
                    )
                };
                (
                    self.split_heads(q, qh, "Q", "q_num_heads")?,
                    self.split_heads(k, kvh, "K", "kv_num_heads")?,
                    self.split_heads(v, kvh, "V", "kv_num_heads")?,
                )
            }
            4 => {
                if opset >= 25 && (q_heads.is_some() || kv_heads.is_some()) {
                    invalid!("q_num_heads and kv_num_heads must not be given for 4-D inputs");
                }
                (q, k, v)
            }
            r => invalid!("Q, K and V must be 3-D or 4-D, got rank {r}"),
        };
        let (qd, kd, vd) = (self.dims_of(&q)?, self.dims_of(&k)?, self.dims_of(&v)?);
        let qh = known(qd[1], "the number of query heads")?;
        let kvh = known(kd[1], "the number of key heads")?;
        if vd[1] != kd[1] {
            invalid!("K has {} heads, V {}", kd[1], vd[1]);
        }
        if kvh == 0 || qh % kvh != 0 {
            invalid!("the query heads ({qh}) must be a multiple of the key/value heads ({kvh})");
        }
        let head = known(qd[3], "the head size")?;
        if kd[3] != qd[3] {
            invalid!("Q's head size is {}, K's {}", qd[3], kd[3]);
        }
        if kd[2] != vd[2] {
            invalid!("K has {} positions, V {}", kd[2], vd[2]);
        }
        let sq = known(qd[2], "the query sequence length")?;
        Ok(Heads {
            q,
            k,
            v,
            dt,
            rank,
            q_heads: qh,
            kv_heads: kvh,
            head,
            sq,
        })
    }

    /// Softmax over the keys in `precision`. Rows with every key masked (`dead`) give
    /// zeros, and the softmax itself sees zeros there, so neither it nor its gradient is
    /// NaN.
    fn masked_softmax(&mut self, scores: Val, dead: Option<Val>, precision: DType) -> R<Val> {
        use OpKind as K;
        let logits = self.cast_to(scores, precision)?;
        let zero = || Val::konst(scalar(precision, 0.0));
        let logits = match &dead {
            Some(d) => self.op(K::Where, Attrs::new(), &[d.clone(), zero(), logits])?,
            None => logits,
        };
        let probs = self.op(K::Softmax, SoftmaxAttrs { axis: -1 }.to_attrs(), &[logits])?;
        match dead {
            Some(d) => self.op(K::Where, Attrs::new(), &[d, zero(), probs]),
            None => Ok(probs),
        }
    }

    /// `[B, heads, S, size]` → `[B, S, heads·size]`.
    fn merge_heads(&mut self, y: Val) -> R<Val> {
        let perm = TransposeAttrs {
            perm: Some(vec![0, 2, 1, 3]),
        };
        let t = self.op(OpKind::Transpose, perm.to_attrs(), &[y])?;
        let td = self.dims_of(&t)?;
        let (heads, size) = (
            known(td[2], "the query heads")?,
            known(td[3], "V's head size")?,
        );
        let Some(hidden) = heads.checked_mul(size) else {
            invalid!("{heads} heads of size {size} overflow");
        };
        self.reshape_to(t, &[td[0], td[1], Dim::Known(hidden as u64)])
    }

    /// `[B, S, heads·size]` → `[B, heads, S, size]`.
    fn split_heads(&mut self, x: Val, heads: i64, name: &str, attr: &str) -> R<Val> {
        let d = self.dims_of(&x)?;
        let hidden = known(d[2], &format!("{name}'s hidden size"))? as i64;
        if heads <= 0 || hidden % heads != 0 {
            invalid!("{name}'s hidden size {hidden} is not a multiple of {attr} = {heads}");
        }
        let split = [
            d[0],
            d[1],
            Dim::Known(heads as u64),
            Dim::Known((hidden / heads) as u64),
        ];
        let x = self.reshape_to(x, &split)?;
        let perm = TransposeAttrs {
            perm: Some(vec![0, 2, 1, 3]),
        };
        self.op(OpKind::Transpose, perm.to_attrs(), &[x])
    }

    /// Each head `reps` times in a row (`[h0, h0, h1, h1, ..]`), for grouped-query attention.
    pub(super) fn repeat_heads(&mut self, x: Val, reps: usize) -> R<Val> {
        let d = self.dims_of(&x)?;
        let un = UnsqueezeAttrs { axes: vec![2] }.to_attrs();
        let x = self.op(OpKind::Unsqueeze, un, &[x])?;
        let shape = vec![1, 1, reps as i64, 1, 1];
        let x = self.op(OpKind::Expand, ShapeAttrs { shape }.to_attrs(), &[x])?;
        let heads = known(d[1], "the number of key heads")? * reps;
        self.reshape_to(x, &[d[0], Dim::Known(heads as u64), d[2], d[3]])
    }

    /// The additive bias of the scores (0 where a key is attended, `-inf` where masked, plus
    /// a float `attn_mask`) and which rows have no key at all; `None` when nothing masks.
    fn attention_bias(
        &mut self,
        mask: Option<Val>,
        nonpad: Option<Val>,
        s: BiasShape,
    ) -> R<Option<Bias>> {
        use OpKind as K;
        let (sq, total) = (s.sq, s.total);
        // Shape-only masks are built at import time as [sq, total] tensors.
        if sq
            .checked_mul(total)
            .is_none_or(|n| n > MATERIALIZE_MAX_ELEMENTS)
        {
            unsupported!(
                "the attention mask of {sq} queries by {total} keys is too large to build at import time"
            );
        }
        let neg_inf = || Val::konst(scalar(s.dt, f64::NEG_INFINITY));
        let zero = || Val::konst(scalar(s.dt, 0.0));

        // The mask as an additive bias in Q's type, padded to the total length with -inf.
        let mask_bias = match mask {
            None => None,
            Some(m) => {
                let mt = self.ty(&m)?;
                let m = if mt.dtype == DType::Bool {
                    self.op(K::Where, Attrs::new(), &[m, zero(), neg_inf()])?
                } else {
                    self.cast_to(m, s.dt)?
                };
                let md = self.dims_of(&m)?;
                let Some(&last) = md.last() else {
                    invalid!("attn_mask (input 3) must have rank at least 1");
                };
                let last = known(last, "attn_mask's last dimension")?;
                if last > total {
                    invalid!(
                        "attn_mask's last dimension {last} is longer than the key sequence {total}"
                    );
                }
                let m = if last < total {
                    let mut pad: Vec<usize> = Vec::with_capacity(md.len());
                    for d in &md[..md.len() - 1] {
                        pad.push(known(*d, "a dimension of attn_mask")?);
                    }
                    pad.push(total - last);
                    let fill = Val::Splat {
                        value: Rc::new(scalar(s.dt, f64::NEG_INFINITY)),
                        shape: pad,
                    };
                    let axis = md.len() as i64 - 1;
                    self.op(K::Concat, ConcatAttrs { axis }.to_attrs(), &[m, fill])?
                } else {
                    m
                };
                Some(m)
            }
        };

        // Causal and window masks with a static offset (the past length, or 0).
        let static_allowed = if nonpad.is_none() && (s.is_causal || s.windowed) {
            let off = s.past_len as i64;
            let mut allowed = vec![true; sq * total];
            for i in 0..sq {
                for j in 0..total {
                    let diff = i as i64 + off - j as i64;
                    allowed[i * total + j] = (!s.is_causal || diff >= 0)
                        && (s.left < 0 || diff <= s.left)
                        && (s.right < 0 || -diff <= s.right);
                }
            }
            Some(allowed)
        } else {
            None
        };

        // With `nonpad_kv_seqlen` (an external cache) the offset is per batch:
        // `nonpad[b] - sq`, and keys at or after `nonpad[b]` are padding.
        let runtime_allowed = match nonpad {
            None => None,
            Some(n) => {
                let nt = self.ty(&n)?;
                if nt.dtype.is_float() || nt.rank() != 1 {
                    invalid!("nonpad_kv_seqlen (input 6) must be a 1-D integer tensor");
                }
                let n = self.cast_to(n, DType::I64)?;
                let n = self.op(
                    K::Reshape,
                    ShapeAttrs {
                        shape: vec![-1, 1, 1, 1],
                    }
                    .to_attrs(),
                    &[n],
                )?;
                let grid = |f: &dyn Fn(i64, i64) -> i64| {
                    let data = (0..sq as i64)
                        .flat_map(|i| (0..total as i64).map(move |j| (i, j)))
                        .map(|(i, j)| f(i, j))
                        .collect();
                    Val::konst(Tensor::from_i64(DType::I64, vec![1, 1, sq, total], data))
                };
                let sqi = sq as i64;
                // Padding: j < n.
                let mut allowed = self.binop(K::Less, grid(&|_, j| j), n.clone())?;
                if s.is_causal {
                    // j <= i + n - sq  ⇔  j - i + sq <= n.
                    let c = self.binop(K::LessEqual, grid(&|i, j| j - i + sqi), n.clone())?;
                    allowed = self.binop(K::And, allowed, c)?;
                }
                if s.left >= 0 {
                    // i + n - sq - j <= left  ⇔  n <= left + j + sq - i.
                    let l = s.left;
                    let c = self.binop(K::LessEqual, n.clone(), grid(&|i, j| l + j + sqi - i))?;
                    allowed = self.binop(K::And, allowed, c)?;
                }
                if s.right >= 0 {
                    // j - i - n + sq <= right  ⇔  n >= j - i + sq - right.
                    let r = s.right;
                    let c =
                        self.binop(K::GreaterEqual, n.clone(), grid(&|i, j| j - i + sqi - r))?;
                    allowed = self.binop(K::And, allowed, c)?;
                }
                Some(allowed)
            }
        };

        if mask_bias.is_none() && static_allowed.is_none() && runtime_allowed.is_none() {
            return Ok(None);
        }
        let mut bias: Option<Val> = None;
        let mut statically_dead = false;
        if let Some(allowed) = &static_allowed {
            statically_dead = allowed.chunks(total.max(1)).any(|r| r.iter().all(|&x| !x));
            if allowed.iter().any(|&x| !x) {
                let data = allowed
                    .iter()
                    .map(|&x| if x { 0.0 } else { f64::NEG_INFINITY })
                    .collect();
                bias = Some(Val::konst(Tensor::from_f64(s.dt, vec![sq, total], data)));
            }
        }
        if let Some(allowed) = runtime_allowed {
            let b = self.op(K::Where, Attrs::new(), &[allowed, zero(), neg_inf()])?;
            bias = Some(match bias {
                Some(c) => self.binop(K::Add, c, b)?,
                None => b,
            });
        }
        let has_runtime_mask =
            mask_bias.is_some() || bias.as_ref().is_some_and(|b| !b.is_foldable());
        if let Some(m) = mask_bias {
            bias = Some(match bias {
                Some(c) => self.binop(K::Add, c, m)?,
                None => m,
            });
        }
        let Some(bias) = bias else {
            return Ok(None);
        };
        // Rows whose bias is -inf everywhere (decided on the bias, not on the scores).
        let dead_rows = if has_runtime_mask || statically_dead {
            let max = ReduceAttrs {
                axes: vec![-1],
                keepdims: true,
            };
            let m = self.op(K::ReduceMax, max.to_attrs(), std::slice::from_ref(&bias))?;
            Some(self.binop(K::Equal, m, neg_inf())?)
        } else {
            None
        };
        Ok(Some(Bias { bias, dead_rows }))
    }
}

/// What the attention bias depends on besides its inputs.
struct BiasShape {
    dt: DType,
    sq: usize,
    total: usize,
    past_len: usize,
    is_causal: bool,
    left: i64,
    right: i64,
    windowed: bool,
}

/// Q, K and V split into heads, with what the rest of the lowering needs of their shapes.
struct Heads {
    q: Val,
    k: Val,
    v: Val,
    dt: DType,
    /// The inputs' rank (3 or 4).
    rank: usize,
    q_heads: usize,
    kv_heads: usize,
    head: usize,
    sq: usize,
}

struct Bias {
    bias: Val,
    /// Boolean, broadcastable over the scores: rows with no attended key.
    dead_rows: Option<Val>,
}
