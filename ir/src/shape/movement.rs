//! Reductions and data movement: reshape, transpose, concat, split, slice, gather, expand,
//! pad, tile, squeeze, unsqueeze, flatten.

use super::elementwise::broadcast_shapes;
use super::{
    bail, batch_err, check_elem, dims_str, norm_axes, norm_axis, same_dtype, Elem, Res, ShapeError,
};
use crate::ops::attrs::{
    ConcatAttrs, FlattenAttrs, PadAttrs, ReduceAttrs, ShapeAttrs, SliceAttrs, SplitAttrs,
    SqueezeAttrs, TileAttrs, TransposeAttrs, UnsqueezeAttrs,
};
use crate::ops::OpKind;
use crate::types::{Dim, TensorType};

pub(super) fn reduce(kind: OpKind, attrs: &ReduceAttrs, x: &TensorType) -> Res<TensorType> {
    if matches!(kind, OpKind::ReduceSum | OpKind::ReduceMean) {
        check_elem(x, 0, Elem::Numeric)?;
    }
    if kind == OpKind::ReduceLogSumExp {
        check_elem(x, 0, Elem::Float)?;
    }
    let axes = norm_axes(&attrs.axes, x.rank(), "axes")?;
    let keepdims = attrs.keepdims;
    let all = axes.is_empty();
    let mut dims = Vec::with_capacity(x.rank());
    for (i, &d) in x.dims.iter().enumerate() {
        if all || axes.contains(&i) {
            if keepdims {
                dims.push(Dim::Known(1));
            }
        } else {
            dims.push(d);
        }
    }
    Ok(TensorType::new(x.dtype, dims))
}

/// Product of known sizes; `None` on overflow.
fn product(sizes: impl IntoIterator<Item = u64>) -> Option<u64> {
    sizes
        .into_iter()
        .try_fold(1u64, |acc, n| acc.checked_mul(n))
}

pub(super) fn reshape(attrs: &ShapeAttrs, x: &TensorType) -> Res<TensorType> {
    let shape = &attrs.shape;
    let mut infer_at = None;
    for (i, &s) in shape.iter().enumerate() {
        match s {
            -1 if infer_at.is_some() => bail!("'shape' = {shape:?} has more than one -1"),
            -1 => infer_at = Some(i),
            0 => bail!("'shape' entry {i} is 0; a frontend must resolve ONNX's copy-this-dim 0"),
            s if s < -1 => bail!("'shape' entry {i} is {s}; sizes must be positive or -1"),
            _ => {}
        }
    }
    let too_big = || ShapeError(format!("'shape' = {shape:?} has too many elements"));
    let out_known =
        product(shape.iter().filter(|&&s| s > 0).map(|&s| s as u64)).ok_or_else(too_big)?;
    let in_known = product(x.dims.iter().filter_map(|d| d.known())).ok_or_else(too_big)?;
    let has_batch = x.dims.contains(&Dim::Batch);
    let mut dims: Vec<Dim> = shape.iter().map(|&s| Dim::Known(s.max(0) as u64)).collect();
    match (infer_at, has_batch) {
        (Some(i), true) => dims[i] = Dim::Batch,
        (Some(i), false) => {
            if in_known % out_known != 0 {
                bail!("cannot reshape {x} ({in_known} elements) to {shape:?}: {in_known} is not a multiple of {out_known}");
            }
            dims[i] = Dim::Known(in_known / out_known);
        }
        (None, false) if in_known != out_known => {
            bail!("cannot reshape {x} ({in_known} elements) to {shape:?} ({out_known} elements)")
        }
        (None, true) if in_known != 0 && out_known % in_known != 0 => {
            bail!("cannot reshape {x} to {shape:?}: {out_known} elements is not a multiple of {in_known}")
        }
        (None, _) => {}
    }
    Ok(TensorType::new(x.dtype, dims))
}

pub(super) fn transpose(attrs: &TransposeAttrs, x: &TensorType) -> Res<TensorType> {
    let rank = x.rank();
    let perm = match &attrs.perm {
        Some(p) => p.clone(),
        None => (0..rank as i64).rev().collect(),
    };
    if perm.len() != rank {
        bail!(
            "operand 0 has {rank} dims but 'perm' has {} entries",
            perm.len()
        );
    }
    let axes = norm_axes(&perm, rank, "perm")?;
    Ok(TensorType::new(
        x.dtype,
        axes.iter().map(|&a| x.dims[a]).collect(),
    ))
}

