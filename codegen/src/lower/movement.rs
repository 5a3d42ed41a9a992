//! Data movement. None of these ops computes with element values, so every one of them
//! works for every dtype (f32, f64, f16, bf16, i64, i32, i8, bool), except the two
//! gradient helpers, whose incoming gradient is a float tensor by definition.
//!
//! | op | MLIR |
//! | --- | --- |
//! | `transpose` | `linalg.transpose` |
//! | `reshape`, `flatten`, `squeeze`, `unsqueeze` | `tensor.collapse_shape` + `tensor.expand_shape` |
//! | `constant` | `arith.constant dense<...>` (the value cast to the result dtype as the interpreter does) |
//! | `concat` | `tensor.insert_slice` of each operand into a `tensor.empty` |
//! | `split` | one `tensor.extract_slice` per result |
//! | `slice` | `tensor.extract_slice` with strides `abs(step)`, then a reversing `linalg.generic` (maps `n-1 - d`) over the negative-step axes |
//! | `slice_grad` | the same reversal, then `tensor.insert_slice` into zeros |
//! | `gather` | `linalg.generic` reading the indices through the map, the data through `tensor.extract` |
//! | `gather_grad` | `scf.for` over the indices adding each `dy` slab into its row of a zero accumulator |
//! | `expand` | `linalg.generic` with broadcasting maps |
//! | `pad` | constant: `tensor.insert_slice` into a filled tensor; reflect/edge: a `linalg.generic` computing the source coordinate per axis |
//! | `tile` | `linalg.generic` into `[r0, d0, r1, d1, ..]` (input map `(d1, d3, ..)`), collapsed to the result |
//!
//! Every op with a zero-element result lowers to `tensor.empty` (or a zero fill where the
//! result has to be defined), so no loop, slice or `dense` literal ever has a size of 0.
//!
//! Index errors that the interpreter reports at run time (a gather index out of range) cannot
//! be reported from native code: an out-of-range `gather` index reads zeros, an out-of-range
//! `gather_grad` index contributes nothing. Nothing is ever read or written out of bounds.

use ppir::ops::attrs::{
    ConcatAttrs, ConstantAttrs, GatherAttrs, GatherGradAttrs, PadAttrs, ShapeAttrs, SliceAttrs,
    SliceGradAttrs, SplitAttrs, TileAttrs, TransposeAttrs,
};
use ppir::{DType, OpKind, Tensor, TensorData};

use super::{literal, tensor_type, Body, Emitter, Iter, LowerError, OpView, Operand};

/// `dense<...>` for a constant tensor (a splat when every element is equal).
pub fn dense_literal(t: &Tensor) -> String {
    let vals: Vec<String> = match &t.data {
        TensorData::Float(v) => v.iter().map(|&x| literal(t.dtype, x)).collect(),
        TensorData::Int(v) => v.iter().map(|&x| super::int_literal(t.dtype, x)).collect(),
    };
    if !vals.is_empty() && vals.iter().all(|x| *x == vals[0]) {
        return format!("dense<{}>", vals[0]);
    }
    fn nest(v: &[String], shape: &[usize], s: &mut String) {
        if shape.is_empty() {
            s.push_str(&v[0]);
            return;
        }
        let inner: usize = shape[1..].iter().product();
        s.push('[');
        for i in 0..shape[0] {
            if i > 0 {
                s.push_str(", ");
            }
            nest(&v[i * inner..(i + 1) * inner], &shape[1..], s);
        }
        s.push(']');
    }
    let mut s = String::from("dense<");
    if vals.is_empty() {
        s.push_str("[]");
    } else {
        nest(&vals, &t.shape, &mut s);
    }
    s.push('>');
    s
}

pub fn lower(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    // IR that did not verify: refuse rather than index out of bounds below.
    if !op.kind.arity().accepts(op.in_shapes.len()) {
        return Err(op.invalid(format!(
            "expected {} operands, got {}",
            op.kind.arity(),
            op.in_shapes.len()
        )));
    }
    if op.out_shapes.is_empty() || (op.kind != OpKind::Split && op.out_shapes.len() != 1) {
        return Err(op.invalid(format!(
            "unexpected number of results: {}",
            op.out_shapes.len()
        )));
    }
    // Every op here has operands and results of one dtype, except gather's indices.
    let data_operands = match op.kind {
        OpKind::Gather => 1,
        OpKind::GatherGrad => 0,
        _ => op.in_dtypes.len(),
    };
    if let Some(&d) = op.out_dtypes.first() {
        let gg_dy = op.kind == OpKind::GatherGrad && op.in_dtypes.get(1) != Some(&d);
        let mixed = op.in_dtypes[..data_operands]
            .iter()
            .chain(&op.out_dtypes)
            .any(|&t| t != d);
        if mixed || gg_dy {
            return Err(op.invalid(format!(
                "operand element types {:?} do not match the result's {d}",
                op.in_dtypes
            )));
        }
    }
    match op.kind {
        OpKind::Transpose => transpose(e, op),
        OpKind::Reshape | OpKind::Flatten | OpKind::Squeeze | OpKind::Unsqueeze => {
            let src = e.name(op.op.operands()[0]);
            let (from, to) = (&op.in_shapes[0], &op.out_shapes[0]);
            if numel(from) != numel(to) {
                return Err(op.invalid(format!("cannot reshape {from:?} to {to:?}")));
            }
            if numel(to) == 0 {
                return Ok(vec![e.empty(to, op.out_dtypes[0])]);
            }
            Ok(vec![e.reshape(&src, from, to, op.in_dtypes[0])])
        }
        OpKind::Constant => constant(e, op),
        OpKind::Concat => concat(e, op),
        OpKind::Split => split(e, op),
        OpKind::Slice => slice(e, op),
        OpKind::SliceGrad => slice_grad(e, op),
        OpKind::Gather => gather(e, op),
        OpKind::GatherGrad => gather_grad(e, op),
        OpKind::Expand => expand(e, op),
        OpKind::Pad => pad(e, op),
        OpKind::Tile => tile(e, op),
        _ => Err(op.unsupported("")),
    }
}

