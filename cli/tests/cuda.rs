//! `--target cuda` without a GPU: compiling works anywhere and writes PTX for every stage
//! that NVIDIA's `ptxas` assembles for the architecture it was written for (sm_80 and
//! sm_90); `ppcc run` of a CUDA plan on a machine without the CUDA driver stops with an
//! error naming it; a bad `--cuda-arch` is refused before anything is written; with
//! `--gpu-gemm cublas` the host code multiplies through the runtime's cuBLAS entry; whole
//! models compiled through the CUDA lowering but run on the CPU (loops for kernels, both
//! GEMM forms) train with the CPU plan's losses.
//!
//! `ptxas` comes from the test venv (PyPI `nvidia-cuda-nvcc-cu12`), `$PPCC_PTXAS` or PATH;
//! without one the assembly step is skipped, except in CI (`CI` set), where it must run.
//! On a GPU machine, `scripts/gpu-check.sh` runs the plans (see README, GPUs).

mod pipeline_common;

use std::path::{Path, PathBuf};

use pipeline_common::{compile, ppcc, repo};

fn tmp(name: &str) -> PathBuf {
    pipeline_common::tmp("ppcc-cuda-test", name)
}

fn ptxas() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("PPCC_PTXAS") {
        return Some(PathBuf::from(p));
    }
    let venv = repo().join(".venv/lib/python3.11/site-packages/nvidia/cuda_nvcc/bin/ptxas");
    if venv.exists() {
        return Some(venv);
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join("ptxas"))
        .find(|p| p.exists())
}

/// Every `.ptx` of every stage of `dir`, by stage.
fn ptx_files(dir: &Path, stages: usize) -> Vec<Vec<PathBuf>> {
    (0..stages)
        .map(|s| {
            let mut v: Vec<PathBuf> = std::fs::read_dir(dir.join(format!("stage{s}")))
                .expect("stage dir")
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "ptx"))
                .collect();
            v.sort();
            v
        })
        .collect()
}

