//! `ppcc train`: single-device training, as native code (the default) or on the reference
//! interpreter.
//!
//! Import → bind the micro-batch size → `@grad` (autodiff, loss appended) → `@optim` and
//! `@accumulate` (optimizer) → [`ppcc_runtime::Trainer`] over `.npz` or synthetic data.
//! Standard output carries exactly one line per step, `step <k> loss <value>`; the value is
//! the f64 loss in Rust's `{:?}` form: the shortest digits that read back exactly, in
//! scientific notation below 1e-4 (`2.765547752380371`, `1.4511585504806135e-5`).
//! Everything else goes to standard error.

use ppcc_driver::target::{build_native, ScratchDir, Target};
use ppcc_runtime::native::NativeExecutor;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use ppcc_passes::autodiff::LossKind;
use ppcc_runtime::data::{default_specs, index_limits_of, with_batch};
use ppcc_runtime::{BatchSource, SyntheticSource, Trainer, TrainerOptions};
use ppir::{Dim, Tensor, TensorType};

use crate::program::{step_bar, ProgramArgs};
use ppcc_driver::data::{label_spec, npz_source};
use ppcc_driver::program::{build_training, prepare, Prepared, Training};
use ppcc_runtime::npz::read_npz;

/// Train a model on one device (native code by default, or the reference interpreter).
///
/// Builds the training program (gradient of the loss by autodiff, optimizer step and
/// gradient accumulation as IR) and runs it step by step.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Output: exactly one line per step on standard output, `step <k> loss <value>` (k from 0;
the value is the mean loss over the global batch before that step's update, as the
shortest decimal that reads back as the same f64: `2.765547752380371`,
`1.4511585504806135e-5`). Everything else goes to standard error; a progress bar only
when standard error is a terminal.

Data: `--data FILE.npz` holds the model's inputs under their ONNX names and `labels`
(class ids for cross-entropy, float targets for mse), rows on axis 0; step k takes the
(k mod n)-th block of N rows, n = rows / N. `--data synthetic` draws one seeded batch
(floats ~ N(0,1), token ids within the embedding table, class ids within the logits) and
repeats it every step, so a working program shows the loss falling; `synthetic-fresh`
draws a new batch per step. Integer inputs that index something (token ids into an
embedding table, class labels) are checked before training: a value outside the table or
the classes is refused with the input, row, position and value.

Targets: `--target cpu` (the default, as for `ppcc run`) and `--target interp` compute the
same losses up to f32 rounding in another order (see README.md for the tolerance).

A step whose loss is NaN or infinite stops training with an error (exit status 1);
`--allow-nonfinite-loss` continues instead.

Examples:
  ppcc train examples/gpt.onnx --steps 50 --data synthetic
  ppcc train examples/mlp.onnx --data examples/mlp_train.npz --steps 5 --lr 0.05 --momentum 0.9
  ppcc train examples/mlp.onnx --data examples/mlp_train.npz --microbatches 4
  ppcc train examples/two_tower.onnx --data examples/two_tower_train.npz --loss mse \\
      --optimizer adamw --lr 1e-3 --weight-decay 0.01 --save-onnx trained.onnx")]
pub struct TrainArgs {
    /// The ONNX model (float initializers are the trained parameters).
    model: PathBuf,
    /// Number of training steps.
    #[arg(long, default_value_t = 10)]
    steps: u64,
    /// Training data: an `.npz` (inputs by ONNX name, plus `labels`), `synthetic`
    /// (one seeded batch, repeated) or `synthetic-fresh` (a new seeded batch each step).
    #[arg(long, value_name = "FILE.npz|synthetic", default_value = "synthetic")]
    data: String,
    /// Micro-batches per step M (each carries N/M rows; gradients are summed, then scaled
    /// by 1/M). M must divide N.
    #[arg(long, value_name = "M", default_value_t = 1)]
    microbatches: u64,
    /// Seed of synthetic data.
    #[arg(long, value_name = "S", default_value_t = 0)]
    seed: u64,
    /// After training, write the model with its initializers replaced by the trained
    /// values (loadable by onnxruntime).
    #[arg(long, value_name = "OUT.onnx")]
    save_onnx: Option<PathBuf>,
    /// Run the training step as native code (MLIR → LLVM; the functions @grad,
    /// @accumulate and @optim become one module) or on the reference interpreter.
    #[arg(long, value_enum, default_value_t = Target::Cpu)]
    target: Target,
    /// Keep training after a step whose loss is NaN or infinite (default: stop with an
    /// error at the first one).
    #[arg(long)]
    allow_nonfinite_loss: bool,
    #[command(flatten)]
    program: ProgramArgs,
}

