//! The harness shared by every op family's tests.

#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use ppcc_codegen::{
    compile_to_shared_object, lower_functions, lower_functions_with, CompileOptions, GpuGemm,
    LowerOptions,
};
use ppcc_runtime::native::NativeModule;
use ppir::interp::{run_function, Comm, CommError, InterpOptions};
use ppir::{DType, Function, Module, Tensor, TensorData};

/// The code the CPU runs of a lowered module's text: an op function that has a
/// support-library version (`@X__lib`, which the CPU pipeline calls instead after
/// bufferization) without its `linalg` version `@X`.
pub fn cpu_code(text: &str) -> String {
    const SEP: &str = "\n  func.func ";
    let name = |part: &str| -> String {
        let p = part.strip_prefix("private ").unwrap_or(part);
        p.trim_start_matches('@')
            .split('(')
            .next()
            .unwrap_or("")
            .to_string()
    };
    let parts: Vec<&str> = text.split(SEP).collect();
    let names: Vec<String> = parts.iter().map(|p| name(p)).collect();
    let kept: Vec<&str> = parts
        .iter()
        .zip(&names)
        .enumerate()
        .filter(|(i, (_, n))| *i == 0 || !names.contains(&format!("{n}__lib")))
        .map(|(_, (p, _))| *p)
        .collect();
    kept.join(SEP)
}

/// [`cpu_code`] of `f` lowered for the CPU.
pub fn lower_cpu(f: &Function) -> String {
    cpu_code(&ppcc_codegen::lower_function(f).expect("lower").0)
}

pub fn parse(src: &str) -> Module {
    let m = ppir::text::parse_module(src).unwrap_or_else(|e| panic!("parse: {e}\n{src}"));
    ppir::verify::verify_module(&m).unwrap_or_else(|e| panic!("verify: {e:?}\n{src}"));
    m
}

fn lcg(s: &mut u64) -> u64 {
    *s = s
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *s >> 33
}

/// Deterministic f32 values in [-2, 2).
pub fn input(shape: &[usize], seed: u64) -> Tensor {
    uniform(DType::F32, shape, seed, -2.0, 2.0)
}

/// Deterministic floats of `d` in [lo, hi).
pub fn uniform(d: DType, shape: &[usize], seed: u64, lo: f64, hi: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let data = (0..n)
        .map(|_| lo + (lcg(&mut s) as f64 / (1u64 << 31) as f64) * (hi - lo))
        .collect();
    Tensor::from_f64(d, shape.to_vec(), data)
}

/// Deterministic integers of `d` in [lo, hi).
pub fn ints(d: DType, shape: &[usize], seed: u64, lo: i64, hi: i64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_add(0x1234_5678);
    let data = (0..n)
        .map(|_| lo + (lcg(&mut s) % (hi - lo) as u64) as i64)
        .collect();
    Tensor::from_i64(d, shape.to_vec(), data)
}

/// Inputs for every argument of `f` by its type: floats in [-2, 2), integers in [0, 4),
/// bools at random.
pub fn random_inputs(f: &Function, seed: u64) -> Vec<Tensor> {
    f.arg_values()
        .enumerate()
        .map(|(i, v)| {
            let ty = f.ty(v);
            let shape: Vec<usize> = ty
                .static_shape()
                .expect("static argument")
                .into_iter()
                .map(|d| d as usize)
                .collect();
            let s = seed * 1000 + i as u64;
            match ty.dtype {
                d if d.is_float() => uniform(d, &shape, s, -2.0, 2.0),
                DType::Bool => ints(DType::Bool, &shape, s, 0, 2),
                d => ints(d, &shape, s, 0, 4),
            }
        })
        .collect()
}

static CASE: AtomicUsize = AtomicUsize::new(0);

