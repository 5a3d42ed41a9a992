//! Losses and the gradient helper ops autodiff emits: softmax cross-entropy and its
//! gradient, the adjoints of max/avg pooling, of a convolution with respect to its
//! weight, of gather (a scatter-add) and of slice (a scatter).
//!
//! Each is the direct transcription of "which forward element read which input element",
//! walking the same window geometry as the forward op (see `pool.rs` and `conv.rs`), so a
//! gradient routes exactly where the forward op read.

use super::conv::{split_nc, to3, Window};
use super::movement::slice_maps;
use super::pool::{pool_geom, PoolGeom};
use super::util::{fail, float_tensor, floats, ints, norm_axis, same_dtype, valid_range, OpResult};
use crate::ops::attrs::{
    AvgPoolAttrs, AvgPoolGradAttrs, ConvGradWeightAttrs, CrossEntropyAttrs, GatherGradAttrs,
    LabelLogitAttrs, LabelLogitGradAttrs, MaxPoolAttrs, SliceAttrs, SliceGradAttrs,
};
use crate::tensor::{strides_of, Tensor};

/// A shape attribute `name` (non-negative sizes).
fn shape_attr(v: &[i64], name: &str) -> OpResult<Vec<usize>> {
    if v.iter().any(|&d| d < 0) {
        fail!("`{name}` must be non-negative sizes, got {v:?}");
    }
    Ok(v.iter().map(|&d| d as usize).collect())
}

fn check_shape(t: &Tensor, want: &[usize], what: &str) -> OpResult<()> {
    if t.shape != want {
        fail!("{what} must have shape {want:?}, got {:?}", t.shape);
    }
    Ok(())
}

// ---- softmax cross-entropy ----

/// The class count of logits `[.., C]` and their shape without the class axis, which the
/// labels must have.
fn classes_and_rows<'t>(logits: &'t Tensor, labels: &Tensor) -> OpResult<(usize, &'t [usize])> {
    let Some((&classes, outer)) = logits.shape.split_last() else {
        fail!("logits must have rank >= 1 (the last axis holds the classes)");
    };
    if labels.shape != outer {
        fail!(
            "labels must have shape {outer:?} (the logits' shape without the class axis), got {:?}",
            labels.shape
        );
    }
    Ok((classes, outer))
}

/// Rows of the logits `[outer, C]`, their labels, and which rows count.
struct CrossEntropy<'a> {
    logits: &'a [f64],
    classes: usize,
    labels: &'a [i64],
    /// Per row: the label as a class index, or `None` for an ignored row.
    targets: Vec<Option<usize>>,
    count: usize,
}

impl<'a> CrossEntropy<'a> {
    fn new(attrs: &CrossEntropyAttrs, logits: &'a Tensor, labels: &'a Tensor) -> OpResult<Self> {
        let lv = floats(logits, "logits")?;
        let labels_v = ints(labels, "labels")?;
        let (classes, _) = classes_and_rows(logits, labels)?;
        let ignore = attrs.ignore_index;
        let mut targets = Vec::with_capacity(labels_v.len());
        for (row, &l) in labels_v.iter().enumerate() {
            if Some(l) == ignore {
                targets.push(None);
            } else if l < 0 || l as usize >= classes {
                fail!("label {l} at position {row} is out of range for {classes} classes");
            } else {
                targets.push(Some(l as usize));
            }
        }
        let count = targets.iter().filter(|t| t.is_some()).count();
        Ok(CrossEntropy {
            logits: lv,
            classes,
            labels: labels_v,
            targets,
            count,
        })
    }

    fn row(&self, r: usize) -> &'a [f64] {
        &self.logits[r * self.classes..(r + 1) * self.classes]
    }
}

/// Shifted by the maximum so `exp` cannot overflow; an all `-inf` row shifts by 0.
fn log_sum_exp(row: &[f64]) -> f64 {
    let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let max = if max.is_finite() { max } else { 0.0 };
    max + row.iter().map(|&v| (v - max).exp()).sum::<f64>().ln()
}

