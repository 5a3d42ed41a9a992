#!/usr/bin/env python3
"""Planner benchmark: predicted iteration time of every partitioner x schedule.

For each model (GPT-style decoder with 24 layers, a two-tower model, Inception v1 from the
onnx wheel) at 4 and 8 devices on the h100 profile, runs
`ppcc MODEL -o DIR --plan-only --stages P --partition K --schedule S` and prints one
Markdown table per model: predicted iteration time, its ratio to the lower bound (total
work / devices), bubble, whether the stage graph is a chain, and the planner's wall time.
The `graph` rows are compared with the `sequential` rows of the same schedule in the same
run.

    .venv/bin/python bench/gen_models.py --out target/bench/models   # once
    cargo build --release -p ppcc
    .venv/bin/python bench/planner.py [--ppcc target/release/ppcc] [--devices 4 8]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCHEDULES = ["gpipe", "1f1b", "zb-h1", "zb-h2", "interleaved-1f1b", "zb-v"]
PARTITIONS = ["graph", "sequential", "uniform"]


def models(model_dir):
    import onnx

    light = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    return [
        # name, path, extra compile arguments
        ("gpt24", os.path.join(model_dir, "gpt24.onnx"), ["--batch", "32", "--microbatches", "8"]),
        (
            "two_tower_big",
            os.path.join(model_dir, "two_tower_big.onnx"),
            ["--batch", "256", "--microbatches", "8", "--loss", "mse"],
        ),
        # Inception v1 bakes batch 1 into a Reshape: micro-batches of one row.
        (
            "inception_v1",
            os.path.join(light, "light_inception_v1.onnx"),
            ["--batch", "8", "--microbatches", "8"],
        ),
    ]


def run(ppcc, path, extra, devices, partition, schedule, out):
    cmd = [ppcc, path, "-o", out, "--plan-only", "--stages", str(devices),
           "--partition", partition, "--schedule", schedule, "--device-profile", "h100"] + extra
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"
        return None, msg, wall
    with open(os.path.join(out, "plan.json")) as f:
        return json.load(f), None, wall


def fmt_ms(s):
    return f"{s * 1e3:.3f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ppcc", default=os.path.join(ROOT, "target", "release", "ppcc"))
    ap.add_argument("--models", default=os.path.join(ROOT, "target", "bench", "models"))
    ap.add_argument("--devices", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--only", nargs="*", help="model names to run")
    args = ap.parse_args()
    if not os.path.exists(args.ppcc):
        sys.exit(f"{args.ppcc} not found: cargo build --release -p ppcc")
    todo = [m for m in models(args.models) if not args.only or m[0] in args.only]
    for name, path, _ in todo:
        if not os.path.exists(path):
            sys.exit(f"{path} not found: .venv/bin/python bench/gen_models.py --out {args.models}")
    summary = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, path, extra in todo:
            for p in args.devices:
                print(f"\n### {name}, {p} devices (h100 profile, {' '.join(extra)})\n")
                print("| partition | schedule | iteration (ms) | × lower bound | bubble | stage graph | planner (s) | wall (s) |")
                print("|---|---|---:|---:|---:|---|---:|---:|")
                results = {}
                for schedule in SCHEDULES:
                    for partition in PARTITIONS:
                        if partition == "graph" and schedule in ("interleaved-1f1b", "zb-v"):
                            continue  # several stages per device along a chain
                        out = os.path.join(tmp, f"{name}-{p}-{partition}-{schedule}")
                        plan, err, wall = run(args.ppcc, path, extra, p, partition, schedule, out)
                        if plan is None:
                            print(f"| {partition} | {schedule} | — | — | — | {err} | — | {wall:.2f} |")
                            continue
                        pred = plan["prediction"]
                        it, lb = pred["iteration_seconds"], pred["lower_bound_seconds"]
                        results[(partition, schedule)] = it
                        graph = "chain" if pred["stage_graph_is_chain"] else "DAG"
                        if partition == "graph":
                            base = plan["baseline"].get("iteration_seconds")
                            if base:
                                graph += f" ({base / it:.3f}× vs sequential)"
                            dags = [c["iteration_seconds"] for c in plan.get("candidates", [])
                                    if not c["stage_graph_is_chain"]]
                            if pred["stage_graph_is_chain"]:
                                graph += (f"; best DAG candidate {fmt_ms(min(dags))} ms" if dags
                                          else "; no DAG candidate")
                        print(f"| {partition} | {schedule} | {fmt_ms(it)} | {it / lb:.3f} | "
                              f"{pred['bubble_fraction'] * 100:.1f}% | {graph} | {plan['planner_seconds']:.2f} | {wall:.2f} |")
                best = min(results.items(), key=lambda kv: kv[1]) if results else None
                if best:
                    summary.append((name, p, best[0][0], best[0][1], best[1]))
    print("\n### best plan per model and device count\n")
    print("| model | devices | partition | schedule | iteration (ms) |")
    print("|---|---:|---|---|---:|")
    for name, p, part, sched, it in summary:
        print(f"| {name} | {p} | {part} | {sched} | {fmt_ms(it)} |")


if __name__ == "__main__":
    main()
