//! Contractions (matmul, gemm, conv, conv_transpose), pooling and normalisation.

use super::elementwise::{broadcast_shapes, broadcasts_to};
use super::{bail, batch_err, check_elem, dims_str, min_rank, norm_axis, same_dtype, Elem, Res};
use crate::ops::attrs::{
    AvgPoolAttrs, ConvAttrs, ConvTransposeAttrs, GemmAttrs, LayerNormAttrs, LrnAttrs, MaxPoolAttrs,
    SoftmaxAttrs,
};
use crate::ops::OpKind;
use crate::types::{Dim, TensorType};

/// `inner dimensions differ: 784 vs 512` unless the two may agree.
fn check_inner(k1: Dim, k2: Dim) -> Res<()> {
    if !k1.compatible(k2) {
        bail!("inner dimensions differ: {k1} vs {k2}");
    }
    Ok(())
}

/// numpy `matmul`: 1-D operands are promoted (and the added dim removed from the result),
/// leading dims broadcast.
pub(super) fn matmul(a: &TensorType, b: &TensorType) -> Res<TensorType> {
    check_elem(a, 0, Elem::Numeric)?;
    same_dtype(&[a.clone(), b.clone()], 0, 1)?;
    if a.rank() == 0 || b.rank() == 0 {
        bail!("matmul operands must have rank >= 1, got {a} and {b}");
    }
    let mut ad = a.dims.clone();
    let mut bd = b.dims.clone();
    let a_vec = ad.len() == 1;
    let b_vec = bd.len() == 1;
    if a_vec {
        ad.insert(0, Dim::Known(1));
    }
    if b_vec {
        bd.push(Dim::Known(1));
    }
    let (m, k1) = (ad[ad.len() - 2], ad[ad.len() - 1]);
    let (k2, n) = (bd[bd.len() - 2], bd[bd.len() - 1]);
    check_inner(k1, k2)?;
    let Some(mut dims) = broadcast_shapes(&ad[..ad.len() - 2], &bd[..bd.len() - 2]) else {
        bail!(
            "batch dimensions {} of {a} and {} of {b} do not broadcast",
            dims_str(&ad[..ad.len() - 2]),
            dims_str(&bd[..bd.len() - 2])
        );
    };
    if !a_vec {
        dims.push(m);
    }
    if !b_vec {
        dims.push(n);
    }
    Ok(TensorType::new(a.dtype, dims))
}

pub(super) fn gemm(attrs: &GemmAttrs, ops: &[TensorType]) -> Res<TensorType> {
    let (a, b) = (&ops[0], &ops[1]);
    check_elem(a, 0, Elem::Numeric)?;
    same_dtype(ops, 0, 1)?;
    for (i, t) in [a, b].into_iter().enumerate() {
        if t.rank() != 2 {
            bail!("operand {i} of gemm must be 2-D, got {t}");
        }
    }
    let (m, k1) = if attrs.trans_a {
        (a.dims[1], a.dims[0])
    } else {
        (a.dims[0], a.dims[1])
    };
    let (k2, n) = if attrs.trans_b {
        (b.dims[1], b.dims[0])
    } else {
        (b.dims[0], b.dims[1])
    };
    check_inner(k1, k2)?;
    let out = TensorType::new(a.dtype, vec![m, n]);
    if let Some(c) = ops.get(2) {
        same_dtype(ops, 0, 2)?;
        if !broadcasts_to(&c.dims, &out.dims) {
            bail!(
                "operand 2 {c} does not broadcast to the result shape {}",
                dims_str(&out.dims)
            );
        }
    }
    Ok(out)
}

/// An integer-list attribute `name` with one entry per spatial dim (or `per` entries per
/// dim); `default` for each entry when absent.
fn spatial_list(
    value: Option<&[i64]>,
    name: &str,
    spatial: usize,
    per: usize,
    default: i64,
) -> Res<Vec<i64>> {
    match value {
        None => Ok(vec![default; spatial * per]),
        Some(v) if v.len() == spatial * per => Ok(v.to_vec()),
        Some(v) => bail!(
            "'{name}' has {} entries but the input has {spatial} spatial dims (expected {})",
            v.len(),
            spatial * per
        ),
    }
}