/// Mean over the counted positions of `logsumexp(row) - row[label]`; 0 if none counts.
pub(super) fn softmax_cross_entropy(
    attrs: &CrossEntropyAttrs,
    inputs: &[&Tensor],
) -> OpResult<Tensor> {
    let ce = CrossEntropy::new(attrs, inputs[0], inputs[1])?;
    debug_assert_eq!(ce.labels.len(), ce.targets.len());
    let mut sum = 0.0;
    for (r, t) in ce.targets.iter().enumerate() {
        if let Some(c) = *t {
            let row = ce.row(r);
            sum += log_sum_exp(row) - row[c];
        }
    }
    let loss = if ce.count == 0 {
        0.0
    } else {
        sum / ce.count as f64
    };
    Ok(float_tensor(inputs[0].dtype, vec![], vec![loss]))
}

/// `(softmax(row) - onehot(label)) · dloss / count` per counted row, 0 on ignored rows.
pub(super) fn softmax_cross_entropy_grad(
    attrs: &CrossEntropyAttrs,
    inputs: &[&Tensor],
) -> OpResult<Tensor> {
    let ce = CrossEntropy::new(attrs, inputs[0], inputs[1])?;
    same_dtype(inputs[0], inputs[2])?;
    let dl = floats(inputs[2], "dloss")?;
    if dl.len() != 1 || !inputs[2].shape.is_empty() {
        fail!("dloss must be a scalar, got shape {:?}", inputs[2].shape);
    }
    let scale = if ce.count == 0 {
        0.0
    } else {
        dl[0] / ce.count as f64
    };
    let mut out = vec![0.0; ce.logits.len()];
    for (r, t) in ce.targets.iter().enumerate() {
        let Some(c) = *t else { continue };
        let row = ce.row(r);
        let lse = log_sum_exp(row);
        let o = &mut out[r * ce.classes..(r + 1) * ce.classes];
        for (j, (o, &v)) in o.iter_mut().zip(row).enumerate() {
            let onehot = if j == c { 1.0 } else { 0.0 };
            *o = ((v - lse).exp() - onehot) * scale;
        }
    }
    Ok(float_tensor(inputs[0].dtype, inputs[0].shape.clone(), out))
}

// ---- the logit at the label, for cross-entropy over vocabulary pieces ----

/// The column of `label` in a piece holding the classes `offset..offset + classes`.
fn label_column(label: i64, offset: i64, classes: usize) -> Option<usize> {
    let c = label.checked_sub(offset)?;
    (0..classes as i64).contains(&c).then_some(c as usize)
}

/// `logits[.., label - offset]` where that column exists, else 0.
pub(super) fn label_logit(attrs: &LabelLogitAttrs, inputs: &[&Tensor]) -> OpResult<Tensor> {
    let (logits, labels) = (inputs[0], inputs[1]);
    let lv = floats(logits, "logits")?;
    let lab = ints(labels, "labels")?;
    let (classes, outer) = classes_and_rows(logits, labels)?;
    let out: Vec<f64> = lab
        .iter()
        .enumerate()
        .map(|(r, &l)| label_column(l, attrs.offset, classes).map_or(0.0, |c| lv[r * classes + c]))
        .collect();
    Ok(float_tensor(logits.dtype, outer.to_vec(), out))
}

/// dy in the column of each label (where it is in range), 0 elsewhere.
pub(super) fn label_logit_grad(
    attrs: &LabelLogitGradAttrs,
    inputs: &[&Tensor],
) -> OpResult<Tensor> {
    let (dy, labels) = (inputs[0], inputs[1]);
    let dv = floats(dy, "dy")?;
    let lab = ints(labels, "labels")?;
    if labels.shape != dy.shape {
        fail!(
            "labels must have the shape of dy {:?}, got {:?}",
            dy.shape,
            labels.shape
        );
    }
    let Ok(classes) = usize::try_from(attrs.classes) else {
        fail!("`classes` must be >= 0, got {}", attrs.classes);
    };
    let mut out = match inputs.get(2) {
        Some(base) => {
            let b = floats(base, "base")?;
            if b.len() != dv.len() * classes {
                fail!("base must have shape [.., {classes}], got {:?}", base.shape);
            }
            b.to_vec()
        }
        None => vec![0.0; dv.len() * classes],
    };
    for (r, (&l, &g)) in lab.iter().zip(dv).enumerate() {
        if let Some(c) = label_column(l, attrs.offset, classes) {
            out[r * classes + c] += g;
        }
    }
    let mut shape = dy.shape.clone();
    shape.push(classes);
    Ok(float_tensor(dy.dtype, shape, out))
}

