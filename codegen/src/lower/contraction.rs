//! Contractions: `matmul`, `gemm`, `conv`, `conv_transpose`, `conv_grad_weight`, with the
//! interpreter's semantics (`ppir::interp::{linalg, conv, grad}`).
//!
//! * `matmul` (numpy): 1-D operands are promoted with `tensor.expand_shape` and the added
//!   dimension collapsed away again. Plain shapes go to [`emit_matmul2d`] (`linalg.matmul`)
//!   or [`emit_batch_matmul`] (`linalg.batch_matmul`), collapsing leading dimensions where
//!   that is exact (equal batches; a batched left operand against a matrix); batches that
//!   broadcast become one `linalg.generic` ([`emit_broadcast_matmul`]). Floats and
//!   integers (wrapping, as the interpreter's result is wrapped to the dtype).
//! * `gemm`: transposed operands are materialised (`linalg.generic` with a permuted map),
//!   the product goes through [`emit_matmul2d`], and one elementwise epilogue applies
//!   `alpha · acc + beta · C` (C broadcast with a 0 in the map).
//! * `conv`, `conv_transpose`, `conv_grad_weight`: one `linalg.generic` each over
//!   `[N, group, channels per group, spatial..]` views (`tensor.expand_shape`, exact), with
//!   strided and dilated windows in the affine maps (`d3 * 2 + d7 * 3`). Padding is a
//!   zero-filled buffer with the input copied into its interior ([`place`]: a copy
//!   `linalg.generic` into a `tensor.extract_slice` of the buffer, inserted back, which
//!   bufferizes in place without `memref.copy`). `conv_transpose` is the gather form of the
//!   interpreter's scatter: the input is spread with `stride - 1` zeros between elements
//!   (a strided [`place`]) and correlated with the kernel read back to front.
//!
//! Float ops accept f32 and f64; f16/bf16 (the interpreter computes in f64 and rounds
//! once) and integer convolutions are refused.

use std::fmt::Write as _;

use ppir::{DType, OpKind};

use super::{elem_type, literal, tensor_type, Body, Emitter, Iter, LowerError, OpView, Operand};