/// Entries must be `>= min`, and small enough that window arithmetic cannot overflow.
fn check_min(name: &str, v: &[i64], min: i64) -> Res<()> {
    if let Some((i, x)) = v.iter().enumerate().find(|(_, &x)| x < min) {
        bail!("'{name}' entry {i} is {x}; it must be >= {min}");
    }
    if let Some((i, x)) = v.iter().enumerate().find(|(_, &x)| x > i32::MAX as i64) {
        bail!("'{name}' entry {i} is {x}, which is too large");
    }
    Ok(())
}

/// Sliding-window geometry shared by conv and the pools.
struct Window {
    strides: Vec<i64>,
    pads: Vec<i64>,
    dilations: Vec<i64>,
}

impl Window {
    /// The window of a conv or pool over `spatial` dims, from its `strides`, `pads` and
    /// `dilations` attributes (absent: ones, zeros, ones).
    fn read(
        strides: Option<&[i64]>,
        pads: Option<&[i64]>,
        dilations: Option<&[i64]>,
        spatial: usize,
    ) -> Res<Window> {
        let strides = spatial_list(strides, "strides", spatial, 1, 1)?;
        let pads = spatial_list(pads, "pads", spatial, 2, 0)?;
        let dilations = spatial_list(dilations, "dilations", spatial, 1, 1)?;
        check_min("strides", &strides, 1)?;
        check_min("pads", &pads, 0)?;
        check_min("dilations", &dilations, 1)?;
        Ok(Window {
            strides,
            pads,
            dilations,
        })
    }

    /// Output size of spatial dim `i` for input size `input` and kernel size `kernel`.
    fn out(&self, i: usize, input: Dim, kernel: Dim, ceil_mode: bool) -> Res<Dim> {
        let spatial = self.strides.len();
        // i128: attributes come from user input and must not overflow.
        let (s, d) = (self.strides[i] as i128, self.dilations[i] as i128);
        let (pb, pe) = (self.pads[i] as i128, self.pads[spatial + i] as i128);
        let dk = dilated_kernel(i, kernel, d)?;
        let Some(n) = input.known() else {
            // `?` maps to itself only through a window that keeps every size.
            if s == 1 && pb + pe == dk - 1 {
                return Ok(Dim::Batch);
            }
            return Err(batch_err(format_args!("spatial dim {i}")));
        };
        let n = n as i128;
        let padded = n + pb + pe;
        if padded < dk {
            bail!("spatial dim {i}: padded input size {padded} is smaller than the dilated kernel size {dk}");
        }
        let mut out = if ceil_mode {
            (padded - dk + s - 1) / s + 1
        } else {
            (padded - dk) / s + 1
        };
        // In ceil mode the last window must start inside the input or the left padding
        // (as PyTorch and onnxruntime do).
        if ceil_mode && (out - 1) * s >= n + pb {
            out -= 1;
        }
        super::size_dim(out, format_args!("spatial dim {i}"))
    }
}

/// `(k - 1) * d + 1` for kernel dim `i`.
fn dilated_kernel(i: usize, kernel: Dim, d: i128) -> Res<i128> {
    let Some(k) = kernel.known() else {
        return Err(batch_err(format_args!("kernel spatial dim {i}")));
    };
    if k == 0 {
        bail!("kernel spatial dim {i} is 0");
    }
    Ok((k as i128 - 1) * d + 1)
}

/// `[N, C, spatial..]` input checks shared by conv, conv_transpose and pools.
fn spatial_input(x: &TensorType, what: &str) -> Res<usize> {
    if x.rank() < 3 {
        bail!(
            "operand 0 of {what} must be [N, C, spatial..] with at least one spatial dim, got {x}"
        );
    }
    Ok(x.rank() - 2)
}

fn group(g: i64) -> Res<u64> {
    if g < 1 {
        bail!("'group' must be >= 1, found {g}");
    }
    Ok(g as u64)
}

fn check_weight_rank(x: &TensorType, w: &TensorType) -> Res<()> {
    if w.rank() != x.rank() {
        bail!(
            "weight {w} has rank {} but the input {x} has rank {}",
            w.rank(),
            x.rank()
        );
    }
    Ok(())
}

fn check_bias(ops: &[TensorType], channels: Dim) -> Res<()> {
    if let Some(b) = ops.get(2) {
        same_dtype(ops, 0, 2)?;
        if b.rank() != 1 || !b.dims[0].compatible(channels) {
            bail!("bias {b} must be [{channels}], one entry per output channel");
        }
    }
    Ok(())
}

