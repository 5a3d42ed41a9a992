//! ONNX ops whose results are fixed by shapes and attributes, or are a fixed linear map of
//! their input, built at import time: `EyeLike`, `HannWindow`, `HammingWindow`,
//! `BlackmanWindow` (constants), `AffineGrid` (a `matmul` of θ with the constant base grid
//! of normalised coordinates), `CenterCropPad` (`slice` and zero `pad` per axis) and
//! `Col2Im` (a grouped `conv_transpose` with one-hot kernels: each column entry is added
//! at its place in the image, the adjoint of extracting the blocks).

use ppir::ops::attrs::{ConvTransposeAttrs, PadAttrs, ShapeAttrs, TransposeAttrs};
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, Dim, OpKind, Tensor};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, Importer, Val, R};
use super::super::proto::NodeProto;
use super::super::tensor::dtype_from_onnx;
use super::attention::{known, known_dims};
use super::{norm_axis, OrInvalid};

/// The largest constant these ops build (elements).
const MAX_GENERATED: usize = 1 << 24;

fn dtype_attr(t: i64) -> R<DType> {
    match i32::try_from(t).ok().and_then(dtype_from_onnx) {
        Some(d) => Ok(d),
        None => invalid!("unsupported or unknown element type {t}"),
    }
}

use OpKind as K;

