//! Op mappings and opset differences, on small models built with the prost types,
//! encoded to bytes and imported. Results are checked through the reference interpreter
//! against values computed by hand.

mod common;

use common::*;
use ppcc_frontends::onnx::proto::data_type;
use ppcc_frontends::onnx::{import_onnx, ImportOptions};
use ppir::{ArgKind, Attr, DType, Dim, Module, OpKind, Tensor};

fn import(m: &Model) -> Module {
    import_onnx(&m.bytes(), &ImportOptions::default())
        .unwrap_or_else(|e| panic!("import failed: {e}"))
}

fn import_with(m: &Model, opts: &ImportOptions) -> Module {
    import_onnx(&m.bytes(), opts).unwrap_or_else(|e| panic!("import failed: {e}"))
}

fn ops(m: &Module) -> Vec<OpKind> {
    let f = &m.functions[0];
    f.ops().iter().map(|&o| f.op(o).kind).collect()
}

fn only_op(m: &Module, kind: OpKind) -> &ppir::OpData {
    let f = &m.functions[0];
    let found: Vec<_> = f
        .ops()
        .iter()
        .map(|&o| f.op(o))
        .filter(|o| o.kind == kind)
        .collect();
    assert_eq!(found.len(), 1, "expected one {kind}, ops: {:?}", ops(m));
    found[0]
}

fn iota(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_f32(
        shape.to_vec(),
        (0..n).map(|i| i as f32 * 0.25 - 1.0).collect(),
    )
}

