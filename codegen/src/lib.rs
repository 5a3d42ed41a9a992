//! # ppcc-codegen (prototype)
//!
//! ppir stage functions → MLIR (`func`, `linalg`, `tensor`, `arith`, `math`) text
//! ([`lower`]) → bufferized, lowered to the LLVM dialect by a melior pass pipeline, translated
//! to LLVM IR, compiled to an object by inkwell's `TargetMachine`, linked into a shared object
//! with a C entry `_mlir_ciface_<name>` per function ([`compile`]).
//!
//! C ABI of an entry: `void _mlir_ciface_<name>(in0*, in1*, ..., out0*, out1*, ...)`, each a
//! pointer to a ranked memref descriptor
//! `{ float *allocated, float *aligned, int64_t offset, int64_t sizes[r], int64_t strides[r] }`
//! of a dense row-major buffer; outputs are buffers the caller allocates.

pub mod compile;
pub mod lower;

pub use compile::{
    compile_to_object, compile_to_shared_object, link_shared, CompileError, CompileOptions,
};
pub use lower::{lower_function, lower_functions, LowerError, Signature};
