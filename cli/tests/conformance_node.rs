//! The ONNX backend node cases (one op per model, `onnx/backend/test/case/node`) through
//! `ppcc conform`, on the interpreter, with `--target cpu`, and as the loops the CUDA
//! target turns into kernels run on the CPU (`gpu-loops`: `--target cpu
//! --gpu-loops-on-cpu`, the GPU's tiling and mapping checked against the onnx reference
//! outputs), against the checked-in list `tests/conformance/node-expected.txt` (one line
//! per case: its status per target).
//!
//! Fails when a case listed `passed` no longer passes, or when a case crashes that the list
//! does not say crashes; prints cases that pass now but are not listed so, so the list can
//! be updated. Regenerate the list (after an intended change):
//!
//! ```text
//! PPCC_UPDATE_EXPECTED=1 cargo test -p ppcc --test conformance_node
//! ```
//!
//! The cases come from `PPCC_ONNX_NODE_DATA` (a `node/` folder), else from the onnx
//! package's `backend/test/data/node` when the wheel ships it, else they are generated once
//! with `scripts/onnx-node-data.py` (through `PPCC_PYTHON`, else the repository's `.venv`)
//! into `target/onnx-node-data/<onnx version>/`. `PPCC_CONFORM_TARGETS=interp` (a comma
//! list) limits the targets; `PPCC_CONFORM_CPU_EVERY=N` runs only every N-th case by sorted
//! name with `--target cpu` (the whole list takes about 20 s on 2 cores, so CI runs all);
//! `PPCC_CONFORM_GPU_LOOPS_EVERY=N` does the same for `gpu-loops`, by default every 8th
//! case (the whole list takes about twice the CPU's time; 1 runs all).
//!
//! Every case is also put in one category of [`CATEGORIES`], decided from its model alone
//! (graph input/output element types, op types and domains of its nodes); the test prints
//! the passed count per category and target, and the pass rate of the "float,
//! training-relevant" cases, the ones issue 20's goal counts (README, "ONNX node
//! conformance", lists the categories with their counts).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use ppcc_frontends::onnx::proto::{data_type as dt, GraphProto, ModelProto, NodeProto, TypeValue};
use prost::Message;

/// `gpu-loops` is `--target cpu --gpu-loops-on-cpu`: the loops the CUDA target turns into
/// kernels (tiled and mapped for the GPU), run on the CPU.
const TARGETS: [&str; 3] = ["interp", "cpu", "gpu-loops"];
const STATUSES: [&str; 5] = ["passed", "failed", "unsupported", "error", "crashed"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn expected_path() -> PathBuf {
    repo().join("tests/conformance/node-expected.txt")
}

fn python() -> String {
    std::env::var("PPCC_PYTHON")
        .unwrap_or_else(|_| repo().join(".venv/bin/python").display().to_string())
}

fn py(code: &str) -> String {
    let py = python();
    let out = Command::new(&py)
        .args(["-c", code])
        .output()
        .unwrap_or_else(|e| panic!("{py}: {e} (run scripts/setup.sh --test)"));
    assert!(
        out.status.success(),
        "{py} -c {code:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The `node/` folder of test cases (see the module docs for where it comes from).
fn node_data() -> PathBuf {
    if let Some(d) = std::env::var_os("PPCC_ONNX_NODE_DATA") {
        return PathBuf::from(d);
    }
    let shipped = match std::env::var_os("PPCC_ONNX_TESTDATA") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(py(
            "import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), 'backend', 'test', 'data'))",
        )),
    }
    .join("node");
    if shipped.is_dir() {
        return shipped;
    }
    let version = py("import onnx, numpy; print(onnx.__version__ + '-numpy' + numpy.__version__)");
    let root = repo().join("target/onnx-node-data").join(version);
    let node = root.join("node");
    if !root.join("complete").is_file() {
        let _ = std::fs::remove_dir_all(&root);
        let o = Command::new(python())
            .arg(repo().join("scripts/onnx-node-data.py"))
            .arg(&root)
            .output()
            .expect("runs scripts/onnx-node-data.py");
        assert!(
            o.status.success(),
            "scripts/onnx-node-data.py {}: {}",
            root.display(),
            String::from_utf8_lossy(&o.stderr)
        );
        std::fs::write(root.join("complete"), "").unwrap();
    }
    node
}

/// Status by case name, from the rows `ppcc conform` prints before its table.
fn parse_rows(stdout: &str) -> BTreeMap<String, String> {
    stdout
        .lines()
        .take_while(|l| !l.is_empty())
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (status, name) = (w.next()?, w.next()?);
            STATUSES
                .contains(&status)
                .then(|| (name.to_string(), status.to_string()))
        })
        .collect()
}

