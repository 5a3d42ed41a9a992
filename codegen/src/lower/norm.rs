//! Normalisations, softmax and the cross-entropy loss, as reductions into f64 statistics
//! (`linalg.generic` with reduction iterators) followed by one elementwise
//! `linalg.generic` that writes the result: a few passes over the data per op.
//!
//! Every op computes in f64 inside its bodies and rounds once when it stores, with the
//! interpreter's formulas in the interpreter's order (`ppir::interp::norm` and `::grad`),
//! so f32 results agree with the reference to the last bit or so. Element types: f32, f64
//! and f16 (bf16 is refused, see [`super::reduce`]); labels i64, i32 or i8.
//!
//! * `softmax` / `log_softmax`: the maximum along the axis (NaN ignored, as `f64::max`;
//!   shifted by 0 when it is not finite), `Σ exp(x - max)` in f64, then
//!   `exp(x - max) / Σ` or `(x - max) - ln Σ`.
//! * `batch_norm`: `(x - mean) / sqrt(var + ε) · scale + bias` per channel (axis 1); the
//!   per-channel operands may have their own float types (ONNX), promoted to f64.
//! * `instance_norm`: population mean and variance of each (n, c) plane, then
//!   `(x - mean) / sqrt(var + ε) · scale[c] + bias[c]`.
//! * `layer_norm`: over `axis..rank`, `(x - mean) · (1 / sqrt(var + ε)) · scale + bias`
//!   (scale / bias broadcast to the normalised dimensions); with three results also the mean
//!   and the inverse standard deviation (shape of x with the normalised dims set to 1).
//! * `lrn`: `x / (bias + α/size · Σ x²)^β` over the channel window
//!   `c - ⌊(size-1)/2⌋ ..= c + ⌈(size-1)/2⌉` clipped to the tensor (the squares are
//!   zero-padded along the channels, so the window is one affine map).
//! * `softmax_cross_entropy[_grad]`: rows of `[R, C]` logits; `lse = shift + ln Σ exp`;
//!   the loss is the mean over counted rows of `lse - logits[label]` (0 if none counts), the
//!   gradient `(exp(x - lse) - onehot) · dloss / count`, 0 on rows not counted. A row
//!   counts unless its label equals `ignore_index`. **Out-of-range labels** (negative or
//!   ≥ C) are an error in the interpreter; compiled code cannot fail, so such a row is
//!   treated as ignored (it adds to neither the sum nor the count, and its gradient is 0).
//!   No memory is ever read at the label (the picked logit is selected during the row scan).
//! * `reduce_log_sum_exp` (called from [`super::reduce`]): the maximum over the axes (NaN
//!   ignored, 0 when not finite) as the shift, `Σ exp(x - shift)` in f64, `shift + ln Σ`.
//! * `label_logit`: one `linalg.generic` over the rows reading the label, and the logit at
//!   `label - offset` through `tensor.extract` at a clamped column (so no read is out of
//!   bounds), selected to 0 where the column is out of range. `label_logit_grad`: one
//!   elementwise pass over `[rows, classes]`, dy where the column is the label's.

use ppir::ops::attrs::{
    BatchNormAttrs, CrossEntropyAttrs, InstanceNormAttrs, LabelLogitAttrs, LabelLogitGradAttrs,
    LayerNormAttrs, LrnAttrs, ReduceAttrs, SoftmaxAttrs,
};
use ppir::{DType, OpKind};

use super::contraction::{i64_const, memref_ptr, tensor_ptr};
use super::reduce::{
    dims_map, f64c, float_ok, from_f64, kept, pointwise, reduction, to_f64, FLOATS,
};
use super::{elem_type, tensor_type, Body, Emitter, Iter, LowerError, OpView, Operand};

pub fn lower(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    match op.kind {
        OpKind::Softmax | OpKind::LogSoftmax => softmax(e, op),
        OpKind::BatchNorm => batch_norm(e, op),
        OpKind::InstanceNorm => instance_norm(e, op),
        OpKind::LayerNorm => layer_norm(e, op),
        OpKind::Lrn => lrn(e, op),
        OpKind::SoftmaxCrossEntropy | OpKind::SoftmaxCrossEntropyGrad => cross_entropy(e, op),
        OpKind::LabelLogit => label_logit(e, op),
        OpKind::LabelLogitGrad => label_logit_grad(e, op),
        OpKind::LogSumExpGrad => log_sum_exp_grad(e, op),
        _ => Err(op.unsupported("")),
    }
}

/// The float operand `i`, checked for a lowered float dtype.
fn float_operand(op: &OpView, i: usize, what: &str) -> Result<(Vec<u64>, DType), LowerError> {
    let d = op.in_dtypes[i];
    if !d.is_float() {
        return Err(op.invalid(format!("{what} must be a float tensor, got {d}")));
    }
    if !float_ok(d) {
        return Err(op.unsupported(format!(" ({what} of dtype {d}; {FLOATS})")));
    }
    Ok((op.in_shapes[i].clone(), d))
}

/// x (operand 0) and the first result must have the same float type and shape.
fn same_as_x(e: &Emitter, op: &OpView) -> Result<(String, Vec<u64>, DType), LowerError> {
    let (x, d) = float_operand(op, 0, "x")?;
    if op.out_dtypes.first() != Some(&d) || op.out_shapes.first() != Some(&x) {
        return Err(op.invalid(format!(
            "the result must have the operand's type {}",
            tensor_type(&x, d)
        )));
    }
    Ok((e.name(op.op.operands()[0]), x, d))
}

/// `m` if it is finite, else 0 (the interpreter's shift for all -inf / +inf rows).
fn finite_or_zero(b: &mut Body, m: &str) -> String {
    let a = b.op(format!("math.absf {m} : f64"));
    let inf = f64c(b, f64::INFINITY);
    let fin = b.op(format!("arith.cmpf olt, {a}, {inf} : f64"));
    let z = f64c(b, 0.0);
    b.op(format!("arith.select {fin}, {m}, {z} : f64"))
}

/// An operand of the stats shape (the loops of `rank` without `axes`).
fn stat(name: &str, shape: &[u64], axes: &[usize], d: DType) -> Operand {
    let keep = kept(shape.len(), axes);
    let s: Vec<u64> = keep.iter().map(|&i| shape[i]).collect();
    Operand::new(name, &s, d, dims_map(keep))
}

