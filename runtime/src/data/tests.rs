use ppir::{DType, Dim, Tensor, TensorType};

use super::*;

fn rows(t: &Tensor) -> Vec<i64> {
    t.to_i64_vec()
}

#[test]
fn array_batches_are_consecutive_and_wrap_around() {
    let ids = Tensor::from_i64(DType::I64, vec![5, 2], (0..10).collect());
    let x = Tensor::from_f32(vec![5], vec![0.0, 1.0, 2.0, 3.0, 4.0]);
    let mut s = ArraySource::new([("ids".into(), ids), ("x".into(), x)], 2).unwrap();
    assert_eq!((s.rows(), s.batches()), (5, 2));
    let b0 = s.batch(0).unwrap();
    assert_eq!(rows(&b0["ids"]), vec![0, 1, 2, 3]);
    assert_eq!(b0["ids"].shape, vec![2, 2]);
    assert_eq!(b0["x"].to_f64_vec(), vec![0.0, 1.0]);
    assert_eq!(s.batch(1).unwrap()["x"].to_f64_vec(), vec![2.0, 3.0]);
    // Row 4 never forms a full batch: step 2 starts again at row 0.
    assert_eq!(s.batch(2).unwrap(), b0);
    assert_eq!(s.batch(7).unwrap()["x"].to_f64_vec(), vec![2.0, 3.0]);
}

#[test]
fn array_source_errors() {
    let x = Tensor::from_f32(vec![3], vec![0.0; 3]);
    let e = ArraySource::new([("x".into(), x.clone())], 4)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("3 rows, fewer than one global batch of 4"),
        "{e}"
    );
    let y = Tensor::from_f32(vec![2], vec![0.0; 2]);
    let e = ArraySource::new([("x".into(), x), ("y".into(), y)], 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("disagree"), "{e}");
    let s = Tensor::scalar_f64(DType::F32, 1.0);
    assert!(ArraySource::new([("s".into(), s)], 1).is_err());
    assert!(ArraySource::new(Vec::new(), 1).is_err());
}

fn specs() -> Vec<InputSpec> {
    vec![
        InputSpec {
            name: "x".into(),
            ty: TensorType::of(DType::F32, &[64, 32]),
            dist: Distribution::Normal,
        },
        InputSpec {
            name: "ids".into(),
            ty: TensorType::of(DType::I64, &[64, 16]),
            dist: Distribution::Uniform { low: 0, high: 10 },
        },
    ]
}

#[test]
fn synthetic_data_is_seeded_and_valid() {
    let mut a = SyntheticSource::new(specs(), 7, false).unwrap();
    let mut b = SyntheticSource::new(specs(), 7, false).unwrap();
    let mut c = SyntheticSource::new(specs(), 8, false).unwrap();
    let a0 = a.batch(0).unwrap();
    assert_eq!(a0, b.batch(0).unwrap());
    assert_ne!(a0, c.batch(0).unwrap());
    assert_ne!(a0, a.batch(1).unwrap());
    let x = a0["x"].to_f64_vec();
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    assert!(mean.abs() < 0.1 && (var - 1.0).abs() < 0.1, "{mean} {var}");
    let ids = a0["ids"].to_i64_vec();
    assert!(ids.iter().all(|&i| (0..10).contains(&i)));
    for k in 0..10 {
        assert!(ids.contains(&k));
    }
    // Repeating: every step is step 0's batch.
    let mut r = SyntheticSource::new(specs(), 7, true).unwrap();
    assert_eq!(r.batch(0).unwrap(), a0);
    assert_eq!(r.batch(5).unwrap(), a0);
}

#[test]
fn synthetic_spec_errors() {
    let mut s = specs();
    s[1].dist = Distribution::Normal;
    assert!(SyntheticSource::new(s, 0, true).is_err());
    let mut s = specs();
    s[1].dist = Distribution::Uniform { low: 3, high: 3 };
    assert!(SyntheticSource::new(s, 0, true).is_err());
    let mut s = specs();
    s[0].ty.dims[0] = Dim::Batch;
    assert!(SyntheticSource::new(s, 0, true).is_err());
}

