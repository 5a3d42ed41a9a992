#!/usr/bin/env python3
"""Generate ppcc's small example ONNX models and their reference inputs/outputs.

Usage (from the repository root, with onnx, onnxruntime and numpy installed):

    python examples/gen_examples.py

Writes, next to this script:

    mlp.onnx        mlp_io.npz
    gpt.onnx        gpt_io.npz
    two_tower.onnx  two_tower_io.npz
    cnn.onnx        cnn_io.npz

Every model uses opset 17 (default domain), IR version 8, static shapes and float32
weights. Float initializers are the trainable parameters (plus BatchNormalization's
running statistics, stored as initializers the way exporters store them); scalars, masks,
index tensors and reshape targets are `Constant` nodes.

Each `<name>_io.npz` holds the model's inputs under the graph input names and
onnxruntime's outputs (graph optimisations off, one thread) under the graph output names.

The script is deterministic: running it twice gives byte-identical files (fixed seeds, no
timestamps in the models, fixed timestamps in the npz archives).
"""

import io
import os
import sys
import zipfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
PRODUCER = "ppcc-examples"
PRODUCER_VERSION = "1"
HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------------------------------
# A tiny graph builder on top of onnx.helper
# ---------------------------------------------------------------------------------------


class Builder:
    def __init__(self, name, seed):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes = []
        self.initializers = []
        self.inputs = []
        self.outputs = []
        self._names = set()

    def _unique(self, name):
        assert name not in self._names, f"duplicate name {name}"
        self._names.add(name)
        return name

    # --- graph inputs/outputs -----------------------------------------------------------
    def input(self, name, elem_type, shape):
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return self._unique(name)

    def output(self, name, elem_type, shape):
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))

    # --- parameters (float initializers) ------------------------------------------------
    def param(self, name, array):
        array = np.ascontiguousarray(array, dtype=np.float32)
        self.initializers.append(numpy_helper.from_array(array, name=self._unique(name)))
        return name

    def normal(self, name, shape, std, mean=0.0):
        return self.param(name, mean + std * self.rng.standard_normal(shape))

    def uniform(self, name, shape, low, high):
        return self.param(name, self.rng.uniform(low, high, size=shape))

    # --- nodes ----------------------------------------------------------------------------
    def node(self, op, inputs, name, outputs=None, **attrs):
        """Add a node named `name`; its single output is called `name` too unless given."""
        if outputs is None:
            outputs = [name]
        for o in outputs:
            self._unique(o)
        self.nodes.append(helper.make_node(op, inputs, outputs, name=name, **attrs))
        return outputs[0] if len(outputs) == 1 else outputs

    def const(self, name, array):
        """A `Constant` node (not a parameter)."""
        array = np.asarray(array)
        tensor = numpy_helper.from_array(array, name=name)
        return self.node("Constant", [], name, value=tensor)

    def const_f(self, name, value):
        return self.const(name, np.array(value, dtype=np.float32))

    def const_i64(self, name, value):
        return self.const(name, np.array(value, dtype=np.int64))

    # --- model ------------------------------------------------------------------------------
    def model(self, doc):
        graph = helper.make_graph(
            self.nodes,
            self.name,
            self.inputs,
            self.outputs,
            initializer=self.initializers,
        )
        model = helper.make_model(
            graph,
            producer_name=PRODUCER,
            producer_version=PRODUCER_VERSION,
            opset_imports=[helper.make_opsetid("", OPSET)],
            ir_version=IR_VERSION,
            doc_string=doc,
        )
        return model


def linear_matmul(b, x, prefix, fan_in, fan_out, std):
    """MatMul + Add (the PyTorch exporter's form for Linear on 3-D inputs)."""
    w = b.normal(f"{prefix}.weight", (fan_in, fan_out), std)
    bias = b.normal(f"{prefix}.bias", (fan_out,), 0.02)
    y = b.node("MatMul", [x, w], f"{prefix}/MatMul")
    return b.node("Add", [y, bias], f"{prefix}/Add")


# ---------------------------------------------------------------------------------------
# 1. MLP
# ---------------------------------------------------------------------------------------


