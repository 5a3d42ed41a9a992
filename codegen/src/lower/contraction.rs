//! Contractions: `matmul`, `gemm`, `conv`, `conv_transpose`, `conv_grad_weight`, with the
//! interpreter's semantics (`ppir::interp::{linalg, conv, grad}`).
//!
//! * `matmul` (numpy): 1-D operands are promoted with `tensor.expand_shape` and the added
//!   dimension collapsed away again. Float products call the support GEMM
//!   (`ppcc_sgemm` / `ppcc_dgemm` in `codegen/src/support.c`, linked into every module):
//!   [`emit_gemm_call`] hands the operands' buffers to one call, or to a loop nest of calls
//!   over the batch dimensions (numpy broadcasting through zero strides); an operand that
//!   is a `transpose` of its last two dimensions is read through the call's transpose flag,
//!   and a batched left operand against one matrix is one 2-D product over its rows.
//!   Integer products (wrapping, as the interpreter's result is wrapped to the dtype) are
//!   [`emit_matmul2d`] (`linalg.matmul`), [`emit_batch_matmul`] (`linalg.batch_matmul`) or,
//!   for broadcast batches, one `linalg.generic` ([`emit_broadcast_matmul`]).
//! * `gemm`: one support-GEMM call computing `alpha · op(A) · op(B) + beta · C`, the
//!   transposes as flags and C broadcast into the result through its strides.
//! * `conv`, `conv_transpose`, `conv_grad_weight`: one `linalg.generic` each over
//!   `[N, group, channels per group, spatial..]` views (`tensor.expand_shape`, exact), with
//!   strided and dilated windows in the affine maps (`d3 * 2 + d7 * 3`). Padding is a
//!   zero-filled buffer with the input copied into its interior ([`place`]: a copy
//!   `linalg.generic` into a `tensor.extract_slice` of the buffer, inserted back, which
//!   bufferizes in place without `memref.copy`). `conv_transpose` is the gather form of the
//!   interpreter's scatter: the input is spread with `stride - 1` zeros between elements
//!   (a strided [`place`]) and correlated with the kernel read back to front.
//!
//! Float ops accept f32 and f64; f16/bf16 `matmul`, `gemm`, `conv` and `conv_transpose`
//! widen their operands to f64, compute in f64 and round each result once, as the
//! interpreter does; integer convolutions and f16/bf16 `conv_grad_weight` are refused.

use std::fmt::Write as _;

use ppir::ops::attrs::{
    ConvAttrs, ConvGradWeightAttrs, ConvTransposeAttrs, GemmAttrs, TransposeAttrs,
};
use ppir::ops::OpAttrs;
use ppir::{DType, OpKind};

use super::{
    elem_type, literal, memref_type, tensor_type, Body, Emitter, Iter, LowerError, OpView, Operand,
};

pub fn lower(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let (lo, hi) = match op.kind {
        OpKind::MatMul | OpKind::ConvGradWeight => (2, 2),
        _ => (2, 3),
    };
    check_arity(op, lo, hi)?;
    let r = match op.kind {
        OpKind::MatMul => matmul(e, op)?,
        OpKind::Gemm => gemm(e, op)?,
        OpKind::Conv => in_f64_if_half(e, op, conv)?,
        OpKind::ConvTranspose => in_f64_if_half(e, op, conv_transpose)?,
        OpKind::ConvGradWeight => conv_grad_weight(e, op)?,
        _ => return Err(op.unsupported("")),
    };
    Ok(vec![r])
}

/// `lower(op)` for f32/f64; for an f16/bf16 op, the interpreter's way: the operands
/// widened to f64 (exact), the op lowered in f64 and its result rounded once to the dtype.
fn in_f64_if_half(
    e: &mut Emitter,
    op: &OpView,
    lower: fn(&mut Emitter, &OpView) -> Result<String, LowerError>,
) -> Result<String, LowerError> {
    let d = op.out_dtypes.first().copied().unwrap_or(DType::F32);
    if !matches!(d, DType::F16 | DType::BF16) || op.in_dtypes.iter().any(|&t| t != d) {
        return lower(e, op);
    }
    let operands = op.op.operands();
    let names: Vec<String> = operands.iter().map(|&v| e.name(v)).collect();
    for ((&v, name), shape) in operands.iter().zip(&names).zip(&op.in_shapes) {
        let wide = super::elementwise::convert(e, name, shape, d, DType::F64);
        e.set_name(v, wide);
    }
    let wide = OpView {
        f: op.f,
        id: op.id,
        op: op.op,
        kind: op.kind,
        in_shapes: op.in_shapes.clone(),
        in_dtypes: vec![DType::F64; op.in_dtypes.len()],
        out_shapes: op.out_shapes.clone(),
        out_dtypes: vec![DType::F64; op.out_dtypes.len()],
    };
    let r = lower(e, &wide);
    // Later users of the operands read them in their own dtype.
    for (&v, name) in operands.iter().zip(names) {
        e.set_name(v, name);
    }
    let shape = op.out_shapes.first().cloned().unwrap_or_default();
    Ok(super::elementwise::convert(e, &r?, &shape, DType::F64, d))
}

// ---- shared helpers (also used by `pool`) ----

/// `lo..=hi` operands and one result (IR that did not verify gets an error, not a panic).
pub(super) fn check_arity(op: &OpView, lo: usize, hi: usize) -> Result<(), LowerError> {
    let n = op.in_shapes.len();
    if n < lo || n > hi || op.out_shapes.len() != 1 {
        return Err(op.invalid(format!(
            "expected {lo} to {hi} operands and one result, got {n} and {}",
            op.out_shapes.len()
        )));
    }
    Ok(())
}

/// The common dtype of every operand and the result, if it is one of `allowed`.
pub(super) fn common_dtype(op: &OpView, allowed: &[DType]) -> Result<DType, LowerError> {
    let d = op
        .out_dtypes
        .first()
        .copied()
        .ok_or_else(|| op.invalid("no result"))?;
    if let Some(&o) = op.in_dtypes.iter().find(|&&t| t != d) {
        return Err(op.invalid(format!(
            "operand dtype {o} differs from the result dtype {d}"
        )));
    }
    if !allowed.contains(&d) {
        let names: Vec<&str> = allowed.iter().map(|t| t.name()).collect();
        return Err(op.unsupported(format!(
            " (dtype {d}; lowered for {} only)",
            names.join(", ")
        )));
    }
    Ok(d)
}

/// An affine expression `Σ coef · d<dim> + constant` in MLIR syntax.
pub(super) fn affine(terms: &[(usize, i64)], constant: i64) -> String {
    let mut s = String::new();
    for &(dim, coef) in terms {
        if coef == 0 {
            continue;
        }
        let mag = coef.unsigned_abs();
        let term = if mag == 1 {
            format!("d{dim}")
        } else {
            format!("d{dim} * {mag}")
        };
        if s.is_empty() {
            if coef < 0 {
                s.push('-');
            }
        } else {
            s.push_str(if coef < 0 { " - " } else { " + " });
        }
        s.push_str(&term);
    }
    if s.is_empty() {
        return constant.to_string();
    }
    if constant != 0 {
        let _ = write!(
            s,
            " {} {}",
            if constant < 0 { '-' } else { '+' },
            constant.unsigned_abs()
        );
    }
    s
}

/// `d<i>` for each of `dims`.
pub(super) fn dims(dims: impl IntoIterator<Item = usize>) -> Vec<String> {
    dims.into_iter().map(|i| format!("d{i}")).collect()
}

