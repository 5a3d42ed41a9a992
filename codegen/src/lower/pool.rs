//! Pooling: `max_pool`, `avg_pool`, `global_avg_pool`, `global_max_pool`, `max_pool_grad`,
//! `avg_pool_grad`, with the interpreter's window geometry (`ppir::interp::pool`):
//!
//! * output size `floor((in + pads - span) / stride) + 1` (`span = (k - 1)·dilation + 1`), or
//!   the ceiling under `ceil_mode`, dropping a last window that would start past the input
//!   and the begin padding;
//! * padded cells never win a max (the input is copied into a `-inf` buffer) and add
//!   nothing to a sum (a zero buffer); the buffer also covers `ceil_mode` windows running
//!   off the end;
//! * the average's divisor is the number of taps inside the input (`count_include_pad =
//!   0`) or inside the explicitly padded input (`= 1`), per output position: a product of
//!   per-dimension counts, emitted as one dense constant vector per spatial dimension.
//!
//! The forward pools are one `linalg.generic` over `(n, c, out.., kernel..)` with the window
//! in the affine map (`d2 * 2 + d4`) and a `tensor.empty` of the kernel's shape as a dummy
//! operand that indexes the kernel loops directly (as `linalg.pooling_*` does).
//!
//! The gradients scatter: `max_pool_grad` first finds each window's first maximum (a
//! reduction generic carrying the value and its flat input offset; the selection is
//! order-independent: NaN above every number, then the larger value, then the smaller
//! offset, i.e. the first in row-major order, as the interpreter), then adds dy there in
//! an `scf.for` nest over the output (`tensor.extract`/`tensor.insert`, in place after
//! bufferization). `avg_pool_grad` adds `dy / count` to every tap of each window in an
//! `scf.for` nest over a padded buffer and crops the input out of it. Both do work
//! proportional to the output times the window, as the interpreter.
//!
//! f32 and f64; other dtypes are refused (integer max pooling is accepted by shape
//! inference but not by the interpreter).

use ppir::ops::attrs::{AvgPoolAttrs, AvgPoolGradAttrs, MaxPoolAttrs};
use ppir::{DType, OpKind};

use super::contraction::{
    affine, check_arity, common_dtype, crop, dense_1d, dims, pad_spatial, Window,
};
use super::{elem_type, tensor_type, Body, Emitter, Iter, LowerError, OpView, Operand};

pub fn lower(e: &mut Emitter, op: &OpView) -> Result<Vec<String>, LowerError> {
    let n = if op.kind == OpKind::MaxPoolGrad { 2 } else { 1 };
    check_arity(op, n, n)?;
    let r = match op.kind {
        OpKind::MaxPool | OpKind::AvgPool => pool(e, op)?,
        OpKind::GlobalAvgPool | OpKind::GlobalMaxPool => global_pool(e, op)?,
        OpKind::MaxPoolGrad => max_pool_grad(e, op)?,
        OpKind::AvgPoolGrad => avg_pool_grad(e, op)?,
        _ => return Err(op.unsupported("")),
    };
    Ok(vec![r])
}

const FLOATS: &[DType] = &[DType::F32, DType::F64];

/// Output positions `o < n_out` with `o·stride + offset` in `0..n_in`, as `lo..hi` (the
/// interpreter's `valid_range`).
fn valid_range(n_out: u64, n_in: u64, stride: u64, offset: i64) -> (u64, u64) {
    let s = stride as i64;
    let lo = if offset >= 0 {
        0
    } else {
        (-offset + s - 1) / s
    };
    let last = n_in as i64 - 1 - offset;
    let hi = if last < 0 {
        0
    } else {
        (last / s + 1).min(n_out as i64)
    };
    let lo = lo.min(hi);
    (lo as u64, hi as u64)
}

/// The window geometry of a pool over `in_sp`.
struct Geom {
    kernel: Vec<u64>,
    win: Window,
    out: Vec<u64>,
    /// Per spatial dimension and output position: taps inside the input, and taps inside
    /// the explicitly padded input.
    inside: Vec<Vec<u64>>,
    padded: Vec<Vec<u64>>,
    /// Size of a buffer (input at offset `pad_begin`) that every window fits in.
    extent: Vec<u64>,
}

