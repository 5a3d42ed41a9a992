//! MLIR text → LLVM dialect (melior pass pipeline) → LLVM IR → object code (inkwell's
//! `TargetMachine`) → shared object (`cc -shared`).
//!
//! Every MLIR failure (parse, verification, a pass) becomes a [`CompileError`] carrying the
//! diagnostics MLIR reported, captured through a context diagnostic handler.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;

use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target, TargetMachine,
};
use inkwell::OptimizationLevel;
use melior::dialect::DialectRegistry;
use melior::ir::operation::OperationLike;
use melior::ir::Module;
use melior::pass::PassManager;
use melior::utility::{
    parse_pass_pipeline, register_all_dialects, register_all_llvm_translations, register_all_passes,
};
use melior::Context;

use crate::gpu::CudaOptions;
use crate::lower::Signature;
use crate::support_cache::{load_or_build, private_temp_file, resolve_cache_dir, sha256_hex};

/// The passes every target starts with (see [`CPU_PIPELINE`]): bufferization with
/// caller-provided results and every temporary freed.
macro_rules! bufferize_passes {
    () => {
        "cse,\
ppcc-distinct-results,\
one-shot-bufferize{bufferize-function-boundaries function-boundary-type-conversion=identity-layout-map},\
buffer-results-to-out-params{hoist-static-allocs modify-public-functions},\
buffer-deallocation-pipeline,\
scf-forall-to-parallel,"
    };
}
pub(crate) use bufferize_passes;

/// Our step that points calls at the ops' support-library versions ([`crate::library`]),
/// listed among the passes by this name (and written as such with `--keep-mlir`).
const USE_LIBRARY: &str = "ppcc-use-library-routines";
/// Our step that makes the values each function returns pairwise distinct
/// ([`crate::results`]): named in [`bufferize_passes`], right after `cse`.
pub(crate) const DISTINCT_RESULTS: &str = "ppcc-distinct-results";
/// Our step that turns buffer copies into `linalg.copy` on the CUDA target, so that they
/// become kernels instead of host code ([`crate::copies`]): named in
/// [`crate::gpu::gpu_loops_passes`], right after bufferization.
pub(crate) const COPIES_TO_LINALG: &str = "ppcc-copies-to-linalg";
/// Our step that frees each temporary after its last use ([`crate::free_early`]).
const FREE_EARLY: &str = "ppcc-free-after-last-use";

/// The passes that lower host loops and everything else left to the LLVM dialect.
macro_rules! host_to_llvm_passes {
    () => {
        "expand-strided-metadata,\
lower-affine,\
convert-scf-to-cf,\
convert-math-to-llvm,\
convert-math-to-libm,\
convert-to-llvm,\
reconcile-unrealized-casts"
    };
}

/// The default bufferization + lowering pipeline (CPU, scalar loops; matrix products call
/// the support GEMM, [`SUPPORT_C`]).
///
/// - `cse` first: besides merging identical pure ops it erases dead ones, such as a
///   transposed copy that a matrix product reads through its transpose flag instead;
/// - one-shot bufferization across function boundaries with identity layouts, so the C
///   entry's descriptors are plain dense row-major buffers;
/// - `buffer-results-to-out-params{hoist-static-allocs modify-public-functions}`: results become caller-provided
///   output buffers (destination-passing style: the caller owns all memory);
/// - the ownership-based deallocation pipeline frees every temporary;
/// - linalg → loops → cf → LLVM dialect.
pub const CPU_PIPELINE: &str = concat!(
    "builtin.module(",
    bufferize_passes!(),
    "convert-linalg-to-loops,",
    host_to_llvm_passes!(),
    ")"
);

/// [`CPU_PIPELINE`] on the loops the CUDA target turns into kernels: `linalg` becomes
/// `scf.parallel` loops tiled by the thread-block size and mapped to blocks and threads as
/// in [`crate::gpu::cuda_pipeline`], then run on the CPU as ordinary loops (the mapping
/// attributes are ignored). Used with `library_calls` off, it checks on any machine that
/// the loops the kernels are made of compute what the interpreter does.
pub fn cpu_gpu_loops_pipeline() -> String {
    format!(
        "builtin.module({}{})",
        crate::gpu::gpu_loops_passes(),
        host_to_llvm_passes!()
    )
}

#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    #[error("MLIR parse failed:\n{0}")]
    Parse(String),
    #[error("MLIR pass pipeline `{pipeline}` failed:\n{diagnostics}")]
    Pipeline {
        pipeline: String,
        diagnostics: String,
    },
    #[error("MLIR to LLVM IR translation failed:\n{0}")]
    Translate(String),
    #[error("LLVM: {0}")]
    Llvm(String),
    #[error("linking {path}: {message}")]
    Link { path: PathBuf, message: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Unsupported(String),
    #[error("support-object cache {path}: {message}")]
    Cache { path: PathBuf, message: String },
    /// A cache directory that others could write (or that is not ours): linking from it
    /// would run their code.
    #[error("refusing the support-object cache {path}: {why}. Whoever can write there can run code in every module ppcc builds: make it yours and private (chmod 700), or set PPCC_CACHE_DIR to a private directory")]
    UnsafeCache { path: PathBuf, why: String },
}

