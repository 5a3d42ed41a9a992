//! Data movement: `transpose` → `linalg.transpose`; `reshape`, `flatten`, `squeeze`,
//! `unsqueeze` (which only change a static shape) → `tensor.collapse_shape` +
//! `tensor.expand_shape`; `constant` → `arith.constant dense<...>`.

use ppir::{DType, OpKind, Tensor, TensorData};

use super::{literal, tensor_type, Emitter, LowerError, OpView};

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
    match op.kind {
        OpKind::Transpose => {
            let x = &op.in_shapes[0];
            let d = op.in_dtypes[0];
            let rank = x.len();
            let perm = match op.ints("perm")? {
                Some(p) => p,
                None => (0..rank as i64).rev().collect(),
            };
            let mut p = Vec::new();
            for a in perm {
                p.push(op.axis(a, rank)?.to_string());
            }
            let ty = tensor_type(&op.out_shapes[0], d);
            let init = e.empty(&op.out_shapes[0], d);
            let src = e.name(op.op.operands()[0]);
            let r = e.op(format!(
                "linalg.transpose ins({src} : {}) outs({init} : {ty}) permutation = [{}]",
                tensor_type(x, d),
                p.join(", ")
            ));
            Ok(vec![r])
        }
        OpKind::Reshape | OpKind::Flatten | OpKind::Squeeze | OpKind::Unsqueeze => {
            let src = e.name(op.op.operands()[0]);
            let (from, to) = (&op.in_shapes[0], &op.out_shapes[0]);
            if from.iter().product::<u64>() != to.iter().product::<u64>() {
                return Err(op.invalid(format!("cannot reshape {from:?} to {to:?}")));
            }
            Ok(vec![e.reshape(&src, from, to, op.in_dtypes[0])])
        }
        OpKind::Constant => {
            let t = op
                .op
                .attrs
                .tensor("value")
                .map_err(|x| op.attr_err(x))?
                .ok_or_else(|| op.invalid("missing attribute `value`"))?;
            let ty = tensor_type(&op.out_shapes[0], t.dtype);
            let r = e.op(format!("arith.constant {} : {ty}", dense_literal(t)));
            let _ = DType::F32;
            Ok(vec![r])
        }
        _ => Err(op.unsupported("")),
    }
}