fn join(v: &[u64]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// `src[lo + i]` for `i` below `count`, as a `tensor.extract_slice` (a view after
/// bufferization); `src` itself when that is everything.
fn slice_view(
    e: &mut Emitter,
    src: &str,
    shape: &[u64],
    lo: &[u64],
    count: &[u64],
    d: DType,
) -> String {
    if lo.iter().all(|&x| x == 0) && count == shape {
        return src.to_string();
    }
    let ones = vec![1; shape.len()];
    e.op(format!(
        "tensor.extract_slice {src}[{}] [{}] [{}] : {} to {}",
        join(lo),
        join(count),
        join(&ones),
        tensor_type(shape, d),
        tensor_type(count, d)
    ))
}

/// An identity-map copy of `src` into `init` (both of `shape`).
fn copy_into(e: &mut Emitter, src: &str, init: &str, shape: &[u64], d: DType) -> String {
    let rank = shape.len();
    e.generic(
        rank,
        &vec![Iter::Parallel; rank],
        &[Operand::identity(src, shape, d)],
        &[Operand::identity(init, shape, d)],
        &Body::default(),
        &["%in0".to_string()],
    )
    .remove(0)
}

/// A tensor of `dst_shape` filled with `fill`, with `src[src_lo + i]` (for `i` below
/// `count`) written at `dst_off + i · dst_stride`. The copy is a `linalg.generic` into a
/// `tensor.extract_slice` of the filled buffer, inserted back with `tensor.insert_slice`:
/// one-shot bufferization writes it in place (no `memref.copy`, which would need the MLIR
/// runner-utils library).
#[allow(clippy::too_many_arguments)]
pub(super) fn place(
    e: &mut Emitter,
    src: &str,
    src_shape: &[u64],
    src_lo: &[u64],
    count: &[u64],
    dst_shape: &[u64],
    dst_off: &[u64],
    dst_stride: &[u64],
    fill: f64,
    d: DType,
) -> String {
    let whole = src_lo.iter().all(|&x| x == 0)
        && count == src_shape
        && count == dst_shape
        && dst_off.iter().all(|&x| x == 0);
    if whole {
        return src.to_string();
    }
    let filled = e.filled(dst_shape, d, fill);
    if count.contains(&0) {
        return filled;
    }
    let part = slice_view(e, src, src_shape, src_lo, count, d);
    let dst_ty = tensor_type(dst_shape, d);
    let cnt_ty = tensor_type(count, d);
    let slice = e.op(format!(
        "tensor.extract_slice {filled}[{}] [{}] [{}] : {dst_ty} to {cnt_ty}",
        join(dst_off),
        join(count),
        join(dst_stride)
    ));
    let copy = copy_into(e, &part, &slice, count, d);
    e.op(format!(
        "tensor.insert_slice {copy} into {filled}[{}] [{}] [{}] : {cnt_ty} into {dst_ty}",
        join(dst_off),
        join(count),
        join(dst_stride)
    ))
}

/// `src[lo + i]` for `i` in `out_shape`, copied into a fresh tensor.
pub(super) fn crop(
    e: &mut Emitter,
    src: &str,
    src_shape: &[u64],
    lo: &[u64],
    out_shape: &[u64],
    d: DType,
) -> String {
    if src_shape == out_shape {
        return src.to_string();
    }
    let part = slice_view(e, src, src_shape, lo, out_shape, d);
    let init = e.empty(out_shape, d);
    copy_into(e, &part, &init, out_shape, d)
}

/// `acc + x · y` in the body (floats or wrapping integers).
fn mul_add(b: &mut Body, d: DType, x: &str, y: &str, acc: &str) -> String {
    let ty = elem_type(d);
    if d.is_float() {
        let p = b.op(format!("arith.mulf {x}, {y} : {ty}"));
        b.op(format!("arith.addf {acc}, {p} : {ty}"))
    } else {
        let p = b.op(format!("arith.muli {x}, {y} : {ty}"));
        b.op(format!("arith.addi {acc}, {p} : {ty}"))
    }
}

/// Strides, pads (all begins then all ends) and dilations of a window op, validated as the
/// interpreter does (positive strides and dilations, non-negative pads).
pub(super) struct Window {
    pub strides: Vec<u64>,
    pub pads: Vec<u64>,
    pub dilations: Vec<u64>,
}

impl Window {
    /// From a window op's `strides`, `pads` and `dilations` (absent: ones, zeros, ones).
    pub(super) fn new(
        op: &OpView,
        nsp: usize,
        strides: Option<&[i64]>,
        pads: Option<&[i64]>,
        dilations: Option<&[i64]>,
    ) -> Result<Window, LowerError> {
        let positive = |name: &str, v: Option<&[i64]>| -> Result<Vec<u64>, LowerError> {
            let v = v.map_or_else(|| vec![1; nsp], <[i64]>::to_vec);
            if v.len() != nsp || v.iter().any(|&s| !(1..=i32::MAX as i64).contains(&s)) {
                return Err(op.invalid(format!(
                    "`{name}` must be {nsp} positive integers, got {v:?}"
                )));
            }
            Ok(v.iter().map(|&s| s as u64).collect())
        };
        let strides = positive("strides", strides)?;
        let dilations = positive("dilations", dilations)?;
        let pads = pads.map_or_else(|| vec![0; 2 * nsp], <[i64]>::to_vec);
        if pads.len() != 2 * nsp || pads.iter().any(|&p| !(0..=i32::MAX as i64).contains(&p)) {
            return Err(op.invalid(format!(
                "`pads` must be {} non-negative integers (begins then ends), got {pads:?}",
                2 * nsp
            )));
        }
        Ok(Window {
            strides,
            pads: pads.iter().map(|&p| p as u64).collect(),
            dilations,
        })
    }

    /// Begin pad of spatial dimension `i`.
    pub(super) fn begin(&self, i: usize) -> u64 {
        self.pads[i]
    }

    /// End pad of spatial dimension `i`.
    pub(super) fn end(&self, i: usize) -> u64 {
        self.pads[self.strides.len() + i]
    }
}

fn group(op: &OpView, g: i64) -> Result<u64, LowerError> {
    if g < 1 {
        return Err(op.invalid(format!("`group` must be >= 1, got {g}")));
    }
    Ok(g as u64)
}

fn check_result(op: &OpView, want: &[u64]) -> Result<(), LowerError> {
    if op.out_shapes[0] != want {
        return Err(op.invalid(format!(
            "the result is declared {:?}, but the operands give {want:?}",
            op.out_shapes[0]
        )));
    }
    Ok(())
}

/// Split `[N, C, spatial..]`.
fn split_nc(op: &OpView, s: &[u64], what: &str) -> Result<(u64, u64, Vec<u64>), LowerError> {
    if s.len() < 2 {
        return Err(op.invalid(format!(
            "{what} must have shape [N, C, spatial..], got {s:?}"
        )));
    }
    Ok((s[0], s[1], s[2..].to_vec()))
}

/// A zero-padded copy of `x` (`[N, C, spatial..]`) with `extent[i] ≥ in[i] + begin[i]`
/// cells per spatial dimension, the input starting at `begin[i]`.
pub(super) fn pad_spatial(
    e: &mut Emitter,
    x: &str,
    xs: &[u64],
    begin: &[u64],
    extent: &[u64],
    fill: f64,
    d: DType,
) -> (String, Vec<u64>) {
    let mut dst = xs[..2].to_vec();
    dst.extend_from_slice(extent);
    let mut off = vec![0, 0];
    off.extend_from_slice(begin);
    let r = place(
        e,
        x,
        xs,
        &vec![0; xs.len()],
        xs,
        &dst,
        &off,
        &vec![1; xs.len()],
        fill,
        d,
    );
    (r, dst)
}

/// The bias `[M]` broadcast into `[N, G, M/G, spatial..]` (the accumulator's init), or
/// zeros without a bias.
fn bias_init(e: &mut Emitter, op: &OpView, out5: &[u64], d: DType) -> Result<String, LowerError> {
    let Some(&bv) = op.op.operands().get(2) else {
        return Ok(e.zeros(out5, d));
    };
    let (g, mg) = (out5[1], out5[2]);
    if op.in_shapes[2] != [g * mg] {
        return Err(op.invalid(format!(
            "bias must have shape [{}], got {:?}",
            g * mg,
            op.in_shapes[2]
        )));
    }
    let b = e.name(bv);
    let b2 = e.reshape(&b, &[g * mg], &[g, mg], d);
    let init = e.empty(out5, d);
    let rank = out5.len();
    Ok(e.generic(
        rank,
        &vec![Iter::Parallel; rank],
        &[Operand::new(b2, &[g, mg], d, dims([1, 2]))],
        &[Operand::identity(init, out5, d)],
        &Body::default(),
        &["%in0".to_string()],
    )
    .remove(0))
}

// ---- matmul and gemm ----

/// The support-library GEMM for `d` (`codegen/src/support.c`, `ppcc_support.h`), declared
/// in the module, and its name:
/// - `void ppcc_<s|d>gemm(i64 flags, i64 m, i64 n, i64 k, T alpha, T *a, i64 lda, T *b,
///   i64 ldb, T beta, T *c0, i64 c0_rs, i64 c0_cs, T *c, i64 ldc)` computes the row-major
///   `c = alpha · op(a) · op(b) [+ beta · c0]` (flags bit 0 / bit 1: `a` / `b` transposed;
///   `c0` null or broadcast through its strides);
/// - `batched`: `void ppcc_<s|d>gemm_batched(i64 flags, i64 m, i64 n, i64 k, T alpha, T *a,
///   i64 lda, i64 stride_a, T *b, i64 ldb, i64 stride_b, T beta, T *c, i64 ldc,
///   i64 stride_c, i64 count)`, `count` of those at strides (beta 0: C written, not read),
///   the form of batched products under [`crate::lower::LowerOptions::gpu_gemm`].
fn declare_gemm(e: &mut Emitter, d: DType, batched: bool) -> String {
    let sym = format!(
        "ppcc_{}gemm{}",
        if d == DType::F64 { "d" } else { "s" },
        if batched { "_batched" } else { "" }
    );
    let t = elem_type(d);
    let params = if batched {
        format!("i64, i64, i64, i64, {t}, !llvm.ptr, i64, i64, !llvm.ptr, i64, i64, {t}, !llvm.ptr, i64, i64, i64")
    } else {
        format!("i64, i64, i64, i64, {t}, !llvm.ptr, i64, !llvm.ptr, i64, {t}, !llvm.ptr, i64, i64, !llvm.ptr, i64")
    };
    e.declare(format!("llvm.func @{sym}({params})"));
    sym
}

/// `!llvm.ptr` to the first element of an identity-layout memref (offset 0 by its type).
pub(super) fn memref_ptr(e: &mut Emitter, memref: &str, mty: &str) -> String {
    let idx = e.op(format!(
        "memref.extract_aligned_pointer_as_index {memref} : {mty} -> index"
    ));
    let i = e.op(format!("arith.index_cast {idx} : index to i64"));
    e.op(format!("llvm.inttoptr {i} : i64 to !llvm.ptr"))
}

/// `!llvm.ptr` to the first element of tensor `t`'s buffer (read-only, dense row-major:
/// bufferization copies a strided view into an identity-layout buffer first).
pub(super) fn tensor_ptr(e: &mut Emitter, t: &str, shape: &[u64], d: DType) -> String {
    let mty = memref_type(shape, d);
    let m = e.op(format!(
        "bufferization.to_buffer {t} read_only : {} to {mty}",
        tensor_type(shape, d)
    ));
    memref_ptr(e, &m, &mty)
}

pub(super) fn i64_const(e: &mut Emitter, x: i64) -> String {
    e.op(format!("arith.constant {x} : i64"))
}

/// A matrix operand of a GEMM call: a dense row-major tensor of `shape` `[batch.., r, c]`
/// whose matrices are read transposed when `trans`.
struct Mat<'a> {
    name: &'a str,
    shape: &'a [u64],
    trans: bool,
}

