use super::*;
use crate::attr::{Attr, Attrs};
use crate::module::{ArgKind, Function, Module, NewOp};
use crate::ops::{OpKind, Phase};
use crate::tensor::{Tensor, TensorData};
use crate::types::{DType, Dim, TensorType};

fn ty(s: &str) -> TensorType {
    parse_type(s).unwrap()
}

/// The error of parsing `src`, as `line:col: message`.
fn err(src: &str) -> String {
    match parse_module(src) {
        Ok(m) => panic!("expected an error, parsed:\n{m}"),
        Err(e) => e.to_string(),
    }
}

/// Parse, print, and check the printed text is `src` (which must be canonical).
fn canonical(src: &str) -> Module {
    let m = parse_module(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    assert_eq!(print_module(&m, &PrintOptions::default()), src);
    m
}

/// A module body with one function `@f(%x: tensor<2xf32>) -> ()` around `body`.
fn in_func(body: &str) -> String {
    format!("module {{\n  func @f(%x: tensor<2xf32>) -> () {{\n{body}\n    return\n  }}\n}}\n")
}

const EXAMPLE: &str = r#"module @optional_name {
  func @main(%x: tensor<?x784xf32>, %w1: tensor<784x128xf32> {param}, %rm: tensor<128xf32> {state}) -> (tensor<?x64xf32>, tensor<3xf32>) attributes {stage = 0} {
    %0 = "pp.matmul"(%x, %w1) {stage = 0, phase = "fwd"} : (tensor<?x784xf32>, tensor<784x128xf32>) -> tensor<?x128xf32> loc("fc1/MatMul")
    %a, %b = "pp.split"(%0) {axis = 1, split = [64, 64]} : (tensor<?x128xf32>) -> (tensor<?x64xf32>, tensor<?x64xf32>)
    "pp.send"(%a) {channel = 3, peer = 1} : (tensor<?x64xf32>) -> ()
    %c = "pp.constant"() {value = dense<[1.0, 2.5, -3.0]> : tensor<3xf32>} : () -> tensor<3xf32>
    return %b, %c : tensor<?x64xf32>, tensor<3xf32>
  }
  weight @rm : tensor<2xf32> = dense<[1.0, 2.0]>
  weight @w1 : tensor<17xi8> = dense<"0x0102030405060708090A0B0C0D0E0F10FF">
}
"#;

fn example_module() -> Module {
    let mut f = Function::new("main");
    f.attrs.set("stage", Attr::Int(0));
    let x = f.add_arg("x", ty("tensor<?x784xf32>"), ArgKind::Input);
    let w1 = f.add_arg("w1", ty("tensor<784x128xf32>"), ArgKind::Param);
    f.add_arg("rm", ty("tensor<128xf32>"), ArgKind::State);
    let h = f.push(
        NewOp::new(OpKind::MatMul, vec![x, w1], vec![ty("tensor<?x128xf32>")])
            .stage(0)
            .phase(Phase::Fwd)
            .loc("fc1/MatMul"),
    );
    let split = f.push_op(
        NewOp::new(OpKind::Split, vec![h], vec![ty("tensor<?x64xf32>"); 2])
            .attrs(
                Attrs::new()
                    .with("axis", Attr::Int(1))
                    .with("split", Attr::Ints(vec![64, 64])),
            )
            .names(vec!["a".into(), "b".into()]),
    );
    let (a, b) = (f.op(split).results()[0], f.op(split).results()[1]);
    f.push_op(
        NewOp::new(OpKind::Send, vec![a], vec![]).attrs(
            Attrs::new()
                .with("peer", Attr::Int(1))
                .with("channel", Attr::Int(3)),
        ),
    );
    let value = Tensor::from_f32(vec![3], vec![1.0, 2.5, -3.0]);
    let c = f.push(
        NewOp::new(OpKind::Constant, vec![], vec![ty("tensor<3xf32>")])
            .attrs(Attrs::new().with("value", Attr::Tensor(value)))
            .names(vec!["c".into()]),
    );
    f.set_results(vec![b, c]);
    let mut m = Module::new();
    m.name = Some("optional_name".into());
    m.functions.push(f);
    m.weights
        .insert("rm".into(), Tensor::from_f32(vec![2], vec![1.0, 2.0]));
    m.weights.insert(
        "w1".into(),
        Tensor::from_i64(
            DType::I8,
            vec![17],
            (1..=17).map(|i| if i == 17 { -1 } else { i }).collect(),
        ),
    );
    m
}

// ---- printing ----

#[test]
fn prints_the_documented_layout() {
    assert_eq!(
        print_module(&example_module(), &PrintOptions::default()),
        EXAMPLE
    );
    assert_eq!(example_module().to_string(), EXAMPLE);
}

