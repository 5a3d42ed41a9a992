//! Compiles the C parts of ppcc's generated modules for any CPU of the target architecture:
//! the support library (`src/support.c`, its ABI declared in `include/ppcc_support.h`),
//! linked into the host code of CUDA modules, and the GPU runtime shim (`src/gpu_shim.c`).
//! Their objects are embedded in the crate (`compile.rs`), so a C error shows at build
//! time. CPU modules link `support.c` compiled for the host CPU (`-march=native`), which
//! `compile.rs` builds on first use and caches.

use std::path::PathBuf;

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("set by cargo"));
    for f in ["src/support.c", "src/gpu_shim.c", "include/ppcc_support.h"] {
        println!("cargo:rerun-if-changed={f}");
    }
    for (src, obj) in [
        ("src/support.c", "support-portable.o"),
        ("src/gpu_shim.c", "gpu-shim.o"),
    ] {
        // An absolute path: support.c includes itself through `__FILE__`.
        let objects = cc::Build::new()
            .file(dir.join(src))
            .include(dir.join("include"))
            .opt_level(3)
            .pic(true)
            .debug(false)
            .flag("-std=gnu11")
            .warnings(false)
            .cargo_metadata(false)
            .compile_intermediates();
        let [object] = objects.as_slice() else {
            panic!("compiling {src} gave {} objects", objects.len());
        };
        std::fs::copy(object, out.join(obj))
            .unwrap_or_else(|e| panic!("copying the object of {src}: {e}"));
    }
}