// ---- pooling ----

impl PoolGeom {
    /// Call `f(output offset in the plane, taps as input offsets in the plane)` per window.
    fn for_each_window(&self, mut f: impl FnMut(usize, &[usize])) {
        let [td, th, tw] = &self.taps;
        let [_, ih, iw] = self.in3;
        let [sd, sh, sw] = self.strides;
        let [dd, dh, dw] = self.dilations;
        let [pd, ph, pw] = self.pads;
        let mut offs = Vec::new();
        let mut o = 0;
        for (zd, a) in td.iter().enumerate() {
            for (zh, e) in th.iter().enumerate() {
                for (zw, g) in tw.iter().enumerate() {
                    offs.clear();
                    for jd in a.lo..a.hi {
                        let xd = zd * sd + jd * dd - pd;
                        for jh in e.lo..e.hi {
                            let xh = zh * sh + jh * dh - ph;
                            for jw in g.lo..g.hi {
                                let xw = zw * sw + jw * dw - pw;
                                offs.push((xd * ih + xh) * iw + xw);
                            }
                        }
                    }
                    f(o, &offs);
                    o += 1;
                }
            }
        }
    }

    fn out_plane(&self) -> usize {
        self.out_sp.iter().product()
    }
}

/// dx of `max_pool`: each dy goes to the first maximum (row-major over the window) of
/// the input elements its window read; padding never wins. A NaN in the window is the
/// maximum, as in the forward op.
pub(super) fn max_pool_grad(attrs: &MaxPoolAttrs, x: &Tensor, dy: &Tensor) -> OpResult<Tensor> {
    same_dtype(x, dy)?;
    let xv = floats(x, "x")?;
    let dyv = floats(dy, "dy")?;
    let (n, c, in_sp) = split_nc(&x.shape, "x")?;
    let geom = pool_geom(attrs.into(), &in_sp)?;
    let mut want = vec![n, c];
    want.extend(&geom.out_sp);
    check_shape(dy, &want, "dy")?;
    let (isz, osz) = (in_sp.iter().product::<usize>(), geom.out_plane());
    let mut dx = vec![0.0; xv.len()];
    for p in 0..n * c {
        let xp = &xv[p * isz..(p + 1) * isz];
        let dxp = &mut dx[p * isz..(p + 1) * isz];
        let dyp = &dyv[p * osz..(p + 1) * osz];
        geom.for_each_window(|o, taps| {
            let mut best: Option<usize> = None;
            for &t in taps {
                let better = match best {
                    None => true,
                    Some(b) => xp[t] > xp[b] || (xp[t].is_nan() && !xp[b].is_nan()),
                };
                if better {
                    best = Some(t);
                }
            }
            if let Some(b) = best {
                dxp[b] += dyp[o];
            }
        });
    }
    Ok(float_tensor(x.dtype, x.shape.clone(), dx))
}

/// dx of `avg_pool`: each dy spreads evenly over the cells its window averaged (the
/// divisor follows `count_include_pad` as in the forward op).
pub(super) fn avg_pool_grad(attrs: &AvgPoolGradAttrs, dy: &Tensor) -> OpResult<Tensor> {
    let dyv = floats(dy, "dy")?;
    let in_shape = shape_attr(&attrs.input_shape, "input_shape")?;
    let (n, c, in_sp) = split_nc(&in_shape, "`input_shape`")?;
    let pool = AvgPoolAttrs::of_grad(attrs);
    let geom = pool_geom((&pool).into(), &in_sp)?;
    let include_pad = attrs.count_include_pad;
    let mut want = vec![n, c];
    want.extend(&geom.out_sp);
    check_shape(dy, &want, "dy")?;
    // Divisors per output position, in the order for_each_window visits them.
    let [td, th, tw] = &geom.taps;
    let mut counts = Vec::with_capacity(geom.out_plane());
    for a in td {
        for e in th {
            for g in tw {
                counts.push(if include_pad {
                    a.padded * e.padded * g.padded
                } else {
                    (a.hi - a.lo) * (e.hi - e.lo) * (g.hi - g.lo)
                });
            }
        }
    }
    let (isz, osz) = (in_sp.iter().product::<usize>(), geom.out_plane());
    let mut dx = vec![0.0; n * c * isz];
    for p in 0..n * c {
        let dxp = &mut dx[p * isz..(p + 1) * isz];
        let dyp = &dyv[p * osz..(p + 1) * osz];
        geom.for_each_window(|o, taps| {
            let share = dyp[o] / counts[o] as f64;
            for &t in taps {
                dxp[t] += share;
            }
        });
    }
    Ok(float_tensor(dy.dtype, in_shape, dx))
}

