#!/usr/bin/env bash
# Op splitting (issue 14): the planner's predicted iteration with --split off, --split auto
# and forced splits, side by side, for every model given (MODEL:STAGES:MICROBATCHES:BATCH).
#   bench/split.sh /tmp/gm/gpt24.onnx:8:16:256 /tmp/gm2/gpt24.onnx:4:8:128
# Prints a markdown table. PPCC (default target/debug/ppcc) and PROFILE (default h100).
set -euo pipefail
PPCC=${PPCC:-target/debug/ppcc}
PROFILE=${PROFILE:-h100}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "| model | devices, micro-batches | schedule | split | predicted iteration | lower bound | speed-up vs off | rewrite |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for spec in "$@"; do
  IFS=: read -r model stages micro batch <<<"$spec"
  for schedule in 1f1b zb-h2; do
    base=""
    for split in off auto lm_head=2 lm_head=4 lm_head=8; do
      log=$("$PPCC" "$model" -o "$out/plan" --force --stages "$stages" --microbatches "$micro" \
        --batch "$batch" --plan-only --device-profile "$PROFILE" --schedule "$schedule" \
        --split "$split" 2>&1) || { echo "| $model | $split: failed |"; continue; }
      it=$(sed -n 's/^predicted: iteration \([0-9.]*\) ms.*/\1/p' <<<"$log")
      lb=$(sed -n 's/.*lower bound \([0-9.]*\) ms.*/\1/p' <<<"$log" | head -1)
      rw=$(sed -n 's/^rewrite: .*, \([0-9.]*\) s; .*/\1 s/p' <<<"$log")
      chosen=$(sed -n 's/^split auto: chose \([^ ]*\) .*/\1/p' <<<"$log")
      [ "$split" = off ] && base=$it
      label=$split
      [ "$split" = auto ] && label="auto (${chosen:-none})"
      speed=$(awk -v b="$base" -v t="$it" 'BEGIN { printf "%.2f", b / t }')
      echo "| $(basename "$(dirname "$model")")/$(basename "$model") | $stages, $micro | $schedule | $label | $it ms | $lb ms | $speed | ${rw:--} |"
    done
  done
done
