//! `ppcc import`, `ppcc eval`: the ONNX frontend on the command line (`ppcc conform` is in
//! `conform_cmd`).

use ppcc_runtime::npz;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use ppcc_frontends::onnx::conform::{compare, Tolerance};
use ppcc_frontends::onnx::{import_onnx_file_full, ImportOptions, Imported};
use ppcc_runtime::native::Arg as NativeArgRef;
use ppir::interp::{run_function, InterpOptions, Precision};

use ppcc_driver::model::Format;
use ppcc_driver::target::{build_native, ScratchDir, Target};
use ppir::text::{print_module, PrintOptions};
use ppir::ArgKind;

/// Shape options shared by `import` and `eval`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ShapeArgs {
    /// Bind the symbolic first (batch) dimension of every input to N. Without it, that
    /// dimension stays symbolic (`?`). For a StableHLO module (static shapes): rebind its
    /// exported batch to N, or an error names the op that fixes it.
    #[arg(long, value_name = "N")]
    batch: Option<u64>,
    /// The full static shape of input NAME, e.g. `--input-shape tokens=1x128`. Needed for
    /// symbolic dimensions other than the first. Repeatable.
    #[arg(long = "input-shape", value_name = "NAME=DIMS", value_parser = parse_input_shape)]
    input_shape: Vec<(String, Vec<u64>)>,
}

/// Why an `--input-shape` value does not parse.
#[derive(Debug, thiserror::Error)]
enum InputShapeError {
    #[error("expected NAME=DIMS (e.g. x=1x3x224x224), got {0:?}")]
    NoEquals(String),
    #[error("expected NAME=DIMS, got {0:?}")]
    NoName(String),
    #[error("bad dimension {dim:?} in {text:?}")]
    Dimension { dim: String, text: String },
}

