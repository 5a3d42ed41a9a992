//! Cost model: how much work an op, a phase and a function are, and how long that takes on
//! a device.
//!
//! The input is the training program autodiff and the optimizer builder produce (`@grad`
//! with ops tagged `fwd` / `bwd_input` / `bwd_weight`, `@optim` with `optim`), with static
//! shapes (run `bind-batch` first). The consumers are the partitioners, the rewrite pass
//! and the simulator.
//!
//! - [`op_cost`] / [`op_cost_of`]: FLOPs, bytes read and written and output bytes of one op
//!   from its kind, attributes and operand/result types ([`OpCost`]; the counting rules
//!   are documented in `op.rs`).
//! - [`function_costs`], [`op_costs`], [`function_times`], [`op_times`]: sums per training phase
//!   ([`PerPhase`]), per-op lists for partitioners, and [`param_bytes`] / [`state_bytes`].
//! - [`DeviceProfile`]: peak FLOP/s per dtype, memory bandwidth and size, link bandwidth
//!   and latency, per-op overhead. `h100` and `a100` ship as JSON files in
//!   `passes/profiles/` (embedded in the binary); `host` is measured on this machine by a
//!   short micro-benchmark ([`measure_host`]) and cached ([`host_profile_cached`]).
//! - [`op_time`]: the roofline `max(flops / peak, bytes / bandwidth) + overhead`;
//!   [`comm_time`]: `latency + bytes / link bandwidth`.
//!
//! ```
//! use ppcc_passes::cost::{op_cost_of, op_time, DeviceProfile};
//! use ppir::{Attrs, DType, OpKind, TensorType};
//! let a = TensorType::of(DType::F32, &[64, 128]);
//! let b = TensorType::of(DType::F32, &[128, 32]);
//! let y = TensorType::of(DType::F32, &[64, 32]);
//! let c = op_cost_of(OpKind::MatMul, &Attrs::new(), &[&a, &b], &[&y]).unwrap();
//! assert_eq!(c.flops, 2.0 * 64.0 * 128.0 * 32.0);
//! let h100 = DeviceProfile::builtin("h100").unwrap();
//! assert!(op_time(&c, DType::F32, &h100) > 0.0);
//! ```

mod function;
mod host;
mod measure;
mod op;
mod profile;

use std::path::PathBuf;

pub use function::{
    compute_dtype, function_costs, function_times, op_cost, op_costs, op_times, param_bytes,
    state_bytes, PerPhase, PhaseCosts, PhaseTimes,
};
pub use host::{
    host_cache_path, host_key, host_profile_cached, host_profile_cached_at, measure_host,
};
pub use measure::{measure_function_ops, measured_op_time, op_time_in};
pub use op::{op_cost_of, OpCost, OpCostError, TRANSCENDENTAL_FLOPS};
pub use profile::{bound, comm_time, op_time, Bound, DeviceProfile, BUILTIN_PROFILES};

/// Why a cost could not be computed or a profile not loaded.
#[derive(Debug, thiserror::Error)]
pub enum CostError {
    /// An op (or argument) whose cost is undefined: a symbolic `?` dimension, a missing or
    /// ill-typed attribute, operands that do not fit the op.
    #[error("{what}: {source}")]
    Invalid { what: String, source: OpCostError },
    /// A device profile that does not parse or has a bad field.
    #[error("device profile `{origin}`: {}{message}", field_prefix(.path))]
    Profile {
        origin: String,
        /// The field at fault (`peak_flops.f32`); empty for the whole object.
        path: String,
        message: String,
    },
    /// A name [`DeviceProfile::builtin`] does not know.
    #[error("unknown device profile `{0}` (known: h100, a100, host)")]
    UnknownProfile(String),
    /// Reading or writing a profile file.
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// "`path`: " before a profile error's message, nothing for the whole object.
fn field_prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("`{path}`: ")
    }
}