#[test]
fn gather_indices_get_the_table_size() {
    let src = r#"
module {
  func @main(%tok: tensor<?x4xi64>, %mask: tensor<?x4xi64>, %x: tensor<?x4xf32>, %wte: tensor<50x8xf32> {param}, %pos: tensor<6x8xf32> {param}) -> (tensor<?x4x8xf32>, tensor<?x4x8xf32>) {
    %e = "pp.gather"(%wte, %tok) : (tensor<50x8xf32>, tensor<?x4xi64>) -> tensor<?x4x8xf32>
    %t2 = "pp.reshape"(%tok) {shape = [-1]} : (tensor<?x4xi64>) -> tensor<?xi64>
    %p = "pp.gather"(%pos, %tok) : (tensor<6x8xf32>, tensor<?x4xi64>) -> tensor<?x4x8xf32>
    return %e, %p : tensor<?x4x8xf32>, tensor<?x4x8xf32>
  }
}
"#;
    let m = ppir::text::parse_module(src).unwrap();
    let f = &m.functions[0];
    let b = index_bounds(f);
    assert_eq!(b.get("tok"), Some(&6));
    assert_eq!(b.get("mask"), None);
    let names: Vec<String> = ["tok", "mask", "x"].map(String::from).to_vec();
    let specs = default_specs(f, &names, 12);
    assert_eq!(specs.len(), 3);
    assert_eq!(specs[0].ty, TensorType::of(DType::I64, &[12, 4]));
    assert_eq!(specs[0].dist, Distribution::Uniform { low: 0, high: 6 });
    assert_eq!(specs[1].dist, Distribution::Uniform { low: 0, high: 2 });
    assert_eq!(specs[2].dist, Distribution::Normal);
}

#[test]
fn gather_through_data_movement() {
    let src = r#"
module {
  func @main(%tok: tensor<2x4xi64>, %wte: tensor<50x8xf32> {param}) -> (tensor<8x8xf32>) {
    %t = "pp.reshape"(%tok) {shape = [-1]} : (tensor<2x4xi64>) -> tensor<8xi64>
    %e = "pp.gather"(%wte, %t) : (tensor<50x8xf32>, tensor<8xi64>) -> tensor<8x8xf32>
    return %e : tensor<8x8xf32>
  }
}
"#;
    let m = ppir::text::parse_module(src).unwrap();
    assert_eq!(index_bounds(&m.functions[0]).get("tok"), Some(&50));
}

