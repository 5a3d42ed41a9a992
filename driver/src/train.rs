//! Single-device training as a library call (`ppcc train`): import → bind the micro-batch
//! size → `@grad` (autodiff, loss appended) → `@optim` and `@accumulate` (optimizer) →
//! [`ppcc_runtime::Trainer`] over `.npz` or synthetic data, on native code or the
//! interpreter. What it does is reported as [`TrainEvent`]s; the caller prints them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ppcc_passes::autodiff::LossKind;
use ppcc_runtime::data::{default_specs, index_limits_of, with_batch};
use ppcc_runtime::native::NativeExecutor;
use ppcc_runtime::npz::read_npz;
use ppcc_runtime::{BatchSource, SyntheticSource, Trainer, TrainerOptions};
use ppir::{Dim, Tensor, TensorType};

use crate::data::{label_spec, npz_source};
use crate::error::{bail, Context, Result};
use crate::program::{build_training, prepare, Prepared, ProgramOptions, Training};
use crate::target::{build_native, ScratchDir, Target};

/// What to train and how (the options of `ppcc train`).
#[derive(Clone, Debug)]
pub struct TrainOptions {
    /// The ONNX model (float initializers are the trained parameters).
    pub model: PathBuf,
    pub steps: u64,
    /// An `.npz` file, `synthetic` (one seeded batch, repeated) or `synthetic-fresh`.
    pub data: String,
    /// Micro-batches per step.
    pub microbatches: u64,
    /// Seed of synthetic data.
    pub seed: u64,
    /// Write the model with the trained initializers here afterwards.
    pub save_onnx: Option<PathBuf>,
    /// Write the trained parameters here afterwards, as `.npz` keyed by the model's
    /// names for them (`arg<i>` for StableHLO, initializer names for ONNX).
    pub save_params: Option<PathBuf>,
    pub target: Target,
    /// Keep training after a step whose loss is NaN or infinite.
    pub allow_nonfinite_loss: bool,
    pub program: ProgramOptions,
}

impl TrainOptions {
    /// The command line's defaults for `model`.
    pub fn new(model: impl Into<PathBuf>) -> Self {
        TrainOptions {
            model: model.into(),
            steps: 10,
            data: "synthetic".into(),
            microbatches: 1,
            seed: 0,
            save_onnx: None,
            save_params: None,
            target: Target::Cpu,
            allow_nonfinite_loss: false,
            program: ProgramOptions::default(),
        }
    }
}

/// What training reports while it works.
#[derive(Clone, Debug, PartialEq)]
pub enum TrainEvent {
    /// The steps are about to start.
    Started { steps: u64 },
    /// Step `step` ended with `loss` (the mean over the global batch, before the update).
    Step { step: u64, loss: f64 },
    /// A line for the user (standard error): what trains, warnings, timing, files written.
    Note(String),
}

