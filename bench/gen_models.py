#!/usr/bin/env python3
"""Generate the ONNX models for ppcc's planner benchmark.

Usage (from the repository root):

    .venv/bin/python bench/gen_models.py --out target/bench/models

Writes into --out:

    gpt24.onnx          GPT-style decoder (24 blocks by default, ~35 M parameters)
    two_tower_big.onnx  two-tower recommendation MLP (~28 M parameters)
    mmt.onnx            multi-modal transformer: encoder branches of different depth and
                        sequence length (text tokens, image patches, audio frames), pooled,
                        concatenated and classified (--mmt-branches)

The models use opset 17 (default domain; opset 20 with --gelu op), IR version 8, float32 weights drawn from a
seeded normal distribution, and a symbolic batch dimension "N" on every graph input and
output. No constant in any graph depends on the batch size (every Reshape target uses 0
or -1 on the batch axis), so ppcc can re-batch them (`ppcc train --batch 16
--microbatches 4` runs them with 4 rows).

Each model is checked with onnx.checker and run once through onnxruntime at the default
batch and at --alt-batch rows. With --ppcc BIN the script also runs `BIN train` on each
model for one step and prints the wall time.

The script is deterministic: the same options give byte-identical files.
"""

import argparse
import os
import subprocess
import sys
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
PRODUCER = "ppcc-bench"
PRODUCER_VERSION = "1"
BATCH_DIM = "N"


# ---------------------------------------------------------------------------------------
# Graph builder
# ---------------------------------------------------------------------------------------


class Graph:
    """Collects nodes, initializers and graph inputs/outputs for one model."""

    def __init__(self, name, seed, std):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.std = std
        self.nodes = []
        self.inits = []
        self.inputs = []
        self.outputs = []
        self.n_params = 0
        self.seen = set()
        self.opset = OPSET

    def _fresh(self, name):
        if name in self.seen:
            raise ValueError(f"duplicate value name {name!r}")
        self.seen.add(name)
        return name

    def add_input(self, name, dtype, shape):
        self.inputs.append(helper.make_tensor_value_info(self._fresh(name), dtype, shape))
        return name

    def add_output(self, name, dtype, shape):
        self.outputs.append(helper.make_tensor_value_info(name, dtype, shape))

    def weight(self, name, shape, std=None, fill=None):
        """A trainable float32 initializer: N(0, std) unless `fill` gives a constant."""
        if fill is None:
            std = self.std if std is None else std
            data = std * self.rng.standard_normal(shape, dtype=np.float32)
        else:
            data = np.full(shape, fill, dtype=np.float32)
        data = np.ascontiguousarray(data, dtype=np.float32)
        self.inits.append(numpy_helper.from_array(data, name=self._fresh(name)))
        self.n_params += data.size
        return name

    def op(self, op_type, inputs, name, **attrs):
        """One node with a single output named like the node."""
        self.nodes.append(
            helper.make_node(op_type, inputs, [self._fresh(name)], name=name, **attrs)
        )
        return name

    def constant(self, name, array):
        """A `Constant` node (not a trainable parameter)."""
        tensor = numpy_helper.from_array(np.asarray(array), name=name)
        return self.op("Constant", [], name, value=tensor)

    def to_model(self, doc):
        graph = helper.make_graph(
            self.nodes, self.name, self.inputs, self.outputs, initializer=self.inits
        )
        return helper.make_model(
            graph,
            producer_name=PRODUCER,
            producer_version=PRODUCER_VERSION,
            opset_imports=[helper.make_opsetid("", self.opset)],
            ir_version=IR_VERSION,
            doc_string=doc,
        )


# ---------------------------------------------------------------------------------------
# GPT-style decoder
# ---------------------------------------------------------------------------------------