#[derive(Clone, Debug)]
pub struct CompileOptions {
    pub pipeline: String,
    pub opt_level: OptimizationLevel,
    /// Write `<stem>.llvm.mlir` and `<stem>.ll` next to the object (debugging).
    pub keep_intermediates: bool,
    /// Run the pipeline one pass at a time and write the module after each pass to
    /// `<dir>/NN-<pass>.mlir` (`--keep-mlir`).
    pub keep_passes: Option<PathBuf>,
    /// Generate CUDA kernels (PTX) and host code that launches them instead of CPU code;
    /// `pipeline` is then replaced by [`crate::gpu::cuda_pipeline`].
    pub cuda: Option<CudaOptions>,
    /// CPU code: call the support library's routines where the lowering wrote an op's
    /// version that does ([`crate::library`]); `false` runs every op as its `linalg` loops.
    /// Default: on, unless `PPCC_LIBRARY=off`.
    pub library: bool,
}

impl Default for CompileOptions {
    fn default() -> Self {
        CompileOptions {
            pipeline: std::env::var("PPCC_MLIR_PIPELINE")
                .unwrap_or_else(|_| CPU_PIPELINE.to_string()),
            opt_level: OptimizationLevel::Aggressive,
            keep_intermediates: false,
            keep_passes: None,
            cuda: None,
            library: std::env::var("PPCC_LIBRARY").map_or(true, |v| v != "off"),
        }
    }
}

/// A context with every dialect and LLVM translation registered, and a diagnostic sink.
pub(crate) fn new_context() -> (Context, Rc<RefCell<Vec<String>>>) {
    static PASSES: std::sync::Once = std::sync::Once::new();
    PASSES.call_once(register_all_passes);
    let registry = DialectRegistry::new();
    register_all_dialects(&registry);
    let context = Context::new();
    context.append_dialect_registry(&registry);
    context.load_all_available_dialects();
    register_all_llvm_translations(&context);
    let sink = Rc::new(RefCell::new(Vec::new()));
    let s = sink.clone();
    context.attach_diagnostic_handler(move |d| {
        let mut text = format!("{}: {}", d.location(), d);
        for i in 0..d.note_count() {
            if let Ok(n) = d.note(i) {
                text.push_str(&format!("\n  note: {}: {}", n.location(), n));
            }
        }
        s.borrow_mut().push(text);
        true
    });
    (context, sink)
}

fn drain(sink: &Rc<RefCell<Vec<String>>>) -> String {
    std::mem::take(&mut *sink.borrow_mut()).join("\n")
}

/// Run the pipeline on `mlir` and return the module in the LLVM dialect (text).
pub fn lower_to_llvm_dialect(mlir: &str, opts: &CompileOptions) -> Result<String, CompileError> {
    let (context, sink) = new_context();
    let module = parse_and_lower(&context, &sink, mlir, opts)?;
    Ok(module.as_operation().to_string())
}

fn parse_and_lower<'c>(
    context: &'c Context,
    sink: &Rc<RefCell<Vec<String>>>,
    mlir: &str,
    opts: &CompileOptions,
) -> Result<Module<'c>, CompileError> {
    let mut module =
        Module::parse(context, mlir).ok_or_else(|| CompileError::Parse(drain(sink)))?;
    if !module.as_operation().verify() {
        return Err(CompileError::Parse(drain(sink)));
    }
    let run = |pipeline: &str, module: &mut Module<'c>| {
        let pm = PassManager::new(context);
        let fail = |e: melior::Error| CompileError::Pipeline {
            pipeline: pipeline.to_string(),
            diagnostics: format!("{e}\n{}", drain(sink)),
        };
        parse_pass_pipeline(pm.as_operation_pass_manager(), pipeline).map_err(fail)?;
        pm.run(module).map_err(fail)
    };
    // Steps of ours between passes (CPU code): right after bufferization has given every
    // function its final buffer signature, the calls of ops with a support-library version
    // go to it (`library`) and `symbol-dce` drops the unused `linalg` versions; right after
    // the deallocation pipeline placed the frees, each temporary is freed after its last
    // use (`free_early`).
    let mut passes = pipeline_passes(&opts.pipeline);
    let cpu = opts.cuda.is_none();
    // The CUDA target swaps in library versions only for cuBLAS (then the lowering wrote
    // GEMM-only ones, [`crate::lower::LowerOptions::gpu_gemm`]), and names the GPU's GEMM.
    let gpu_gemm = opts.cuda.as_ref().is_some_and(|c| c.uses_cublas());
    if cpu || gpu_gemm {
        if let Some(at) = passes
            .iter()
            .position(|p| p.starts_with("buffer-results-to-out-params"))
        {
            // Without the library the `__lib` versions are the ones no call reaches.
            passes.insert(at + 1, "symbol-dce".to_string());
            if opts.library {
                passes.insert(at + 1, USE_LIBRARY.to_string());
            }
        }
    }
    let free_after = passes
        .iter()
        .position(|p| p == "buffer-deallocation-pipeline")
        .filter(|_| cpu);
    let is_ours = |p: &str| {
        p == USE_LIBRARY
            || p == DISTINCT_RESULTS
            || p == COPIES_TO_LINALG
            || p == crate::tiling::TILE_LOOPS
    };
    let ours = |pass: &str, module: &mut Module<'c>| -> Result<(), CompileError> {
        // A step of ours that failed, with its own message first when it has one.
        let failed = |message: Option<String>| CompileError::Pipeline {
            pipeline: format!("ppcc {pass}"),
            diagnostics: match message {
                Some(m) => format!("{m}\n{}", drain(sink)),
                None => drain(sink),
            },
        };
        if pass == crate::tiling::TILE_LOOPS {
            crate::tiling::tile_parallel_loops(context.to_raw(), module.as_operation().to_raw())
                .map_err(|e| failed(Some(e)))?;
        } else if pass == COPIES_TO_LINALG {
            // `PPCC_GPU_COPIES=host` keeps them host copies (the GPU check's baseline).
            if std::env::var("PPCC_GPU_COPIES").map_or(true, |v| v != "host") {
                crate::copies::copies_to_linalg(module.as_operation().to_raw())
                    .map_err(|e| failed(Some(e)))?;
            }
        } else if pass == DISTINCT_RESULTS {
            crate::results::distinct_results(module.as_operation().to_raw())
                .map_err(|e| failed(Some(e)))?;
        } else if pass == USE_LIBRARY {
            let m = module.as_operation().to_raw();
            crate::library::use_library_routines(m);
            if gpu_gemm {
                for f in ["sgemm", "dgemm", "sgemm_batched", "dgemm_batched"] {
                    crate::library::rename_callee(
                        m,
                        &format!("ppcc_{f}"),
                        &format!("ppcc_gpu_{f}"),
                    );
                }
            }
        } else {
            crate::free_early::free_after_last_use(module.as_operation().to_raw());
        }
        if module.as_operation().verify() {
            Ok(())
        } else {
            Err(failed(None))
        }
    };
    match &opts.keep_passes {
        None => {
            // MLIR's passes in runs between our steps.
            let mut run_from = 0;
            for i in 0..passes.len() {
                let ours_here = is_ours(&passes[i]);
                if ours_here || Some(i) == free_after || i + 1 == passes.len() {
                    let end = if ours_here { i } else { i + 1 };
                    if end > run_from {
                        run(
                            &format!("builtin.module({})", passes[run_from..end].join(",")),
                            &mut module,
                        )?;
                    }
                    if ours_here {
                        ours(&passes[i], &mut module)?;
                    } else if Some(i) == free_after {
                        ours(FREE_EARLY, &mut module)?;
                    }
                    run_from = i + 1;
                }
            }
        }
        Some(dir) => {
            create_dir(dir)?;
            write_file(&dir.join("00-input.mlir"), mlir)?;
            for (i, pass) in passes.iter().enumerate() {
                if is_ours(pass) {
                    ours(pass, &mut module)?;
                } else {
                    run(&format!("builtin.module({pass})"), &mut module)?;
                }
                if Some(i) == free_after {
                    ours(FREE_EARLY, &mut module)?;
                }
                let stem: String = pass
                    .chars()
                    .take_while(|c| *c != '{')
                    .map(|c| {
                        if c.is_ascii_alphanumeric() || c == '-' {
                            c
                        } else {
                            '_'
                        }
                    })
                    .collect();
                write_file(
                    &dir.join(format!("{:02}-{stem}.mlir", i + 1)),
                    module.as_operation().to_string(),
                )?;
            }
        }
    }
    Ok(module)
}

