#!/usr/bin/env python3
"""Recomputation and memory-aware planning: the largest global batch that plans under a
memory limit with `--recompute off` and `--recompute auto`, and the graph partition against
the sequential one when each picks its own micro-batch size.

Usage (from the repository root, after `cargo build --release -p ppcc`):

    .venv/bin/python bench/gen_models.py --out target/bench/gpt2s --only gpt \\
        --layers 12 --d-model 768 --heads 12 --seq 128 --vocab 50257 --no-check
    .venv/bin/python bench/gen_models.py --out target/bench/mmt --only mmt --no-check
    .venv/bin/python bench/recompute.py \\
        --batch-search target/bench/gpt2s/gpt24.onnx:4:8:1GiB,2GiB \\
        --batch-search target/bench/gpt2s/gpt24.onnx:8:16:1GiB \\
        --batch-search target/bench/mmt/mmt.onnx:4:8:1GiB \\
        --partitions target/bench/mmt/mmt.onnx:4:1GiB:4,8,16

Every figure is the planner's (`ppcc MODEL --plan-only`, h100 profile, 1F1B): the
predicted iteration, the recomputed FLOPs from plan.json, and the planner's wall time.

--batch-search MODEL:DEVICES:MICROBATCHES:LIMIT[,LIMIT...]
    For each limit and for --recompute off and auto: the largest rows per micro-batch
    that plans (doubling, then bisection), with the global batch, predicted time per
    sample, recomputed GFLOP per step and planner seconds at that batch.
--partitions MODEL:DEVICES:LIMIT:M[,M...]
    For --partition graph and sequential (both with --recompute auto): for each number of
    micro-batches M, the largest micro-batch that plans; the best throughput (samples
    per second) over M for each partitioner, and their ratio.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def plan(ppcc, model, out, devices, micro, rows, limit, recompute, partition="auto",
         schedule="1f1b"):
    """Plan once; (plan.json as a dict, seconds) or (None, seconds) when it does not plan."""
    cmd = [ppcc, model, "-o", out, "--force", "--plan-only", "--stages", str(devices),
           "--microbatches", str(micro), "--batch", str(micro * rows), "--memory-limit",
           limit, "--recompute", recompute, "--split", "off", "--schedule", schedule,
           "--partition", partition]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.time() - t0
    if r.returncode != 0:
        if "memory" not in r.stderr and "fits" not in r.stderr:
            sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr}")
        return None, dt
    with open(os.path.join(out, "plan.json")) as f:
        return json.load(f), dt


def largest(ppcc, model, out, devices, micro, limit, recompute, partition="auto", cap=4096):
    """The largest rows per micro-batch that plans: (rows, plan, seconds) or (0, None, 0)."""
    best = (0, None, 0.0)
    rows = 1
    hi = None
    while rows <= cap:
        p, dt = plan(ppcc, model, out, devices, micro, rows, limit, recompute, partition)
        if p is None:
            hi = rows
            break
        best = (rows, p, dt)
        rows *= 2
    if best[0] == 0 or hi is None:
        return best
    lo = best[0]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        p, dt = plan(ppcc, model, out, devices, micro, mid, limit, recompute, partition)
        if p is None:
            hi = mid
        else:
            lo, best = mid, (mid, p, dt)
    return best


def extra_gflop(p):
    """Recomputed GFLOP per step: per stage, per micro-batch, times micro-batches."""
    per_mb = sum((s.get("recompute") or {}).get("extra_flops", 0.0) for s in p["stages"])
    return per_mb * p["microbatches"] / 1e9


def batch_search(ppcc, spec, out):
    model, devices, micro, limits = spec.split(":")
    devices, micro = int(devices), int(micro)
    name = os.path.basename(os.path.dirname(model)) + "/" + os.path.basename(model)
    rows_out = []
    for limit in limits.split(","):
        found = {}
        for mode in ["off", "auto"]:
            found[mode] = largest(ppcc, model, out, devices, micro, limit, mode)
        (r_off, p_off, t_off), (r_auto, p_auto, t_auto) = found["off"], found["auto"]
        for mode, (r, p, t) in found.items():
            if p is None:
                rows_out.append(f"| {name} | {devices} | {limit} | {mode} | none plans | | | | |")
                continue
            g = r * micro
            per = p["prediction"]["iteration_seconds"] / g
            ratio = ""
            if mode == "auto" and p_off is not None:
                per_off = p_off["prediction"]["iteration_seconds"] / (r_off * micro)
                ratio = f"{g / (r_off * micro):.2f}× batch, {per / per_off:.2f}× time/sample"
            rows_out.append(
                f"| {name} | {devices} | {limit} | {mode} | {g} ({r} × {micro}) | "
                f"{per * 1e3:.3f} ms | {extra_gflop(p):.1f} | {t:.1f} s | {ratio} |")
    return rows_out


def partitions(ppcc, spec, out):
    model, devices, limit, micros = spec.split(":")
    devices = int(devices)
    name = os.path.basename(os.path.dirname(model)) + "/" + os.path.basename(model)
    best = {}
    lines = []
    for part in ["graph", "sequential"]:
        for m in [int(x) for x in micros.split(",")]:
            r, p, t = largest(ppcc, model, out, devices, m, limit, "auto", part)
            if p is None:
                lines.append(f"| {name} | {devices} | {limit} | {part} | {m} | none plans | | |")
                continue
            g = r * m
            it = p["prediction"]["iteration_seconds"]
            thr = g / it
            chain = "chain" if p["prediction"]["stage_graph_is_chain"] else "DAG"
            lines.append(f"| {name} | {devices} | {limit} | {part} ({chain}) | {m} | {g} | "
                         f"{thr:.0f} | {t:.1f} s |")
            if thr > best.get(part, (0,))[0]:
                best[part] = (thr, m, g)
    summary = ""
    if "graph" in best and "sequential" in best:
        summary = (f"graph {best['graph'][0]:.0f} samples/s (M={best['graph'][1]}, batch "
                   f"{best['graph'][2]}) vs sequential {best['sequential'][0]:.0f} (M="
                   f"{best['sequential'][1]}, batch {best['sequential'][2]}): "
                   f"{best['graph'][0] / best['sequential'][0]:.2f}×")
    return lines, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--ppcc", default="target/release/ppcc")
    ap.add_argument("--batch-search", action="append", default=[])
    ap.add_argument("--partitions", action="append", default=[])
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "plan")
        if a.batch_search:
            print("| model | devices | limit | recompute | largest global batch (rows × M) "
                  "| predicted time per sample | recomputed GFLOP/step | planner | auto vs off |")
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            for spec in a.batch_search:
                for line in batch_search(a.ppcc, spec, out):
                    print(line, flush=True)
            print()
        for spec in a.partitions:
            print("| model | devices | limit | partition | M | largest global batch "
                  "| samples/s | planner |")
            print("| --- | --- | --- | --- | --- | --- | --- | --- |")
            lines, summary = partitions(a.ppcc, spec, out)
            for line in lines:
                print(line, flush=True)
            print()
            print(summary)
            print()


if __name__ == "__main__":
    main()