class Transformer:
    """Transformer pieces on one Graph: layer norm, linear, GELU and a pre-norm block
    (multi-head attention + MLP, residual). The constants they share are made once, in
    this order: [causal mask], attention scale, head split/merge shapes, GELU constants."""

    def __init__(self, g, a, d_model, heads, causal_seq=None):
        if d_model % heads:
            sys.exit(f"d_model {d_model} is not a multiple of heads {heads}")
        self.g, self.a, self.D, self.H = g, a, d_model, heads
        self.DH = d_model // heads
        self.FF = a.ff_mult * d_model
        self.mask = None
        if causal_seq is not None:
            T = causal_seq
            self.mask = g.constant(
                "const/causal_mask", np.triu(np.full((T, T), -1e9, dtype=np.float32), k=1)
            )  # [T,T] additive, broadcast over [N,H,T,T]
        self.scale = g.constant("const/attn_scale",
                                np.array(1.0 / np.sqrt(self.DH), dtype=np.float32))
        self.split_shape = g.constant("const/split_heads_shape",
                                      np.array([0, 0, heads, self.DH], np.int64))
        self.merge_shape = g.constant("const/merge_heads_shape", np.array([0, 0, -1], np.int64))
        if a.gelu == "tanh":
            self.c_half = g.constant("const/gelu_half", np.array(0.5, np.float32))
            self.c_one = g.constant("const/gelu_one", np.array(1.0, np.float32))
            self.c_cube = g.constant("const/gelu_0044715", np.array(0.044715, np.float32))
            self.c_k = g.constant("const/gelu_sqrt_2_over_pi",
                                  np.array(np.sqrt(2 / np.pi), np.float32))
        elif a.gelu == "erf":
            self.c_half = g.constant("const/gelu_half", np.array(0.5, np.float32))
            self.c_one = g.constant("const/gelu_one", np.array(1.0, np.float32))
            self.c_sqrt2 = g.constant("const/gelu_sqrt2", np.array(np.sqrt(2.0), np.float32))

    def layer_norm(self, x, p):
        g = self.g
        gamma = g.weight(f"{p}.weight", (self.D,), fill=1.0)
        beta = g.weight(f"{p}.bias", (self.D,), fill=0.0)
        return g.op("LayerNormalization", [x, gamma, beta], f"{p}/LayerNorm",
                    axis=-1, epsilon=1e-5)

    def linear(self, x, p, n_in, n_out):
        g = self.g
        w = g.weight(f"{p}.weight", (n_in, n_out))
        bias = g.weight(f"{p}.bias", (n_out,))
        y = g.op("MatMul", [x, w], f"{p}/MatMul")
        return g.op("Add", [y, bias], f"{p}/Add")

    def gelu(self, x, p):
        g = self.g
        if self.a.gelu == "op":  # the model is written at opset 20 then
            return g.op("Gelu", [x], f"{p}/Gelu", approximate="tanh")
        if self.a.gelu == "erf":
            t = g.op("Div", [x, self.c_sqrt2], f"{p}/Div")
            t = g.op("Erf", [t], f"{p}/Erf")
        else:  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            x2 = g.op("Mul", [x, x], f"{p}/Mul_sq")
            x3 = g.op("Mul", [x2, x], f"{p}/Mul_cube")
            t = g.op("Mul", [x3, self.c_cube], f"{p}/Mul_coef")
            t = g.op("Add", [x, t], f"{p}/Add_inner")
            t = g.op("Mul", [t, self.c_k], f"{p}/Mul_k")
            t = g.op("Tanh", [t], f"{p}/Tanh")
        t = g.op("Add", [t, self.c_one], f"{p}/Add_one")
        t = g.op("Mul", [x, t], f"{p}/Mul_x")
        return g.op("Mul", [t, self.c_half], f"{p}/Mul_half")

    def block(self, x, p):
        """One pre-norm block on x [N,T,D] (causal if the mask was made)."""
        g, D = self.g, self.D
        h = self.layer_norm(x, f"{p}.ln_1")
        q = self.linear(h, f"{p}.attn.q_proj", D, D)
        k = self.linear(h, f"{p}.attn.k_proj", D, D)
        v = self.linear(h, f"{p}.attn.v_proj", D, D)
        q = g.op("Reshape", [q, self.split_shape], f"{p}.attn/Reshape_q")  # [N,T,H,DH]
        k = g.op("Reshape", [k, self.split_shape], f"{p}.attn/Reshape_k")
        v = g.op("Reshape", [v, self.split_shape], f"{p}.attn/Reshape_v")
        q = g.op("Transpose", [q], f"{p}.attn/Transpose_q", perm=[0, 2, 1, 3])  # [N,H,T,DH]
        k = g.op("Transpose", [k], f"{p}.attn/Transpose_k", perm=[0, 2, 3, 1])  # [N,H,DH,T]
        v = g.op("Transpose", [v], f"{p}.attn/Transpose_v", perm=[0, 2, 1, 3])  # [N,H,T,DH]
        s = g.op("MatMul", [q, k], f"{p}.attn/MatMul_qk")  # [N,H,T,T]
        s = g.op("Mul", [s, self.scale], f"{p}.attn/Mul_scale")
        if self.mask is not None:
            s = g.op("Add", [s, self.mask], f"{p}.attn/Add_mask")
        s = g.op("Softmax", [s], f"{p}.attn/Softmax", axis=-1)
        o = g.op("MatMul", [s, v], f"{p}.attn/MatMul_av")  # [N,H,T,DH]
        o = g.op("Transpose", [o], f"{p}.attn/Transpose_merge", perm=[0, 2, 1, 3])
        o = g.op("Reshape", [o, self.merge_shape], f"{p}.attn/Reshape_merge")  # [N,T,D]
        o = self.linear(o, f"{p}.attn.o_proj", D, D)
        x = g.op("Add", [x, o], f"{p}/Add_attn_residual")

        h = self.layer_norm(x, f"{p}.ln_2")
        h = self.linear(h, f"{p}.mlp.fc_in", D, self.FF)
        h = self.gelu(h, f"{p}.mlp.gelu")
        h = self.linear(h, f"{p}.mlp.fc_out", self.FF, D)
        return g.op("Add", [x, h], f"{p}/Add_mlp_residual")


