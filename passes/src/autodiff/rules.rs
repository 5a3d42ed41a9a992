//! The gradient rules: for each op kind, the vector-Jacobian product that turns the
//! gradients of its results into gradients of its operands, written with IR ops.
//!
//! A rule receives the forward op (its operands and results are values of the function
//! being built, so saved activations are explicit operands of the backward ops), the
//! gradients of its results and which operands want a gradient, and returns one
//! contribution per wanted operand, of exactly that operand's type. Rules only build what
//! is wanted, so the weight-gradient part of an op (e.g. `xᵀ·dy` of a matmul) exists only
//! where a parameter needs it.

use ppir::ops::attrs::*;
use ppir::ops::OpAttrs;
use ppir::{Attrs, OpKind, TensorType, ValueId};

use super::emit::Emitter;
use super::{unsupported, view, Res};

/// The forward op being differentiated.
pub(super) struct FwdOp {
    pub kind: OpKind,
    pub attrs: Attrs,
    pub operands: Vec<ValueId>,
    pub results: Vec<ValueId>,
}

/// Resolve a possibly negative axis.
fn axis_of(a: i64, rank: usize) -> usize {
    if a < 0 {
        (a + rank as i64) as usize
    } else {
        a as usize
    }
}

/// The vector-Jacobian product of `op`: `dys[i]` is the gradient of result `i` (at least
/// one is present), `wants[j]` whether operand `j` needs a gradient. Returns one entry per
/// operand.
pub(super) fn vjp(
    em: &mut Emitter,
    op: &FwdOp,
    dys: &[Option<ValueId>],
    wants: &[bool],
) -> Res<Vec<Option<ValueId>>> {
    use OpKind::*;
    let kind = op.kind;
    let x = op.operands[0];
    let n = op.operands.len();
    let mut out: Vec<Option<ValueId>> = vec![None; n];
    if kind == Split {
        out[0] = Some(split(em, op, dys)?);
        return Ok(out);
    }
    let Some(dy) = dys[0] else {
        return Ok(out);
    };
    let y = op.results[0];
    let a = &op.attrs;
    let ty = |em: &Emitter, v: ValueId| em.ty(v).clone();
    match kind {
        // ---- unary ----
        Relu => {
            let c = em.cmp_scalar(Greater, x, 0.0)?;
            out[0] = Some(em.mask(c, dy)?);
        }
        LeakyRelu => {
            let alpha = view::<LeakyReluAttrs>(a)?.alpha;
            let c = em.cmp_scalar(Less, x, 0.0)?;
            let s = em.scale(dy, alpha)?;
            out[0] = Some(em.where_(c, s, dy)?);
        }
        Elu => {
            // x < 0: d/dx α(eˣ - 1) = αeˣ = y + α.
            let alpha = view::<EluAttrs>(a)?.alpha;
            let c = em.cmp_scalar(Less, x, 0.0)?;
            let al = em.scalar_like(x, alpha)?;
            let t = em.add(y, al)?;
            let g = em.mul(dy, t)?;
            out[0] = Some(em.where_(c, g, dy)?);
        }
        Selu => {
            // x > 0: γ; else γαeˣ = y + γα.
            let SeluAttrs { alpha, gamma } = view(a)?;
            let c = em.cmp_scalar(Greater, x, 0.0)?;
            let pos = em.scale(dy, gamma)?;
            let ga = em.scalar_like(x, gamma * alpha)?;
            let t = em.add(y, ga)?;
            let neg = em.mul(dy, t)?;
            out[0] = Some(em.where_(c, pos, neg)?);
        }
        Sigmoid => {
            let one = em.scalar_like(x, 1.0)?;
            let t = em.sub(one, y)?;
            let d = em.mul(y, t)?;
            out[0] = Some(em.mul(dy, d)?);
        }
        HardSigmoid => {
            // α inside the linear part 0 < αx + β < 1, i.e. 0 < y < 1.
            let alpha = view::<HardSigmoidAttrs>(a)?.alpha;
            let lo = em.cmp_scalar(Greater, y, 0.0)?;
            let hi = em.cmp_scalar(Less, y, 1.0)?;
            let c = em.op(And, &[lo, hi], Attrs::new())?;
            let s = em.scale(dy, alpha)?;
            out[0] = Some(em.mask(c, s)?);
        }
        Tanh => {
            let one = em.scalar_like(x, 1.0)?;
            let t = em.mul(y, y)?;
            let d = em.sub(one, t)?;
            out[0] = Some(em.mul(dy, d)?);
        }
        Gelu => {
            let d = match view::<GeluAttrs>(a)?.approximate.as_str() {
                "tanh" => gelu_tanh_derivative(em, x)?,
                _ => gelu_derivative(em, x)?,
            };
            out[0] = Some(em.mul(dy, d)?);
        }
        Erf => {
            // 2/√π · e^(-x²)
            let x2 = em.mul(x, x)?;
            let nx2 = em.neg(x2)?;
            let e = em.unary(Exp, nx2)?;
            let d = em.scale(e, std::f64::consts::FRAC_2_SQRT_PI)?;
            out[0] = Some(em.mul(dy, d)?);
        }
        Exp => out[0] = Some(em.mul(dy, y)?),
        Log => out[0] = Some(em.div(dy, x)?),
        Sqrt => {
            let t = em.scale(y, 2.0)?;
            out[0] = Some(em.div(dy, t)?);
        }
        Abs => {
            let s = em.unary(Sign, x)?;
            out[0] = Some(em.mul(dy, s)?);
        }
        Neg => out[0] = Some(em.neg(dy)?),
        Reciprocal => {
            let t = em.mul(y, y)?;
            let u = em.mul(dy, t)?;
            out[0] = Some(em.neg(u)?);
        }
        Softplus => {
            let s = em.unary(Sigmoid, x)?;
            out[0] = Some(em.mul(dy, s)?);
        }
        Softsign => {
            let ab = em.unary(Abs, x)?;
            let one = em.scalar_like(x, 1.0)?;
            let b = em.add(ab, one)?;
            let b2 = em.mul(b, b)?;
            out[0] = Some(em.div(dy, b2)?);
        }
        Sin => {
            let c = em.unary(Cos, x)?;
            out[0] = Some(em.mul(dy, c)?);
        }
        Cos => {
            let s = em.unary(Sin, x)?;
            let u = em.mul(dy, s)?;
            out[0] = Some(em.neg(u)?);
        }
        Identity => out[0] = Some(dy),
        Shrink => {
            let lambd = view::<ShrinkAttrs>(a)?.lambd;
            let ab = em.unary(Abs, x)?;
            let c = em.cmp_scalar(Greater, ab, lambd)?;
            out[0] = Some(em.mask(c, dy)?);
        }
        Clip => {
            // Where min <= x <= max (PyTorch's clamp rule).
            let ClipAttrs { min: lo, max: hi } = view(a)?;
            let mut cond = None;
            if lo > f64::NEG_INFINITY {
                cond = Some(em.cmp_scalar(GreaterEqual, x, lo)?);
            }
            if hi < f64::INFINITY {
                let c = em.cmp_scalar(LessEqual, x, hi)?;
                cond = Some(match cond {
                    Some(l) => em.op(And, &[l, c], Attrs::new())?,
                    None => c,
                });
            }
            out[0] = Some(match cond {
                Some(c) => em.mask(c, dy)?,
                None => dy,
            });
        }
        Cast => {
            let from = em.dtype(x);
            if from.is_float() {
                out[0] = Some(em.cast(dy, from)?);
            }
        }
        Dropout => {
            // Training: the same mask (same seed and key) and scale; inference: identity.
            if view::<DropoutAttrs>(a)?.training {
                let mut operands = vec![dy];
                operands.extend(op.operands.get(1).copied());
                out[0] = Some(em.op(Dropout, &operands, a.clone())?);
            } else {
                out[0] = Some(dy);
            }
        }

        // ---- binary, with numpy broadcasting ----
        Add | Sub => {
            let b = op.operands[1];
            if wants[0] {
                out[0] = Some(em.unbroadcast(dy, &ty(em, x))?);
            }
            if wants[1] {
                let g = em.unbroadcast(dy, &ty(em, b))?;
                out[1] = Some(if kind == Sub { em.neg(g)? } else { g });
            }
        }
        Mul if x == op.operands[1] => {
            // x·x: one contribution 2·x·dy.
            let g = em.mul(dy, x)?;
            let g = em.scale(g, 2.0)?;
            out[0] = Some(em.unbroadcast(g, &ty(em, x))?);
        }
        Mul => {
            let b = op.operands[1];
            if wants[0] {
                let g = em.mul(dy, b)?;
                out[0] = Some(em.unbroadcast(g, &ty(em, x))?);
            }
            if wants[1] {
                let g = em.mul(dy, x)?;
                out[1] = Some(em.unbroadcast(g, &ty(em, b))?);
            }
        }
        Div => {
            let b = op.operands[1];
            if wants[0] {
                let g = em.div(dy, b)?;
                out[0] = Some(em.unbroadcast(g, &ty(em, x))?);
            }
            if wants[1] {
                // d(a/b)/db = -y/b
                let t = em.div(y, b)?;
                let g = em.mul(dy, t)?;
                let g = em.unbroadcast(g, &ty(em, b))?;
                out[1] = Some(em.neg(g)?);
            }
        }
        Mod => {
            // y = a - n·b with n the (piecewise constant) integer quotient: dy/da = 1,
            // dy/db = -n = -(a - y)/b.
            let b = op.operands[1];
            if wants[0] {
                out[0] = Some(em.unbroadcast(dy, &ty(em, x))?);
            }
            if wants[1] {
                let r = em.sub(x, y)?;
                let n = em.div(r, b)?;
                let g = em.mul(dy, n)?;
                let g = em.unbroadcast(g, &ty(em, b))?;
                out[1] = Some(em.neg(g)?);
            }
        }
        Pow => {
            let b = op.operands[1];
            if wants[0] {
                // b · a^(b-1)
                let one = em.scalar_like(b, 1.0)?;
                let bm1 = em.sub(b, one)?;
                let p = em.op(Pow, &[x, bm1], Attrs::new())?;
                let bx = em.cast(b, em.dtype(x))?;
                let d = em.mul(p, bx)?;
                let g = em.mul(dy, d)?;
                out[0] = Some(em.unbroadcast(g, &ty(em, x))?);
            }
            if wants[1] {
                // y · ln a
                let l = em.unary(Log, x)?;
                let d = em.mul(y, l)?;
                let g = em.mul(dy, d)?;
                let g = em.unbroadcast(g, &ty(em, b))?;
                out[1] = Some(em.cast(g, em.dtype(b))?);
            }
        }
        Max | Min => {
            // The larger (smaller) operand takes the gradient; ties split it evenly.
            let b = op.operands[1];
            let wins = em.op(
                if kind == Max { Greater } else { Less },
                &[x, b],
                Attrs::new(),
            )?;
            let tie = em.op(Equal, &[x, b], Attrs::new())?;
            let one = em.scalar_like(x, 1.0)?;
            let half = em.scalar_like(x, 0.5)?;
            let zero = em.scalar_like(x, 0.0)?;
            let w_tie = em.where_(tie, half, zero)?;
            let w = em.where_(wins, one, w_tie)?;
            let ga = em.mul(dy, w)?;
            if wants[0] {
                out[0] = Some(em.unbroadcast(ga, &ty(em, x))?);
            }
            if wants[1] {
                let gb = em.sub(dy, ga)?;
                out[1] = Some(em.unbroadcast(gb, &ty(em, b))?);
            }
        }
        PRelu => {
            let slope = op.operands[1];
            let c = em.cmp_scalar(Less, x, 0.0)?;
            if wants[0] {
                let t = em.mul(dy, slope)?;
                out[0] = Some(em.where_(c, t, dy)?);
            }
            if wants[1] {
                let t = em.mul(dy, x)?;
                let m = em.mask(c, t)?;
                out[1] = Some(em.unbroadcast(m, &ty(em, slope))?);
            }
        }
        Where => {
            let c = op.operands[0];
            if wants[1] {
                let g = em.mask(c, dy)?;
                out[1] = Some(em.unbroadcast(g, &ty(em, op.operands[1]))?);
            }
            if wants[2] {
                let z = em.scalar_like(dy, 0.0)?;
                let g = em.where_(c, z, dy)?;
                out[2] = Some(em.unbroadcast(g, &ty(em, op.operands[2]))?);
            }
        }

        // ---- contractions ----
        MatMul => matmul(em, op, dy, wants, &mut out)?,
        Gemm => gemm(em, op, dy, wants, &mut out)?,
        Conv => conv(em, op, dy, wants, &mut out)?,
        ConvTranspose => conv_transpose(em, op, dy, wants, &mut out)?,

        // ---- pooling ----
        MaxPool => {
            out[0] = Some(em.op(MaxPoolGrad, &[x, dy], a.clone())?);
        }
        AvgPool => {
            let p: AvgPoolAttrs = view(a)?;
            let attrs = AvgPoolGradAttrs {
                kernel_shape: p.kernel_shape,
                strides: p.strides,
                pads: p.pads,
                dilations: p.dilations,
                ceil_mode: p.ceil_mode,
                count_include_pad: p.count_include_pad,
                input_shape: em.shape(x).iter().map(|&d| d as i64).collect(),
            };
            out[0] = Some(em.op(AvgPoolGrad, &[dy], attrs.to_attrs())?);
        }
        GlobalAvgPool => {
            let shape = em.shape(x);
            let size: u64 = shape[2..].iter().product();
            let e = em.expand(dy, &shape)?;
            out[0] = Some(em.scale(e, 1.0 / size as f64)?);
        }
        GlobalMaxPool => {
            // A max pool whose window is the whole plane (first maximum, as max_pool).
            let attrs = MaxPoolAttrs {
                kernel_shape: em.shape(x)[2..].iter().map(|&d| d as i64).collect(),
                strides: None,
                pads: None,
                dilations: None,
                ceil_mode: false,
            };
            out[0] = Some(em.op(MaxPoolGrad, &[x, dy], attrs.to_attrs())?);
        }

        // ---- normalisation ----
        BatchNorm => batch_norm_inference(em, op, dy, wants, &mut out)?,
        Softmax => {
            // y · (dy - Σ dy·y)
            let axis = axis_of(view::<SoftmaxAttrs>(a)?.axis, em.rank(x));
            let t = em.mul(dy, y)?;
            let s = em.reduce_sum(t, &[axis], true)?;
            let u = em.sub(dy, s)?;
            out[0] = Some(em.mul(y, u)?);
        }
        LogSoftmax => {
            // dy - softmax · Σ dy
            let axis = axis_of(view::<SoftmaxAttrs>(a)?.axis, em.rank(x));
            let e = em.unary(Exp, y)?;
            let s = em.reduce_sum(dy, &[axis], true)?;
            let t = em.mul(e, s)?;
            out[0] = Some(em.sub(dy, t)?);
        }
        InstanceNorm | LayerNorm | Lrn => {
            return Err(super::internal(format!(
                "{kind} should have been decomposed before differentiation"
            )))
        }

        // ---- reductions ----
        ReduceSum | ReduceMean | ReduceMax | ReduceMin | ReduceLogSumExp => {
            reduce(em, op, dy, &mut out)?
        }

        // ---- data movement ----
        Reshape | Flatten | Squeeze | Unsqueeze => {
            let shape = em.shape(x);
            out[0] = Some(em.reshape(dy, &shape)?);
        }
        Transpose => {
            let rank = em.rank(x);
            let perm = match view::<TransposeAttrs>(a)?.perm {
                Some(p) => p.iter().map(|&v| axis_of(v, rank)).collect(),
                None => (0..rank).rev().collect::<Vec<_>>(),
            };
            let mut inv = vec![0; rank];
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            out[0] = Some(em.transpose(dy, &inv)?);
        }
        Concat => {
            let rank = em.rank(x);
            let axis = axis_of(view::<ConcatAttrs>(a)?.axis, rank);
            let mut off = 0i64;
            for (i, &v) in op.operands.iter().enumerate() {
                let len = em.shape(v)[axis] as i64;
                if wants[i] {
                    let attrs = SliceAttrs {
                        starts: vec![off],
                        ends: vec![off + len],
                        axes: Some(vec![axis as i64]),
                        steps: None,
                    };
                    out[i] = Some(em.op(Slice, &[dy], attrs.to_attrs())?);
                }
                off += len;
            }
        }
        Slice => out[0] = Some(slice(em, op, dy)?),
        Gather => {
            let attrs = GatherGradAttrs {
                axis: view::<GatherAttrs>(a)?.axis,
                data_shape: em.shape(x).iter().map(|&d| d as i64).collect(),
            };
            out[0] = Some(em.op(GatherGrad, &[op.operands[1], dy], attrs.to_attrs())?);
        }
        // A scatter-add of the updates: each update's gradient is read back at its index.
        GatherGrad => {
            if wants[1] {
                let attrs = GatherAttrs {
                    axis: view::<GatherGradAttrs>(a)?.axis,
                };
                out[1] = Some(em.op(Gather, &[dy, x], attrs.to_attrs())?);
            }
        }
        Expand => out[0] = Some(em.unbroadcast(dy, &ty(em, x))?),
        Pad => {
            let p: PadAttrs = view(a)?;
            if p.mode != "constant" {
                return Err(unsupported(format!(
                    "the gradient of pad in mode \"{}\" is not implemented",
                    p.mode
                )));
            }
            out[0] = Some(em.op(Pad, &[dy], zero_pad(p.pads.iter().map(|&p| -p).collect()))?);
        }
        Tile => {
            // [r0·d0, r1·d1, ..] viewed as [r0, d0, r1, d1, ..], summed over the r axes.
            let shape = em.shape(x);
            let reps = view::<TileAttrs>(a)?.repeats;
            if reps.iter().all(|&r| r == 1) {
                out[0] = Some(dy);
            } else {
                let view: Vec<u64> = shape
                    .iter()
                    .zip(&reps)
                    .flat_map(|(&d, &r)| [r as u64, d])
                    .collect();
                let v = em.reshape(dy, &view)?;
                let axes: Vec<usize> = (0..shape.len()).map(|i| 2 * i).collect();
                let s = em.reduce_sum(v, &axes, false)?;
                out[0] = Some(em.reshape(s, &shape)?);
            }
        }
        SoftmaxCrossEntropy => {
            let labels = op.operands[1];
            out[0] = Some(em.op(SoftmaxCrossEntropyGrad, &[x, labels, dy], a.clone())?);
        }
        LabelLogit => {
            let labels = op.operands[1];
            let classes = em.shape(x).last().copied().unwrap_or(0) as i64;
            let g = LabelLogitGradAttrs {
                offset: view::<LabelLogitAttrs>(a)?.offset,
                classes,
            };
            out[0] = Some(em.op(LabelLogitGrad, &[dy, labels], g.to_attrs())?);
        }
        Split => unreachable!("handled above"),
        Sign
        | Floor
        | Ceil
        | Not
        | Equal
        | Less
        | Greater
        | LessEqual
        | GreaterEqual
        | And
        | Or
        | Constant
        | Send
        | Recv
        | AllReduce
        | ReduceScatter
        | Shard
        | AllGather
        | SoftmaxCrossEntropyGrad
        | LabelLogitGrad
        | LogSumExpGrad
        | MaxPoolGrad
        | AvgPoolGrad
        | ConvGradWeight
        | SliceGrad => {
            return Err(unsupported(format!(
                "cannot differentiate through \"{kind}\" (no gradient rule)"
            )))
        }
    }
    Ok(out)
}

