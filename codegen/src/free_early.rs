//! Free each temporary buffer right after its last use.
//!
//! MLIR's ownership-based deallocation puts every `memref.dealloc` at the end of the block
//! that allocates the buffer, so a stage function holds all of its temporaries until it
//! returns: a backward over several layers keeps every layer's gradient temporaries at
//! once. This step, run right after `buffer-deallocation-pipeline` on CPU code, moves each
//! `memref.dealloc` of a function's entry block up to just after the last op of that block
//! that uses the buffer or anything computed from it (views, extracted pointers, loaded
//! values, ...; a use inside a loop counts as a use by the loop), which is where the
//! reference interpreter drops the value.
//!
//! Only deallocations of a `memref.alloc` in the same block move; anything else stays
//! where the pipeline put it.
//!
//! Before that, results are written in place: `buffer-results-to-out-params` turns the
//! results of the outlined op functions into fresh buffers in the caller, so a stage
//! function computed each of its own results into a temporary and copied it into the
//! caller's output buffer at the end (twice the memory of every result, and the copy). A
//! `memref.copy` of a block-local `memref.alloc` (or of a `memref.expand_shape` view of
//! one) into an output argument that nothing else uses, with no use of the buffer after
//! the copy but its deallocation, becomes the output argument itself (or a
//! `memref.collapse_shape` view of it). CUDA host code keeps the pipeline's placement: kernels run
//! asynchronously, so a buffer may still be in use after its last host-side use.

use std::collections::{HashMap, HashSet};

use mlir_sys::{
    mlirBlockArgumentGetOwner, mlirBlockEqual, mlirBlockGetFirstOperation,
    mlirBlockInsertOwnedOperationBefore, mlirIdentifierGet, mlirIdentifierStr,
    mlirNamedAttributeGet, mlirOpOperandGetNextUse, mlirOpOperandGetOwner, mlirOpOperandIsNull,
    mlirOpResultGetOwner, mlirOperationCreate, mlirOperationDestroy,
    mlirOperationGetAttributeByName, mlirOperationGetBlock, mlirOperationGetContext,
    mlirOperationGetLocation, mlirOperationGetName, mlirOperationGetNextInBlock,
    mlirOperationGetNumOperands, mlirOperationGetNumRegions, mlirOperationGetNumResults,
    mlirOperationGetOperand, mlirOperationGetParentOperation, mlirOperationGetRegion,
    mlirOperationGetResult, mlirOperationMoveAfter, mlirOperationStateAddAttributes,
    mlirOperationStateAddOperands, mlirOperationStateAddResults, mlirOperationStateGet,
    mlirRegionGetFirstBlock, mlirTypeEqual, mlirValueGetFirstUse, mlirValueGetType,
    mlirValueIsABlockArgument, mlirValueIsAOpResult, mlirValueReplaceAllUsesOfWith, MlirBlock,
    MlirOperation, MlirStringRef, MlirValue,
};

fn name(op: MlirOperation) -> String {
    // SAFETY: `op` is a live operation; the identifier's string is owned by the context
    // and copied here.
    unsafe {
        let s = mlirIdentifierStr(mlirOperationGetName(op));
        if s.data.is_null() {
            return String::new();
        }
        let bytes = std::slice::from_raw_parts(s.data as *const u8, s.length);
        String::from_utf8_lossy(bytes).into_owned()
    }
}

fn ops_of(block: MlirBlock) -> Vec<MlirOperation> {
    let mut out = vec![];
    // SAFETY: walking a live block's operation list.
    unsafe {
        let mut op = mlirBlockGetFirstOperation(block);
        while !op.ptr.is_null() {
            out.push(op);
            op = mlirOperationGetNextInBlock(op);
        }
    }
    out
}

/// A string reference to a static name.
fn str_ref(s: &'static str) -> MlirStringRef {
    MlirStringRef {
        data: s.as_ptr() as *const std::os::raw::c_char,
        length: s.len(),
    }
}

fn key(op: MlirOperation) -> usize {
    op.ptr as usize
}

/// The op of `block` that is `op` or contains it; `None` if `op` is outside `block`.
fn ancestor_in(block: MlirBlock, mut op: MlirOperation) -> Option<MlirOperation> {
    // SAFETY: parents of a live operation are live; a null parent ends the walk.
    unsafe {
        loop {
            if op.ptr.is_null() {
                return None;
            }
            let b = mlirOperationGetBlock(op);
            if !b.ptr.is_null() && mlirBlockEqual(b, block) {
                return Some(op);
            }
            op = mlirOperationGetParentOperation(op);
        }
    }
}

