#!/usr/bin/env python3
"""Runtime benchmark: a 2-stage pipeline against 1 stage on this machine, and measured
against predicted time per step with the `host` profile.

Compiles the same model with the same global batch and micro-batches into a 1-stage and a
2-stage plan (`--device-profile host`), trains each for a few steps with `ppcc run`
(threads, the reference interpreter), and prints one table: measured seconds per step,
throughput ratio, predicted seconds per step and the prediction error. Run it on an
otherwise idle machine: the two stages need a core each.

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
    args = ap.parse_args()
    for path in (args.ppcc, args.model):
        if not os.path.exists(path):
            sys.exit(f"{path} not found (see the usage at the top of this script)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for stages in (1, 2):
            out = os.path.join(tmp, f"p{stages}")
            sh([args.ppcc, args.model, "-o", out, "--stages", str(stages), "--batch", str(args.batch),
                "--microbatches", str(args.microbatches), "--schedule", args.schedule,
                "--device-profile", "host"])
            with open(os.path.join(out, "plan.json")) as f:
                plan = json.load(f)
            p = sh([args.ppcc, "run", out, "--steps", str(args.steps)])
            m = re.search(r"time per step: measured ([0-9.]+) (s|ms|us)", p.stderr)
            if not m:
                sys.exit(f"no timing in:\n{p.stderr}")
            scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}[m.group(2)]
            measured = float(m.group(1)) * scale
            losses = [l for l in p.stdout.splitlines() if l.startswith("step ")]
            rows.append((stages, measured, plan["prediction"]["iteration_seconds"],
                         plan["prediction"]["bubble_fraction"], losses[-1]))
    base = rows[0][1]
    print(f"model {os.path.relpath(args.model, ROOT)}, global batch {args.batch} = "
          f"{args.microbatches} micro-batches, schedule {args.schedule}, {args.steps} steps "
          f"(first step not timed), {os.cpu_count()} cores\n")
    print("| stages | measured s/step | throughput vs 1 stage | predicted s/step (host) | error | predicted bubble | last loss |")
    print("|---:|---:|---:|---:|---:|---:|---|")
    for stages, measured, predicted, bubble, last in rows:
        print(f"| {stages} | {measured:.3f} | {base / measured:.2f}× | {predicted:.3f} | "
              f"{100 * (predicted - measured) / measured:+.1f}% | {100 * bubble:.1f}% | `{last}` |")
    if rows[0][4].split()[-1] != rows[1][4].split()[-1]:
        print("\nwarning: the 1-stage and 2-stage runs ended with different losses")


if __name__ == "__main__":
    main()
