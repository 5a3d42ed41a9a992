//! Tests of `lower::norm` (see common.rs for the harness).

use ppcc_codegen::lower_function;
use ppir::interp::{run_function, InterpOptions};
use ppir::{DType, Tensor};

use crate::common::*;
use crate::reduce::check_nan_inputs;

fn t(shape: &[u64], ty: &str) -> String {
    let mut s = String::from("tensor<");
    for d in shape {
        s.push_str(&format!("{d}x"));
    }
    s.push_str(ty);
    s.push('>');
    s
}

/// `softmax` and `log_softmax` of `x` with `attrs`.
fn softmaxes(shape: &[u64], ty: &str, attrs: &str) -> String {
    let x = t(shape, ty);
    format!(
        r#"
module {{
  func @f(%x: {x}) -> ({x}, {x}) {{
    %s = "pp.softmax"(%x) {attrs} : ({x}) -> {x}
    %l = "pp.log_softmax"(%x) {attrs} : ({x}) -> {x}
    return %s, %l : {x}, {x}
  }}
}}
"#
    )
}

#[test]
fn softmax_any_axis() {
    for (shape, attrs) in [
        (&[4u64, 8][..], "{axis = -1}"),
        (&[4, 8], "{}"),
        (&[4, 8], "{axis = 0}"),
        (&[3, 5, 7], "{axis = 1}"),
        (&[3, 5, 7], "{axis = -3}"),
        (&[2, 3, 4, 5], "{axis = 2}"),
        (&[6], "{axis = 0}"),
    ] {
        check(&softmaxes(shape, "f32", attrs), None);
    }
}

#[test]
fn softmax_f64_and_large_values() {
    let x = uniform(DType::F64, &[3, 9], 2, -50.0, 50.0);
    check(&softmaxes(&[3, 9], "f64", "{axis = 1}"), Some(vec![x]));
    // Large logits: stable only if shifted by the maximum.
    let x = uniform(DType::F32, &[4, 6], 3, 500.0, 1000.0);
    check(&softmaxes(&[4, 6], "f32", "{}"), Some(vec![x]));
}

#[test]
fn softmax_long_rows() {
    let x = uniform(DType::F32, &[2, 5000], 4, -8.0, 8.0);
    check(&softmaxes(&[2, 5000], "f32", "{axis = -1}"), Some(vec![x]));
}

#[test]
fn softmax_infinities_and_nan() {
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let x = Tensor::from_f32(
        vec![5, 3],
        vec![
            -inf, -inf, -inf, // all -inf: shift 0, 0/0
            -inf, 1.0, 2.0, // one -inf: exp gives 0
            inf, 1.0, 0.0, // +inf: shift 0, inf/inf
            nan, 1.0, 2.0, // NaN: ignored by the max, poisons the sum
            0.5, -0.5, 3.0,
        ],
    );
    check_nan_inputs(&softmaxes(&[5, 3], "f32", "{}"), vec![x]);
}

#[test]
fn batch_norm_inference() {
    for (shape, attrs) in [
        (&[2u64, 3, 4, 5][..], "{epsilon = 1e-5}"),
        (&[2, 4, 6], "{epsilon = 0.25}"),
        (&[5, 3], "{}"),
    ] {
        for (ty, d) in [("f32", DType::F32), ("f64", DType::F64)] {
            let c = shape[1];
            let x = t(shape, ty);
            let p = t(&[c], ty);
            let src = format!(
                r#"
module {{
  func @f(%x: {x}, %s: {p}, %b: {p}, %m: {p}, %v: {p}) -> ({x}) {{
    %y = "pp.batch_norm"(%x, %s, %b, %m, %v) {attrs} : ({x}, {p}, {p}, {p}, {p}) -> {x}
    return %y : {x}
  }}
}}
"#
            );
            let dims: Vec<usize> = shape.iter().map(|&s| s as usize).collect();
            let c = c as usize;
            let inputs = vec![
                uniform(d, &dims, 1, -3.0, 3.0),
                uniform(d, &[c], 2, -2.0, 2.0),
                uniform(d, &[c], 3, -1.0, 1.0),
                uniform(d, &[c], 4, -1.0, 1.0),
                uniform(d, &[c], 5, 0.01, 2.0),
            ];
            check(&src, Some(inputs));
        }
    }
}