fn case_dir(name: &str) -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    base.join(format!(
        "ppcc-ops-{}-{name}-{}",
        std::process::id(),
        CASE.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A module compiled for the CPU, and the same functions as the loops the CUDA target
/// turns into kernels (every op in `linalg`, tiled and mapped as for the GPU), run on the
/// CPU: every call runs both and checks that they agree (the caller checks the first
/// against the interpreter). Compiling also lowers the module for CUDA (sm_80 and sm_90)
/// and assembles every kernel with `ptxas` ([`check_cuda`]).
pub struct Compiled {
    pub cpu: NativeModule,
    loops: NativeModule,
    loops_dir: PathBuf,
    /// Where the module multiplies matrices: its `--gpu-gemm cublas` form (GEMM-only
    /// library versions, C0 broadcast into the result by a loop nest, every other op as
    /// GPU-mapped loops) run on the CPU, with the support library's GEMM standing in for
    /// cuBLAS under the same in-place contract.
    gemm: Option<(NativeModule, PathBuf)>,
}

impl Compiled {
    /// [`NativeModule::call`] on the CPU module; without a `comm` (which a second run
    /// could not replay) also on the GPU loops, whose results must match within 1e-4 (their
    /// matrix products sum in another order).
    pub fn call<'c>(
        &self,
        function: &str,
        args: &[&Tensor],
        comm: Option<&'c mut (dyn Comm + 'c)>,
    ) -> Result<Vec<Tensor>, ppcc_runtime::native::NativeError> {
        let replay = comm.is_none();
        let got = self.cpu.call(function, args, comm)?;
        if replay {
            let loops = self
                .loops
                .call(function, args, None)
                .unwrap_or_else(|e| panic!("GPU-mapped loops on the CPU: {e}"));
            for (i, (l, c)) in loops.iter().zip(&got).enumerate() {
                assert_close(
                    l,
                    c,
                    1e-4,
                    &format!("@{function} result {i}, GPU-mapped loops vs CPU code"),
                );
            }
            if let Some((gemm, _)) = &self.gemm {
                let g = gemm
                    .call(function, args, None)
                    .unwrap_or_else(|e| panic!("the --gpu-gemm cublas form on the CPU: {e}"));
                for (i, (l, c)) in g.iter().zip(&got).enumerate() {
                    assert_close(
                        l,
                        c,
                        1e-4,
                        &format!("@{function} result {i}, --gpu-gemm cublas form vs CPU code"),
                    );
                }
            }
        }
        Ok(got)
    }

    pub fn path(&self) -> &std::path::Path {
        self.cpu.path()
    }

    pub fn take_op_profile(&self, n: usize) -> Option<Vec<f64>> {
        self.cpu.take_op_profile(n)
    }
}

impl Drop for Compiled {
    fn drop(&mut self) {
        cleanup(std::mem::take(&mut self.loops_dir));
        if let Some((_, dir)) = self.gemm.take() {
            cleanup(dir);
        }
    }
}

/// Lower and compile every function of `m` into one `module.so` and load it (see
/// [`Compiled`]).
pub fn compile(m: &Module) -> (Compiled, PathBuf) {
    let fs: Vec<&Function> = m.functions.iter().collect();
    let (mlir, sigs) = lower_functions(&fs).unwrap_or_else(|e| panic!("lower: {e}"));
    let dir = case_dir(&m.functions[0].name);
    let opts = CompileOptions {
        keep_intermediates: std::env::var_os("PPCC_CODEGEN_KEEP").is_some(),
        ..Default::default()
    };
    let so = compile_to_shared_object(&mlir, &sigs, &dir, &opts)
        .unwrap_or_else(|e| panic!("compile:\n{e}\n--- MLIR ---\n{mlir}"));
    let cpu = NativeModule::load(&so, m, None).unwrap_or_else(|e| panic!("load: {e}"));

    let portable = LowerOptions {
        library_calls: false,
        ..Default::default()
    };
    let (pmlir, psigs) =
        lower_functions_with(&fs, &portable).unwrap_or_else(|e| panic!("lower (portable): {e}"));
    let loops_dir = case_dir(&format!("{}-gpuloops", m.functions[0].name));
    let lopts = CompileOptions {
        pipeline: ppcc_codegen::compile::cpu_gpu_loops_pipeline(),
        ..opts.clone()
    };
    let lso = compile_to_shared_object(&pmlir, &psigs, &loops_dir, &lopts).unwrap_or_else(|e| {
        panic!("compile (GPU-mapped loops on the CPU):\n{e}\n--- MLIR ---\n{pmlir}")
    });
    let loops = NativeModule::load(&lso, m, None).unwrap_or_else(|e| panic!("load: {e}"));
    check_cuda(m, &pmlir, &psigs, GpuGemm::Kernels);
    (
        Compiled {
            cpu,
            loops,
            loops_dir,
            gemm: gemm_form(m, &fs, &lopts),
        },
        dir,
    )
}

