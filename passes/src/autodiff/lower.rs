//! Decompositions applied while copying the forward function, so that the gradients of
//! these ops follow from the primitive rules (and are gradient-checked through them):
//!
//! - `batch_norm` in training mode: normalise with the batch statistics (mean and
//!   population variance over every axis but the channel axis 1), and return them for the
//!   running-statistics update.
//! - `layer_norm` (over `axis..rank`) and `instance_norm` (over the spatial axes).
//! - `lrn`: the sum of squares over a window of channels is an average pool with
//!   `count_include_pad` over a `[N, 1, C, spatial]` view of `x²`.
//!
//! Each uses `reduce_mean sub mul add sqrt div reshape` (and `avg_pool pow` for lrn).

use ppir::ops::attrs::{AvgPoolAttrs, BatchNormAttrs, InstanceNormAttrs, LayerNormAttrs, LrnAttrs};
use ppir::ops::OpAttrs;
use ppir::{Attrs, OpKind, ValueId};

use super::emit::{Emitter, Name};
use super::{view, Res};

/// `reshape(t, [C, 1, ..])` so a per-channel `[C]` operand broadcasts against
/// `[N, C, spatial..]` (rank `rank`).
fn per_channel(em: &mut Emitter, t: ValueId, rank: usize) -> Res<ValueId> {
    let c = em.shape(t)[0];
    let mut shape = vec![c];
    shape.resize(rank - 1, 1);
    em.reshape(t, &shape)
}

/// `(x - mean) / sqrt(var + eps)` over `axes` (kept as 1s); returns (xhat, mean, var, sd).
fn normalise(
    em: &mut Emitter,
    x: ValueId,
    axes: &[usize],
    eps: f64,
) -> Res<(ValueId, ValueId, ValueId, ValueId)> {
    let mean = em.reduce_mean(x, axes, true)?;
    let xc = em.sub(x, mean)?;
    let sq = em.mul(xc, xc)?;
    let var = em.reduce_mean(sq, axes, true)?;
    let e = em.scalar_like(x, eps)?;
    let ve = em.add(var, e)?;
    let sd = em.unary(OpKind::Sqrt, ve)?;
    let xhat = em.div(xc, sd)?;
    Ok((xhat, mean, var, sd))
}

/// Batch statistics of a training-mode batch norm.
pub(super) struct BatchStats {
    /// Mean over the batch and spatial axes, `[C]`.
    pub mean: ValueId,
    /// Unbiased variance, `[C]` (the population variance times n/(n-1), as PyTorch's
    /// running_var uses; n = N · spatial size).
    pub var_unbiased: ValueId,
}

/// `batch_norm(x, scale, bias, _, _)` normalised with the batch's own statistics.
pub(super) fn batch_norm_train(
    em: &mut Emitter,
    operands: &[ValueId],
    attrs: &Attrs,
    name: Name<'_>,
) -> Res<(ValueId, BatchStats)> {
    let x = operands[0];
    let rank = em.rank(x);
    let shape = em.shape(x);
    let dtype = em.dtype(x);
    let eps = view::<BatchNormAttrs>(attrs)?.epsilon;
    let axes: Vec<usize> = std::iter::once(0).chain(2..rank).collect();
    let (xhat, mean, var, _) = normalise(em, x, &axes, eps)?;
    let scale = em.cast(operands[1], dtype)?;
    let scale = per_channel(em, scale, rank)?;
    let bias = em.cast(operands[2], dtype)?;
    let bias = per_channel(em, bias, rank)?;
    let t = em.mul(xhat, scale)?;
    let y = em.op_as(name, OpKind::Add, &[t, bias], Attrs::new())?;
    let c = shape[1];
    let mean_c = em.reshape(mean, &[c])?;
    let var_c = em.reshape(var, &[c])?;
    let n: u64 = axes.iter().map(|&a| shape[a]).product();
    let var_unbiased = if n > 1 {
        em.scale(var_c, n as f64 / (n - 1) as f64)?
    } else {
        var_c
    };
    Ok((
        y,
        BatchStats {
            mean: mean_c,
            var_unbiased,
        },
    ))
}

