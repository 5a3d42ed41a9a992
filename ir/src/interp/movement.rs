//! Data movement: reshape, transpose, concat, split, slice, gather, expand, pad, tile,
//! squeeze, unsqueeze, flatten, and constant. None of them computes with element values,
//! so each works on float and integer storage alike.
//!
//! Slice, gather, expand, pad and tile are all "pick a source coordinate per axis"
//! ([`select_axes`]); they differ only in how they build the per-axis maps.

use super::elementwise::cast;
use super::util::{
    broadcast_shapes, fail, for_each_strided, full_map, ints, map_data, norm_axes, norm_axis,
    select_data, to_usize, OpResult,
};
use crate::attr::Attrs;
use crate::ops::attrs::{
    ConcatAttrs, ConstantAttrs, FlattenAttrs, PadAttrs, ShapeAttrs, SliceAttrs, SplitAttrs,
    SqueezeAttrs, TileAttrs, TransposeAttrs, UnsqueezeAttrs,
};
use crate::tensor::{strides_of, Tensor, TensorData};
use crate::types::{DType, TensorType};

fn with_shape(x: &Tensor, shape: Vec<usize>) -> Tensor {
    Tensor {
        dtype: x.dtype,
        shape,
        data: x.data.clone(),
    }
}

/// `shape` (static, at most one -1 for the size that makes the element counts agree).
pub(super) fn reshape(attrs: &ShapeAttrs, x: &Tensor) -> OpResult<Tensor> {
    let spec = &attrs.shape;
    let n = x.num_elements();
    let mut shape = Vec::with_capacity(spec.len());
    let mut inferred = None;
    for (i, &d) in spec.iter().enumerate() {
        if d == -1 {
            if inferred.is_some() {
                fail!("`shape` {spec:?} has more than one -1");
            }
            inferred = Some(i);
            shape.push(1);
        } else {
            shape.push(to_usize(d, "each entry of `shape` (other than one -1)")?);
        }
    }
    if let Some(i) = inferred {
        let known: usize = shape.iter().product();
        if known == 0 || !n.is_multiple_of(known) {
            fail!("cannot reshape {:?} ({n} elements) to {spec:?}", x.shape);
        }
        shape[i] = n / known;
    }
    if shape.iter().product::<usize>() != n {
        fail!("cannot reshape {:?} ({n} elements) to {spec:?}", x.shape);
    }
    Ok(with_shape(x, shape))
}

/// `perm` (default: reversed axes); result dimension i is input dimension `perm[i]`.
pub(super) fn transpose(attrs: &TransposeAttrs, x: &Tensor) -> OpResult<Tensor> {
    let rank = x.shape.len();
    let perm = match &attrs.perm {
        Some(p) => p.clone(),
        None => (0..rank as i64).rev().collect(),
    };
    if perm.len() != rank {
        fail!("`perm` {perm:?} must have {rank} entries");
    }
    let perm = norm_axes(&perm, rank)?;
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let st = strides_of(&x.shape);
    let src_strides: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let data = map_data!(&x.data, |v| {
        let mut out = Vec::with_capacity(v.len());
        for_each_strided(&shape, [&src_strides], |[i]| out.push(v[i]));
        out
    });
    Ok(Tensor {
        dtype: x.dtype,
        shape,
        data,
    })
}