/// The maximum of `src` (shape `shape`, dtype `d`) over `axes` ignoring NaN, from -inf,
/// then as an f64 shift (0 where not finite). Returns the shift of the kept shape.
fn max_shift(e: &mut Emitter, src: &str, shape: &[u64], axes: &[usize], d: DType) -> String {
    let ty = elem_type(d);
    let m = reduction(
        e,
        shape,
        axes,
        &[Operand::identity(src, shape, d)],
        &[(d, f64::NEG_INFINITY)],
        |b| vec![b.op(format!("arith.maxnumf %out0, %in0 : {ty}"))],
    )
    .remove(0);
    let ks: Vec<u64> = kept(shape.len(), axes).iter().map(|&i| shape[i]).collect();
    pointwise(e, &ks, &[Operand::identity(m, &ks, d)], DType::F64, |b| {
        let v = to_f64(b, "%in0", d);
        finite_or_zero(b, &v)
    })
}

/// `Σ exp(x - shift)` over `axes` in f64.
fn sum_exp(
    e: &mut Emitter,
    src: &str,
    shape: &[u64],
    axes: &[usize],
    d: DType,
    shift: &str,
) -> String {
    reduction(
        e,
        shape,
        axes,
        &[
            Operand::identity(src, shape, d),
            stat(shift, shape, axes, DType::F64),
        ],
        &[(DType::F64, 0.0)],
        |b| {
            let v = to_f64(b, "%in0", d);
            let t = b.op(format!("arith.subf {v}, %in1 : f64"));
            let x = exp_of(b, &t, d);
            vec![b.op(format!("arith.addf %out0, {x} : f64"))]
        },
    )
    .remove(0)
}

/// `reduce_log_sum_exp` of `src` (shape `shape`, float dtype `d`) over `axes`, with the
/// reduced dimensions dropped.
pub(super) fn log_sum_exp(
    e: &mut Emitter,
    src: &str,
    shape: &[u64],
    axes: &[usize],
    d: DType,
) -> String {
    let shift = max_shift(e, src, shape, axes, d);
    let s = sum_exp(e, src, shape, axes, d, &shift);
    let ks: Vec<u64> = kept(shape.len(), axes).iter().map(|&i| shape[i]).collect();
    pointwise(
        e,
        &ks,
        &[
            Operand::identity(shift.as_str(), &ks, DType::F64),
            Operand::identity(s.as_str(), &ks, DType::F64),
        ],
        d,
        |b| {
            let ln = b.op("math.log %in1 : f64");
            let v = b.op(format!("arith.addf %in0, {ln} : f64"));
            from_f64(b, &v, d)
        },
    )
}

/// The column of the label `l` (i64) in a piece of `classes` columns starting at class
/// `offset`: (in range, the column clamped into the piece as an index).
fn label_column(b: &mut Body, l: &str, offset: i64, classes: u64) -> (String, String) {
    let off = b.constant(DType::I64, offset as f64);
    let c = b.op(format!("arith.subi {l}, {off} : i64"));
    let zero = b.constant(DType::I64, 0.0);
    let n = b.constant(DType::I64, classes as f64);
    let lo = b.op(format!("arith.cmpi sge, {c}, {zero} : i64"));
    let hi = b.op(format!("arith.cmpi slt, {c}, {n} : i64"));
    let ok = b.op(format!("arith.andi {lo}, {hi} : i1"));
    let cc = b.op(format!("arith.select {ok}, {c}, {zero} : i64"));
    let ci = b.op(format!("arith.index_cast {cc} : i64 to index"));
    (ok, ci)
}

fn label_logit(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let (shape, d) = float_operand(op, 0, "logits")?;
    let Some((&classes, outer)) = shape.split_last() else {
        return Err(op.invalid("logits must have rank >= 1 (the last axis holds the classes)"));
    };
    let outer = outer.to_vec();
    let ld = op.in_dtypes[1];
    if !ld.is_int() || op.in_shapes[1] != outer {
        return Err(op.invalid(format!(
            "labels must be integers of shape {outer:?} (the logits' shape without the class axis)"
        )));
    }
    if op.out_dtypes[0] != d || op.out_shapes[0] != outer {
        return Err(op.invalid(format!("the result must be {}", tensor_type(&outer, d))));
    }
    let rows: u64 = outer.iter().product();
    if rows == 0 || classes == 0 {
        return Ok(vec![e.zeros(&outer, d)]);
    }
    let offset = op.attrs::<LabelLogitAttrs>()?.offset;
    let rc = [rows, classes];
    let logits = e.name(op.op.operands()[0]);
    let logits = e.reshape(&logits, &shape, &rc, d);
    let labels = e.name(op.op.operands()[1]);
    let labels = e.reshape(&labels, &outer, &[rows], ld);
    let out = pointwise(
        e,
        &[rows],
        &[Operand::identity(labels.as_str(), &[rows], ld)],
        d,
        |b| {
            let l = label_i64(b, "%in0", ld);
            let (ok, ci) = label_column(b, &l, offset, classes);
            let r = b.op("linalg.index 0 : index");
            let v = b.op(format!(
                "tensor.extract {logits}[{r}, {ci}] : {}",
                tensor_type(&rc, d)
            ));
            let zero = b.constant(d, 0.0);
            b.op(format!("arith.select {ok}, {v}, {zero} : {}", elem_type(d)))
        },
    );
    Ok(vec![e.reshape(&out, &[rows], &outer, d)])
}