pub(super) fn concat(attrs: &ConcatAttrs, ops: &[TensorType]) -> Res<TensorType> {
    let first = &ops[0];
    let rank = first.rank();
    let axis = norm_axis(attrs.axis, rank, "'axis'")?;
    let mut dims = first.dims.clone();
    for (i, t) in ops.iter().enumerate().skip(1) {
        same_dtype(ops, 0, i)?;
        if t.rank() != rank {
            bail!(
                "operand {i} has rank {} but operand 0 has rank {rank}",
                t.rank()
            );
        }
        for (j, (&d, out)) in t.dims.iter().zip(dims.iter_mut()).enumerate() {
            if j == axis {
                continue;
            }
            if !d.compatible(*out) {
                bail!(
                    "operand {i} dim {j} is {d} but operand 0 has {}",
                    first.dims[j]
                );
            }
            if d != Dim::Batch {
                *out = d;
            }
        }
    }
    // Known sizes add up; `?` survives only alone (plus empty operands).
    let known = ops
        .iter()
        .filter_map(|t| t.dims[axis].known())
        .try_fold(0u64, |a, n| a.checked_add(n))
        .ok_or_else(|| {
            ShapeError::new(format!("concat along dim {axis}: the size is too large"))
        })?;
    let batches: Vec<usize> = (0..ops.len())
        .filter(|&i| ops[i].dims[axis] == Dim::Batch)
        .collect();
    dims[axis] = match batches.as_slice() {
        [] => Dim::Known(known),
        [_] if known == 0 => Dim::Batch,
        [i, ..] => {
            return Err(batch_err(format_args!(
                "concat along dim {axis} (operand {i})"
            )))
        }
    };
    Ok(TensorType::new(first.dtype, dims))
}

pub(super) fn split(attrs: &SplitAttrs, x: &TensorType) -> Res<Vec<TensorType>> {
    let axis = norm_axis(attrs.axis, x.rank(), "'axis'")?;
    let sizes = &attrs.split;
    if sizes.is_empty() {
        bail!("'split' must have at least one entry");
    }
    if let Some((i, s)) = sizes.iter().enumerate().find(|(_, &s)| s < 0) {
        bail!("'split' entry {i} is {s}; sizes must be >= 0");
    }
    let Some(n) = x.dims[axis].known() else {
        return Err(batch_err(format_args!("split along dim {axis}")));
    };
    let total: i128 = sizes.iter().map(|&s| s as i128).sum();
    if total != n as i128 {
        bail!("'split' sizes {sizes:?} sum to {total} but dim {axis} of {x} has size {n}");
    }
    Ok(sizes
        .iter()
        .map(|&s| {
            let mut dims = x.dims.clone();
            dims[axis] = Dim::Known(s as u64);
            TensorType::new(x.dtype, dims)
        })
        .collect())
}

/// Number of elements ONNX Slice takes from a dim of size `n`.
fn slice_len(n: u64, start: i64, end: i64, step: i64) -> u64 {
    let (n, start, end, step) = (n as i128, start as i128, end as i128, step as i128);
    let resolve = |v: i128| if v < 0 { v + n } else { v };
    let (start, end) = (resolve(start), resolve(end));
    let (start, end) = if step > 0 {
        (start.clamp(0, n), end.clamp(0, n))
    } else {
        (start.clamp(0, (n - 1).max(0)), end.clamp(-1, n - 1))
    };
    let len = if step > 0 {
        (end - start + step - 1) / step
    } else {
        (start - end + (-step) - 1) / (-step)
    };
    len.max(0) as u64
}

/// Slice bounds at least this large count as "to the end" on the batch dim `?` (exporters
/// write INT64_MAX, and some INT32_MAX).
const OPEN_END: i64 = i32::MAX as i64;

