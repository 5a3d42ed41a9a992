#!/usr/bin/env bash
# Run every ppcc test: formatting, clippy, the Rust tests (unit, integration, conformance
# against the onnx package's reference outputs), and the lit suite. Installs what it needs.
# Ends with one line `N passed, N failed` (checks + tests + lit cases).
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }
[[ -d "$HOME/.cargo/bin" ]] && export PATH="$HOME/.cargo/bin:$PATH"

export PPCC_PYTHON="$PWD/.venv/bin/python"
PPCC_ONNX_TESTDATA="$("$PPCC_PYTHON" -c 'import onnx, os; print(os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data"))')"
export PPCC_ONNX_TESTDATA
export CARGO_TERM_COLOR=never

logs="$(mktemp -d)"
passed=0
failed=0
failures=()

check() {  # check NAME CMD... — a step that counts as one pass or one failure
  local name="$1"; shift
  echo "==> $name: $*"
  if "$@" >"$logs/$name.log" 2>&1; then
    passed=$((passed + 1))
  else
    cat "$logs/$name.log"
    failed=$((failed + 1)); failures+=("$name")
  fi
}

check fmt cargo fmt --all --check
check clippy cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> cargo test --workspace"
# Also builds what lit runs: ppcc, ppcc-opt and the example pass plugin (a workspace member).
cargo build --workspace --locked 2>&1 | tail -n 3
cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$logs/cargo-test.log"
test_rc=${PIPESTATUS[0]}
t_pass=$(grep -E '^test result:' "$logs/cargo-test.log" | sed -E 's/.* ([0-9]+) passed.*/\1/' | awk '{s+=$1} END {print s+0}')
t_fail=$(grep -E '^test result:' "$logs/cargo-test.log" | sed -E 's/.* ([0-9]+) failed.*/\1/' | awk '{s+=$1} END {print s+0}')
passed=$((passed + ${t_pass:-0})); failed=$((failed + ${t_fail:-0}))
if [[ $test_rc -ne 0 && ${t_fail:-0} -eq 0 ]]; then failed=$((failed + 1)); failures+=("cargo-test(build)"); fi
[[ ${t_fail:-0} -gt 0 ]] && failures+=("cargo-test")

echo "==> lit lit/"
/usr/lib/llvm-22/bin/lit -sv lit/ 2>&1 | tee "$logs/lit.log"
lit_rc=${PIPESTATUS[0]}
l_pass=$(grep -E '^ *Passed *:' "$logs/lit.log" | grep -oE '[0-9]+' | head -1)
l_fail=$(grep -E '^ *(Failed|Unresolved|Timed Out) *:' "$logs/lit.log" | grep -oE '[0-9]+' | awk '{s+=$1} END {print s+0}')
passed=$((passed + ${l_pass:-0})); failed=$((failed + ${l_fail:-0}))
if [[ $lit_rc -ne 0 && ${l_fail:-0} -eq 0 ]]; then failed=$((failed + 1)); failures+=("lit(run)"); fi
[[ ${l_fail:-0} -gt 0 ]] && failures+=("lit")

# Fuzz the readers (ONNX, npz, plan.json, CSV schedules; also through the ppcc binary) for a
# bounded time from a fixed seed, after replaying every saved finding in tests/fuzz-findings/.
# PPCC_FUZZ_SECONDS=3600 scripts/test.sh (or target/debug/ppcc-fuzz --seconds 3600) runs longer.
check fuzz target/debug/ppcc-fuzz --seconds "${PPCC_FUZZ_SECONDS:-60}"

echo
[[ ${#failures[@]} -gt 0 ]] && echo "failing steps: ${failures[*]}"
echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
