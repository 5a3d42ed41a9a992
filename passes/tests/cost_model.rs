//! The cost model: hand-computed FLOPs and bytes per op, phase sums on a real training
//! program, device profiles and the roofline, and the host measurement.

use ppcc_passes::autodiff::{build_gradient_function, AutodiffOptions};
use ppcc_passes::cost::{
    bound, comm_time, function_costs, function_times, host_profile_cached_at, measure_host,
    op_cost_of, op_costs, op_time, op_times, param_bytes, state_bytes, Bound, CostError,
    DeviceProfile, OpCost, OpCostError, TRANSCENDENTAL_FLOPS,
};
use ppcc_passes::optim::{build_optimizer_function, trainable_params, OptimizerOptions};
use std::slice::from_ref;

use ppir::{Attr, Attrs, DType, Dim, OpKind, Phase, TensorType};

fn f32t(shape: &[u64]) -> TensorType {
    TensorType::of(DType::F32, shape)
}

fn cost(kind: OpKind, attrs: Attrs, xs: &[TensorType], ys: &[TensorType]) -> OpCost {
    let xs: Vec<&TensorType> = xs.iter().collect();
    let ys: Vec<&TensorType> = ys.iter().collect();
    op_cost_of(kind, &attrs, &xs, &ys).unwrap_or_else(|e| panic!("{e}"))
}

fn size(shape: &[u64], elem: f64) -> f64 {
    shape.iter().product::<u64>() as f64 * elem
}

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

#[test]
fn batched_matmul() {
    // [3, 8, 16] · [16, 4] (broadcast weight) → [3, 8, 4]
    let c = cost(
        OpKind::MatMul,
        Attrs::new(),
        &[f32t(&[3, 8, 16]), f32t(&[16, 4])],
        &[f32t(&[3, 8, 4])],
    );
    assert_eq!(c.flops, 2.0 * 3.0 * 8.0 * 4.0 * 16.0);
    assert_eq!(c.bytes_read, (3.0 * 8.0 * 16.0 + 16.0 * 4.0) * 4.0);
    assert_eq!(c.bytes_written, 3.0 * 8.0 * 4.0 * 4.0);
    assert_eq!(c.output_bytes, c.bytes_written);
    // Fully batched [2, 5, 6, 7] · [2, 5, 7, 3], in f16.
    let h = |s: &[u64]| TensorType::of(DType::F16, s);
    let c = cost(
        OpKind::MatMul,
        Attrs::new(),
        &[h(&[2, 5, 6, 7]), h(&[2, 5, 7, 3])],
        &[h(&[2, 5, 6, 3])],
    );
    assert_eq!(c.flops, 2.0 * 10.0 * 6.0 * 3.0 * 7.0);
    assert_eq!(c.bytes_written, 2.0 * 10.0 * 6.0 * 3.0);
    // Vector · matrix: [7] · [7, 3] → [3]
    let c = cost(
        OpKind::MatMul,
        Attrs::new(),
        &[f32t(&[7]), f32t(&[7, 3])],
        &[f32t(&[3])],
    );
    assert_eq!(c.flops, 2.0 * 7.0 * 3.0);
}

#[test]
fn gemm_with_alpha_beta_and_c() {
    // aᵀ: a is [K=16, M=8], b [16, 4], c [4] broadcast.
    let (m, n, k) = (8.0, 4.0, 16.0);
    let xs = [f32t(&[16, 8]), f32t(&[16, 4]), f32t(&[4])];
    let ys = [f32t(&[8, 4])];
    let base = Attrs::new().with("trans_a", Attr::Int(1));
    let plain = cost(OpKind::Gemm, base.clone(), &xs[..2], &ys);
    assert_eq!(plain.flops, 2.0 * m * n * k);
    let with_c = cost(OpKind::Gemm, base.clone(), &xs, &ys);
    assert_eq!(with_c.flops, 2.0 * m * n * k + m * n);
    assert_eq!(with_c.bytes_read, (16.0 * 8.0 + 16.0 * 4.0 + 4.0) * 4.0);
    let scaled = base
        .clone()
        .with("alpha", Attr::Float(0.5))
        .with("beta", Attr::Float(2.0));
    assert_eq!(
        cost(OpKind::Gemm, scaled, &xs, &ys).flops,
        2.0 * m * n * k + m * n + 2.0 * m * n
    );
    let no_c = base.with("beta", Attr::Float(0.0));
    assert_eq!(cost(OpKind::Gemm, no_c, &xs, &ys).flops, 2.0 * m * n * k);
}

