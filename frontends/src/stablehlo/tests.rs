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
    for m in ["mlp", "gpt", "cnn", "ops"] {
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

fn import_at(text: &str, batch: u64) -> Result<Imported, StableHloError> {
    import_stablehlo_with_batch(text.as_bytes(), "t.mlir", &BTreeMap::new(), Some(batch))
}

fn run(m: &Imported, inputs: Vec<ppir::Tensor>) -> Vec<ppir::Tensor> {
    ppir::interp::run_function(&m.module.functions[0], inputs, &Default::default(), None)
        .unwrap_or_else(|e| panic!("{e:?}"))
}

#[test]
fn every_fixture_rebinds_its_batch() {
    let mut params = BTreeMap::new();
    for (m, n_params, batch) in [("mlp", 4, 3), ("gpt", 17, 5), ("cnn", 6, 1), ("ops", 5, 4)] {
        params.clear();
        for i in 0..n_params {
            // Only the keys matter for which arguments are data; shapes are checked, so
            // take them from the module itself.
            params.insert(
                format!("arg{i}"),
                ppir::Tensor::scalar_f64(ppir::DType::F32, 0.0),
            );
        }
        let plain = import_stablehlo(&fixture(&format!("{m}.mlir")), m, &BTreeMap::new())
            .unwrap_or_else(|e| panic!("{e}"));
        let f = &plain.module.functions[0];
        for (i, &(v, _)) in f.args().iter().enumerate().take(n_params) {
            let ty = f.ty(v);
            let dims: Vec<usize> = ty
                .dims
                .iter()
                .map(|d| d.known().unwrap() as usize)
                .collect();
            let n = dims.iter().product();
            params.insert(
                format!("arg{i}"),
                ppir::Tensor::from_f64(ty.dtype, dims, vec![0.5; n]),
            );
        }
        for form in ["mlir", "generic.mlir"] {
            let r = import_stablehlo_with_batch(
                &fixture(&format!("{m}.{form}")),
                m,
                &params,
                Some(batch),
            )
            .unwrap_or_else(|e| panic!("{m}.{form}: {e}"));
            ppir::verify::verify_module(&r.module).unwrap_or_else(|e| panic!("{m}: {e:?}"));
            let f = &r.module.functions[0];
            let data = f.args()[n_params].0;
            assert_eq!(f.ty(data).dims[0].known(), Some(batch), "{m}.{form}");
            let out = f.results()[0];
            assert_eq!(f.ty(out).dims[0].known(), Some(batch), "{m}.{form}");
        }
    }
}

/// A row-wise model: rebinding the batch computes the same rows.
#[test]
fn a_rebound_batch_computes_the_same_rows() {
    let text = "module {
  func.func public @main(%arg0: tensor<4x3xf32>) -> tensor<4x3xf32> {
    %0 = call @relu(%arg0) : (tensor<4x3xf32>) -> tensor<4x3xf32>
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    %1 = stablehlo.reduce(%0 init: %cst) applies stablehlo.add across dimensions = [1] : (tensor<4x3xf32>, tensor<f32>) -> tensor<4xf32>
    %2 = stablehlo.broadcast_in_dim %1, dims = [0] : (tensor<4xf32>) -> tensor<4x3xf32>
    %3 = stablehlo.reshape %2 : (tensor<4x3xf32>) -> tensor<4x3x1xf32>
    %4 = stablehlo.slice %3 [0:4, 0:3, 0:1] : (tensor<4x3x1xf32>) -> tensor<4x3x1xf32>
    %5 = stablehlo.reshape %4 : (tensor<4x3x1xf32>) -> tensor<4x3xf32>
    %6 = stablehlo.transpose %5, dims = [1, 0] : (tensor<4x3xf32>) -> tensor<3x4xf32>
    %7 = stablehlo.transpose %6, dims = [1, 0] : (tensor<3x4xf32>) -> tensor<4x3xf32>
    %8 = stablehlo.subtract %0, %7 : tensor<4x3xf32>
    return %8 : tensor<4x3xf32>
  }
  func.func private @relu(%arg0: tensor<4x3xf32>) -> tensor<4x3xf32> {
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<4x3xf32>
    %0 = stablehlo.maximum %arg0, %cst : tensor<4x3xf32>
    return %0 : tensor<4x3xf32>
  }
}";
    let m = import_at(text, 2).unwrap_or_else(|e| panic!("{e}"));
    let x = ppir::Tensor::from_f32(vec![2, 3], vec![1., -2., 3., 4., 5., -6.]);
    let out = run(&m, vec![x]);
    assert_eq!(out[0].shape, [2, 3]);
    assert_eq!(out[0].to_f64_vec(), [-3., -4., -1., -5., -4., -9.]);
    // The export's own batch is no rebinding at all.
    assert!(import_at(text, 4).is_ok());
}