/// GELU (erf form): Φ(x) + x·φ(x).
fn gelu_derivative(em: &mut Emitter, x: ValueId) -> Res<ValueId> {
    let s = em.scale(x, std::f64::consts::FRAC_1_SQRT_2)?;
    let e = em.unary(OpKind::Erf, s)?;
    let one = em.scalar_like(x, 1.0)?;
    let p = em.add(e, one)?;
    let cdf = em.scale(p, 0.5)?;
    let x2 = em.mul(x, x)?;
    let t = em.scale(x2, -0.5)?;
    let ex = em.unary(OpKind::Exp, t)?;
    let pdf = em.scale(ex, 1.0 / (2.0 * std::f64::consts::PI).sqrt())?;
    let xp = em.mul(x, pdf)?;
    em.add(cdf, xp)
}

/// GELU (tanh form), with t = tanh(k(x + c·x³)):
/// 0.5(1 + t) + 0.5·x·(1 - t²)·k·(1 + 3c·x²).
fn gelu_tanh_derivative(em: &mut Emitter, x: ValueId) -> Res<ValueId> {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let c = 0.044715;
    let one = em.scalar_like(x, 1.0)?;
    let x2 = em.mul(x, x)?;
    let x3 = em.mul(x2, x)?;
    let cx3 = em.scale(x3, c)?;
    let inner = em.add(x, cx3)?;
    let u = em.scale(inner, k)?;
    let t = em.unary(OpKind::Tanh, u)?;
    let tp = em.add(t, one)?;
    let left = em.scale(tp, 0.5)?;
    let t2 = em.mul(t, t)?;
    let omt = em.sub(one, t2)?;
    let q = em.scale(x2, 3.0 * c)?;
    let q1 = em.add(q, one)?;
    let r = em.mul(omt, q1)?;
    let rx = em.mul(r, x)?;
    let right = em.scale(rx, 0.5 * k)?;
    em.add(left, right)
}

