//! Normalisations, pooling and reductions that ppir has no op for, decomposed into ppir ops:
//!
//! - `LpNormalization`: `x / ‖x‖ₚ` along `axis` (p = 1 or 2), 0 where the norm is 0.
//! - `MeanVarianceNormalization`: `(x - E x) / (√(E x² - (E x)²) + 1e-9)` over `axes` (the
//!   op's function body).
//! - `GroupNormalization`: x reshaped to `[N, G, rest]`, normalised over `rest`
//!   (`√(var + ε)`, statistics in `stash_type`), then the per-channel scale and bias (per
//!   group before opset 21).
//! - `LpPool`: `(Σ_window |x|ᵖ)^(1/p)`, the window sums a depthwise `conv` with a kernel of
//!   ones (padding adds zeros; `ceil_mode` pads the end with more zeros).
//! - `ReduceProd`: the reduced axes moved last and flattened, then halved `log₂ n` times
//!   (`mul` of the two halves, an odd length padded with a one): exact products whose
//!   gradient is the product rule, zeros included.
//! - `BatchNormalization` with `training_mode = 1` (opset 14+): normalised with the batch's
//!   mean and (population) variance over every axis but the channels; the running-statistics
//!   results are `mean·momentum + batch_mean·(1 - momentum)` (and the same for the variance).
//! - `CausalConvWithState`: `past_state` (zeros without it) concatenated before the input
//!   along the length, a depthwise `conv` (`group` = channels) with the bias, optionally
//!   SiLU; `present_state` is the last k - 1 positions of the concatenation.

use ppir::ops::attrs::{ConcatAttrs, ConvAttrs, PadAttrs, ReduceAttrs, ShapeAttrs, TransposeAttrs};
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, Dim, OpKind, Tensor};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, unsupported, Fail, Importer, Val, BATCH_NEEDED, R};
use super::super::proto::NodeProto;
use super::attention::{known, known_dims};
use super::{norm_axis, OrInvalid};

use OpKind as K;

fn reduce(axes: Vec<i64>, keepdims: bool) -> Attrs {
    ReduceAttrs { axes, keepdims }.to_attrs()
}