#[test]
fn an_op_that_fixes_the_batch_is_named_with_its_location() {
    let cases = [
        // A reduction over the batch.
        ("%1 = stablehlo.reduce(%arg0 init: %cst) applies stablehlo.add across dimensions = [0] : (tensor<4x3xf32>, tensor<f32>) -> tensor<3xf32>
    %2 = stablehlo.broadcast_in_dim %1, dims = [1] : (tensor<3xf32>) -> tensor<4x3xf32>",
         "stablehlo.reduce", "reduces over dim 0"),
        // A reshape that merges the batch with another dim.
        ("%1 = stablehlo.reshape %arg0 : (tensor<4x3xf32>) -> tensor<12xf32>
    %2 = stablehlo.reshape %1 : (tensor<12xf32>) -> tensor<4x3xf32>",
         "stablehlo.reshape", "merges or splits dim 0"),
        // An iota along the batch.
        ("%1 = stablehlo.iota dim = 0 : tensor<4x3xf32>
    %2 = stablehlo.add %arg0, %1 : tensor<4x3xf32>",
         "stablehlo.iota", "counts along"),
        // A constant shaped by the batch.
        ("%1 = stablehlo.constant dense<[[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0]]> : tensor<4x3xf32>
    %2 = stablehlo.add %arg0, %1 : tensor<4x3xf32>",
         "stablehlo.constant", "not a splat"),
        // A slice of some rows.
        ("%1 = stablehlo.slice %arg0 [1:3, 0:3] : (tensor<4x3xf32>) -> tensor<2x3xf32>
    %2 = stablehlo.concatenate %1, %1, dim = 0 : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>",
         "stablehlo.slice", "slices dim 0"),
    ];
    for (body, op, why) in cases {
        let text = format!(
            "func.func @main(%arg0: tensor<4x3xf32>) -> tensor<4x3xf32> {{
    %cst = stablehlo.constant dense<0.000000e+00> : tensor<f32>
    {body}
    return %2 : tensor<4x3xf32>
}}"
        );
        // The module imports at its own batch...
        import_at(&text, 4).unwrap_or_else(|e| panic!("{op}: {e}"));
        // ...and another batch names the op, its line and column.
        let e = import_at(&text, 2).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Unsupported, "{e}");
        assert_eq!(e.op.as_deref(), Some(op), "{e}");
        assert_eq!(e.pos.map(|p| p.line), Some(3), "{e}");
        let s = e.to_string();
        assert!(s.starts_with("t.mlir:3:5: `"), "{s}");
        assert!(
            s.contains(why) && s.contains("cannot be rebound to 2 rows"),
            "{s}"
        );
    }
}

#[test]
fn interior_and_negative_padding() {
    let m = import(
        "func.func @main(%arg0: tensor<2x3xf32>) -> tensor<3x6xf32> {
  %cst = stablehlo.constant dense<9.000000e+00> : tensor<f32>
  %0 = stablehlo.pad %arg0, %cst, low = [0, -1], high = [0, 2], interior = [1, 1] : (tensor<2x3xf32>, tensor<f32>) -> tensor<3x6xf32>
  return %0 : tensor<3x6xf32>
}",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let x = ppir::Tensor::from_f32(vec![2, 3], vec![1., 2., 3., 4., 5., 6.]);
    let out = run(&m, vec![x]);
    // Columns: 1 9 2 9 3 (interior), cut 1 low, 2 more high.
    assert_eq!(
        out[0].to_f64_vec(),
        [
            9., 2., 9., 3., 9., 9., //
            9., 9., 9., 9., 9., 9., //
            9., 5., 9., 6., 9., 9.
        ]
    );
}

const ARGMAX_BODY: &str = "
     reducer(%a1: tensor<f32>, %a3: tensor<f32>) (%a2: tensor<i32>, %a4: tensor<i32>)  {
      %2 = stablehlo.compare GT, %a1, %a3, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %3 = stablehlo.compare NE, %a1, %a1, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %4 = stablehlo.or %2, %3 : tensor<i1>
      %5 = stablehlo.compare EQ, %a1, %a3, FLOAT : (tensor<f32>, tensor<f32>) -> tensor<i1>
      %6 = stablehlo.compare LT, %a2, %a4, SIGNED : (tensor<i32>, tensor<i32>) -> tensor<i1>
      %7 = stablehlo.and %5, %6 : tensor<i1>
      %8 = stablehlo.or %4, %7 : tensor<i1>
      %9 = stablehlo.select %4, %a1, %a3 : tensor<i1>, tensor<f32>
      %10 = stablehlo.select %8, %a2, %a4 : tensor<i1>, tensor<i32>
      stablehlo.return %9, %10 : tensor<f32>, tensor<i32>
    }";

