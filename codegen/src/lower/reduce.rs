//! Reductions → `linalg.generic` with reduction iterators into a filled accumulator of the
//! non-kept shape; `keepdims` re-inserts the unit dimensions with `tensor.expand_shape`.

use ppir::{DType, OpKind};

use super::elementwise::{generic_elementwise, Scalar};
use super::{Body, Emitter, Iter, LowerError, OpView, Operand};

/// Sorted, deduplicated, non-negative axes (`[]` = all).
pub fn reduce_axes(op: &OpView, rank: usize) -> Result<Vec<usize>, LowerError> {
    let axes = op.ints_or("axes", vec![])?;
    if axes.is_empty() {
        return Ok((0..rank).collect());
    }
    let mut out = Vec::new();
    for a in axes {
        let a = op.axis(a, rank)?;
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out.sort_unstable();
    Ok(out)
}

pub fn lower(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let d = op.out_dtypes[0];
    if d != DType::F32 || !matches!(op.kind, OpKind::ReduceSum | OpKind::ReduceMean) {
        return Err(op.unsupported(format!(" (dtype {d})")));
    }
    let x = &op.in_shapes[0];
    let rank = x.len();
    let axes = reduce_axes(op, rank)?;
    let keepdims = op.int_or("keepdims", 1)? != 0;
    let reduced: Vec<u64> = (0..rank)
        .filter(|i| !axes.contains(i))
        .map(|i| x[i])
        .collect();
    let out_map: Vec<String> = (0..rank)
        .filter(|i| !axes.contains(i))
        .map(|i| format!("d{i}"))
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
    let acc = e.zeros(&reduced, d);
    let src = e.name(op.op.operands()[0]);
    let mut b = Body::default();
    let s = b.op("arith.addf %in0, %out0 : f32");
    let mut r = e
        .generic(
            rank,
            &iters,
            &[Operand::identity(src, x, d)],
            &[Operand::new(acc, &reduced, d, out_map)],
            &b,
            &[s],
        )
        .remove(0);
    if op.kind == OpKind::ReduceMean {
        let count: u64 = axes.iter().map(|&a| x[a]).product();
        r = generic_elementwise(
            e,
            &[(r, reduced.clone())],
            &reduced,
            d,
            &Scalar::Binary(
                OpKind::Div,
                Box::new(Scalar::Arg(0)),
                Box::new(Scalar::Const(count as f64)),
            ),
        )
        .map_err(|_| op.unsupported(""))?;
    }
    if keepdims {
        r = e.reshape(&r, &reduced, &op.out_shapes[0], d);
    }
    Ok(vec![r])
}
