//! The CPU's support-library routines, swapped in after bufferization.
//!
//! Every op is lowered once to `linalg` on tensors, the form both targets compile: the
//! CUDA target turns its loops into kernels, and the CPU can run them as loops. For the ops
//! the CPU runs faster through the hand-written support library (`support.c`: matrix
//! products, convolution as im2col + GEMM, softmax and layer-norm rows), the lowering also
//! writes the op's function a second time, `@<fn>__op<k>__lib`, whose body hands buffers
//! to that library ([`crate::lower::LIBRARY_SUFFIX`]). Both versions take the same tensors
//! and return the same results, so after bufferization (and `buffer-results-to-out-params`)
//! they have the same signature; [`use_library_routines`] then points every call of
//! `@<fn>__op<k>` at `@<fn>__op<k>__lib`, and `symbol-dce` deletes the `linalg` versions no
//! call reaches. Until that step the module is target-neutral; `PPCC_LIBRARY=off` (or
//! [`crate::compile::CompileOptions::library`] false) keeps the `linalg` loops on the CPU
//! too, which is how the tests compare the two.

use std::collections::HashSet;

use mlir_sys::{
    mlirAttributeIsAFlatSymbolRef, mlirAttributeIsAString, mlirBlockGetFirstOperation,
    mlirFlatSymbolRefAttrGet, mlirFlatSymbolRefAttrGetValue, mlirIdentifierStr,
    mlirOperationGetAttributeByName, mlirOperationGetContext, mlirOperationGetName,
    mlirOperationGetNextInBlock, mlirOperationGetNumRegions, mlirOperationGetRegion,
    mlirOperationSetAttributeByName, mlirRegionGetFirstBlock, mlirStringAttrGet,
    mlirStringAttrGetValue, MlirAttribute, MlirOperation, MlirStringRef,
};

use crate::lower::LIBRARY_SUFFIX;

pub(crate) fn string(s: MlirStringRef) -> String {
    if s.data.is_null() {
        return String::new();
    }
    // SAFETY: an MLIR string reference points at `length` bytes owned by the context.
    let bytes = unsafe { std::slice::from_raw_parts(s.data as *const u8, s.length) };
    String::from_utf8_lossy(bytes).into_owned()
}

pub(crate) fn str_ref(s: &str) -> MlirStringRef {
    MlirStringRef {
        data: s.as_ptr() as *const std::os::raw::c_char,
        length: s.len(),
    }
}

pub(crate) fn op_name(op: MlirOperation) -> String {
    // SAFETY: `op` is a live operation.
    string(unsafe { mlirIdentifierStr(mlirOperationGetName(op)) })
}

pub(crate) fn attribute(op: MlirOperation, name: &str) -> Option<MlirAttribute> {
    // SAFETY: `op` is live; a missing attribute is a null attribute.
    let a = unsafe { mlirOperationGetAttributeByName(op, str_ref(name)) };
    (!a.ptr.is_null()).then_some(a)
}

/// Every operation nested in `op`'s regions (all blocks), outermost first.
pub(crate) fn walk(op: MlirOperation, f: &mut impl FnMut(MlirOperation)) {
    // SAFETY: walking the live regions, blocks and operation lists of `op`.
    unsafe {
        for r in 0..mlirOperationGetNumRegions(op) {
            let mut block = mlirRegionGetFirstBlock(mlirOperationGetRegion(op, r));
            while !block.ptr.is_null() {
                let mut o = mlirBlockGetFirstOperation(block);
                while !o.ptr.is_null() {
                    f(o);
                    walk(o, f);
                    o = mlirOperationGetNextInBlock(o);
                }
                block = mlir_sys::mlirBlockGetNextInRegion(block);
            }
        }
    }
}

/// Point each `func.call @X` of `module` at `@X__lib` where the module defines that
/// function (see the module docs); returns how many calls now use a library routine.
pub(crate) fn use_library_routines(module: MlirOperation) -> usize {
    let mut functions = HashSet::new();
    walk(module, &mut |op| {
        if op_name(op) == "func.func" {
            if let Some(a) = attribute(op, "sym_name") {
                // SAFETY: `a` is a live attribute.
                if unsafe { mlirAttributeIsAString(a) } {
                    functions.insert(string(unsafe { mlirStringAttrGetValue(a) }));
                }
            }
        }
    });
    let mut swapped = 0;
    walk(module, &mut |op| {
        if op_name(op) != "func.call" {
            return;
        }
        let Some(callee) = attribute(op, "callee") else {
            return;
        };
        // SAFETY: `callee` is a live attribute.
        if !unsafe { mlirAttributeIsAFlatSymbolRef(callee) } {
            return;
        }
        let name = string(unsafe { mlirFlatSymbolRefAttrGetValue(callee) });
        let lib = format!("{name}{LIBRARY_SUFFIX}");
        if functions.contains(&lib) {
            // SAFETY: `op` is live; the new attribute is created in its context.
            unsafe {
                let ctx = mlirOperationGetContext(op);
                let attr = mlirFlatSymbolRefAttrGet(ctx, str_ref(&lib));
                mlirOperationSetAttributeByName(op, str_ref("callee"), attr);
            }
            swapped += 1;
        }
    });
    swapped
}

/// Point every `llvm.call @from` of `module` at `@to` and rename the declaration
/// `llvm.func @from` to `@to` (the CUDA target's GEMM calls, which the lowering names as
/// the CPU's); returns how many calls were renamed.
pub(crate) fn rename_callee(module: MlirOperation, from: &str, to: &str) -> usize {
    let mut renamed = 0;
    walk(module, &mut |op| {
        let name = op_name(op);
        let (attr, is_ref) = match name.as_str() {
            "llvm.call" => ("callee", true),
            "llvm.func" => ("sym_name", false),
            _ => return,
        };
        let Some(a) = attribute(op, attr) else {
            return;
        };
        // SAFETY: `a` is a live attribute of `op`; the new one is created in its context.
        unsafe {
            let current = if is_ref {
                if !mlirAttributeIsAFlatSymbolRef(a) {
                    return;
                }
                string(mlirFlatSymbolRefAttrGetValue(a))
            } else {
                if !mlirAttributeIsAString(a) {
                    return;
                }
                string(mlirStringAttrGetValue(a))
            };
            if current != from {
                return;
            }
            let ctx = mlirOperationGetContext(op);
            let new = if is_ref {
                mlirFlatSymbolRefAttrGet(ctx, str_ref(to))
            } else {
                mlirStringAttrGet(ctx, str_ref(to))
            };
            mlirOperationSetAttributeByName(op, str_ref(attr), new);
        }
        if is_ref {
            renamed += 1;
        }
    });
    renamed
}
