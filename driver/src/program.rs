//! Building the training program from an ONNX model: import, micro-batch size, `@grad`
//! (autodiff with the loss appended), `@optim` and `@accumulate`. Shared by single-device
//! training (`ppcc train`) and the compile pipeline ([`crate::compile`]).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::error::{bail, invalid, Context, DriverError, Result};
use ppcc_frontends::onnx::ImportOptions;
use ppcc_passes::autodiff::{build_gradient_function, AutodiffOptions, LossKind, TrainingInfo};
use ppcc_passes::optim::{build_optimizer_function, OptimizerKind, OptimizerOptions};
use ppir::{ArgKind, Dim, Module, TensorType};

/// Batch, loss and optimizer options of a training program (`ppcc train` and the
/// compiler), with the command line's defaults.
#[derive(Clone, Debug)]
pub struct ProgramOptions {
    /// Global batch size N (rows per step). `None`: the model's static batch size.
    pub batch: Option<u64>,
    pub loss: LossKind,
    pub optimizer: OptimizerKind,
    /// `None`: 0.05 for SGD, 1e-3 for AdamW.
    pub lr: Option<f64>,
    pub momentum: f64,
    /// `None`: 0 for SGD, 0.01 for AdamW.
    pub weight_decay: Option<f64>,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Inference-mode ops: dropout off, batch-norm with running statistics.
    pub eval_mode: bool,
    /// The trainable arguments of a StableHLO module (`.npz` keyed `arg<i>`).
    pub params: Option<PathBuf>,
}

impl Default for ProgramOptions {
    fn default() -> Self {
        ProgramOptions {
            batch: None,
            loss: LossKind::Auto,
            optimizer: OptimizerKind::Sgd,
            lr: None,
            momentum: 0.9,
            weight_decay: None,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            eval_mode: false,
            params: None,
        }
    }
}

impl ProgramOptions {
    pub fn loss_kind(&self) -> LossKind {
        self.loss
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
            OptimizerKind::Sgd => (
                OptimizerKind::Sgd,
                self.lr.unwrap_or(0.05),
                self.weight_decay.unwrap_or(0.0),
            ),
            OptimizerKind::AdamW => (
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
pub fn prepare(model: &Path, a: &ProgramOptions, microbatches: u64) -> Result<Prepared> {
    if microbatches == 0 {
        bail!("--microbatches must be at least 1");
    }
    // Hyper-parameters are checked up front, also for `--plan-only` (which builds no
    // optimizer) and before minutes of planning.
    a.optimizer(microbatches)?;
    let (mut imported, format) =
        crate::model::import_model(model, a.params.as_deref(), &ImportOptions::default())?;
    let model_batch = model_batch(&imported.module)?;
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
    // A StableHLO module's shapes are static: another batch is a re-import with the
    // batch rebound (or an error naming the op that fixes it).
    if format == crate::model::Format::StableHlo {
        if let Some(b) = model_batch.filter(|&b| b != micro) {
            imported = crate::model::import_stablehlo_model(model, a.params.as_deref(), Some(micro))
                .map_err(|e| {
                    invalid!(
                        "the StableHLO module was exported with a batch of {b} rows and its batch cannot be rebound to micro-batches of {micro} rows: {}; use micro-batches of {b} rows (--batch {b}×M --microbatches M), or export the module with a batch of {micro}",
                        crate::error_chain(&e)
                    )
                })?;
        }
    }
    let model_batch = self::model_batch(&imported.module)?;
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
pub fn build_training(
    module: &mut Module,
    a: &ProgramOptions,
    microbatches: u64,
) -> Result<Training> {
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
    ppir::verify::verify_module(module).map_err(|errors| DriverError::Verify {
        what: what.to_string(),
        errors,
    })
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
                invalid!(
                    "the model's batch size is fixed at {b} ({e}); use a micro-batch of {b} rows (--batch {b}×M)"
                )
            })?;
        }
    }
    ppir::shape::bind_batch(m, micro).map_err(|e| {
        let fixed = model_batch.map_or(String::new(), |b| {
            format!("; the model's batch size is fixed at {b}: use a micro-batch of {b} rows (--batch {b}×M)")
        });
        invalid!("cannot use micro-batches of {micro} rows: {e}{fixed}")
    })
}