impl<'a> Mat<'a> {
    fn new(name: &'a str, shape: &'a [u64], trans: bool) -> Self {
        Mat { name, shape, trans }
    }

    /// The row stride of the stored matrices (their last dimension; matrices have rank >= 2).
    fn ld(&self) -> u64 {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Row-major element strides of the batch dimensions `batch` (numpy broadcasting:
    /// missing and size-1 dimensions against larger ones have stride 0).
    fn batch_strides(&self, batch: &[u64]) -> Vec<u64> {
        let r = self.shape.len();
        let own = &self.shape[..r - 2];
        let lead = batch.len() - own.len();
        let mut strides = vec![0; batch.len()];
        let mut s = self.shape[r - 2] * self.shape[r - 1];
        for j in (0..own.len()).rev() {
            if own[j] != 1 {
                strides[lead + j] = s;
            }
            s *= own[j];
        }
        strides
    }
}

/// Loops over broadcast batch dimensions, merged where the three operands' strides allow:
/// `(count, stride of a, stride of b, stride of c)` from the outermost loop in.
fn batch_loops(batch: &[u64], sa: &[u64], sb: &[u64], sc: &[u64]) -> Vec<(u64, [u64; 3])> {
    let mut loops: Vec<(u64, [u64; 3])> = Vec::new();
    for i in (0..batch.len()).rev() {
        if batch[i] == 1 {
            continue;
        }
        let st = [sa[i], sb[i], sc[i]];
        if let Some((n, inner)) = loops.last_mut() {
            if (0..3).all(|x| st[x] == inner[x] * *n) {
                *n *= batch[i];
                continue;
            }
        }
        loops.push((batch[i], st));
    }
    loops.reverse();
    loops
}

/// `alpha · op(a)[i] · op(b)[i] (+ beta · c)` for every index `i` of `batch` (numpy
/// broadcasting of the operands' batch dimensions), as calls into the support GEMM: one
/// call, or a loop nest of calls over the batch dimensions that do not merge. `c` (`gemm`
/// only, no batch) is `(name, shape of rank <= 2 broadcast to m × n, beta)`. Returns the
/// `[batch.., m, n]` result, written by the calls into a fresh buffer.
#[allow(clippy::too_many_arguments)]
fn emit_gemm_call(
    e: &mut Emitter,
    a: Mat,
    b: Mat,
    batch: &[u64],
    (m, k, n): (u64, u64, u64),
    alpha: f64,
    c: Option<(&str, &[u64], f64)>,
    d: DType,
    shape: Option<&[u64]>,
) -> String {
    if !e.library_calls {
        let r = emit_gemm_generic(e, a, b, batch, (m, k, n), alpha, c, d);
        return match shape {
            Some(s) => {
                let mut out = batch.to_vec();
                out.extend([m, n]);
                e.reshape(&r, &out, s, d)
            }
            None => r,
        };
    }
    let sym = declare_gemm(e, d, false);
    let t = elem_type(d);
    // The buffer has the result's final shape (a dense row-major reshape of
    // `[batch.., m, n]`), so the caller's result is this allocation itself and the
    // function's output can take its place (no copy into a reshaped view).
    let out: Vec<u64> = match shape {
        Some(s) => s.to_vec(),
        None => batch.iter().copied().chain([m, n]).collect(),
    };
    let mty = memref_type(&out, d);
    let pa = tensor_ptr(e, a.name, a.shape, d);
    let pb = tensor_ptr(e, b.name, b.shape, d);
    // The GPU's library GEMM takes C0 only in place ([`LowerOptions::gpu_gemm`]): it is
    // broadcast into the result buffer first (below), and each call reads its own C.
    let c0_in_place = e.gpu_gemm && c.is_some();
    let (pc0, c0_rs, c0_cs, beta) = match c {
        // beta · C0 is the broadcast's (a zero beta still propagates C0's NaNs, as in
        // the interpreter; a BLAS with beta 0 would not read C), the call adds it.
        Some(_) if c0_in_place => (String::new(), n as i64, 1, 1.0),
        Some((cn, cs, beta)) => {
            let p = tensor_ptr(e, cn, cs, d);
            let (cr, cc) = match cs {
                [] => (1, 1),
                [x] => (1, *x),
                [x, y, ..] => (*x, *y),
            };
            let rs = if cr == 1 { 0 } else { cc };
            let cst = if cc == 1 { 0 } else { 1 };
            (p, rs as i64, cst, beta)
        }
        None => (e.op("llvm.mlir.zero : !llvm.ptr"), 0, 0, 0.0),
    };
    let alloc = e.op(format!("memref.alloc() {{alignment = 64 : i64}} : {mty}"));
    let pc = memref_ptr(e, &alloc, &mty);
    let flags = i64_const(e, a.trans as i64 | (b.trans as i64) << 1);
    let (mv, nv, kv) = (
        i64_const(e, m as i64),
        i64_const(e, n as i64),
        i64_const(e, k as i64),
    );
    let lda = i64_const(e, a.ld() as i64);
    let ldb = i64_const(e, b.ld() as i64);
    let ldc = i64_const(e, n as i64);
    let al = e.op(format!("arith.constant {} : {t}", literal(d, alpha)));
    let be = e.op(format!("arith.constant {} : {t}", literal(d, beta)));
    let (rs, cs) = (i64_const(e, c0_rs), i64_const(e, c0_cs));

    let sa = a.batch_strides(batch);
    let sb = b.batch_strides(batch);
    let mut sc = vec![0; batch.len()];
    let mut s = m * n;
    for i in (0..batch.len()).rev() {
        sc[i] = s;
        s *= batch[i];
    }
    let mut loops = batch_loops(batch, &sa, &sb, &sc);
    // The GPU's library takes the innermost batch loop as one strided-batched call.
    let batched = if e.gpu_gemm { loops.pop() } else { None };
    if batch.contains(&0) || m * n == 0 {
        // Nothing to compute: the result has no elements.
        return e.op(format!(
            "bufferization.to_tensor {alloc} restrict writable : {mty} to {}",
            tensor_type(&out, d)
        ));
    }
    if let (true, Some((cn, cs, beta))) = (c0_in_place, c) {
        let mut full = batch.to_vec();
        full.extend([m, n]);
        broadcast_into(e, (cn, cs, beta), &alloc, &out, &full, d);
    }
    let mut ptrs = [pa.clone(), pb.clone(), pc.clone()];
    if !loops.is_empty() {
        let zero = e.op("arith.constant 0 : index");
        let one = e.op("arith.constant 1 : index");
        let mut offs: [Option<String>; 3] = [None, None, None];
        for (count, strides) in &loops {
            let hi = e.op(format!("arith.constant {count} : index"));
            let iv = e.fresh();
            e.line(format!("scf.for {iv} = {zero} to {hi} step {one} {{"));
            for x in 0..3 {
                if strides[x] == 0 {
                    continue;
                }
                let st = e.op(format!("arith.constant {} : index", strides[x]));
                let term = e.op(format!("arith.muli {iv}, {st} : index"));
                offs[x] = Some(match &offs[x] {
                    None => term,
                    Some(o) => e.op(format!("arith.addi {o}, {term} : index")),
                });
            }
        }
        let bases = [&pa, &pb, &pc];
        for x in 0..3 {
            if let Some(o) = &offs[x] {
                let i = e.op(format!("arith.index_cast {o} : index to i64"));
                ptrs[x] = e.op(format!(
                    "llvm.getelementptr {}[{i}] : (!llvm.ptr, i64) -> !llvm.ptr, {t}",
                    bases[x]
                ));
            }
        }
    }
    let [pa, pb, pc] = &ptrs;
    if let Some((count, [stride_a, stride_b, stride_c])) = batched {
        // C in place with beta 1 (C0 broadcast into it above), else written (beta 0).
        let sym = declare_gemm(e, d, true);
        let [sa, sb, sc, n_batch] =
            [stride_a, stride_b, stride_c, count].map(|x| i64_const(e, x as i64));
        e.line(format!(
            "llvm.call @{sym}({flags}, {mv}, {nv}, {kv}, {al}, {pa}, {lda}, {sa}, {pb}, {ldb}, {sb}, {be}, {pc}, {ldc}, {sc}, {n_batch}) : (i64, i64, i64, i64, {t}, !llvm.ptr, i64, i64, !llvm.ptr, i64, i64, {t}, !llvm.ptr, i64, i64, i64) -> ()"
        ));
    } else {
        let pc0 = if c0_in_place { pc } else { &pc0 };
        e.line(format!(
            "llvm.call @{sym}({flags}, {mv}, {nv}, {kv}, {al}, {pa}, {lda}, {pb}, {ldb}, {be}, {pc0}, {rs}, {cs}, {pc}, {ldc}) : (i64, i64, i64, i64, {t}, !llvm.ptr, i64, !llvm.ptr, i64, {t}, !llvm.ptr, i64, i64, !llvm.ptr, i64) -> ()"
        ));
    }
    for _ in &loops {
        e.line("}");
    }
    e.op(format!(
        "bufferization.to_tensor {alloc} restrict writable : {mty} to {}",
        tensor_type(&out, d)
    ))
}

/// `beta · c` (`c` of shape `cs`, rank <= 2, aligned right against `(m, n)`, size-1
/// dimensions broadcast) written into every `m × n` matrix of `alloc`, a dense buffer of
/// shape `out` that holds the `full` = `[batch.., m, n]` result: a `linalg.generic` on
/// buffers (a kernel on the GPU), the initial value of a GEMM that adds its product to its
/// result ([`crate::lower::LowerOptions::gpu_gemm`]).
fn broadcast_into(
    e: &mut Emitter,
    (c, cs, beta): (&str, &[u64], f64),
    alloc: &str,
    out: &[u64],
    full: &[u64],
    d: DType,
) {
    let t = elem_type(d);
    let c_ty = memref_type(cs, d);
    let cm = e.op(format!(
        "bufferization.to_buffer {c} read_only : {} to {c_ty}",
        tensor_type(cs, d)
    ));
    let rank = full.len();
    let (view, view_ty) = if out == full {
        (alloc.to_string(), memref_type(out, d))
    } else {
        let mut strides = vec![1u64; rank];
        for i in (0..rank.saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * full[i + 1];
        }
        let join =
            |v: &[u64], sep: &str| v.iter().map(u64::to_string).collect::<Vec<_>>().join(sep);
        let ty = format!(
            "memref<{}x{t}, strided<[{}]>>",
            join(full, "x"),
            join(&strides, ", ")
        );
        let v = e.op(format!(
            "memref.reinterpret_cast {alloc} to offset: [0], sizes: [{}], strides: [{}] : {} to {ty}",
            join(full, ", "),
            join(&strides, ", "),
            memref_type(out, d)
        ));
        (v, ty)
    };
    let dims: Vec<String> = (0..rank).map(|i| format!("d{i}")).collect();
    let c_map: Vec<String> = cs
        .iter()
        .enumerate()
        .map(|(j, &s)| {
            if s == 1 {
                "0".to_string()
            } else {
                format!("d{}", rank - cs.len() + j)
            }
        })
        .collect();
    let domain = dims.join(", ");
    e.line(format!(
        "linalg.generic {{indexing_maps = [affine_map<({domain}) -> ({})>, affine_map<({domain}) -> ({domain})>], iterator_types = [{}]}} ins({cm} : {c_ty}) outs({view} : {view_ty}) {{",
        c_map.join(", "),
        vec!["\"parallel\""; rank].join(", ")
    ));
    e.out
        .push_str(&format!("    ^bb0(%in0: {t}, %out0: {t}):\n"));
    let value = if beta == 1.0 {
        "%in0".to_string()
    } else {
        let b = e.fresh();
        e.line(format!("  {b} = arith.constant {} : {t}", literal(d, beta)));
        let y = e.fresh();
        e.line(format!("  {y} = arith.mulf %in0, {b} : {t}"));
        y
    };
    e.line(format!("  linalg.yield {value} : {t}"));
    e.line("}");
}

/// [`emit_gemm_call`] as `linalg` on tensors, for targets without the support library
/// (CUDA, whose kernels come from these loops): one contraction `linalg.generic` over
/// `[batch.., m, n, k]` into zeros (operands indexed through their transposes and
/// broadcast batch dimensions), then, when `alpha != 1` or `c` is given, one pointwise
/// `alpha · p + beta · c` (the interpreter's order).
#[allow(clippy::too_many_arguments)]
fn emit_gemm_generic(
    e: &mut Emitter,
    a: Mat,
    b: Mat,
    batch: &[u64],
    (m, _k, n): (u64, u64, u64),
    alpha: f64,
    c: Option<(&str, &[u64], f64)>,
    d: DType,
) -> String {
    let nb = batch.len();
    let mut out = batch.to_vec();
    out.extend([m, n]);
    let (dm, dn, dk) = (
        format!("d{nb}"),
        format!("d{}", nb + 1),
        format!("d{}", nb + 2),
    );
    // The map of a `[own batch.., r, c]` operand: its batch dimensions aligned right
    // against `batch` (size 1 against a larger one reads index 0), then (row, col).
    let operand_map = |x: &Mat, row: &str, col: &str| {
        let r = x.shape.len();
        let mut map = batch_map(&x.shape[..r - 2], batch);
        if x.trans {
            map.extend([col.to_string(), row.to_string()]);
        } else {
            map.extend([row.to_string(), col.to_string()]);
        }
        map
    };
    let ma = operand_map(&a, &dm, &dk);
    let mb = operand_map(&b, &dk, &dn);
    let mut mo: Vec<String> = (0..nb).map(|i| format!("d{i}")).collect();
    mo.extend([dm.clone(), dn.clone()]);
    let acc = e.zeros(&out, d);
    let mut iters = vec![Iter::Parallel; nb + 2];
    iters.push(Iter::Reduction);
    let mut body = Body::default();
    let y = mul_add(&mut body, d, "%in0", "%in1", "%out0");
    let p = e
        .generic(
            nb + 3,
            &iters,
            &[
                Operand::new(a.name, a.shape, d, ma),
                Operand::new(b.name, b.shape, d, mb),
            ],
            &[Operand::new(acc, &out, d, mo)],
            &body,
            &[y],
        )
        .remove(0);
    if alpha == 1.0 && c.is_none() {
        return p;
    }
    let t = elem_type(d);
    let r = out.len();
    let mut inputs = vec![Operand::identity(p.as_str(), &out, d)];
    if let Some((cn, cs, _)) = c {
        // `c` (rank <= 2) broadcast against the trailing (m, n) dimensions.
        let map = batch_map(cs, &out);
        inputs.push(Operand::new(cn, cs, d, map));
    }
    let init = e.empty(&out, d);
    let mut body = Body::default();
    let mut y = "%in0".to_string();
    if alpha != 1.0 {
        let al = body.constant(d, alpha);
        y = body.op(format!("arith.mulf {y}, {al} : {t}"));
    }
    if let Some((_, _, beta)) = c {
        let bc = body.constant(d, beta);
        let bcv = body.op(format!("arith.mulf %in1, {bc} : {t}"));
        y = body.op(format!("arith.addf {y}, {bcv} : {t}"));
    }
    e.generic(
        r,
        &vec![Iter::Parallel; r],
        &inputs,
        &[Operand::identity(init, &out, d)],
        &body,
        &[y],
    )
    .remove(0)
}

/// `a (m×k) · b (k×n)` into a fresh tensor: floats call the support GEMM
/// ([`emit_gemm_call`]), integers are one `linalg.matmul` (wrapping).
pub fn emit_matmul2d(
    e: &mut Emitter,
    a: &str,
    b: &str,
    (m, k, n): (u64, u64, u64),
    d: DType,
) -> String {
    if d.is_float() {
        let (sa, sb) = ([m, k], [k, n]);
        let a = Mat::new(a, &sa, false);
        let b = Mat::new(b, &sb, false);
        return emit_gemm_call(e, a, b, &[], (m, k, n), 1.0, None, d, None);
    }
    let out = [m, n];
    let acc = e.zeros(&out, d);
    e.op(format!(
        "linalg.matmul ins({a}, {b} : {}, {}) outs({acc} : {}) -> {}",
        tensor_type(&[m, k], d),
        tensor_type(&[k, n], d),
        tensor_type(&out, d),
        tensor_type(&out, d)
    ))
}

/// `a[i] (m×k) · b[i] (k×n)` for `i < batch` into a fresh tensor: floats call the support
/// GEMM once per batch entry, integers are one `linalg.batch_matmul`.
pub fn emit_batch_matmul(
    e: &mut Emitter,
    a: &str,
    b: &str,
    batch: u64,
    (m, k, n): (u64, u64, u64),
    d: DType,
) -> String {
    if d.is_float() {
        let (sa, sb) = ([batch, m, k], [batch, k, n]);
        let a = Mat::new(a, &sa, false);
        let b = Mat::new(b, &sb, false);
        return emit_gemm_call(e, a, b, &[batch], (m, k, n), 1.0, None, d, None);
    }
    let out = [batch, m, n];
    let acc = e.zeros(&out, d);
    e.op(format!(
        "linalg.batch_matmul ins({a}, {b} : {}, {}) outs({acc} : {}) -> {}",
        tensor_type(&[batch, m, k], d),
        tensor_type(&[batch, k, n], d),
        tensor_type(&out, d),
        tensor_type(&out, d)
    ))
}

/// Operand `i` of a float matmul as the GEMM reads it: `(name, stored shape, transposed)`.
/// A `transpose` of the last two dimensions (rank >= 2) is folded into the transpose flag
/// and its source read directly; the transposed copy is then dead unless something else
/// uses it (the pipeline's `cse` erases dead ops).
fn gemm_operand(e: &Emitter, op: &OpView, i: usize) -> (String, Vec<u64>, bool) {
    let v = op.op.operands()[i];
    let shape = op.in_shapes[i].clone();
    let r = shape.len();
    let folded = (|| {
        if r < 2 {
            return None;
        }
        let p = op.f.op(op.f.producer(v)?);
        if p.kind != OpKind::Transpose || p.operands().len() != 1 {
            return None;
        }
        let perm = TransposeAttrs::of(&p.attrs).ok()?.perm;
        let perm: Vec<i64> = perm.unwrap_or_else(|| (0..r as i64).rev().collect());
        let norm: Vec<i64> = perm
            .iter()
            .map(|&x| if x < 0 { x + r as i64 } else { x })
            .collect();
        let mut want: Vec<i64> = (0..r as i64).collect();
        want.swap(r - 2, r - 1);
        if norm != want {
            return None;
        }
        let x = p.operands()[0];
        if !e.has_name(x) {
            return None;
        }
        let xs = e.shape(x).ok()?;
        (e.dtype(x) == e.dtype(v)).then(|| (e.name(x), xs, true))
    })();
    folded.unwrap_or_else(|| (e.name(v), shape, false))
}

/// The indexing of a batch of `shape` broadcast against `batch` (numpy rules): size-1
/// dimensions against larger ones index with 0, missing leading dimensions are dropped.
pub(super) fn batch_map(shape: &[u64], batch: &[u64]) -> Vec<String> {
    let lead = batch.len() - shape.len();
    shape
        .iter()
        .enumerate()
        .map(|(j, &s)| {
            if s == 1 && batch[lead + j] != 1 {
                "0".to_string()
            } else {
                format!("d{}", lead + j)
            }
        })
        .collect()
}

/// `a [.., m, k] · b [.., k, n]` with broadcast batches, as one `linalg.generic` over
/// `(batch.., m, k, n)` (the innermost loop streams rows of b and of the result).
#[allow(clippy::too_many_arguments)]
fn emit_broadcast_matmul(
    e: &mut Emitter,
    a: &str,
    a_shape: &[u64],
    b: &str,
    b_shape: &[u64],
    batch: &[u64],
    (m, _k, n): (u64, u64, u64),
    d: DType,
) -> String {
    let nb = batch.len();
    let (ra, rb) = (a_shape.len(), b_shape.len());
    let mut amap = batch_map(&a_shape[..ra - 2], batch);
    amap.extend(dims([nb, nb + 1]));
    let mut bmap = batch_map(&b_shape[..rb - 2], batch);
    bmap.extend(dims([nb + 1, nb + 2]));
    let mut out = batch.to_vec();
    out.extend([m, n]);
    let acc = e.zeros(&out, d);
    let mut iters = vec![Iter::Parallel; nb + 1];
    iters.extend([Iter::Reduction, Iter::Parallel]);
    let mut body = Body::default();
    let y = mul_add(&mut body, d, "%in0", "%in1", "%out0");
    e.generic(
        nb + 3,
        &iters,
        &[
            Operand::new(a, a_shape, d, amap),
            Operand::new(b, b_shape, d, bmap),
        ],
        &[Operand::new(acc, &out, d, dims((0..=nb).chain([nb + 2])))],
        &body,
        &[y],
    )
    .remove(0)
}

fn broadcast(a: &[u64], b: &[u64]) -> Option<Vec<u64>> {
    let rank = a.len().max(b.len());
    let mut out = vec![1u64; rank];
    for s in [a, b] {
        let off = rank - s.len();
        for (i, &x) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = x;
            } else if x != 1 && x != *o {
                return None;
            }
        }
    }
    Some(out)
}