/// `layer_norm(x, scale, [bias])` over `axis..rank`; with `stats`, also the mean and
/// `1 / sqrt(var + eps)` (the op's optional second and third results).
pub(super) fn layer_norm(
    em: &mut Emitter,
    operands: &[ValueId],
    attrs: &Attrs,
    names: &[Name<'_>],
) -> Res<Vec<ValueId>> {
    let x = operands[0];
    let rank = em.rank(x) as i64;
    let LayerNormAttrs { axis, epsilon: eps } = view(attrs)?;
    let axis = if axis < 0 { axis + rank } else { axis } as usize;
    let axes: Vec<usize> = (axis..rank as usize).collect();
    let (xhat, mean, _, sd) = normalise(em, x, &axes, eps)?;
    let name = names.first().copied().unwrap_or(Name::Fresh);
    let y = match operands.get(2) {
        Some(&bias) => {
            let t = em.mul(xhat, operands[1])?;
            em.op_as(name, OpKind::Add, &[t, bias], Attrs::new())?
        }
        None => em.op_as(name, OpKind::Mul, &[xhat, operands[1]], Attrs::new())?,
    };
    let mut out = vec![y];
    if names.len() == 3 {
        let m = em.op_as(names[1], OpKind::Identity, &[mean], Attrs::new())?;
        let inv = em.op_as(names[2], OpKind::Reciprocal, &[sd], Attrs::new())?;
        out.extend([m, inv]);
    }
    Ok(out)
}

/// `instance_norm(x, scale, bias)`: per (n, c) plane over the spatial axes.
pub(super) fn instance_norm(
    em: &mut Emitter,
    operands: &[ValueId],
    attrs: &Attrs,
    name: Name<'_>,
) -> Res<ValueId> {
    let x = operands[0];
    let rank = em.rank(x);
    let eps = view::<InstanceNormAttrs>(attrs)?.epsilon;
    let axes: Vec<usize> = (2..rank).collect();
    let (xhat, _, _, _) = normalise(em, x, &axes, eps)?;
    let scale = per_channel(em, operands[1], rank)?;
    let bias = per_channel(em, operands[2], rank)?;
    let t = em.mul(xhat, scale)?;
    em.op_as(name, OpKind::Add, &[t, bias], Attrs::new())
}

/// `lrn(x)`: `x / (bias + alpha · avg_c(x²))^beta`, the channel average over a window of
/// `size` channels (clipped at the edges, divided by `size`) as an average pool over a
/// `[N, 1, C, spatial]` view with `count_include_pad`.
pub(super) fn lrn(
    em: &mut Emitter,
    operands: &[ValueId],
    attrs: &Attrs,
    name: Name<'_>,
) -> Res<ValueId> {
    let x = operands[0];
    let shape = em.shape(x);
    let LrnAttrs {
        size,
        alpha,
        beta,
        bias,
    } = view(attrs)?;
    let size = size.max(1);
    let (n, c) = (shape[0], shape[1]);
    let spatial: u64 = shape[2..].iter().product();
    let before = (size - 1) / 2;
    let after = size - 1 - before;
    let sq = em.mul(x, x)?;
    let sq_view = em.reshape(sq, &[n, 1, c, spatial])?;
    let window = AvgPoolAttrs {
        kernel_shape: vec![size, 1],
        strides: None,
        pads: Some(vec![before, 0, after, 0]),
        dilations: None,
        ceil_mode: false,
        count_include_pad: true,
    };
    let pool = em.op(OpKind::AvgPool, &[sq_view], window.to_attrs())?;
    let avg = em.reshape(pool, &shape)?;
    let scaled = em.scale(avg, alpha)?;
    let b = em.scalar_like(x, bias)?;
    let base = em.add(scaled, b)?;
    let p = em.scalar_like(x, beta)?;
    let den = em.op(OpKind::Pow, &[base, p], Attrs::new())?;
    em.op_as(name, OpKind::Div, &[x, den], Attrs::new())
}
