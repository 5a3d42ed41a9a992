//! `If`, `Loop` and `Scan` unrolled at import: results against hand-computed values, and
//! the errors for what cannot be unrolled (they name the node and what must be static).

mod common;

use common::*;
use ppcc_frontends::onnx::proto::data_type;
use ppcc_frontends::onnx::{import_onnx, ImportOptions, OnnxError};
use ppir::{DType, Tensor};

fn import(m: &Model) -> Result<ppir::Module, OnnxError> {
    import_onnx(&m.bytes(), &ImportOptions::default())
}

fn bool_info(name: &str) -> ppcc_frontends::onnx::proto::ValueInfoProto {
    value_info(name, data_type::BOOL, &[])
}

fn i64_info(name: &str) -> ppcc_frontends::onnx::proto::ValueInfoProto {
    value_info(name, data_type::INT64, &[])
}

/// `If` on a run-time condition: both branches, selected per output.
#[test]
fn if_with_a_run_time_condition_selects_between_both_branches() {
    let then_g = graph(
        vec![node("Add", &["x", "x"], &["t"], vec![])],
        vec![],
        vec![f32_info("t", &[3])],
    );
    let else_g = graph(
        vec![node("Neg", &["x"], &["e"], vec![])],
        vec![],
        vec![f32_info("e", &[3])],
    );
    let m = Model::new(13)
        .input(bool_info("c"))
        .input(f32_info("x", &[3]))
        .node(node(
            "If",
            &["c"],
            &["y"],
            vec![
                attr_graph("then_branch", then_g),
                attr_graph("else_branch", else_g),
            ],
        ))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m).unwrap();
    let x = Tensor::from_f64(DType::F32, vec![3], vec![1.0, -2.0, 3.0]);
    for (c, want) in [(1, [2.0, -4.0, 6.0]), (0, [-1.0, 2.0, -3.0])] {
        let cond = Tensor::from_i64(DType::Bool, vec![], vec![c]);
        let y = run(&module, vec![cond, x.clone()]);
        assert_close(&f32s(&y[0]), &want);
    }
}