#[test]
fn instance_norm_planes() {
    for (shape, attrs) in [
        (&[2u64, 3, 4, 5][..], "{}"),
        (&[3, 2, 7], "{epsilon = 1e-3}"),
        (&[1, 4, 2, 3, 2], "{epsilon = 1e-5}"),
    ] {
        for ty in ["f32", "f64"] {
            let x = t(shape, ty);
            let p = t(&[shape[1]], ty);
            let src = format!(
                r#"
module {{
  func @f(%x: {x}, %s: {p}, %b: {p}) -> ({x}) {{
    %y = "pp.instance_norm"(%x, %s, %b) {attrs} : ({x}, {p}, {p}) -> {x}
    return %y : {x}
  }}
}}
"#
            );
            check(&src, None);
        }
    }
}

#[test]
fn instance_norm_constant_planes() {
    // Zero variance: the result is the bias (x - mean = 0 exactly).
    let src = r#"
module {
  func @f(%x: tensor<2x2x3xf32>, %s: tensor<2xf32>, %b: tensor<2xf32>) -> (tensor<2x2x3xf32>) {
    %y = "pp.instance_norm"(%x, %s, %b) : (tensor<2x2x3xf32>, tensor<2xf32>, tensor<2xf32>) -> tensor<2x2x3xf32>
    return %y : tensor<2x2x3xf32>
  }
}
"#;
    let x = Tensor::from_f32(vec![2, 2, 3], vec![1.5; 12]);
    let s = Tensor::from_f32(vec![2], vec![2.0, -1.0]);
    let b = Tensor::from_f32(vec![2], vec![0.25, 3.0]);
    check(src, Some(vec![x, s, b]));
}

#[test]
fn layer_norm_axes_scale_and_bias() {
    for (shape, axis, scale, bias) in [
        (&[4u64, 8][..], -1i64, &[8u64][..], Some(&[8u64][..])),
        (&[2, 3, 4], 1, &[3, 4], None),
        (&[2, 3, 4], -2, &[1, 4], Some(&[3, 1][..])),
        (&[2, 3, 4], 0, &[2, 3, 4], Some(&[4][..])),
        (&[5, 6], 1, &[1], None),
        (&[3, 1, 5], 1, &[1, 5], Some(&[5][..])),
    ] {
        for ty in ["f32", "f64"] {
            let x = t(shape, ty);
            let sc = t(scale, ty);
            let (args, operands, types) = match bias {
                Some(b) => {
                    let bt = t(b, ty);
                    (format!(", %b: {bt}"), ", %b".to_string(), format!(", {bt}"))
                }
                None => (String::new(), String::new(), String::new()),
            };
            let src = format!(
                r#"
module {{
  func @f(%x: {x}, %s: {sc}{args}) -> ({x}) {{
    %y = "pp.layer_norm"(%x, %s{operands}) {{axis = {axis}, epsilon = 1e-4}} : ({x}, {sc}{types}) -> {x}
    return %y : {x}
  }}
}}
"#
            );
            check(&src, None);
        }
    }
}

#[test]
fn layer_norm_default_axis_and_long_rows() {
    let src = r#"
module {
  func @f(%x: tensor<3x3000xf32>, %s: tensor<3000xf32>, %b: tensor<3000xf32>) -> (tensor<3x3000xf32>) {
    %y = "pp.layer_norm"(%x, %s, %b) : (tensor<3x3000xf32>, tensor<3000xf32>, tensor<3000xf32>) -> tensor<3x3000xf32>
    return %y : tensor<3x3000xf32>
  }
}
"#;
    let x = uniform(DType::F32, &[3, 3000], 1, 100.0, 101.0);
    let s = uniform(DType::F32, &[3000], 2, -2.0, 2.0);
    let b = uniform(DType::F32, &[3000], 3, -2.0, 2.0);
    check(src, Some(vec![x, s, b]));
}