pub(super) fn conv(attrs: &ConvAttrs, ops: &[TensorType]) -> Res<TensorType> {
    let (x, w) = (&ops[0], &ops[1]);
    check_elem(x, 0, Elem::Float)?;
    same_dtype(ops, 0, 1)?;
    let spatial = spatial_input(x, "conv")?;
    check_weight_rank(x, w)?;
    let g = group(attrs.group)?;
    let win = Window::read(
        attrs.strides.as_deref(),
        attrs.pads.as_deref(),
        attrs.dilations.as_deref(),
        spatial,
    )?;
    let (c, wc, m) = (x.dims[1], w.dims[1], w.dims[0]);
    if let (Some(c), Some(wc)) = (c.known(), wc.known()) {
        if c != wc * g {
            bail!(
                "input has {c} channels but weight dim 1 ({wc}) x group ({g}) is {}",
                wc * g
            );
        }
    }
    if let Some(m) = m.known() {
        if m % g != 0 {
            bail!("{m} output channels are not divisible by group {g}");
        }
    }
    check_bias(ops, m)?;
    let mut dims = vec![x.dims[0], m];
    for i in 0..spatial {
        dims.push(win.out(i, x.dims[2 + i], w.dims[2 + i], false)?);
    }
    Ok(TensorType::new(x.dtype, dims))
}

pub(super) fn conv_transpose(attrs: &ConvTransposeAttrs, ops: &[TensorType]) -> Res<TensorType> {
    let (x, w) = (&ops[0], &ops[1]);
    check_elem(x, 0, Elem::Float)?;
    same_dtype(ops, 0, 1)?;
    let spatial = spatial_input(x, "conv_transpose")?;
    check_weight_rank(x, w)?;
    let g = group(attrs.group)?;
    let win = Window::read(
        attrs.strides.as_deref(),
        attrs.pads.as_deref(),
        attrs.dilations.as_deref(),
        spatial,
    )?;
    let output_padding = spatial_list(
        attrs.output_padding.as_deref(),
        "output_padding",
        spatial,
        1,
        0,
    )?;
    check_min("output_padding", &output_padding, 0)?;
    let (c, wc) = (x.dims[1], w.dims[0]);
    if !c.compatible(wc) {
        bail!("input has {c} channels but weight dim 0 is {wc}");
    }
    if let Some(c) = c.known().or(wc.known()) {
        if c % g != 0 {
            bail!("{c} input channels are not divisible by group {g}");
        }
    }
    let m = match w.dims[1] {
        Dim::Known(n) => n
            .checked_mul(g)
            .map(Dim::Known)
            .ok_or_else(|| super::ShapeError::new("too many output channels"))?,
        Dim::Batch => return Err(batch_err("weight dim 1 (output channels per group)")),
    };
    check_bias(ops, m)?;
    let mut dims = vec![x.dims[0], m];
    for (i, &op) in output_padding.iter().enumerate() {
        let (s, d, op) = (win.strides[i] as i128, win.dilations[i] as i128, op as i128);
        let (pb, pe) = (win.pads[i] as i128, win.pads[spatial + i] as i128);
        let dk = dilated_kernel(i, w.dims[2 + i], d)?;
        let out = match x.dims[2 + i] {
            Dim::Known(n) => s * (n as i128 - 1) + op + dk - pb - pe,
            Dim::Batch if s == 1 && op + dk - 1 - pb - pe == 0 => {
                dims.push(Dim::Batch);
                continue;
            }
            Dim::Batch => return Err(batch_err(format_args!("spatial dim {i}"))),
        };
        if out < 1 {
            bail!("spatial dim {i}: output size would be {out}");
        }
        dims.push(super::size_dim(out, format_args!("spatial dim {i}"))?);
    }
    Ok(TensorType::new(x.dtype, dims))
}

pub(super) fn max_pool(a: &MaxPoolAttrs, x: &TensorType) -> Res<TensorType> {
    let (s, p, d) = (
        a.strides.as_deref(),
        a.pads.as_deref(),
        a.dilations.as_deref(),
    );
    let window = |spatial| Window::read(s, p, d, spatial);
    pool(OpKind::MaxPool, &a.kernel_shape, window, a.ceil_mode, x)
}

pub(super) fn avg_pool(a: &AvgPoolAttrs, x: &TensorType) -> Res<TensorType> {
    let (s, p, d) = (
        a.strides.as_deref(),
        a.pads.as_deref(),
        a.dilations.as_deref(),
    );
    let window = |spatial| Window::read(s, p, d, spatial);
    pool(OpKind::AvgPool, &a.kernel_shape, window, a.ceil_mode, x)
}

