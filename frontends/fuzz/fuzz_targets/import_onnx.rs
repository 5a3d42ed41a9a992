//! Any bytes into the ONNX importer: an error or a module, never a panic, and no
//! allocation far beyond the input's size.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ppcc_frontends::onnx::{import_onnx, ImportOptions};

fuzz_target!(|data: &[u8]| {
    let _ = import_onnx(data, &ImportOptions::default());
    let _ = import_onnx(
        data,
        &ImportOptions {
            batch: Some(2),
            ..Default::default()
        },
    );
});
