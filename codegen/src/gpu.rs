//! The CUDA target: the MLIR pipeline from `linalg` on tensors to GPU kernels in PTX and host
//! code that launches them, ppcc's math library for kernels, and the PTX kept beside the
//! module.
//!
//! A stage's functions are lowered as for the CPU but with every op kept in `linalg`
//! ([`crate::lower::LowerOptions::library_calls`] off), bufferized the same way, then:
//! `linalg` → `scf.parallel` loops → tiled (the tile is a thread block) → mapped to blocks
//! and threads → outlined into `gpu.module` kernels → NVVM → PTX (`format=isa`: no CUDA
//! toolkit is needed to compile; the driver JIT-compiles the PTX for the card it runs on).
//! The host part (everything outside the kernels: calls between the op functions,
//! send/recv, allocation) becomes an x86-64 object that calls MLIR's GPU runtime ABI
//! (`mgpu*`), which `gpu_shim.c` forwards to the ppcc runtime (`runtime/src/gpu.rs`).
//!
//! Memory: the host code's temporaries and the runtime's buffers are allocated by the
//! runtime as memory the device and the host both address (CUDA managed memory), so the
//! same host code works unchanged and buffers stay on the device between calls unless the
//! host touches them.

use std::path::{Path, PathBuf};

use crate::compile::CompileError;

/// ppcc's device math functions (`__nv_*`), see the file's header.
pub const GPU_MATH_LL: &str = include_str!("gpu_math.ll");

/// The host side of a CUDA module's GPU runtime ABI, see the file's header.
pub const GPU_SHIM_C: &str = include_str!("gpu_shim.c");

/// The version of the table `gpu_shim.c` takes from the runtime (`PPCC_GPU_API_VERSION`).
pub const GPU_API_VERSION: u32 = 2;

/// What to generate CUDA code for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CudaOptions {
    /// The GPU architecture, `sm_<major><minor>` with an optional `a` (`sm_90a`).
    pub arch: String,
    /// Who computes matrix products (and the GEMM of convolutions).
    pub gemm: GpuGemm,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            arch: "sm_90".to_string(),
            gemm: GpuGemm::default(),
        }
    }
}

/// Who computes a CUDA module's matrix products (`--gpu-gemm`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GpuGemm {
    /// Generated kernels: the contraction's `linalg` loops, tiled and mapped like every
    /// other op (verified on an H100; slow, one thread per output element).
    Kernels,
    /// NVIDIA's cuBLAS (the default), which the runtime loads when a run starts: the host
    /// code calls `ppcc_gpu_sgemm`/`ppcc_gpu_dgemm` (`gpu_shim.c`) with device buffers, C0
    /// already broadcast into the result by a kernel
    /// ([`crate::lower::LowerOptions::gpu_gemm`]). On an H100 it trained 5 of 6 models
    /// faster than the generated kernels and multiplied 4096³ in 216 ms against 304 ms,
    /// with the same losses (BENCHMARKS.md, 2026-11-28).
    #[default]
    Cublas,
}

impl GpuGemm {
    pub const NAMES: [&'static str; 2] = ["kernels", "cublas"];

    pub fn name(self) -> &'static str {
        match self {
            GpuGemm::Kernels => "kernels",
            GpuGemm::Cublas => "cublas",
        }
    }

    pub fn parse(s: &str) -> Option<GpuGemm> {
        match s {
            "kernels" => Some(GpuGemm::Kernels),
            "cublas" => Some(GpuGemm::Cublas),
            _ => None,
        }
    }
}

/// A `--cuda-arch` that is not an NVIDIA architecture name.
#[derive(Debug, thiserror::Error)]
#[error("unknown CUDA architecture `{0}`: expected sm_<NN> such as sm_80 (A100), sm_89 (L4, RTX 4090), sm_90 (H100, H200) or sm_90a, at least sm_70")]
pub struct ArchError(pub String);

impl CudaOptions {
    pub fn new(arch: &str) -> Result<Self, ArchError> {
        let o = CudaOptions {
            arch: arch.to_string(),
            gemm: GpuGemm::default(),
        };
        o.sm().ok_or_else(|| ArchError(arch.to_string()))?;
        Ok(o)
    }

    /// Whether matrix products go to cuBLAS ([`GpuGemm::Cublas`]).
    pub fn uses_cublas(&self) -> bool {
        self.gemm == GpuGemm::Cublas
    }