def build_mlp():
    B, D_IN, H, D_OUT = 8, 64, 128, 10
    b = Builder("mlp", seed=1)
    x = b.input("x", TensorProto.FLOAT, [B, D_IN])

    # fc1: Gemm with transB=1 (weight stored [out, in], as PyTorch exports nn.Linear).
    w1 = b.normal("fc1.weight", (H, D_IN), np.sqrt(1.0 / D_IN))
    b1 = b.normal("fc1.bias", (H,), 0.05)
    h = b.node("Gemm", [x, w1, b1], "fc1/Gemm", alpha=1.0, beta=1.0, transB=1)
    h = b.node("Relu", [h], "relu1/Relu")

    # fc2: MatMul + Add (weight stored [in, out]).
    w2 = b.normal("fc2.weight", (H, H), np.sqrt(2.0 / H))
    b2 = b.normal("fc2.bias", (H,), 0.05)
    h = b.node("MatMul", [h, w2], "fc2/MatMul")
    h = b.node("Add", [h, b2], "fc2/Add")
    h = b.node("Relu", [h], "relu2/Relu")

    # fc3: Gemm without transposes (weight stored [in, out]).
    w3 = b.normal("fc3.weight", (H, D_OUT), np.sqrt(2.0 / H))
    b3 = b.normal("fc3.bias", (D_OUT,), 0.05)
    b.node("Gemm", [h, w3, b3], "fc3/Gemm", outputs=["logits"])
    b.output("logits", TensorProto.FLOAT, [B, D_OUT])

    model = b.model("MLP 64 -> 128 -> 128 -> 10 with ReLU (Gemm transB=1, MatMul+Add, Gemm).")
    rng = np.random.default_rng(101)
    inputs = {"x": rng.standard_normal((B, D_IN)).astype(np.float32)}
    return model, inputs


# ---------------------------------------------------------------------------------------
# 2. GPT-style decoder
# ---------------------------------------------------------------------------------------