fn parse_input_shape(s: &str) -> Result<(String, Vec<u64>), InputShapeError> {
    let (name, dims) = s
        .rsplit_once('=')
        .ok_or_else(|| InputShapeError::NoEquals(s.to_string()))?;
    if name.is_empty() {
        return Err(InputShapeError::NoName(s.to_string()));
    }
    let dims = if dims.is_empty() || dims == "scalar" {
        vec![]
    } else {
        dims.split(['x', 'X', ','])
            .map(|d| {
                d.trim()
                    .parse::<u64>()
                    .map_err(|_| InputShapeError::Dimension {
                        dim: d.to_string(),
                        text: s.to_string(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?
    };
    Ok((name.to_string(), dims))
}

impl ShapeArgs {
    fn options(&self) -> ImportOptions {
        ImportOptions {
            batch: self.batch,
            input_shapes: self.input_shape.iter().cloned().collect(),
            ..Default::default()
        }
    }
}

/// Import an ONNX model and print (or write) its ppir.
///
/// Printed to standard output, weights with more than 16 elements are shown as `elided`
/// (the text is for reading); with `-o` every weight is written in full, so the file
/// parses back into the same module.
#[derive(clap::Args)]
#[command(after_help = "\
Printed to standard output, weights with more than 16 elements show as `elided` (the text
is for reading); with -o every weight is written in full, so the file parses back into the
same module. Only the first dimension of an input may stay symbolic (`?`, the batch);
bind it with --batch, and give other symbolic dimensions with --input-shape.

Examples:
  ppcc import model.onnx                      print the IR, large weights elided
  ppcc import model.onnx -o model.ppir        write the IR with all weights
  ppcc import model.onnx --batch 8            bind the symbolic batch dimension
  ppcc import bert.onnx --input-shape input_ids=1x128 --input-shape attention_mask=1x128")]
pub struct ImportArgs {
    /// The model: ONNX (external data files are read from its folder), or a StableHLO
    /// module (`.mlir`).
    model: PathBuf,
    /// The trainable arguments of a StableHLO module (`.npz` keyed `arg<i>`).
    #[arg(long, value_name = "P.npz")]
    params: Option<PathBuf>,
    /// Write the IR to this file (all weights in full) instead of printing it.
    #[arg(short, long, value_name = "OUT.ppir")]
    output: Option<PathBuf>,
    #[command(flatten)]
    shapes: ShapeArgs,
    /// Print weights with more than N elements as `elided` (lossy). Default: 16 when
    /// printing to standard output, none with -o.
    #[arg(long, value_name = "N")]
    elide_weights: Option<usize>,
}

pub fn import(a: ImportArgs) -> Result<ExitCode> {
    let (imported, _) =
        ppcc_driver::model::import_model(&a.model, a.params.as_deref(), &a.shapes.options())?;
    let module = &imported.module;
    if let Err(errors) = ppir::verify::verify_module(module) {
        eprintln!("warning: the imported module does not verify:");
        for e in errors.iter().take(20) {
            eprintln!("  {e}");
        }
    }
    let elide = match (&a.output, a.elide_weights) {
        (_, Some(n)) => Some(n),
        (None, None) => Some(16),
        (Some(_), None) => None,
    };
    let text = print_module(
        module,
        &PrintOptions {
            elide_weights_over: elide,
        },
    );
    match &a.output {
        Some(path) => std::fs::write(path, text)
            .with_context(|| format!("cannot write {}", path.display()))?,
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

/// Run a model's forward pass with the reference interpreter.
///
/// Inputs come from an `.npz` file whose keys are the model's input names (f32, f64, f16,
/// i64, i32, i8 or bool arrays); outputs are written to an `.npz` keyed by the model's
/// output names. Input shapes are taken from the arrays; inputs that only feed shapes
/// (e.g. an Expand target) are folded into the model when needed.
#[derive(clap::Args)]
#[command(after_help = "\
Input arrays are keyed by the model's input names (f32, f64, f16, i64, i32, i8 or bool);
their shapes bind the model's symbolic dimensions. Outputs are keyed by output names.
Integer inputs that only feed shapes (e.g. an Expand target) are folded into the model.
With --reference, outputs must satisfy |out - ref| <= atol + rtol * |ref| elementwise.

Examples:
  ppcc eval model.onnx --inputs in.npz -o out.npz
  ppcc eval gpt.onnx --inputs tokens.npz -o logits.npz --batch 2
  ppcc eval examples/gpt.onnx --inputs examples/gpt_io.npz -o out.npz --reference examples/gpt_io.npz

Make inputs with numpy: np.savez('in.npz', x=np.random.rand(1, 784).astype(np.float32))")]
pub struct EvalArgs {
    /// The model: ONNX, or a StableHLO module (`.mlir`; inputs keyed `arg<i>`, outputs
    /// `out<i>`).
    model: PathBuf,
    /// The trainable arguments of a StableHLO module (`.npz` keyed `arg<i>`).
    #[arg(long, value_name = "P.npz")]
    params: Option<PathBuf>,
    /// The inputs, an `.npz` keyed by input name.
    #[arg(long, value_name = "IN.npz")]
    inputs: PathBuf,
    /// Where to write the outputs (`.npz` keyed by output name).
    #[arg(short, long, value_name = "OUT.npz")]
    output: PathBuf,
    #[command(flatten)]
    shapes: ShapeArgs,
    /// Keep every float in f64 instead of rounding to each value's type after each op
    /// (interpreter only).
    #[arg(long, conflicts_with = "target")]
    f64: bool,
    /// Run the model on the reference interpreter or as native code (MLIR → LLVM).
    #[arg(long, value_enum, default_value_t = Target::Interp)]
    target: Target,
    /// Who multiplies matrices under `--target cuda`: `cublas` (the default) or generated
    /// `kernels` (see `ppcc --help`).
    #[arg(long, value_name = "kernels|cublas", value_parser = ["kernels", "cublas"])]
    gpu_gemm: Option<String>,
    /// After the first run, run the forward pass N more times and print its median and
    /// minimum latency (the inputs and weights are passed in each time).
    #[arg(long, value_name = "N", default_value_t = 0)]
    repeat: usize,
    /// Compare the outputs with the arrays of the same names in this `.npz` (e.g.
    /// onnxruntime's outputs) and fail if any element differs by more than
    /// `atol + rtol * |reference|`.
    #[arg(long, value_name = "REF.npz")]
    reference: Option<PathBuf>,
    /// Relative tolerance for --reference.
    #[arg(long, default_value_t = 1e-4, requires = "reference")]
    rtol: f64,
    /// Absolute tolerance for --reference.
    #[arg(long, default_value_t = 1e-5, requires = "reference")]
    atol: f64,
}

fn bind_inputs(
    imported: &Imported,
    inputs: &HashMap<String, ppir::Tensor>,
) -> Result<Vec<ppir::Tensor>> {
    let f = &imported.module.functions[0];
    let mut next_input = imported.inputs.iter();
    let mut args = vec![];
    for &(v, kind) in f.args() {
        match kind {
            ArgKind::Input => {
                let name = next_input
                    .next()
                    .context("argument list does not match the model's inputs")?;
                let t = inputs.get(name).with_context(|| {
                    format!(
                        "the inputs have no array `{name}` (the model's inputs: {})",
                        imported.inputs.join(", ")
                    )
                })?;
                args.push(t.clone());
            }
            ArgKind::Param | ArgKind::State => {
                let name = &f.value(v).name;
                args.push(
                    imported
                        .module
                        .weights
                        .get(name)
                        .with_context(|| format!("no weight `{name}`"))?
                        .clone(),
                );
            }
        }
    }
    Ok(args)
}

/// Import an ONNX model for `eval`: the arrays' shapes bind its symbolic dimensions, and
/// integer inputs that only feed shapes are folded in when needed.
fn import_onnx_for_eval(a: &EvalArgs, inputs: &HashMap<String, ppir::Tensor>) -> Result<Imported> {
    let mut opts = a.shapes.options();
    for (name, t) in inputs {
        opts.input_shapes
            .entry(name.clone())
            .or_insert_with(|| t.shape.iter().map(|&d| d as u64).collect());
    }
    // Arrays for names the model does not have would be reported as unknown inputs.
    let model_inputs = {
        let bytes = std::fs::read(&a.model)
            .with_context(|| format!("cannot read {}", a.model.display()))?;
        let m = ppcc_frontends::onnx::decode_model(&bytes)?;
        m.graph
            .map(|g| g.input.into_iter().map(|v| v.name).collect::<Vec<_>>())
            .unwrap_or_default()
    };
    opts.input_shapes.retain(|k, _| model_inputs.contains(k));
    let imported = match import_onnx_file_full(&a.model, &opts) {
        Ok(m) => m,
        Err(e) if e.is_unsupported() => {
            let ints: HashMap<_, _> = inputs
                .iter()
                .filter(|(k, t)| !t.dtype.is_float() && model_inputs.contains(k))
                .map(|(k, t)| (k.clone(), t.clone()))
                .collect();
            if ints.is_empty() {
                return Err(e.into());
            }
            opts.input_values = ints;
            let m = import_onnx_file_full(&a.model, &opts).map_err(|_| e)?;
            eprintln!("note: integer inputs were folded into the model as constants");
            m
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!("importing {}", a.model.display())))
        }
    };
    Ok(imported)
}

pub fn eval(a: EvalArgs) -> Result<ExitCode> {
    let arrays = npz::read_npz(&a.inputs)?;
    let inputs: HashMap<String, ppir::Tensor> = arrays.into_iter().collect();
    let imported = match ppcc_driver::model::format_of(&a.model) {
        Format::StableHlo => {
            ppcc_driver::model::import_model(&a.model, a.params.as_deref(), &a.shapes.options())?.0
        }
        Format::Onnx => {
            if a.params.is_some() {
                anyhow::bail!(
                    "--params is for StableHLO modules; an ONNX model carries its own weights"
                );
            }
            import_onnx_for_eval(&a, &inputs)?
        }
    };
    let args = bind_inputs(&imported, &inputs)?;
    // Native code does not check indices (token ids, class labels): check them here, for
    // every target.
    let limits = ppcc_runtime::data::index_limits(&imported.module.functions[0]);
    for (&(v, _), t) in imported.module.functions[0].args().iter().zip(&args) {
        let name = &imported.module.functions[0].value(v).name;
        if let Some(l) = limits.get(name) {
            ppcc_runtime::data::check_indices(name, t, l, 0)
                .with_context(|| a.inputs.display().to_string())?;
        }
    }
    let precision = if a.f64 {
        Precision::F64
    } else {
        Precision::Typed
    };
    let f = &imported.module.functions[0];
    let opts = InterpOptions { precision };
    let scratch = ScratchDir::new("eval")?;
    let cuda = a
        .target
        .cuda_with(a.gpu_gemm.as_deref().and_then(ppcc_codegen::GpuGemm::parse))?;
    let mut forward: Box<dyn FnMut() -> Result<Vec<ppir::Tensor>>> = match a.target {
        Target::Interp => Box::new(|| Ok(run_function(f, args.clone(), &opts, None)?)),
        Target::Cpu | Target::Cuda => {
            let t0 = Instant::now();
            let native = build_native(
                &imported.module,
                &[&f.name],
                &scratch.0,
                "the model",
                false,
                cuda.clone(),
            )?;
            eprintln!(
                "generated native code in {:.2} s",
                t0.elapsed().as_secs_f64()
            );
            // Weights go into native buffers once (as a session keeps its initializers);
            // the model's inputs are converted on every call.
            let mut prepared = Vec::new();
            for (i, (&(_, kind), t)) in f.args().iter().zip(&args).enumerate() {
                prepared.push(match kind {
                    ArgKind::Input => None,
                    ArgKind::Param | ArgKind::State => Some(native.prepare(&f.name, i, t)?),
                });
            }
            let args = args.clone();
            Box::new(move || {
                let call_args: Vec<NativeArgRef> = args
                    .iter()
                    .zip(&prepared)
                    .map(|(t, p)| match p {
                        Some(p) => NativeArgRef::Native(p),
                        None => NativeArgRef::Tensor(t),
                    })
                    .collect();
                Ok(native.call_with(&f.name, &call_args, None)?)
            })
        }
    };
    let mut outs = forward()?;
    if a.repeat > 0 {
        let mut times = vec![];
        for _ in 0..a.repeat {
            let t = Instant::now();
            outs = forward()?;
            times.push(t.elapsed().as_secs_f64());
        }
        times.sort_by(f64::total_cmp);
        eprintln!(
            "forward latency (--target {}): median {:.3} ms, min {:.3} ms over {} runs",
            a.target.name(),
            times[times.len() / 2] * 1e3,
            times[0] * 1e3,
            a.repeat
        );
    }
    let named: Vec<(String, ppir::Tensor)> = imported.outputs.iter().cloned().zip(outs).collect();
    npz::write_npz(&a.output, &named)?;
    let Some(reference) = &a.reference else {
        return Ok(ExitCode::SUCCESS);
    };
    let refs: HashMap<String, ppir::Tensor> = npz::read_npz(reference)?.into_iter().collect();
    let tol = Tolerance {
        rtol: a.rtol,
        atol: a.atol,
    };
    let mut ok = true;
    for (name, got) in &named {
        let want = refs
            .get(name)
            .with_context(|| format!("{} has no array `{name}`", reference.display()))?;
        // Compare in the reference's element type (npz has no bf16; f16 may come back as f32).
        let got = if got.dtype != want.dtype && got.dtype.is_float() && want.dtype.is_float() {
            ppir::Tensor {
                dtype: want.dtype,
                ..got.clone()
            }
        } else {
            got.clone()
        };
        match compare(&got, want, tol) {
            Ok((abs, rel)) => println!("output `{name}`: matches the reference (max abs err {abs:.2e}, max rel err {rel:.2e}; rtol {}, atol {})", tol.rtol, tol.atol),
            Err(m) => {
                ok = false;
                println!("output `{name}`: DIFFERS from the reference: {m}");
            }
        }
    }
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_shape_syntax() {
        assert_eq!(
            parse_input_shape("x=1x3x224x224").unwrap(),
            ("x".into(), vec![1, 3, 224, 224])
        );
        assert_eq!(
            parse_input_shape("a/b:0=2,5").unwrap(),
            ("a/b:0".into(), vec![2, 5])
        );
        assert_eq!(parse_input_shape("s=").unwrap(), ("s".into(), vec![]));
        assert!(parse_input_shape("x").is_err());
        assert!(parse_input_shape("x=1xq").is_err());
    }
}
