//! ONNX `DFT` (opsets 17 and 20) as `matmul`s with constant cosine and sine matrices along
//! the transformed axis: for θ = 2πkn/L, the forward transform is
//! `Re = C·re + S·im`, `Im = C·im - S·re`; the inverse `(C·re - S·im)/L`,
//! `(S·re + C·im)/L`; the one-sided inverse (IRFFT) the real part of the Hermitian extension,
//! `Σₖ cₖ (C·re - S·im)/L` with cₖ = 2 except for k = 0 and k = L/2. `dft_length` pads
//! with zeros or truncates (columns of the matrices). Differentiable through `matmul`.

use ppir::ops::attrs::{ConcatAttrs, ShapeAttrs, SqueezeAttrs, UnsqueezeAttrs};
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, OpKind, Tensor};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, unsupported, Importer, Val, R};
use super::super::proto::NodeProto;
use super::attention::known;
use super::OrInvalid;

impl Importer<'_> {
    pub(super) fn lower_dft(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        if self.opset < 17 {
            return Err(self.unsupported_op(node));
        }
        let x = self.req(node, 0)?;
        let xt = self.ty(&x)?;
        if !xt.dtype.is_float() {
            invalid!("the input must be a float tensor, not {}", xt.dtype);
        }
        let rank = xt.rank();
        if rank < 2 {
            invalid!("the input must have rank at least 2, not {xt}");
        }
        let parts = known(xt.dims[rank - 1], "the last dimension")?;
        if parts != 1 && parts != 2 {
            invalid!("the last dimension must be 1 (real) or 2 (complex), not {parts}");
        }
        let axis = if self.opset >= 20 {
            match self.static_ints(node, 2, "axis")? {
                Some(v) if v.len() == 1 => v[0],
                Some(v) => invalid!("axis must be a scalar, not {v:?}"),
                None => -2,
            }
        } else {
            a.int_or("axis", 1).inv()?
        };
        let r = rank as i64;
        let axis = if axis < 0 { axis + r } else { axis };
        if !(0..r - 1).contains(&axis) {
            invalid!("axis must name a signal dimension (not the last), got {axis}");
        }
        let axis = axis as usize;
        let inverse = a.int_or("inverse", 0).inv()? != 0;
        let onesided = a.int_or("onesided", 0).inv()? != 0;
        let length = match self.static_ints(node, 1, "dft_length")? {
            Some(v) if v.len() == 1 => {
                if v[0] <= 0 {
                    invalid!("dft_length must be positive, not {}", v[0]);
                }
                Some(v[0] as usize)
            }
            Some(v) => invalid!("dft_length must be a scalar, not {v:?}"),
            None => None,
        };
        self.dft_along(x, axis, inverse, onesided, length)
    }

    /// The DFT of `x` (`[.., parts]`, parts 1 for real or 2 for complex) along `axis`,
    /// of `length` points (default: the axis' size, or `2(n-1)` for a one-sided inverse).
    pub(super) fn dft_along(
        &mut self,
        x: Val,
        axis: usize,
        inverse: bool,
        onesided: bool,
        length: Option<usize>,
    ) -> R<Val> {
        use OpKind as K;
        let xt = self.ty(&x)?;
        let rank = xt.rank();
        let r = rank as i64;
        let parts = known(xt.dims[rank - 1], "the last dimension")?;
        let n_in = known(xt.dims[axis], "the transformed dimension")?;
        let length = match length {
            Some(l) => l,
            None if inverse && onesided => 2 * n_in.saturating_sub(1),
            None => n_in,
        };
        if length == 0 {
            invalid!("the transform length is 0");
        }
        let irfft = inverse && onesided;
        let rows = if irfft || inverse || !onesided {
            length
        } else {
            length / 2 + 1
        };
        if rows.saturating_mul(n_in) > 1 << 26 {
            unsupported!("a DFT of {rows}x{n_in} is too large to build as matrices");
        }
        let l = length as f64;
        let tau = 2.0 * std::f64::consts::PI;
        // cos and sin of θ = 2π·(row·col mod L)/L; zero columns past the used input.
        let used = if irfft {
            n_in.min(length / 2 + 1)
        } else {
            n_in.min(length)
        };
        let mut cos = vec![0.0; rows * n_in];
        let mut sin = vec![0.0; rows * n_in];
        for row in 0..rows {
            for col in 0..used {
                let th = tau * ((row * col) % length) as f64 / l;
                let (mut c, mut s) = (th.cos(), th.sin());
                if inverse {
                    let weight = if irfft && !(col == 0 || 2 * col == length) {
                        2.0
                    } else {
                        1.0
                    };
                    c *= weight / l;
                    s *= weight / l;
                }
                cos[row * n_in + col] = c;
                sin[row * n_in + col] = s;
            }
        }
        // Computed in float64 and rounded once at the end: the transform's sums cancel
        // (an inverse of a real signal's spectrum has imaginary parts of exactly 0).
        let mat = |v: Vec<f64>| Val::konst(Tensor::from_f64(DType::F64, vec![rows, n_in], v));
        let (cm, sm) = (mat(cos), mat(sin));

        // Real and imaginary parts without the last axis, as [before, n, after].
        let squeeze = SqueezeAttrs { axes: vec![r - 1] };
        let part = |me: &mut Self, i: i64| -> R<Val> {
            let p = if parts == 1 {
                x.clone()
            } else {
                me.slice_axis(x.clone(), r - 1, i, i + 1, 1)?
            };
            me.op(K::Squeeze, squeeze.to_attrs(), &[p])
        };
        let before = xt.dims[..axis]
            .iter()
            .try_fold(1i64, |acc, d| d.known().map(|v| acc * v as i64))
            .unwrap_or(-1);
        let Some(after) = xt.dims[axis + 1..rank - 1]
            .iter()
            .try_fold(1i64, |acc, d| d.known().map(|v| acc * v as i64))
        else {
            unsupported!("a DFT along an axis before the symbolic batch size");
        };
        let as3 = ShapeAttrs {
            shape: vec![before, n_in as i64, after],
        };
        let re = part(self, 0)?;
        let re = self.op(K::Reshape, as3.to_attrs(), &[re])?;
        let re = self.cast_to(re, DType::F64)?;
        let im = if parts == 2 {
            let im = part(self, 1)?;
            let im = self.op(K::Reshape, as3.to_attrs(), &[im])?;
            Some(self.cast_to(im, DType::F64)?)
        } else {
            None
        };
        let mm = |me: &mut Self, m: &Val, v: &Val| {
            me.op(K::MatMul, Attrs::new(), &[m.clone(), v.clone()])
        };
        let cr = mm(self, &cm, &re)?;
        let sr = mm(self, &sm, &re)?;
        let (ci, si) = match &im {
            Some(im) => (Some(mm(self, &cm, im)?), Some(mm(self, &sm, im)?)),
            None => (None, None),
        };
        let combine = |me: &mut Self, a: Val, b: Option<Val>, kind: OpKind| -> R<Val> {
            match b {
                Some(b) => me.binop(kind, a, b),
                None => Ok(a),
            }
        };
        let (out_re, out_im) = if !inverse {
            let re = combine(self, cr, si, K::Add)?;
            let im = match ci {
                Some(ci) => self.binop(K::Sub, ci, sr)?,
                None => self.un(K::Neg, sr)?,
            };
            (re, Some(im))
        } else if irfft {
            (combine(self, cr, si, K::Sub)?, None)
        } else {
            let re = combine(self, cr, si, K::Sub)?;
            let im = combine(self, sr, ci, K::Add)?;
            (re, Some(im))
        };
        // Back to the input's layout with `rows` along the axis and the parts last.
        let mut dims = super::attention::reshape_spec(&xt.dims[..rank - 1])?;
        dims[axis] = rows as i64;
        let back = ShapeAttrs { shape: dims };
        let unsq = UnsqueezeAttrs { axes: vec![r - 1] };
        let mut outs = vec![];
        for p in std::iter::once(out_re).chain(out_im) {
            let p = self.cast_to(p, xt.dtype)?;
            let p = self.op(K::Reshape, back.to_attrs(), &[p])?;
            outs.push(self.op(K::Unsqueeze, unsq.to_attrs(), &[p])?);
        }
        if outs.len() == 1 {
            Ok(outs.remove(0))
        } else {
            self.op(K::Concat, ConcatAttrs { axis: r - 1 }.to_attrs(), &outs)
        }
    }
}