#[test]
fn parses_the_documented_layout() {
    let m = canonical(EXAMPLE);
    let f = &m.functions[0];
    assert_eq!(m.name.as_deref(), Some("optional_name"));
    assert_eq!(
        f.args().iter().map(|a| a.1).collect::<Vec<_>>(),
        [ArgKind::Input, ArgKind::Param, ArgKind::State]
    );
    let ops = f.ops();
    let mm = f.op(ops[0]);
    assert_eq!(mm.kind, OpKind::MatMul);
    assert_eq!(
        (mm.stage, mm.phase, mm.loc.as_deref()),
        (Some(0), Some(Phase::Fwd), Some("fc1/MatMul"))
    );
    assert!(
        mm.attrs.is_empty(),
        "stage and phase leave the attribute dictionary"
    );
    assert_eq!(f.value(mm.results()[0]).name, "0");
    assert_eq!(f.op(ops[1]).results().len(), 2);
    assert_eq!(f.op(ops[2]).results().len(), 0);
    assert_eq!(f.attrs.int("stage").unwrap(), Some(0));
    assert_eq!(m.weights["w1"].as_i64().unwrap()[16], -1);
    // The parsed module equals the built one in content.
    assert_eq!(
        print_module(&example_module(), &PrintOptions::default()),
        m.to_string()
    );
}

#[test]
fn print_function_and_op() {
    let m = example_module();
    let f = &m.functions[0];
    let text = print_function(f);
    assert!(text.starts_with("func @main(%x: tensor<?x784xf32>, "));
    assert!(text.ends_with("  return %b, %c : tensor<?x64xf32>, tensor<3xf32>\n}\n"));
    assert_eq!(
        print_op(f, f.ops()[2]),
        r#""pp.send"(%a) {channel = 3, peer = 1} : (tensor<?x64xf32>) -> ()"#
    );
}

#[test]
fn empty_module_and_function() {
    canonical("module {\n}\n");
    let m = canonical("module {\n  func @f() -> () {\n    return\n  }\n}\n");
    assert!(m.functions[0].results().is_empty());
}

#[test]
fn elided_weights() {
    let m = example_module();
    let text = print_module(
        &m,
        &PrintOptions {
            elide_weights_over: Some(2),
        },
    );
    assert!(text.contains("  weight @rm : tensor<2xf32> = dense<[1.0, 2.0]>\n"));
    assert!(text.contains("  weight @w1 : tensor<17xi8> = elided\n"));
    let back = parse_module(&text).unwrap();
    assert_eq!(back.weights.keys().collect::<Vec<_>>(), ["rm"]);
}

#[test]
fn types() {
    assert_eq!(
        ty("tensor<2x?x3xf32>"),
        TensorType::new(DType::F32, vec![Dim::Known(2), Dim::Batch, Dim::Known(3)])
    );
    assert_eq!(ty("tensor<f32>"), TensorType::scalar(DType::F32));
    assert_eq!(
        ty("  tensor<0x1xi1> // comment"),
        TensorType::of(DType::Bool, &[0, 1])
    );
    for d in DType::ALL {
        let t = TensorType::new(d, vec![Dim::Batch, Dim::Known(7)]);
        assert_eq!(ty(&t.to_string()), t);
    }
}

#[test]
fn type_errors() {
    let e = |s: &str| parse_type(s).unwrap_err().to_string();
    assert_eq!(
        e("tensor<2xf33>"),
        "1:10: unknown element type 'f33' (expected one of f32, f64, f16, bf16, i64, i32, i8, i1)"
    );
    assert_eq!(
        e("tensor<2xbool>"),
        "1:10: unknown element type 'bool' (expected one of f32, f64, f16, bf16, i64, i32, i8, i1)"
    );
    assert_eq!(
        e("tensor<2xxf32>"),
        "1:10: expected a dimension (a size or '?') before 'x'"
    );
    assert_eq!(
        e("tensor<2x3x>"),
        "1:12: expected an element type at the end of the tensor type"
    );
    assert_eq!(
        e("tensor<>"),
        "1:8: expected an element type at the end of the tensor type"
    );
    assert_eq!(
        e("tensor<a2x3xf32>"),
        "1:8: invalid dimension 'a2' (expected a size or '?')"
    );
    assert_eq!(
        e("tensor<2x3xf32"),
        "1:15: expected '>' to close the tensor type, found end of file"
    );
    assert_eq!(
        e("tensor<2, 3xf32>"),
        "1:9: expected '>' to close the tensor type, found ','"
    );
    assert_eq!(
        e("tensor<99999999999999999999xf32>"),
        "1:8: dimension 99999999999999999999 is too large"
    );
    // 2^31 * 2^31 * 4 elements wrap to 0 in unchecked 64-bit arithmetic.
    assert_eq!(
        e("tensor<2147483648x2147483648x4xf32>"),
        "1:8: shape tensor<2147483648x2147483648x4xf32> of 4-byte elements is too large: its size overflows 64-bit arithmetic (at most 9223372036854775807 bytes)"
    );
    assert_eq!(
        e("tensor<2xf32> x"),
        "1:15: expected end of file after the type, found 'x'"
    );
    assert_eq!(
        e("vector<2xf32>"),
        "1:1: expected a tensor type, found 'vector'"
    );
    assert_eq!(e(""), "1:1: expected a tensor type, found end of file");
}

