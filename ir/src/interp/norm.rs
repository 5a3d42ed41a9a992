//! Normalisations: batch_norm (inference form), instance_norm, layer_norm, lrn, and
//! softmax / log_softmax over one axis. Statistics are population statistics (divide by
//! the count), as ONNX defines them.

use super::util::{
    broadcast_shapes, fail, float_tensor, floats, for_each_broadcast, norm_axis, same_dtype,
    OpResult,
};
use crate::ops::attrs::{
    BatchNormAttrs, InstanceNormAttrs, LayerNormAttrs, LrnAttrs, SoftmaxAttrs,
};
use crate::ops::OpKind;
use crate::tensor::Tensor;
use crate::types::TensorType;

/// The `[C]`-shaped per-channel operands of batch_norm and instance_norm.
fn per_channel<'a>(x: &Tensor, t: &'a Tensor, what: &str) -> OpResult<&'a [f64]> {
    same_dtype(x, t)?;
    if t.shape != [x.shape[1]] {
        fail!(
            "{what} must have shape [{}] (the channels of x), got {:?}",
            x.shape[1],
            t.shape
        );
    }
    floats(t, what)
}

fn channels_first(x: &Tensor) -> OpResult<(usize, usize, usize)> {
    if x.shape.len() < 2 {
        fail!("x must have shape [N, C, ..], got {:?}", x.shape);
    }
    Ok((x.shape[0], x.shape[1], x.shape[2..].iter().product()))
}

/// `y = (x - mean) / sqrt(var + epsilon) * scale + bias`, per channel (axis 1).
pub(super) fn batch_norm(attrs: &BatchNormAttrs, inputs: &[&Tensor]) -> OpResult<Tensor> {
    let x = inputs[0];
    let xv = floats(x, "x")?;
    let (n, c, size) = channels_first(x)?;
    let scale = per_channel(x, inputs[1], "scale")?;
    let bias = per_channel(x, inputs[2], "bias")?;
    let mean = per_channel(x, inputs[3], "mean")?;
    let var = per_channel(x, inputs[4], "var")?;
    let eps = attrs.epsilon;
    let den: Vec<f64> = var.iter().map(|v| (v + eps).sqrt()).collect();
    let mut out = Vec::with_capacity(xv.len());
    for p in 0..n * c {
        let ch = p % c;
        let (m, d, s, b) = (mean[ch], den[ch], scale[ch], bias[ch]);
        out.extend(
            xv[p * size..(p + 1) * size]
                .iter()
                .map(|&v| (v - m) / d * s + b),
        );
    }
    Ok(float_tensor(x.dtype, x.shape.clone(), out))
}

/// Mean and population variance of a slice.
fn moments(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|&a| (a - mean) * (a - mean)).sum::<f64>() / n;
    (mean, var)
}

/// Normalise each (n, c) plane over its spatial elements, then `* scale[c] + bias[c]`.
pub(super) fn instance_norm(attrs: &InstanceNormAttrs, inputs: &[&Tensor]) -> OpResult<Tensor> {
    let x = inputs[0];
    let xv = floats(x, "x")?;
    let (n, c, size) = channels_first(x)?;
    let scale = per_channel(x, inputs[1], "scale")?;
    let bias = per_channel(x, inputs[2], "bias")?;
    let eps = attrs.epsilon;
    let mut out = Vec::with_capacity(xv.len());
    for p in 0..n * c {
        let ch = p % c;
        let plane = &xv[p * size..(p + 1) * size];
        let (mean, var) = moments(plane);
        let d = (var + eps).sqrt();
        out.extend(plane.iter().map(|&v| (v - mean) / d * scale[ch] + bias[ch]));
    }
    Ok(float_tensor(x.dtype, x.shape.clone(), out))
}

/// Expand an operand that broadcasts (unidirectionally) to `shape` into a dense vector.
fn expand_to(t: &Tensor, shape: &[usize], what: &str) -> OpResult<Vec<f64>> {
    let v = floats(t, what)?;
    if broadcast_shapes(&[&t.shape, shape])? != shape {
        fail!(
            "{what} of shape {:?} does not broadcast to the normalised shape {shape:?}",
            t.shape
        );
    }
    let mut out = Vec::with_capacity(shape.iter().product());
    for_each_broadcast(shape, [&t.shape], |[i]| out.push(v[i]));
    Ok(out)
}

