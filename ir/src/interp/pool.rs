//! Pooling: max and average over windows (1 to 3 spatial dimensions), and the global forms.
//!
//! Output size per spatial dimension, with `span = (k - 1) · dilation + 1`:
//! `floor((in + pads - span) / stride) + 1`, or with `ceil_mode` the ceiling, dropping the
//! last window when it would start past the input and the begin padding (the ONNX and
//! PyTorch rule). Padded cells never win a max. For averages the divisor is the number of
//! cells inside the input (`count_include_pad = 0`) or inside the explicitly padded input
//! (`count_include_pad = 1`); cells of a `ceil_mode` window beyond the padding never count.
//! `dilations` apply to both (average pooling has them since opset 19).

use super::conv::{split_nc, to3, Window};
use super::util::{fail, float_tensor, floats, max_nan, valid_range, OpResult};
use crate::ops::attrs::{AvgPoolAttrs, MaxPoolAttrs};
use crate::ops::OpKind;
use crate::tensor::Tensor;

/// Taps of one window along one dimension: `lo..hi` are the taps inside the input, `padded`
/// counts those inside the padded input (as the forward pool computes them).
#[derive(Clone, Copy)]
pub(super) struct Taps {
    pub lo: usize,
    pub hi: usize,
    pub padded: usize,
}

/// The geometry of a pool over `in_sp`, padded to three spatial dims in front.
pub(super) struct PoolGeom {
    pub taps: [Vec<Taps>; 3],
    pub in3: [usize; 3],
    pub strides: [usize; 3],
    pub dilations: [usize; 3],
    pub pads: [usize; 3],
    pub out_sp: Vec<usize>,
}

/// What a pool reads from its attributes: the view of `max_pool`, `avg_pool` and their
/// gradients (`count_include_pad` is false for max pooling).
#[derive(Clone, Copy)]
pub(super) struct PoolAttrs<'a> {
    pub kernel_shape: &'a [i64],
    pub strides: Option<&'a [i64]>,
    pub pads: Option<&'a [i64]>,
    pub dilations: Option<&'a [i64]>,
    pub ceil_mode: bool,
    pub count_include_pad: bool,
}

impl<'a> From<&'a MaxPoolAttrs> for PoolAttrs<'a> {
    fn from(a: &'a MaxPoolAttrs) -> Self {
        PoolAttrs {
            kernel_shape: &a.kernel_shape,
            strides: a.strides.as_deref(),
            pads: a.pads.as_deref(),
            dilations: a.dilations.as_deref(),
            ceil_mode: a.ceil_mode,
            count_include_pad: false,
        }
    }
}

impl<'a> From<&'a AvgPoolAttrs> for PoolAttrs<'a> {
    fn from(a: &'a AvgPoolAttrs) -> Self {
        PoolAttrs {
            kernel_shape: &a.kernel_shape,
            strides: a.strides.as_deref(),
            pads: a.pads.as_deref(),
            dilations: a.dilations.as_deref(),
            ceil_mode: a.ceil_mode,
            count_include_pad: a.count_include_pad,
        }
    }
}

/// Window geometry shared by the pools and their gradients (one definition of the
/// output-size and padding rules).
pub(super) fn pool_geom(attrs: PoolAttrs, in_sp: &[usize]) -> OpResult<PoolGeom> {
    let nsp = in_sp.len();
    let kernel = attrs.kernel_shape;
    if kernel.len() != nsp || kernel.iter().any(|&k| k < 1) {
        fail!("`kernel_shape` must be {nsp} positive integers, got {kernel:?}");
    }
    let kernel: Vec<usize> = kernel.iter().map(|&k| k as usize).collect();
    let win = Window::new(attrs.strides, attrs.pads, attrs.dilations, nsp)?;
    let ceil_mode = attrs.ceil_mode;
    let mut taps: Vec<Vec<Taps>> = Vec::with_capacity(nsp);
    let mut out_sp = Vec::with_capacity(nsp);
    for i in 0..nsp {
        let (k, s, d) = (kernel[i], win.strides[i], win.dilations[i]);
        let (pb, pe) = (win.pads[i], win.pads[nsp + i]);
        let span = (k - 1) * d + 1;
        let padded = in_sp[i] + pb + pe;
        if padded < span {
            fail!("spatial dimension {i}: window of span {span} does not fit the padded input of size {padded}");
        }
        let mut out = if ceil_mode {
            (padded - span).div_ceil(s) + 1
        } else {
            (padded - span) / s + 1
        };
        if ceil_mode && (out - 1) * s >= in_sp[i] + pb {
            out -= 1;
        }
        out_sp.push(out);
        taps.push(
            (0..out)
                .map(|z| {
                    let start = (z * s) as i64 - pb as i64;
                    let (lo, hi) = valid_range(k, in_sp[i], d, start);
                    let (plo, phi) = valid_range(k, padded, d, start + pb as i64);
                    Taps {
                        lo,
                        hi,
                        padded: phi - plo,
                    }
                })
                .collect(),
        );
    }
    let unit = vec![Taps {
        lo: 0,
        hi: 1,
        padded: 1,
    }];
    let mut t3 = [unit.clone(), unit.clone(), unit];
    for (i, t) in taps.into_iter().enumerate() {
        t3[3 - nsp + i] = t;
    }
    Ok(PoolGeom {
        taps: t3,
        in3: to3(in_sp, 1),
        strides: to3(&win.strides, 1),
        dilations: to3(&win.dilations, 1),
        pads: to3(&win.pads[..nsp], 0),
        out_sp,
    })
}

