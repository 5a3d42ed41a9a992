//! Helpers shared by the op families: the op-level failure type, operand access, axes,
//! numpy broadcasting and index maps.

use crate::attr::AttrError;
use crate::tensor::{Tensor, TensorData};
use crate::types::DType;

/// What went wrong inside one op. [`super::eval_op`] adds the op kind, and
/// [`super::run_function`] the result name and source location.
#[derive(Debug)]
pub(crate) struct OpFail(pub String);

impl From<AttrError> for OpFail {
    fn from(e: AttrError) -> Self {
        OpFail(e.to_string())
    }
}

pub(crate) type OpResult<T> = Result<T, OpFail>;

/// `return Err(OpFail(format!(...)))`.
macro_rules! fail {
    ($($arg:tt)*) => {
        return Err($crate::interp::util::OpFail(format!($($arg)*)))
    };
}
pub(crate) use fail;

/// The elements of a float operand, or an error naming the operand.
pub(crate) fn floats<'a>(t: &'a Tensor, what: &str) -> OpResult<&'a [f64]> {
    match &t.data {
        TensorData::Float(v) if t.dtype.is_float() => Ok(v),
        _ => fail!("{what} must be a float tensor, got {}", t.dtype),
    }
}

/// The elements of an integer (not bool) operand.
pub(crate) fn ints<'a>(t: &'a Tensor, what: &str) -> OpResult<&'a [i64]> {
    match &t.data {
        TensorData::Int(v) if t.dtype.is_int() => Ok(v),
        _ => fail!("{what} must be an integer tensor, got {}", t.dtype),
    }
}

/// The elements of a bool operand.
pub(crate) fn bools<'a>(t: &'a Tensor, what: &str) -> OpResult<&'a [i64]> {
    match &t.data {
        TensorData::Int(v) if t.dtype == DType::Bool => Ok(v),
        _ => fail!("{what} must be a bool (i1) tensor, got {}", t.dtype),
    }
}

pub(crate) fn same_dtype(a: &Tensor, b: &Tensor) -> OpResult<()> {
    if a.dtype != b.dtype {
        fail!("operand element types differ: {} and {}", a.dtype, b.dtype);
    }
    Ok(())
}

pub(crate) fn float_tensor(dtype: DType, shape: Vec<usize>, data: Vec<f64>) -> Tensor {
    debug_assert_eq!(shape.iter().product::<usize>(), data.len());
    Tensor {
        dtype,
        shape,
        data: TensorData::Float(data),
    }
}

pub(crate) fn int_tensor(dtype: DType, shape: Vec<usize>, data: Vec<i64>) -> Tensor {
    debug_assert_eq!(shape.iter().product::<usize>(), data.len());
    Tensor {
        dtype,
        shape,
        data: TensorData::Int(data),
    }
}

/// Apply a shape-only rearrangement to either storage kind.
macro_rules! map_data {
    ($data:expr, |$v:ident| $body:expr) => {
        match $data {
            $crate::tensor::TensorData::Float($v) => $crate::tensor::TensorData::Float($body),
            $crate::tensor::TensorData::Int($v) => $crate::tensor::TensorData::Int($body),
        }
    };
}
pub(crate) use map_data;

/// Resolve a possibly negative axis against `rank`.
pub(crate) fn norm_axis(axis: i64, rank: usize) -> OpResult<usize> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        fail!("axis {axis} out of range for rank {rank}");
    }
    Ok(if axis < 0 {
        (axis + r) as usize
    } else {
        axis as usize
    })
}

/// Resolve a list of axes; duplicates are an error.
pub(crate) fn norm_axes(axes: &[i64], rank: usize) -> OpResult<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = norm_axis(a, rank)?;
        if out.contains(&a) {
            fail!("axis {a} listed twice in {axes:?}");
        }
        out.push(a);
    }
    Ok(out)
}

/// A non-negative size from an attribute.
pub(crate) fn to_usize(v: i64, what: &str) -> OpResult<usize> {
    if v < 0 {
        fail!("{what} must be non-negative, got {v}");
    }
    Ok(v as usize)
}

/// Numpy broadcast of several shapes.
pub(crate) fn broadcast_shapes(shapes: &[&[usize]]) -> OpResult<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                fail!(
                    "shapes {} cannot be broadcast together",
                    list_shapes(shapes)
                );
            }
        }
    }
    Ok(out)
}

