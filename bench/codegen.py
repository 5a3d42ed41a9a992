#!/usr/bin/env python3
"""Native code (ppcc --target cpu) against onnxruntime and ppcc's interpreter.

Usage (from the repository root, after `cargo build --release -p ppcc`):

    .venv/bin/python bench/codegen.py [--ppcc target/release/ppcc] [--runs 200]

Prints two tables, all numbers measured in this run on this machine:

1. Forward latency at batch 32 of
   - the MLP example (examples/mlp.onnx with its batch made symbolic: the same graph and
     weights, 64 -> 128 -> 128 -> 10), and
   - a GPT-style decoder with the GPT example's dimensions (bench/gen_models.py
     --layers 2 --d-model 32 --heads 4 --seq 16 --vocab 64 --gelu erf: vocab 64, seq 16,
     d 32, 4 heads, 2 blocks; the example itself bakes batch 4 into a Reshape),
   and the CNN example (batch 8, its own fixed batch; forward only),
   for ppcc's native module (one thread), onnxruntime with one intra-op thread, and
   onnxruntime with its default threads (all cores). Median over --runs calls each,
   after warm-up; ppcc's time is measured inside `ppcc eval --repeat` and includes
   converting the inputs into the module's buffers (the weights go in once, as a session
   keeps its initializers).
2. A training step (forward, backward, SGD) at global batch 32 for the same models:
   `ppcc train --target cpu` against `--target interp`, the median step time `ppcc train`
   reports over K steps (the first, warm-up step not counted).

Ratios above 1 mean ppcc is faster.
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np
import onnx
import onnxruntime as ort

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "target", "bench", "codegen")
BATCH = 32


def make_models(py):
    os.makedirs(OUT, exist_ok=True)
    # MLP: the example with a symbolic batch.
    m = onnx.load(os.path.join(ROOT, "examples", "mlp.onnx"))
    for v in list(m.graph.input) + list(m.graph.output):
        v.type.tensor_type.shape.dim[0].dim_param = "N"
    onnx.checker.check_model(m)
    mlp = os.path.join(OUT, "mlp.onnx")
    onnx.save(m, mlp)
    # GPT: the example's dimensions, re-batchable.
    gdir = os.path.join(OUT, "gpt")
    subprocess.run(
        [py, os.path.join(ROOT, "bench", "gen_models.py"), "--out", gdir, "--only", "gpt",
         "--layers", "2", "--d-model", "32", "--heads", "4", "--seq", "16", "--vocab", "64",
         "--gelu", "erf", "--batch", str(BATCH), "--no-check"],
        check=True, stdout=subprocess.DEVNULL)
    gpt = os.path.join(gdir, "gpt24.onnx")
    rng = np.random.default_rng(0)
    inputs = {
        "mlp": (mlp, {"x": rng.standard_normal((BATCH, 64)).astype(np.float32)}),
        "gpt": (gpt, {"tokens": rng.integers(0, 64, (BATCH, 16)).astype(np.int64)}),
        # The CNN example as it is (batch 8 baked in): latency only.
        "cnn": (os.path.join(ROOT, "examples", "cnn.onnx"),
                {"image": rng.standard_normal((8, 3, 16, 16)).astype(np.float32)}),
    }
    for name, (path, arrays) in inputs.items():
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        if sorted(names) != sorted(arrays):
            sys.exit(f"{name}: model inputs {names}, prepared {list(arrays)}")
        np.savez(os.path.join(OUT, f"{name}_in.npz"), **arrays)
    return inputs


def ort_latency(path, arrays, threads, runs):
    so = ort.SessionOptions()
    if threads:
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    for _ in range(20):
        sess.run(None, arrays)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        sess.run(None, arrays)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def ppcc_latency(ppcc, path, name, target, runs):
    out = subprocess.run(
        [ppcc, "eval", path, "--inputs", os.path.join(OUT, f"{name}_in.npz"), "-o",
         os.path.join(OUT, f"{name}_out.npz"), "--target", target, "--repeat", str(runs)],
        check=True, capture_output=True, text=True)
    m = re.search(r"median ([0-9.]+) ms", out.stderr)
    if not m:
        sys.exit(f"no latency in: {out.stderr}")
    return float(m.group(1)) / 1e3


def train_step(ppcc, path, name, target, steps):
    """Median seconds per step as `ppcc train` measures it (first step not counted)."""
    args = [ppcc, "train", path, "--steps", str(1 + steps), "--target", target, "--batch",
            str(BATCH), "--data", "synthetic"]
    if name == "mlp":
        args += ["--loss", "cross-entropy"]
    out = subprocess.run(args, check=True, capture_output=True, text=True)
    m = re.search(r"time per step: mean [0-9.]+ ms, median ([0-9.]+) ms", out.stderr)
    if not m:
        sys.exit(f"no step time in: {out.stderr}")
    return float(m.group(1)) / 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ppcc", default=os.path.join(ROOT, "target", "release", "ppcc"))
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--train-steps", type=int, default=20)
    a = ap.parse_args()
    if not os.path.exists(a.ppcc):
        sys.exit(f"{a.ppcc} not found: cargo build --release -p ppcc")
    models = make_models(sys.executable)
    print(f"forward latency, batch {BATCH}, median of {a.runs} calls "
          f"({os.cpu_count()} cores; ratio = onnxruntime / ppcc, > 1: ppcc faster)")
    print(f"{'model':<6} {'ppcc cpu':>10} {'ort 1 thr':>10} {'ort all':>10} "
          f"{'vs ort 1':>9} {'vs ort all':>10} {'interp':>10}")
    for name, (path, arrays) in models.items():
        ours = ppcc_latency(a.ppcc, path, name, "cpu", a.runs)
        interp = ppcc_latency(a.ppcc, path, name, "interp", max(5, a.runs // 20))
        o1 = ort_latency(path, arrays, 1, a.runs)
        oall = ort_latency(path, arrays, 0, a.runs)
        print(f"{name:<6} {ours*1e3:>8.3f}ms {o1*1e3:>8.3f}ms {oall*1e3:>8.3f}ms "
              f"{o1/ours:>8.2f}x {oall/ours:>9.2f}x {interp*1e3:>8.3f}ms")
    print()
    print(f"training step (forward + backward + SGD), global batch {BATCH}, "
          f"{a.train_steps} steps")
    print(f"{'model':<6} {'ppcc cpu':>10} {'interp':>10} {'speed-up':>9}")
    for name, (path, _) in models.items():
        if name == "cnn":
            continue
        # Enough steps that the difference stands out of the process start-up noise.
        cpu = train_step(a.ppcc, path, name, "cpu", a.train_steps * (10 if name == "mlp" else 1))
        interp = train_step(a.ppcc, path, name, "interp", max(3, a.train_steps // 4))
        print(f"{name:<6} {cpu*1e3:>8.3f}ms {interp*1e3:>8.3f}ms {interp/cpu:>8.2f}x")


if __name__ == "__main__":
    main()