/// numpy matmul: promote 1-D operands to matrices, then `da = dy·bᵀ`, `db = aᵀ·dy`,
/// summed over broadcast batch dims and reshaped back.
fn matmul(
    em: &mut Emitter,
    op: &FwdOp,
    dy: ValueId,
    wants: &[bool],
    out: &mut [Option<ValueId>],
) -> Res<()> {
    let (a, b) = (op.operands[0], op.operands[1]);
    let (sa, sb) = (em.shape(a), em.shape(b));
    let a2 = if sa.len() == 1 {
        em.reshape(a, &[1, sa[0]])?
    } else {
        a
    };
    let b2 = if sb.len() == 1 {
        em.reshape(b, &[sb[0], 1])?
    } else {
        b
    };
    let (s2a, s2b) = (em.shape(a2), em.shape(b2));
    let (m, k, n) = (s2a[s2a.len() - 2], s2a[s2a.len() - 1], s2b[s2b.len() - 1]);
    let batch_a = &s2a[..s2a.len() - 2];
    let batch_b = &s2b[..s2b.len() - 2];
    let rank = batch_a.len().max(batch_b.len());
    let mut batch = vec![1u64; rank];
    for (shape, off) in [
        (batch_a, rank - batch_a.len()),
        (batch_b, rank - batch_b.len()),
    ] {
        for (i, &d) in shape.iter().enumerate() {
            if d != 1 {
                batch[off + i] = d;
            }
        }
    }
    let mut out2 = batch.clone();
    out2.extend([m, n]);
    let dy2 = em.reshape(dy, &out2)?;
    if wants[0] {
        let bt = em.transpose_last2(b2)?;
        let g = em.op(OpKind::MatMul, &[dy2, bt], Attrs::new())?;
        let g = em.unbroadcast(g, &em.ty(a2).clone())?;
        out[0] = Some(em.reshape(g, &sa)?);
    }
    if wants[1] {
        let g = if batch_b.is_empty() && !batch_a.is_empty() {
            // A 2-D weight under a batched input: one matmul over the flattened rows.
            let rows: u64 = batch.iter().product::<u64>() * m;
            let af = em.reshape(a2, &[rows, k])?;
            let at = em.transpose(af, &[1, 0])?;
            let df = em.reshape(dy2, &[rows, n])?;
            em.op(OpKind::MatMul, &[at, df], Attrs::new())?
        } else {
            let at = em.transpose_last2(a2)?;
            let g = em.op(OpKind::MatMul, &[at, dy2], Attrs::new())?;
            em.unbroadcast(g, &em.ty(b2).clone())?
        };
        out[1] = Some(em.reshape(g, &sb)?);
    }
    Ok(())
}