// ---- helpers ----

/// The element count, saturating at `u64::MAX` (no overflow panic on absurd shapes).
fn numel(shape: &[u64]) -> u64 {
    shape
        .iter()
        .try_fold(1u64, |a, &b| a.checked_mul(b))
        .unwrap_or(u64::MAX)
}

fn list<T: ToString>(v: &[T]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The result shape must be the one the op computes (the verifier's shape inference).
fn check_out(op: &OpView, i: usize, want: &[u64]) -> Result<(), LowerError> {
    if op.out_shapes[i] != want {
        return Err(op.invalid(format!(
            "result {i} is declared {:?} but the op gives {want:?}",
            op.out_shapes[i]
        )));
    }
    Ok(())
}

/// `%tN = arith.constant n : index`.
fn index_const(e: &mut Emitter, n: i64) -> String {
    e.op(format!("arith.constant {n} : index"))
}

/// A `tensor.extract_slice` with static offsets, sizes and (positive) strides, without a
/// copy: after bufferization a strided view of `src`, only fit as the input of a
/// `linalg.generic` (a `memref.copy` of a strided view would need the MLIR runtime
/// library's `memrefCopy`, which a `module.so` does not link).
fn view(
    e: &mut Emitter,
    src: &str,
    from: &[u64],
    offsets: &[u64],
    sizes: &[u64],
    strides: &[u64],
    d: DType,
) -> String {
    if offsets.iter().all(|&o| o == 0) && sizes == from && strides.iter().all(|&s| s == 1) {
        return src.to_string();
    }
    e.op(format!(
        "tensor.extract_slice {src}[{}] [{}] [{}] : {} to {}",
        list(offsets),
        list(sizes),
        list(strides),
        tensor_type(from, d),
        tensor_type(sizes, d)
    ))
}

/// The input map reading `shape` reversed along the axes in `rev` (`n-1 - d`).
fn reversed_map(shape: &[u64], rev: &[bool]) -> Vec<String> {
    (0..shape.len())
        .map(|i| {
            if rev[i] && shape[i] > 1 {
                format!("{} - d{i}", shape[i] - 1)
            } else {
                format!("d{i}")
            }
        })
        .collect()
}

/// A `linalg.generic` copying `src` (read through `map`) into `init` (identity).
fn copy_into(
    e: &mut Emitter,
    src: &str,
    map: Vec<String>,
    init: &str,
    shape: &[u64],
    d: DType,
) -> String {
    let rank = shape.len();
    e.generic(
        rank,
        &vec![Iter::Parallel; rank],
        &[Operand::new(src, shape, d, map)],
        &[Operand::identity(init, shape, d)],
        &Body::default(),
        &["%in0".to_string()],
    )
    .remove(0)
}

/// A dense copy of `src` reversed along the axes in `rev` (`src` itself when nothing is
/// reversed and `copy` is false).
fn reverse(
    e: &mut Emitter,
    src: &str,
    shape: &[u64],
    rev: &[bool],
    copy: bool,
    d: DType,
) -> String {
    let any = (0..shape.len()).any(|i| rev[i] && shape[i] > 1);
    if !any && !copy {
        return src.to_string();
    }
    let init = e.empty(shape, d);
    copy_into(e, src, reversed_map(shape, rev), &init, shape, d)
}

/// `tensor.insert_slice` of `src` into `dest` at static offsets and strides, with the
/// copy done by a `linalg.generic` writing into the slice of `dest` (in place after
/// bufferization), and `src` read through `map`.
#[allow(clippy::too_many_arguments)]
fn insert(
    e: &mut Emitter,
    src: &str,
    map: Vec<String>,
    src_shape: &[u64],
    dest: &str,
    dest_shape: &[u64],
    offsets: &[u64],
    strides: &[u64],
    d: DType,
) -> String {
    let slice = view(e, dest, dest_shape, offsets, src_shape, strides, d);
    let copied = copy_into(e, src, map, &slice, src_shape, d);
    if slice == dest {
        return copied;
    }
    e.op(format!(
        "tensor.insert_slice {copied} into {dest}[{}] [{}] [{}] : {} into {}",
        list(offsets),
        list(src_shape),
        list(strides),
        tensor_type(src_shape, d),
        tensor_type(dest_shape, d)
    ))
}

fn identity_map(rank: usize) -> Vec<String> {
    (0..rank).map(|i| format!("d{i}")).collect()
}

/// The right-hand side of a scalar `arith.constant` of `lit` in dtype `d` (a bool
/// literal carries its type: `arith.constant true`, never `true : i1`).
fn const_rhs(d: DType, lit: &str) -> String {
    if d == DType::Bool {
        format!("arith.constant {lit}")
    } else {
        format!("arith.constant {lit} : {}", super::elem_type(d))
    }
}

/// A tensor of `shape` filled with the literal `lit` (`tensor.empty` + `linalg.fill`).
fn filled(e: &mut Emitter, shape: &[u64], d: DType, lit: &str) -> String {
    let ty = tensor_type(shape, d);
    let c = e.op(const_rhs(d, lit));
    let empty = e.empty(shape, d);
    e.op(format!(
        "linalg.fill ins({c} : {}) outs({empty} : {ty}) -> {ty}",
        super::elem_type(d)
    ))
}

fn zeros(e: &mut Emitter, shape: &[u64], d: DType) -> String {
    filled(e, shape, d, &literal(d, 0.0))
}

/// The fill value of `pad` in dtype `d`, converted as the interpreter does (`value as
/// i64`, wrapped to the integer type; bool is `!= 0` of that).
fn fill_literal(d: DType, value: f64) -> String {
    match d {
        d if d.is_float() => literal(d, value),
        d => super::int_literal(d, ppir::tensor::wrap_int(d, value as i64)),
    }
}

/// The interpreter's `cast` of a constant's value to the declared result dtype.
fn cast_tensor(t: &Tensor, to: DType) -> Tensor {
    use ppir::tensor::wrap_int;
    let data = match &t.data {
        TensorData::Float(v) if to.is_float() => TensorData::Float(v.clone()),
        TensorData::Float(v) if to == DType::Bool => {
            TensorData::Int(v.iter().map(|&a| (a != 0.0) as i64).collect())
        }
        TensorData::Float(v) => {
            TensorData::Int(v.iter().map(|&a| wrap_int(to, a.trunc() as i64)).collect())
        }
        TensorData::Int(v) if to.is_float() => {
            TensorData::Float(v.iter().map(|&a| a as f64).collect())
        }
        TensorData::Int(v) => TensorData::Int(v.iter().map(|&a| wrap_int(to, a)).collect()),
    };
    Tensor {
        dtype: to,
        shape: t.shape.clone(),
        data,
    }
}

// ---- ops ----

fn transpose(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let x = &op.in_shapes[0];
    let d = op.in_dtypes[0];
    let rank = x.len();
    let perm = match op.attrs::<TransposeAttrs>()?.perm {
        Some(p) => p,
        None => (0..rank as i64).rev().collect(),
    };
    if perm.len() != rank {
        return Err(op.invalid(format!("`perm` {perm:?} must have {rank} entries")));
    }
    let mut p = Vec::with_capacity(rank);
    for a in perm {
        let a = op.axis(a, rank)?;
        if p.contains(&a) {
            return Err(op.invalid(format!("axis {a} listed twice in `perm`")));
        }
        p.push(a);
    }
    let out: Vec<u64> = p.iter().map(|&a| x[a]).collect();
    check_out(op, 0, &out)?;
    let src = e.name(op.op.operands()[0]);
    if numel(&out) == 0 {
        return Ok(vec![e.empty(&out, d)]);
    }
    // Moving only size-1 axes keeps the row-major order: a reshape.
    let moved: Vec<usize> = p.iter().copied().filter(|&a| x[a] != 1).collect();
    if moved.windows(2).all(|w| w[0] < w[1]) {
        return Ok(vec![e.reshape(&src, x, &out, d)]);
    }
    let ty = tensor_type(&out, d);
    let init = e.empty(&out, d);
    let r = e.op(format!(
        "linalg.transpose ins({src} : {}) outs({init} : {ty}) permutation = [{}]",
        tensor_type(x, d),
        list(&p)
    ));
    Ok(vec![r])
}

fn constant(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let t = ConstantAttrs::value_ref(&op.op.attrs).map_err(|x| op.attr_err(x))?;
    let d = op.out_dtypes[0];
    let shape: Vec<u64> = t.shape.iter().map(|&s| s as u64).collect();
    check_out(op, 0, &shape)?;
    let consistent = t.data.len() == t.shape.iter().product::<usize>()
        && matches!(
            (&t.data, t.dtype.is_float()),
            (TensorData::Float(_), true) | (TensorData::Int(_), false)
        );
    if !consistent {
        return Err(op.invalid("`value` is a malformed tensor"));
    }
    if numel(&shape) == 0 {
        return Ok(vec![e.empty(&shape, d)]);
    }
    let lit = if t.dtype == d {
        dense_literal(t)
    } else {
        dense_literal(&cast_tensor(t, d))
    };
    Ok(vec![e.constant_tensor(&lit, &shape, d)])
}

fn concat(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let d = op.out_dtypes[0];
    let first = &op.in_shapes[0];
    let rank = first.len();
    let axis = op.axis(op.attrs::<ConcatAttrs>()?.axis, rank)?;
    for (i, s) in op.in_shapes.iter().enumerate() {
        if s.len() != rank || (0..rank).any(|a| a != axis && s[a] != first[a]) {
            return Err(op.invalid(format!(
                "operand {i} of shape {s:?} does not match operand 0 of shape {first:?} outside axis {axis}"
            )));
        }
    }
    let mut out = first.clone();
    out[axis] = op.in_shapes.iter().map(|s| s[axis]).sum();
    check_out(op, 0, &out)?;
    let names: Vec<String> = op.op.operands().iter().map(|&v| e.name(v)).collect();
    if numel(&out) == 0 {
        return Ok(vec![e.empty(&out, d)]);
    }
    if let Some(i) = op.in_shapes.iter().position(|s| *s == out) {
        // One operand is the whole result (the others are empty).
        return Ok(vec![names[i].clone()]);
    }
    let mut acc = e.empty(&out, d);
    let mut offsets = vec![0u64; rank];
    let strides = vec![1u64; rank];
    for (name, s) in names.iter().zip(&op.in_shapes) {
        if s[axis] == 0 {
            continue;
        }
        acc = insert(
            e,
            name,
            identity_map(rank),
            s,
            &acc,
            &out,
            &offsets,
            &strides,
            d,
        );
        offsets[axis] += s[axis];
    }
    Ok(vec![acc])
}

fn split(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let d = op.in_dtypes[0];
    let x = &op.in_shapes[0];
    let rank = x.len();
    let SplitAttrs { axis, split: sizes } = op.attrs()?;
    let axis = op.axis(axis, rank)?;
    if sizes.len() != op.out_shapes.len() {
        return Err(op.invalid(format!(
            "`split` has {} sizes but the op declares {} results",
            sizes.len(),
            op.out_shapes.len()
        )));
    }
    let total = sizes.iter().try_fold(0u64, |a, &s| {
        u64::try_from(s).ok().and_then(|s| a.checked_add(s))
    });
    if total != Some(x[axis]) {
        return Err(op.invalid(format!(
            "split sizes {sizes:?} do not add up to dimension {axis} of size {}",
            x[axis]
        )));
    }
    let src = e.name(op.op.operands()[0]);
    let mut start = 0u64;
    let mut names = Vec::with_capacity(sizes.len());
    for (i, &s) in sizes.iter().enumerate() {
        let mut shape = x.clone();
        shape[axis] = s as u64;
        check_out(op, i, &shape)?;
        if numel(&shape) == 0 {
            names.push(e.empty(&shape, d));
        } else {
            let mut offsets = vec![0u64; rank];
            offsets[axis] = start;
            let v = view(e, &src, x, &offsets, &shape, &vec![1; rank], d);
            let keep = vec![false; rank];
            names.push(reverse(e, &v, &shape, &keep, v != src, d));
        }
        start += s as u64;
    }
    Ok(names)
}

/// One axis of a slice: the result reads input coordinates `start + t·step` for
/// `t` in `0..count`.
#[derive(Clone, Copy, Debug)]
struct SliceAxis {
    start: i64,
    step: i64,
    count: u64,
}

impl SliceAxis {
    /// The stride of the positive-stride slice (1 when a single element is read, so that
    /// a step of `i64::MIN` never reaches MLIR).
    fn stride(&self) -> u64 {
        if self.count <= 1 {
            1
        } else {
            self.step.unsigned_abs()
        }
    }

    /// The smallest input coordinate read (the offset of the positive-stride slice).
    fn low(&self) -> u64 {
        if self.step > 0 || self.count == 0 {
            self.start as u64
        } else {
            (self.start as u64) - (self.count - 1) * self.step.unsigned_abs()
        }
    }
}

/// Per axis of an input of `in_shape`, the slice geometry (ONNX rules, as the
/// interpreter's `slice_maps`): negative starts/ends count from the end, then starts clamp
/// to `[0, d]` (`[0, d-1]` for negative steps) and ends to `[0, d]` (`[-1, d-1]`).
fn slice_axes(op: &OpView, a: SliceAttrs, in_shape: &[u64]) -> Result<Vec<SliceAxis>, LowerError> {
    let rank = in_shape.len();
    let SliceAttrs {
        starts,
        ends,
        axes,
        steps,
    } = a;
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err(op.invalid(format!(
            "`starts` {starts:?}, `ends` {ends:?}, `axes` {axes:?} and `steps` {steps:?} must have the same length"
        )));
    }
    let mut geo: Vec<SliceAxis> = in_shape
        .iter()
        .map(|&d| SliceAxis {
            start: 0,
            step: 1,
            count: d,
        })
        .collect();
    let mut seen = Vec::with_capacity(axes.len());
    for (i, &a) in axes.iter().enumerate() {
        let axis = op.axis(a, rank)?;
        if seen.contains(&axis) {
            return Err(op.invalid(format!("axis {axis} listed twice in {axes:?}")));
        }
        seen.push(axis);
        let d =
            i64::try_from(in_shape[axis]).map_err(|_| op.unsupported(" (dimension too large)"))?;
        let step = steps[i];
        if step == 0 {
            return Err(op.invalid(format!("slice step for axis {axis} is 0")));
        }
        let resolve = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
        let (start, end) = (resolve(starts[i]), resolve(ends[i]));
        let (start, end) = if step > 0 {
            (start.clamp(0, d), end.clamp(0, d))
        } else {
            (start.clamp(0, (d - 1).max(0)), end.clamp(-1, d - 1))
        };
        let span = if step > 0 { end - start } else { start - end };
        let count = if span > 0 && d > 0 {
            (span as u64 - 1) / step.unsigned_abs() + 1
        } else {
            0
        };
        geo[axis] = SliceAxis { start, step, count };
    }
    Ok(geo)
}

fn slice(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let d = op.in_dtypes[0];
    let x = &op.in_shapes[0];
    let geo = slice_axes(op, op.attrs()?, x)?;
    let out: Vec<u64> = geo.iter().map(|g| g.count).collect();
    check_out(op, 0, &out)?;
    if numel(&out) == 0 {
        return Ok(vec![e.empty(&out, d)]);
    }
    let src = e.name(op.op.operands()[0]);
    let offsets: Vec<u64> = geo.iter().map(|g| g.low()).collect();
    let strides: Vec<u64> = geo.iter().map(|g| g.stride()).collect();
    let s = view(e, &src, x, &offsets, &out, &strides, d);
    let rev: Vec<bool> = geo.iter().map(|g| g.step < 0).collect();
    Ok(vec![reverse(e, &s, &out, &rev, s != src, d)])
}

fn slice_grad(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let d = op.in_dtypes[0];
    if !d.is_float() {
        return Err(op.invalid(format!("dy must be a float tensor, got {d}")));
    }
    let a: SliceGradAttrs = op.attrs()?;
    let input_shape = &a.input_shape;
    if input_shape.iter().any(|&s| s < 0) {
        return Err(op.invalid(format!(
            "`input_shape` must be non-negative sizes, got {input_shape:?}"
        )));
    }
    let x: Vec<u64> = input_shape.iter().map(|&s| s as u64).collect();
    check_out(op, 0, &x)?;
    let geo = slice_axes(op, SliceAttrs::of_grad(&a), &x)?;
    let dy_shape: Vec<u64> = geo.iter().map(|g| g.count).collect();
    if op.in_shapes[0] != dy_shape {
        return Err(op.invalid(format!(
            "dy has shape {:?}, the slice gives {dy_shape:?}",
            op.in_shapes[0]
        )));
    }
    let dy = e.name(op.op.operands()[0]);
    if numel(&x) == 0 {
        return Ok(vec![e.empty(&x, d)]);
    }
    if numel(&dy_shape) == 0 {
        return Ok(vec![zeros(e, &x, d)]);
    }
    let rev: Vec<bool> = geo.iter().map(|g| g.step < 0).collect();
    if dy_shape == x {
        // The slice read everything: dx is dy (reversed where the slice reversed).
        return Ok(vec![reverse(e, &dy, &dy_shape, &rev, false, d)]);
    }
    let zeros = zeros(e, &x, d);
    let offsets: Vec<u64> = geo.iter().map(|g| g.low()).collect();
    let strides: Vec<u64> = geo.iter().map(|g| g.stride()).collect();
    let map = reversed_map(&dy_shape, &rev);
    Ok(vec![insert(
        e, &dy, map, &dy_shape, &zeros, &x, &offsets, &strides, d,
    )])
}

/// Body lines turning the integer index `idx` (of `idx_ty`) into a coordinate along an
/// axis of size `n`: negative values count from the end. Returns `(coordinate, in_range)`;
/// the coordinate is clamped to 0 when out of range, so it is always safe to use.
fn wrap_index(
    mut op: impl FnMut(String) -> String,
    idx: &str,
    idx_ty: &str,
    n: u64,
) -> (String, String) {
    let i = op(format!("arith.index_cast {idx} : {idx_ty} to index"));
    let zero = op("arith.constant 0 : index".into());
    let size = op(format!("arith.constant {n} : index"));
    let neg = op(format!("arith.cmpi slt, {i}, {zero} : index"));
    let wrapped = op(format!("arith.addi {i}, {size} : index"));
    let j = op(format!("arith.select {neg}, {wrapped}, {i} : index"));
    let lo = op(format!("arith.cmpi sge, {j}, {zero} : index"));
    let hi = op(format!("arith.cmpi slt, {j}, {size} : index"));
    let ok = op(format!("arith.andi {lo}, {hi} : i1"));
    let safe = op(format!("arith.select {ok}, {j}, {zero} : index"));
    (safe, ok)
}

fn index_dtype(op: &OpView, t: DType) -> Result<&'static str, LowerError> {
    if !t.is_int() {
        return Err(op.invalid(format!("indices must be an integer tensor, got {t}")));
    }
    Ok(super::elem_type(t))
}