#[test]
fn layer_norm_with_statistics() {
    // The interpreter's three-result form (mean and 1/std); the verifier wants one result,
    // so this module is built without it. Statistics in f32 and in f64.
    for stat in ["f32", "f64"] {
        let src = format!(
            r#"
module {{
  func @f(%x: tensor<2x3x4xf32>, %s: tensor<3x4xf32>, %b: tensor<4xf32>) -> (tensor<2x3x4xf32>, tensor<2x1x1x{stat}>, tensor<2x1x1x{stat}>) {{
    %y, %m, %r = "pp.layer_norm"(%x, %s, %b) {{axis = 1}} : (tensor<2x3x4xf32>, tensor<3x4xf32>, tensor<4xf32>) -> (tensor<2x3x4xf32>, tensor<2x1x1x{stat}>, tensor<2x1x1x{stat}>)
    return %y, %m, %r : tensor<2x3x4xf32>, tensor<2x1x1x{stat}>, tensor<2x1x1x{stat}>
  }}
}}
"#
        );
        let m = parse_stage(&src);
        let inputs = random_inputs(&m.functions[0], 5);
        check_with(&m, "f", inputs, 1e-5);
    }
}

fn lrn_src(shape: &[u64], ty: &str, attrs: &str) -> String {
    let x = t(shape, ty);
    format!(
        r#"
module {{
  func @f(%x: {x}) -> ({x}) {{
    %y = "pp.lrn"(%x) {attrs} : ({x}) -> {x}
    return %y : {x}
  }}
}}
"#
    )
}

#[test]
fn lrn_windows() {
    for (shape, attrs) in [
        (&[2u64, 5, 3, 3][..], "{size = 3}"),
        (
            &[2, 6, 4],
            "{size = 4, alpha = 0.01, beta = 0.5, bias = 2.0}",
        ),
        (&[1, 4, 2, 2], "{size = 1, alpha = 0.1}"),
        (&[2, 3, 5], "{size = 7, alpha = 0.3, beta = 1.25}"),
        (&[3, 8], "{size = 5, alpha = 0.05, bias = 0.5}"),
        (&[1, 6, 2, 2], "{size = 2, alpha = 1.0, beta = 0.75}"),
    ] {
        check(&lrn_src(shape, "f32", attrs), None);
    }
    let x = uniform(DType::F64, &[2, 5, 3], 6, -3.0, 3.0);
    check(
        &lrn_src(&[2, 5, 3], "f64", "{size = 3, alpha = 0.2}"),
        Some(vec![x]),
    );
}

// ---- softmax cross-entropy ----

fn ce_src(logits: &[u64], ty: &str, lty: &str, attrs: &str) -> String {
    let l = t(logits, ty);
    let lab = t(&logits[..logits.len() - 1], lty);
    let s = t(&[], ty);
    format!(
        r#"
module {{
  func @f(%l: {l}, %lab: {lab}, %dl: {s}) -> ({s}, {l}) {{
    %ce = "pp.softmax_cross_entropy"(%l, %lab) {attrs} : ({l}, {lab}) -> {s}
    %g = "pp.softmax_cross_entropy_grad"(%l, %lab, %dl) {attrs} : ({l}, {lab}, {s}) -> {l}
    return %ce, %g : {s}, {l}
  }}
}}
"#
    )
}

fn ce_inputs(logits: &[usize], d: DType, ld: DType, labels: Vec<i64>, seed: u64) -> Vec<Tensor> {
    vec![
        uniform(d, logits, seed, -4.0, 4.0),
        Tensor::from_i64(ld, logits[..logits.len() - 1].to_vec(), labels),
        Tensor::from_f64(d, vec![], vec![0.75]),
    ]
}

#[test]
fn cross_entropy_and_gradient() {
    // Random labels in [0, 4) over 10 classes.
    check(&ce_src(&[4, 10], "f32", "i64", "{}"), None);
    check(&ce_src(&[2, 3, 7], "f32", "i64", "{}"), None);
    check(&ce_src(&[2, 3, 7], "f64", "i32", "{}"), None);
    check(&ce_src(&[3, 5], "f32", "i8", "{ignore_index = 3}"), None);
    // Every class used, i32 labels.
    let labels = (0..12).map(|i| i % 5).collect();
    check(
        &ce_src(&[3, 4, 5], "f32", "i32", "{}"),
        Some(ce_inputs(&[3, 4, 5], DType::F32, DType::I32, labels, 3)),
    );
    // Rank-1 logits: one row, a scalar label.
    check(
        &ce_src(&[6], "f32", "i64", "{}"),
        Some(ce_inputs(&[6], DType::F32, DType::I64, vec![5], 4)),
    );
}

