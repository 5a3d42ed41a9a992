//! Reductions → `linalg.generic` with reduction iterators into a filled accumulator of the
//! non-kept shape; `keepdims` re-inserts the unit dimensions with `tensor.expand_shape`.
//!
//! Semantics follow `ppir::interp` exactly:
//!
//! * floats (f32, f64, f16, bf16; see [`float_ok`]): `reduce_sum` / `reduce_mean` accumulate in f64 (in the input's element order)
//!   and round once at the end, so an f32 result is the interpreter's bit for bit;
//!   `reduce_max` / `reduce_min` propagate NaN (`arith.maximumf` / `arith.minimumf`) from
//!   ∓inf; an empty reduction gives 0, NaN (mean), -inf (max), +inf (min).
//! * integers (i64, i32, i8): sums wrap in i64 and are truncated to the width at the end;
//!   `reduce_mean` divides the i64 sum by the count truncating toward zero; max / min in the
//!   element type. An empty max / min / mean is the interpreter's error, refused here.
//! * bool operands are refused (the interpreter rejects them too).
//!
//! The `pub(super)` helpers below (loop maps, f64 promotion inside bodies, pointwise and
//! reduction generics) are shared with [`super::norm`].

use ppir::ops::attrs::ReduceAttrs;
use ppir::{DType, OpKind};

use super::{elem_type, Body, Emitter, Iter, LowerError, OpView, Operand};