fn gather(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let d = op.in_dtypes[0];
    let data = &op.in_shapes[0];
    let q = &op.in_shapes[1];
    let ity = index_dtype(op, op.in_dtypes[1])?;
    if data.is_empty() {
        return Err(op.invalid("data must have rank >= 1"));
    }
    let axis = op.axis(op.attrs::<GatherAttrs>()?.axis, data.len())?;
    let mut out = data[..axis].to_vec();
    out.extend_from_slice(q);
    out.extend_from_slice(&data[axis + 1..]);
    check_out(op, 0, &out)?;
    if numel(&out) == 0 {
        return Ok(vec![e.empty(&out, d)]);
    }
    if data[axis] == 0 {
        // Every index is out of range (the interpreter reports an error): zeros.
        return Ok(vec![zeros(e, &out, d)]);
    }
    let src = e.name(op.op.operands()[0]);
    let indices = e.name(op.op.operands()[1]);
    let rank = out.len();
    let qr = q.len();
    let idx_map = (axis..axis + qr).map(|i| format!("d{i}")).collect();
    let mut b = Body::default();
    let (j, ok) = wrap_index(|s| b.op(s), "%in0", ity, data[axis]);
    let mut coords = Vec::with_capacity(data.len());
    for m in 0..data.len() {
        coords.push(match m {
            m if m < axis => b.op(format!("linalg.index {m} : index")),
            m if m == axis => j.clone(),
            m => b.op(format!("linalg.index {} : index", m - 1 + qr)),
        });
    }
    let v = b.op(format!(
        "tensor.extract {src}[{}] : {}",
        coords.join(", "),
        tensor_type(data, d)
    ));
    let zero = b.op(const_rhs(d, &literal(d, 0.0)));
    let y = b.op(format!(
        "arith.select {ok}, {v}, {zero} : {}",
        super::elem_type(d)
    ));
    let init = e.empty(&out, d);
    Ok(e.generic(
        rank,
        &vec![Iter::Parallel; rank],
        &[Operand::new(indices, q, op.in_dtypes[1], idx_map)],
        &[Operand::identity(init, &out, d)],
        &b,
        &[y],
    ))
}

