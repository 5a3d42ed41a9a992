//! Contractions: `matmul` → `linalg.matmul` / `linalg.batch_matmul` into a zero-filled
//! accumulator. (`gemm`, `conv`, `conv_transpose`, `conv_grad_weight`: not yet.)

use ppir::{DType, OpKind};

use super::{tensor_type, Emitter, LowerError, OpView};

pub fn lower(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let d = op.out_dtypes[0];
    if d != DType::F32 {
        return Err(op.unsupported(format!(" (dtype {d})")));
    }
    match op.kind {
        OpKind::MatMul => {
            let (a, b) = (&op.in_shapes[0], &op.in_shapes[1]);
            let out = &op.out_shapes[0];
            let name = match (a.len(), b.len()) {
                (2, 2) => "linalg.matmul",
                (3, 3) if a[0] == b[0] => "linalg.batch_matmul",
                _ => {
                    return Err(op.unsupported(format!(
                        " (operand shapes {a:?} and {b:?}; only 2-D×2-D and equal-batch 3-D×3-D are lowered)"
                    )))
                }
            };
            let acc = e.zeros(out, d);
            let x = e.name(op.op.operands()[0]);
            let y = e.name(op.op.operands()[1]);
            let r = e.op(format!(
                "{name} ins({x}, {y} : {}, {}) outs({acc} : {}) -> {}",
                tensor_type(a, d),
                tensor_type(b, d),
                tensor_type(out, d),
                tensor_type(out, d)
            ));
            Ok(vec![r])
        }
        _ => Err(op.unsupported("")),
    }
}