/// A pool with kernel `kernel` and the window `window` gives for the spatial rank.
fn pool(
    kind: OpKind,
    kernel: &[i64],
    window: impl FnOnce(usize) -> Res<Window>,
    ceil_mode: bool,
    x: &TensorType,
) -> Res<TensorType> {
    let is_max = kind == OpKind::MaxPool;
    check_elem(x, 0, if is_max { Elem::Numeric } else { Elem::Float })?;
    let spatial = spatial_input(x, kind.name())?;
    if kernel.len() != spatial {
        bail!(
            "'kernel_shape' has {} entries but the input has {spatial} spatial dims",
            kernel.len()
        );
    }
    check_min("kernel_shape", kernel, 1)?;
    // Average pooling has dilations too since ONNX opset 19 (the interpreter applies them).
    let win = window(spatial)?;
    let mut dims = vec![x.dims[0], x.dims[1]];
    for (i, &k) in kernel.iter().enumerate() {
        dims.push(win.out(i, x.dims[2 + i], Dim::Known(k as u64), ceil_mode)?);
    }
    Ok(TensorType::new(x.dtype, dims))
}

pub(super) fn global_pool(x: &TensorType) -> Res<TensorType> {
    check_elem(x, 0, Elem::Float)?;
    min_rank(x, 0, 3, "[N, C, spatial..]")?;
    let mut dims = x.dims.clone();
    dims[2..].iter_mut().for_each(|d| *d = Dim::Known(1));
    Ok(TensorType::new(x.dtype, dims))
}

/// Operand `index` must be `[C]` for the channel dim of x.
fn per_channel(ops: &[TensorType], index: usize, what: &str) -> Res<()> {
    let c = ops[0].dims[1];
    let t = &ops[index];
    if t.rank() != 1 || !t.dims[0].compatible(c) {
        bail!(
            "operand {index} ({what}) must be [{c}], one entry per channel of the input, got {t}"
        );
    }
    Ok(())
}

pub(super) fn batch_norm(ops: &[TensorType]) -> Res<TensorType> {
    let x = &ops[0];
    check_elem(x, 0, Elem::Float)?;
    min_rank(x, 0, 2, "[N, C, ..]")?;
    for (i, what) in [(1, "scale"), (2, "bias"), (3, "mean"), (4, "var")] {
        // ONNX (opset 15) lets scale/bias and mean/var have their own float types.
        check_elem(&ops[i], i, Elem::Float)?;
        per_channel(ops, i, what)?;
    }
    Ok(x.clone())
}

pub(super) fn instance_norm(ops: &[TensorType]) -> Res<TensorType> {
    let x = &ops[0];
    check_elem(x, 0, Elem::Float)?;
    min_rank(x, 0, 3, "[N, C, spatial..]")?;
    for (i, what) in [(1, "scale"), (2, "bias")] {
        same_dtype(ops, 0, i)?;
        per_channel(ops, i, what)?;
    }
    Ok(x.clone())
}

pub(super) fn layer_norm(attrs: &LayerNormAttrs, ops: &[TensorType]) -> Res<TensorType> {
    let x = &ops[0];
    check_elem(x, 0, Elem::Float)?;
    min_rank(x, 0, 1, "input")?;
    let axis = norm_axis(attrs.axis, x.rank(), "'axis'")?;
    let normalized = &x.dims[axis..];
    for (i, what) in [(1, "scale"), (2, "bias")] {
        let Some(t) = ops.get(i) else { continue };
        same_dtype(ops, 0, i)?;
        if !broadcasts_to(&t.dims, normalized) {
            bail!(
                "operand {i} ({what}) {t} does not broadcast to the normalised shape {}",
                dims_str(normalized)
            );
        }
    }
    Ok(x.clone())
}

pub(super) fn lrn(attrs: &LrnAttrs, x: &TensorType) -> Res<TensorType> {
    check_elem(x, 0, Elem::Float)?;
    min_rank(x, 0, 2, "[N, C, ..]")?;
    let size = attrs.size;
    if size < 1 {
        bail!("'size' must be >= 1, found {size}");
    }
    Ok(x.clone())
}

pub(super) fn softmax(attrs: &SoftmaxAttrs, x: &TensorType) -> Res<TensorType> {
    check_elem(x, 0, Elem::Float)?;
    norm_axis(attrs.axis, x.rank(), "'axis'")?;
    Ok(x.clone())
}
