//! Elementwise ops: unary math, cast, clip, dropout; binary arithmetic with numpy
//! broadcasting; comparisons; logical ops; where.
//!
//! Each op's scalar function is chosen once per op (one `match` arm per kind) and handed to
//! a generic loop, so hot loops carry no per-element dispatch.

use super::erf::erf;
use super::util::{
    bools, broadcast_shapes, fail, float_tensor, floats, for_each_broadcast, int_tensor, max_nan,
    min_nan, same_dtype, OpResult,
};
use crate::attr::Attrs;
use crate::ops::attrs::{
    CastAttrs, ClipAttrs, DropoutAttrs, EluAttrs, GeluAttrs, HardSigmoidAttrs, LeakyReluAttrs,
    SeluAttrs, ShrinkAttrs,
};
use crate::ops::{OpAttrs, OpKind};
use crate::tensor::{wrap_int, Tensor, TensorData};
use crate::types::{DType, TensorType};

fn map<T: Copy, R>(x: &[T], f: impl Fn(T) -> R) -> Vec<R> {
    x.iter().map(|&v| f(v)).collect()
}

/// `dropout(x, [key])`: identity in inference; in training (`training` = 1)
/// `x · mask / (1 - ratio)` with the mask of [`super::rng::dropout_keep`] for the op's
/// `seed` and the key's (step, micro-batch). A second declared result is the mask (i1).
pub(super) fn dropout(
    attrs: &DropoutAttrs,
    inputs: &[&Tensor],
    result_types: &[TensorType],
) -> OpResult<Vec<Tensor>> {
    let x = inputs[0];
    let DropoutAttrs {
        ratio,
        training,
        seed,
    } = *attrs;
    let n = x.num_elements();
    let keep: Vec<i64> = if training {
        if !(0.0..1.0).contains(&ratio) {
            fail!("`ratio` must be in [0, 1), got {ratio}");
        }
        let Some(key) = inputs.get(1) else {
            fail!("training-mode dropout needs its key operand (tensor<2xi64>: step, micro-batch)");
        };
        let k = super::util::ints(key, "the dropout key")?;
        if k.len() != 2 {
            fail!(
                "the dropout key must be tensor<2xi64> (step, micro-batch), got shape {:?}",
                key.shape
            );
        }
        let stream = super::rng::dropout_stream(seed, k[0], k[1]);
        (0..n as u64)
            .map(|i| (super::rng::stream_uniform(stream, i) >= ratio) as i64)
            .collect()
    } else {
        vec![1; n]
    };
    let mut outs = if training {
        let v = floats(x, "x")?;
        let scale = 1.0 / (1.0 - ratio);
        let y = v
            .iter()
            .zip(&keep)
            .map(|(&a, &k)| if k != 0 { a * scale } else { 0.0 })
            .collect();
        vec![float_tensor(x.dtype, x.shape.clone(), y)]
    } else {
        vec![x.clone()]
    };
    if result_types.len() == 2 {
        outs.push(int_tensor(DType::Bool, x.shape.clone(), keep));
    }
    Ok(outs)
}