    /// The compute capability as a number (`sm_90a` → 90), `None` for a malformed name or
    /// one older than Volta.
    pub fn sm(&self) -> Option<u32> {
        let digits = self.arch.strip_prefix("sm_")?;
        let digits = digits.strip_suffix('a').unwrap_or(digits);
        if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
            return None;
        }
        digits.parse().ok().filter(|&n| (70..=1000).contains(&n))
    }

    /// The PTX ISA version the kernels declare: the least that the architecture accepts
    /// (sm_90 needs PTX 8.0) and that LLVM 22's NVPTX backend writes.
    pub fn ptx_features(&self) -> &'static str {
        match self.sm().unwrap_or(90) {
            ..=75 => "+ptx63",
            76..=86 => "+ptx71",
            87..=89 => "+ptx78",
            90..=99 => "+ptx80",
            100..=119 => "+ptx86",
            _ => "+ptx87",
        }
    }
}

/// Bufferization, buffer copies as `linalg.copy` ([`crate::copies`]), then `linalg` →
/// `scf.parallel` loops tiled into thread blocks (ppcc's
/// step [`crate::tiling::TILE_LOOPS`]: each loop's tile sizes by
/// [`crate::tiling::tiles_for`]) and mapped to blocks and threads: the part of [`cuda_pipeline`] that
/// [`crate::compile::cpu_gpu_loops_pipeline`] also runs (then as host loops). Ends with a
/// comma.
pub fn gpu_loops_passes() -> String {
    format!(
        "{}{},\
convert-linalg-to-parallel-loops,\
{},\
sccp,\
func.func(gpu-map-parallel-loops),",
        crate::compile::bufferize_passes!(),
        crate::compile::COPIES_TO_LINALG,
        crate::tiling::TILE_LOOPS
    )
}

/// [`gpu_loops_passes`], then the mapped loops become `gpu.launch` regions, outlined into
/// `gpu.func` kernels of a `gpu.module`: the start of [`cuda_pipeline`], before NVVM. What
/// `ppcc-opt --pass lower-to-mlir{target=cuda-kernels}` prints (the lit tests of each op
/// family's kernels). Ends with a comma.
pub fn kernel_outlining_passes() -> String {
    format!(
        "{}convert-parallel-loops-to-gpu,lower-affine,gpu-kernel-outlining,",
        gpu_loops_passes()
    )
}

/// The MLIR pass pipeline of the CUDA target: bufferization as on the CPU (caller-provided
/// results, every temporary freed), then loops → kernels → PTX with ppcc's math library
/// `math_lib` linked into every kernel module, and the host code to the LLVM dialect.
pub fn cuda_pipeline(opts: &CudaOptions, math_lib: &Path) -> String {
    format!(
        "builtin.module({outlined}\
convert-vector-to-scf,\
convert-scf-to-cf,\
convert-nvvm-to-llvm,\
convert-func-to-llvm,\
expand-strided-metadata,\
nvvm-attach-target{{chip={chip} features={features} O=3 l={lib}}},\
lower-affine,\
convert-arith-to-llvm,\
convert-index-to-llvm,\
canonicalize,\
cse,\
gpu.module(convert-gpu-to-nvvm,canonicalize,cse,reconcile-unrealized-casts),\
gpu-to-llvm,\
gpu-module-to-binary{{format=isa}},\
convert-math-to-llvm,\
convert-math-to-libm,\
convert-to-llvm,\
canonicalize,\
cse,\
reconcile-unrealized-casts)",
        outlined = kernel_outlining_passes(),
        chip = opts.arch,
        features = opts.ptx_features(),
        lib = math_lib.display(),
    )
}

/// Assemble [`GPU_MATH_LL`] into LLVM bitcode at `dir/ppcc_gpu_math.bc`.
pub fn write_math_library(dir: &Path) -> Result<PathBuf, CompileError> {
    let ctx = inkwell::context::Context::create();
    let buf = inkwell::memory_buffer::MemoryBuffer::create_from_memory_range_copy(
        GPU_MATH_LL.as_bytes(),
        "ppcc_gpu_math.ll",
    );
    let module = ctx
        .create_module_from_ir(buf)
        .map_err(|e| CompileError::Llvm(format!("ppcc's GPU math library: {e}")))?;
    let path = dir.join("ppcc_gpu_math.bc");
    if !module.write_bitcode_to_path(&path) {
        return Err(CompileError::Write {
            path: path.clone(),
            source: std::io::Error::other("LLVM could not write the bitcode"),
        });
    }
    Ok(path)
}