impl Importer<'_> {
    pub(super) fn lower_lp_normalization(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let x = self.req(node, 0)?;
        let rank = self.rank_of(&x)?;
        if rank == 0 {
            invalid!("expects a tensor of rank at least 1");
        }
        let axis = norm_axis(a.int_or("axis", -1).inv()?, rank)? as i64;
        let norm = match a.int_or("p", 2).inv()? {
            1 => {
                let ax = self.un(K::Abs, x.clone())?;
                self.op(K::ReduceSum, reduce(vec![axis], true), &[ax])?
            }
            2 => {
                let sq = self.binop(K::Mul, x.clone(), x.clone())?;
                let s = self.op(K::ReduceSum, reduce(vec![axis], true), &[sq])?;
                self.un(K::Sqrt, s)?
            }
            p => invalid!("attribute `p` must be 1 or 2, not {p}"),
        };
        // A zero norm has an all-zero row: divide it by 1.
        let dt = self.ty(&x)?.dtype;
        let zero = self.cst(dt, 0.0);
        let is_zero = self.binop(K::Equal, norm.clone(), zero)?;
        let one = self.cst(dt, 1.0);
        let safe = self.op(K::Where, Attrs::new(), &[is_zero, one, norm])?;
        self.binop(K::Div, x, safe)
    }

    pub(super) fn lower_mvn(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let x = self.req(node, 0)?;
        let axes = a.ints("axes").inv()?.unwrap_or_else(|| vec![0, 2, 3]);
        let mean = self.op(
            K::ReduceMean,
            reduce(axes.clone(), true),
            std::slice::from_ref(&x),
        )?;
        let sq = self.binop(K::Mul, x.clone(), x.clone())?;
        let mean_sq = self.op(K::ReduceMean, reduce(axes, true), &[sq])?;
        let sq_mean = self.binop(K::Mul, mean.clone(), mean.clone())?;
        let var = self.binop(K::Sub, mean_sq, sq_mean)?;
        let sd = self.un(K::Sqrt, var)?;
        let den = self.with_scalar(K::Add, sd, 1e-9)?;
        let d = self.binop(K::Sub, x, mean)?;
        self.binop(K::Div, d, den)
    }

    pub(super) fn lower_group_norm(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let (x, scale, bias) = (self.req(node, 0)?, self.req(node, 1)?, self.req(node, 2)?);
        let xt = self.ty(&x)?;
        if !xt.dtype.is_float() {
            invalid!("X must be a float tensor, not {}", xt.dtype);
        }
        if xt.rank() < 2 {
            invalid!("X must have rank at least 2 ([N, C, ..])");
        }
        let Some(groups) = a.int("num_groups").inv()? else {
            invalid!("attribute `num_groups` is required")
        };
        let c = known(xt.dims[1], "the channel count")? as i64;
        if groups <= 0 || c % groups != 0 {
            invalid!("the channel count {c} is not a multiple of num_groups {groups}");
        }
        let epsilon = a.float_or("epsilon", 1e-5).inv()?;
        let stash = if self.opset >= 21 {
            match a.int_or("stash_type", 1).inv()? {
                1 => DType::F32,
                11 => DType::F64,
                t => invalid!("attribute `stash_type` must be 1 or 11, not {t}"),
            }
        } else {
            xt.dtype
        };
        // Opset 18's scale and bias are per group, opset 21's per channel.
        let per = if self.opset >= 21 { c } else { groups };
        for (what, v) in [("scale", &scale), ("bias", &bias)] {
            let t = self.ty(v)?;
            if t.rank() != 1 || t.dims[0] != Dim::Known(per as u64) {
                invalid!("{what} must have shape [{per}], not {t}");
            }
        }
        let n = match xt.dims[0] {
            Dim::Known(n) => n as i64,
            Dim::Batch => -1,
        };
        let xs = self.cast_to(x, stash)?;
        let grouped = self.op(
            K::Reshape,
            ShapeAttrs {
                shape: vec![n, groups, -1],
            }
            .to_attrs(),
            &[xs],
        )?;
        let mean = self.op(
            K::ReduceMean,
            reduce(vec![2], true),
            std::slice::from_ref(&grouped),
        )?;
        let d = self.binop(K::Sub, grouped, mean)?;
        let sq = self.binop(K::Mul, d.clone(), d.clone())?;
        let var = self.op(K::ReduceMean, reduce(vec![2], true), &[sq])?;
        let eps = self.cst(stash, epsilon as f32 as f64);
        let ve = self.binop(K::Add, var, eps)?;
        let sd = self.un(K::Sqrt, ve)?;
        let normed = self.binop(K::Div, d, sd)?;
        let normed = self.cast_to(normed, xt.dtype)?;
        // Scale and bias broadcast as [per, 1, ..] against [N, per, ..].
        let rank = xt.rank();
        let (y, tail) = if self.opset >= 21 {
            let back = super::attention::reshape_spec(&xt.dims)?;
            (
                self.op(K::Reshape, ShapeAttrs { shape: back }.to_attrs(), &[normed])?,
                rank - 2,
            )
        } else {
            (normed, 1)
        };
        let mut bshape = vec![per];
        bshape.extend(std::iter::repeat_n(1, tail));
        let shape = ShapeAttrs { shape: bshape };
        let scale = self.cast_to(scale, xt.dtype)?;
        let bias = self.cast_to(bias, xt.dtype)?;
        let s = self.op(K::Reshape, shape.to_attrs(), &[scale])?;
        let b = self.op(K::Reshape, shape.to_attrs(), &[bias])?;
        let ys = self.binop(K::Mul, y, s)?;
        let y = self.binop(K::Add, ys, b)?;
        if self.opset >= 21 {
            Ok(y)
        } else {
            let back = super::attention::reshape_spec(&xt.dims)?;
            self.op(K::Reshape, ShapeAttrs { shape: back }.to_attrs(), &[y])
        }
    }

    pub(super) fn lower_lp_pool(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Val> {
        let x = self.req(node, 0)?;
        let xt = self.ty(&x)?;
        if !xt.dtype.is_float() {
            invalid!("X must be a float tensor, not {}", xt.dtype);
        }
        let Some(kernel) = a.ints("kernel_shape").inv()? else {
            invalid!("attribute `kernel_shape` is required")
        };
        let ns = kernel.len();
        if xt.rank() != ns + 2 {
            invalid!("kernel_shape has {ns} dimensions, X is {}", xt);
        }
        if kernel.iter().any(|&k| k <= 0) {
            invalid!("kernel_shape must be positive");
        }
        let (strides, mut pads, dilations) = self.conv_common(a, &x, &kernel)?;
        if a.int_or("ceil_mode", 0).inv()? != 0 {
            // More zeros at the end so that the floor of the output size is its ceiling.
            let input = self.spatial_sizes(&x)?;
            for i in 0..ns {
                let span = input[i] + pads[i] + pads[ns + i] - (dilations[i] * (kernel[i] - 1) + 1);
                if span >= 0 && span % strides[i] != 0 {
                    let mut extra = strides[i] - span % strides[i];
                    // A last window must start inside the input or its begin padding.
                    let last_start = (span + extra) / strides[i] * strides[i];
                    if last_start >= input[i] + pads[i] {
                        extra -= strides[i];
                    }
                    pads[ns + i] += extra.max(0);
                }
            }
        }
        let p = a.int_or("p", 2).inv()?;
        if p <= 0 {
            invalid!("attribute `p` must be positive, not {p}");
        }
        let c = known(xt.dims[1], "the channel count")?;
        let powed = match p {
            1 => self.un(K::Abs, x)?,
            2 => self.binop(K::Mul, x.clone(), x)?,
            _ => {
                let ax = self.un(K::Abs, x)?;
                self.with_scalar(K::Pow, ax, p as f64)?
            }
        };
        let mut wshape = vec![c, 1];
        wshape.extend(kernel.iter().map(|&k| k as usize));
        let count: usize = wshape.iter().product();
        let ones = Val::konst(Tensor::from_f64(xt.dtype, wshape, vec![1.0; count]));
        let attrs = ConvAttrs {
            strides: Some(strides),
            pads: Some(pads),
            dilations: Some(dilations),
            group: c as i64,
            kernel_shape: Some(kernel),
        };
        let sums = self.op(K::Conv, attrs.to_attrs(), &[powed, ones])?;
        match p {
            1 => Ok(sums),
            2 => self.un(K::Sqrt, sums),
            _ => self.with_scalar(K::Pow, sums, 1.0 / p as f64),
        }
    }

    pub(super) fn lower_reduce_prod(&mut self, x: Val, axes: Vec<i64>, keepdims: bool) -> R<Val> {
        let dims = self.dims_of(&x)?;
        let rank = dims.len();
        let mut axes = axes
            .iter()
            .map(|&ax| norm_axis(ax, rank.max(1)))
            .collect::<R<Vec<_>>>()?;
        if axes.is_empty() {
            axes = (0..rank).collect();
        }
        axes.sort_unstable();
        axes.dedup();
        let sizes = known_dims(&dims, "a dimension of ReduceProd's input")?;
        let kept: Vec<usize> = (0..rank).filter(|i| !axes.contains(i)).collect();
        let mut perm: Vec<i64> = kept.iter().map(|&i| i as i64).collect();
        perm.extend(axes.iter().map(|&i| i as i64));
        let out: Vec<i64> = if keepdims {
            (0..rank)
                .map(|i| {
                    if axes.contains(&i) {
                        1
                    } else {
                        sizes[i] as i64
                    }
                })
                .collect()
        } else {
            kept.iter().map(|&i| sizes[i] as i64).collect()
        };
        if sizes.contains(&0) {
            // An empty input: the empty product, ones (or an empty result), known now
            // (ppir has no reshapes to zero-size shapes).
            let dt = self.ty(&x)?.dtype;
            let shape: Vec<usize> = out.iter().map(|&d| d as usize).collect();
            let count = shape.iter().product();
            return Ok(Val::konst(if dt.is_float() {
                Tensor::from_f64(dt, shape, vec![1.0; count])
            } else {
                Tensor::from_i64(dt, shape, vec![1; count])
            }));
        }
        let mut y = if perm.iter().enumerate().all(|(i, &p)| i as i64 == p) {
            x
        } else {
            let attrs = TransposeAttrs { perm: Some(perm) };
            self.op(K::Transpose, attrs.to_attrs(), &[x])?
        };
        let mut flat: Vec<i64> = kept.iter().map(|&i| sizes[i] as i64).collect();
        let mut n: i64 = axes.iter().map(|&i| sizes[i] as i64).product();
        flat.push(n);
        y = self.op(
            K::Reshape,
            ShapeAttrs {
                shape: flat.clone(),
            }
            .to_attrs(),
            &[y],
        )?;
        let last = flat.len() as i64 - 1;
        while n > 1 {
            if n % 2 == 1 {
                let mut pads = vec![0i64; 2 * flat.len()];
                pads[2 * flat.len() - 1] = 1;
                let attrs = PadAttrs {
                    pads,
                    mode: "constant".into(),
                    value: 1.0,
                };
                y = self.op(K::Pad, attrs.to_attrs(), &[y])?;
                n += 1;
            }
            let lo = self.slice_axis(y.clone(), last, 0, n / 2, 1)?;
            let hi = self.slice_axis(y, last, n / 2, n, 1)?;
            y = self.binop(K::Mul, lo, hi)?;
            n /= 2;
        }
        self.op(K::Reshape, ShapeAttrs { shape: out }.to_attrs(), &[y])
    }

    pub(super) fn lower_causal_conv(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Vec<Val>> {
        if self.opset < 27 {
            return Err(self.unsupported_op(node));
        }
        let (x, w) = (self.req(node, 0)?, self.req(node, 1)?);
        let (xt, wt) = (self.ty(&x)?, self.ty(&w)?);
        if xt.rank() != 3 || wt.rank() != 3 {
            invalid!("input and weight must have rank 3, not {xt} and {wt}");
        }
        let c = known(xt.dims[1], "the channel count")?;
        let k = known(wt.dims[2], "the kernel size")?;
        if wt.dims[0] != Dim::Known(c as u64) || wt.dims[1] != Dim::Known(1) || k == 0 {
            invalid!("weight must have shape [{c}, 1, k] with k ≥ 1, not {wt}");
        }
        let activation = a.string_or("activation", "none").inv()?;
        let silu = match activation.as_str() {
            "none" => false,
            "silu" | "swish" => true,
            other => invalid!("activation must be \"none\", \"silu\" or \"swish\", not {other:?}"),
        };
        let bias = self.input(node, 2)?;
        let past = match self.input(node, 3)? {
            Some(p) => p,
            None => {
                let b = match xt.dims[0] {
                    Dim::Known(b) => b as usize,
                    Dim::Batch => unsupported!("{}", BATCH_NEEDED),
                };
                Val::konst(Tensor::from_f64(
                    xt.dtype,
                    vec![b, c, k - 1],
                    vec![0.0; b * c * (k - 1)],
                ))
            }
        };
        let padded = self.op(K::Concat, ConcatAttrs { axis: 2 }.to_attrs(), &[past, x])?;
        let mut operands = vec![padded.clone(), w];
        operands.extend(bias);
        let attrs = ConvAttrs {
            strides: Some(vec![1]),
            pads: Some(vec![0, 0]),
            dilations: Some(vec![1]),
            group: c as i64,
            kernel_shape: Some(vec![k as i64]),
        };
        let conv = self.op(K::Conv, attrs.to_attrs(), &operands)?;
        let y = if silu { self.swish(conv, 1.0)? } else { conv };
        let total = known(self.dims_of(&padded)?[2], "the state length")? as i64;
        let state = self.slice_axis(padded, 2, total - (k as i64 - 1), total, 1)?;
        Ok(vec![y, state])
    }

    pub(super) fn lower_batch_norm_training(
        &mut self,
        node: &NodeProto,
        a: &NodeAttrs,
    ) -> R<Vec<Val>> {
        let x = self.req(node, 0)?;
        let xt = self.ty(&x)?;
        if !xt.dtype.is_float() || xt.rank() < 2 {
            invalid!("X must be a float tensor of rank at least 2, not {xt}");
        }
        let rank = xt.rank();
        let epsilon = a.float_or("epsilon", 1e-5).inv()?;
        let momentum = a.float_or("momentum", 0.9).inv()?;
        let axes: Vec<i64> = (0..rank as i64).filter(|&i| i != 1).collect();
        let mean = self.op(
            K::ReduceMean,
            reduce(axes.clone(), true),
            std::slice::from_ref(&x),
        )?;
        let d = self.binop(K::Sub, x, mean.clone())?;
        let sq = self.binop(K::Mul, d.clone(), d.clone())?;
        let var = self.op(K::ReduceMean, reduce(axes, true), &[sq])?;
        let ve = self.with_scalar(K::Add, var.clone(), epsilon)?;
        let sd = self.un(K::Sqrt, ve)?;
        let normed = self.binop(K::Div, d, sd)?;
        // Per-channel vectors broadcast as [C, 1, ..].
        let mut cshape = vec![-1i64];
        cshape.extend(std::iter::repeat_n(1, rank - 2));
        let as_channels = ShapeAttrs { shape: cshape };
        let flat = ShapeAttrs { shape: vec![-1] };
        let mut per_channel = vec![];
        for i in 1..5 {
            let v = self.req(node, i)?;
            per_channel.push(self.cast_to(v, xt.dtype)?);
        }
        let [scale, bias, running_mean, running_var] = <[Val; 4]>::try_from(per_channel)
            .map_err(|_| Fail::Invalid("four per-channel inputs expected".into()))?;
        let scale = self.op(K::Reshape, as_channels.to_attrs(), &[scale])?;
        let bias = self.op(K::Reshape, as_channels.to_attrs(), &[bias])?;
        let ys = self.binop(K::Mul, normed, scale)?;
        let y = self.binop(K::Add, ys, bias)?;
        let mut outs = vec![y];
        for (running, batch) in [(running_mean, mean), (running_var, var)] {
            let batch = self.op(K::Reshape, flat.to_attrs(), &[batch])?;
            let kept = self.with_scalar(K::Mul, running, momentum)?;
            let new = self.with_scalar(K::Mul, batch, 1.0 - momentum)?;
            outs.push(self.binop(K::Add, kept, new)?);
        }
        Ok(outs)
    }
}
