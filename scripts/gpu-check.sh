#!/usr/bin/env bash
# GPU check of the CUDA target (issue 16), run on a machine with an NVIDIA GPU and driver:
#
#   scripts/gpu-check.sh [PPCC] [OUT]
#
# PPCC: the ppcc binary (default target/release/ppcc); OUT: where logs go (default
# target/gpu-check). Needs python3 with onnx (bench models) and a C compiler (ppcc links
# modules with it); torch, when present, gives the cuBLAS reference of the GEMM table.
#
# 1. Every bundled example compiled for 2 stages with --target cuda and --target cpu on this
#    machine, trained 10 steps each from the same synthetic data: the losses must agree to
#    1e-4 relative (the CPU run is the reference).
# 2. Each PTX file assembled by ptxas (when on PATH) for the architecture it was written for.
# 3. Benchmarks: two generated models (a GPT and a two-tower MLP), time per step on the GPU
#    and on this machine's CPU, and the cost model's h100 prediction; then the f32 GEMM rate
#    of one MatMul (ppcc eval) with generated kernels and with cuBLAS.
# 4. With 2 GPUs or more: the 2-stage GPT again with its tensors over NCCL (--nccl), whose
#    losses must equal the CPU run's too.
#
# Sections 1 and 3 run every model twice on the GPU: "cuda", its matrix products in
# generated kernels (--gpu-gemm kernels), and "cublas", on cuBLAS (--gpu-gemm cublas, the
# default); section 3 adds "hostcopy" (cuBLAS, compiled with PPCC_GPU_COPIES=host: buffer
# copies on the host, the baseline of copies as kernels) and prints the cuBLAS run's
# slowest kernels (PPCC_GPU_PROFILE=1). cuBLAS is looked for in PPCC_CUBLAS_LIB, the
# loader's paths, then a pip-installed nvidia-cublas-cu12 or CUDA 13 nvidia-cublas (torch
# brings one).
set -u
PPCC=${1:-target/release/ppcc}
OUT=${2:-target/gpu-check}
mkdir -p "$OUT"
W=$(mktemp -d)
fail=0
say() { echo "$@" | tee -a "$OUT/summary.txt"; }

say "# ppcc GPU check, $(date -u +%Y-%m-%dT%H:%MZ)"
if [ -z "${PPCC_CUBLAS_LIB:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.1[23] '; then
  # A pip-installed cuBLAS: nvidia-cublas-cu12 (nvidia/cublas/lib/libcublas.so.12) or
  # CUDA 13's nvidia-cublas (nvidia/cu13/lib/libcublas.so.13), newest first.
  lib=$(python3 -c '
import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
hits = [h for r in roots for p in ("nvidia/*/lib/libcublas.so.1[23]", "nvidia/cublas/lib/libcublas.so.1[23]")
        for h in glob.glob(os.path.join(r, p))]
print(sorted(set(hits), key=lambda h: h[-2:])[-1] if hits else "")' 2>/dev/null)
  [ -n "$lib" ] && [ -e "$lib" ] && export PPCC_CUBLAS_LIB="$lib"
fi
say "cuBLAS: ${PPCC_CUBLAS_LIB:-on the loader search path}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$OUT/summary.txt"

losses() { grep '^step ' "$1" | awk '{print $4}'; }

compare() { # name cuda.log cpu.log
  python3 - "$@" <<'EOF' | tee -a "$OUT/summary.txt"
import sys
name, a, b = sys.argv[1:4]
la = [float(l.split()[3]) for l in open(a) if l.startswith("step ")]
lb = [float(l.split()[3]) for l in open(b) if l.startswith("step ")]
if not la or len(la) != len(lb):
    print(f"{name}: FAIL ({len(la)} cuda steps, {len(lb)} cpu steps)")
    sys.exit(1)
worst = max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(la, lb))
ok = worst <= 1e-4
print(f"{name}: {'ok' if ok else 'FAIL'}  max rel loss diff {worst:.2e} over {len(la)} steps;"
      f" cuda {la[0]:.6f} -> {la[-1]:.6f}, cpu {lb[0]:.6f} -> {lb[-1]:.6f}")
sys.exit(0 if ok else 1)
EOF
}

# The compile flags of a variant: cuda (generated kernels), cublas, cpu; hostcopy is cublas
# compiled with PPCC_GPU_COPIES=host (buffer copies left to the host, as before 2026-11-28).
target_flags() {
  case $1 in
    cuda) echo "--target cuda --gpu-gemm kernels" ;;
    cublas|hostcopy) echo "--target cuda --gpu-gemm cublas" ;;
    *) echo "--target $1" ;;
  esac
}

