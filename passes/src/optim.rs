//! `optimizer`: the optimizer step and gradient accumulation, as ordinary IR functions.
//!
//! [`build_optimizer_function`] adds two functions to a training module:
//!
//! - `@accumulate(%acc.<p>.., %grad.<p>..) -> (%new.acc.<p>..)`: one `add` per parameter
//!   (phase `bwd_weight`). The runtime sums the micro-batch gradients with it (the first
//!   micro-batch's gradients are taken as they are), so accumulation is IR, not host code.
//! - `@optim(%<p>.. {param}, %grad.<p>.., %<state>.. {state}) -> (%new.<p>.., %new.<state>..)`:
//!   the update (phase `optim`) from the *summed* gradients: they are scaled by `1/M` first
//!   (M micro-batches), once, by a constant multiply.
//!
//! Optimizers (PyTorch semantics; `g` is the scaled gradient, `w` the parameter):
//!
//! - SGD: `v = μ·v + (g + wd·w)`, `w = w − lr·v`; state `momentum.<p>` (zero at the start;
//!   absent when μ = 0, where `v` is just `g + wd·w`).
//! - AdamW: `t = t + 1`, `w = w·(1 − lr·wd)`, `m = β1·m + (1−β1)·g`,
//!   `v = β2·v + (1−β2)·g²`, `w = w − lr·(m/(1−β1^t)) / (sqrt(v/(1−β2^t)) + eps)`;
//!   states `adam.m.<p>`, `adam.v.<p>` and the step count `adam.step` (a scalar f32,
//!   exact up to 2^24 steps; f64 when a parameter is f64), all zero at the start.
//!
//! States get zero initial values in [`Module::weights`]; every op is an elementwise op
//! (`mul add sub div sqrt pow`) or a scalar `constant` in the parameter's dtype, so the
//! partitioner, codegen and the interpreter need nothing optimizer-specific.
//!
//! As a pass (`--pass optimizer{kind=adamw,lr=1e-3}`) the parameters are the `param`
//! arguments of `@main` (option `function` names another function).

use std::collections::HashMap;

use ppir::ops::attrs::{CastAttrs, ConstantAttrs};
use ppir::ops::OpAttrs;
use ppir::{ArgKind, DType, Function, Module, NewOp, OpKind, Phase, Tensor, TensorType, ValueId};

use crate::registry::PassOptions;
use crate::{Pass, PassError};

const PASS: &str = "optimizer";

/// Which update rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimizerKind {
    /// Stochastic gradient descent with momentum and (coupled) weight decay.
    Sgd,
    /// Adam with decoupled weight decay and bias correction.
    AdamW,
}

impl OptimizerKind {
    pub fn name(self) -> &'static str {
        match self {
            OptimizerKind::Sgd => "sgd",
            OptimizerKind::AdamW => "adamw",
        }
    }

    pub fn from_name(s: &str) -> Option<OptimizerKind> {
        match s {
            "sgd" => Some(OptimizerKind::Sgd),
            "adamw" => Some(OptimizerKind::AdamW),
            _ => None,
        }
    }
}

/// Hyper-parameters of the optimizer step.
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerOptions {
    pub kind: OptimizerKind,
    pub lr: f64,
    /// SGD momentum μ (ignored by AdamW).
    pub momentum: f64,
    /// SGD: L2 penalty added to the gradient; AdamW: decoupled decay of the weights.
    pub weight_decay: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Micro-batches per step M: the summed gradients are scaled by 1/M.
    pub microbatches: u32,
}

impl Default for OptimizerOptions {
    fn default() -> Self {
        OptimizerOptions {
            kind: OptimizerKind::Sgd,
            lr: 0.01,
            momentum: 0.0,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            microbatches: 1,
        }
    }
}

impl OptimizerOptions {
    /// AdamW with the usual defaults (β1 0.9, β2 0.999, eps 1e-8, weight decay 0.01).
    pub fn adamw(lr: f64) -> Self {
        OptimizerOptions {
            kind: OptimizerKind::AdamW,
            lr,
            weight_decay: 0.01,
            ..Default::default()
        }
    }

    /// SGD with momentum μ.
    pub fn sgd(lr: f64, momentum: f64) -> Self {
        OptimizerOptions {
            kind: OptimizerKind::Sgd,
            lr,
            momentum,
            ..Default::default()
        }
    }

