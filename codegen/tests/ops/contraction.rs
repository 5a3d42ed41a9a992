//! Tests of `lower::contraction` (see common.rs for the harness).

use ppcc_codegen::lower_function;
use ppir::{DType, Module, Tensor};

use crate::common::*;

/// A module with one function `@f` applying `"pp.<op>"` with `attrs` to arguments of the
/// given types (`"2x3xf32"`); the result type is inferred (declared with `?` dims of
/// `rank`, then `ppir::shape::infer_function`).
fn one_op(op: &str, attrs: &str, args: &[&str], rank: usize, dtype: &str) -> Module {
    let params: Vec<String> = args
        .iter()
        .enumerate()
        .map(|(i, t)| format!("%a{i}: tensor<{t}>"))
        .collect();
    let names: Vec<String> = (0..args.len()).map(|i| format!("%a{i}")).collect();
    let tys: Vec<String> = args.iter().map(|t| format!("tensor<{t}>")).collect();
    let mut res = String::from("tensor<");
    for _ in 0..rank {
        res.push_str("?x");
    }
    res.push_str(dtype);
    res.push('>');
    let attrs = if attrs.is_empty() {
        String::new()
    } else {
        format!(" {{{attrs}}}")
    };
    let src = format!(
        "module {{\n  func @f({}) -> ({res}) {{\n    %y = \"pp.{op}\"({}){attrs} : ({}) -> {res}\n    return %y : {res}\n  }}\n}}\n",
        params.join(", "),
        names.join(", "),
        tys.join(", ")
    );
    let mut m = ppir::text::parse_module(&src).unwrap_or_else(|e| panic!("parse: {e}\n{src}"));
    for f in &mut m.functions {
        ppir::shape::infer_function(f).unwrap_or_else(|e| panic!("infer: {e}\n{src}"));
    }
    ppir::verify::verify_module(&m).unwrap_or_else(|e| panic!("verify: {e:?}\n{src}"));
    m
}

/// Check one op on random inputs (f32 unless the types say otherwise).
fn check_op(op: &str, attrs: &str, args: &[&str], rank: usize) {
    let dtype = args[0].rsplit('x').next().unwrap();
    let m = one_op(op, attrs, args, rank, dtype);
    let inputs = random_inputs(&m.functions[0], 3);
    check_with(&m, "f", inputs, 1e-5);
}

/// The tolerance for f32 products summing `k` terms. The interpreter accumulates in f64
/// and rounds once; the GEMM accumulates in f32 (as f32 BLAS libraries do), so its error
/// grows with the length of the sums: measured up to 1.1e-5 · max(1, |x|) at k = 300,
/// 2.6e-5 at k = 600, 3.3e-5 at k = 1100 (inputs in [-2, 2)). The first-order bound of
/// recursive summation, k · ε (ε = 2^-23, f32's machine epsilon), leaves a margin of 3×
/// and more and still catches any wrong element.
fn sum_rtol(k: u64) -> f64 {
    (k as f64 * f32::EPSILON as f64).max(1e-5)
}

/// [`check_op`] with the tolerance of a `k`-term f32 sum ([`sum_rtol`]).
fn check_op_k(op: &str, attrs: &str, args: &[&str], rank: usize, k: u64) {
    let dtype = args[0].rsplit('x').next().unwrap();
    let m = one_op(op, attrs, args, rank, dtype);
    let inputs = random_inputs(&m.functions[0], 3);
    check_with(&m, "f", inputs, sum_rtol(k));
}

/// The lowering error of one op, which must be a refusal (not a panic).
fn refusal(op: &str, attrs: &str, args: &[&str], rank: usize, dtype: &str) -> String {
    let m = one_op(op, attrs, args, rank, dtype);
    lower_function(&m.functions[0])
        .expect_err("lowering refused")
        .to_string()
}

// ---- matmul ----

#[test]
fn matmul_2d_and_batched() {
    check_op("matmul", "", &["5x7xf32", "7x3xf32"], 2);
    check_op("matmul", "", &["4x5x7xf32", "4x7x3xf32"], 3);
    check_op("matmul", "", &["2x3x5x7xf32", "2x3x7x6xf32"], 4);
}

