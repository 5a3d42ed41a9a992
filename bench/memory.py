#!/usr/bin/env python3
"""Memory benchmark: what `ppcc run` measures per device against plan.json's prediction,
and the same plan built by a baseline ppcc binary, side by side.

For each MODEL (with its compile options), compiles a pipeline with this ppcc and with the
baseline (`--baseline BIN`, e.g. a release build of an older commit), trains each for a few
steps with `ppcc run`, and prints one table per model: per device, the measured stash,
temporaries and peak (weights + optimizer state + gradients + stash + temporaries) against
the prediction, the process's peak resident memory and the time per step of both builds.
A baseline that does not measure temporaries shows `-` there.

    cargo build --release -p ppcc
    .venv/bin/python bench/memory.py --baseline /tmp/ppcc-old \\
        'examples/gpt.onnx --stages 2 --microbatches 4 --batch 16' \\
        'target/bench/gsm/gpt24.onnx --stages 4 --microbatches 8 --batch 64 --recompute all'
"""

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DEVICE = re.compile(
    r"^device (\d+) .*peak memory ([\d.]+) MiB \(weights and optimizer state ([\d.]+) MiB, "
    r"gradients ([\d.]+) MiB, stash ([\d.]+) MiB(?:, temporaries ([\d.]+) MiB(?: \(predicted ([\d.]+) MiB\))?)?\), "
    r"predicted ([\d.]+) MiB"
)
STEP = re.compile(r"time per step: measured ([\d.]+) (ms|s)")
RSS = re.compile(r"peak resident memory of .*: ([\d.]+) MiB")


def sh(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{p.stderr}")
    return p


def measure(ppcc, spec, out, steps):
    args = shlex.split(spec)
    sh([ppcc, args[0], "-o", out] + args[1:])
    p = sh([ppcc, "run", out, "--steps", str(steps)])
    devices = [m.groups() for m in map(DEVICE.match, p.stderr.splitlines()) if m]
    step = STEP.search(p.stderr)
    seconds = float(step.group(1)) * (1e-3 if step.group(2) == "ms" else 1.0) if step else float("nan")
    rss = RSS.search(p.stderr)
    # The predicted stash per device: micro-batches in flight × each of its stages' stash.
    plan = json.load(open(os.path.join(out, "plan.json")))
    inflight = plan["prediction"]["peak_stash_microbatches"]
    stash = [0.0] * len(inflight)
    for st in plan["stages"]:
        stash[st["device"]] += inflight[st["device"]] * st["activation_bytes_per_microbatch"]
    return devices, seconds, float(rss.group(1)) if rss else float("nan"), stash


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="'MODEL.onnx OPTIONS...' (ppcc compile options)")
    ap.add_argument("--ppcc", default=os.path.join(ROOT, "target", "release", "ppcc"))
    ap.add_argument("--baseline", help="a ppcc binary to compare with (same options)")
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ppcc-memory-") as tmp:
        for i, spec in enumerate(a.models):
            ours, t_ours, rss_ours, stash_p = measure(a.ppcc, spec, os.path.join(tmp, f"m{i}"), a.steps)
            base = None
            if a.baseline:
                base = measure(a.baseline, spec, os.path.join(tmp, f"b{i}"), a.steps)
            print(f"\n`{spec}`\n")
            print("| device | stash measured / predicted | temporaries measured / predicted | peak measured / predicted | baseline: temporaries, peak |")
            print("| --- | --- | --- | --- | --- |")
            for k, d in enumerate(ours):
                dev, peak, _w, _g, stash, temp, temp_p, pred = d
                b = ""
                if base and k < len(base[0]):
                    bd = base[0][k]
                    b = f"{bd[5] or '-'} MiB, {bd[1]} MiB"
                sp = stash_p[k] / 2**20 if k < len(stash_p) else float("nan")
                print(f"| {dev} | {stash} / {sp:.2f} MiB | {temp} / {temp_p} MiB | {peak} / {pred} MiB | {b} |")
            line = f"\ntime per step {t_ours * 1e3:.1f} ms, peak resident memory {rss_ours:.1f} MiB"
            if base:
                line += (
                    f"; baseline {base[1] * 1e3:.1f} ms, {base[2]:.1f} MiB"
                    f" ({base[1] / t_ours:.2f}x the time of ours)"
                )
            print(line)


if __name__ == "__main__":
    main()
