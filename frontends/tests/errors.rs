//! Error messages: they name the node, op type, opset and what ppcc supports.

mod common;

use common::*;
use ppcc_frontends::onnx::proto::{data_type, OperatorSetIdProto};
use ppcc_frontends::onnx::{
    import_onnx, refused_version, ImportOptions, NewVersion, OnnxError, MAX_OPSET,
    VERSIONS_AFTER_25,
};
use ppir::{DType, Tensor};
use prost::Message;

fn err(m: &Model) -> OnnxError {
    import_onnx(&m.bytes(), &ImportOptions::default()).expect_err("import should fail")
}

#[test]
fn unsupported_op_names_node_op_and_opsets() {
    let mut n = node("TfIdfVectorizer", &["x"], &["y"], vec![]);
    n.name = "foo".into();
    let m = Model::new(9)
        .input(f32_info("x", &[1]))
        .node(n)
        .output(out_info("y", data_type::FLOAT));
    let e = err(&m);
    assert!(e.is_unsupported());
    let s = e.to_string();
    assert!(
        s.starts_with(
            r#"node "foo" (TfIdfVectorizer, opset 9): unsupported op; ppcc supports opsets 6 to 28"#
        ),
        "{s}"
    );
    assert!(s.contains("Conv") && s.contains("Softmax"), "{s}");
    assert_eq!(
        e.short(),
        r#"node "foo" (TfIdfVectorizer, opset 9): unsupported op"#
    );
}

#[test]
fn other_domains_are_named() {
    let mut n = node("FusedMatMul", &["x"], &["y"], vec![]);
    n.domain = "com.microsoft".into();
    let m = Model::new(13)
        .input(f32_info("x", &[1]))
        .node(n)
        .output(out_info("y", data_type::FLOAT));
    assert!(err(&m).to_string().contains("com.microsoft.FusedMatMul"));
}

#[test]
fn unsupported_opsets() {
    for v in [5, 29] {
        let e = err(&Model::new(v)
            .input(f32_info("x", &[1]))
            .output(f32_info("x", &[1])));
        assert!(matches!(e, OnnxError::UnsupportedOpset { .. }), "{e}");
        assert!(
            e.to_string().contains(&format!("opset {v}")) && e.to_string().contains("6 to 28"),
            "{e}"
        );
    }
    let mut p = Model::new(13)
        .input(f32_info("x", &[1]))
        .output(f32_info("x", &[1]))
        .proto();
    p.opset_import = vec![OperatorSetIdProto {
        domain: "ai.onnx.ml".into(),
        version: 3,
    }];
    let e = import_onnx(&p.encode_to_vec(), &ImportOptions::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("no opset of the default ONNX domain"),
        "{e}"
    );
}

#[test]
fn op_versions_after_opset_25_that_ppcc_does_not_follow_are_refused_by_name() {
    // BitShift (version 28 at opset 28) is refused by name, as an op ppcc does not map;
    // once it is mapped, its version 28 stays refused until its row says it is followed.
    let mut n = node(
        "BitShift",
        &["a", "a"],
        &["y"],
        vec![attr_str("direction", "LEFT")],
    );
    n.name = "mm".into();
    let m = Model::new(28)
        .input(value_info("a", data_type::INT64, &[Ok(2)]))
        .node(n)
        .output(out_info("y", data_type::INT64));
    let e = err(&m);
    assert!(e.is_unsupported());
    assert_eq!(
        e.short(),
        r#"node "mm" (BitShift, opset 28): unsupported op"#
    );
    assert_eq!(refused_version("BitShift", 28), Some(28));
    let e = OnnxError::UnsupportedOpVersion {
        node: "mm".into(),
        op_type: "BitShift".into(),
        version: 28,
        opset: 28,
    };
    assert!(e.is_unsupported());
    assert_eq!(
        e.to_string(),
        r#"node "mm" (BitShift, opset 28): unsupported op version: BitShift version 28 (opsets 28 and later) is not implemented"#
    );
    // Each refused row applies from its version on, followed rows never.
    for &(op, v, how) in VERSIONS_AFTER_25 {
        assert_eq!(refused_version(op, v - 1), None, "{op}");
        let want = (how == NewVersion::Refused).then_some(v);
        assert_eq!(refused_version(op, v), want, "{op}");
        assert_eq!(refused_version(op, MAX_OPSET), want, "{op}");
    }
    assert_eq!(refused_version("Add", MAX_OPSET), None);
}