#[test]
fn cross_entropy_ignore_index() {
    let labels = vec![1, -100, 3, 0, -100, 2];
    check(
        &ce_src(&[2, 3, 4], "f32", "i64", "{ignore_index = -100}"),
        Some(ce_inputs(&[2, 3, 4], DType::F32, DType::I64, labels, 5)),
    );
    // An in-range ignore index.
    let labels = vec![1, 2, 2, 0, 2, 3];
    check(
        &ce_src(&[6, 4], "f32", "i32", "{ignore_index = 2}"),
        Some(ce_inputs(&[6, 4], DType::F32, DType::I32, labels, 6)),
    );
    // Every position ignored: loss 0, gradient 0.
    let labels = vec![-1; 3];
    check(
        &ce_src(&[3, 5], "f64", "i64", "{ignore_index = -1}"),
        Some(ce_inputs(&[3, 5], DType::F64, DType::I64, labels, 7)),
    );
}

#[test]
fn cross_entropy_large_logits() {
    let mut inputs = ce_inputs(&[4, 6], DType::F32, DType::I64, vec![0, 5, 2, 3], 8);
    inputs[0] = uniform(DType::F32, &[4, 6], 9, 300.0, 900.0);
    check(&ce_src(&[4, 6], "f32", "i64", "{}"), Some(inputs));
}

#[test]
fn out_of_range_labels_are_ignored() {
    // The interpreter rejects labels outside [0, C); compiled code cannot fail and treats
    // such positions as ignored: compare with the interpreter given ignore_index there.
    let src = ce_src(&[5, 4], "f32", "i64", "{ignore_index = -100}");
    let m = parse(&src);
    let native_labels = vec![1, 4, -3, 2, 100];
    let interp_labels = vec![1, -100, -100, 2, -100];
    let native = ce_inputs(&[5, 4], DType::F32, DType::I64, native_labels, 10);
    let mut interp = native.clone();
    interp[1] = Tensor::from_i64(DType::I64, vec![5], interp_labels);
    let f = &m.functions[0];
    let want = run_function(f, interp, &InterpOptions::default(), None).unwrap();
    let (nm, dir) = compile(&m);
    let args: Vec<&Tensor> = native.iter().collect();
    let got = nm.call("f", &args, None).unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(g, w, 1e-5, &format!("result {i}"));
    }
    cleanup(dir);
}

#[test]
fn refused_cases_are_errors() {
    // lrn without its required size.
    let src = r#"
module {
  func @f(%x: tensor<1x3x2xf32>) -> (tensor<1x3x2xf32>) {
    %y = "pp.lrn"(%x) {size = 2} : (tensor<1x3x2xf32>) -> tensor<1x3x2xf32>
    return %y : tensor<1x3x2xf32>
  }
}
"#;
    let mut m = parse(src);
    let f = &mut m.functions[0];
    let op = f.ops()[0];
    f.op_mut(op).attrs = ppir::attr::Attrs::new();
    let e = lower_function(&m.functions[0]).unwrap_err().to_string();
    assert!(e.contains("size"), "{e}");
}

#[test]
fn half_precision() {
    let x = uniform(DType::F16, &[3, 9], 2, -5.0, 5.0);
    check(&softmaxes(&[3, 9], "f16", "{axis = 1}"), Some(vec![x]));
    check(&lrn_src(&[2, 5, 3], "f16", "{size = 3, alpha = 0.2}"), None);
    check(
        &ce_src(&[2, 3, 7], "f16", "i64", "{ignore_index = 1}"),
        None,
    );
    let src = r#"
module {
  func @f(%x: tensor<2x3x4xf16>, %s: tensor<4xf16>, %b: tensor<4xf16>, %c: tensor<3xf16>, %v: tensor<3xf16>) -> (tensor<2x3x4xf16>, tensor<2x3x4xf16>, tensor<2x3x4xf16>) {
    %l = "pp.layer_norm"(%x, %s, %b) : (tensor<2x3x4xf16>, tensor<4xf16>, tensor<4xf16>) -> tensor<2x3x4xf16>
    %i = "pp.instance_norm"(%x, %c, %c) : (tensor<2x3x4xf16>, tensor<3xf16>, tensor<3xf16>) -> tensor<2x3x4xf16>
    %n = "pp.batch_norm"(%x, %c, %c, %c, %v) : (tensor<2x3x4xf16>, tensor<3xf16>, tensor<3xf16>, tensor<3xf16>, tensor<3xf16>) -> tensor<2x3x4xf16>
    return %l, %i, %n : tensor<2x3x4xf16>, tensor<2x3x4xf16>, tensor<2x3x4xf16>
  }
}
"#;
    let mut inputs = random_inputs(&parse(src).functions[0], 3);
    inputs[4] = uniform(DType::F16, &[3], 4, 0.1, 2.0);
    check(src, Some(inputs));
}