impl Importer<'_> {
    pub(super) fn lower_eye_like(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let x = self.req(node, 0)?;
        let xt = self.ty(&x)?;
        let dims = known_dims(&xt.dims, "a dimension of the input")?;
        let (rows, cols) = match dims[..] {
            [n] => (n, n),
            [r, c] => (r, c),
            _ => invalid!("the input must have rank 1 or 2, not {xt}"),
        };
        let dtype = match a.int("dtype").inv()? {
            Some(t) => dtype_attr(t)?,
            None => xt.dtype,
        };
        if rows.saturating_mul(cols) > MAX_GENERATED {
            invalid!("a {rows}x{cols} result is too large to build");
        }
        let k = a.int_or("k", 0).inv()?;
        let mut data = vec![0i64; rows * cols];
        for r in 0..rows {
            let c = r as i64 + k;
            if (0..cols as i64).contains(&c) {
                data[r * cols + c as usize] = 1;
            }
        }
        let t = if dtype.is_float() {
            Tensor::from_f64(
                dtype,
                vec![rows, cols],
                data.iter().map(|&v| v as f64).collect(),
            )
        } else {
            Tensor::from_i64(dtype, vec![rows, cols], data)
        };
        Ok(Val::konst(t))
    }

    /// `HannWindow`, `HammingWindow`, `BlackmanWindow` (opset 17).
    pub(super) fn lower_window(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        if self.opset < 17 {
            return Err(self.unsupported_op(node));
        }
        let Some(size) = self.static_ints(node, 0, "size")? else {
            invalid!("input 0 (size) is missing")
        };
        let [size] = size[..] else {
            invalid!("size must be a scalar")
        };
        if !(0..=MAX_GENERATED as i64).contains(&size) {
            invalid!("size {size} is out of range");
        }
        let dtype = dtype_attr(a.int_or("output_datatype", 1).inv()?)?;
        let periodic = a.int_or("periodic", 1).inv()? != 0;
        let denom = if periodic { size } else { size - 1 } as f64;
        let tau = 2.0 * std::f64::consts::PI;
        let w: Vec<f64> = (0..size)
            .map(|n| {
                let t = tau * n as f64 / denom;
                match node.op_type.as_str() {
                    "HannWindow" => 0.5 - 0.5 * t.cos(),
                    "HammingWindow" => {
                        let alpha = 25.0 / 46.0;
                        alpha - (1.0 - alpha) * t.cos()
                    }
                    _ => 0.42 - 0.5 * t.cos() + 0.08 * (2.0 * t).cos(),
                }
            })
            .collect();
        let t = if dtype.is_float() {
            Tensor::from_f64(dtype, vec![size as usize], w)
        } else {
            Tensor::from_i64(
                dtype,
                vec![size as usize],
                w.iter().map(|&v| v as i64).collect(),
            )
        };
        Ok(Val::konst(t))
    }

    pub(super) fn lower_affine_grid(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        use OpKind as K;
        if self.opset < 20 {
            return Err(self.unsupported_op(node));
        }
        let theta = self.req(node, 0)?;
        let tt = self.ty(&theta)?;
        if !tt.dtype.is_float() {
            invalid!("theta must be a float tensor, not {}", tt.dtype);
        }
        let Some(size) = self.static_ints(node, 1, "size")? else {
            invalid!("input 1 (size) is missing")
        };
        let spatial: &[i64] = match size[..] {
            [_, _, ..] if size.len() == 4 || size.len() == 5 => &size[2..],
            _ => invalid!("size must have 4 or 5 entries ([N, C, (D,) H, W]), not {size:?}"),
        };
        if spatial.iter().any(|&s| s <= 0) {
            invalid!("the spatial sizes must be positive: {size:?}");
        }
        let spatial: Vec<usize> = spatial.iter().map(|&s| s as usize).collect();
        let k = spatial.len();
        if tt.rank() != 3
            || tt.dims[1] != Dim::Known(k as u64)
            || tt.dims[2] != Dim::Known(k as u64 + 1)
        {
            invalid!("theta must have shape [N, {k}, {}], not {tt}", k + 1);
        }
        let points = spatial
            .iter()
            .try_fold(1usize, |a, &s| a.checked_mul(s))
            .unwrap_or(usize::MAX);
        if points.saturating_mul(k + 1) > MAX_GENERATED {
            invalid!("a grid of {points} points is too large to build");
        }
        let align = a.int_or("align_corners", 0).inv()? != 0;
        let coord = |i: usize, len: usize| -> f64 {
            if align {
                if len == 1 {
                    -1.0
                } else {
                    -1.0 + 2.0 * i as f64 / (len - 1) as f64
                }
            } else {
                (2 * i + 1) as f64 / len as f64 - 1.0
            }
        };
        // Rows (x, y[, z], 1) in row-major order of (D,) H, W; x runs along W.
        let mut base = Vec::with_capacity(points * (k + 1));
        for p in 0..points {
            let mut rest = p;
            let mut idx = vec![0; k];
            for d in (0..k).rev() {
                idx[d] = rest % spatial[d];
                rest /= spatial[d];
            }
            for d in (0..k).rev() {
                base.push(coord(idx[d], spatial[d]));
            }
            base.push(1.0);
        }
        let base = Val::konst(Tensor::from_f64(tt.dtype, vec![points, k + 1], base));
        let perm = TransposeAttrs {
            perm: Some(vec![0, 2, 1]),
        };
        let tt_t = self.op(K::Transpose, perm.to_attrs(), &[theta])?;
        let grid = self.op(K::MatMul, Attrs::new(), &[base, tt_t])?;
        let mut shape = vec![match tt.dims[0] {
            Dim::Known(n) => n as i64,
            Dim::Batch => -1,
        }];
        shape.extend(spatial.iter().map(|&s| s as i64));
        shape.push(k as i64);
        self.op(K::Reshape, ShapeAttrs { shape }.to_attrs(), &[grid])
    }

    pub(super) fn lower_center_crop_pad(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        if self.opset < 18 {
            return Err(self.unsupported_op(node));
        }
        let x = self.req(node, 0)?;
        let dims = self.dims_of(&x)?;
        let rank = dims.len();
        let Some(shape) = self.static_ints(node, 1, "shape")? else {
            invalid!("input 1 (shape) is missing")
        };
        let axes = match a.ints("axes").inv()? {
            Some(ax) => ax
                .iter()
                .map(|&i| norm_axis(i, rank))
                .collect::<R<Vec<_>>>()?,
            None => (0..rank).collect(),
        };
        if shape.len() != axes.len() {
            invalid!("shape has {} entries for {} axes", shape.len(), axes.len());
        }
        let mut y = x;
        let mut pads = vec![0i64; 2 * rank];
        for (&d, &target) in axes.iter().zip(&shape) {
            if target < 0 {
                invalid!("shape must not be negative: {shape:?}");
            }
            let len = known(dims[d], "a cropped or padded dimension")? as i64;
            if target < len {
                let start = (len - target) / 2;
                y = self.slice_axis(y, d as i64, start, start + target, 1)?;
            } else if target > len {
                let before = (target - len) / 2;
                pads[d] = before;
                pads[rank + d] = target - len - before;
            }
        }
        if pads.iter().any(|&p| p != 0) {
            let attrs = PadAttrs {
                pads,
                mode: "constant".into(),
                value: 0.0,
            };
            y = self.op(OpKind::Pad, attrs.to_attrs(), &[y])?;
        }
        Ok(y)
    }

    pub(super) fn lower_col2im(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        if self.opset < 18 {
            return Err(self.unsupported_op(node));
        }
        let x = self.req(node, 0)?;
        let xt = self.ty(&x)?;
        let (Some(image), Some(block)) = (
            self.static_ints(node, 1, "image_shape")?,
            self.static_ints(node, 2, "block_shape")?,
        ) else {
            invalid!("inputs 1 (image_shape) and 2 (block_shape) are required")
        };
        let k = image.len();
        if k == 0 || block.len() != k || image.iter().chain(&block).any(|&v| v <= 0) {
            invalid!("image_shape {image:?} and block_shape {block:?} must be positive and of one length");
        }
        if xt.rank() != 3 {
            invalid!("the input must be [N, C·∏block, L], not {xt}");
        }
        let n = match xt.dims[0] {
            Dim::Known(v) => v as i64,
            Dim::Batch => -1,
        };
        let ck = known(xt.dims[1], "the column height")? as i64;
        let l = known(xt.dims[2], "the block count")? as i64;
        let kernel: i64 = block.iter().product();
        if ck % kernel != 0 {
            invalid!("the column height {ck} is not a multiple of the block size {kernel}");
        }
        let c = ck / kernel;
        let ones =
            |name: &str| -> R<Vec<i64>> { Ok(a.ints(name).inv()?.unwrap_or_else(|| vec![1; k])) };
        let (strides, dilations) = (ones("strides")?, ones("dilations")?);
        let pads = a.ints("pads").inv()?.unwrap_or_else(|| vec![0; 2 * k]);
        if strides.len() != k || dilations.len() != k || pads.len() != 2 * k {
            invalid!(
                "strides, dilations and pads must have {k}, {k} and {} entries",
                2 * k
            );
        }
        if strides.iter().chain(&dilations).any(|&v| v <= 0) || pads.iter().any(|&p| p < 0) {
            invalid!("strides and dilations must be positive and pads non-negative");
        }
        // Blocks per axis, and the end padding that the last block leaves uncovered.
        let mut grid = vec![];
        let mut output_padding = vec![];
        for i in 0..k {
            let span = image[i] + pads[i] + pads[k + i] - dilations[i] * (block[i] - 1) - 1;
            if span < 0 {
                invalid!("a block does not fit in the padded image along axis {i}");
            }
            grid.push(span / strides[i] + 1);
            output_padding.push(span % strides[i]);
        }
        if grid.iter().product::<i64>() != l {
            invalid!(
                "the input has {l} blocks, the shapes give {}",
                grid.iter().product::<i64>()
            );
        }
        let mut shape = vec![n, ck];
        shape.extend(&grid);
        let xg = self.op(K::Reshape, ShapeAttrs { shape }.to_attrs(), &[x])?;
        // Weight [C·K, 1, block..]: channel c·K + q has a one at block position q.
        let mut wshape = vec![ck as usize, 1];
        wshape.extend(block.iter().map(|&b| b as usize));
        let mut w = vec![0.0; (ck * kernel) as usize];
        for ch in 0..ck {
            let q = ch % kernel;
            w[(ch * kernel + q) as usize] = 1.0;
        }
        let w = Val::konst(Tensor::from_f64(xt.dtype, wshape, w));
        let attrs = ConvTransposeAttrs {
            strides: Some(strides),
            pads: Some(pads),
            dilations: Some(dilations),
            output_padding: Some(output_padding),
            group: c,
        };
        self.op(K::ConvTranspose, attrs.to_attrs(), &[xg, w])
    }
}