def build_gpt():
    B, T, V, D, NH, LAYERS = 4, 16, 64, 32, 4, 2
    DH = D // NH
    FF = 4 * D
    b = Builder("gpt", seed=2)
    tokens = b.input("tokens", TensorProto.INT64, [B, T])

    # Embeddings: token table gathered by the ids, positional table gathered by a constant
    # position index tensor, broadcast-added.
    wte = b.normal("wte.weight", (V, D), 0.1)
    wpe = b.normal("wpe.weight", (T, D), 0.05)
    pos_ids = b.const_i64("position_ids", np.arange(T))
    tok_emb = b.node("Gather", [wte, tokens], "wte/Gather", axis=0)  # [B,T,D]
    pos_emb = b.node("Gather", [wpe, pos_ids], "wpe/Gather", axis=0)  # [T,D]
    x = b.node("Add", [tok_emb, pos_emb], "embed/Add")

    # Shared constants (scalars and masks are Constant nodes, not parameters).
    scale = b.const_f("attn_scale", 1.0 / np.sqrt(DH))
    causal_bool = b.const("causal_mask_bool", np.tril(np.ones((T, T), dtype=bool)))
    neg_big = b.const_f("mask_fill_value", -1e9)
    causal_add = b.const(
        "causal_mask_additive",
        np.triu(np.full((T, T), -1e9, dtype=np.float32), k=1),
    )
    sqrt2 = b.const_f("gelu_sqrt2", np.sqrt(2.0))
    one = b.const_f("gelu_one", 1.0)
    half = b.const_f("gelu_half", 0.5)

    def layer_norm(x, prefix):
        g = b.param(f"{prefix}.weight", 1.0 + 0.1 * b.rng.standard_normal(D))
        beta = b.normal(f"{prefix}.bias", (D,), 0.05)
        return b.node(
            "LayerNormalization", [x, g, beta], f"{prefix}/LayerNormalization",
            axis=-1, epsilon=1e-5,
        )

    for layer in range(LAYERS):
        p = f"blocks.{layer}"
        # ---- attention --------------------------------------------------------------
        h = layer_norm(x, f"{p}.ln_1")
        q = linear_matmul(b, h, f"{p}.attn.q_proj", D, D, 0.1)
        k = linear_matmul(b, h, f"{p}.attn.k_proj", D, D, 0.1)
        v = linear_matmul(b, h, f"{p}.attn.v_proj", D, D, 0.1)

        if layer == 0:
            # Split-heads target computed from the input's shape, the way tracing
            # exporters emit it: Shape -> Gather -> Unsqueeze -> Concat.
            shp = b.node("Shape", [h], f"{p}.attn/Shape")
            i0 = b.const_i64(f"{p}.attn/Constant_idx0", 0)
            i1 = b.const_i64(f"{p}.attn/Constant_idx1", 1)
            bdim = b.node("Gather", [shp, i0], f"{p}.attn/Gather_batch", axis=0)
            tdim = b.node("Gather", [shp, i1], f"{p}.attn/Gather_seq", axis=0)
            ax0 = b.const_i64(f"{p}.attn/Constant_axes", [0])
            bdim = b.node("Unsqueeze", [bdim, ax0], f"{p}.attn/Unsqueeze_batch")
            tdim = b.node("Unsqueeze", [tdim, ax0], f"{p}.attn/Unsqueeze_seq")
            heads = b.const_i64(f"{p}.attn/Constant_heads", [NH, DH])
            split_shape = b.node(
                "Concat", [bdim, tdim, heads], f"{p}.attn/Concat_split_shape", axis=0
            )
        else:
            split_shape = b.const_i64(f"{p}.attn/Constant_split_shape", [B, T, NH, DH])

        def split_heads(t, name, perm):
            t = b.node("Reshape", [t, split_shape], f"{p}.attn/Reshape_{name}")
            return b.node("Transpose", [t], f"{p}.attn/Transpose_{name}", perm=perm)

        qh = split_heads(q, "q", [0, 2, 1, 3])  # [B,H,T,Dh]
        kt = split_heads(k, "k", [0, 2, 3, 1])  # [B,H,Dh,T]
        vh = split_heads(v, "v", [0, 2, 1, 3])  # [B,H,T,Dh]

        s = b.node("MatMul", [qh, kt], f"{p}.attn/MatMul_qk")  # [B,H,T,T]
        s = b.node("Mul", [s, scale], f"{p}.attn/Mul_scale")
        if layer == 0:
            s = b.node("Where", [causal_bool, s, neg_big], f"{p}.attn/Where_mask")
        else:
            s = b.node("Add", [s, causal_add], f"{p}.attn/Add_mask")
        a = b.node("Softmax", [s], f"{p}.attn/Softmax", axis=-1)
        o = b.node("MatMul", [a, vh], f"{p}.attn/MatMul_av")  # [B,H,T,Dh]
        o = b.node("Transpose", [o], f"{p}.attn/Transpose_merge", perm=[0, 2, 1, 3])
        if layer == 0:
            merge_shape = b.const_i64(f"{p}.attn/Constant_merge_shape", [B, T, D])
        else:
            # 0 copies the input dimension, -1 is inferred (allowzero = 0).
            merge_shape = b.const_i64(f"{p}.attn/Constant_merge_shape", [0, 0, -1])
        o = b.node("Reshape", [o, merge_shape], f"{p}.attn/Reshape_merge")
        o = linear_matmul(b, o, f"{p}.attn.o_proj", D, D, 0.1)
        x = b.node("Add", [x, o], f"{p}/Add_residual_attn")

        # ---- MLP with erf GELU ------------------------------------------------------
        h = layer_norm(x, f"{p}.ln_2")
        h = linear_matmul(b, h, f"{p}.mlp.fc_in", D, FF, 0.1)
        g = b.node("Div", [h, sqrt2], f"{p}.mlp.gelu/Div")
        g = b.node("Erf", [g], f"{p}.mlp.gelu/Erf")
        g = b.node("Add", [g, one], f"{p}.mlp.gelu/Add")
        g = b.node("Mul", [h, g], f"{p}.mlp.gelu/Mul")
        g = b.node("Mul", [g, half], f"{p}.mlp.gelu/Mul_half")
        h = linear_matmul(b, g, f"{p}.mlp.fc_out", FF, D, 0.05)
        x = b.node("Add", [x, h], f"{p}/Add_residual_mlp")

    h = layer_norm(x, "ln_f")
    w_head = b.normal("lm_head.weight", (D, V), 0.2)
    b.node("MatMul", [h, w_head], "lm_head/MatMul", outputs=["logits"])
    b.output("logits", TensorProto.FLOAT, [B, T, V])

    model = b.model(
        "GPT-style decoder: vocab 64, seq 16, d 32, 4 heads, 2 blocks, erf GELU MLP (4x)."
    )
    rng = np.random.default_rng(102)
    inputs = {"tokens": rng.integers(0, V, size=(B, T), dtype=np.int64)}
    return model, inputs