/// Token ids and labels are checked against the embedding table and the class count
/// before anything runs (native code does not check them: issue 12, item 3).
#[test]
fn token_ids_and_labels_are_checked_against_their_limits() {
    let src = r#"
module {
  func @main(%tok: tensor<2x3xi64>, %labels: tensor<2xi64>, %wte: tensor<5x4xf32> {param}, %w: tensor<4x7xf32> {param}) -> (tensor<f32>) {
    %e = "pp.gather"(%wte, %tok) : (tensor<5x4xf32>, tensor<2x3xi64>) -> tensor<2x3x4xf32>
    %s = "pp.reduce_sum"(%e) {axes = [1], keepdims = 0} : (tensor<2x3x4xf32>) -> tensor<2x4xf32>
    %logits = "pp.matmul"(%s, %w) : (tensor<2x4xf32>, tensor<4x7xf32>) -> tensor<2x7xf32>
    %loss = "pp.softmax_cross_entropy"(%logits, %labels) {ignore_index = -100} : (tensor<2x7xf32>, tensor<2xi64>) -> tensor<f32> loc("loss")
    return %loss : tensor<f32>
  }
}
"#;
    let m = ppir::text::parse_module(src).unwrap();
    let limits = index_limits_of(&m.functions);
    assert_eq!(limits["tok"].size, 5);
    assert_eq!(limits["labels"].size, 7);
    assert_eq!(limits["labels"].ignore, Some(-100));

    let tok = Tensor::from_i64(DType::I64, vec![2, 3], vec![0, 1, 4, 2, 5, 0]);
    let e = check_indices("tok", &tok, &limits["tok"], 10)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(
            "`tok` row 11, position 1: value 5 is outside [-5, 5) (the 5 rows of the gather)"
        ),
        "{e}"
    );
    // Gather indices count from the end, as in ONNX (and in both targets); class labels
    // do not.
    let wrapped = Tensor::from_i64(DType::I64, vec![2, 3], vec![0, 1, 4, 2, -5, 0]);
    check_indices("tok", &wrapped, &limits["tok"], 0).unwrap();
    let neg = Tensor::from_i64(DType::I64, vec![2, 3], vec![0, 1, 4, 2, -6, 0]);
    let e = check_indices("tok", &neg, &limits["tok"], 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("value -6 is outside [-5, 5)"), "{e}");
    let labels = Tensor::from_i64(DType::I64, vec![2], vec![-100, 7]);
    let e = check_indices("labels", &labels, &limits["labels"], 0)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`labels` row 1: value 7 is outside [0, 7) or -100 (ignored) (the 7 classes of the cross-entropy \"loss\")"),
        "{e}"
    );
    let ok = Tensor::from_i64(DType::I64, vec![2], vec![-100, 6]);
    check_indices("labels", &ok, &limits["labels"], 0).unwrap();

    // Whole arrays are checked with their own row numbers.
    let src = ArraySource::new(
        [
            (
                "tok".to_string(),
                Tensor::from_i64(DType::I64, vec![4, 3], vec![0; 12]),
            ),
            (
                "labels".to_string(),
                Tensor::from_i64(DType::I64, vec![4], vec![0, 1, 2, 9]),
            ),
        ],
        2,
    )
    .unwrap();
    let e = src.check_indices(&limits).unwrap_err().to_string();
    assert!(e.contains("`labels` row 3: value 9"), "{e}");

    // Synthetic data drawn beyond the table is refused.
    let spec = |high| InputSpec {
        name: "tok".into(),
        ty: TensorType::of(DType::I64, &[2, 3]),
        dist: Distribution::Uniform { low: 0, high },
    };
    let s = SyntheticSource::new(vec![spec(5)], 0, true).unwrap();
    s.check_indices(&limits).unwrap();
    let s = SyntheticSource::new(vec![spec(6)], 0, true).unwrap();
    let e = s.check_indices(&limits).unwrap_err().to_string();
    assert!(e.contains("synthetic `tok` is drawn from [0, 6)"), "{e}");
}

/// Issue 12, item 2: an array whose declared shape wraps to 0 elements (an `.npz` header
/// `(2**62, 4)` with no data) made `batch` panic slicing rows.
#[test]
fn arrays_whose_shape_does_not_match_their_data_are_refused() {
    let bad = Tensor {
        dtype: DType::F32,
        shape: vec![1 << 62, 4],
        data: ppir::TensorData::Float(vec![]),
    };
    let e = ArraySource::new([("x".into(), bad.clone())], 2)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("array `x`: shape [4611686018427387904, 4] does not match its 0 elements"),
        "{e}"
    );
    assert!(try_slice_rows(&bad, 0, 2).is_err());
    let t = Tensor::from_f32(vec![3, 2], vec![0.0; 6]);
    let e = try_slice_rows(&t, 2, 2).unwrap_err();
    assert_eq!(
        e,
        SliceError::Rows {
            start: 2,
            end: 4,
            rows: 3
        }
    );
    assert!(e.to_string().contains("outside its 3 rows"), "{e}");
    assert_eq!(try_slice_rows(&t, 1, 2).unwrap().shape, vec![2, 2]);
}

/// Issue 12, items 2 and 5: `train --batch 1000000000` aborted allocating the synthetic
/// batch; a batch whose size overflows wrapped.
#[test]
fn synthetic_batches_too_large_are_refused() {
    let spec = |dims: Vec<u64>| InputSpec {
        name: "x".into(),
        ty: TensorType::of(DType::F32, &dims),
        dist: Distribution::Normal,
    };
    let e = SyntheticSource::new(vec![spec(vec![1 << 62, 4])], 0, true)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("synthetic input `x`: shape tensor<4611686018427387904x4xf32>"),
        "{e}"
    );
    if ppir::size::available_memory().is_some() {
        // 1e9 x 64 x 1000 f32 values, 512 TB as ppir tensors.
        let e = SyntheticSource::new(vec![spec(vec![1_000_000_000, 64_000])], 0, true)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(
                "synthetic input `x`: a batch of tensor<1000000000x64000xf32> needs 512.0 TB"
            ),
            "{e}"
        );
    }
}
