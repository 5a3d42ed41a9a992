//! Reductions: reduce_sum, reduce_mean, reduce_max, reduce_min, reduce_log_sum_exp over
//! `axes` (empty = all), keeping the reduced dimensions as 1s when `keepdims` = 1.
//!
//! `reduce_log_sum_exp` is `m + ln Σ exp(x - m)` with `m` the maximum (NaN ignored), or 0
//! where the maximum is not finite: an empty or all `-inf` set gives `-inf`, a `+inf`
//! element `+inf`.

use super::util::{
    fail, float_tensor, for_each_broadcast, int_tensor, max_nan, min_nan, norm_axes, OpResult,
};
use crate::ops::attrs::ReduceAttrs;
use crate::ops::OpKind;
use crate::tensor::{Tensor, TensorData};

/// The reduced axes (all for an empty `axes`) and the shape with them kept as 1s. Every
/// input element adds into the result element at its own index with the reduced
/// coordinates set to 0, which is exactly how the kept shape broadcasts to the input.
fn reduced(attrs: &ReduceAttrs, shape: &[usize]) -> OpResult<(Vec<usize>, Vec<usize>)> {
    let rank = shape.len();
    let axes = if attrs.axes.is_empty() {
        (0..rank).collect()
    } else {
        norm_axes(&attrs.axes, rank)?
    };
    let kept = shape
        .iter()
        .enumerate()
        .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
        .collect();
    Ok((axes, kept))
}

pub(super) fn reduce(kind: OpKind, attrs: &ReduceAttrs, x: &Tensor) -> OpResult<Tensor> {
    let (axes, kept) = reduced(attrs, &x.shape)?;
    let keepdims = attrs.keepdims;
    let out_len: usize = kept.iter().product();
    let count: usize = axes.iter().map(|&a| x.shape[a]).product();
    let shape: Vec<usize> = if keepdims {
        kept.clone()
    } else {
        x.shape
            .iter()
            .enumerate()
            .filter(|(i, _)| !axes.contains(i))
            .map(|(_, &d)| d)
            .collect()
    };
    let data = match &x.data {
        TensorData::Float(v) if x.dtype.is_float() => {
            let mut acc = match kind {
                OpKind::ReduceSum | OpKind::ReduceMean => {
                    fold(v, &x.shape, &kept, 0.0, |a, b| a + b)
                }
                OpKind::ReduceMax => fold(v, &x.shape, &kept, f64::NEG_INFINITY, max_nan),
                OpKind::ReduceMin => fold(v, &x.shape, &kept, f64::INFINITY, min_nan),
                OpKind::ReduceLogSumExp => {
                    let max = fold(v, &x.shape, &kept, f64::NEG_INFINITY, f64::max);
                    let shift: Vec<f64> = max
                        .iter()
                        .map(|&m| if m.is_finite() { m } else { 0.0 })
                        .collect();
                    let mut sum = vec![0.0; out_len];
                    let mut i = 0;
                    for_each_broadcast(&x.shape, [&kept], |[j]| {
                        sum[j] += (v[i] - shift[j]).exp();
                        i += 1;
                    });
                    sum.iter().zip(&shift).map(|(s, m)| m + s.ln()).collect()
                }
                _ => unreachable!("{kind} is not a reduction"),
            };
            if kind == OpKind::ReduceMean {
                for a in &mut acc {
                    *a /= count as f64;
                }
            }
            return Ok(float_tensor(x.dtype, shape, acc));
        }
        TensorData::Int(_) if kind == OpKind::ReduceLogSumExp => {
            fail!("{kind} needs a float operand, got {}", x.dtype)
        }
        TensorData::Int(v) if x.dtype.is_int() => v,
        _ => fail!("{kind} needs a numeric operand, got {}", x.dtype),
    };
    if count == 0
        && out_len > 0
        && matches!(
            kind,
            OpKind::ReduceMax | OpKind::ReduceMin | OpKind::ReduceMean
        )
    {
        fail!("{kind} of integers over an empty set of elements");
    }
    let mut acc = match kind {
        OpKind::ReduceSum | OpKind::ReduceMean => fold(data, &x.shape, &kept, 0, i64::wrapping_add),
        OpKind::ReduceMax => fold(data, &x.shape, &kept, i64::MIN, i64::max),
        OpKind::ReduceMin => fold(data, &x.shape, &kept, i64::MAX, i64::min),
        _ => unreachable!("{kind} is not a reduction"),
    };
    if kind == OpKind::ReduceMean {
        for a in &mut acc {
            *a /= count as i64;
        }
    }
    Ok(int_tensor(x.dtype, shape, acc))
}

/// `log_sum_exp_grad`: `exp(x - y) · dy` with y and dy (the reduction's shape) broadcast
/// over the reduced axes.
pub(super) fn log_sum_exp_grad(attrs: &ReduceAttrs, inputs: &[&Tensor]) -> OpResult<Tensor> {
    let (x, y, dy) = (inputs[0], inputs[1], inputs[2]);
    let (TensorData::Float(xv), TensorData::Float(yv), TensorData::Float(dv)) =
        (&x.data, &y.data, &dy.data)
    else {
        fail!("log_sum_exp_grad needs float operands");
    };
    let (_, kept) = reduced(attrs, &x.shape)?;
    let n: usize = kept.iter().product();
    if yv.len() != n || dv.len() != n {
        fail!(
            "y and dy must have the reduction's {n} elements, got {} and {}",
            yv.len(),
            dv.len()
        );
    }
    let mut out = Vec::with_capacity(xv.len());
    let mut i = 0;
    for_each_broadcast(&x.shape, [&kept], |[j]| {
        out.push((xv[i] - yv[j]).exp() * dv[j]);
        i += 1;
    });
    Ok(float_tensor(x.dtype, x.shape.clone(), out))
}

/// Fold every element of `v` (shape `shape`) into the result element it reduces to.
fn fold<T: Copy>(
    v: &[T],
    shape: &[usize],
    kept: &[usize],
    init: T,
    f: impl Fn(T, T) -> T,
) -> Vec<T> {
    let mut acc = vec![init; kept.iter().product()];
    let mut i = 0;
    for_each_broadcast(shape, [kept], |[j]| {
        acc[j] = f(acc[j], v[i]);
        i += 1;
    });
    acc
}