# ---------------------------------------------------------------------------------------
# 3. Two-tower model (two parallel branches)
# ---------------------------------------------------------------------------------------


def build_two_tower():
    B, D_USER, D_ITEM, W = 8, 32, 48, 64
    b = Builder("two_tower", seed=3)
    user = b.input("user", TensorProto.FLOAT, [B, D_USER])
    item = b.input("item", TensorProto.FLOAT, [B, D_ITEM])

    def tower(x, prefix, d_in):
        for i in range(3):
            fan_in = d_in if i == 0 else W
            x = linear_matmul(b, x, f"{prefix}.fc{i}", fan_in, W, np.sqrt(2.0 / fan_in))
            x = b.node("Relu", [x], f"{prefix}.relu{i}/Relu")
        return x

    u = tower(user, "user_tower", D_USER)
    v = tower(item, "item_tower", D_ITEM)
    h = b.node("Concat", [u, v], "head/Concat", axis=1)  # [B, 128]
    h = linear_matmul(b, h, "head.fc0", 2 * W, W, np.sqrt(2.0 / (2 * W)))
    h = b.node("Relu", [h], "head.relu0/Relu")
    w = b.normal("head.fc1.weight", (W, 1), np.sqrt(1.0 / W))
    bias = b.normal("head.fc1.bias", (1,), 0.05)
    h = b.node("MatMul", [h, w], "head.fc1/MatMul")
    b.node("Add", [h, bias], "head.fc1/Add", outputs=["score"])
    b.output("score", TensorProto.FLOAT, [B, 1])

    model = b.model(
        "Two towers (user 32 -> 64x3, item 48 -> 64x3), concatenated, MLP head -> score."
    )
    rng = np.random.default_rng(103)
    inputs = {
        "user": rng.standard_normal((B, D_USER)).astype(np.float32),
        "item": rng.standard_normal((B, D_ITEM)).astype(np.float32),
    }
    return model, inputs


# ---------------------------------------------------------------------------------------
# 4. Small CNN with batch-norm
# ---------------------------------------------------------------------------------------


def build_cnn():
    B, C_IN, HW, C1, C2, N_CLS = 8, 3, 16, 8, 16, 10
    b = Builder("cnn", seed=4)
    image = b.input("image", TensorProto.FLOAT, [B, C_IN, HW, HW])

    def conv_bn_relu(x, prefix, c_in, c_out):
        fan_in = c_in * 3 * 3
        w = b.normal(f"{prefix}.conv.weight", (c_out, c_in, 3, 3), np.sqrt(2.0 / fan_in))
        bias = b.normal(f"{prefix}.conv.bias", (c_out,), 0.05)
        x = b.node(
            "Conv", [x, w, bias], f"{prefix}.conv/Conv",
            kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1], dilations=[1, 1],
            group=1,
        )
        gamma = b.param(f"{prefix}.bn.weight", 1.0 + 0.1 * b.rng.standard_normal(c_out))
        beta = b.normal(f"{prefix}.bn.bias", (c_out,), 0.05)
        mean = b.normal(f"{prefix}.bn.running_mean", (c_out,), 0.1)
        var = b.uniform(f"{prefix}.bn.running_var", (c_out,), 0.5, 2.0)
        x = b.node(
            "BatchNormalization", [x, gamma, beta, mean, var],
            f"{prefix}.bn/BatchNormalization", epsilon=1e-5, momentum=0.9,
        )
        return b.node("Relu", [x], f"{prefix}.relu/Relu")

    x = conv_bn_relu(image, "block1", C_IN, C1)  # [B,8,16,16]
    x = b.node(
        "MaxPool", [x], "pool1/MaxPool", kernel_shape=[2, 2], strides=[2, 2],
        pads=[0, 0, 0, 0],
    )  # [B,8,8,8]
    x = conv_bn_relu(x, "block2", C1, C2)  # [B,16,8,8]
    x = b.node("GlobalAveragePool", [x], "gap/GlobalAveragePool")  # [B,16,1,1]
    x = b.node("Flatten", [x], "flatten/Flatten", axis=1)  # [B,16]
    w = b.normal("fc.weight", (N_CLS, C2), np.sqrt(1.0 / C2))
    bias = b.normal("fc.bias", (N_CLS,), 0.05)
    b.node("Gemm", [x, w, bias], "fc/Gemm", transB=1, outputs=["logits"])
    b.output("logits", TensorProto.FLOAT, [B, N_CLS])

    model = b.model(
        "Small CNN: Conv3x3(3->8)+BN+ReLU, MaxPool2x2, Conv3x3(8->16)+BN+ReLU, GAP, Gemm -> 10."
    )
    rng = np.random.default_rng(104)
    inputs = {"image": rng.standard_normal((B, C_IN, HW, HW)).astype(np.float32)}
    return model, inputs