/// Train `a.model` for `a.steps` steps on one device.
pub fn train(a: &TrainOptions, events: &mut dyn FnMut(TrainEvent)) -> Result<()> {
    if a.microbatches == 0 {
        bail!("--microbatches must be at least 1");
    }
    if a.save_onnx.is_some() && crate::model::format_of(&a.model) == crate::model::Format::StableHlo
    {
        bail!(
            "--save-onnx writes an ONNX model's trained weights back; {} is a StableHLO module: write the trained parameters with --save-params OUT.npz (keyed arg<i>, as --params reads them and as @main takes them)",
            a.model.display()
        );
    }
    let Prepared {
        mut module,
        weight_sources,
        onnx_name,
        first_output,
        global,
        micro,
    } = prepare(&a.model, &a.program, a.microbatches)?;
    let Training {
        info,
        params,
        optimizer: opt,
    } = build_training(&mut module, &a.program, a.microbatches)?;
    let (kind, lr) = (opt.kind, opt.lr);
    let trainer_opts = TrainerOptions {
        grad: info.function.clone(),
        microbatches: a.microbatches as usize,
        ..Default::default()
    };
    let scratch = ScratchDir::new("train")?;
    let mut trainer = match a.target {
        Target::Interp => Trainer::new(module, trainer_opts)?,
        target @ (Target::Cpu | Target::Cuda) => {
            let names = [
                trainer_opts.grad.as_str(),
                trainer_opts.accumulate.as_str(),
                trainer_opts.optim.as_str(),
            ];
            let native = build_native(
                &module,
                &names,
                &scratch.0,
                "the training step",
                false,
                target.cuda(),
            )?;
            Trainer::with_executor(module, trainer_opts, Box::new(NativeExecutor { native }))?
        }
    };

    // Data.
    let grad_f = trainer
        .module()
        .function(&info.function)
        .context("no gradient function")?;
    let mut wanted: Vec<(String, TensorType)> = vec![];
    for n in trainer.data_inputs() {
        let v = grad_f
            .find_value(n)
            .with_context(|| format!("@{}: no data input %{n}", info.function))?;
        wanted.push((n.clone(), with_batch(grad_f.ty(v), global)));
    }
    // What the integer inputs index: checked before training, on every target.
    let limits = index_limits_of(&trainer.module().functions);
    let mut source: Box<dyn BatchSource> = match a.data.as_str() {
        "synthetic" | "synthetic-fresh" => {
            let names: Vec<String> = wanted
                .iter()
                .map(|(n, _)| n.clone())
                .filter(|n| n != "labels")
                .collect();
            let mut specs = default_specs(grad_f, &names, global);
            if let Some((_, ty)) = wanted.iter().find(|(n, _)| n == "labels") {
                specs.push(label_spec(ty, first_output.as_ref())?);
            }
            let source = SyntheticSource::new(specs, a.seed, a.data == "synthetic")?;
            source.check_indices(&limits).context("synthetic data")?;
            Box::new(source)
        }
        path => {
            let arrays = read_npz(Path::new(path))?;
            let source = npz_source(path, arrays, &wanted, &onnx_name, global as usize)?;
            source.check_indices(&limits).context(path.to_string())?;
            Box::new(source)
        }
    };

    if info.loss_kind == LossKind::CrossEntropy
        && first_output.as_ref().and_then(|t| t.dims.last()) == Some(&Dim::Known(1))
    {
        events(TrainEvent::Note(
            "warning: cross-entropy over a last axis of size 1 is always 0; a regression output wants --loss mse".into(),
        ));
    }
    let n_params: u64 = params.iter().filter_map(|(_, t)| t.num_elements()).sum();
    events(TrainEvent::Note(format!(
        "training {}: {} parameters ({n_params} values), loss {}, {} lr {lr}, global batch {global} = {} × {micro}, data {}",
        a.model.display(),
        params.len(),
        info.loss_kind.name(),
        kind.name(),
        a.microbatches,
        a.data
    )));

    events(TrainEvent::Started { steps: a.steps });
    let mut times = Vec::new();
    for k in 0..a.steps {
        let t0 = std::time::Instant::now();
        let batch = source.batch(k)?;
        let report = trainer.step(&batch)?;
        times.push(t0.elapsed().as_secs_f64());
        events(TrainEvent::Step {
            step: k,
            loss: report.loss,
        });
        if !report.loss.is_finite() && !a.allow_nonfinite_loss {
            bail!("{}", crate::run::nonfinite_loss(k, report.loss));
        }
    }
    // The first step warms caches up; leave it out when there are more.
    let timed = if times.len() > 2 {
        &times[1..]
    } else {
        &times[..]
    };
    if !timed.is_empty() {
        let mut sorted = timed.to_vec();
        sorted.sort_by(f64::total_cmp);
        events(TrainEvent::Note(format!(
            "time per step: mean {:.3} ms, median {:.3} ms ({} steps, --target {})",
            1e3 * timed.iter().sum::<f64>() / timed.len() as f64,
            1e3 * sorted[sorted.len() / 2],
            timed.len(),
            a.target.name()
        )));
    }

    if let Some(out) = &a.save_params {
        let trained: Vec<(String, Tensor)> = trainer
            .weights()
            .iter()
            .map(|(k, v)| (weight_sources.get(k).unwrap_or(k).clone(), v.clone()))
            .collect();
        ppcc_runtime::npz::write_npz(out, &trained)?;
        events(TrainEvent::Note(format!(
            "wrote {} ({} trained parameters)",
            out.display(),
            trained.len()
        )));
    }
    if let Some(out) = &a.save_onnx {
        let bytes = std::fs::read(&a.model)
            .with_context(|| format!("cannot read {}", a.model.display()))?;
        // Trained values keyed by the ONNX initializer each IR weight came from.
        let trained: BTreeMap<String, Tensor> = trainer
            .weights()
            .iter()
            .filter_map(|(k, v)| Some((weight_sources.get(k)?.clone(), v.clone())))
            .collect();
        let (model, report) = ppcc_frontends::onnx_export::replace_initializers(&bytes, &trained)?;
        std::fs::write(out, model).with_context(|| format!("cannot write {}", out.display()))?;
        events(TrainEvent::Note(format!(
            "wrote {} ({} initializers updated)",
            out.display(),
            report.replaced.len()
        )));
        if !report.unused.is_empty() {
            events(TrainEvent::Note(format!(
                "warning: weights with no matching initializer: {}",
                report.unused.join(", ")
            )));
        }
    }
    Ok(())
}
