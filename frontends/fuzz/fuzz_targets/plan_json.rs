//! Any bytes as `plan.json`: an error or a plan, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ppcc_runtime::pipeline::PlanSpec;

fuzz_target!(|data: &[u8]| {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = PlanSpec::from_json(&v, std::path::Path::new("."));
    }
});
