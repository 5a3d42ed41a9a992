#!/usr/bin/env python3
"""StableHLO fixtures made by JAX itself, for ppcc's StableHLO frontend.

Usage (from the repository root; see tests/stablehlo/README.md for the venv):

    python tests/stablehlo/gen_fixtures.py

For each model (mlp, gpt, cnn, ops) it writes into tests/stablehlo/fixtures/:

    <m>.mlir            jax.jit(f).lower(*args).as_text()            (the pretty form)
    <m>.generic.mlir    ...compiler_ir('stablehlo') in the generic op form
    <m>_params.npz      the trainable arguments of @main, keyed arg<i> (position in @main)
    <m>_io.npz          the data inputs (arg<i>) and JAX's outputs (out0)
    <m>_train.npz       two batches of training data: the inputs (arg<i>) and labels
    <m>.json            JAX's own SGD run: loss before each of 5 steps, at the exported
                        batch (`losses`) and at another batch (`rebatch`: `batch`,
                        `losses`), which ppcc reaches by rebinding the module's batch

Training: plain SGD (w = w - lr*g, no momentum, no weight decay), the loss the mean
softmax cross-entropy over rows (mlp, cnn) or over all tokens (gpt), step k uses batch
k mod 2 of <m>_train.npz (at the other batch b: rows [k mod (R/b)]·b.. of the R rows). Everything is float32, single-threaded XLA CPU, fixed seeds; the
npz files are written with fixed timestamps, so regeneration is byte-identical.
"""

import json
import os
import sys