/// `VERSIONS_AFTER_25` lists exactly the ops of the installed onnx package that got a new
/// version after opset 25, up to `MAX_OPSET`, not counting ops new there.
#[test]
fn versions_after_opset_25_match_the_onnx_schemas() {
    let py = std::env::var("PPCC_PYTHON").unwrap_or_else(|_| {
        concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/python").to_string()
    });
    let code = format!(
        "import onnx.defs as d\n\
         vs = {{}}\n\
         for s in d.get_all_schemas_with_history():\n    \
             if s.domain in ('', 'ai.onnx'): vs.setdefault(s.name, []).append(s.since_version)\n\
         for n, v in sorted(vs.items()):\n    \
             for x in v:\n        \
                 if 25 < x <= {MAX_OPSET} and min(v) <= 25: print(n, x)"
    );
    let out = std::process::Command::new(&py)
        .args(["-c", &code])
        .output()
        .unwrap_or_else(|e| panic!("{py}: {e} (set PPCC_PYTHON to a python with onnx)"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let want: Vec<String> = VERSIONS_AFTER_25
        .iter()
        .map(|(op, v, _)| format!("{op} {v}"))
        .collect();
    assert_eq!(got, want);
}

#[test]
fn malformed_bytes_are_errors() {
    for bytes in [
        &b""[..],
        b"\x08",
        b"\xff\xff\xff\xff",
        b"not a model at all",
        b"\x3a\x05\x0a\x03\x0a\x01",
    ] {
        match import_onnx(bytes, &ImportOptions::default()) {
            Ok(_) => panic!("{bytes:?} imported"),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
    let e = import_onnx(b"\xff\xff", &ImportOptions::default()).unwrap_err();
    assert!(e.to_string().starts_with("not a valid ONNX model"), "{e}");
}

#[test]
fn undefined_values_and_bad_attributes_name_the_node() {
    let m = Model::new(13)
        .input(f32_info("x", &[2]))
        .node(node("Add", &["x", "nope"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let s = err(&m).to_string();
    assert!(
        s.contains(r#"node "Add_y" (Add, opset 13)"#) && s.contains("`nope`"),
        "{s}"
    );
    let m = Model::new(13)
        .input(f32_info("x", &[2, 3]))
        .node(node("Concat", &["x"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    assert!(err(&m).to_string().contains("attribute `axis` is required"));
    // Shape errors come from ppir's shape inference, with the node named.
    let m = Model::new(13)
        .input(f32_info("a", &[2, 3]))
        .input(f32_info("b", &[4, 5]))
        .node(node("MatMul", &["a", "b"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let e = err(&m);
    assert!(matches!(e, OnnxError::Node { .. }), "{e}");
    assert!(
        e.to_string()
            .contains(r#"node "MatMul_y" (MatMul, opset 13)"#),
        "{e}"
    );
}

#[test]
fn runtime_values_where_static_ones_are_needed() {
    let m = Model::new(13)
        .input(f32_info("x", &[6]))
        .input(value_info("shape", data_type::INT64, &[Ok(2)]))
        .node(node("Reshape", &["x", "shape"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let e = err(&m);
    assert!(e.is_unsupported());
    assert!(
        e.to_string()
            .contains("the target shape (input 1) must be known at import time"),
        "{e}"
    );
}

#[test]
fn string_and_sequence_values_are_unsupported() {
    let m = Model::new(13)
        .input(value_info("s", data_type::STRING, &[Ok(2)]))
        .node(node("Identity", &["s"], &["y"], vec![]))
        .output(out_info("y", data_type::STRING));
    let e = err(&m);
    assert!(
        e.is_unsupported() && e.to_string().contains("STRING"),
        "{e}"
    );
    let m = Model::new(13)
        .input(f32_info("x", &[2]))
        .node(node("SequenceConstruct", &["x"], &["s"], vec![]))
        .output(out_info("s", data_type::FLOAT));
    assert!(err(&m).to_string().contains("sequence"));
}

#[test]
fn declared_output_type_must_match() {
    let m = Model::new(13)
        .input(f32_info("x", &[2]))
        .node(node("Relu", &["x"], &["y"], vec![]))
        .output(out_info("y", data_type::INT64));
    let e = err(&m).to_string();
    assert!(
        e.contains("graph output `y` is declared i64 but computes f32"),
        "{e}"
    );
}

#[test]
fn broken_initializers_are_errors() {
    let mut m = Model::new(13)
        .input(f32_info("x", &[2]))
        .node(node("Add", &["x", "w"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let mut w = ppcc_frontends::onnx::tensor::tensor_to_proto(
        &Tensor::from_f32(vec![2], vec![1.0, 2.0]),
        "w",
    );
    w.dims = vec![1 << 40];
    m.initializers.push(w);
    let e = err(&m).to_string();
    assert!(e.contains("tensor `w`") && e.contains("bytes"), "{e}");
    let mut m2 = Model::new(13)
        .input(f32_info("x", &[2]))
        .output(f32_info("x", &[2]));
    let mut w = ppcc_frontends::onnx::tensor::tensor_to_proto(
        &Tensor::from_i64(DType::I64, vec![1], vec![1]),
        "w",
    );
    w.dims = vec![i64::MAX, i64::MAX];
    m2.initializers.push(w);
    assert!(err(&m2).to_string().contains("too many elements"));
}

#[test]
fn value_info_must_agree_with_inferred_types() {
    let m = Model::new(13)
        .input(f32_info("x", &[2, 3]))
        .node(node("Transpose", &["x"], &["t"], vec![]))
        .node(node("Relu", &["t"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let with = |vi| {
        let mut p = m.proto();
        p.graph.as_mut().unwrap().value_info.push(vi);
        import_onnx(&p.encode_to_vec(), &ImportOptions::default())
    };
    assert!(with(f32_info("t", &[3, 2])).is_ok());
    assert!(with(value_info("t", data_type::FLOAT, &[Err("a"), Ok(2)])).is_ok());
    let e = with(f32_info("t", &[2, 3])).unwrap_err().to_string();
    assert!(
        e.contains(r#"node "Transpose_t""#)
            && e.contains("value_info declares `t` as FLOAT [2, 3]")
            && e.contains("tensor<3x2xf32>"),
        "{e}"
    );
    let e = with(value_info("t", data_type::INT64, &[Ok(3), Ok(2)]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("INT64"), "{e}");
}

/// Issue 12, item 7: graphs that assign a value twice are refused with the value and both
/// writers (onnxruntime refuses them; importing them let the last writer win).
#[test]
fn values_assigned_twice_are_refused() {
    let w = Tensor::from_f32(vec![2], vec![1.0, 2.0]);
    let reassigned = |m: &Model| {
        let e = err(m);
        assert!(matches!(e, OnnxError::Reassigned { .. }), "{e}");
        e.to_string()
    };
    // Two nodes write `y`.
    let m = Model::new(13)
        .input(f32_info("x", &[2]))
        .node(node("Relu", &["x"], &["y"], vec![]))
        .node(node("Neg", &["x"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    assert_eq!(
        reassigned(&m),
        r#"invalid model: value `y` is assigned twice, by node "Relu_y" (Relu) and by node "Neg_y" (Neg); ONNX graphs assign each value once"#
    );
    // One node lists an output twice (an unnamed node is named by op type and position).
    let mut n = node("Split", &["x"], &["a", "a"], vec![attr_int("axis", 0)]);
    n.name.clear();
    let m = Model::new(13)
        .input(f32_info("x", &[2]))
        .node(n)
        .output(out_info("a", data_type::FLOAT));
    assert!(reassigned(&m).contains(r#"by node "Split_0" (Split) and by node "Split_0" (Split)"#));
    // A node overwrites a graph input.
    let m = Model::new(13)
        .input(f32_info("x", &[2]))
        .node(node("Relu", &["x"], &["x"], vec![]))
        .output(out_info("x", data_type::FLOAT));
    assert!(reassigned(&m).contains(
        r#"value `x` is assigned twice, by the graph input and by node "Relu_x" (Relu)"#
    ));
    // A node overwrites an initializer.
    let m = Model::new(13)
        .input(f32_info("x", &[2]))
        .init("w", &w)
        .node(node("Relu", &["x"], &["w"], vec![]))
        .output(out_info("w", data_type::FLOAT));
    assert!(reassigned(&m).contains(r#"by an initializer and by node "Relu_w" (Relu)"#));
    // An initializer given twice, with different shapes or the same.
    for second in [Tensor::from_f32(vec![3], vec![1.0, 2.0, 3.0]), w.clone()] {
        let m = Model::new(13)
            .input(f32_info("x", &[2]))
            .init("w", &w)
            .init("w", &second)
            .node(node("Add", &["x", "w"], &["y"], vec![]))
            .output(out_info("y", data_type::FLOAT));
        assert!(reassigned(&m)
            .contains("value `w` is assigned twice, by an initializer and by an initializer"));
    }
    // A graph input listed twice.
    let m = Model::new(13)
        .input(f32_info("x", &[2]))
        .input(f32_info("x", &[3]))
        .node(node("Relu", &["x"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    assert!(reassigned(&m).contains("value `x` is assigned twice, by a graph input"));
}

/// An initializer may share its name with a graph input (its default value) when the types
/// agree; with conflicting types the model is refused.
#[test]
fn graph_input_with_an_initializer_must_agree_with_it() {
    let w = Tensor::from_f32(vec![2], vec![1.0, 2.0]);
    let model = |declared: &[i64]| {
        Model::new(13)
            .input(f32_info("x", &[2]))
            .input(f32_info("w", declared))
            .init("w", &w)
            .node(node("Add", &["x", "w"], &["y"], vec![]))
            .output(out_info("y", data_type::FLOAT))
    };
    import_onnx(&model(&[2]).bytes(), &ImportOptions::default()).expect("agreeing types import");
    let e = err(&model(&[3]));
    assert!(matches!(e, OnnxError::InitializerType { .. }), "{e}");
    assert_eq!(
        e.to_string(),
        "invalid model: graph input `w` is declared FLOAT [3] but its initializer is FLOAT [2]"
    );
    let mut m = model(&[2]);
    m.inputs[1] = value_info("w", data_type::INT64, &[Ok(2)]);
    assert!(err(&m)
        .to_string()
        .contains("declared INT64 [2] but its initializer is FLOAT [2]"));
}

/// Issue 12, item 2: an input whose element count wraps to 0 in 64-bit arithmetic.
#[test]
fn inputs_too_large_to_count_are_refused() {
    let m = Model::new(13)
        .input(f32_info("x", &[1 << 31, 1 << 31, 4]))
        .node(node("Relu", &["x"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let e = err(&m);
    assert!(matches!(e, OnnxError::InputShape { .. }), "{e}");
    assert!(
        e.to_string().starts_with(
            "input `x`: shape tensor<2147483648x2147483648x4xf32> of 4-byte elements is too large"
        ),
        "{e}"
    );
    // An Expand whose target overflows is refused by shape inference, naming the node.
    let shape = Tensor::from_i64(DType::I64, vec![2], vec![1 << 32, 1 << 32]);
    let m = Model::new(13)
        .input(f32_info("x", &[1, 1]))
        .init("shape", &shape)
        .node(node("Expand", &["x", "shape"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let s = err(&m).to_string();
    assert!(
        s.contains(r#"node "Expand_y" (Expand, opset 13)"#) && s.contains("too large"),
        "{s}"
    );
}

/// The opset-23 transformer ops: absent before opset 23, and what they cannot take is
/// named with the node and the attribute or input.
#[test]
fn transformer_op_errors_name_the_node_and_attribute() {
    let attention = |opset: i64, inputs: &[&str], attrs| {
        let mut m = Model::new(opset);
        for &(name, dims) in &[
            ("q", &[1, 4, 8][..]),
            ("k", &[1, 4, 8][..]),
            ("v", &[1, 4, 8][..]),
            ("pk", &[1, 2, 3, 4][..]),
        ] {
            if inputs.contains(&name) {
                m = m.input(f32_info(name, dims));
            }
        }
        m.node(node("Attention", inputs, &["y"], attrs))
            .output(out_info("y", data_type::FLOAT))
    };
    let e = err(&attention(22, &["q", "k", "v"], vec![]));
    assert!(e.is_unsupported(), "{e}");
    assert!(
        e.to_string()
            .contains("(Attention, opset 22): unsupported op"),
        "{e}"
    );
    let s = err(&attention(23, &["q", "k", "v"], vec![])).to_string();
    assert!(
        s.contains(r#"node "Attention_y" (Attention, opset 23)"#)
            && s.contains("`q_num_heads` and `kv_num_heads` are required for 3-D inputs"),
        "{s}"
    );
    let heads = || vec![attr_int("q_num_heads", 2), attr_int("kv_num_heads", 3)];
    let s = err(&attention(23, &["q", "k", "v"], heads())).to_string();
    assert!(s.contains("not a multiple of kv_num_heads = 3"), "{s}");
    let s = err(&attention(23, &["q", "k", "v", "", "pk"], heads())).to_string();
    assert!(
        s.contains("past_key (input 4) and past_value (input 5)"),
        "{s}"
    );
    let mut with_scale = heads();
    with_scale[1] = attr_int("kv_num_heads", 2);
    with_scale.push(attr_float("scale", -1.0));
    let s = err(&attention(23, &["q", "k", "v"], with_scale)).to_string();
    assert!(s.contains("attribute `scale` = -1"), "{s}");

    let m = Model::new(23)
        .input(f32_info("x", &[2, 4]))
        .input(f32_info("g", &[4]))
        .node(node(
            "RMSNormalization",
            &["x", "g"],
            &["y"],
            vec![attr_int("stash_type", 7)],
        ))
        .output(out_info("y", data_type::FLOAT));
    let s = err(&m).to_string();
    assert!(
        s.contains("(RMSNormalization, opset 23)") && s.contains("`stash_type` must be a float"),
        "{s}"
    );
    let m = Model::new(23)
        .input(f32_info("x", &[1, 3, 8]))
        .input(f32_info("c", &[1, 3, 4]))
        .node(node("RotaryEmbedding", &["x", "c", "c"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let s = err(&m).to_string();
    assert!(
        s.contains("(RotaryEmbedding, opset 23)")
            && s.contains("`num_heads` is required for a 3-D input"),
        "{s}"
    );
}

#[test]
fn einsum_errors_name_the_node_and_the_equation() {
    for (eq, why) in [
        ("ij,jk->iz", "no input has"),
        ("ij,jk,kl->il", "3 terms for 2 inputs"),
        ("ijk,jk->ik", "does not fit an input of rank 2"),
    ] {
        let mut n = node(
            "Einsum",
            &["a", "b"],
            &["y"],
            vec![attr_str("equation", eq)],
        );
        n.name = "mm".into();
        let m = Model::new(13)
            .input(f32_info("a", &[2, 3]))
            .input(f32_info("b", &[3, 4]))
            .node(n)
            .output(out_info("y", data_type::FLOAT));
        let e = err(&m).to_string();
        assert!(
            e.contains(r#"node "mm" (Einsum, opset 13)"#)
                && e.contains(&format!("equation {eq:?}"))
                && e.contains(why),
            "{e}"
        );
    }
}

#[test]
fn selection_op_errors_name_the_node_and_what_is_needed() {
    // Scatter indices read at run time cannot be resolved into gathers.
    let scatter = |op: &str, attrs, idx: Option<&Tensor>| {
        let m = Model::new(18).input(f32_info("data", &[3, 3]));
        let m = match idx {
            Some(t) => m.init("idx", t),
            None => m.input(value_info("idx", data_type::INT64, &[Ok(1), Ok(2)])),
        };
        m.input(f32_info("upd", &[1, 2]))
            .node(node(op, &["data", "idx", "upd"], &["y"], attrs))
            .output(out_info("y", data_type::FLOAT))
    };
    let e = err(&scatter("ScatterElements", vec![], None));
    assert!(e.is_unsupported(), "{e}");
    let s = e.to_string();
    assert!(
        s.contains("(ScatterElements, opset 18)")
            && s.contains("indices (input 1) must be known at import time"),
        "{s}"
    );
    let idx = Tensor::from_i64(DType::I64, vec![1, 2], vec![0, 5]);
    let s = err(&scatter("ScatterElements", vec![], Some(&idx))).to_string();
    assert!(
        s.contains("(ScatterElements, opset 18)")
            && s.contains("index 5 is out of range for a dimension of size 3"),
        "{s}"
    );
    let s = err(&scatter(
        "ScatterND",
        vec![attr_str("reduction", "xor")],
        Some(&idx),
    ))
    .to_string();
    assert!(
        s.contains("(ScatterND, opset 18)") && s.contains("reduction must be none, add"),
        "{s}"
    );

    let one_hot = Model::new(11)
        .input(value_info("i", data_type::INT64, &[Ok(3)]))
        .input(value_info("depth", data_type::INT64, &[]))
        .input(f32_info("values", &[2]))
        .node(node("OneHot", &["i", "depth", "values"], &["y"], vec![]))
        .output(out_info("y", data_type::FLOAT));
    let s = err(&one_hot).to_string();
    assert!(
        s.contains("(OneHot, opset 11)")
            && s.contains("depth (input 1) must be known at import time"),
        "{s}"
    );

    let s2d = |op: &str, attrs| {
        Model::new(13)
            .input(f32_info("x", &[1, 2, 3, 3]))
            .node(node(op, &["x"], &["y"], attrs))
            .output(out_info("y", data_type::FLOAT))
    };
    let s = err(&s2d("SpaceToDepth", vec![attr_int("blocksize", 2)])).to_string();
    assert!(
        s.contains("(SpaceToDepth, opset 13)")
            && s.contains("height 3 and width 3 must be multiples of blocksize 2"),
        "{s}"
    );
    let attrs = vec![attr_int("blocksize", 1), attr_str("mode", "RCD")];
    let s = err(&s2d("DepthToSpace", attrs)).to_string();
    assert!(
        s.contains("(DepthToSpace, opset 13)") && s.contains(r#"not "RCD""#),
        "{s}"
    );

    let m = Model::new(13)
        .input(f32_info("a", &[2]))
        .input(f32_info("b", &[2]))
        .node(node("Mod", &["a", "b"], &["y"], vec![attr_int("fmod", 2)]))
        .output(out_info("y", data_type::FLOAT));
    let s = err(&m).to_string();
    assert!(
        s.contains("(Mod, opset 13)") && s.contains("`fmod` must be 0 or 1, not 2"),
        "{s}"
    );
}

#[test]
fn casts_to_types_without_a_dtype_name_the_type() {
    for (to, name) in [
        (17, "FLOAT8E4M3FN"),
        (20, "FLOAT8E5M2FNUZ"),
        (22, "INT4"),
        (25, "UINT2"),
        (23, "FLOAT4E2M1"),
    ] {
        let m = Model::new(25)
            .input(f32_info("x", &[2]))
            .node(node("Cast", &["x"], &["y"], vec![attr_int("to", to)]))
            .output(out_info("y", data_type::FLOAT));
        let e = err(&m);
        assert!(e.is_unsupported(), "{e}");
        let s = e.to_string();
        assert!(
            s.contains("(Cast, opset 25)") && s.contains(&format!("Cast to {name}")),
            "{s}"
        );
    }
}

/// GatherND's shape rules: errors name the node and the rule broken.
#[test]
fn gather_nd_errors_name_the_node_and_rule() {
    let model = |idims: &[i64], batch_dims: i64| {
        let mut n = node(
            "GatherND",
            &["x", "i"],
            &["y"],
            vec![attr_int("batch_dims", batch_dims)],
        );
        n.name = "pick".into();
        let ok: Vec<Result<i64, &str>> = idims.iter().map(|&d| Ok(d)).collect();
        Model::new(13)
            .input(f32_info("x", &[2, 3]))
            .input(value_info("i", data_type::INT64, &ok))
            .node(n)
            .output(out_info("y", data_type::FLOAT))
    };
    for (idims, batch_dims, want, unsupported) in [
        (&[2, 1][..], 2, "batch_dims 2 must be in [0, 2)", false),
        (&[2, 3][..], 0, "index tuples of length 3", false),
        (
            &[3, 1][..],
            1,
            "the batch axes of data [2] and indices [3] differ",
            false,
        ),
        (&[2, 0][..], 0, "GatherND with empty index tuples", true),
    ] {
        let e = err(&model(idims, batch_dims));
        let s = e.to_string();
        assert!(
            s.starts_with(r#"node "pick" (GatherND, opset 13)"#) && s.contains(want),
            "{s}"
        );
        assert_eq!(e.is_unsupported(), unsupported, "{s}");
    }
}
