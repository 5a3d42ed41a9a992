#!/usr/bin/env bash
# The main job end to end: import the bundled GPT-style decoder from ONNX, check its
# forward pass against onnxruntime, compile it into a 3-stage pipeline plan (partition,
# send/recv, ZB-H1 schedule, predicted timeline) and train it with one worker per stage;
# then the same for the two-tower model, whose towers run side by side on different stages
# (a stage DAG). Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
[[ -d "$HOME/.cargo/bin" ]] && export PATH="$HOME/.cargo/bin:$PATH"

echo "==> building ppcc (release)"
cargo build --release --locked -q -p ppcc
ppcc=target/release/ppcc
opt=target/release/ppcc-opt
mkdir -p build/demo

echo "==> ppcc import examples/gpt.onnx   (first lines of the IR)"
$ppcc import examples/gpt.onnx | head -n 12
echo "    ..."
$ppcc import examples/gpt.onnx -o build/demo/gpt.ppir
echo "==> ppcc-opt --pass canonicalize  (verify, fold constants, remove dead code)"
$opt build/demo/gpt.ppir --pass canonicalize -o build/demo/gpt.canon.ppir
echo "    ops before: $(grep -c '"pp\.' build/demo/gpt.ppir), after: $(grep -c '"pp\.' build/demo/gpt.canon.ppir)"
echo "==> ppcc eval examples/gpt.onnx on examples/gpt_io.npz, checked against onnxruntime's outputs"
$ppcc eval examples/gpt.onnx --inputs examples/gpt_io.npz -o build/demo/gpt_out.npz --reference examples/gpt_io.npz
echo "==> ppcc examples/gpt.onnx -o build/demo/gpt --stages 3 --microbatches 1 --schedule zb-h1"
$ppcc examples/gpt.onnx -o build/demo/gpt --stages 3 --microbatches 1 --schedule zb-h1
echo "==> ppcc run build/demo/gpt --steps 50   (3 workers; the loss should fall)"
$ppcc run build/demo/gpt --steps 50 --save-onnx build/demo/gpt_trained.onnx --trace build/demo/gpt_run_trace.json | awk 'NR % 10 == 1 || NR == 50'
echo "==> ppcc examples/two_tower.onnx -o build/demo/two_tower --stages 3 --microbatches 4 --loss mse   (towers side by side)"
$ppcc examples/two_tower.onnx -o build/demo/two_tower --stages 3 --microbatches 4 --loss mse
echo "==> ppcc run build/demo/two_tower --steps 30 --data examples/two_tower_train.npz"
$ppcc run build/demo/two_tower --steps 30 --data examples/two_tower_train.npz | awk 'NR % 10 == 1 || NR == 30'
echo "==> done"
echo "    predicted timelines: build/demo/gpt/timeline.svg, build/demo/two_tower/timeline.svg"
echo "    what ran (Chrome/Perfetto trace): build/demo/gpt_run_trace.json"
echo "    per-stage programs: build/demo/gpt/stage*/stage.ppir; trained model: build/demo/gpt_trained.onnx"