/// `case -> target -> status` from the checked-in list.
fn read_expected() -> BTreeMap<String, BTreeMap<String, String>> {
    let text = std::fs::read_to_string(expected_path()).unwrap_or_default();
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let w: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(w.len(), 1 + TARGETS.len(), "bad line {line:?}");
        let per: BTreeMap<String, String> = TARGETS
            .iter()
            .zip(&w[1..])
            .filter(|(_, s)| **s != "-")
            .map(|(t, s)| (t.to_string(), s.to_string()))
            .collect();
        out.insert(w[0].to_string(), per);
    }
    out
}

fn write_expected(
    list: &BTreeMap<String, BTreeMap<String, String>>,
    onnx: &str,
) -> std::io::Result<()> {
    let width = list.keys().map(String::len).max().unwrap_or(4);
    let mut text = format!(
        "# ONNX backend node cases ({onnx}): the status of each on the interpreter, with\n\
         # --target cpu, and as the CUDA target's loops run on the CPU (--target cpu\n\
         # --gpu-loops-on-cpu) (passed, failed, unsupported, error, crashed; `-`: not run).\n\
         # cli/tests/conformance_node.rs fails when a case listed `passed` stops passing or a\n\
         # case crashes that is not listed `crashed`. Regenerate:\n\
         #   PPCC_UPDATE_EXPECTED=1 cargo test -p ppcc --test conformance_node\n\
         # {:<w$}  {:<11}  {:<11}  gpu-loops\n",
        "case",
        "interp",
        "cpu",
        w = width.saturating_sub(2)
    );
    for (name, per) in list {
        text.push_str(&format!("{name:<width$}"));
        for t in TARGETS {
            let s = per.get(t).map(String::as_str).unwrap_or("-");
            text.push_str(&format!("  {s:<11}"));
        }
        text.truncate(text.trim_end().len());
        text.push('\n');
    }
    std::fs::write(expected_path(), text)
}

/// The category of the cases the issue's goal counts ("float, training-relevant").
const TRAINING: &str = "float, training-relevant";

/// The categories, in the order they are tested (the first that applies wins) and printed.
/// Each is decided from the case's model alone: its graph's input/output element types and
/// the op types and domains of its nodes (subgraphs included).
const CATEGORIES: [(&str, &str); 9] = [
    (
        "sequence/optional",
        "a graph input/output that is a sequence, optional or map, or a Sequence*/Optional*/SplitToSequence/ConcatFromSequence node",
    ),
    ("string", "a STRING graph input/output, or a String*/RegexFullMatch node"),
    (
        "float8/6/4/2-bit",
        "a graph input/output of a FLOAT8*, FLOAT6*, FLOAT4E2M1, (U)INT4 or (U)INT2 type",
    ),
    (
        "quantization",
        "a (Dynamic)QuantizeLinear, DequantizeLinear, QLinear*, ConvInteger or MatMulInteger node",
    ),
    ("image decoding", "an ImageDecoder node"),
    (
        "classical ML",
        "a node of the ai.onnx.ml domain (tree ensembles, label encoders, ...)",
    ),
    (
        "random values",
        "a Bernoulli, Random*, Multinomial node, or a Dropout given `training_mode` (its mask is numpy's random draw)",
    ),
    (
        "no float data",
        "no graph input/output of a float type (f16, bf16, f32, f64): integer, bool and unsigned-only cases",
    ),
    (TRAINING, "every other case"),
];

fn collect_nodes<'a>(g: &'a GraphProto, out: &mut Vec<&'a NodeProto>) {
    for n in &g.node {
        out.push(n);
        for a in &n.attribute {
            if let Some(sub) = &a.g {
                collect_nodes(sub, out);
            }
            for sub in &a.graphs {
                collect_nodes(sub, out);
            }
        }
    }
}