#[test]
fn if_with_a_run_time_condition_needs_branches_of_one_type() {
    let then_g = graph(
        vec![node("Identity", &["x"], &["t"], vec![])],
        vec![],
        vec![f32_info("t", &[3])],
    );
    let else_g = graph(
        vec![node(
            "ReduceSum",
            &["x"],
            &["e"],
            vec![attr_int("keepdims", 0)],
        )],
        vec![],
        vec![f32_info("e", &[])],
    );
    let m = Model::new(13)
        .input(bool_info("c"))
        .input(f32_info("x", &[3]))
        .node(node(
            "If",
            &["c"],
            &["y"],
            vec![
                attr_graph("then_branch", then_g),
                attr_graph("else_branch", else_g),
            ],
        ))
        .output(out_info("y", data_type::FLOAT));
    let e = import(&m).unwrap_err();
    assert!(e.is_unsupported(), "{e}");
    let s = e.to_string();
    assert!(s.contains(r#"node "If_y" (If, opset 13)"#), "{s}");
    assert!(s.contains("differs in type"), "{s}");
}

/// A `Loop` body that accumulates `y += x[i]` with outer-scope `x` and stacks each value.
fn loop_model(trip_input: bool) -> Model {
    let body = graph(
        vec![
            node("Identity", &["cond_in"], &["cond_out"], vec![]),
            node("Gather", &["x", "i"], &["xi"], vec![]),
            node("Add", &["y_in", "xi"], &["y_out"], vec![]),
            node("Identity", &["y_out"], &["scan"], vec![]),
        ],
        vec![i64_info("i"), bool_info("cond_in"), f32_info("y_in", &[])],
        vec![
            bool_info("cond_out"),
            f32_info("y_out", &[]),
            f32_info("scan", &[]),
        ],
    );
    let m = Model::new(13)
        .input(f32_info("x", &[4]))
        .input(f32_info("y0", &[]));
    let m = if trip_input {
        m.input(i64_info("n"))
    } else {
        m.init("n", &Tensor::from_i64(DType::I64, vec![], vec![3]))
    };
    m.node(node(
        "Loop",
        &["n", "", "y0"],
        &["y", "ys"],
        vec![attr_graph("body", body)],
    ))
    .output(out_info("y", data_type::FLOAT))
    .output(out_info("ys", data_type::FLOAT))
}

#[test]
fn loop_with_a_static_trip_count_is_unrolled() {
    let module = import(&loop_model(false)).unwrap();
    let x = Tensor::from_f64(DType::F32, vec![4], vec![1.0, 2.0, 3.0, 4.0]);
    let y0 = Tensor::from_f64(DType::F32, vec![], vec![10.0]);
    let out = run(&module, vec![x, y0]);
    assert_close(&f32s(&out[0]), &[16.0]);
    assert_close(&f32s(&out[1]), &[11.0, 13.0, 16.0]);
}

#[test]
fn loop_with_a_run_time_trip_count_is_refused_naming_the_input() {
    let e = import(&loop_model(true)).unwrap_err();
    assert_eq!(e.input_value_needed(), Some("n"), "{e}");
    let s = e.to_string();
    assert!(s.contains(r#"node "Loop_y" (Loop, opset 13)"#), "{s}");
    assert!(s.contains("trip count"), "{s}");
}

#[test]
fn loop_whose_body_computes_its_condition_at_run_time_is_refused() {
    let body = graph(
        vec![
            node(
                "ReduceSum",
                &["y_in"],
                &["s"],
                vec![attr_int("keepdims", 0)],
            ),
            node("Greater", &["s", "zero"], &["cond_out"], vec![]),
            node("Identity", &["y_in"], &["y_out"], vec![]),
        ],
        vec![i64_info("i"), bool_info("cond_in"), f32_info("y_in", &[2])],
        vec![bool_info("cond_out"), f32_info("y_out", &[2])],
    );
    let m = Model::new(13)
        .input(f32_info("y0", &[2]))
        .init("zero", &Tensor::from_f64(DType::F32, vec![], vec![0.0]))
        .init("n", &Tensor::from_i64(DType::I64, vec![], vec![5]))
        .node(node(
            "Loop",
            &["n", "", "y0"],
            &["y"],
            vec![attr_graph("body", body)],
        ))
        .output(out_info("y", data_type::FLOAT));
    let e = import(&m).unwrap_err();
    assert!(e.is_unsupported(), "{e}");
    assert!(
        e.to_string()
            .contains("computes the loop condition at run time"),
        "{e}"
    );
}

/// `Scan` (opset 9+): a running sum over axis 1 read in reverse, the scan output written
/// along axis 1 in reverse too.
#[test]
fn scan_reads_and_writes_along_axes_in_both_directions() {
    let body = graph(
        vec![
            node("Add", &["s_in", "xt"], &["s_out"], vec![]),
            node("Identity", &["s_out"], &["yt"], vec![]),
        ],
        vec![f32_info("s_in", &[2]), f32_info("xt", &[2])],
        vec![f32_info("s_out", &[2]), f32_info("yt", &[2])],
    );
    let m = Model::new(11)
        .input(f32_info("s0", &[2]))
        .input(f32_info("x", &[2, 3]))
        .node(node(
            "Scan",
            &["s0", "x"],
            &["s", "ys"],
            vec![
                attr_graph("body", body),
                attr_int("num_scan_inputs", 1),
                attr_ints("scan_input_axes", &[1]),
                attr_ints("scan_input_directions", &[1]),
                attr_ints("scan_output_axes", &[1]),
                attr_ints("scan_output_directions", &[1]),
            ],
        ))
        .output(out_info("s", data_type::FLOAT))
        .output(out_info("ys", data_type::FLOAT));
    let module = import(&m).unwrap();
    let s0 = Tensor::from_f64(DType::F32, vec![2], vec![0.0, 100.0]);
    let x = Tensor::from_f64(DType::F32, vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let out = run(&module, vec![s0, x]);
    assert_close(&f32s(&out[0]), &[6.0, 115.0]);
    // Steps read columns 2, 1, 0: sums 3, 5, 6 (and 106, 111, 115), written at columns
    // 2, 1, 0 of the output.
    assert_close(&f32s(&out[1]), &[6.0, 5.0, 3.0, 115.0, 111.0, 106.0]);
}

#[test]
fn unique_of_a_run_time_input_is_refused_naming_the_input() {
    let m = Model::new(11)
        .input(f32_info("x", &[4]))
        .node(node("Unique", &["x"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let e = import(&m).unwrap_err();
    assert_eq!(e.input_value_needed(), Some("x"), "{e}");
    assert!(e.to_string().contains("depends on its values"), "{e}");
}