/// Gemm `y = α·op(a)·op(b) + β·c`: each operand gradient is itself one gemm with the
/// transposition flags arranged so no explicit transpose is needed.
fn gemm(
    em: &mut Emitter,
    op: &FwdOp,
    dy: ValueId,
    wants: &[bool],
    out: &mut [Option<ValueId>],
) -> Res<()> {
    let GemmAttrs {
        alpha,
        beta,
        trans_a: ta,
        trans_b: tb,
    } = view(&op.attrs)?;
    let (a, b) = (op.operands[0], op.operands[1]);
    let g = |em: &mut Emitter, p: ValueId, q: ValueId, t1: bool, t2: bool| {
        let attrs = GemmAttrs {
            alpha,
            beta: 1.0,
            trans_a: t1,
            trans_b: t2,
        };
        em.op(OpKind::Gemm, &[p, q], attrs.to_attrs())
    };
    if wants[0] {
        // op(a) = a: dy·op(b)ᵀ; op(a) = aᵀ: op(b)·dyᵀ.
        out[0] = Some(if !ta {
            g(em, dy, b, false, !tb)?
        } else {
            g(em, b, dy, tb, true)?
        });
    }
    if wants[1] {
        // op(b) = b: op(a)ᵀ·dy; op(b) = bᵀ: dyᵀ·op(a).
        out[1] = Some(if !tb {
            g(em, a, dy, !ta, false)?
        } else {
            g(em, dy, a, true, ta)?
        });
    }
    if wants.get(2).copied().unwrap_or(false) {
        let c = op.operands[2];
        let s = if beta == 1.0 { dy } else { em.scale(dy, beta)? };
        out[2] = Some(em.unbroadcast(s, &em.ty(c).clone())?);
    }
    Ok(())
}

