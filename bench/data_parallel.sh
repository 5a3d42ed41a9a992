#!/usr/bin/env bash
# Pipeline × data parallelism (issue 19): the predicted throughput of every P stages × D
# replicas split of 16 and 64 h100 devices for a GPT (`ppcc --devices N`), and a measured
# comparison on this machine of one device, 2 stages, and 2 replicas on the same global
# batch (`ppcc run`, native code, threads).
#
#   bench/data_parallel.sh [PPCC] [OUT]      # PPCC defaults to target/release/ppcc
#
# Prints the tables that BENCHMARKS.md records.
set -euo pipefail
cd "$(dirname "$0")/.."
PPCC="${1:-target/release/ppcc}"
OUT="${2:-target/bench/data_parallel}"
PY="${PPCC_PYTHON:-.venv/bin/python}"
mkdir -p "$OUT"

# --- predicted: a 24-layer GPT (d 1024, 16 heads, seq 512, vocabulary 32000: 368 M
# parameters) on 16 and 64 h100 devices, 16 micro-batches per replica.
"$PY" bench/gen_models.py --out "$OUT/big" --only gpt --layers 24 --d-model 1024 --heads 16 \
    --seq 512 --vocab 32000 --no-check >/dev/null
for n_batch in "16 256" "64 1024"; do
    set -- $n_batch
    echo "== --devices $1, global batch $2 (h100 profile, 1F1B, 16 micro-batches per replica)"
    "$PPCC" "$OUT/big/gpt24.onnx" -o "$OUT/plan$1" --force --devices "$1" --batch "$2" \
        --microbatches 16 --plan-only --split off 2>&1 | sed -n '/^--devices/,/^data parallel/p' | grep -v '^data parallel'
done

# --- ZeRO-1: the same GPT with AdamW on 4 stages x 4 replicas, predicted peak memory per
# device with the whole optimizer state on every replica (--zero 0) and sharded (--zero 1).
for z in 0 1; do
    "$PPCC" "$OUT/big/gpt24.onnx" -o "$OUT/zero$z" --force --stages 4 --data-parallel 4 \
        --batch 256 --microbatches 16 --plan-only --split off --optimizer adamw --zero "$z" >/dev/null
done
echo "== ZeRO-1: AdamW, 4 stages x 4 replicas, global batch 256 (h100 profile), predicted peak memory per device"
"$PY" - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
plans = [json.load(open(f"{out}/zero{z}/plan.json")) for z in (0, 1)]
gib = 2.0 ** 30
print(f"| device | weights | --zero 0 | --zero 1 | saved |")
print(f"| --- | --- | --- | --- | --- |")
for d, (a, b) in enumerate(zip(plans[0]["prediction"]["peak_memory_bytes"], plans[1]["prediction"]["peak_memory_bytes"])):
    w = sum(s["param_bytes"] for s in plans[0]["stages"] if s["device"] == d)
    print(f"| {d} | {w / gib:.2f} GiB | {a / gib:.2f} GiB | {b / gib:.2f} GiB | {(a - b) / gib:.2f} GiB |")
print("predicted iteration: --zero 0 %.1f ms, --zero 1 %.1f ms" % tuple(p["prediction"]["iteration_seconds"] * 1e3 for p in plans))
PY

# --- measured: a small GPT (4 layers, d 128, vocabulary 512, 32 tokens), global batch 32,
# 8 micro-batches of 4 rows in all; 20 steps, the first left out.
"$PY" bench/gen_models.py --out "$OUT/small" --only gpt --layers 4 --d-model 128 --heads 4 \
    --seq 32 --vocab 512 --no-check >/dev/null
M="$OUT/small/gpt24.onnx"
echo "== measured on this machine ($(nproc) cores): global batch 32, native code, threads"
printf '%-24s %12s %12s %s\n' "layout" "ms/step" "rows/s" "losses (steps 0, 19)"
run() {  # NAME COMPILE-OPTIONS...
    local name="$1"; shift
    rm -rf "${OUT:?}/$name"
    "$PPCC" "$M" -o "$OUT/$name" --batch 32 --split off "$@" >/dev/null 2>&1
    local log
    log="$("$PPCC" run "$OUT/$name" --steps 20 2>&1)"
    echo "$log" | awk -v name="$name" '
        /^step 0 /  { l0 = $4 }
        /^step 19 / { l19 = $4 }
        /^time per step: measured/ {
            v = $5; u = $6; sub(/,$/, "", u)
            s = (u == "s") ? v : (u == "ms") ? v / 1e3 : v / 1e6
        }
        END { printf "%-24s %12.2f %12.0f %s %s\n", name, s * 1e3, 32 / s, l0, l19 }'
}
run "1 stage, 1 replica" --stages 1 --microbatches 8
run "2 stages, 1 replica" --stages 2 --microbatches 8
run "1 stage, 2 replicas" --stages 1 --data-parallel 2 --microbatches 4
run "2 stages, 2 replicas" --stages 2 --data-parallel 2 --microbatches 4
run "2x2, AdamW" --stages 2 --data-parallel 2 --microbatches 4 --optimizer adamw
run "2x2, AdamW, --zero 1" --stages 2 --data-parallel 2 --microbatches 4 --optimizer adamw --zero 1
