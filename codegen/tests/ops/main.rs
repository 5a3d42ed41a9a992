//! Every lowered op against the reference interpreter: ppir text → MLIR → `module.so` →
//! `ppcc_call_<fn>` through the runtime's loader → compared with `ppir::interp` (f32
//! rounding per op), `|native − interp| ≤ 1e-5 · max(1, |interp|)`, integers exactly.
//!
//! One test binary for all op families (MLIR and LLVM are linked statically: each test
//! target is a large link). `PPCC_CODEGEN_KEEP=1` keeps each case's build directory
//! (stage.mlir, module.llvm.mlir, module.ll, module.so) under the target's tmp dir.

mod common;

mod basic;
mod comm;
mod contraction;
mod elementwise;
mod movement;
mod norm;
mod pool;
mod reduce;