/// Elementwise float conversion (`arith.extf` / `arith.truncf`).
fn convert_float(e: &mut Emitter, src: &str, shape: &[u64], from: DType, to: DType) -> String {
    let rank = shape.len();
    let mut b = Body::default();
    let how = if from.size_bytes() < to.size_bytes() {
        "arith.extf"
    } else {
        "arith.truncf"
    };
    let y = b.op(format!(
        "{how} %in0 : {} to {}",
        super::elem_type(from),
        super::elem_type(to)
    ));
    let init = e.empty(shape, to);
    e.generic(
        rank,
        &vec![Iter::Parallel; rank],
        &[Operand::identity(src, shape, from)],
        &[Operand::identity(init, shape, to)],
        &b,
        &[y],
    )
    .remove(0)
}

fn gather_grad(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let d = op.out_dtypes[0];
    if !d.is_float() {
        return Err(op.invalid(format!("dy must be a float tensor, got {d}")));
    }
    let ity = index_dtype(op, op.in_dtypes[0])?;
    let q = &op.in_shapes[0];
    let dy_shape = &op.in_shapes[1];
    let GatherGradAttrs { axis, data_shape } = op.attrs()?;
    if data_shape.is_empty() || data_shape.iter().any(|&s| s < 0) {
        return Err(op.invalid(format!(
            "`data_shape` must be non-negative sizes of rank >= 1, got {data_shape:?}"
        )));
    }
    let data: Vec<u64> = data_shape.iter().map(|&s| s as u64).collect();
    check_out(op, 0, &data)?;
    let axis = op.axis(axis, data.len())?;
    let mut want = data[..axis].to_vec();
    want.extend_from_slice(q);
    want.extend_from_slice(&data[axis + 1..]);
    if *dy_shape != want {
        return Err(op.invalid(format!(
            "dy has shape {dy_shape:?}, the gather gives {want:?}"
        )));
    }
    if numel(&data) == 0 {
        return Ok(vec![e.empty(&data, d)]);
    }
    let outer = numel(&data[..axis]);
    let inner = numel(&data[axis + 1..]);
    let k = numel(q);
    if k == 0 {
        return Ok(vec![zeros(e, &data, d)]);
    }
    // Accumulate half-precision gradients in f32 (the interpreter sums in f64 and rounds
    // once).
    let acc_t = match d {
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    };
    let dy = e.name(op.op.operands()[1]);
    let indices = e.name(op.op.operands()[0]);
    let dy3_shape = [outer, k, inner];
    let acc_shape = [outer, data[axis], inner];
    let mut dy3 = e.reshape(&dy, dy_shape, &dy3_shape, d);
    if acc_t != d {
        dy3 = convert_float(e, &dy3, &dy3_shape, d, acc_t);
    }
    let idx1 = e.reshape(&indices, q, &[k], op.in_dtypes[0]);
    let zeros = zeros(e, &acc_shape, acc_t);
    let parts = GatherGradParts {
        dy3: &dy3,
        dy3_shape: &dy3_shape,
        indices: &idx1,
        index_dtype: op.in_dtypes[0],
        ity,
        zeros: &zeros,
        acc_shape: &acc_shape,
        acc_t,
    };
    let r = if e.loops_for_gpu {
        gather_grad_columns(e, &parts)
    } else {
        gather_grad_rows(e, &parts)
    };
    let mut out = e.reshape(&r, &acc_shape, &data, acc_t);
    if acc_t != d {
        out = convert_float(e, &out, &data, acc_t, d);
    }
    Ok(vec![out])
}

