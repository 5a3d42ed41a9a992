//! The single-device training loop.
//!
//! One [`Trainer::step`] on a global batch of B rows with M micro-batches:
//!
//! 1. for each micro-batch m: run `@grad` on rows `[m·B/M, (m+1)·B/M)` of every input
//!    (and `labels`), with `rng = [step, m]` when `@grad` takes it; replace each weight
//!    `s` that `@grad` returns as `new.<s>` (batch-norm running statistics); add the
//!    gradients to the running sums with `@accumulate` (the first micro-batch's are taken
//!    as they are);
//! 2. run `@optim` with the summed gradients (it scales them by 1/M itself) and replace
//!    every weight it returns as `new.<w>`.
//!
//! The step's loss is the mean of the micro-batch losses. Every argument and result is
//! resolved by name when the trainer is built, so a module that does not follow the
//! conventions fails then, with the function and name, not in the middle of a run.

use std::collections::{BTreeMap, HashMap};

use ppir::interp::{run_function, InterpOptions};
use ppir::{ArgKind, DType, Function, Module, Tensor};

use crate::data::slice_rows;
use crate::{Batch, RuntimeError};

/// Runs one function of a module. The interpreter is the only one today; compiled stage
/// modules plug in here later.
pub trait Executor {
    fn call(
        &mut self,
        module: &Module,
        function: &Function,
        args: Vec<Tensor>,
    ) -> Result<Vec<Tensor>, Box<dyn std::error::Error + Send + Sync>>;
}

/// The reference interpreter as an [`Executor`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Interpreter {
    pub options: InterpOptions,
}

impl Executor for Interpreter {
    fn call(
        &mut self,
        _module: &Module,
        function: &Function,
        args: Vec<Tensor>,
    ) -> Result<Vec<Tensor>, Box<dyn std::error::Error + Send + Sync>> {
        Ok(run_function(function, args, &self.options, None)?)
    }
}

/// Names of the training functions and the number of micro-batches per step.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainerOptions {
    pub grad: String,
    pub accumulate: String,
    pub optim: String,
    /// Micro-batches per step (the global batch must split evenly).
    pub microbatches: usize,
}

impl Default for TrainerOptions {
    fn default() -> Self {
        TrainerOptions {
            grad: "grad".into(),
            accumulate: "accumulate".into(),
            optim: "optim".into(),
            microbatches: 1,
        }
    }
}

/// One function call made during a step, in order (for tests and traces).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub function: String,
    /// The micro-batch, for per-micro-batch calls.
    pub micro: Option<usize>,
}

/// What one step did.
#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    pub step: u64,
    /// Mean of the micro-batch losses.
    pub loss: f64,
    pub micro_losses: Vec<f64>,
    pub calls: Vec<Call>,
}

/// Where an argument's value comes from.
#[derive(Clone, Debug)]
enum Source {
    /// Rows of a batch array.
    Data(String),
    /// `[step, micro]`.
    Rng,
    /// A module weight.
    Weight(String),
    /// The running gradient sum of a parameter.
    Acc(String),
    /// This micro-batch's gradient of a parameter.
    Grad(String),
}

/// Where a result goes.
#[derive(Clone, Debug)]
enum Sink {
    Loss,
    Grad(String),
    Acc(String),
    Weight(String),
    Ignore,
}

#[derive(Clone, Debug)]
struct Binding {
    function: usize,
    args: Vec<Source>,
    results: Vec<Sink>,
}

/// Trains a module on one device.
pub struct Trainer {
    module: Module,
    options: TrainerOptions,
    executor: Box<dyn Executor>,
    grad: Binding,
    accumulate: Option<Binding>,
    optim: Binding,
    /// Rows of one micro-batch (axis 0 of `@grad`'s data inputs).
    micro_rows: usize,
    /// Names of the data inputs `@grad` reads.
    data_inputs: Vec<String>,
    step: u64,
}

fn sig(function: &str, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Signature {
        function: function.to_string(),
        message: message.into(),
    }
}

impl Trainer {
    /// A trainer on the reference interpreter.
    pub fn new(module: Module, options: TrainerOptions) -> Result<Self, RuntimeError> {
        Trainer::with_executor(module, options, Box::<Interpreter>::default())
    }