/// Join along `axis`; all other dimensions must agree.
pub(super) fn concat(attrs: &ConcatAttrs, inputs: &[&Tensor]) -> OpResult<Tensor> {
    let first = inputs[0];
    let rank = first.shape.len();
    let axis = norm_axis(attrs.axis, rank)?;
    for (i, t) in inputs.iter().enumerate() {
        if t.dtype != first.dtype {
            fail!(
                "operand {i} has element type {}, operand 0 has {}",
                t.dtype,
                first.dtype
            );
        }
        let same =
            t.shape.len() == rank && (0..rank).all(|d| d == axis || t.shape[d] == first.shape[d]);
        if !same {
            fail!("operand {i} of shape {:?} does not match operand 0 of shape {:?} outside axis {axis}", t.shape, first.shape);
        }
    }
    let outer: usize = first.shape[..axis].iter().product();
    let inner: usize = first.shape[axis + 1..].iter().product();
    let mut shape = first.shape.clone();
    shape[axis] = inputs.iter().map(|t| t.shape[axis]).sum();
    fn join<T: Copy>(parts: &[(&[T], usize)], outer: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(parts.iter().map(|p| p.0.len()).sum());
        for o in 0..outer {
            for &(v, chunk) in parts {
                out.extend_from_slice(&v[o * chunk..(o + 1) * chunk]);
            }
        }
        out
    }
    let data = match &first.data {
        TensorData::Float(_) => TensorData::Float(join(
            &inputs
                .iter()
                .map(|t| (t.as_f64().unwrap_or(&[]), t.shape[axis] * inner))
                .collect::<Vec<_>>(),
            outer,
        )),
        TensorData::Int(_) => TensorData::Int(join(
            &inputs
                .iter()
                .map(|t| (t.as_i64().unwrap_or(&[]), t.shape[axis] * inner))
                .collect::<Vec<_>>(),
            outer,
        )),
    };
    Ok(Tensor {
        dtype: first.dtype,
        shape,
        data,
    })
}

/// Cut along `axis` into pieces of the sizes in `split`, one result each.
pub(super) fn split(attrs: &SplitAttrs, x: &Tensor, n_results: usize) -> OpResult<Vec<Tensor>> {
    let rank = x.shape.len();
    let axis = norm_axis(attrs.axis, rank)?;
    let sizes = attrs
        .split
        .iter()
        .map(|&s| to_usize(s, "each split size"))
        .collect::<OpResult<Vec<_>>>()?;
    if sizes.len() != n_results {
        fail!(
            "`split` has {} sizes but the op declares {n_results} results",
            sizes.len()
        );
    }
    if sizes.iter().sum::<usize>() != x.shape[axis] {
        fail!(
            "split sizes {sizes:?} do not add up to dimension {axis} of size {}",
            x.shape[axis]
        );
    }
    let mut start = 0;
    let mut out = Vec::with_capacity(sizes.len());
    for &s in &sizes {
        let mut maps: Vec<Vec<Option<usize>>> = x.shape.iter().map(|&d| full_map(d)).collect();
        maps[axis] = (start..start + s).map(Some).collect();
        let mut shape = x.shape.clone();
        shape[axis] = s;
        out.push(Tensor {
            dtype: x.dtype,
            shape,
            data: select_data(&x.data, &x.shape, &maps, 0.0),
        });
        start += s;
    }
    Ok(out)
}

/// ONNX Slice: `starts`, `ends`, optional `axes` and `steps`. Negative starts/ends count
/// from the end; then starts clamp to `[0, d]` (`[0, d-1]` for negative steps) and ends to
/// `[0, d]` (`[-1, d-1]` for negative steps), so INT64_MAX/INT64_MIN mean "to the end".
pub(super) fn slice(attrs: &SliceAttrs, x: &Tensor) -> OpResult<Tensor> {
    let maps = slice_maps(attrs, &x.shape)?;
    let shape = maps.iter().map(|m| m.len()).collect();
    Ok(Tensor {
        dtype: x.dtype,
        shape,
        data: select_data(&x.data, &x.shape, &maps, 0.0),
    })
}

/// Per axis of an input of shape `in_shape`, the input coordinate each result coordinate
/// of a slice reads (shared with `slice_grad`, which writes there).
pub(super) fn slice_maps(
    attrs: &SliceAttrs,
    in_shape: &[usize],
) -> OpResult<Vec<Vec<Option<usize>>>> {
    let rank = in_shape.len();
    let (starts, ends) = (&attrs.starts, &attrs.ends);
    let axes = match &attrs.axes {
        Some(a) => a.clone(),
        None => (0..starts.len() as i64).collect(),
    };
    let steps = match &attrs.steps {
        Some(s) => s.clone(),
        None => vec![1; starts.len()],
    };
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        fail!(
            "`starts` {starts:?}, `ends` {ends:?}, `axes` {axes:?} and `steps` {steps:?} must have the same length"
        );
    }
    let axes = norm_axes(&axes, rank)?;
    let mut maps: Vec<Vec<Option<usize>>> = in_shape.iter().map(|&d| full_map(d)).collect();
    for (i, &axis) in axes.iter().enumerate() {
        let d = in_shape[axis] as i64;
        let step = steps[i];
        if step == 0 {
            fail!("slice step for axis {axis} is 0");
        }
        let resolve = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
        let (start, end) = (resolve(starts[i]), resolve(ends[i]));
        let (start, end) = if step > 0 {
            (start.clamp(0, d), end.clamp(0, d))
        } else {
            (start.clamp(0, (d - 1).max(0)), end.clamp(-1, d - 1))
        };
        // Element count without stepping (a step near INT64_MAX must not overflow).
        let span = if step > 0 { end - start } else { start - end };
        let count = if span > 0 && d > 0 {
            (span as u64 - 1) / step.unsigned_abs() + 1
        } else {
            0
        };
        let map = (0..count as i64)
            .map(|t| Some((start + t * step) as usize))
            .collect();
        maps[axis] = map;
    }
    Ok(maps)
}

