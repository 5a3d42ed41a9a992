//! `send` / `recv` → indirect calls through the context pointer (see [`super::CTX_LAYOUT`]).
//!
//! - `send x`: the tensor's buffer (`bufferization.to_buffer`, read-only, identity layout so
//!   it is dense with offset 0) is handed to `ctx->send(ctx, peer, channel, data)`; the
//!   runtime copies it before returning.
//! - `recv`: a fresh `memref.alloc` is filled by `ctx->recv(ctx, peer, channel, data)` and
//!   becomes a tensor with `bufferization.to_tensor ... restrict`.
//!
//! - `all_reduce x`: `ctx->all_reduce(ctx, channel, x_data, out_data)` fills a fresh buffer
//!   with the sum over the op's participants (the runtime computes it; see
//!   `ppcc_runtime::pipeline`). `reduce_scatter`, `shard` and `all_gather` (ZeRO-1) go
//!   through the same callback: the runtime knows each channel's op.
//!
//! The callbacks return a status the generated code ignores: the runtime records the first
//! failure in its context, turns later calls into no-ops, and reports the failure when the
//! entry returns.

use ppir::ops::attrs::CommAttrs;

use super::{memref_type, tensor_type, Emitter, LowerError, OpView};

fn callback(e: &mut Emitter, field: usize) -> String {
    let slot = e.op(format!(
        "llvm.getelementptr %ctx[0, {field}] : (!llvm.ptr) -> !llvm.ptr, {}",
        super::CTX_LAYOUT
    ));
    e.op(format!("llvm.load {slot} : !llvm.ptr -> !llvm.ptr"))
}

pub fn lower(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let CommAttrs { peer, channel } = op.attrs()?;
    let (shape, d) = match op.kind {
        ppir::OpKind::Send => (op.in_shapes[0].clone(), op.in_dtypes[0]),
        _ => (op.out_shapes[0].clone(), op.out_dtypes[0]),
    };
    let tty = tensor_type(&shape, d);
    let mty = memref_type(&shape, d);
    let p = e.op(format!("arith.constant {peer} : i64"));
    let c = e.op(format!("arith.constant {channel} : i64"));
    match op.kind {
        ppir::OpKind::Send => {
            let x = e.name(op.op.operands()[0]);
            let m = e.op(format!(
                "bufferization.to_buffer {x} read_only : {tty} to {mty}"
            ));
            let data = data_pointer_simple(e, &m, &mty);
            let f = callback(e, 0);
            e.op(format!(
                "llvm.call {f}(%ctx, {p}, {c}, {data}) : !llvm.ptr, (!llvm.ptr, i64, i64, !llvm.ptr) -> i32"
            ));
            Ok(vec![])
        }
        _ => {
            let m = e.op(format!("memref.alloc() {{alignment = 64 : i64}} : {mty}"));
            let data = data_pointer_simple(e, &m, &mty);
            let f = callback(e, 1);
            e.op(format!(
                "llvm.call {f}(%ctx, {p}, {c}, {data}) : !llvm.ptr, (!llvm.ptr, i64, i64, !llvm.ptr) -> i32"
            ));
            let t = e.op(format!(
                "bufferization.to_tensor {m} restrict writable : {mty} to {tty}"
            ));
            Ok(vec![t])
        }
    }
}

/// `all_reduce`, `reduce_scatter`, `shard`, `all_gather`: the operand's buffer and a fresh
/// result buffer through callback 2, which finds the op (its kind, attributes and types)
/// by its channel: a channel belongs to one collective op of a function (the verifier
/// checks it).
pub fn lower_collective(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let channel = match op.kind {
        ppir::OpKind::AllReduce => op.attrs::<ppir::ops::attrs::AllReduceAttrs>()?.channel,
        _ => op.attrs::<ppir::ops::attrs::ShardAttrs>()?.channel,
    };
    let (shape, d) = (op.out_shapes[0].clone(), op.out_dtypes[0]);
    let (in_shape, in_d) = (op.in_shapes[0].clone(), op.in_dtypes[0]);
    let tty = tensor_type(&shape, d);
    let mty = memref_type(&shape, d);
    let in_tty = tensor_type(&in_shape, in_d);
    let in_mty = memref_type(&in_shape, in_d);
    let c = e.op(format!("arith.constant {channel} : i64"));
    let x = e.name(op.op.operands()[0]);
    let xm = e.op(format!(
        "bufferization.to_buffer {x} read_only : {in_tty} to {in_mty}"
    ));
    let xp = data_pointer_simple(e, &xm, &in_mty);
    let m = e.op(format!("memref.alloc() {{alignment = 64 : i64}} : {mty}"));
    let out = data_pointer_simple(e, &m, &mty);
    let f = callback(e, 2);
    e.op(format!(
        "llvm.call {f}(%ctx, {c}, {xp}, {out}) : !llvm.ptr, (!llvm.ptr, i64, !llvm.ptr, !llvm.ptr) -> i32"
    ));
    let t = e.op(format!(
        "bufferization.to_tensor {m} restrict writable : {mty} to {tty}"
    ));
    Ok(vec![t])
}

/// `!llvm.ptr` to the first element of an identity-layout memref (whose offset is 0 by
/// its type).
fn data_pointer_simple(e: &mut Emitter, memref: &str, mty: &str) -> String {
    let idx = e.op(format!(
        "memref.extract_aligned_pointer_as_index {memref} : {mty} -> index"
    ));
    let i = e.op(format!("arith.index_cast {idx} : index to i64"));
    e.op(format!("llvm.inttoptr {i} : i64 to !llvm.ptr"))
}