fn argmax_module(cmp: &str, init: &str) -> String {
    format!(
        "func.func @main(%arg0: tensor<2x4xf32>) -> (tensor<2xf32>, tensor<2xi32>) {{
    %0 = stablehlo.iota dim = 1 : tensor<2x4xi32>
    %cst = stablehlo.constant dense<{init}> : tensor<f32>
    %c = stablehlo.constant dense<0> : tensor<i32>
    %1:2 = stablehlo.reduce(%arg0 init: %cst), (%0 init: %c) across dimensions = [1] : (tensor<2x4xf32>, tensor<2x4xi32>, tensor<f32>, tensor<i32>) -> (tensor<2xf32>, tensor<2xi32>)
{}
    return %1#0, %1#1 : tensor<2xf32>, tensor<2xi32>
}}",
        ARGMAX_BODY.replace("GT", cmp)
    )
}

#[test]
fn argmax_and_argmin_reduce_as_jax_emits_them() {
    let x = || ppir::Tensor::from_f32(vec![2, 4], vec![1., 5., 5., 2., 3., -1., 0., -1.]);
    let m = import(&argmax_module("GT", "0xFF800000")).unwrap_or_else(|e| panic!("{e}"));
    let out = run(&m, vec![x()]);
    assert_eq!(out[0].to_f64_vec(), [5., 3.]);
    // Ties go to the first index.
    assert_eq!(out[1].to_i64_vec(), [1, 0]);
    assert_eq!(out[1].dtype, ppir::DType::I32);
    let m = import(&argmax_module("LT", "0x7F800000")).unwrap_or_else(|e| panic!("{e}"));
    let out = run(&m, vec![x()]);
    assert_eq!(out[0].to_f64_vec(), [1., -1.]);
    assert_eq!(out[1].to_i64_vec(), [0, 1]);
    // Another comparator body is refused, naming the op and its location.
    let e = import(&argmax_module("NE", "0xFF800000")).unwrap_err();
    assert_eq!(e.kind, ErrorKind::Unsupported);
    let s = e.to_string();
    assert!(s.starts_with("t.mlir:5:5: `stablehlo.reduce`: "), "{s}");
    assert!(s.contains("argmax/argmin"), "{s}");
}

#[test]
fn dynamic_slices_with_run_time_starts_are_clamped() {
    let m = import(
        "func.func @main(%arg0: tensor<3x5xf32>, %arg1: tensor<i32>, %arg2: tensor<3x2xf32>) -> (tensor<3x2xf32>, tensor<3x5xf32>) {
  %c = stablehlo.constant dense<0> : tensor<i32>
  %0 = stablehlo.dynamic_slice %arg0, %c, %arg1, sizes = [3, 2] : (tensor<3x5xf32>, tensor<i32>, tensor<i32>) -> tensor<3x2xf32>
  %1 = stablehlo.dynamic_update_slice %arg0, %arg2, %c, %arg1 : (tensor<3x5xf32>, tensor<3x2xf32>, tensor<i32>, tensor<i32>) -> tensor<3x5xf32>
  return %0, %1 : tensor<3x2xf32>, tensor<3x5xf32>
}",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let x = || ppir::Tensor::from_f32(vec![3, 5], (0..15).map(|v| v as f32).collect());
    let u = || ppir::Tensor::from_f32(vec![3, 2], vec![-1., -2., -3., -4., -5., -6.]);
    let s = |v: i64| ppir::Tensor::from_i64(ppir::DType::I32, vec![], vec![v]);
    for (start, at) in [(1, 1), (-7, 0), (4, 3), (9, 3)] {
        let out = run(&m, vec![x(), s(start), u()]);
        let at = at as usize;
        let want: Vec<f64> = (0..3)
            .flat_map(|r| (at..at + 2).map(move |c| (r * 5 + c) as f64))
            .collect();
        assert_eq!(out[0].to_f64_vec(), want, "start {start}");
        let mut upd: Vec<f64> = (0..15).map(|v| v as f64).collect();
        for r in 0..3 {
            for c in 0..2 {
                upd[r * 5 + at + c] = -((r * 2 + c + 1) as f64);
            }
        }
        assert_eq!(out[1].to_f64_vec(), upd, "start {start}");
    }
}