/// Unary ops (the `Unary` class, including cast, clip and identity).
pub(super) fn unary(kind: OpKind, attrs: &Attrs, x: &Tensor) -> OpResult<Vec<Tensor>> {
    use OpKind::*;
    match kind {
        Identity => return Ok(vec![x.clone()]),
        Cast => return Ok(vec![cast(x, CastAttrs::of(attrs)?.to)]),
        Not => {
            let v = bools(x, "the operand of pp.not")?;
            return Ok(vec![int_tensor(
                DType::Bool,
                x.shape.clone(),
                map(v, |b| (b == 0) as i64),
            )]);
        }
        _ => {}
    }
    let shape = x.shape.clone();
    let v = match &x.data {
        TensorData::Float(v) if x.dtype.is_float() => v,
        TensorData::Int(v) if x.dtype.is_int() => {
            return Ok(vec![int_tensor(x.dtype, shape, unary_int(kind, attrs, v)?)]);
        }
        _ => fail!("{kind} needs a numeric operand, got {}", x.dtype),
    };
    let y = match kind {
        Relu => map(v, |a| if a < 0.0 { 0.0 } else { a }),
        LeakyRelu => {
            let alpha = LeakyReluAttrs::of(attrs)?.alpha;
            map(v, |a| if a < 0.0 { alpha * a } else { a })
        }
        Elu => {
            let alpha = EluAttrs::of(attrs)?.alpha;
            map(v, |a| if a < 0.0 { alpha * a.exp_m1() } else { a })
        }
        Selu => {
            let SeluAttrs { alpha, gamma } = SeluAttrs::of(attrs)?;
            map(v, |a| {
                if a > 0.0 {
                    gamma * a
                } else {
                    gamma * alpha * a.exp_m1()
                }
            })
        }
        Sigmoid => map(v, sigmoid),
        HardSigmoid => {
            let HardSigmoidAttrs { alpha, beta } = HardSigmoidAttrs::of(attrs)?;
            map(v, |a| clamp(alpha * a + beta, 0.0, 1.0))
        }
        Tanh => map(v, f64::tanh),
        Gelu => match GeluAttrs::of(attrs)?.approximate.as_str() {
            "none" => map(v, |a| {
                0.5 * a * (1.0 + erf(a * std::f64::consts::FRAC_1_SQRT_2))
            }),
            "tanh" => {
                let k = (2.0 / std::f64::consts::PI).sqrt();
                map(v, |a| {
                    0.5 * a * (1.0 + (k * (a + 0.044715 * a * a * a)).tanh())
                })
            }
            other => fail!("gelu: `approximate` must be \"none\" or \"tanh\", got \"{other}\""),
        },
        Erf => map(v, erf),
        Exp => map(v, f64::exp),
        Log => map(v, f64::ln),
        Sqrt => map(v, f64::sqrt),
        Abs => map(v, f64::abs),
        Neg => map(v, |a| -a),
        Sign => map(v, |a| {
            if a > 0.0 {
                1.0
            } else if a < 0.0 {
                -1.0
            } else {
                a
            }
        }),
        Reciprocal => map(v, |a| 1.0 / a),
        // log(1 + e^a) = max(a, 0) + log(1 + e^-|a|), which neither overflows nor loses
        // the small values for very negative a.
        Softplus => map(v, |a| {
            if a.is_nan() {
                a
            } else {
                a.max(0.0) + (-a.abs()).exp().ln_1p()
            }
        }),
        Softsign => map(v, |a| a / (1.0 + a.abs())),
        Floor => map(v, f64::floor),
        Ceil => map(v, f64::ceil),
        Sin => map(v, f64::sin),
        Cos => map(v, f64::cos),
        Shrink => {
            let ShrinkAttrs { bias, lambd } = ShrinkAttrs::of(attrs)?;
            map(v, |a| {
                if a < -lambd {
                    a + bias
                } else if a > lambd {
                    a - bias
                } else {
                    0.0
                }
            })
        }
        Clip => {
            let ClipAttrs { min, max } = ClipAttrs::of(attrs)?;
            map(v, |a| clamp(a, min, max))
        }
        _ => unreachable!("{kind} is not a unary op"),
    };
    Ok(vec![float_tensor(x.dtype, shape, y)])
}

/// Unary ops on integer tensors (the ones ONNX defines for integers).
fn unary_int(kind: OpKind, attrs: &Attrs, v: &[i64]) -> OpResult<Vec<i64>> {
    use OpKind::*;
    Ok(match kind {
        Relu => map(v, |a| a.max(0)),
        Abs => map(v, i64::wrapping_abs),
        Neg => map(v, i64::wrapping_neg),
        Sign => map(v, i64::signum),
        Clip => {
            let ClipAttrs { min: lo, max: hi } = ClipAttrs::of(attrs)?;
            // Integer bounds: round inward so that the clamp stays within [lo, hi].
            let (lo, hi) = (lo.ceil(), hi.floor());
            map(v, |a| {
                let c = clamp(a as f64, lo, hi);
                if c == a as f64 {
                    a
                } else {
                    c as i64
                }
            })
        }
        _ => fail!("{kind} needs a float operand, got an integer tensor"),
    })
}

