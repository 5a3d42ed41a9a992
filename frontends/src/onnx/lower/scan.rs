//! ONNX `ArgMax`/`ArgMin`, `CumSum`, `GatherElements` and `GatherND`, decomposed into ppir ops (linear
//! or `n log n` work, so no new IR op is needed):
//!
//! - `ArgMax` (`ArgMin`): `reduce_min(where(x == reduce_max(x), iota, n))` along the axis,
//!   the first index of the extreme (`reduce_max(where(.., iota, -1))` with
//!   `select_last_index`). A NaN is not found as the extreme (the result is then `n`).
//! - `CumSum`: a Hillis–Steele scan, `y += shift(y, k)` for k = 1, 2, 4.. < n, a shift being
//!   a `pad` with zeros in front and the same count cut off the end; `exclusive` shifts by
//!   one first, `reverse` shifts the other way. Differentiable through `pad` and `add`.
//!   `CumProd` is the same scan with `y *= shift(y, k)`, the shifts filling in ones (exact
//!   products, zeros included, and their gradients through `mul`).
//! - `GatherElements`: a `gather` from the flattened data at computed flat indices.
//! - `GatherND`: a `gather` of rows of the data reshaped to [rows, slice] at computed row
//!   numbers (folded to constants when the indices are, as exporters' indexing emits them).

use ppir::ops::attrs::{PadAttrs, ReduceAttrs};
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, Dim, OpKind, Tensor};

use super::super::attrs::NodeAttrs;
use super::super::import::{
    invalid, scalar, unsupported, Fail, Importer, Val, BATCH_NEEDED, MATERIALIZE_MAX_ELEMENTS, R,
};
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
    /// `CumProd` (`prod`) is the same scan with `mul` and shifts that fill in ones.
    pub(super) fn lower_cumsum(&mut self, node: &NodeProto, a: &NodeAttrs, prod: bool) -> R<Val> {
        let x = self.req(node, 0)?;
        if prod && self.opset < 26 {
            return Err(self.unsupported_op(node));
        }
        let (combine, fill) = if prod {
            (OpKind::Mul, 1.0)
        } else {
            (OpKind::Add, 0.0)
        };
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
            y = self.shift_along(y, axis, rank, 1, reverse, fill)?;
        }
        let mut k = 1;
        while k < n {
            let s = self.shift_along(y.clone(), axis, rank, k, reverse, fill)?;
            y = self.op(combine, Attrs::new(), &[y, s])?;
            k *= 2;
        }
        Ok(y)
    }

    /// Element i takes element i - k along `axis` (i + k when `reverse`), `fill` where there
    /// is none.
    fn shift_along(
        &mut self,
        v: Val,
        axis: usize,
        rank: usize,
        k: i64,
        reverse: bool,
        fill: f64,
    ) -> R<Val> {
        let mut pads = vec![0i64; 2 * rank];
        let (front, back) = if reverse { (-k, k) } else { (k, -k) };
        pads[axis] = front;
        pads[rank + axis] = back;
        let attrs = PadAttrs {
            pads,
            mode: "constant".into(),
            value: fill,
        };
        self.op(OpKind::Pad, attrs.to_attrs(), &[v])
    }
}