fn label_logit_grad(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let (outer, d) = float_operand(op, 0, "dy")?;
    let ld = op.in_dtypes[1];
    if !ld.is_int() || op.in_shapes[1] != outer {
        return Err(op.invalid(format!("labels must be integers of dy's shape {outer:?}")));
    }
    let LabelLogitGradAttrs { offset, classes } = op.attrs()?;
    let classes = u64::try_from(classes)
        .map_err(|_| op.invalid(format!("`classes` must be >= 0, got {classes}")))?;
    let mut shape = outer.clone();
    shape.push(classes);
    if op.out_dtypes[0] != d || op.out_shapes[0] != shape {
        return Err(op.invalid(format!("the result must be {}", tensor_type(&shape, d))));
    }
    let rows: u64 = outer.iter().product();
    if rows == 0 || classes == 0 {
        return Ok(vec![e.zeros(&shape, d)]);
    }
    let rc = [rows, classes];
    let dy = e.name(op.op.operands()[0]);
    let dy = e.reshape(&dy, &outer, &[rows], d);
    let labels = e.name(op.op.operands()[1]);
    let labels = e.reshape(&labels, &outer, &[rows], ld);
    let row = |n: &str, dt: DType| Operand::new(n, &[rows], dt, vec!["d0".into()]);
    let mut ins = vec![row(&dy, d), row(&labels, ld)];
    if let Some(&base) = op.op.operands().get(2) {
        if op.in_dtypes[2] != d || op.in_shapes[2] != shape {
            return Err(op.invalid(format!("base must be {}", tensor_type(&shape, d))));
        }
        let base = e.name(base);
        let base = e.reshape(&base, &shape, &rc, d);
        ins.push(Operand::identity(base, &rc, d));
    }
    let with_base = ins.len() == 3;
    let out = pointwise(e, &rc, &ins, d, |b| {
        let l = label_i64(b, "%in1", ld);
        let off = b.constant(DType::I64, offset as f64);
        let c = b.op(format!("arith.subi {l}, {off} : i64"));
        let j = b.op("linalg.index 1 : index");
        let j64 = b.op(format!("arith.index_cast {j} : index to i64"));
        let hit = b.op(format!("arith.cmpi eq, {j64}, {c} : i64"));
        let ty = elem_type(d);
        if with_base {
            let s = b.op(format!("arith.addf %in2, %in0 : {ty}"));
            return b.op(format!("arith.select {hit}, {s}, %in2 : {ty}"));
        }
        let zero = b.constant(d, 0.0);
        b.op(format!("arith.select {hit}, %in0, {zero} : {ty}"))
    });
    Ok(vec![e.reshape(&out, &rc, &shape, d)])
}

/// `exp(x - y) · dy` with y and dy broadcast over the reduced axes, in f64.
fn log_sum_exp_grad(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let (x, d) = float_operand(op, 0, "x")?;
    let rank = x.len();
    let ReduceAttrs { axes, keepdims } = op.attrs()?;
    let axes = super::reduce::reduce_axes(op, &axes, rank)?;
    let ks: Vec<u64> = kept(rank, &axes).iter().map(|&i| x[i]).collect();
    let ones: Vec<u64> = (0..rank)
        .map(|i| if axes.contains(&i) { 1 } else { x[i] })
        .collect();
    let given = if keepdims { &ones } else { &ks };
    for i in [1, 2] {
        if op.in_dtypes[i] != d || op.in_shapes[i] != *given {
            return Err(op.invalid(format!(
                "operand {i} must be {} (the reduction's result)",
                tensor_type(given, d)
            )));
        }
    }
    if op.out_dtypes[0] != d || op.out_shapes[0] != x {
        return Err(op.invalid(format!("the result must be {}", tensor_type(&x, d))));
    }
    let src = e.name(op.op.operands()[0]);
    let mut stats = vec![];
    for i in [1, 2] {
        let n = e.name(op.op.operands()[i]);
        stats.push(if keepdims {
            e.reshape(&n, &ones, &ks, d)
        } else {
            n
        });
    }
    let out = pointwise(
        e,
        &x,
        &[
            Operand::identity(src.as_str(), &x, d),
            stat(&stats[0], &x, &axes, d),
            stat(&stats[1], &x, &axes, d),
        ],
        d,
        |b| {
            let v = to_f64(b, "%in0", d);
            let y = to_f64(b, "%in1", d);
            let g = to_f64(b, "%in2", d);
            let t = b.op(format!("arith.subf {v}, {y} : f64"));
            let p = exp_of(b, &t, d);
            let r = b.op(format!("arith.mulf {p}, {g} : f64"));
            from_f64(b, &r, d)
        },
    );
    Ok(vec![out])
}

fn softmax(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let (src, x, d) = same_as_x(e, op)?;
    let rank = x.len();
    if rank == 0 {
        return Err(op.invalid("softmax needs an operand of rank >= 1"));
    }
    let axis = op.axis(op.attrs::<SoftmaxAttrs>()?.axis, rank)?;
    if d == DType::F32 && axis == rank - 1 && e.cpu_library() {
        return Ok(vec![softmax_rows_call(
            e,
            &src,
            &x,
            op.kind == OpKind::LogSoftmax,
        )]);
    }
    let axes = [axis];
    let shift = max_shift(e, &src, &x, &axes, d);
    let xin = Operand::identity(src.as_str(), &x, d);
    let sh = stat(&shift, &x, &axes, DType::F64);
    let r = if op.kind == OpKind::LogSoftmax {
        let s = sum_exp(e, &src, &x, &axes, d, &shift);
        let ks = sh.shape.clone();
        let ln = pointwise(
            e,
            &ks,
            &[Operand::identity(s, &ks, DType::F64)],
            DType::F64,
            |b| b.op("math.log %in0 : f64"),
        );
        let lo = stat(&ln, &x, &axes, DType::F64);
        pointwise(e, &x, &[xin, sh, lo], d, |b| {
            let v = to_f64(b, "%in0", d);
            let t = b.op(format!("arith.subf {v}, %in1 : f64"));
            let y = b.op(format!("arith.subf {t}, %in2 : f64"));
            from_f64(b, &y, d)
        })
    } else {
        // exp(x - shift) once, kept in f64 for the sum and the quotient.
        let ex = pointwise(e, &x, &[xin, sh], DType::F64, |b| {
            let v = to_f64(b, "%in0", d);
            let t = b.op(format!("arith.subf {v}, %in1 : f64"));
            exp_of(b, &t, d)
        });
        let s = reduction(
            e,
            &x,
            &axes,
            &[Operand::identity(ex.as_str(), &x, DType::F64)],
            &[(DType::F64, 0.0)],
            |b| vec![b.op("arith.addf %out0, %in0 fastmath<reassoc> : f64")],
        )
        .remove(0);
        let so = stat(&s, &x, &axes, DType::F64);
        pointwise(
            e,
            &x,
            &[Operand::identity(ex.as_str(), &x, DType::F64), so],
            d,
            |b| {
                let y = b.op("arith.divf %in0, %in1 : f64");
                from_f64(b, &y, d)
            },
        )
    };
    Ok(vec![r])
}