/// The category (a name of [`CATEGORIES`]) of the case whose model is at `path`.
fn classify(path: &Path) -> &'static str {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let model =
        ModelProto::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let Some(graph) = model.graph.as_ref() else {
        return "no float data";
    };
    let mut nodes = vec![];
    collect_nodes(graph, &mut nodes);
    let has_op = |f: &dyn Fn(&str) -> bool| {
        nodes
            .iter()
            .any(|n| (n.domain.is_empty() || n.domain == "ai.onnx") && f(&n.op_type))
    };
    // Element types of the graph's inputs and outputs; `None` for non-tensor types.
    let types: Vec<Option<i32>> = graph
        .input
        .iter()
        .chain(&graph.output)
        .map(|v| match v.r#type.as_ref().and_then(|t| t.value.as_ref()) {
            Some(TypeValue::TensorType(t)) => Some(t.elem_type),
            _ => None,
        })
        .collect();
    if types.iter().any(Option::is_none)
        || has_op(&|o| {
            o.starts_with("Sequence")
                || o.starts_with("Optional")
                || o == "SplitToSequence"
                || o == "ConcatFromSequence"
        })
    {
        return "sequence/optional";
    }
    let types: Vec<i32> = types.into_iter().flatten().collect();
    if types.contains(&dt::STRING) || has_op(&|o| o.starts_with("String") || o == "RegexFullMatch")
    {
        return "string";
    }
    if types.iter().any(|t| (17..=28).contains(t)) {
        return "float8/6/4/2-bit";
    }
    if has_op(&|o| {
        matches!(
            o,
            "QuantizeLinear"
                | "DequantizeLinear"
                | "DynamicQuantizeLinear"
                | "QLinearConv"
                | "QLinearMatMul"
                | "ConvInteger"
                | "MatMulInteger"
        )
    }) {
        return "quantization";
    }
    if has_op(&|o| o == "ImageDecoder") {
        return "image decoding";
    }
    if nodes.iter().any(|n| n.domain == "ai.onnx.ml") {
        return "classical ML";
    }
    let training_dropout = nodes
        .iter()
        .any(|n| n.op_type == "Dropout" && n.input.get(2).is_some_and(|i| !i.is_empty()));
    if training_dropout
        || has_op(&|o| o == "Bernoulli" || o == "Multinomial" || o.starts_with("Random"))
    {
        return "random values";
    }
    let float = [dt::FLOAT, dt::DOUBLE, dt::FLOAT16, dt::BFLOAT16];
    if !types.iter().any(|t| float.contains(t)) {
        return "no float data";
    }
    TRAINING
}

/// Per category and target: (passed, cases); prints the table and the goal's pass rate.
fn report_categories(
    cases: &[PathBuf],
    actual: &BTreeMap<String, BTreeMap<String, String>>,
    targets: &[String],
) {
    let mut counts: BTreeMap<&str, (usize, BTreeMap<&str, usize>)> = BTreeMap::new();
    for case in cases {
        let name = case.file_name().unwrap().to_string_lossy().to_string();
        let cat = classify(&case.join("model.onnx"));
        let e = counts.entry(cat).or_default();
        e.0 += 1;
        for t in targets {
            let passed = actual
                .get(&name)
                .and_then(|per| per.get(t))
                .is_some_and(|s| s == "passed");
            *e.1.entry(t.as_str()).or_default() += usize::from(passed);
        }
    }
    eprintln!(
        "category                    cases  passed per target ({})",
        targets.join(", ")
    );
    for (cat, _) in CATEGORIES {
        let Some((n, per)) = counts.get(cat) else {
            continue;
        };
        let passed: Vec<String> = targets
            .iter()
            .map(|t| per.get(t.as_str()).copied().unwrap_or(0).to_string())
            .collect();
        eprintln!("{cat:<26}  {n:>5}  {}", passed.join("  "));
    }
    if let Some((n, per)) = counts.get(TRAINING) {
        for t in targets {
            let p = per.get(t.as_str()).copied().unwrap_or(0);
            eprintln!(
                "--target {t}: {p} of {n} float, training-relevant cases pass ({:.1}%)",
                100.0 * p as f64 / (*n).max(1) as f64
            );
        }
    }
}