def build_gpt(a):
    D, H, T, V = a.d_model, a.heads, a.seq, a.vocab
    g = Graph("gpt", a.seed, a.std)
    if a.gelu == "op":
        g.opset = 20  # Gelu is new in opset 20
    tokens = g.add_input("tokens", TensorProto.INT64, [BATCH_DIM, T])

    # Constants shared by all blocks. None of them mentions the batch size.
    pos_idx = g.constant("const/position_ids", np.arange(T, dtype=np.int64))
    tf = Transformer(g, a, D, H, causal_seq=T)

    wte = g.weight("wte.weight", (V, D))
    wpe = g.weight("wpe.weight", (T, D))
    tok = g.op("Gather", [wte, tokens], "wte/Gather", axis=0)  # [N,T,D]
    pos = g.op("Gather", [wpe, pos_idx], "wpe/Gather", axis=0)  # [T,D]
    x = g.op("Add", [tok, pos], "embed/Add")

    for i in range(a.layers):
        x = tf.block(x, f"h.{i}")

    x = tf.layer_norm(x, "ln_f")
    if a.tie_embeddings:
        # GPT-2's LM head reads the token embedding (as torch exports it: MatMul by the
        # transposed table).
        w_head = g.op("Transpose", [wte], "lm_head/Transpose", perm=[1, 0])
    else:
        w_head = g.weight("lm_head.weight", (D, V))
    g.nodes.append(helper.make_node("MatMul", [x, w_head], ["logits"], name="lm_head/MatMul"))
    g.add_output("logits", TensorProto.FLOAT, [BATCH_DIM, T, V])

    doc = (f"GPT-style decoder: {a.layers} blocks, d_model {D}, {H} heads, seq {T}, "
           f"vocab {V}, MLP {a.ff_mult}x with {a.gelu} GELU, causal additive mask"
           f"{', LM head tied to the token embedding' if a.tie_embeddings else ''}.")

    def inputs(n, rng):
        return {"tokens": rng.integers(0, V, size=(n, T), dtype=np.int64)}

    return g, g.to_model(doc), inputs


# ---------------------------------------------------------------------------------------
# Multi-modal transformer (several encoder branches)
# ---------------------------------------------------------------------------------------


def build_mmt(a):
    """Encoder branches of different depths and sequence lengths (text tokens, image
    patches, audio frames), each mean-pooled, concatenated and classified: the shape of
    GraphPipe's multi-modal transformer."""
    D, H = a.mmt_d_model, a.mmt_heads
    g = Graph("mmt", a.seed + 2, a.std)
    if a.gelu == "op":
        g.opset = 20
    tf = Transformer(g, a, D, H)
    branches = []
    for spec in a.mmt_branches.split(","):
        name, kind, depth, seq, width = spec.split(":")
        depth, seq, width = int(depth), int(seq), int(width)
        if kind == "tokens":
            x_in = g.add_input(name, TensorProto.INT64, [BATCH_DIM, seq])
            table = g.weight(f"{name}.embed.weight", (width, D))
            x = g.op("Gather", [table, x_in], f"{name}.embed/Gather", axis=0)
        else:
            x_in = g.add_input(name, TensorProto.FLOAT, [BATCH_DIM, seq, width])
            x = tf.linear(x_in, f"{name}.embed", width, D)
        pos = g.weight(f"{name}.pos.weight", (seq, D))
        x = g.op("Add", [x, pos], f"{name}.pos/Add")
        for i in range(depth):
            x = tf.block(x, f"{name}.h.{i}")
        x = tf.layer_norm(x, f"{name}.ln_f")
        x = g.op("ReduceMean", [x], f"{name}.pool/ReduceMean", axes=[1], keepdims=0)  # [N,D]
        branches.append((name, kind, depth, seq, width, x))
    h = g.op("Concat", [b[-1] for b in branches], "fuse/Concat", axis=1)
    h = g.op("Relu", [tf.linear(h, "fuse.fc", D * len(branches), D)], "fuse.fc/Relu")
    w = g.weight("classifier.weight", (D, a.mmt_classes))
    g.nodes.append(helper.make_node("MatMul", [h, w], ["logits"], name="classifier/MatMul"))
    g.add_output("logits", TensorProto.FLOAT, [BATCH_DIM, a.mmt_classes])
    doc = (f"Multi-modal transformer: d_model {D}, {H} heads, branches "
           + ", ".join(f"{n} ({k}, {d} blocks, seq {s})" for n, k, d, s, _, _ in branches)
           + f"; mean-pooled, concatenated, {a.mmt_classes} classes.")

    def inputs(n, rng):
        out = {}
        for name, kind, _, seq, width, _ in branches:
            if kind == "tokens":
                out[name] = rng.integers(0, width, size=(n, seq), dtype=np.int64)
            else:
                out[name] = rng.standard_normal((n, seq, width), dtype=np.float32)
        return out

    return g, g.to_model(doc), inputs