/// `gather_grad` for the CPU: a loop over the indices adding each `dy` slab
/// (`[outer, 1, inner]`) into its row of the accumulator, in order.
fn gather_grad_rows(e: &mut Emitter, g: &GatherGradParts) -> String {
    let [outer, k, inner] = *g.dy3_shape;
    let (dy3, dy3_shape, idx1, zeros, acc_t) = (g.dy3, g.dy3_shape, g.indices, g.zeros, g.acc_t);
    let slab = [outer, 1, inner];
    let c0 = index_const(e, 0);
    let c1 = index_const(e, 1);
    let ck = index_const(e, k as i64);
    let acc_ty = tensor_type(g.acc_shape, acc_t);
    let slab_ty = tensor_type(&slab, acc_t);
    let (iv, acc) = (e.fresh(), e.fresh());
    let r = e.fresh();
    e.line(format!(
        "{r} = scf.for {iv} = {c0} to {ck} step {c1} iter_args({acc} = {zeros}) -> ({acc_ty}) {{"
    ));
    let raw = e.op(format!(
        "tensor.extract {idx1}[{iv}] : {}",
        tensor_type(&[k], g.index_dtype)
    ));
    let (j, ok) = wrap_index(|s| e.op(s), &raw, g.ity, g.acc_shape[1]);
    let next = e.fresh();
    e.line(format!("{next} = scf.if {ok} -> ({acc_ty}) {{"));
    let src = e.op(format!(
        "tensor.extract_slice {dy3}[0, {iv}, 0] [{}] [1, 1, 1] : {} to {slab_ty}",
        list(&slab),
        tensor_type(dy3_shape, acc_t)
    ));
    let dst = e.op(format!(
        "tensor.extract_slice {acc}[0, {j}, 0] [{}] [1, 1, 1] : {acc_ty} to {slab_ty}",
        list(&slab)
    ));
    let mut b = Body::default();
    let s = b.op(format!(
        "arith.addf %out0, %in0 : {}",
        super::elem_type(acc_t)
    ));
    let sum = e
        .generic(
            3,
            &[Iter::Parallel; 3],
            &[Operand::identity(src, &slab, acc_t)],
            &[Operand::identity(dst, &slab, acc_t)],
            &b,
            &[s],
        )
        .remove(0);
    let upd = e.op(format!(
        "tensor.insert_slice {sum} into {acc}[0, {j}, 0] [{}] [1, 1, 1] : {slab_ty} into {acc_ty}",
        list(&slab)
    ));
    e.line(format!("scf.yield {upd} : {acc_ty}"));
    e.line("} else {");
    e.line(format!("scf.yield {acc} : {acc_ty}"));
    e.line("}");
    e.line(format!("scf.yield {next} : {acc_ty}"));
    e.line("}");
    r
}