/// One kernel module's PTX (`gpu.binary @name`).
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub ptx: String,
}

/// The PTX of every `gpu.binary` in a module printed after `gpu-module-to-binary{format=isa}`
/// (the `assembly = "..."` of its `#gpu.object`, with MLIR's `\XX` escapes undone).
pub fn kernels(module_text: &str) -> Vec<Kernel> {
    let mut out = Vec::new();
    for line in module_text.lines() {
        let Some(rest) = line.trim_start().strip_prefix("gpu.binary @") else {
            continue;
        };
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let Some(start) = rest.find("assembly = \"") else {
            continue;
        };
        let body = &rest[start + "assembly = \"".len()..];
        out.push(Kernel {
            name,
            ptx: unescape(body),
        });
    }
    out
}

/// MLIR's string escapes up to the closing quote: `\XX` is a byte in hex, `\\` and `\"`
/// themselves.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => break,
            b'\\' if i + 1 < b.len() && (b[i + 1] == b'\\' || b[i + 1] == b'"') => {
                out.push(b[i + 1]);
                i += 2;
            }
            b'\\' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => {
                        out.push(v);
                        i += 3;
                    }
                    None => {
                        out.push(b'\\');
                        i += 1;
                    }
                }
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Functions a PTX module declares but does not define (`.extern .func ... name(`): a math
/// function neither ppcc's library nor the PTX instruction set provides.
pub fn unresolved(ptx: &str) -> Vec<String> {
    let mut names = Vec::new();
    for line in ptx.lines() {
        let l = line.trim_start();
        if !l.starts_with(".extern .func") {
            continue;
        }
        // `.extern .func  (.param .b32 func_retval0) __nv_expf(` (the parameter list may
        // start on the next line) or `.extern .func f(`: the name after the return value.
        let rest = l[".extern .func".len()..].trim_start();
        let rest = match rest.strip_prefix('(') {
            Some(r) => r.find(')').map_or("", |p| &r[p + 1..]),
            None => rest,
        };
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'))
            .collect();
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// What an unresolved `__nv_*` function computes, for the error message.
pub fn describe_unresolved(name: &str) -> String {
    let base = name.strip_prefix("__nv_").unwrap_or(name);
    let (f, ty) = match base.strip_suffix('f') {
        Some(f) if !["erf"].contains(&base) => (f, "f32"),
        _ => (base, "f64"),
    };
    format!("{ty} `{f}` ({name})")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f64 functions of [`GPU_MATH_LL`] (plain LLVM, no NVVM intrinsics) compiled for
    /// this CPU and compared with Rust's (the platform libm's) over wide sweeps.
    #[test]
    fn device_math_f64_matches_libm() {
        use inkwell::execution_engine::JitFunction;
        // Keep the f64 functions (and their helper), which use no NVVM intrinsic.
        let mut text = String::new();
        let mut keep = true;
        let mut body = String::new();
        for line in GPU_MATH_LL.lines() {
            if line.starts_with("target ") {
                continue;
            }
            if line.starts_with("define ") {
                body.clear();
                keep = line.starts_with("define double") || line.starts_with("define internal");
            }
            if line.starts_with("define ") || !body.is_empty() {
                body.push_str(line);
                body.push('\n');
                if line == "}" {
                    if keep {
                        text.push_str(&body);
                    }
                    body.clear();
                }
                continue;
            }
            if line.starts_with("declare ") && line.contains("llvm.nvvm") {
                continue;
            }
            text.push_str(line);
            text.push('\n');
        }
        inkwell::targets::Target::initialize_native(&Default::default()).unwrap();
        let ctx = inkwell::context::Context::create();
        let buf = inkwell::memory_buffer::MemoryBuffer::create_from_memory_range_copy(
            text.as_bytes(),
            "f64",
        );
        let module = ctx.create_module_from_ir(buf).expect("the f64 part parses");
        let ee = module
            .create_jit_execution_engine(inkwell::OptimizationLevel::Default)
            .expect("a JIT");
        type F1 = unsafe extern "C" fn(f64) -> f64;
        type F2 = unsafe extern "C" fn(f64, f64) -> f64;
        let f1 = |name: &str| -> JitFunction<F1> {
            // SAFETY: the function has this signature in gpu_math.ll.
            unsafe { ee.get_function(name) }.unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let mut next = uniform(0x2545_F491_4F6C_DD1Du64);
        let rel = |a: f64, b: f64| {
            if a == b || (a.is_nan() && b.is_nan()) {
                0.0
            } else {
                (a - b).abs() / b.abs().max(1e-300)
            }
        };
        // (function, reference, lowest, highest argument, tolerance)
        type Check = (&'static str, fn(f64) -> f64, f64, f64, f64);
        let checks: [Check; 6] = [
            ("__nv_exp", f64::exp, -700.0, 700.0, 3e-14),
            ("__nv_log", f64::ln, 1e-300, 1e300, 1e-15),
            ("__nv_tanh", f64::tanh, -25.0, 25.0, 2e-15),
            // erf: the series reference itself loses ~1e-13 near |x| = 3 (against glibc's
            // erf the library is within 4e-15).
            ("__nv_erf", erf_ref, -7.0, 7.0, 2e-13),
            ("__nv_sin", f64::sin, -1e3, 1e3, 1e-13),
            ("__nv_cos", f64::cos, -1e3, 1e3, 1e-13),
        ];
        for (name, reference, lo, hi, tol) in checks {
            let f = f1(name);
            let mut worst = 0.0f64;
            for i in 0..20000 {
                let u = next();
                let x = if name == "__nv_log" {
                    // log-uniform over [lo, hi]
                    (lo.ln() + u * (hi.ln() - lo.ln())).exp()
                } else {
                    lo + u * (hi - lo) * if i % 2 == 0 { 1.0 } else { 1e-3 }
                };
                // SAFETY: a pure function of one f64.
                let got = unsafe { f.call(x) };
                let want = reference(x);
                // sin/cos near their zeros: compare absolutely.
                let e = if name == "__nv_sin" || name == "__nv_cos" {
                    (got - want).abs()
                } else {
                    rel(got, want)
                };
                worst = worst.max(e);
            }
            assert!(worst <= tol, "{name}: worst error {worst:e} > {tol:e}");
            // SAFETY: as above.
            assert!(unsafe { f.call(f64::NAN) }.is_nan(), "{name}(NaN)");
        }
        // SAFETY: the function has this signature in gpu_math.ll.
        let pow: JitFunction<F2> = unsafe { ee.get_function("__nv_pow") }.unwrap();
        for (x, y) in [
            (2.0, 10.0),
            (-2.0, 3.0),
            (-2.0, 2.0),
            (0.5, -3.5),
            (0.0, -1.0),
            (7.0, 0.0),
        ] {
            // SAFETY: as above.
            let got = unsafe { pow.call(x, y) };
            let want: f64 = f64::powf(x, y);
            assert!(
                rel(got, want) <= 1e-14,
                "pow({x}, {y}) = {got}, libm {want}"
            );
        }
        // SAFETY: as above.
        assert!(unsafe { pow.call(-2.0, 0.5) }.is_nan());
    }

    /// Pseudo-random numbers in [0, 1) (xorshift64 from `seed`).
    fn uniform(mut seed: u64) -> impl FnMut() -> f64 {
        move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// erf by its Taylor series (|x| < 3) and continued fraction (beyond), in plain f64
    /// (Rust's std has no erf).
    fn erf_ref(x: f64) -> f64 {
        let a = x.abs();
        let r = if a < 3.0 {
            // Σ (−1)ⁿ x²ⁿ⁺¹ / (n! (2n+1)), summed until the terms vanish.
            let mut term = a;
            let mut sum = a;
            let z = a * a;
            for n in 1..200 {
                term *= -z / n as f64;
                let t = term / (2 * n + 1) as f64;
                sum += t;
                if t.abs() < 1e-18 * sum.abs() {
                    break;
                }
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            let mut t = a;
            for k in (1..=200).rev() {
                t = a + (k as f64 / 2.0) / t;
            }
            1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * t)
        };
        r.copysign(x)
    }

    /// The f32 functions of [`GPU_MATH_LL`] compiled for this CPU, with the two PTX
    /// approximations they are built on (`ex2.approx`, `lg2.approx`, about 2 ulp on the
    /// GPU) replaced by LLVM's exact `exp2`/`log2`: this checks everything ppcc writes
    /// around them (range reduction, constants, the compositions for `exp`, `log`,
    /// `log10`, `pow`, `tanh`, `sin`, `cos`, `erf`) against libm, and the exact ones bit for
    /// bit. What it cannot check is the hardware's own approximation error, which is
    /// NVIDIA's documented bound.
    #[test]
    fn device_math_f32_matches_libm_around_ex2_and_lg2() {
        use inkwell::execution_engine::JitFunction;
        let mut text = String::new();
        for line in GPU_MATH_LL.lines() {
            if line.starts_with("target ") {
                continue;
            }
            if line.starts_with("declare ") && line.contains("llvm.nvvm") {
                continue;
            }
            text.push_str(
                &line
                    .replace("@llvm.nvvm.ex2.approx.f(", "@llvm.exp2.f32(")
                    .replace("@llvm.nvvm.lg2.approx.f(", "@llvm.log2.f32("),
            );
            text.push('\n');
        }
        text.push_str("declare float @llvm.exp2.f32(float)\ndeclare float @llvm.log2.f32(float)\n");
        inkwell::targets::Target::initialize_native(&Default::default()).unwrap();
        let ctx = inkwell::context::Context::create();
        let buf = inkwell::memory_buffer::MemoryBuffer::create_from_memory_range_copy(
            text.as_bytes(),
            "f32",
        );
        let module = ctx
            .create_module_from_ir(buf)
            .expect("the module parses for the CPU");
        let ee = module
            .create_jit_execution_engine(inkwell::OptimizationLevel::Default)
            .expect("a JIT");
        type F1 = unsafe extern "C" fn(f32) -> f32;
        type F2 = unsafe extern "C" fn(f32, f32) -> f32;
        type F3 = unsafe extern "C" fn(f32, f32, f32) -> f32;
        let f1 = |name: &str| -> JitFunction<F1> {
            // SAFETY: the function has this signature in gpu_math.ll.
            unsafe { ee.get_function(name) }.unwrap_or_else(|e| panic!("{name}: {e}"))
        };
        let mut next = uniform(0x9E37_79B9_7F4A_7C15u64);
        // (function, reference in f64, lowest, highest argument, log-uniform, relative
        // tolerance, absolute tolerance): an error passes if within either.
        type Check = (&'static str, fn(f64) -> f64, f64, f64, bool, f64, f64);
        let checks: [Check; 9] = [
            ("__nv_expf", f64::exp, -87.0, 88.0, false, 4.0e-7, 0.0),
            ("__nv_exp2f", f64::exp2, -125.0, 127.0, false, 1.2e-7, 0.0),
            ("__nv_logf", f64::ln, 1e-37, 1e38, true, 2.4e-7, 0.0),
            ("__nv_log2f", f64::log2, 1e-37, 1e38, true, 1.2e-7, 0.0),
            ("__nv_log10f", f64::log10, 1e-37, 1e38, true, 2.4e-7, 0.0),
            // 1 − 2/(e^{2|x|} + 1) cancels for small |x|: its error is absolute there.
            ("__nv_tanhf", f64::tanh, -20.0, 20.0, false, 4.0e-7, 2.4e-7),
            ("__nv_sinf", f64::sin, -1e3, 1e3, false, 0.0, 1.2e-7),
            ("__nv_cosf", f64::cos, -1e3, 1e3, false, 0.0, 1.2e-7),
            ("__nv_erff", erf_ref, -7.0, 7.0, false, 0.0, 1.2e-7),
        ];
        for (name, reference, lo, hi, log, rel_tol, abs_tol) in checks {
            let f = f1(name);
            let mut worst = (0.0f64, 0.0f32);
            for i in 0..20000 {
                let u = next();
                let x = if log {
                    (lo.ln() + u * (hi.ln() - lo.ln())).exp()
                } else {
                    lo + u * (hi - lo) * if i % 2 == 0 { 1.0 } else { 1e-3 }
                } as f32;
                // SAFETY: a pure function of one f32.
                let got = f64::from(unsafe { f.call(x) });
                let want = reference(f64::from(x));
                let err = (got - want).abs();
                let scaled = if err <= abs_tol {
                    0.0
                } else {
                    err / want.abs().max(f64::MIN_POSITIVE)
                };
                if scaled > worst.0 {
                    worst = (scaled, x);
                }
            }
            assert!(
                worst.0 <= rel_tol,
                "{name}: relative error {:e} at x = {:e} > {rel_tol:e}",
                worst.0,
                worst.1
            );
            // SAFETY: as above.
            assert!(unsafe { f.call(f32::NAN) }.is_nan(), "{name}(NaN)");
        }
        // pow = 2^(y·log2 x): the rounding of y·log2 x scales with the exponent.
        // SAFETY: the function has this signature in gpu_math.ll.
        let pow: JitFunction<F2> = unsafe { ee.get_function("__nv_powf") }.unwrap();
        for _ in 0..20000 {
            let x = (next() * 100.0) as f32 + 1e-3;
            let y = (next() * 20.0 - 10.0) as f32;
            // SAFETY: as above.
            let got = f64::from(unsafe { pow.call(x, y) });
            let want = f64::from(x).powf(f64::from(y));
            let t = (f64::from(y) * f64::from(x).log2()).abs();
            let tol = 1.2e-7 * (2.0 + t);
            assert!(
                ((got - want) / want).abs() <= tol,
                "powf({x}, {y}) = {got}, libm {want}"
            );
        }
        // The exact ones: bit for bit.
        type Exact1 = (&'static str, fn(f32) -> f32);
        let exact: [Exact1; 8] = [
            ("__nv_sqrtf", f32::sqrt),
            ("__nv_rsqrtf", |x| 1.0 / x.sqrt()),
            ("__nv_fabsf", f32::abs),
            ("__nv_floorf", f32::floor),
            ("__nv_ceilf", f32::ceil),
            ("__nv_truncf", f32::trunc),
            ("__nv_rintf", f32::round_ties_even),
            ("__nv_roundf", f32::round),
        ];
        for (name, reference) in exact {
            let f = f1(name);
            for i in 0..4000 {
                let x = ((next() - 0.5) * if i % 2 == 0 { 2e3 } else { 7.0 }) as f32;
                let x = if name.contains("sqrt") { x.abs() } else { x };
                // SAFETY: a pure function of one f32.
                let got = unsafe { f.call(x) };
                let want = reference(x);
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{name}({x}) = {got}, want {want}"
                );
            }
        }
        type Exact2 = (&'static str, fn(f32, f32) -> f32);
        let two: [Exact2; 3] = [
            ("__nv_copysignf", f32::copysign),
            ("__nv_fminf", f32::min),
            ("__nv_fmaxf", f32::max),
        ];
        for (name, reference) in two {
            // SAFETY: the function has this signature in gpu_math.ll.
            let f: JitFunction<F2> = unsafe { ee.get_function(name) }.unwrap();
            for _ in 0..4000 {
                let (x, y) = (
                    ((next() - 0.5) * 20.0) as f32,
                    ((next() - 0.5) * 20.0) as f32,
                );
                // SAFETY: as above.
                let got = unsafe { f.call(x, y) };
                assert_eq!(got.to_bits(), reference(x, y).to_bits(), "{name}({x}, {y})");
            }
        }
        // SAFETY: the function has this signature in gpu_math.ll.
        let fma: JitFunction<F3> = unsafe { ee.get_function("__nv_fmaf") }.unwrap();
        for _ in 0..4000 {
            let (x, y, z) = (
                next() as f32 * 3.0,
                next() as f32 - 0.5,
                next() as f32 * -2.0,
            );
            // SAFETY: as above.
            let got = unsafe { fma.call(x, y, z) };
            assert_eq!(
                got.to_bits(),
                x.mul_add(y, z).to_bits(),
                "fma({x}, {y}, {z})"
            );
        }
    }

    #[test]
    fn arch_names() {
        assert_eq!(CudaOptions::new("sm_90").unwrap().sm(), Some(90));
        assert_eq!(CudaOptions::new("sm_90a").unwrap().ptx_features(), "+ptx80");
        assert_eq!(CudaOptions::new("sm_80").unwrap().ptx_features(), "+ptx71");
        for bad in ["sm90", "sm_", "sm_6", "sm_60", "compute_90", "sm_9x"] {
            assert!(CudaOptions::new(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ptx_is_unescaped_and_unresolved_functions_are_found() {
        let text = "  gpu.binary @k_0  [#gpu.object<#nvvm.target<chip = \"sm_90\">, assembly = \"//\\0A.version 8.0\\0A.extern .func  (.param .b64 func_retval0) __nv_exp\\0A(\\0A\\22q\\22 \\5C\"]\n";
        let ks = kernels(text);
        assert_eq!(ks.len(), 1);
        assert_eq!(ks[0].name, "k_0");
        assert!(ks[0].ptx.starts_with("//\n.version 8.0\n"));
        assert!(ks[0].ptx.ends_with("\"q\" \\"));
        assert_eq!(unresolved(&ks[0].ptx), vec!["__nv_exp".to_string()]);
        assert_eq!(describe_unresolved("__nv_exp"), "f64 `exp` (__nv_exp)");
        assert_eq!(describe_unresolved("__nv_logf"), "f32 `log` (__nv_logf)");
    }
}
