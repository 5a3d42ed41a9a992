//! `ppcc-opt`: run ppcc passes on textual IR, one at a time or in a pipeline.
//!
//! Reads a `.ppir` file, verifies it, runs the passes named by `--pass` in order (verifying
//! after each), and prints the result. Every pass of the compiler is usable alone this way,
//! which is how the lit tests under `lit/` exercise them. `--load-pass-plugin LIB.so` adds
//! the passes of a plugin (see `docs/plugins.md`) to those `--pass` can name.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ppcc_codegen::LowerError;
use ppcc_passes::plugin::{PassOrigin, PluginError};
use ppcc_passes::{PassError, PassManager, PassRegistry};
use ppir::text::{parse_module, print_module, ParseError, PrintOptions};

/// The codegen lowering, offered as the last "pass" (it leaves ppir for MLIR).
const LOWER_TO_MLIR: &str = "lower-to-mlir";

#[derive(Parser)]
#[command(
    name = "ppcc-opt",
    version,
    about = "Run ppcc passes on textual IR (.ppir) and print the result",
    after_help = "Examples:\n  ppcc-opt model.ppir --pass canonicalize\n  ppcc-opt stage.ppir --pass lower-to-mlir\n  ppcc-opt model.ppir --pass bind-batch{size=8} --pass infer-shapes\n  ppcc-opt model.ppir --verify-only\n  ppcc-opt --list-passes\n  ppcc-opt --list-ops\n  ppcc-opt model.ppir --load-pass-plugin target/debug/libppcc_example_plugin.so --pass op-stats"
)]
struct Args {
    /// Input file in ppir text form; `-` reads standard input.
    #[arg(required_unless_present_any = ["list_passes", "list_ops"])]
    file: Option<PathBuf>,

    /// A pass to run, as NAME or NAME{key=value,...}; repeat to build a pipeline.
    #[arg(long = "pass", value_name = "NAME")]
    passes: Vec<String>,

    /// Only parse and verify; print nothing on success.
    #[arg(long)]
    verify_only: bool,

    /// Do not verify the input and the IR after each pass.
    #[arg(long)]
    no_verify: bool,

    /// Write the result here instead of standard output.
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,

    /// Print weights with more than N elements as `elided` (lossy; for reading).
    #[arg(long, value_name = "N")]
    elide_weights: Option<usize>,

    /// List the registered passes (with those of loaded plugins) and exit.
    #[arg(long)]
    list_passes: bool,

    /// Print the op table (each op's family, operands, attributes with kinds and defaults,
    /// gradient support) and exit.
    #[arg(long)]
    list_ops: bool,

    /// Load a pass plugin (a shared library exporting `ppcc_pass_plugin`); its passes can
    /// then be named in --pass. Repeatable.
    #[arg(long = "load-pass-plugin", value_name = "LIB")]
    plugins: Vec<PathBuf>,
}

/// Why `ppcc-opt` failed; printed once, by `main`. `file` is the input as given (`-` for
/// standard input).
#[derive(Debug, thiserror::Error)]
enum OptError {
    #[error("error: {0}")]
    Plugin(PluginError),
    #[error("error: stdin: {0}")]
    Stdin(std::io::Error),
    #[error("error: {file}: {error}")]
    Read { file: String, error: std::io::Error },
    #[error("{file}:{error}")]
    Parse { file: String, error: ParseError },
    #[error("error: --pass {LOWER_TO_MLIR} must be the last pass")]
    LowerNotLast,
    #[error(
        "error: --pass {spec}: expected {LOWER_TO_MLIR} or {LOWER_TO_MLIR}{{target=cpu|cuda}}"
    )]
    LowerOptions { spec: String },
    /// An unknown pass, or bad pass options.
    #[error("error: {0}")]
    Pass(PassError),
    #[error("{file}: error: {error}")]
    Run { file: String, error: PassError },
    #[error("{file}: error: {error}")]
    Kernels {
        file: String,
        error: Box<ppcc_codegen::CompileError>,
    },
    #[error("{file}: error: {error}")]
    Lower {
        file: String,
        error: Box<LowerError>,
    },
    #[error("error: {}: {error}", .path.display())]
    Write {
        path: PathBuf,
        error: std::io::Error,
    },
}

