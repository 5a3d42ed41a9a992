//! ONNX `ArgMax`/`ArgMin` and `CumSum`, decomposed into ppir ops (linear and
//! `n log n` work respectively, so no new IR op is needed):
//!
//! - `ArgMax` (`ArgMin`): `reduce_min(where(x == reduce_max(x), iota, n))` along the axis,
//!   the first index of the extreme (`reduce_max(where(.., iota, -1))` with
//!   `select_last_index`). A NaN is not found as the extreme (the result is then `n`).
//! - `CumSum`: a Hillis–Steele scan, `y += shift(y, k)` for k = 1, 2, 4.. < n, a shift being
//!   a `pad` with zeros in front and the same count cut off the end; `exclusive` shifts by
//!   one first, `reverse` shifts the other way. Differentiable through `pad` and `add`.

use ppir::ops::attrs::{PadAttrs, ReduceAttrs};
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, Dim, OpKind, Tensor};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, scalar, unsupported, Importer, Val, BATCH_NEEDED, R};
use super::super::proto::NodeProto;
use super::{norm_axis, OrInvalid};

impl Importer<'_> {
    /// `ArgMax` (`max` true) and `ArgMin`: int64 indices along `axis`.
    pub(super) fn lower_arg_extreme(
        &mut self,
        node: &NodeProto,
        a: &NodeAttrs,
        max: bool,
    ) -> R<Val> {
        use OpKind as K;
        let x = self.req(node, 0)?;
        let dims = self.dims_of(&x)?;
        let rank = dims.len();
        if rank == 0 {
            invalid!("expects a tensor of rank at least 1");
        }
        let axis = norm_axis(a.int_or("axis", 0).inv()?, rank)?;
        let keepdims = a.int_or("keepdims", 1).inv()? != 0;
        let last = a.int_or("select_last_index", 0).inv()? != 0;
        let n = match dims[axis] {
            Dim::Known(0) => invalid!("axis {axis} is empty"),
            Dim::Known(n) => n as i64,
            Dim::Batch => unsupported!("{}", BATCH_NEEDED),
        };
        let at_axis = |keepdims| {
            ReduceAttrs {
                axes: vec![axis as i64],
                keepdims,
            }
            .to_attrs()
        };
        let extreme = if max { K::ReduceMax } else { K::ReduceMin };
        let m = self.op(extreme, at_axis(true), std::slice::from_ref(&x))?;
        let hit = self.op(K::Equal, Attrs::new(), &[x, m])?;
        // The index along `axis`, broadcast over the axes after it.
        let mut shape = vec![n as usize];
        shape.extend(std::iter::repeat_n(1, rank - axis - 1));
        let iota = Val::konst(Tensor::from_i64(DType::I64, shape, (0..n).collect()));
        let (miss, pick) = if last {
            (-1, K::ReduceMax)
        } else {
            (n, K::ReduceMin)
        };
        let miss = Val::konst(scalar(DType::I64, miss as f64));
        let idx = self.op(K::Where, Attrs::new(), &[hit, iota, miss])?;
        self.op(pick, at_axis(keepdims), &[idx])
    }

    /// `CumSum(x, axis)` with `exclusive` and `reverse`; `axis` must be known at import time.
    pub(super) fn lower_cumsum(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let x = self.req(node, 0)?;
        let Some(axis) = self.static_ints(node, 1, "axis")? else {
            invalid!("input 1 (axis) is missing")
        };
        if axis.len() != 1 {
            invalid!("axis must hold one value, it has {}", axis.len());
        }
        let dims = self.dims_of(&x)?;
        let rank = dims.len();
        if rank == 0 {
            invalid!("expects a tensor of rank at least 1");
        }
        let axis = norm_axis(axis[0], rank)?;
        let exclusive = a.int_or("exclusive", 0).inv()? != 0;
        let reverse = a.int_or("reverse", 0).inv()? != 0;
        let n = match dims[axis] {
            Dim::Known(n) => n as i64,
            Dim::Batch => unsupported!("{}", BATCH_NEEDED),
        };
        let mut y = x;
        if exclusive && n > 0 {
            y = self.shift_along(y, axis, rank, 1, reverse)?;
        }
        let mut k = 1;
        while k < n {
            let s = self.shift_along(y.clone(), axis, rank, k, reverse)?;
            y = self.op(OpKind::Add, Attrs::new(), &[y, s])?;
            k *= 2;
        }
        Ok(y)
    }

    /// Element i takes element i - k along `axis` (i + k when `reverse`), zero where there
    /// is none.
    fn shift_along(&mut self, v: Val, axis: usize, rank: usize, k: i64, reverse: bool) -> R<Val> {
        let mut pads = vec![0i64; 2 * rank];
        let (front, back) = if reverse { (-k, k) } else { (k, -k) };
        pads[axis] = front;
        pads[rank + axis] = back;
        let attrs = PadAttrs {
            pads,
            mode: "constant".into(),
            value: 0.0,
        };
        self.op(OpKind::Pad, attrs.to_attrs(), &[v])
    }
}