/// `add(matmul(x, w), bias)` (op `add`, the product by op `mm`; see
/// `fuse::Plan::bias_matmul`): one GEMM call with the bias broadcast as its `C` where the
/// product is one matrix product, else the product and then the add as usual.
pub fn matmul_plus_bias(
    e: &mut Emitter,
    add: &OpView,
    mm: ppir::OpId,
    inlined: &dyn Fn(ppir::ValueId) -> Option<ppir::OpId>,
) -> Result<Vec<String>, LowerError> {
    let mv = super::elementwise::op_view(e, mm)?;
    let product = mv.op.results()[0];
    let bias = if add.op.operands()[0] == product {
        add.op.operands()[1]
    } else {
        add.op.operands()[0]
    };
    let d = e.dtype(bias);
    let bs = e.shape(bias)?;
    let bn = bs.last().copied().unwrap_or(1);
    let b2 = [1, bn];
    let bname = e.name(bias);
    let bname = e.reshape(&bname, &bs, &b2, d);
    let (r, used) = matmul_impl(e, &mv, Some((&bname, &b2)))?;
    if used {
        return Ok(vec![r]);
    }
    e.set_name(product, r);
    super::elementwise::lower_root(e, add, inlined)
}

fn matmul(e: &mut Emitter, op: &OpView) -> Result<String, LowerError> {
    Ok(matmul_impl(e, op, None)?.0)
}