/// The top-level passes of `builtin.module(a,b{x y},c)`: `["a", "b{x y}", "c"]`.
pub fn pipeline_passes(pipeline: &str) -> Vec<String> {
    let inner = pipeline
        .trim()
        .strip_prefix("builtin.module(")
        .and_then(|s| s.strip_suffix(')'))
        .unwrap_or(pipeline);
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in inner.chars() {
        match c {
            '{' | '(' => depth += 1,
            '}' | ')' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            out.push(std::mem::take(&mut cur).trim().to_string());
        } else {
            cur.push(c);
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_string());
    }
    out
}

/// The host target machine (host CPU and features, PIC for shared objects).
///
/// `portable`: the baseline of the host architecture instead of this machine's CPU (a CUDA
/// module's host code runs on the GPU machine's CPU, which need not be this one).
fn host_target_machine(
    opt: OptimizationLevel,
    portable: bool,
) -> Result<TargetMachine, CompileError> {
    Target::initialize_native(&InitializationConfig::default()).map_err(CompileError::Llvm)?;
    let triple = TargetMachine::get_default_triple();
    let target = Target::from_triple(&triple).map_err(|e| CompileError::Llvm(e.to_string()))?;
    let host_cpu = TargetMachine::get_host_cpu_name();
    let (cpu, mut features) = if portable {
        ("generic".to_string(), String::new())
    } else {
        (
            host_cpu.to_str().unwrap_or("generic").to_string(),
            TargetMachine::get_host_cpu_features()
                .to_str()
                .unwrap_or("")
                .to_string(),
        )
    };
    // The loops linalg leaves have short, fully unrolled inner loops (a softmax row of 16);
    // with gathers allowed LLVM vectorises the outer loop with gather/scatter, several
    // times slower than the contiguous SLP-vectorised inner body it makes without them.
    if triple.as_str().to_string_lossy().starts_with("x86_64") {
        features.push_str(",+prefer-no-gather,+prefer-no-scatter");
    }
    target
        .create_target_machine(
            &triple,
            &cpu,
            &features,
            opt,
            RelocMode::PIC,
            CodeModel::Default,
        )
        .ok_or_else(|| CompileError::Llvm(format!("no target machine for {triple}")))
}

/// Compile MLIR text (func/linalg/tensor/arith/math), as [`crate::lower`] writes it for the
/// functions `sigs`, to an object file at `obj` with the `ppcc_call_<name>` entries.
pub fn compile_to_object(
    mlir: &str,
    sigs: &[Signature],
    obj: &Path,
    opts: &CompileOptions,
) -> Result<(), CompileError> {
    compile_to_object_with(mlir, sigs, obj, opts, |_| Ok(()))
}