/// `min(max(a, lo), hi)` as numpy's `clip` computes it (so `lo > hi` gives `hi`), keeping NaN.
fn clamp(a: f64, lo: f64, hi: f64) -> f64 {
    let a = if a < lo { lo } else { a };
    if a > hi {
        hi
    } else {
        a
    }
}

fn sigmoid(a: f64) -> f64 {
    if a >= 0.0 {
        1.0 / (1.0 + (-a).exp())
    } else {
        let e = a.exp();
        e / (1.0 + e)
    }
}

/// Conversion between any two dtypes: float → int truncates toward zero (then wraps to
/// the target width), anything → bool is "nonzero", bool → number is 0/1. Float results
/// are rounded to the target by the caller (in `Typed` precision).
pub(super) fn cast(x: &Tensor, to: DType) -> Tensor {
    let shape = x.shape.clone();
    match &x.data {
        TensorData::Float(v) if to.is_float() => float_tensor(to, shape, v.clone()),
        TensorData::Float(v) if to == DType::Bool => {
            int_tensor(to, shape, map(v, |a| (a != 0.0) as i64))
        }
        TensorData::Float(v) => int_tensor(to, shape, map(v, |a| wrap_int(to, a.trunc() as i64))),
        TensorData::Int(v) if to.is_float() => float_tensor(to, shape, map(v, |a| a as f64)),
        TensorData::Int(v) => int_tensor(to, shape, map(v, |a| wrap_int(to, a))),
    }
}

/// Combine two operands with numpy broadcasting.
pub(super) fn zip_broadcast<A: Copy, B: Copy, R>(
    a: &[A],
    a_shape: &[usize],
    b: &[B],
    b_shape: &[usize],
    mut f: impl FnMut(A, B) -> R,
) -> OpResult<(Vec<usize>, Vec<R>)> {
    if a_shape == b_shape {
        return Ok((
            a_shape.to_vec(),
            a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect(),
        ));
    }
    let shape = broadcast_shapes(&[a_shape, b_shape])?;
    let mut out = Vec::with_capacity(shape.iter().product());
    for_each_broadcast(&shape, [a_shape, b_shape], |[i, j]| out.push(f(a[i], b[j])));
    Ok((shape, out))
}

/// `mod`: the remainder with the quotient truncated (`fmod`, the sign of `a`) or floored
/// (the sign of `b`, numpy's `mod`: `fmod` plus `b` where the signs differ, a zero with
/// `b`'s sign). Integers: 0 where `b` is 0 (as numpy), wrapping on overflow.
pub(super) fn modulo(fmod: bool, a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    same_dtype(a, b)?;
    match (&a.data, &b.data) {
        (TensorData::Float(x), TensorData::Float(y)) if a.dtype.is_float() => {
            let (shape, out) = zip_broadcast(x, &a.shape, y, &b.shape, |p, q| {
                let r = p % q;
                if fmod {
                    r
                } else if r == 0.0 {
                    0.0f64.copysign(q)
                } else if (r < 0.0) != (q < 0.0) {
                    r + q
                } else {
                    r
                }
            })?;
            Ok(float_tensor(a.dtype, shape, out))
        }
        (TensorData::Int(x), TensorData::Int(y)) if a.dtype.is_int() => {
            let (shape, out) = zip_broadcast(x, &a.shape, y, &b.shape, |p, q| {
                let r = p.checked_rem(q).unwrap_or(0);
                if !fmod && r != 0 && (r < 0) != (q < 0) {
                    r.wrapping_add(q)
                } else {
                    r
                }
            })?;
            Ok(int_tensor(a.dtype, shape, out))
        }
        _ => fail!("mod needs numeric operands, got {}", a.dtype),
    }
}

