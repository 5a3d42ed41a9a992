#!/bin/bash
# Compile time of two ppcc binaries on the same models, alternating them: CPU seconds (user +
# system) of `ppcc MODEL -o DIR --stages 2 ...`, min and mean of REPS runs each.
#
#   bench/compile_time.sh BEFORE_BIN AFTER_BIN [REPS]
#
# Models: examples/cnn.onnx, and from bench/gen_models.py a 4-layer GPT (d 256, vocab 4096,
# seq 64) and two_tower_big, generated into target/bench/compile_time/ on first use.
set -eu
before=$1 after=$2 reps=${3:-4}
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PPCC_PYTHON:-$root/.venv/bin/python}
models=$root/target/bench/compile_time
mkdir -p "$models"
[ -f "$models/gpt/gpt24.onnx" ] || "$py" "$root/bench/gen_models.py" --out "$models/gpt" --only gpt \
  --layers 4 --d-model 256 --heads 4 --seq 64 --vocab 4096 --batch 16 --no-check > /dev/null
[ -f "$models/tt/two_tower_big.onnx" ] || "$py" "$root/bench/gen_models.py" --out "$models/tt" \
  --only two_tower --no-check > /dev/null
cases=(
  "cnn|$root/examples/cnn.onnx"
  "gpt4-d256|$models/gpt/gpt24.onnx --batch 32 --microbatches 2"
  "two_tower_big|$models/tt/two_tower_big.onnx --batch 64 --microbatches 2 --loss mse"
)
out=$(mktemp)
for c in "${cases[@]}"; do
  name=${c%%|*} args=${c#*|}
  for _ in $(seq "$reps"); do
    for which in before after; do
      bin=$before; [ "$which" = after ] && bin=$after
      d=$(mktemp -d)
      # shellcheck disable=SC2086
      /usr/bin/time -f "%U %S" -o "$d/t" "$bin" $args -o "$d/o" --stages 2 > /dev/null 2>&1
      echo "$name $which $(awk '{print $1 + $2}' "$d/t")" >> "$out"
      rm -rf "$d"
    done
  done
done
echo "| model | before: min (s) | before: mean (s) | after: min (s) | after: mean (s) |"
echo "|---|---:|---:|---:|---:|"
awk '{k = $1 " " $2; if (!(k in mn) || $3 < mn[k]) mn[k] = $3; s[k] += $3; n[k]++; if (!($1 in seen)) { seen[$1] = 1; order[++m] = $1 } }
     END { for (i = 1; i <= m; i++) { x = order[i];
       printf "| %s | %.2f | %.2f | %.2f | %.2f |\n", x, mn[x " before"], s[x " before"] / n[x " before"], mn[x " after"], s[x " after"] / n[x " after"] } }' "$out"
rm -f "$out"
