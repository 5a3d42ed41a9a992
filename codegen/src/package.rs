//! Building the native module of a set of ppir functions: lowering, the MLIR pipeline,
//! object code and the shared object, with errors that name the function.

use std::path::{Path, PathBuf};
use std::time::Instant;

use ppir::{Function, Module};

use crate::compile::{compile_to_shared_object, CompileError, CompileOptions};
use crate::gpu::CudaOptions;
use crate::lower::{lower_functions_with, LowerError, LowerOptions};

/// A failure to build native code, with what was being built.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    #[error("generating code for {what}")]
    Lower {
        what: String,
        #[source]
        source: Box<LowerError>,
    },
    #[error("generating code for {what}{}", function.as_ref().map(|f| format!(", function @{f}")).unwrap_or_default())]
    Compile {
        what: String,
        /// The function the first MLIR diagnostic points into, when there is one.
        function: Option<String>,
        #[source]
        source: Box<CompileError>,
    },
}

/// Options of [`build_module`].
#[derive(Clone, Debug, Default)]
pub struct BuildOptions {
    /// Also write the module after every pass of the pipeline to `<dir>/mlir/` and the
    /// LLVM dialect / LLVM IR next to the object.
    pub keep_mlir: bool,
    /// Time every op call (see [`LowerOptions::profile_ops`]); for measuring, not for
    /// training runs.
    pub profile_ops: bool,
    /// Generate a CUDA module (PTX kernels and the host code that launches them).
    pub cuda: Option<CudaOptions>,
    /// Generate CPU code from the loops the CUDA target turns into kernels (every op kept
    /// in `linalg`, tiled and mapped as for the GPU, then run as host loops), with the
    /// matrix products as that target would compute them (`Some(GpuGemm::Cublas)`: its
    /// cuBLAS form, the support library's GEMM standing in): how the tests check the GPU
    /// lowering's numerics, op by op and on whole models, without a GPU.
    pub cuda_loops_on_cpu: Option<crate::gpu::GpuGemm>,
}

/// What [`build_module`] wrote.
#[derive(Clone, Debug)]
pub struct Built {
    pub so: PathBuf,
    pub mlir: PathBuf,
    pub seconds: f64,
}

/// Lower `functions` of `m` (all when empty) into `dir/stage.mlir` and compile them into
/// `dir/module.so`. `what` names the module in errors ("stage 1").
pub fn build_module(
    m: &Module,
    functions: &[&str],
    dir: &Path,
    what: &str,
    opts: &BuildOptions,
) -> Result<Built, CodegenError> {
    let t0 = Instant::now();
    let fs: Vec<&Function> = if functions.is_empty() {
        m.functions.iter().collect()
    } else {
        m.functions
            .iter()
            .filter(|f| functions.contains(&f.name.as_str()))
            .collect()
    };
    let gemm = match (&opts.cuda, opts.cuda_loops_on_cpu) {
        (Some(c), _) => Some(c.gemm),
        (None, g) => g,
    };
    let gpu_gemm = gemm == Some(crate::gpu::GpuGemm::Cublas);
    let lopts = LowerOptions {
        profile_ops: opts.profile_ops,
        library_calls: gemm.is_none() || gpu_gemm,
        gpu_gemm,
    };
    let (mlir, sigs) = lower_functions_with(&fs, &lopts).map_err(|source| CodegenError::Lower {
        what: what.to_string(),
        source: Box::new(source),
    })?;
    let mut copts = CompileOptions {
        keep_intermediates: opts.keep_mlir,
        keep_passes: opts.keep_mlir.then(|| dir.join("mlir")),
        cuda: opts.cuda.clone(),
        ..Default::default()
    };
    if opts.cuda.is_none() && opts.cuda_loops_on_cpu.is_some() {
        copts.pipeline = crate::compile::cpu_gpu_loops_pipeline();
    }
    let so = compile_to_shared_object(&mlir, &sigs, dir, &copts).map_err(|source| {
        CodegenError::Compile {
            what: what.to_string(),
            function: function_at_diagnostic(&mlir, &source.to_string(), &fs),
            source: Box::new(source),
        }
    })?;
    Ok(Built {
        so,
        mlir: dir.join("stage.mlir"),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// The ppir function whose MLIR text holds the first location of an MLIR diagnostic: a
/// `loc("node")` the lowering put on the op (the first line that carries it), else a
/// `:<line>:<col>` of the text we generated.
fn function_at_diagnostic(mlir: &str, diag: &str, fs: &[&Function]) -> Option<String> {
    let named = diag.find("loc(\"").and_then(|start| {
        let end = diag[start..].find("\")")? + start + 2;
        let loc = &diag[start..end];
        mlir.lines().position(|l| l.contains(loc)).map(|i| i + 1)
    });
    let line = match named {
        Some(l) => Some(l),
        None => line_of(diag),
    }?;
    let mut current = None;
    for (i, l) in mlir.lines().enumerate() {
        if let Some(rest) = l.trim_start().strip_prefix("func.func @") {
            let sym: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            current = fs
                .iter()
                .find(|f| ppir::abi::mangle(&f.name) == sym)
                .map(|f| f.name.clone());
        }
        if i + 1 == line {
            return current;
        }
    }
    None
}

/// The line of the first `:<line>:<col>` in a diagnostic.
fn line_of(diag: &str) -> Option<usize> {
    diag.split(':')
        .zip(diag.split(':').skip(1))
        .find_map(|(a, b)| {
            let a = a.rsplit(|c: char| !c.is_ascii_digit()).next()?;
            if a.is_empty() || !a.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            let b: String = b.chars().take_while(|c| c.is_ascii_digit()).collect();
            (!b.is_empty()).then(|| a.parse::<usize>().ok()).flatten()
        })
}