/// Binary arithmetic: add sub mul div pow max min prelu.
pub(super) fn binary(kind: OpKind, a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    use OpKind::*;
    if kind == Pow {
        return pow(a, b);
    }
    same_dtype(a, b)?;
    match (&a.data, &b.data) {
        (TensorData::Float(x), TensorData::Float(y)) if a.dtype.is_float() => {
            let (shape, out) = match kind {
                Add => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| p + q)?,
                Sub => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| p - q)?,
                Mul => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| p * q)?,
                Div => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| p / q)?,
                Max => zip_broadcast(x, &a.shape, y, &b.shape, max_nan)?,
                Min => zip_broadcast(x, &a.shape, y, &b.shape, min_nan)?,
                PRelu => prelu_shape_check(
                    a,
                    zip_broadcast(
                        x,
                        &a.shape,
                        y,
                        &b.shape,
                        |p, s| if p < 0.0 { s * p } else { p },
                    )?,
                )?,
                _ => unreachable!("{kind} is not binary arithmetic"),
            };
            Ok(float_tensor(a.dtype, shape, out))
        }
        (TensorData::Int(x), TensorData::Int(y)) if a.dtype.is_int() => {
            let mut div_by_zero = false;
            let (shape, out) = match kind {
                Add => zip_broadcast(x, &a.shape, y, &b.shape, i64::wrapping_add)?,
                Sub => zip_broadcast(x, &a.shape, y, &b.shape, i64::wrapping_sub)?,
                Mul => zip_broadcast(x, &a.shape, y, &b.shape, i64::wrapping_mul)?,
                // Truncation toward zero, as in C (Rust's `/` on integers).
                Div => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| {
                    if q == 0 {
                        div_by_zero = true;
                        0
                    } else {
                        p.wrapping_div(q)
                    }
                })?,
                Max => zip_broadcast(x, &a.shape, y, &b.shape, i64::max)?,
                Min => zip_broadcast(x, &a.shape, y, &b.shape, i64::min)?,
                PRelu => prelu_shape_check(
                    a,
                    zip_broadcast(x, &a.shape, y, &b.shape, |p, s| {
                        if p < 0 {
                            s.wrapping_mul(p)
                        } else {
                            p
                        }
                    })?,
                )?,
                _ => unreachable!("{kind} is not binary arithmetic"),
            };
            if div_by_zero {
                fail!("integer division by zero");
            }
            Ok(int_tensor(a.dtype, shape, out))
        }
        _ => fail!("{kind} needs numeric operands, got {}", a.dtype),
    }
}

/// PRelu broadcasts the slope to the input (unidirectionally): the result has x's shape.
fn prelu_shape_check<T>(x: &Tensor, r: (Vec<usize>, Vec<T>)) -> OpResult<(Vec<usize>, Vec<T>)> {
    if r.0 != x.shape {
        fail!(
            "prelu slope must broadcast to the input shape {:?}, the result would be {:?}",
            x.shape,
            r.0
        );
    }
    Ok(r)
}

/// Pow: the result has the base's type; the exponent may be float or integer.
fn pow(a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    if !(a.dtype.is_float() || a.dtype.is_int()) || !(b.dtype.is_float() || b.dtype.is_int()) {
        fail!(
            "pow needs numeric operands, got {} and {}",
            a.dtype,
            b.dtype
        );
    }
    match (&a.data, &b.data) {
        (TensorData::Float(x), TensorData::Float(y)) => {
            let (shape, out) = zip_broadcast(x, &a.shape, y, &b.shape, f64::powf)?;
            Ok(float_tensor(a.dtype, shape, out))
        }
        (TensorData::Float(x), TensorData::Int(y)) => {
            let (shape, out) = zip_broadcast(x, &a.shape, y, &b.shape, |p, q| p.powf(q as f64))?;
            Ok(float_tensor(a.dtype, shape, out))
        }
        (TensorData::Int(x), TensorData::Float(y)) => {
            let (shape, out) = zip_broadcast(x, &a.shape, y, &b.shape, |p, q| {
                (p as f64).powf(q).trunc() as i64
            })?;
            Ok(int_tensor(a.dtype, shape, out))
        }
        (TensorData::Int(x), TensorData::Int(y)) => {
            let mut zero_to_negative = false;
            let (shape, out) = zip_broadcast(x, &a.shape, y, &b.shape, |p, q| {
                int_pow(p, q).unwrap_or_else(|| {
                    zero_to_negative = true;
                    0
                })
            })?;
            if zero_to_negative {
                fail!("integer 0 raised to a negative power");
            }
            Ok(int_tensor(a.dtype, shape, out))
        }
    }
}