pub fn lower(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let (lo, hi) = match op.kind {
        OpKind::MatMul | OpKind::ConvGradWeight => (2, 2),
        _ => (2, 3),
    };
    check_arity(op, lo, hi)?;
    let r = match op.kind {
        OpKind::MatMul => matmul(e, op)?,
        OpKind::Gemm => gemm(e, op)?,
        OpKind::Conv => conv(e, op)?,
        OpKind::ConvTranspose => conv_transpose(e, op)?,
        OpKind::ConvGradWeight => conv_grad_weight(e, op)?,
        _ => return Err(op.unsupported("")),
    };
    Ok(vec![r])
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
    pub(super) fn read(op: &OpView, nsp: usize) -> Result<Window, LowerError> {
        let positive = |name: &str| -> Result<Vec<u64>, LowerError> {
            let v = op.ints_or(name, vec![1; nsp])?;
            if v.len() != nsp || v.iter().any(|&s| !(1..=i32::MAX as i64).contains(&s)) {
                return Err(op.invalid(format!(
                    "`{name}` must be {nsp} positive integers, got {v:?}"
                )));
            }
            Ok(v.iter().map(|&s| s as u64).collect())
        };
        let strides = positive("strides")?;
        let dilations = positive("dilations")?;
        let pads = op.ints_or("pads", vec![0; 2 * nsp])?;
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

fn group(op: &OpView) -> Result<u64, LowerError> {
    let g = op.int_or("group", 1)?;
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

/// `a (m×k) · b (k×n)` into a fresh zero accumulator: the one place a plain matrix product
/// is emitted (a faster kernel or a library call replaces this function).
pub fn emit_matmul2d(
    e: &mut Emitter,
    a: &str,
    b: &str,
    (m, k, n): (u64, u64, u64),
    d: DType,
) -> String {
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

/// `a[i] (m×k) · b[i] (k×n)` for `i < batch` into a fresh zero accumulator.
pub fn emit_batch_matmul(
    e: &mut Emitter,
    a: &str,
    b: &str,
    batch: u64,
    (m, k, n): (u64, u64, u64),
    d: DType,
) -> String {
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

/// The indexing of a batch of `shape` broadcast against `batch` (numpy rules): size-1
/// dimensions against larger ones index with 0, missing leading dimensions are dropped.
fn batch_map(shape: &[u64], batch: &[u64]) -> Vec<String> {
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

fn matmul(e: &mut Emitter, op: &OpView) -> Result<String, LowerError> {
    use DType::*;
    let d = common_dtype(op, &[F32, F64, I64, I32, I8])?;
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
    Ok(e.reshape(&r, &full, &want, d))
}

/// The transpose of a 2-D tensor of `shape`, materialised.
fn transpose2d(e: &mut Emitter, x: &str, shape: &[u64], d: DType) -> String {
    let out = [shape[1], shape[0]];
    let init = e.empty(&out, d);
    e.generic(
        2,
        &[Iter::Parallel, Iter::Parallel],
        &[Operand::new(x, shape, d, dims([1, 0]))],
        &[Operand::identity(init, &out, d)],
        &Body::default(),
        &["%in0".to_string()],
    )
    .remove(0)
}

fn gemm(e: &mut Emitter, op: &OpView) -> Result<String, LowerError> {
    let d = common_dtype(op, &[DType::F32, DType::F64])?;
    let (sa, sb) = (&op.in_shapes[0], &op.in_shapes[1]);
    if sa.len() != 2 || sb.len() != 2 {
        return Err(op.invalid(format!("operands must be 2-D, got {sa:?} and {sb:?}")));
    }
    let alpha = op.float_or("alpha", 1.0)?;
    let beta = op.float_or("beta", 1.0)?;
    let trans_a = op.int_or("trans_a", 0)? != 0;
    let trans_b = op.int_or("trans_b", 0)? != 0;
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
    let mut a = e.name(op.op.operands()[0]);
    let mut b = e.name(op.op.operands()[1]);
    if trans_a {
        a = transpose2d(e, &a, sa, d);
    }
    if trans_b {
        b = transpose2d(e, &b, sb, d);
    }
    let acc = emit_matmul2d(e, &a, &b, (m, k, n), d);
    if c.is_none() && alpha == 1.0 {
        return Ok(acc);
    }
    // The interpreter's order: acc · alpha, then + beta · c (each factor skipped when 1,
    // which is exact).
    let ty = elem_type(d);
    let mut body = Body::default();
    let mut y = "%in0".to_string();
    if alpha != 1.0 {
        let al = body.constant(d, alpha);
        y = body.op(format!("arith.mulf {y}, {al} : {ty}"));
    }
    let mut inputs = vec![Operand::identity(acc, &out, d)];
    if let Some(c) = c {
        let cs = &op.in_shapes[2];
        inputs.push(Operand::new(e.name(c), cs, d, batch_map(cs, &out)));
        let mut t = "%in1".to_string();
        if beta != 1.0 {
            let be = body.constant(d, beta);
            t = body.op(format!("arith.mulf {be}, {t} : {ty}"));
        }
        y = body.op(format!("arith.addf {y}, {t} : {ty}"));
    }
    let init = e.empty(&out, d);
    Ok(e.generic(
        2,
        &[Iter::Parallel, Iter::Parallel],
        &inputs,
        &[Operand::identity(init, &out, d)],
        &body,
        &[y],
    )
    .remove(0))
}

// ---- convolutions ----

/// Loop layout of the convolution generics: `(n, g, m/g, out spatial.., c/g, kernel..)`.
struct ConvLoops {
    nsp: usize,
}

impl ConvLoops {
    fn cg(&self) -> usize {
        3
    }
    fn j(&self, i: usize) -> usize {
        4 + i
    }
    fn z(&self, i: usize) -> usize {
        4 + self.nsp + i
    }
    fn count(&self) -> usize {
        4 + 2 * self.nsp
    }
    fn iters(&self) -> Vec<Iter> {
        let mut v = vec![Iter::Parallel; 3];
        v.extend(vec![Iter::Reduction; 1 + self.nsp]);
        v.extend(vec![Iter::Parallel; self.nsp]);
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
    let g = group(op)?;
    if c % g != 0 || m % g != 0 || cg * g != c {
        return Err(op.invalid(format!(
            "group {g} must divide the {c} input and {m} output channels, and w {ws:?} must have C/group input channels"
        )));
    }
    if let Some(kattr) = op.ints("kernel_shape")? {
        if kattr.len() != nsp || kattr.iter().zip(&ks).any(|(&a, &b)| a < 0 || a as u64 != b) {
            return Err(op.invalid(format!(
                "kernel_shape {kattr:?} disagrees with w of shape {ws:?}"
            )));
        }
    }
    let win = Window::read(op, nsp)?;
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
    let x5s = with_nc(n, g, cg, &xps[2..]);
    let x5 = e.reshape(&xp, &xps, &x5s, d);
    let w5s = with_nc(g, mg, cg, &ks);
    let w5 = e.reshape(&w, ws, &w5s, d);
    let out5 = with_nc(n, g, mg, &out_sp);
    let init = bias_init(e, op, &out5, d)?;

    let l = ConvLoops { nsp };
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
    let g = group(op)?;
    if c % g != 0 {
        return Err(op.invalid(format!("group {g} must divide the {c} input channels")));
    }
    let (cg, mg, ks) = (c / g, ws[1], ws[2..].to_vec());
    let m = mg * g;
    let win = Window::read(op, nsp)?;
    let out_pad = op.ints_or("output_padding", vec![0; nsp])?;
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

    let l = ConvLoops { nsp };
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
    let ks = op.ints_req("kernel_shape")?;
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
    let g = group(op)?;
    if c % g != 0 || m % g != 0 {
        return Err(op.invalid(format!(
            "group {g} must divide the {c} input and {m} output channels"
        )));
    }
    let (cg, mg) = (c / g, m / g);
    let win = Window::read(op, nsp)?;
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
    e.op(format!(
        "arith.constant dense<[{}]> : {}",
        items.join(", "),
        tensor_type(&[values.len() as u64], d)
    ))
}