/// ONNX Gather: result shape `data[..axis] ++ indices ++ data[axis+1..]`; negative
/// indices count from the end.
pub(super) fn gather(axis: i64, data: &Tensor, indices: &Tensor) -> OpResult<Tensor> {
    let rank = data.shape.len();
    let axis = norm_axis(axis, rank)?;
    let idx = ints(indices, "indices")?;
    let d = data.shape[axis];
    let mut map = Vec::with_capacity(idx.len());
    for &i in idx {
        let j = if i < 0 { i + d as i64 } else { i };
        if j < 0 || j >= d as i64 {
            fail!("index {i} out of range for axis {axis} of size {d}");
        }
        map.push(Some(j as usize));
    }
    let mut maps: Vec<Vec<Option<usize>>> = data.shape.iter().map(|&d| full_map(d)).collect();
    maps[axis] = map;
    let mut shape = data.shape[..axis].to_vec();
    shape.extend_from_slice(&indices.shape);
    shape.extend_from_slice(&data.shape[axis + 1..]);
    Ok(Tensor {
        dtype: data.dtype,
        shape,
        data: select_data(&data.data, &data.shape, &maps, 0.0),
    })
}

/// ONNX Expand: broadcast x and `shape` against each other (a 1 in `shape` keeps x's size).
pub(super) fn expand(attrs: &ShapeAttrs, x: &Tensor) -> OpResult<Tensor> {
    let spec = attrs
        .shape
        .iter()
        .map(|&d| to_usize(d, "each entry of `shape`"))
        .collect::<OpResult<Vec<_>>>()?;
    let shape = broadcast_shapes(&[&x.shape, &spec])?;
    let mut src_shape = vec![1; shape.len() - x.shape.len()];
    src_shape.extend_from_slice(&x.shape);
    let maps: Vec<Vec<Option<usize>>> = src_shape
        .iter()
        .zip(&shape)
        .map(|(&s, &o)| {
            if s == 1 {
                vec![Some(0); o]
            } else {
                full_map(o)
            }
        })
        .collect();
    Ok(Tensor {
        dtype: x.dtype,
        shape,
        data: select_data(&x.data, &src_shape, &maps, 0.0),
    })
}

/// ONNX Pad: `pads` (all begins then all ends; negative values crop), `mode` constant
/// (fill with `value`), reflect (mirror without repeating the edge, as numpy) or edge.
pub(super) fn pad(attrs: &PadAttrs, x: &Tensor) -> OpResult<Tensor> {
    let rank = x.shape.len();
    let pads = &attrs.pads;
    if pads.len() != 2 * rank {
        fail!(
            "`pads` must have {} entries (begins then ends), got {pads:?}",
            2 * rank
        );
    }
    let mode = attrs.mode.as_str();
    if !matches!(mode, "constant" | "reflect" | "edge") {
        fail!("`mode` must be \"constant\", \"reflect\" or \"edge\", got \"{mode}\"");
    }
    let value = attrs.value;
    let mut maps = Vec::with_capacity(rank);
    for (axis, &d) in x.shape.iter().enumerate() {
        let (pb, pe) = (pads[axis], pads[rank + axis]);
        let len = d as i64 + pb + pe;
        if len < 0 {
            fail!("pads {pb} and {pe} crop more than the {d} elements of axis {axis}");
        }
        if len > 0 && d == 0 && mode != "constant" {
            fail!("cannot {mode}-pad axis {axis} of size 0");
        }
        let di = d as i64;
        let map: Vec<Option<usize>> = (0..len)
            .map(|o| {
                let s = o - pb;
                if (0..di).contains(&s) {
                    return Some(s as usize);
                }
                match mode {
                    "edge" => Some(s.clamp(0, di - 1) as usize),
                    // numpy "reflect": a triangle wave of period 2(d-1) over the input.
                    "reflect" if di == 1 => Some(0),
                    "reflect" => {
                        let period = 2 * (di - 1);
                        let m = s.rem_euclid(period);
                        Some((if m < di { m } else { period - m }) as usize)
                    }
                    _ => None,
                }
            })
            .collect();
        maps.push(map);
    }
    let shape = maps.iter().map(|m| m.len()).collect();
    Ok(Tensor {
        dtype: x.dtype,
        shape,
        data: select_data(&x.data, &x.shape, &maps, value),
    })
}