#[test]
fn bf16_softmax_and_layer_norm() {
    let x = uniform(DType::BF16, &[3, 9], 5, -5.0, 5.0);
    check(&softmaxes(&[3, 9], "bf16", "{axis = 1}"), Some(vec![x]));
    let x = uniform(DType::BF16, &[4, 9], 6, -5.0, 5.0);
    check(&softmaxes(&[4, 9], "bf16", "{axis = 0}"), Some(vec![x]));
    check(
        r#"
module {
  func @f(%x: tensor<2x3x4xbf16>, %s: tensor<4xbf16>, %b: tensor<4xbf16>) -> (tensor<2x3x4xbf16>) {
    %l = "pp.layer_norm"(%x, %s, %b) : (tensor<2x3x4xbf16>, tensor<4xbf16>, tensor<4xbf16>) -> tensor<2x3x4xbf16>
    return %l : tensor<2x3x4xbf16>
  }
}
"#,
        None,
    );
    // The cross-entropy's scalar loss would be rounded by a libgcc call: refused.
    let m = parse(&ce_src(&[2, 3, 7], "bf16", "i64", "{}"));
    let e = lower_function(&m.functions[0]).unwrap_err().to_string();
    assert!(e.contains("bf16"), "{e}");
}

/// The support-library row kernels (f32 softmax over the last axis, layer_norm with dense
/// scale and bias): rows that do not fill a block of 4 or 8, rows shorter and longer than a
/// vector, NaN and infinities, and all three layer_norm results.
#[test]
fn row_kernels_on_ragged_shapes() {
    for shape in [&[9u64, 5][..], &[3, 17], &[2, 2, 33], &[7, 1], &[1, 16]] {
        check(&softmaxes(shape, "f32", "{axis = -1}"), None);
    }
    let (inf, nan) = (f32::INFINITY, f32::NAN);
    let mut v = vec![0.25f32; 9 * 20];
    v[3] = nan;
    v[25] = inf;
    v[47] = -inf;
    for x in &mut v[60..80] {
        *x = -inf;
    }
    v[100] = 80.0;
    v[101] = -80.0;
    check_nan_inputs(
        &softmaxes(&[9, 20], "f32", "{}"),
        vec![Tensor::from_f32(vec![9, 20], v)],
    );
    for (rows, n) in [(9u64, 5u64), (3, 40), (17, 3)] {
        let src = format!(
            r#"
module {{
  func @f(%x: tensor<{rows}x{n}xf32>, %s: tensor<{n}xf32>, %b: tensor<{n}xf32>) -> (tensor<{rows}x{n}xf32>, tensor<{rows}x1xf32>, tensor<{rows}x1xf32>) {{
    %y, %m, %r = "pp.layer_norm"(%x, %s, %b) {{axis = 1, epsilon = 1e-3}} : (tensor<{rows}x{n}xf32>, tensor<{n}xf32>, tensor<{n}xf32>) -> (tensor<{rows}x{n}xf32>, tensor<{rows}x1xf32>, tensor<{rows}x1xf32>)
    return %y, %m, %r : tensor<{rows}x{n}xf32>, tensor<{rows}x1xf32>, tensor<{rows}x1xf32>
  }}
}}
"#
        );
        let m = parse_stage(&src);
        let inputs = random_inputs(&m.functions[0], 6);
        check_with(&m, "f", inputs, 1e-5);
    }
}