/// [`compile_to_object`] with `inspect` called on the module in the LLVM dialect (the CUDA
/// target takes its kernels' PTX from there).
fn compile_to_object_with(
    mlir: &str,
    sigs: &[Signature],
    obj: &Path,
    opts: &CompileOptions,
    inspect: impl FnOnce(&str) -> Result<(), CompileError>,
) -> Result<(), CompileError> {
    let (context, sink) = new_context();
    let module = parse_and_lower(&context, &sink, mlir, opts)?;
    let text = module.as_operation().to_string();
    inspect(&text)?;
    if opts.keep_intermediates {
        write_file(&obj.with_extension("llvm.mlir"), &text)?;
    }
    drop(text);
    let llvm_ctx = inkwell::context::Context::create();
    // SAFETY: the MLIR module is valid and in the LLVM dialect; the returned module
    // belongs to `llvm_ctx` and is owned (disposed) by the inkwell wrapper.
    let raw = unsafe {
        mlir_sys::mlirTranslateModuleToLLVMIR(module.as_operation().to_raw(), llvm_ctx.raw() as _)
    };
    if raw.is_null() {
        return Err(CompileError::Translate(drain(&sink)));
    }
    let llvm_module = unsafe { inkwell::module::Module::new(raw as _) };
    add_entries(&llvm_ctx, &llvm_module, sigs)?;
    // The host code's temporaries: in CUDA modules they are read and written by kernels,
    // so they come from the runtime's device-addressable allocator (`gpu_shim.c`); in CPU
    // modules from the C heap through support.c's counting wrappers (the runtime reports
    // the peak per call).
    let allocator = if opts.cuda.is_some() {
        [
            ("malloc", "ppcc_gpu_malloc"),
            ("aligned_alloc", "ppcc_gpu_aligned_alloc"),
            ("free", "ppcc_gpu_free"),
        ]
    } else {
        [
            ("malloc", "ppcc_tmp_malloc"),
            ("aligned_alloc", "ppcc_tmp_aligned_alloc"),
            ("free", "ppcc_tmp_free"),
        ]
    };
    for (from, to) in allocator {
        if let Some(f) = llvm_module.get_function(from) {
            f.as_global_value().set_name(to);
        }
    }
    let tm = host_target_machine(opts.opt_level, opts.cuda.is_some())?;
    llvm_module.set_triple(&tm.get_triple());
    llvm_module.set_data_layout(&tm.get_target_data().get_data_layout());
    llvm_module
        .verify()
        .map_err(|e| CompileError::Llvm(format!("invalid LLVM IR: {e}")))?;
    let passes = match opts.opt_level {
        OptimizationLevel::None => "default<O0>",
        OptimizationLevel::Less => "default<O1>",
        OptimizationLevel::Default => "default<O2>",
        OptimizationLevel::Aggressive => "default<O3>",
    };
    llvm_module
        .run_passes(passes, &tm, inkwell::passes::PassBuilderOptions::create())
        .map_err(|e| CompileError::Llvm(e.to_string()))?;
    if opts.keep_intermediates {
        llvm_module
            .print_to_file(obj.with_extension("ll"))
            .map_err(|e| {
                CompileError::Llvm(format!(
                    "writing {}: {e}",
                    obj.with_extension("ll").display()
                ))
            })?;
    }
    tm.write_to_file(&llvm_module, FileType::Object, obj)
        .map_err(|e| CompileError::Llvm(format!("writing {}: {e}", obj.display())))?;
    Ok(())
}

/// Add, per function, `void ppcc_call_<name>(void *ctx, void **descriptors)` (calls
/// `_mlir_ciface_<name>(ctx, descriptors[0], ..., descriptors[n-1])`) and
/// `const char *ppcc_sig_<name>(void)` (the [`Signature::text`] it was compiled for).
fn add_entries<'c>(
    ctx: &'c inkwell::context::Context,
    module: &inkwell::module::Module<'c>,
    sigs: &[Signature],
) -> Result<(), CompileError> {
    let ptr = ctx.ptr_type(inkwell::AddressSpace::default());
    let builder = ctx.create_builder();
    let err = |e: inkwell::builder::BuilderError| CompileError::Llvm(e.to_string());
    for sig in sigs {
        let target = module
            .get_function(&format!("_mlir_ciface_{}", sig.symbol()))
            .ok_or_else(|| {
                CompileError::Llvm(format!("no `_mlir_ciface_{}` in the module", sig.symbol()))
            })?;
        let n = sig.inputs.len() + sig.outputs.len();
        if target.count_params() as usize != n + 1 {
            return Err(CompileError::Llvm(format!(
                "`_mlir_ciface_{}` takes {} parameters, expected the context and {n} descriptors",
                sig.symbol(),
                target.count_params()
            )));
        }
        let fty = ctx.void_type().fn_type(&[ptr.into(), ptr.into()], false);
        let f = module.add_function(&ppir::abi::entry_symbol(&sig.name), fty, None);
        builder.position_at_end(ctx.append_basic_block(f, "entry"));
        let c = f.get_nth_param(0).expect("param 0").into_pointer_value();
        let descs = f.get_nth_param(1).expect("param 1").into_pointer_value();
        let mut args: Vec<inkwell::values::BasicMetadataValueEnum> = vec![c.into()];
        for i in 0..n {
            let idx = ctx.i64_type().const_int(i as u64, false);
            // SAFETY: `descs` points at `n` pointers (the ABI); GEP is in bounds.
            let slot =
                unsafe { builder.build_in_bounds_gep(ptr, descs, &[idx], "slot") }.map_err(err)?;
            args.push(builder.build_load(ptr, slot, "desc").map_err(err)?.into());
        }
        builder.build_call(target, &args, "").map_err(err)?;
        builder.build_return(None).map_err(err)?;

        let sfty = ptr.fn_type(&[], false);
        let g = module.add_function(&ppir::abi::signature_symbol(&sig.name), sfty, None);
        builder.position_at_end(ctx.append_basic_block(g, "entry"));
        let text = builder
            .build_global_string_ptr(&sig.text(), &format!("ppcc_sig_text_{}", sig.symbol()))
            .map_err(err)?;
        builder
            .build_return(Some(&text.as_pointer_value()))
            .map_err(err)?;
    }
    Ok(())
}