# ---------------------------------------------------------------------------------------
# Two-tower model
# ---------------------------------------------------------------------------------------


def build_two_tower(a):
    g = Graph("two_tower_big", a.seed + 1, a.std)
    user = g.add_input("user", TensorProto.FLOAT, [BATCH_DIM, a.user_dim])
    item = g.add_input("item", TensorProto.FLOAT, [BATCH_DIM, a.item_dim])

    def gemm(x, p, n_in, n_out):
        # Weight stored [out, in] with transB=1, the way PyTorch exports nn.Linear.
        w = g.weight(f"{p}.weight", (n_out, n_in))
        bias = g.weight(f"{p}.bias", (n_out,))
        return g.op("Gemm", [x, w, bias], f"{p}/Gemm", alpha=1.0, beta=1.0, transB=1)

    def mlp(x, p, n_in, width, depth):
        for i in range(depth):
            x = gemm(x, f"{p}.fc{i}", n_in if i == 0 else width, width)
            x = g.op("Relu", [x], f"{p}.fc{i}/Relu")
        return x

    u = mlp(user, "user_tower", a.user_dim, a.user_width, a.user_layers)
    v = mlp(item, "item_tower", a.item_dim, a.item_width, a.item_layers)
    h = g.op("Concat", [u, v], "head/Concat", axis=1)
    h = mlp(h, "head", a.user_width + a.item_width, a.head_width, a.head_layers)
    w = g.weight("head.out.weight", (1, a.head_width))
    bias = g.weight("head.out.bias", (1,))
    g.nodes.append(helper.make_node("Gemm", [h, w, bias], ["score"], name="head.out/Gemm",
                                    alpha=1.0, beta=1.0, transB=1))
    g.add_output("score", TensorProto.FLOAT, [BATCH_DIM, 1])

    doc = (f"Two towers: user {a.user_dim} -> {a.user_layers}x{a.user_width}, item "
           f"{a.item_dim} -> {a.item_layers}x{a.item_width}, Concat, head "
           f"{a.head_layers}x{a.head_width} -> 1. Gemm+Relu throughout.")

    def inputs(n, rng):
        return {
            "user": rng.standard_normal((n, a.user_dim), dtype=np.float32),
            "item": rng.standard_normal((n, a.item_dim), dtype=np.float32),
        }

    return g, g.to_model(doc), inputs


# ---------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------


def check(name, model, path, make_inputs, batches, seed):
    import onnxruntime as ort

    onnx.checker.check_model(path, full_check=True)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    out_names = [o.name for o in sess.get_outputs()]
    declared = {
        o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]
        for o in model.graph.output
    }
    rng = np.random.default_rng(seed + 1000)
    for n in batches:
        t0 = time.perf_counter()
        outs = sess.run(out_names, make_inputs(n, rng))
        dt = time.perf_counter() - t0
        for oname, val in zip(out_names, outs):
            want = [n if d == BATCH_DIM else d for d in declared[oname]]
            assert list(val.shape) == want, f"{name}: {oname} {val.shape} != {want}"
            assert np.all(np.isfinite(val)), f"{name}: {oname} has non-finite values"
        shapes = ", ".join(f"{o}{list(v.shape)}" for o, v in zip(out_names, outs))
        print(f"  onnxruntime batch {n}: ok ({shapes}, {dt:.2f} s)")