/// f32 softmax / log_softmax over the last axis as one call of the support library's
/// `ppcc_softmax_f32(rows, n, x, y, log)` (`codegen/src/support.c`: a row of 16 floats is one
/// vector register, where the loops linalg leaves run a 16-element row scalar or strided).
fn softmax_rows_call(e: &mut Emitter, src: &str, x: &[u64], log: bool) -> String {
    // The caller has checked rank >= 1.
    let (n, outer) = x.split_last().map_or((1, &[][..]), |(&n, o)| (n, o));
    let rows: u64 = outer.iter().product();
    e.declare("llvm.func @ppcc_softmax_f32(i64, i64, !llvm.ptr, !llvm.ptr, i64)");
    let px = tensor_ptr(e, src, x, DType::F32);
    let mty = super::memref_type(x, DType::F32);
    let alloc = e.op(format!("memref.alloc() {{alignment = 64 : i64}} : {mty}"));
    let py = memref_ptr(e, &alloc, &mty);
    let (r, c, l) = (
        i64_const(e, rows as i64),
        i64_const(e, n as i64),
        i64_const(e, log as i64),
    );
    e.line(format!(
        "llvm.call @ppcc_softmax_f32({r}, {c}, {px}, {py}, {l}) : (i64, i64, !llvm.ptr, !llvm.ptr, i64) -> ()"
    ));
    e.op(format!(
        "bufferization.to_tensor {alloc} restrict writable : {mty} to {}",
        tensor_type(x, DType::F32)
    ))
}

/// f32 layer_norm whose scale (and bias) cover the whole normalised shape (no broadcast)
/// and whose statistics, if asked for, are f32: one call of the support library's
/// `ppcc_layernorm_f32(rows, n, x, scale, bias, eps, y, mean, inv)`. `None` when the op
/// does not fit (the generic lowering handles it).
fn layer_norm_rows_call(
    e: &mut Emitter,
    op: &OpView,
    src: &str,
    x: &[u64],
    axis: usize,
    eps: f64,
) -> Option<Vec<String>> {
    let inner = &x[axis..];
    let n: u64 = inner.iter().product();
    let rows: u64 = x[..axis].iter().product();
    let dense = |i: usize| {
        op.in_dtypes[i] == DType::F32
            && op.in_shapes[i].iter().product::<u64>() == n
            && op.in_shapes[i]
                .iter()
                .filter(|&&s| s != 1)
                .eq(inner.iter().filter(|&&s| s != 1))
    };
    let n_out = op.out_shapes.len();
    if !e.cpu_library()
        || !(1..=3).contains(&op.in_shapes.len())
        || !(2..op.in_shapes.len()).all(dense)
        || !dense(1)
        || op.out_dtypes.iter().any(|&t| t != DType::F32)
        || n == 0
    {
        return None;
    }
    let mut stat_shape = x[..axis].to_vec();
    stat_shape.resize(x.len(), 1);
    if n_out == 3 && (op.out_shapes[1] != stat_shape || op.out_shapes[2] != stat_shape) {
        return None;
    }
    e.declare(
        "llvm.func @ppcc_layernorm_f32(i64, i64, !llvm.ptr, !llvm.ptr, !llvm.ptr, f64, !llvm.ptr, !llvm.ptr, !llvm.ptr)",
    );
    let operand = |e: &mut Emitter, i: usize| {
        let name = e.name(op.op.operands()[i]);
        let shape = op.in_shapes[i].clone();
        tensor_ptr(e, &name, &shape, DType::F32)
    };
    let px = tensor_ptr(e, src, x, DType::F32);
    let ps = operand(e, 1);
    let pb = if op.in_shapes.len() == 3 {
        operand(e, 2)
    } else {
        e.op("llvm.mlir.zero : !llvm.ptr")
    };
    let mut outs = vec![(x.to_vec(), String::new())];
    if n_out == 3 {
        outs.push((stat_shape.clone(), String::new()));
        outs.push((stat_shape, String::new()));
    }
    let mut ptrs = Vec::new();
    for (shape, alloc) in outs.iter_mut() {
        let mty = super::memref_type(shape, DType::F32);
        *alloc = e.op(format!("memref.alloc() {{alignment = 64 : i64}} : {mty}"));
        ptrs.push(memref_ptr(e, alloc, &mty));
    }
    while ptrs.len() < 3 {
        ptrs.push(e.op("llvm.mlir.zero : !llvm.ptr"));
    }
    let (r, c) = (i64_const(e, rows as i64), i64_const(e, n as i64));
    let ep = e.op(format!("arith.constant {eps:.17e} : f64"));
    e.line(format!(
        "llvm.call @ppcc_layernorm_f32({r}, {c}, {px}, {ps}, {pb}, {ep}, {}, {}, {}) : (i64, i64, !llvm.ptr, !llvm.ptr, !llvm.ptr, f64, !llvm.ptr, !llvm.ptr, !llvm.ptr) -> ()",
        ptrs[0], ptrs[1], ptrs[2]
    ));
    Some(
        outs.iter()
            .map(|(shape, alloc)| {
                let mty = super::memref_type(shape, DType::F32);
                e.op(format!(
                    "bufferization.to_tensor {alloc} restrict writable : {mty} to {}",
                    tensor_type(shape, DType::F32)
                ))
            })
            .collect(),
    )
}

/// Per-channel operand `i` (shape `[C]`, any lowered float type), indexed by loop d1.
fn per_channel(
    e: &Emitter,
    op: &OpView,
    i: usize,
    what: &str,
    c: u64,
) -> Result<Operand, LowerError> {
    let (s, d) = float_operand(op, i, what)?;
    if s != [c] {
        return Err(op.invalid(format!(
            "{what} must have shape [{c}] (the channels of x), got {s:?}"
        )));
    }
    Ok(Operand::new(
        e.name(op.op.operands()[i]),
        &s,
        d,
        vec!["d1".into()],
    ))
}