pub(super) fn slice(attrs: &SliceAttrs, x: &TensorType) -> Res<TensorType> {
    let (starts, ends) = (&attrs.starts, &attrs.ends);
    let n = starts.len();
    if ends.len() != n {
        bail!("'starts' has {n} entries but 'ends' has {}", ends.len());
    }
    let axes = match &attrs.axes {
        Some(a) if a.len() != n => bail!("'starts' has {n} entries but 'axes' has {}", a.len()),
        Some(a) => a.clone(),
        None => (0..n as i64).collect(),
    };
    let steps = match &attrs.steps {
        Some(s) if s.len() != n => bail!("'starts' has {n} entries but 'steps' has {}", s.len()),
        Some(s) => s.clone(),
        None => vec![1; n],
    };
    let axes = norm_axes(&axes, x.rank(), "axes")?;
    let mut dims = x.dims.clone();
    for i in 0..n {
        let (axis, start, end, step) = (axes[i], starts[i], ends[i], steps[i]);
        if step == 0 {
            bail!("'steps' entry {i} is 0");
        }
        dims[axis] = match x.dims[axis] {
            Dim::Known(size) => Dim::Known(slice_len(size, start, end, step)),
            Dim::Batch => {
                // Only a slice that keeps the whole dim, in either direction, keeps `?`.
                let whole_forward =
                    step == 1 && (start == 0 || start <= -OPEN_END) && end >= OPEN_END;
                let whole_backward =
                    step == -1 && (start == -1 || start >= OPEN_END) && end <= -OPEN_END;
                if !(whole_forward || whole_backward) {
                    return Err(batch_err(format_args!(
                        "slicing dim {axis} with [{start}:{end}:{step}]"
                    )));
                }
                Dim::Batch
            }
        };
    }
    Ok(TensorType::new(x.dtype, dims))
}

pub(super) fn gather(axis: i64, data: &TensorType, indices: &TensorType) -> Res<TensorType> {
    check_elem(indices, 1, Elem::Integer)?;
    if data.rank() == 0 {
        bail!("operand 0 (data) must have rank >= 1, got {data}");
    }
    let axis = norm_axis(axis, data.rank(), "'axis'")?;
    let mut dims = data.dims[..axis].to_vec();
    dims.extend_from_slice(&indices.dims);
    dims.extend_from_slice(&data.dims[axis + 1..]);
    Ok(TensorType::new(data.dtype, dims))
}

pub(super) fn expand(attrs: &ShapeAttrs, x: &TensorType) -> Res<TensorType> {
    let shape = &attrs.shape;
    if let Some((i, s)) = shape.iter().enumerate().find(|(_, &s)| s < 0) {
        bail!("'shape' entry {i} is {s}; sizes must be >= 0");
    }
    let target: Vec<Dim> = shape.iter().map(|&s| Dim::Known(s as u64)).collect();
    let Some(dims) = broadcast_shapes(&x.dims, &target) else {
        bail!("cannot broadcast {x} with shape {shape:?}");
    };
    Ok(TensorType::new(x.dtype, dims))
}

pub(super) fn pad(attrs: &PadAttrs, x: &TensorType) -> Res<TensorType> {
    let pads = &attrs.pads;
    let rank = x.rank();
    if pads.len() != 2 * rank {
        bail!(
            "operand 0 has {rank} dims but 'pads' has {} entries (expected {})",
            pads.len(),
            2 * rank
        );
    }
    match attrs.mode.as_str() {
        "constant" | "reflect" | "edge" => {}
        other => bail!("'mode' must be \"constant\", \"reflect\" or \"edge\", found {other:?}"),
    }
    let mut dims = Vec::with_capacity(rank);
    for (i, &d) in x.dims.iter().enumerate() {
        let (b, e) = (pads[i], pads[rank + i]);
        dims.push(match d {
            Dim::Batch if b == 0 && e == 0 => Dim::Batch,
            Dim::Batch => return Err(batch_err(format_args!("padding dim {i} by {b} and {e}"))),
            Dim::Known(n) => {
                let out = n as i128 + b as i128 + e as i128;
                if out < 0 {
                    bail!("padding dim {i} (size {n}) by {b} and {e} gives a negative size {out}");
                }
                super::size_dim(out, format_args!("padding dim {i}"))?
            }
        });
    }
    Ok(TensorType::new(x.dtype, dims))
}

