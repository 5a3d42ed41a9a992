//! Gradients through the ONNX ops the importer decomposes (Einsum, CumSum, LayerNormalization
//! with its Mean and InvStdDev results, SoftmaxCrossEntropyLoss with class weights and
//! `ignore_index`, GatherElements, GatherND with `batch_dims`; ArgMax beside them, not differentiated): a small ONNX
//! model whose own SoftmaxCrossEntropyLoss output is the loss (`--loss output`) is imported,
//! differentiated by autodiff and checked against central finite differences of its loss,
//! all in f64 on the reference interpreter. The model is written by the onnx Python package
//! (`PPCC_PYTHON`, else the repository's `.venv`); the test is skipped without it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use ppcc_frontends::onnx::{import_onnx, ImportOptions};
use ppcc_passes::autodiff::{build_gradient_function, AutodiffOptions, LossKind};
use ppir::interp::{bind_args, run_function, InterpOptions, Precision};
use ppir::{DType, Module, Tensor, TensorData};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

const MODEL: &str = r#"
import sys, numpy as np, onnx
from onnx import helper as h, numpy_helper as nh, TensorProto as T
rng = np.random.default_rng(1)
params = [
    nh.from_array((rng.normal(size=(4, 4)) * 0.5).astype(np.float32), "W"),
    nh.from_array((1 + 0.1 * rng.normal(size=(4,))).astype(np.float32), "g"),
    nh.from_array(np.array(1, np.int64), "axis"),
    nh.from_array(np.array([[[0, 2, 1, -1]], [[1, 0, 2, 1]]], np.int64), "pick"),
    nh.from_array(np.array([[[2], [0], [2]], [[-2], [1], [0]]], np.int64), "rows"),
]
wts = nh.from_array(np.array([1.0, 2.0, 0.5], np.float32))
nodes = [
    h.make_node("Constant", [], ["wts"], value=wts),
    h.make_node("Einsum", ["x", "W"], ["e"], equation="bij,jk->bik"),
    h.make_node("CumSum", ["e", "axis"], ["c"], reverse=1),
    h.make_node("LayerNormalization", ["c", "g"], ["n", "mean", "inv"], axis=-1, epsilon=1e-3),
    h.make_node("Add", ["n", "mean"], ["t"]),
    h.make_node("Mul", ["t", "inv"], ["s"]),
    h.make_node("GatherElements", ["s", "pick"], ["p"], axis=1),
    h.make_node("GatherND", ["s", "rows"], ["q"], batch_dims=1),
    h.make_node("Add", ["s", "p"], ["sp"]),
    h.make_node("Add", ["sp", "q"], ["scores"]),
    h.make_node("SoftmaxCrossEntropyLoss", ["scores", "y", "wts"], ["loss"],
                ignore_index=1, reduction="mean"),
    h.make_node("ArgMax", ["scores"], ["am"], axis=1, keepdims=0),
]
g = h.make_graph(
    nodes, "grads",
    [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 4]),
     h.make_tensor_value_info("y", T.INT64, [2, 4])],
    [h.make_tensor_value_info("loss", T.FLOAT, []),
     h.make_tensor_value_info("am", T.INT64, [2, 4])],
    params)
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]), sys.argv[1])
"#;

fn f64_opts() -> InterpOptions {
    InterpOptions {
        precision: Precision::F64,
    }
}

fn loss_of(m: &Module, inputs: &HashMap<String, Tensor>) -> Vec<Tensor> {
    let f = m.function("grad").unwrap();
    let args = bind_args(m, f, inputs).unwrap();
    run_function(f, args, &f64_opts(), None).unwrap()
}

fn floats(t: &Tensor) -> Vec<f64> {
    t.to_f64_vec()
}

