//! Matrix-product throughput of the generated code against the machine's peak.
//!
//! ```text
//! cargo run --release -p ppcc-codegen --example matmul_bench [-- --quick] [--threads N] [--keep] [--only TEXT]
//! ```
//!
//! `--quick` skips the largest square product, `--threads N` lets each GEMM call use `N`
//! threads (`ppcc_set_num_threads`), `--keep` keeps the build directories (MLIR, LLVM IR), `--only TEXT` runs the cases
//! whose description contains `TEXT`.
//!
//! For each shape, a ppir function with one `matmul` or `gemm` is lowered and compiled to a
//! `module.so` exactly as `ppcc compile --target cpu` does, and its `ppcc_call_f` entry is
//! timed on dense f32 buffers (best of several runs, one thread unless `--threads`). The
//! single-core peak is measured in the same run by an FMA-throughput loop (12 independent
//! accumulator chains of AVX-512 `vfmadd231ps zmm` and of AVX2 `vfmadd231ps ymm`; the
//! faster is the peak). For a few sizes the old lowering (`linalg.matmul` into a zero
//! accumulator, the same pipeline) is timed for comparison.

use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ppcc_codegen::{compile_to_shared_object, lower_functions, CompileOptions, Signature};
use ppir::DType;

/// One benchmark case.
struct Case {
    what: &'static str,
    /// ppir op text: `matmul` or `gemm` with attributes.
    op: &'static str,
    a: Vec<u64>,
    b: Vec<u64>,
    c: Option<Vec<u64>>,
    out: Vec<u64>,
    /// Multiply-adds per call.
    macs: u64,
    /// Also time the old `linalg.matmul` lowering (2-D, non-transposed only).
    naive: bool,
}

fn mm(what: &'static str, m: u64, k: u64, n: u64, naive: bool) -> Case {
    Case {
        what,
        op: "matmul",
        a: vec![m, k],
        b: vec![k, n],
        c: None,
        out: vec![m, n],
        macs: m * k * n,
        naive,
    }
}

/// `gemm {trans_b = 1}` of an m×k A by a stored n×k B, plus a bias of n (an ONNX Gemm).
fn gemm_tb(what: &'static str, m: u64, k: u64, n: u64) -> Case {
    Case {
        what,
        op: "gemm {trans_b = 1}",
        a: vec![m, k],
        b: vec![n, k],
        c: Some(vec![n]),
        out: vec![m, n],
        macs: m * k * n,
        naive: false,
    }
}

fn cases(quick: bool) -> Vec<Case> {
    let mut v = vec![
        mm("square", 256, 256, 256, true),
        mm("square", 512, 512, 512, true),
        mm("square", 1024, 1024, 1024, false),
    ];
    if !quick {
        v.push(mm("square", 2048, 2048, 2048, false));
    }
    v.extend([
        mm("issue example", 2048, 256, 256, true),
        mm("MLP layer, batch 32", 32, 4096, 4096, false),
        gemm_tb("two-tower Gemm transB, batch 32", 32, 1024, 1024),
        gemm_tb("two-tower Gemm transB, batch 32", 32, 1536, 1536),
        mm("GPT-24 MLP up, batch 32", 4096, 320, 1280, false),
        mm("GPT-24 MLP down, batch 32", 4096, 1280, 320, false),
        Case {
            what: "GPT-24 attention QK^T, batch 32",
            op: "matmul",
            a: vec![160, 128, 64],
            b: vec![160, 64, 128],
            c: None,
            out: vec![160, 128, 128],
            macs: 160 * 128 * 64 * 128,
            naive: false,
        },
        gemm_tb("mlp.onnx fc1 Gemm transB, batch 32", 32, 64, 128),
    ]);
    v
}

fn ty(s: &[u64]) -> String {
    let mut t = String::from("tensor<");
    for d in s {
        t.push_str(&format!("{d}x"));
    }
    t + "f32>"
}

/// The ppir module of one case: `@f` applying its op.
fn module_text(c: &Case) -> String {
    let mut params = vec![format!("%a: {}", ty(&c.a)), format!("%b: {}", ty(&c.b))];
    let mut args = vec!["%a", "%b"];
    let mut tys = vec![ty(&c.a), ty(&c.b)];
    if let Some(cs) = &c.c {
        params.push(format!("%c: {}", ty(cs)));
        args.push("%c");
        tys.push(ty(cs));
    }
    let (name, attrs) = match c.op.split_once(' ') {
        Some((n, a)) => (n, format!(" {a}")),
        None => (c.op, String::new()),
    };
    let out = ty(&c.out);
    format!(
        "module {{\n  func @f({}) -> ({out}) {{\n    %y = \"pp.{name}\"({}){attrs} : ({}) -> {out}\n    return %y : {out}\n  }}\n}}\n",
        params.join(", "),
        args.join(", "),
        tys.join(", ")
    )
}