fn channels_first(op: &OpView, x: &[u64]) -> Result<u64, LowerError> {
    if x.len() < 2 {
        return Err(op.invalid(format!("x must have shape [N, C, ..], got {x:?}")));
    }
    Ok(x[1])
}

fn batch_norm(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let (src, x, d) = same_as_x(e, op)?;
    let c = channels_first(op, &x)?;
    let eps = op.attrs::<BatchNormAttrs>()?.epsilon;
    let mut ins = vec![Operand::identity(src, &x, d)];
    for (i, what) in [(1, "scale"), (2, "bias"), (3, "mean")] {
        ins.push(per_channel(e, op, i, what, c)?);
    }
    // sqrt(var + ε) once per channel (the same f64 operations as per element).
    let var = per_channel(e, op, 4, "var", c)?;
    let dv = var.dtype;
    let den = pointwise(
        e,
        &[c],
        &[Operand::identity(var.name.as_str(), &[c], dv)],
        DType::F64,
        |b| {
            let v = to_f64(b, "%in0", dv);
            let ec = f64c(b, eps);
            let ve = b.op(format!("arith.addf {v}, {ec} : f64"));
            b.op(format!("math.sqrt {ve} : f64"))
        },
    );
    ins.push(Operand::new(den, &[c], DType::F64, vec!["d1".into()]));
    let dts: Vec<DType> = ins.iter().map(|o| o.dtype).collect();
    let r = pointwise(e, &x, &ins, d, |b| {
        let v: Vec<String> = (0..5)
            .map(|i| to_f64(b, &format!("%in{i}"), dts[i]))
            .collect();
        let den = &v[4];
        let t = b.op(format!("arith.subf {}, {} : f64", v[0], v[3]));
        let q = b.op(format!("arith.divf {t}, {den} : f64"));
        let p = b.op(format!("arith.mulf {q}, {} : f64", v[1]));
        let y = b.op(format!("arith.addf {p}, {} : f64", v[2]));
        from_f64(b, &y, d)
    });
    Ok(vec![r])
}

/// Population mean and `Σ (x - mean)²` of `src` over `axes`, both f64 of the kept shape.
fn moments(
    e: &mut Emitter,
    src: &str,
    x: &[u64],
    axes: &[usize],
    d: DType,
) -> (String, String, u64) {
    let n: u64 = axes.iter().map(|&a| x[a]).product();
    let xin = Operand::identity(src, x, d);
    let sum = reduction(
        e,
        x,
        axes,
        std::slice::from_ref(&xin),
        &[(DType::F64, 0.0)],
        |b| {
            let v = to_f64(b, "%in0", d);
            vec![b.op(format!("arith.addf %out0, {v} : f64"))]
        },
    )
    .remove(0);
    let ks: Vec<u64> = kept(x.len(), axes).iter().map(|&i| x[i]).collect();
    let mean = pointwise(
        e,
        &ks,
        &[Operand::identity(sum, &ks, DType::F64)],
        DType::F64,
        |b| {
            let c = f64c(b, n as f64);
            b.op(format!("arith.divf %in0, {c} : f64"))
        },
    );
    let sq = reduction(
        e,
        x,
        axes,
        &[xin, stat(&mean, x, axes, DType::F64)],
        &[(DType::F64, 0.0)],
        |b| {
            let v = to_f64(b, "%in0", d);
            let t = b.op(format!("arith.subf {v}, %in1 : f64"));
            let t2 = b.op(format!("arith.mulf {t}, {t} : f64"));
            vec![b.op(format!("arith.addf %out0, {t2} : f64"))]
        },
    )
    .remove(0);
    (mean, sq, n)
}

fn instance_norm(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let (src, x, d) = same_as_x(e, op)?;
    let c = channels_first(op, &x)?;
    let eps = op.attrs::<InstanceNormAttrs>()?.epsilon;
    let scale = per_channel(e, op, 1, "scale", c)?;
    let bias = per_channel(e, op, 2, "bias", c)?;
    let axes: Vec<usize> = (2..x.len()).collect();
    let (mean, sq, n) = moments(e, &src, &x, &axes, d);
    let ks = [x[0], x[1]];
    // sqrt(var + eps) per plane.
    let den = pointwise(
        e,
        &ks,
        &[Operand::identity(sq, &ks, DType::F64)],
        DType::F64,
        |b| {
            let nc = f64c(b, n as f64);
            let var = b.op(format!("arith.divf %in0, {nc} : f64"));
            let ec = f64c(b, eps);
            let ve = b.op(format!("arith.addf {var}, {ec} : f64"));
            b.op(format!("math.sqrt {ve} : f64"))
        },
    );
    let (ds, db) = (scale.dtype, bias.dtype);
    let ins = [
        Operand::identity(src, &x, d),
        stat(&mean, &x, &axes, DType::F64),
        stat(&den, &x, &axes, DType::F64),
        scale,
        bias,
    ];
    let r = pointwise(e, &x, &ins, d, |b| {
        let v = to_f64(b, "%in0", d);
        let s = to_f64(b, "%in3", ds);
        let bb = to_f64(b, "%in4", db);
        let t = b.op(format!("arith.subf {v}, %in1 : f64"));
        let q = b.op(format!("arith.divf {t}, %in2 : f64"));
        let p = b.op(format!("arith.mulf {q}, {s} : f64"));
        let y = b.op(format!("arith.addf {p}, {bb} : f64"));
        from_f64(b, &y, d)
    });
    Ok(vec![r])
}

/// An operand that broadcasts (numpy, unidirectionally) to the trailing dims `x[axis..]`.
fn trailing_broadcast(
    e: &Emitter,
    op: &OpView,
    i: usize,
    what: &str,
    x: &[u64],
    axis: usize,
    d: DType,
) -> Result<Operand, LowerError> {
    let s = op.in_shapes[i].clone();
    if op.in_dtypes[i] != d {
        return Err(op.invalid(format!(
            "{what} has element type {}, x has {d}",
            op.in_dtypes[i]
        )));
    }
    let inner = &x[axis..];
    let fits = s.len() <= inner.len()
        && s.iter()
            .zip(&inner[inner.len() - s.len()..])
            .all(|(&a, &b)| a == b || a == 1);
    if !fits {
        return Err(op.invalid(format!(
            "{what} of shape {s:?} does not broadcast to the normalised shape {inner:?}"
        )));
    }
    let lead = x.len() - s.len();
    let map = s
        .iter()
        .enumerate()
        .map(|(j, &n)| {
            if n == 1 && x[lead + j] != 1 {
                "0".to_string()
            } else {
                format!("d{}", lead + j)
            }
        })
        .collect();
    Ok(Operand::new(e.name(op.op.operands()[i]), &s, d, map))
}