/// The `--gpu-gemm cublas` lowering of `fs` compiled with `opts` (the GPU-mapped loops
/// pipeline, whose library step swaps in the GEMM-only versions) and loaded, and the same
/// lowering compiled for CUDA with its GEMMs on cuBLAS ([`check_cuda`]); `None` when no op
/// of `fs` multiplies matrices (the form is then the GPU loops' own).
fn gemm_form(
    m: &Module,
    fs: &[&Function],
    opts: &CompileOptions,
) -> Option<(NativeModule, PathBuf)> {
    let lowering = LowerOptions {
        gpu_gemm: true,
        ..Default::default()
    };
    let (mlir, sigs) =
        lower_functions_with(fs, &lowering).unwrap_or_else(|e| panic!("lower (gpu gemm): {e}"));
    if !mlir.contains("llvm.call @ppcc_sgemm") && !mlir.contains("llvm.call @ppcc_dgemm") {
        return None;
    }
    assert!(
        !mlir.contains("@ppcc_softmax") && !mlir.contains("@ppcc_layernorm"),
        "the cuBLAS form calls only GEMMs:\n{mlir}"
    );
    let dir = case_dir(&format!("{}-gpugemm", m.functions[0].name));
    let so = compile_to_shared_object(&mlir, &sigs, &dir, opts).unwrap_or_else(|e| {
        panic!("compile (--gpu-gemm cublas form on the CPU):\n{e}\n--- MLIR ---\n{mlir}")
    });
    let module = NativeModule::load(&so, m, None).unwrap_or_else(|e| panic!("load: {e}"));
    // Compiled for CUDA and assembled for a fixed quarter of the modules (by their text),
    // which keeps CI inside its time; PPCC_CUDA_ALL_ARCHS=1 checks every one. (`ppcc
    // --target cuda --gpu-gemm cublas` of whole models is checked in cli/tests/cuda.rs.)
    let sampled = mlir
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32))
        % 4
        == 0;
    if sampled || std::env::var_os("PPCC_CUDA_ALL_ARCHS").is_some() {
        check_cuda(m, &mlir, &sigs, GpuGemm::Cublas);
    }
    Some((module, dir))
}

/// `ptxas`: `$PPCC_PTXAS`, else the one of the test venv (PyPI `nvidia-cuda-nvcc-cu12`),
/// else `ptxas` on PATH. `None` when there is none (then [`check_cuda`] only compiles,
/// unless `CI` is set: CI must assemble).
pub fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PPCC_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../.venv/lib/python3.11/site-packages/nvidia/cuda_nvcc/bin/ptxas");
    if venv.exists() {
        return Some(venv);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("ptxas"))
        .find(|p| p.exists())
}

/// Compile the portable lowering `mlir` of `m` for CUDA (sm_80 and sm_90) and assemble
/// every kernel's PTX with `ptxas` for its architecture.
pub fn check_cuda(m: &Module, mlir: &str, sigs: &[ppcc_codegen::Signature], gemm: GpuGemm) {
    let ptxas = ptxas();
    if ptxas.is_none() && std::env::var_os("CI").is_some() {
        panic!("ptxas not found (install nvidia-cuda-nvcc-cu12 in .venv, or set PPCC_PTXAS)");
    }
    // Every case for sm_90 (the default); sm_80 differs only in the target chip and PTX
    // version, so a fixed quarter of the cases (by name) checks it, which keeps CI inside
    // its time (PPCC_CUDA_ALL_ARCHS=1 checks every case on both).
    let name = &m.functions[0].name;
    let sample = name
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(b as u32))
        % 4
        == 0;
    let all = std::env::var_os("PPCC_CUDA_ALL_ARCHS").is_some();
    let archs: &[&str] = if sample || all {
        &["sm_80", "sm_90"]
    } else {
        &["sm_90"]
    };
    for &arch in archs {
        let dir = case_dir(&format!("{name}-cuda-{arch}-{}", gemm.name()));
        let cuda = ppcc_codegen::CudaOptions {
            gemm,
            ..ppcc_codegen::CudaOptions::new(arch).expect("arch")
        };
        let opts = CompileOptions {
            cuda: Some(cuda),
            keep_intermediates: gemm == GpuGemm::Cublas,
            ..Default::default()
        };
        compile_to_shared_object(mlir, sigs, &dir, &opts)
            .unwrap_or_else(|e| panic!("compile for CUDA {arch}:\n{e}\n--- MLIR ---\n{mlir}"));
        if gemm == GpuGemm::Cublas {
            // The host code calls the GPU's GEMM, never the CPU's.
            let ll: String = std::fs::read_dir(&dir)
                .expect("build dir")
                .flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "ll"))
                .map(|e| std::fs::read_to_string(e.path()).expect("read .ll"))
                .collect();
            // (The names' prefixes cover the batched GEMMs too.)
            assert!(
                ll.contains("@ppcc_gpu_sgemm") || ll.contains("@ppcc_gpu_dgemm"),
                "no call of the GPU's GEMM in the CUDA host code:\n{ll}"
            );
            assert!(
                !ll.contains("call void @ppcc_sgemm") && !ll.contains("call void @ppcc_dgemm"),
                "the CUDA host code calls the CPU's GEMM"
            );
        }
        if let Some(ptxas) = &ptxas {
            for e in std::fs::read_dir(&dir).expect("build dir").flatten() {
                let p = e.path();
                if p.extension().is_none_or(|x| x != "ptx") {
                    continue;
                }
                let out = std::process::Command::new(ptxas)
                    .arg(format!("-arch={arch}"))
                    .arg(&p)
                    .arg("-o")
                    .arg(p.with_extension("cubin"))
                    .output()
                    .unwrap_or_else(|e| panic!("running {}: {e}", ptxas.display()));
                assert!(
                    out.status.success(),
                    "ptxas -arch={arch} {}:\n{}",
                    p.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            // A module may have no kernel: loops without a parallel dimension (a full
            // reduction to a scalar) run in the host code, over the same managed memory.
        }
        cleanup(dir);
    }
}

