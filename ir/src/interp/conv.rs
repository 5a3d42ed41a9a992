//! Convolution and transposed convolution, for 1 to 3 spatial dimensions.
//!
//! Fewer than three spatial dimensions are padded in front with unit dimensions (kernel 1,
//! stride 1, no padding), so one set of direct loops serves every rank. The innermost loop
//! runs over the last spatial dimension, contiguous in the output and the input; the range
//! of output positions whose input falls inside the (unpadded) input is computed once per
//! kernel tap ([`valid_range`]), so the loops carry no padding test.

use super::util::{fail, float_tensor, floats, same_dtype, to_usize, valid_range, OpResult};
use crate::ops::attrs::{ConvAttrs, ConvTransposeAttrs};
use crate::tensor::Tensor;

/// Strides, pads and dilations of a window op over `nsp` spatial dimensions, validated.
pub(super) struct Window {
    pub strides: Vec<usize>,
    /// Begin pads then end pads.
    pub pads: Vec<usize>,
    pub dilations: Vec<usize>,
}

impl Window {
    /// From the op's `strides`, `pads` and `dilations` (absent: ones, zeros, ones).
    pub(super) fn new(
        strides: Option<&[i64]>,
        pads: Option<&[i64]>,
        dilations: Option<&[i64]>,
        nsp: usize,
    ) -> OpResult<Window> {
        let strides = positive_list(strides, "strides", nsp)?;
        let dilations = positive_list(dilations, "dilations", nsp)?;
        let pads = pads.map_or_else(|| vec![0; 2 * nsp], <[i64]>::to_vec);
        if pads.len() != 2 * nsp {
            fail!(
                "`pads` must have {} entries (begins then ends), got {:?}",
                2 * nsp,
                pads
            );
        }
        let pads = pads
            .iter()
            .map(|&p| to_usize(p, "each pad"))
            .collect::<OpResult<Vec<_>>>()?;
        Ok(Window {
            strides,
            pads,
            dilations,
        })
    }
}

/// An optional list attribute `name` of `n` positive integers (default all 1).
fn positive_list(value: Option<&[i64]>, name: &str, n: usize) -> OpResult<Vec<usize>> {
    let v = value.map_or_else(|| vec![1; n], <[i64]>::to_vec);
    if v.len() != n || v.iter().any(|&s| s < 1) {
        fail!("`{name}` must be {n} positive integers, got {v:?}");
    }
    Ok(v.iter().map(|&s| s as usize).collect())
}

/// Pad a per-spatial-dimension list in front to three entries.
pub(super) fn to3(v: &[usize], fill: usize) -> [usize; 3] {
    let mut out = [fill; 3];
    out[3 - v.len()..].copy_from_slice(v);
    out
}

/// Split a `[N, C, spatial..]` shape, rejecting more than three spatial dimensions.
pub(super) fn split_nc(shape: &[usize], what: &str) -> OpResult<(usize, usize, Vec<usize>)> {
    if shape.len() < 2 || shape.len() > 5 {
        fail!("{what} must have shape [N, C, spatial..] with 0 to 3 spatial dimensions, got {shape:?}");
    }
    Ok((shape[0], shape[1], shape[2..].to_vec()))
}

/// Check a per-output-channel bias of `m` entries and return its data.
fn bias_of<'a>(x: &Tensor, bias: Option<&&'a Tensor>, m: usize) -> OpResult<Option<&'a [f64]>> {
    let Some(b) = bias else { return Ok(None) };
    same_dtype(x, b)?;
    if b.shape != [m] {
        fail!("bias must have shape [{m}], got {:?}", b.shape);
    }
    Ok(Some(floats(b, "bias")?))
}