/// A pooling op's attributes as `avg_pool`'s: `max_pool` and `max_pool_grad` have no
/// `count_include_pad` (false: they count no taps).
fn pool_attrs(op: &OpView) -> Result<AvgPoolAttrs, LowerError> {
    if op.kind == OpKind::AvgPool {
        return op.attrs();
    }
    let MaxPoolAttrs {
        kernel_shape,
        strides,
        pads,
        dilations,
        ceil_mode,
    } = op.attrs()?;
    Ok(AvgPoolAttrs {
        kernel_shape,
        strides,
        pads,
        dilations,
        ceil_mode,
        count_include_pad: false,
    })
}

impl Geom {
    fn read(op: &OpView, in_sp: &[u64], a: &AvgPoolAttrs) -> Result<Geom, LowerError> {
        let nsp = in_sp.len();
        let kernel = &a.kernel_shape;
        if kernel.len() != nsp || kernel.iter().any(|&k| !(1..=i32::MAX as i64).contains(&k)) {
            return Err(op.invalid(format!(
                "`kernel_shape` must be {nsp} positive integers, got {kernel:?}"
            )));
        }
        let kernel: Vec<u64> = kernel.iter().map(|&k| k as u64).collect();
        let win = Window::new(
            op,
            nsp,
            a.strides.as_deref(),
            a.pads.as_deref(),
            a.dilations.as_deref(),
        )?;
        let ceil_mode = a.ceil_mode;
        let (mut out, mut inside, mut padded, mut extent) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 0..nsp {
            let (k, s, d) = (kernel[i], win.strides[i], win.dilations[i]);
            let (pb, pe) = (win.begin(i), win.end(i));
            let span = (k - 1) * d + 1;
            let full = in_sp[i] + pb + pe;
            if full < span {
                return Err(op.invalid(format!(
                    "spatial dimension {i}: window of span {span} does not fit the padded input of size {full}"
                )));
            }
            let mut o = if ceil_mode {
                (full - span).div_ceil(s) + 1
            } else {
                (full - span) / s + 1
            };
            if ceil_mode && (o - 1) * s >= in_sp[i] + pb {
                o -= 1;
            }
            let (mut ins, mut pads) = (Vec::new(), Vec::new());
            for z in 0..o {
                let start = (z * s) as i64 - pb as i64;
                let (lo, hi) = valid_range(k, in_sp[i], d, start);
                let (plo, phi) = valid_range(k, full, d, start + pb as i64);
                ins.push(hi - lo);
                pads.push(phi - plo);
            }
            extent.push(if o == 0 {
                full
            } else {
                full.max((o - 1) * s + span)
            });
            out.push(o);
            inside.push(ins);
            padded.push(pads);
        }
        Ok(Geom {
            kernel,
            win,
            out,
            inside,
            padded,
            extent,
        })
    }

    fn nsp(&self) -> usize {
        self.kernel.len()
    }

    fn begins(&self) -> Vec<u64> {
        (0..self.nsp()).map(|i| self.win.begin(i)).collect()
    }

    /// The map of the padded input over loops `(n, c, out.., kernel..)`.
    fn input_map(&self) -> Vec<String> {
        let nsp = self.nsp();
        let mut m = dims([0, 1]);
        for i in 0..nsp {
            m.push(affine(
                &[
                    (2 + i, self.win.strides[i] as i64),
                    (2 + nsp + i, self.win.dilations[i] as i64),
                ],
                0,
            ));
        }
        m
    }
}

fn split_nc(op: &OpView, s: &[u64], what: &str) -> Result<(u64, u64, Vec<u64>), LowerError> {
    if s.len() < 2 {
        return Err(op.invalid(format!(
            "{what} must have shape [N, C, spatial..], got {s:?}"
        )));
    }
    Ok((s[0], s[1], s[2..].to_vec()))
}

fn check_shape(op: &OpView, got: &[u64], want: &[u64], what: &str) -> Result<(), LowerError> {
    if got != want {
        return Err(op.invalid(format!("{what} must have shape {want:?}, got {got:?}")));
    }
    Ok(())
}

fn nc_out(n: u64, c: u64, sp: &[u64]) -> Vec<u64> {
    let mut v = vec![n, c];
    v.extend_from_slice(sp);
    v
}

