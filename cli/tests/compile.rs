//! `ppcc MODEL.onnx -o DIR` end to end: the plan (plan.json) of the graph partitioner on
//! the two-tower example against its sequential baseline, the per-stage programs (they
//! parse and, loaded together, verify: every send has its recv), schedule.csv and
//! timeline.svg; the other partitioners and schedules on the MLP and GPT examples; and the
//! errors for impossible requests.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

/// A fresh output directory for one test.
fn out_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ppcc-compile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Run `ppcc MODEL -o DIR ARGS`: (success, stdout, stderr).
fn compile(model: &str, dir: &Path, args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ppcc"))
        .arg(example(model))
        .arg("-o")
        .arg(dir)
        .args(args)
        .output()
        .expect("ppcc runs");
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

/// Compile, expecting success; returns plan.json.
fn compile_ok(model: &str, name: &str, args: &[&str]) -> (PathBuf, Value) {
    let dir = out_dir(name);
    let (ok, out, err) = compile(model, &dir, args);
    assert!(ok, "ppcc {model} {args:?} failed:\n{out}\n{err}");
    let text = std::fs::read_to_string(dir.join("plan.json")).expect("plan.json written");
    let plan: Value = serde_json::from_str(&text).expect("plan.json parses");
    (dir, plan)
}

/// Compile, expecting failure; returns stderr.
fn compile_err(model: &str, name: &str, args: &[&str]) -> String {
    let dir = out_dir(name);
    let (ok, out, err) = compile(model, &dir, args);
    assert!(!ok, "ppcc {model} {args:?} should fail:\n{out}\n{err}");
    err
}

fn f64_of(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Every stage's stage.ppir parses; all stages' functions in one module verify (the
/// verifier pairs each send with its recv across functions). Returns the module.
fn load_stages(dir: &Path, stages: usize) -> ppir::Module {
    let mut all = ppir::Module::new();
    for s in 0..stages {
        let path = dir.join(format!("stage{s}")).join("stage.ppir");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let m = ppir::text::parse_module(&text)
            .unwrap_or_else(|e| panic!("{} does not parse: {e:?}", path.display()));
        assert!(
            dir.join(format!("stage{s}")).join("params.npz").exists(),
            "stage{s}/params.npz"
        );
        let names: Vec<&str> = m.functions.iter().map(|f| f.name.as_str()).collect();
        for phase in ["fwd", "bwd_input", "bwd_weight", "optim"] {
            let want = format!("stage{s}.{phase}");
            assert!(
                names.contains(&want.as_str()),
                "{}: no @{want} in {names:?}",
                path.display()
            );
        }
        all.functions.extend(m.functions);
        all.weights.extend(m.weights);
    }
    if let Err(errors) = ppir::verify::verify_module(&all) {
        let list: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
        panic!("the stages together do not verify:\n{}", list.join("\n"));
    }
    all
}

#[test]
fn two_tower_graph_partition_beats_the_sequential_baseline() {
    let (dir, plan) = compile_ok(
        "two_tower.onnx",
        "two-tower",
        &["--stages", "3", "--microbatches", "4", "--loss", "mse"],
    );
    assert_eq!(plan["format"], "ppcc-plan");
    assert_eq!(plan["partition"], "graph");
    assert_eq!(plan["devices"], 3);
    assert_eq!(plan["microbatches"], 4);
    assert_eq!(plan["global_batch"], 8);
    assert_eq!(plan["micro_batch"], 2);
    assert_eq!(plan["schedule"]["name"], "1f1b");

    let stages = plan["stages"].as_array().expect("stages");
    assert_eq!(stages.len(), 3);
    for (i, st) in stages.iter().enumerate() {
        assert_eq!(st["stage"], i as u64);
        assert_eq!(st["device"], i as u64);
        assert_eq!(st["dir"], format!("stage{i}"));
        assert!(st["ops"].as_u64().unwrap() > 0, "stage {i} has no ops");
        assert_eq!(st["functions"]["fwd"], format!("stage{i}.fwd"));
        assert_eq!(st["functions"]["optim"], format!("stage{i}.optim"));
    }
    // The towers run side by side; the head joins them.
    assert_eq!(stages[0]["first_op"], "user_tower.fc0/MatMul");
    assert_eq!(stages[0]["last_op"], "user_tower.relu2/Relu");
    assert_eq!(stages[1]["first_op"], "item_tower.fc0/MatMul");
    assert_eq!(stages[1]["last_op"], "item_tower.relu2/Relu");
    assert_eq!(stages[2]["first_op"], "head/Concat");
    assert_eq!(stages[2]["last_op"], "head.fc1/Add");
    assert_eq!(stages[0]["ops"], 9);
    assert_eq!(stages[1]["ops"], 9);
    assert_eq!(stages[2]["ops"], 6);
    assert_eq!(plan["edges"], serde_json::json!([[0, 2], [1, 2]]));
    // Two activations forward, their two gradients back.
    let channels = plan["channels"].as_array().unwrap();
    let summary: Vec<(u64, u64, &str)> = channels
        .iter()
        .map(|c| {
            (
                c["from"].as_u64().unwrap(),
                c["to"].as_u64().unwrap(),
                c["phase"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            (0, 2, "fwd"),
            (1, 2, "fwd"),
            (2, 0, "bwd_input"),
            (2, 1, "bwd_input")
        ]
    );
    // 2 rows × 64 floats.
    assert!(channels.iter().all(|c| c["bytes"] == 512));

    let prediction = &plan["prediction"];
    assert_eq!(prediction["stage_graph_is_chain"], false);
    let baseline = &plan["baseline"];
    assert_eq!(baseline["partition"], "sequential");
    let (t, t0) = (
        f64_of(&prediction["iteration_seconds"]),
        f64_of(&baseline["iteration_seconds"]),
    );
    assert!(
        t > 0.0 && t < t0,
        "graph {t} s is not faster than sequential {t0} s"
    );
    assert!(f64_of(&prediction["lower_bound_seconds"]) <= t);
    let bubble = f64_of(&prediction["bubble_fraction"]);
    assert!(bubble > 0.0 && bubble < f64_of(&baseline["bubble_fraction"]));
    assert_eq!(prediction["peak_memory_bytes"].as_array().unwrap().len(), 3);

    let m = load_stages(&dir, 3);
    assert_eq!(m.functions.len(), 12);

    let csv = std::fs::read_to_string(dir.join("schedule.csv")).unwrap();
    // A stage DAG's CSV starts with a comment line (its edges and ranks).
    assert!(csv.starts_with("# ppcc stage DAG"), "{csv}");
    let rows: Vec<&str> = csv.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(rows.len(), 3, "{csv}");
    for (r, row) in rows.iter().enumerate() {
        // Every rank runs F and B of each of the 4 micro-batches of its stage.
        for mb in 0..4 {
            for action in ["F", "B"] {
                let cell = format!("{r}{action}{mb}");
                assert!(
                    row.split(',').any(|c| c == cell),
                    "row {r} lacks {cell}: {row}"
                );
            }
        }
    }
    let svg = std::fs::read_to_string(dir.join("timeline.svg")).unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
    let trace = std::fs::read_to_string(dir.join("trace.json")).unwrap();
    serde_json::from_str::<Value>(&trace).expect("trace.json parses");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sequential_partition_numbers_stages_in_op_order() {
    let (dir, plan) = compile_ok(
        "two_tower.onnx",
        "two-tower-seq",
        &[
            "--stages",
            "3",
            "--microbatches",
            "4",
            "--loss",
            "mse",
            "--partition",
            "sequential",
        ],
    );
    assert_eq!(plan["partition"], "sequential");
    let stages = plan["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 3);
    let firsts: Vec<&str> = stages
        .iter()
        .map(|s| s["first_op"].as_str().unwrap())
        .collect();
    assert_eq!(
        firsts,
        [
            "user_tower.fc0/MatMul",
            "item_tower.fc0/MatMul",
            "head/Concat"
        ]
    );
    // Stage edges only go forward in the numbering.
    for e in plan["edges"].as_array().unwrap() {
        assert!(e[0].as_u64().unwrap() < e[1].as_u64().unwrap(), "edge {e}");
    }
    // The plan is its own baseline.
    assert_eq!(
        f64_of(&plan["prediction"]["iteration_seconds"]),
        f64_of(&plan["baseline"]["iteration_seconds"])
    );
    load_stages(&dir, 3);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mlp_sequential_stages_form_a_chain() {
    let (dir, plan) = compile_ok(
        "mlp.onnx",
        "mlp-seq",
        &["--stages", "2", "--partition", "sequential"],
    );
    assert_eq!(plan["prediction"]["stage_graph_is_chain"], true);
    assert_eq!(plan["edges"], serde_json::json!([[0, 1]]));
    load_stages(&dir, 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn zb_v_needs_a_chain_partition() {
    let err = compile_err(
        "two_tower.onnx",
        "zbv",
        &[
            "--stages",
            "3",
            "--microbatches",
            "4",
            "--loss",
            "mse",
            "--schedule",
            "zb-v",
            "--partition",
            "graph",
        ],
    );
    assert!(err.contains("--partition sequential"), "{err}");
    assert!(err.contains("zb-v"), "{err}");
}

#[test]
fn interleaved_on_the_mlp_makes_four_virtual_stages() {
    let (dir, plan) = compile_ok(
        "mlp.onnx",
        "mlp-interleaved",
        &[
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--schedule",
            "interleaved-1f1b",
            "--chunks",
            "2",
        ],
    );
    assert_eq!(plan["devices"], 2);
    assert_eq!(plan["schedule"]["chunks"], 2);
    let stages = plan["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 4);
    // Virtual stage c·P + r on device r.
    let placement: Vec<(u64, u64)> = stages
        .iter()
        .map(|s| (s["device"].as_u64().unwrap(), s["chunk"].as_u64().unwrap()))
        .collect();
    assert_eq!(placement, [(0, 0), (1, 0), (0, 1), (1, 1)]);
    assert_eq!(plan["edges"], serde_json::json!([[0, 1], [1, 2], [2, 3]]));
    let csv = std::fs::read_to_string(dir.join("schedule.csv")).unwrap();
    assert_eq!(csv.lines().count(), 2, "{csv}");
    load_stages(&dir, 4);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn interleaved_with_too_few_op_groups_says_so() {
    // The MLP cannot be cut into 2 × 8 = 16 virtual stages.
    let err = compile_err(
        "mlp.onnx",
        "mlp-interleaved-many",
        &[
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--schedule",
            "interleaved-1f1b",
            "--chunks",
            "8",
        ],
    );
    assert!(err.contains("fewer than the 16 stages asked for"), "{err}");
    assert!(
        err.contains("needs 16 stages: 2 devices × 8 stages each"),
        "{err}"
    );
}

#[test]
fn memory_limit_too_small_names_the_stage_and_the_excess() {
    let err = compile_err(
        "two_tower.onnx",
        "memory",
        &[
            "--stages",
            "3",
            "--microbatches",
            "4",
            "--loss",
            "mse",
            "--memory-limit",
            "1K",
        ],
    );
    assert!(err.contains("no plan fits the memory limit"), "{err}");
    assert!(err.contains("the stage with ops `"), "{err}");
    assert!(err.contains("the limit is 1000 B (over by "), "{err}");
}

#[test]
fn bad_memory_limit_unit() {
    let err = compile_err("mlp.onnx", "memory-unit", &["--memory-limit", "3 parsecs"]);
    assert!(
        err.contains("--memory-limit: unknown unit `parsecs`"),
        "{err}"
    );
}

#[test]
fn unknown_stage_layout_name_is_named() {
    let err = compile_err(
        "two_tower.onnx",
        "layout",
        &[
            "--stages",
            "3",
            "--microbatches",
            "4",
            "--loss",
            "mse",
            "--stage-layout",
            "nonexistent",
        ],
    );
    assert!(
        err.contains("no op of @main is named `nonexistent`"),
        "{err}"
    );
    assert!(err.contains("user_tower.fc0/MatMul"), "{err}");
}

#[test]
fn stage_layout_forces_a_cut() {
    let (dir, plan) = compile_ok(
        "two_tower.onnx",
        "layout-ok",
        &[
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--loss",
            "mse",
            "--partition",
            "sequential",
            "--stage-layout",
            "head.relu0/Relu",
        ],
    );
    let stages = plan["stages"].as_array().unwrap();
    assert_eq!(stages.len(), 2);
    assert_eq!(stages[1]["first_op"], "head.relu0/Relu");
    load_stages(&dir, 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn unknown_schedule_lists_the_builtins() {
    let err = compile_err("mlp.onnx", "schedule", &["--schedule", "foo"]);
    assert!(
        err.contains(
            "unknown schedule `foo` (built-in: gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zb-v, dualpipe-v; auto; or a .pps or .csv file)"
        ),
        "{err}"
    );
}

#[test]
fn zero_stages_is_an_error() {
    let err = compile_err("mlp.onnx", "zero", &["--stages", "0"]);
    assert!(err.contains("--stages must be at least 1"), "{err}");
}

/// Issue 12: hyper-parameters are checked before planning, with `--plan-only` too (a NaN
/// learning rate used to be written into the plan).
#[test]
fn non_finite_hyper_parameters_are_refused_before_planning() {
    for arg in ["--lr=nan", "--lr=inf", "--momentum=-1"] {
        let err = compile_err("mlp.onnx", "nan-lr", &[arg, "--plan-only"]);
        assert!(err.contains("must be a finite number"), "{arg}: {err}");
    }
}

/// MLP and GPT with two stages under every single-chunk built-in schedule (default
/// partition) and under the uniform partition.
#[test]
fn examples_compile_under_every_schedule_and_uniform() {
    // The GPT's attention reshapes fix its batch at 4 rows, so one micro-batch.
    for (model, extra) in [
        ("mlp.onnx", vec![]),
        ("gpt.onnx", vec!["--microbatches", "1"]),
    ] {
        let mut runs: Vec<(String, Vec<&str>)> = ["gpipe", "1f1b", "zb-h1", "zb-h2"]
            .into_iter()
            .map(|s| (s.to_string(), vec!["--schedule", s]))
            .collect();
        runs.push(("uniform".into(), vec!["--partition", "uniform"]));
        for (label, args) in runs {
            let mut all = vec!["--stages", "2"];
            all.extend(&extra);
            all.extend(&args);
            let name = format!("{}-{label}", model.trim_end_matches(".onnx"));
            let (dir, plan) = compile_ok(model, &name, &all);
            let stages = plan["stages"].as_array().unwrap();
            assert_eq!(stages.len(), 2, "{name}");
            assert!(
                stages.iter().all(|s| s["ops"].as_u64().unwrap() > 0),
                "{name}: an empty stage"
            );
            if label == "uniform" {
                assert_eq!(plan["partition"], "uniform", "{name}");
                assert_eq!(plan["schedule"]["name"], "1f1b", "{name}");
            } else {
                assert_eq!(plan["schedule"]["name"], label.as_str(), "{name}");
            }
            assert!(
                f64_of(&plan["prediction"]["iteration_seconds"]) > 0.0,
                "{name}"
            );
            load_stages(&dir, 2);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[test]
fn a_baked_batch_falls_back_to_one_micro_batch_by_default() {
    // The GPT example fixes its batch of 4 rows in a reshape: the default 4 micro-batches
    // of 1 row cannot work, so the compiler takes 1 micro-batch and says why.
    let dir = out_dir("gpt-default-m");
    let (ok, _stdout, stderr) = compile("gpt.onnx", &dir, &["--stages", "2"]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("note: using 1 micro-batch per step"),
        "{stderr}"
    );
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan["microbatches"], 1);
    assert_eq!(plan["micro_batch"], 4);
    // An explicit choice is never overridden.
    let err = compile_err(
        "gpt.onnx",
        "gpt-explicit-m",
        &["--stages", "2", "--microbatches", "4"],
    );
    assert!(
        err.contains("the model's batch size is fixed at 4"),
        "{err}"
    );
}

#[test]
fn an_output_without_the_batch_is_refused_at_compile_time() {
    // PoissonNLLLoss_no_reduce (onnx wheel) multiplies its input by a fixed 10×10 tensor:
    // its output keeps 10 rows whatever the batch, so micro-batches cannot cut it.
    let d = std::env::var("PPCC_ONNX_TEST_DATA")
        .ok()
        .map(PathBuf::from)
        .or_else(|| {
            let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/lib");
            std::fs::read_dir(venv)
                .ok()?
                .flatten()
                .map(|e| e.path().join("site-packages/onnx/backend/test/data"))
                .find(|p| p.exists())
        });
    let Some(d) = d else {
        eprintln!("skipped: no onnx test data (.venv)");
        return;
    };
    let model = d.join("pytorch-converted/test_PoissonNLLLLoss_no_reduce/model.onnx");
    let dir = out_dir("poisson");
    let out = Command::new(env!("CARGO_BIN_EXE_ppcc"))
        .arg(&model)
        .arg("-o")
        .arg(&dir)
        .args(["--stages", "2", "--batch", "2"])
        .output()
        .expect("ppcc runs");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(!out.status.success());
    assert!(
        err.contains("the loss's labels (shaped like the model's output) have 10 rows per micro-batch but a micro-batch has 1")
            && err.contains("--batch 10 --microbatches 1"),
        "{err}"
    );
}

/// `--target cpu` (the default) generates one native module per stage and says so in
/// plan.json; `--target interp` generates none, and `ppcc run --target cpu` on such a plan
/// says what to do; `--keep-mlir` keeps every pass's output.
#[test]
fn native_modules_per_stage_and_the_interp_target() {
    let dir = out_dir("native");
    let (ok, _, err) = compile("mlp.onnx", &dir, &["--stages", "2", "--keep-mlir"]);
    assert!(ok, "{err}");
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan["target"], "cpu");
    for s in 0..2 {
        let sd = dir.join(format!("stage{s}"));
        for f in ["module.so", "stage.mlir", "stage.ppir", "module.ll"] {
            assert!(sd.join(f).exists(), "missing stage{s}/{f}");
        }
        assert!(sd.join("mlir").join("00-input.mlir").exists());
    }

    let idir = out_dir("interp");
    let (ok, _, err) = compile("mlp.onnx", &idir, &["--stages", "2", "--target", "interp"]);
    assert!(ok, "{err}");
    assert!(!idir.join("stage0").join("module.so").exists());
    let out = Command::new(env!("CARGO_BIN_EXE_ppcc"))
        .args([
            "run",
            idir.to_str().unwrap(),
            "--steps",
            "1",
            "--target",
            "cpu",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--target interp") && err.contains("module.so"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&idir);
}

#[test]
fn host_profile_times_the_generated_code() {
    // A private cache, so the host profile is measured here and nothing outside is touched.
    let cache = out_dir("host-cache");
    std::fs::create_dir_all(&cache).unwrap();
    let dir = out_dir("host-native");
    let out = Command::new(env!("CARGO_BIN_EXE_ppcc"))
        .arg(example("mlp.onnx"))
        .arg("-o")
        .arg(&dir)
        .args(["--stages", "2", "--device-profile", "host"])
        .env("XDG_CACHE_HOME", &cache)
        .output()
        .expect("ppcc runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        !stderr.contains("timing ops with the interpreter"),
        "the op timer fell back:\n{stderr}"
    );
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    // The prediction simulates the schedule with each stage's actions timed on its
    // generated code; the cost model's own prediction is kept beside it.
    assert_eq!(plan["prediction"]["stage_times"], "measured-native");
    assert!(f64_of(&plan["prediction"]["iteration_seconds"]) > 0.0);
    assert!(f64_of(&plan["prediction_cost_model"]["iteration_seconds"]) > 0.0);
    for s in plan["stages"].as_array().unwrap() {
        let t = &s["native_seconds"];
        for k in ["fwd", "bwd_input", "bwd_weight"] {
            assert!(f64_of(&t[k]) > 0.0, "stage {}: {k} = {}", s["stage"], t[k]);
        }
        assert!(f64_of(&t["optim"]) >= 0.0);
    }
    assert!(stdout.contains("both by the cost model"), "{stdout}");
    // Interpreter plans keep the cost model's prediction.
    let idir = out_dir("host-interp");
    let out = Command::new(env!("CARGO_BIN_EXE_ppcc"))
        .arg(example("mlp.onnx"))
        .arg("-o")
        .arg(&idir)
        .args([
            "--stages",
            "2",
            "--device-profile",
            "host",
            "--target",
            "interp",
        ])
        .env("XDG_CACHE_HOME", &cache)
        .output()
        .expect("ppcc runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(idir.join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan["prediction"]["stage_times"], "cost-model");
    assert!(plan["prediction_cost_model"].is_null());
    for d in [&dir, &idir, &cache] {
        let _ = std::fs::remove_dir_all(d);
    }
}

/// `ppcc ARGS` with extra environment variables: (success, stderr).
fn ppcc_env(args: &[&str], env: &[(&str, &Path)]) -> (bool, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ppcc"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("ppcc runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `ppcc eval --target cpu` of the MLP example: builds and loads a native module.
fn eval_native(dir: &Path, cache: &Path) -> (bool, String) {
    let out = dir.join("out.npz");
    ppcc_env(
        &[
            "eval",
            &example("mlp.onnx"),
            "--target",
            "cpu",
            "--inputs",
            &example("mlp_io.npz"),
            "-o",
            out.to_str().unwrap(),
        ],
        &[("PPCC_CACHE_DIR", cache)],
    )
}

fn euid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    // The owner of a file this process just created.
    let d = out_dir("whoami");
    std::fs::create_dir_all(&d).unwrap();
    let uid = std::fs::metadata(&d).unwrap().uid();
    let _ = std::fs::remove_dir_all(&d);
    uid
}

/// Issue 12, item 1: the support object linked into every module is cached per user; a
/// cache directory that others can write, or that belongs to someone else, is refused
/// with its name and the reason instead of being linked from.
#[test]
fn a_shared_or_foreign_support_cache_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = out_dir("cache-refused");
    let cache = dir.join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (ok, err) = eval_native(&dir, &cache);
    assert!(!ok, "a world-writable cache was used");
    assert!(
        err.contains(&format!("support-object cache {}", cache.display()))
            && err.contains("writable by everyone (mode 0777)"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_dir(&cache).unwrap().count(),
        0,
        "nothing written"
    );
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o770)).unwrap();
    let (ok, err) = eval_native(&dir, &cache);
    assert!(
        !ok && err.contains("writable by its group (mode 0770)"),
        "{err}"
    );
    if euid() == 0 {
        // Owned by another user (as root, the test can make it so).
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&cache, Some(12345), None).unwrap();
        let (ok, err) = eval_native(&dir, &cache);
        assert!(!ok, "another user's cache was used");
        assert!(
            err.contains(&cache.display().to_string())
                && err.contains("owned by uid 12345, not by you (uid 0)"),
            "{err}"
        );
    }
    // A private directory of ours works, and what it holds is private.
    let own = dir.join("own");
    let (ok, err) = eval_native(&dir, &own);
    assert!(ok, "{err}");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&own), 0o700);
    for e in std::fs::read_dir(&own).unwrap() {
        assert_eq!(mode(&e.unwrap().path()), 0o600);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 1: an object planted in the cache (here: the real support code plus a
/// constructor that writes a marker file), whose bytes do not match the hash recorded
/// beside it, is never linked: building and loading modules afterwards rebuilds it, and
/// the marker is never written.
#[test]
fn a_planted_support_object_is_never_linked() {
    let dir = out_dir("cache-planted");
    let cache = dir.join("cache");
    let (ok, err) = eval_native(&dir, &cache);
    assert!(ok, "{err}");
    let cached: Vec<PathBuf> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "o"))
        .collect();
    assert_eq!(cached.len(), 1, "{cached:?}");
    let marker = dir.join("planted-code-ran");
    let support = Path::new(env!("CARGO_MANIFEST_DIR")).join("../codegen/src/support.c");
    let evil = dir.join("evil.c");
    std::fs::write(
        &evil,
        format!(
            "#include <stdio.h>\n\
             __attribute__((constructor)) static void planted(void) {{\n\
             FILE *f = fopen(\"{}\", \"w\"); if (f) {{ fputs(\"ran\", f); fclose(f); }} }}\n\
             #include \"{}\"\n",
            marker.display(),
            support.canonicalize().unwrap().display()
        ),
    )
    .unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("../codegen/include");
    let st = Command::new(&cc)
        .args(["-O1", "-fPIC", "-std=gnu11", "-I"])
        .arg(&include)
        .arg("-c")
        .arg(&evil)
        .arg("-o")
        .arg(&cached[0])
        .status()
        .unwrap();
    assert!(st.success(), "compiling the planted object");
    // Compile a plan (links two modules) and run it (loads them); eval links and loads.
    let build = dir.join("build");
    let (ok, err) = ppcc_env(
        &[
            &example("mlp.onnx"),
            "-o",
            build.to_str().unwrap(),
            "--stages",
            "2",
        ],
        &[("PPCC_CACHE_DIR", &cache)],
    );
    assert!(ok, "{err}");
    let (ok, err) = ppcc_env(
        &["run", build.to_str().unwrap(), "--steps", "1"],
        &[("PPCC_CACHE_DIR", &cache)],
    );
    assert!(ok, "{err}");
    let (ok, err) = eval_native(&dir, &cache);
    assert!(ok, "{err}");
    assert!(!marker.exists(), "the planted object was linked and ran");
    // The cache holds a rebuilt object again, matching its recorded hash.
    let bytes = std::fs::read(&cached[0]).unwrap();
    let recorded = std::fs::read_to_string(cached[0].with_extension("o.sha256")).unwrap();
    assert_eq!(
        recorded.split_whitespace().next().unwrap(),
        ppcc_codegen::support_cache::sha256_of(&bytes)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 8: `-o` into an existing directory that is neither empty nor a ppcc
/// build directory (`-o /`) is refused before anything is written, unless `--force`.
#[test]
fn output_into_a_foreign_directory_needs_force() {
    // `-o /` is refused before the model is even read (a missing model here, so that
    // nothing could be written to / even if the check regressed).
    let (ok, _, err) = compile("no-such-model.onnx", Path::new("/"), &["--plan-only"]);
    assert!(
        !ok && err.contains("/ is not empty and is not a ppcc build directory"),
        "{err}"
    );
    let dir = out_dir("foreign");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("notes.txt"), "mine").unwrap();
    let (ok, _, err) = compile("mlp.onnx", &dir, &["--stages", "2"]);
    assert!(!ok, "wrote into a foreign directory");
    assert!(
        err.contains(&format!(
            "{} is not empty and is not a ppcc build directory",
            dir.display()
        )) && err.contains("--force"),
        "{err}"
    );
    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&dir), ["notes.txt"]);
    let (ok, _, err) = compile("mlp.onnx", &dir, &["--stages", "2", "--force"]);
    assert!(ok, "{err}");
    assert!(dir.join("plan.json").exists() && dir.join("notes.txt").exists());
    // Now a build directory: compiling again into it needs no --force.
    let (ok, _, err) = compile("mlp.onnx", &dir, &["--stages", "2", "--plan-only"]);
    assert!(ok, "{err}");
    // A file where the directory should be is named.
    let file = dir.join("notes.txt");
    let (ok, _, err) = compile("mlp.onnx", &file, &[]);
    assert!(
        !ok && err.contains("exists and is not a directory"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 12, item 8: a failed write (a full disk, here /dev/full behind a file name) is an
/// error naming the file.
#[test]
fn a_failed_write_names_the_file() {
    if !Path::new("/dev/full").exists() {
        return;
    }
    let dir = out_dir("full");
    std::fs::create_dir_all(dir.join("stage0")).unwrap();
    let params = dir.join("stage0").join("params.npz");
    std::os::unix::fs::symlink("/dev/full", &params).unwrap();
    let (ok, _, err) = compile("mlp.onnx", &dir, &["--stages", "2"]);
    assert!(!ok);
    assert!(
        err.contains(&format!("cannot write {}", params.display()))
            && err.contains("No space left on device"),
        "{err}"
    );
    std::fs::remove_file(&params).unwrap();
    std::os::unix::fs::symlink("/dev/full", dir.join("timeline.svg")).unwrap();
    let (ok, _, err) = compile("mlp.onnx", &dir, &["--stages", "2", "--target", "interp"]);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "cannot write {}",
            dir.join("timeline.svg").display()
        )),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--microbatches auto` plans every divisor of the global batch up to 8·P, says what it
/// compared and keeps the shortest predicted iteration; under a memory limit the counts
/// that do not fit are named as such, and with none fitting the error lists them.
#[test]
fn microbatches_auto_compares_the_divisors_of_the_batch() {
    let dir = out_dir("mb-auto");
    let (ok, _, stderr) = compile(
        "mlp.onnx",
        &dir,
        &[
            "--stages",
            "2",
            "--batch",
            "24",
            "--microbatches",
            "auto",
            "--plan-only",
        ],
    );
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("--microbatches auto: global batch 24 on 2 devices"),
        "{stderr}"
    );
    let tried: Vec<&str> = stderr.lines().filter(|l| l.contains(" rows: ")).collect();
    // 1, 2, 3, 4, 6, 8, 12 (16 = 8·P caps 24).
    assert_eq!(tried.len(), 7, "{stderr}");
    let chosen = tried
        .iter()
        .find(|l| l.ends_with("<- chosen"))
        .unwrap_or_else(|| panic!("none chosen: {stderr}"));
    let m: u64 = chosen.split_whitespace().next().unwrap().parse().unwrap();
    let plan: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plan.json")).unwrap()).unwrap();
    assert_eq!(plan["microbatches"].as_u64(), Some(m));
    assert_eq!(plan["global_batch"].as_u64(), Some(24));
    // The chosen count has the shortest of the predicted iterations.
    let ms = |l: &str| -> f64 {
        let at = l.find("iteration ").unwrap() + "iteration ".len();
        l[at..].split(' ').next().unwrap().parse().unwrap()
    };
    assert!(tried.iter().all(|l| ms(l) >= ms(chosen)), "{stderr}");
    let err = compile_err(
        "mlp.onnx",
        "mb-auto-none",
        &[
            "--batch",
            "8",
            "--microbatches",
            "auto",
            "--memory-limit",
            "1K",
        ],
    );
    assert!(
        err.contains("no number of micro-batches plans for a global batch of 8"),
        "{err}"
    );
    assert!(err.contains("does not plan"), "{err}");
    let err = compile_err("mlp.onnx", "mb-bad", &["--microbatches", "some"]);
    assert!(
        err.contains("`some` is neither a number nor `auto`"),
        "{err}"
    );
}

/// When nothing fits even with recomputation, the error names the device and what fills
/// it; without recomputation it points at `--recompute auto`.
#[test]
fn over_the_limit_with_and_without_recomputation() {
    let args = |r: &'static str| {
        vec![
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--batch",
            "16",
            "--plan-only",
            "--memory-limit",
            "300K",
            "--recompute",
            r,
        ]
    };
    let err = compile_err("gpt.onnx", "over-auto", &args("auto"));
    for part in [
        "device 0 needs",
        "the memory limit is 293.0 KiB",
        "weights 59.6 KiB, gradients 59.6 KiB, optimizer state 59.6 KiB",
        "micro-batches in flight), temporaries of a stage function",
        "the plan closest to the limit needs",
    ] {
        assert!(err.contains(part), "{part:?} in {err}");
    }
    let err = compile_err("gpt.onnx", "over-off", &args("off"));
    assert!(err.contains("no plan fits the memory limit"), "{err}");
    assert!(
        err.contains("--recompute auto makes activations again"),
        "{err}"
    );
}

fn schedule_file(name: &str) -> String {
    example(&format!("schedules/{name}.pps"))
}

/// A `.pps` program equal to a built-in gives the same plan as the built-in by name: the
/// same stages, edges, prediction and schedule files.
#[test]
fn pps_schedule_plans_as_its_builtin() {
    for (name, extra) in [
        ("1f1b", vec![]),
        ("interleaved-1f1b", vec!["--chunks", "2"]),
    ] {
        let mut base = vec![
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--partition",
            "sequential",
            "--plan-only",
        ];
        base.extend(extra.iter().copied());
        let file = schedule_file(name);
        let mut by_name = base.clone();
        by_name.extend(["--schedule", name]);
        let mut by_file = base.clone();
        by_file.extend(["--schedule", file.as_str()]);
        let (dir_a, a) = compile_ok("mlp.onnx", &format!("pps-{name}-builtin"), &by_name);
        let (dir_b, b) = compile_ok("mlp.onnx", &format!("pps-{name}-file"), &by_file);
        for key in ["stages", "edges", "devices", "prediction"] {
            assert_eq!(a[key], b[key], "{name}: plan.json `{key}` differs");
        }
        for f in ["schedule.csv", "schedule.pps"] {
            let (x, y) = (
                std::fs::read_to_string(dir_a.join(f)).unwrap(),
                std::fs::read_to_string(dir_b.join(f)).unwrap(),
            );
            assert_eq!(x, y, "{name}: {f} differs");
        }
        let _ = std::fs::remove_dir_all(&dir_a);
        let _ = std::fs::remove_dir_all(&dir_b);
    }
}

#[test]
fn malformed_pps_schedule_names_file_line_and_column() {
    let dir = out_dir("bad-pps-src");
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.pps");
    std::fs::write(
        &bad,
        "layout chain\nrank r {\n  repeat 2 { F(0) }\n  I(0, 0) W(0 1)\n}\n",
    )
    .unwrap();
    let err = compile_err(
        "mlp.onnx",
        "bad-pps",
        &[
            "--stages",
            "2",
            "--microbatches",
            "2",
            "--plan-only",
            "--schedule",
            bad.to_str().unwrap(),
        ],
    );
    let want = format!("{}:4:15: expected `)`, found `1`", bad.display());
    assert!(err.contains(&want), "`{err}` lacks `{want}`");
    let _ = std::fs::remove_dir_all(&dir);
}

/// schedule.csv is torch.distributed.pipelining's `compute_only` form by default (no
/// transfers: torch's default loader reads it as it is) and `compute_comms` with
/// `--csv-format compute_comms`; a torch-style file with idle (empty) cells reads back and
/// is written again with the same actions; a stage DAG gets a `#` comment line that
/// ppcc's reader skips.
#[test]
fn schedule_csv_formats_round_trip() {
    // 1F1B on 2 ranks and 4 micro-batches as torch writes it (idle slots empty).
    let torch = "0F0,0F1,,0B0,0F2,0B1,0F3,0B2,0B3\n,1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n";
    let src = out_dir("csv-src");
    std::fs::create_dir_all(&src).unwrap();
    let file = src.join("torch.csv");
    std::fs::write(&file, torch).unwrap();
    let (dir, plan) = compile_ok(
        "mlp.onnx",
        "csv-compute-only",
        &[
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--schedule",
            file.to_str().unwrap(),
            "--partition",
            "sequential",
        ],
    );
    let written = std::fs::read_to_string(dir.join("schedule.csv")).unwrap();
    let cells = |t: &str| -> Vec<Vec<String>> {
        t.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                l.split(',')
                    .filter(|c| !c.is_empty())
                    .map(String::from)
                    .collect()
            })
            .collect()
    };
    assert_eq!(cells(&written), cells(torch), "{written}");
    assert!(
        !written.contains("SEND") && !written.contains("RECV"),
        "{written}"
    );
    // plan.json's actions have the transfers.
    let actions = plan["schedule"]["actions"].to_string();
    assert!(
        actions.contains("SEND_F") && actions.contains("RECV_B"),
        "{actions}"
    );
    let _ = std::fs::remove_dir_all(&dir);

    // compute_comms lists the transfers; it reads back too.
    let (dir, _) = compile_ok(
        "mlp.onnx",
        "csv-compute-comms",
        &[
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--csv-format",
            "compute_comms",
            "--partition",
            "sequential",
        ],
    );
    let comms = std::fs::read_to_string(dir.join("schedule.csv")).unwrap();
    assert!(
        comms.contains("0SEND_F0") && comms.contains("1RECV_F0"),
        "{comms}"
    );
    let again = out_dir("csv-comms-again");
    let csv = dir.join("schedule.csv");
    let (ok, _, err) = compile(
        "mlp.onnx",
        &again,
        &[
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--schedule",
            csv.to_str().unwrap(),
            "--partition",
            "sequential",
        ],
    );
    assert!(ok, "{err}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&again);

    // A V schedule's CSV (ZB-V) reads back without --csv-layout: the layout is inferred
    // from the rows, as torch does.
    let (dir, plan) = compile_ok(
        "gpt.onnx",
        "csv-zbv",
        &[
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--batch",
            "16",
            "--schedule",
            "zb-v",
        ],
    );
    let again = out_dir("csv-zbv-again");
    let csv = dir.join("schedule.csv");
    let (ok, _, err) = compile(
        "gpt.onnx",
        &again,
        &[
            "--stages",
            "2",
            "--microbatches",
            "4",
            "--batch",
            "16",
            "--schedule",
            csv.to_str().unwrap(),
        ],
    );
    assert!(ok, "{err}");
    let replan: Value =
        serde_json::from_str(&std::fs::read_to_string(again.join("plan.json")).unwrap()).unwrap();
    assert_eq!(replan["schedule"]["actions"], plan["schedule"]["actions"]);
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&again);

    // A stage DAG (two towers joined by a head) has its comment line.
    let (dir, _) = compile_ok(
        "two_tower.onnx",
        "csv-dag",
        &["--stages", "3", "--microbatches", "4", "--loss", "mse"],
    );
    let dag = std::fs::read_to_string(dir.join("schedule.csv")).unwrap();
    assert!(dag.starts_with("# ppcc stage DAG"), "{dag}");
    assert!(
        dag.lines().next().unwrap().contains("edges [0->2, 1->2]"),
        "{dag}"
    );
    assert_eq!(dag.lines().count(), 4, "{dag}");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&src);
}