    pub fn with_executor(
        module: Module,
        options: TrainerOptions,
        executor: Box<dyn Executor>,
    ) -> Result<Self, RuntimeError> {
        if options.microbatches == 0 {
            return Err(RuntimeError::Data(
                "the number of micro-batches must be at least 1".into(),
            ));
        }
        let index = |name: &str| {
            module
                .functions
                .iter()
                .position(|f| f.name == name)
                .ok_or_else(|| RuntimeError::MissingFunction(name.to_string()))
        };
        // @grad
        let gi = index(&options.grad)?;
        let gf = &module.functions[gi];
        let mut args = vec![];
        let mut data_inputs = vec![];
        let mut micro_rows: Option<(usize, String)> = None;
        for &(v, kind) in gf.args() {
            let name = gf.value(v).name.clone();
            let ty = gf.ty(v);
            args.push(match kind {
                ArgKind::Input if name == "rng" => {
                    if ty.dtype != DType::I64 || ty.static_shape() != Some(vec![2]) {
                        return Err(sig(
                            &gf.name,
                            format!("argument %rng must be tensor<2xi64> ([step, micro-batch]), got {ty}"),
                        ));
                    }
                    Source::Rng
                }
                ArgKind::Input => {
                    let rows = ty.dims.first().and_then(|d| d.known()).ok_or_else(|| {
                        sig(
                            &gf.name,
                            format!("input %{name} needs a static batch axis 0, got {ty} (bind the batch size first)"),
                        )
                    })? as usize;
                    match &micro_rows {
                        Some((r, first)) if *r != rows => {
                            return Err(sig(
                                &gf.name,
                                format!("inputs disagree on the micro-batch size: %{first} has {r} rows, %{name} has {rows}"),
                            ))
                        }
                        Some(_) => {}
                        None => micro_rows = Some((rows, name.clone())),
                    }
                    data_inputs.push(name.clone());
                    Source::Data(name)
                }
                ArgKind::Param | ArgKind::State => weight_source(&module, gf, &name)?,
            });
        }
        let mut results = vec![];
        let mut grads = vec![];
        let mut has_loss = false;
        for &r in gf.results() {
            let name = &gf.value(r).name;
            results.push(if name == "loss" {
                if gf.ty(r).num_elements() != Some(1) || !gf.ty(r).dtype.is_float() {
                    return Err(sig(
                        &gf.name,
                        format!("result %loss must be a float scalar, got {}", gf.ty(r)),
                    ));
                }
                has_loss = true;
                Sink::Loss
            } else if let Some(p) = name.strip_prefix("grad.") {
                grads.push(p.to_string());
                Sink::Grad(p.to_string())
            } else if let Some(w) = name.strip_prefix("new.") {
                weight_sink(&module, gf, w)?
            } else {
                Sink::Ignore
            });
        }
        if !has_loss {
            return Err(sig(&gf.name, "returns no %loss"));
        }
        let grad = Binding {
            function: gi,
            args,
            results,
        };

        // @accumulate (needed only with several micro-batches)
        let accumulate = match index(&options.accumulate) {
            Err(e) if options.microbatches > 1 => return Err(e),
            Err(_) => None,
            Ok(ai) => {
                let af = &module.functions[ai];
                let mut args = vec![];
                for &(v, kind) in af.args() {
                    let name = &af.value(v).name;
                    args.push(match kind {
                        ArgKind::Input => {
                            if let Some(p) = name.strip_prefix("acc.") {
                                known_grad(af, &grads, p)?;
                                Source::Acc(p.to_string())
                            } else if let Some(p) = name.strip_prefix("grad.") {
                                known_grad(af, &grads, p)?;
                                Source::Grad(p.to_string())
                            } else {
                                return Err(sig(
                                    &af.name,
                                    format!(
                                        "input %{name} is neither acc.<param> nor grad.<param>"
                                    ),
                                ));
                            }
                        }
                        _ => weight_source(&module, af, name)?,
                    });
                }
                let mut results = vec![];
                let mut covered = vec![];
                for &r in af.results() {
                    let name = &af.value(r).name;
                    let Some(p) = name.strip_prefix("new.acc.") else {
                        return Err(sig(
                            &af.name,
                            format!("result %{name} is not new.acc.<param>"),
                        ));
                    };
                    known_grad(af, &grads, p)?;
                    covered.push(p.to_string());
                    results.push(Sink::Acc(p.to_string()));
                }
                if let Some(p) = grads.iter().find(|p| !covered.contains(p)) {
                    return Err(sig(&af.name, format!("does not accumulate grad.{p}")));
                }
                Some(Binding {
                    function: ai,
                    args,
                    results,
                })
            }
        };

        // @optim
        let oi = index(&options.optim)?;
        let of = &module.functions[oi];
        let mut args = vec![];
        for &(v, kind) in of.args() {
            let name = &of.value(v).name;
            args.push(match kind {
                ArgKind::Input => {
                    let Some(p) = name.strip_prefix("grad.") else {
                        return Err(sig(
                            &of.name,
                            format!("input %{name} is not a gradient (grad.<param>)"),
                        ));
                    };
                    known_grad(of, &grads, p)?;
                    Source::Acc(p.to_string())
                }
                _ => weight_source(&module, of, name)?,
            });
        }
        let mut results = vec![];
        for &r in of.results() {
            let name = &of.value(r).name;
            let Some(w) = name.strip_prefix("new.") else {
                return Err(sig(&of.name, format!("result %{name} is not new.<weight>")));
            };
            results.push(weight_sink(&module, of, w)?);
        }
        let optim = Binding {
            function: oi,
            args,
            results,
        };

        let micro_rows = micro_rows.map_or(0, |(r, _)| r);
        Ok(Trainer {
            module,
            options,
            executor,
            grad,
            accumulate,
            optim,
            micro_rows,
            data_inputs,
            step: 0,
        })
    }