// ---- convolution weight gradient ----

/// dw of `conv(x, w)`: `dw[oc, ci, k..] = Σ_b Σ_z dy[b, oc, z] · x[b, g·C/group + ci,
/// z·stride - pad + k·dilation]`, with `kernel_shape` giving w's spatial dims.
pub(super) fn conv_grad_weight(
    attrs: &ConvGradWeightAttrs,
    x: &Tensor,
    dy: &Tensor,
) -> OpResult<Tensor> {
    same_dtype(x, dy)?;
    let xv = floats(x, "x")?;
    let dyv = floats(dy, "dy")?;
    let (n, c, in_sp) = split_nc(&x.shape, "x")?;
    let nsp = in_sp.len();
    let ksp = shape_attr(&attrs.kernel_shape, "kernel_shape")?;
    if ksp.len() != nsp || ksp.contains(&0) {
        fail!("`kernel_shape` must be {nsp} positive sizes, got {ksp:?}");
    }
    let group = attrs.group;
    if dy.shape.len() != x.shape.len() {
        fail!(
            "dy must have rank {}, got shape {:?}",
            x.shape.len(),
            dy.shape
        );
    }
    let m = dy.shape[1];
    if group < 1 || !c.is_multiple_of(group as usize) || !m.is_multiple_of(group as usize) {
        fail!("group {group} must be positive and divide the {c} input and {m} output channels");
    }
    let group = group as usize;
    let (cg, mg) = (c / group, m / group);
    let win = Window::new(
        attrs.strides.as_deref(),
        attrs.pads.as_deref(),
        attrs.dilations.as_deref(),
        nsp,
    )?;
    let mut out_sp = Vec::with_capacity(nsp);
    for i in 0..nsp {
        let span = win.dilations[i] * (ksp[i] - 1) + 1;
        let padded = in_sp[i] + win.pads[i] + win.pads[nsp + i];
        if padded < span {
            fail!("spatial dimension {i}: kernel {} (dilation {}) does not fit the padded input of size {padded}", ksp[i], win.dilations[i]);
        }
        out_sp.push((padded - span) / win.strides[i] + 1);
    }
    let mut want = vec![n, m];
    want.extend(&out_sp);
    check_shape(dy, &want, "dy")?;

    let [id, ih, iw] = to3(&in_sp, 1);
    let [od, oh, ow] = to3(&out_sp, 1);
    let [kd, kh, kw] = to3(&ksp, 1);
    let [sd, sh, sw] = to3(&win.strides, 1);
    let [dd, dh, dw] = to3(&win.dilations, 1);
    let [pd, ph, pw] = to3(&win.pads[..nsp], 0).map(|p| p as i64);
    let (isz, osz, ksz) = (id * ih * iw, od * oh * ow, kd * kh * kw);

    let mut out = vec![0.0; m * cg * ksz];
    for oc in 0..m {
        let g = oc / mg;
        for ci in 0..cg {
            let ic = g * cg + ci;
            let wk = &mut out[(oc * cg + ci) * ksz..(oc * cg + ci + 1) * ksz];
            for b in 0..n {
                let xp = &xv[(b * c + ic) * isz..(b * c + ic + 1) * isz];
                let dyp = &dyv[(b * m + oc) * osz..(b * m + oc + 1) * osz];
                for a in 0..kd {
                    let off_d = (a * dd) as i64 - pd;
                    let (d_lo, d_hi) = valid_range(od, id, sd, off_d);
                    for e in 0..kh {
                        let off_h = (e * dh) as i64 - ph;
                        let (h_lo, h_hi) = valid_range(oh, ih, sh, off_h);
                        for f in 0..kw {
                            let off_w = (f * dw) as i64 - pw;
                            let (w_lo, w_hi) = valid_range(ow, iw, sw, off_w);
                            let mut acc = 0.0;
                            for zd in d_lo..d_hi {
                                let xd = ((zd * sd) as i64 + off_d) as usize;
                                for zh in h_lo..h_hi {
                                    let xh = ((zh * sh) as i64 + off_h) as usize;
                                    let drow = &dyp[(zd * oh + zh) * ow..];
                                    let xrow = &xp[(xd * ih + xh) * iw..];
                                    for (zw, &d) in drow[..w_hi].iter().enumerate().skip(w_lo) {
                                        let xw = ((zw * sw) as i64 + off_w) as usize;
                                        acc += d * xrow[xw];
                                    }
                                }
                            }
                            wk[(a * kh + e) * kw + f] += acc;
                        }
                    }
                }
            }
        }
    }
    let mut shape = vec![m, cg];
    shape.extend(ksp);
    Ok(float_tensor(x.dtype, shape, out))
}