pub fn cleanup(dir: PathBuf) {
    if std::env::var_os("PPCC_CODEGEN_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// `got` equals `want`: same dtype and shape; floats within `rtol · max(1, |want|)`
/// (NaN only where the reference is NaN), integers exactly.
pub fn assert_close(got: &Tensor, want: &Tensor, rtol: f64, what: &str) {
    assert_eq!(got.dtype, want.dtype, "{what}: dtype");
    assert_eq!(got.shape, want.shape, "{what}: shape");
    match (&got.data, &want.data) {
        (TensorData::Float(g), TensorData::Float(w)) => {
            for (j, (&g, &w)) in g.iter().zip(w).enumerate() {
                if w.is_nan() {
                    assert!(
                        g.is_nan(),
                        "{what} element {j}: native {g}, interpreter NaN"
                    );
                    continue;
                }
                if w.is_infinite() {
                    assert_eq!(g, w, "{what} element {j}");
                    continue;
                }
                let err = (g - w).abs() / w.abs().max(1.0);
                assert!(
                    err <= rtol,
                    "{what} element {j}: native {g} vs interpreter {w} (rel err {err:e})"
                );
            }
        }
        (TensorData::Int(g), TensorData::Int(w)) => {
            for (j, (g, w)) in g.iter().zip(w).enumerate() {
                assert_eq!(g, w, "{what} element {j}");
            }
        }
        _ => panic!("{what}: storage differs"),
    }
}

/// Compile the module's functions, run `function` natively and on the interpreter, and
/// compare every result (tolerance 1e-5).
pub fn check_with(m: &Module, function: &str, inputs: Vec<Tensor>, rtol: f64) {
    let f = m.function(function).expect("function");
    let expected = run_function(f, inputs.clone(), &InterpOptions::default(), None)
        .unwrap_or_else(|e| panic!("interpreter: {e}"));
    let (nm, dir) = compile(m);
    let args: Vec<&Tensor> = inputs.iter().collect();
    let got = nm
        .call(function, &args, None)
        .unwrap_or_else(|e| panic!("native call: {e}"));
    assert_eq!(got.len(), expected.len());
    for (i, (g, w)) in got.iter().zip(&expected).enumerate() {
        assert_close(g, w, rtol, &format!("@{function} result {i}"));
    }
    cleanup(dir);
}

/// Parse `src`, check its first function on `inputs` (or on [`random_inputs`]).
pub fn check(src: &str, inputs: Option<Vec<Tensor>>) {
    let m = parse(src);
    let f = &m.functions[0];
    let inputs = inputs.unwrap_or_else(|| random_inputs(f, 7));
    let name = f.name.clone();
    check_with(&m, &name, inputs, 1e-5);
}

/// A `Comm` that records sends and answers receives from a queue (for stage functions).
#[derive(Default)]
pub struct MockComm {
    pub sent: Vec<(u32, i64, Tensor)>,
    pub to_receive: Vec<(u32, i64, Tensor)>,
}

impl Comm for MockComm {
    fn send(&mut self, peer: u32, channel: i64, t: Tensor) -> Result<(), CommError> {
        self.sent.push((peer, channel, t));
        Ok(())
    }

    fn recv(
        &mut self,
        peer: u32,
        channel: i64,
        _ty: &ppir::TensorType,
    ) -> Result<Tensor, CommError> {
        let i = self
            .to_receive
            .iter()
            .position(|(p, c, _)| *p == peer && *c == channel)
            .ok_or_else(|| CommError::Transport {
                peer,
                channel,
                message: format!("nothing queued from stage {peer} on channel {channel}"),
            })?;
        Ok(self.to_receive.remove(i).2)
    }
}

/// Parse without the module-level checks (a lone stage's send/recv have no partners).
pub fn parse_stage(src: &str) -> Module {
    ppir::text::parse_module(src).unwrap_or_else(|e| panic!("parse: {e}\n{src}"))
}
