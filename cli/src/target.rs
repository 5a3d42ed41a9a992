//! `--target`: where model code runs — the reference interpreter or native code generated
//! through MLIR (`ppcc-codegen`) and loaded by the runtime.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use ppcc_codegen::{build_module, BuildOptions};
use ppcc_runtime::native::NativeModule;
use ppir::Module;

/// Where model code runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// The reference interpreter (slow, obviously right).
    Interp,
    /// Native code for this machine's CPU, generated through MLIR and LLVM.
    Cpu,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Interp => "interp",
            Target::Cpu => "cpu",
        }
    }
}

/// Generate `dir/module.so` for `functions` of `m` (all when empty) and load it.
pub fn build_native(
    m: &Module,
    functions: &[&str],
    dir: &Path,
    what: &str,
    keep_mlir: bool,
) -> Result<NativeModule> {
    let built = build_module(m, functions, dir, what, &BuildOptions { keep_mlir })?;
    let only = (!functions.is_empty()).then_some(functions);
    NativeModule::load(&built.so, m, only).context("loading the generated module")
}

/// A scratch directory removed when dropped (native code for `eval`, `train`, `conform`).
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    pub fn new(tag: &str) -> Result<ScratchDir> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "ppcc-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).with_context(|| format!("cannot create {}", p.display()))?;
        Ok(ScratchDir(p))
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