fn main() -> ExitCode {
    ppcc_driver::default_sigpipe();
    ppcc_driver::crash::install("ppcc-opt");
    let args = Args::parse();
    if args.list_ops {
        print!("{}", ppir::ops::table_text());
        return ExitCode::SUCCESS;
    }
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> Result<(), OptError> {
    let mut registry = PassRegistry::builtin();
    for plugin in &args.plugins {
        registry.load_plugin(plugin).map_err(OptError::Plugin)?;
    }
    if args.list_passes {
        for p in registry.list() {
            match &p.origin {
                PassOrigin::Builtin => println!("{:<16} {}", p.name, p.description),
                PassOrigin::Plugin { name, .. } => {
                    println!("{:<16} [plugin {name}] {}", p.name, p.description)
                }
            }
        }
        println!(
            "{:<16} lower every function to MLIR (func/linalg/tensor/arith/math) and print it; must be the last pass; {{target=cuda}}: every op kept in linalg on tensors (no support-library calls), the form the CUDA target turns into kernels; {{target=cuda-kernels}}: that form bufferized, tiled and outlined into gpu.func kernels (before NVVM); {{target=cuda-cublas}}: the form of --gpu-gemm cublas (matrix products' library versions only, C0 broadcast into the result first)",
            LOWER_TO_MLIR
        );
        return Ok(());
    }
    let path = args.file.expect("clap requires FILE unless --list-passes");
    let display = path.display().to_string();
    let file = || display.clone();
    let src = if display == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(OptError::Stdin)?;
        s
    } else {
        std::fs::read_to_string(&path).map_err(|error| OptError::Read {
            file: file(),
            error,
        })?
    };
    let mut module = parse_module(&src).map_err(|error| OptError::Parse {
        file: file(),
        error,
    })?;

    let mut pm = PassManager::new();
    pm.verify_each(!args.no_verify);
    let mut to_mlir = None;
    for (i, spec) in args.passes.iter().enumerate() {
        if let Some(options) = spec.strip_prefix(LOWER_TO_MLIR) {
            let (library_calls, gpu_gemm, kernels) = match options {
                "" | "{target=cpu}" => (true, false, false),
                "{target=cuda}" => (false, false, false),
                "{target=cuda-cublas}" => (true, true, false),
                "{target=cuda-kernels}" => (false, false, true),
                _ => return Err(OptError::LowerOptions { spec: spec.clone() }),
            };
            if i + 1 != args.passes.len() {
                return Err(OptError::LowerNotLast);
            }
            to_mlir = Some((
                ppcc_codegen::lower::LowerOptions {
                    profile_ops: false,
                    library_calls,
                    gpu_gemm,
                },
                kernels,
            ));
            continue;
        }
        pm.add(registry.create(spec).map_err(OptError::Pass)?);
    }
    ppcc_driver::crash::set_step(&format!(
        "running the passes {} on {}",
        args.passes.join(", "),
        file()
    ));
    pm.run(&mut module).map_err(|error| OptError::Run {
        file: file(),
        error,
    })?;
    if args.verify_only {
        return Ok(());
    }
    let text = if let Some((opts, kernels)) = &to_mlir {
        let fs: Vec<&ppir::Function> = module.functions.iter().collect();
        let text = ppcc_codegen::lower::lower_functions_with(&fs, opts)
            .map_err(|error| OptError::Lower {
                file: file(),
                error: Box::new(error),
            })?
            .0;
        if *kernels {
            let copts = ppcc_codegen::CompileOptions {
                pipeline: format!(
                    "builtin.module({})",
                    ppcc_codegen::gpu::kernel_outlining_passes().trim_end_matches(',')
                ),
                // The kernel form of every op, matrix products included.
                cuda: Some(ppcc_codegen::CudaOptions {
                    gemm: ppcc_codegen::GpuGemm::Kernels,
                    ..Default::default()
                }),
                ..Default::default()
            };
            ppcc_codegen::compile::lower_to_llvm_dialect(&text, &copts).map_err(|error| {
                OptError::Kernels {
                    file: file(),
                    error: Box::new(error),
                }
            })?
        } else {
            text
        }
    } else {
        print_module(
            &module,
            &PrintOptions {
                elide_weights_over: args.elide_weights,
            },
        )
    };
    match args.output {
        Some(out) => {
            std::fs::write(&out, text).map_err(|error| OptError::Write { path: out, error })
        }
        None => {
            print!("{text}");
            Ok(())
        }
    }
}
