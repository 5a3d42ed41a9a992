#!/usr/bin/env python3
"""Planner speed (issue 18): wall and CPU time (user + system) of `ppcc MODEL -o DIR --plan-only` and the planner's
own time (plan.json's `planner_seconds`) for two ppcc binaries in the same run, each
configuration alternating between them, the fastest of `--repeat` runs (the least disturbed by other work on the machine); and whether the two
wrote the same plan (plan.json without `planner_seconds`, and schedule.csv).

    .venv/bin/python bench/gen_models.py --out target/bench/models48 --only gpt --layers 48 \\
        --d-model 128 --heads 4 --seq 128 --vocab 1000 --batch 64 --no-check
    cp target/debug/ppcc /tmp/ppcc-before      # built from the commit to compare against
    cargo build -p ppcc
    .venv/bin/python bench/planner_speed.py --before /tmp/ppcc-before --after target/debug/ppcc \\
        --model target/bench/models48/gpt24.onnx
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def run(ppcc, model, out, schedule, stages, extra):
    cmd = [ppcc, model, "-o", out, "--plan-only", "--device-profile", "h100",
           "--stages", str(stages), "--schedule", schedule] + extra
    t0 = time.perf_counter()
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if p.returncode != 0:
        return None
    with open(os.path.join(out, "plan.json")) as f:
        doc = json.load(f)
    planner = doc.pop("planner_seconds")
    doc["schedule"]["name"] = None
    with open(os.path.join(out, "schedule.csv")) as f:
        csv = f.read()
    return wall, cpu, planner, (json.dumps(doc, sort_keys=True), csv), doc["prediction"]


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--schedules", nargs="+", default=["1f1b", "zb-v", "auto"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--extra", nargs=argparse.REMAINDER,
                    default=["--batch", "64", "--microbatches", "64"])
    args = ap.parse_args()
    print(f"\n{os.path.basename(args.model)}, {args.stages} devices, {' '.join(args.extra)}, "
          f"h100 profile; fastest of {args.repeat} runs (load average {os.getloadavg()[0]:.1f})\n")
    print("| schedule | before: wall (s) | before: CPU (s) | before: planner (s) "
          "| after: wall (s) | after: CPU (s) | after: planner (s) | same plan "
          "| iteration (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for s in args.schedules:
            res = {"before": [], "after": []}
            plans = {}
            for _ in range(args.repeat):
                for which in ["before", "after"]:
                    out = os.path.join(tmp, f"{which}-{s}")
                    r = run(getattr(args, which), args.model, out, s, args.stages, args.extra)
                    if r is None:
                        # (`auto` is new: the old binary refuses it.)
                        if which == "after":
                            sys.exit(f"{args.after} failed on {s}")
                        continue
                    w, cpu, pl, plan, pred = r
                    res[which].append((w, cpu, pl))
                    plans[which] = (plan, pred)
            cells = []
            for which in ["before", "after"]:
                if not res[which]:
                    cells += ["—", "—", "—"]
                else:
                    cells += [f"{min(x[i] for x in res[which]):.2f}"
                              for i in range(3)]
            same = ("yes" if plans["before"][0] == plans["after"][0] else "NO") \
                if "before" in plans else "—"
            it = plans["after"][1]["iteration_seconds"] * 1e3
            print(f"| {s} | {' | '.join(cells)} | {same} | {it:.3f} |")


if __name__ == "__main__":
    main()