step_time() { grep -o 'measured [^(]*' "$1" | head -1 | sed 's/measured //'; }
predicted() { grep -o 'predicted: iteration [0-9.]* [mu]*s' "$1" | head -1 | sed 's/predicted: iteration //'; }

say ""
say "## 1. 2-stage training, CUDA vs CPU (10 steps, synthetic data, seed 0)"
for m in mlp gpt cnn two_tower; do
  extra=""
  [ "$m" = two_tower ] && extra="--loss mse"
  for t in cuda cublas cpu; do
    if ! timeout 300 "$PPCC" "examples/$m.onnx" -o "$W/${m}_$t" --stages 2 $(target_flags $t) $extra \
        >"$OUT/${m}_$t.compile.log" 2>&1; then
      say "$m: compile --target $t FAILED:"; tail -5 "$OUT/${m}_$t.compile.log" | tee -a "$OUT/summary.txt"
      fail=1; continue
    fi
    timeout 300 "$PPCC" run "$W/${m}_$t" --steps 10 >"$OUT/${m}_$t.run.log" 2>&1 \
      || { say "$m: run --target $t FAILED:"; tail -5 "$OUT/${m}_$t.run.log" | tee -a "$OUT/summary.txt"; fail=1; }
  done
  compare "$m" "$OUT/${m}_cuda.run.log" "$OUT/${m}_cpu.run.log" || fail=1
  compare "$m (cublas)" "$OUT/${m}_cublas.run.log" "$OUT/${m}_cpu.run.log" || fail=1
  say "   step time: cuda $(step_time "$OUT/${m}_cuda.run.log"), cuda+cublas $(step_time "$OUT/${m}_cublas.run.log"), cpu $(step_time "$OUT/${m}_cpu.run.log")"
done

say ""
say "## 2. ptxas"
if command -v ptxas >/dev/null; then
  n=0; bad=0
  for f in "$W"/*_cuda/stage*/*.ptx "$W"/*_cublas/stage*/*.ptx; do
    n=$((n + 1))
    ptxas -arch=sm_90 "$f" -o "$W/x.cubin" 2>>"$OUT/ptxas.log" || bad=$((bad + 1))
  done
  say "ptxas sm_90: $((n - bad)) of $n PTX files assemble"
  [ "$bad" = 0 ] || fail=1
else
  say "ptxas not on PATH: skipped"
fi

say ""
say "## 3. Benchmarks (time per step; 2 stages on the one GPU / on this CPU)"
python3 bench/gen_models.py --out "$W/models" --no-check --layers 4 --d-model 256 --heads 4 \
  --seq 128 --vocab 4096 --user-width 1024 --item-width 1536 >"$OUT/gen.log" 2>&1 \
  || { say "generating the bench models failed"; tail -3 "$OUT/gen.log"; }
bench() { # name model extra...
  local name=$1 model=$2; shift 2
  for t in cuda cublas hostcopy cpu; do
    copies=; [ $t = hostcopy ] && copies=host
    PPCC_GPU_COPIES=$copies timeout 300 "$PPCC" "$model" -o "$W/b_${name}_$t" --stages 2 $(target_flags $t) "$@" \
      >"$OUT/b_${name}_$t.compile.log" 2>&1 || { say "$name: compile $t failed"; tail -3 "$OUT/b_${name}_$t.compile.log"; continue; }
    # Each GPU run also times its kernels one by one (PPCC_GPU_PROFILE: a table in the log).
    PPCC_GPU_PROFILE=1 timeout 300 "$PPCC" run "$W/b_${name}_$t" --steps 6 >"$OUT/b_${name}_$t.run.log" 2>&1 \
      || { say "$name: run $t failed"; tail -3 "$OUT/b_${name}_$t.run.log"; }
  done
  say "$name: cuda $(step_time "$OUT/b_${name}_cuda.run.log") | cuda+cublas $(step_time "$OUT/b_${name}_cublas.run.log") | cublas, host copies $(step_time "$OUT/b_${name}_hostcopy.run.log") | cpu $(step_time "$OUT/b_${name}_cpu.run.log") | h100 prediction $(predicted "$OUT/b_${name}_cuda.compile.log")"
  compare "$name" "$OUT/b_${name}_cuda.run.log" "$OUT/b_${name}_cpu.run.log" || true
  compare "$name (cublas)" "$OUT/b_${name}_cublas.run.log" "$OUT/b_${name}_cpu.run.log" || true
  compare "$name (cublas, host copies)" "$OUT/b_${name}_hostcopy.run.log" "$OUT/b_${name}_cpu.run.log" || true
  # Where the GPU time goes: kernels waited for, cuBLAS, allocations (per device, whole run).
  for t in cuda cublas hostcopy; do
    grep -o 'GPU [^;]*cuBLAS products ([0-9.]* s)' "$OUT/b_${name}_$t.run.log" | head -1 | sed "s/^/   $t: /" | tee -a "$OUT/summary.txt"
  done
  grep -A 8 'PPCC_GPU_PROFILE' "$OUT/b_${name}_cublas.run.log" | sed "s/^/   cublas /" | tee -a "$OUT/summary.txt"
}
bench gpt4-d256 "$W/models/gpt24.onnx" --batch 16 --microbatches 4
bench two-tower-1536 "$W/models/two_tower_big.onnx" --batch 256 --microbatches 4 --loss mse
if python3 -c 'import torch' 2>/dev/null; then
  python3 - <<'EOF' | tee -a "$OUT/summary.txt"