impl Importer<'_> {
    /// `STFT` (opset 17): the frames `signal[b, f·step .. f·step + L]` are gathered with a
    /// constant index table, weighted by the window and transformed along the frame axis
    /// by [`Importer::dft_along`] (one-sided by default): `[batch, frames, bins, 2]`.
    pub(super) fn lower_stft(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        use OpKind as K;
        if self.opset < 17 {
            return Err(self.unsupported_op(node));
        }
        let x = self.req(node, 0)?;
        let xt = self.ty(&x)?;
        if xt.rank() != 3 || !xt.dtype.is_float() {
            invalid!("the signal must be a float tensor [batch, length, 1 or 2], not {xt}");
        }
        let parts = known(xt.dims[2], "the last dimension")?;
        if parts != 1 && parts != 2 {
            invalid!("the last dimension must be 1 (real) or 2 (complex), not {parts}");
        }
        let n = known(xt.dims[1], "the signal length")?;
        let step = match self.static_ints(node, 1, "frame_step")? {
            Some(v) if v.len() == 1 && v[0] > 0 => v[0] as usize,
            Some(v) => invalid!("frame_step must be one positive value, not {v:?}"),
            None => invalid!("input 1 (frame_step) is missing"),
        };
        let window = self.input(node, 2)?;
        let given = match self.static_ints(node, 3, "frame_length")? {
            Some(v) if v.len() == 1 && v[0] > 0 => Some(v[0] as usize),
            Some(v) => invalid!("frame_length must be one positive value, not {v:?}"),
            None => None,
        };
        let wlen = match &window {
            Some(w) => {
                let wt = self.ty(w)?;
                if wt.rank() != 1 {
                    invalid!("the window must be 1-D, not {wt}");
                }
                Some(known(wt.dims[0], "the window length")?)
            }
            None => None,
        };
        let len = match (given, wlen) {
            (Some(l), Some(w)) if l != w => {
                invalid!("frame_length {l} and the window's length {w} differ")
            }
            (Some(l), _) | (None, Some(l)) => l,
            (None, None) => n,
        };
        if len > n {
            invalid!("frames of {len} do not fit the signal of {n}");
        }
        let onesided = a.int_or("onesided", 1).inv()? != 0;
        if onesided && parts == 2 {
            invalid!("a one-sided transform needs a real signal");
        }
        let frames = (n - len) / step + 1;
        if frames.saturating_mul(len) > 1 << 24 {
            unsupported!("{frames} frames of {len} are too many to gather");
        }
        let idx: Vec<i64> = (0..frames)
            .flat_map(|f| (0..len).map(move |l| (f * step + l) as i64))
            .collect();
        let idx = Val::konst(Tensor::from_i64(DType::I64, vec![frames * len], idx));
        let g = self.op(
            K::Gather,
            ppir::ops::attrs::GatherAttrs { axis: 1 }.to_attrs(),
            &[x, idx],
        )?;
        let mut dims = super::attention::reshape_spec(&xt.dims[..1])?;
        dims.extend([frames as i64, len as i64, parts as i64]);
        let g = self.op(K::Reshape, ShapeAttrs { shape: dims }.to_attrs(), &[g])?;
        let g = match window {
            Some(w) => {
                let w = self.cast_to(w, xt.dtype)?;
                let col = ShapeAttrs {
                    shape: vec![len as i64, 1],
                };
                let w = self.op(K::Reshape, col.to_attrs(), &[w])?;
                self.binop(K::Mul, g, w)?
            }
            None => g,
        };
        let y = self.dft_along(g, 2, false, onesided, Some(len))?;
        Ok(y)
    }
}