/// One reduction generic over `(n, c, out.., kernel..)` reading the padded input `xp`
/// through the window map into an accumulator filled with `init`; `max` or sum.
fn window_reduce(
    e: &mut Emitter,
    g: &Geom,
    xp: &str,
    xps: &[u64],
    out: &[u64],
    max: bool,
    d: DType,
) -> String {
    let nsp = g.nsp();
    let init = e.filled(out, d, if max { f64::NEG_INFINITY } else { 0.0 });
    let mut inputs = vec![Operand::new(xp, xps, d, g.input_map())];
    if nsp > 0 {
        let window = e.empty(&g.kernel, d);
        inputs.push(Operand::new(
            window,
            &g.kernel,
            d,
            dims(2 + nsp..2 + 2 * nsp),
        ));
    }
    let mut iters = vec![Iter::Parallel; 2 + nsp];
    iters.extend(vec![Iter::Reduction; nsp]);
    let ty = elem_type(d);
    let mut b = Body::default();
    let y = if max {
        b.op(format!("arith.maximumf %out0, %in0 : {ty}"))
    } else {
        b.op(format!("arith.addf %out0, %in0 : {ty}"))
    };
    e.generic(
        2 + 2 * nsp,
        &iters,
        &inputs,
        &[Operand::new(init, out, d, dims(0..2 + nsp))],
        &b,
        &[y],
    )
    .remove(0)
}

/// `src / count` per output position of `g` (`src` of shape `[N, C, out..]`).
fn divide_by_counts(
    e: &mut Emitter,
    g: &Geom,
    include_pad: bool,
    src: &str,
    shape: &[u64],
    d: DType,
) -> String {
    let nsp = g.nsp();
    let ty = elem_type(d);
    let mut inputs = vec![Operand::identity(src, shape, d)];
    for i in 0..nsp {
        let counts = if include_pad {
            &g.padded[i]
        } else {
            &g.inside[i]
        };
        let v: Vec<f64> = counts.iter().map(|&c| c as f64).collect();
        let cv = dense_1d(e, &v, d);
        inputs.push(Operand::new(cv, &[g.out[i]], d, dims([2 + i])));
    }
    let mut b = Body::default();
    // Products of small integers: exact.
    let mut count = if nsp == 0 {
        b.constant(d, 1.0)
    } else {
        "%in1".to_string()
    };
    for i in 1..nsp {
        count = b.op(format!("arith.mulf {count}, %in{} : {ty}", i + 1));
    }
    let y = b.op(format!("arith.divf %in0, {count} : {ty}"));
    let init = e.empty(shape, d);
    let rank = shape.len();
    e.generic(
        rank,
        &vec![Iter::Parallel; rank],
        &inputs,
        &[Operand::identity(init, shape, d)],
        &b,
        &[y],
    )
    .remove(0)
}

fn pool(e: &mut Emitter, op: &OpView) -> Result<String, LowerError> {
    let d = common_dtype(op, FLOATS)?;
    let xs = &op.in_shapes[0];
    let (n, c, in_sp) = split_nc(op, xs, "x")?;
    let a = pool_attrs(op)?;
    let g = Geom::read(op, &in_sp, &a)?;
    let max = op.kind == OpKind::MaxPool;
    let include_pad = !max && a.count_include_pad;
    let out = nc_out(n, c, &g.out);
    check_shape(op, &op.out_shapes[0], &out, "the result")?;
    let x = e.name(op.op.operands()[0]);
    let fill = if max { f64::NEG_INFINITY } else { 0.0 };
    let (xp, xps) = pad_spatial(e, &x, xs, &g.begins(), &g.extent, fill, d);
    let r = window_reduce(e, &g, &xp, &xps, &out, max, d);
    if max {
        return Ok(r);
    }
    Ok(divide_by_counts(e, &g, include_pad, &r, &out, d))
}