/// The old lowering of a 2-D f32 matmul: `linalg.matmul` into a zero accumulator.
fn naive_mlir(m: u64, k: u64, n: u64) -> String {
    let (a, b, c) = (ty(&[m, k]), ty(&[k, n]), ty(&[m, n]));
    format!(
        "module {{\n  func.func @f(%ctx: !llvm.ptr, %a: {a} {{bufferization.writable = false}}, %b: {b} {{bufferization.writable = false}}) -> ({c}) attributes {{llvm.emit_c_interface}} {{\n    %z = arith.constant 0.0 : f32\n    %e = tensor.empty() : {c}\n    %acc = linalg.fill ins(%z : f32) outs(%e : {c}) -> {c}\n    %r = linalg.matmul ins(%a, %b : {a}, {b}) outs(%acc : {c}) -> {c}\n    return %r : {c}\n  }}\n}}\n"
    )
}

/// A dense row-major f32 buffer and its memref descriptor
/// `{T *allocated, T *aligned, i64 offset, i64 sizes[r], i64 strides[r]}`.
struct Buf {
    data: Vec<f32>,
    desc: Vec<i64>,
}

impl Buf {
    fn new(shape: &[u64], seed: u64) -> Buf {
        let n: u64 = shape.iter().product();
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let data: Vec<f32> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
            })
            .collect();
        let mut b = Buf {
            data,
            desc: Vec::new(),
        };
        let p = b.data.as_mut_ptr() as i64;
        b.desc = vec![p, p, 0];
        b.desc.extend(shape.iter().map(|&d| d as i64));
        let mut st = vec![1i64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            st[i] = st[i + 1] * shape[i + 1] as i64;
        }
        b.desc.extend(st);
        b
    }
}

type Entry = unsafe extern "C" fn(*mut c_void, *const *mut c_void);

/// A compiled module and the buffers of one call.
struct Bench {
    _lib: libloading::Library,
    entry: Entry,
    bufs: Vec<Buf>,
}

impl Bench {
    fn load(so: &Path, shapes: &[Vec<u64>]) -> Bench {
        // SAFETY: module.so is ppcc's own output; `ppcc_call_f` has the `Entry` ABI.
        let lib = unsafe { libloading::Library::new(so) }.expect("load module.so");
        let entry = *unsafe { lib.get::<Entry>(b"ppcc_call_f") }.expect("ppcc_call_f");
        let bufs = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| Buf::new(s, i as u64 + 1))
            .collect();
        Bench {
            _lib: lib,
            entry,
            bufs,
        }
    }

    fn call(&mut self) {
        let descs: Vec<*mut c_void> = self
            .bufs
            .iter_mut()
            .map(|b| b.desc.as_mut_ptr() as *mut c_void)
            .collect();
        // SAFETY: one descriptor per input then output, of the compiled shapes; no
        // send/recv, so the context is never read.
        unsafe { (self.entry)(std::ptr::null_mut(), descs.as_ptr()) };
    }

    fn set_threads(&self, n: i32) {
        // SAFETY: exported by the support code of every module.
        if let Ok(f) = unsafe {
            self._lib
                .get::<unsafe extern "C" fn(i32)>(b"ppcc_set_num_threads")
        } {
            unsafe { f(n) };
        }
    }

    /// Best seconds per call over `rounds` rounds of at least `min_s` each.
    fn time(&mut self, rounds: usize, min_s: f64) -> f64 {
        self.call();
        let mut best = f64::INFINITY;
        for _ in 0..rounds {
            let t = Instant::now();
            let mut n = 0u32;
            while n == 0 || t.elapsed().as_secs_f64() < min_s {
                self.call();
                n += 1;
            }
            best = best.min(t.elapsed().as_secs_f64() / n as f64);
        }
        best
    }
}

fn compile(mlir: &str, sigs: &[Signature], dir: &Path, keep: bool) -> PathBuf {
    let opts = CompileOptions {
        keep_intermediates: keep,
        ..Default::default()
    };
    compile_to_shared_object(mlir, sigs, dir, &opts).unwrap_or_else(|e| panic!("compile: {e}"))
}

// ---- peak ----