fn list_shapes(shapes: &[&[usize]]) -> String {
    shapes
        .iter()
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Strides (in elements) of `shape` read as broadcast to `out` (right-aligned; 0 where a
/// dimension is broadcast). `shape` must broadcast to `out`.
pub(crate) fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let own = crate::tensor::strides_of(shape);
    let off = out.len() - shape.len();
    (0..out.len())
        .map(|i| {
            if i < off || shape[i - off] == 1 {
                0
            } else {
                own[i - off]
            }
        })
        .collect()
}

/// Call `f` with the flat offsets of `K` operands (of shapes `ins`, each broadcast to
/// `out`) for every element of `out` in row-major order.
pub(crate) fn for_each_broadcast<const K: usize>(
    out: &[usize],
    ins: [&[usize]; K],
    f: impl FnMut([usize; K]),
) {
    let strides: [Vec<usize>; K] = std::array::from_fn(|k| broadcast_strides(ins[k], out));
    for_each_strided(out, strides.each_ref().map(|s| &s[..]), f);
}

/// Call `f` with the offsets `Σ index[d] · strides[k][d]` of `K` operands for every index
/// of `out` in row-major order (an odometer over the outer dimensions, a plain loop over
/// the last).
pub(crate) fn for_each_strided<const K: usize>(
    out: &[usize],
    strides: [&[usize]; K],
    mut f: impl FnMut([usize; K]),
) {
    let n: usize = out.iter().product();
    if n == 0 {
        return;
    }
    let rank = out.len();
    if rank == 0 {
        f([0; K]);
        return;
    }
    let inner = out[rank - 1];
    let inner_st: [usize; K] = std::array::from_fn(|k| strides[k][rank - 1]);
    let mut idx = vec![0usize; rank];
    let mut base = [0usize; K];
    for _ in 0..n / inner {
        let mut offs = base;
        for _ in 0..inner {
            f(offs);
            for k in 0..K {
                offs[k] += inner_st[k];
            }
        }
        for d in (0..rank - 1).rev() {
            idx[d] += 1;
            for k in 0..K {
                base[k] += strides[k][d];
            }
            if idx[d] < out[d] {
                break;
            }
            for k in 0..K {
                base[k] -= strides[k][d] * out[d];
            }
            idx[d] = 0;
        }
    }
}

/// Build a tensor of shape `maps[i].len()` whose element at index `(o_0, .., o_r)` is the
/// source element at `(maps[0][o_0], .., maps[r][o_r])`, or `fill` where any map is `None`.
/// Slice, pad, tile, expand and gather are all this with different per-axis maps.
pub(crate) fn select_axes<T: Copy>(
    src: &[T],
    src_shape: &[usize],
    maps: &[Vec<Option<usize>>],
    fill: T,
) -> Vec<T> {
    debug_assert_eq!(src_shape.len(), maps.len());
    let out_shape: Vec<usize> = maps.iter().map(|m| m.len()).collect();
    let n: usize = out_shape.iter().product();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let rank = maps.len();
    if rank == 0 {
        out.push(src[0]);
        return out;
    }
    let st = crate::tensor::strides_of(src_shape);
    let last = &maps[rank - 1];
    let mut idx = vec![0usize; rank - 1];
    loop {
        // Source offset of the outer index, or None if it falls in padding.
        let mut base = Some(0usize);
        for d in 0..rank - 1 {
            base = match (base, maps[d][idx[d]]) {
                (Some(b), Some(i)) => Some(b + i * st[d]),
                _ => None,
            };
        }
        match base {
            Some(b) => out.extend(last.iter().map(|m| match m {
                Some(i) => src[b + i * st[rank - 1]],
                None => fill,
            })),
            None => out.extend(std::iter::repeat_n(fill, last.len())),
        }
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < out_shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Identity map of one axis.
pub(crate) fn full_map(n: usize) -> Vec<Option<usize>> {
    (0..n).map(Some).collect()
}

/// Apply `select_axes` to either storage kind (fill 0).
pub(crate) fn select_data(
    data: &TensorData,
    src_shape: &[usize],
    maps: &[Vec<Option<usize>>],
    fill: f64,
) -> TensorData {
    match data {
        TensorData::Float(v) => TensorData::Float(select_axes(v, src_shape, maps, fill)),
        TensorData::Int(v) => TensorData::Int(select_axes(v, src_shape, maps, fill as i64)),
    }
}

/// Range `lo..hi` of `o` in `0..n_out` for which `o * stride + offset` lies in `0..n_in`.
/// Convolution and pooling loops use it to skip padding without a test per element.
pub(crate) fn valid_range(n_out: usize, n_in: usize, stride: usize, offset: i64) -> (usize, usize) {
    let s = stride as i64;
    let lo = if offset >= 0 {
        0
    } else {
        (-offset + s - 1) / s
    };
    let last = n_in as i64 - 1 - offset;
    let hi = if last < 0 {
        0
    } else {
        (last / s + 1).min(n_out as i64)
    };
    let lo = lo.min(hi);
    (lo as usize, hi as usize)
}

/// NaN-propagating maximum and minimum (numpy `maximum`/`minimum`).
pub(crate) fn max_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

pub(crate) fn min_nan(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_range_matches_brute_force() {
        for n_out in 0..7 {
            for n_in in 0..7 {
                for stride in 1..4 {
                    for offset in -6i64..6 {
                        let (lo, hi) = valid_range(n_out, n_in, stride, offset);
                        let want: Vec<usize> = (0..n_out)
                            .filter(|&o| {
                                let i = o as i64 * stride as i64 + offset;
                                i >= 0 && i < n_in as i64
                            })
                            .collect();
                        let got: Vec<usize> = (lo..hi).collect();
                        assert_eq!(
                            got, want,
                            "n_out {n_out} n_in {n_in} s {stride} off {offset}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn broadcast_offsets() {
        let mut seen = vec![];
        for_each_broadcast(&[2, 3], [&[2, 1], &[3]], |[a, b]| seen.push((a, b)));
        assert_eq!(seen, vec![(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]);
        assert!(broadcast_shapes(&[&[2, 3], &[4]]).is_err());
        assert_eq!(
            broadcast_shapes(&[&[2, 1, 3], &[4, 1], &[]]).unwrap(),
            vec![2, 4, 3]
        );
    }
}