#[test]
fn conv_with_groups_and_strides() {
    // x [2, 8, 9, 9], w [6, 4, 3, 3] with group 2, stride 2, pad 1 → out [2, 6, 5, 5].
    let attrs = Attrs::new()
        .with("group", Attr::Int(2))
        .with("strides", ints(&[2, 2]))
        .with("pads", ints(&[1, 1, 1, 1]));
    let xs = [f32t(&[2, 8, 9, 9]), f32t(&[6, 4, 3, 3]), f32t(&[6])];
    let ys = [f32t(&[2, 6, 5, 5])];
    let c = cost(OpKind::Conv, attrs.clone(), &xs[..2], &ys);
    // 2·N·M·(C/g)·Πk·Πout
    assert_eq!(c.flops, 2.0 * 2.0 * 6.0 * 4.0 * 9.0 * 25.0);
    assert_eq!(
        c.bytes_read,
        (size(&[2, 8, 9, 9], 4.0)) + size(&[6, 4, 3, 3], 4.0)
    );
    assert_eq!(c.bytes_written, size(&[2, 6, 5, 5], 4.0));
    let with_bias = cost(OpKind::Conv, attrs, &xs, &ys);
    assert_eq!(with_bias.flops, c.flops + 2.0 * 6.0 * 25.0);

    // conv_grad_weight of the same conv: x, dy → dw [6, 4, 3, 3]; same FLOPs as the conv.
    let gw_attrs = Attrs::new()
        .with("group", Attr::Int(2))
        .with("strides", ints(&[2, 2]))
        .with("pads", ints(&[1, 1, 1, 1]))
        .with("kernel_shape", ints(&[3, 3]));
    let gw = cost(
        OpKind::ConvGradWeight,
        gw_attrs,
        &[f32t(&[2, 8, 9, 9]), f32t(&[2, 6, 5, 5])],
        &[f32t(&[6, 4, 3, 3])],
    );
    assert_eq!(gw.flops, c.flops);
    assert_eq!(gw.bytes_written, size(&[6, 4, 3, 3], 4.0));

    // conv_transpose: x [1, 4, 5, 5], w [4, 3, 2, 2] (C=4, M/g=3), stride 2 → [1, 3, 10, 10].
    let ct = cost(
        OpKind::ConvTranspose,
        Attrs::new().with("strides", ints(&[2, 2])),
        &[f32t(&[1, 4, 5, 5]), f32t(&[4, 3, 2, 2])],
        &[f32t(&[1, 3, 10, 10])],
    );
    // every input element meets (M/g)·Πk weights
    assert_eq!(ct.flops, 2.0 * 100.0 * 3.0 * 4.0);
}

#[test]
fn pools() {
    let x = f32t(&[2, 3, 8, 8]);
    let y = f32t(&[2, 3, 4, 4]);
    let k = Attrs::new()
        .with("kernel_shape", ints(&[3, 3]))
        .with("strides", ints(&[2, 2]))
        .with("pads", ints(&[1, 1, 1, 1]));
    let ny = 2.0 * 3.0 * 16.0;
    let nx = 2.0 * 3.0 * 64.0;
    let max = cost(OpKind::MaxPool, k.clone(), from_ref(&x), from_ref(&y));
    assert_eq!(max.flops, ny * 9.0);
    assert_eq!(max.bytes_read, nx * 4.0);
    assert_eq!(max.bytes_written, ny * 4.0);
    let avg = cost(OpKind::AvgPool, k.clone(), from_ref(&x), from_ref(&y));
    assert_eq!(avg.flops, ny * 10.0);
    let g = cost(
        OpKind::GlobalAvgPool,
        Attrs::new(),
        from_ref(&x),
        &[f32t(&[2, 3, 1, 1])],
    );
    assert_eq!(g.flops, nx + 6.0);
    let mg = cost(
        OpKind::MaxPoolGrad,
        k.clone(),
        &[x.clone(), y.clone()],
        from_ref(&x),
    );
    assert_eq!(mg.flops, ny * 10.0);
    assert_eq!(mg.bytes_read, (nx + ny) * 4.0);
    let ag = cost(
        OpKind::AvgPoolGrad,
        k.with("input_shape", ints(&[2, 3, 8, 8])),
        &[y],
        from_ref(&x),
    );
    assert_eq!(ag.flops, ny * 10.0);
    assert_eq!(ag.bytes_written, nx * 4.0);
    // kernel_shape is required.
    let e = op_cost_of(OpKind::MaxPool, &Attrs::new(), &[&x], &[&x]).unwrap_err();
    assert!(e.to_string().contains("kernel_shape"), "{e}");
}