/// A matmul, plus `bias` (a `[1, n]` or `[1, 1]` tensor, added to every row) when the
/// product is a single GEMM; the flag says whether the bias was added.
fn matmul_impl(
    e: &mut Emitter,
    op: &OpView,
    bias: Option<(&str, &[u64])>,
) -> Result<(String, bool), LowerError> {
    use DType::*;
    let d = common_dtype(op, &[F32, F64, F16, BF16, I64, I32, I8])?;
    let (sa, sb) = (&op.in_shapes[0], &op.in_shapes[1]);
    if sa.is_empty() || sb.is_empty() {
        return Err(op.invalid(format!(
            "operands must have rank >= 1, got {sa:?} and {sb:?}"
        )));
    }
    let ap = if sa.len() == 1 {
        vec![1, sa[0]]
    } else {
        sa.clone()
    };
    let bp = if sb.len() == 1 {
        vec![sb[0], 1]
    } else {
        sb.clone()
    };
    let (ra, rb) = (ap.len(), bp.len());
    let (m, k) = (ap[ra - 2], ap[ra - 1]);
    let (k2, n) = (bp[rb - 2], bp[rb - 1]);
    if k != k2 {
        return Err(op.invalid(format!(
            "contraction sizes differ: shapes {sa:?} and {sb:?}"
        )));
    }
    let (ba, bb) = (&ap[..ra - 2], &bp[..rb - 2]);
    let batch = broadcast(ba, bb).ok_or_else(|| {
        op.invalid(format!(
            "batch dimensions of {sa:?} and {sb:?} do not broadcast"
        ))
    })?;
    let mut full = batch.clone();
    full.extend([m, n]);
    let mut want = batch.clone();
    if sa.len() > 1 {
        want.push(m);
    }
    if sb.len() > 1 {
        want.push(n);
    }
    check_result(op, &want)?;

    if matches!(d, F16 | BF16) {
        let r = half_matmul(e, op, (&ap, &bp), &batch, (m, k, n), d);
        return Ok((e.reshape(&r, &full, &want, d), false));
    }
    if d.is_float() {
        let (r, used) = float_matmul(e, op, (&ap, &bp), &batch, (m, k, n), d, bias);
        return Ok((e.reshape(&r, &full, &want, d), used));
    }
    let a = e.name(op.op.operands()[0]);
    let b = e.name(op.op.operands()[1]);
    let a = e.reshape(&a, sa, &ap, d);
    let b = e.reshape(&b, sb, &bp, d);
    let nb: u64 = batch.iter().product();
    let r = if batch.is_empty() {
        emit_matmul2d(e, &a, &b, (m, k, n), d)
    } else if ba == batch.as_slice() && bb == batch.as_slice() {
        let a3 = e.reshape(&a, &ap, &[nb, m, k], d);
        let b3 = e.reshape(&b, &bp, &[nb, k, n], d);
        let r3 = emit_batch_matmul(e, &a3, &b3, nb, (m, k, n), d);
        e.reshape(&r3, &[nb, m, n], &full, d)
    } else if ba == batch.as_slice() && bb.iter().all(|&x| x == 1) {
        // The right operand is one matrix: the left one's batch folds into its rows.
        let a2 = e.reshape(&a, &ap, &[nb * m, k], d);
        let b2 = e.reshape(&b, &bp, &[k, n], d);
        let r2 = emit_matmul2d(e, &a2, &b2, (nb * m, k, n), d);
        e.reshape(&r2, &[nb * m, n], &full, d)
    } else {
        emit_broadcast_matmul(e, &a, &ap, &b, &bp, &batch, (m, k, n), d)
    };
    Ok((e.reshape(&r, &full, &want, d), false))
}