/// The position in `block` (by `index`) of the last op that uses `buffer` or a value
/// computed from it, not counting `dealloc`; `None` when some use is outside the block.
fn last_use(
    block: MlirBlock,
    index: &HashMap<usize, usize>,
    buffer: MlirValue,
    dealloc: MlirOperation,
) -> Option<usize> {
    let mut last = 0usize;
    let mut seen: HashSet<usize> = HashSet::new();
    let mut values = vec![buffer];
    while let Some(v) = values.pop() {
        // SAFETY: uses of a live value; each owner is a live operation.
        unsafe {
            let mut u = mlirValueGetFirstUse(v);
            while !mlirOpOperandIsNull(u) {
                let owner = mlirOpOperandGetOwner(u);
                u = mlirOpOperandGetNextUse(u);
                if key(owner) == key(dealloc) {
                    continue;
                }
                let top = ancestor_in(block, owner)?;
                last = last.max(*index.get(&key(top))?);
                if seen.insert(key(owner)) {
                    for i in 0..mlirOperationGetNumResults(owner) {
                        values.push(mlirOperationGetResult(owner, i));
                    }
                }
            }
        }
    }
    Some(last)
}

fn uses(v: MlirValue) -> Vec<MlirOperation> {
    let mut out = vec![];
    // SAFETY: uses of a live value.
    unsafe {
        let mut u = mlirValueGetFirstUse(v);
        while !mlirOpOperandIsNull(u) {
            out.push(mlirOpOperandGetOwner(u));
            u = mlirOpOperandGetNextUse(u);
        }
    }
    out
}

/// Compute results directly into the output arguments they are copied to at the end of
/// a function body's entry block; returns how many copies went.
fn write_results_in_place(block: MlirBlock) -> usize {
    let ops = ops_of(block);
    let index: HashMap<usize, usize> = ops.iter().enumerate().map(|(i, &o)| (key(o), i)).collect();
    let mut done = 0;
    // Ops destroyed here (later entries of `ops` among them): never touched again.
    let mut gone: HashSet<usize> = HashSet::new();
    for (at, &copy) in ops.iter().enumerate() {
        if gone.contains(&key(copy)) || name(copy) != "memref.copy" {
            continue;
        }
        // SAFETY: operands and types of live ops and values.
        let (src, dst) = unsafe {
            if mlirOperationGetNumOperands(copy) != 2 {
                continue;
            }
            let (src, dst) = (
                mlirOperationGetOperand(copy, 0),
                mlirOperationGetOperand(copy, 1),
            );
            let out_arg = mlirValueIsABlockArgument(dst)
                && mlirBlockEqual(mlirBlockArgumentGetOwner(dst), block);
            if !out_arg
                || !mlirValueIsAOpResult(src)
                || !mlirTypeEqual(mlirValueGetType(src), mlirValueGetType(dst))
            {
                continue;
            }
            (src, dst)
        };
        // The buffer: `src` itself, or what `src` is an expand_shape view of.
        // SAFETY: `src` is an op result (checked above); operands of live ops.
        let (buffer, view) = unsafe {
            let owner = mlirOpResultGetOwner(src);
            if name(owner) == "memref.expand_shape" && mlirOperationGetNumOperands(owner) >= 1 {
                let b = mlirOperationGetOperand(owner, 0);
                if !mlirValueIsAOpResult(b) {
                    continue;
                }
                (b, Some(owner))
            } else {
                (src, None)
            }
        };
        // SAFETY: `buffer` is an op result (checked above).
        let alloc = unsafe { mlirOpResultGetOwner(buffer) };
        if name(alloc) != "memref.alloc" || ancestor_in(block, alloc).map(key) != Some(key(alloc)) {
            continue;
        }
        // The output is written by this copy only; neither the buffer nor the view is used
        // after it, except to free the buffer.
        if uses(dst).iter().any(|&u| key(u) != key(copy)) {
            continue;
        }
        let before = |u: MlirOperation| matches!(ancestor_in(block, u).and_then(|t| index.get(&key(t))), Some(&i) if i < at);
        let mut deallocs = vec![];
        let mut later_use = false;
        for u in uses(buffer) {
            if name(u) == "memref.dealloc" {
                deallocs.push(u);
            } else if !(key(u) == key(copy) || view.map(key) == Some(key(u)) || before(u)) {
                later_use = true;
            }
        }
        if view.is_some() {
            later_use |= uses(src)
                .into_iter()
                .any(|u| key(u) != key(copy) && !before(u));
        }
        if later_use {
            continue;
        }
        // SAFETY: the new op is built from live values and attributes and inserted before
        // the allocation (the output argument dominates it); the ops destroyed are in
        // `block` and not used again (the copy and the deallocations have no results; the
        // allocation's uses now read `dst` or its collapsed view).
        unsafe {
            let replacement = match view {
                None => dst,
                Some(v) => {
                    let reassociation =
                        mlirOperationGetAttributeByName(v, str_ref("reassociation"));
                    if reassociation.ptr.is_null() {
                        continue;
                    }
                    let mut state = mlirOperationStateGet(
                        str_ref("memref.collapse_shape"),
                        mlirOperationGetLocation(alloc),
                    );
                    mlirOperationStateAddOperands(&mut state, 1, &dst);
                    let ty = mlirValueGetType(buffer);
                    mlirOperationStateAddResults(&mut state, 1, &ty);
                    let attr = mlirNamedAttributeGet(
                        mlirIdentifierGet(mlirOperationGetContext(alloc), str_ref("reassociation")),
                        reassociation,
                    );
                    mlirOperationStateAddAttributes(&mut state, 1, &attr);
                    let collapse = mlirOperationCreate(&mut state);
                    if collapse.ptr.is_null() {
                        continue;
                    }
                    mlirBlockInsertOwnedOperationBefore(block, alloc, collapse);
                    mlirOperationGetResult(collapse, 0)
                }
            };
            mlirValueReplaceAllUsesOfWith(buffer, replacement);
            for op in deallocs.into_iter().chain([copy, alloc]) {
                gone.insert(key(op));
                mlirOperationDestroy(op);
            }
        }
        done += 1;
    }
    done
}