#[test]
fn elementwise() {
    let t = f32t(&[4, 5]);
    let n = 20.0;
    let one = |k: OpKind| cost(k, Attrs::new(), from_ref(&t), from_ref(&t));
    assert_eq!(one(OpKind::Relu).flops, n);
    assert_eq!(one(OpKind::Relu).bytes_read, n * 4.0);
    assert_eq!(one(OpKind::Exp).flops, n * TRANSCENDENTAL_FLOPS);
    assert_eq!(one(OpKind::Tanh).flops, n * TRANSCENDENTAL_FLOPS);
    assert_eq!(one(OpKind::Sigmoid).flops, n * (TRANSCENDENTAL_FLOPS + 2.0));
    assert_eq!(one(OpKind::Gelu).flops, n * (TRANSCENDENTAL_FLOPS + 4.0));
    assert_eq!(one(OpKind::Identity).flops, 0.0);
    // Broadcasting binary op: per result element; bytes of each operand as stored.
    let add = cost(
        OpKind::Add,
        Attrs::new(),
        &[t.clone(), f32t(&[5])],
        from_ref(&t),
    );
    assert_eq!(add.flops, n);
    assert_eq!(add.bytes_read, (20.0 + 5.0) * 4.0);
    // A comparison writes i1 (1 byte per element).
    let less = cost(
        OpKind::Less,
        Attrs::new(),
        &[t.clone(), t.clone()],
        &[TensorType::of(DType::Bool, &[4, 5])],
    );
    assert_eq!(less.bytes_written, n);
    // Dropout: a copy in inference, a mask draw in training.
    let key = TensorType::of(DType::I64, &[2]);
    let train = Attrs::new().with("training", Attr::Int(1));
    assert_eq!(
        cost(OpKind::Dropout, train, &[t.clone(), key], from_ref(&t)).flops,
        4.0 * n
    );
    assert_eq!(one(OpKind::Dropout).flops, 0.0);
}

#[test]
fn softmax_norms_and_reductions() {
    let t = f32t(&[6, 10]);
    let n = 60.0;
    let s = cost(OpKind::Softmax, Attrs::new(), from_ref(&t), from_ref(&t));
    assert_eq!(s.flops, (TRANSCENDENTAL_FLOPS + 4.0) * n);
    let ls = cost(OpKind::LogSoftmax, Attrs::new(), from_ref(&t), from_ref(&t));
    assert_eq!(
        ls.flops,
        (TRANSCENDENTAL_FLOPS + 4.0) * n + TRANSCENDENTAL_FLOPS * 6.0
    );
    let labels = TensorType::of(DType::I64, &[6]);
    let ce = cost(
        OpKind::SoftmaxCrossEntropy,
        Attrs::new(),
        &[t.clone(), labels.clone()],
        &[TensorType::scalar(DType::F32)],
    );
    assert_eq!(
        ce.flops,
        (TRANSCENDENTAL_FLOPS + 4.0) * n + (TRANSCENDENTAL_FLOPS + 2.0) * 6.0
    );
    assert_eq!(ce.bytes_read, n * 4.0 + 6.0 * 8.0);
    assert_eq!(ce.bytes_written, 4.0);
    let ln = cost(
        OpKind::LayerNorm,
        Attrs::new(),
        &[t.clone(), f32t(&[10]), f32t(&[10])],
        from_ref(&t),
    );
    assert_eq!(ln.flops, 8.0 * n + 3.0 * 6.0);
    let sum = cost(
        OpKind::ReduceSum,
        Attrs::new().with("axes", ints(&[1])),
        from_ref(&t),
        &[f32t(&[6, 1])],
    );
    assert_eq!(sum.flops, n);
    assert_eq!(sum.bytes_written, 24.0);
    let mean = cost(
        OpKind::ReduceMean,
        Attrs::new(),
        from_ref(&t),
        &[f32t(&[1, 1])],
    );
    assert_eq!(mean.flops, n + 1.0);
}