/// The runtime support code linked into every module (`support.c`): the GEMM that matrix
/// products call (`ppcc_sgemm`, `ppcc_dgemm`), `ppcc_set_num_threads` /
/// `ppcc_get_num_threads`, and `memrefCopy` (what MLIR's `memref.copy` lowering calls for
/// non-contiguous copies), so a module needs none of MLIR's runner libraries.
pub const SUPPORT_C: &str = include_str!("support.c");

/// The support library's C ABI, declared once (`codegen/include/ppcc_support.h`); support.c
/// includes it.
pub const SUPPORT_H: &str = include_str!("../include/ppcc_support.h");

/// build.rs's objects of [`SUPPORT_C`] and [`crate::gpu::GPU_SHIM_C`] for any CPU of the
/// architecture.
static SUPPORT_PORTABLE_O: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/support-portable.o"));
static GPU_SHIM_O: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/gpu-shim.o"));

/// The C objects linked into modules: the host-CPU one compiled once per process and cached
/// per user, the portable ones built by build.rs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CObject {
    /// [`SUPPORT_C`] for this machine's CPU (`-march=native`): CPU modules.
    Support,
    /// [`SUPPORT_C`] for any CPU of the architecture (build.rs): the host code of CUDA
    /// modules, which runs on the GPU machine.
    SupportPortable,
    /// [`crate::gpu::GPU_SHIM_C`] (build.rs): the GPU runtime ABI of CUDA modules.
    GpuShim,
}

impl CObject {
    const ALL: [CObject; 3] = [CObject::Support, CObject::SupportPortable, CObject::GpuShim];

    fn source(self) -> &'static str {
        match self {
            CObject::Support | CObject::SupportPortable => SUPPORT_C,
            CObject::GpuShim => crate::gpu::GPU_SHIM_C,
        }
    }

    /// Compiler flags, tried in order (the portable set when the compiler refuses the
    /// first).
    fn flag_sets(self) -> &'static [&'static [&'static str]] {
        const PORTABLE: &[&str] = &["-O3", "-fPIC", "-std=gnu11"];
        match self {
            CObject::Support => &[&["-O3", "-fPIC", "-march=native", "-std=gnu11"], PORTABLE],
            CObject::SupportPortable | CObject::GpuShim => &[PORTABLE],
        }
    }

    fn stem(self) -> &'static str {
        match self {
            CObject::Support => "support",
            CObject::SupportPortable => "support-portable",
            CObject::GpuShim => "gpu-shim",
        }
    }

    fn index(self) -> usize {
        CObject::ALL.iter().position(|&c| c == self).unwrap_or(0)
    }
}

fn c_compiler() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".to_string())
}

/// The object of [`SUPPORT_C`] for this host, compiled with `$CC` (else `cc`) on first use
/// and cached per user (see [`crate::support_cache`]: `$PPCC_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/ppcc`, else `$HOME/.cache/ppcc`) under a key of the source, the compiler
/// (`--version`), the flags and the host CPU (`-march=native`). The bytes returned have been
/// checked against the SHA-256 recorded beside the cached object.
pub fn support_object() -> Result<&'static [u8], CompileError> {
    c_object(CObject::Support)
}

fn c_object(which: CObject) -> Result<&'static [u8], CompileError> {
    match which {
        CObject::SupportPortable => return Ok(SUPPORT_PORTABLE_O),
        CObject::GpuShim => return Ok(GPU_SHIM_O),
        CObject::Support => {}
    }
    // Only success is kept: an error (say, a cache directory fixed meanwhile) is retried.
    static OBJS: [std::sync::OnceLock<Vec<u8>>; 3] = [const { std::sync::OnceLock::new() }; 3];
    let slot = &OBJS[which.index()];
    if let Some(bytes) = slot.get() {
        return Ok(bytes);
    }
    let bytes = build_c_object(which)?;
    Ok(slot.get_or_init(|| bytes))
}

fn build_c_object(which: CObject) -> Result<Vec<u8>, CompileError> {
    let cc = c_compiler();
    let version = Command::new(&cc)
        .arg("--version")
        .output()
        .map(|o| o.stdout)
        .unwrap_or_default();
    let cpu = TargetMachine::get_host_cpu_name();
    let features = TargetMachine::get_host_cpu_features();
    let flags = format!("{:?}", which.flag_sets());
    let key = sha256_hex(&[
        which.source().as_bytes(),
        SUPPORT_H.as_bytes(),
        cc.as_bytes(),
        &version,
        flags.as_bytes(),
        cpu.to_bytes(),
        features.to_bytes(),
    ]);
    let var = |name: &str| std::env::var_os(name).map(PathBuf::from);
    let dir = resolve_cache_dir(
        var("PPCC_CACHE_DIR").as_deref(),
        var("XDG_CACHE_HOME").as_deref(),
        var("HOME").as_deref(),
    )?;
    let name = format!("{}-{}.o", which.stem(), &key[..32]);
    load_or_build(&dir, &name, || compile_c(&cc, &name, which))
}