/// `max_pool` and `avg_pool`.
pub(super) fn pool(kind: OpKind, attrs: PoolAttrs, x: &Tensor) -> OpResult<Tensor> {
    let xv = floats(x, "x")?;
    let (n, c, in_sp) = split_nc(&x.shape, "x")?;
    let include_pad = attrs.count_include_pad;
    let g = pool_geom(attrs, &in_sp)?;
    let [td, th, tw] = &g.taps;
    let [id, ih, iw] = g.in3;
    let [sd, sh, sw] = g.strides;
    let [dd, dh, dw] = g.dilations;
    let [pd, ph, pw] = g.pads;
    let (isz, osz) = (id * ih * iw, td.len() * th.len() * tw.len());

    let mut out = Vec::with_capacity(n * c * osz);
    for plane in 0..n * c {
        let xp = &xv[plane * isz..(plane + 1) * isz];
        for (zd, a) in td.iter().enumerate() {
            for (zh, e) in th.iter().enumerate() {
                for (zw, f) in tw.iter().enumerate() {
                    // Input coordinate of tap j: z·stride - pad + j·dilation (in range by `Taps`).
                    let xd = |j: usize| zd * sd + j * dd - pd;
                    let xh = |j: usize| zh * sh + j * dh - ph;
                    let xw = |j: usize| zw * sw + j * dw - pw;
                    let v = if kind == OpKind::MaxPool {
                        let mut m = f64::NEG_INFINITY;
                        for jd in a.lo..a.hi {
                            for jh in e.lo..e.hi {
                                let row = &xp[(xd(jd) * ih + xh(jh)) * iw..];
                                for jw in f.lo..f.hi {
                                    m = max_nan(m, row[xw(jw)]);
                                }
                            }
                        }
                        m
                    } else {
                        let mut sum = 0.0;
                        for jd in a.lo..a.hi {
                            for jh in e.lo..e.hi {
                                let row = &xp[(xd(jd) * ih + xh(jh)) * iw..];
                                for jw in f.lo..f.hi {
                                    sum += row[xw(jw)];
                                }
                            }
                        }
                        let count = if include_pad {
                            a.padded * e.padded * f.padded
                        } else {
                            (a.hi - a.lo) * (e.hi - e.lo) * (f.hi - f.lo)
                        };
                        sum / count as f64
                    };
                    out.push(v);
                }
            }
        }
    }
    let mut shape = vec![n, c];
    shape.extend(g.out_sp);
    Ok(float_tensor(x.dtype, shape, out))
}

/// `global_avg_pool` and `global_max_pool`: every spatial dimension becomes 1.
pub(super) fn global_pool(kind: OpKind, x: &Tensor) -> OpResult<Tensor> {
    let xv = floats(x, "x")?;
    if x.shape.len() < 2 {
        fail!("x must have shape [N, C, spatial..], got {:?}", x.shape);
    }
    let planes = x.shape[0] * x.shape[1];
    let size: usize = x.shape[2..].iter().product();
    let out: Vec<f64> = (0..planes)
        .map(|p| {
            let v = &xv[p * size..(p + 1) * size];
            if kind == OpKind::GlobalMaxPool {
                v.iter().copied().fold(f64::NEG_INFINITY, max_nan)
            } else {
                v.iter().sum::<f64>() / size as f64
            }
        })
        .collect();
    let mut shape = x.shape.clone();
    for d in &mut shape[2..] {
        *d = 1;
    }
    Ok(float_tensor(x.dtype, shape, out))
}