/// A float `matmul` of the promoted shapes `ap` `[.., m, k]` and `bp` `[.., k, n]` with
/// broadcast `batch`, as support-GEMM calls ([`emit_gemm_call`]): operands that are a
/// `transpose` of the last two dimensions are read through the transpose flag
/// ([`gemm_operand`]), and a batched left operand against one matrix is one 2-D product
/// over its rows. Returns the `[batch.., m, n]` result.
fn float_matmul(
    e: &mut Emitter,
    op: &OpView,
    (ap, bp): (&[u64], &[u64]),
    batch: &[u64],
    (m, k, n): (u64, u64, u64),
    d: DType,
    bias: Option<(&str, &[u64])>,
) -> (String, bool) {
    let (sa, sb) = (&op.in_shapes[0], &op.in_shapes[1]);
    // 1-D operands are promoted by a reshape; the others may be transposes.
    let (a, a_shape, ta) = if sa.len() == 1 {
        let a = e.name(op.op.operands()[0]);
        (e.reshape(&a, sa, ap, d), ap.to_vec(), false)
    } else {
        gemm_operand(e, op, 0)
    };
    let (b, b_shape, tb) = if sb.len() == 1 {
        let b = e.name(op.op.operands()[1]);
        (e.reshape(&b, sb, bp, d), bp.to_vec(), false)
    } else {
        gemm_operand(e, op, 1)
    };
    let (ra, rb) = (a_shape.len(), b_shape.len());
    let b_single = b_shape[..rb - 2].iter().all(|&x| x == 1);
    let nb: u64 = batch.iter().product();
    if !batch.is_empty() && !ta && b_single && a_shape[..ra - 2] == *batch {
        // The right operand is one matrix: the left one's batch folds into its rows.
        let a2_shape = [nb * m, k];
        let a2 = e.reshape(&a, &a_shape, &a2_shape, d);
        let b2_shape = [b_shape[rb - 2], b_shape[rb - 1]];
        let b2 = e.reshape(&b, &b_shape, &b2_shape, d);
        let mut full = batch.to_vec();
        full.extend([m, n]);
        let r = emit_gemm_call(
            e,
            Mat::new(&a2, &a2_shape, false),
            Mat::new(&b2, &b2_shape, tb),
            &[],
            (nb * m, k, n),
            1.0,
            bias.map(|(name, shape)| (name, shape, 1.0)),
            d,
            Some(&full),
        );
        return (r, bias.is_some());
    }
    // A bias rides along only on a single (unbatched) product.
    let bias = bias.filter(|_| batch.is_empty());
    let r = emit_gemm_call(
        e,
        Mat::new(&a, &a_shape, ta),
        Mat::new(&b, &b_shape, tb),
        batch,
        (m, k, n),
        1.0,
        bias.map(|(name, shape)| (name, shape, 1.0)),
        d,
        None,
    );
    (r, bias.is_some())
}

/// An f16/bf16 `matmul` as the interpreter computes it: the operands widened to f64
/// (exact), one f64 product ([`emit_gemm_call`]) and each result rounded once to `d` as
/// the interpreter's `cast` rounds. Returns the `[batch.., m, n]` result.
fn half_matmul(
    e: &mut Emitter,
    op: &OpView,
    (ap, bp): (&[u64], &[u64]),
    batch: &[u64],
    (m, k, n): (u64, u64, u64),
    d: DType,
) -> String {
    let (sa, sb) = (&op.in_shapes[0], &op.in_shapes[1]);
    let a = e.name(op.op.operands()[0]);
    let b = e.name(op.op.operands()[1]);
    let a = super::elementwise::convert(e, &a, sa, d, DType::F64);
    let b = super::elementwise::convert(e, &b, sb, d, DType::F64);
    let a = e.reshape(&a, sa, ap, DType::F64);
    let b = e.reshape(&b, sb, bp, DType::F64);
    let r = emit_gemm_call(
        e,
        Mat::new(&a, ap, false),
        Mat::new(&b, bp, false),
        batch,
        (m, k, n),
        1.0,
        None,
        DType::F64,
        None,
    );
    let mut full = batch.to_vec();
    full.extend([m, n]);
    super::elementwise::convert(e, &r, &full, DType::F64, d)
}

fn gemm(e: &mut Emitter, op: &OpView) -> Result<String, LowerError> {
    let d = common_dtype(op, &[DType::F32, DType::F64, DType::F16, DType::BF16])?;
    let (sa, sb) = (&op.in_shapes[0], &op.in_shapes[1]);
    if sa.len() != 2 || sb.len() != 2 {
        return Err(op.invalid(format!("operands must be 2-D, got {sa:?} and {sb:?}")));
    }
    let GemmAttrs {
        alpha,
        beta,
        trans_a,
        trans_b,
    } = op.attrs()?;
    let (m, k) = if trans_a {
        (sa[1], sa[0])
    } else {
        (sa[0], sa[1])
    };
    let (k2, n) = if trans_b {
        (sb[1], sb[0])
    } else {
        (sb[0], sb[1])
    };
    if k != k2 {
        return Err(op.invalid(format!(
            "contraction sizes differ: A {sa:?} (trans_a = {}) and B {sb:?} (trans_b = {})",
            trans_a as i64, trans_b as i64
        )));
    }
    let out = [m, n];
    check_result(op, &out)?;
    let c = op.op.operands().get(2).copied();
    if c.is_some() {
        let cs = &op.in_shapes[2];
        if cs.len() > 2 || broadcast(cs, &out).as_deref() != Some(&out[..]) {
            return Err(op.invalid(format!(
                "C of shape {cs:?} does not broadcast to the result {out:?}"
            )));
        }
    }
    // f16/bf16 operands are widened to f64 (exact) and the result rounded once.
    let cd = if matches!(d, DType::F16 | DType::BF16) {
        DType::F64
    } else {
        d
    };
    let a = e.name(op.op.operands()[0]);
    let a = super::elementwise::convert(e, &a, sa, d, cd);
    let b = e.name(op.op.operands()[1]);
    let b = super::elementwise::convert(e, &b, sb, d, cd);
    let c = c.map(|c| {
        let cs = op.in_shapes[2].clone();
        let name = e.name(c);
        (super::elementwise::convert(e, &name, &cs, d, cd), cs)
    });
    // alpha · op(A) · op(B) + beta · C in one call: the transposes are flags, C is
    // broadcast into the result through its strides (the interpreter's order: the product
    // times alpha, plus beta · C).
    let r = emit_gemm_call(
        e,
        Mat::new(&a, sa, trans_a),
        Mat::new(&b, sb, trans_b),
        &[],
        (m, k, n),
        alpha,
        c.as_ref().map(|(n, s)| (n.as_str(), s.as_slice(), beta)),
        cd,
        None,
    );
    Ok(super::elementwise::convert(e, &r, &out, cd, d))
}

// ---- convolutions ----

/// Loop layout of the convolution generics: `n, g, m/g` (parallel) first, then
/// - for the CPU's loops, `c/g, kernel..` (reductions) and the output's spatial dimensions
///   innermost, so that the innermost loop runs along an output row;
/// - for the GPU's kernels (any lowering without the CPU's library), the output's spatial
///   dimensions before the reductions: every parallel dimension is then one loop, a thread
///   per output element summing its window, instead of a parallel loop nested inside the
///   reductions, which MLIR's tiling (it tiles innermost parallel loops) and mapping would
///   turn into blocks of one thread each looping over the window.
struct ConvLoops {
    nsp: usize,
    reductions_last: bool,
}