// ---- names ----

#[test]
fn names_with_onnx_characters_and_quoted_names() {
    let src = r#"module @"my model" {
  func @"f 1"(%"input:0": tensor<2xf32>, %a/b.c$d-e_0: tensor<2xf32>) -> (tensor<2xf32>) {
    %"out\"q" = "pp.add"(%"input:0", %a/b.c$d-e_0) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
    return %"out\"q" : tensor<2xf32>
  }
  weight @"w:0" : tensor<f32> = dense<[5.0]>
}
"#;
    let m = canonical(src);
    assert_eq!(m.name.as_deref(), Some("my model"));
    let f = &m.functions[0];
    assert_eq!(f.name, "f 1");
    assert!(f.find_value("input:0").is_some());
    assert!(f.find_value("a/b.c$d-e_0").is_some());
    assert!(f.find_value("out\"q").is_some());
    assert!(m.weights.contains_key("w:0"));
}

#[test]
fn comments_and_free_layout() {
    let src = "// RUN: ppcc-opt %s | FileCheck %s\nmodule { // CHECK: module\n func @f(%x: tensor<2xf32>)\n -> tensor<2xf32> { %y = \"pp.relu\"(%x)\n : (tensor<2xf32>) -> (tensor<2xf32>) return %y : tensor<2xf32> } }";
    let m = parse_module(src).unwrap();
    assert_eq!(
        m.to_string(),
        "module {\n  func @f(%x: tensor<2xf32>) -> (tensor<2xf32>) {\n    %y = \"pp.relu\"(%x) : (tensor<2xf32>) -> tensor<2xf32>\n    return %y : tensor<2xf32>\n  }\n}\n"
    );
}

#[test]
fn lib_doc_example_parses() {
    let src = r#"
module {
  func @main(%x: tensor<2x3xf32>) -> (tensor<2x3xf32>) {
    %y = "pp.relu"(%x) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    return %y : tensor<2x3xf32>
  }
}
"#;
    let m = parse_module(src).unwrap();
    assert_eq!(m.to_string(), src.trim_start());
}

// ---- attributes ----

/// Print an op carrying `attr` under the name `a`, check the text, and parse it back.
fn attr_round_trip(attr: Attr, printed: &str) -> Attr {
    let mut f = Function::new("f");
    f.push_op(NewOp::new(OpKind::Recv, vec![], vec![]).attrs(Attrs::new().with("a", attr)));
    let mut m = Module::new();
    m.functions.push(f);
    let text = m.to_string();
    let line = format!("    \"pp.recv\"() {{a = {printed}}} : () -> ()\n");
    assert!(text.contains(&line), "expected {line:?} in\n{text}");
    let back = canonical(&text);
    let f = &back.functions[0];
    f.op(f.ops()[0]).attrs.get("a").unwrap().clone()
}

