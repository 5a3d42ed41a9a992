#!/usr/bin/env bash
# Install what ppcc needs on Debian 12, skipping whatever is already there.
#   scripts/setup.sh           build tools only (Rust, Open MPI, LLVM/MLIR 22)
#   scripts/setup.sh --test    also the test tools (lit/FileCheck, Python venv with onnx)
# Idempotent; safe to run on every invocation of the demo and test scripts.
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[[ "${1:-}" == "--test" ]] && want_test=1

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

apt_missing=()
need_pkg() { dpkg -s "$1" >/dev/null 2>&1 || apt_missing+=("$1"); }

need_pkg build-essential
need_pkg pkg-config
need_pkg curl
need_pkg ca-certificates
need_pkg libopenmpi-dev      # the runtime's MPI transport (feature `mpi`): mpi.h, libmpi
need_pkg openmpi-bin         # mpirun
need_pkg libclang-22-dev     # libclang for bindgen (the `mpi` crate's build script)
# MLIR/LLVM 22 for the codegen crate (melior links the MLIR C API statically, inkwell LLVM).
for p in llvm-22-dev libmlir-22-dev mlir-22-tools clang-22 libpolly-22-dev libzstd-dev \
         zlib1g-dev libxml2-dev libz3-dev; do
  need_pkg "$p"
done
if [[ $want_test -eq 1 ]]; then
  need_pkg llvm-22-tools     # lit, FileCheck, not (in /usr/lib/llvm-22/bin)
  need_pkg python3-venv
fi
if [[ ${#apt_missing[@]} -gt 0 ]]; then
  echo "setup: installing ${apt_missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_missing[@]}" >/dev/null
fi

# Rust: Debian 12's cargo is too old; use rustup's stable toolchain when none is installed.
if ! command -v cargo >/dev/null 2>&1; then
  if [[ -x "$HOME/.cargo/bin/cargo" ]]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "setup: installing Rust with rustup" >&2
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal -c clippy,rustfmt >&2
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
fi

if [[ $want_test -eq 1 ]]; then
  if [[ ! -x .venv/bin/python ]] || ! .venv/bin/python -c "import onnx, onnxruntime, numpy" 2>/dev/null \
     || ! cmp -s scripts/requirements-test.txt .venv/.requirements 2>/dev/null; then
    echo "setup: creating .venv with $(grep -v '^#' scripts/requirements-test.txt | tr '\n' ' ')" >&2
    python3 -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check -r scripts/requirements-test.txt
    cp scripts/requirements-test.txt .venv/.requirements
  fi
fi