impl Importer<'_> {
    /// `GatherElements(data, indices)` along `axis`: a `gather` from the flattened data at
    /// `indices · stride(axis) + Σ coordinate(k) · stride(k)` over the other axes (negative
    /// indices wrap), so it stays linear in the indices and differentiable through `gather`.
    pub(super) fn lower_gather_elements(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        use OpKind as K;
        let (data, idx) = (self.req(node, 0)?, self.req(node, 1)?);
        let (dd, it) = (self.dims_of(&data)?, self.ty(&idx)?);
        let rank = dd.len();
        if rank == 0 || it.rank() != rank {
            invalid!(
                "data and indices must have the same rank (at least 1), got {rank} and {}",
                it.rank()
            );
        }
        if it.dtype.is_float() {
            invalid!("the indices must be integers, got {}", it.dtype);
        }
        let axis = norm_axis(a.int_or("axis", 0).inv()?, rank)?;
        let (Some(dims), Some(idims)) = (
            dd.iter().map(|d| d.known()).collect::<Option<Vec<u64>>>(),
            it.static_shape(),
        ) else {
            unsupported!("{}", BATCH_NEEDED)
        };
        for k in 0..rank {
            if k != axis && idims[k] > dims[k] {
                invalid!(
                    "indices dimension {k} ({}) exceeds the data's ({})",
                    idims[k],
                    dims[k]
                );
            }
        }
        let mut strides = vec![1i64; rank];
        for k in (0..rank - 1).rev() {
            strides[k] = strides[k + 1] * dims[k + 1] as i64;
        }
        let i64c = |v: i64| Val::konst(scalar(DType::I64, v as f64));
        let cast = ppir::ops::attrs::CastAttrs { to: DType::I64 }.to_attrs();
        let mut flat = self.op(K::Cast, cast, &[idx])?;
        // Negative indices count from the end of the axis.
        let n = dims[axis] as i64;
        let neg = self.op(K::Less, Attrs::new(), &[flat.clone(), i64c(0)])?;
        let wrapped = self.op(K::Add, Attrs::new(), &[flat.clone(), i64c(n)])?;
        flat = self.op(K::Where, Attrs::new(), &[neg, wrapped, flat])?;
        if strides[axis] != 1 {
            flat = self.op(K::Mul, Attrs::new(), &[flat, i64c(strides[axis])])?;
        }
        for k in (0..rank).filter(|&k| k != axis && idims[k] > 1) {
            let mut shape = vec![1usize; rank];
            shape[k] = idims[k] as usize;
            let coords = (0..idims[k] as i64).map(|c| c * strides[k]).collect();
            let offsets = Val::konst(Tensor::from_i64(DType::I64, shape, coords));
            flat = self.op(K::Add, Attrs::new(), &[flat, offsets])?;
        }
        let total = dims.iter().product::<u64>() as i64;
        let shape = ppir::ops::attrs::ShapeAttrs { shape: vec![total] }.to_attrs();
        let data = self.op(K::Reshape, shape, &[data])?;
        let g = ppir::ops::attrs::GatherAttrs { axis: 0 }.to_attrs();
        self.op(K::Gather, g, &[data, flat])
    }

    /// `GatherND` as a `gather` of rows: the data reshaped to [rows, slice] (rows over the
    /// batch axes and the `k` indexed axes), each index tuple turned into its row number.
    pub(super) fn lower_gather_nd(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        use OpKind as K;
        let (data, idx) = (self.req(node, 0)?, self.req(node, 1)?);
        let (dd, it) = (self.dims_of(&data)?, self.ty(&idx)?);
        if it.dtype.is_float() {
            invalid!("the indices must be integers, got {}", it.dtype);
        }
        let (Some(dims), Some(idims)) = (
            dd.iter().map(|d| d.known()).collect::<Option<Vec<u64>>>(),
            it.static_shape(),
        ) else {
            unsupported!("{}", BATCH_NEEDED)
        };
        let (r, q) = (dims.len(), idims.len());
        if r == 0 || q == 0 {
            invalid!("data and indices must have rank >= 1, got {r} and {q}");
        }
        let b = a.int_or("batch_dims", 0).inv()?;
        if b < 0 || b as usize >= r.min(q) {
            invalid!("batch_dims {b} must be in [0, {})", r.min(q));
        }
        let b = b as usize;
        let k = idims[q - 1] as usize;
        if b + k > r {
            invalid!("index tuples of length {k} after {b} batch axes exceed the data's rank {r}");
        }
        if idims[..b] != dims[..b] {
            invalid!(
                "the batch axes of data {:?} and indices {:?} differ",
                &dims[..b],
                &idims[..b]
            );
        }
        if k == 0 {
            unsupported!("GatherND with empty index tuples (indices of shape {idims:?})");
        }
        // Sizes as i64 with overflow checks: shapes come from the file.
        let product = |ds: &[u64]| -> R<i64> {
            ds.iter()
                .try_fold(1i64, |n, &d| {
                    i64::try_from(d).ok().and_then(|d| n.checked_mul(d))
                })
                .ok_or_else(|| Fail::Invalid(format!("the shape {ds:?} has too many elements")))
        };
        let tuples: Vec<usize> = idims[..q - 1].iter().map(|&d| d as usize).collect();
        let indexed: Vec<i64> = dims[b..b + k].iter().map(|&d| d as i64).collect();
        let per_batch = product(&dims[b..b + k])?;
        let rows = product(&dims[..b + k])?;
        let slice: Vec<i64> = dims[b + k..].iter().map(|&d| d as i64).collect();
        let width = product(&dims[b + k..])?;
        let n_batch = product(&dims[..b])?;
        if n_batch as u64 > MATERIALIZE_MAX_ELEMENTS as u64 {
            unsupported!("GatherND over {n_batch} batch positions");
        }
        let cast = ppir::ops::attrs::CastAttrs { to: DType::I64 }.to_attrs();
        let flat = self.op(K::Cast, cast, &[idx])?;
        // Negative indices count from the end of their axis.
        let sizes = Val::konst(Tensor::from_i64(DType::I64, vec![k], indexed.clone()));
        let zero = Val::konst(scalar(DType::I64, 0.0));
        let neg = self.op(K::Less, Attrs::new(), &[flat.clone(), zero])?;
        let wrapped = self.op(K::Add, Attrs::new(), &[flat.clone(), sizes])?;
        let flat = self.op(K::Where, Attrs::new(), &[neg, wrapped, flat])?;
        let mut strides = vec![1i64; k];
        for j in (0..k - 1).rev() {
            strides[j] = strides[j + 1] * indexed[j + 1];
        }
        let strides = Val::konst(Tensor::from_i64(DType::I64, vec![k], strides));
        let scaled = self.op(K::Mul, Attrs::new(), &[flat, strides])?;
        let sum = ReduceAttrs {
            axes: vec![q as i64 - 1],
            keepdims: false,
        }
        .to_attrs();
        let mut row = self.op(K::ReduceSum, sum, &[scaled])?;
        if b > 0 {
            // Each batch position starts its own block of `per_batch` rows.
            let mut shape = tuples[..b].to_vec();
            shape.resize(q - 1, 1);
            let offsets = (0..n_batch).map(|n| n * per_batch).collect();
            let offsets = Val::konst(Tensor::from_i64(DType::I64, shape, offsets));
            row = self.op(K::Add, Attrs::new(), &[row, offsets])?;
        }
        let table = ppir::ops::attrs::ShapeAttrs {
            shape: vec![rows, width],
        }
        .to_attrs();
        let data = self.op(K::Reshape, table, &[data])?;
        let g = ppir::ops::attrs::GatherAttrs { axis: 0 }.to_attrs();
        let picked = self.op(K::Gather, g, &[data, row])?;
        let mut out: Vec<i64> = tuples.iter().map(|&d| d as i64).collect();
        out.extend_from_slice(&slice);
        let shape = ppir::ops::attrs::ShapeAttrs { shape: out }.to_attrs();
        self.op(K::Reshape, shape, &[picked])
    }
}
