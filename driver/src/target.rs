//! `--target`: where model code runs — the reference interpreter or native code generated
//! through MLIR (`ppcc-codegen`) and loaded by the runtime.

use std::path::{Path, PathBuf};

use crate::error::{Context, Result};
use ppcc_codegen::{build_module, BuildOptions};
use ppcc_runtime::native::NativeModule;
use ppir::interp::CommError;
use ppir::Module;

/// Where model code runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Target {
    /// The reference interpreter (slow, obviously right).
    Interp,
    /// Native code for this machine's CPU, generated through MLIR and LLVM.
    Cpu,
    /// NVIDIA GPUs: PTX kernels (JIT-compiled by the CUDA driver) and x86-64 host code that
    /// launches them, generated through MLIR's NVVM path; runs where a CUDA driver and GPU
    /// are (compiling needs neither).
    Cuda,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Interp => "interp",
            Target::Cpu => "cpu",
            Target::Cuda => "cuda",
        }
    }

    /// Whether stage code is generated (a `module.so` per stage).
    pub fn is_native(self) -> bool {
        self != Target::Interp
    }

    /// The CUDA options of `--target cuda` with the default architecture.
    pub fn cuda(self) -> Option<ppcc_codegen::CudaOptions> {
        (self == Target::Cuda).then(ppcc_codegen::CudaOptions::default)
    }

    /// [`Target::cuda`] with `--gpu-gemm` (which only `--target cuda` takes).
    pub fn cuda_with(
        self,
        gemm: Option<ppcc_codegen::GpuGemm>,
    ) -> Result<Option<ppcc_codegen::CudaOptions>> {
        match (self.cuda(), gemm) {
            (None, Some(g)) => Err(crate::error::invalid!(
                "--gpu-gemm {} chooses how GPUs multiply matrices: it needs --target cuda (this is --target {})",
                g.name(),
                self.name()
            )),
            (cuda, gemm) => Ok(cuda.map(|c| ppcc_codegen::CudaOptions {
                gemm: gemm.unwrap_or_default(),
                ..c
            })),
        }
    }
}

/// Generate `dir/module.so` for `functions` of `m` (all when empty) and load it: CPU code,
/// or with `cuda` ([`Target::cuda_with`]) a CUDA module.
pub fn build_native(
    m: &Module,
    functions: &[&str],
    dir: &Path,
    what: &str,
    keep_mlir: bool,
    cuda: Option<ppcc_codegen::CudaOptions>,
) -> Result<NativeModule> {
    let built = build_module(
        m,
        functions,
        dir,
        what,
        &BuildOptions {
            keep_mlir,
            profile_ops: false,
            cuda,
            ..Default::default()
        },
    )?;
    let only = (!functions.is_empty()).then_some(functions);
    NativeModule::load(&built.so, m, only).context("loading the generated module")
}