#[test]
fn matmul_vectors() {
    // 1-D operands: promotion, and the added dimension removed again.
    check_op("matmul", "", &["7xf32", "7xf32"], 0);
    check_op("matmul", "", &["7xf32", "7x3xf32"], 1);
    check_op("matmul", "", &["5x7xf32", "7xf32"], 1);
    check_op("matmul", "", &["7xf32", "2x7x3xf32"], 2);
    check_op("matmul", "", &["2x3x5x7xf32", "7xf32"], 3);
}

#[test]
fn matmul_batch_broadcasting() {
    check_op("matmul", "", &["2x1x3x4xf32", "5x4x6xf32"], 4);
    check_op("matmul", "", &["3x4xf32", "2x4x6xf32"], 3);
    check_op("matmul", "", &["2x3x4xf32", "4x6xf32"], 3);
    check_op("matmul", "", &["2x3x4xf32", "1x4x6xf32"], 3);
    check_op("matmul", "", &["1x3x4xf32", "5x4x6xf32"], 3);
    check_op("matmul", "", &["3x1x2x4xf32", "1x5x4x6xf32"], 4);
}

/// The value of the `arith.constant` that defines `name` in `text`.
fn constant_of(text: &str, name: &str) -> String {
    let key = format!("{name} = arith.constant ");
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix(key.as_str()))
        .unwrap_or_else(|| panic!("no constant {name} in\n{text}"));
    line.split(' ').next().unwrap().to_string()
}

