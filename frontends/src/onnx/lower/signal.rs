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
        use OpKind as K;
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
        let n_in = known(xt.dims[axis], "the transformed dimension")?;
        let length = match self.static_ints(node, 1, "dft_length")? {
            Some(v) if v.len() == 1 => {
                if v[0] <= 0 {
                    invalid!("dft_length must be positive, not {}", v[0]);
                }
                v[0] as usize
            }
            Some(v) => invalid!("dft_length must be a scalar, not {v:?}"),
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