os.environ.setdefault(
    "XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import io  # noqa: E402
import zipfile  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def write_npz(path, arrays):
    """Like np.savez, but with fixed archive timestamps (as examples/gen_examples.py)."""
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

OUT = os.path.join(HERE, "fixtures")
LR = 0.05
STEPS = 5


def dense(x, w, b):
    return x @ w + b


# ---------------------------------------------------------------- models
def mlp_params(rng):
    return [
        (rng.standard_normal((64, 32)) / 8).astype(np.float32),
        np.zeros(32, np.float32) + 0.01,
        (rng.standard_normal((32, 10)) / np.sqrt(32)).astype(np.float32),
        np.zeros(10, np.float32),
    ]


def mlp(w1, b1, w2, b2, x):
    h = jax.nn.relu(dense(x, w1, b1))
    return dense(h, w2, b2)


def mlp_data(rng, rows):
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    teacher = rng.standard_normal((64, 10)).astype(np.float32)
    labels = np.argmax(x @ teacher, axis=1).astype(np.int32)
    return [x], labels


V, T, D, H = 32, 8, 16, 2


def gpt_params(rng):
    def w(*shape, scale=0.2):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return [
        w(V, D),  # wte
        w(T, D, scale=0.1),  # wpe
        np.ones(D, np.float32), np.zeros(D, np.float32),  # ln1
        w(D, 3 * D), np.zeros(3 * D, np.float32),  # qkv
        w(D, D), np.zeros(D, np.float32),  # proj
        np.ones(D, np.float32), np.zeros(D, np.float32),  # ln2
        w(D, 4 * D), np.zeros(4 * D, np.float32),  # fc
        w(4 * D, D), np.zeros(D, np.float32),  # fc2
        np.ones(D, np.float32), np.zeros(D, np.float32),  # ln_f
        w(D, V),  # lm head
    ]


def layer_norm(x, g, b, eps=1e-5):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * g + b


def gpt(wte, wpe, g1, b1, wqkv, bqkv, wo, bo, g2, b2, wf, bf, wf2, bf2, gf, bff, wlm, tokens):
    bsz, t = tokens.shape
    x = wte[tokens] + wpe
    h = layer_norm(x, g1, b1)
    qkv = dense(h, wqkv, bqkv)
    q, k, v = jnp.split(qkv, 3, axis=-1)
    q = q.reshape(bsz, t, H, D // H)
    k = k.reshape(bsz, t, H, D // H)
    v = v.reshape(bsz, t, H, D // H)
    s = jnp.einsum("bthd,bshd->bhts", q, k) / np.float32(np.sqrt(D // H))
    mask = jnp.tril(jnp.ones((t, t), bool))
    s = jnp.where(mask, s, np.float32(-1e9))
    p = jax.nn.softmax(s, axis=-1)
    a = jnp.einsum("bhts,bshd->bthd", p, v).reshape(bsz, t, D)
    x = x + dense(a, wo, bo)
    h = layer_norm(x, g2, b2)
    x = x + dense(jax.nn.gelu(dense(h, wf, bf), approximate=True), wf2, bf2)
    return layer_norm(x, gf, bff) @ wlm


def gpt_data(rng, rows):
    start = rng.integers(0, V, size=(rows, 1))
    stride = rng.integers(1, 6, size=(rows, 1))
    seq = (start + stride * np.arange(T + 1)[None, :]) % V
    return [seq[:, :T].astype(np.int32)], seq[:, 1:].astype(np.int32)


def cnn_params(rng):
    def w(*shape, fan_in):
        return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

    return [
        w(8, 3, 3, 3, fan_in=27), np.zeros(8, np.float32) + 0.01,
        w(8, 8, 3, 3, fan_in=72), np.zeros(8, np.float32),
        w(8, 10, fan_in=8), np.zeros(10, np.float32),
    ]


def conv(x, w, b):
    y = jax.lax.conv_general_dilated(
        x, w, window_strides=(1, 1), padding=((1, 1), (1, 1)),
        dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return y + b[None, :, None, None]


def cnn(w1, b1, w2, b2, w3, b3, image):
    h = jax.nn.relu(conv(image, w1, b1))
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
    h = jax.nn.relu(conv(h, w2, b2))
    h = jnp.mean(h, axis=(2, 3))
    return dense(h, w3, b3)


def cnn_data(rng, rows):
    x = rng.standard_normal((rows, 3, 8, 8)).astype(np.float32)
    feats = x.reshape(rows, 3, 2, 4, 2, 4).mean(axis=(3, 5)).reshape(rows, 12)
    teacher = rng.standard_normal((12, 10)).astype(np.float32)
    return [x], np.argmax(feats @ teacher, axis=1).astype(np.int32)


def ops_params(rng):
    def w(*shape, fan_in):
        return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)

    return [
        rng.standard_normal(6).astype(np.float32),  # wsel: argmax/argmin pick slice starts
        w(3, 3, 3, 8, fan_in=27),  # HWIO kernel
        w(3, 3, 4, 8, fan_in=36),  # HWIO kernel, 2 feature groups
        w(3, 3, 8, 8, fan_in=72),  # HWIO kernel, input (lhs) dilation
        w(4 + 2 + 4 + 8 + 24, 10, fan_in=42),
    ]


def ops(wsel, k1, k2, k3, w, image):
    """JAX patterns beyond the three models: NHWC/HWIO convolution (feature groups, rhs
    and lhs dilation), interior padding, gathers `x[:, i, j, :]`, `x[:, idx]`, `jnp.take`,
    argmax/argmin (a two-operand reduce), dynamic_slice and dynamic_update_slice with
    starts computed at run time."""
    nhwc = ("NHWC", "HWIO", "NHWC")
    h = jax.lax.conv_general_dilated(image, k1, (1, 1), "SAME", dimension_numbers=nhwc)
    h = jax.nn.relu(h)
    h = jax.lax.conv_general_dilated(h, k2, (1, 1), ((2, 2), (2, 2)), rhs_dilation=(2, 2),
                                     dimension_numbers=nhwc, feature_group_count=2)
    padded = jax.lax.pad(h, np.float32(0), [(0, 0, 0), (0, 0, 1), (0, 0, 0), (0, 0, 0)])
    picked = h[:, np.array([0, 2, 5]), np.array([1, 1, 7]), :]
    up = jax.lax.conv_general_dilated(h, k3, (1, 1), ((1, 1), (1, 1)), lhs_dilation=(2, 2),
                                      dimension_numbers=nhwc)
    feat = jnp.mean(padded, axis=(1, 2)) + jnp.mean(up, axis=(1, 2))
    a = feat[:, np.array([3, 0, 0, 7])]
    b = jnp.take(feat, np.array([1, 5]), axis=1)
    d = jax.lax.dynamic_slice_in_dim(feat, jnp.argmax(wsel), 4, axis=1)
    e = jax.lax.dynamic_update_slice_in_dim(feat, d * 2, jnp.argmin(wsel), axis=1)
    z = jnp.concatenate([a, b, d, e, picked.reshape(picked.shape[0], -1)], axis=1)
    return z @ w + wsel[0]


def ops_data(rng, rows):
    x = rng.standard_normal((rows, 8, 8, 3)).astype(np.float32)
    feats = x.reshape(rows, 2, 4, 2, 4, 3).mean(axis=(2, 4)).reshape(rows, 12)
    teacher = rng.standard_normal((12, 10)).astype(np.float32)
    return [x], np.argmax(feats @ teacher, axis=1).astype(np.int32)


MODELS = [
    # name, forward, params, data, micro-batch, another micro-batch (rebinding)
    ("mlp", mlp, mlp_params, mlp_data, 8, 4),
    ("gpt", gpt, gpt_params, gpt_data, 2, 4),
    ("cnn", cnn, cnn_params, cnn_data, 4, 2),
    ("ops", ops, ops_params, ops_data, 6, 4),
]


# ---------------------------------------------------------------- training
def cross_entropy(logits, labels):
    z = logits.reshape(-1, logits.shape[-1])
    y = labels.reshape(-1)
    lse = jax.nn.logsumexp(z, axis=-1)
    picked = jnp.take_along_axis(z, y[:, None], axis=-1)[:, 0]
    return jnp.mean(lse - picked)


def train(fwd, params, inputs, labels, batch, chunks=2):
    n = len(params)

    def loss_of(ps, ins, y):
        return cross_entropy(fwd(*ps, *ins), y)

    step = jax.jit(jax.value_and_grad(loss_of))
    ps = [jnp.asarray(p) for p in params]
    losses = []
    for k in range(STEPS):
        r = slice((k % chunks) * batch, (k % chunks + 1) * batch)
        loss, grads = step(ps, [jnp.asarray(i[r]) for i in inputs], jnp.asarray(labels[r]))
        losses.append(float(loss))
        ps = [p - np.float32(LR) * g for p, g in zip(ps, grads)]
    assert len(ps) == n
    return losses


def main():
    os.makedirs(OUT, exist_ok=True)
    for i, (name, fwd, make_params, make_data, batch, rebatch) in enumerate(MODELS):
        rng = np.random.default_rng(1000 + i)
        params = make_params(rng)
        inputs, labels = make_data(rng, 2 * batch)
        first = [x[:batch] for x in inputs]
        lowered = jax.jit(fwd).lower(*params, *first)
        pretty = lowered.as_text()
        generic = lowered.compiler_ir("stablehlo").operation.get_asm(print_generic_op_form=True)
        write_bytes(os.path.join(OUT, f"{name}.mlir"), pretty.encode())
        write_bytes(os.path.join(OUT, f"{name}.generic.mlir"), generic.encode())
        np_ = len(params)
        write_npz(os.path.join(OUT, f"{name}_params.npz"),
                  {f"arg{j}": p for j, p in enumerate(params)})
        out = np.asarray(jax.jit(fwd)(*params, *first))
        io_ = {f"arg{np_ + j}": x for j, x in enumerate(first)}
        io_["out0"] = out
        write_npz(os.path.join(OUT, f"{name}_io.npz"), io_)
        train_arrays = {f"arg{np_ + j}": x for j, x in enumerate(inputs)}
        train_arrays["labels"] = labels
        write_npz(os.path.join(OUT, f"{name}_train.npz"), train_arrays)
        losses = train(fwd, params, inputs, labels, batch)
        rows = 2 * batch
        re_losses = train(fwd, params, inputs, labels, rebatch, rows // rebatch)
        meta = {
            "model": name,
            "params": [f"arg{j}" for j in range(np_)],
            "inputs": [f"arg{np_ + j}" for j in range(len(inputs))],
            "batch": batch,
            "optimizer": {"name": "sgd", "lr": LR, "momentum": 0.0, "weight_decay": 0.0},
            "loss": "cross-entropy",
            "steps": STEPS,
            "losses": losses,
            "rebatch": {"batch": rebatch, "losses": re_losses},
        }
        write_bytes(os.path.join(OUT, f"{name}.json"),
                    (json.dumps(meta, indent=2, sort_keys=True) + "\n").encode())
        print(f"{name}: losses {' '.join(f'{l:.6f}' for l in losses)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