#[test]
fn mlp_initializers_become_params() {
    let w = Tensor::from_f32(vec![3, 2], vec![1.0, 0.0, 0.0, 1.0, 1.0, -1.0]);
    let b = Tensor::from_f32(vec![2], vec![0.5, -10.0]);
    let m = Model::new(13)
        .input(value_info("x", data_type::FLOAT, &[Err("N"), Ok(3)]))
        .init("fc/w:0", &w)
        .init("fc/b:0", &b)
        .node(node("MatMul", &["x", "fc/w:0"], &["h"], vec![]))
        .node(node("Add", &["h", "fc/b:0"], &["a"], vec![]))
        .node(node("Relu", &["a"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m);
    let f = &module.functions[0];
    assert_eq!(f.name, "main");
    let kinds: Vec<ArgKind> = f.args().iter().map(|a| a.1).collect();
    assert_eq!(kinds, vec![ArgKind::Input, ArgKind::Param, ArgKind::Param]);
    assert_eq!(f.ty(f.args()[0].0).dims, vec![Dim::Batch, Dim::Known(3)]);
    // Names are sanitised; weights are stored under the argument names.
    assert_eq!(f.value(f.args()[1].0).name, "fc/w_0");
    assert!(module.weights.contains_key("fc/w_0") && module.weights.contains_key("fc/b_0"));
    assert_eq!(
        ops(&module),
        vec![OpKind::MatMul, OpKind::Add, OpKind::Relu]
    );
    let relu = only_op(&module, OpKind::Relu);
    assert_eq!(relu.loc.as_deref(), Some("Relu_y"));
    assert_eq!(f.value(f.results()[0]).name, "y");
    let out = run(
        &module,
        vec![Tensor::from_f32(vec![1, 3], vec![1.0, 2.0, 3.0])],
    );
    assert_close(&f32s(&out[0]), &[4.5, 0.0]);
    ppir::verify::verify_module(&module).expect("verifies");
}

#[test]
fn unnamed_nodes_get_type_and_index_locations() {
    let mut n = node("Neg", &["x"], &["y"], vec![]);
    n.name.clear();
    let m = Model::new(13)
        .input(f32_info("x", &[2]))
        .node(n)
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m);
    assert_eq!(only_op(&module, OpKind::Neg).loc.as_deref(), Some("Neg_0"));
}

#[test]
fn batch_binding_and_input_shapes() {
    let m = Model::new(13)
        .input(value_info("x", data_type::FLOAT, &[Err("batch"), Ok(4)]))
        .node(node("Relu", &["x"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let opts = ImportOptions {
        batch: Some(8),
        ..Default::default()
    };
    let module = import_with(&m, &opts);
    let f = &module.functions[0];
    assert_eq!(f.ty(f.args()[0].0).to_string(), "tensor<8x4xf32>");
    assert_eq!(f.result_types()[0].to_string(), "tensor<8x4xf32>");

    // A -1 first dimension is the batch too.
    let m = Model::new(13)
        .input(value_info("x", data_type::FLOAT, &[Ok(-1), Ok(4)]))
        .node(node("Relu", &["x"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let f = &import(&m).functions[0];
    assert_eq!(f.ty(f.args()[0].0).to_string(), "tensor<?x4xf32>");

    // Another symbolic dimension needs --input-shape, and the error says so.
    let m = Model::new(13)
        .input(value_info(
            "tokens",
            data_type::INT64,
            &[Err("batch"), Err("seq")],
        ))
        .node(node("Identity", &["tokens"], &["y"], vec![]))
        .output(out_info("y", data_type::INT64));
    let e = import_onnx(&m.bytes(), &ImportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`tokens`")
            && e.contains("dimension 1")
            && e.contains("\"seq\"")
            && e.contains("--input-shape tokens="),
        "{e}"
    );
    let mut opts = ImportOptions::default();
    opts.input_shapes.insert("tokens".into(), vec![2, 16]);
    let f = &import_with(&m, &opts).functions[0];
    assert_eq!(f.ty(f.args()[0].0).to_string(), "tensor<2x16xi64>");
    opts.input_shapes.insert("tokens".into(), vec![2]);
    assert!(import_onnx(&m.bytes(), &opts)
        .unwrap_err()
        .to_string()
        .contains("dimensions"));
}

fn softmax_model(opset: i64, axis: i64) -> Model {
    Model::new(opset)
        .input(f32_info("x", &[2, 2, 2]))
        .node(node(
            "Softmax",
            &["x"],
            &["y"],
            vec![attr_int("axis", axis)],
        ))
        .output(out_info("y", data_type::FLOAT))
}

fn softmax(v: &[f32]) -> Vec<f32> {
    let m = v.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = v.iter().map(|x| (x - m).exp()).collect();
    let s: f32 = e.iter().sum();
    e.iter().map(|x| x / s).collect()
}

#[test]
fn softmax_before_13_coerces_to_2d() {
    let x = Tensor::from_f32(vec![2, 2, 2], vec![0.0, 1.0, 2.0, 3.0, 1.0, 1.0, 0.0, -1.0]);
    let xs = f32s(&x);
    // Opset 11, axis 1: normalise over the flattened trailing [2, 2] block of each batch row.
    let old = import(&softmax_model(11, 1));
    assert!(ops(&old).contains(&OpKind::Reshape));
    let mut want = softmax(&xs[0..4]);
    want.extend(softmax(&xs[4..8]));
    assert_close(&f32s(&run(&old, vec![x.clone()])[0]), &want);
    // Opset 13, axis 1: normalise along axis 1 only.
    let new = import(&softmax_model(13, 1));
    assert_eq!(ops(&new), vec![OpKind::Softmax]);
    let mut want = vec![0.0; 8];
    for b in 0..2 {
        for k in 0..2 {
            let col = softmax(&[xs[b * 4 + k], xs[b * 4 + 2 + k]]);
            want[b * 4 + k] = col[0];
            want[b * 4 + 2 + k] = col[1];
        }
    }
    assert_close(&f32s(&run(&new, vec![x.clone()])[0]), &want);
    // The old form on the last axis needs no reshape.
    assert_eq!(ops(&import(&softmax_model(11, 2))), vec![OpKind::Softmax]);
}

#[test]
fn reduce_axes_attribute_or_input_by_opset() {
    let x = iota(&[2, 3]);
    // ReduceSum: attribute before 13, input from 13.
    let m11 = Model::new(11)
        .input(f32_info("x", &[2, 3]))
        .node(node(
            "ReduceSum",
            &["x"],
            &["y"],
            vec![attr_ints("axes", &[1]), attr_int("keepdims", 0)],
        ))
        .output(out_info("y", data_type::FLOAT));
    let m13 = Model::new(13)
        .input(f32_info("x", &[2, 3]))
        .init("axes", &Tensor::from_i64(DType::I64, vec![1], vec![1]))
        .node(node(
            "ReduceSum",
            &["x", "axes"],
            &["y"],
            vec![attr_int("keepdims", 0)],
        ))
        .output(out_info("y", data_type::FLOAT));
    for m in [m11, m13] {
        let module = import(&m);
        assert_eq!(
            only_op(&module, OpKind::ReduceSum).attrs.get("axes"),
            Some(&Attr::Ints(vec![1]))
        );
        assert_close(&f32s(&run(&module, vec![x.clone()])[0]), &[-2.25, 0.0]);
    }
    // ReduceMean: attribute until 17, input from 18; empty axes input with noop is identity.
    let m17 = Model::new(17)
        .input(f32_info("x", &[2, 3]))
        .node(node(
            "ReduceMean",
            &["x"],
            &["y"],
            vec![attr_ints("axes", &[0])],
        ))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m17);
    assert_close(
        &f32s(&run(&module, vec![x.clone()])[0]),
        &[-0.625, -0.375, -0.125],
    );
    let m18 = Model::new(18)
        .input(f32_info("x", &[2, 3]))
        .init("axes", &Tensor::from_i64(DType::I64, vec![1], vec![0]))
        .node(node("ReduceMean", &["x", "axes"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    assert_close(
        &f32s(&run(&import(&m18), vec![x.clone()])[0]),
        &[-0.625, -0.375, -0.125],
    );
    let noop = Model::new(18)
        .input(f32_info("x", &[2, 3]))
        .node(node(
            "ReduceMax",
            &["x"],
            &["y"],
            vec![attr_int("noop_with_empty_axes", 1)],
        ))
        .output(out_info("y", data_type::FLOAT));
    assert!(ops(&import(&noop)).is_empty());
}

#[test]
fn split_sizes_from_attribute_input_or_equal() {
    let x = iota(&[5]);
    let outs = |m: &Model| {
        run(&import(m), vec![x.clone()])
            .iter()
            .map(f32s)
            .collect::<Vec<_>>()
    };
    let m11 = Model::new(11)
        .input(f32_info("x", &[5]))
        .node(node(
            "Split",
            &["x"],
            &["a", "b"],
            vec![attr_ints("split", &[2, 3])],
        ))
        .output(out_info("a", data_type::FLOAT))
        .output(out_info("b", data_type::FLOAT));
    assert_eq!(outs(&m11), vec![vec![-1.0, -0.75], vec![-0.5, -0.25, 0.0]]);
    let m13 = Model::new(13)
        .input(f32_info("x", &[5]))
        .init("s", &Tensor::from_i64(DType::I64, vec![2], vec![4, 1]))
        .node(node("Split", &["x", "s"], &["a", "b"], vec![]))
        .output(out_info("a", data_type::FLOAT))
        .output(out_info("b", data_type::FLOAT));
    assert_eq!(outs(&m13)[1], vec![0.0]);
    // Opset 18: num_outputs, the last part smaller.
    let m18 = Model::new(18)
        .input(f32_info("x", &[5]))
        .node(node(
            "Split",
            &["x"],
            &["a", "b"],
            vec![attr_int("num_outputs", 2)],
        ))
        .output(out_info("a", data_type::FLOAT))
        .output(out_info("b", data_type::FLOAT));
    assert_eq!(outs(&m18)[0].len(), 3);
    assert_eq!(outs(&m18)[1].len(), 2);
    // Before 18 an uneven equal split is an error naming the node.
    let bad = Model::new(13)
        .input(f32_info("x", &[5]))
        .node(node("Split", &["x"], &["a", "b"], vec![]))
        .output(out_info("a", data_type::FLOAT))
        .output(out_info("b", data_type::FLOAT));
    let e = import_onnx(&bad.bytes(), &ImportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("Split_a") && e.contains("equal parts"), "{e}");
}

#[test]
fn clip_bounds_attributes_or_inputs() {
    let x = Tensor::from_f32(vec![4], vec![-2.0, -0.5, 0.5, 2.0]);
    let m6 = Model::new(6)
        .input(f32_info("x", &[4]))
        .node(node(
            "Clip",
            &["x"],
            &["y"],
            vec![attr_float("min", -1.0), attr_float("max", 1.0)],
        ))
        .output(out_info("y", data_type::FLOAT));
    let m12 = Model::new(12)
        .input(f32_info("x", &[4]))
        .init("lo", &Tensor::from_f32(vec![], vec![-1.0]))
        .init("hi", &Tensor::from_f32(vec![], vec![1.0]))
        .node(node("Clip", &["x", "lo", "hi"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    for m in [m6, m12] {
        let module = import(&m);
        let clip = only_op(&module, OpKind::Clip);
        assert_eq!(clip.attrs.get("min"), Some(&Attr::Float(-1.0)));
        assert_close(
            &f32s(&run(&module, vec![x.clone()])[0]),
            &[-1.0, -0.5, 0.5, 1.0],
        );
    }
    // Only a max, computed at run time: clip then min.
    let m = Model::new(13)
        .input(f32_info("x", &[4]))
        .input(f32_info("hi", &[]))
        .node(node("Clip", &["x", "", "hi"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m);
    assert!(ops(&module).contains(&OpKind::Min));
    let out = run(
        &module,
        vec![x.clone(), Tensor::from_f32(vec![], vec![0.0])],
    );
    assert_close(&f32s(&out[0]), &[-2.0, -0.5, 0.0, 0.0]);
}

#[test]
fn pad_attributes_or_inputs() {
    let x = Tensor::from_f32(vec![1, 2], vec![1.0, 2.0]);
    let m2 = Model::new(10)
        .input(f32_info("x", &[1, 2]))
        .node(node(
            "Pad",
            &["x"],
            &["y"],
            vec![attr_ints("pads", &[0, 1, 0, 2]), attr_float("value", 9.0)],
        ))
        .output(out_info("y", data_type::FLOAT));
    let m11 = Model::new(11)
        .input(f32_info("x", &[1, 2]))
        .init(
            "pads",
            &Tensor::from_i64(DType::I64, vec![4], vec![0, 1, 0, 2]),
        )
        .init("v", &Tensor::from_f32(vec![], vec![9.0]))
        .node(node("Pad", &["x", "pads", "v"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    // Opset 18: pads for the listed axes only.
    let m18 = Model::new(18)
        .input(f32_info("x", &[1, 2]))
        .init("pads", &Tensor::from_i64(DType::I64, vec![2], vec![1, 2]))
        .init("v", &Tensor::from_f32(vec![], vec![9.0]))
        .init("axes", &Tensor::from_i64(DType::I64, vec![1], vec![-1]))
        .node(node("Pad", &["x", "pads", "v", "axes"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    for m in [m2, m11, m18] {
        let module = import(&m);
        assert_eq!(
            only_op(&module, OpKind::Pad).attrs.get("pads"),
            Some(&Attr::Ints(vec![0, 1, 0, 2]))
        );
        assert_close(
            &f32s(&run(&module, vec![x.clone()])[0]),
            &[9.0, 1.0, 2.0, 9.0, 9.0],
        );
    }
}

#[test]
fn slice_attributes_or_inputs() {
    let x = iota(&[2, 4]);
    let m9 = Model::new(9)
        .input(f32_info("x", &[2, 4]))
        .node(node(
            "Slice",
            &["x"],
            &["y"],
            vec![
                attr_ints("starts", &[1]),
                attr_ints("ends", &[1000]),
                attr_ints("axes", &[1]),
            ],
        ))
        .output(out_info("y", data_type::FLOAT));
    assert_close(
        &f32s(&run(&import(&m9), vec![x.clone()])[0]),
        &[-0.75, -0.5, -0.25, 0.25, 0.5, 0.75],
    );
    let m13 = Model::new(13)
        .input(f32_info("x", &[2, 4]))
        .init("s", &Tensor::from_i64(DType::I64, vec![1], vec![-1]))
        .init("e", &Tensor::from_i64(DType::I64, vec![1], vec![i64::MIN]))
        .init("a", &Tensor::from_i64(DType::I64, vec![1], vec![1]))
        .init("st", &Tensor::from_i64(DType::I64, vec![1], vec![-2]))
        .node(node("Slice", &["x", "s", "e", "a", "st"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m13);
    assert_eq!(
        only_op(&module, OpKind::Slice).attrs.get("steps"),
        Some(&Attr::Ints(vec![-2]))
    );
    assert_close(
        &f32s(&run(&module, vec![x])[0]),
        &[-0.25, -0.75, 0.75, 0.25],
    );
}

#[test]
fn squeeze_unsqueeze_axes_attribute_or_input() {
    let x = iota(&[3]);
    let m11 = Model::new(11)
        .input(f32_info("x", &[3]))
        .node(node(
            "Unsqueeze",
            &["x"],
            &["u"],
            vec![attr_ints("axes", &[0, 2])],
        ))
        .node(node(
            "Squeeze",
            &["u"],
            &["y"],
            vec![attr_ints("axes", &[0])],
        ))
        .output(out_info("u", data_type::FLOAT))
        .output(out_info("y", data_type::FLOAT));
    let m13 = Model::new(13)
        .input(f32_info("x", &[3]))
        .init("ua", &Tensor::from_i64(DType::I64, vec![2], vec![0, 2]))
        .init("sa", &Tensor::from_i64(DType::I64, vec![1], vec![0]))
        .node(node("Unsqueeze", &["x", "ua"], &["u"], vec![]))
        .node(node("Squeeze", &["u", "sa"], &["y"], vec![]))
        .output(out_info("u", data_type::FLOAT))
        .output(out_info("y", data_type::FLOAT));
    for m in [m11, m13] {
        let module = import(&m);
        let tys: Vec<String> = module.functions[0]
            .result_types()
            .iter()
            .map(|t| t.to_string())
            .collect();
        assert_eq!(tys, vec!["tensor<1x3x1xf32>", "tensor<3x1xf32>"]);
        run(&module, vec![x.clone()]);
    }
}

#[test]
fn dropout_ratio_attribute_or_input_and_mask() {
    let m10 = Model::new(10)
        .input(f32_info("x", &[2]))
        .node(node(
            "Dropout",
            &["x"],
            &["y"],
            vec![attr_float("ratio", 0.25)],
        ))
        .output(out_info("y", data_type::FLOAT));
    let m12 = Model::new(12)
        .input(f32_info("x", &[2]))
        .init("r", &Tensor::from_f32(vec![], vec![0.25]))
        .node(node("Dropout", &["x", "r"], &["y", "mask"], vec![]))
        .output(out_info("y", data_type::FLOAT))
        .output(out_info("mask", data_type::BOOL));
    for m in [m10, m12] {
        let module = import(&m);
        assert_eq!(
            only_op(&module, OpKind::Dropout).attrs.get("ratio"),
            Some(&Attr::Float(0.25))
        );
        let out = run(&module, vec![Tensor::from_f32(vec![2], vec![1.0, 2.0])]);
        assert_close(&f32s(&out[0]), &[1.0, 2.0]);
        if out.len() == 2 {
            assert_eq!(out[1].as_i64().unwrap(), &[1, 1]);
        }
    }
}

#[test]
fn legacy_broadcast_with_axis_before_opset_7() {
    // Opset 6: B of shape [3] added along axis 1 of A [2, 3, 2].
    let m = Model::new(6)
        .input(f32_info("a", &[2, 3, 2]))
        .input(f32_info("b", &[3]))
        .node(node(
            "Add",
            &["a", "b"],
            &["y"],
            vec![attr_int("broadcast", 1), attr_int("axis", 1)],
        ))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m);
    let a = Tensor::from_f32(vec![2, 3, 2], vec![0.0; 12]);
    let b = Tensor::from_f32(vec![3], vec![1.0, 2.0, 3.0]);
    let out = run(&module, vec![a, b]);
    assert_close(
        &f32s(&out[0]),
        &[1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0],
    );
}

#[test]
fn prelu_slope_on_channels_before_opset_7() {
    let m = Model::new(6)
        .input(f32_info("x", &[1, 2, 2]))
        .init("slope", &Tensor::from_f32(vec![2], vec![0.5, 2.0]))
        .node(node("PRelu", &["x", "slope"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let out = run(
        &import(&m),
        vec![Tensor::from_f32(vec![1, 2, 2], vec![-1.0, 1.0, -1.0, 1.0])],
    );
    assert_close(&f32s(&out[0]), &[-0.5, 1.0, -2.0, 1.0]);
}

#[test]
fn shape_subgraph_folds_into_a_static_reshape() {
    // y = x.view(x.size(0), -1) as PyTorch exports it.
    let m = Model::new(13)
        .input(value_info("x", data_type::FLOAT, &[Err("N"), Ok(2), Ok(3)]))
        .init("zero", &Tensor::from_i64(DType::I64, vec![], vec![0]))
        .init("minus1", &Tensor::from_i64(DType::I64, vec![1], vec![-1]))
        .init("ax0", &Tensor::from_i64(DType::I64, vec![1], vec![0]))
        .node(node("Shape", &["x"], &["s"], vec![]))
        .node(node(
            "Gather",
            &["s", "zero"],
            &["n"],
            vec![attr_int("axis", 0)],
        ))
        .node(node("Unsqueeze", &["n", "ax0"], &["n1"], vec![]))
        .node(node(
            "Concat",
            &["n1", "minus1"],
            &["target"],
            vec![attr_int("axis", 0)],
        ))
        .node(node("Reshape", &["x", "target"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    // Symbolic batch: the batch size becomes the reshape's -1.
    let module = import(&m);
    assert_eq!(ops(&module), vec![OpKind::Reshape]);
    let r = only_op(&module, OpKind::Reshape);
    assert_eq!(r.attrs.get("shape"), Some(&Attr::Ints(vec![-1, 6])));
    assert_eq!(
        module.functions[0].result_types()[0].to_string(),
        "tensor<?x6xf32>"
    );
    let out = run(&module, vec![iota(&[2, 2, 3])]);
    assert_eq!(out[0].shape, vec![2, 6]);
    // Bound batch: fully static.
    let module = import_with(
        &m,
        &ImportOptions {
            batch: Some(4),
            ..Default::default()
        },
    );
    assert_eq!(
        only_op(&module, OpKind::Reshape).attrs.get("shape"),
        Some(&Attr::Ints(vec![4, 6]))
    );
}

#[test]
fn batch_dependent_arithmetic_asks_for_batch() {
    // Reshape to [N * 2, -1]: the batch size times 2 cannot stay symbolic.
    let m = Model::new(13)
        .input(value_info("x", data_type::FLOAT, &[Err("N"), Ok(2), Ok(3)]))
        .init("idx", &Tensor::from_i64(DType::I64, vec![1], vec![0]))
        .init("two", &Tensor::from_i64(DType::I64, vec![1], vec![2]))
        .init("minus1", &Tensor::from_i64(DType::I64, vec![1], vec![-1]))
        .node(node("Shape", &["x"], &["s"], vec![]))
        .node(node("Gather", &["s", "idx"], &["n"], vec![]))
        .node(node("Mul", &["n", "two"], &["n2"], vec![]))
        .node(node(
            "Concat",
            &["n2", "minus1"],
            &["t"],
            vec![attr_int("axis", 0)],
        ))
        .node(node("Reshape", &["x", "t"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let e = import_onnx(&m.bytes(), &ImportOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("--batch"), "{e}");
    let module = import_with(
        &m,
        &ImportOptions {
            batch: Some(3),
            ..Default::default()
        },
    );
    assert_eq!(
        only_op(&module, OpKind::Reshape).attrs.get("shape"),
        Some(&Attr::Ints(vec![6, 3]))
    );
}

#[test]
fn constants_fold_and_materialise() {
    // ConstantOfShape + Range + Constant(value_float) feeding run-time ops.
    let m = Model::new(13)
        .input(f32_info("x", &[2, 3]))
        .init("shape", &Tensor::from_i64(DType::I64, vec![2], vec![2, 3]))
        .node(node(
            "ConstantOfShape",
            &["shape"],
            &["ones"],
            vec![attr_tensor("value", &Tensor::from_f32(vec![1], vec![1.5]))],
        ))
        .node(node(
            "Constant",
            &[],
            &["start"],
            vec![attr_tensor(
                "value",
                &Tensor::from_i64(DType::I64, vec![], vec![0]),
            )],
        ))
        .node(node(
            "Constant",
            &[],
            &["limit"],
            vec![attr_tensor(
                "value",
                &Tensor::from_i64(DType::I64, vec![], vec![3]),
            )],
        ))
        .node(node(
            "Constant",
            &[],
            &["delta"],
            vec![attr_tensor(
                "value",
                &Tensor::from_i64(DType::I64, vec![], vec![1]),
            )],
        ))
        .node(node("Range", &["start", "limit", "delta"], &["r"], vec![]))
        .node(node(
            "Cast",
            &["r"],
            &["rf"],
            vec![attr_int("to", data_type::FLOAT as i64)],
        ))
        .node(node(
            "Constant",
            &[],
            &["half"],
            vec![attr_float("value_float", 0.5)],
        ))
        .node(node("Mul", &["rf", "half"], &["rh"], vec![]))
        .node(node("Add", &["x", "ones"], &["a"], vec![]))
        .node(node("Add", &["a", "rh"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m);
    // The splat is a scalar constant expanded at run time; the range arithmetic is folded.
    assert_eq!(
        ops(&module),
        vec![
            OpKind::Constant,
            OpKind::Expand,
            OpKind::Add,
            OpKind::Constant,
            OpKind::Add
        ]
    );
    let f = &module.functions[0];
    let expand = only_op(&module, OpKind::Expand);
    assert_eq!(f.value(expand.results()[0]).name, "ones");
    assert_eq!(expand.loc.as_deref(), Some("ConstantOfShape_ones"));
    let out = run(&module, vec![Tensor::from_f32(vec![2, 3], vec![0.0; 6])]);
    assert_close(&f32s(&out[0]), &[1.5, 2.0, 2.5, 1.5, 2.0, 2.5]);
}

#[test]
fn conv_auto_pad_becomes_explicit_pads() {
    let w = Tensor::from_f32(vec![1, 1, 3, 3], vec![1.0; 9]);
    let m = Model::new(11)
        .input(f32_info("x", &[1, 1, 4, 4]))
        .init("w", &w)
        .node(node(
            "Conv",
            &["x", "w"],
            &["y"],
            vec![
                attr_str("auto_pad", "SAME_UPPER"),
                attr_ints("strides", &[2, 2]),
            ],
        ))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m);
    let conv = only_op(&module, OpKind::Conv);
    // out = ceil(4 / 2) = 2; total pad = (2 - 1) * 2 + 3 - 4 = 1, the extra at the end.
    assert_eq!(conv.attrs.get("pads"), Some(&Attr::Ints(vec![0, 0, 1, 1])));
    let out = run(
        &module,
        vec![Tensor::from_f32(vec![1, 1, 4, 4], vec![1.0; 16])],
    );
    assert_close(&f32s(&out[0]), &[9.0, 6.0, 6.0, 4.0]);
    let lower = Model::new(11)
        .input(f32_info("x", &[1, 1, 4, 4]))
        .init("w", &w)
        .node(node(
            "MaxPool",
            &["x"],
            &["y"],
            vec![
                attr_str("auto_pad", "SAME_LOWER"),
                attr_ints("kernel_shape", &[3, 3]),
                attr_ints("strides", &[2, 2]),
            ],
        ))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&lower);
    assert_eq!(
        only_op(&module, OpKind::MaxPool).attrs.get("pads"),
        Some(&Attr::Ints(vec![1, 1, 0, 0]))
    );
}

#[test]
fn variadic_sum_mean_max_become_chains() {
    let m = Model::new(13)
        .input(f32_info("a", &[2]))
        .input(f32_info("b", &[2]))
        .input(f32_info("c", &[2]))
        .node(node("Sum", &["a", "b", "c"], &["s"], vec![]))
        .node(node("Mean", &["a", "b", "c"], &["m"], vec![]))
        .node(node("Max", &["a", "b", "c"], &["x"], vec![]))
        .node(node("Min", &["a"], &["n"], vec![]))
        .output(out_info("s", data_type::FLOAT))
        .output(out_info("m", data_type::FLOAT))
        .output(out_info("x", data_type::FLOAT))
        .output(out_info("n", data_type::FLOAT));
    let module = import(&m);
    let t = |v: [f32; 2]| Tensor::from_f32(vec![2], v.to_vec());
    let out = run(&module, vec![t([1.0, 5.0]), t([2.0, -1.0]), t([3.0, 2.0])]);
    assert_close(&f32s(&out[0]), &[6.0, 6.0]);
    assert_close(&f32s(&out[1]), &[2.0, 2.0]);
    assert_close(&f32s(&out[2]), &[3.0, 5.0]);
    assert_close(&f32s(&out[3]), &[1.0, 5.0]);
}

#[test]
fn batch_norm_statistics_are_state() {
    let c = |v: f32| Tensor::from_f32(vec![2], vec![v, v]);
    let m = Model::new(15)
        .input(f32_info("x", &[1, 2, 1, 1]))
        .init("scale", &c(2.0))
        .init("bias", &c(1.0))
        .init("mean", &c(0.5))
        .init("var", &c(4.0))
        .node(node(
            "BatchNormalization",
            &["x", "scale", "bias", "mean", "var"],
            &["y"],
            vec![attr_float("epsilon", 0.0)],
        ))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m);
    let kinds: Vec<ArgKind> = module.functions[0].args().iter().map(|a| a.1).collect();
    assert_eq!(
        kinds,
        vec![
            ArgKind::Input,
            ArgKind::Param,
            ArgKind::Param,
            ArgKind::State,
            ArgKind::State
        ]
    );
    let out = run(
        &module,
        vec![Tensor::from_f32(vec![1, 2, 1, 1], vec![2.5, 0.5])],
    );
    assert_close(&f32s(&out[0]), &[3.0, 1.0]);
}

#[test]
fn names_are_sanitised_and_unique() {
    let m = Model::new(13)
        .input(f32_info("in:0", &[1]))
        .init("w:0", &Tensor::from_f32(vec![1], vec![2.0]))
        .init("w_0", &Tensor::from_f32(vec![1], vec![3.0]))
        .node(node("Mul", &["in:0", "w:0"], &["a b"], vec![]))
        .node(node("Mul", &["a b", "w_0"], &["out"], vec![]))
        .output(out_info("out", data_type::FLOAT));
    let module = import(&m);
    let f = &module.functions[0];
    let names: Vec<&str> = f
        .args()
        .iter()
        .map(|a| f.value(a.0).name.as_str())
        .collect();
    assert_eq!(names, vec!["in_0", "w_0", "w_0_1"]);
    assert_eq!(module.weights["w_0"].as_f64().unwrap(), &[2.0]);
    assert_eq!(module.weights["w_0_1"].as_f64().unwrap(), &[3.0]);
    assert_close(
        &f32s(&run(&module, vec![Tensor::from_f32(vec![1], vec![1.0])])[0]),
        &[6.0],
    );
}

#[test]
fn known_input_values_fold_into_static_attributes() {
    let m = Model::new(13)
        .input(f32_info("x", &[1, 3, 1]))
        .input(value_info("shape", data_type::INT64, &[Ok(3)]))
        .node(node("Expand", &["x", "shape"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let e = import_onnx(&m.bytes(), &ImportOptions::default()).unwrap_err();
    assert!(e.is_unsupported());
    assert!(e.to_string().contains("graph input `shape`"), "{e}");
    let mut opts = ImportOptions::default();
    opts.input_values.insert(
        "shape".into(),
        Tensor::from_i64(DType::I64, vec![3], vec![2, 1, 4]),
    );
    let module = import_with(&m, &opts);
    assert_eq!(module.functions[0].args().len(), 1);
    assert_eq!(
        only_op(&module, OpKind::Expand).attrs.get("shape"),
        Some(&Attr::Ints(vec![2, 1, 4]))
    );
    assert_eq!(
        module.functions[0].result_types()[0].to_string(),
        "tensor<2x3x4xf32>"
    );
}

#[test]
fn sequences_unroll_at_import_time() {
    let m = Model::new(12)
        .input(f32_info("x", &[2, 3]))
        .input(f32_info("y", &[2, 3]))
        .init("pos", &Tensor::from_i64(DType::I64, vec![], vec![-1]))
        .node(node("SequenceConstruct", &["x", "y"], &["s"], vec![]))
        .node(node("SequenceAt", &["s", "pos"], &["last"], vec![]))
        .node(node("SequenceLength", &["s"], &["n"], vec![]))
        .node(node(
            "ConcatFromSequence",
            &["s"],
            &["stacked"],
            vec![attr_int("axis", 0), attr_int("new_axis", 1)],
        ))
        .output(out_info("last", data_type::FLOAT))
        .output(out_info("n", data_type::INT64))
        .output(out_info("stacked", data_type::FLOAT));
    let module = import(&m);
    let out = run(
        &module,
        vec![iota(&[2, 3]), Tensor::from_f32(vec![2, 3], vec![7.0; 6])],
    );
    assert_close(&f32s(&out[0]), &[7.0; 6]);
    assert_eq!(out[1].as_i64().unwrap(), &[2]);
    assert_eq!(out[2].shape, vec![2, 2, 3]);
}

#[test]
fn opset_20_gelu_and_opset_17_layer_norm() {
    let m = Model::new(20)
        .input(f32_info("x", &[1, 4]))
        .init("g", &Tensor::from_f32(vec![4], vec![1.0; 4]))
        .init("b", &Tensor::from_f32(vec![4], vec![0.0; 4]))
        .node(node(
            "LayerNormalization",
            &["x", "g", "b"],
            &["n"],
            vec![attr_float("epsilon", 0.0)],
        ))
        .node(node("Gelu", &["n"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m);
    assert_eq!(ops(&module), vec![OpKind::LayerNorm, OpKind::Gelu]);
    let out = run(
        &module,
        vec![Tensor::from_f32(vec![1, 4], vec![1.0, 2.0, 3.0, 4.0])],
    );
    assert_eq!(out[0].shape, vec![1, 4]);
}

#[test]
fn printed_module_parses_back() {
    let m = Model::new(13)
        .input(f32_info("x", &[2, 20]))
        .init(
            "w",
            &Tensor::from_f32(vec![20, 3], (0..60).map(|i| i as f32 / 7.0).collect()),
        )
        .node(node("MatMul", &["x", "w"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m);
    let text = ppir::text::print_module(&module, &ppir::text::PrintOptions::default());
    let back = ppir::text::parse_module(&text).expect("parses");
    assert_eq!(ppir::text::print_module(&back, &Default::default()), text);
    assert_eq!(back.weights, module.weights);
}

/// ONNX's `test_convtranspose_output_shape`: an `output_shape` beyond the full output
/// (9x7 here) grows the output at the end (total padding -1 per axis in the spec's
/// formula), as onnx's reference and onnxruntime do; it used to stay 9x7.
#[test]
fn conv_transpose_output_shape_beyond_the_full_output() {
    let x = Tensor::from_f32(vec![1, 1, 3, 3], (0..9).map(|v| v as f32).collect());
    let w = Tensor::from_f32(vec![1, 2, 3, 3], vec![1.0; 18]);
    let m = Model::new(11)
        .input(f32_info("x", &[1, 1, 3, 3]))
        .init("w", &w)
        .node(node(
            "ConvTranspose",
            &["x", "w"],
            &["y"],
            vec![
                attr_ints("strides", &[3, 2]),
                attr_ints("output_shape", &[10, 8]),
            ],
        ))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m);
    let ct = only_op(&module, OpKind::ConvTranspose);
    assert_eq!(ct.attrs.get("pads"), Some(&Attr::Ints(vec![0, 0, 0, 0])));
    assert_eq!(
        ct.attrs.get("output_padding"),
        Some(&Attr::Ints(vec![1, 1]))
    );
    let f = &module.functions[0];
    let y = f.ty(ct.results()[0]);
    assert_eq!(y.static_shape(), Some(vec![1, 2, 10, 8]));
    let out = run(&module, vec![x]);
    assert_eq!(out[0].shape, vec![1, 2, 10, 8]);
    // Channel 0 of onnx's reference output (channel 1 is equal: the weights are all ones).
    let rows: [[f32; 8]; 4] = [
        [0.0, 0.0, 1.0, 1.0, 3.0, 2.0, 2.0, 0.0],
        [3.0, 3.0, 7.0, 4.0, 9.0, 5.0, 5.0, 0.0],
        [6.0, 6.0, 13.0, 7.0, 15.0, 8.0, 8.0, 0.0],
        [0.0; 8],
    ];
    let want: Vec<f32> = [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
        .iter()
        .flat_map(|&r| rows[r])
        .collect();
    let got = f32s(&out[0]);
    assert_close(&got[..80], &want);
    assert_close(&got[80..], &want);
}

#[test]
fn opsets_26_to_28_import() {
    // Ops whose newest version is ≤ 25 mean the same at opsets 26–28.
    for opset in [26, 27, 28] {
        let m = Model::new(opset)
            .input(f32_info("x", &[1, 3]))
            .node(node("Softmax", &["x"], &["s"], vec![]))
            .node(node(
                "Cast",
                &["s"],
                &["y"],
                vec![attr_int("to", data_type::DOUBLE as i64)],
            ))
            .output(out_info("y", data_type::DOUBLE));
        let module = import(&m);
        let out = run(&module, vec![Tensor::from_f32(vec![1, 3], vec![0.0; 3])]);
        assert_eq!(out[0].dtype, DType::F64);
        assert_close(&f32s(&out[0]), &[1.0 / 3.0; 3]);
    }
}

fn range_model(
    opset: i64,
    dtype: DType,
    attrs: Vec<ppcc_frontends::onnx::proto::AttributeProto>,
) -> Model {
    let s = |v: f64| Tensor::from_f64(dtype, vec![], vec![v]);
    let ty = ppcc_frontends::onnx::tensor::dtype_to_onnx(dtype);
    Model::new(opset)
        .init("start", &s(1.0))
        .init("limit", &s(5.0))
        .init("delta", &s(2.0))
        .node(node("Range", &["start", "limit", "delta"], &["r"], attrs))
        .output(out_info("r", ty))
}

#[test]
fn range_27_stash_type() {
    // Version 27 takes float16/bfloat16, computed in `stash_type` (float or double).
    for dtype in [DType::F16, DType::BF16] {
        for attrs in [vec![], vec![attr_int("stash_type", 11)]] {
            let out = run(&import(&range_model(27, dtype, attrs)), vec![]);
            assert_eq!(out[0].dtype, dtype);
            assert_close(&f32s(&out[0]), &[1.0, 3.0]);
        }
        let e = import_onnx(
            &range_model(27, dtype, vec![attr_int("stash_type", 10)]).bytes(),
            &ImportOptions::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("stash_type must be 1"), "{e}");
    }
    // Other types ignore it.
    let m = range_model(27, DType::F32, vec![attr_int("stash_type", 10)]);
    assert_close(&f32s(&run(&import(&m), vec![])[0]), &[1.0, 3.0]);
}

#[test]
fn log_reductions_28_take_floats_only() {
    let m = |ty: i32, opset: i64| {
        Model::new(opset)
            .input(value_info("x", ty, &[Ok(2), Ok(2)]))
            .init("axes", &Tensor::from_i64(DType::I64, vec![1], vec![1]))
            .node(node(
                "ReduceLogSumExp",
                &["x", "axes"],
                &["y"],
                vec![attr_int("keepdims", 0)],
            ))
            .output(out_info("y", ty))
    };
    let out = run(
        &import(&m(data_type::FLOAT, 28)),
        vec![Tensor::from_f32(vec![2, 2], vec![0.0, 0.0, 1.0, 1.0])],
    );
    let l2 = 2f32.ln();
    assert_close(&f32s(&out[0]), &[l2, 1.0 + l2]);
    let e = import_onnx(&m(data_type::INT32, 28).bytes(), &ImportOptions::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("takes a float tensor from opset 28, not i32"),
        "{e}"
    );
}

/// Einsum by brute force over every assignment of the subscripts (letters only; `out`
/// explicit), for checking the lowering.
fn einsum_reference(terms: &[&str], out: &str, xs: &[(&[usize], Vec<f64>)]) -> Vec<f64> {
    let mut size: std::collections::BTreeMap<char, usize> = Default::default();
    for (t, (shape, _)) in terms.iter().zip(xs) {
        for (c, &n) in t.chars().zip(shape.iter()) {
            size.insert(c, n);
        }
    }
    let letters: Vec<char> = size.keys().copied().collect();
    let out: Vec<char> = out.chars().collect();
    let out_len: usize = out.iter().map(|c| size[c]).product();
    let mut y = vec![0.0; out_len];
    let total: usize = letters.iter().map(|c| size[c]).product();
    for mut k in 0..total {
        let mut at = std::collections::HashMap::new();
        for c in letters.iter().rev() {
            at.insert(*c, k % size[c]);
            k /= size[c];
        }
        let flat = |s: &[char], shape: &[usize]| {
            s.iter().zip(shape).fold(0, |acc, (c, &n)| acc * n + at[c])
        };
        let mut p = 1.0;
        for (t, (shape, data)) in terms.iter().zip(xs) {
            let s: Vec<char> = t.chars().collect();
            p *= data[flat(&s, shape)];
        }
        let out_shape: Vec<usize> = out.iter().map(|c| size[c]).collect();
        y[flat(&out, &out_shape)] += p;
    }
    y
}

#[test]
fn einsum_equations_match_a_brute_force_reference() {
    // (equation, its terms, its output, the input shapes)
    type Case<'a> = (&'a str, &'a [&'a str], &'a str, &'a [&'a [usize]]);
    let cases: &[Case] = &[
        ("ii->i", &["ii"], "i", &[&[3, 3]]),
        ("ii", &["ii"], "", &[&[3, 3]]),
        ("iji->j", &["iji"], "j", &[&[2, 3, 2]]),
        (
            "bij,bkj->bik",
            &["bij", "bkj"],
            "bik",
            &[&[2, 3, 4], &[2, 5, 4]],
        ),
        ("i,j->ij", &["i", "j"], "ij", &[&[3], &[4]]),
        ("ij,ij->ij", &["ij", "ij"], "ij", &[&[2, 3], &[2, 3]]),
        (
            "ij,jk,kl",
            &["ij", "jk", "kl"],
            "il",
            &[&[2, 3], &[3, 4], &[4, 2]],
        ),
        ("abc,cb->a", &["abc", "cb"], "a", &[&[2, 3, 4], &[4, 3]]),
        ("Ab,bA->", &["Ab", "bA"], "", &[&[3, 2], &[2, 3]]),
        ("ijk->kji", &["ijk"], "kji", &[&[2, 3, 4]]),
    ];
    for &(eq, terms, out, shapes) in cases {
        let names: Vec<String> = (0..shapes.len()).map(|i| format!("x{i}")).collect();
        let name_refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let mut m = Model::new(13);
        for (n, s) in names.iter().zip(shapes) {
            m = m.input(f32_info(
                n,
                &s.iter().map(|&d| d as i64).collect::<Vec<_>>(),
            ));
        }
        let m = m
            .node(node(
                "Einsum",
                &name_refs,
                &["y"],
                vec![attr_str("equation", eq)],
            ))
            .output(out_info("y", data_type::FLOAT));
        let module = import(&m);
        let xs: Vec<Tensor> = shapes.iter().map(|s| iota(s)).collect();
        let got = run(&module, xs.clone());
        let data: Vec<(&[usize], Vec<f64>)> = shapes
            .iter()
            .zip(&xs)
            .map(|(s, t)| (*s, t.to_f64_vec()))
            .collect();
        let want = einsum_reference(terms, out, &data);
        let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
        assert_close(&f32s(&got[0]), &want);
    }
    // Ellipses broadcast: [2, 1 | 2, 3] against [4 | 3, 5] → [2, 4 | 2, 5].
    let m = Model::new(13)
        .input(f32_info("a", &[2, 1, 2, 3]))
        .input(f32_info("b", &[4, 3, 5]))
        .node(node(
            "Einsum",
            &["a", "b"],
            &["y"],
            vec![attr_str("equation", "...ij,...jk")],
        ))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m);
    let (a, b) = (iota(&[2, 1, 2, 3]), iota(&[4, 3, 5]));
    let got = run(&module, vec![a.clone(), b.clone()]);
    assert_eq!(got[0].shape, vec![2, 4, 2, 5]);
    let (a, b) = (a.to_f64_vec(), b.to_f64_vec());
    let mut want = vec![];
    for e in 0..2 {
        for f in 0..4 {
            for i in 0..2 {
                for k in 0..5 {
                    let s: f64 = (0..3)
                        .map(|j| a[e * 6 + i * 3 + j] * b[f * 15 + j * 5 + k])
                        .sum();
                    want.push(s as f32);
                }
            }
        }
    }
    assert_close(&f32s(&got[0]), &want);
}

#[test]
fn argmax_ties_and_cumsum_of_integers() {
    // Ties: the first index, or the last with select_last_index.
    for (op, last, want) in [
        ("ArgMax", 0, vec![1, 0]),
        ("ArgMax", 1, vec![2, 2]),
        ("ArgMin", 0, vec![0, 1]),
        ("ArgMin", 1, vec![0, 1]),
    ] {
        let m = Model::new(13)
            .input(f32_info("x", &[2, 3]))
            .node(node(
                op,
                &["x"],
                &["y"],
                vec![
                    attr_int("axis", 1),
                    attr_int("keepdims", 0),
                    attr_int("select_last_index", last),
                ],
            ))
            .output(out_info("y", data_type::INT64));
        let x = Tensor::from_f32(vec![2, 3], vec![1.0, 5.0, 5.0, 7.0, 2.0, 7.0]);
        let got = run(&import(&m), vec![x]);
        assert_eq!(got[0].to_i64_vec(), want, "{op} select_last_index={last}");
    }
    // CumSum over a long axis of integers (exact), exclusive and reversed.
    let n = 37usize;
    let axis = Tensor::from_i64(DType::I64, vec![], vec![0]);
    for (exclusive, reverse) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let m = Model::new(14)
            .input(value_info("x", data_type::INT32, &[Ok(n as i64)]))
            .init("axis", &axis)
            .node(node(
                "CumSum",
                &["x", "axis"],
                &["y"],
                vec![
                    attr_int("exclusive", exclusive),
                    attr_int("reverse", reverse),
                ],
            ))
            .output(out_info("y", data_type::INT32));
        let xs: Vec<i64> = (0..n as i64).map(|i| i * i - 5).collect();
        let x = Tensor::from_i64(DType::I32, vec![n], xs.clone());
        let got = run(&import(&m), vec![x]);
        let want: Vec<i64> = (0..n)
            .map(|i| {
                let range: Vec<usize> = match (exclusive, reverse) {
                    (0, 0) => (0..=i).collect(),
                    (1, 0) => (0..i).collect(),
                    (0, _) => (i..n).collect(),
                    _ => (i + 1..n).collect(),
                };
                range.iter().map(|&j| xs[j]).sum()
            })
            .collect();
        assert_eq!(
            got[0].to_i64_vec(),
            want,
            "exclusive={exclusive} reverse={reverse}"
        );
    }
}

#[test]
fn layer_norm_mean_and_inv_std_dev_are_in_the_stash_type() {
    // A double input: Y is double, Mean and InvStdDev float (stash_type 1).
    let m = Model::new(17)
        .input(value_info("x", data_type::DOUBLE, &[Ok(2), Ok(4)]))
        .input(value_info("g", data_type::DOUBLE, &[Ok(4)]))
        .node(node(
            "LayerNormalization",
            &["x", "g"],
            &["y", "mean", "inv"],
            vec![attr_float("epsilon", 0.0)],
        ))
        .output(out_info("y", data_type::DOUBLE))
        .output(out_info("mean", data_type::FLOAT))
        .output(out_info("inv", data_type::FLOAT));
    let module = import(&m);
    let x = Tensor::from_f64(
        DType::F64,
        vec![2, 4],
        vec![1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 2.0, 2.0],
    );
    let g = Tensor::from_f64(DType::F64, vec![4], vec![1.0, 2.0, 1.0, 1.0]);
    let out = run(&module, vec![x, g]);
    assert_eq!(out[0].dtype, DType::F64);
    assert_eq!((out[1].dtype, out[2].dtype), (DType::F32, DType::F32));
    assert_eq!(out[1].shape, vec![2, 1]);
    assert_close(&f32s(&out[1]), &[2.5, 1.0]);
    let s = 1.25f32.sqrt();
    assert_close(&f32s(&out[2]), &[1.0 / s, 1.0]);
    assert_close(
        &f32s(&out[0]),
        &[-1.5 / s, -1.0 / s, 0.5 / s, 1.5 / s, -1.0, -2.0, 1.0, 1.0],
    );
}

/// GatherND (the dynamo exporter's advanced indexing): constant index tuples become one
/// `gather` of rows with constant row numbers; run-time tuples (with `batch_dims`) get
/// their row numbers computed, negative indices counting from the end.
#[test]
fn gather_nd_constant_and_runtime_indices() {
    let x = iota(&[2, 3, 2]);
    let m = Model::new(18)
        .input(f32_info("x", &[2, 3, 2]))
        .init(
            "i",
            &Tensor::from_i64(DType::I64, vec![2, 2], vec![1, -1, 0, 0]),
        )
        .node(node("GatherND", &["x", "i"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m);
    let gather = only_op(&module, OpKind::Gather);
    let f = &module.functions[0];
    let index = f.producer(gather.operands()[1]);
    assert!(
        index.is_some_and(|o| f.op(o).kind == OpKind::Constant),
        "the row numbers are folded: {:?}",
        ops(&module)
    );
    let y = &run(&module, vec![x.clone()])[0];
    assert_eq!(y.shape, vec![2, 2]);
    assert_close(&f32s(y), &[1.5, 1.75, -1.0, -0.75]);

    let m = Model::new(18)
        .input(f32_info("x", &[2, 3, 2]))
        .input(value_info("i", data_type::INT64, &[Ok(2), Ok(1)]))
        .node(node(
            "GatherND",
            &["x", "i"],
            &["y"],
            vec![attr_int("batch_dims", 1)],
        ))
        .output(out_info("y", data_type::FLOAT));
    let module = import(&m);
    let i = Tensor::from_i64(DType::I64, vec![2, 1], vec![2, -3]);
    let y = &run(&module, vec![x, i])[0];
    assert_eq!(y.shape, vec![2, 2]);
    assert_close(&f32s(y), &[0.0, 0.25, 0.5, 0.75]);
}