/// What [`gather_grad_rows`] and [`gather_grad_columns`] sum: `dy3` (`[outer, k, inner]`)
/// into rows `indices[n]` of a `[outer, rows, inner]` accumulator that starts as `zeros`.
struct GatherGradParts<'a> {
    dy3: &'a str,
    dy3_shape: &'a [u64; 3],
    indices: &'a str,
    index_dtype: DType,
    ity: &'a str,
    zeros: &'a str,
    acc_shape: &'a [u64; 3],
    acc_t: DType,
}

/// `gather_grad` for the GPU: one parallel loop over the accumulator's columns
/// `(outer, inner)` (`scf.forall`, bufferized in place into the result), each summing its
/// column over the indices in order, so every element adds in the order the host loop
/// does (the same bits). The CPU's form is a host loop over the indices around a loop
/// over the slab, which on the GPU is a launch per index (512 a call for the embedding of
/// a GPT's 4×128 tokens).
fn gather_grad_columns(e: &mut Emitter, g: &GatherGradParts) -> String {
    let [outer, k, inner] = *g.dy3_shape;
    let rows = g.acc_shape[1];
    let acc_ty = tensor_type(g.acc_shape, g.acc_t);
    let col_ty = tensor_type(&[rows], g.acc_t);
    let elem = super::elem_type(g.acc_t);
    let c0 = index_const(e, 0);
    let c1 = index_const(e, 1);
    let ck = index_const(e, k as i64);
    let (o, i, acc, r) = (e.fresh(), e.fresh(), e.fresh(), e.fresh());
    e.line(format!(
        "{r} = scf.forall ({o}, {i}) in ({outer}, {inner}) shared_outs({acc} = {}) -> ({acc_ty}) {{",
        g.zeros
    ));
    let col = e.op(format!(
        "tensor.extract_slice {acc}[{o}, 0, {i}] [1, {rows}, 1] [1, 1, 1] : {acc_ty} to {col_ty}"
    ));
    let (n, c, summed) = (e.fresh(), e.fresh(), e.fresh());
    e.line(format!(
        "{summed} = scf.for {n} = {c0} to {ck} step {c1} iter_args({c} = {col}) -> ({col_ty}) {{"
    ));
    let raw = e.op(format!(
        "tensor.extract {}[{n}] : {}",
        g.indices,
        tensor_type(&[k], g.index_dtype)
    ));
    let (j, ok) = wrap_index(|s| e.op(s), &raw, g.ity, rows);
    let next = e.fresh();
    e.line(format!("{next} = scf.if {ok} -> ({col_ty}) {{"));
    let dy = e.op(format!(
        "tensor.extract {}[{o}, {n}, {i}] : {}",
        g.dy3,
        tensor_type(g.dy3_shape, g.acc_t)
    ));
    let x = e.op(format!("tensor.extract {c}[{j}] : {col_ty}"));
    let sum = e.op(format!("arith.addf {x}, {dy} : {elem}"));
    let put = e.op(format!("tensor.insert {sum} into {c}[{j}] : {col_ty}"));
    e.line(format!("scf.yield {put} : {col_ty}"));
    e.line("} else {");
    e.line(format!("scf.yield {c} : {col_ty}"));
    e.line("}");
    e.line(format!("scf.yield {next} : {col_ty}"));
    e.line("}");
    e.line("scf.forall.in_parallel {");
    e.line(format!(
        "tensor.parallel_insert_slice {summed} into {acc}[{o}, 0, {i}] [1, {rows}, 1] [1, 1, 1] : {col_ty} into {acc_ty}"
    ));
    e.line("}");
    e.line("}");
    r
}