/// The transpose flags operand (bit 0: A, bit 1: B) of each support-GEMM call in `text`.
fn gemm_flags(text: &str) -> Vec<i64> {
    // SSA names are per function (each op is outlined into its own): look each call's
    // flags up in the function that makes it.
    text.split("func.func ")
        .flat_map(|func| {
            func.lines()
                .filter_map(|l| l.split_once("llvm.call @ppcc_"))
                .map(|(_, rest)| {
                    let args = rest.split_once('(').unwrap().1;
                    let first = args.split(',').next().unwrap().trim();
                    constant_of(func, first).parse::<i64>().unwrap()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

#[test]
fn matmul_calls_the_support_gemm() {
    let mm = |args: &[&str], rank, dtype| {
        let m = one_op("matmul", "", args, rank, dtype);
        lower_cpu(&m.functions[0])
    };
    let t = mm(&["5x7xf32", "7x3xf32"], 2, "f32");
    assert!(
        t.contains("llvm.func @ppcc_sgemm(")
            && t.contains("llvm.call @ppcc_sgemm(")
            && !t.contains("linalg.matmul"),
        "{t}"
    );
    let t = mm(&["5x7xf64", "7x3xf64"], 2, "f64");
    assert!(t.contains("llvm.call @ppcc_dgemm("), "{t}");
    // Equal batches: one loop of calls over the merged batch dimensions.
    let t = mm(&["2x3x5x7xf32", "2x3x7x6xf32"], 4, "f32");
    assert_eq!(t.matches("scf.for").count(), 1, "{t}");
    assert!(!t.contains("linalg."), "{t}");
    // A batched left operand against one matrix folds into one 2-D product.
    let t = mm(&["2x3x5x7xf32", "7x6xf32"], 4, "f32");
    assert!(
        t.contains("llvm.call @ppcc_sgemm(") && !t.contains("scf.for") && !t.contains("linalg."),
        "{t}"
    );
    // Broadcast batches that do not merge: a loop per batch dimension.
    let t = mm(&["2x1x3x4xf32", "5x4x6xf32"], 4, "f32");
    assert_eq!(t.matches("scf.for").count(), 2, "{t}");
    // Integers keep the linalg forms.
    let t = mm(&["5x7xi64", "7x3xi64"], 2, "i64");
    assert!(t.contains("linalg.matmul") && !t.contains("ppcc_"), "{t}");
    let t = mm(&["2x1x3x4xi32", "5x4x6xi32"], 4, "i32");
    assert!(
        t.contains("linalg.generic") && t.contains("\"reduction\""),
        "{t}"
    );
}

#[test]
fn matmul_f64_and_integers() {
    check_op("matmul", "", &["3x5x7xf64", "7x4xf64"], 3);
    check_op("matmul", "", &["2x1x3x4xf64", "5x4x6xf64"], 4);
    check_op("matmul", "", &["5x7xi64", "7x3xi64"], 2);
    check_op("matmul", "", &["2x5x7xi32", "1x7x3xi32"], 3);
    // i8 wraps as the interpreter's result does.
    let m = one_op("matmul", "", &["4x9xi8", "9x5xi8"], 2, "i8");
    let a = ints(DType::I8, &[4, 9], 1, -100, 100);
    let b = ints(DType::I8, &[9, 5], 2, -100, 100);
    check_with(&m, "f", vec![a, b], 0.0);
}

#[test]
fn matmul_half_precision_rounds_as_the_interpreter() {
    // Widened to f64, one product, each result rounded once: equal to the interpreter.
    for t in ["f16", "bf16"] {
        check_op("matmul", "", &[&format!("4x8x{t}"), &format!("8x2x{t}")], 2);
        check_op(
            "matmul",
            "",
            &[&format!("2x1x3x5x{t}"), &format!("4x5x6x{t}")],
            4,
        );
        check_op("matmul", "", &[&format!("7x{t}"), &format!("3x7x2x{t}")], 2);
        check_op(
            "gemm",
            "alpha = 0.5, beta = 2.0, trans_b = 1",
            &[&format!("5x7x{t}"), &format!("3x7x{t}"), &format!("3x{t}")],
            2,
        );
    }
}

// ---- gemm ----

#[test]
fn gemm_plain_and_transposed() {
    check_op("gemm", "", &["5x7xf32", "7x3xf32"], 2);
    check_op("gemm", "trans_a = 1", &["7x5xf32", "7x3xf32"], 2);
    check_op("gemm", "trans_b = 1", &["5x7xf32", "3x7xf32"], 2);
    check_op(
        "gemm",
        "alpha = 0.5, trans_a = 1, trans_b = 1",
        &["7x5xf32", "3x7xf32"],
        2,
    );
}

#[test]
fn gemm_with_c() {
    check_op("gemm", "", &["5x7xf32", "7x3xf32", "5x3xf32"], 2);
    check_op(
        "gemm",
        "alpha = 1.5, beta = -0.25",
        &["5x7xf32", "7x3xf32", "3xf32"],
        2,
    );
    check_op("gemm", "beta = 2.0", &["5x7xf32", "7x3xf32", "5x1xf32"], 2);
    check_op("gemm", "beta = 0.0", &["5x7xf32", "7x3xf32", "1x3xf32"], 2);
    check_op(
        "gemm",
        "alpha = 2.0, trans_b = 1",
        &["5x7xf32", "3x7xf32", "f32"],
        2,
    );
    check_op(
        "gemm",
        "alpha = 0.75, beta = 0.5, trans_a = 1",
        &["7x5xf64", "7x3xf64", "5x3xf64"],
        2,
    );
}

/// Large enough for every level of the GEMM's blocking (several k blocks, partial tiles in
/// m and n), and degenerate sizes.
#[test]
fn matmul_large_and_ragged() {
    check_op_k("matmul", "", &["37x1100xf32", "1100x70xf32"], 2, 1100);
    check_op("matmul", "", &["130x17xf32", "17x33xf32"], 2);
    check_op("matmul", "", &["1x9xf32", "9x1xf32"], 2);
    check_op("matmul", "", &["3x1x1xf32", "3x1x1xf32"], 3);
    check_op("matmul", "", &["3x20x600xf64", "3x600x17xf64"], 3);
    check_op("matmul", "", &["2x1x30x40xf32", "3x40x50xf32"], 4);
    // Empty sums and empty results.
    check_op("matmul", "", &["3x0xf32", "0x4xf32"], 2);
    check_op(
        "gemm",
        "alpha = 2.0, beta = 0.5",
        &["3x0xf32", "0x4xf32", "4xf32"],
        2,
    );
    check_op("matmul", "", &["0x5xf32", "5x3xf32"], 2);
    check_op("matmul", "", &["2x0x5xf64", "2x5x3xf64"], 3);
}

/// Long sums (k = 4096): the GEMM accumulates f32 in blocks of k, within [`sum_rtol`]
/// (f64 within the harness's 1e-5).
#[test]
fn matmul_large_k() {
    check_op_k("matmul", "", &["8x4096xf32", "4096x24xf32"], 2, 4096);
    check_op_k(
        "gemm",
        "trans_a = 1, trans_b = 1",
        &["4096x8xf32", "24x4096xf32"],
        2,
        4096,
    );
    check_op("matmul", "", &["8x4096xf64", "4096x24xf64"], 2);
}

#[test]
fn gemm_transposed_large() {
    check_op_k("gemm", "trans_a = 1", &["600x37xf32", "600x45xf32"], 2, 600);
    check_op_k(
        "gemm",
        "trans_b = 1, alpha = 0.5",
        &["37x600xf32", "45x600xf32", "45xf32"],
        2,
        600,
    );
    check_op_k(
        "gemm",
        "trans_a = 1, trans_b = 1, beta = 0.0",
        &["600x37xf32", "45x600xf32", "37x1xf32"],
        2,
        600,
    );
    check_op(
        "gemm",
        "trans_a = 1, alpha = -1.5, beta = 0.25",
        &["300x40xf64", "300x50xf64", "40x50xf64"],
        2,
    );
}

#[test]
fn gemm_c_propagates_non_finite_values_with_beta_zero() {
    // The interpreter adds beta · C even for beta = 0, so inf in C gives NaN.
    let m = one_op(
        "gemm",
        "beta = 0.0",
        &["2x3xf32", "3x2xf32", "2x2xf32"],
        2,
        "f32",
    );
    let c = Tensor::from_f32(vec![2, 2], vec![1.0, f32::INFINITY, 2.0, f32::NAN]);
    check_with(&m, "f", vec![input(&[2, 3], 1), input(&[3, 2], 2), c], 1e-5);
}

/// Matrix products of transposed views read the source through the GEMM's transpose
/// flags (the transposed copies are then dead code, erased by the pipeline).
#[test]
fn matmul_of_transposes_uses_flags() {
    let src = r#"
module {
  func @f(%a: tensor<7x5xf32>, %b: tensor<2x3x7xf32>, %q: tensor<2x4x6x8xf32>, %k: tensor<2x4x6x8xf32>) -> (tensor<2x5x3xf32>, tensor<2x4x6x6xf32>, tensor<5x7xf32>) {
    %at = "pp.transpose"(%a) {perm = [1, 0]} : (tensor<7x5xf32>) -> tensor<5x7xf32>
    %bt = "pp.transpose"(%b) {perm = [0, -1, -2]} : (tensor<2x3x7xf32>) -> tensor<2x7x3xf32>
    %y = "pp.matmul"(%at, %bt) : (tensor<5x7xf32>, tensor<2x7x3xf32>) -> tensor<2x5x3xf32>
    %kt = "pp.transpose"(%k) {perm = [0, 1, 3, 2]} : (tensor<2x4x6x8xf32>) -> tensor<2x4x8x6xf32>
    %s = "pp.matmul"(%q, %kt) : (tensor<2x4x6x8xf32>, tensor<2x4x8x6xf32>) -> tensor<2x4x6x6xf32>
    return %y, %s, %at : tensor<2x5x3xf32>, tensor<2x4x6x6xf32>, tensor<5x7xf32>
  }
}
"#;
    let m = parse(src);
    let text = lower_cpu(&m.functions[0]);
    assert_eq!(gemm_flags(&text), vec![3, 2], "{text}");
    check(src, None);
    // A transpose of other dimensions is not a flag.
    let src2 = r#"
module {
  func @g(%a: tensor<3x2x4xf32>, %b: tensor<4x5xf32>) -> (tensor<2x3x5xf32>) {
    %at = "pp.transpose"(%a) {perm = [1, 0, 2]} : (tensor<3x2x4xf32>) -> tensor<2x3x4xf32>
    %y = "pp.matmul"(%at, %b) : (tensor<2x3x4xf32>, tensor<4x5xf32>) -> tensor<2x3x5xf32>
    return %y : tensor<2x3x5xf32>
  }
}
"#;
    let text = lower_cpu(&parse(src2).functions[0]);
    assert_eq!(gemm_flags(&text), vec![0], "{text}");
    check(src2, None);
}

#[test]
fn gemm_passes_transposes_as_flags() {
    let text = |attrs: &str| {
        let m = one_op("gemm", attrs, &["7x5xf32", "3x7xf32"], 2, "f32");
        lower_cpu(&m.functions[0])
    };
    let t = text("trans_a = 1, trans_b = 1");
    assert_eq!(gemm_flags(&t), vec![3], "{t}");
    assert!(!t.contains("linalg."), "{t}");
}

/// `ppcc_set_num_threads` (exported by every module) splits one product over threads;
/// the result does not change.
#[test]
fn gemm_threads() {
    let m = one_op(
        "gemm",
        "trans_b = 1, alpha = 0.5",
        &["150x300xf32", "170x300xf32", "170xf32"],
        2,
        "f32",
    );
    let inputs = random_inputs(&m.functions[0], 5);
    let args: Vec<&Tensor> = inputs.iter().collect();
    let (nm, dir) = compile(&m);
    let one = nm.call("f", &args, None).unwrap();
    // SAFETY: module.so is ppcc's; the symbols have these C signatures.
    let lib = unsafe { libloading::Library::new(nm.path()) }.unwrap();
    let set: libloading::Symbol<unsafe extern "C" fn(i32)> =
        unsafe { lib.get(b"ppcc_set_num_threads") }.unwrap();
    let get: libloading::Symbol<unsafe extern "C" fn() -> i32> =
        unsafe { lib.get(b"ppcc_get_num_threads") }.unwrap();
    assert_eq!(unsafe { get() }, 1, "one thread by default");
    for threads in [2, 3, 7] {
        unsafe { set(threads) };
        assert_eq!(unsafe { get() }, threads);
        let many = nm.call("f", &args, None).unwrap();
        assert_close(&many[0], &one[0], 0.0, &format!("{threads} threads"));
    }
    unsafe { set(1) };
    let f = &m.functions[0];
    let want = ppir::interp::run_function(f, inputs.clone(), &Default::default(), None).unwrap();
    assert_close(&one[0], &want[0], sum_rtol(300), "gemm");
    cleanup(dir);
}

/// `memref.copy` between non-contiguous memrefs lowers to a call of `memrefCopy`, which
/// the support code defines (a module needs no MLIR runner library): a strided slice of
/// an argument returned as a result.
#[test]
fn strided_copy_uses_support_memref_copy() {
    let ir = r#"
module {
  func @f(%x: tensor<5x7xf32>) -> (tensor<2x3xf32>, tensor<3x2xf64>) {
    %y = "pp.slice"(%x) {starts = [1, 1], ends = [5, 7], steps = [2, 2]} : (tensor<5x7xf32>) -> tensor<2x3xf32>
    %z0 = "pp.slice"(%x) {starts = [0, 4], ends = [5, 6], steps = [2, 1]} : (tensor<5x7xf32>) -> tensor<3x2xf32>
    %z = "pp.cast"(%z0) {to = f64} : (tensor<3x2xf32>) -> tensor<3x2xf64>
    return %y, %z : tensor<2x3xf32>, tensor<3x2xf64>
  }
}
"#;
    let m = parse(ir);
    let f = &m.functions[0];
    let sigs = vec![ppcc_codegen::Signature {
        name: "f".into(),
        inputs: vec![(DType::F32, vec![5, 7])],
        outputs: vec![(DType::F32, vec![2, 3]), (DType::F64, vec![3, 2])],
    }];
    // The same function in MLIR, the slices as strided views copied into the results.
    let mlir = r#"
module {
  func.func @f(%ctx: !llvm.ptr, %x: tensor<5x7xf32> {bufferization.writable = false}) -> (tensor<2x3xf32>, tensor<3x2xf64>) attributes {llvm.emit_c_interface} {
    %y = tensor.extract_slice %x[1, 1] [2, 3] [2, 2] : tensor<5x7xf32> to tensor<2x3xf32>
    %z0 = tensor.extract_slice %x[0, 4] [3, 2] [2, 1] : tensor<5x7xf32> to tensor<3x2xf32>
    %e = tensor.empty() : tensor<3x2xf64>
    %z = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>], iterator_types = ["parallel", "parallel"]} ins(%z0 : tensor<3x2xf32>) outs(%e : tensor<3x2xf64>) {
    ^bb0(%a: f32, %b: f64):
      %c = arith.extf %a : f32 to f64
      linalg.yield %c : f64
    } -> tensor<3x2xf64>
    return %y, %z : tensor<2x3xf32>, tensor<3x2xf64>
  }
}
"#;
    let llvm = ppcc_codegen::compile::lower_to_llvm_dialect(mlir, &Default::default()).unwrap();
    assert!(llvm.contains("memrefCopy"), "{llvm}");
    let dir = std::env::temp_dir().join(format!("ppcc-ops-memref-copy-{}", std::process::id()));
    let so = ppcc_codegen::compile_to_shared_object(mlir, &sigs, &dir, &Default::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let nm = ppcc_runtime::native::NativeModule::load(&so, &m, None).unwrap();
    let x = input(&[5, 7], 11);
    let got = nm.call("f", &[&x], None).unwrap();
    let want = ppir::interp::run_function(f, vec![x], &Default::default(), None).unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(g, w, 0.0, &format!("result {i}"));
    }
    cleanup(dir);
}

// ---- conv ----

#[test]
fn conv_2d() {
    check_op("conv", "", &["2x3x8x7xf32", "4x3x3x3xf32"], 4);
    check_op("conv", "", &["2x3x8x7xf32", "4x3x3x3xf32", "4xf32"], 4);
    check_op(
        "conv",
        "strides = [2, 3], pads = [1, 0, 2, 1]",
        &["2x3x9x10xf32", "4x3x3x2xf32", "4xf32"],
        4,
    );
    check_op(
        "conv",
        "dilations = [2, 1], pads = [2, 1, 0, 3], strides = [1, 2]",
        &["1x2x9x8xf32", "3x2x3x3xf32"],
        4,
    );
    check_op(
        "conv",
        "kernel_shape = [1, 1]",
        &["2x5x4x6xf32", "3x5x1x1xf32"],
        4,
    );
}

#[test]
fn conv_groups_and_depthwise() {
    check_op(
        "conv",
        "group = 2, pads = [1, 1, 1, 1]",
        &["2x4x6x6xf32", "6x2x3x3xf32", "6xf32"],
        4,
    );
    // Depthwise with a channel multiplier of 2, strided.
    check_op(
        "conv",
        "group = 3, strides = [2, 2], pads = [1, 1, 1, 1]",
        &["2x3x7x7xf32", "6x1x3x3xf32"],
        4,
    );
    check_op(
        "conv",
        "group = 4, dilations = [2, 2]",
        &["1x4x8x8xf32", "4x1x2x2xf32", "4xf32"],
        4,
    );
}

#[test]
fn conv_1d_and_3d() {
    check_op(
        "conv",
        "strides = [2], pads = [2, 1], dilations = [2]",
        &["3x4x17xf32", "5x4x3xf32", "5xf32"],
        3,
    );
    check_op(
        "conv",
        "group = 2, pads = [0, 1, 1, 1, 0, 1], strides = [1, 2, 1]",
        &["2x4x5x6x4xf32", "4x2x2x3x2xf32", "4xf32"],
        5,
    );
}

#[test]
fn conv_f64() {
    check_op(
        "conv",
        "pads = [1, 2, 1, 0], strides = [2, 1], group = 2",
        &["2x4x6x5xf64", "4x2x3x3xf64", "4xf64"],
        4,
    );
    // Ungrouped: patches and the f64 GEMM.
    check_op(
        "conv",
        "pads = [1, 1, 1, 1], strides = [1, 2]",
        &["2x3x6x5xf64", "4x3x3x3xf64", "4xf64"],
        4,
    );
}

/// Ungrouped 3-D convolution (patches + GEMM), and a batch of one image.
#[test]
fn conv_3d_ungrouped_and_single_image() {
    check_op(
        "conv",
        "pads = [1, 0, 1, 1, 0, 1], strides = [2, 1, 1], dilations = [1, 2, 1]",
        &["2x3x5x6x4xf32", "4x3x2x2x2xf32", "4xf32"],
        5,
    );
    check_op(
        "conv",
        "pads = [1, 1, 1, 1]",
        &["1x16x9x9xf32", "8x16x3x3xf32", "8xf32"],
        4,
    );
}

#[test]
fn conv_half_precision_rounds_as_the_interpreter() {
    for t in ["f16", "bf16"] {
        let x = format!("1x2x5x5x{t}");
        check_op(
            "conv",
            "pads = [1, 1, 1, 1]",
            &[&x, &format!("3x2x3x3x{t}"), &format!("3x{t}")],
            4,
        );
        check_op(
            "conv_transpose",
            "strides = [2, 2]",
            &[&x, &format!("2x3x3x3x{t}")],
            4,
        );
    }
    let err = refusal(
        "conv_grad_weight",
        "kernel_shape = [3, 3]",
        &["1x2x5x5xf16", "1x3x3x3xf16"],
        4,
        "f16",
    );
    assert!(err.contains("not lowered") && err.contains("f16"), "{err}");
}

// ---- conv_transpose ----

#[test]
fn conv_transpose_2d() {
    check_op("conv_transpose", "", &["2x3x4x5xf32", "3x2x3x3xf32"], 4);
    check_op(
        "conv_transpose",
        "strides = [2, 2]",
        &["2x3x4x5xf32", "3x2x3x3xf32", "2xf32"],
        4,
    );
    check_op(
        "conv_transpose",
        "strides = [2, 3], pads = [1, 0, 2, 1], output_padding = [1, 2]",
        &["1x2x4x3xf32", "2x3x3x4xf32", "3xf32"],
        4,
    );
    check_op(
        "conv_transpose",
        "strides = [3, 2], dilations = [2, 3], pads = [0, 2, 1, 1]",
        &["2x2x3x4xf32", "2x2x2x3xf32"],
        4,
    );
}

#[test]
fn conv_transpose_large_pads_and_groups() {
    // Pads larger than the kernel's reach: the spread input is cut at the start, or
    // (large end pads) at the end.
    check_op(
        "conv_transpose",
        "strides = [2, 2], pads = [0, 1, 3, 4]",
        &["1x2x5x6xf32", "2x3x3x2xf32"],
        4,
    );
    check_op(
        "conv_transpose",
        "strides = [2, 2], pads = [4, 3, 3, 5]",
        &["1x2x6x7xf32", "2x3x2x2xf32"],
        4,
    );
    check_op(
        "conv_transpose",
        "group = 2, strides = [2, 1], pads = [1, 1, 0, 1], output_padding = [1, 0]",
        &["2x4x3x4xf32", "4x3x3x2xf32", "6xf32"],
        4,
    );
    // Depthwise.
    check_op(
        "conv_transpose",
        "group = 3, strides = [2, 2], pads = [1, 1, 1, 1]",
        &["1x3x4x4xf32", "3x1x3x3xf32", "3xf32"],
        4,
    );
}

#[test]
fn conv_transpose_1d_3d_f64() {
    check_op(
        "conv_transpose",
        "strides = [3], pads = [1, 2], dilations = [2], output_padding = [2]",
        &["2x3x5xf32", "3x4x3xf32", "4xf32"],
        3,
    );
    check_op(
        "conv_transpose",
        "strides = [2, 1, 2], pads = [1, 0, 0, 0, 1, 1]",
        &["1x2x3x2x3xf32", "2x2x2x2x3xf32"],
        5,
    );
    check_op(
        "conv_transpose",
        "strides = [2, 2], pads = [1, 0, 0, 1], group = 2",
        &["2x2x3x3xf64", "2x2x3x3xf64", "4xf64"],
        4,
    );
}

// ---- conv_grad_weight ----

#[test]
fn conv_grad_weight_2d() {
    check_op(
        "conv_grad_weight",
        "kernel_shape = [3, 3]",
        &["2x3x6x7xf32", "2x4x4x5xf32"],
        4,
    );
    check_op(
        "conv_grad_weight",
        "kernel_shape = [3, 2], strides = [2, 3], pads = [1, 0, 2, 1], dilations = [1, 2]",
        &["2x3x9x10xf32", "2x4x5x3xf32"],
        4,
    );
    check_op(
        "conv_grad_weight",
        "kernel_shape = [3, 3], group = 2, pads = [1, 1, 1, 1]",
        &["2x4x6x6xf32", "2x6x6x6xf32"],
        4,
    );
}

#[test]
fn conv_grad_weight_1d_3d_f64() {
    check_op(
        "conv_grad_weight",
        "kernel_shape = [3], strides = [2], pads = [2, 1], dilations = [2], group = 2",
        &["3x4x17xf32", "3x6x8xf32"],
        3,
    );
    check_op(
        "conv_grad_weight",
        "kernel_shape = [2, 3, 2], pads = [0, 1, 1, 1, 0, 1], strides = [1, 2, 1]",
        &["2x2x5x6x4xf32", "2x3x5x3x5xf32"],
        5,
    );
    check_op(
        "conv_grad_weight",
        "kernel_shape = [3, 3], strides = [2, 2], group = 3",
        &["2x3x7x7xf64", "2x6x3x3xf64"],
        4,
    );
}

/// conv, then its weight gradient and a transposed convolution of the result, chained in
/// one function (values flow between the lowered ops).
#[test]
fn conv_chain() {
    let src = r#"
module {
  func @chain(%x: tensor<2x3x8x8xf32>, %w: tensor<4x3x3x3xf32>, %b: tensor<4xf32>, %wt: tensor<4x3x2x2xf32>) -> (tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>) {
    %y = "pp.conv"(%x, %w, %b) {pads = [1, 1, 1, 1], strides = [2, 2]} : (tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>, tensor<4xf32>) -> tensor<2x4x4x4xf32>
    %r = "pp.relu"(%y) : (tensor<2x4x4x4xf32>) -> tensor<2x4x4x4xf32>
    %dw = "pp.conv_grad_weight"(%x, %r) {kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]} : (tensor<2x3x8x8xf32>, tensor<2x4x4x4xf32>) -> tensor<4x3x3x3xf32>
    %u = "pp.conv_transpose"(%r, %wt) {strides = [2, 2]} : (tensor<2x4x4x4xf32>, tensor<4x3x2x2xf32>) -> tensor<2x3x8x8xf32>
    return %u, %dw : tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>
  }
}
"#;
    check(src, None);
}

#[test]
fn conv_inputs_keep_their_values() {
    // check_with asserts inputs are unchanged; use distinct inputs to make that meaningful.
    let m = one_op(
        "conv",
        "pads = [1, 1, 1, 1]",
        &["1x2x4x4xf32", "2x2x3x3xf32"],
        4,
        "f32",
    );
    let x = Tensor::from_f32(vec![1, 2, 4, 4], (0..32).map(|v| v as f32 * 0.25).collect());
    let w = input(&[2, 2, 3, 3], 9);
    check_with(&m, "f", vec![x, w], 1e-5);
}

/// `add(matmul(x, w), bias)` with a bias along the last dimension is one GEMM call with the
/// bias as its `C` (the matmul is not computed separately); other adds after a matmul, and
/// shapes that are not one matrix product, keep the add. All against the interpreter.
#[test]
fn matmul_bias_add_is_one_gemm() {
    // (x, w, bias, bias first, fused)
    let cases: &[(&str, &str, &str, bool, bool)] = &[
        ("4x6", "6x5", "5", false, true),
        ("2x3x6", "6x5", "1x5", true, true),
        ("2x3x6", "6x5", "1x1x5", false, true),
        ("3x6", "6x5", "1", false, true),
        ("3x6", "6x5", "3x1", false, false),
        ("3x6", "6x5", "3x5", false, false),
        ("2x3x6", "2x6x5", "5", false, false),
    ];
    for &(x, w, b, bias_first, fused) in cases {
        let out = {
            let mut s: Vec<&str> = x.split('x').collect();
            *s.last_mut().unwrap() = w.rsplit('x').next().unwrap();
            if w.split('x').count() == 3 {
                s[0] = "2";
            }
            s.join("x")
        };
        let (l, r) = if bias_first {
            ("%b", "%p")
        } else {
            ("%p", "%b")
        };
        let (lt, rt) = if bias_first {
            (format!("tensor<{b}xf32>"), format!("tensor<{out}xf32>"))
        } else {
            (format!("tensor<{out}xf32>"), format!("tensor<{b}xf32>"))
        };
        let src = format!(
            r#"
module {{
  func @f(%x: tensor<{x}xf32>, %w: tensor<{w}xf32>, %b: tensor<{b}xf32>) -> (tensor<{out}xf32>) {{
    %p = "pp.matmul"(%x, %w) : (tensor<{x}xf32>, tensor<{w}xf32>) -> tensor<{out}xf32>
    %y = "pp.add"({l}, {r}) : ({lt}, {rt}) -> tensor<{out}xf32>
    return %y : tensor<{out}xf32>
  }}
}}
"#
        );
        let m = parse(&src);
        let mlir = lower_cpu(&m.functions[0]);
        let calls = mlir.matches("llvm.call @ppcc_sgemm").count();
        let generics = mlir.matches("linalg.generic").count();
        assert_eq!(calls, 1, "{x}·{w} + {b}:\n{mlir}");
        assert_eq!(
            generics == 0,
            fused,
            "{x}·{w} + {b}: fused = {fused}\n{mlir}"
        );
        let inputs = random_inputs(&m.functions[0], 9);
        check_with(&m, "f", inputs, 1e-5);
    }
}