#[test]
fn attr_values() {
    assert_eq!(attr_round_trip(Attr::Int(5), "5"), Attr::Int(5));
    assert_eq!(attr_round_trip(Attr::Int(-5), "-5"), Attr::Int(-5));
    assert_eq!(
        attr_round_trip(Attr::Int(i64::MIN), "-9223372036854775808"),
        Attr::Int(i64::MIN)
    );
    assert_eq!(attr_round_trip(Attr::Float(1.0), "1.0"), Attr::Float(1.0));
    assert_eq!(
        attr_round_trip(Attr::Float(1e-5), "1e-5"),
        Attr::Float(1e-5)
    );
    assert_eq!(attr_round_trip(Attr::Float(0.1), "0.1"), Attr::Float(0.1));
    assert_eq!(
        attr_round_trip(Attr::Float(1e300), "1e300"),
        Attr::Float(1e300)
    );
    assert_eq!(
        attr_round_trip(Attr::Float(f64::INFINITY), "inf"),
        Attr::Float(f64::INFINITY)
    );
    assert_eq!(
        attr_round_trip(Attr::Float(f64::NEG_INFINITY), "-inf"),
        Attr::Float(f64::NEG_INFINITY)
    );
    assert!(matches!(attr_round_trip(Attr::Float(f64::NAN), "nan"), Attr::Float(x) if x.is_nan()));
    let Attr::Float(z) = attr_round_trip(Attr::Float(-0.0), "-0.0") else {
        panic!()
    };
    assert!(z == 0.0 && z.is_sign_negative());
    assert_eq!(
        attr_round_trip(
            Attr::Str("a\"b\\c\nd\te\u{1}f\u{7f}é".into()),
            r#""a\"b\\c\nd\te\01f\7Fé""#
        ),
        Attr::Str("a\"b\\c\nd\te\u{1}f\u{7f}é".into())
    );
    assert_eq!(
        attr_round_trip(Attr::Ints(vec![1, -2]), "[1, -2]"),
        Attr::Ints(vec![1, -2])
    );
    assert_eq!(
        attr_round_trip(Attr::Ints(vec![]), "[]"),
        Attr::Ints(vec![])
    );
    // An empty float list reads back as an empty integer list (the accessors accept both).
    assert_eq!(
        attr_round_trip(Attr::Floats(vec![]), "[]"),
        Attr::Ints(vec![])
    );
    assert_eq!(
        attr_round_trip(
            Attr::Floats(vec![1.0, 2.5, f64::INFINITY]),
            "[1.0, 2.5, inf]"
        ),
        Attr::Floats(vec![1.0, 2.5, f64::INFINITY])
    );
    assert_eq!(
        attr_round_trip(Attr::DType(DType::BF16), "bf16"),
        Attr::DType(DType::BF16)
    );
    assert_eq!(
        attr_round_trip(Attr::DType(DType::Bool), "i1"),
        Attr::DType(DType::Bool)
    );
    let t = Tensor::from_i64(DType::I32, vec![2, 2], vec![1, -2, 3, 4]);
    assert_eq!(
        attr_round_trip(
            Attr::Tensor(t.clone()),
            "dense<[1, -2, 3, 4]> : tensor<2x2xi32>"
        ),
        Attr::Tensor(t)
    );
}