fn layer_norm(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let (src, x, d) = same_as_x(e, op)?;
    let rank = x.len();
    if rank == 0 {
        return Err(op.invalid("layer_norm needs an operand of rank >= 1"));
    }
    let LayerNormAttrs { axis, epsilon: eps } = op.attrs()?;
    let axis = op.axis(axis, rank)?;
    let n_out = op.out_shapes.len();
    if n_out != 1 && n_out != 3 {
        return Err(op.invalid(format!(
            "has 1 result, or 3 with the mean and inverse std dev; {n_out} are declared"
        )));
    }
    if d == DType::F32 {
        if let Some(r) = layer_norm_rows_call(e, op, &src, &x, axis, eps) {
            return Ok(r);
        }
    }
    let scale = trailing_broadcast(e, op, 1, "scale", &x, axis, d)?;
    let bias = match op.in_shapes.len() {
        3 => Some(trailing_broadcast(e, op, 2, "bias", &x, axis, d)?),
        _ => None,
    };
    let axes: Vec<usize> = (axis..rank).collect();
    let (mean, sq, n) = moments(e, &src, &x, &axes, d);
    let ks: Vec<u64> = x[..axis].to_vec();
    let inv = pointwise(
        e,
        &ks,
        &[Operand::identity(sq, &ks, DType::F64)],
        DType::F64,
        |b| {
            let nc = f64c(b, n as f64);
            let var = b.op(format!("arith.divf %in0, {nc} : f64"));
            let ec = f64c(b, eps);
            let ve = b.op(format!("arith.addf {var}, {ec} : f64"));
            let sd = b.op(format!("math.sqrt {ve} : f64"));
            let one = f64c(b, 1.0);
            b.op(format!("arith.divf {one}, {sd} : f64"))
        },
    );
    let has_bias = bias.is_some();
    let mut ins = vec![
        Operand::identity(src, &x, d),
        stat(&mean, &x, &axes, DType::F64),
        stat(&inv, &x, &axes, DType::F64),
        scale,
    ];
    ins.extend(bias);
    let y = pointwise(e, &x, &ins, d, |b| {
        let v = to_f64(b, "%in0", d);
        let s = to_f64(b, "%in3", d);
        let t = b.op(format!("arith.subf {v}, %in1 : f64"));
        let q = b.op(format!("arith.mulf {t}, %in2 : f64"));
        let mut y = b.op(format!("arith.mulf {q}, {s} : f64"));
        if has_bias {
            let bb = to_f64(b, "%in4", d);
            y = b.op(format!("arith.addf {y}, {bb} : f64"));
        }
        from_f64(b, &y, d)
    });
    let mut results = vec![y];
    if n_out == 3 {
        let mut stat_shape = ks.clone();
        stat_shape.resize(rank, 1);
        for (k, v) in [(1, mean), (2, inv)] {
            let dt = op.out_dtypes[k];
            if !dt.is_float() {
                return Err(op.invalid(format!(
                    "layer_norm statistics must have a float type, declared {dt}"
                )));
            }
            if !float_ok(dt) {
                return Err(op.unsupported(format!(" (statistics of dtype {dt}; {FLOATS})")));
            }
            if op.out_shapes[k] != stat_shape {
                return Err(op.invalid(format!(
                    "result {k} must have shape {stat_shape:?}, declared {:?}",
                    op.out_shapes[k]
                )));
            }
            let r = if dt == DType::F64 {
                v
            } else {
                pointwise(e, &ks, &[Operand::identity(v, &ks, DType::F64)], dt, |b| {
                    from_f64(b, "%in0", dt)
                })
            };
            results.push(e.reshape(&r, &ks, &stat_shape, dt));
        }
    }
    Ok(results)
}

