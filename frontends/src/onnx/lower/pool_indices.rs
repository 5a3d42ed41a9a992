//! `MaxPool`'s second output (the indices of the maxima) and `MaxUnpool`, from ppir ops:
//!
//! - The indices: every window's elements are gathered from the input flattened per
//!   image (with one `-inf` slot standing for padding) through a constant table of
//!   window positions; the first maximum's place in its window is
//!   `reduce_min(where(w == reduce_max(w), iota, K))`, and a second constant table maps
//!   (window, place) to the flat index into `x` (row-major, or with `storage_order` 1
//!   the spatial axes column-major), plus each image's offset.
//! - `MaxUnpool`: `gather_grad` (the scatter-add that is `gather`'s gradient) writes the
//!   values at their flat indices into zeros of the output shape; pooling indices are
//!   distinct, so adding is writing. Differentiable in the values.

use ppir::ops::attrs::{
    ConcatAttrs, GatherAttrs, GatherGradAttrs, PadAttrs, ReduceAttrs, ShapeAttrs,
};
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, OpKind, Tensor};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, unsupported, Importer, Val, R};
use super::super::proto::NodeProto;
use super::attention::known_dims;
use super::OrInvalid;

/// The largest window table built at import time (output positions × kernel elements).
const MAX_TABLE: usize = 1 << 22;

/// All multi-indices of `dims` in row-major order.
fn multi_indices(dims: &[usize]) -> Vec<Vec<usize>> {
    let total: usize = dims.iter().product();
    (0..total)
        .map(|mut f| {
            let mut idx = vec![0; dims.len()];
            for d in (0..dims.len()).rev() {
                idx[d] = f % dims[d];
                f /= dims[d];
            }
            idx
        })
        .collect()
}

