//! ONNX `RNN`, `GRU` and `LSTM`, unrolled over the (static) sequence into `matmul`s,
//! elementwise ops and the gate activations, so gradients flow through the unrolled steps
//! like through any other ops.
//!
//! The input projection `X·Wᵀ (+ biases)` is one `matmul` over the whole sequence; each
//! step adds `H·Rᵀ` and applies the cell (gate order as in the spec: RNN `i`; GRU `z r h`;
//! LSTM `i o f c`, peepholes `i o f`). A missing initial state is zero, which the first
//! step uses by leaving its terms out (so the batch size may stay symbolic). With
//! `sequence_lens`, a step past an element's length keeps its state and writes zeros to
//! `Y` (`where` on `t < sequence_lens`); a reverse direction then starts at each
//! element's own last step, as the spec asks.

use ppir::ops::attrs::{
    ClipAttrs, EluAttrs, HardSigmoidAttrs, LeakyReluAttrs, SplitAttrs, SqueezeAttrs, TransposeAttrs,
};
use ppir::ops::OpAttrs;
use ppir::{Attrs, DType, Dim, OpKind, Tensor};

use super::super::attrs::NodeAttrs;
use super::super::import::{invalid, unsupported, Importer, Val, R};
use super::super::proto::NodeProto;
use super::attention::known;
use super::{OrInvalid, MAX_SEQUENCE};

use OpKind as K;

/// Which recurrent cell.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Cell {
    Rnn,
    Gru,
    Lstm,
}

impl Cell {
    /// Gates per step (rows of W per hidden unit).
    fn gates(self) -> usize {
        match self {
            Cell::Rnn => 1,
            Cell::Gru => 3,
            Cell::Lstm => 4,
        }
    }

    /// The activations per direction and their defaults.
    fn default_activations(self) -> &'static [&'static str] {
        match self {
            Cell::Rnn => &["Tanh"],
            Cell::Gru => &["Sigmoid", "Tanh"],
            Cell::Lstm => &["Sigmoid", "Tanh", "Tanh"],
        }
    }
}

/// A gate activation with its parameters.
#[derive(Clone, Debug)]
struct Activation {
    name: String,
    alpha: f64,
    beta: f64,
}

/// The activations of `activations`, each taking its `alpha`/`beta` in order from
/// `activation_alpha`/`activation_beta` when it has such parameters (as onnxruntime reads
/// them), else the defaults of the ONNX op of that name.
fn activations(a: &NodeAttrs, cell: Cell, directions: usize) -> R<Vec<Activation>> {
    let names: Vec<String> = match a.strings("activations").inv()? {
        Some(v) => v,
        None => (0..directions)
            .flat_map(|_| cell.default_activations().iter().map(|s| s.to_string()))
            .collect(),
    };
    let want = cell.default_activations().len() * directions;
    if names.len() != want {
        invalid!(
            "attribute `activations` lists {} functions; {want} expected ({} per direction)",
            names.len(),
            cell.default_activations().len()
        );
    }
    let alphas = a.floats("activation_alpha").inv()?.unwrap_or_default();
    let betas = a.floats("activation_beta").inv()?.unwrap_or_default();
    let (mut ai, mut bi) = (alphas.iter(), betas.iter());
    names
        .into_iter()
        .map(|name| {
            let (alpha, beta, uses_alpha, uses_beta) = match name.as_str() {
                "Relu" | "Tanh" | "Sigmoid" | "Softsign" | "Softplus" => (0.0, 0.0, false, false),
                "Affine" => (1.0, 0.0, true, true),
                "LeakyRelu" => (0.01, 0.0, true, false),
                "ThresholdedRelu" => (1.0, 0.0, true, false),
                "ScaledTanh" => (1.0, 1.0, true, true),
                "HardSigmoid" => (0.2, 0.5, true, true),
                "Elu" => (1.0, 0.0, true, false),
                other => unsupported!("activation function {other:?}"),
            };
            let alpha = if uses_alpha {
                ai.next().copied().unwrap_or(alpha)
            } else {
                alpha
            };
            let beta = if uses_beta {
                bi.next().copied().unwrap_or(beta)
            } else {
                beta
            };
            Ok(Activation { name, alpha, beta })
        })
        .collect()
}

