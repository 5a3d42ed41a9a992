#!/usr/bin/env bash
# ZB-V, DualPipeV and `auto` on the V layout: two plan_bench builds side by side.
#
#   bench/v_schedules.sh OLD_PLAN_BENCH NEW_PLAN_BENCH DUMP:DEVICES:MICROBATCHES...
#
# DUMP is a module dumped with `ppcc MODEL --plan-only --dump-after import --dump-dir D`
# (D/1-import.ppir). Prints a markdown table: iteration, lower bound / iteration and peak
# memory of each schedule under each build (h100 profile, the planner's own partitions).
set -euo pipefail
if [ $# -lt 3 ]; then
    echo "usage: $0 OLD_PLAN_BENCH NEW_PLAN_BENCH DUMP:DEVICES:MICROBATCHES..." >&2
    exit 2
fi
old=$1
new=$2
shift 2
echo "| model | devices, micro-batches | schedule | before: iteration (ms) | lower bound / it | peak (MiB) | after: iteration (ms) | lower bound / it | peak (MiB) | chosen (auto) |"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
for case in "$@"; do
    IFS=: read -r dump devices mb <<<"$case"
    name=$(basename "$(dirname "$dump")")
    for sched in zb-v dualpipe-v auto; do
        row=()
        chosen=""
        for bin in "$old" "$new"; do
            line=$("$bin" "$dump" "$devices" "$mb" "$sched" --idle 2>&1 | grep -E "^$sched \(" | head -1 || true)
            if [ -z "$line" ]; then
                row+=("-" "-" "-")
                continue
            fi
            it=$(sed -E 's/.*makespan ([0-9.]+) ms.*/\1/' <<<"$line")
            ratio=$(sed -E 's/.*lower bound [0-9.]+ ms \(([0-9.]+)\).*/\1/' <<<"$line")
            peak=$(sed -E 's/.*peak memory ([0-9.]+) MiB.*/\1/' <<<"$line")
            chosen=$(sed -E "s/^$sched \((.*)\): makespan.*/\1/" <<<"$line")
            row+=("$it" "$ratio" "$peak")
        done
        [ "$sched" = auto ] || chosen=""
        echo "| $name | $devices, $mb | $sched | ${row[0]} | ${row[1]} | ${row[2]} | ${row[3]} | ${row[4]} | ${row[5]} | $chosen |"
    done
done