import torch, time
torch.backends.cuda.matmul.allow_tf32 = False
for (m, k, n) in [(64, 1536, 1536), (2048, 256, 1024), (4096, 4096, 4096)]:
    a = torch.randn(m, k, device="cuda"); b = torch.randn(k, n, device="cuda")
    for _ in range(3): a @ b
    torch.cuda.synchronize(); t = time.perf_counter(); r = 20
    for _ in range(r): a @ b
    torch.cuda.synchronize(); dt = (time.perf_counter() - t) / r
    print(f"cuBLAS (torch) f32 GEMM {m}x{k}x{n}: {2*m*k*n/dt/1e12:.1f} TFLOP/s")
EOF
fi
say ""
say "## 3b. GEMM TFLOP/s (f32): ppcc eval of one MatMul, generated kernels vs cuBLAS (the"
say "##     latency includes passing the inputs in, so it is a lower bound on the GEMM's rate)"
python3 - "$W/gemm" <<'EOF' >"$OUT/gemm-models.log" 2>&1 || say "generating the GEMM models failed"
import sys, os, numpy as np, onnx
from onnx import helper, TensorProto
out = sys.argv[1]; os.makedirs(out, exist_ok=True)
for (m, k, n) in [(64, 1536, 1536), (2048, 256, 1024), (4096, 4096, 4096)]:
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "mm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k]),
         helper.make_tensor_value_info("b", TensorProto.FLOAT, [k, n])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [m, n])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), f"{out}/mm_{m}x{k}x{n}.onnx")
    r = np.random.default_rng(0)
    np.savez(f"{out}/mm_{m}x{k}x{n}.npz", a=r.standard_normal((m, k), dtype=np.float32),
             b=r.standard_normal((k, n), dtype=np.float32))
EOF
for f in "$W"/gemm/mm_*.onnx; do
  [ -e "$f" ] || continue
  shape=$(basename "$f" .onnx | sed 's/mm_//')
  line="GEMM $shape:"
  for g in kernels cublas; do
    timeout 300 "$PPCC" eval "$f" --inputs "${f%.onnx}.npz" -o "$W/gemm/out.npz" --target cuda \
      --gpu-gemm $g --repeat 5 >"$OUT/gemm_${shape}_$g.log" 2>&1
    ms=$(grep -o 'median [0-9.]* ms' "$OUT/gemm_${shape}_$g.log" | awk '{print $2}')
    if [ -n "$ms" ]; then
      rate=$(python3 -c "m,k,n=map(int,'$shape'.split('x')); print(f'{2*m*k*n/($ms*1e-3)/1e12:.2f}')")
      line="$line $g $rate TFLOP/s ($ms ms);"
    else
      line="$line $g FAILED ($(tail -1 "$OUT/gemm_${shape}_$g.log"));"
    fi
  done
  say "$line"
done

say ""
say "## 4. NCCL between GPUs (--nccl; needs 2 GPUs)"
ngpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | wc -l)
if [ "$ngpu" -ge 2 ] && [ -d "$W/gpt_cuda" ]; then
  timeout 300 "$PPCC" run "$W/gpt_cuda" --steps 10 --nccl >"$OUT/gpt_nccl.run.log" 2>&1 \
    || { say "gpt: run --nccl FAILED:"; tail -5 "$OUT/gpt_nccl.run.log" | tee -a "$OUT/summary.txt"; fail=1; }
  compare "gpt --nccl" "$OUT/gpt_nccl.run.log" "$OUT/gpt_cpu.run.log" || fail=1
  say "   step time: --nccl $(step_time "$OUT/gpt_nccl.run.log"), without $(step_time "$OUT/gpt_cuda.run.log")"
else
  say "$ngpu GPU(s): skipped (NCCL puts each device on its own GPU)"
fi
rm -rf "$W"
say ""
say "result: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
