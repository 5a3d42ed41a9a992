//! Reader and lowering tests on the committed JAX fixtures (tests/stablehlo/fixtures) and
//! on small hand-written modules.

use std::collections::BTreeMap;

use super::*;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../tests/stablehlo/fixtures/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn import(text: &str) -> Result<Imported, StableHloError> {
    import_stablehlo(text.as_bytes(), "t.mlir", &BTreeMap::new())
}

#[test]
fn every_fixture_imports_in_both_forms_alike() {
    for m in ["mlp", "gpt", "cnn"] {
        let pretty = import_stablehlo(&fixture(&format!("{m}.mlir")), m, &BTreeMap::new())
            .unwrap_or_else(|e| panic!("{e}"));
        let generic = import_stablehlo(&fixture(&format!("{m}.generic.mlir")), m, &BTreeMap::new())
            .unwrap_or_else(|e| panic!("{e}"));
        let (p, g) = (&pretty.module.functions[0], &generic.module.functions[0]);
        assert_eq!(p.ops().len(), g.ops().len(), "{m}");
        let kinds = |f: &ppir::Function| -> Vec<ppir::OpKind> {
            f.ops().iter().map(|&o| f.op(o).kind).collect()
        };
        assert_eq!(kinds(p), kinds(g), "{m}");
        assert_eq!(p.result_types(), g.result_types(), "{m}");
        ppir::verify::verify_module(&pretty.module).unwrap_or_else(|e| panic!("{m}: {e:?}"));
    }
}

#[test]
fn unknown_ops_are_named_with_their_location() {
    let e = import(
        "func.func @main(%arg0: tensor<2xf32>) -> tensor<2xf32> {\n  %0 = stablehlo.cbrt %arg0 : tensor<2xf32>\n  return %0 : tensor<2xf32>\n}",
    )
    .unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    assert_eq!(
        e.to_string(),
        "t.mlir:2:3: `stablehlo.cbrt`: this op is not supported by ppcc's StableHLO importer"
    );
}

#[test]
fn recursive_calls_are_an_error() {
    let e = import(
        "module {\n func.func @main(%a: tensor<f32>) -> tensor<f32> {\n  %0 = call @f(%a) : (tensor<f32>) -> tensor<f32>\n  return %0 : tensor<f32>\n }\n func.func private @f(%a: tensor<f32>) -> tensor<f32> {\n  %0 = call @f(%a) : (tensor<f32>) -> tensor<f32>\n  return %0 : tensor<f32>\n }\n}",
    )
    .unwrap_err();
    assert!(e.to_string().contains("deeper than"), "{e}");
}

#[test]
fn reducer_blocks_hex_constants_and_generic_ops_read_alike() {
    // A pretty `reduce` with its body written out, a hex constant, and a generic op
    // between pretty ones.
    let m = import(
        "func.func @main(%arg0: tensor<2x3xf32>) -> (tensor<2xf32>, tensor<2xf32>) {
  %c = stablehlo.constant dense<\"0x0000803F00000040\"> : tensor<2xf32>
  %z = stablehlo.constant dense<0.000000e+00> : tensor<f32>
  %0 = stablehlo.reduce(%arg0 init: %z) across dimensions = [1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<2xf32>
   reducer(%a: tensor<f32>, %b: tensor<f32>)  {
    %s = stablehlo.add %a, %b : tensor<f32>
    stablehlo.return %s : tensor<f32>
  }
  %1 = \"stablehlo.multiply\"(%0, %c) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  return %0, %1 : tensor<2xf32>, tensor<2xf32>
}",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let f = &m.module.functions[0];
    let x = ppir::Tensor::from_f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]);
    let out = ppir::interp::run_function(f, vec![x], &Default::default(), None).unwrap();
    assert_eq!(out[0].to_f64_vec(), [6.0, 15.0]);
    assert_eq!(out[1].to_f64_vec(), [6.0, 30.0]);
    assert_eq!(m.outputs, ["out0", "out1"]);
}

#[test]
fn hostile_text_is_an_error_not_a_crash() {
    for text in [
        "",
        "func.func @main(",
        "module { func.func @main() -> () { return } ",
        &"[".repeat(100_000),
        &format!("func.func @main() -> tensor<f32> {{ %0 = stablehlo.constant dense<{}> : tensor<f32>\n return %0 : tensor<f32> }}", "[".repeat(10_000)),
        "func.func @main() -> tensor<99999999999x99999999999xf32> { %0 = stablehlo.iota dim = 0 : tensor<99999999999x99999999999xf32>\n return %0 : tensor<99999999999x99999999999xf32> }",
        "\"func.func\"() <{function_type = () -> (), sym_name = \"main\"}> ({\n}) : () -> ()",
    ] {
        assert!(import(text).is_err(), "{text:.60}");
    }
}
