//! Building the training program from an ONNX model: import, micro-batch size, `@grad`
//! (autodiff with the loss appended), `@optim` and `@accumulate`. Shared by `ppcc train`
//! and the compiler (`ppcc MODEL.onnx -o DIR`).

use std::collections::{BTreeMap, HashMap};
use std::io::IsTerminal;
use std::path::Path;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use ppcc_frontends::onnx::{import_onnx_file_full, ImportOptions};
use ppcc_passes::autodiff::{build_gradient_function, AutodiffOptions, LossKind, TrainingInfo};
use ppcc_passes::optim::{build_optimizer_function, OptimizerKind, OptimizerOptions};
use ppir::{ArgKind, Dim, Module, TensorType};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LossArg {
    /// The model's output if it is a single scalar, cross-entropy otherwise.
    Auto,
    /// Softmax cross-entropy over the last axis of the first output, integer labels.
    CrossEntropy,
    /// Mean squared error of the first output against float labels.
    Mse,
    /// The model's (scalar) output is the loss.
    Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OptimizerArg {
    /// SGD with momentum and weight decay (PyTorch semantics).
    Sgd,
    /// AdamW (decoupled weight decay, bias correction).
    Adamw,
}

/// Batch, loss and optimizer options shared by `ppcc train` and the compiler.
#[derive(Args, Clone, Debug)]
pub struct ProgramArgs {
    /// Global batch size N (rows per step). Default: the model's static batch size. A
    /// model exported with a static batch trains with other micro-batch sizes unless it
    /// bakes its batch size into a constant (then N/M must equal it).
    #[arg(long, value_name = "N")]
    pub batch: Option<u64>,
    /// The loss to train.
    #[arg(long, value_enum, default_value_t = LossArg::Auto)]
    pub loss: LossArg,
    /// The optimizer.
    #[arg(long, value_enum, default_value_t = OptimizerArg::Sgd)]
    pub optimizer: OptimizerArg,
    /// Learning rate. Default: 0.05 for SGD, 1e-3 for AdamW.
    #[arg(long, value_name = "F")]
    pub lr: Option<f64>,
    /// SGD momentum.
    #[arg(long, value_name = "F", default_value_t = 0.9)]
    pub momentum: f64,
    /// Weight decay (SGD: added to the gradient; AdamW: decoupled). Default: 0 for SGD,
    /// 0.01 for AdamW.
    #[arg(long, value_name = "F")]
    pub weight_decay: Option<f64>,
    /// AdamW β1.
    #[arg(long, value_name = "F", default_value_t = 0.9)]
    pub beta1: f64,
    /// AdamW β2.
    #[arg(long, value_name = "F", default_value_t = 0.999)]
    pub beta2: f64,
    /// AdamW ε.
    #[arg(long, value_name = "F", default_value_t = 1e-8)]
    pub eps: f64,
    /// Train with inference-mode ops: dropout off, batch-norm with running statistics.
    #[arg(long)]
    pub eval_mode: bool,
}

impl ProgramArgs {
    pub fn loss_kind(&self) -> LossKind {
        match self.loss {
            LossArg::Auto => LossKind::Auto,
            LossArg::CrossEntropy => LossKind::CrossEntropy,
            LossArg::Mse => LossKind::Mse,
            LossArg::Output => LossKind::Output,
        }
    }

    pub fn autodiff(&self) -> AutodiffOptions {
        AutodiffOptions {
            function: "main".into(),
            loss: self.loss_kind(),
            train_mode: !self.eval_mode,
        }
    }

    /// The optimizer with its defaults resolved, for `microbatches` per step.
    pub fn optimizer(&self, microbatches: u64) -> Result<OptimizerOptions> {
        let (kind, lr, wd) = match self.optimizer {
            OptimizerArg::Sgd => (
                OptimizerKind::Sgd,
                self.lr.unwrap_or(0.05),
                self.weight_decay.unwrap_or(0.0),
            ),
            OptimizerArg::Adamw => (
                OptimizerKind::AdamW,
                self.lr.unwrap_or(1e-3),
                self.weight_decay.unwrap_or(0.01),
            ),
        };
        let opts = OptimizerOptions {
            kind,
            lr,
            momentum: self.momentum,
            weight_decay: wd,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            microbatches: u32::try_from(microbatches).context("--microbatches is too large")?,
        };
        opts.check()?;
        Ok(opts)
    }
}

/// An imported model bound to its micro-batch size.
pub struct Prepared {
    pub module: Module,
    /// ONNX initializer of each IR weight.
    pub weight_sources: BTreeMap<String, String>,
    /// ONNX input name of each IR input argument.
    pub onnx_name: HashMap<String, String>,
    pub first_output: Option<TensorType>,
    /// Rows per step and per micro-batch.
    pub global: u64,
    pub micro: u64,
}

/// Import `model` and bind its batch to `global / microbatches` rows.
pub fn prepare(model: &Path, a: &ProgramArgs, microbatches: u64) -> Result<Prepared> {
    if microbatches == 0 {
        bail!("--microbatches must be at least 1");
    }
    // Hyper-parameters are checked up front, also for `--plan-only` (which builds no
    // optimizer) and before minutes of planning.
    a.optimizer(microbatches)?;
    let imported = import_onnx_file_full(model, &ImportOptions::default())
        .with_context(|| format!("importing {}", model.display()))?;
    let mut module = imported.module;
    let main = module
        .function("main")
        .context("the imported module has no @main")?;
    let input_names: Vec<String> = main
        .args()
        .iter()
        .filter(|(_, k)| *k == ArgKind::Input)
        .map(|&(v, _)| main.value(v).name.clone())
        .collect();
    let onnx_name: HashMap<String, String> = input_names
        .iter()
        .cloned()
        .zip(imported.inputs.iter().cloned())
        .collect();
    let first_output = main.results().first().map(|&v| main.ty(v).clone());
    let model_batch = model_batch(&module)?;
    let global = match (a.batch, model_batch) {
        (Some(n), _) => n,
        (None, Some(b)) => b,
        (None, None) => {
            bail!("the model's batch size is symbolic: give the global batch with --batch N")
        }
    };
    if global == 0 || global % microbatches != 0 {
        bail!("--microbatches {microbatches} must divide the global batch {global}");
    }
    let micro = global / microbatches;
    set_batch(&mut module, model_batch, micro)?;
    Ok(Prepared {
        module,
        weight_sources: imported.weight_sources,
        onnx_name,
        first_output,
        global,
        micro,
    })
}

/// The training functions added to a module.
pub struct Training {
    pub info: TrainingInfo,
    /// Trained params with their types, in order.
    pub params: Vec<(String, TensorType)>,
    pub optimizer: OptimizerOptions,
}

/// Add `@grad`, `@optim` and `@accumulate` to `module` (stage tags on `@main` carry over).
pub fn build_training(module: &mut Module, a: &ProgramArgs, microbatches: u64) -> Result<Training> {
    let info =
        build_gradient_function(module, &a.autodiff()).context("building the gradient function")?;
    let grad_f = module
        .function(&info.function)
        .context("autodiff returned no gradient function")?;
    let params: Vec<(String, TensorType)> = info
        .params
        .iter()
        .map(|p| {
            let v = grad_f
                .find_value(p)
                .with_context(|| format!("@{} has no argument %{p}", info.function))?;
            Ok((p.clone(), grad_f.ty(v).clone()))
        })
        .collect::<Result<_>>()?;
    let optimizer = a.optimizer(microbatches)?;
    build_optimizer_function(module, &params, &optimizer).context("building the optimizer")?;
    check(module, "the training program")?;
    Ok(Training {
        info,
        params,
        optimizer,
    })
}

/// Verify `module`, listing the first errors.
pub fn check(module: &Module, what: &str) -> Result<()> {
    if let Err(errors) = ppir::verify::verify_module(module) {
        let mut msg = format!("{what} does not verify:");
        for e in errors.iter().take(10) {
            msg.push_str(&format!("\n  {e}"));
        }
        bail!(msg);
    }
    Ok(())
}

/// The static batch size shared by axis 0 of every model input, `None` if it is symbolic.
pub fn model_batch(m: &Module) -> Result<Option<u64>> {
    let f = m.function("main").context("no @main")?;
    let mut batch: Option<Option<u64>> = None;
    for &(v, kind) in f.args() {
        if kind != ArgKind::Input {
            continue;
        }
        let ty = f.ty(v);
        let Some(&d0) = ty.dims.first() else {
            bail!(
                "input %{} is a scalar; training needs the batch on axis 0 of every input",
                f.value(v).name
            );
        };
        let this = d0.known();
        match batch {
            None => batch = Some(this),
            Some(b) if b != this => bail!(
                "the model's inputs disagree on the batch size (axis 0): {} vs {}",
                b.map_or("?".into(), |n| n.to_string()),
                this.map_or("?".into(), |n| n.to_string())
            ),
            Some(_) => {}
        }
    }
    batch.context("the model has no inputs")
}

/// Make axis 0 of every input `micro` rows. A model whose batch is static is re-derived
/// with a symbolic batch first; that fails (with the reason) if the model bakes its batch
/// size into a constant such as a reshape target.
pub fn set_batch(m: &mut Module, model_batch: Option<u64>, micro: u64) -> Result<()> {
    if model_batch == Some(micro) {
        return Ok(());
    }
    if let Some(b) = model_batch {
        for f in &mut m.functions {
            let inputs: Vec<_> = f
                .args()
                .iter()
                .filter(|(_, k)| *k == ArgKind::Input)
                .map(|&(v, _)| v)
                .collect();
            for v in inputs {
                let mut ty = f.ty(v).clone();
                ty.dims[0] = Dim::Batch;
                f.set_type(v, ty);
            }
            ppir::shape::infer_function(f).map_err(|e| {
                anyhow::anyhow!(
                    "the model's batch size is fixed at {b} ({e}); use a micro-batch of {b} rows (--batch {b}×M)"
                )
            })?;
        }
    }
    ppir::shape::bind_batch(m, micro).map_err(|e| {
        let fixed = model_batch.map_or(String::new(), |b| {
            format!("; the model's batch size is fixed at {b}: use a micro-batch of {b} rows (--batch {b}×M)")
        });
        anyhow::anyhow!("cannot use micro-batches of {micro} rows: {e}{fixed}")
    })
}

/// A bar of training steps on a terminal (`show`), else a hidden one.
pub fn step_bar(steps: u64, show: bool) -> indicatif::ProgressBar {
    if show && std::io::stderr().is_terminal() {
        let pb = indicatif::ProgressBar::new(steps);
        pb.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} steps, {elapsed} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    } else {
        indicatif::ProgressBar::hidden()
    }
}