    /// Refuse hyper-parameters that are not finite or out of range, naming them.
    pub fn check(&self) -> Result<(), PassError> {
        let bad = |what: &str, v: f64| {
            Err(PassError::Usage(format!(
                "pass `{PASS}`: {what} must be a finite number ≥ 0, got {v}"
            )))
        };
        for (what, v) in [
            ("lr", self.lr),
            ("momentum", self.momentum),
            ("weight_decay", self.weight_decay),
            ("eps", self.eps),
        ] {
            if !v.is_finite() || v < 0.0 {
                return bad(what, v);
            }
        }
        for (what, v) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&v) {
                return Err(PassError::Usage(format!(
                    "pass `{PASS}`: {what} must be in [0, 1), got {v}"
                )));
            }
        }
        if self.microbatches == 0 {
            return Err(PassError::Usage(format!(
                "pass `{PASS}`: microbatches must be at least 1"
            )));
        }
        Ok(())
    }

    /// Read `kind, lr, momentum, weight_decay, beta1, beta2, eps, microbatches` from pass
    /// options; unknown keys (other than those in `extra`) are an error.
    pub fn from_pass_options(o: &PassOptions, extra: &[&str]) -> Result<Self, PassError> {
        let mut known = vec![
            "kind",
            "lr",
            "momentum",
            "weight_decay",
            "beta1",
            "beta2",
            "eps",
            "microbatches",
        ];
        known.extend_from_slice(extra);
        o.expect_only(PASS, &known)?;
        let mut opts = match o.get("kind").unwrap_or("sgd") {
            "sgd" => OptimizerOptions::default(),
            "adamw" => OptimizerOptions::adamw(1e-3),
            other => {
                return Err(PassError::Usage(format!(
                    "pass `{PASS}`: kind must be sgd or adamw, got `{other}`"
                )))
            }
        };
        let float = |key: &str| -> Result<Option<f64>, PassError> {
            o.get(key)
                .map(|v| {
                    v.parse::<f64>().map_err(|_| {
                        PassError::Usage(format!(
                            "pass `{PASS}`: option `{key}` must be a number, got `{v}`"
                        ))
                    })
                })
                .transpose()
        };
        for (key, slot) in [
            ("lr", &mut opts.lr),
            ("momentum", &mut opts.momentum),
            ("weight_decay", &mut opts.weight_decay),
            ("beta1", &mut opts.beta1),
            ("beta2", &mut opts.beta2),
            ("eps", &mut opts.eps),
        ] {
            if let Some(v) = float(key)? {
                *slot = v;
            }
        }
        if let Some(m) = o.u64(PASS, "microbatches")? {
            opts.microbatches = u32::try_from(m).map_err(|_| {
                PassError::Usage(format!("pass `{PASS}`: microbatches is too large: {m}"))
            })?;
        }
        opts.check()?;
        Ok(opts)
    }
}

/// What [`build_optimizer_function`] added.
#[derive(Clone, Debug, PartialEq)]
pub struct OptimizerInfo {
    /// The update function (`"optim"`).
    pub function: String,
    /// The accumulation function (`"accumulate"`).
    pub accumulate: String,
    /// Parameter names, in argument order.
    pub params: Vec<String>,
    /// Optimizer state names (module weights), in argument order.
    pub states: Vec<String>,
}

/// Add `@optim` and `@accumulate` for `params` (name and type of each trainable weight)
/// to `m`, and zero initial values for the optimizer states to `m.weights`.
///
/// Fails if the module already has either function, a parameter type is not a static
/// float type, or a generated name would clash.
pub fn build_optimizer_function(
    m: &mut Module,
    params: &[(String, TensorType)],
    opts: &OptimizerOptions,
) -> Result<OptimizerInfo, PassError> {
    opts.check()?;
    for name in ["optim", "accumulate"] {
        if m.function(name).is_some() {
            return Err(PassError::failed(
                PASS,
                format!("the module already has a function @{name}"),
            ));
        }
    }
    for (p, ty) in params {
        if !ty.dtype.is_float() || !ty.is_static() {
            return Err(PassError::failed(
                PASS,
                format!("parameter %{p} must have a static float type, got {ty}"),
            ));
        }
    }

    let accumulate = build_accumulate(params)?;
    let (optim, states) = match opts.kind {
        OptimizerKind::Sgd => build_sgd(params, opts)?,
        OptimizerKind::AdamW => build_adamw(params, opts)?,
    };
    for (name, ty) in &states {
        if m.weights.contains_key(name) {
            return Err(PassError::failed(
                PASS,
                format!("optimizer state `{name}` clashes with an existing weight"),
            ));
        }
        let shape = ty
            .static_shape()
            .ok_or_else(|| {
                PassError::failed(
                    PASS,
                    format!("optimizer state `{name}` has type {ty}, which is not static"),
                )
            })?
            .into_iter()
            .map(|d| d as usize)
            .collect();
        m.weights
            .insert(name.clone(), Tensor::zeros(ty.dtype, shape));
    }
    m.functions.push(accumulate);
    m.functions.push(optim);
    Ok(OptimizerInfo {
        function: "optim".into(),
        accumulate: "accumulate".into(),
        params: params.iter().map(|(p, _)| p.clone()).collect(),
        states: states.into_iter().map(|(s, _)| s).collect(),
    })
}