/// Per spatial dim of a conv's window (its `strides`, `pads` and `dilations`; absent:
/// ones, zeros, ones): stride, begin pad, end pad, dilation.
fn window(c: &ConvAttrs, spatial: usize) -> Vec<(i64, i64, i64, i64)> {
    let s = c.strides.clone().unwrap_or(vec![1; spatial]);
    let p = c.pads.clone().unwrap_or(vec![0; 2 * spatial]);
    let d = c.dilations.clone().unwrap_or(vec![1; spatial]);
    (0..spatial)
        .map(|i| (s[i], p[i], p[spatial + i], d[i]))
        .collect()
}

/// The `conv_grad_weight` of a convolution with window `c` and spatial kernel `k`.
fn grad_weight_attrs(c: &ConvAttrs, k: &[u64]) -> Attrs {
    ConvGradWeightAttrs {
        strides: c.strides.clone(),
        pads: c.pads.clone(),
        dilations: c.dilations.clone(),
        group: c.group,
        kernel_shape: k.iter().map(|&d| d as i64).collect(),
    }
    .to_attrs()
}

/// Conv: `dx` is a transposed convolution of dy with the same weight (output_padding
/// recovers the input positions the last window did not reach), `dw` a
/// `conv_grad_weight`, `db` the sum of dy over batch and space.
fn conv(
    em: &mut Emitter,
    op: &FwdOp,
    dy: ValueId,
    wants: &[bool],
    out: &mut [Option<ValueId>],
) -> Res<()> {
    let (x, w) = (op.operands[0], op.operands[1]);
    let (sx, sw, sy) = (em.shape(x), em.shape(w), em.shape(dy));
    let spatial = sx.len() - 2;
    let c: ConvAttrs = view(&op.attrs)?;
    if wants[0] {
        let win = window(&c, spatial);
        let mut output_padding = Vec::with_capacity(spatial);
        for (i, &(s, pb, pe, d)) in win.iter().enumerate() {
            let reach = (sy[2 + i] as i64 - 1) * s + (sw[2 + i] as i64 - 1) * d + 1;
            output_padding.push(sx[2 + i] as i64 + pb + pe - reach);
        }
        let attrs = ConvTransposeAttrs {
            strides: c.strides.clone(),
            pads: c.pads.clone(),
            dilations: c.dilations.clone(),
            output_padding: Some(output_padding),
            group: c.group,
        };
        out[0] = Some(em.op(OpKind::ConvTranspose, &[dy, w], attrs.to_attrs())?);
    }
    if wants[1] {
        let attrs = grad_weight_attrs(&c, &sw[2..]);
        out[1] = Some(em.op(OpKind::ConvGradWeight, &[x, dy], attrs)?);
    }
    if wants.get(2).copied().unwrap_or(false) {
        let axes: Vec<usize> = std::iter::once(0).chain(2..sy.len()).collect();
        out[2] = Some(em.reduce_sum(dy, &axes, false)?);
    }
    Ok(())
}

