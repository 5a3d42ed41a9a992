#!/usr/bin/env bash
# The main job end to end, as far as ppcc goes today: import the bundled GPT-style decoder
# from ONNX, verify and canonicalize its IR, run it with the reference interpreter and
# compare with onnxruntime's outputs shipped next to the model, then train it for 50 steps
# on one device (autodiff + SGD as IR, run by the interpreter). Installs what it needs.
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
echo "==> ppcc train examples/gpt.onnx --steps 50 --data synthetic   (the loss should fall)"
$ppcc train examples/gpt.onnx --steps 50 --data synthetic --save-onnx build/demo/gpt_trained.onnx | awk 'NR % 10 == 1 || NR == 50'
echo "==> done: IR in build/demo/gpt.ppir, outputs in build/demo/gpt_out.npz, trained model in build/demo/gpt_trained.onnx"