/// Builds one function with a constant cache and a fixed phase.
struct Builder {
    f: Function,
    phase: Phase,
    consts: HashMap<(DType, u64), ValueId>,
    names: std::collections::HashSet<String>,
}

impl Builder {
    fn new(name: &str, phase: Phase) -> Self {
        Builder {
            f: Function::new(name),
            phase,
            consts: HashMap::new(),
            names: Default::default(),
        }
    }

    fn claim(&mut self, name: &str) -> Result<(), PassError> {
        if !self.names.insert(name.to_string()) {
            return Err(PassError::failed(
                PASS,
                format!(
                    "@{}: the name %{name} would be used twice (a parameter is named like a generated value)",
                    self.f.name
                ),
            ));
        }
        Ok(())
    }

    fn arg(&mut self, name: &str, ty: &TensorType, kind: ArgKind) -> Result<ValueId, PassError> {
        self.claim(name)?;
        Ok(self.f.add_arg(name, ty.clone(), kind))
    }

    /// A scalar constant of `dtype` (shared by every use).
    fn scalar(&mut self, dtype: DType, x: f64) -> ValueId {
        let key = (dtype, x.to_bits());
        if let Some(&v) = self.consts.get(&key) {
            return v;
        }
        let ty = TensorType::scalar(dtype);
        let value = Tensor::scalar_f64(dtype, x);
        let v = self.f.push(
            NewOp::new(OpKind::Constant, vec![], vec![ty])
                .attrs(ConstantAttrs { value }.to_attrs())
                .phase(self.phase),
        );
        self.consts.insert(key, v);
        v
    }

    /// An op with one result of `ty`, optionally named.
    fn op(
        &mut self,
        kind: OpKind,
        operands: Vec<ValueId>,
        ty: &TensorType,
        name: Option<&str>,
    ) -> Result<ValueId, PassError> {
        let mut new = NewOp::new(kind, operands, vec![ty.clone()]).phase(self.phase);
        if let Some(n) = name {
            self.claim(n)?;
            new = new.names(vec![n.to_string()]);
        }
        Ok(self.f.push(new))
    }

    fn binary(&mut self, kind: OpKind, a: ValueId, b: ValueId, ty: &TensorType) -> ValueId {
        self.f
            .push(NewOp::new(kind, vec![a, b], vec![ty.clone()]).phase(self.phase))
    }

    /// `x * c` for a scalar constant `c` (nothing when `c` is 1).
    fn scale(&mut self, x: ValueId, c: f64, ty: &TensorType) -> ValueId {
        if c == 1.0 {
            return x;
        }
        let k = self.scalar(ty.dtype, c);
        self.binary(OpKind::Mul, x, k, ty)
    }

    /// Rename an already-computed value to a result name (fresh op-free alias is not
    /// needed: the value itself takes the name).
    fn name_result(&mut self, v: ValueId, name: &str) -> Result<ValueId, PassError> {
        self.claim(name)?;
        self.f.rename_value(v, name);
        Ok(v)
    }
}

fn build_accumulate(params: &[(String, TensorType)]) -> Result<Function, PassError> {
    let mut b = Builder::new("accumulate", Phase::BwdWeight);
    let mut accs = vec![];
    for (p, ty) in params {
        accs.push(b.arg(&format!("acc.{p}"), ty, ArgKind::Input)?);
    }
    let mut grads = vec![];
    for (p, ty) in params {
        grads.push(b.arg(&format!("grad.{p}"), ty, ArgKind::Input)?);
    }
    let mut results = vec![];
    for (i, (p, ty)) in params.iter().enumerate() {
        let sum = b.op(
            OpKind::Add,
            vec![accs[i], grads[i]],
            ty,
            Some(&format!("new.acc.{p}")),
        )?;
        results.push(sum);
    }
    b.f.set_results(results);
    Ok(b.f)
}

