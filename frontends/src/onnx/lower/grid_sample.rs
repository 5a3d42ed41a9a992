//! ONNX `GridSample` (opsets 16–22; 1-, 2- and 3-D), decomposed into ppir ops.
//!
//! The grid's normalised coordinates become input coordinates (`align_corners`); `nearest`
//! rounds them half to even; coordinates outside the border are clamped (`border`) or
//! reflected (`reflection`). Each output point then reads 1 (nearest), 2ᵏ (linear) or 4ᵏ
//! (cubic, a = -0.75) input points: their flat indices (clamped, or reflected, and with
//! zero weight outside the input for `zeros`) `gather` rows of the input laid out as
//! [N·spatial, C], weighted by products of the per-axis coefficients. Gradients reach the
//! input through `gather` and the grid through the coefficients.

use ppir::ops::attrs::{CastAttrs, GatherAttrs, ShapeAttrs, TransposeAttrs};
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, Dim, OpKind, Tensor};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, unsupported, Importer, Val, BATCH_NEEDED, R};
use super::super::proto::NodeProto;
use super::attention::known;
use super::OrInvalid;

use OpKind as K;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Padding {
    Zeros,
    Border,
    Reflection,
}

impl Importer<'_> {
    fn clamp_to(&mut self, x: Val, lo: f64, hi: f64) -> R<Val> {
        let m = self.with_scalar(K::Max, x, lo)?;
        self.with_scalar(K::Min, m, hi)
    }

    /// Reflect `x` by the nearer border until it lies in [lo, hi] (where it is outside).
    fn reflect(&mut self, x: Val, lo: f64, hi: f64) -> R<Val> {
        let dt = self.ty(&x)?.dtype;
        let range = hi - lo;
        if range <= 0.0 {
            let c = self.cst(dt, lo);
            let zero = self.with_scalar(K::Mul, x, 0.0)?;
            return self.binop(K::Add, zero, c);
        }
        let mut out = x.clone();
        for below in [true, false] {
            // d: the distance past the border; n its whole ranges, r the rest.
            let d = if below {
                let c = self.cst(dt, lo);
                self.binop(K::Sub, c, x.clone())?
            } else {
                self.with_scalar(K::Sub, x.clone(), hi)?
            };
            let q = self.with_scalar(K::Div, d.clone(), range)?;
            let n = self.un(K::Floor, q)?;
            let nr = self.with_scalar(K::Mul, n.clone(), range)?;
            let r = self.binop(K::Sub, d.clone(), nr)?;
            let parity = self.with_scalar(K::Mod, n, 2.0)?;
            let zero = self.cst(dt, 0.0);
            let even = self.binop(K::Equal, parity, zero.clone())?;
            let from_lo = self.with_scalar(K::Add, r.clone(), lo)?;
            let hi_c = self.cst(dt, hi);
            let from_hi = self.binop(K::Sub, hi_c, r)?;
            let reflected = if below {
                self.op(K::Where, Attrs::new(), &[even, from_lo, from_hi])?
            } else {
                self.op(K::Where, Attrs::new(), &[even, from_hi, from_lo])?
            };
            let outside = self.binop(K::Greater, d, zero)?;
            out = self.op(K::Where, Attrs::new(), &[outside, reflected, out])?;
        }
        Ok(out)
    }

    pub(super) fn lower_grid_sample(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        if self.opset < 16 {
            return Err(self.unsupported_op(node));
        }
        let (x, grid) = (self.req(node, 0)?, self.req(node, 1)?);
        let (xt, gt) = (self.ty(&x)?, self.ty(&grid)?);
        if !xt.dtype.is_float() || !gt.dtype.is_float() {
            invalid!("X and grid must be float tensors, not {xt} and {gt}");
        }
        let k = xt.rank().saturating_sub(2);
        if k == 0 || k > 3 || gt.rank() != k + 2 || gt.dims[k + 1] != Dim::Known(k as u64) {
            invalid!(
                "X must be [N, C, D1..Dk] (k = 1..3) and grid [N, O1..Ok, k], not {xt} and {gt}"
            );
        }
        let (opset, mode) = (self.opset, a.string_or("mode", "").inv()?);
        let mode = match mode.as_str() {
            "" if opset >= 20 => "linear",
            "" => "bilinear",
            m => m,
        };
        let taps_per_axis: usize = match mode {
            "nearest" => 1,
            "linear" | "bilinear" => 2,
            "cubic" | "bicubic" => 4,
            m => invalid!("unknown mode {m:?}"),
        };
        let padding = match a.string_or("padding_mode", "zeros").inv()?.as_str() {
            "zeros" => Padding::Zeros,
            "border" => Padding::Border,
            "reflection" => Padding::Reflection,
            p => invalid!("unknown padding_mode {p:?}"),
        };
        let align = a.int_or("align_corners", 0).inv()? != 0;
        let n = match xt.dims[0] {
            Dim::Known(v) => v as usize,
            Dim::Batch => unsupported!("{}", BATCH_NEEDED),
        };
        let c = known(xt.dims[1], "the channel count")?;
        let lens = (0..k)
            .map(|j| known(xt.dims[2 + j], "a spatial dimension of X"))
            .collect::<R<Vec<_>>>()?;
        let outs = (0..k)
            .map(|j| known(gt.dims[1 + j], "a spatial dimension of the grid"))
            .collect::<R<Vec<_>>>()?;
        if gt.dims[0] != Dim::Known(n as u64) {
            invalid!("X and grid must have the same batch size");
        }
        let spatial: usize = lens.iter().product();
        let points: usize = outs.iter().product();
        if spatial == 0 || points == 0 || taps_per_axis.pow(k as u32) > 64 {
            unsupported!("an empty input or output, or more than 64 taps per point");
        }
        let dt = xt.dtype;
        // The grid as [N, P, k] in X's type; coordinate j of X reads grid component k-1-j.
        let g = self.cast_to(grid, dt)?;
        let flat = ShapeAttrs {
            shape: vec![n as i64, points as i64, k as i64],
        };
        let g = self.op(K::Reshape, flat.to_attrs(), &[g])?;
        // Per axis: (index, weight or none for 1) of each tap, as [N, P].
        let mut axis_taps: Vec<Vec<(Val, Option<Val>)>> = vec![];
        for (j, &len) in lens.iter().enumerate() {
            let l = len as f64;
            let comp = (k - 1 - j) as i64;
            let gj = self.slice_axis(g.clone(), 2, comp, comp + 1, 1)?;
            let sq = ShapeAttrs {
                shape: vec![n as i64, points as i64],
            };
            let gj = self.op(K::Reshape, sq.to_attrs(), &[gj])?;
            let gp = self.with_scalar(K::Add, gj, 1.0)?;
            let mut xj = if align {
                self.with_scalar(K::Mul, gp, (l - 1.0) / 2.0)?
            } else {
                let s = self.with_scalar(K::Mul, gp, l)?;
                let s = self.with_scalar(K::Sub, s, 1.0)?;
                self.with_scalar(K::Mul, s, 0.5)?
            };
            if taps_per_axis == 1 {
                xj = self.round_half_even(xj, dt)?;
            }
            let (lo, hi) = if align {
                (0.0, l - 1.0)
            } else {
                (-0.5, l - 0.5)
            };
            xj = match padding {
                Padding::Zeros => xj,
                Padding::Border => {
                    let clamped = self.clamp_to(xj.clone(), 0.0, l - 1.0)?;
                    let below = self.with_scalar(K::Less, xj.clone(), lo)?;
                    let above = self.with_scalar(K::Greater, xj.clone(), hi)?;
                    let outside = self.binop(K::Or, below, above)?;
                    self.op(K::Where, Attrs::new(), &[outside, clamped, xj])?
                }
                Padding::Reflection => self.reflect(xj, lo, hi)?,
            };
            let mut taps = vec![];
            if taps_per_axis == 1 {
                taps.push((xj, None));
            } else {
                let x0 = self.un(K::Floor, xj.clone())?;
                let t = self.binop(K::Sub, xj, x0.clone())?;
                let offsets: Vec<i64> = if taps_per_axis == 2 {
                    vec![0, 1]
                } else {
                    vec![-1, 0, 1, 2]
                };
                for off in offsets {
                    let idx = self.with_scalar(K::Add, x0.clone(), off as f64)?;
                    // The coefficient of tap `off` at distance |t - off|.
                    let d = self.with_scalar(K::Sub, t.clone(), off as f64)?;
                    let d = self.un(K::Abs, d)?;
                    let w = if taps_per_axis == 2 {
                        self.one_minus_pub(d)?
                    } else {
                        self.keys_cubic(d, -0.75)?
                    };
                    taps.push((idx, Some(w)));
                }
            }
            // Indices into range: clamped, reflected, or (zeros) clamped with weight 0.
            let mut resolved = vec![];
            for (idx, w) in taps {
                let (idx, w) = match padding {
                    Padding::Border => (self.clamp_to(idx, 0.0, l - 1.0)?, w),
                    Padding::Reflection => {
                        let r = self.reflect(idx, lo, hi)?;
                        // int(): toward zero.
                        let r = self.clamp_to(r, 0.0, l - 1.0)?;
                        (self.trunc_nonneg(r)?, w)
                    }
                    Padding::Zeros => {
                        let ge = self.with_scalar(K::GreaterEqual, idx.clone(), 0.0)?;
                        let le = self.with_scalar(K::LessEqual, idx.clone(), l - 1.0)?;
                        let inside = self.binop(K::And, ge, le)?;
                        let m = self.op(K::Cast, CastAttrs { to: dt }.to_attrs(), &[inside])?;
                        let w = match w {
                            Some(w) => self.binop(K::Mul, w, m)?,
                            None => m,
                        };
                        (self.clamp_to(idx, 0.0, l - 1.0)?, Some(w))
                    }
                };
                let idx = self.op(K::Cast, CastAttrs { to: DType::I64 }.to_attrs(), &[idx])?;
                resolved.push((idx, w));
            }
            axis_taps.push(resolved);
        }
        // X as rows [N·spatial, C].
        let mut perm = vec![0i64];
        perm.extend((2..k as i64 + 2).collect::<Vec<_>>());
        perm.push(1);
        let xr = self.op(
            K::Transpose,
            TransposeAttrs { perm: Some(perm) }.to_attrs(),
            &[x],
        )?;
        let rows = ShapeAttrs {
            shape: vec![(n * spatial) as i64, c as i64],
        };
        let xr = self.op(K::Reshape, rows.to_attrs(), &[xr])?;
        let base: Vec<i64> = (0..n).map(|b| (b * spatial) as i64).collect();
        let base = Val::konst(Tensor::from_i64(DType::I64, vec![n, 1], base));
        let strides: Vec<i64> = (0..k)
            .map(|j| lens[j + 1..].iter().product::<usize>() as i64)
            .collect();
        let total = taps_per_axis.pow(k as u32);
        let mut acc: Option<Val> = None;
        for combo in 0..total {
            let mut rest = combo;
            let mut flat_idx = base.clone();
            let mut weight: Option<Val> = None;
            for (j, taps) in axis_taps.iter().enumerate() {
                let (idx, w) = &taps[rest % taps_per_axis];
                rest /= taps_per_axis;
                let stride = Val::konst(Tensor::from_i64(DType::I64, vec![], vec![strides[j]]));
                let scaled = self.binop(K::Mul, idx.clone(), stride)?;
                flat_idx = self.binop(K::Add, flat_idx, scaled)?;
                weight = match (weight, w) {
                    (Some(acc_w), Some(w)) => Some(self.binop(K::Mul, acc_w, w.clone())?),
                    (acc_w, w) => acc_w.or_else(|| w.clone()),
                };
            }
            let picked = self.op(
                K::Gather,
                GatherAttrs { axis: 0 }.to_attrs(),
                &[xr.clone(), flat_idx],
            )?;
            let term = match weight {
                Some(w) => {
                    let w3 = ShapeAttrs {
                        shape: vec![n as i64, points as i64, 1],
                    };
                    let w = self.op(K::Reshape, w3.to_attrs(), &[w])?;
                    self.binop(K::Mul, picked, w)?
                }
                None => picked,
            };
            acc = Some(match acc {
                Some(s) => self.binop(K::Add, s, term)?,
                None => term,
            });
        }
        let Some(y) = acc else {
            invalid!("no taps");
        };
        // [N, P, C] → [N, C, O1..Ok].
        let perm = TransposeAttrs {
            perm: Some(vec![0, 2, 1]),
        };
        let y = self.op(K::Transpose, perm.to_attrs(), &[y])?;
        let mut shape = vec![n as i64, c as i64];
        shape.extend(outs.iter().map(|&o| o as i64));
        self.op(K::Reshape, ShapeAttrs { shape }.to_attrs(), &[y])
    }

    fn one_minus_pub(&mut self, x: Val) -> R<Val> {
        let dt = self.ty(&x)?.dtype;
        let one = self.cst(dt, 1.0);
        self.binop(K::Sub, one, x)
    }

    /// Keys' cubic kernel at distance `d` ≥ 0 (a piecewise cubic, 0 from 2 on).
    fn keys_cubic(&mut self, d: Val, a: f64) -> R<Val> {
        let dt = self.ty(&d)?.dtype;
        // Near: ((a + 2)d - (a + 3))d² + 1; far: ((a d - 5a)d + 8a)d - 4a.
        let d2 = self.binop(K::Mul, d.clone(), d.clone())?;
        let n1 = self.with_scalar(K::Mul, d.clone(), a + 2.0)?;
        let n1 = self.with_scalar(K::Sub, n1, a + 3.0)?;
        let n1 = self.binop(K::Mul, n1, d2)?;
        let near = self.with_scalar(K::Add, n1, 1.0)?;
        let f1 = self.with_scalar(K::Mul, d.clone(), a)?;
        let f1 = self.with_scalar(K::Sub, f1, 5.0 * a)?;
        let f1 = self.binop(K::Mul, f1, d.clone())?;
        let f1 = self.with_scalar(K::Add, f1, 8.0 * a)?;
        let f1 = self.binop(K::Mul, f1, d.clone())?;
        let far = self.with_scalar(K::Sub, f1, 4.0 * a)?;
        let one = self.cst(dt, 1.0);
        let two = self.cst(dt, 2.0);
        let is_near = self.binop(K::LessEqual, d.clone(), one)?;
        let is_far = self.binop(K::Less, d, two)?;
        let zero = self.cst(dt, 0.0);
        let far = self.op(K::Where, Attrs::new(), &[is_far, far, zero])?;
        self.op(K::Where, Attrs::new(), &[is_near, near, far])
    }

    /// `trunc` of a value ≥ 0.
    fn trunc_nonneg(&mut self, x: Val) -> R<Val> {
        self.un(K::Floor, x)
    }
}