fn lrn(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let (src, x, d) = same_as_x(e, op)?;
    let c = channels_first(op, &x)?;
    let rank = x.len();
    let LrnAttrs {
        size,
        alpha,
        beta,
        bias,
    } = op.attrs()?;
    if size < 1 {
        return Err(op.invalid(format!("`size` must be positive, got {size}")));
    }
    let size = size as u64;
    let before = (size - 1) / 2;
    let after = (size - 1).div_ceil(2);
    // The squares, zero-padded along the channels: padded channel p holds channel
    // p - before. They are written by one generic straight into the slice of the zero
    // tensor (`tensor.extract_slice` → generic → `tensor.insert_slice` bufferizes in
    // place; a copy of a strided view would need the MLIR runtime's `memrefCopy`).
    let mut padded_shape = x.clone();
    padded_shape[1] = c + before + after;
    let pad = before + after > 0;
    let (dest, slice) = if pad {
        let z = e.zeros(&padded_shape, DType::F64);
        let mut offs = vec!["0".to_string(); rank];
        offs[1] = before.to_string();
        let sizes: Vec<String> = x.iter().map(|s| s.to_string()).collect();
        let ones = vec!["1"; rank];
        let spec = format!(
            "[{}] [{}] [{}]",
            offs.join(", "),
            sizes.join(", "),
            ones.join(", ")
        );
        let slice = e.op(format!(
            "tensor.extract_slice {z}{spec} : {} to {}",
            tensor_type(&padded_shape, DType::F64),
            tensor_type(&x, DType::F64)
        ));
        (Some((z, spec)), slice)
    } else {
        (None, e.empty(&x, DType::F64))
    };
    let mut b = Body::default();
    let v = to_f64(&mut b, "%in0", d);
    let v2 = b.op(format!("arith.mulf {v}, {v} : f64"));
    let sq = e
        .generic(
            rank,
            &vec![Iter::Parallel; rank],
            &[Operand::identity(src.as_str(), &x, d)],
            &[Operand::identity(slice, &x, DType::F64)],
            &b,
            &[v2],
        )
        .remove(0);
    let padded = match dest {
        Some((z, spec)) => e.op(format!(
            "tensor.insert_slice {sq} into {z}{spec} : {} into {}",
            tensor_type(&x, DType::F64),
            tensor_type(&padded_shape, DType::F64)
        )),
        None => sq,
    };
    // Loops (d0..d<rank-1>, k): window position k reads padded channel d1 + k, i.e.
    // channel d1 - before + k, ascending as the interpreter sums.
    let mut loops = x.clone();
    loops.push(size);
    let mut map = dims_map(0..rank);
    map[1] = format!("d1 + d{rank}");
    // The window loop's extent comes from an (unread) operand of shape [size], as the
    // kernel operand of linalg's pooling ops.
    let window = e.empty(&[size], DType::F64);
    let win = reduction(
        e,
        &loops,
        &[rank],
        &[
            Operand::new(padded, &padded_shape, DType::F64, map),
            Operand::new(window, &[size], DType::F64, vec![format!("d{rank}")]),
        ],
        &[(DType::F64, 0.0)],
        |b| vec![b.op("arith.addf %out0, %in0 fastmath<reassoc> : f64")],
    )
    .remove(0);
    let k = alpha / size as f64;
    let r = pointwise(
        e,
        &x,
        &[
            Operand::identity(src, &x, d),
            Operand::identity(win, &x, DType::F64),
        ],
        d,
        |b| {
            let v = to_f64(b, "%in0", d);
            let kc = f64c(b, k);
            let t = b.op(format!("arith.mulf {kc}, %in1 : f64"));
            let bc = f64c(b, bias);
            let u = b.op(format!("arith.addf {bc}, {t} : f64"));
            let be = f64c(b, beta);
            let p = b.op(format!("math.powf {u}, {be} : f64"));
            let y = b.op(format!("arith.divf {v}, {p} : f64"));
            from_f64(b, &y, d)
        },
    );
    Ok(vec![r])
}

/// Whether a row counts: its label (body value `l`, i64) is not `ignore` and lies in
/// `0..classes`. Returns an i1.
fn counts(b: &mut Body, l: &str, ignore: Option<i64>, classes: u64) -> String {
    let z = b.op("arith.constant 0 : i64");
    let cc = b.op(format!("arith.constant {classes} : i64"));
    let ge = b.op(format!("arith.cmpi sge, {l}, {z} : i64"));
    let lt = b.op(format!("arith.cmpi slt, {l}, {cc} : i64"));
    let mut ok = b.op(format!("arith.andi {ge}, {lt} : i1"));
    if let Some(ig) = ignore {
        let ic = b.op(format!("arith.constant {ig} : i64"));
        let ne = b.op(format!("arith.cmpi ne, {l}, {ic} : i64"));
        ok = b.op(format!("arith.andi {ok}, {ne} : i1"));
    }
    ok
}

/// A label body value of integer dtype `ld` as i64.
fn label_i64(b: &mut Body, l: &str, ld: DType) -> String {
    if ld == DType::I64 {
        l.to_string()
    } else {
        b.op(format!("arith.extsi {l} : {} to i64", elem_type(ld)))
    }
}

/// Whether the current column (loop d1) is the label `l` (i64).
fn is_label_column(b: &mut Body, l: &str) -> String {
    let j = b.op("linalg.index 1 : index");
    let j64 = b.op(format!("arith.index_cast {j} : index to i64"));
    b.op(format!("arith.cmpi eq, {j64}, {l} : i64"))
}

