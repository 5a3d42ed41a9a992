//! `ppcc-*`: the `ppcc` binary as a child process on mutated files, for what an in-process
//! run cannot catch — a death by signal (SIGSEGV, SIGBUS, SIGABRT from a failed
//! allocation), a panic in code the library targets do not reach, a hang. Each run is
//! bounded by `Env::child_timeout`; the worker's memory limit applies to the child too.
//! Mutations are the matching in-process target's.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::npz::Npz;
use super::onnx::{Onnx, EXTERNAL_FILE};
use super::plan::Plan;
use super::{run_child, Env, Target, Verdict};
use crate::rng::Rng;

fn ppcc(env: &Env) -> Result<Command, Verdict> {
    let bin = env
        .ppcc
        .as_ref()
        .ok_or_else(|| Verdict::Crash("fuzzer: no ppcc binary (pass --ppcc)".into()))?;
    let mut cmd = Command::new(bin);
    cmd.current_dir(&env.scratch);
    Ok(cmd)
}

fn write(path: &Path, input: &[u8]) -> Result<(), Verdict> {
    std::fs::write(path, input)
        .map_err(|e| Verdict::Crash(format!("fuzzer: cannot write {}: {e}", path.display())))
}

fn example(env: &Env, name: &str) -> PathBuf {
    env.root.join("examples").join(name)
}

/// `ppcc import FILE.onnx` (external data beside it).
pub struct PpccImport;

impl Target for PpccImport {
    fn name(&self) -> &'static str {
        "ppcc-import"
    }
    fn describe(&self) -> &'static str {
        "child process: ppcc import MODEL.onnx --batch 2 (signals, panics, hangs)"
    }
    fn ext(&self) -> &'static str {
        "onnx"
    }
    fn needs_ppcc(&self) -> bool {
        true
    }
    fn weight(&self) -> u32 {
        1
    }
    fn seeds(&self, env: &Env) -> anyhow::Result<Vec<Vec<u8>>> {
        Onnx.seeds(env)
    }
    fn mutate_structured(
        &self,
        rng: &mut Rng,
        input: &[u8],
        corpus: &[Vec<u8>],
    ) -> Option<Vec<u8>> {
        Onnx.mutate_structured(rng, input, corpus)
    }
    fn run(&self, env: &Env, input: &[u8]) -> Verdict {
        let model = env.scratch.join("child-model.onnx");
        debug_assert!(env.scratch.join(EXTERNAL_FILE).exists());
        let mut cmd = match ppcc(env).and_then(|c| write(&model, input).map(|()| c)) {
            Ok(c) => c,
            Err(v) => return v,
        };
        cmd.arg("import")
            .arg(&model)
            .args(["--batch", "2", "-o", "child-model.ppir"]);
        run_child(cmd, env.child_timeout)
    }
}

/// A `ppcc` subcommand run on a mutated `.npz` (`--inputs` of `eval`, `--data` of `train`).
pub struct PpccNpz {
    pub name: &'static str,
    pub describe: &'static str,
    /// The example `.npz` the mutations start from.
    pub seed: &'static str,
    /// In the default set (weight 1) or only when asked for (weight 0).
    pub default: bool,
    /// The command line: `ppcc ARGS...` with `{model}` and `{npz}` replaced.
    pub args: &'static [&'static str],
}

/// `ppcc eval examples/mlp.onnx --inputs IN.npz --target T`.
pub const EVAL_INTERP: PpccNpz = PpccNpz {
    name: "ppcc-eval",
    describe: "child process: ppcc eval examples/mlp.onnx --inputs IN.npz --target interp",
    seed: "mlp_io.npz",
    default: true,
    args: &[
        "eval",
        "{model}",
        "--inputs",
        "{npz}",
        "-o",
        "child-out.npz",
        "--target",
        "interp",
    ],
};
pub const EVAL_CPU: PpccNpz = PpccNpz {
    name: "ppcc-eval-cpu",
    describe: "child process: ppcc eval examples/mlp.onnx --inputs IN.npz --target cpu (native code; slow, not in the default set)",
    seed: "mlp_io.npz",
    default: false,
    args: &["eval", "{model}", "--inputs", "{npz}", "-o", "child-out.npz", "--target", "cpu"],
};
/// `ppcc train examples/mlp.onnx --data FILE.npz --steps 1 --target interp`.
pub const TRAIN_INTERP: PpccNpz = PpccNpz {
    name: "ppcc-train",
    describe:
        "child process: ppcc train examples/mlp.onnx --data DATA.npz --steps 1 --target interp",
    seed: "mlp_train.npz",
    default: true,
    args: &[
        "train", "{model}", "--data", "{npz}", "--steps", "1", "--target", "interp",
    ],
};

