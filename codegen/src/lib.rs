//! # ppcc-codegen
//!
//! ppir stage functions → MLIR (`func`, `linalg`, `tensor`, `arith`, `math`) text
//! ([`lower`]) → bufferized, lowered to the LLVM dialect by a melior pass pipeline, translated
//! to LLVM IR, compiled to an object by inkwell's `TargetMachine`, linked into a shared object
//! ([`compile`]) with a C entry `ppcc_call_<name>(void *ctx, void **descriptors)` per
//! function (the ABI is described in [`lower`]).

pub mod compile;
mod copies;
mod free_early;
pub mod gpu;
pub mod library;
pub mod lower;
pub mod package;
mod results;
pub mod support_cache;
pub mod tiling;

pub use compile::{
    compile_to_object, compile_to_shared_object, link_shared, CompileError, CompileOptions,
};
pub use gpu::{CudaOptions, GpuGemm};
pub use lower::{
    lower_function, lower_functions, lower_functions_with, LowerError, LowerOptions, Signature,
};
pub use package::{build_module, BuildOptions, Built, CodegenError};