/// Move the deallocations of one function body's entry block; returns how many moved.
fn free_in_block(block: MlirBlock) -> usize {
    let ops = ops_of(block);
    let index: HashMap<usize, usize> = ops.iter().enumerate().map(|(i, &o)| (key(o), i)).collect();
    let mut moved = 0;
    for (at, &op) in ops.iter().enumerate() {
        if name(op) != "memref.dealloc" {
            continue;
        }
        // SAFETY: a `memref.dealloc` has one operand.
        let buffer = unsafe {
            if mlirOperationGetNumOperands(op) != 1 {
                continue;
            }
            mlirOperationGetOperand(op, 0)
        };
        // SAFETY: `buffer` is a live value; its owner is checked to be an op result first.
        let alloc = unsafe {
            if !mlirValueIsAOpResult(buffer) {
                continue;
            }
            mlirOpResultGetOwner(buffer)
        };
        if name(alloc) != "memref.alloc" || ancestor_in(block, alloc).map(key) != Some(key(alloc)) {
            continue;
        }
        let Some(last) = last_use(block, &index, buffer, op) else {
            continue;
        };
        let last = last.max(index[&key(alloc)]);
        if last + 1 < at {
            // SAFETY: both ops are in `block`; the dealloc moves up past ops that do not
            // use the buffer.
            unsafe { mlirOperationMoveAfter(op, ops[last]) };
            moved += 1;
        }
    }
    moved
}

/// Move every function's deallocations in `module` (a `builtin.module` operation) to right
/// after the buffers' last uses; returns how many moved.
pub(crate) fn free_after_last_use(module: MlirOperation) -> usize {
    let mut moved = 0;
    // SAFETY: a module has one region with one block; functions are its ops.
    unsafe {
        if mlirOperationGetNumRegions(module) == 0 {
            return 0;
        }
        let body = mlirRegionGetFirstBlock(mlirOperationGetRegion(module, 0));
        if body.ptr.is_null() {
            return 0;
        }
        for f in ops_of(body) {
            if name(f) != "func.func" || mlirOperationGetNumRegions(f) == 0 {
                continue;
            }
            let entry = mlirRegionGetFirstBlock(mlirOperationGetRegion(f, 0));
            if !entry.ptr.is_null() {
                write_results_in_place(entry);
                moved += free_in_block(entry);
            }
        }
    }
    moved
}