impl Target for PpccNpz {
    fn name(&self) -> &'static str {
        self.name
    }
    fn describe(&self) -> &'static str {
        self.describe
    }
    fn ext(&self) -> &'static str {
        "npz"
    }
    fn needs_ppcc(&self) -> bool {
        true
    }
    fn weight(&self) -> u32 {
        u32::from(self.default)
    }
    fn seeds(&self, env: &Env) -> anyhow::Result<Vec<Vec<u8>>> {
        Ok(vec![std::fs::read(example(env, self.seed))?])
    }
    fn mutate_structured(
        &self,
        rng: &mut Rng,
        input: &[u8],
        corpus: &[Vec<u8>],
    ) -> Option<Vec<u8>> {
        Npz.mutate_structured(rng, input, corpus)
    }
    fn run(&self, env: &Env, input: &[u8]) -> Verdict {
        let data = env.scratch.join(format!("child-{}.npz", self.name));
        let mut cmd = match ppcc(env).and_then(|c| write(&data, input).map(|()| c)) {
            Ok(c) => c,
            Err(v) => return v,
        };
        let model = example(env, "mlp.onnx");
        for a in self.args {
            match *a {
                "{model}" => cmd.arg(&model),
                "{npz}" => cmd.arg(&data),
                other => cmd.arg(other),
            };
        }
        run_child(cmd, env.child_timeout)
    }
}

/// `ppcc run DIR --steps 1 --recv-timeout 5` with a mutated `DIR/plan.json` (the stage
/// programs of a real compile beside it).
pub struct PpccRunPlan;

impl Target for PpccRunPlan {
    fn name(&self) -> &'static str {
        "ppcc-run"
    }
    fn describe(&self) -> &'static str {
        "child process: ppcc run DIR --steps 1 --recv-timeout 5 with a mutated DIR/plan.json"
    }
    fn ext(&self) -> &'static str {
        "json"
    }
    fn needs_ppcc(&self) -> bool {
        true
    }
    fn weight(&self) -> u32 {
        1
    }
    fn seeds(&self, env: &Env) -> anyhow::Result<Vec<Vec<u8>>> {
        // Only the first plan: its stage folders are the ones the mutated plan runs with.
        Ok(Plan.seeds(env)?.into_iter().take(1).collect())
    }
    fn mutate_structured(
        &self,
        rng: &mut Rng,
        input: &[u8],
        corpus: &[Vec<u8>],
    ) -> Option<Vec<u8>> {
        Plan.mutate_structured(rng, input, corpus)
    }
    fn run(&self, env: &Env, input: &[u8]) -> Verdict {
        let Some(plan_dir) = env.plan_dirs.first() else {
            return Verdict::Crash("fuzzer: no compiled plan".into());
        };
        let dir = env.scratch.join("child-plan");
        if let Err(e) = link_plan(plan_dir, &dir) {
            return Verdict::Crash(format!("fuzzer: cannot prepare {}: {e}", dir.display()));
        }
        let mut cmd = match ppcc(env).and_then(|c| write(&dir.join("plan.json"), input).map(|()| c))
        {
            Ok(c) => c,
            Err(v) => return v,
        };
        cmd.arg("run")
            .arg(&dir)
            .args(["--steps", "1", "--recv-timeout", "5"]);
        run_child(cmd, env.child_timeout)
    }
}

/// `dst`: the stage folders of `src` (symlinked, so a run cannot change the seed plan's).
fn link_plan(src: &Path, dst: &Path) -> std::io::Result<()> {
    if dst.exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src)?.flatten() {
        let name = e.file_name();
        if name != "plan.json" {
            std::os::unix::fs::symlink(e.path(), dst.join(name))?;
        }
    }
    Ok(())
}