impl Importer<'_> {
    /// `MaxPool` with its indices output.
    pub(super) fn lower_max_pool_indices(
        &mut self,
        node: &NodeProto,
        a: &NodeAttrs,
        y: Val,
    ) -> R<Val> {
        use OpKind as K;
        let x = self.req(node, 0)?;
        let Some(kernel) = a.ints("kernel_shape").inv()? else {
            invalid!("attribute `kernel_shape` is required")
        };
        let (strides, pads, dilations) = self.conv_common(a, &x, &kernel)?;
        let column_major = a.int_or("storage_order", 0).inv()? != 0;
        let xt = self.ty(&x)?;
        let dims = known_dims(&xt.dims, "a dimension of the input")?;
        let nsp = kernel.len();
        if dims.len() != nsp + 2 {
            invalid!("the input must have rank {}, not {xt}", nsp + 2);
        }
        let (n, c, spatial) = (dims[0], dims[1], &dims[2..]);
        let out_dims = known_dims(&self.ty(&y)?.dims, "a dimension of the result")?;
        let out_sp = &out_dims[2..];
        let kdims: Vec<usize> = kernel.iter().map(|&k| k.max(0) as usize).collect();
        let s: usize = spatial.iter().product();
        let p: usize = out_sp.iter().product();
        let kk: usize = kdims.iter().product();
        if p.saturating_mul(kk) > MAX_TABLE || kk == 0 {
            unsupported!("a pooling window table of {p}×{kk} elements is too large");
        }
        // Flat index of a spatial position, row-major and as the indices output counts it.
        let row_major = |i: &[usize]| i.iter().zip(spatial).fold(0, |f, (&v, &d)| f * d + v);
        let counted = |i: &[usize]| {
            if column_major {
                i.iter().zip(spatial).rev().fold(0, |f, (&v, &d)| f * d + v)
            } else {
                row_major(i)
            }
        };
        let mut read = Vec::with_capacity(p * kk);
        let mut result = Vec::with_capacity(p * kk);
        let kidx = multi_indices(&kdims);
        for o in multi_indices(out_sp) {
            for k in &kidx {
                let mut pos = Vec::with_capacity(nsp);
                for d in 0..nsp {
                    let v = o[d] as i64 * strides[d] - pads[d] + k[d] as i64 * dilations[d];
                    if v < 0 || v >= spatial[d] as i64 {
                        break;
                    }
                    pos.push(v as usize);
                }
                if pos.len() == nsp {
                    read.push(row_major(&pos) as i64);
                    result.push(counted(&pos) as i64);
                } else {
                    read.push(s as i64); // the -inf slot
                    result.push(0);
                }
            }
        }
        let flat = ShapeAttrs {
            shape: vec![n as i64, c as i64, s as i64],
        };
        let xf = self.op(K::Reshape, flat.to_attrs(), &[x])?;
        let pad = Val::konst(Tensor::from_f64(
            xt.dtype,
            vec![n, c, 1],
            vec![f64::NEG_INFINITY; n * c],
        ));
        let xf = self.op(K::Concat, ConcatAttrs { axis: 2 }.to_attrs(), &[xf, pad])?;
        let read = Val::konst(Tensor::from_i64(DType::I64, vec![p * kk], read));
        let w = self.op(K::Gather, GatherAttrs { axis: 2 }.to_attrs(), &[xf, read])?;
        let win = ShapeAttrs {
            shape: vec![n as i64, c as i64, p as i64, kk as i64],
        };
        let w = self.op(K::Reshape, win.to_attrs(), &[w])?;
        let keep = ReduceAttrs {
            axes: vec![3],
            keepdims: true,
        };
        let m = self.op(K::ReduceMax, keep.to_attrs(), std::slice::from_ref(&w))?;
        let at_max = self.binop(K::Equal, w, m)?;
        let iota = Val::konst(Tensor::from_i64(
            DType::I64,
            vec![kk],
            (0..kk as i64).collect(),
        ));
        let none = self.cst(DType::I64, kk as f64);
        let places = self.op(K::Where, Attrs::new(), &[at_max, iota, none])?;
        let drop = ReduceAttrs {
            axes: vec![3],
            keepdims: false,
        };
        let place = self.op(K::ReduceMin, drop.to_attrs(), &[places])?; // [n, c, p]
        let starts = Val::konst(Tensor::from_i64(
            DType::I64,
            vec![p],
            (0..p).map(|i| (i * kk) as i64).collect(),
        ));
        let at = self.binop(K::Add, place, starts)?;
        let table = Val::konst(Tensor::from_i64(DType::I64, vec![p * kk], result));
        let idx = self.op(K::Gather, GatherAttrs { axis: 0 }.to_attrs(), &[table, at])?;
        let base = Val::konst(Tensor::from_i64(
            DType::I64,
            vec![n, c, 1],
            (0..n * c).map(|i| (i * s) as i64).collect(),
        ));
        let idx = self.binop(K::Add, idx, base)?;
        let shape = ShapeAttrs {
            shape: out_dims.iter().map(|&d| d as i64).collect(),
        };
        self.op(K::Reshape, shape.to_attrs(), &[idx])
    }

    pub(super) fn lower_max_unpool(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        use OpKind as K;
        let (x, ind) = (self.req(node, 0)?, self.req(node, 1)?);
        let Some(kernel) = a.ints("kernel_shape").inv()? else {
            invalid!("attribute `kernel_shape` is required")
        };
        let nsp = kernel.len();
        let strides = a.ints("strides").inv()?.unwrap_or_else(|| vec![1; nsp]);
        let pads = a.ints("pads").inv()?.unwrap_or_else(|| vec![0; 2 * nsp]);
        if strides.len() != nsp || pads.len() != 2 * nsp {
            invalid!("strides and pads must have {nsp} and {} entries", 2 * nsp);
        }
        let (xt, it) = (self.ty(&x)?, self.ty(&ind)?);
        if it.dtype.is_float() || it.dims != xt.dims {
            invalid!("the indices must be integers of X's shape {xt}, not {it}");
        }
        let dims = known_dims(&xt.dims, "a dimension of X")?;
        if dims.len() != nsp + 2 {
            invalid!("X must have rank {}, not {xt}", nsp + 2);
        }
        // The values land in the inferred shape, which `output_shape` may extend with
        // zeros at the end of each axis (as the reference implementation does).
        let mut inferred = vec![dims[0] as i64, dims[1] as i64];
        for d in 0..nsp {
            inferred
                .push((dims[d + 2] as i64 - 1) * strides[d] - pads[d] - pads[d + nsp] + kernel[d]);
        }
        if inferred.iter().any(|&d| d < 0) {
            invalid!("the output shape {inferred:?} is negative");
        }
        let out: Vec<i64> = match self.static_ints(node, 2, "output_shape")? {
            Some(v) => {
                if v.len() != dims.len() || v.iter().zip(&inferred).any(|(&o, &i)| o < i) {
                    unsupported!(
                        "output_shape {v:?} must give {} sizes, none below the inferred {inferred:?}",
                        dims.len()
                    );
                }
                v
            }
            None => inferred.clone(),
        };
        let total: i64 = inferred.iter().product();
        let flat = ShapeAttrs { shape: vec![-1] };
        let xf = self.op(K::Reshape, flat.to_attrs(), &[x])?;
        let ind = self.cast_to(ind, DType::I64)?;
        let indf = self.op(K::Reshape, flat.to_attrs(), &[ind])?;
        let attrs = GatherGradAttrs {
            axis: 0,
            data_shape: vec![total],
        };
        let y = self.op(K::GatherGrad, attrs.to_attrs(), &[indf, xf])?;
        let y = self.op(
            K::Reshape,
            ShapeAttrs {
                shape: inferred.clone(),
            }
            .to_attrs(),
            &[y],
        )?;
        if out == inferred {
            return Ok(y);
        }
        let mut pads = vec![0; out.len()];
        pads.extend(out.iter().zip(&inferred).map(|(o, i)| o - i));
        let attrs = PadAttrs {
            pads,
            mode: "constant".into(),
            value: 0.0,
        };
        self.op(K::Pad, attrs.to_attrs(), &[y])
    }
}