fn assemble(files: &[PathBuf], arch: &str) {
    let Some(ptxas) = ptxas() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "ptxas not found (scripts/setup.sh --test installs it into .venv)"
        );
        eprintln!("ptxas not found: the PTX is not assembled");
        return;
    };
    for f in files {
        let out = std::process::Command::new(&ptxas)
            .arg(format!("-arch={arch}"))
            .arg(f)
            .arg("-o")
            .arg(f.with_extension("cubin"))
            .output()
            .expect("ptxas runs");
        assert!(
            out.status.success(),
            "ptxas -arch={arch} {}:\n{}",
            f.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn cuda_plans_compile_anywhere_and_their_ptx_assembles() {
    for (model, extra) in [
        ("examples/gpt.onnx", &[][..]),
        ("examples/two_tower.onnx", &["--loss", "mse"][..]),
    ] {
        for arch in ["sm_80", "sm_90"] {
            let dir = tmp(&format!(
                "{}-{arch}",
                Path::new(model).file_stem().unwrap().to_string_lossy()
            ));
            let mut args = vec!["--stages", "2", "--target", "cuda", "--cuda-arch", arch];
            args.extend_from_slice(extra);
            compile(model, &dir, &args);
            let plan = std::fs::read_to_string(dir.join("plan.json")).unwrap();
            assert!(plan.contains("\"target\": \"cuda\""), "{plan}");
            let per_stage = ptx_files(&dir, 2);
            for (s, files) in per_stage.iter().enumerate() {
                assert!(
                    !files.is_empty(),
                    "{model} {arch}: stage {s} has no kernels"
                );
                assert!(dir.join(format!("stage{s}/module.so")).exists());
                for f in files {
                    let text = std::fs::read_to_string(f).unwrap();
                    assert!(text.contains(&format!(".target {arch}")), "{}", f.display());
                    assert!(!text.contains(".extern .func"), "{}", f.display());
                }
            }
            assemble(&per_stage.concat(), arch);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// `--gpu-gemm cublas`: every stage's host code multiplies through the runtime's cuBLAS
/// entry (`ppcc_gpu_sgemm`) and never the CPU's GEMM, the kernels that remain assemble,
/// and the plan says so. A GPT (matmuls, batched attention products, transposed operands
/// in the backward) and a CNN (convolutions as im2col + GEMM, with a bias broadcast).
#[test]
fn cublas_plans_call_the_gpu_gemm_and_their_kernels_assemble() {
    for model in ["examples/gpt.onnx", "examples/cnn.onnx"] {
        let dir = tmp(&format!(
            "cublas-{}",
            Path::new(model).file_stem().unwrap().to_string_lossy()
        ));
        compile(
            model,
            &dir,
            &[
                "--stages",
                "2",
                "--target",
                "cuda",
                "--gpu-gemm",
                "cublas",
                "--keep-mlir",
            ],
        );
        let plan = std::fs::read_to_string(dir.join("plan.json")).unwrap();
        assert!(plan.contains("\"gpu_gemm\": \"cublas\""), "{plan}");
        for s in 0..2 {
            let ll = std::fs::read_to_string(dir.join(format!("stage{s}/module.ll"))).unwrap();
            assert!(
                ll.contains("@ppcc_gpu_sgemm"),
                "{model} stage {s}: no call of the GPU's GEMM"
            );
            for cpu in [
                "call void @ppcc_sgemm", // the batched GEMM too
                "@ppcc_softmax_f32(",
                "@ppcc_layernorm_f32(",
            ] {
                assert!(!ll.contains(cpu), "{model} stage {s} calls {cpu}");
            }
        }
        assemble(&ptx_files(&dir, 2).concat(), "sm_90");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The losses of `ppcc run DIR --steps N`.
fn losses(dir: &Path, steps: &str) -> Vec<f64> {
    let out = ppcc(&["run", dir.to_str().unwrap(), "--steps", steps]);
    assert!(out.ok, "ppcc run {}:\n{}", dir.display(), out.stderr);
    out.stdout
        .lines()
        .filter_map(|l| l.strip_prefix("step "))
        .filter_map(|l| l.split_whitespace().nth(2)?.parse().ok())
        .collect()
}

/// Whole models (a GPT, a CNN) through the CUDA target's lowering, run on the CPU (the hidden
/// `--gpu-loops-on-cpu`): every op as the loops that become kernels, and the matrix
/// products as generated loops or in the cuBLAS form (the support library's GEMM standing
/// in for cuBLAS under the same contract). Each trains with the CPU plan's losses (1e-4
/// relative: products sum in another order) — forward, both backward halves and the
/// optimizer, across two stages.
#[test]
fn the_cuda_lowering_trains_whole_models_with_the_cpu_losses() {
    // (The two-tower model's products are plain GEMMs with biases, which the op tests
    // cover; left out to keep CI inside its time.)
    for (model, extra) in [
        ("examples/gpt.onnx", &[][..]),
        ("examples/cnn.onnx", &[][..]),
    ] {
        let stem = Path::new(model).file_stem().unwrap().to_string_lossy();
        let base = tmp(&format!("loops-{stem}-cpu"));
        let mut args = vec!["--stages", "2"];
        args.extend_from_slice(extra);
        compile(model, &base, &args);
        let want = losses(&base, "3");
        assert_eq!(want.len(), 3, "{model}: {want:?}");
        for gemm in ["kernels", "cublas"] {
            let dir = tmp(&format!("loops-{stem}-{gemm}"));
            let mut a = args.clone();
            a.extend(["--gpu-loops-on-cpu", "--gpu-gemm", gemm]);
            compile(model, &dir, &a);
            let got = losses(&dir, "3");
            assert_eq!(got.len(), want.len(), "{model} {gemm}: {got:?}");
            for (g, w) in got.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 1e-4 * w.abs().max(1e-6),
                    "{model} --gpu-gemm {gemm}: losses {got:?}, the CPU plan's {want:?}"
                );
            }
            let _ = std::fs::remove_dir_all(&dir);
        }
        let _ = std::fs::remove_dir_all(&base);
    }
}

#[test]
fn gpu_gemm_needs_the_cuda_target() {
    let dir = tmp("gemm-cpu");
    let out = ppcc(&[
        "examples/mlp.onnx",
        "-o",
        dir.to_str().unwrap(),
        "--gpu-gemm",
        "cublas",
    ]);
    assert!(!out.ok);
    assert!(
        out.stderr.contains("--gpu-gemm cublas") && out.stderr.contains("--target cuda"),
        "{}",
        out.stderr
    );
    assert!(!dir.exists(), "nothing is written for a refused --gpu-gemm");
    // `ppcc eval` takes it too (to time a model's products on a GPU), with the same rule.
    let out_npz = tmp("gemm-eval.npz");
    let out = ppcc(&[
        "eval",
        "examples/gpt.onnx",
        "--inputs",
        "examples/gpt_io.npz",
        "-o",
        out_npz.to_str().unwrap(),
        "--target",
        "cpu",
        "--gpu-gemm",
        "cublas",
    ]);
    assert!(!out.ok);
    assert!(
        out.stderr.contains("--gpu-gemm cublas") && out.stderr.contains("--target cuda"),
        "{}",
        out.stderr
    );
    assert!(!out_npz.exists());
}

#[test]
fn a_cuda_plan_without_a_gpu_stops_with_a_clear_error() {
    // Only meaningful where there is no CUDA driver (CI, this project's machines).
    let has_driver = ["libcuda.so.1", "libcuda.so"].iter().any(|l| {
        // SAFETY: probing for the driver library; loading it runs its initialisers only.
        unsafe { libloading::Library::new(l) }.is_ok()
    });
    if has_driver {
        eprintln!("a CUDA driver is present: skipped");
        return;
    }
    let dir = tmp("nogpu");
    compile(
        "examples/mlp.onnx",
        &dir,
        &["--stages", "2", "--target", "cuda"],
    );
    let blas = tmp("nogpu-cublas");
    compile(
        "examples/mlp.onnx",
        &blas,
        &["--stages", "2", "--target", "cuda", "--gpu-gemm", "cublas"],
    );
    // With tensors over NCCL or matrix products on cuBLAS too: the missing driver is what
    // is named.
    for (dir, extra) in [(&dir, &[][..]), (&dir, &["--nccl"][..]), (&blas, &[][..])] {
        let mut args = vec!["run", dir.to_str().unwrap(), "--steps", "1"];
        args.extend_from_slice(extra);
        let out = ppcc(&args);
        assert!(!out.ok, "{extra:?}: {}", out.stdout);
        assert!(
            out.stderr
                .contains("CUDA driver library (libcuda.so.1) cannot be loaded"),
            "{extra:?}: {}",
            out.stderr
        );
        assert!(!out.stderr.contains("panicked"), "{}", out.stderr);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&blas);
}

#[test]
fn a_bad_cuda_arch_is_refused() {
    let dir = tmp("arch");
    let out = ppcc(&[
        "examples/mlp.onnx",
        "-o",
        dir.to_str().unwrap(),
        "--target",
        "cuda",
        "--cuda-arch",
        "sm_6",
    ]);
    assert!(!out.ok);
    assert!(
        out.stderr.contains("unknown CUDA architecture `sm_6`"),
        "{}",
        out.stderr
    );
    assert!(
        !dir.exists(),
        "nothing is written for a refused --cuda-arch"
    );
}