/// ConvTranspose: its adjoint is a convolution with the same weight and window; the
/// weight gradient is `conv_grad_weight` with the roles of input and output swapped.
fn conv_transpose(
    em: &mut Emitter,
    op: &FwdOp,
    dy: ValueId,
    wants: &[bool],
    out: &mut [Option<ValueId>],
) -> Res<()> {
    let (x, w) = (op.operands[0], op.operands[1]);
    let (sw, sy) = (em.shape(w), em.shape(dy));
    let spatial = sy.len() - 2;
    let t: ConvTransposeAttrs = view(&op.attrs)?;
    // The convolution with the same window (the adjoint).
    let c = ConvAttrs {
        strides: t.strides,
        pads: t.pads,
        dilations: t.dilations,
        group: t.group,
        kernel_shape: None,
    };
    let win = window(&c, spatial);
    let op_pad = t.output_padding.unwrap_or(vec![0; spatial]);
    if op_pad.iter().zip(&win).any(|(&p, &(s, ..))| p >= s) {
        return Err(unsupported(format!(
            "the gradient of conv_transpose with output_padding {op_pad:?} not below the strides"
        )));
    }
    if wants[0] {
        out[0] = Some(em.op(OpKind::Conv, &[dy, w], c.to_attrs())?);
    }
    if wants[1] {
        let attrs = grad_weight_attrs(&c, &sw[2..]);
        out[1] = Some(em.op(OpKind::ConvGradWeight, &[dy, x], attrs)?);
    }
    if wants.get(2).copied().unwrap_or(false) {
        let axes: Vec<usize> = std::iter::once(0).chain(2..sy.len()).collect();
        out[2] = Some(em.reduce_sum(dy, &axes, false)?);
    }
    Ok(())
}

