"""A small Llama-style block of the opset-23 transformer ops, for cli/tests/transformer_ops.rs.

    python block.py OUT_DIR

writes OUT_DIR/block.onnx (x [2, 6, 16] -> y [2, 6, 16]), OUT_DIR/block_case/ (that model
with an input and the onnx reference implementation's output, checked against
onnxruntime's, as a `ppcc conform` folder) and OUT_DIR/block_loss.onnx (the same block, then loss = sum(y * R) for a fixed random R: a
scalar output for gradient checks). The block: RMSNormalization -> q/k/v projections ->
RotaryEmbedding on q (3-D input, full rotation, halves) and on k (partial rotation,
interleaved) -> Attention (3-D inputs, 4 query heads over 2 key/value heads, causal,
softcap, a boolean key mask) -> output projection + residual -> RMSNormalization.
Float initializers are the trainable weights; caches, positions and the mask are Constant
nodes.
"""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

B, S, D, HQ, HKV = 2, 6, 16, 4, 2
HEAD = D // HQ


def const(name, array):
    return helper.make_node(
        "Constant",
        [],
        [name],
        name=name,
        value=numpy_helper.from_array(array, name),
    )


def rope_cache(positions, half, base=10000.0):
    inv = base ** (-np.arange(half, dtype=np.float64) / half)
    angles = np.outer(np.arange(positions), inv)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def build(with_loss):
    rng = np.random.default_rng(23)
    w = lambda *shape: (rng.standard_normal(shape) * 0.3).astype(np.float32)
    inits = [
        numpy_helper.from_array((1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32), "g1"),
        numpy_helper.from_array(w(D, HQ * HEAD), "wq"),
        numpy_helper.from_array(w(D, HKV * HEAD), "wk"),
        numpy_helper.from_array(w(D, HKV * HEAD), "wv"),
        numpy_helper.from_array(w(HQ * HEAD, D), "wo"),
        numpy_helper.from_array((1.0 + 0.1 * rng.standard_normal(D)).astype(np.float32), "g2"),
    ]
    cos_q, sin_q = rope_cache(S, HEAD // 2)
    cos_k, sin_k = rope_cache(S, 1)
    nodes = [
        const("cos_q", cos_q),
        const("sin_q", sin_q),
        const("cos_k", cos_k),
        const("sin_k", sin_k),
        const("pos", np.tile(np.arange(S, dtype=np.int64), (B, 1))),
        # Key 4 is never attended (every row still has key 0).
        const("key_mask", np.tile([True, True, True, True, False, True], (S, 1))),
        helper.make_node("RMSNormalization", ["x", "g1"], ["h"], name="norm1", epsilon=1e-5),
        helper.make_node("MatMul", ["h", "wq"], ["q"], name="q_proj"),
        helper.make_node("MatMul", ["h", "wk"], ["k"], name="k_proj"),
        helper.make_node("MatMul", ["h", "wv"], ["v"], name="v_proj"),
        helper.make_node(
            "RotaryEmbedding", ["q", "cos_q", "sin_q", "pos"], ["q_rot"], name="rope_q", num_heads=HQ
        ),
        helper.make_node(
            "RotaryEmbedding",
            ["k", "cos_k", "sin_k", "pos"],
            ["k_rot"],
            name="rope_k",
            num_heads=HKV,
            rotary_embedding_dim=2,
            interleaved=1,
        ),
        helper.make_node(
            "Attention",
            ["q_rot", "k_rot", "v", "key_mask"],
            ["att"],
            name="attention",
            q_num_heads=HQ,
            kv_num_heads=HKV,
            is_causal=1,
            softcap=4.0,
        ),
        helper.make_node("MatMul", ["att", "wo"], ["o"], name="o_proj"),
        helper.make_node("Add", ["x", "o"], ["r"], name="residual"),
        helper.make_node("RMSNormalization", ["r", "g2"], ["y"], name="norm2"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, S, D])]
    if with_loss:
        nodes += [
            const("R", rng.standard_normal((1, S, D)).astype(np.float32)),
            helper.make_node("Mul", ["y", "R"], ["yr"], name="weigh"),
            helper.make_node("ReduceSum", ["yr"], ["loss"], name="loss", keepdims=0),
        ]
        outputs = [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])]
    graph = helper.make_graph(
        nodes,
        "transformer_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, S, D])],
        outputs,
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def write_case(model, folder):
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(5).standard_normal((B, S, D)).astype(np.float32)
    (y,) = ReferenceEvaluator(model).run(None, {"x": x})
    try:
        import onnxruntime
    except ImportError:
        onnxruntime = None
    if onnxruntime is not None:
        sess = onnxruntime.InferenceSession(model.SerializeToString())
        (y_ort,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(y, y_ort, rtol=1e-4, atol=1e-5)
    data = os.path.join(folder, "test_data_set_0")
    os.makedirs(data, exist_ok=True)
    onnx.save(model, os.path.join(folder, "model.onnx"))
    for name, array in [("input_0", numpy_helper.from_array(x, "x")), ("output_0", numpy_helper.from_array(y, "y"))]:
        with open(os.path.join(data, name + ".pb"), "wb") as f:
            f.write(array.SerializeToString())


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    block = build(False)
    onnx.save(block, os.path.join(out, "block.onnx"))
    write_case(block, os.path.join(out, "block_case"))
    onnx.save(build(True), os.path.join(out, "block_loss.onnx"))


if __name__ == "__main__":
    main()