# ---------------------------------------------------------------------------------------
# Checks, reference outputs and deterministic writing
# ---------------------------------------------------------------------------------------


def ort_session(model_bytes):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    # Reference outputs come from the graph op by op: no fusions, one thread.
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model_bytes, opts, providers=["CPUExecutionProvider"])


def run_ort(sess, inputs):
    names = [o.name for o in sess.get_outputs()]
    values = sess.run(names, inputs)
    return dict(zip(names, values))


def check_model(name, model, inputs):
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    declared = {o.name: o for o in model.graph.output}
    for o in inferred.graph.output:
        assert o == declared[o.name], f"{name}: inferred output {o} != declared"

    sess = ort_session(model.SerializeToString())
    outputs = run_ort(sess, inputs)
    for o in model.graph.output:
        dims = [d.dim_value for d in o.type.tensor_type.shape.dim]
        got = outputs[o.name]
        assert list(got.shape) == dims, f"{name}: {o.name} shape {got.shape} != {dims}"
        assert got.dtype == np.float32, f"{name}: {o.name} dtype {got.dtype}"
        assert np.all(np.isfinite(got)), f"{name}: non-finite output"
    return sess, outputs


def check_causal(sess, inputs):
    """Changing the token at position t must leave logits at positions < t unchanged."""
    base = run_ort(sess, inputs)["logits"]
    tokens = inputs["tokens"].copy()
    t = tokens.shape[1] // 2
    tokens[:, t] = (tokens[:, t] + 1) % 64
    changed = run_ort(sess, {"tokens": tokens})["logits"]
    assert np.array_equal(base[:, :t], changed[:, :t]), "gpt: attention is not causal"
    assert not np.allclose(base[:, t:], changed[:, t:]), "gpt: token change has no effect"


def write_npz(path, arrays):
    """Like np.savez, but with fixed archive timestamps so the bytes are reproducible."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for key in sorted(arrays):
            data = io.BytesIO()
            np.lib.format.write_array(data, np.ascontiguousarray(arrays[key]),
                                      allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3
            info.external_attr = 0o644 << 16
            zf.writestr(info, data.getvalue())
    write_bytes(path, buf.getvalue())


def write_bytes(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def summarize(name, model):
    n_params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    ops = sorted({n.op_type for n in model.graph.node})
    print(f"{name}: {len(model.graph.node)} nodes, {n_params} parameters, ops: {', '.join(ops)}")


BUILDERS = [
    ("mlp", build_mlp),
    ("gpt", build_gpt),
    ("two_tower", build_two_tower),
    ("cnn", build_cnn),
]


def main():
    for name, build in BUILDERS:
        model, inputs = build()
        sess, outputs = check_model(name, model, inputs)
        if name == "gpt":
            check_causal(sess, inputs)
        overlap = set(inputs) & set(outputs)
        assert not overlap, f"{name}: input/output names clash: {overlap}"
        write_bytes(os.path.join(HERE, f"{name}.onnx"), model.SerializeToString())
        write_npz(os.path.join(HERE, f"{name}_io.npz"), {**inputs, **outputs})
        summarize(name, model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