/// Inference-mode batch norm: mean and var are constants, so it is a per-channel affine
/// map: `dx = dy · scale / sqrt(var + eps)`, `dscale = Σ dy · xhat`, `dbias = Σ dy`.
fn batch_norm_inference(
    em: &mut Emitter,
    op: &FwdOp,
    dy: ValueId,
    wants: &[bool],
    out: &mut [Option<ValueId>],
) -> Res<()> {
    let x = op.operands[0];
    let dtype = em.dtype(x);
    if op.operands[1..].iter().any(|&v| em.dtype(v) != dtype) {
        return Err(unsupported(
            "the gradient of batch_norm with statistics of another element type than x",
        ));
    }
    let (scale, mean, var) = (op.operands[1], op.operands[3], op.operands[4]);
    let shape = em.shape(x);
    let rank = shape.len();
    let mut cshape = vec![shape[1]];
    cshape.resize(rank - 1, 1);
    let axes: Vec<usize> = std::iter::once(0).chain(2..rank).collect();
    let eps = view::<BatchNormAttrs>(&op.attrs)?.epsilon;
    let e = em.scalar(dtype, eps)?;
    let ve = em.add(var, e)?;
    let sd = em.unary(OpKind::Sqrt, ve)?;
    if wants[0] {
        let k = em.div(scale, sd)?;
        let kr = em.reshape(k, &cshape)?;
        out[0] = Some(em.mul(dy, kr)?);
    }
    if wants[1] {
        let mr = em.reshape(mean, &cshape)?;
        let sr = em.reshape(sd, &cshape)?;
        let xc = em.sub(x, mr)?;
        let xh = em.div(xc, sr)?;
        let t = em.mul(dy, xh)?;
        out[1] = Some(em.reduce_sum(t, &axes, false)?);
    }
    if wants[2] {
        out[2] = Some(em.reduce_sum(dy, &axes, false)?);
    }
    Ok(())
}