fn targets() -> Vec<String> {
    match std::env::var("PPCC_CONFORM_TARGETS") {
        Ok(t) => t.split(',').map(|s| s.trim().to_string()).collect(),
        Err(_) => TARGETS.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn node_cases_match_the_expectation_list() {
    let data = node_data();
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&data)
        .unwrap_or_else(|e| panic!("{}: {e}", data.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("model.onnx").is_file())
        .collect();
    cases.sort();
    assert!(
        cases.len() > 1000,
        "only {} cases in {}",
        cases.len(),
        data.display()
    );
    let update = std::env::var_os("PPCC_UPDATE_EXPECTED").is_some_and(|v| v != "0");
    let every_of = |var: &str, default: usize| -> usize {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
            .max(1)
    };
    let every = every_of("PPCC_CONFORM_CPU_EVERY", 1);
    // The GPU loops take twice the CPU's time: CI runs every 8th case.
    let every_gpu_loops = every_of("PPCC_CONFORM_GPU_LOOPS_EVERY", 8);
    let expected = read_expected();
    let mut actual: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for target in targets() {
        assert!(
            TARGETS.contains(&target.as_str()),
            "unknown target {target}"
        );
        let mut args = vec!["conform".to_string(), "--target".into()];
        let step = match target.as_str() {
            "gpu-loops" => {
                args.extend(["cpu".into(), "--gpu-loops-on-cpu".into()]);
                every_gpu_loops
            }
            "cpu" => {
                args.push(target.clone());
                every
            }
            _ => {
                args.push(target.clone());
                1
            }
        };
        args.push("--".into());
        if step > 1 {
            args.extend(cases.iter().step_by(step).map(|p| p.display().to_string()));
        } else {
            args.push(data.display().to_string());
        }
        let t0 = Instant::now();
        let o = Command::new(env!("CARGO_BIN_EXE_ppcc"))
            .args(&args)
            .output()
            .expect("ppcc runs");
        let stdout = String::from_utf8_lossy(&o.stdout);
        let summary = stdout.lines().last().unwrap_or_default().to_string();
        eprintln!(
            "--target {target}: {summary} in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        assert!(
            summary.ends_with(" crashed"),
            "ppcc conform --target {target} did not finish: {}{}",
            stdout,
            String::from_utf8_lossy(&o.stderr)
        );
        for (name, status) in parse_rows(&stdout) {
            actual
                .entry(name)
                .or_default()
                .insert(target.clone(), status);
        }
    }

    report_categories(&cases, &actual, &targets());

    let mut regressions = vec![];
    let mut improved = vec![];
    let mut unlisted = vec![];
    for (name, per) in &actual {
        let Some(want) = expected.get(name) else {
            unlisted.push(name.clone());
            continue;
        };
        for (target, got) in per {
            let was = want.get(target).map(String::as_str).unwrap_or("-");
            if (was == "passed" && got != "passed") || (got == "crashed" && was != "crashed") {
                regressions.push(format!("{name} --target {target}: listed {was}, now {got}"));
            } else if got == "passed" && was != "passed" {
                improved.push(format!(
                    "{name} --target {target}: listed {was}, now passed"
                ));
            }
        }
    }
    let missing: Vec<&String> = expected
        .keys()
        .filter(|k| !actual.contains_key(*k))
        .collect();
    if update {
        // Keep what this run did not look at (a target left out, cases left out).
        let mut list = expected.clone();
        for (name, per) in &actual {
            list.entry(name.clone()).or_default().extend(per.clone());
        }
        if every == 1 && every_gpu_loops == 1 {
            list.retain(|k, _| actual.contains_key(k));
        }
        let onnx = py("import onnx; print('onnx ' + onnx.__version__)");
        write_expected(&list, &onnx).unwrap();
        eprintln!("wrote {} ({} cases)", expected_path().display(), list.len());
        return;
    }
    if !improved.is_empty() {
        eprintln!(
            "{} newly passing (update the list: PPCC_UPDATE_EXPECTED=1 cargo test -p ppcc --test conformance_node):\n  {}",
            improved.len(),
            improved.join("\n  ")
        );
    }
    if !unlisted.is_empty() {
        eprintln!(
            "{} cases not in the list (another onnx version?): {}",
            unlisted.len(),
            unlisted.join(", ")
        );
    }
    if !missing.is_empty() {
        eprintln!(
            "{} listed cases not in {}: {}",
            missing.len(),
            data.display(),
            missing
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    assert!(
        regressions.is_empty(),
        "{} regressions against {}:\n  {}",
        regressions.len(),
        expected_path().display(),
        regressions.join("\n  ")
    );
}
