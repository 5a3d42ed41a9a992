//! Device profiles and the roofline time model.
//!
//! A profile is a small JSON object (the files in `passes/profiles/`, embedded in the
//! binary so nothing is read at run time):
//!
//! ```json
//! { "name": "h100", "description": "...", "source": "where the numbers come from",
//!   "peak_flops": { "f32": 67e12, "bf16": 989.4e12, ... },
//!   "memory_bandwidth": 3.35e12, "memory_bytes": 80e9,
//!   "link_bandwidth": 450e9, "link_latency": 5e-6, "op_overhead": 5e-6 }
//! ```
//!
//! Units are FLOP/s, bytes/s, bytes and seconds. `peak_flops` is keyed by the IR's dtype
//! names (`f64 f32 f16 bf16 i64 i32 i8`, plus `tf32`, which no IR dtype selects by
//! itself: codegen lowers f32 matmuls as plain f32); a dtype without an entry uses `f32`'s.
//! `description`, `source` and `measure_ops` are optional; any other field is required and
//! an unknown field is an error, reported with the path of the field at fault.

use std::collections::BTreeMap;
use std::path::Path;

use ppir::DType;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::op::OpCost;
use super::CostError;

/// The names [`DeviceProfile::builtin`] knows.
pub const BUILTIN_PROFILES: [&str; 3] = ["h100", "a100", "host"];

const H100: &str = include_str!("../../profiles/h100.json");
const A100: &str = include_str!("../../profiles/a100.json");

/// What one device can do; also the profile file's format (field for field, strict: an
/// unknown or missing field is an error naming its path).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceProfile {
    pub name: String,
    /// The device in words.
    #[serde(default)]
    pub description: String,
    /// Where the numbers come from (spec sheet, measurement).
    #[serde(default)]
    pub source: String,
    /// Peak FLOP/s by dtype name; see the module documentation.
    pub peak_flops: BTreeMap<String, f64>,
    /// Main-memory bandwidth, bytes/s.
    pub memory_bandwidth: f64,
    /// Memory capacity, bytes (0: unknown).
    pub memory_bytes: f64,
    /// Bandwidth of the link to a neighbouring device, one direction, bytes/s.
    pub link_bandwidth: f64,
    /// Latency of one message over that link, seconds.
    pub link_latency: f64,
    /// Fixed cost of running one op (kernel launch, dispatch), seconds.
    pub op_overhead: f64,
    /// Time each op by running it with the reference interpreter on this machine
    /// ([`super::op_time_in`]) instead of the roofline (the `host` profile: predictions of
    /// what `ppcc run` will measure here).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub measure_ops: bool,
}

/// A profile that does not deserialize, with the path of the field at fault.
fn schema_error<E: std::fmt::Display>(origin: &str, e: serde_path_to_error::Error<E>) -> CostError {
    let path = e.path().to_string();
    CostError::Profile {
        origin: origin.to_string(),
        // `.`: the top-level object (a missing or unknown field, which the message names).
        path: if path == "." { String::new() } else { path },
        message: e.into_inner().to_string(),
    }
}

impl DeviceProfile {
    /// A built-in profile: `h100`, `a100` (spec-sheet numbers, embedded), or `host`
    /// (measured on this machine, cached; see [`super::host_profile_cached`]).
    pub fn builtin(name: &str) -> Result<DeviceProfile, CostError> {
        match name {
            "h100" => DeviceProfile::from_json(H100, "h100"),
            "a100" => DeviceProfile::from_json(A100, "a100"),
            "host" => super::host::host_profile_cached(false),
            _ => Err(CostError::UnknownProfile(name.to_string())),
        }
    }