/// Integer power with wrapping; negative exponents truncate `1 / b^-e` toward zero.
fn int_pow(b: i64, e: i64) -> Option<i64> {
    if e < 0 {
        return match b {
            0 => None,
            1 => Some(1),
            -1 => Some(if e % 2 == 0 { 1 } else { -1 }),
            _ => Some(0),
        };
    }
    let (mut base, mut e, mut acc) = (b, e as u64, 1i64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    Some(acc)
}

/// Comparisons; the result is bool.
pub(super) fn compare(kind: OpKind, a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    use OpKind::*;
    same_dtype(a, b)?;
    let (shape, out) = match (&a.data, &b.data) {
        (TensorData::Float(x), TensorData::Float(y)) => match kind {
            Equal => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| (p == q) as i64)?,
            Less => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| (p < q) as i64)?,
            Greater => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| (p > q) as i64)?,
            LessEqual => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| (p <= q) as i64)?,
            GreaterEqual => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| (p >= q) as i64)?,
            _ => unreachable!("{kind} is not a comparison"),
        },
        (TensorData::Int(x), TensorData::Int(y)) => match kind {
            Equal => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| (p == q) as i64)?,
            Less => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| (p < q) as i64)?,
            Greater => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| (p > q) as i64)?,
            LessEqual => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| (p <= q) as i64)?,
            GreaterEqual => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| (p >= q) as i64)?,
            _ => unreachable!("{kind} is not a comparison"),
        },
        _ => fail!("operands of {kind} have mismatched storage"),
    };
    Ok(int_tensor(DType::Bool, shape, out))
}

/// `and`, `or` on bool tensors.
pub(super) fn logical(kind: OpKind, a: &Tensor, b: &Tensor) -> OpResult<Tensor> {
    let x = bools(a, "the first operand")?;
    let y = bools(b, "the second operand")?;
    let (shape, out) = match kind {
        OpKind::And => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| (p != 0 && q != 0) as i64)?,
        OpKind::Or => zip_broadcast(x, &a.shape, y, &b.shape, |p, q| (p != 0 || q != 0) as i64)?,
        _ => unreachable!("{kind} is not a logical op"),
    };
    Ok(int_tensor(DType::Bool, shape, out))
}

/// `where(cond, x, y)` with three-way broadcasting.
pub(super) fn where_(cond: &Tensor, x: &Tensor, y: &Tensor) -> OpResult<Tensor> {
    let c = bools(cond, "the condition of pp.where")?;
    same_dtype(x, y)?;
    let shape = broadcast_shapes(&[&cond.shape, &x.shape, &y.shape])?;
    let ins = [&cond.shape[..], &x.shape[..], &y.shape[..]];
    let n = shape.iter().product();
    let data = match (&x.data, &y.data) {
        (TensorData::Float(p), TensorData::Float(q)) => {
            let mut out = Vec::with_capacity(n);
            for_each_broadcast(&shape, ins, |[i, j, k]| {
                out.push(if c[i] != 0 { p[j] } else { q[k] })
            });
            TensorData::Float(out)
        }
        (TensorData::Int(p), TensorData::Int(q)) => {
            let mut out = Vec::with_capacity(n);
            for_each_broadcast(&shape, ins, |[i, j, k]| {
                out.push(if c[i] != 0 { p[j] } else { q[k] })
            });
            TensorData::Int(out)
        }
        _ => fail!("operands of pp.where have mismatched storage"),
    };
    Ok(Tensor {
        dtype: x.dtype,
        shape,
        data,
    })
}