#[test]
fn gathers_of_whole_slices_as_jax_emits_them() {
    // x[:, [0, 2, 5], [1, 1, 7], :] and x[:, idx] (from `jax.jit(..).lower(..).as_text()`).
    let m = import(
        "func.func @main(%arg0: tensor<2x8x8x3xf32>, %arg1: tensor<2x8xf32>) -> (tensor<2x3x3xf32>, tensor<2x4xf32>) {
    %c = stablehlo.constant dense<[[0, 1], [2, 1], [5, 7]]> : tensor<3x2xi32>
    %0 = \"stablehlo.gather\"(%arg0, %c) <{dimension_numbers = #stablehlo.gather<offset_dims = [0, 2], collapsed_slice_dims = [1, 2], start_index_map = [1, 2], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 2, 1, 1, 3>}> : (tensor<2x8x8x3xf32>, tensor<3x2xi32>) -> tensor<2x3x3xf32>
    %c_0 = stablehlo.constant dense<[[3], [0], [0], [9]]> : tensor<4x1xi32>
    %1 = \"stablehlo.gather\"(%arg1, %c_0) <{dimension_numbers = #stablehlo.gather<offset_dims = [0], collapsed_slice_dims = [1], start_index_map = [1], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 2, 1>}> : (tensor<2x8xf32>, tensor<4x1xi32>) -> tensor<2x4xf32>
    return %0, %1 : tensor<2x3x3xf32>, tensor<2x4xf32>
}",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let x = ppir::Tensor::from_f32(vec![2, 8, 8, 3], (0..384).map(|v| v as f32).collect());
    let y = ppir::Tensor::from_f32(vec![2, 8], (0..16).map(|v| v as f32).collect());
    let out = run(&m, vec![x, y]);
    let mut want = vec![];
    for b in 0..2 {
        for (i, j) in [(0, 1), (2, 1), (5, 7)] {
            for c in 0..3 {
                want.push((((b * 8 + i) * 8 + j) * 3 + c) as f64);
            }
        }
    }
    assert_eq!(out[0].to_f64_vec(), want);
    // Index 9 is clamped to 7, as StableHLO clamps gather starts.
    assert_eq!(out[1].to_f64_vec(), [3., 0., 0., 7., 11., 8., 8., 15.]);
}

#[test]
fn nhwc_convolutions_equal_nchw_ones() {
    let conv = |dn: &str, xt: &str, wt: &str, yt: &str, extra: &str| {
        format!(
            "func.func @main(%arg0: {xt}, %arg1: {wt}) -> {yt} {{
    %0 = stablehlo.convolution(%arg0, %arg1) dim_numbers = {dn}, window = {{stride = [1, 1], pad = [[2, 2], [1, 1]], lhs_dilate = [2, 1], rhs_dilate = [1, 2]}} {{batch_group_count = 1 : i64, feature_group_count = 2 : i64{extra}}} : ({xt}, {wt}) -> {yt}
    return %0 : {yt}
}}"
        )
    };
    let nchw = import(&conv(
        "[b, f, 0, 1]x[o, i, 0, 1]->[b, f, 0, 1]",
        "tensor<1x4x3x5xf32>",
        "tensor<6x2x3x2xf32>",
        "tensor<1x6x7x5xf32>",
        "",
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let nhwc = import(&conv(
        "[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]",
        "tensor<1x3x5x4xf32>",
        "tensor<3x2x2x6xf32>",
        "tensor<1x7x5x6xf32>",
        "",
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let x: Vec<f32> = (0..60).map(|v| ((v * 7) % 11) as f32 - 5.0).collect();
    let w: Vec<f32> = (0..72).map(|v| ((v * 5) % 13) as f32 - 6.0).collect();
    let xc = ppir::Tensor::from_f32(vec![1, 4, 3, 5], x);
    let wc = ppir::Tensor::from_f32(vec![6, 2, 3, 2], w);
    let t = |t: &ppir::Tensor, p: &[usize]| transpose(t, p);
    let a = run(&nchw, vec![xc.clone(), wc.clone()]);
    let b = run(&nhwc, vec![t(&xc, &[0, 2, 3, 1]), t(&wc, &[2, 3, 1, 0])]);
    assert_eq!(t(&a[0], &[0, 2, 3, 1]).to_f64_vec(), b[0].to_f64_vec());
    // The lhs dilation doubles the rows: 3 → 5, padded 2+2 → 9, kernel 3 → 7.
    assert_eq!(a[0].shape, [1, 6, 7, 5]);
}

/// `t` with its dims permuted: result dim `k` is `t`'s dim `perm[k]`.
fn transpose(t: &ppir::Tensor, perm: &[usize]) -> ppir::Tensor {
    let src = t.to_f64_vec();
    let out_shape: Vec<usize> = perm.iter().map(|&p| t.shape[p]).collect();
    let n = src.len();
    let mut strides = vec![1usize; t.shape.len()];
    for d in (0..t.shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * t.shape[d + 1];
    }
    let mut out = vec![0.0; n];
    for (i, o) in out.iter_mut().enumerate() {
        let mut rem = i;
        let mut off = 0;
        for k in (0..out_shape.len()).rev() {
            let c = rem % out_shape[k];
            rem /= out_shape[k];
            off += c * strides[perm[k]];
        }
        *o = src[off];
    }
    ppir::Tensor::from_f64(t.dtype, out_shape, out)
}
