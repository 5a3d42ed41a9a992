#!/usr/bin/env python3
"""Schedule benchmark (issue 18): every built-in schedule against the lower bound.

For a 48-layer GPT (d_model 128) and the two-tower model at 4, 8 and 16 devices on the
h100 profile, runs `ppcc MODEL -o DIR --plan-only --stages P --schedule S` with the
default partition of each schedule (graph for one stage per device, sequential for
interleaved-1f1b, zb-v and dualpipe-v), `auto` (with the profile's memory limit, and as
`auto@1.1` with the limit at 1.1 × 1F1B's peak and `--recompute off`, and as `auto@1.1+rc` with
that limit and recomputation allowed, ppcc's default) and prints one Markdown table per model: predicted
iteration time, lower bound / iteration (1.0 = no bubble), bubble, the largest peak memory
of a device against 1F1B's, and the planner's own time from plan.json.

    .venv/bin/python bench/gen_models.py --out target/bench/models48 --only gpt --layers 48 \\
        --d-model 128 --heads 4 --seq 128 --vocab 1000 --batch 64 --no-check
    .venv/bin/python bench/gen_models.py --out target/bench/models48 --only two_tower --no-check
    cargo build -p ppcc
    .venv/bin/python bench/schedules.py --ppcc target/debug/ppcc --models target/bench/models48
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCHEDULES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zb-v", "dualpipe-v", "auto",
             "auto@1.1", "auto@1.1+rc"]


def models(model_dir):
    return [
        # name, path, extra compile arguments
        ("gpt48 (d 128)", os.path.join(model_dir, "gpt24.onnx"),
         ["--batch", "64", "--microbatches", "64"]),
        ("two_tower_big", os.path.join(model_dir, "two_tower_big.onnx"),
         ["--batch", "256", "--microbatches", "64", "--loss", "mse"]),
    ]


def run(ppcc, path, extra, devices, schedule, out, limit=None, recompute=False):
    cmd = [ppcc, path, "-o", out, "--plan-only", "--stages", str(devices),
           "--schedule", schedule, "--device-profile", "h100"] + extra
    if limit is not None:
        cmd += ["--memory-limit", str(int(limit))]
        if not recompute:
            # Which schedule fits, not what recomputation could make fit.
            cmd += ["--recompute", "off"]
    if schedule == "interleaved-1f1b":
        cmd += ["--chunks", "2"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        msg = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else "failed"
        return None, msg
    with open(os.path.join(out, "plan.json")) as f:
        return json.load(f), None


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ppcc", default=os.path.join(ROOT, "target", "debug", "ppcc"))
    ap.add_argument("--models", default=os.path.join(ROOT, "target", "bench", "models48"))
    ap.add_argument("--devices", type=int, nargs="+", default=[4, 8, 16])
    ap.add_argument("--schedules", nargs="+", default=SCHEDULES)
    args = ap.parse_args()
    if not os.path.exists(args.ppcc):
        sys.exit(f"{args.ppcc} not found: cargo build -p ppcc")
    with tempfile.TemporaryDirectory() as tmp:
        for name, path, extra in models(args.models):
            if not os.path.exists(path):
                sys.exit(f"{path} not found: see this script's docstring")
            for p in args.devices:
                print(f"\n### {name}, {p} devices (h100 profile, {' '.join(extra)})\n")
                print("| schedule | iteration (ms) | lower bound / iteration | bubble "
                      "| peak memory (MiB) | × 1F1B's | planner (s) |")
                print("|---|---:|---:|---:|---:|---:|---:|")
                rows, base_peak = [], None
                for schedule in args.schedules:
                    out = os.path.join(tmp, f"{p}-{schedule}")
                    # `auto@F`: auto with the memory limit at F × 1F1B's peak; `auto@F+rc`
                    # the same with recomputation at ppcc's default (`--recompute auto`).
                    limit = None
                    recompute = schedule.endswith("+rc")
                    if "@" in schedule:
                        if base_peak is None:
                            rows.append(f"| {schedule} | — | — | — | — | — | no 1f1b peak |")
                            continue
                        limit = float(schedule.split("@")[1].removesuffix("+rc")) * base_peak
                    plan, err = run(args.ppcc, path, extra, p, schedule.split("@")[0], out,
                                    limit, recompute)
                    if plan is None:
                        rows.append(f"| {schedule} | — | — | — | — | — | {err} |")
                        continue
                    pred = plan["prediction"]
                    it, lb = pred["iteration_seconds"], pred["lower_bound_seconds"]
                    peak = max(pred["peak_memory_bytes"])
                    if schedule == "1f1b":
                        base_peak = peak
                    rel = f"{peak / base_peak:.2f}" if base_peak else "—"
                    label = schedule
                    if schedule.startswith("auto"):
                        chosen = plan["schedule"]["name"].split(": ", 1)[-1]
                        bound = schedule.removesuffix("+rc").replace("@", " ≤ ")
                        label = (f"{bound}{'× 1F1B' if '@' in schedule else ''}"
                                 f"{' (--recompute auto)' if recompute else ''}"
                                 f" → {chosen}, {plan['partition']}")
                    rows.append(
                        f"| {label} | {it * 1e3:.3f} | {lb / it:.3f} | "
                        f"{pred['bubble_fraction'] * 100:.1f}% | {peak / 2**20:.1f} | {rel} | "
                        f"{plan['planner_seconds']:.2f} |")
                print("\n".join(rows))


if __name__ == "__main__":
    main()