    /// Read a profile from a JSON file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<DeviceProfile, CostError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| CostError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        DeviceProfile::from_json(&text, &path.display().to_string())
    }

    /// Parse a profile; `origin` names it in errors (a file name or builtin name).
    pub fn from_json(text: &str, origin: &str) -> Result<DeviceProfile, CostError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let p: DeviceProfile =
            serde_path_to_error::deserialize(&mut de).map_err(|e| schema_error(origin, e))?;
        // Nothing but whitespace after the object.
        de.end().map_err(|e| CostError::Profile {
            origin: origin.to_string(),
            path: String::new(),
            message: e.to_string(),
        })?;
        p.validate(origin)?;
        Ok(p)
    }

    /// Build from an already parsed JSON object.
    pub fn from_value(v: &Value, origin: &str) -> Result<DeviceProfile, CostError> {
        let p: DeviceProfile =
            serde_path_to_error::deserialize(v).map_err(|e| schema_error(origin, e))?;
        p.validate(origin)?;
        Ok(p)
    }

    /// What the types cannot say: a name, finite non-negative numbers, positive peaks and
    /// bandwidths (they divide), an `f32` peak (the fallback).
    fn validate(&self, origin: &str) -> Result<(), CostError> {
        let bad = |path: String, message: String| CostError::Profile {
            origin: origin.to_string(),
            path,
            message,
        };
        if self.name.is_empty() {
            return Err(bad("name".into(), "must not be empty".into()));
        }
        let peaks = self
            .peak_flops
            .iter()
            .map(|(k, &x)| (format!("peak_flops.{k}"), x, true));
        let numbers = [
            ("memory_bandwidth", self.memory_bandwidth, true),
            ("memory_bytes", self.memory_bytes, false),
            ("link_bandwidth", self.link_bandwidth, true),
            ("link_latency", self.link_latency, false),
            ("op_overhead", self.op_overhead, false),
        ]
        .map(|(k, x, nonzero)| (k.to_string(), x, nonzero));
        for (path, x, nonzero) in peaks.chain(numbers) {
            if !x.is_finite() || x < 0.0 {
                return Err(bad(path, format!("must be a finite number ≥ 0, got {x}")));
            }
            if nonzero && x == 0.0 {
                return Err(bad(path, "must be > 0".into()));
            }
        }
        if !self.peak_flops.contains_key("f32") {
            return Err(bad(
                "peak_flops".into(),
                "needs an `f32` entry (the fallback)".into(),
            ));
        }
        Ok(())
    }

    /// The profile as a JSON object (what [`DeviceProfile::from_value`] reads).
    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        serde_json::to_value(self)
    }

    /// The profile as pretty JSON text.
    pub fn to_json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }

    /// Peak FLOP/s for ops computing in `dtype` (bool counts as `i8`; a dtype without an
    /// entry uses `f32`'s).
    pub fn peak_flops(&self, dtype: DType) -> f64 {
        let key = match dtype {
            DType::Bool => "i8",
            d => d.name(),
        };
        self.peak_flops
            .get(key)
            .or_else(|| self.peak_flops.get("f32"))
            .copied()
            .unwrap_or(f64::INFINITY)
    }
}

/// What limits an op under the roofline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// FLOPs / peak ≥ bytes / bandwidth.
    Compute,
    /// Bytes / bandwidth > FLOPs / peak.
    Memory,
}

fn compute_and_memory(cost: &OpCost, dtype: DType, profile: &DeviceProfile) -> (f64, f64) {
    (
        cost.flops / profile.peak_flops(dtype),
        cost.bytes() / profile.memory_bandwidth,
    )
}

/// Seconds an op with `cost` computing in `dtype` takes on `profile`: the roofline
/// `max(flops / peak(dtype), (bytes read + written) / memory bandwidth)` plus the per-op
/// overhead.
pub fn op_time(cost: &OpCost, dtype: DType, profile: &DeviceProfile) -> f64 {
    let (c, m) = compute_and_memory(cost, dtype, profile);
    c.max(m) + profile.op_overhead
}

/// Which side of the roofline an op is on.
pub fn bound(cost: &OpCost, dtype: DType, profile: &DeviceProfile) -> Bound {
    let (c, m) = compute_and_memory(cost, dtype, profile);
    if c >= m {
        Bound::Compute
    } else {
        Bound::Memory
    }
}

/// Seconds to move `bytes` to a neighbouring device: latency + bytes / link bandwidth.
pub fn comm_time(bytes: f64, profile: &DeviceProfile) -> f64 {
    profile.link_latency + bytes / profile.link_bandwidth
}