/// `label_logit` and its gradient over logits `[.., C]` holding the classes
/// `offset..offset + C`.
fn label_src(logits: &[u64], ty: &str, lty: &str, offset: i64) -> String {
    let l = t(logits, ty);
    let outer = &logits[..logits.len() - 1];
    let lab = t(outer, lty);
    let y = t(outer, ty);
    let c = logits[logits.len() - 1];
    format!(
        r#"
module {{
  func @f(%l: {l}, %lab: {lab}, %dy: {y}) -> ({y}, {l}, {l}) {{
    %p = "pp.label_logit"(%l, %lab) {{offset = {offset}}} : ({l}, {lab}) -> {y}
    %g = "pp.label_logit_grad"(%dy, %lab) {{offset = {offset}, classes = {c}}} : ({y}, {lab}) -> {l}
    %a = "pp.label_logit_grad"(%dy, %lab, %l) {{offset = {offset}, classes = {c}}} : ({y}, {lab}, {l}) -> {l}
    return %p, %g, %a : {y}, {l}, {l}
  }}
}}
"#
    )
}

#[test]
fn label_logit_and_gradient() {
    // Labels below, inside and above the piece's classes 4..9.
    for (ld, lty) in [(DType::I64, "i64"), (DType::I32, "i32")] {
        let labels: Vec<i64> = vec![0, 3, 4, 6, 8, 9, 12, -100];
        let inputs = vec![
            uniform(DType::F32, &[2, 4, 5], 21, -3.0, 3.0),
            Tensor::from_i64(ld, vec![2, 4], labels),
            uniform(DType::F32, &[2, 4], 22, -1.0, 1.0),
        ];
        check(&label_src(&[2, 4, 5], "f32", lty, 4), Some(inputs));
    }
    let inputs = vec![
        uniform(DType::F64, &[3, 7], 23, -3.0, 3.0),
        Tensor::from_i64(DType::I64, vec![3], vec![6, 0, 2]),
        uniform(DType::F64, &[3], 24, -1.0, 1.0),
    ];
    check(&label_src(&[3, 7], "f64", "i64", 0), Some(inputs));
}

fn lse_src(shape: &str, out: &str, attrs: &str) -> String {
    format!(
        r#"
module {{
  func @f(%x: tensor<{shape}xf32>, %dy: tensor<{out}xf32>) -> (tensor<{out}xf32>, tensor<{shape}xf32>) {{
    %y = "pp.reduce_log_sum_exp"(%x) {attrs} : (tensor<{shape}xf32>) -> tensor<{out}xf32>
    %g = "pp.log_sum_exp_grad"(%x, %y, %dy) {attrs} : (tensor<{shape}xf32>, tensor<{out}xf32>, tensor<{out}xf32>) -> tensor<{shape}xf32>
    return %y, %g : tensor<{out}xf32>, tensor<{shape}xf32>
  }}
}}
"#
    )
}

#[test]
fn reduce_log_sum_exp() {
    for (out, attrs) in [
        ("3x4", "{axes = [-1], keepdims = 0}"),
        ("3x1x5", "{axes = [1]}"),
        ("1x1x1", "{}"),
        ("4", "{axes = [0, 2], keepdims = 0}"),
    ] {
        let x = uniform(DType::F32, &[3, 4, 5], 25, -50.0, 50.0);
        let n: Vec<usize> = out.split('x').map(|d| d.parse().unwrap()).collect();
        let dy = uniform(DType::F32, &n, 26, -1.0, 1.0);
        check(&lse_src("3x4x5", out, attrs), Some(vec![x, dy]));
    }
    // Large values (no overflow), an all -inf row (-inf) and a +inf element.
    let inf = f32::INFINITY;
    let x = Tensor::from_f32(
        vec![3, 3],
        vec![800.0, 805.0, -3.0, -inf, -inf, -inf, inf, 1.0, 2.0],
    );
    // dy is 0 on the infinite rows (their gradient is NaN on both sides: inf - inf).
    let dy = Tensor::from_f32(vec![3], vec![0.5, 0.0, 0.0]);
    check(
        &lse_src("3x3", "3", "{axes = [1], keepdims = 0}"),
        Some(vec![x, dy]),
    );
}
