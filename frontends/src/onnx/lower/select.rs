//! Selection and rearrangement ops decomposed at import into ppir ops, exactly:
//! `Hardmax` (reduce_max, equal, where, reduce_min: the first maximum), `TopK` (`k` such
//! rounds over what is not taken yet), `OneHot` (an
//! index grid compared with the indices), `SpaceToDepth` / `DepthToSpace` (reshape,
//! transpose, reshape), and `ScatterElements` / `ScatterND` / `Scatter` with indices known at
//! import time: each result element is a `gather` from the data and the updates (the last
//! update written to it wins), and a reduction folds the updates written to an element in
//! their order (`add`: `((data + u₀) + u₁)…`), one gather per repeat. Gradients flow through
//! the gathers and the reductions' elementwise ops; `Hardmax` and `OneHot` are piecewise
//! constant.

use ppir::ops::attrs::{
    ConcatAttrs, GatherAttrs, ReduceAttrs, ShapeAttrs, TransposeAttrs, UnsqueezeAttrs,
};
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, Dim, OpKind, Tensor};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, scalar, unsupported, Importer, Val, R};
use super::super::proto::NodeProto;
use super::attention::{known, known_dims, reshape_spec};
use super::{norm_axis, OrInvalid};

/// The most gathered elements one scatter with a reduction may unroll into (repeated
/// indices make one gather over the whole data per repeat).
const MAX_SCATTER_ELEMENTS: usize = 1 << 26;

/// The largest `K` a `TopK` is unrolled for (a few ops per selected element).
const MAX_TOP_K: usize = 256;

/// Row-major strides of `shape`.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// `i` in `[-size, size)` as a position in `[0, size)`.
fn wrap_index(i: i64, size: usize, what: &str) -> R<usize> {
    let s = size as i64;
    if i < -s || i >= s {
        invalid!("{what} {i} is out of range for a dimension of size {size}");
    }
    Ok(if i < 0 { (i + s) as usize } else { i as usize })
}

/// The identity of a scatter reduction in `d` (what an unwritten slot contributes).
fn reduction_identity(kind: OpKind, d: DType) -> R<Tensor> {
    let t = match (kind, d.is_float()) {
        (OpKind::Add, _) => scalar(d, 0.0),
        (OpKind::Mul, _) => scalar(d, 1.0),
        (OpKind::Max, true) => scalar(d, f64::NEG_INFINITY),
        (OpKind::Min, true) => scalar(d, f64::INFINITY),
        (OpKind::Max | OpKind::Min, false) => {
            let (lo, hi) = match d {
                DType::I8 => (i8::MIN as i64, i8::MAX as i64),
                DType::I32 => (i32::MIN as i64, i32::MAX as i64),
                DType::I64 => (i64::MIN, i64::MAX),
                _ => invalid!("a max/min scatter of {d} values is not defined"),
            };
            let v = if kind == OpKind::Max { lo } else { hi };
            Tensor::from_i64(d, vec![], vec![v])
        }
        _ => invalid!("no identity for {kind}"),
    };
    Ok(t)
}

