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

use std::collections::BTreeMap;
use std::path::Path;

use ppir::DType;
use serde_json::{Map, Value};

use super::op::OpCost;
use super::CostError;

/// The names [`DeviceProfile::builtin`] knows.
pub const BUILTIN_PROFILES: [&str; 3] = ["h100", "a100", "host"];

const H100: &str = include_str!("../../profiles/h100.json");
const A100: &str = include_str!("../../profiles/a100.json");

/// What one device can do.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceProfile {
    pub name: String,
    /// The device in words.
    pub description: String,
    /// Where the numbers come from (spec sheet, measurement).
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
    pub measure_ops: bool,
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
        let v: Value = serde_json::from_str(text).map_err(|e| CostError::Profile {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        DeviceProfile::from_value(&v, origin)
    }

    /// Build from an already parsed JSON object.
    pub fn from_value(v: &Value, origin: &str) -> Result<DeviceProfile, CostError> {
        let bad = |message: String| CostError::Profile {
            origin: origin.to_string(),
            message,
        };
        let obj = v
            .as_object()
            .ok_or_else(|| bad("expected a JSON object".into()))?;
        let text = |key: &str| -> Result<String, CostError> {
            match obj.get(key) {
                None => Ok(String::new()),
                Some(Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(bad(format!("`{key}` must be a string"))),
            }
        };
        let positive = |key: &str, x: Option<&Value>| -> Result<f64, CostError> {
            let x = x
                .ok_or_else(|| bad(format!("missing `{key}`")))?
                .as_f64()
                .ok_or_else(|| bad(format!("`{key}` must be a number")))?;
            if !x.is_finite() || x < 0.0 {
                return Err(bad(format!("`{key}` must be a finite number ≥ 0, got {x}")));
            }
            Ok(x)
        };
        let num = |key: &str| positive(key, obj.get(key));
        let name = text("name")?;
        if name.is_empty() {
            return Err(bad("missing `name`".into()));
        }
        let mut peak_flops = BTreeMap::new();
        let peaks = obj
            .get("peak_flops")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("missing `peak_flops` (an object of dtype → FLOP/s)".into()))?;
        for (k, x) in peaks {
            let p = positive(&format!("peak_flops.{k}"), Some(x))?;
            if p == 0.0 {
                return Err(bad(format!("`peak_flops.{k}` must be > 0")));
            }
            peak_flops.insert(k.clone(), p);
        }
        if !peak_flops.contains_key("f32") {
            return Err(bad(
                "`peak_flops` needs an `f32` entry (the fallback)".into()
            ));
        }
        let profile = DeviceProfile {
            name,
            description: text("description")?,
            source: text("source")?,
            peak_flops,
            memory_bandwidth: num("memory_bandwidth")?,
            memory_bytes: num("memory_bytes")?,
            link_bandwidth: num("link_bandwidth")?,
            link_latency: num("link_latency")?,
            op_overhead: num("op_overhead")?,
            measure_ops: match obj.get("measure_ops") {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => return Err(bad("`measure_ops` must be true or false".into())),
            },
        };
        for (key, x) in [
            ("memory_bandwidth", profile.memory_bandwidth),
            ("link_bandwidth", profile.link_bandwidth),
        ] {
            if x == 0.0 {
                return Err(bad(format!("`{key}` must be > 0")));
            }
        }
        Ok(profile)
    }

    /// The profile as a JSON object (what [`DeviceProfile::from_value`] reads).
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("name".into(), self.name.clone().into());
        m.insert("description".into(), self.description.clone().into());
        m.insert("source".into(), self.source.clone().into());
        let peaks: Map<String, Value> = self
            .peak_flops
            .iter()
            .map(|(k, &v)| (k.clone(), v.into()))
            .collect();
        m.insert("peak_flops".into(), Value::Object(peaks));
        m.insert("memory_bandwidth".into(), self.memory_bandwidth.into());
        m.insert("memory_bytes".into(), self.memory_bytes.into());
        m.insert("link_bandwidth".into(), self.link_bandwidth.into());
        m.insert("link_latency".into(), self.link_latency.into());
        m.insert("op_overhead".into(), self.op_overhead.into());
        if self.measure_ops {
            m.insert("measure_ops".into(), true.into());
        }
        Value::Object(m)
    }

    /// The profile as pretty JSON text.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(&self.to_value()).expect("a JSON value always prints")
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