    /// The next step's number (steps count from 0).
    pub fn step_index(&self) -> u64 {
        self.step
    }

    /// Continue from step `step` (after restoring weights from a checkpoint).
    pub fn set_step_index(&mut self, step: u64) {
        self.step = step;
    }

    /// Rows of one global batch.
    pub fn global_batch(&self) -> usize {
        self.micro_rows * self.options.microbatches
    }

    /// The batch arrays each step needs (the `@grad` data inputs, `labels` included).
    pub fn data_inputs(&self) -> &[String] {
        &self.data_inputs
    }

    /// Current parameters and states, by name.
    pub fn weights(&self) -> &BTreeMap<String, Tensor> {
        &self.module.weights
    }

    pub fn module(&self) -> &Module {
        &self.module
    }

    pub fn into_module(self) -> Module {
        self.module
    }

    /// Run one training step on a global batch.
    pub fn step(&mut self, batch: &Batch) -> Result<StepReport, RuntimeError> {
        let step = self.step;
        let m_count = self.options.microbatches;
        let rows = self.micro_rows;
        for name in &self.data_inputs {
            let t = batch.get(name).ok_or_else(|| RuntimeError::Batch {
                step,
                message: format!(
                    "the batch has no array `{name}` (it has: {})",
                    batch.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            })?;
            let got = t.shape.first().copied();
            if got != Some(rows * m_count) {
                return Err(RuntimeError::Batch {
                    step,
                    message: format!(
                        "array `{name}` has shape {:?}; expected {} rows ({m_count} micro-batch(es) of {rows})",
                        t.shape,
                        rows * m_count
                    ),
                });
            }
        }

        let mut calls = vec![];
        let mut micro_losses = vec![];
        let mut acc: HashMap<String, Tensor> = HashMap::new();
        for micro in 0..m_count {
            let grad = self.grad.clone();
            let outs = {
                let mut grads = HashMap::new();
                let args = self.bind(&grad, step, micro, batch, &acc, &mut grads)?;
                self.run(&grad, args, step, Some(micro), &mut calls)?
            };
            let mut new_grads: HashMap<String, Tensor> = HashMap::new();
            for (sink, t) in grad.results.iter().zip(outs) {
                match sink {
                    Sink::Loss => micro_losses.push(t.to_f64_vec()[0]),
                    Sink::Grad(p) => {
                        new_grads.insert(p.clone(), t);
                    }
                    Sink::Weight(w) => {
                        self.module.weights.insert(w.clone(), t);
                    }
                    Sink::Acc(_) | Sink::Ignore => {}
                }
            }
            if micro == 0 {
                acc = new_grads;
            } else {
                let binding = self.accumulate.clone().ok_or_else(|| {
                    RuntimeError::MissingFunction(self.options.accumulate.clone())
                })?;
                let args = self.bind(&binding, step, micro, batch, &acc, &mut new_grads)?;
                let outs = self.run(&binding, args, step, Some(micro), &mut calls)?;
                for (sink, t) in binding.results.iter().zip(outs) {
                    if let Sink::Acc(p) = sink {
                        acc.insert(p.clone(), t);
                    }
                }
            }
        }

        let optim = self.optim.clone();
        let args = self.bind(&optim, step, 0, batch, &acc, &mut HashMap::new())?;
        let outs = self.run(&optim, args, step, None, &mut calls)?;
        for (sink, t) in optim.results.iter().zip(outs) {
            if let Sink::Weight(w) = sink {
                self.module.weights.insert(w.clone(), t);
            }
        }

        self.step += 1;
        let loss = micro_losses.iter().sum::<f64>() / micro_losses.len() as f64;
        Ok(StepReport {
            step,
            loss,
            micro_losses,
            calls,
        })
    }

    /// The arguments of a call. Gradients of this micro-batch are moved out of `grads`.
    fn bind(
        &self,
        b: &Binding,
        step: u64,
        micro: usize,
        batch: &Batch,
        acc: &HashMap<String, Tensor>,
        grads: &mut HashMap<String, Tensor>,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        let f = &self.module.functions[b.function];
        let missing = |what: String| RuntimeError::Execution {
            step,
            micro: Some(micro),
            function: f.name.clone(),
            source: what.into(),
        };
        b.args
            .iter()
            .map(|s| {
                Ok(match s {
                    Source::Data(n) => {
                        slice_rows(&batch[n], micro * self.micro_rows, self.micro_rows)
                    }
                    Source::Rng => {
                        Tensor::from_i64(DType::I64, vec![2], vec![step as i64, micro as i64])
                    }
                    Source::Weight(w) => self.module.weights[w].clone(),
                    Source::Acc(p) => acc
                        .get(p)
                        .cloned()
                        .ok_or_else(|| missing(format!("no accumulated gradient for {p}")))?,
                    Source::Grad(p) => grads
                        .remove(p)
                        .ok_or_else(|| missing(format!("no gradient for {p}")))?,
                })
            })
            .collect()
    }

    fn run(
        &mut self,
        b: &Binding,
        args: Vec<Tensor>,
        step: u64,
        micro: Option<usize>,
        calls: &mut Vec<Call>,
    ) -> Result<Vec<Tensor>, RuntimeError> {
        let f = &self.module.functions[b.function];
        calls.push(Call {
            function: f.name.clone(),
            micro,
        });
        self.executor
            .call(&self.module, f, args)
            .map_err(|source| RuntimeError::Execution {
                step,
                micro,
                function: f.name.clone(),
                source,
            })
    }
}

/// A `param`/`state` argument: the module must have its weight.
fn weight_source(m: &Module, f: &Function, name: &str) -> Result<Source, RuntimeError> {
    if !m.weights.contains_key(name) {
        return Err(sig(
            &f.name,
            format!("the module has no weight `{name}` for argument %{name}"),
        ));
    }
    Ok(Source::Weight(name.to_string()))
}

/// A `new.<w>` result: `w` must be a weight.
fn weight_sink(m: &Module, f: &Function, w: &str) -> Result<Sink, RuntimeError> {
    if !m.weights.contains_key(w) {
        return Err(sig(
            &f.name,
            format!("result %new.{w} updates `{w}`, which is not a weight of the module"),
        ));
    }
    Ok(Sink::Weight(w.to_string()))
}

fn known_grad(f: &Function, grads: &[String], p: &str) -> Result<(), RuntimeError> {
    if grads.iter().any(|g| g == p) {
        Ok(())
    } else {
        Err(sig(
            &f.name,
            format!("uses the gradient of `{p}`, which @grad does not return"),
        ))
    }
}

#[cfg(test)]
mod tests;
