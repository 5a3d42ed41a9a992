//! Elementwise ops → one `linalg.generic` each with all-parallel iterators.
//!
//! Operands broadcast with ppir's (numpy) rules: a size-1 operand dimension against a larger
//! result dimension indexes with the constant 0, missing leading dimensions are dropped
//! from the map. The body is built from a [`Scalar`] expression tree over the generic's
//! block arguments, so fusing a chain of elementwise ops means building one bigger tree.

use ppir::{DType, OpKind};

use super::{Body, Emitter, Iter, LowerError, OpView, Operand};

/// A scalar computation inside an elementwise `linalg.generic` body.
#[derive(Clone, Debug, PartialEq)]
pub enum Scalar {
    /// The i-th input block argument.
    Arg(usize),
    Const(f64),
    Unary(OpKind, Box<Scalar>),
    Binary(OpKind, Box<Scalar>, Box<Scalar>),
}

/// The indexing map of an operand of `shape` broadcast to `out` (numpy rules).
pub fn broadcast_map(shape: &[u64], out: &[u64]) -> Vec<String> {
    let lead = out.len() - shape.len();
    shape
        .iter()
        .enumerate()
        .map(|(j, &d)| {
            if d == 1 && out[lead + j] != 1 {
                "0".to_string()
            } else {
                format!("d{}", lead + j)
            }
        })
        .collect()
}

/// Emit `body` (over f32 arguments) into `b`; returns the SSA name of its value.
pub fn emit_scalar(e: &Scalar, b: &mut Body, d: DType) -> Result<String, OpKind> {
    let ty = super::elem_type(d);
    Ok(match e {
        Scalar::Arg(i) => format!("%in{i}"),
        Scalar::Const(c) => b.constant(d, *c),
        Scalar::Unary(kind, x) => {
            let a = emit_scalar(x, b, d)?;
            use OpKind::*;
            match kind {
                Identity => a,
                Relu => {
                    // ppir: `if a < 0 { 0 } else { a }` (NaN stays NaN).
                    let z = b.constant(d, 0.0);
                    let c = b.op(format!("arith.cmpf olt, {a}, {z} : {ty}"));
                    b.op(format!("arith.select {c}, {z}, {a} : {ty}"))
                }
                Sigmoid => {
                    let one = b.constant(d, 1.0);
                    let n = b.op(format!("arith.negf {a} : {ty}"));
                    let x = b.op(format!("math.exp {n} : {ty}"));
                    let s = b.op(format!("arith.addf {one}, {x} : {ty}"));
                    b.op(format!("arith.divf {one}, {s} : {ty}"))
                }
                Reciprocal => {
                    let one = b.constant(d, 1.0);
                    b.op(format!("arith.divf {one}, {a} : {ty}"))
                }
                Neg => b.op(format!("arith.negf {a} : {ty}")),
                Exp => b.op(format!("math.exp {a} : {ty}")),
                Log => b.op(format!("math.log {a} : {ty}")),
                Tanh => b.op(format!("math.tanh {a} : {ty}")),
                Sqrt => b.op(format!("math.sqrt {a} : {ty}")),
                Abs => b.op(format!("math.absf {a} : {ty}")),
                k => return Err(*k),
            }
        }
        Scalar::Binary(kind, x, y) => {
            let l = emit_scalar(x, b, d)?;
            let r = emit_scalar(y, b, d)?;
            use OpKind::*;
            let op = match kind {
                Add => "arith.addf",
                Sub => "arith.subf",
                Mul => "arith.mulf",
                Div => "arith.divf",
                Max => "arith.maximumf",
                Min => "arith.minimumf",
                Pow => "math.powf",
                k => return Err(*k),
            };
            b.op(format!("{op} {l}, {r} : {ty}"))
        }
    })
}

/// One elementwise generic computing `body` over `inputs` (name, shape) into `out_shape`.
pub fn generic_elementwise(
    e: &mut Emitter,
    inputs: &[(String, Vec<u64>)],
    out_shape: &[u64],
    d: DType,
    body: &Scalar,
) -> Result<String, OpKind> {
    let mut b = Body::default();
    let y = emit_scalar(body, &mut b, d)?;
    let ins: Vec<Operand> = inputs
        .iter()
        .map(|(n, s)| Operand::new(n.clone(), s, d, broadcast_map(s, out_shape)))
        .collect();
    let init = e.empty(out_shape, d);
    let out = Operand::identity(init, out_shape, d);
    let rank = out_shape.len();
    Ok(
        e.generic(rank, &vec![Iter::Parallel; rank], &ins, &[out], &b, &[y])
            .remove(0),
    )
}

pub fn lower(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let d = op.out_dtypes[0];
    if d != DType::F32 || op.in_dtypes.iter().any(|&t| t != DType::F32) {
        return Err(op.unsupported(format!(" (dtype {d})")));
    }
    let ins: Vec<(String, Vec<u64>)> = op
        .op
        .operands()
        .iter()
        .zip(&op.in_shapes)
        .map(|(&v, s)| (e.name(v), s.clone()))
        .collect();
    if op.kind == OpKind::Identity {
        return Ok(vec![ins[0].0.clone()]);
    }
    let body = match ins.len() {
        1 => Scalar::Unary(op.kind, Box::new(Scalar::Arg(0))),
        2 => Scalar::Binary(op.kind, Box::new(Scalar::Arg(0)), Box::new(Scalar::Arg(1))),
        _ => return Err(op.unsupported("")),
    };
    let r = generic_elementwise(e, &ins, &op.out_shapes[0], d, &body)
        .map_err(|_| op.unsupported(""))?;
    Ok(vec![r])
}