/// The per-direction weights and state of one unrolled direction.
struct Direction {
    /// `X·Wᵀ + biases`, one `[batch, gates·hidden]` value per step.
    xw: Vec<Val>,
    /// `Rᵀ`: `[hidden, gates·hidden]`.
    rt: Val,
    /// GRU with `linear_before_reset`: the recurrence bias of the `h` gate, `[hidden]`.
    rbh: Option<Val>,
    /// LSTM peepholes `p_i`, `p_o`, `p_f`, each `[hidden]`.
    peep: Option<[Val; 3]>,
    acts: Vec<Activation>,
    reverse: bool,
}

impl Importer<'_> {
    fn activate(&mut self, x: Val, act: &Activation, clip: Option<f64>) -> R<Val> {
        let x = match clip {
            Some(c) => {
                let attrs = ClipAttrs { min: -c, max: c };
                self.op(K::Clip, attrs.to_attrs(), &[x])?
            }
            None => x,
        };
        let (alpha, beta) = (act.alpha, act.beta);
        match act.name.as_str() {
            "Relu" => self.un(K::Relu, x),
            "Tanh" => self.un(K::Tanh, x),
            "Sigmoid" => self.un(K::Sigmoid, x),
            "Softsign" => self.un(K::Softsign, x),
            "Softplus" => self.un(K::Softplus, x),
            "Affine" => {
                let ax = self.with_scalar(K::Mul, x, alpha)?;
                self.with_scalar(K::Add, ax, beta)
            }
            "LeakyRelu" => self.op(K::LeakyRelu, LeakyReluAttrs { alpha }.to_attrs(), &[x]),
            "ThresholdedRelu" => {
                let dt = self.ty(&x)?.dtype;
                let t = self.cst(dt, alpha);
                let above = self.binop(K::Greater, x.clone(), t)?;
                let zero = self.cst(dt, 0.0);
                self.op(K::Where, Attrs::new(), &[above, x, zero])
            }
            "ScaledTanh" => {
                let bx = self.with_scalar(K::Mul, x, beta)?;
                let t = self.un(K::Tanh, bx)?;
                self.with_scalar(K::Mul, t, alpha)
            }
            "HardSigmoid" => {
                let attrs = HardSigmoidAttrs { alpha, beta };
                self.op(K::HardSigmoid, attrs.to_attrs(), &[x])
            }
            "Elu" => self.op(K::Elu, EluAttrs { alpha }.to_attrs(), &[x]),
            other => unsupported!("activation function {other:?}"),
        }
    }

    /// Direction `d` of a `[directions, ..]` tensor, without that axis.
    fn direction_of(&mut self, x: &Val, d: usize) -> R<Val> {
        let s = self.slice_axis(x.clone(), 0, d as i64, d as i64 + 1, 1)?;
        let attrs = SqueezeAttrs { axes: vec![0] };
        self.op(K::Squeeze, attrs.to_attrs(), &[s])
    }

    /// `x` cut into `n` equal pieces along its last axis.
    fn split_last(&mut self, x: Val, n: usize, width: usize) -> R<Vec<Val>> {
        if n == 1 {
            return Ok(vec![x]);
        }
        let attrs = SplitAttrs {
            axis: -1,
            split: vec![width as i64; n],
        };
        self.op_n(K::Split, attrs.to_attrs(), &[x], n)
    }

    fn transpose(&mut self, x: Val, perm: Vec<i64>) -> R<Val> {
        let attrs = TransposeAttrs { perm: Some(perm) };
        self.op(K::Transpose, attrs.to_attrs(), &[x])
    }

    pub(super) fn lower_recurrent(&mut self, node: &NodeProto, a: &NodeAttrs) -> R<Vec<Val>> {
        let cell = match node.op_type.as_str() {
            "RNN" => Cell::Rnn,
            "GRU" => Cell::Gru,
            "LSTM" => Cell::Lstm,
            _ => return Err(self.unsupported_op(node)),
        };
        let g = cell.gates();
        let (x, w, r) = (self.req(node, 0)?, self.req(node, 1)?, self.req(node, 2)?);
        let bias = self.input(node, 3)?;
        let lens = self.input(node, 4)?;
        let init_h = self.input(node, 5)?;
        let (init_c, peep) = if cell == Cell::Lstm {
            (self.input(node, 6)?, self.input(node, 7)?)
        } else {
            (None, None)
        };
        let layout = a.int_or("layout", 0).inv()?;
        if layout != 0 && layout != 1 {
            invalid!("layout must be 0 or 1, not {layout}");
        }
        let direction = a.string_or("direction", "forward").inv()?;
        let dirs: &[bool] = match direction.as_str() {
            "forward" => &[false],
            "reverse" => &[true],
            "bidirectional" => &[false, true],
            d => invalid!("direction must be forward, reverse or bidirectional, not {d:?}"),
        };
        let nd = dirs.len();
        let clip = a.float("clip").inv()?;
        if clip.is_some_and(|c| c.is_nan() || c < 0.0) {
            invalid!("clip must be a non-negative threshold");
        }
        let lbr = cell == Cell::Gru && a.int_or("linear_before_reset", 0).inv()? != 0;
        let input_forget = cell == Cell::Lstm && a.int_or("input_forget", 0).inv()? != 0;
        let acts = activations(a, cell, nd)?;
        let per_dir = cell.default_activations().len();

        let xt = self.ty(&x)?;
        if xt.rank() != 3 || !xt.dtype.is_float() {
            invalid!("X must be a float tensor of rank 3, not {xt}");
        }
        let dtype = xt.dtype;
        // X as [seq, batch, input].
        let x = if layout == 1 {
            self.transpose(x, vec![1, 0, 2])?
        } else {
            x
        };
        let xd = self.dims_of(&x)?;
        let steps = known(xd[0], "the sequence length")?;
        if steps == 0 {
            unsupported!("an empty sequence");
        }
        if steps > MAX_SEQUENCE {
            unsupported!(
                "a sequence of {steps} steps is too long to unroll (at most {MAX_SEQUENCE})"
            );
        }
        let input_size = known(xd[2], "the input size")?;
        let rt_ty = self.ty(&r)?;
        let hidden = match a.int("hidden_size").inv()? {
            Some(h) if h > 0 => h as usize,
            Some(h) => invalid!("hidden_size must be positive, not {h}"),
            None => match rt_ty.dims.get(2) {
                Some(&d) => known(d, "R's last dimension")?,
                None => invalid!("R must have rank 3, it is {rt_ty}"),
            },
        };
        let expect = |name: &str, v: &Val, dims: Vec<usize>, this: &Self| -> R<()> {
            let t = this.ty(v)?;
            let want: Vec<Dim> = dims.iter().map(|&d| Dim::Known(d as u64)).collect();
            if t.dims != want || t.dtype != dtype {
                invalid!("{name} must be {dtype} of shape {dims:?}, it is {t}");
            }
            Ok(())
        };
        expect("W", &w, vec![nd, g * hidden, input_size], self)?;
        expect("R", &r, vec![nd, g * hidden, hidden], self)?;
        if let Some(b) = &bias {
            expect("B", b, vec![nd, 2 * g * hidden], self)?;
        }
        if let Some(p) = &peep {
            expect("P", p, vec![nd, 3 * hidden], self)?;
        }
        let batch_dim = xd[1];
        // Initial states as [directions, batch, hidden].
        let state_in = |this: &mut Self, v: Option<Val>, name: &str| -> R<Option<Val>> {
            let Some(v) = v else { return Ok(None) };
            let v = if layout == 1 {
                this.transpose(v, vec![1, 0, 2])?
            } else {
                v
            };
            let t = this.ty(&v)?;
            let want = vec![Dim::Known(nd as u64), batch_dim, Dim::Known(hidden as u64)];
            if t.dims != want || t.dtype != dtype {
                invalid!(
                    "{name} must be {dtype} [{nd}, batch, {hidden}] (layout {layout}), it is {t}"
                );
            }
            Ok(Some(v))
        };
        let init_h = state_in(self, init_h, "initial_h")?;
        let init_c = state_in(self, init_c, "initial_c")?;

        // `t < sequence_lens` per step as [batch, 1], unless every length is the full one.
        let masks = match lens {
            None => None,
            Some(l) => {
                let lt = self.ty(&l)?;
                if lt.rank() != 1 || lt.dtype.is_float() {
                    invalid!("sequence_lens must be an integer vector, it is {lt}");
                }
                let full = self
                    .static_tensor(&l)?
                    .is_some_and(|t| t.to_i64_vec().iter().all(|&n| n == steps as i64));
                if full {
                    None
                } else {
                    let col = self.unsqueeze_last(l)?;
                    let mut m = Vec::with_capacity(steps);
                    for t in 0..steps {
                        let c = Val::konst(Tensor::from_i64(lt.dtype, vec![], vec![t as i64]));
                        m.push(self.binop(K::Less, c, col.clone())?);
                    }
                    Some(m)
                }
            }
        };

        let mut ys: Vec<Vec<Val>> = Vec::with_capacity(nd);
        let mut hs = Vec::with_capacity(nd);
        let mut cs = Vec::with_capacity(nd);
        for (d, &reverse) in dirs.iter().enumerate() {
            let wd = self.direction_of(&w, d)?;
            let wt = self.transpose(wd, vec![1, 0])?;
            let mut proj = self.binop(K::MatMul, x.clone(), wt)?; // [seq, batch, g·hidden]
            let mut rbh = None;
            if let Some(b) = &bias {
                let bd = self.direction_of(b, d)?;
                let wb = self.slice_axis(bd.clone(), 0, 0, (g * hidden) as i64, 1)?;
                let rb = self.slice_axis(bd, 0, (g * hidden) as i64, (2 * g * hidden) as i64, 1)?;
                let rb = if lbr {
                    // The h gate's recurrence bias goes inside the reset product.
                    rbh = Some(self.slice_axis(
                        rb.clone(),
                        0,
                        (2 * hidden) as i64,
                        (3 * hidden) as i64,
                        1,
                    )?);
                    let mut keep = vec![1.0; 2 * hidden];
                    keep.extend(vec![0.0; hidden]);
                    let keep = Val::konst(Tensor::from_f64(dtype, vec![3 * hidden], keep));
                    self.binop(K::Mul, rb, keep)?
                } else {
                    rb
                };
                let sum = self.binop(K::Add, wb, rb)?;
                proj = self.binop(K::Add, proj, sum)?;
            }
            let rd = self.direction_of(&r, d)?;
            let rt = self.transpose(rd, vec![1, 0])?;
            let peep = match &peep {
                Some(p) => {
                    let pd = self.direction_of(p, d)?;
                    let v = self.split_last(pd, 3, hidden)?;
                    let Ok(three) = <[Val; 3]>::try_from(v) else {
                        invalid!("P does not split into three peephole vectors")
                    };
                    Some(three)
                }
                None => None,
            };
            let xw = self.unstack(proj, 0)?;
            let dir = Direction {
                xw,
                rt,
                rbh,
                peep,
                acts: acts[d * per_dir..(d + 1) * per_dir].to_vec(),
                reverse,
            };
            let h0 = match &init_h {
                Some(h) => Some(self.direction_of(h, d)?),
                None => None,
            };
            let c0 = match &init_c {
                Some(c) => Some(self.direction_of(c, d)?),
                None => None,
            };
            let (y, h, c) = self.run_direction(
                cell,
                &dir,
                h0,
                c0,
                masks.as_deref(),
                hidden,
                clip,
                lbr,
                input_forget,
                dtype,
            )?;
            ys.push(y);
            hs.push(h);
            cs.push(c);
        }

        let want = |k: usize| node.output.get(k).is_some_and(|o| !o.is_empty());
        let mut outs = Vec::with_capacity(3);
        // Y: [seq, directions, batch, hidden].
        if want(0) {
            let mut per_dir = Vec::with_capacity(nd);
            for y in ys {
                let s = self.stack(y, 0)?; // [seq, batch, hidden]
                per_dir.push(s);
            }
            let y = self.stack(per_dir, 1)?;
            outs.push(if layout == 1 {
                self.transpose(y, vec![2, 0, 1, 3])?
            } else {
                y
            });
        } else {
            outs.push(Val::Opaque("the Y output is not requested".into()));
        }
        let finals = |this: &mut Self, v: Vec<Val>| -> R<Val> {
            let s = this.stack(v, 0)?; // [directions, batch, hidden]
            if layout == 1 {
                this.transpose(s, vec![1, 0, 2])
            } else {
                Ok(s)
            }
        };
        outs.push(finals(self, hs)?);
        if cell == Cell::Lstm {
            let cs: Vec<Val> = cs.into_iter().flatten().collect();
            outs.push(finals(self, cs)?);
        }
        Ok(outs)
    }

    /// `x` with a trailing axis of size 1.
    fn unsqueeze_last(&mut self, x: Val) -> R<Val> {
        let r = self.rank_of(&x)? as i64;
        self.unsqueeze_at(x, r)
    }

    /// One direction's steps: returns `Y`'s per-step values in time order, the final
    /// hidden state and (LSTM) the final cell state.
    #[allow(clippy::too_many_arguments)]
    fn run_direction(
        &mut self,
        cell: Cell,
        dir: &Direction,
        mut h: Option<Val>,
        mut c: Option<Val>,
        masks: Option<&[Val]>,
        hidden: usize,
        clip: Option<f64>,
        lbr: bool,
        input_forget: bool,
        dtype: DType,
    ) -> R<(Vec<Val>, Val, Option<Val>)> {
        let steps = dir.xw.len();
        let g = cell.gates();
        let zero = self.cst(dtype, 0.0);
        let mut ys: Vec<Option<Val>> = vec![None; steps];
        for k in 0..steps {
            let t = if dir.reverse { steps - 1 - k } else { k };
            let xw = dir.xw[t].clone();
            let (h_new, c_new) = match cell {
                Cell::Rnn => {
                    let pre = match &h {
                        Some(hv) => {
                            let hr = self.binop(K::MatMul, hv.clone(), dir.rt.clone())?;
                            self.binop(K::Add, xw, hr)?
                        }
                        None => xw,
                    };
                    (self.activate(pre, &dir.acts[0], clip)?, None)
                }
                Cell::Gru => {
                    let xs = self.split_last(xw, g, hidden)?;
                    let (xz, xr, xh) = (xs[0].clone(), xs[1].clone(), xs[2].clone());
                    let (z, hh) = match &h {
                        Some(hv) => {
                            let rts = self.split_last(dir.rt.clone(), g, hidden)?;
                            let hz = self.binop(K::MatMul, hv.clone(), rts[0].clone())?;
                            let hr = self.binop(K::MatMul, hv.clone(), rts[1].clone())?;
                            let zp = self.binop(K::Add, xz, hz)?;
                            let rp = self.binop(K::Add, xr, hr)?;
                            let z = self.activate(zp, &dir.acts[0], clip)?;
                            let rg = self.activate(rp, &dir.acts[0], clip)?;
                            let inner = if lbr {
                                let hh = self.binop(K::MatMul, hv.clone(), rts[2].clone())?;
                                let hh = match &dir.rbh {
                                    Some(b) => self.binop(K::Add, hh, b.clone())?,
                                    None => hh,
                                };
                                self.binop(K::Mul, rg.clone(), hh)?
                            } else {
                                let rh = self.binop(K::Mul, rg.clone(), hv.clone())?;
                                self.binop(K::MatMul, rh, rts[2].clone())?
                            };
                            let hp = self.binop(K::Add, xh, inner)?;
                            (z, self.activate(hp, &dir.acts[1], clip)?)
                        }
                        None => {
                            let z = self.activate(xz, &dir.acts[0], clip)?;
                            let rg = self.activate(xr, &dir.acts[0], clip)?;
                            let hp = match (&dir.rbh, lbr) {
                                (Some(b), true) => {
                                    let rb = self.binop(K::Mul, rg.clone(), b.clone())?;
                                    self.binop(K::Add, xh, rb)?
                                }
                                _ => xh,
                            };
                            (z, self.activate(hp, &dir.acts[1], clip)?)
                        }
                    };
                    // H = (1 - z)·h + z·H_prev
                    let one = self.cst(dtype, 1.0);
                    let keep = self.binop(K::Sub, one, z.clone())?;
                    let mut hn = self.binop(K::Mul, keep, hh)?;
                    if let Some(hv) = &h {
                        let zh = self.binop(K::Mul, z, hv.clone())?;
                        hn = self.binop(K::Add, hn, zh)?;
                    }
                    (hn, None)
                }
                Cell::Lstm => {
                    let pre = match &h {
                        Some(hv) => {
                            let hr = self.binop(K::MatMul, hv.clone(), dir.rt.clone())?;
                            self.binop(K::Add, xw, hr)?
                        }
                        None => xw,
                    };
                    let gs = self.split_last(pre, g, hidden)?;
                    let (mut ip, op, mut fp, cp) =
                        (gs[0].clone(), gs[1].clone(), gs[2].clone(), gs[3].clone());
                    if let (Some([pi, _, pf]), Some(cv)) = (&dir.peep, &c) {
                        let a = self.binop(K::Mul, pi.clone(), cv.clone())?;
                        ip = self.binop(K::Add, ip, a)?;
                        let b = self.binop(K::Mul, pf.clone(), cv.clone())?;
                        fp = self.binop(K::Add, fp, b)?;
                    }
                    let f = self.activate(fp, &dir.acts[0], clip)?;
                    let i = if input_forget {
                        let one = self.cst(dtype, 1.0);
                        self.binop(K::Sub, one, f.clone())?
                    } else {
                        self.activate(ip, &dir.acts[0], clip)?
                    };
                    let cc = self.activate(cp, &dir.acts[1], clip)?;
                    let mut cn = self.binop(K::Mul, i, cc)?;
                    if let Some(cv) = &c {
                        let fc = self.binop(K::Mul, f, cv.clone())?;
                        cn = self.binop(K::Add, fc, cn)?;
                    }
                    let op = match &dir.peep {
                        Some([_, po, _]) => {
                            let a = self.binop(K::Mul, po.clone(), cn.clone())?;
                            self.binop(K::Add, op, a)?
                        }
                        None => op,
                    };
                    let o = self.activate(op, &dir.acts[0], clip)?;
                    let hc = self.activate(cn.clone(), &dir.acts[2], clip)?;
                    (self.binop(K::Mul, o, hc)?, Some(cn))
                }
            };
            // Past an element's length: keep the state, write zeros.
            let (h_next, c_next, y) = match masks {
                Some(m) => {
                    let keep = |this: &mut Self, new: Val, old: &Option<Val>| -> R<Val> {
                        let old = old.clone().unwrap_or_else(|| zero.clone());
                        this.op(K::Where, Attrs::new(), &[m[t].clone(), new, old])
                    };
                    let y = self.op(
                        K::Where,
                        Attrs::new(),
                        &[m[t].clone(), h_new.clone(), zero.clone()],
                    )?;
                    let hn = keep(self, h_new, &h)?;
                    let cn = match c_new {
                        Some(cn) => Some(keep(self, cn, &c)?),
                        None => None,
                    };
                    (hn, cn, y)
                }
                None => (h_new.clone(), c_new, h_new),
            };
            ys[t] = Some(y);
            h = Some(h_next);
            if c_next.is_some() {
                c = c_next;
            }
        }
        let ys = ys.into_iter().flatten().collect::<Vec<_>>();
        let Some(h) = h else { invalid!("no steps") };
        Ok((ys, h, c))
    }
}
