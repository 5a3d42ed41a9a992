//! Buffer copies as loops: ppcc's step `ppcc-copies-to-linalg` (see
//! [`crate::compile::COPIES_TO_LINALG`]), after bufferization on the CUDA target.
//!
//! Bufferization copies whole buffers with `memref.copy` (a function's result into the
//! caller's buffer, a tensor that is written while still read elsewhere). Outside a kernel
//! that copy is host code: the CPU reads and writes managed memory that the GPU has just
//! written and is about to read again, so every page of both buffers migrates to the host
//! and back, at a fault per page. On an H100 that cost the GPT a fifth of its step
//! (BENCHMARKS.md, "Second GPU session (2026-11-28)").
//!
//! Here every `memref.copy` of ranked buffers of rank ≥ 1 becomes `linalg.copy`, which
//! the GPU pipeline turns into parallel loops, tiles and maps like any other op: a kernel.
//! Two kinds stay on the host: rank-0 copies (one element), and copies from or to a
//! `memref.global` (a constant of the module, in the host's memory, which a kernel cannot
//! address: on an H100 such a copy as a kernel stopped with CUDA_ERROR_ILLEGAL_ADDRESS).
//! `PPCC_GPU_COPIES=host` at compile time leaves every copy on the host (the baseline
//! `scripts/gpu-check.sh` measures against).

use mlir_sys::{
    mlirBlockAppendOwnedOperation, mlirBlockCreate, mlirBlockGetArgument,
    mlirBlockInsertOwnedOperationBefore, mlirDenseI32ArrayGet, mlirIdentifierGet,
    mlirNamedAttributeGet, mlirOpResultGetOwner, mlirOperationCreate, mlirOperationDestroy,
    mlirOperationGetBlock, mlirOperationGetContext, mlirOperationGetLocation,
    mlirOperationGetNumOperands, mlirOperationGetOperand, mlirOperationStateAddAttributes,
    mlirOperationStateAddOperands, mlirOperationStateAddOwnedRegions, mlirOperationStateGet,
    mlirRegionAppendOwnedBlock, mlirRegionCreate, mlirShapedTypeGetElementType,
    mlirShapedTypeGetRank, mlirTypeIsAMemRef, mlirValueGetType, mlirValueIsAOpResult,
    MlirOperation, MlirValue,
};

use crate::library::{op_name, str_ref, walk};

/// Replace every `memref.copy` of ranked buffers of rank ≥ 1 in `module` by `linalg.copy`
/// (see the module docs). Returns how many were replaced.
pub(crate) fn copies_to_linalg(module: MlirOperation) -> Result<usize, String> {
    let mut copies = vec![];
    walk(module, &mut |op| {
        if op_name(op) == "memref.copy" {
            copies.push(op);
        }
    });
    let mut replaced = 0;
    for copy in copies {
        // SAFETY: `copy` is a live `memref.copy`; its operands are live values.
        let ranked = unsafe {
            mlirOperationGetNumOperands(copy) == 2
                && (0..2).all(|i| {
                    let t = mlirValueGetType(mlirOperationGetOperand(copy, i));
                    mlirTypeIsAMemRef(t) && mlirShapedTypeGetRank(t) >= 1
                })
        };
        // SAFETY: as above.
        let global = unsafe { (0..2).any(|i| from_global(mlirOperationGetOperand(copy, i))) };
        if ranked && !global {
            to_linalg(copy)?;
            replaced += 1;
        }
    }
    Ok(replaced)
}

/// Whether `v` is a `memref.global` (`memref.get_global`), or a view of one.
///
/// # Safety
/// `v` must be a live value.
unsafe fn from_global(mut v: MlirValue) -> bool {
    const VIEWS: [&str; 7] = [
        "memref.cast",
        "memref.subview",
        "memref.reinterpret_cast",
        "memref.expand_shape",
        "memref.collapse_shape",
        "memref.reshape",
        "memref.transpose",
    ];
    while mlirValueIsAOpResult(v) {
        let def = mlirOpResultGetOwner(v);
        let name = op_name(def);
        if name == "memref.get_global" {
            return true;
        }
        if !VIEWS.contains(&name.as_str()) || mlirOperationGetNumOperands(def) == 0 {
            return false;
        }
        v = mlirOperationGetOperand(def, 0);
    }
    false
}

/// `memref.copy %src, %dst` → `linalg.copy ins(%src) outs(%dst)` in its place: the named
/// op with its body (`^bb0(%in, %out): linalg.yield %in`) built here, as its region
/// builder would.
fn to_linalg(copy: MlirOperation) -> Result<(), String> {
    // SAFETY: building operations in the context of the live `copy` from its live
    // operands, inserting the new one before it and then destroying it (nothing else
    // refers to a `memref.copy`: it has no results).
    unsafe {
        let ctx = mlirOperationGetContext(copy);
        let loc = mlirOperationGetLocation(copy);
        let operands = [
            mlirOperationGetOperand(copy, 0),
            mlirOperationGetOperand(copy, 1),
        ];
        let elements = operands.map(|v| mlirShapedTypeGetElementType(mlirValueGetType(v)));
        let block = mlirBlockCreate(2, elements.as_ptr(), [loc, loc].as_ptr());
        let mut yield_state = mlirOperationStateGet(str_ref("linalg.yield"), loc);
        let input = mlirBlockGetArgument(block, 0);
        mlirOperationStateAddOperands(&mut yield_state, 1, &input);
        let yield_op = mlirOperationCreate(&mut yield_state);
        if yield_op.ptr.is_null() {
            return Err("cannot build a linalg.yield".into());
        }
        mlirBlockAppendOwnedOperation(block, yield_op);
        let region = mlirRegionCreate();
        mlirRegionAppendOwnedBlock(region, block);

        let mut state = mlirOperationStateGet(str_ref("linalg.copy"), loc);
        mlirOperationStateAddOperands(&mut state, 2, operands.as_ptr());
        // Operand groups: inputs, outputs.
        let segments = [1i32, 1];
        let attr = mlirNamedAttributeGet(
            mlirIdentifierGet(ctx, str_ref("operandSegmentSizes")),
            mlirDenseI32ArrayGet(ctx, 2, segments.as_ptr()),
        );
        mlirOperationStateAddAttributes(&mut state, 1, &attr);
        mlirOperationStateAddOwnedRegions(&mut state, 1, &region);
        let linalg = mlirOperationCreate(&mut state);
        if linalg.ptr.is_null() {
            return Err("cannot build a linalg.copy".into());
        }
        mlirBlockInsertOwnedOperationBefore(mlirOperationGetBlock(copy), copy, linalg);
        mlirOperationDestroy(copy);
    }
    Ok(())
}
