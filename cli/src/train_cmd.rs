//! `ppcc train`: single-device training, as native code (the default) or on the reference
//! interpreter: the arguments and the printing of [`ppcc_driver::train`].
//! Standard output carries exactly one line per step, `step <k> loss <value>`; the value is
//! the f64 loss in Rust's `{:?}` form: the shortest digits that read back exactly, in
//! scientific notation below 1e-4 (`2.765547752380371`, `1.4511585504806135e-5`).
//! Everything else goes to standard error.

use ppcc_driver::target::Target;
use ppcc_driver::train::{TrainEvent, TrainOptions};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;

use crate::program::{step_bar, ProgramArgs};

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
  ppcc train tests/stablehlo/fixtures/mlp.mlir --params tests/stablehlo/fixtures/mlp_params.npz \\
      --data tests/stablehlo/fixtures/mlp_train.npz --loss cross-entropy --momentum 0 --steps 5
  ppcc train examples/two_tower.onnx --data examples/two_tower_train.npz --loss mse \\
      --optimizer adamw --lr 1e-3 --weight-decay 0.01 --save-onnx trained.onnx")]
pub struct TrainArgs {
    /// The model: ONNX (float initializers are the trained parameters), or a StableHLO
    /// module (`.mlir`, pretty or generic form) with its parameters in `--params`.
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
    /// After training, write the trained parameters as .npz, keyed by the model's names
    /// for them: `arg<i>` for a StableHLO module (what `--params` reads and JAX's
    /// function takes, in order), initializer names for ONNX.
    #[arg(long, value_name = "OUT.npz")]
    save_params: Option<PathBuf>,
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
    let opts = TrainOptions {
        model: a.model.clone(),
        steps: a.steps,
        data: a.data.clone(),
        microbatches: a.microbatches,
        seed: a.seed,
        save_onnx: a.save_onnx.clone(),
        save_params: a.save_params.clone(),
        target: a.target,
        allow_nonfinite_loss: a.allow_nonfinite_loss,
        program: a.program.options(),
    };
    let mut bar = indicatif::ProgressBar::hidden();
    let result = ppcc_driver::train::train(&opts, &mut |e| match e {
        TrainEvent::Started { steps } => bar = step_bar(steps, true),
        TrainEvent::Step { step, loss } => {
            bar.suspend(|| println!("{}", step_line(step, loss)));
            bar.set_message(format!("loss {loss:.4}"));
            bar.inc(1);
        }
        TrainEvent::Note(n) => {
            if !bar.is_finished() && !bar.is_hidden() {
                bar.finish_and_clear();
            }
            eprintln!("{n}");
        }
    });
    bar.finish_and_clear();
    result?;
    Ok(ExitCode::SUCCESS)
}

/// The output line of one step.
pub(crate) fn step_line(step: u64, loss: f64) -> String {
    format!("step {step} loss {loss:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use ppir::{DType, Tensor, TensorType};

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