#[test]
fn attr_keys_sorted_quoted_and_mixed_lists() {
    let src = in_func(
        r#"    "pp.recv"() {"my key" = 1, b = 2, a = [1, 2.5], c = [nan, -inf, 3]} : () -> ()"#,
    );
    let m = parse_module(&src).unwrap();
    let f = &m.functions[0];
    let attrs = &f.op(f.ops()[0]).attrs;
    assert_eq!(attrs.get("a"), Some(&Attr::Floats(vec![1.0, 2.5])));
    assert!(
        matches!(attrs.get("c"), Some(Attr::Floats(v)) if v[0].is_nan() && v[1] == f64::NEG_INFINITY && v[2] == 3.0)
    );
    assert!(print_op(f, f.ops()[0])
        .starts_with(r#""pp.recv"() {a = [1.0, 2.5], b = 2, c = [nan, -inf, 3.0], "my key" = 1}"#));
}

#[test]
fn stage_and_phase_come_last() {
    let src = in_func(
        r#"    "pp.recv"() {phase = "bwd_weight", z = 1, stage = 4294967295, a = 0} : () -> ()"#,
    );
    let m = parse_module(&src).unwrap();
    let f = &m.functions[0];
    let op = f.op(f.ops()[0]);
    assert_eq!(
        (op.stage, op.phase),
        (Some(u32::MAX), Some(Phase::BwdWeight))
    );
    assert_eq!(
        print_op(f, f.ops()[0]),
        r#""pp.recv"() {a = 0, z = 1, stage = 4294967295, phase = "bwd_weight"} : () -> ()"#
    );
}

#[test]
fn function_attributes_are_plain() {
    let m = canonical("module {\n  func @f() -> () attributes {phase = \"x\", stage = 1.5} {\n    return\n  }\n}\n");
    assert_eq!(m.functions[0].attrs.get("stage"), Some(&Attr::Float(1.5)));
}

// ---- dense tensors ----

fn dense_round_trip(t: Tensor) -> (String, Tensor) {
    let mut m = Module::new();
    m.weights.insert("w".into(), t);
    let text = m.to_string();
    let back = canonical(&text);
    let line = text.lines().nth(1).unwrap().trim().to_string();
    (line, back.weights["w"].clone())
}

#[test]
fn dense_lists_every_dtype() {
    let cases: Vec<(Tensor, &str)> = vec![
        (
            Tensor::from_f32(vec![2, 2], vec![1.0, -0.0, 0.1, f32::MIN_POSITIVE / 4.0]),
            "dense<[1.0, -0.0, 0.1, 2.938736e-39]>",
        ),
        (
            Tensor::from_f64(DType::F64, vec![3], vec![0.1, 1e-300, f64::NAN]),
            "dense<[0.1, 1e-300, nan]>",
        ),
        (
            Tensor::from_f64(DType::F16, vec![3], vec![0.1, 65504.0, f64::NEG_INFINITY]),
            "dense<[0.099975586, 65504.0, -inf]>",
        ),
        (
            Tensor::from_f64(DType::BF16, vec![2], vec![0.1, 3.0e38]),
            "dense<[0.100097656, 3.0040553e38]>",
        ),
        (
            Tensor::from_i64(DType::I64, vec![2], vec![i64::MIN, i64::MAX]),
            "dense<[-9223372036854775808, 9223372036854775807]>",
        ),
        (
            Tensor::from_i64(DType::I32, vec![1], vec![-7]),
            "dense<[-7]>",
        ),
        (
            Tensor::from_i64(DType::I8, vec![2], vec![-128, 127]),
            "dense<[-128, 127]>",
        ),
        (
            Tensor::from_i64(DType::Bool, vec![2], vec![1, 0]),
            "dense<[true, false]>",
        ),
        (Tensor::scalar_f64(DType::F32, 5.0), "dense<[5.0]>"),
        (Tensor::zeros(DType::F32, vec![0, 3]), "dense<[]>"),
    ];
    for (t, printed) in cases {
        let (line, back) = dense_round_trip(t.clone());
        assert_eq!(line, format!("weight @w : {} = {printed}", t.tensor_type()));
        assert_eq!(format!("{:?}", back), format!("{:?}", t), "{printed}");
    }
}

#[test]
fn dense_hex_every_dtype() {
    let n = 17;
    let floats: Vec<f64> = (0..n).map(|i| (i as f64 - 8.0) * 0.37).collect();
    let ints: Vec<i64> = (0..n).map(|i| (i as i64 - 8) * 13).collect();
    for d in DType::ALL {
        let t = if d.is_float() {
            Tensor::from_f64(d, vec![n], floats.clone())
        } else {
            Tensor::from_i64(d, vec![n], ints.clone())
        };
        let (line, back) = dense_round_trip(t.clone());
        let hex = line
            .split("dense<\"0x")
            .nth(1)
            .unwrap()
            .trim_end_matches("\">");
        assert_eq!(hex.len(), 2 * n * d.size_bytes(), "{line}");
        assert!(hex
            .chars()
            .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase()));
        assert_eq!(back, t, "{d}");
    }
    let (line, _) = dense_round_trip(Tensor::from_f32(vec![17], vec![1.0; 17]));
    assert!(line.ends_with(&format!("dense<\"0x{}\">", "0000803F".repeat(17))));
}

#[test]
fn dense_accepts_either_form_for_any_size() {
    let src = "module {\n  weight @a : tensor<2xf32> = dense<\"0x0000803F00000040\">\n  weight @b : tensor<2xi1> = dense<[1, 0]>\n  weight @c : tensor<2xf32> = dense<[1, 2]>\n}\n";
    let m = parse_module(src).unwrap();
    assert_eq!(m.weights["a"].data, TensorData::Float(vec![1.0, 2.0]));
    assert_eq!(m.weights["b"].data, TensorData::Int(vec![1, 0]));
    assert_eq!(m.weights["c"].data, TensorData::Float(vec![1.0, 2.0]));
    // f32 literals are rounded once, in f32.
    let m = parse_module("module { weight @a : tensor<1xf32> = dense<[0.1]> }").unwrap();
    assert_eq!(m.weights["a"].as_f64().unwrap()[0], 0.1f32 as f64);
}

#[test]
fn dense_errors() {
    let w = |lit: &str| err(&format!("module {{\n  weight @w : {lit}\n}}"));
    assert_eq!(
        w("tensor<2x2xf32> = dense<[1.0, 2.0, 3.0]>"),
        "2:39: dense literal has 3 elements but tensor<2x2xf32> has 4"
    );
    assert_eq!(
        w("tensor<2xf32> = dense<\"0x0000803F\">"),
        "2:37: dense literal has 4 bytes but tensor<2xf32> needs 8 (2 elements of 4 bytes)"
    );
    assert_eq!(
        w("tensor<1xi8> = dense<\"0xZZ\">"),
        "2:36: invalid hex digit 'Z' in dense literal"
    );
    assert_eq!(
        w("tensor<1xi8> = dense<\"0x0\">"),
        "2:36: dense hex literal has an odd number of digits"
    );
    assert_eq!(
        w("tensor<1xi8> = dense<\"12\">"),
        "2:36: a dense string literal must be hex starting with \"0x\""
    );
    assert_eq!(
        w("tensor<1xi1> = dense<\"0x02\">"),
        "2:36: i1 elements must be bytes 00 or 01, found 02"
    );
    assert_eq!(
        w("tensor<2xi8> = dense<[1, 300]>"),
        "2:40: integer out of range for i8 (expected -128 to 127)"
    );
    assert_eq!(
        w("tensor<1xi1> = dense<[2]>"),
        "2:37: integer out of range for i1 (expected 0 to 1)"
    );
    assert_eq!(
        w("tensor<1xi32> = dense<[1.5]>"),
        "2:38: expected an integer for i32, found '1.5'"
    );
    assert_eq!(
        w("tensor<1xf32> = dense<[true]>"),
        "2:38: expected a number for f32, found a bool"
    );
    assert_eq!(
        w("tensor<?xf32> = dense<[1.0]>"),
        "2:15: a dense tensor needs a static type, found tensor<?xf32>"
    );
    assert_eq!(
        w("tensor<1xf32> = dense<[1.0 2.0]>"),
        "2:42: expected ',' or ']' in the dense list, found '2.0'"
    );
    assert_eq!(
        w("tensor<1xf32> = dense<[x]>"),
        "2:38: expected a tensor element, found 'x'"
    );
    assert_eq!(
        w("tensor<1xf32> = dense<1.0>"),
        "2:37: expected '[' or a hex string in the dense literal, found '1.0'"
    );
    assert_eq!(
        w("tensor<1xf32> = zeros"),
        "2:31: expected 'dense' or 'elided', found 'zeros'"
    );
    assert!(w("tensor<4294967296x4294967296x4294967296xf32> = dense<[]>").starts_with(
        "2:22: shape tensor<4294967296x4294967296x4294967296xf32> of 4-byte elements is too large"
    ));
    assert_eq!(
        err("module {\n  weight @w : tensor<f32> = dense<[1.0]>\n  weight @w : tensor<f32> = dense<[1.0]>\n}"),
        "3:10: redefinition of weight @w"
    );
    // In an attribute, the type follows the literal.
    assert_eq!(
        err(&in_func(
            r#"    "pp.recv"() {v = dense<[1, 2]> : tensor<3xi64>} : () -> ()"#
        )),
        "3:28: dense literal has 2 elements but tensor<3xi64> has 3"
    );
    assert_eq!(
        err(&in_func(
            r#"    "pp.recv"() {v = dense<[1, 2]>} : () -> ()"#
        )),
        "3:35: expected ':' and the type after a dense literal, found '}'"
    );
}

// ---- syntax and semantic errors ----

#[test]
fn expected_found_messages() {
    assert_eq!(
        err(&in_func(
            r#"    %y = "pp.relu"(%x {a = 1} : (tensor<2xf32>) -> tensor<2xf32>"#
        )),
        "3:23: expected ')' after operands, found '{'"
    );
    assert_eq!(err(""), "1:1: expected 'module', found end of file");
    assert_eq!(
        err("module {"),
        "1:9: expected 'func', 'weight' or '}', found end of file"
    );
    assert_eq!(
        err("module {} module {}"),
        "1:11: expected end of file after the module, found 'module'"
    );
    assert_eq!(
        err("module {}\n}"),
        "2:1: expected end of file after the module, found '}'"
    );
    assert_eq!(
        err("module { func f() -> () { return } }"),
        "1:15: expected function name after 'func', found 'f'"
    );
    assert_eq!(
        err("module { func @f(%x tensor<2xf32>) -> () { return } }"),
        "1:21: expected ':' after the argument name, found 'tensor<2xf32>'"
    );
    assert_eq!(
        err("module { func @f(%x: tensor<2xf32> {weight}) -> () { return } }"),
        "1:37: expected 'param' or 'state', found 'weight'"
    );
    assert_eq!(
        err("module { func @f() { return } }"),
        "1:20: expected '->' after the argument list, found '{'"
    );
    assert_eq!(
        err("module { func @f() -> () { } }"),
        "1:28: expected an op or 'return', found '}'"
    );
    assert_eq!(
        err("module { func @f() -> () { return %"),
        "1:36: expected a name after '%', found end of file"
    );
    assert_eq!(
        err(&in_func(
            r#"    %y = "pp.relu"(%x) : tensor<2xf32> -> tensor<2xf32>"#
        )),
        "3:26: expected '(' to start the operand types, found 'tensor<2xf32>'"
    );
    assert_eq!(
        err(&in_func(
            r#"    %y = "pp.relu"(%x) (tensor<2xf32>) -> tensor<2xf32>"#
        )),
        "3:24: expected ':' before the op's type signature, found '('"
    );
    assert_eq!(
        err(&in_func(
            r#"    %y "pp.relu"(%x) : (tensor<2xf32>) -> tensor<2xf32>"#
        )),
        "3:8: expected '=' after the op's results, found string \"pp.relu\""
    );
    assert_eq!(
        err(&in_func(r#"    "pp.recv"() {a 1} : () -> ()"#)),
        "3:20: expected '=' after attribute name `a`, found '1'"
    );
    assert_eq!(
        err(&in_func(r#"    "pp.recv"() {a = } : () -> ()"#)),
        "3:22: expected an attribute value, found '}'"
    );
    assert_eq!(
        err(&in_func(r#"    "pp.recv"() {a = [1, x]} : () -> ()"#)),
        "3:26: expected a number in the list, found 'x'"
    );
    assert_eq!(
        err(&in_func(r#"    "pp.recv"() {a = 1, a = 2} : () -> ()"#)),
        "3:25: duplicate attribute `a`"
    );
    assert_eq!(
        err(&in_func(
            r#"    "pp.recv"() {a = 99999999999999999999} : () -> ()"#
        )),
        "3:22: integer 99999999999999999999 does not fit in a 64-bit attribute"
    );
    assert_eq!(
        err(&in_func(r#"    "pp.recv"() : () -> () loc(1)"#)),
        "3:32: expected a location string, found '1'"
    );
}

#[test]
fn unknown_ops() {
    assert_eq!(
        err(&in_func(
            r#"    %y = "pp.reluu"(%x) : (tensor<2xf32>) -> tensor<2xf32>"#
        )),
        "3:10: unknown op \"pp.reluu\" (did you mean \"pp.relu\"?)"
    );
    assert_eq!(
        err(&in_func(
            r#"    %y = "relu"(%x) : (tensor<2xf32>) -> tensor<2xf32>"#
        )),
        "3:10: unknown op \"relu\" (op names start with \"pp.\": did you mean \"pp.relu\"?)"
    );
    assert_eq!(
        err(&in_func(
            r#"    %y = "pp.frobnicate"(%x) : (tensor<2xf32>) -> tensor<2xf32>"#
        )),
        "3:10: unknown op \"pp.frobnicate\""
    );
    assert_eq!(
        err(&in_func(
            r#"    %y = "pp.mux"(%x) : (tensor<2xf32>) -> tensor<2xf32>"#
        )),
        "3:10: unknown op \"pp.mux\" (did you mean \"pp.max\" or \"pp.mul\"?)"
    );
}

#[test]
fn undefined_and_redefined_values() {
    assert_eq!(
        err(&in_func(
            r#"    %y = "pp.relu"(%foo) : (tensor<2xf32>) -> tensor<2xf32>"#
        )),
        "3:20: use of undefined value %foo"
    );
    // SSA: a use before the definition is a use of an undefined value, at the use.
    assert_eq!(
        err(&in_func(
            "    %a = \"pp.relu\"(%b) : (tensor<2xf32>) -> tensor<2xf32>\n    %b = \"pp.relu\"(%x) : (tensor<2xf32>) -> tensor<2xf32>"
        )),
        "3:20: use of undefined value %b"
    );
    assert_eq!(
        err(&in_func(
            r#"    %y = "pp.relu"(%y) : (tensor<2xf32>) -> tensor<2xf32>"#
        )),
        "3:20: use of undefined value %y"
    );
    assert_eq!(
        err(&in_func(
            r#"    %x = "pp.relu"(%x) : (tensor<2xf32>) -> tensor<2xf32>"#
        )),
        "3:5: redefinition of value %x (first defined at 2:11)"
    );
    assert_eq!(
        err(&in_func(
            r#"    %a, %a = "pp.split"(%x) : (tensor<2xf32>) -> (tensor<1xf32>, tensor<1xf32>)"#
        )),
        "3:9: redefinition of value %a (first defined at 3:5)"
    );
    assert_eq!(
        err("module { func @f(%x: tensor<2xf32>, %x: tensor<2xf32>) -> () { return } }"),
        "1:37: redefinition of value %x (first defined at 1:18)"
    );
    assert_eq!(
        err("module { func @f() -> () { return %r : tensor<2xf32> } }"),
        "1:35: use of undefined value %r"
    );
    // Names are per function.
    parse_module("module { func @f(%x: tensor<2xf32>) -> () { return } func @g(%x: tensor<2xf32>) -> () { return } }").unwrap();
    assert_eq!(
        err("module {\n  func @f() -> () { return }\n  func @f() -> () { return }\n}"),
        "3:8: redefinition of function @f (first defined at 2:8)"
    );
    assert_eq!(
        err("module { func @f(%\"\": tensor<2xf32>) -> () { return } }"),
        "1:18: empty value name"
    );
}

#[test]
fn signature_mismatches() {
    assert_eq!(
        err(&in_func(
            r#"    %y = "pp.add"(%x, %x) : (tensor<2xf32>) -> tensor<2xf32>"#
        )),
        "3:29: \"pp.add\" has 2 operands but its signature lists 1 operand type"
    );
    assert_eq!(
        err(&in_func(
            r#"    %y = "pp.relu"(%x) : (tensor<2xf32>) -> (tensor<2xf32>, tensor<2xf32>)"#
        )),
        "3:45: \"pp.relu\" has 1 result but its signature lists 2 result types"
    );
    assert_eq!(
        err(&in_func(
            r#"    "pp.relu"(%x) : (tensor<2xf32>) -> tensor<2xf32>"#
        )),
        "3:40: \"pp.relu\" has 0 results but its signature lists 1 result type"
    );
    assert_eq!(
        err(&in_func(r#"    %y = "pp.add"(%x, %x) : (tensor<2xf32>, tensor<?xf32>) -> tensor<2xf32>"#)),
        "3:45: operand 1 of \"pp.add\" (%x) has type tensor<2xf32> but the signature says tensor<?xf32>"
    );
    assert_eq!(
        err("module { func @f(%x: tensor<2xf32>) -> (tensor<2xf32>) { return %x : tensor<3xf32> } }"),
        "1:70: returned value 0 (%x) has type tensor<2xf32> but the 'return' says tensor<3xf32>"
    );
    assert_eq!(
        err("module { func @f(%x: tensor<2xf32>) -> (tensor<2xf32>) { return %x, %x : tensor<2xf32> } }"),
        "1:58: 'return' has 2 values but 1 types"
    );
    assert_eq!(
        err("module { func @f(%x: tensor<2xf32>) -> (tensor<2xf32>) { return } }"),
        "1:58: function @f declares 1 results but returns 0 values"
    );
    assert_eq!(
        err(
            "module { func @f(%x: tensor<2xf32>) -> (tensor<2xi8>) { return %x : tensor<2xf32> } }"
        ),
        "1:64: function @f declares result 0 as tensor<2xi8> but returns %x of type tensor<2xf32>"
    );
}

#[test]
fn stage_and_phase_must_have_the_right_kind() {
    assert_eq!(
        err(&in_func(r#"    "pp.recv"() {stage = 1.0} : () -> ()"#)),
        "3:18: attribute `stage` must be a non-negative integer (a pipeline stage), found float 1.0"
    );
    assert_eq!(
        err(&in_func(r#"    "pp.recv"() {stage = -1} : () -> ()"#)),
        "3:18: attribute `stage` must be a non-negative integer (a pipeline stage), found integer -1"
    );
    assert_eq!(
        err(&in_func(r#"    "pp.recv"() {phase = "bwd"} : () -> ()"#)),
        "3:18: attribute `phase` must be one of \"fwd\", \"bwd_input\", \"bwd_weight\", \"optim\", found string \"bwd\""
    );
}

#[test]
fn lexical_errors() {
    assert_eq!(err("module @\"abc\n{}"), "1:9: unterminated string");
    assert_eq!(err("module @\"abc"), "1:9: unterminated string");
    assert_eq!(
        err("module @\"a\\qb\" {}"),
        "1:11: invalid escape sequence '\\q' in string"
    );
    assert_eq!(
        err("module @\"a\\4\" {}"),
        "1:11: expected two hex digits after '\\' in string"
    );
    assert_eq!(err("module @\"\\FF\" {}"), "1:9: string is not valid UTF-8");
    assert_eq!(err("module { # }"), "1:10: unexpected character '#'");
    assert_eq!(err("module { / }"), "1:10: unexpected character '/'");
    assert_eq!(err("module { - }"), "1:10: unexpected character '-'");
    assert_eq!(
        err("module @ {}"),
        "1:9: expected a name after '@', found ' '"
    );
    // A syntax error before a lexical error is the one reported.
    assert_eq!(
        err("module ( \"abc"),
        "1:8: expected '{' to start the module body, found '('"
    );
    // Columns count characters, not bytes.
    assert_eq!(
        err("module @\"ééé\" # {}"),
        "1:15: unexpected character '#'"
    );
}

// ---- robustness ----

#[test]
fn truncations_and_mutations_never_panic() {
    let src = EXAMPLE;
    let mut n_err = 0;
    // Every proper prefix of the module (without its final newline) is incomplete.
    let trimmed = src.trim_end();
    for (i, _) in trimmed.char_indices() {
        if parse_module(&trimmed[..i]).is_err() {
            n_err += 1;
        }
    }
    assert_eq!(n_err, trimmed.chars().count());
    // Deterministic byte mutations (a small LCG), read back lossily as UTF-8.
    let mut state: u64 = 0x9E3779B97F4A7C15;
    let mut next = || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) as usize
    };
    let bytes = src.as_bytes();
    for _ in 0..3000 {
        let mut b = bytes.to_vec();
        for _ in 0..1 + next() % 4 {
            let at = next() % b.len();
            match next() % 3 {
                0 => b[at] = (next() % 256) as u8,
                1 => {
                    b.remove(at);
                }
                _ => b.insert(at, b"%@\"<>()[]{},:=-x?0123456789.e\\"[next() % 30]),
            }
        }
        let s = String::from_utf8_lossy(&b);
        let _ = parse_module(&s);
    }
}