impl ConvLoops {
    fn new(e: &Emitter, nsp: usize) -> ConvLoops {
        ConvLoops {
            nsp,
            reductions_last: !e.cpu_library(),
        }
    }
    fn cg(&self) -> usize {
        if self.reductions_last {
            3 + self.nsp
        } else {
            3
        }
    }
    fn j(&self, i: usize) -> usize {
        self.cg() + 1 + i
    }
    fn z(&self, i: usize) -> usize {
        if self.reductions_last {
            3 + i
        } else {
            4 + self.nsp + i
        }
    }
    fn count(&self) -> usize {
        4 + 2 * self.nsp
    }
    fn iters(&self) -> Vec<Iter> {
        let (p, r) = (Iter::Parallel, Iter::Reduction);
        let mut v = vec![p; 3];
        if self.reductions_last {
            v.extend(vec![p; self.nsp]);
            v.extend(vec![r; 1 + self.nsp]);
        } else {
            v.extend(vec![r; 1 + self.nsp]);
            v.extend(vec![p; self.nsp]);
        }
        v
    }
}

fn with_nc(a: u64, b: u64, c: u64, rest: &[u64]) -> Vec<u64> {
    let mut v = vec![a, b, c];
    v.extend_from_slice(rest);
    v
}

fn conv(e: &mut Emitter, op: &OpView) -> Result<String, LowerError> {
    let d = common_dtype(op, &[DType::F32, DType::F64])?;
    let (xs, ws) = (&op.in_shapes[0], &op.in_shapes[1]);
    let (n, c, in_sp) = split_nc(op, xs, "x")?;
    let nsp = in_sp.len();
    if ws.len() != xs.len() {
        return Err(op.invalid(format!("w must have rank {} like x, got {ws:?}", xs.len())));
    }
    let (m, cg, ks) = (ws[0], ws[1], ws[2..].to_vec());
    let a: ConvAttrs = op.attrs()?;
    let g = group(op, a.group)?;
    if c % g != 0 || m % g != 0 || cg * g != c {
        return Err(op.invalid(format!(
            "group {g} must divide the {c} input and {m} output channels, and w {ws:?} must have C/group input channels"
        )));
    }
    // An optional `kernel_shape` must agree with w.
    if let Some(kattr) = &a.kernel_shape {
        if kattr.len() != nsp || kattr.iter().zip(&ks).any(|(&a, &b)| a < 0 || a as u64 != b) {
            return Err(op.invalid(format!(
                "kernel_shape {kattr:?} disagrees with w of shape {ws:?}"
            )));
        }
    }
    let win = Window::new(
        op,
        nsp,
        a.strides.as_deref(),
        a.pads.as_deref(),
        a.dilations.as_deref(),
    )?;
    let mut out_sp = Vec::with_capacity(nsp);
    let mut extent = Vec::with_capacity(nsp);
    for i in 0..nsp {
        let span = win.dilations[i] * ks[i].saturating_sub(1) + 1;
        let padded = in_sp[i] + win.begin(i) + win.end(i);
        if ks[i] == 0 || padded < span {
            return Err(op.invalid(format!(
                "spatial dimension {i}: kernel {} (dilation {}) does not fit the padded input of size {padded}",
                ks[i], win.dilations[i]
            )));
        }
        out_sp.push((padded - span) / win.strides[i] + 1);
        extent.push(padded);
    }
    let mut want = vec![n, m];
    want.extend(&out_sp);
    check_result(op, &want)?;
    let mg = m / g;

    let x = e.name(op.op.operands()[0]);
    let w = e.name(op.op.operands()[1]);
    let begins: Vec<u64> = (0..nsp).map(|i| win.begin(i)).collect();
    let (xp, xps) = pad_spatial(e, &x, xs, &begins, &extent, 0.0, d);
    let k: u64 = c * ks.iter().product::<u64>();
    let ohw: u64 = out_sp.iter().product();
    if g == 1 && n * k * ohw * d.size_bytes() as u64 <= IM2COL_MAX_BYTES {
        return conv_im2col(e, op, (&xp, &xps), &w, (&ks, &out_sp), &win, &want, d);
    }
    let x5s = with_nc(n, g, cg, &xps[2..]);
    let x5 = e.reshape(&xp, &xps, &x5s, d);
    let w5s = with_nc(g, mg, cg, &ks);
    let w5 = e.reshape(&w, ws, &w5s, d);
    let out5 = with_nc(n, g, mg, &out_sp);
    let init = bias_init(e, op, &out5, d)?;

    let l = ConvLoops::new(e, nsp);
    let mut xmap = dims([0, 1, l.cg()]);
    let mut wmap = dims([1, 2, l.cg()]);
    let mut omap = dims([0, 1, 2]);
    for i in 0..nsp {
        xmap.push(affine(
            &[
                (l.z(i), win.strides[i] as i64),
                (l.j(i), win.dilations[i] as i64),
            ],
            0,
        ));
        wmap.push(format!("d{}", l.j(i)));
        omap.push(format!("d{}", l.z(i)));
    }
    let mut body = Body::default();
    let y = mul_add(&mut body, d, "%in1", "%in0", "%out0");
    let r = e
        .generic(
            l.count(),
            &l.iters(),
            &[
                Operand::new(x5, &x5s, d, xmap),
                Operand::new(w5, &w5s, d, wmap),
            ],
            &[Operand::new(init, &out5, d, omap)],
            &body,
            &[y],
        )
        .remove(0);
    Ok(e.reshape(&r, &out5, &want, d))
}

/// Largest patch matrix (bytes) a convolution is lowered through; beyond it the direct
/// loop nest, which needs no extra memory.
const IM2COL_MAX_BYTES: u64 = 256 << 20;

/// An ungrouped convolution as patches and a GEMM per image: `cols[n, c, j.., z..] =
/// xp[n, c, z·stride + j·dilation]` (xp: the zero-padded input), viewed as `[n, K, OHW]`
/// with K = C·∏kernel, then `y[n] = w[M, K] · cols[n] (+ bias per output channel)` with the
/// support GEMM, which writes `[n, M, OHW]`, the output's own layout.
#[allow(clippy::too_many_arguments)]
fn conv_im2col(
    e: &mut Emitter,
    op: &OpView,
    (xp, xps): (&str, &[u64]),
    w: &str,
    (ks, out_sp): (&[u64], &[u64]),
    win: &Window,
    want: &[u64],
    d: DType,
) -> Result<String, LowerError> {
    let nsp = ks.len();
    let (n, c, m) = (xps[0], xps[1], want[1]);
    let k: u64 = c * ks.iter().product::<u64>();
    let ohw: u64 = out_sp.iter().product();
    let mut cs = vec![n, c];
    cs.extend(ks);
    cs.extend(out_sp);
    let rank = cs.len();
    let mut xmap = vec!["d0".to_string(), "d1".to_string()];
    for i in 0..nsp {
        xmap.push(affine(
            &[
                (2 + nsp + i, win.strides[i] as i64),
                (2 + i, win.dilations[i] as i64),
            ],
            0,
        ));
    }
    let init = e.empty(&cs, d);
    let cols = e
        .generic(
            rank,
            &vec![Iter::Parallel; rank],
            &[Operand::new(xp, xps, d, xmap)],
            &[Operand::identity(init, &cs, d)],
            &Body::default(),
            &["%in0".to_string()],
        )
        .remove(0);
    let cols3 = e.reshape(&cols, &cs, &[n, k, ohw], d);
    let ws = &op.in_shapes[1];
    let w2 = e.reshape(w, ws, &[m, k], d);
    let bias = match op.op.operands().get(2) {
        None => None,
        Some(&bv) => {
            if op.in_shapes[2] != [m] {
                return Err(op.invalid(format!(
                    "bias must have shape [{m}], got {:?}",
                    op.in_shapes[2]
                )));
            }
            let b = e.name(bv);
            Some(e.reshape(&b, &[m], &[m, 1], d))
        }
    };
    let (a_shape, b_shape, bias_shape) = ([m, k], [n, k, ohw], [m, 1]);
    let r = emit_gemm_call(
        e,
        Mat::new(&w2, &a_shape, false),
        Mat::new(&cols3, &b_shape, false),
        &[n],
        (m, k, ohw),
        1.0,
        bias.as_deref().map(|b| (b, &bias_shape[..], 1.0)),
        d,
        Some(want),
    );
    Ok(r)
}