// ---- gather and slice ----

/// dData of `gather(data, indices)`: `zeros(data_shape)` with each dy element added at
/// the data element it was gathered from (negative indices count from the end).
pub(super) fn gather_grad(
    attrs: &GatherGradAttrs,
    indices: &Tensor,
    dy: &Tensor,
) -> OpResult<Tensor> {
    let idx = ints(indices, "indices")?;
    let dyv = floats(dy, "dy")?;
    let data_shape = shape_attr(&attrs.data_shape, "data_shape")?;
    if data_shape.is_empty() {
        fail!("`data_shape` must have rank >= 1");
    }
    let axis = norm_axis(attrs.axis, data_shape.len())?;
    let mut want = data_shape[..axis].to_vec();
    want.extend_from_slice(&indices.shape);
    want.extend_from_slice(&data_shape[axis + 1..]);
    check_shape(dy, &want, "dy")?;
    let d = data_shape[axis];
    let outer: usize = data_shape[..axis].iter().product();
    let inner: usize = data_shape[axis + 1..].iter().product();
    let mut rows = Vec::with_capacity(idx.len());
    for &i in idx {
        let j = if i < 0 { i + d as i64 } else { i };
        if j < 0 || j >= d as i64 {
            fail!("index {i} out of range for axis {axis} of size {d}");
        }
        rows.push(j as usize);
    }
    let mut dx = vec![0.0; data_shape.iter().product()];
    for o in 0..outer {
        for (k, &r) in rows.iter().enumerate() {
            let src = &dyv[(o * rows.len() + k) * inner..][..inner];
            let dst = &mut dx[(o * d + r) * inner..][..inner];
            for (a, &b) in dst.iter_mut().zip(src) {
                *a += b;
            }
        }
    }
    Ok(float_tensor(dy.dtype, data_shape, dx))
}

/// dx of `slice(x)`: `zeros(input_shape)` with dy written where the slice read (any
/// steps; each input element is read at most once).
pub(super) fn slice_grad(attrs: &SliceGradAttrs, dy: &Tensor) -> OpResult<Tensor> {
    let dyv = floats(dy, "dy")?;
    let in_shape = shape_attr(&attrs.input_shape, "input_shape")?;
    let maps = slice_maps(&SliceAttrs::of_grad(attrs), &in_shape)?;
    let want: Vec<usize> = maps.iter().map(|m| m.len()).collect();
    check_shape(dy, &want, "dy")?;
    let st = strides_of(&in_shape);
    let mut dx = vec![0.0; in_shape.iter().product()];
    let rank = want.len();
    let mut idx = vec![0usize; rank];
    for &v in dyv {
        let off: usize = (0..rank)
            .map(|a| maps[a][idx[a]].unwrap_or(0) * st[a])
            .sum();
        dx[off] = v;
        for a in (0..rank).rev() {
            idx[a] += 1;
            if idx[a] < want[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    Ok(float_tensor(dy.dtype, in_shape, dx))
}
