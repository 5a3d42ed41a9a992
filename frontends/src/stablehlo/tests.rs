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

#[test]
fn take_along_axis_as_jax_emits_it() {
    // jnp.take_along_axis(x, i[:, None], axis=1), as jax.jit(..).lower(..).as_text()
    // prints it (with the bounds mask reduced by `and`).
    let m = import(
        "module @jit_f {
  func.func public @main(%arg0: tensor<3x4xf32>, %arg1: tensor<3x1xi32>) -> (tensor<3x1xf32>) {
    %c = stablehlo.constant dense<0> : tensor<i32>
    %0 = stablehlo.broadcast_in_dim %c, dims = [] : (tensor<i32>) -> tensor<3x1xi32>
    %1 = stablehlo.compare  LT, %arg1, %0,  SIGNED : (tensor<3x1xi32>, tensor<3x1xi32>) -> tensor<3x1xi1>
    %c_0 = stablehlo.constant dense<4> : tensor<i32>
    %2 = stablehlo.broadcast_in_dim %c_0, dims = [] : (tensor<i32>) -> tensor<3x1xi32>
    %3 = stablehlo.add %arg1, %2 : tensor<3x1xi32>
    %4 = stablehlo.select %1, %3, %arg1 : tensor<3x1xi1>, tensor<3x1xi32>
    %5 = stablehlo.reshape %4 : (tensor<3x1xi32>) -> tensor<3x1x1xi32>
    %c_1 = stablehlo.constant dense<3> : tensor<1xi32>
    %c_2 = stablehlo.constant dense<0> : tensor<i32>
    %6 = stablehlo.broadcast_in_dim %c_2, dims = [] : (tensor<i32>) -> tensor<3x1x1xi32>
    %7 = stablehlo.compare  GE, %5, %6,  SIGNED : (tensor<3x1x1xi32>, tensor<3x1x1xi32>) -> tensor<3x1x1xi1>
    %8 = stablehlo.broadcast_in_dim %c_1, dims = [2] : (tensor<1xi32>) -> tensor<1x1x1xi32>
    %9 = stablehlo.broadcast_in_dim %8, dims = [0, 1, 2] : (tensor<1x1x1xi32>) -> tensor<3x1x1xi32>
    %10 = stablehlo.compare  LE, %5, %9,  SIGNED : (tensor<3x1x1xi32>, tensor<3x1x1xi32>) -> tensor<3x1x1xi1>
    %11 = stablehlo.and %7, %10 : tensor<3x1x1xi1>
    %c_3 = stablehlo.constant dense<true> : tensor<i1>
    %12 = stablehlo.reduce(%11 init: %c_3) applies stablehlo.and across dimensions = [2] : (tensor<3x1x1xi1>, tensor<i1>) -> tensor<3x1xi1>
    %13 = \"stablehlo.gather\"(%arg0, %5) <{dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [1], operand_batching_dims = [0], start_indices_batching_dims = [0], start_index_map = [1], index_vector_dim = 2>, indices_are_sorted = false, slice_sizes = array<i64: 1, 1>}> : (tensor<3x4xf32>, tensor<3x1x1xi32>) -> tensor<3x1xf32>
    %cst = stablehlo.constant dense<0x7FC00000> : tensor<f32>
    %14 = stablehlo.broadcast_in_dim %cst, dims = [] : (tensor<f32>) -> tensor<3x1xf32>
    %15 = stablehlo.select %12, %13, %14 : tensor<3x1xi1>, tensor<3x1xf32>
    return %15 : tensor<3x1xf32>
  }
}",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let f = &m.module.functions[0];
    let x = ppir::Tensor::from_f32(vec![3, 4], (0..12).map(|v| v as f32).collect());
    let i = ppir::Tensor::from_i64(ppir::DType::I32, vec![3, 1], vec![2, -1, 0]);
    let out = ppir::interp::run_function(f, vec![x, i], &Default::default(), None).unwrap();
    assert_eq!(out[0].to_f64_vec(), [2.0, 7.0, 8.0]);
}