pub(super) fn tile(attrs: &TileAttrs, x: &TensorType) -> Res<TensorType> {
    let repeats = &attrs.repeats;
    if repeats.len() != x.rank() {
        bail!(
            "operand 0 has {} dims but 'repeats' has {} entries",
            x.rank(),
            repeats.len()
        );
    }
    let mut dims = Vec::with_capacity(x.rank());
    for (i, (&d, &r)) in x.dims.iter().zip(repeats).enumerate() {
        if r < 0 {
            bail!("'repeats' entry {i} is {r}; repeats must be >= 0");
        }
        dims.push(match d {
            Dim::Known(n) => {
                super::size_dim(n as i128 * r as i128, format_args!("tiling dim {i}"))?
            }
            Dim::Batch if r == 1 => Dim::Batch,
            Dim::Batch if r == 0 => Dim::Known(0),
            Dim::Batch => return Err(batch_err(format_args!("tiling dim {i} by {r}"))),
        });
    }
    Ok(TensorType::new(x.dtype, dims))
}

pub(super) fn squeeze(attrs: &SqueezeAttrs, x: &TensorType) -> Res<TensorType> {
    let axes = norm_axes(&attrs.axes, x.rank(), "axes")?;
    if axes.is_empty() {
        // Without axes every dim known to be 1 goes; `?` is assumed not to be 1.
        let dims = x
            .dims
            .iter()
            .copied()
            .filter(|&d| d != Dim::Known(1))
            .collect();
        return Ok(TensorType::new(x.dtype, dims));
    }
    for &a in &axes {
        match x.dims[a] {
            Dim::Known(1) => {}
            Dim::Known(n) => bail!("cannot squeeze dim {a} of {x}: its size is {n}, not 1"),
            Dim::Batch => return Err(batch_err(format_args!("squeezing dim {a}"))),
        }
    }
    let dims = x
        .dims
        .iter()
        .enumerate()
        .filter(|(i, _)| !axes.contains(i))
        .map(|(_, &d)| d)
        .collect();
    Ok(TensorType::new(x.dtype, dims))
}

pub(super) fn unsqueeze(attrs: &UnsqueezeAttrs, x: &TensorType) -> Res<TensorType> {
    let axes = &attrs.axes;
    let rank = x.rank() + axes.len();
    let axes = norm_axes(axes, rank, "axes")?;
    // `norm_axes` rejects repeated axes, so the input dims fill the other slots exactly.
    let mut rest = x.dims.iter().copied();
    let dims = (0..rank)
        .map(|i| {
            if axes.contains(&i) {
                Some(Dim::Known(1))
            } else {
                rest.next()
            }
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| ShapeError(format!("'axes' = {axes:?} do not fit rank {rank}")))?;
    Ok(TensorType::new(x.dtype, dims))
}

/// Product of dims as one dim: known if all are known, `?` if the only other factors are 1.
fn dim_product(dims: &[Dim]) -> Option<Dim> {
    let known = product(dims.iter().filter_map(|d| d.known()))?;
    match dims.iter().filter(|&&d| d == Dim::Batch).count() {
        0 => Some(Dim::Known(known)),
        _ if known == 0 => Some(Dim::Known(0)),
        1 if known == 1 => Some(Dim::Batch),
        _ => None,
    }
}

pub(super) fn flatten(attrs: &FlattenAttrs, x: &TensorType) -> Res<TensorType> {
    let rank = x.rank() as i64;
    let axis = attrs.axis;
    if axis < -rank || axis > rank {
        bail!(
            "'axis' = {axis} is out of range for rank {rank} (valid: {} to {rank})",
            -rank
        );
    }
    let axis = if axis < 0 { axis + rank } else { axis } as usize;
    let (outer, inner) = x.dims.split_at(axis);
    let mut dims = Vec::with_capacity(2);
    for part in [outer, inner] {
        match dim_product(part) {
            Some(d) => dims.push(d),
            None => {
                return Err(ShapeError(format!(
                    "flattening {} of {x} multiplies the batch dimension `?` by other sizes; \
                     this needs a known batch size",
                    dims_str(part)
                )))
            }
        }
    }
    Ok(TensorType::new(x.dtype, dims))
}