fn conv_transpose(e: &mut Emitter, op: &OpView) -> Result<String, LowerError> {
    let d = common_dtype(op, &[DType::F32, DType::F64])?;
    let (xs, ws) = (&op.in_shapes[0], &op.in_shapes[1]);
    let (n, c, in_sp) = split_nc(op, xs, "x")?;
    let nsp = in_sp.len();
    if ws.len() != xs.len() || ws[0] != c {
        return Err(op.invalid(format!(
            "w must have shape [{c}, M/group, k..] (rank {}), got {ws:?}",
            xs.len()
        )));
    }
    let a: ConvTransposeAttrs = op.attrs()?;
    let g = group(op, a.group)?;
    if c % g != 0 {
        return Err(op.invalid(format!("group {g} must divide the {c} input channels")));
    }
    let (cg, mg, ks) = (c / g, ws[1], ws[2..].to_vec());
    let m = mg * g;
    let win = Window::new(
        op,
        nsp,
        a.strides.as_deref(),
        a.pads.as_deref(),
        a.dilations.as_deref(),
    )?;
    let out_pad = a.output_padding.unwrap_or_else(|| vec![0; nsp]);
    if out_pad.len() != nsp || out_pad.iter().any(|&p| !(0..=i32::MAX as i64).contains(&p)) {
        return Err(op.invalid(format!(
            "`output_padding` must be {nsp} non-negative integers, got {out_pad:?}"
        )));
    }
    let mut out_sp = Vec::with_capacity(nsp);
    for i in 0..nsp {
        let full = win.strides[i] * in_sp[i].saturating_sub(1)
            + out_pad[i] as u64
            + win.dilations[i] * ks[i].saturating_sub(1)
            + 1;
        let pads = win.begin(i) + win.end(i);
        if in_sp[i] == 0 || ks[i] == 0 || full <= pads {
            return Err(op.invalid(format!(
                "spatial dimension {i}: the output size would be {}",
                full as i64 - pads as i64
            )));
        }
        out_sp.push(full - pads);
    }
    let mut want = vec![n, m];
    want.extend(&out_sp);
    check_result(op, &want)?;

    // Gather form of `out[i·s + j·dil - pad] += x[i] · w[j]`: with x spread out as
    // X[u] = x[i] at u = i·s + q (q = (k - 1)·dil - pad_begin, zeros elsewhere),
    // out[z] = Σ_j X[z + (k - 1 - j)·dil] · w[j].
    let mut ext = vec![n, c];
    let mut src_lo = vec![0, 0];
    let mut count = vec![n, c];
    let mut off = vec![0, 0];
    let mut step = vec![1, 1];
    for i in 0..nsp {
        let (s, dil, k) = (win.strides[i] as i64, win.dilations[i] as i64, ks[i] as i64);
        let q = (k - 1) * dil - win.begin(i) as i64;
        let len = out_sp[i] as i64 + (k - 1) * dil;
        let lo = if q >= 0 { 0 } else { (-q + s - 1) / s };
        let hi = if len - q > 0 {
            ((len - q + s - 1) / s).min(in_sp[i] as i64)
        } else {
            0
        };
        let cnt = (hi - lo).max(0);
        ext.push(len as u64);
        src_lo.push(lo as u64);
        count.push(cnt as u64);
        off.push(if cnt > 0 { (lo * s + q) as u64 } else { 0 });
        step.push(s as u64);
    }
    let x = e.name(op.op.operands()[0]);
    let w = e.name(op.op.operands()[1]);
    let xp = place(e, &x, xs, &src_lo, &count, &ext, &off, &step, 0.0, d);
    let x5s = with_nc(n, g, cg, &ext[2..]);
    let x5 = e.reshape(&xp, &ext, &x5s, d);
    let w5s = with_nc(g, cg, mg, &ks);
    let w5 = e.reshape(&w, ws, &w5s, d);
    let out5 = with_nc(n, g, mg, &out_sp);
    let init = bias_init(e, op, &out5, d)?;

    let l = ConvLoops::new(e, nsp);
    let mut xmap = dims([0, 1, l.cg()]);
    let mut wmap = dims([1, l.cg(), 2]);
    let mut omap = dims([0, 1, 2]);
    for (i, &k) in ks.iter().enumerate() {
        let dil = win.dilations[i] as i64;
        xmap.push(affine(&[(l.z(i), 1), (l.j(i), -dil)], (k as i64 - 1) * dil));
        wmap.push(format!("d{}", l.j(i)));
        omap.push(format!("d{}", l.z(i)));
    }
    let mut body = Body::default();
    let y = mul_add(&mut body, d, "%in1", "%in0", "%out0");
    let r = e
        .generic(
            l.count(),
            &l.iters(),
            &[
                Operand::new(x5, &x5s, d, xmap),
                Operand::new(w5, &w5s, d, wmap),
            ],
            &[Operand::new(init, &out5, d, omap)],
            &body,
            &[y],
        )
        .remove(0);
    Ok(e.reshape(&r, &out5, &want, d))
}

fn conv_grad_weight(e: &mut Emitter, op: &OpView) -> Result<String, LowerError> {
    let d = common_dtype(op, &[DType::F32, DType::F64])?;
    let (xs, dys) = (&op.in_shapes[0], &op.in_shapes[1]);
    let (n, c, in_sp) = split_nc(op, xs, "x")?;
    let nsp = in_sp.len();
    let a: ConvGradWeightAttrs = op.attrs()?;
    let ks = &a.kernel_shape;
    if ks.len() != nsp || ks.iter().any(|&k| !(1..=i32::MAX as i64).contains(&k)) {
        return Err(op.invalid(format!(
            "`kernel_shape` must be {nsp} positive sizes, got {ks:?}"
        )));
    }
    let ks: Vec<u64> = ks.iter().map(|&k| k as u64).collect();
    if dys.len() != xs.len() {
        return Err(op.invalid(format!("dy must have rank {}, got {dys:?}", xs.len())));
    }
    let m = dys[1];
    let g = group(op, a.group)?;
    if c % g != 0 || m % g != 0 {
        return Err(op.invalid(format!(
            "group {g} must divide the {c} input and {m} output channels"
        )));
    }
    let (cg, mg) = (c / g, m / g);
    let win = Window::new(
        op,
        nsp,
        a.strides.as_deref(),
        a.pads.as_deref(),
        a.dilations.as_deref(),
    )?;
    let mut out_sp = Vec::with_capacity(nsp);
    let mut extent = Vec::with_capacity(nsp);
    for i in 0..nsp {
        let span = win.dilations[i] * (ks[i] - 1) + 1;
        let padded = in_sp[i] + win.begin(i) + win.end(i);
        if padded < span {
            return Err(op.invalid(format!(
                "spatial dimension {i}: kernel {} (dilation {}) does not fit the padded input of size {padded}",
                ks[i], win.dilations[i]
            )));
        }
        out_sp.push((padded - span) / win.strides[i] + 1);
        extent.push(padded);
    }
    let mut dy_want = vec![n, m];
    dy_want.extend(&out_sp);
    if *dys != dy_want {
        return Err(op.invalid(format!("dy must have shape {dy_want:?}, got {dys:?}")));
    }
    let mut want = vec![m, cg];
    want.extend(&ks);
    check_result(op, &want)?;

    let x = e.name(op.op.operands()[0]);
    let dy = e.name(op.op.operands()[1]);
    let begins: Vec<u64> = (0..nsp).map(|i| win.begin(i)).collect();
    let (xp, xps) = pad_spatial(e, &x, xs, &begins, &extent, 0.0, d);
    let x5s = with_nc(n, g, cg, &xps[2..]);
    let x5 = e.reshape(&xp, &xps, &x5s, d);
    let dy5s = with_nc(n, g, mg, &out_sp);
    let dy5 = e.reshape(&dy, dys, &dy5s, d);
    let out5 = with_nc(g, mg, cg, &ks);
    let acc = e.zeros(&out5, d);

    // Loops (g, m/g, c/g, kernel.., n, out spatial..); the last 1 + nsp reduce.
    let j = |i: usize| 3 + i;
    let nl = 3 + nsp;
    let z = |i: usize| 4 + nsp + i;
    let mut xmap = dims([nl, 0, 2]);
    let mut dymap = dims([nl, 0, 1]);
    let mut omap = dims([0, 1, 2]);
    for i in 0..nsp {
        xmap.push(affine(
            &[
                (z(i), win.strides[i] as i64),
                (j(i), win.dilations[i] as i64),
            ],
            0,
        ));
        dymap.push(format!("d{}", z(i)));
        omap.push(format!("d{}", j(i)));
    }
    let mut iters = vec![Iter::Parallel; 3 + nsp];
    iters.extend(vec![Iter::Reduction; 1 + nsp]);
    let mut body = Body::default();
    let ty = elem_type(d);
    let p = body.op(format!("arith.mulf %in1, %in0 : {ty}"));
    // Every loop innermost to dw's is a reduction: `reassoc` lets LLVM vectorise the
    // sum (about 4x faster; the interpreter sums in f64, so no f32 order is "the" one).
    let y = body.op(format!("arith.addf %out0, {p} fastmath<reassoc> : {ty}"));
    let r = e
        .generic(
            4 + 2 * nsp,
            &iters,
            &[
                Operand::new(x5, &x5s, d, xmap),
                Operand::new(dy5, &dy5s, d, dymap),
            ],
            &[Operand::new(acc, &out5, d, omap)],
            &body,
            &[y],
        )
        .remove(0);
    Ok(e.reshape(&r, &out5, &want, d))
}

/// A dense constant 1-D tensor of `values` in dtype `d`.
pub(super) fn dense_1d(e: &mut Emitter, values: &[f64], d: DType) -> String {
    let items: Vec<String> = values.iter().map(|&v| literal(d, v)).collect();
    e.constant_tensor(
        &format!("dense<[{}]>", items.join(", ")),
        &[values.len() as u64],
        d,
    )
}
