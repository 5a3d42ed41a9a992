#!/usr/bin/env python3
"""Generate small, learnable training sets for ppcc's example models.

Usage (from the repository root, with numpy and onnx installed):

    python examples/gen_train_data.py

Writes, next to this script:

    mlp_train.npz        x      f32 [16, 64]           labels i64 [16]        (classes 0..9)
    gpt_train.npz        tokens i64 [8, 16]  (< 64)    labels i64 [8, 16]     (next token, < 64)
    two_tower_train.npz  user   f32 [16, 32]           labels f32 [16, 1]     (regression target)
                         item   f32 [16, 48]
    cnn_train.npz        image  f32 [16, 3, 16, 16]    labels i64 [16]        (classes 0..9)

Each file holds the model inputs under the graph input names and `labels`, with the rows
on axis 0. Every file holds exactly two global batches of the model's static batch
(mlp 8, gpt 4, two_tower 8, cnn 8). A training step k uses batch k mod 2, i.e. rows
[(k mod 2)·B, (k mod 2 + 1)·B): step 0 rows [0:B], step 1 rows [B:2B], step 2 rows [0:B], ...
(`ppcc train --data`: "steps take consecutive batches, wrapping around").

The labels come from fixed random "teachers", so the tasks are learnable:
- mlp: argmax of a random linear map of x.
- gpt: each row is an arithmetic progression mod 64 (random start, random stride 1..7);
  labels are the tokens shifted by one (the next element of the progression).
- two_tower: a scaled dot product of random projections of user and item, plus small noise.
- cnn: argmax of a random linear map of the per-channel, per-quadrant image means.

The output is byte-for-byte deterministic (fixed seeds; npz written with stored zip entries
and fixed timestamps, the same writer as gen_examples.py).
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_examples import write_npz  # noqa: E402  (deterministic npz writer)

N_BATCHES = 2  # global batches per file


def mlp_data():
    B, D_IN, N_CLS = 8, 64, 10
    rows = N_BATCHES * B
    rng = np.random.default_rng(201)
    x = rng.standard_normal((rows, D_IN)).astype(np.float32)
    teacher = rng.standard_normal((D_IN, N_CLS))
    labels = np.argmax(x.astype(np.float64) @ teacher, axis=1).astype(np.int64)
    return {"x": x, "labels": labels}


def gpt_data():
    B, T, V = 4, 16, 64
    rows = N_BATCHES * B
    rng = np.random.default_rng(202)
    start = rng.integers(0, V, size=(rows, 1), dtype=np.int64)
    stride = rng.integers(1, 8, size=(rows, 1), dtype=np.int64)
    seq = (start + stride * np.arange(T + 1, dtype=np.int64)[None, :]) % V  # [rows, T+1]
    tokens = np.ascontiguousarray(seq[:, :T]).astype(np.int64)
    labels = np.ascontiguousarray(seq[:, 1:]).astype(np.int64)
    return {"tokens": tokens, "labels": labels}


def two_tower_data():
    B, D_USER, D_ITEM, K = 8, 32, 48, 8
    rows = N_BATCHES * B
    rng = np.random.default_rng(203)
    user = rng.standard_normal((rows, D_USER)).astype(np.float32)
    item = rng.standard_normal((rows, D_ITEM)).astype(np.float32)
    pu = rng.standard_normal((D_USER, K)) / np.sqrt(D_USER)
    pi = rng.standard_normal((D_ITEM, K)) / np.sqrt(D_ITEM)
    noise = 0.1 * rng.standard_normal((rows, 1))
    score = np.sum((user @ pu) * (item @ pi), axis=1, keepdims=True) / np.sqrt(K) + noise
    return {"user": user, "item": item, "labels": score.astype(np.float32)}


def cnn_data():
    B, C_IN, HW, N_CLS = 8, 3, 16, 10
    rows = N_BATCHES * B
    rng = np.random.default_rng(204)
    image = rng.standard_normal((rows, C_IN, HW, HW)).astype(np.float32)
    h = HW // 2
    quads = image.astype(np.float64).reshape(rows, C_IN, 2, h, 2, h).mean(axis=(3, 5))
    feats = quads.reshape(rows, C_IN * 4)
    teacher = rng.standard_normal((C_IN * 4, N_CLS))
    labels = np.argmax(feats @ teacher, axis=1).astype(np.int64)
    return {"image": image, "labels": labels}


GENERATORS = [
    ("mlp", mlp_data),
    ("gpt", gpt_data),
    ("two_tower", two_tower_data),
    ("cnn", cnn_data),
]


def main():
    for name, gen in GENERATORS:
        arrays = gen()
        rows = {a.shape[0] for a in arrays.values()}
        assert len(rows) == 1, f"{name}: inconsistent row counts {rows}"
        write_npz(os.path.join(HERE, f"{name}_train.npz"), arrays)
        desc = ", ".join(f"{k} {v.dtype} {list(v.shape)}" for k, v in sorted(arrays.items()))
        print(f"{name}_train.npz: {desc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
