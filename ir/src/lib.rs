//! # ppir — the ppcc intermediate representation
//!
//! Plain data in the middle of the compiler: tensor [`types`], the op set ([`ops`]),
//! [`module`]s of functions with SSA values, a [`text`]ual form that round-trips, a
//! [`verify`]er, [`shape`] inference, and a reference [`interp`]reter that is the oracle
//! for everything generated later.
//!
//! ```
//! let src = r#"
//! module {
//!   func @main(%x: tensor<2x3xf32>) -> (tensor<2x3xf32>) {
//!     %y = "pp.relu"(%x) : (tensor<2x3xf32>) -> tensor<2x3xf32>
//!     return %y : tensor<2x3xf32>
//!   }
//! }
//! "#;
//! let module = ppir::text::parse_module(src).unwrap();
//! ppir::verify::verify_module(&module).unwrap();
//! ```

pub mod abi;
pub mod attr;
pub mod interp;
pub mod memory;
pub mod module;
pub mod ops;
pub mod schedule;
pub mod shape;
pub mod shard;
pub mod size;
pub mod tensor;
pub mod text;
pub mod types;
pub mod verify;

pub use attr::{Attr, Attrs};
pub use module::{ArgKind, Function, Module, NewOp, OpData, OpId, Use, ValueDef, ValueId};
pub use ops::{OpKind, Phase};
pub use size::SizeError;
pub use tensor::{Tensor, TensorData};
pub use types::{DType, Dim, TensorType};
