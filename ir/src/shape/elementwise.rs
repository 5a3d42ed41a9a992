//! Elementwise ops: unary math, binary arithmetic with numpy broadcasting, comparisons,
//! logic and `where`.

use super::{bail, check_elem, same_dtype, Elem, Res};
use crate::attr::Attrs;
use crate::ops::attrs::{CastAttrs, DropoutAttrs, GeluAttrs};
use crate::ops::{OpAttrs, OpKind};
use crate::types::{DType, Dim, TensorType};

/// Broadcast two dimensions: `1` stretches, `?` agrees with anything (it takes a known size
/// other than 1, assuming it matches), and two different known sizes do not broadcast.
fn broadcast_dim(a: Dim, b: Dim) -> Option<Dim> {
    match (a, b) {
        (Dim::Known(1), d) | (d, Dim::Known(1)) => Some(d),
        (Dim::Batch, d) | (d, Dim::Batch) => Some(d),
        (Dim::Known(x), Dim::Known(y)) => (x == y).then_some(a),
    }
}

/// The numpy broadcast of two shapes (aligned at the right), or `None` if they do not
/// broadcast.
pub fn broadcast_shapes(a: &[Dim], b: &[Dim]) -> Option<Vec<Dim>> {
    let rank = a.len().max(b.len());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = if i + a.len() >= rank {
            a[i + a.len() - rank]
        } else {
            Dim::Known(1)
        };
        let db = if i + b.len() >= rank {
            b[i + b.len() - rank]
        } else {
            Dim::Known(1)
        };
        out.push(broadcast_dim(da, db)?);
    }
    Some(out)
}

/// Whether `src` broadcasts to exactly `target` (ONNX "unidirectional" broadcasting).
pub(crate) fn broadcasts_to(src: &[Dim], target: &[Dim]) -> bool {
    src.len() <= target.len()
        && src
            .iter()
            .rev()
            .zip(target.iter().rev())
            .all(|(&s, &t)| s == Dim::Known(1) || s.compatible(t))
}

pub(super) fn unary(kind: OpKind, attrs: &Attrs, x: &TensorType) -> Res<TensorType> {
    use OpKind::*;
    let elem = match kind {
        LeakyRelu | Elu | Selu | Sigmoid | HardSigmoid | Tanh | Gelu | Exp | Log | Sqrt
        | Reciprocal | Softplus | Softsign | Floor | Ceil | Sin | Cos => Some(Elem::Float),
        Relu | Erf | Abs | Neg | Sign | Shrink | Clip => Some(Elem::Numeric),
        Not => Some(Elem::Bool),
        _ => None,
    };
    if let Some(e) = elem {
        check_elem(x, 0, e)?;
    }
    match kind {
        Cast => return Ok(TensorType::new(CastAttrs::of(attrs)?.to, x.dims.clone())),
        Gelu => match GeluAttrs::of(attrs)?.approximate.as_str() {
            "none" | "tanh" => {}
            other => bail!("'approximate' must be \"none\" or \"tanh\", found {other:?}"),
        },
        _ => {}
    }
    Ok(x.clone())
}

/// `dropout(x, [key])`: x's type. The key, when present, is the `tensor<2xi64>`
/// (step, micro-batch) that selects the training mask.
pub(super) fn dropout(attrs: &DropoutAttrs, ops: &[TensorType]) -> Res<TensorType> {
    let x = &ops[0];
    check_elem(x, 0, Elem::Float)?;
    let ratio = attrs.ratio;
    if !(0.0..1.0).contains(&ratio) {
        bail!("'ratio' must be in [0, 1), found {ratio}");
    }
    if let Some(key) = ops.get(1) {
        if *key != TensorType::of(DType::I64, &[2]) {
            bail!(
                "operand 1 (the dropout key: step, micro-batch) must be tensor<2xi64>, got {key}"
            );
        }
    }
    Ok(x.clone())
}

pub(super) fn binary(kind: OpKind, a: &TensorType, b: &TensorType) -> Res<TensorType> {
    use OpKind::*;
    let ops = [a.clone(), b.clone()];
    match kind {
        And | Or => {
            check_elem(a, 0, Elem::Bool)?;
            check_elem(b, 1, Elem::Bool)?;
        }
        Equal => same_dtype(&ops, 0, 1)?,
        Pow => {
            // ONNX Pow lets the exponent have its own numeric type; the result is the base's.
            check_elem(a, 0, Elem::Numeric)?;
            check_elem(b, 1, Elem::Numeric)?;
        }
        _ => {
            check_elem(a, 0, Elem::Numeric)?;
            same_dtype(&ops, 0, 1)?;
        }
    }
    if kind == PRelu {
        // The slope broadcasts to x; the result is x's shape.
        if !broadcasts_to(&b.dims, &a.dims) {
            bail!("slope {b} does not broadcast to the input {a}");
        }
        return Ok(a.clone());
    }
    let Some(dims) = broadcast_shapes(&a.dims, &b.dims) else {
        bail!("cannot broadcast {a} with {b}");
    };
    let dtype = match kind {
        Equal | Less | Greater | LessEqual | GreaterEqual => DType::Bool,
        _ => a.dtype,
    };
    Ok(TensorType::new(dtype, dims))
}

pub(super) fn where_(cond: &TensorType, x: &TensorType, y: &TensorType) -> Res<TensorType> {
    check_elem(cond, 0, Elem::Bool)?;
    same_dtype(&[cond.clone(), x.clone(), y.clone()], 1, 2)?;
    let dims = broadcast_shapes(&x.dims, &y.dims).and_then(|d| broadcast_shapes(&cond.dims, &d));
    let Some(dims) = dims else {
        bail!("cannot broadcast {cond}, {x} and {y}");
    };
    Ok(TensorType::new(x.dtype, dims))
}