fn global_pool(e: &mut Emitter, op: &OpView) -> Result<String, LowerError> {
    let d = common_dtype(op, FLOATS)?;
    let xs = &op.in_shapes[0];
    let (n, c, sp) = split_nc(op, xs, "x")?;
    let mut want = vec![n, c];
    want.extend(vec![1; sp.len()]);
    check_shape(op, &op.out_shapes[0], &want, "the result")?;
    let max = op.kind == OpKind::GlobalMaxPool;
    let rank = xs.len();
    let init = e.filled(&[n, c], d, if max { f64::NEG_INFINITY } else { 0.0 });
    let ty = elem_type(d);
    let mut b = Body::default();
    let y = if max {
        b.op(format!("arith.maximumf %out0, %in0 : {ty}"))
    } else {
        b.op(format!("arith.addf %out0, %in0 : {ty}"))
    };
    let mut iters = vec![Iter::Parallel; 2];
    iters.extend(vec![Iter::Reduction; rank - 2]);
    let x = e.name(op.op.operands()[0]);
    let mut r = e
        .generic(
            rank,
            &iters,
            &[Operand::identity(x, xs, d)],
            &[Operand::new(init, &[n, c], d, dims([0, 1]))],
            &b,
            &[y],
        )
        .remove(0);
    if !max {
        let size: u64 = sp.iter().product();
        let mut b = Body::default();
        let s = b.constant(d, size as f64);
        let y = b.op(format!("arith.divf %in0, {s} : {ty}"));
        let init = e.empty(&[n, c], d);
        r = e
            .generic(
                2,
                &[Iter::Parallel, Iter::Parallel],
                &[Operand::identity(r, &[n, c], d)],
                &[Operand::identity(init, &[n, c], d)],
                &b,
                &[y],
            )
            .remove(0);
    }
    Ok(e.reshape(&r, &[n, c], &want, d))
}

/// A nest of `scf.for` loops over `0..bounds[i]` carrying one tensor of type `ty` (from
/// `init`); `body(e, ivs, acc)` emits the innermost body and returns the updated tensor.
fn loop_nest(
    e: &mut Emitter,
    bounds: &[u64],
    init: &str,
    ty: &str,
    body: &mut dyn FnMut(&mut Emitter, &[String], &str) -> String,
) -> String {
    if bounds.is_empty() {
        return body(e, &[], init);
    }
    let c0 = e.op("arith.constant 0 : index");
    let c1 = e.op("arith.constant 1 : index");
    let ubs: Vec<String> = bounds
        .iter()
        .map(|b| e.op(format!("arith.constant {b} : index")))
        .collect();
    let (mut results, mut ivs) = (Vec::new(), Vec::new());
    let mut acc = init.to_string();
    for ub in &ubs {
        let (r, iv, a) = (e.fresh(), e.fresh(), e.fresh());
        e.line(format!(
            "{r} = scf.for {iv} = {c0} to {ub} step {c1} iter_args({a} = {acc}) -> ({ty}) {{"
        ));
        results.push(r);
        ivs.push(iv);
        acc = a;
    }
    let mut inner = body(e, &ivs, &acc);
    for r in results.into_iter().rev() {
        e.line(format!("  scf.yield {inner} : {ty}"));
        e.line("}");
        inner = r;
    }
    inner
}

