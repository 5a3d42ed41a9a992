//! End to end: ppir function → MLIR → module.so → call `_mlir_ciface_<name>` with memref
//! descriptors → compare with ppir's reference interpreter.
//!
//! All cases live in one test binary (MLIR is linked statically: each test target costs a
//! ~100 MB link).

use std::ffi::c_void;
use std::path::PathBuf;

use ppcc_codegen::{
    compile_to_shared_object, lower_function, CompileError, CompileOptions, LowerError,
};
use ppir::interp::{run_function, InterpOptions};
use ppir::{Function, Module, Tensor, TensorData};

fn parse(src: &str) -> Module {
    let m = ppir::text::parse_module(src).expect("parse");
    ppir::verify::verify_module(&m).expect("verify");
    m
}

/// Deterministic inputs in [-2, 2).
fn input(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let data = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
        })
        .collect();
    Tensor::from_f32(shape.to_vec(), data)
}

fn f32s(t: &Tensor) -> Vec<f32> {
    match &t.data {
        TensorData::Float(v) => v.iter().map(|&x| x as f32).collect(),
        _ => panic!("not a float tensor"),
    }
}

/// A ranked memref descriptor laid out as i64 words:
/// `{allocated, aligned, offset, sizes[r], strides[r]}`.
fn descriptor(buf: &mut [f32], shape: &[usize]) -> Vec<i64> {
    let p = buf.as_mut_ptr() as i64;
    let mut d = vec![p, p, 0];
    d.extend(shape.iter().map(|&s| s as i64));
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1] as i64;
    }
    d.extend(strides);
    d
}

fn unique_dir(name: &str) -> PathBuf {
    let base = std::env::var_os("CARGO_TARGET_TMPDIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    base.join(format!("ppcc-codegen-{}-{name}", std::process::id()))
}

/// Call `entry` with `n` descriptor pointers.
unsafe fn call(entry: *const c_void, p: &[*mut c_void]) {
    type P = *mut c_void;
    unsafe {
        match p.len() {
            1 => std::mem::transmute::<*const c_void, unsafe extern "C" fn(P)>(entry)(p[0]),
            2 => {
                std::mem::transmute::<*const c_void, unsafe extern "C" fn(P, P)>(entry)(p[0], p[1])
            }
            3 => std::mem::transmute::<*const c_void, unsafe extern "C" fn(P, P, P)>(entry)(
                p[0], p[1], p[2],
            ),
            4 => std::mem::transmute::<*const c_void, unsafe extern "C" fn(P, P, P, P)>(entry)(
                p[0], p[1], p[2], p[3],
            ),
            5 => std::mem::transmute::<*const c_void, unsafe extern "C" fn(P, P, P, P, P)>(entry)(
                p[0], p[1], p[2], p[3], p[4],
            ),
            6 => std::mem::transmute::<*const c_void, unsafe extern "C" fn(P, P, P, P, P, P)>(
                entry,
            )(p[0], p[1], p[2], p[3], p[4], p[5]),
            7 => std::mem::transmute::<*const c_void, unsafe extern "C" fn(P, P, P, P, P, P, P)>(
                entry,
            )(p[0], p[1], p[2], p[3], p[4], p[5], p[6]),
            8 => {
                std::mem::transmute::<*const c_void, unsafe extern "C" fn(P, P, P, P, P, P, P, P)>(
                    entry,
                )(p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7])
            }
            n => panic!("{n} descriptors not supported by this test"),
        }
    }
}