/// Seconds for `iters` iterations of 24 independent-chain FMAs on zmm registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn fma_loop_zmm(iters: u64) {
    use std::arch::asm;
    asm!(
        "vxorps xmm12, xmm12, xmm12",
        "vxorps xmm13, xmm13, xmm13",
        "2:",
        "vfmadd231ps zmm0, zmm12, zmm13", "vfmadd231ps zmm1, zmm12, zmm13",
        "vfmadd231ps zmm2, zmm12, zmm13", "vfmadd231ps zmm3, zmm12, zmm13",
        "vfmadd231ps zmm4, zmm12, zmm13", "vfmadd231ps zmm5, zmm12, zmm13",
        "vfmadd231ps zmm6, zmm12, zmm13", "vfmadd231ps zmm7, zmm12, zmm13",
        "vfmadd231ps zmm8, zmm12, zmm13", "vfmadd231ps zmm9, zmm12, zmm13",
        "vfmadd231ps zmm10, zmm12, zmm13", "vfmadd231ps zmm11, zmm12, zmm13",
        "vfmadd231ps zmm0, zmm12, zmm13", "vfmadd231ps zmm1, zmm12, zmm13",
        "vfmadd231ps zmm2, zmm12, zmm13", "vfmadd231ps zmm3, zmm12, zmm13",
        "vfmadd231ps zmm4, zmm12, zmm13", "vfmadd231ps zmm5, zmm12, zmm13",
        "vfmadd231ps zmm6, zmm12, zmm13", "vfmadd231ps zmm7, zmm12, zmm13",
        "vfmadd231ps zmm8, zmm12, zmm13", "vfmadd231ps zmm9, zmm12, zmm13",
        "vfmadd231ps zmm10, zmm12, zmm13", "vfmadd231ps zmm11, zmm12, zmm13",
        "dec {n}",
        "jnz 2b",
        n = inout(reg) iters => _,
        out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _, out("zmm4") _,
        out("zmm5") _, out("zmm6") _, out("zmm7") _, out("zmm8") _, out("zmm9") _,
        out("zmm10") _, out("zmm11") _, out("zmm12") _, out("zmm13") _,
        options(nostack, nomem),
    );
}

/// The same on ymm registers (AVX2 + FMA).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_loop_ymm(iters: u64) {
    use std::arch::asm;
    asm!(
        "vxorps xmm12, xmm12, xmm12",
        "vxorps xmm13, xmm13, xmm13",
        "2:",
        "vfmadd231ps ymm0, ymm12, ymm13", "vfmadd231ps ymm1, ymm12, ymm13",
        "vfmadd231ps ymm2, ymm12, ymm13", "vfmadd231ps ymm3, ymm12, ymm13",
        "vfmadd231ps ymm4, ymm12, ymm13", "vfmadd231ps ymm5, ymm12, ymm13",
        "vfmadd231ps ymm6, ymm12, ymm13", "vfmadd231ps ymm7, ymm12, ymm13",
        "vfmadd231ps ymm8, ymm12, ymm13", "vfmadd231ps ymm9, ymm12, ymm13",
        "vfmadd231ps ymm10, ymm12, ymm13", "vfmadd231ps ymm11, ymm12, ymm13",
        "vfmadd231ps ymm0, ymm12, ymm13", "vfmadd231ps ymm1, ymm12, ymm13",
        "vfmadd231ps ymm2, ymm12, ymm13", "vfmadd231ps ymm3, ymm12, ymm13",
        "vfmadd231ps ymm4, ymm12, ymm13", "vfmadd231ps ymm5, ymm12, ymm13",
        "vfmadd231ps ymm6, ymm12, ymm13", "vfmadd231ps ymm7, ymm12, ymm13",
        "vfmadd231ps ymm8, ymm12, ymm13", "vfmadd231ps ymm9, ymm12, ymm13",
        "vfmadd231ps ymm10, ymm12, ymm13", "vfmadd231ps ymm11, ymm12, ymm13",
        "dec {n}",
        "jnz 2b",
        "vzeroupper",
        n = inout(reg) iters => _,
        out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _,
        out("ymm5") _, out("ymm6") _, out("ymm7") _, out("ymm8") _, out("ymm9") _,
        out("ymm10") _, out("ymm11") _, out("ymm12") _, out("ymm13") _,
        options(nostack, nomem),
    );
}