#[test]
fn data_movement_and_comm() {
    let t = f32t(&[4, 6]);
    let tr = cost(
        OpKind::Transpose,
        Attrs::new(),
        from_ref(&t),
        &[f32t(&[6, 4])],
    );
    assert_eq!(tr.flops, 0.0);
    assert_eq!(tr.bytes_read, 96.0);
    assert_eq!(tr.bytes_written, 96.0);
    let cat = cost(
        OpKind::Concat,
        Attrs::new().with("axis", Attr::Int(0)),
        &[t.clone(), t.clone()],
        &[f32t(&[8, 6])],
    );
    assert_eq!(
        (cat.flops, cat.bytes_read, cat.bytes_written),
        (0.0, 192.0, 192.0)
    );
    let send = cost(OpKind::Send, Attrs::new(), from_ref(&t), &[]);
    assert_eq!(
        (send.flops, send.bytes_read, send.output_bytes),
        (0.0, 96.0, 0.0)
    );
    let recv = cost(OpKind::Recv, Attrs::new(), &[], from_ref(&t));
    assert_eq!(
        (recv.flops, recv.bytes_read, recv.bytes_written),
        (0.0, 0.0, 96.0)
    );
    let k = cost(OpKind::Constant, Attrs::new(), &[], &[t]);
    assert_eq!((k.flops, k.bytes_written), (0.0, 96.0));
}

#[test]
fn symbolic_dims_are_an_error() {
    let t = TensorType::new(DType::F32, vec![Dim::Batch, Dim::Known(4)]);
    let e = op_cost_of(OpKind::Relu, &Attrs::new(), &[&t], &[&t]).unwrap_err();
    assert!(matches!(
        e,
        CostError::Invalid {
            source: OpCostError::Symbolic { .. },
            ..
        }
    ));
    assert!(e.to_string().contains("bind-batch"), "{e}");
}

/// A 2-layer MLP with static shapes: x[B, IN] → fc1 (+bias, relu) → fc2 → logits[B, OUT].
const B: u64 = 32;
const IN: u64 = 256;
const H: u64 = 512;
const OUT: u64 = 64;