/// Arguments shared by both optimizers: params then gradients. Returns their values.
fn param_and_grad_args(
    b: &mut Builder,
    params: &[(String, TensorType)],
) -> Result<(Vec<ValueId>, Vec<ValueId>), PassError> {
    let mut ws = vec![];
    for (p, ty) in params {
        ws.push(b.arg(p, ty, ArgKind::Param)?);
    }
    let mut gs = vec![];
    for (p, ty) in params {
        gs.push(b.arg(&format!("grad.{p}"), ty, ArgKind::Input)?);
    }
    Ok((ws, gs))
}

type States = Vec<(String, TensorType)>;

fn build_sgd(
    params: &[(String, TensorType)],
    o: &OptimizerOptions,
) -> Result<(Function, States), PassError> {
    let mut b = Builder::new("optim", Phase::Optim);
    let (ws, gs) = param_and_grad_args(&mut b, params)?;
    let mut states: States = vec![];
    let mut vs = vec![];
    if o.momentum != 0.0 {
        for (p, ty) in params {
            let name = format!("momentum.{p}");
            vs.push(b.arg(&name, ty, ArgKind::State)?);
            states.push((name, ty.clone()));
        }
    }
    let mut new_ws = vec![];
    let mut new_vs = vec![];
    for (i, (p, ty)) in params.iter().enumerate() {
        // g = grad / M (+ wd·w)
        let mut g = b.scale(gs[i], 1.0 / o.microbatches as f64, ty);
        if o.weight_decay != 0.0 {
            let decay = b.scale(ws[i], o.weight_decay, ty);
            g = b.binary(OpKind::Add, g, decay, ty);
        }
        // v = μ·v + g
        let step = if o.momentum != 0.0 {
            let mv = b.scale(vs[i], o.momentum, ty);
            let v = b.op(
                OpKind::Add,
                vec![mv, g],
                ty,
                Some(&format!("new.momentum.{p}")),
            )?;
            new_vs.push(v);
            v
        } else {
            g
        };
        let lr_step = b.scale(step, o.lr, ty);
        let w = b.op(
            OpKind::Sub,
            vec![ws[i], lr_step],
            ty,
            Some(&format!("new.{p}")),
        )?;
        new_ws.push(w);
    }
    new_ws.extend(new_vs);
    b.f.set_results(new_ws);
    Ok((b.f, states))
}

