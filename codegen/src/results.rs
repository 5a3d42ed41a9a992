//! Pairwise distinct results: ppcc's step `ppcc-distinct-results` (see
//! [`crate::compile::DISTINCT_RESULTS`]), between `cse` and bufferization.
//!
//! MLIR's `buffer-results-to-out-params{hoist-static-allocs}` crashes (a use after free)
//! on a function that returns one buffer twice: it writes the first result straight into
//! the caller's buffer, erases the allocation, and then reads the erased value for the
//! second. A function returns one value twice when one ONNX value is two outputs, and
//! `cse` merges equal computations that the training program returns separately (an
//! Inception network's two LRN stashes of the same constant scalar, equal zero-size pieces
//! of a `split`). Here every repeated operand of a `func.return` is replaced by a copy of
//! itself, `bufferization.alloc_tensor() copy(%v)`: an allocation, which `cse` keeps apart
//! and bufferization turns into a buffer of its own.

use mlir_sys::{
    mlirBlockInsertOwnedOperationBefore, mlirDenseI32ArrayGet, mlirIdentifierGet,
    mlirNamedAttributeGet, mlirOperationCreate, mlirOperationGetBlock, mlirOperationGetContext,
    mlirOperationGetLocation, mlirOperationGetNumOperands, mlirOperationGetOperand,
    mlirOperationGetResult, mlirOperationSetOperand, mlirOperationStateAddAttributes,
    mlirOperationStateAddOperands, mlirOperationStateAddResults, mlirOperationStateGet,
    mlirTypeIsARankedTensor, mlirValueEqual, mlirValueGetType, MlirOperation,
};

use crate::library::{op_name, str_ref, walk};

/// Make the operands of every `func.return` in `module` pairwise distinct (see the module
/// docs). Returns how many copies were made, or what was repeated where it is not a
/// tensor (the step runs before bufferization, so every result is one).
pub(crate) fn distinct_results(module: MlirOperation) -> Result<usize, String> {
    let mut returns = vec![];
    walk(module, &mut |op| {
        if op_name(op) == "func.return" {
            returns.push(op);
        }
    });
    let mut copies = 0;
    for ret in returns {
        // SAFETY: `ret` is a live `func.return`; its operands are live values.
        let n = unsafe { mlirOperationGetNumOperands(ret) };
        for i in 1..n {
            // SAFETY: `i` and every `j < i` are below the operand count.
            let repeated = unsafe {
                let v = mlirOperationGetOperand(ret, i);
                (0..i).any(|j| mlirValueEqual(mlirOperationGetOperand(ret, j), v))
            };
            if repeated {
                copy_operand(ret, i)?;
                copies += 1;
            }
        }
    }
    Ok(copies)
}

/// Replace operand `i` of `ret` by `bufferization.alloc_tensor() copy(%v)`, inserted
/// right before `ret`.
fn copy_operand(ret: MlirOperation, i: isize) -> Result<(), String> {
    // SAFETY: building one operation in the context of the live `ret`, from its live
    // operand, and inserting it into `ret`'s block before `ret`.
    unsafe {
        let v = mlirOperationGetOperand(ret, i);
        let ty = mlirValueGetType(v);
        if !mlirTypeIsARankedTensor(ty) {
            return Err(format!(
                "a function returns one value twice (result {i}), and it is not a tensor"
            ));
        }
        let ctx = mlirOperationGetContext(ret);
        let mut state = mlirOperationStateGet(
            str_ref("bufferization.alloc_tensor"),
            mlirOperationGetLocation(ret),
        );
        mlirOperationStateAddOperands(&mut state, 1, &v);
        mlirOperationStateAddResults(&mut state, 1, &ty);
        // Operand groups: dynamic sizes, copy, size hint.
        let segments = [0i32, 1, 0];
        let attr = mlirNamedAttributeGet(
            mlirIdentifierGet(ctx, str_ref("operandSegmentSizes")),
            mlirDenseI32ArrayGet(ctx, 3, segments.as_ptr()),
        );
        mlirOperationStateAddAttributes(&mut state, 1, &attr);
        let copy = mlirOperationCreate(&mut state);
        if copy.ptr.is_null() {
            return Err("cannot build a bufferization.alloc_tensor".into());
        }
        mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(ret), ret, copy);
        mlirOperationSetOperand(ret, i, mlirOperationGetResult(copy, 0));
    }
    Ok(())
}
