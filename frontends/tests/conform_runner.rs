//! The conformance runner's bookkeeping on small crafted cases: the op type each case is
//! counted under, the opset it imports, and the table per op type.

mod common;

use common::*;
use ppcc_frontends::onnx::conform::{case_infos, discover, OpTable, Outcome};
use ppcc_frontends::onnx::proto::data_type;

fn write_case(root: &std::path::Path, name: &str, m: &Model) {
    let d = root.join(name);
    std::fs::create_dir_all(d.join("test_data_set_0")).unwrap();
    std::fs::write(d.join("model.onnx"), m.bytes()).unwrap();
}

#[test]
fn cases_count_under_their_op_type() {
    let root = std::env::temp_dir().join(format!("ppcc-conform-runner-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let relu = Model::new(14)
        .input(f32_info("x", &[3]))
        .node(node("Relu", &["x"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    // An op's function body: several nodes, named after the case it expands.
    let body = Model::new(13)
        .input(f32_info("x", &[3]))
        .node(node("Exp", &["x"], &["e"], vec![]))
        .node(node("Log", &["e"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    write_case(&root, "test_relu", &relu);
    write_case(&root, "test_relu_expanded", &body);
    write_case(&root, "test_reduce_log_sum_exp_x_expanded", &body);
    write_case(&root, "test_two_ops", &body);
    let cases = discover(&root).unwrap();
    let names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "test_reduce_log_sum_exp_x_expanded",
            "test_relu",
            "test_relu_expanded",
            "test_two_ops"
        ]
    );
    let infos = case_infos(&cases);
    let ops: Vec<&str> = infos.iter().map(|i| i.op_type.as_str()).collect();
    assert_eq!(ops, ["ReduceLogSumExp", "Relu", "Relu", "(model)"]);
    assert_eq!(infos[1].opset, Some(14));

    let mut table = OpTable::default();
    table.add(
        "Relu",
        &Outcome::Passed {
            max_abs: 0.0,
            max_rel: 0.0,
        },
    );
    table.add("Relu", &Outcome::Crashed("signal 11 (SIGSEGV)".into()));
    table.add("Abs", &Outcome::Error("broken".into()));
    let text = table.to_string();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["op", "type", "passed", "failed", "unsupported", "crashed"]
    );
    assert_eq!(rows[1], ["Abs", "0", "1", "0", "0"]);
    assert_eq!(rows[2], ["Relu", "1", "0", "0", "1"]);
    assert_eq!(rows[3], ["total", "1", "1", "0", "1"]);
    assert_eq!(
        table.total.to_string(),
        "1 passed, 1 failed, 0 unsupported, 1 crashed"
    );
    let _ = std::fs::remove_dir_all(&root);
}