pub fn train(a: TrainArgs) -> Result<ExitCode> {
    if a.microbatches == 0 {
        bail!("--microbatches must be at least 1");
    }
    let Prepared {
        mut module,
        weight_sources,
        onnx_name,
        first_output,
        global,
        micro,
    } = prepare(&a.model, &a.program.options(), a.microbatches)?;
    let Training {
        info,
        params,
        optimizer: opt,
    } = build_training(&mut module, &a.program.options(), a.microbatches)?;
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
                target,
            )?;
            Trainer::with_executor(module, trainer_opts, Box::new(NativeExecutor { native }))?
        }
    };

    // Data.
    let grad_f = trainer
        .module()
        .function(&info.function)
        .context("no gradient function")?;
    let wanted: Vec<(String, TensorType)> = trainer
        .data_inputs()
        .iter()
        .map(|n| {
            let v = grad_f.find_value(n).expect("the trainer resolved it");
            (n.clone(), with_batch(grad_f.ty(v), global))
        })
        .collect();
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
        eprintln!(
            "warning: cross-entropy over a last axis of size 1 is always 0; a regression output wants --loss mse"
        );
    }
    let n_params: u64 = params.iter().filter_map(|(_, t)| t.num_elements()).sum();
    eprintln!(
        "training {}: {} parameters ({n_params} values), loss {}, {} lr {lr}, global batch {global} = {} × {micro}, data {}",
        a.model.display(),
        params.len(),
        info.loss_kind.name(),
        kind.name(),
        a.microbatches,
        a.data
    );

    let bar = step_bar(a.steps, true);
    let mut times = Vec::new();
    for k in 0..a.steps {
        let t0 = std::time::Instant::now();
        let batch = source.batch(k)?;
        let report = trainer.step(&batch)?;
        times.push(t0.elapsed().as_secs_f64());
        bar.suspend(|| println!("{}", step_line(k, report.loss)));
        bar.set_message(format!("loss {:.4}", report.loss));
        bar.inc(1);
        if !report.loss.is_finite() && !a.allow_nonfinite_loss {
            bar.finish_and_clear();
            bail!(ppcc_driver::run::nonfinite_loss(k, report.loss));
        }
    }
    bar.finish_and_clear();
    // The first step warms caches up; leave it out when there are more.
    let timed = if times.len() > 2 {
        &times[1..]
    } else {
        &times[..]
    };
    if !timed.is_empty() {
        let mut sorted = timed.to_vec();
        sorted.sort_by(f64::total_cmp);
        eprintln!(
            "time per step: mean {:.3} ms, median {:.3} ms ({} steps, --target {})",
            1e3 * timed.iter().sum::<f64>() / timed.len() as f64,
            1e3 * sorted[sorted.len() / 2],
            timed.len(),
            a.target.name()
        );
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
        eprintln!(
            "wrote {} ({} initializers updated)",
            out.display(),
            report.replaced.len()
        );
        if !report.unused.is_empty() {
            eprintln!(
                "warning: weights with no matching initializer: {}",
                report.unused.join(", ")
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The output line of one step.
pub(crate) fn step_line(step: u64, loss: f64) -> String {
    format!("step {step} loss {loss:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ppir::DType;

    #[test]
    fn step_lines_round_trip() {
        let loss = 2.765_547_8_f32 as f64;
        let line = step_line(3, loss);
        assert_eq!(line, "step 3 loss 2.765547752380371");
        let back: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!(back, loss);
        let tiny = 1.4511585504806135e-5;
        assert_eq!(step_line(0, tiny), "step 0 loss 1.4511585504806135e-5");
        assert_eq!(step_line(1, 0.0), "step 1 loss 0.0");
    }

    #[test]
    fn conversions() {
        let t = Tensor::from_f64(DType::F64, vec![2], vec![0.1, 2.0]);
        let c = ppcc_driver::data::convert("x", t, DType::F32).unwrap();
        assert_eq!(c.dtype, DType::F32);
        let i = Tensor::from_i64(DType::I32, vec![1], vec![5]);
        assert_eq!(
            ppcc_driver::data::convert("i", i.clone(), DType::I64)
                .unwrap()
                .dtype,
            DType::I64
        );
        assert!(ppcc_driver::data::convert("i", i, DType::F32).is_err());
    }

    #[test]
    fn static_batches_are_rebound() {
        let src = r#"
module {
  func @main(%x: tensor<8x3xf32>, %w: tensor<3x2xf32> {param}) -> (tensor<8x2xf32>) {
    %y = "pp.matmul"(%x, %w) : (tensor<8x3xf32>, tensor<3x2xf32>) -> tensor<8x2xf32>
    return %y : tensor<8x2xf32>
  }
  weight @w : tensor<3x2xf32> = dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]>
}
"#;
        let mut m = ppir::text::parse_module(src).unwrap();
        assert_eq!(ppcc_driver::program::model_batch(&m).unwrap(), Some(8));
        ppcc_driver::program::set_batch(&mut m, Some(8), 2).unwrap();
        let f = m.function("main").unwrap();
        assert_eq!(f.result_types()[0], TensorType::of(DType::F32, &[2, 2]));

        let fixed = r#"
module {
  func @main(%x: tensor<4x6xf32>) -> (tensor<4x2x3xf32>) {
    %y = "pp.reshape"(%x) {shape = [4, 2, 3]} : (tensor<4x6xf32>) -> tensor<4x2x3xf32>
    return %y : tensor<4x2x3xf32>
  }
}
"#;
        let mut m = ppir::text::parse_module(fixed).unwrap();
        let e = ppcc_driver::program::set_batch(&mut m, Some(4), 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("fixed at 4"), "{e}");
    }
}