/// ONNX LayerNormalization: normalise over dimensions `axis..rank`, then `* scale + bias`.
/// With three declared results, also returns the mean and `1 / sqrt(var + epsilon)`
/// (shape of x with the normalised dimensions set to 1).
pub(super) fn layer_norm(
    attrs: &LayerNormAttrs,
    inputs: &[&Tensor],
    result_types: &[TensorType],
) -> OpResult<Vec<Tensor>> {
    let x = inputs[0];
    let xv = floats(x, "x")?;
    let rank = x.shape.len();
    let axis = norm_axis(attrs.axis, rank)?;
    let inner_shape = &x.shape[axis..];
    let inner: usize = inner_shape.iter().product();
    let outer: usize = x.shape[..axis].iter().product();
    same_dtype(x, inputs[1])?;
    let scale = expand_to(inputs[1], inner_shape, "scale")?;
    let bias = match inputs.get(2) {
        Some(b) => {
            same_dtype(x, b)?;
            Some(expand_to(b, inner_shape, "bias")?)
        }
        None => None,
    };
    let eps = attrs.epsilon;
    let mut out = Vec::with_capacity(xv.len());
    let mut means = Vec::with_capacity(outer);
    let mut inv_stds = Vec::with_capacity(outer);
    for r in 0..outer {
        let row = &xv[r * inner..(r + 1) * inner];
        let (mean, var) = moments(row);
        let inv_std = 1.0 / (var + eps).sqrt();
        for (j, &v) in row.iter().enumerate() {
            let y = (v - mean) * inv_std * scale[j];
            out.push(match &bias {
                Some(b) => y + b[j],
                None => y,
            });
        }
        means.push(mean);
        inv_stds.push(inv_std);
    }
    let mut results = vec![float_tensor(x.dtype, x.shape.clone(), out)];
    if result_types.len() == 3 {
        let mut stat_shape = x.shape[..axis].to_vec();
        stat_shape.resize(rank, 1);
        for (data, ty) in [(means, &result_types[1]), (inv_stds, &result_types[2])] {
            if !ty.dtype.is_float() {
                fail!("layer_norm statistics must have a float type, declared {ty}");
            }
            results.push(float_tensor(ty.dtype, stat_shape.clone(), data));
        }
    }
    Ok(results)
}

/// ONNX LRN: `y = x / (bias + alpha / size · Σ x²)^beta`, the sum over channels
/// `c - floor((size - 1) / 2) ..= c + ceil((size - 1) / 2)` clipped to the tensor.
pub(super) fn lrn(attrs: &LrnAttrs, x: &Tensor) -> OpResult<Tensor> {
    let xv = floats(x, "x")?;
    let (n, c, size) = channels_first(x)?;
    let LrnAttrs {
        size: window,
        alpha,
        beta,
        bias,
    } = *attrs;
    if window < 1 {
        fail!("`size` must be positive, got {window}");
    }
    let before = ((window - 1) / 2) as usize;
    let after = (window as usize - 1).div_ceil(2);
    let mut out = vec![0.0; xv.len()];
    let mut sq = vec![0.0; size];
    for b in 0..n {
        for ch in 0..c {
            sq.fill(0.0);
            for cc in ch.saturating_sub(before)..(ch + after + 1).min(c) {
                let plane = &xv[(b * c + cc) * size..(b * c + cc + 1) * size];
                for (s, &v) in sq.iter_mut().zip(plane) {
                    *s += v * v;
                }
            }
            let base = (b * c + ch) * size;
            for i in 0..size {
                out[base + i] = xv[base + i] / (bias + alpha / window as f64 * sq[i]).powf(beta);
            }
        }
    }
    Ok(float_tensor(x.dtype, x.shape.clone(), out))
}

/// softmax / log_softmax along one axis, shifted by the maximum so `exp` cannot overflow.
pub(super) fn softmax(kind: OpKind, attrs: &SoftmaxAttrs, x: &Tensor) -> OpResult<Tensor> {
    let xv = floats(x, "x")?;
    let axis = norm_axis(attrs.axis, x.shape.len())?;
    let len = x.shape[axis];
    let inner: usize = x.shape[axis + 1..].iter().product();
    let outer: usize = x.shape[..axis].iter().product();
    let mut out = vec![0.0; xv.len()];
    for o in 0..outer {
        for i in 0..inner {
            let base = o * len * inner + i;
            let at = |j: usize| base + j * inner;
            let max = (0..len)
                .map(|j| xv[at(j)])
                .fold(f64::NEG_INFINITY, f64::max);
            // An all -inf row would give -inf - -inf = NaN; shift by 0 instead.
            let max = if max.is_finite() { max } else { 0.0 };
            let sum: f64 = (0..len).map(|j| (xv[at(j)] - max).exp()).sum();
            for j in 0..len {
                out[at(j)] = if kind == OpKind::LogSoftmax {
                    (xv[at(j)] - max) - sum.ln()
                } else {
                    (xv[at(j)] - max).exp() / sum
                };
            }
        }
    }
    Ok(float_tensor(x.dtype, x.shape.clone(), out))
}