/// ONNX Tile: repeat the whole tensor `repeats[i]` times along axis i.
pub(super) fn tile(attrs: &TileAttrs, x: &Tensor) -> OpResult<Tensor> {
    let repeats = &attrs.repeats;
    if repeats.len() != x.shape.len() {
        fail!(
            "`repeats` {repeats:?} must have one entry per dimension of x (rank {})",
            x.shape.len()
        );
    }
    let mut maps = Vec::with_capacity(repeats.len());
    for (&d, &r) in x.shape.iter().zip(repeats) {
        let r = to_usize(r, "each repeat")?;
        maps.push((0..d * r).map(|o| Some(o % d)).collect::<Vec<_>>());
    }
    let shape = maps.iter().map(|m| m.len()).collect();
    Ok(Tensor {
        dtype: x.dtype,
        shape,
        data: select_data(&x.data, &x.shape, &maps, 0.0),
    })
}

/// Remove the listed size-1 dimensions (all of them when `axes` is empty).
pub(super) fn squeeze(attrs: &SqueezeAttrs, x: &Tensor) -> OpResult<Tensor> {
    let rank = x.shape.len();
    let axes = &attrs.axes;
    let axes = if axes.is_empty() {
        (0..rank).filter(|&i| x.shape[i] == 1).collect()
    } else {
        norm_axes(axes, rank)?
    };
    for &a in &axes {
        if x.shape[a] != 1 {
            fail!(
                "cannot squeeze axis {a} of size {} (shape {:?})",
                x.shape[a],
                x.shape
            );
        }
    }
    let shape = (0..rank)
        .filter(|i| !axes.contains(i))
        .map(|i| x.shape[i])
        .collect();
    Ok(with_shape(x, shape))
}

/// Insert size-1 dimensions at the listed positions of the result.
pub(super) fn unsqueeze(attrs: &UnsqueezeAttrs, x: &Tensor) -> OpResult<Tensor> {
    let axes = &attrs.axes;
    let out_rank = x.shape.len() + axes.len();
    let axes = norm_axes(axes, out_rank)?;
    let mut rest = x.shape.iter();
    let shape = (0..out_rank)
        .map(|i| {
            if axes.contains(&i) {
                1
            } else {
                *rest.next().unwrap_or(&1)
            }
        })
        .collect();
    Ok(with_shape(x, shape))
}

/// To 2-D: `[prod(d[..axis]), prod(d[axis..])]`; `axis` in `-rank..=rank`.
pub(super) fn flatten(attrs: &FlattenAttrs, x: &Tensor) -> OpResult<Tensor> {
    let rank = x.shape.len() as i64;
    let axis = attrs.axis;
    if axis < -rank || axis > rank {
        fail!("axis {axis} out of range for flatten of rank {rank}");
    }
    let axis = if axis < 0 { axis + rank } else { axis } as usize;
    let shape = vec![
        x.shape[..axis].iter().product(),
        x.shape[axis..].iter().product(),
    ];
    Ok(with_shape(x, shape))
}

/// The `value` attribute, converted to the declared element type.
pub(super) fn constant(attrs: &Attrs, result: &TensorType) -> OpResult<Tensor> {
    let value = ConstantAttrs::value_ref(attrs)?;
    let dtype: DType = result.dtype;
    Ok(if value.dtype == dtype {
        value.clone()
    } else {
        cast(value, dtype)
    })
}