/// Compile one of the C sources in a private temporary directory and return the object's
/// bytes.
fn compile_c(cc: &str, name: &str, which: CObject) -> Result<Vec<u8>, CompileError> {
    // support.c includes itself (once per element type), so it is compiled from a file.
    let file = format!("{}.c", which.stem());
    let (scratch, src) = private_temp_file("ppcc-support-", &file, which.source().as_bytes())?;
    let header = scratch.path().join("ppcc_support.h");
    std::fs::write(&header, SUPPORT_H).map_err(|e| CompileError::Write {
        path: header.clone(),
        source: e,
    })?;
    let obj = scratch.path().join("out.o");
    let mut errors = String::new();
    for flags in which.flag_sets() {
        let out = Command::new(cc)
            .args(*flags)
            .arg("-I")
            .arg(scratch.path())
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .output()
            .map_err(|e| CompileError::Link {
                path: PathBuf::from(name),
                message: format!("running `{cc}`: {e}"),
            })?;
        if out.status.success() {
            return std::fs::read(&obj).map_err(|e| CompileError::Link {
                path: obj.clone(),
                message: format!("reading the compiled support code: {e}"),
            });
        }
        errors.push_str(&format!(
            "`{cc} {}`: {}\n",
            flags.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Err(CompileError::Link {
        path: PathBuf::from(name),
        message: format!("compiling the runtime support code failed:\n{errors}"),
    })
}

/// Link objects and the runtime support object ([`support_object`]) into a shared object
/// with the system C compiler (`$CC`, else `cc`). The support object's verified bytes are
/// written to a private temporary file for the linker, so what is linked is what was
/// checked. `cuda`: the host code of a CUDA module (the portable support object and the
/// GPU runtime shim).
pub fn link_shared(objects: &[PathBuf], so: &Path, cuda: bool) -> Result<(), CompileError> {
    let cc = c_compiler();
    let parts: &[CObject] = if cuda {
        &[CObject::SupportPortable, CObject::GpuShim]
    } else {
        &[CObject::Support]
    };
    let mut scratch = Vec::new();
    let mut linked = Vec::new();
    for &p in parts {
        let (dir, path) =
            private_temp_file("ppcc-link-", &format!("{}.o", p.stem()), c_object(p)?)?;
        scratch.push(dir);
        linked.push(path);
    }
    let out = Command::new(&cc)
        .arg("-shared")
        .arg("-o")
        .arg(so)
        .args(objects)
        .args(&linked)
        .arg("-lm")
        .arg("-lpthread")
        .output()
        .map_err(|e| CompileError::Link {
            path: so.to_path_buf(),
            message: format!("running `{cc}`: {e}"),
        })?;
    drop(scratch);
    if !out.status.success() {
        return Err(CompileError::Link {
            path: so.to_path_buf(),
            message: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(())
}

/// `std::fs::write` whose error names the file.
fn write_file(path: &Path, contents: impl AsRef<[u8]>) -> Result<(), CompileError> {
    std::fs::write(path, contents).map_err(|source| CompileError::Write {
        path: path.to_path_buf(),
        source,
    })
}

fn create_dir(path: &Path) -> Result<(), CompileError> {
    std::fs::create_dir_all(path).map_err(|source| CompileError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// MLIR text → `dir/module.so` (with `dir/module.o` beside it). Returns the `.so` path.
pub fn compile_to_shared_object(
    mlir: &str,
    sigs: &[Signature],
    dir: &Path,
    opts: &CompileOptions,
) -> Result<PathBuf, CompileError> {
    create_dir(dir)?;
    write_file(&dir.join("stage.mlir"), mlir)?;
    let obj = dir.join("module.o");
    let so = dir.join("module.so");
    let Some(cuda) = &opts.cuda else {
        compile_to_object(mlir, sigs, &obj, opts)?;
        link_shared(&[obj], &so, false)?;
        return Ok(so);
    };
    // The math library's bitcode lives while the pipeline runs.
    let scratch = tempfile::Builder::new()
        .prefix("ppcc-cuda-")
        .tempdir()
        .map_err(|source| CompileError::Write {
            path: std::env::temp_dir(),
            source,
        })?;
    let lib = crate::gpu::write_math_library(scratch.path())?;
    let copts = CompileOptions {
        pipeline: crate::gpu::cuda_pipeline(cuda, &lib),
        ..opts.clone()
    };
    compile_to_object_with(mlir, sigs, &obj, &copts, |text| {
        write_kernels(dir, &crate::gpu::kernels(text))
    })?;
    link_shared(&[obj], &so, true)?;
    Ok(so)
}

/// Write each kernel module's PTX to `dir/<name>.ptx` (removing those of an earlier build),
/// refusing kernels that call a math function nothing provides.
fn write_kernels(dir: &Path, kernels: &[crate::gpu::Kernel]) -> Result<(), CompileError> {
    for k in kernels {
        let missing = crate::gpu::unresolved(&k.ptx);
        if !missing.is_empty() {
            let what: Vec<String> = missing
                .iter()
                .map(|m| crate::gpu::describe_unresolved(m))
                .collect();
            return Err(CompileError::Unsupported(format!(
                "kernel `{}` needs {}, which the CUDA target does not provide",
                k.name,
                what.join(", ")
            )));
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.path().extension().is_some_and(|x| x == "ptx") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    for k in kernels {
        write_file(&dir.join(format!("{}.ptx", k.name)), &k.ptx)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use melior::ir::block::BlockLike;
    use melior::ir::operation::{OperationLike, OperationRef};
    use melior::ir::RegionLike;

    /// `(op name, location)` of every op nested in `op`.
    fn locations(op: OperationRef, out: &mut Vec<(String, String)>) {
        for region in op.regions() {
            let mut block = region.first_block();
            while let Some(b) = block {
                let mut next = b.first_operation();
                while let Some(o) = next {
                    out.push((
                        o.name().as_string_ref().as_str().unwrap_or("?").to_string(),
                        o.location().to_string(),
                    ));
                    locations(o, out);
                    next = o.next_in_block();
                }
                block = b.next_in_region();
            }
        }
    }

    /// Every op of the lowered MLIR carries the location of the ppir op (the ONNX node) it
    /// came from, or its function's name: none is left with a position in the generated
    /// text, so MLIR's diagnostics name the node.
    #[test]
    fn every_mlir_op_carries_its_node_name() {
        let src = r#"module {
  func @main(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %b: tensor<16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
    %g = "pp.gemm"(%x, %w, %b) {alpha = 1.0, beta = 1.0, trans_a = 0, trans_b = 1} : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<16xf32>) -> tensor<4x16xf32> loc("fc/Gemm")
    %r = "pp.relu"(%g) : (tensor<4x16xf32>) -> tensor<4x16xf32> loc("act \"1\"\\x")
    %s = "pp.softmax"(%r) {axis = -1} : (tensor<4x16xf32>) -> tensor<4x16xf32> loc("head/Softmax")
    %t = "pp.relu"(%s) : (tensor<4x16xf32>) -> tensor<4x16xf32>
    return %s, %t : tensor<4x16xf32>, tensor<4x16xf32>
  }
}
"#;
        let m = ppir::text::parse_module(src).unwrap();
        for (library_calls, gpu_gemm) in [(true, false), (false, false), (true, true)] {
            let opts = crate::lower::LowerOptions {
                profile_ops: false,
                library_calls,
                gpu_gemm,
            };
            let f = &m.functions[0];
            let (text, _) = crate::lower::lower_functions_with(&[f], &opts).unwrap();
            let (context, sink) = new_context();
            let module = Module::parse(&context, &text)
                .unwrap_or_else(|| panic!("{}\n{text}", drain(&sink)));
            let mut locs = Vec::new();
            locations(module.as_operation(), &mut locs);
            assert!(locs.len() > 10, "{locs:?}");
            let allowed = [
                "loc(\"fc/Gemm\")",
                "loc(\"head/Softmax\")",
                "loc(\"main: %t\")",
                "loc(\"main\")",
                "loc(\"ppcc runtime support\")",
            ];
            for (name, loc) in &locs {
                // The implicit bodies of named ops (`linalg.fill`) are built by MLIR.
                let implicit = name == "linalg.yield" && loc == "loc(unknown)";
                let ok = allowed.contains(&loc.as_str())
                    || implicit
                    || (loc.starts_with("loc(\"act ") && loc.contains('1'));
                assert!(
                    ok,
                    "{name} at {loc} (library calls: {library_calls})\n{text}"
                );
            }
            for want in &allowed[..4] {
                assert!(
                    locs.iter().any(|(_, l)| l == want),
                    "no op at {want}: {locs:?}"
                );
            }
        }
    }

    /// The CPU pipeline calls an op's support-library version (`__lib`) after
    /// bufferization and drops the `linalg` one; with the library off the `linalg` loops
    /// stay and nothing calls the library.
    #[test]
    fn library_versions_replace_linalg_after_bufferization() {
        let src = r#"module {
  func @main(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %b: tensor<16xf32>) -> (tensor<4x16xf32>) {
    %g = "pp.gemm"(%x, %w, %b) {alpha = 1.0, beta = 1.0, trans_a = 0, trans_b = 1} : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<16xf32>) -> tensor<4x16xf32> loc("fc/Gemm")
    %r = "pp.relu"(%g) : (tensor<4x16xf32>) -> tensor<4x16xf32> loc("act")
    %s = "pp.softmax"(%r) {axis = -1} : (tensor<4x16xf32>) -> tensor<4x16xf32> loc("head/Softmax")
    return %s : tensor<4x16xf32>
  }
}
"#;
        let m = ppir::text::parse_module(src).unwrap();
        let (text, _) = crate::lower::lower_functions(&[&m.functions[0]]).unwrap();
        assert!(
            text.contains("func.func private @main__op0__lib("),
            "{text}"
        );
        assert!(
            text.contains("func.func private @main__op2__lib("),
            "{text}"
        );
        assert!(!text.contains("@main__op1__lib"), "{text}");
        let on = CompileOptions {
            library: true,
            ..Default::default()
        };
        let llvm = lower_to_llvm_dialect(&text, &on).unwrap();
        for (f, lib) in [
            ("main__op0", true),
            ("main__op1", false),
            ("main__op2", true),
        ] {
            let (kept, dropped) = if lib {
                (format!("{f}__lib"), f.to_string())
            } else {
                (f.to_string(), format!("{f}__lib"))
            };
            assert!(
                llvm.contains(&format!("llvm.call @{kept}(")),
                "{kept}: {llvm}"
            );
            assert!(
                !llvm.contains(&format!("llvm.func @{dropped}(")),
                "{dropped}: {llvm}"
            );
        }
        assert!(llvm.contains("ppcc_sgemm") && llvm.contains("ppcc_softmax_f32"));
        let off = CompileOptions {
            library: false,
            ..Default::default()
        };
        let llvm = lower_to_llvm_dialect(&text, &off).unwrap();
        assert!(llvm.contains("llvm.call @main__op0("), "{llvm}");
        assert!(!llvm.contains("llvm.call @main__op0__lib("), "{llvm}");
        assert!(!llvm.contains("llvm.call @ppcc_sgemm"), "{llvm}");
    }

    /// The parameter types of each function `ppcc_support.h` declares, as LLVM types.
    fn header_prototypes() -> std::collections::HashMap<String, Vec<&'static str>> {
        let text: String = SUPPORT_H
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        // Drop comments, then split into declarations at `;`.
        let mut plain = String::new();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("/*") {
            plain.push_str(&rest[..i]);
            rest = rest[i..].find("*/").map_or("", |j| &rest[i + j + 2..]);
        }
        plain.push_str(rest);
        let llvm = |c: &str| -> &'static str {
            let c = c.trim();
            if c.contains('*') {
                return "!llvm.ptr";
            }
            let ty = c.rsplit_once(' ').map_or(c, |(t, _)| t).trim();
            match ty {
                "int64_t" | "uint64_t" | "size_t" => "i64",
                "int" => "i32",
                "float" => "f32",
                "double" => "f64",
                other => panic!("type `{other}` in ppcc_support.h"),
            }
        };
        let mut out = std::collections::HashMap::new();
        for decl in plain.split(';') {
            let Some((head, params)) = decl.split_once('(') else {
                continue;
            };
            let Some(name) = head.split_whitespace().last() else {
                continue;
            };
            let name = name.trim_start_matches('*');
            if !name.starts_with("ppcc_") {
                continue;
            }
            let params = params.trim().trim_end_matches(')');
            let tys: Vec<&'static str> = if params.trim() == "void" {
                vec![]
            } else {
                params.split(',').map(llvm).collect()
            };
            out.insert(name.to_string(), tys);
        }
        out
    }

    /// Every support-library function the lowering declares in MLIR has the parameters the
    /// header declares: the ABI is written once, in C, and the generated calls follow it.
    #[test]
    fn support_declarations_match_the_header() {
        let src = r#"module {
  func @main(%x: tensor<4x8xf32>, %w: tensor<16x8xf32>, %b: tensor<16xf32>, %xd: tensor<4x8xf64>, %wd: tensor<8x3xf64>) -> (tensor<4x16xf32>, tensor<4x16xf32>, tensor<4x3xf64>) {
    %g = "pp.gemm"(%x, %w, %b) {trans_b = 1} : (tensor<4x8xf32>, tensor<16x8xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    %s = "pp.softmax"(%g) {axis = -1} : (tensor<4x16xf32>) -> tensor<4x16xf32>
    %l = "pp.layer_norm"(%g, %b, %b) {axis = -1} : (tensor<4x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    %d = "pp.matmul"(%xd, %wd) : (tensor<4x8xf64>, tensor<8x3xf64>) -> tensor<4x3xf64>
    return %s, %l, %d : tensor<4x16xf32>, tensor<4x16xf32>, tensor<4x3xf64>
  }
}
"#;
        let m = ppir::text::parse_module(src).unwrap();
        let opts = crate::lower::LowerOptions {
            profile_ops: true,
            library_calls: true,
            gpu_gemm: false,
        };
        let (mut text, _) = crate::lower::lower_functions_with(&[&m.functions[0]], &opts).unwrap();
        // The CUDA target's cuBLAS form declares the batched GEMMs.
        let batched = r#"module {
  func @main(%a: tensor<2x3x4x8xf32>, %b: tensor<2x3x8x5xf32>, %c: tensor<3x4x8xf64>, %d: tensor<3x8x2xf64>) -> (tensor<2x3x4x5xf32>, tensor<3x4x2xf64>) {
    %p = "pp.matmul"(%a, %b) : (tensor<2x3x4x8xf32>, tensor<2x3x8x5xf32>) -> tensor<2x3x4x5xf32>
    %q = "pp.matmul"(%c, %d) : (tensor<3x4x8xf64>, tensor<3x8x2xf64>) -> tensor<3x4x2xf64>
    return %p, %q : tensor<2x3x4x5xf32>, tensor<3x4x2xf64>
  }
}
"#;
        let bm = ppir::text::parse_module(batched).unwrap();
        let gpu = crate::lower::LowerOptions {
            gpu_gemm: true,
            ..opts
        };
        text += &crate::lower::lower_functions_with(&[&bm.functions[0]], &gpu)
            .unwrap()
            .0;
        let header = header_prototypes();
        let mut seen = Vec::new();
        for line in text.lines() {
            let Some(rest) = line.trim_start().strip_prefix("llvm.func @") else {
                continue;
            };
            let (name, rest) = rest.split_once('(').unwrap();
            let params = rest.split_once(')').unwrap().0;
            let tys: Vec<&str> = if params.is_empty() {
                vec![]
            } else {
                params.split(", ").collect()
            };
            let want = header
                .get(name)
                .unwrap_or_else(|| panic!("@{name} is not declared in ppcc_support.h"));
            assert_eq!(
                &tys, want,
                "@{name}: MLIR declares {tys:?}, the header {want:?}"
            );
            seen.push(name.to_string());
        }
        for f in [
            "ppcc_sgemm",
            "ppcc_dgemm",
            "ppcc_sgemm_batched",
            "ppcc_dgemm_batched",
            "ppcc_softmax_f32",
            "ppcc_layernorm_f32",
            "ppcc_prof_begin",
            "ppcc_prof_end",
        ] {
            assert!(
                seen.iter().any(|s| s == f),
                "{f} not declared: {seen:?}\n{text}"
            );
        }
    }

    /// A failing pipeline's diagnostic names the node of the op it failed on.
    #[test]
    fn pipeline_diagnostics_name_the_node() {
        let text = "module {\n  func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {\n    %0 = func.call @nowhere(%a) : (tensor<4xf32>) -> tensor<4xf32> loc(\"blocks.3/mlp/Gelu\")\n    return %0 : tensor<4xf32> loc(\"f\")\n  } loc(\"f\")\n}\n";
        let e = lower_to_llvm_dialect(text, &CompileOptions::default()).unwrap_err();
        assert!(e.to_string().contains("blocks.3/mlp/Gelu"), "{e}");
    }
}