impl Importer<'_> {
    // ---- Hardmax ----

    /// One-hot of the first maximum along `axis` (opset 13), or over the 2-D coercion
    /// `[d0·…·d(axis-1), d(axis)·…]` before it.
    pub(super) fn lower_hardmax(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let x = self.req(node, 0)?;
        let ty = self.ty(&x)?;
        if !ty.dtype.is_float() {
            invalid!("the input must be a float tensor, got {}", ty.dtype);
        }
        let rank = ty.rank();
        if self.opset >= 13 {
            let axis = norm_axis(a.int_or("axis", -1).inv()?, rank)?;
            let n = known(ty.dims[axis], "the Hardmax axis")?;
            return self.first_max_one_hot(x, axis, n, rank, ty.dtype);
        }
        let axis = norm_axis(a.int_or("axis", 1).inv()?, rank.max(1))?;
        let inner = known_dims(&ty.dims[axis..], "a dimension after `axis`")?
            .iter()
            .product::<usize>();
        let x2 = self.op(
            OpKind::Reshape,
            ShapeAttrs {
                shape: vec![-1, inner as i64],
            }
            .to_attrs(),
            &[x],
        )?;
        let y2 = self.first_max_one_hot(x2, 1, inner, 2, ty.dtype)?;
        let shape = reshape_spec(&ty.dims)?;
        self.op(OpKind::Reshape, ShapeAttrs { shape }.to_attrs(), &[y2])
    }

    /// 1 at the first maximum of `x` along `axis` (size `n`), 0 elsewhere, in `dtype`.
    fn first_max_one_hot(
        &mut self,
        x: Val,
        axis: usize,
        n: usize,
        rank: usize,
        dtype: DType,
    ) -> R<Val> {
        let keep = ReduceAttrs {
            axes: vec![axis as i64],
            keepdims: true,
        }
        .to_attrs();
        let m = self.op(OpKind::ReduceMax, keep.clone(), std::slice::from_ref(&x))?;
        let is_max = self.binop(OpKind::Equal, x, m)?;
        let mut shape = vec![1; rank];
        shape[axis] = n;
        let iota = Val::konst(Tensor::from_i64(DType::I64, shape, (0..n as i64).collect()));
        let past_end = Val::konst(scalar(DType::I64, n as f64));
        let at_max = self.op(
            OpKind::Where,
            Attrs::new(),
            &[is_max, iota.clone(), past_end],
        )?;
        let first = self.op(OpKind::ReduceMin, keep, &[at_max])?;
        let hot = self.binop(OpKind::Equal, iota, first)?;
        self.cast_to(hot, dtype)
    }

    // ---- TopK ----

    /// The `k` largest (smallest) elements along `axis` and their indices, sorted, equal
    /// values by index: `k` rounds of "the extreme of what is not taken yet, and the first
    /// index holding it" (`k · n` work, exact; gradients reach `x` through the reductions).
    pub(super) fn lower_top_k(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Vec<Val>> {
        let x = self.req(node, 0)?;
        let ty = self.ty(&x)?;
        if ty.dtype == DType::Bool {
            invalid!("the input must be numbers, got bool");
        }
        let rank = ty.rank();
        if rank == 0 {
            invalid!("the input must have rank >= 1");
        }
        let axis = norm_axis(a.int_or("axis", -1).inv()?, rank)?;
        let k = if self.opset < 10 {
            match a.int("k").inv()? {
                Some(k) => k,
                None => invalid!("attribute `k` is required"),
            }
        } else {
            match self.static_ints(node, 1, "K")?.as_deref() {
                Some([k]) => *k,
                Some(v) => invalid!("K must hold one value, it has {}", v.len()),
                None => invalid!("input 1 (K) is missing"),
            }
        };
        let largest = self.opset < 11 || a.int_or("largest", 1).inv()? != 0;
        let n = known(ty.dims[axis], "the TopK axis")?;
        if k < 0 || k as usize > n {
            invalid!("K = {k} is not in [0, {n}] (the size of axis {axis})");
        }
        let k = k as usize;
        if k > MAX_TOP_K {
            unsupported!("TopK with K = {k} (ppcc unrolls K up to {MAX_TOP_K})");
        }
        if k == 0 {
            let values = self.slice_axis(x, axis as i64, 0, 0, 1)?;
            let indices = self.cast_to(values.clone(), DType::I64)?;
            return Ok(vec![values, indices]);
        }
        let keep = ReduceAttrs {
            axes: vec![axis as i64],
            keepdims: true,
        }
        .to_attrs();
        let (extreme, fill) = if largest {
            (
                OpKind::ReduceMax,
                reduction_identity(OpKind::Max, ty.dtype)?,
            )
        } else {
            (
                OpKind::ReduceMin,
                reduction_identity(OpKind::Min, ty.dtype)?,
            )
        };
        let fill = Val::konst(fill);
        let mut shape = vec![1; rank];
        shape[axis] = n;
        let iota = Val::konst(Tensor::from_i64(DType::I64, shape, (0..n as i64).collect()));
        let past_end = Val::konst(scalar(DType::I64, n as f64));
        let (mut values, mut indices) = (vec![], vec![]);
        let mut taken: Option<Val> = None;
        for _ in 0..k {
            let (rest, at) = match &taken {
                None => (x.clone(), None),
                Some(t) => {
                    let rest = self.op(
                        OpKind::Where,
                        Attrs::new(),
                        &[t.clone(), fill.clone(), x.clone()],
                    )?;
                    (
                        rest,
                        Some(self.op(OpKind::Not, Attrs::new(), std::slice::from_ref(t))?),
                    )
                }
            };
            let m = self.op(extreme, keep.clone(), &[rest])?;
            let mut hit = self.binop(OpKind::Equal, x.clone(), m.clone())?;
            if let Some(free) = at {
                hit = self.binop(OpKind::And, hit, free)?;
            }
            let at_hit = self.op(
                OpKind::Where,
                Attrs::new(),
                &[hit, iota.clone(), past_end.clone()],
            )?;
            let first = self.op(OpKind::ReduceMin, keep.clone(), &[at_hit])?;
            let now = self.binop(OpKind::Equal, iota.clone(), first.clone())?;
            taken = Some(match taken {
                None => now,
                Some(t) => self.binop(OpKind::Or, t, now)?,
            });
            values.push(m);
            indices.push(first);
        }
        let cat = ConcatAttrs { axis: axis as i64 }.to_attrs();
        let values = self.op(OpKind::Concat, cat.clone(), &values)?;
        let indices = self.op(OpKind::Concat, cat, &indices)?;
        Ok(vec![values, indices])
    }

    // ---- OneHot ----

    /// `values[1]` where the (wrapped) index equals the position along the new axis,
    /// `values[0]` elsewhere; indices outside `[-depth, depth)` match nothing.
    pub(super) fn lower_one_hot(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let indices = self.req(node, 0)?;
        let Some(depth) = self.static_scalar_f64(node, 1, "depth")? else {
            invalid!("input 1 (depth) is missing")
        };
        if depth.fract() != 0.0 || !(0.0..=(1u64 << 31) as f64).contains(&depth) {
            invalid!("depth must be a non-negative integer, got {depth}");
        }
        let values = self.req(node, 2)?;
        let vt = self.ty(&values)?;
        if vt.dims != [Dim::Known(2)] {
            invalid!(
                "values must be the two elements [off_value, on_value], got shape {:?}",
                vt.dims
            );
        }
        let it = self.ty(&indices)?;
        if it.dtype == DType::Bool {
            invalid!("indices must be numbers, got bool");
        }
        let rank = it.rank() as i64;
        let axis = a.int_or("axis", -1).inv()?;
        let axis = if axis < 0 { axis + rank + 1 } else { axis };
        if !(0..=rank).contains(&axis) {
            invalid!("axis {axis} is out of range for indices of rank {rank}");
        }
        let d = it.dtype;
        let zero = Val::konst(scalar(d, 0.0));
        let negative = self.binop(OpKind::Less, indices.clone(), zero)?;
        let shifted = self.binop(OpKind::Add, indices.clone(), Val::konst(scalar(d, depth)))?;
        let wrapped = self.op(OpKind::Where, Attrs::new(), &[negative, shifted, indices])?;
        let column = self.op(
            OpKind::Unsqueeze,
            UnsqueezeAttrs { axes: vec![axis] }.to_attrs(),
            &[wrapped],
        )?;
        let n = depth as usize;
        let mut shape = vec![1; rank as usize + 1];
        shape[axis as usize] = n;
        let positions: Vec<f64> = (0..n).map(|i| i as f64).collect();
        let grid = if d.is_float() {
            Tensor::from_f64(d, shape, positions)
        } else {
            Tensor::from_i64(d, shape, (0..n as i64).collect())
        };
        let hot = self.binop(OpKind::Equal, column, Val::konst(grid))?;
        let off = self.slice_axis(values.clone(), 0, 0, 1, 1)?;
        let on = self.slice_axis(values, 0, 1, 2, 1)?;
        self.op(OpKind::Where, Attrs::new(), &[hot, on, off])
    }

    // ---- SpaceToDepth / DepthToSpace ----

    /// Blocks of `blocksize²` pixels to channels (`to_depth`) or back, in `mode` `DCR`
    /// (depth-column-row) or `CRD` (column-row-depth) order: reshape, transpose, reshape.
    pub(super) fn lower_space_depth(
        &mut self,
        node: &NodeProto,
        a: &NodeAttrs,
        to_depth: bool,
    ) -> R<Val> {
        let x = self.req(node, 0)?;
        let dims = self.dims_of(&x)?;
        if dims.len() != 4 {
            invalid!(
                "the input must be 4-D [N, C, H, W], got rank {}",
                dims.len()
            );
        }
        let Some(b) = a.int("blocksize").inv()? else {
            invalid!("attribute `blocksize` is required")
        };
        if b < 1 {
            invalid!("blocksize must be positive, got {b}");
        }
        // `mode` came to DepthToSpace in opset 11 and to SpaceToDepth in opset 28.
        let has_mode = self.opset >= if to_depth { 28 } else { 11 };
        let mode = if has_mode {
            a.string_or("mode", "DCR").inv()?
        } else {
            "DCR".to_string()
        };
        let crd = match mode.as_str() {
            "DCR" => false,
            "CRD" => true,
            other => invalid!("mode must be \"DCR\" or \"CRD\", not {other:?}"),
        };
        let n = dims[0].known().map_or(-1, |n| n as i64);
        let [c, h, w] = [1, 2, 3].map(|i| dims[i]);
        let (c, h, w) = (
            known(c, "the channel count")? as i64,
            known(h, "the height")? as i64,
            known(w, "the width")? as i64,
        );
        let (tmp, perm, out) = if to_depth {
            if h % b != 0 || w % b != 0 {
                invalid!("height {h} and width {w} must be multiples of blocksize {b}");
            }
            let tmp = vec![n, c, h / b, b, w / b, b];
            let perm = if crd {
                vec![0, 1, 3, 5, 2, 4]
            } else {
                vec![0, 3, 5, 1, 2, 4]
            };
            (tmp, perm, vec![n, c * b * b, h / b, w / b])
        } else {
            if c % (b * b) != 0 {
                invalid!(
                    "the channel count {c} must be a multiple of blocksize² = {}",
                    b * b
                );
            }
            let (tmp, perm) = if crd {
                (vec![n, c / (b * b), b, b, h, w], vec![0, 1, 4, 2, 5, 3])
            } else {
                (vec![n, b, b, c / (b * b), h, w], vec![0, 3, 4, 1, 5, 2])
            };
            (tmp, perm, vec![n, c / (b * b), h * b, w * b])
        };
        let y = self.op(OpKind::Reshape, ShapeAttrs { shape: tmp }.to_attrs(), &[x])?;
        let y = self.op(
            OpKind::Transpose,
            TransposeAttrs { perm: Some(perm) }.to_attrs(),
            &[y],
        )?;
        self.op(OpKind::Reshape, ShapeAttrs { shape: out }.to_attrs(), &[y])
    }

    // ---- ScatterElements / ScatterND ----

    /// The scatter's `reduction` (attribute since opset 16): the op combining the data and
    /// the updates, `None` for plain replacement.
    fn scatter_reduction(&self, a: &NodeAttrs) -> R<Option<OpKind>> {
        let r = if self.opset >= 16 {
            a.string_or("reduction", "none").inv()?
        } else {
            "none".to_string()
        };
        Ok(match r.as_str() {
            "none" => None,
            "add" => Some(OpKind::Add),
            "mul" => Some(OpKind::Mul),
            "max" => Some(OpKind::Max),
            "min" => Some(OpKind::Min),
            other => invalid!("reduction must be none, add, mul, max or min, not {other:?}"),
        })
    }

    /// The static shapes of a scatter's data and updates (inputs 0 and 2).
    fn scatter_shapes(&self, node: &NodeProto) -> R<(Val, Vec<usize>, Val, Vec<usize>)> {
        let data = self.req(node, 0)?;
        let updates = self.req(node, 2)?;
        let ds = known_dims(&self.dims_of(&data)?, "a data dimension")?;
        let us = known_dims(&self.dims_of(&updates)?, "an updates dimension")?;
        let (dt, ut) = (self.ty(&data)?.dtype, self.ty(&updates)?.dtype);
        if dt != ut {
            invalid!("data ({dt}) and updates ({ut}) differ in element type");
        }
        Ok((data, ds, updates, us))
    }

    /// `ScatterElements` (and opset 9–10 `Scatter`): `out[.., indices[p], ..] = updates[p]`
    /// along `axis`, the indices known at import time.
    pub(super) fn lower_scatter_elements(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let reduction = self.scatter_reduction(a)?;
        let (data, ds, updates, us) = self.scatter_shapes(node)?;
        let Some(indices) = self.static_input(node, 1, "indices")? else {
            invalid!("input 1 (indices) is missing")
        };
        if indices.dtype.is_float() {
            invalid!("indices must be integers, got {}", indices.dtype);
        }
        if indices.shape != us {
            invalid!(
                "indices {:?} and updates {us:?} must have the same shape",
                indices.shape
            );
        }
        if us.len() != ds.len() {
            invalid!(
                "indices and updates (rank {}) must have the data's rank {}",
                us.len(),
                ds.len()
            );
        }
        let axis = norm_axis(a.int_or("axis", 0).inv()?, ds.len())?;
        let (dst, ust) = (strides(&ds), strides(&us));
        let n: usize = ds.iter().product();
        let mut writes = vec![vec![]; n];
        for (p, &i) in indices.to_i64_vec().iter().enumerate() {
            let mut target = 0;
            for k in 0..us.len() {
                let c = if k == axis {
                    wrap_index(i, ds[axis], "index")?
                } else {
                    let c = p / ust[k] % us[k];
                    if c >= ds[k] {
                        invalid!("updates {us:?} reach past the data {ds:?} along axis {k}");
                    }
                    c
                };
                target += c * dst[k];
            }
            writes[target].push(p);
        }
        self.scatter_flat(data, &ds, updates, us.iter().product(), &writes, reduction)
    }

    /// `ScatterND`: `out[indices[i]] = updates[i]` for each index tuple (a prefix of the
    /// data's dimensions) `indices[i]`, known at import time.
    pub(super) fn lower_scatter_nd(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let reduction = self.scatter_reduction(a)?;
        let (data, ds, updates, us) = self.scatter_shapes(node)?;
        let Some(indices) = self.static_input(node, 1, "indices")? else {
            invalid!("input 1 (indices) is missing")
        };
        if indices.dtype.is_float() {
            invalid!("indices must be integers, got {}", indices.dtype);
        }
        let is = &indices.shape;
        let Some((&k, tuples_shape)) = is.split_last() else {
            invalid!("indices must have rank >= 1")
        };
        if k == 0 {
            unsupported!("ScatterND with empty index tuples (indices of shape {is:?})");
        }
        if k > ds.len() {
            invalid!(
                "index tuples of length {k} are longer than the data's rank {}",
                ds.len()
            );
        }
        let mut want = tuples_shape.to_vec();
        want.extend_from_slice(&ds[k..]);
        if us != want {
            invalid!("updates must have shape {want:?}, got {us:?}");
        }
        let dst = strides(&ds);
        let slice: usize = ds[k..].iter().product();
        let n: usize = ds.iter().product();
        let mut writes = vec![vec![]; n];
        for (t, tuple) in indices.to_i64_vec().chunks(k).enumerate() {
            let mut base = 0;
            for (j, &i) in tuple.iter().enumerate() {
                base += wrap_index(i, ds[j], "index")? * dst[j];
            }
            for e in 0..slice {
                writes[base + e].push(t * slice + e);
            }
        }
        self.scatter_flat(data, &ds, updates, us.iter().product(), &writes, reduction)
    }

    /// The scatter result from `writes` (for each data element in row-major order, the
    /// flat positions of the updates written to it, in order).
    fn scatter_flat(
        &mut self,
        data: Val,
        ds: &[usize],
        updates: Val,
        n_updates: usize,
        writes: &[Vec<usize>],
        reduction: Option<OpKind>,
    ) -> R<Val> {
        let n = writes.len();
        let dtype = self.ty(&data)?.dtype;
        let flat = |v: usize| {
            ShapeAttrs {
                shape: vec![v as i64],
            }
            .to_attrs()
        };
        let data_flat = self.op(OpKind::Reshape, flat(n), &[data])?;
        let upd_flat = self.op(OpKind::Reshape, flat(n_updates), &[updates])?;
        let cat = ConcatAttrs { axis: 0 }.to_attrs();
        let gather = GatherAttrs { axis: 0 }.to_attrs();
        let index = |sel: Vec<i64>| Val::konst(Tensor::from_i64(DType::I64, vec![n], sel));
        let out = match reduction {
            None => {
                // [data.., updates..]: each element from the last update written to it.
                let table = self.op(OpKind::Concat, cat, &[data_flat, upd_flat])?;
                let sel = writes
                    .iter()
                    .enumerate()
                    .map(|(j, w)| w.last().map_or(j, |&u| n + u) as i64)
                    .collect();
                self.op(OpKind::Gather, gather, &[table, index(sel)])?
            }
            Some(kind) => {
                let repeats = writes.iter().map(Vec::len).max().unwrap_or(0);
                if repeats.saturating_mul(n) > MAX_SCATTER_ELEMENTS {
                    unsupported!(
                        "a scatter whose indices repeat {repeats} times over {n} elements"
                    );
                }
                // [updates.., identity]: the r-th update written to each element, or the
                // reduction's identity where there are fewer.
                let identity = reduction_identity(kind, dtype)?;
                let pad = self.op(OpKind::Reshape, flat(1), &[Val::konst(identity)])?;
                let table = self.op(OpKind::Concat, cat, &[upd_flat, pad])?;
                let mut acc = data_flat;
                for r in 0..repeats {
                    let sel = writes
                        .iter()
                        .map(|w| w.get(r).map_or(n_updates, |&u| u) as i64)
                        .collect();
                    let g =
                        self.op(OpKind::Gather, gather.clone(), &[table.clone(), index(sel)])?;
                    acc = self.binop(kind, acc, g)?;
                }
                acc
            }
        };
        let shape = ds.iter().map(|&d| d as i64).collect();
        self.op(OpKind::Reshape, ShapeAttrs { shape }.to_attrs(), &[out])
    }
}