/// Reductions: the gradient of the kept shape, broadcast back (divided by the count for
/// the mean; for max/min routed to the extreme elements, ties sharing it evenly; for the
/// log-sum-exp weighted by the softmax `exp(x - y)`).
fn reduce(em: &mut Emitter, op: &FwdOp, dy: ValueId, out: &mut [Option<ValueId>]) -> Res<()> {
    let x = op.operands[0];
    let shape = em.shape(x);
    let rank = shape.len();
    let axes = view::<ReduceAttrs>(&op.attrs)?.axes;
    let axes: Vec<usize> = if axes.is_empty() {
        (0..rank).collect()
    } else {
        axes.iter().map(|&a| axis_of(a, rank)).collect()
    };
    let kept: Vec<u64> = (0..rank)
        .map(|i| if axes.contains(&i) { 1 } else { shape[i] })
        .collect();
    let gk = em.reshape(dy, &kept)?;
    out[0] = Some(match op.kind {
        OpKind::ReduceSum => em.expand(gk, &shape)?,
        OpKind::ReduceMean => {
            let count: u64 = axes.iter().map(|&a| shape[a]).product();
            let q = em.scale(gk, 1.0 / count as f64)?;
            em.expand(q, &shape)?
        }
        OpKind::ReduceLogSumExp => em.op(
            OpKind::LogSumExpGrad,
            &[x, op.results[0], dy],
            op.attrs.clone(),
        )?,
        _ => {
            let yk = em.reshape(op.results[0], &kept)?;
            let eq = em.op(OpKind::Equal, &[x, yk], Attrs::new())?;
            let m = em.cast(eq, em.dtype(x))?;
            let cnt = em.reduce_sum(m, &axes, true)?;
            let q = em.div(gk, cnt)?;
            em.mul(m, q)?
        }
    });
    Ok(())
}

/// Split: the results' gradients (zeros where a result has none) concatenated back.
fn split(em: &mut Emitter, op: &FwdOp, dys: &[Option<ValueId>]) -> Res<ValueId> {
    let axis = view::<SplitAttrs>(&op.attrs)?.axis;
    let mut parts = Vec::with_capacity(op.results.len());
    for (i, &r) in op.results.iter().enumerate() {
        parts.push(match dys.get(i).copied().flatten() {
            Some(g) => g,
            None => {
                let t: TensorType = em.ty(r).clone();
                em.zeros(&t)?
            }
        });
    }
    em.op(OpKind::Concat, &parts, ConcatAttrs { axis }.to_attrs())
}

/// Slice: with unit steps, dy padded back with zeros (a `pad`); otherwise `slice_grad`.
fn slice(em: &mut Emitter, op: &FwdOp, dy: ValueId) -> Res<ValueId> {
    let x = op.operands[0];
    let shape = em.shape(x);
    let rank = shape.len();
    let a: SliceAttrs = view(&op.attrs)?;
    let starts = &a.starts;
    let axes: Vec<usize> = match &a.axes {
        Some(ax) => ax.iter().map(|&v| axis_of(v, rank)).collect(),
        None => (0..starts.len()).collect(),
    };
    if a.steps.as_ref().is_some_and(|s| s.iter().any(|&s| s != 1)) {
        let attrs = SliceGradAttrs {
            starts: a.starts,
            ends: a.ends,
            axes: a.axes,
            steps: a.steps,
            input_shape: shape.iter().map(|&d| d as i64).collect(),
        };
        return em.op(OpKind::SliceGrad, &[dy], attrs.to_attrs());
    }
    let out_shape = em.shape(dy);
    let mut pads = vec![0i64; 2 * rank];
    for (i, &axis) in axes.iter().enumerate() {
        let d = shape[axis] as i64;
        let start = if starts[i] < 0 {
            starts[i].saturating_add(d)
        } else {
            starts[i]
        }
        .clamp(0, d);
        let count = out_shape[axis] as i64;
        pads[axis] = start;
        pads[rank + axis] = d - start - count;
    }
    em.op(OpKind::Pad, &[dy], zero_pad(pads))
}

/// A constant `pad` with zeros (negative entries crop).
fn zero_pad(pads: Vec<i64>) -> Attrs {
    PadAttrs {
        pads,
        mode: "constant".into(),
        value: 0.0,
    }
    .to_attrs()
}