/// Best GFLOP/s of `f(iters)`, which runs `flops_per_iter` per iteration.
fn best_gflops(f: impl Fn(u64), flops_per_iter: f64) -> f64 {
    let iters = 20_000_000u64;
    f(iters / 10);
    (0..5)
        .map(|_| {
            let t = Instant::now();
            f(iters);
            iters as f64 * flops_per_iter / t.elapsed().as_secs_f64() / 1e9
        })
        .fold(0.0, f64::max)
}

/// `(isa, GFLOP/s)` of every FMA width this CPU has, fastest first.
fn peaks() -> Vec<(&'static str, f64)> {
    let mut v = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F.
            v.push((
                "AVX-512 (zmm FMA)",
                best_gflops(|n| unsafe { fma_loop_zmm(n) }, 24.0 * 32.0),
            ));
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA.
            v.push((
                "AVX2 (ymm FMA)",
                best_gflops(|n| unsafe { fma_loop_ymm(n) }, 24.0 * 16.0),
            ));
        }
    }
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let keep = args.iter().any(|a| a == "--keep");
    let threads: i32 = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let only: Option<String> = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    // Private (0700) with an unpredictable name: the modules built here are loaded.
    let base = tempfile::Builder::new()
        .prefix("ppcc-matmul-bench-")
        .tempdir()
        .unwrap_or_else(|e| panic!("cannot create a scratch directory: {e}"))
        .keep();

    let peaks = peaks();
    println!("single-core f32 peak (FMA throughput loop, 12 chains):");
    for (isa, g) in &peaks {
        println!("  {isa:<18} {g:7.1} GFLOP/s");
    }
    let (peak_isa, peak) = peaks.first().copied().unwrap_or(("none", f64::NAN));
    let same = peaks.len() > 1 && peaks[1].1 > 0.97 * peak;
    println!(
        "  peak = {peak:.1} GFLOP/s ({}); GEMM threads: {threads}\n",
        if same {
            "every width within 3%: the FMA datapath is the limit"
        } else {
            peak_isa
        }
    );

    println!(
        "{:<36} {:>18} {:>10} {:>9} {:>7} {:>12}",
        "case", "m x k x n", "ms/call", "GFLOP/s", "% peak", "naive GFLOP/s"
    );
    for (i, c) in cases(quick).iter().enumerate() {
        if only.as_ref().is_some_and(|o| !c.what.contains(o.as_str())) {
            continue;
        }
        let src = module_text(c);
        let m = ppir::text::parse_module(&src).unwrap_or_else(|e| panic!("parse: {e}\n{src}"));
        let fs: Vec<&ppir::Function> = m.functions.iter().collect();
        let (mlir, sigs) = lower_functions(&fs).unwrap_or_else(|e| panic!("lower: {e}"));
        let dir = base.join(format!("case{i}"));
        let so = compile(&mlir, &sigs, &dir, keep);
        let mut shapes = vec![c.a.clone(), c.b.clone()];
        shapes.extend(c.c.clone());
        shapes.push(c.out.clone());
        let mut b = Bench::load(&so, &shapes);
        b.set_threads(threads);
        let flops = 2.0 * c.macs as f64;
        let s = b.time(5, 0.2);
        let g = flops / s / 1e9;
        let naive = if c.naive {
            let (mm, kk, nn) = (c.a[0], c.a[1], c.b[1]);
            let sig = Signature {
                name: "f".into(),
                inputs: vec![(DType::F32, c.a.clone()), (DType::F32, c.b.clone())],
                outputs: vec![(DType::F32, c.out.clone())],
            };
            let so = compile(
                &naive_mlir(mm, kk, nn),
                &[sig],
                &base.join(format!("naive{i}")),
                keep,
            );
            let mut nb = Bench::load(&so, &shapes);
            format!("{:.2}", flops / nb.time(2, 0.2) / 1e9)
        } else {
            "-".into()
        };
        let r = c.out.len();
        let (mm, nn) = (c.out[r - 2], c.out[r - 1]);
        let nb: u64 = c.out[..r - 2].iter().product();
        let kk = c.macs / (nb * mm * nn);
        let dims = if r > 2 {
            format!("{nb}x({mm}x{kk}x{nn})")
        } else {
            format!("{mm}x{kk}x{nn}")
        };
        println!(
            "{:<36} {:>18} {:>10.3} {:>9.1} {:>6.0}% {:>12}",
            c.what,
            dims,
            s * 1e3,
            g,
            100.0 * g / peak,
            naive
        );
    }
    if keep {
        println!("\nbuild directories kept under {}", base.display());
    } else {
        let _ = std::fs::remove_dir_all(&base);
    }
}