impl Importer<'_> {
    /// `MelWeightMatrix` (opset 17): the `[dft_length/2 + 1, num_mel_bins]` triangular
    /// filter bank, built at import time from its scalar inputs (the mel scale
    /// `2595·log10(1 + f/700)`, band edges rounded down to spectrogram bins).
    pub(super) fn lower_mel_weight_matrix(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        if self.opset < 17 {
            return Err(self.unsupported_op(node));
        }
        let what = [
            "num_mel_bins",
            "dft_length",
            "sample_rate",
            "lower_edge_hertz",
            "upper_edge_hertz",
        ];
        let mut v = [0.0f64; 5];
        for (i, w) in what.iter().enumerate() {
            match self.static_scalar_f64(node, i, w)? {
                Some(x) => v[i] = x,
                None => invalid!("input {i} ({w}) is missing"),
            }
        }
        let [mels, dft, rate, low, high] = v;
        if mels < 1.0 || dft < 1.0 || rate <= 0.0 || mels > MAX_GENERATED as f64 {
            invalid!(
                "num_mel_bins {mels}, dft_length {dft} and sample_rate {rate} must be positive"
            );
        }
        let (mels, bins) = (mels as usize, dft as usize / 2 + 1);
        if bins > MAX_GENERATED || mels.saturating_mul(bins) > MAX_GENERATED {
            invalid!("a {bins}×{mels} matrix is too large to build at import time");
        }
        let to_mel = |f: f64| 2595.0 * (f / 700.0).ln_1p() / std::f64::consts::LN_10;
        let (lo, hi) = (to_mel(low), to_mel(high));
        let step = (hi - lo) / (mels + 2) as f64;
        let edge: Vec<i64> = (0..mels + 2)
            .map(|k| {
                let m = k as f64 * step + lo;
                let f = 700.0 * (m / 2595.0 * std::f64::consts::LN_10).exp_m1();
                ((dft + 1.0) * f / rate).floor() as i64
            })
            .collect();
        let mut w = vec![0.0; bins * mels];
        let mut set = |j: i64, i: usize, x: f64| -> R<()> {
            if j < 0 || j as usize >= bins {
                invalid!("the mel band {i} reaches past the {bins} spectrogram bins");
            }
            w[j as usize * mels + i] = x;
            Ok(())
        };
        for i in 0..mels {
            let (l, c, r) = (edge[i], edge[i + 1], edge[i + 2]);
            if c == l {
                set(c, i, 1.0)?;
            } else {
                for j in l..=c {
                    set(j, i, (j - l) as f64 / (c - l) as f64)?;
                }
            }
            for j in c..r {
                set(j, i, (r - j) as f64 / (r - c) as f64)?;
            }
        }
        let dtype = dtype_attr(a.int_or("output_datatype", 1).inv()?)?;
        Ok(Val::konst(if dtype.is_float() {
            Tensor::from_f64(dtype, vec![bins, mels], w)
        } else {
            Tensor::from_i64(
                dtype,
                vec![bins, mels],
                w.iter().map(|&x| x as i64).collect(),
            )
        }))
    }
}