/// A scratch directory removed when dropped (native code for `eval`, `train`, `conform`):
/// `<temp>/ppcc-<tag>-XXXXXX` with an unpredictable suffix, created exclusively with mode
/// 0700, so nobody else can plant or read what is built and loaded there.
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    pub fn new(tag: &str) -> Result<ScratchDir> {
        use std::os::unix::fs::PermissionsExt;
        let prefix = format!("ppcc-{tag}-");
        let dir = tempfile::Builder::new()
            .prefix(&prefix)
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir()
            .with_context(|| {
                format!(
                    "cannot create a scratch directory {}",
                    std::env::temp_dir()
                        .join(format!("{prefix}XXXXXX"))
                        .display()
                )
            })?;
        // Removal is ours (Drop), so PPCC_KEEP_SCRATCH can keep it.
        Ok(ScratchDir(dir.keep()))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        // PPCC_KEEP_SCRATCH=1 keeps generated modules for profilers and debuggers.
        if std::env::var_os("PPCC_KEEP_SCRATCH").is_some_and(|v| v != "0") {
            eprintln!("kept {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Answers every receive with zeros of the asked type and drops every send: a stage
/// function run on its own, for timing.
pub struct NullComm;

impl ppir::interp::Comm for NullComm {
    fn send(&mut self, _peer: u32, _channel: i64, _t: ppir::Tensor) -> Result<(), CommError> {
        Ok(())
    }

    fn recv(
        &mut self,
        peer: u32,
        channel: i64,
        ty: &ppir::TensorType,
    ) -> Result<ppir::Tensor, CommError> {
        synthetic(ty).ok_or_else(|| CommError::Transport {
            peer,
            channel,
            message: format!("cannot make a {ty} to receive"),
        })
    }
}

/// A tensor of a static type for timing: floats spread over [-1, 1) (a constant would
/// make normalisations degenerate and gradients subnormal, which is slower than real
/// data), integers 0 (valid indices and labels). `None` for a symbolic type, or one too
/// large to count or to fit in memory.
pub fn synthetic(ty: &ppir::TensorType) -> Option<ppir::Tensor> {
    let shape: Vec<usize> = ty.static_shape()?.iter().map(|&d| d as usize).collect();
    let n = ppir::size::checked_num_elements(&shape)?;
    ppir::size::check_memory((n as u64).saturating_mul(8), String::new).ok()?;
    Some(if ty.dtype.is_float() {
        let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
        let v = (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                (s >> 11) as f64 / (1u64 << 52) as f64 - 1.0
            })
            .collect();
        ppir::Tensor::from_f64(ty.dtype, shape, v)
    } else {
        ppir::Tensor::from_i64(ty.dtype, shape, vec![0; n])
    })
}

/// Seconds of every op of `g` (a whole training step) in native code: `g` is compiled with
/// per-op timers (`profile_ops`), run on the initial `weights` (by argument name) and
/// synthetic data a few times, and each op's time averaged; ops fused into another op
/// count 0 (their time is their consumer's).
pub fn native_op_times(
    g: &ppir::Function,
    weights: &std::collections::BTreeMap<String, ppir::Tensor>,
) -> Result<std::collections::HashMap<ppir::OpId, f64>> {
    let scratch = ScratchDir::new("optimes")?;
    let mut m = Module::new();
    m.functions.push(g.clone());
    let built = build_module(
        &m,
        &[],
        &scratch.0,
        "the training step (timing its ops)",
        &BuildOptions {
            keep_mlir: false,
            profile_ops: true,
            ..Default::default()
        },
    )?;
    let native = NativeModule::load(&built.so, &m, None)?;
    let args: Vec<ppir::Tensor> = g
        .args()
        .iter()
        .map(|&(v, kind)| {
            let want: Option<Vec<usize>> = g
                .ty(v)
                .static_shape()
                .map(|s| s.iter().map(|&d| d as usize).collect());
            let real = (kind != ppir::ArgKind::Input)
                .then(|| weights.get(&g.value(v).name))
                .flatten()
                .filter(|t| want.as_ref() == Some(&t.shape))
                .cloned();
            match real {
                Some(t) => Ok(t),
                None => synthetic(g.ty(v)).with_context(|| {
                    format!(
                        "@{}: cannot make an argument of type {} (not static, or too large)",
                        g.name,
                        g.ty(v)
                    )
                }),
            }
        })
        .collect::<Result<_>>()?;
    let refs: Vec<&ppir::Tensor> = args.iter().collect();
    let n = g.num_op_slots();
    native.call(&g.name, &refs, None)?;
    native
        .take_op_profile(n)
        .context("the module has no op counters")?;
    const RUNS: usize = 3;
    for _ in 0..RUNS {
        native.call(&g.name, &refs, None)?;
    }
    let ns = native
        .take_op_profile(n)
        .context("the module has no op counters")?;
    Ok(g.ops()
        .iter()
        .map(|&op| (op, ns[op.index()] / RUNS as f64))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn scratch_dirs_are_private_and_unpredictable() {
        let a = ScratchDir::new("t").unwrap();
        let b = ScratchDir::new("t").unwrap();
        for d in [&a.0, &b.0] {
            let md = std::fs::symlink_metadata(d).unwrap();
            assert!(md.is_dir());
            assert_eq!(md.mode() & 0o7777, 0o700, "{}", d.display());
            let name = d.file_name().unwrap().to_string_lossy().into_owned();
            let suffix = name.strip_prefix("ppcc-t-").expect("prefix");
            // Not the process id and a counter (guessable), but random characters.
            assert!(suffix.len() >= 6, "{name}");
            assert!(!suffix.contains(&std::process::id().to_string()), "{name}");
        }
        assert_ne!(a.0, b.0);
        let kept = a.0.clone();
        drop(a);
        assert!(!kept.exists());
    }
}