/// Compile `f` natively, run it on `inputs`, and compare every output with the interpreter.
fn check(f: &Function, inputs: Vec<Tensor>) {
    let (mlir, sig) = lower_function(f).unwrap_or_else(|e| panic!("lower: {e}"));
    let dir = unique_dir(&f.name);
    let opts = CompileOptions {
        keep_intermediates: true,
        ..Default::default()
    };
    let t0 = std::time::Instant::now();
    let so = compile_to_shared_object(&mlir, &dir, &opts)
        .unwrap_or_else(|e| panic!("compile:\n{e}\n--- MLIR ---\n{mlir}"));
    eprintln!(
        "{}: compiled in {:.2?} -> {}",
        f.name,
        t0.elapsed(),
        so.display()
    );

    let expected =
        run_function(f, inputs.clone(), &InterpOptions::default(), None).expect("interpreter");

    let mut in_bufs: Vec<Vec<f32>> = inputs.iter().map(f32s).collect();
    let mut out_bufs: Vec<Vec<f32>> = sig
        .outputs
        .iter()
        .map(|s| vec![f32::NAN; s.iter().product::<u64>() as usize])
        .collect();
    let mut descs = Vec::new();
    for (b, t) in in_bufs.iter_mut().zip(&inputs) {
        descs.push(descriptor(b, &t.shape));
    }
    for (b, s) in out_bufs.iter_mut().zip(&sig.outputs) {
        let shape: Vec<usize> = s.iter().map(|&d| d as usize).collect();
        descs.push(descriptor(b, &shape));
    }
    let ptrs: Vec<*mut c_void> = descs
        .iter_mut()
        .map(|d| d.as_mut_ptr() as *mut c_void)
        .collect();
    let inputs_before = in_bufs.clone();
    unsafe {
        let lib = libloading::Library::new(&so).expect("dlopen");
        let sym = format!("_mlir_ciface_{}", f.name);
        let entry: libloading::Symbol<*const c_void> = lib
            .get(sym.as_bytes())
            .unwrap_or_else(|e| panic!("{sym}: {e}"));
        call(*entry, &ptrs);
    }
    assert_eq!(in_bufs, inputs_before, "{}: inputs were modified", f.name);
    assert_eq!(out_bufs.len(), expected.len());
    for (i, (got, want)) in out_bufs.iter().zip(&expected).enumerate() {
        let want = f32s(want);
        assert_eq!(got.len(), want.len());
        let mut worst = 0f32;
        for (j, (&g, &w)) in got.iter().zip(&want).enumerate() {
            // 1e-5 relative, with an absolute floor of 1e-5 for results near 0.
            let err = (g - w).abs() / w.abs().max(1.0);
            worst = worst.max(err);
            assert!(
                err <= 1e-5,
                "{} output {i} element {j}: native {g} vs interpreter {w} (rel err {err:e})",
                f.name
            );
        }
        eprintln!(
            "{} output {i}: {} elements, max rel err {worst:e}",
            f.name,
            got.len()
        );
    }
    // PPCC_CODEGEN_KEEP=1 keeps stage.mlir, module.llvm.mlir, module.ll, module.o, module.so.
    if std::env::var_os("PPCC_CODEGEN_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
}

const MLP: &str = r#"
module {
  func @mlp(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>, %b: tensor<16xf32>) -> (tensor<4x16xf32>, tensor<4x16xf32>) {
    %mm = "pp.matmul"(%x, %w) : (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x16xf32>
    %h = "pp.add"(%mm, %b) : (tensor<4x16xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    %y = "pp.relu"(%h) : (tensor<4x16xf32>) -> tensor<4x16xf32>
    %t = "pp.tanh"(%h) : (tensor<4x16xf32>) -> tensor<4x16xf32>
    %n = "pp.neg"(%t) : (tensor<4x16xf32>) -> tensor<4x16xf32>
    %m = "pp.mul"(%n, %y) : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
    %s = "pp.sub"(%m, %b) : (tensor<4x16xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    return %y, %s : tensor<4x16xf32>, tensor<4x16xf32>
  }
}
"#;

const REDUCE: &str = r#"
module {
  func @reduce(%x: tensor<3x4x5xf32>) -> (tensor<3x5xf32>, tensor<1x4x1xf32>, tensor<f32>) {
    %a = "pp.reduce_sum"(%x) {axes = [1], keepdims = 0} : (tensor<3x4x5xf32>) -> tensor<3x5xf32>
    %m = "pp.reduce_mean"(%x) {axes = [0, -1]} : (tensor<3x4x5xf32>) -> tensor<1x4x1xf32>
    %e = "pp.exp"(%x) : (tensor<3x4x5xf32>) -> tensor<3x4x5xf32>
    %t = "pp.reduce_sum"(%e) {keepdims = 0} : (tensor<3x4x5xf32>) -> tensor<f32>
    return %a, %m, %t : tensor<3x5xf32>, tensor<1x4x1xf32>, tensor<f32>
  }
}
"#;

const MOVEMENT: &str = r#"
module {
  func @movement(%x: tensor<2x3x4xf32>, %y: tensor<4x1xf32>) -> (tensor<24xf32>, tensor<6x4xf32>) {
    %t = "pp.transpose"(%x) {perm = [2, 0, 1]} : (tensor<2x3x4xf32>) -> tensor<4x2x3xf32>
    %r = "pp.reshape"(%t) {shape = [4, 6]} : (tensor<4x2x3xf32>) -> tensor<4x6xf32>
    %c = "pp.constant"() {value = dense<[1.0, 2.5, -3.0, 0.5]> : tensor<4x1xf32>} : () -> tensor<4x1xf32>
    %a = "pp.add"(%r, %c) : (tensor<4x6xf32>, tensor<4x1xf32>) -> tensor<4x6xf32>
    %d = "pp.div"(%a, %y) : (tensor<4x6xf32>, tensor<4x1xf32>) -> tensor<4x6xf32>
    %e = "pp.exp"(%d) : (tensor<4x6xf32>) -> tensor<4x6xf32>
    %q = "pp.sqrt"(%e) : (tensor<4x6xf32>) -> tensor<4x6xf32>
    %tt = "pp.transpose"(%q) : (tensor<4x6xf32>) -> tensor<6x4xf32>
    %f = "pp.reshape"(%tt) {shape = [-1]} : (tensor<6x4xf32>) -> tensor<24xf32>
    return %f, %tt : tensor<24xf32>, tensor<6x4xf32>
  }
}
"#;

const MISC: &str = r#"
module {
  func @misc(%a: tensor<2x3x4xf32>, %b: tensor<2x4x5xf32>, %u: tensor<3x1xf32>, %v: tensor<1x5xf32>) -> (tensor<2x3x5xf32>, tensor<1x1xf32>, tensor<f32>) {
    %mm = "pp.matmul"(%a, %b) : (tensor<2x3x4xf32>, tensor<2x4x5xf32>) -> tensor<2x3x5xf32>
    %uv = "pp.max"(%u, %v) : (tensor<3x1xf32>, tensor<1x5xf32>) -> tensor<3x5xf32>
    %s = "pp.sigmoid"(%uv) : (tensor<3x5xf32>) -> tensor<3x5xf32>
    %y = "pp.add"(%mm, %s) : (tensor<2x3x5xf32>, tensor<3x5xf32>) -> tensor<2x3x5xf32>
    %ab = "pp.abs"(%y) : (tensor<2x3x5xf32>) -> tensor<2x3x5xf32>
    %l = "pp.log"(%ab) : (tensor<2x3x5xf32>) -> tensor<2x3x5xf32>
    %w = "pp.min"(%l, %v) : (tensor<2x3x5xf32>, tensor<1x5xf32>) -> tensor<2x3x5xf32>
    %r = "pp.reduce_mean"(%w) {axes = [0, 1], keepdims = 0} : (tensor<2x3x5xf32>) -> tensor<5xf32>
    %r2 = "pp.reshape"(%r) {shape = [1, 5]} : (tensor<5xf32>) -> tensor<1x5xf32>
    %k = "pp.reduce_sum"(%r2) : (tensor<1x5xf32>) -> tensor<1x1xf32>
    %sc = "pp.reshape"(%k) {shape = []} : (tensor<1x1xf32>) -> tensor<f32>
    return %y, %k, %sc : tensor<2x3x5xf32>, tensor<1x1xf32>, tensor<f32>
  }
}
"#;

const CONV: &str = r#"
module {
  func @conv(%x: tensor<1x1x4x4xf32>, %w: tensor<1x1x3x3xf32>) -> (tensor<1x1x2x2xf32>) {
    %y = "pp.conv"(%x, %w) : (tensor<1x1x4x4xf32>, tensor<1x1x3x3xf32>) -> tensor<1x1x2x2xf32>
    return %y : tensor<1x1x2x2xf32>
  }
}
"#;

#[test]
fn native_matches_interpreter() {
    // One #[test] so the cases run in order and share one process (MLIR registration).
    let m = parse(MLP);
    check(
        &m.functions[0],
        vec![input(&[4, 8], 1), input(&[8, 16], 2), input(&[16], 3)],
    );

    let m = parse(REDUCE);
    check(&m.functions[0], vec![input(&[3, 4, 5], 4)]);

    let m = parse(MOVEMENT);
    // Divisors away from 0.
    let y = Tensor::from_f32(vec![4, 1], vec![1.5, -2.0, 3.0, 0.75]);
    check(&m.functions[0], vec![input(&[2, 3, 4], 5), y]);

    let m = parse(MISC);
    check(
        &m.functions[0],
        vec![
            input(&[2, 3, 4], 6),
            input(&[2, 4, 5], 7),
            input(&[3, 1], 8),
            input(&[1, 5], 9),
        ],
    );
}

#[test]
fn unsupported_op_is_named() {
    let m = parse(CONV);
    let err = lower_function(&m.functions[0]).unwrap_err();
    assert!(matches!(err, LowerError::Unsupported { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("pp.conv"), "{text}");
    eprintln!("{text}");
}

#[test]
fn mlir_errors_carry_diagnostics() {
    let bad = "module {\n  func.func @f(%a: tensor<2xf32>) -> tensor<3xf32> {\n    return %a : tensor<2xf32>\n  }\n}\n";
    let dir = unique_dir("bad");
    let err = compile_to_shared_object(bad, &dir, &CompileOptions::default()).unwrap_err();
    let text = err.to_string();
    eprintln!("{text}");
    assert!(matches!(err, CompileError::Parse(_)), "{text}");
    assert!(text.contains("return"), "diagnostic text missing: {text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lowering_uses_linalg_named_ops_and_generics() {
    let m = parse(MISC);
    let (mlir, sig) = lower_function(&m.functions[0]).unwrap();
    eprintln!("{mlir}");
    for needle in [
        "func.func @misc(",
        "attributes {llvm.emit_c_interface}",
        "{bufferization.writable = false}",
        "linalg.batch_matmul",
        "affine_map<(d0, d1) -> (d0, 0)>",
        "affine_map<(d0, d1) -> (0, d1)>",
        "\"reduction\"",
        "math.log",
        "arith.maximumf",
        "tensor.collapse_shape",
        "tensor.expand_shape",
    ] {
        assert!(mlir.contains(needle), "missing `{needle}` in\n{mlir}");
    }
    assert_eq!(
        sig.inputs,
        vec![vec![2, 3, 4], vec![2, 4, 5], vec![3, 1], vec![1, 5]]
    );
    assert_eq!(sig.outputs, vec![vec![2, 3, 5], vec![1, 1], vec![]]);
}