fn build_adamw(
    params: &[(String, TensorType)],
    o: &OptimizerOptions,
) -> Result<(Function, States), PassError> {
    let mut b = Builder::new("optim", Phase::Optim);
    let (ws, gs) = param_and_grad_args(&mut b, params)?;
    let mut states: States = vec![];
    let mut ms = vec![];
    let mut vs = vec![];
    for (p, ty) in params {
        let name = format!("adam.m.{p}");
        ms.push(b.arg(&name, ty, ArgKind::State)?);
        states.push((name, ty.clone()));
    }
    for (p, ty) in params {
        let name = format!("adam.v.{p}");
        vs.push(b.arg(&name, ty, ArgKind::State)?);
        states.push((name, ty.clone()));
    }
    // The step count and bias corrections are f32 scalars (f64 if any parameter is f64),
    // cast to each parameter dtype below.
    let step_dtype = if params.iter().any(|(_, ty)| ty.dtype == DType::F64) {
        DType::F64
    } else {
        DType::F32
    };
    let step_ty = TensorType::scalar(step_dtype);
    let t = b.arg("adam.step", &step_ty, ArgKind::State)?;
    states.push(("adam.step".into(), step_ty.clone()));

    // t = t + 1; bias corrections 1 − β^t.
    let one = b.scalar(step_dtype, 1.0);
    let t1 = b.op(OpKind::Add, vec![t, one], &step_ty, Some("new.adam.step"))?;
    let beta1 = b.scalar(step_dtype, o.beta1);
    let beta2 = b.scalar(step_dtype, o.beta2);
    let p1 = b.binary(OpKind::Pow, beta1, t1, &step_ty);
    let p2 = b.binary(OpKind::Pow, beta2, t1, &step_ty);
    let bc1 = b.binary(OpKind::Sub, one, p1, &step_ty);
    let bc2 = b.binary(OpKind::Sub, one, p2, &step_ty);
    // Casts of the corrections to each parameter dtype, made once per dtype.
    let mut corrections: HashMap<DType, (ValueId, ValueId)> = HashMap::new();

    let mut new_ws = vec![];
    let mut new_ms = vec![];
    let mut new_vs = vec![];
    for (i, (p, ty)) in params.iter().enumerate() {
        let dt = ty.dtype;
        let (c1, c2) = match corrections.get(&dt) {
            Some(&c) => c,
            None => {
                let c = if dt == step_dtype {
                    (bc1, bc2)
                } else {
                    let sty = TensorType::scalar(dt);
                    let cast = |b: &mut Builder, v| {
                        b.f.push(
                            NewOp::new(OpKind::Cast, vec![v], vec![sty.clone()])
                                .attrs(CastAttrs { to: dt }.to_attrs())
                                .phase(Phase::Optim),
                        )
                    };
                    (cast(&mut b, bc1), cast(&mut b, bc2))
                };
                corrections.insert(dt, c);
                c
            }
        };
        let g = b.scale(gs[i], 1.0 / o.microbatches as f64, ty);
        // Decoupled decay first, as torch.optim.AdamW does.
        let w = b.scale(ws[i], 1.0 - o.lr * o.weight_decay, ty);
        // m = β1·m + (1−β1)·g
        let m1 = b.scale(ms[i], o.beta1, ty);
        let m2 = b.scale(g, 1.0 - o.beta1, ty);
        let m = b.op(
            OpKind::Add,
            vec![m1, m2],
            ty,
            Some(&format!("new.adam.m.{p}")),
        )?;
        // v = β2·v + (1−β2)·g²
        let gg = b.binary(OpKind::Mul, g, g, ty);
        let v1 = b.scale(vs[i], o.beta2, ty);
        let v2 = b.scale(gg, 1.0 - o.beta2, ty);
        let v = b.op(
            OpKind::Add,
            vec![v1, v2],
            ty,
            Some(&format!("new.adam.v.{p}")),
        )?;
        // w = w − lr·m̂/(sqrt(v̂) + eps)
        let m_hat = b.binary(OpKind::Div, m, c1, ty);
        let v_hat = b.binary(OpKind::Div, v, c2, ty);
        let root = b.op(OpKind::Sqrt, vec![v_hat], ty, None)?;
        let eps = b.scalar(dt, o.eps);
        let denom = b.binary(OpKind::Add, root, eps, ty);
        let ratio = b.binary(OpKind::Div, m_hat, denom, ty);
        let upd = b.scale(ratio, o.lr, ty);
        let nw = b.binary(OpKind::Sub, w, upd, ty);
        let nw = b.name_result(nw, &format!("new.{p}"))?;
        new_ws.push(nw);
        new_ms.push(m);
        new_vs.push(v);
    }
    let mut results = new_ws;
    results.extend(new_ms);
    results.extend(new_vs);
    results.push(t1);
    b.f.set_results(results);
    Ok((b.f, states))
}

/// `optimizer{kind=sgd|adamw,lr=..,momentum=..,weight_decay=..,beta1=..,beta2=..,eps=..,
/// microbatches=M,function=main}` as a pass.
#[derive(Clone, Debug)]
pub struct OptimizerPass {
    pub options: OptimizerOptions,
    /// The function whose `param` arguments are the trained parameters.
    pub function: String,
}

impl OptimizerPass {
    pub fn from_options(o: &PassOptions) -> Result<Self, PassError> {
        let options = OptimizerOptions::from_pass_options(o, &["function"])?;
        Ok(OptimizerPass {
            options,
            function: o.get("function").unwrap_or("main").to_string(),
        })
    }
}

impl Pass for OptimizerPass {
    fn name(&self) -> &'static str {
        PASS
    }

    fn run(&self, module: &mut Module) -> Result<(), PassError> {
        let f = module.function(&self.function).ok_or_else(|| {
            PassError::failed(
                PASS,
                format!("the module has no function @{}", self.function),
            )
        })?;
        let params = trainable_params(f);
        build_optimizer_function(module, &params, &self.options)?;
        Ok(())
    }
}

/// The `param` arguments of `f`, by name and type, in argument order.
pub fn trainable_params(f: &Function) -> Vec<(String, TensorType)> {
    f.args()
        .iter()
        .filter(|(_, k)| *k == ArgKind::Param)
        .map(|&(v, _)| (f.value(v).name.clone(), f.ty(v).clone()))
        .collect()
}

#[cfg(test)]
mod tests;