/// ONNX Conv. x `[N, C, d..]`, w `[M, C/group, k..]`, optional bias `[M]`.
pub(super) fn conv(attrs: &ConvAttrs, inputs: &[&Tensor]) -> OpResult<Tensor> {
    let (x, w) = (inputs[0], inputs[1]);
    same_dtype(x, w)?;
    let xv = floats(x, "x")?;
    let wv = floats(w, "w")?;
    let (n, c, in_sp) = split_nc(&x.shape, "x")?;
    let nsp = in_sp.len();
    if w.shape.len() != x.shape.len() {
        fail!(
            "w must have rank {} like x, got shape {:?}",
            x.shape.len(),
            w.shape
        );
    }
    let m = w.shape[0];
    let ksp = w.shape[2..].to_vec();
    let group = attrs.group;
    if group < 1 || c % group as usize != 0 || m % group as usize != 0 {
        fail!("group {group} must be positive and divide the {c} input and {m} output channels");
    }
    let group = group as usize;
    let (cg, mg) = (c / group, m / group);
    if w.shape[1] != cg {
        fail!(
            "w must have {cg} input channels per group (C = {c}, group = {group}), got shape {:?}",
            w.shape
        );
    }
    if let Some(ks) = &attrs.kernel_shape {
        if ks.iter().map(|&k| k as usize).ne(ksp.iter().copied()) || ks.iter().any(|&k| k < 0) {
            fail!(
                "kernel_shape {ks:?} disagrees with w of shape {:?}",
                w.shape
            );
        }
    }
    let win = Window::new(
        attrs.strides.as_deref(),
        attrs.pads.as_deref(),
        attrs.dilations.as_deref(),
        nsp,
    )?;
    let bias = bias_of(x, inputs.get(2), m)?;

    let mut out_sp = Vec::with_capacity(nsp);
    for i in 0..nsp {
        let span = win.dilations[i] * ksp[i].saturating_sub(1) + 1;
        let padded = in_sp[i] + win.pads[i] + win.pads[nsp + i];
        if ksp[i] == 0 || padded < span {
            fail!(
                "spatial dimension {i}: kernel {} (dilation {}) does not fit the padded input of size {padded}",
                ksp[i],
                win.dilations[i]
            );
        }
        out_sp.push((padded - span) / win.strides[i] + 1);
    }

    let [id, ih, iw] = to3(&in_sp, 1);
    let [od, oh, ow] = to3(&out_sp, 1);
    let [kd, kh, kw] = to3(&ksp, 1);
    let [sd, sh, sw] = to3(&win.strides, 1);
    let [dd, dh, dw] = to3(&win.dilations, 1);
    let [pd, ph, pw] = to3(&win.pads[..nsp], 0).map(|p| p as i64);
    let (isz, osz, ksz) = (id * ih * iw, od * oh * ow, kd * kh * kw);

    let mut out = vec![0.0; n * m * osz];
    for b in 0..n {
        for oc in 0..m {
            let g = oc / mg;
            let plane = &mut out[(b * m + oc) * osz..(b * m + oc + 1) * osz];
            if let Some(bias) = bias {
                plane.fill(bias[oc]);
            }
            for ci in 0..cg {
                let ic = g * cg + ci;
                let xp = &xv[(b * c + ic) * isz..(b * c + ic + 1) * isz];
                let wk = &wv[(oc * cg + ci) * ksz..(oc * cg + ci + 1) * ksz];
                for a in 0..kd {
                    let off_d = (a * dd) as i64 - pd;
                    let (d_lo, d_hi) = valid_range(od, id, sd, off_d);
                    for e in 0..kh {
                        let off_h = (e * dh) as i64 - ph;
                        let (h_lo, h_hi) = valid_range(oh, ih, sh, off_h);
                        for f in 0..kw {
                            let wt = wk[(a * kh + e) * kw + f];
                            let off_w = (f * dw) as i64 - pw;
                            let (w_lo, w_hi) = valid_range(ow, iw, sw, off_w);
                            if w_lo >= w_hi || h_lo >= h_hi || d_lo >= d_hi {
                                continue;
                            }
                            // First input column read: valid_range makes it non-negative.
                            let x0 = (w_lo * sw) as i64 + off_w;
                            let x0 = x0 as usize;
                            if sw == 1 && sh == 1 && x0 == 0 && w_lo == 0 && w_hi == ow && ow == iw
                            {
                                // Whole rows that are contiguous in both planes (1×1
                                // convolutions, the middle column of padded 3×3 ones):
                                // one loop over the block of rows h_lo..h_hi.
                                let rows = h_hi - h_lo;
                                let xh0 = (h_lo as i64 + off_h) as usize;
                                for zd in d_lo..d_hi {
                                    let xd = ((zd * sd) as i64 + off_d) as usize;
                                    let ob = &mut plane[(zd * oh + h_lo) * ow..][..rows * ow];
                                    let xb = &xp[(xd * ih + xh0) * iw..][..rows * ow];
                                    for (o, &xv) in ob.iter_mut().zip(xb) {
                                        *o += wt * xv;
                                    }
                                }
                                continue;
                            }
                            for zd in d_lo..d_hi {
                                let xd = ((zd * sd) as i64 + off_d) as usize;
                                for zh in h_lo..h_hi {
                                    let xh = ((zh * sh) as i64 + off_h) as usize;
                                    let orow = &mut plane[(zd * oh + zh) * ow..][w_lo..w_hi];
                                    let xrow = &xp[(xd * ih + xh) * iw..(xd * ih + xh + 1) * iw];
                                    if sw == 1 {
                                        for (o, &xv) in orow.iter_mut().zip(&xrow[x0..]) {
                                            *o += wt * xv;
                                        }
                                    } else {
                                        for (o, &xv) in
                                            orow.iter_mut().zip(xrow[x0..].iter().step_by(sw))
                                        {
                                            *o += wt * xv;
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    let mut shape = vec![n, m];
    shape.extend(out_sp);
    Ok(float_tensor(x.dtype, shape, out))
}

/// ONNX ConvTranspose. x `[N, C, d..]`, w `[C, M/group, k..]`, optional bias `[M]`.
/// Output size per spatial dimension:
/// `stride · (in - 1) + output_padding + (k - 1) · dilation + 1 - pad_begin - pad_end`.
pub(super) fn conv_transpose(attrs: &ConvTransposeAttrs, inputs: &[&Tensor]) -> OpResult<Tensor> {
    let (x, w) = (inputs[0], inputs[1]);
    same_dtype(x, w)?;
    let xv = floats(x, "x")?;
    let wv = floats(w, "w")?;
    let (n, c, in_sp) = split_nc(&x.shape, "x")?;
    let nsp = in_sp.len();
    if w.shape.len() != x.shape.len() || w.shape[0] != c {
        fail!(
            "w must have shape [{c}, M/group, k..] (rank {}), got {:?}",
            x.shape.len(),
            w.shape
        );
    }
    let group = attrs.group;
    if group < 1 || c % group as usize != 0 {
        fail!("group {group} must be positive and divide the {c} input channels");
    }
    let group = group as usize;
    let (cg, mg) = (c / group, w.shape[1]);
    let m = mg * group;
    let ksp = w.shape[2..].to_vec();
    let win = Window::new(
        attrs.strides.as_deref(),
        attrs.pads.as_deref(),
        attrs.dilations.as_deref(),
        nsp,
    )?;
    let out_pad = attrs.output_padding.clone().unwrap_or_else(|| vec![0; nsp]);
    if out_pad.len() != nsp || out_pad.iter().any(|&p| p < 0) {
        fail!("`output_padding` must be {nsp} non-negative integers, got {out_pad:?}");
    }
    let bias = bias_of(x, inputs.get(2), m)?;

    let mut out_sp = Vec::with_capacity(nsp);
    for i in 0..nsp {
        let full = win.strides[i] * in_sp[i].saturating_sub(1)
            + out_pad[i] as usize
            + win.dilations[i] * ksp[i].saturating_sub(1)
            + 1;
        let pads = win.pads[i] + win.pads[nsp + i];
        if in_sp[i] == 0 || ksp[i] == 0 || full <= pads {
            fail!(
                "spatial dimension {i}: the output size would be {} (pads {pads})",
                full as i64 - pads as i64
            );
        }
        out_sp.push(full - pads);
    }

    let [id, ih, iw] = to3(&in_sp, 1);
    let [od, oh, ow] = to3(&out_sp, 1);
    let [kd, kh, kw] = to3(&ksp, 1);
    let [sd, sh, sw] = to3(&win.strides, 1);
    let [dd, dh, dw] = to3(&win.dilations, 1);
    let [pd, ph, pw] = to3(&win.pads[..nsp], 0).map(|p| p as i64);
    let (isz, osz, ksz) = (id * ih * iw, od * oh * ow, kd * kh * kw);

    // Scatter form: input position i, tap k lands on output position i·stride + k·dilation - pad.
    let mut out = vec![0.0; n * m * osz];
    for b in 0..n {
        for oc in 0..m {
            let g = oc / mg;
            let mo = oc % mg;
            let plane = &mut out[(b * m + oc) * osz..(b * m + oc + 1) * osz];
            if let Some(bias) = bias {
                plane.fill(bias[oc]);
            }
            for ci in 0..cg {
                let ic = g * cg + ci;
                let xp = &xv[(b * c + ic) * isz..(b * c + ic + 1) * isz];
                let wk = &wv[(ic * mg + mo) * ksz..(ic * mg + mo + 1) * ksz];
                for a in 0..kd {
                    let off_d = (a * dd) as i64 - pd;
                    let (d_lo, d_hi) = valid_range(id, od, sd, off_d);
                    for e in 0..kh {
                        let off_h = (e * dh) as i64 - ph;
                        let (h_lo, h_hi) = valid_range(ih, oh, sh, off_h);
                        for f in 0..kw {
                            let wt = wk[(a * kh + e) * kw + f];
                            let off_w = (f * dw) as i64 - pw;
                            let (w_lo, w_hi) = valid_range(iw, ow, sw, off_w);
                            if w_lo >= w_hi {
                                continue;
                            }
                            let o0 = ((w_lo * sw) as i64 + off_w) as usize;
                            for zd in d_lo..d_hi {
                                let yd = ((zd * sd) as i64 + off_d) as usize;
                                for zh in h_lo..h_hi {
                                    let yh = ((zh * sh) as i64 + off_h) as usize;
                                    let xrow = &xp[(zd * ih + zh) * iw..][w_lo..w_hi];
                                    let orow =
                                        &mut plane[(yd * oh + yh) * ow..(yd * oh + yh + 1) * ow];
                                    for (o, &xv) in orow[o0..].iter_mut().step_by(sw).zip(xrow) {
                                        *o += wt * xv;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    let mut shape = vec![n, m];
    shape.extend(out_sp);
    Ok(float_tensor(x.dtype, shape, out))
}