fn max_pool_grad(e: &mut Emitter, op: &OpView) -> Result<String, LowerError> {
    let d = common_dtype(op, FLOATS)?;
    let (xs, dys) = (&op.in_shapes[0], &op.in_shapes[1]);
    let (n, c, in_sp) = split_nc(op, xs, "x")?;
    let nsp = in_sp.len();
    let g = Geom::read(op, &in_sp, &pool_attrs(op)?)?;
    let out = nc_out(n, c, &g.out);
    check_shape(op, dys, &out, "dy")?;
    check_shape(op, &op.out_shapes[0], xs, "the result")?;
    let x = e.name(op.op.operands()[0]);
    let dy = e.name(op.op.operands()[1]);
    let ty = elem_type(d);

    // 1. Per window: the best value and the flat offset (in the unpadded input plane) of
    //    its first maximum, -1 for a window of padding only.
    let (xp, xps) = pad_spatial(e, &x, xs, &g.begins(), &g.extent, 0.0, d);
    let best = e.filled(&out, d, f64::NEG_INFINITY);
    let arg = e.filled(&out, DType::I64, -1.0);
    let mut inputs = vec![Operand::new(xp, &xps, d, g.input_map())];
    if nsp > 0 {
        let window = e.empty(&g.kernel, d);
        inputs.push(Operand::new(
            window,
            &g.kernel,
            d,
            dims(2 + nsp..2 + 2 * nsp),
        ));
    }
    let mut b = Body::default();
    let c0 = b.op("arith.constant 0 : index");
    let mut valid: Option<String> = None;
    let mut pos = Vec::with_capacity(nsp);
    for (i, &size) in in_sp.iter().enumerate() {
        let z = b.op(format!("linalg.index {} : index", 2 + i));
        let j = b.op(format!("linalg.index {} : index", 2 + nsp + i));
        let pb = g.win.begin(i);
        let p = b.op(format!(
            "affine.apply affine_map<(d0, d1) -> ({})>({z}, {j})",
            affine(
                &[(0, g.win.strides[i] as i64), (1, g.win.dilations[i] as i64)],
                -(pb as i64)
            )
        ));
        let mut checks = Vec::new();
        if pb > 0 {
            checks.push(b.op(format!("arith.cmpi sge, {p}, {c0} : index")));
        }
        if g.extent[i] > pb + size {
            let lim = b.op(format!("arith.constant {size} : index"));
            checks.push(b.op(format!("arith.cmpi slt, {p}, {lim} : index")));
        }
        for ck in checks {
            valid = Some(match valid {
                None => ck,
                Some(v) => b.op(format!("arith.andi {v}, {ck} : i1")),
            });
        }
        pos.push(p);
    }
    let off = if nsp == 0 {
        c0.clone()
    } else {
        // Row-major flat offset: Σ p_i · Π_{k>i} in_k.
        let terms: Vec<(usize, i64)> = (0..nsp)
            .map(|i| (i, in_sp[i + 1..].iter().product::<u64>() as i64))
            .collect();
        let names: Vec<String> = (0..nsp).map(|i| format!("d{i}")).collect();
        b.op(format!(
            "affine.apply affine_map<({}) -> ({})>({})",
            names.join(", "),
            affine(&terms, 0),
            pos.join(", ")
        ))
    };
    let off = b.op(format!("arith.index_cast {off} : index to i64"));
    let (v, bv, bo) = ("%in0", "%out0", "%out1");
    let vnan = b.op(format!("arith.cmpf uno, {v}, {v} : {ty}"));
    let bnan = b.op(format!("arith.cmpf uno, {bv}, {bv} : {ty}"));
    let gt = b.op(format!("arith.cmpf ogt, {v}, {bv} : {ty}"));
    let t = b.op("arith.constant true");
    let bnum = b.op(format!("arith.xori {bnan}, {t} : i1"));
    let nan_wins = b.op(format!("arith.andi {vnan}, {bnum} : i1"));
    let eq = b.op(format!("arith.cmpf oeq, {v}, {bv} : {ty}"));
    let both_nan = b.op(format!("arith.andi {vnan}, {bnan} : i1"));
    let same = b.op(format!("arith.ori {eq}, {both_nan} : i1"));
    let earlier = b.op(format!("arith.cmpi slt, {off}, {bo} : i64"));
    let tie = b.op(format!("arith.andi {same}, {earlier} : i1"));
    let zero64 = b.op("arith.constant 0 : i64");
    let none = b.op(format!("arith.cmpi slt, {bo}, {zero64} : i64"));
    let mut take = b.op(format!("arith.ori {none}, {gt} : i1"));
    take = b.op(format!("arith.ori {take}, {nan_wins} : i1"));
    take = b.op(format!("arith.ori {take}, {tie} : i1"));
    if let Some(valid) = valid {
        take = b.op(format!("arith.andi {take}, {valid} : i1"));
    }
    let nv = b.op(format!("arith.select {take}, {v}, {bv} : {ty}"));
    let no = b.op(format!("arith.select {take}, {off}, {bo} : i64"));
    let mut iters = vec![Iter::Parallel; 2 + nsp];
    iters.extend(vec![Iter::Reduction; nsp]);
    let omap = dims(0..2 + nsp);
    let res = e.generic(
        2 + 2 * nsp,
        &iters,
        &inputs,
        &[
            Operand::new(best, &out, d, omap.clone()),
            Operand::new(arg, &out, DType::I64, omap),
        ],
        &b,
        &[nv, no],
    );
    let arg = res[1].clone();

    // 2. dx[n, c, arg] += dy[n, c, window] over every window, in order.
    let zf: u64 = g.out.iter().product();
    let xf: u64 = in_sp.iter().product();
    let flat_out = [n, c, zf];
    let flat_in = [n, c, xf];
    let arg3 = e.reshape(&arg, &out, &flat_out, DType::I64);
    let dy3 = e.reshape(&dy, dys, &flat_out, d);
    let dx0 = e.zeros(&flat_in, d);
    let dx_ty = tensor_type(&flat_in, d);
    let arg_ty = tensor_type(&flat_out, DType::I64);
    let dy_ty = tensor_type(&flat_out, d);
    let dx = loop_nest(e, &flat_out, &dx0, &dx_ty, &mut |e, iv, acc| {
        let at = iv.join(", ");
        let o = e.op(format!("tensor.extract {arg3}[{at}] : {arg_ty}"));
        let zero = e.op("arith.constant 0 : i64");
        let ok = e.op(format!("arith.cmpi sge, {o}, {zero} : i64"));
        let r = e.fresh();
        e.line(format!("{r} = scf.if {ok} -> ({dx_ty}) {{"));
        let oi = e.op(format!("arith.index_cast {o} : i64 to index"));
        let gv = e.op(format!("tensor.extract {dy3}[{at}] : {dy_ty}"));
        let here = format!("{}, {}, {oi}", iv[0], iv[1]);
        let cur = e.op(format!("tensor.extract {acc}[{here}] : {dx_ty}"));
        let s = e.op(format!("arith.addf {cur}, {gv} : {ty}"));
        let upd = e.op(format!("tensor.insert {s} into {acc}[{here}] : {dx_ty}"));
        e.line(format!("  scf.yield {upd} : {dx_ty}"));
        e.line("} else {");
        e.line(format!("  scf.yield {acc} : {dx_ty}"));
        e.line("}");
        r
    });
    Ok(e.reshape(&dx, &flat_in, xs, d))
}