fn cross_entropy(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let grad = op.kind == OpKind::SoftmaxCrossEntropyGrad;
    let (shape, d) = float_operand(op, 0, "logits")?;
    if d == DType::BF16 {
        // The scalar loss is rounded outside a body (`arith.truncf`, see `float_ok`).
        return Err(op.unsupported(" (logits of dtype bf16)"));
    }
    let Some((&classes, outer)) = shape.split_last() else {
        return Err(op.invalid("logits must have rank >= 1 (the last axis holds the classes)"));
    };
    let outer = outer.to_vec();
    let ld = op.in_dtypes[1];
    if !ld.is_int() {
        return Err(op.invalid(format!("labels must be an integer tensor, got {ld}")));
    }
    if op.in_shapes[1] != outer {
        return Err(op.invalid(format!(
            "labels must have shape {outer:?} (the logits' shape without the class axis), got {:?}",
            op.in_shapes[1]
        )));
    }
    let want = if grad { shape.clone() } else { vec![] };
    if op.out_dtypes[0] != d || op.out_shapes[0] != want {
        return Err(op.invalid(format!("the result must be {}", tensor_type(&want, d))));
    }
    if grad && (op.in_dtypes[2] != d || !op.in_shapes[2].is_empty()) {
        return Err(op.invalid(format!(
            "dloss must be a scalar {}, got {}",
            elem_type(d),
            tensor_type(&op.in_shapes[2], op.in_dtypes[2])
        )));
    }
    let ignore = op.attrs::<CrossEntropyAttrs>()?.ignore_index;
    let rows: u64 = outer.iter().product();
    let rc = [rows, classes];
    let logits = e.name(op.op.operands()[0]);
    let logits = e.reshape(&logits, &shape, &rc, d);
    let labels = e.name(op.op.operands()[1]);
    let labels = e.reshape(&labels, &outer, &[rows], ld);

    let shift = max_shift(e, &logits, &rc, &[1], d);
    // Σ exp(x - shift) per row and, for the loss, the logit at the label.
    let row_ins = [
        Operand::identity(logits.as_str(), &rc, d),
        Operand::new(shift.as_str(), &[rows], DType::F64, vec!["d0".into()]),
        Operand::new(labels.as_str(), &[rows], ld, vec!["d0".into()]),
    ];
    let mut accs = vec![(DType::F64, 0.0)];
    if !grad {
        accs.push((DType::F64, 0.0));
    }
    let stats = reduction(e, &rc, &[1], &row_ins, &accs, |b| {
        let v = to_f64(b, "%in0", d);
        let t = b.op(format!("arith.subf {v}, %in1 : f64"));
        let x = exp_of(b, &t, d);
        let s = b.op(format!("arith.addf %out0, {x} : f64"));
        if grad {
            return vec![s];
        }
        let l = label_i64(b, "%in2", ld);
        let hit = is_label_column(b, &l);
        let p = b.op(format!("arith.select {hit}, {v}, %out1 : f64"));
        vec![s, p]
    });
    let row = |n: &str, dt: DType| Operand::new(n, &[rows], dt, vec!["d0".into()]);
    // lse = shift + ln Σ.
    let lse = pointwise(
        e,
        &[rows],
        &[row(&shift, DType::F64), row(&stats[0], DType::F64)],
        DType::F64,
        |b| {
            let ln = b.op("math.log %in1 : f64");
            b.op(format!("arith.addf %in0, {ln} : f64"))
        },
    );
    let zero = e.scalar(DType::F64, 0.0);
    if !grad {
        // Σ (lse - picked) and the count over the rows that count.
        let tot = reduction(
            e,
            &[rows],
            &[0],
            &[
                row(&lse, DType::F64),
                row(&stats[1], DType::F64),
                row(&labels, ld),
            ],
            &[(DType::F64, 0.0), (DType::F64, 0.0)],
            |b| {
                let l = label_i64(b, "%in2", ld);
                let ok = counts(b, &l, ignore, classes);
                let t = b.op("arith.subf %in0, %in1 : f64");
                let s = b.op(format!("arith.addf %out0, {t} : f64"));
                let s = b.op(format!("arith.select {ok}, {s}, %out0 : f64"));
                let one = f64c(b, 1.0);
                let n = b.op(format!("arith.addf %out1, {one} : f64"));
                let n = b.op(format!("arith.select {ok}, {n}, %out1 : f64"));
                vec![s, n]
            },
        );
        let s = e.op(format!("tensor.extract {}[] : tensor<f64>", tot[0]));
        let n = e.op(format!("tensor.extract {}[] : tensor<f64>", tot[1]));
        let none = e.op(format!("arith.cmpf oeq, {n}, {zero} : f64"));
        let q = e.op(format!("arith.divf {s}, {n} : f64"));
        let mut loss = e.op(format!("arith.select {none}, {zero}, {q} : f64"));
        if d != DType::F64 {
            loss = e.op(format!("arith.truncf {loss} : f64 to {}", elem_type(d)));
        }
        let r = e.op(format!(
            "tensor.from_elements {loss} : {}",
            tensor_type(&[], d)
        ));
        return Ok(vec![r]);
    }
    let cnt = reduction(
        e,
        &[rows],
        &[0],
        &[row(&labels, ld)],
        &[(DType::F64, 0.0)],
        |b| {
            let l = label_i64(b, "%in0", ld);
            let ok = counts(b, &l, ignore, classes);
            let one = f64c(b, 1.0);
            let n = b.op(format!("arith.addf %out0, {one} : f64"));
            vec![b.op(format!("arith.select {ok}, {n}, %out0 : f64"))]
        },
    )
    .remove(0);
    let n = e.op(format!("tensor.extract {cnt}[] : tensor<f64>"));
    let dl_name = e.name(op.op.operands()[2]);
    let mut dl = e.op(format!(
        "tensor.extract {dl_name}[] : {}",
        tensor_type(&[], d)
    ));
    if d != DType::F64 {
        dl = e.op(format!("arith.extf {dl} : {} to f64", elem_type(d)));
    }
    let none = e.op(format!("arith.cmpf oeq, {n}, {zero} : f64"));
    let q = e.op(format!("arith.divf {dl}, {n} : f64"));
    let scale = e.op(format!("arith.select {none}, {zero}, {q} : f64"));
    let out = pointwise(
        e,
        &rc,
        &[
            Operand::identity(logits.as_str(), &rc, d),
            row(&lse, DType::F64),
            row(&labels, ld),
        ],
        d,
        |b| {
            let v = to_f64(b, "%in0", d);
            let t = b.op(format!("arith.subf {v}, %in1 : f64"));
            let p = exp_of(b, &t, d);
            let l = label_i64(b, "%in2", ld);
            let hit = is_label_column(b, &l);
            let one = f64c(b, 1.0);
            let z = f64c(b, 0.0);
            let oh = b.op(format!("arith.select {hit}, {one}, {z} : f64"));
            let u = b.op(format!("arith.subf {p}, {oh} : f64"));
            let w = b.op(format!("arith.mulf {u}, {scale} : f64"));
            let ok = counts(b, &l, ignore, classes);
            let y = b.op(format!("arith.select {ok}, {w}, {z} : f64"));
            from_f64(b, &y, d)
        },
    );
    Ok(vec![e.reshape(&out, &rc, &shape, d)])
}

/// `exp(t)` as an f64, computed in the operand dtype's precision: for f32 operands the
/// inline vectorisable f32 exp of `t` rounded to f32 (a relative error of |t|·2⁻²⁴ from the
/// rounding, below the f32 result's own), else [`exp_f64`].
fn exp_of(b: &mut Body, t: &str, d: DType) -> String {
    if d != DType::F32 {
        return exp_f64(b, t);
    }
    let t32 = b.op(format!("arith.truncf {t} : f64 to f32"));
    let x = super::mathfn::exp_f32(b, &t32);
    b.op(format!("arith.extf {x} : f32 to f64"))
}

/// `exp(t)` in f64, keeping libm off its slow underflow path where the result is exactly 0
/// (`t < -746`, e.g. masked attention scores of `-1e9`): exp runs on a clamped argument and
/// the select gives 0 there. NaN compares false and goes through exp unchanged.
fn exp_f64(b: &mut Body, t: &str) -> String {
    let lim = b.op("arith.constant -7.460000e+02 : f64");
    let safe = b.op("arith.constant -7.000000e+02 : f64");
    let zero = b.op("arith.constant 0.000000e+00 : f64");
    let small = b.op(format!("arith.cmpf olt, {t}, {lim} : f64"));
    let arg = b.op(format!("arith.select {small}, {safe}, {t} : f64"));
    let x = b.op(format!("math.exp {arg} : f64"));
    b.op(format!("arith.select {small}, {zero}, {x} : f64"))
}