/// The onnx package's Python, or `None` (the tests are then skipped).
fn python_with_onnx() -> Option<PathBuf> {
    let python = std::env::var("PPCC_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo().join(".venv/bin/python"));
    let has_onnx = Command::new(&python)
        .args(["-c", "import onnx, numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_onnx {
        eprintln!("skipping: no onnx/numpy at {}", python.display());
        return None;
    }
    Some(python)
}

/// Writes the model of `script` (which saves it to `sys.argv[1]`), imports it, builds its
/// gradient function with the model's first output as the loss, and checks every
/// parameter's gradient against central finite differences (relative error < 1e-6).
fn check_gradients(
    python: &Path,
    script: &str,
    tag: &str,
    inputs: &HashMap<String, Tensor>,
    params: &[&str],
) {
    let dir = std::env::temp_dir().join(format!("ppcc-onnx-grads-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("grads.onnx");
    let o = Command::new(python)
        .args(["-c", script, path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let mut m = import_onnx(&bytes, &ImportOptions::default()).unwrap();
    let opts = AutodiffOptions {
        loss: LossKind::Output,
        ..AutodiffOptions::default()
    };
    let info = build_gradient_function(&mut m, &opts).unwrap();
    assert_eq!(info.params, params);
    let outs = loss_of(&m, inputs);
    assert!(floats(&outs[0])[0].is_finite());
    let h = 1e-4;
    for (k, p) in info.params.iter().enumerate() {
        let analytic = floats(&outs[1 + k]);
        let original = m.weights[p].clone();
        let mut fd = vec![];
        for i in 0..original.num_elements() {
            let mut at = |d: f64| {
                let mut w = original.clone();
                if let TensorData::Float(v) = &mut w.data {
                    v[i] += d;
                }
                m.weights.insert(p.clone(), w);
                floats(&loss_of(&m, inputs)[0])[0]
            };
            let (p1, m1, p2, m2) = (at(h), at(-h), at(2.0 * h), at(-2.0 * h));
            fd.push((8.0 * (p1 - m1) - (p2 - m2)) / (12.0 * h));
        }
        m.weights.insert(p.clone(), original);
        let scale = analytic
            .iter()
            .chain(&fd)
            .fold(1e-5f64, |a, v| a.max(v.abs()));
        let err = analytic
            .iter()
            .zip(&fd)
            .fold(0.0f64, |a, (x, y)| a.max((x - y).abs()))
            / scale;
        eprintln!("{tag} grad.{p}: largest |g| {scale:.3e}, relative error {err:.2e}");
        assert!(
            err < 1e-6,
            "{tag} grad.{p}: relative error {err:e}\n analytic {analytic:?}\n finite differences {fd:?}"
        );
    }
}

#[test]
fn decomposed_onnx_ops_differentiate_like_finite_differences() {
    let Some(python) = python_with_onnx() else {
        return;
    };
    let x: Vec<f64> = (0..24).map(|i| ((i * 7) % 11) as f64 * 0.2 - 1.0).collect();
    let inputs = HashMap::from([
        (
            "x".to_string(),
            Tensor::from_f64(DType::F32, vec![2, 3, 4], x),
        ),
        (
            "y".to_string(),
            Tensor::from_i64(DType::I64, vec![2, 4], vec![0, 1, 2, 0, 2, 2, 1, 0]),
        ),
    ]);
    check_gradients(&python, MODEL, "mixed", &inputs, &["W", "g"]);
}

/// The elementwise, normalisation, pooling and resampling ops the importer decomposes
/// (onnx opset 28): each reads `h = x + P` (P the parameter), each result enters the loss
/// through `ReduceSum(Softplus(result))` (not invariant under the normalisations), and the
/// gradient of P (and of GroupNormalization's and CausalConvWithState's weights) is checked.
const ELEMENTWISE_MODEL: &str = r#"
import sys, numpy as np, onnx
from onnx import helper as h, numpy_helper as nh, TensorProto as T
rng = np.random.default_rng(2)
params = [
    nh.from_array((rng.normal(size=(2, 4, 5)) * 0.6).astype(np.float32), "P"),
    nh.from_array((1 + 0.2 * rng.normal(size=(4,))).astype(np.float32), "gs"),
    nh.from_array((0.2 * rng.normal(size=(4,))).astype(np.float32), "gb"),
    nh.from_array((0.5 * rng.normal(size=(4, 1, 3))).astype(np.float32), "cw"),
    nh.from_array((0.2 * rng.normal(size=(4,))).astype(np.float32), "cb"),
]
def c(name, v, dt=np.float32):
    return h.make_node("Constant", [], [name], value=nh.from_array(np.array(v, dt)))
nodes = [
    h.make_node("Add", ["x", "P"], ["h"]),
    h.make_node("Tanh", ["h"], ["t"]),
    c("k09", 0.9), c("k3", 3.0), c("k2", 2.0),
    h.make_node("Mul", ["t", "k09"], ["t9"]),
    h.make_node("Mul", ["h", "k3"], ["h3"]),
    h.make_node("Mul", ["h", "h"], ["hh"]),
    h.make_node("Add", ["hh", "k2"], ["h2p"]),
    c("axis2", 2, np.int64), c("axes2", [2], np.int64),
    c("roi", [], np.float32), c("up", [1.0, 1.0, 1.6], np.float32),
    c("down", [2, 4, 3], np.int64),
]
outs = []
def op(kind, ins, **kw):
    name = f"y{len(outs)}"
    nodes.append(h.make_node(kind, ins, [name], **kw))
    outs.append(name)
op("Celu", ["h"], alpha=0.7)
op("ThresholdedRelu", ["h"], alpha=0.3)
op("Swish", ["h"], alpha=1.3)
op("SwiGLU", ["h", "t"], alpha=0.8)
op("Tan", ["h"])
op("Sinh", ["h"])
op("Cosh", ["h"])
op("Asin", ["t9"])
op("Acos", ["t9"])
op("Atan", ["h3"])
op("Asinh", ["h3"])
op("Acosh", ["h2p"])
op("Atanh", ["t9"])
op("Round", ["h3"])
op("LpNormalization", ["h"], axis=-1, p=2)
op("LpNormalization", ["h"], axis=1, p=1)
op("MeanVarianceNormalization", ["h"], axes=[0, 2])
op("GroupNormalization", ["h", "gs", "gb"], num_groups=2, epsilon=1e-3)
op("LpPool", ["h"], kernel_shape=[2], p=3, pads=[1, 0], strides=[2], ceil_mode=1)
op("ReduceProd", ["h", "axes2"], keepdims=0)
op("CumProd", ["h", "axis2"], exclusive=1)
op("CumProd", ["h", "axis2"], reverse=1)
op("Resize", ["h", "roi", "up"], mode="linear")
op("Resize", ["h", "roi", "up"], mode="nearest", coordinate_transformation_mode="asymmetric")
op("Resize", ["h", "", "", "down"], mode="cubic", antialias=1)
nodes.append(h.make_node("CausalConvWithState", ["h", "cw", "cb", "past"], ["cy", "state"],
                         activation="silu"))
outs += ["cy", "state"]
terms = []
for i, o in enumerate(outs):
    nodes.append(h.make_node("Softplus", [o], [f"s{i}"]))
    nodes.append(h.make_node("ReduceSum", [f"s{i}"], [f"r{i}"], keepdims=0))
    terms.append(f"r{i}")
nodes.append(h.make_node("Sum", terms, ["loss"]))
g = h.make_graph(
    nodes, "grads",
    [h.make_tensor_value_info("x", T.FLOAT, [2, 4, 5]),
     h.make_tensor_value_info("past", T.FLOAT, [2, 4, 2])],
    [h.make_tensor_value_info("loss", T.FLOAT, [])],
    params)
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 28)]), sys.argv[1])
"#;

#[test]
fn decomposed_elementwise_and_resampling_ops_differentiate_like_finite_differences() {
    let Some(python) = python_with_onnx() else {
        return;
    };
    let x: Vec<f64> = (0..40)
        .map(|i| ((i * 7) % 13) as f64 * 0.15 - 0.9)
        .collect();
    let past: Vec<f64> = (0..16).map(|i| ((i * 5) % 7) as f64 * 0.2 - 0.6).collect();
    let inputs = HashMap::from([
        (
            "x".to_string(),
            Tensor::from_f64(DType::F32, vec![2, 4, 5], x),
        ),
        (
            "past".to_string(),
            Tensor::from_f64(DType::F32, vec![2, 4, 2], past),
        ),
    ]);
    check_gradients(
        &python,
        ELEMENTWISE_MODEL,
        "elementwise",
        &inputs,
        &["P", "gs", "gb", "cw", "cb"],
    );
}

/// The sampling, signal, attention and reordering ops the importer decomposes: GridSample
/// (three modes and paddings; gradients of the input and of the grid), AffineGrid, Col2Im,
/// DFT, LinearAttention (gated delta rule), TensorScatter, ReverseSequence, CenterCropPad and
/// training-mode BatchNormalization, each entering the loss through `ReduceSum(Softplus(y))`.
const SAMPLING_MODEL: &str = r#"
import sys, numpy as np, onnx
from onnx import helper as h, numpy_helper as nh, TensorProto as T
rng = np.random.default_rng(3)
params = [
    nh.from_array((rng.normal(size=(2, 4, 5)) * 0.6).astype(np.float32), "P"),
    nh.from_array(rng.uniform(-1.1, 1.1, size=(2, 6, 1)).astype(np.float32), "G"),
    nh.from_array((rng.normal(size=(2, 2, 3)) * 0.5).astype(np.float32), "theta"),
    nh.from_array((1 + 0.2 * rng.normal(size=(4,))).astype(np.float32), "bs"),
    nh.from_array((0.2 * rng.normal(size=(4,))).astype(np.float32), "bb"),
]
def c(name, v, dt=np.float32):
    return h.make_node("Constant", [], [name], value=nh.from_array(np.array(v, dt)))
nodes = [
    h.make_node("Add", ["x", "P"], ["h"]),
    c("size", [2, 1, 3, 4], np.int64), c("img", [6], np.int64), c("blk", [2], np.int64),
    c("ax3", [3], np.int64), c("one", 1, np.int64), c("wi", [1, 3], np.int64),
    c("lens", [3, 4], np.int64), c("crop", [3, 6], np.int64),
    c("decay", -0.3 * np.ones((2, 4, 1))), c("beta", 0.6 * np.ones((2, 4, 1))),
    c("mean", np.zeros(4)), c("var", np.ones(4)),
    c("st0", [0], np.int64), c("st2", [2], np.int64), c("st1", [1], np.int64),
    h.make_node("Unsqueeze", ["h", "ax3"], ["h4"]),
    h.make_node("Slice", ["h", "st0", "st2", "st1"], ["upd"]),
]
outs = []
def op(kind, ins, n_out=1, **kw):
    names = [f"y{len(outs) + i}" for i in range(n_out)]
    nodes.append(h.make_node(kind, ins, names, **kw))
    outs.extend(names)
op("GridSample", ["h", "G"], mode="linear", padding_mode="zeros")
op("GridSample", ["h", "G"], mode="cubic", padding_mode="reflection", align_corners=1)
op("GridSample", ["h", "G"], mode="nearest", padding_mode="border")
op("AffineGrid", ["theta", "size"], align_corners=0)
op("Col2Im", ["h", "img", "blk"])
op("DFT", ["h4", "", "one"], onesided=1)
op("LinearAttention", ["h", "h", "h", "", "decay", "beta"], n_out=2, q_num_heads=1,
   kv_num_heads=1, update_rule="gated_delta")
op("TensorScatter", ["h", "upd", "wi"], mode="circular")
op("ReverseSequence", ["h", "lens"], batch_axis=0, time_axis=1)
op("CenterCropPad", ["h", "crop"], axes=[1, 2])
op("BatchNormalization", ["h", "bs", "bb", "mean", "var"], n_out=3, training_mode=1)
terms = []
for i, o in enumerate(outs):
    nodes.append(h.make_node("Softplus", [o], [f"s{i}"]))
    nodes.append(h.make_node("ReduceSum", [f"s{i}"], [f"r{i}"], keepdims=0))
    terms.append(f"r{i}")
nodes.append(h.make_node("Sum", terms, ["loss"]))
g = h.make_graph(
    nodes, "grads",
    [h.make_tensor_value_info("x", T.FLOAT, [2, 4, 5])],
    [h.make_tensor_value_info("loss", T.FLOAT, [])],
    params)
onnx.save(h.make_model(g, opset_imports=[h.make_opsetid("", 28)]), sys.argv[1])
"#;

#[test]
fn decomposed_sampling_and_sequence_ops_differentiate_like_finite_differences() {
    let Some(python) = python_with_onnx() else {
        return;
    };
    let x: Vec<f64> = (0..40)
        .map(|i| ((i * 5) % 11) as f64 * 0.17 - 0.8)
        .collect();
    let inputs = HashMap::from([(
        "x".to_string(),
        Tensor::from_f64(DType::F32, vec![2, 4, 5], x),
    )]);
    check_gradients(
        &python,
        SAMPLING_MODEL,
        "sampling",
        &inputs,
        &["P", "G", "theta", "bs", "bb"],
    );
}

/// Control flow and the recurrent and other ops the importer unrolls or decomposes: a
/// bidirectional GRU (`linear_before_reset`, initial state), an LSTM with peepholes, clip and
/// `sequence_lens` shorter than the sequence, a reverse RNN with `ScaledTanh`, a `Scan` and a
/// `Loop` whose bodies read outer-scope parameters, an `If` on a run-time condition,
/// `FlexAttention` with a `score_mod` subgraph, `Det`, `Compress`, `STFT` and `MaxUnpool`,
/// each entering the loss through `ReduceSum(Softplus(y))`.
const RECURRENT_MODEL: &str = r#"
import sys, numpy as np, onnx
from onnx import helper as h, numpy_helper as nh, TensorProto as T
rng = np.random.default_rng(4)
def p(name, shape, s=0.5, base=0.0):
    return nh.from_array((base + s * rng.normal(size=shape)).astype(np.float32), name)
params = [
    p("Wg", (2, 9, 4)), p("Rg", (2, 9, 3)), p("Bg", (2, 18), 0.2),
    p("Wl", (1, 12, 4)), p("Rl", (1, 12, 3)), p("Bl", (1, 24), 0.2), p("Pl", (1, 9), 0.3),
    p("Wr", (1, 3, 4)), p("Rr", (1, 3, 3)),
    p("Ws", (4, 3)), p("Wo", (3,)), p("Wi", (3, 2, 4)),
    p("Fq", (1, 2, 3, 4)), p("D", (2, 3, 3), 0.6, 0.0), p("S", (1, 12, 1)), p("U", (1, 1, 2, 2)),
]
def c(name, v, dt=np.float32):
    return h.make_node("Constant", [], [name], value=nh.from_array(np.array(v, dt)))
scan_body = h.make_graph(
    [h.make_node("MatMul", ["xt", "Ws"], ["xw"]),
     h.make_node("Add", ["xw", "hs"], ["pre"]),
     h.make_node("Tanh", ["pre"], ["hn"]),
     h.make_node("Identity", ["hn"], ["yt"])],
    "scan_body",
    [h.make_tensor_value_info("hs", T.FLOAT, [2, 3]),
     h.make_tensor_value_info("xt", T.FLOAT, [2, 4])],
    [h.make_tensor_value_info("hn", T.FLOAT, [2, 3]),
     h.make_tensor_value_info("yt", T.FLOAT, [2, 3])])
loop_body = h.make_graph(
    [h.make_node("Cast", ["i"], ["fi"], to=T.FLOAT),
     h.make_node("Mul", ["v", "Wo"], ["vw"]),
     h.make_node("Add", ["vw", "fi"], ["vf"]),
     h.make_node("Sin", ["vf"], ["vo"]),
     h.make_node("Identity", ["cin"], ["cout"]),
     h.make_node("Identity", ["vo"], ["so"])],
    "loop_body",
    [h.make_tensor_value_info("i", T.INT64, []),
     h.make_tensor_value_info("cin", T.BOOL, []),
     h.make_tensor_value_info("v", T.FLOAT, [2, 3])],
    [h.make_tensor_value_info("cout", T.BOOL, []),
     h.make_tensor_value_info("vo", T.FLOAT, [2, 3]),
     h.make_tensor_value_info("so", T.FLOAT, [2, 3])])
then_g = h.make_graph([h.make_node("Mul", ["x", "Wi"], ["ty"])], "then",
                      [], [h.make_tensor_value_info("ty", T.FLOAT, [3, 2, 4])])
else_g = h.make_graph([h.make_node("Sub", ["x", "Wi"], ["ey"])], "else",
                      [], [h.make_tensor_value_info("ey", T.FLOAT, [3, 2, 4])])
score_mod = h.make_graph(
    [h.make_node("Mul", ["sc", "half"], ["so2"])], "score_mod",
    [h.make_tensor_value_info("sc", T.FLOAT, [1, 2, 3, 3])],
    [h.make_tensor_value_info("so2", T.FLOAT, [1, 2, 3, 3])],
    [nh.from_array(np.array(0.5, np.float32), "half")])
nodes = [
    c("h0", 0.1 * np.ones((2, 2, 3))), c("lens", [3, 2], np.int32),
    c("s0", np.zeros((2, 3))), c("trip", 3, np.int64), c("yes", True, np.bool_),
    c("keep", [True, False, True], np.bool_), c("step", 4, np.int64), c("flen", 6, np.int64),
    c("ind", [[[[0, 3], [5, 14]]]], np.int64),
    h.make_node("ReduceSum", ["x"], ["xs"], keepdims=0),
    c("zero", 0.0), h.make_node("Greater", ["xs", "zero"], ["cond"]),
    c("qshape", [1, 2, 3, 4], np.int64),
    h.make_node("Reshape", ["x", "qshape"], ["xq"]),
    h.make_node("Add", ["xq", "Fq"], ["q"]),
]
outs = []
def op(kind, ins, n_out=1, **kw):
    names = [f"y{len(outs) + i}" for i in range(n_out)]
    nodes.append(h.make_node(kind, ins, names, **kw))
    outs.extend(names)
op("GRU", ["x", "Wg", "Rg", "Bg", "", "h0"], n_out=2, hidden_size=3,
   direction="bidirectional", linear_before_reset=1)
op("LSTM", ["x", "Wl", "Rl", "Bl", "lens", "", "", "Pl"], n_out=3, hidden_size=3, clip=5.0)
op("RNN", ["x", "Wr", "Rr"], n_out=2, hidden_size=3, direction="reverse",
   activations=["ScaledTanh"], activation_alpha=[1.3], activation_beta=[0.7])
nodes.append(h.make_node("Scan", ["s0", "x"], ["sf", "sy"], body=scan_body, num_scan_inputs=1))
outs += ["sf", "sy"]
nodes.append(h.make_node("Loop", ["trip", "yes", "sf"], ["lf", "ly"], body=loop_body))
outs += ["lf", "ly"]
op("If", ["cond"], then_branch=then_g, else_branch=else_g)
nodes.append(h.make_node("FlexAttention", ["q", "q", "xq"], ["fa"], domain="ai.onnx.preview",
                         score_mod=score_mod))
outs.append("fa")
op("Det", ["D"])
op("Compress", ["Fq", "keep"], axis=2)
op("STFT", ["S", "step", "", "flen"])
op("MaxUnpool", ["U", "ind"], kernel_shape=[2, 2], strides=[2, 2])
terms = []
for i, o in enumerate(outs):
    nodes.append(h.make_node("Softplus", [o], [f"sp{i}"]))
    nodes.append(h.make_node("ReduceSum", [f"sp{i}"], [f"rs{i}"], keepdims=0))
    terms.append(f"rs{i}")
nodes.append(h.make_node("Sum", terms, ["loss"]))
g = h.make_graph(
    nodes, "grads",
    [h.make_tensor_value_info("x", T.FLOAT, [3, 2, 4])],
    [h.make_tensor_value_info("loss", T.FLOAT, [])],
    params)
model = h.make_model(g, opset_imports=[h.make_opsetid("", 22), h.make_opsetid("ai.onnx.preview", 1)])
onnx.save(model, sys.argv[1])
"#;

#[test]
fn unrolled_control_flow_and_recurrent_ops_differentiate_like_finite_differences() {
    let Some(python) = python_with_onnx() else {
        return;
    };
    let x: Vec<f64> = (0..24)
        .map(|i| ((i * 5) % 11) as f64 * 0.15 - 0.6)
        .collect();
    let inputs = HashMap::from([(
        "x".to_string(),
        Tensor::from_f64(DType::F32, vec![3, 2, 4], x),
    )]);
    check_gradients(
        &python,
        RECURRENT_MODEL,
        "recurrent",
        &inputs,
        &[
            "Fq", "Wg", "Bg", "Rg", "Wl", "Bl", "Rl", "Pl", "Wr", "Rr", "Ws", "Wo", "Wi", "D", "S",
            "U",
        ],
    );
}