fn mlp() -> ppir::Module {
    let src = format!(
        r#"
module {{
  func @main(%x: tensor<{B}x{IN}xf32>, %w1: tensor<{IN}x{H}xf32> {{param}}, %b1: tensor<{H}xf32> {{param}}, %w2: tensor<{H}x{OUT}xf32> {{param}}) -> (tensor<{B}x{OUT}xf32>) {{
    %h = "pp.matmul"(%x, %w1) : (tensor<{B}x{IN}xf32>, tensor<{IN}x{H}xf32>) -> tensor<{B}x{H}xf32> loc("fc1")
    %hb = "pp.add"(%h, %b1) : (tensor<{B}x{H}xf32>, tensor<{H}xf32>) -> tensor<{B}x{H}xf32> loc("fc1/bias")
    %r = "pp.relu"(%hb) : (tensor<{B}x{H}xf32>) -> tensor<{B}x{H}xf32> loc("relu")
    %y = "pp.matmul"(%r, %w2) : (tensor<{B}x{H}xf32>, tensor<{H}x{OUT}xf32>) -> tensor<{B}x{OUT}xf32> loc("fc2")
    return %y : tensor<{B}x{OUT}xf32>
  }}
}}
"#
    );
    let mut m = ppir::text::parse_module(&src).unwrap_or_else(|e| panic!("{e}"));
    build_gradient_function(&mut m, &AutodiffOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    m
}

/// Sum of the FLOPs of the ops of `kind` in `phase`.
fn kind_flops(f: &ppir::Function, kind: OpKind, phase: Phase) -> f64 {
    op_costs(f)
        .unwrap()
        .into_iter()
        .filter(|(op, _)| f.op(*op).kind == kind && f.op(*op).phase == Some(phase))
        .map(|(_, c)| c.flops)
        .sum()
}

#[test]
fn phase_sums_on_a_two_layer_mlp() {
    let m = mlp();
    let g = m.function("grad").unwrap();
    let (b, i, h, o) = (B as f64, IN as f64, H as f64, OUT as f64);
    let fwd_mm = 2.0 * b * (i * h + h * o);
    // F: both layers' matmuls.
    assert_eq!(kind_flops(g, OpKind::MatMul, Phase::Fwd), fwd_mm);
    // B: only fc2's dx (x needs no gradient, so fc1 has no dx matmul).
    assert_eq!(
        kind_flops(g, OpKind::MatMul, Phase::BwdInput),
        2.0 * b * h * o
    );
    // W: both weight gradients, as many FLOPs as the forward matmuls.
    assert_eq!(kind_flops(g, OpKind::MatMul, Phase::BwdWeight), fwd_mm);

    let pc = function_costs(g).unwrap();
    // Phase totals are dominated by the matmuls: the elementwise rest (bias, relu and
    // their gradients, the loss) is < 2 % of F and W and < 5 % of B, which has one matmul.
    let close = |got: f64, want: f64, tol: f64| want <= got && got <= (1.0 + tol) * want;
    assert!(
        close(pc.fwd.flops, fwd_mm, 0.02),
        "F {} vs {fwd_mm}",
        pc.fwd.flops
    );
    let b_mm = 2.0 * b * h * o;
    assert!(
        close(pc.bwd_input.flops, b_mm, 0.05),
        "B {} vs {b_mm}",
        pc.bwd_input.flops
    );
    assert!(
        close(pc.bwd_weight.flops, fwd_mm, 0.02),
        "W {}",
        pc.bwd_weight.flops
    );
    assert_eq!(pc.optim, OpCost::default());
    assert_eq!(pc.untagged, OpCost::default());
    // The total is the sum of the per-op costs.
    let all: OpCost = op_costs(g).unwrap().into_iter().map(|(_, c)| c).sum();
    assert_eq!(pc.total(), all);
    // F writes at least the two activations and the logits.
    assert!(pc.fwd.output_bytes >= 4.0 * b * (2.0 * h + o));

    assert_eq!(
        param_bytes(g).unwrap(),
        4 * (IN * H + H + H * OUT),
        "w1, b1, w2"
    );
    assert_eq!(state_bytes(g).unwrap(), 0);

    // Times: every phase positive on the H100 profile; W ≈ F since both are matmul-bound.
    let h100 = DeviceProfile::builtin("h100").unwrap();
    let t = function_times(g, &h100).unwrap();
    assert!(t.fwd > 0.0 && t.bwd_input > 0.0 && t.bwd_weight > 0.0);
    assert_eq!(t.optim, 0.0);
    assert!((t.total() - (t.fwd + t.bwd_input + t.bwd_weight)).abs() < 1e-15);
    // Per-op times sum to the phase times.
    let per_op: f64 = op_times(g, &h100).unwrap().iter().map(|(_, t)| t).sum();
    assert!((per_op - t.total()).abs() <= 1e-12 * t.total());
}

#[test]
fn optimizer_ops_are_phase_optim_and_states_count() {
    let mut m = mlp();
    let params = trainable_params(m.function("main").unwrap());
    build_optimizer_function(&mut m, &params, &OptimizerOptions::adamw(1e-3))
        .unwrap_or_else(|e| panic!("{e}"));
    let optim = m.function("optim").unwrap();
    let pc = function_costs(optim).unwrap();
    let n_params = (IN * H + H + H * OUT) as f64;
    // AdamW does a handful of elementwise ops per parameter element.
    assert!(pc.optim.flops > 5.0 * n_params, "{}", pc.optim.flops);
    assert_eq!(pc.fwd, OpCost::default());
    assert_eq!(param_bytes(optim).unwrap(), 4 * (IN * H + H + H * OUT));
    // m and v per parameter, plus the step count.
    assert_eq!(
        state_bytes(optim).unwrap(),
        2 * 4 * (IN * H + H + H * OUT) + 4
    );
}

#[test]
fn builtin_profiles_load() {
    let h = DeviceProfile::builtin("h100").unwrap();
    assert_eq!(h.name, "h100");
    assert_eq!(h.peak_flops(DType::BF16), 989.4e12);
    assert_eq!(h.peak_flops(DType::F32), 67e12);
    assert_eq!(h.memory_bandwidth, 3.35e12);
    assert_eq!(h.memory_bytes, 80e9);
    // i64 has no entry: falls back to f32.
    assert_eq!(h.peak_flops(DType::I64), 67e12);
    let a = DeviceProfile::builtin("a100").unwrap();
    assert_eq!(a.peak_flops(DType::F16), 312e12);
    assert_eq!(a.memory_bandwidth, 2.039e12);
    assert!(a.link_bandwidth < h.link_bandwidth);
    assert!(matches!(
        DeviceProfile::builtin("tpu"),
        Err(CostError::UnknownProfile(_))
    ));
    // JSON round trip and from_file.
    let dir = std::env::temp_dir().join(format!("ppcc-cost-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("h100.json");
    std::fs::write(&path, h.to_json().unwrap()).unwrap();
    assert_eq!(DeviceProfile::from_file(&path).unwrap(), h);
    std::fs::remove_dir_all(&dir).unwrap();
    // Errors name the field.
    let e = DeviceProfile::from_json(r#"{"name": "x", "peak_flops": {"f32": 1}}"#, "x.json")
        .unwrap_err();
    assert!(e.to_string().contains("memory_bandwidth"), "{e}");
    // Strict: unknown fields, wrong types (at the field's path) and bad values are refused.
    let mut v = h.to_value().unwrap();
    v["memory_bandwith"] = 1.into();
    let e = DeviceProfile::from_value(&v, "typo.json").unwrap_err();
    assert!(
        e.to_string().contains("unknown field `memory_bandwith`"),
        "{e}"
    );
    let mut v = h.to_value().unwrap();
    v["peak_flops"]["bf16"] = "fast".into();
    let e = DeviceProfile::from_value(&v, "x.json").unwrap_err();
    assert!(
        matches!(&e, CostError::Profile { path, .. } if path == "peak_flops.bf16"),
        "{e}"
    );
    assert!(
        e.to_string().contains("`peak_flops.bf16`: invalid type"),
        "{e}"
    );
    let mut v = h.to_value().unwrap();
    v["link_latency"] = (-1.0).into();
    let e = DeviceProfile::from_value(&v, "x.json").unwrap_err();
    assert!(
        e.to_string()
            .contains("`link_latency`: must be a finite number"),
        "{e}"
    );
    let mut v = h.to_value().unwrap();
    v["peak_flops"].as_object_mut().unwrap().remove("f32");
    let e = DeviceProfile::from_value(&v, "x.json").unwrap_err();
    assert!(
        e.to_string().contains("`peak_flops`: needs an `f32` entry"),
        "{e}"
    );
    let e = DeviceProfile::from_json(&format!("{} x", h.to_json().unwrap()), "x.json").unwrap_err();
    assert!(e.to_string().contains("trailing characters"), "{e}");
    // `measure_ops` is optional and written only when set.
    assert!(h.to_value().unwrap().get("measure_ops").is_none());
    let mut host = h.clone();
    host.measure_ops = true;
    assert_eq!(
        DeviceProfile::from_value(&host.to_value().unwrap(), "x").unwrap(),
        host
    );
    assert!(matches!(
        DeviceProfile::from_file("/nonexistent/p.json"),
        Err(CostError::Io { .. })
    ));
}

#[test]
fn roofline_picks_the_bound() {
    let h = DeviceProfile::builtin("h100").unwrap();
    // A large square matmul: intensity n/6 FLOP/byte ≫ the ridge (67e12 / 3.35e12 = 20).
    let n = 4096u64;
    let big = f32t(&[n, n]);
    let mm = cost(
        OpKind::MatMul,
        Attrs::new(),
        &[big.clone(), big.clone()],
        from_ref(&big),
    );
    assert_eq!(bound(&mm, DType::F32, &h), Bound::Compute);
    let want = mm.flops / 67e12 + h.op_overhead;
    assert!((op_time(&mm, DType::F32, &h) - want).abs() <= 1e-12 * want);
    // bf16 is faster on tensor cores.
    assert!(op_time(&mm, DType::BF16, &h) < op_time(&mm, DType::F32, &h));
    // An elementwise add: 1 FLOP per 12 bytes, memory bound.
    let add = cost(
        OpKind::Add,
        Attrs::new(),
        &[big.clone(), big.clone()],
        from_ref(&big),
    );
    assert_eq!(bound(&add, DType::F32, &h), Bound::Memory);
    let want = add.bytes() / 3.35e12 + h.op_overhead;
    assert!((op_time(&add, DType::F32, &h) - want).abs() <= 1e-12 * want);
    // A tiny op costs about its overhead.
    let tiny = cost(OpKind::Relu, Attrs::new(), &[f32t(&[4])], &[f32t(&[4])]);
    assert!((op_time(&tiny, DType::F32, &h) - h.op_overhead) < 1e-9);
    // Links: latency + bytes / bandwidth.
    assert_eq!(comm_time(0.0, &h), h.link_latency);
    let mb = 1e6;
    assert!((comm_time(mb, &h) - (h.link_latency + mb / 450e9)).abs() < 1e-15);
}

#[test]
fn host_measurement_is_positive_and_cached() {
    let p = measure_host(true);
    assert_eq!(p.name, "host");
    for (what, x) in [
        ("f32 peak", p.peak_flops(DType::F32)),
        ("memory bandwidth", p.memory_bandwidth),
        ("link bandwidth", p.link_bandwidth),
        ("link latency", p.link_latency),
        ("op overhead", p.op_overhead),
    ] {
        assert!(x.is_finite() && x > 0.0, "{what} = {x}");
    }
    assert!(p.memory_bytes.is_finite() && p.memory_bytes >= 0.0);

    let dir = std::env::temp_dir().join(format!("ppcc-host-{}", std::process::id()));
    let path = dir.join("ppcc").join("host-profile.json");
    let first = host_profile_cached_at(&path, false, true).unwrap();
    assert!(path.exists(), "the cache is written");
    // The second call reads the cache: identical numbers, no new measurement.
    let second = host_profile_cached_at(&path, false, true).unwrap();
    assert_eq!(first, second);
    // A cache from another machine is measured again (and overwritten).
    let text = std::fs::read_to_string(&path).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["hostname"] = "some-other-host".into();
    v["profile"]["memory_bandwidth"] = 1.0.into();
    std::fs::write(&path, v.to_string()).unwrap();
    let third = host_profile_cached_at(&path, false, true).unwrap();
    assert_ne!(third.memory_bandwidth, 1.0);
    // refresh always measures.
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["profile"]["memory_bandwidth"] = 1.0.into();
    std::fs::write(&path, v.to_string()).unwrap();
    assert_eq!(
        host_profile_cached_at(&path, false, true)
            .unwrap()
            .memory_bandwidth,
        1.0
    );
    assert_ne!(
        host_profile_cached_at(&path, true, true)
            .unwrap()
            .memory_bandwidth,
        1.0
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The full host measurement, printed (`cargo test -p ppcc-passes --test cost_model --
/// --ignored --nocapture`); it must stay under 2 s.
#[test]
#[ignore]
fn host_measurement_full() {
    let t = std::time::Instant::now();
    let p = measure_host(false);
    let took = t.elapsed().as_secs_f64();
    println!("{}\nmeasured in {took:.2} s", p.to_json().unwrap());
    assert!(took < 2.0, "took {took} s");
}

/// A small CNN: conv → relu → strided conv → relu → max_pool → flatten → matmul.
const CNN: &str = r#"
module {
  func @main(%x: tensor<2x3x8x8xf32>, %w1: tensor<4x3x3x3xf32> {param}, %w2: tensor<6x4x3x3xf32> {param}, %w3: tensor<24x5xf32> {param}) -> (tensor<2x5xf32>) {
    %c1 = "pp.conv"(%x, %w1) {pads = [1, 1, 1, 1]} : (tensor<2x3x8x8xf32>, tensor<4x3x3x3xf32>) -> tensor<2x4x8x8xf32>
    %r1 = "pp.relu"(%c1) : (tensor<2x4x8x8xf32>) -> tensor<2x4x8x8xf32>
    %c2 = "pp.conv"(%r1, %w2) {pads = [1, 1, 1, 1], strides = [2, 2]} : (tensor<2x4x8x8xf32>, tensor<6x4x3x3xf32>) -> tensor<2x6x4x4xf32>
    %r2 = "pp.relu"(%c2) : (tensor<2x6x4x4xf32>) -> tensor<2x6x4x4xf32>
    %p = "pp.max_pool"(%r2) {kernel_shape = [2, 2], strides = [2, 2]} : (tensor<2x6x4x4xf32>) -> tensor<2x6x2x2xf32>
    %f = "pp.flatten"(%p) : (tensor<2x6x2x2xf32>) -> tensor<2x24xf32>
    %y = "pp.matmul"(%f, %w3) : (tensor<2x24xf32>, tensor<24x5xf32>) -> tensor<2x5xf32>
    return %y : tensor<2x5xf32>
  }
}
"#;

#[test]
fn conv_gradients_cost_as_much_as_the_conv() {
    let mut m = ppir::text::parse_module(CNN).unwrap_or_else(|e| panic!("{e}"));
    build_gradient_function(&mut m, &AutodiffOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let g = m.function("grad").unwrap();
    // 2·N·M·(C/g)·Πk·Πout per conv.
    let conv1 = 2.0 * 2.0 * 4.0 * 3.0 * 9.0 * 64.0;
    let conv2 = 2.0 * 2.0 * 6.0 * 4.0 * 9.0 * 16.0;
    assert_eq!(kind_flops(g, OpKind::Conv, Phase::Fwd), conv1 + conv2);
    // dx of conv2 (a conv_transpose) is B; conv1's dx is not needed.
    assert_eq!(kind_flops(g, OpKind::ConvTranspose, Phase::BwdInput), conv2);
    // Both weight gradients are W.
    assert_eq!(
        kind_flops(g, OpKind::ConvGradWeight, Phase::BwdWeight),
        conv1 + conv2
    );
    // The pool's gradient: |dy|·(Πk + 1) with dy [2, 6, 2, 2].
    assert_eq!(
        kind_flops(g, OpKind::MaxPoolGrad, Phase::BwdInput),
        48.0 * 5.0
    );
}

/// Every op in the lit tests' modules with static shapes has a cost (no op kind is left
/// without a rule that works on real attribute spellings).
#[test]
fn every_lit_module_has_costs() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../lit");
    let mut files = vec![];
    let mut stack = vec![root];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "ppir") {
                files.push(p);
            }
        }
    }
    let mut costed = 0;
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        // Error cases (parse or verifier tests) are not this test's business.
        let Ok(m) = ppir::text::parse_module(&text) else {
            continue;
        };
        if ppir::verify::verify_module(&m).is_err() {
            continue;
        }
        for f in &m.functions {
            for &op in f.ops() {
                let data = f.op(op);
                let tys = data.operands().iter().chain(data.results());
                if !tys.clone().all(|&v| f.ty(v).is_static()) {
                    continue;
                }
                match ppcc_passes::cost::op_cost(f, op) {
                    Ok(c) => {
                        assert!(c.flops.is_finite() && c.flops >= 0.0);
                        costed += 1;
                    }
                    Err(e) => panic!("{}: {e}", path.display()),
                }
            }
        }
    }
    assert!(costed > 30, "only {costed} ops costed");
}

/// No op kind panics on odd operands (wrong ranks, scalars, missing attributes): the
/// answer is a cost or an error.
#[test]
fn no_kind_panics_on_odd_input() {
    let shapes: [&[u64]; 5] = [&[], &[3], &[2, 3], &[2, 3, 4], &[2, 3, 4, 4]];
    let attr_sets = [
        Attrs::new(),
        Attrs::new()
            .with("kernel_shape", ints(&[2, 2]))
            .with("size", Attr::Int(3))
            .with("axis", Attr::Int(-7)),
    ];
    for &kind in OpKind::ALL {
        for s in shapes {
            for attrs in &attr_sets {
                let t = f32t(s);
                for n_operands in 0..=5 {
                    let xs = vec![&t; n_operands];
                    for n_results in 0..=1 {
                        let ys = vec![&t; n_results];
                        if let Ok(c) = op_cost_of(kind, attrs, &xs, &ys) {
                            assert!(c.flops.is_finite() && c.flops >= 0.0, "{kind}");
                        }
                    }
                }
            }
        }
    }
}