fn expand(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let d = op.in_dtypes[0];
    let x = &op.in_shapes[0];
    let spec = op.attrs::<ShapeAttrs>()?.shape;
    if spec.iter().any(|&s| s < 0) {
        return Err(op.invalid(format!("`shape` {spec:?} has a negative size")));
    }
    let spec: Vec<u64> = spec.iter().map(|&s| s as u64).collect();
    // Bidirectional (numpy) broadcasting of x's shape and `shape`.
    let rank = x.len().max(spec.len());
    let padded = |s: &[u64]| {
        let mut v = vec![1u64; rank - s.len()];
        v.extend_from_slice(s);
        v
    };
    let (xs, ss) = (padded(x), padded(&spec));
    let mut out = Vec::with_capacity(rank);
    for (&a, &b) in xs.iter().zip(&ss) {
        out.push(match (a, b) {
            (a, 1) => a,
            (1, b) => b,
            (a, b) if a == b => a,
            _ => {
                return Err(op.invalid(format!("cannot broadcast {x:?} with shape {spec:?}")));
            }
        });
    }
    check_out(op, 0, &out)?;
    let src = e.name(op.op.operands()[0]);
    if numel(&out) == 0 {
        return Ok(vec![e.empty(&out, d)]);
    }
    if numel(x) == numel(&out) {
        return Ok(vec![e.reshape(&src, x, &out, d)]);
    }
    let map = super::contraction::batch_map(x, &out);
    let init = e.empty(&out, d);
    Ok(e.generic(
        rank,
        &vec![Iter::Parallel; rank],
        &[Operand::new(src, x, d, map)],
        &[Operand::identity(init, &out, d)],
        &Body::default(),
        &["%in0".to_string()],
    ))
}

fn tile(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let d = op.in_dtypes[0];
    let x = &op.in_shapes[0];
    let rank = x.len();
    let repeats = op.attrs::<TileAttrs>()?.repeats;
    if repeats.len() != rank || repeats.iter().any(|&r| r < 0) {
        return Err(op.invalid(format!(
            "`repeats` {repeats:?} must be one non-negative count per dimension of x (rank {rank})"
        )));
    }
    let reps: Vec<u64> = repeats.iter().map(|&r| r as u64).collect();
    let out = x
        .iter()
        .zip(&reps)
        .map(|(&a, &r)| a.checked_mul(r))
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| op.invalid(format!("repeats {repeats:?} overflow the shape {x:?}")))?;
    check_out(op, 0, &out)?;
    let src = e.name(op.op.operands()[0]);
    if numel(&out) == 0 {
        return Ok(vec![e.empty(&out, d)]);
    }
    if numel(&out) == numel(x) {
        return Ok(vec![e.reshape(&src, x, &out, d)]);
    }
    // out[.., r_i·d_i + o_i, ..] = x[.., o_i, ..]: a broadcast into [r0, d0, r1, d1, ..]
    // followed by a collapse of each (r_i, d_i) pair.
    let wide: Vec<u64> = x.iter().zip(&reps).flat_map(|(&a, &r)| [r, a]).collect();
    let map = (0..rank).map(|i| format!("d{}", 2 * i + 1)).collect();
    let init = e.empty(&wide, d);
    let w = e
        .generic(
            2 * rank,
            &vec![Iter::Parallel; 2 * rank],
            &[Operand::new(src, x, d, map)],
            &[Operand::identity(init, &wide, d)],
            &Body::default(),
            &["%in0".to_string()],
        )
        .remove(0);
    let groups: Vec<String> = (0..rank)
        .map(|i| format!("[{}, {}]", 2 * i, 2 * i + 1))
        .collect();
    let r = e.op(format!(
        "tensor.collapse_shape {w} [{}] : {} into {}",
        groups.join(", "),
        tensor_type(&wide, d),
        tensor_type(&out, d)
    ));
    Ok(vec![r])
}

