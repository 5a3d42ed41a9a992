//! ONNX `Resize` (opsets 10–19) and `Upsample` (7–9), decomposed into ppir ops.
//!
//! Resizing is separable: ONNX defines N-D interpolation as 1-D interpolation along each
//! resized axis in turn. With the scales or sizes known at import time, each output
//! position along an axis is a fixed combination of input positions, so each axis becomes
//! an interpolation matrix `W [out, in]` built here (every mode: `nearest` with its four
//! rounding rules, `linear`, `cubic` with `cubic_coeff_a`; `antialias`, `exclude_outside`;
//! every `coordinate_transformation_mode`): `nearest` is a `gather` of the chosen rows,
//! the other modes a `matmul` of `W` with x viewed as `[before, in, after]`. Outputs of
//! `tf_crop_and_resize` whose source coordinate falls outside the input take
//! `extrapolation_value` through a `where`. Gradients come from `gather`/`matmul`.

use ppir::ops::attrs::{GatherAttrs, ShapeAttrs};
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, Dim, OpKind, Tensor};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, unsupported, Importer, Val, R};
use super::super::proto::NodeProto;
use super::{norm_axis, OrInvalid};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Nearest,
    Linear,
    Cubic,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Nearest {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Coords {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfCropAndResize,
}

/// How one axis is resampled.
#[derive(Clone, Debug)]
struct Interp {
    mode: Mode,
    nearest: Nearest,
    coords: Coords,
    cubic_a: f64,
    exclude_outside: bool,
    antialias: bool,
}

/// One axis's resampling: per output position, its (input index, weight) taps, or `None`
/// where the output is the extrapolation value.
type Taps = Vec<Option<Vec<(usize, f64)>>>;

fn cubic_kernel(d: f64, a: f64) -> f64 {
    let d = d.abs();
    if d <= 1.0 {
        ((a + 2.0) * d - (a + 3.0)) * d * d + 1.0
    } else if d < 2.0 {
        ((a * d - 5.0 * a) * d + 8.0 * a) * d - 4.0 * a
    } else {
        0.0
    }
}

impl Interp {
    /// The source coordinate of output position `x` (ONNX's `x_original`).
    fn source(&self, x: f64, scale: f64, input: usize, output: usize, roi: (f64, f64)) -> f64 {
        let in_f = input as f64;
        // The real-valued output length the coordinate rules use.
        let width = scale * in_f;
        match self.coords {
            Coords::HalfPixel => (x + 0.5) / scale - 0.5,
            Coords::HalfPixelSymmetric => {
                let adjustment = output as f64 / width;
                let offset = in_f / 2.0 * (1.0 - adjustment);
                offset + (x + 0.5) / scale - 0.5
            }
            Coords::PytorchHalfPixel => {
                if width == 1.0 {
                    -0.5
                } else {
                    (x + 0.5) / scale - 0.5
                }
            }
            Coords::AlignCorners => {
                if width == 1.0 {
                    0.0
                } else {
                    x * (in_f - 1.0) / (width - 1.0)
                }
            }
            Coords::Asymmetric => x / scale,
            Coords::TfCropAndResize => {
                let (start, end) = roi;
                let o = if width == 1.0 {
                    (end - start) * (in_f - 1.0) / 2.0
                } else {
                    x * (end - start) * (in_f - 1.0) / (width - 1.0)
                };
                o + start * (in_f - 1.0)
            }
        }
    }

    /// Offsets from the base index and their unnormalised weights, for the fractional
    /// position `ratio` in (0, 1].
    fn coefficients(&self, ratio: f64, scale: f64) -> Vec<(i64, f64)> {
        match self.mode {
            Mode::Nearest => {
                let upper = if ratio == 1.0 {
                    true
                } else {
                    match self.nearest {
                        Nearest::RoundPreferFloor => ratio > 0.5,
                        Nearest::RoundPreferCeil => ratio >= 0.5,
                        Nearest::Floor => false,
                        Nearest::Ceil => true,
                    }
                };
                vec![(0, f64::from(!upper)), (1, f64::from(upper))]
            }
            Mode::Linear if !self.antialias => vec![(0, 1.0 - ratio), (1, ratio)],
            Mode::Cubic if !self.antialias => (-1..=2)
                .map(|i| (i, cubic_kernel(i as f64 - ratio, self.cubic_a)))
                .collect(),
            Mode::Linear => {
                // The triangle filter stretched by 1/scale when downsampling, normalised.
                let s = scale.min(1.0);
                let start = (-1.0 / s).floor() as i64 + 1;
                let taps: Vec<(i64, f64)> = (start..2 - start)
                    .map(|i| (i, (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0)))
                    .collect();
                normalised(taps)
            }
            Mode::Cubic => {
                let s = scale.min(1.0);
                let start = (-2.0 / s).floor() as i64 + 1;
                let taps: Vec<(i64, f64)> = (start..2 - start)
                    .map(|i| (i, cubic_kernel(s * (i as f64 - ratio), self.cubic_a)))
                    .collect();
                normalised(taps)
            }
        }
    }

    fn taps(&self, input: usize, output: usize, scale: f64, roi: (f64, f64)) -> Taps {
        (0..output)
            .map(|o| {
                let x = self.source(o as f64, scale, input, output, roi);
                if self.coords == Coords::TfCropAndResize
                    && (x < 0.0 || x > input as f64 - 1.0 || x.is_nan())
                {
                    return None;
                }
                // The base index is the neighbour on the left; an integer position is
                // the right end of its interval (ratio 1), as ONNX prefers.
                let (base, ratio) = if x == x.floor() {
                    (x as i64 - 1, 1.0)
                } else {
                    (x.floor() as i64, x - x.floor())
                };
                let mut taps: Vec<(i64, f64)> = self
                    .coefficients(ratio, scale)
                    .into_iter()
                    .map(|(i, w)| (base + i, w))
                    .collect();
                if self.exclude_outside {
                    for t in &mut taps {
                        if t.0 < 0 || t.0 >= input as i64 {
                            t.1 = 0.0;
                        }
                    }
                    taps = normalised(taps);
                }
                let last = input as i64 - 1;
                Some(
                    taps.into_iter()
                        .filter(|&(_, w)| w != 0.0)
                        .map(|(i, w)| (i.clamp(0, last) as usize, w))
                        .collect(),
                )
            })
            .collect()
    }
}

fn normalised(taps: Vec<(i64, f64)>) -> Vec<(i64, f64)> {
    let sum: f64 = taps.iter().map(|t| t.1).sum();
    if sum == 0.0 {
        return taps;
    }
    taps.into_iter().map(|(i, w)| (i, w / sum)).collect()
}

fn is_close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

impl Importer<'_> {
    pub(super) fn lower_resize(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let op = node.op_type.as_str();
        let opset = self.opset;
        if op == "Upsample" && opset >= 10 {
            return Err(self.unsupported_op(node));
        }
        if op == "Resize" && opset < 10 {
            return Err(self.unsupported_op(node));
        }
        let x = self.req(node, 0)?;
        let xt = self.ty(&x)?;
        let rank = xt.rank();
        let legacy = op == "Upsample" || opset < 11;
        let mode = match a.string_or("mode", "nearest").inv()?.as_str() {
            "nearest" => Mode::Nearest,
            "linear" | "bilinear" if legacy => Mode::Linear,
            "linear" => Mode::Linear,
            "cubic" if !legacy => Mode::Cubic,
            m => invalid!("unknown mode {m:?}"),
        };
        let interp = if legacy {
            // Resize-10 and Upsample: asymmetric coordinates, nearest rounds down.
            Interp {
                mode,
                nearest: Nearest::Floor,
                coords: Coords::Asymmetric,
                cubic_a: -0.75,
                exclude_outside: false,
                antialias: false,
            }
        } else {
            let nearest = match a
                .string_or("nearest_mode", "round_prefer_floor")
                .inv()?
                .as_str()
            {
                "round_prefer_floor" => Nearest::RoundPreferFloor,
                "round_prefer_ceil" => Nearest::RoundPreferCeil,
                "floor" => Nearest::Floor,
                "ceil" => Nearest::Ceil,
                m => invalid!("unknown nearest_mode {m:?}"),
            };
            let coords = match a
                .string_or("coordinate_transformation_mode", "half_pixel")
                .inv()?
                .as_str()
            {
                "half_pixel" => Coords::HalfPixel,
                "half_pixel_symmetric" if opset >= 18 => Coords::HalfPixelSymmetric,
                "pytorch_half_pixel" => Coords::PytorchHalfPixel,
                "align_corners" => Coords::AlignCorners,
                "asymmetric" => Coords::Asymmetric,
                "tf_crop_and_resize" => Coords::TfCropAndResize,
                // Removed in opset 13; a fixed-offset variant ppcc does not follow.
                "tf_half_pixel_for_nn" => {
                    unsupported!("coordinate_transformation_mode \"tf_half_pixel_for_nn\"")
                }
                m => invalid!("unknown coordinate_transformation_mode {m:?}"),
            };
            let antialias = opset >= 18 && a.int_or("antialias", 0).inv()? != 0;
            if antialias && mode == Mode::Nearest {
                invalid!("antialias applies to the linear and cubic modes only");
            }
            Interp {
                mode,
                nearest,
                coords,
                cubic_a: a.float_or("cubic_coeff_a", -0.75).inv()?,
                exclude_outside: a.int_or("exclude_outside", 0).inv()? != 0,
                antialias,
            }
        };
        if mode != Mode::Nearest && !xt.dtype.is_float() {
            unsupported!("{mode:?} resizing of a {} tensor", xt.dtype);
        }
        let extrapolation = a.float_or("extrapolation_value", 0.0).inv()?;

        // The axes that `roi`, `scales` and `sizes` describe.
        let axes: Vec<usize> = match (opset >= 18 && op == "Resize")
            .then(|| a.ints("axes"))
            .transpose()
            .inv()?
            .flatten()
        {
            Some(ax) => {
                let axes = ax
                    .iter()
                    .map(|&i| norm_axis(i, rank))
                    .collect::<R<Vec<_>>>()?;
                let mut seen = axes.clone();
                seen.sort_unstable();
                seen.dedup();
                if seen.len() != axes.len() {
                    invalid!("`axes` repeats an axis: {ax:?}");
                }
                axes
            }
            None => (0..rank).collect(),
        };
        let n = axes.len();
        let present =
            |t: &Option<std::rc::Rc<Tensor>>| t.as_ref().filter(|t| t.num_elements() > 0).cloned();
        let (roi, scales, sizes) = if op == "Upsample" && opset < 9 {
            let Some(s) = a.floats("scales").inv()? else {
                invalid!("attribute `scales` is required")
            };
            (None, Some(s), None)
        } else if legacy {
            let s = present(&self.static_input(node, 1, "scales")?);
            let Some(s) = s else {
                invalid!("input 1 (scales) is missing")
            };
            (None, Some(s.to_f64_vec()), None)
        } else {
            let roi = present(&self.static_input(node, 1, "roi")?).map(|t| t.to_f64_vec());
            let scales = present(&self.static_input(node, 2, "scales")?).map(|t| t.to_f64_vec());
            let sizes = present(&self.static_input(node, 3, "sizes")?).map(|t| t.to_i64_vec());
            (roi, scales, sizes)
        };
        let dims = xt.dims.clone();
        let size_of = |d: usize| -> R<usize> {
            match dims[d] {
                Dim::Known(v) => Ok(v as usize),
                Dim::Batch => unsupported!(
                    "resizing axis {d}, the symbolic batch size; fix it with --batch N"
                ),
            }
        };
        // Per axis of x: (scale, output length), for the axes in `axes`.
        let mut plan: Vec<(usize, f64, usize)> = Vec::with_capacity(n);
        match (scales, sizes) {
            (Some(_), Some(_)) => invalid!("only one of scales and sizes may be given"),
            (None, None) => invalid!("one of scales and sizes must be given"),
            (Some(s), None) => {
                if s.len() != n {
                    invalid!("scales has {} entries, {n} expected", s.len());
                }
                for (&d, &sc) in axes.iter().zip(&s) {
                    if !(sc > 0.0 && sc.is_finite()) {
                        invalid!("scale {sc} for axis {d} must be positive");
                    }
                    if is_close(sc, 1.0) && dims[d] == Dim::Batch {
                        continue;
                    }
                    let len = size_of(d)?;
                    let out = (sc * len as f64).floor();
                    if out > (1u64 << 31) as f64 {
                        invalid!("axis {d} would have {out} elements");
                    }
                    plan.push((d, sc, out as usize));
                }
            }
            (None, Some(sz)) => {
                if sz.len() != n {
                    invalid!("sizes has {} entries, {n} expected", sz.len());
                }
                if sz.iter().any(|&v| !(0..=1 << 31).contains(&v)) {
                    invalid!("sizes must be non-negative, got {sz:?}");
                }
                let lens = axes.iter().map(|&d| size_of(d)).collect::<R<Vec<_>>>()?;
                let policy = if opset >= 18 {
                    a.string_or("keep_aspect_ratio_policy", "stretch").inv()?
                } else {
                    "stretch".to_string()
                };
                let ratios: Vec<f64> = sz
                    .iter()
                    .zip(&lens)
                    .map(|(&s, &l)| s as f64 / l as f64)
                    .collect();
                let common = match policy.as_str() {
                    "stretch" => None,
                    "not_larger" => Some(ratios.iter().copied().fold(f64::INFINITY, f64::min)),
                    "not_smaller" => Some(ratios.iter().copied().fold(0.0, f64::max)),
                    p => invalid!("unknown keep_aspect_ratio_policy {p:?}"),
                };
                for (i, &d) in axes.iter().enumerate() {
                    match common {
                        None => plan.push((d, ratios[i], sz[i] as usize)),
                        Some(s) => {
                            let out = (s * lens[i] as f64 + 0.5).floor();
                            plan.push((d, s, out as usize));
                        }
                    }
                }
            }
        }
        let roi_of = |i: usize| -> R<(f64, f64)> {
            match &roi {
                Some(r) if interp.coords == Coords::TfCropAndResize => {
                    if r.len() != 2 * n {
                        invalid!("roi has {} entries, {} expected", r.len(), 2 * n);
                    }
                    Ok((r[i], r[n + i]))
                }
                _ => Ok((0.0, 1.0)),
            }
        };
        let mut y = x;
        for &(d, scale, out) in &plan {
            let i = axes.iter().position(|&a| a == d).unwrap_or(0);
            let roi_d = roi_of(i)?;
            let len = size_of(d)?;
            if is_close(scale, 1.0) && out == len && roi_d == (0.0, 1.0) {
                continue;
            }
            if len == 0 {
                invalid!("axis {d} is empty and cannot be resized");
            }
            let taps = interp.taps(len, out, scale, roi_d);
            y = self.resample_axis(y, d, len, &taps, mode, extrapolation)?;
        }
        Ok(y)
    }

    /// Apply one axis's taps to `x` along axis `d` (length `len`).
    fn resample_axis(
        &mut self,
        x: Val,
        d: usize,
        len: usize,
        taps: &Taps,
        mode: Mode,
        extrapolation: f64,
    ) -> R<Val> {
        use OpKind as K;
        let xt = self.ty(&x)?;
        let out = taps.len();
        let rank = xt.rank();
        let mut y = if mode == Mode::Nearest {
            let idx: Vec<i64> = taps
                .iter()
                .map(|t| {
                    t.as_ref()
                        .and_then(|t| t.iter().max_by(|a, b| a.1.total_cmp(&b.1)))
                        .map_or(0, |&(i, _)| i as i64)
                })
                .collect();
            let idx = Val::konst(Tensor::from_i64(DType::I64, vec![out], idx));
            self.op(
                K::Gather,
                GatherAttrs { axis: d as i64 }.to_attrs(),
                &[x, idx],
            )?
        } else {
            if out.saturating_mul(len) > 1 << 26 {
                unsupported!("a {out}x{len} interpolation matrix (axis {d}) is too large");
            }
            let mut w = vec![0.0; out * len];
            for (o, t) in taps.iter().enumerate() {
                for &(i, wt) in t.iter().flatten() {
                    w[o * len + i] += wt;
                }
            }
            let w = Val::konst(Tensor::from_f64(xt.dtype, vec![out, len], w));
            // x as [before, len, after] (the batch size, if any, folded into `before`).
            let known = |r: std::ops::Range<usize>| -> Option<i64> {
                xt.dims[r]
                    .iter()
                    .try_fold(1i64, |acc, dim| dim.known().map(|v| acc * v as i64))
            };
            let before = known(0..d).unwrap_or(-1);
            let Some(after) = known(d + 1..rank) else {
                unsupported!("resizing axis {d} before the symbolic batch size");
            };
            let shape = ShapeAttrs {
                shape: vec![before, len as i64, after],
            };
            let x3 = self.op(K::Reshape, shape.to_attrs(), &[x])?;
            let y3 = self.op(K::MatMul, Attrs::new(), &[w, x3])?;
            let mut dims = super::attention::reshape_spec(&xt.dims)?;
            dims[d] = out as i64;
            self.op(K::Reshape, ShapeAttrs { shape: dims }.to_attrs(), &[y3])?
        };
        if taps.iter().any(Option::is_none) {
            let mut shape = vec![out];
            shape.extend(std::iter::repeat_n(1, rank - d - 1));
            let mask: Vec<bool> = taps.iter().map(Option::is_none).collect();
            let mask = Val::konst(Tensor::from_i64(
                DType::Bool,
                shape,
                mask.into_iter().map(i64::from).collect(),
            ));
            let e = self.cst(xt.dtype, extrapolation);
            y = self.op(K::Where, Attrs::new(), &[mask, e, y])?;
        }
        Ok(y)
    }
}