def run_ppcc(ppcc, path, extra, batch, microbatches):
    cmd = [ppcc, "train", path, "--steps", "1", "--batch", str(batch),
           "--microbatches", str(microbatches), "--data", "synthetic", *extra]
    print("  $ " + " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    lines = [l for l in res.stdout.splitlines() if l.startswith("step ")]
    if res.returncode != 0 or not lines:
        print(f"  ppcc FAILED (rc {res.returncode}, {dt:.1f} s)\n{res.stdout}{res.stderr}")
        return False
    print(f"  {lines[0]}   ({dt:.1f} s)")
    return True


def human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--out", default="target/bench/models", help="output directory")
    ap.add_argument("--seed", type=int, default=0, help="weight seed")
    ap.add_argument("--std", type=float, default=0.02, help="std of the random weights")
    ap.add_argument("--only", choices=["gpt", "two_tower", "mmt"], help="write just one model")
    gp = ap.add_argument_group("gpt24.onnx")
    gp.add_argument("--layers", type=int, default=24)
    gp.add_argument("--d-model", type=int, default=320)
    gp.add_argument("--heads", type=int, default=5)
    gp.add_argument("--seq", type=int, default=128)
    gp.add_argument("--vocab", type=int, default=8192)
    gp.add_argument("--ff-mult", type=int, default=4, help="MLP width = ff-mult * d-model")
    gp.add_argument("--tie-embeddings", action="store_true",
                    help="the LM head reads the token embedding table (GPT-2's tied weights)")
    gp.add_argument("--gelu", choices=["tanh", "erf", "op"], default="tanh",
                    help="tanh/erf: GELU built from primitive ops (opset 17); op: the "
                         "Gelu op with approximate=tanh (the model is then opset 20)")
    gp.add_argument("--batch", type=int, default=8,
                    help="default batch, used for the onnxruntime check (the graph's "
                         "batch dimension is symbolic)")
    tt = ap.add_argument_group("two_tower_big.onnx")
    tt.add_argument("--user-dim", type=int, default=256)
    tt.add_argument("--item-dim", type=int, default=512)
    tt.add_argument("--user-layers", type=int, default=6)
    tt.add_argument("--user-width", type=int, default=1024)
    tt.add_argument("--item-layers", type=int, default=8)
    tt.add_argument("--item-width", type=int, default=1536)
    tt.add_argument("--head-layers", type=int, default=3)
    tt.add_argument("--head-width", type=int, default=1024)
    mm = ap.add_argument_group("mmt.onnx")
    mm.add_argument("--mmt-d-model", type=int, default=512)
    mm.add_argument("--mmt-heads", type=int, default=8)
    mm.add_argument("--mmt-branches", default="text:tokens:8:128:30522,image:patches:6:196:768,audio:frames:3:100:128",
                    help="NAME:tokens|patches|frames:DEPTH:SEQ:VOCAB_OR_FEATURES, comma-separated")
    mm.add_argument("--mmt-classes", type=int, default=1000)
    ck = ap.add_argument_group("checks")
    ck.add_argument("--alt-batch", type=int, default=2,
                    help="second batch size for the onnxruntime check")
    ck.add_argument("--no-check", action="store_true", help="skip checker and onnxruntime")
    ck.add_argument("--ppcc", metavar="BIN",
                    help="also run `BIN train MODEL --steps 1` on each model")
    ck.add_argument("--ppcc-batch", type=int, default=4)
    ck.add_argument("--ppcc-microbatches", type=int, default=2)
    a = ap.parse_args()

    os.makedirs(a.out, exist_ok=True)
    builders = [("gpt24", build_gpt, []), ("two_tower_big", build_two_tower, ["--loss", "mse"]),
                ("mmt", build_mmt, [])]
    ok = True
    for name, build, ppcc_extra in builders:
        if a.only and not name.startswith(a.only):
            continue
        g, model, make_inputs = build(a)
        path = os.path.join(a.out, f"{name}.onnx")
        with open(path, "wb") as f:
            f.write(model.SerializeToString())
        size = os.path.getsize(path)
        print(f"{path}: {g.n_params:,} parameters, {len(g.nodes)} nodes, "
              f"{human(size)} ({size:,} bytes)")
        print(f"  {model.doc_string}")
        if not a.no_check:
            check(name, model, path, make_inputs, [a.batch, a.alt_batch], a.seed)
        if a.ppcc:
            ok &= run_ppcc(a.ppcc, path, ppcc_extra, a.ppcc_batch, a.ppcc_microbatches)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