fn pad(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let d = op.in_dtypes[0];
    let x = &op.in_shapes[0];
    let rank = x.len();
    let PadAttrs { pads, mode, value } = op.attrs()?;
    if pads.len() != 2 * rank {
        return Err(op.invalid(format!(
            "`pads` must have {} entries (begins then ends), got {pads:?}",
            2 * rank
        )));
    }
    if !matches!(mode.as_str(), "constant" | "reflect" | "edge") {
        return Err(op.invalid(format!(
            "`mode` must be \"constant\", \"reflect\" or \"edge\", got \"{mode}\""
        )));
    }
    let mut out = Vec::with_capacity(rank);
    for (axis, &n) in x.iter().enumerate() {
        let (pb, pe) = (pads[axis], pads[rank + axis]);
        let len = i64::try_from(n)
            .ok()
            .and_then(|n| n.checked_add(pb))
            .and_then(|v| v.checked_add(pe))
            .filter(|&v| v >= 0)
            .ok_or_else(|| {
                op.invalid(format!(
                    "pads {pb} and {pe} do not fit the {n} elements of axis {axis}"
                ))
            })?;
        if len > 0 && n == 0 && mode != "constant" {
            return Err(op.invalid(format!("cannot {mode}-pad axis {axis} of size 0")));
        }
        out.push(len as u64);
    }
    check_out(op, 0, &out)?;
    let src = e.name(op.op.operands()[0]);
    if numel(&out) == 0 {
        return Ok(vec![e.empty(&out, d)]);
    }
    if pads.iter().all(|&p| p == 0) {
        return Ok(vec![src]);
    }
    if mode == "constant" {
        let filled = filled(e, &out, d, &fill_literal(d, value));
        // The part of x that survives cropping, and where it lands.
        let mut crop = Vec::with_capacity(rank);
        let mut keep = Vec::with_capacity(rank);
        let mut dest = Vec::with_capacity(rank);
        for (axis, &n) in x.iter().enumerate() {
            let (pb, pe) = (pads[axis], pads[rank + axis]);
            let cb = pb.saturating_neg().max(0) as u64;
            let ce = pe.saturating_neg().max(0) as u64;
            if cb + ce >= n {
                return Ok(vec![filled]);
            }
            crop.push(cb);
            keep.push(n - cb - ce);
            dest.push(pb.max(0) as u64);
        }
        let ones = vec![1u64; rank];
        let inner = view(e, &src, x, &crop, &keep, &ones, d);
        let map = identity_map(rank);
        return Ok(vec![insert(
            e, &inner, map, &keep, &filled, &out, &dest, &ones, d,
        )]);
    }
    // reflect / edge: compute the source coordinate of every result element per axis.
    let mut b = Body::default();
    let mut coords = Vec::with_capacity(rank);
    for (axis, &n) in x.iter().enumerate() {
        let (pb, pe) = (pads[axis], pads[rank + axis]);
        let o = b.op(format!("linalg.index {axis} : index"));
        if pb == 0 && pe <= 0 {
            coords.push(o);
            continue;
        }
        let n = n as i64;
        if n == 1 {
            coords.push(b.op("arith.constant 0 : index"));
            continue;
        }
        let shift = b.op(format!("arith.constant {pb} : index"));
        let s = b.op(format!("arith.subi {o}, {shift} : index"));
        let zero = b.op("arith.constant 0 : index");
        let c = if mode == "edge" {
            let last = b.op(format!("arith.constant {} : index", n - 1));
            let lo = b.op(format!("arith.maxsi {s}, {zero} : index"));
            b.op(format!("arith.minsi {lo}, {last} : index"))
        } else {
            // numpy "reflect": a triangle wave of period 2(n-1).
            let period = b.op(format!("arith.constant {} : index", 2 * (n - 1)));
            let size = b.op(format!("arith.constant {n} : index"));
            let r = b.op(format!("arith.remsi {s}, {period} : index"));
            let neg = b.op(format!("arith.cmpi slt, {r}, {zero} : index"));
            let rp = b.op(format!("arith.addi {r}, {period} : index"));
            let m = b.op(format!("arith.select {neg}, {rp}, {r} : index"));
            let back = b.op(format!("arith.subi {period}, {m} : index"));
            let fwd = b.op(format!("arith.cmpi slt, {m}, {size} : index"));
            b.op(format!("arith.select {fwd}, {m}, {back} : index"))
        };
        coords.push(c);
    }
    let v = b.op(format!(
        "tensor.extract {src}[{}] : {}",
        coords.join(", "),
        tensor_type(x, d)
    ));
    let init = e.empty(&out, d);
    Ok(e.generic(
        rank,
        &vec![Iter::Parallel; rank],
        &[],
        &[Operand::identity(init, &out, d)],
        &b,
        &[v],
    ))
}