/// Sorted, deduplicated, non-negative `axes` (`[]` = all).
pub fn reduce_axes(op: &OpView, axes: &[i64], rank: usize) -> Result<Vec<usize>, LowerError> {
    if axes.is_empty() {
        return Ok((0..rank).collect());
    }
    let mut out = Vec::new();
    for &a in axes {
        let a = op.axis(a, rank)?;
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out.sort_unstable();
    Ok(out)
}

// ---- helpers shared with norm.rs ----

/// What a refusal of a float dtype says.
pub(super) const FLOATS: &str = "f32, f64, f16 and bf16 are lowered";

/// Float element types lowered by this family (computed in f64 inside the bodies). bf16
/// results are rounded with integer ops ([`from_f64`]): `arith.truncf` to bf16 is a call
/// to `__truncdfbf2`, which the libgcc a `module.so` resolves against may lack (f16's
/// `__truncdfhf2` is in libgcc ≥ 12).
pub(super) fn float_ok(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
}

/// The indexing-map results `d<i>` for the listed loop dimensions.
pub(super) fn dims_map(dims: impl IntoIterator<Item = usize>) -> Vec<String> {
    dims.into_iter().map(|i| format!("d{i}")).collect()
}

/// The loops of `0..rank` not in `axes` (the kept dimensions of a reduction).
pub(super) fn kept(rank: usize, axes: &[usize]) -> Vec<usize> {
    (0..rank).filter(|i| !axes.contains(i)).collect()
}

/// Promote a float body value of dtype `d` to f64.
pub(super) fn to_f64(b: &mut Body, v: &str, d: DType) -> String {
    if d == DType::F64 {
        v.to_string()
    } else {
        b.op(format!("arith.extf {v} : {} to f64", elem_type(d)))
    }
}

/// Round an f64 body value to the float dtype `d` (to nearest even, as the interpreter).
pub(super) fn from_f64(b: &mut Body, v: &str, d: DType) -> String {
    match d {
        DType::F64 => v.to_string(),
        DType::BF16 => super::elementwise::round_f64_in(b, v, d),
        _ => b.op(format!("arith.truncf {v} : f64 to {}", elem_type(d))),
    }
}

/// An f64 constant inside a body (exact: printed with 17 significant digits).
pub(super) fn f64c(b: &mut Body, x: f64) -> String {
    b.constant(DType::F64, x)
}

/// One all-parallel `linalg.generic` over `shape` writing a fresh tensor of `out`; `f`
/// builds the body from `%in<i>` and returns the yielded value.
pub(super) fn pointwise(
    e: &mut Emitter,
    shape: &[u64],
    inputs: &[Operand],
    out: DType,
    f: impl FnOnce(&mut Body) -> String,
) -> String {
    let init = e.empty(shape, out);
    let rank = shape.len();
    let mut b = Body::default();
    let y = f(&mut b);
    e.generic(
        rank,
        &vec![Iter::Parallel; rank],
        inputs,
        &[Operand::identity(init, shape, out)],
        &b,
        &[y],
    )
    .remove(0)
}

/// One `linalg.generic` over the loops of `shape` reducing the loops in `axes` into
/// accumulators `(dtype, initial value)` of the kept shape; `f` builds the body from
/// `%in<i>` / `%out<j>` and returns the new accumulator values. Elements are visited in
/// row-major order of `shape`, as the interpreter folds them.
pub(super) fn reduction(
    e: &mut Emitter,
    shape: &[u64],
    axes: &[usize],
    inputs: &[Operand],
    accs: &[(DType, f64)],
    f: impl FnOnce(&mut Body) -> Vec<String>,
) -> Vec<String> {
    let rank = shape.len();
    let keep = kept(rank, axes);
    let kept_shape: Vec<u64> = keep.iter().map(|&i| shape[i]).collect();
    let outs: Vec<Operand> = accs
        .iter()
        .map(|&(d, init)| {
            let t = e.filled(&kept_shape, d, init);
            Operand::new(t, &kept_shape, d, dims_map(keep.iter().copied()))
        })
        .collect();
    let iters: Vec<Iter> = (0..rank)
        .map(|i| {
            if axes.contains(&i) {
                Iter::Reduction
            } else {
                Iter::Parallel
            }
        })
        .collect();
    let mut b = Body::default();
    let ys = f(&mut b);
    // For the GPU, the kept dimensions are the outer loops and the reduced ones the inner
    // (see [`kept_first`]); the body must not read loop indices, which that renumbers. The
    // CPU keeps the reduced loops outer: its inner loop then runs along contiguous memory.
    if e.loops_for_gpu && !b.lines.iter().any(|l| l.contains("linalg.index")) {
        if let Some(order) = kept_first(rank, axes) {
            let ins: Vec<Operand> = inputs.iter().map(|o| renumber(o, &order)).collect();
            let outs: Vec<Operand> = outs.iter().map(|o| renumber(o, &order)).collect();
            let iters: Vec<Iter> = order.iter().map(|&d| iters[d]).collect();
            return e.generic(rank, &iters, &ins, &outs, &b, &ys);
        }
    }
    e.generic(rank, &iters, inputs, &outs, &b, &ys)
}

/// The loop order with the kept dimensions first and the reduced ones after (each group in
/// its own order), or `None` when a reduced dimension already comes after every kept one.
///
/// MLIR's `convert-linalg-to-parallel-loops` makes only the outermost parallel loops an
/// `scf.parallel`: a reduction over leading dimensions (a bias gradient, summing
/// `4×128×256` over the first two) became host loops over the reduced elements, each
/// launching a kernel over the kept ones (512 launches for one bias gradient; on an H100
/// these launches were most of the GPT's step, BENCHMARKS.md). Kept dimensions first make
/// it one kernel, a thread per output element looping over its inputs in their row-major
/// order, so every sum adds in the interpreter's order.
fn kept_first(rank: usize, axes: &[usize]) -> Option<Vec<usize>> {
    let keep = kept(rank, axes);
    let last_kept = *keep.last()?;
    if axes.iter().all(|&a| a > last_kept) {
        return None;
    }
    let mut reduced: Vec<usize> = axes.to_vec();
    reduced.sort_unstable();
    Some(keep.into_iter().chain(reduced).collect())
}

/// `o` with its map's loop dimensions renumbered for the loop order `order` (loop `i` of
/// the new order is dimension `order[i]` of the old).
fn renumber(o: &Operand, order: &[usize]) -> Operand {
    let mut new_of = vec![0; order.len()];
    for (i, &d) in order.iter().enumerate() {
        new_of[d] = i;
    }
    let map = o
        .map
        .iter()
        .map(|expr| {
            let mut out = String::new();
            let mut chars = expr.chars().peekable();
            let mut prev_ident = false;
            while let Some(c) = chars.next() {
                let digits_follow = chars.peek().is_some_and(|n| n.is_ascii_digit());
                if c == 'd' && !prev_ident && digits_follow {
                    let mut n = String::new();
                    while let Some(&d) = chars.peek().filter(|d| d.is_ascii_digit()) {
                        n.push(d);
                        chars.next();
                    }
                    // A dimension past the loops is left alone (the caller's map is wrong).
                    let i: usize = n.parse().unwrap_or(usize::MAX);
                    match new_of.get(i) {
                        Some(j) => out.push_str(&format!("d{j}")),
                        None => out.push_str(&format!("d{n}")),
                    }
                    prev_ident = true;
                    continue;
                }
                prev_ident = c.is_ascii_alphanumeric() || c == '_';
                out.push(c);
            }
            out
        })
        .collect();
    Operand { map, ..o.clone() }
}

// ---- the reductions ----

pub fn lower(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let d = op.in_dtypes[0];
    if op.out_dtypes[0] != d {
        return Err(op.invalid(format!(
            "result element type {} differs from the operand's {d}",
            op.out_dtypes[0]
        )));
    }
    let x = op.in_shapes[0].clone();
    let rank = x.len();
    let ReduceAttrs { axes, keepdims } = op.attrs()?;
    let axes = reduce_axes(op, &axes, rank)?;
    let reduced: Vec<u64> = kept(rank, &axes).iter().map(|&i| x[i]).collect();
    let want: Vec<u64> = if keepdims {
        (0..rank)
            .map(|i| if axes.contains(&i) { 1 } else { x[i] })
            .collect()
    } else {
        reduced.clone()
    };
    if op.out_shapes[0] != want {
        return Err(op.invalid(format!(
            "result shape {:?} is not the reduced shape {want:?}",
            op.out_shapes[0]
        )));
    }
    let count: u64 = axes.iter().map(|&a| x[a]).product();
    let out_len: u64 = reduced.iter().product();
    let src = e.name(op.op.operands()[0]);
    let input = Operand::identity(src.clone(), &x, d);
    let ty = elem_type(d);

    let r = if float_ok(d) {
        if rank == 0 {
            // Nothing to reduce: sum, mean, max and min of one element are the element.
            return Ok(vec![src]);
        }
        match op.kind {
            OpKind::ReduceSum | OpKind::ReduceMean => {
                let acc = reduction(e, &x, &axes, &[input], &[(DType::F64, 0.0)], |b| {
                    let v = to_f64(b, "%in0", d);
                    vec![b.op(format!("arith.addf %out0, {v} : f64"))]
                })
                .remove(0);
                let mean = op.kind == OpKind::ReduceMean;
                if !mean && d == DType::F64 {
                    acc
                } else {
                    let a = Operand::identity(acc, &reduced, DType::F64);
                    pointwise(e, &reduced, &[a], d, |b| {
                        let v = if mean {
                            let c = f64c(b, count as f64);
                            b.op(format!("arith.divf %in0, {c} : f64"))
                        } else {
                            "%in0".to_string()
                        };
                        from_f64(b, &v, d)
                    })
                }
            }
            OpKind::ReduceLogSumExp => super::norm::log_sum_exp(e, &src, &x, &axes, d),
            OpKind::ReduceMax | OpKind::ReduceMin => {
                let (init, f) = if op.kind == OpKind::ReduceMax {
                    (f64::NEG_INFINITY, "arith.maximumf")
                } else {
                    (f64::INFINITY, "arith.minimumf")
                };
                reduction(e, &x, &axes, &[input], &[(d, init)], |b| {
                    vec![b.op(format!("{f} %out0, %in0 : {ty}"))]
                })
                .remove(0)
            }
            _ => return Err(op.unsupported(" (not a reduction)")),
        }
    } else if d.is_int() {
        if count == 0
            && out_len > 0
            && matches!(
                op.kind,
                OpKind::ReduceMax | OpKind::ReduceMin | OpKind::ReduceMean
            )
        {
            return Err(op.invalid(format!(
                "{} of integers over an empty set of elements",
                op.kind
            )));
        }
        if rank == 0 {
            return Ok(vec![src]);
        }
        match op.kind {
            OpKind::ReduceSum | OpKind::ReduceMean => {
                // Wrapping i64 sum, then (mean) truncating division, then truncation to
                // the width: the interpreter's order, so narrow means see the full sum.
                let acc = reduction(e, &x, &axes, &[input], &[(DType::I64, 0.0)], |b| {
                    let v = if d == DType::I64 {
                        "%in0".to_string()
                    } else {
                        b.op(format!("arith.extsi %in0 : {ty} to i64"))
                    };
                    vec![b.op(format!("arith.addi %out0, {v} : i64"))]
                })
                .remove(0);
                let mean = op.kind == OpKind::ReduceMean;
                if !mean && d == DType::I64 {
                    acc
                } else {
                    let a = Operand::identity(acc, &reduced, DType::I64);
                    pointwise(e, &reduced, &[a], d, |b| {
                        let v = if mean {
                            let c = b.op(format!("arith.constant {count} : i64"));
                            b.op(format!("arith.divsi %in0, {c} : i64"))
                        } else {
                            "%in0".to_string()
                        };
                        if d == DType::I64 {
                            v
                        } else {
                            b.op(format!("arith.trunci {v} : i64 to {ty}"))
                        }
                    })
                }
            }
            OpKind::ReduceMax | OpKind::ReduceMin => {
                let bits = 8 * d.size_bytes() as u32;
                let (lo, hi) = (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1);
                let (init, f) = if op.kind == OpKind::ReduceMax {
                    (lo, "arith.maxsi")
                } else {
                    (hi, "arith.minsi")
                };
                let keep = kept(rank, &axes);
                let kept_shape: Vec<u64> = keep.iter().map(|&i| x[i]).collect();
                // Exact integer init (an f64 would round i64::MAX).
                let c = e.op(format!("arith.constant {init} : {ty}"));
                let empty = e.empty(&kept_shape, d);
                let tt = super::tensor_type(&kept_shape, d);
                let acc = e.op(format!(
                    "linalg.fill ins({c} : {ty}) outs({empty} : {tt}) -> {tt}"
                ));
                let iters: Vec<Iter> = (0..rank)
                    .map(|i| {
                        if axes.contains(&i) {
                            Iter::Reduction
                        } else {
                            Iter::Parallel
                        }
                    })
                    .collect();
                let mut b = Body::default();
                let y = b.op(format!("{f} %out0, %in0 : {ty}"));
                e.generic(
                    rank,
                    &iters,
                    &[input],
                    &[Operand::new(acc, &kept_shape, d, dims_map(keep))],
                    &b,
                    &[y],
                )
                .remove(0)
            }
            _ => return Err(op.unsupported(" (not a reduction)")),
        }
    } else if op.kind == OpKind::ReduceLogSumExp {
        return Err(op.invalid(format!("{} needs a float operand, got {d}", op.kind)));
    } else if d == DType::Bool {
        return Err(op.invalid("reductions need a numeric operand, got i1"));
    } else {
        return Err(op.unsupported(format!(" (dtype {d}; {FLOATS})")));
    };
    Ok(vec![if keepdims {
        e.reshape(&r, &reduced, &want, d)
    } else {
        r
    }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_dimensions_go_first_only_when_a_reduction_is_before_them() {
        // Bias gradient: 4×128×256 summed over the first two.
        assert_eq!(kept_first(3, &[0, 1]), Some(vec![2, 0, 1]));
        assert_eq!(kept_first(4, &[2, 0]), Some(vec![1, 3, 0, 2]));
        // Rows (layer norm, softmax) already reduce innermost.
        assert_eq!(kept_first(3, &[2]), None);
        assert_eq!(kept_first(3, &[1, 2]), None);
        // Everything reduced: nothing to keep.
        assert_eq!(kept_first(2, &[0, 1]), None);
    }

    #[test]
    fn maps_follow_the_new_loop_order() {
        let o = Operand::new(
            "%x",
            &[4, 8, 16],
            DType::F32,
            vec!["d0".into(), "d1 + d12".into(), "0".into()],
        );
        // New loop i is old dimension order[i]: d0 → d2, d1 → d0, d12 is past the loops.
        let r = renumber(&o, &[1, 2, 0]);
        assert_eq!(r.map, vec!["d2", "d0 + d12", "0"]);
        assert_eq!(
            (r.name.as_str(), r.shape.as_slice()),
            ("%x", &[4u64, 8, 16][..])
        );
    }
}