fn avg_pool_grad(e: &mut Emitter, op: &OpView) -> Result<String, LowerError> {
    let d = common_dtype(op, FLOATS)?;
    let dys = &op.in_shapes[0];
    let a: AvgPoolGradAttrs = op.attrs()?;
    let in_shape = &a.input_shape;
    if in_shape.iter().any(|&s| s < 0) {
        return Err(op.invalid(format!(
            "`input_shape` must be non-negative sizes, got {in_shape:?}"
        )));
    }
    let xs: Vec<u64> = in_shape.iter().map(|&s| s as u64).collect();
    let (n, c, in_sp) = split_nc(op, &xs, "`input_shape`")?;
    let nsp = in_sp.len();
    let a = AvgPoolAttrs::of_grad(&a);
    let g = Geom::read(op, &in_sp, &a)?;
    let include_pad = a.count_include_pad;
    let out = nc_out(n, c, &g.out);
    check_shape(op, dys, &out, "dy")?;
    check_shape(op, &op.out_shapes[0], &xs, "the result")?;
    let ty = elem_type(d);

    // Each window's share, added to each of its taps in a padded buffer.
    let dy = e.name(op.op.operands()[0]);
    let share = divide_by_counts(e, &g, include_pad, &dy, &out, d);
    let pad_shape = nc_out(n, c, &g.extent);
    let acc0 = e.zeros(&pad_shape, d);
    let acc_ty = tensor_type(&pad_shape, d);
    let share_ty = tensor_type(&out, d);
    let kernel = g.kernel.clone();
    let win = &g.win;
    let padded = loop_nest(e, &out, &acc0, &acc_ty, &mut |e, iv, acc| {
        let sv = e.op(format!(
            "tensor.extract {share}[{}] : {share_ty}",
            iv.join(", ")
        ));
        loop_nest(e, &kernel, acc, &acc_ty, &mut |e, jv, acc| {
            let mut at = vec![iv[0].clone(), iv[1].clone()];
            for i in 0..nsp {
                at.push(e.op(format!(
                    "affine.apply affine_map<(d0, d1) -> ({})>({}, {})",
                    affine(
                        &[(0, win.strides[i] as i64), (1, win.dilations[i] as i64)],
                        0
                    ),
                    iv[2 + i],
                    jv[i]
                )));
            }
            let at = at.join(", ");
            let cur = e.op(format!("tensor.extract {acc}[{at}] : {acc_ty}"));
            let s = e.op(format!("arith.addf {cur}, {sv} : {ty}"));
            e.op(format!("tensor.insert {s} into {acc}[{at}] : {acc_ty}"))
        })
    });
    let mut lo = vec![0, 0];
    lo.extend(g.begins());
    Ok(crop(e, &padded, &pad_shape, &lo, &xs, d))
}
