#!/usr/bin/env python3
"""Runtime benchmark: a 2-stage pipeline against 1 stage on this machine, and measured
against predicted time per step with the `host` profile.

Compiles the same model with the same global batch and micro-batches into a 1-stage and a
2-stage plan (`--device-profile host`, native code: `--target cpu`, the default), trains
each for a few steps with `ppcc run` (one thread per stage), and prints one table:
measured seconds per step, throughput ratio, predicted seconds per step and the prediction
error. With native code the host profile partitions by op times measured in generated code
and predicts from each stage's actions timed at compile time. Run it on an otherwise idle
machine: the two stages need a core each. `--target interp` measures the interpreter.

    .venv/bin/python bench/gen_models.py --out target/bench/rt --only gpt --layers 4 \\
        --d-model 128 --heads 4 --seq 32 --vocab 512 --no-check          # once
    cargo build --release -p ppcc
    .venv/bin/python bench/runtime.py [--steps 6] [--microbatches 16] [--batch 64]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sh(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return p


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ppcc", default=os.path.join(ROOT, "target", "release", "ppcc"))
    ap.add_argument("--model", default=os.path.join(ROOT, "target", "bench", "rt", "gpt24.onnx"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=16)
    ap.add_argument("--schedule", default="1f1b")
    ap.add_argument("--loss", default="auto", help="the loss to compile (ppcc --loss)")
    ap.add_argument("--target", default="cpu", choices=["cpu", "interp"])
    ap.add_argument("--repeats", type=int, default=3,
                    help="compile+run pairs of each plan, alternating (medians are reported)")
    args = ap.parse_args()
    for path in (args.ppcc, args.model):
        if not os.path.exists(path):
            sys.exit(f"{path} not found (see the usage at the top of this script)")
    rows = []
    # Compile and run each plan back to back, alternating, several times: the prediction
    # (op times measured at compile time) and the measurement then see the machine in the
    # same state (this VM's speed drifts by ±20% over minutes).
    pairs = {1: [], 2: []}
    last = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for stages in (1, 2):
                out = os.path.join(tmp, f"p{stages}-{rep}")
                sh([args.ppcc, args.model, "-o", out, "--stages", str(stages), "--batch", str(args.batch),
                    "--microbatches", str(args.microbatches), "--schedule", args.schedule,
                    "--loss", args.loss, "--device-profile", "host", "--target", args.target])
                with open(os.path.join(out, "plan.json")) as f:
                    pred = json.load(f)["prediction"]
                p = sh([args.ppcc, "run", out, "--steps", str(args.steps)])
                m = re.search(r"time per step: measured ([0-9.]+) (s|ms|us)", p.stderr)
                if not m:
                    sys.exit(f"no timing in:\n{p.stderr}")
                scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}[m.group(2)]
                measured = float(m.group(1)) * scale
                pairs[stages].append((measured, pred["iteration_seconds"], pred["bubble_fraction"]))
                last[stages] = [l for l in p.stdout.splitlines() if l.startswith("step ")][-1]
    med = lambda xs: sorted(xs)[len(xs) // 2]
    for stages in (1, 2):
        ms = [x[0] for x in pairs[stages]]
        errs = [100 * (x[1] - x[0]) / x[0] for x in pairs[stages]]
        rows.append((stages, med(ms), min(ms), max(ms), med([x[1] for x in pairs[stages]]),
                     med(errs), min(errs, key=abs), max(errs, key=abs), pairs[stages][0][2], last[stages]))
    base = rows[0][1]
    print(f"model {os.path.relpath(args.model, ROOT)} (loss {args.loss}, target {args.target}), global batch {args.batch} = "
          f"{args.microbatches} micro-batches, schedule {args.schedule}, {args.steps} steps per run "
          f"(first step not timed), {args.repeats} compile+run pairs per plan, {os.cpu_count()} cores\n")
    print("| stages | measured s/step (median) | range | throughput vs 1 stage | predicted s/step (host, median) | prediction error (median) | errors (closest … furthest) | last loss |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|")
    for stages, m, lo, hi, pred, err, err_lo, err_hi, bubble, last_line in rows:
        print(f"| {stages} | {m:.3f} | {lo:.3f}–{hi:.3f} | {base / m:.2f}× | {pred:.3f} | {err:+.1f}% | "
              f"{err_lo:+.1f}% … {err_hi:+.1f}% | `{last_line}` |")
    if rows[0][9].split()[-1] != rows[1][9].split()[-1]:
        print("\nwarning: the 1-stage and 2-stage runs ended with different losses")


if __name__ == "__main__":
    main()
