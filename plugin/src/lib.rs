//! # ppcc-plugin — write ppcc passes outside ppcc
//!
//! A ppcc pass plugin is a shared library (`crate-type = ["cdylib"]`) that ppcc loads at run
//! time (`ppcc-opt --load-pass-plugin LIB.so`). This crate owns the contract between the two:
//!
//! - [`abi`]: the versioned C ABI (one entry point returning a descriptor; passes that take
//!   and return the module as ppir text). ppcc's loader (`ppcc_passes::plugin`) reads it;
//!   `include/ppcc_plugin.h` declares the same types for plugins written in C.
//! - [`declare_plugin!`]: the safe way to export Rust passes. A pass is an ordinary function
//!   `fn(ppir::Module, &str) -> Result<ppir::Module, E>` (`E: Display`); the macro generates
//!   the entry point and, per pass, a C function that parses the module text, calls the pass,
//!   prints the result, and turns an error or a panic into a message (nothing unwinds across
//!   the boundary).
//! - [`Options`]: parses the `key=value,...` options string a pass receives.
//!
//! ```
//! use ppir::Module;
//!
//! fn rename_main(mut m: Module, options: &str) -> Result<Module, ppcc_plugin::OptionsError> {
//!     let options = ppcc_plugin::Options::parse(options)?;
//!     options.expect_only(&["to"])?;
//!     let to = options.get("to").unwrap_or("entry");
//!     if let Some(f) = m.function_mut("main") {
//!         f.name = to.to_string();
//!     }
//!     Ok(m)
//! }
//!
//! ppcc_plugin::declare_plugin! {
//!     name: "doc-example",
//!     version: env!("CARGO_PKG_VERSION"),
//!     passes: [
//!         { name: "rename-main", description: "rename @main: rename-main{to=NAME}", run: rename_main },
//!     ],
//! }
//! # fn main() {
//! #     let d = unsafe { &*ppcc_pass_plugin() };
//! #     assert_eq!(d.abi_version, ppcc_plugin::abi::ABI_VERSION);
//! #     assert_eq!(d.num_passes, 1);
//! # }
//! ```
//!
//! See `docs/plugins.md` for building and loading a plugin, and `examples/pass-plugin/` for
//! a complete one.

pub mod abi;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fmt::Display;
use std::os::raw::c_char;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use abi::{
    Buffer, Bytes, PassDescriptor, PluginDescriptor, RunPassFn, ABI_VERSION, STATUS_FAILED,
    STATUS_OK, STATUS_PANICKED,
};
use ppir::text::{parse_module, print_module, PrintOptions};
use ppir::Module;

/// The ppir crate this plugin exchanges modules with (its text format is the ABI's).
pub use ppir;

/// One pass to export: its name, its one-line description and its C entry (see
/// [`pass_entry!`], which builds this from a Rust function).
#[derive(Clone, Copy, Debug)]
pub struct PassEntry {
    pub name: &'static str,
    pub description: &'static str,
    pub run: RunPassFn,
}

/// A plugin's descriptor together with the strings and pass table it points into. Built once
/// by the entry point that [`declare_plugin!`] generates and kept for the life of the library.
#[derive(Debug)]
pub struct Descriptor {
    _strings: Vec<CString>,
    _passes: Vec<PassDescriptor>,
    plugin: PluginDescriptor,
}

impl Descriptor {
    /// Build a descriptor of the current [`ABI_VERSION`]; a name, version or description
    /// with a NUL byte is refused (the generated entry point then returns null, which ppcc
    /// reports as an invalid descriptor).
    pub fn new(
        name: &str,
        version: &str,
        passes: Vec<PassEntry>,
    ) -> Result<Descriptor, std::ffi::NulError> {
        let mut strings = vec![CString::new(name)?, CString::new(version)?];
        let mut table = Vec::with_capacity(passes.len());
        for p in &passes {
            strings.push(CString::new(p.name)?);
            strings.push(CString::new(p.description)?);
            let n = strings.len();
            // A CString's bytes live on the heap: moving the Vec does not move them.
            table.push(PassDescriptor {
                name: strings[n - 2].as_ptr(),
                description: strings[n - 1].as_ptr(),
                run: Some(p.run),
            });
        }
        let plugin = PluginDescriptor {
            abi_version: ABI_VERSION,
            name: strings[0].as_ptr(),
            version: strings[1].as_ptr(),
            free_buffer: Some(free_buffer),
            passes: table.as_ptr(),
            num_passes: table.len(),
        };
        Ok(Descriptor {
            _strings: strings,
            _passes: table,
            plugin,
        })
    }

    /// The C descriptor (valid while `self` lives).
    pub fn as_ptr(&self) -> *const PluginDescriptor {
        &self.plugin
    }
}

/// What the generated entry point does: build the descriptor once, never unwind.
#[doc(hidden)]
pub fn __entry_point(
    cell: &'static OnceLock<Option<Descriptor>>,
    build: fn() -> Option<Descriptor>,
) -> *const PluginDescriptor {
    catch_unwind(|| match cell.get_or_init(build) {
        Some(d) => d.as_ptr(),
        None => std::ptr::null(),
    })
    .unwrap_or(std::ptr::null())
}

/// The [`abi::FreeBufferFn`] of every plugin built with this crate.
///
/// # Safety
/// `buffer` must come from [`run_pass`] of this same library, and be freed once.
pub unsafe extern "C" fn free_buffer(buffer: Buffer) {
    if !buffer.ptr.is_null() {
        // SAFETY: `run_pass` made this buffer from a `Box<[u8]>` of exactly `len` bytes.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(buffer.ptr, buffer.len)) });
    }
}

fn into_buffer(bytes: Vec<u8>) -> Buffer {
    let b = Box::into_raw(bytes.into_boxed_slice());
    Buffer {
        ptr: b as *mut u8,
        len: b.len(),
    }
}

/// Run a Rust pass behind the C ABI: decode the module text, call `pass`, encode its result;
/// an error becomes [`STATUS_FAILED`] with its message, a panic [`STATUS_PANICKED`].
///
/// # Safety
/// `module` and `options` must be valid for reads; `out` must be null or valid for a write.
pub unsafe fn run_pass<F, E>(pass: F, module: Bytes, options: Bytes, out: *mut Buffer) -> i32
where
    F: FnOnce(Module, &str) -> Result<Module, E>,
    E: Display,
{
    if out.is_null() {
        return STATUS_FAILED;
    }
    let result = catch_unwind(AssertUnwindSafe(|| -> Result<String, RunError<E>> {
        // SAFETY: the caller guarantees both are readable for the call.
        let (module, options) = unsafe { (module.as_slice(), options.as_slice()) };
        let text = std::str::from_utf8(module).map_err(RunError::ModuleUtf8)?;
        let options = std::str::from_utf8(options).map_err(RunError::OptionsUtf8)?;
        let m = parse_module(text).map_err(RunError::Parse)?;
        let m = pass(m, options).map_err(RunError::Pass)?;
        Ok(print_module(&m, &PrintOptions::default()))
    }));
    let (status, text) = match result {
        Ok(Ok(text)) => (STATUS_OK, text),
        Ok(Err(e)) => (STATUS_FAILED, e.to_string()),
        Err(payload) => (STATUS_PANICKED, panic_message(payload.as_ref())),
    };
    // SAFETY: checked non-null above; the caller guarantees it is writable.
    unsafe { out.write(into_buffer(text.into_bytes())) };
    status
}

/// Why [`run_pass`] failed: its message is what ppcc reports.
#[derive(Debug, thiserror::Error)]
enum RunError<E: Display> {
    #[error("the module text is not UTF-8: {0}")]
    ModuleUtf8(std::str::Utf8Error),
    #[error("the options are not UTF-8: {0}")]
    OptionsUtf8(std::str::Utf8Error),
    #[error("the module text does not parse: {0}")]
    Parse(ppir::text::ParseError),
    /// The pass's own error.
    #[error("{0}")]
    Pass(E),
}

fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(a panic without a message)".to_string()
    }
}

/// A [`PassEntry`] for a Rust pass `fn(ppir::Module, &str) -> Result<ppir::Module, E>`:
/// generates the `extern "C"` function that runs it through [`run_pass`].
#[macro_export]
macro_rules! pass_entry {
    ($name:expr, $description:expr, $run:expr $(,)?) => {{
        unsafe extern "C" fn run(
            module: $crate::abi::Bytes,
            options: $crate::abi::Bytes,
            out: *mut $crate::abi::Buffer,
        ) -> i32 {
            let pass = $run;
            // SAFETY: ppcc passes readable bytes and a writable `out` (the ABI's contract).
            unsafe { $crate::run_pass(pass, module, options, out) }
        }
        $crate::PassEntry {
            name: $name,
            description: $description,
            run,
        }
    }};
}

/// Export Rust passes as a ppcc pass plugin: defines the `ppcc_pass_plugin` entry point.
/// Use once per library (`crate-type = ["cdylib"]`); see the crate docs for an example.
#[macro_export]
macro_rules! declare_plugin {
    (
        name: $name:expr,
        version: $version:expr,
        passes: [ $( { name: $pname:expr, description: $pdesc:expr, run: $run:expr $(,)? } ),* $(,)? ] $(,)?
    ) => {
        /// The ppcc pass-plugin entry point (see `ppcc_plugin::abi`).
        #[unsafe(no_mangle)]
        pub extern "C" fn ppcc_pass_plugin() -> *const $crate::abi::PluginDescriptor {
            static DESCRIPTOR: ::std::sync::OnceLock<::std::option::Option<$crate::Descriptor>> =
                ::std::sync::OnceLock::new();
            fn build() -> ::std::option::Option<$crate::Descriptor> {
                $crate::Descriptor::new(
                    $name,
                    $version,
                    ::std::vec![ $( $crate::pass_entry!($pname, $pdesc, $run) ),* ],
                )
                .ok()
            }
            $crate::__entry_point(&DESCRIPTOR, build)
        }
    };
}

/// Why a pass's options string was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    #[error("option `{item}` is not key=value")]
    NotKeyValue { item: String },
    #[error("option `{key}` is given twice")]
    Duplicate { key: String },
    #[error("unknown option `{key}` (options: {known})")]
    Unknown { key: String, known: String },
    #[error("option `{key}`: expected {expected}, got `{value}`")]
    Invalid {
        key: String,
        expected: &'static str,
        value: String,
    },
}

/// A pass's options: the `key=value,...` string ppcc passes (the part of `--pass
/// NAME{key=value,...}` between the braces).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    values: BTreeMap<String, String>,
}

impl Options {
    pub fn parse(options: &str) -> Result<Options, OptionsError> {
        let mut values = BTreeMap::new();
        for item in options.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| OptionsError::NotKeyValue {
                    item: item.to_string(),
                })?;
            let key = k.trim().to_string();
            if values.insert(key.clone(), v.trim().to_string()).is_some() {
                return Err(OptionsError::Duplicate { key });
            }
        }
        Ok(Options { values })
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }

    /// An unsigned integer option.
    pub fn u64(&self, key: &str) -> Result<Option<u64>, OptionsError> {
        self.get(key)
            .map(|v| {
                v.parse().map_err(|_| OptionsError::Invalid {
                    key: key.to_string(),
                    expected: "a non-negative integer",
                    value: v.to_string(),
                })
            })
            .transpose()
    }

    /// Refuse keys not in `known`.
    pub fn expect_only(&self, known: &[&str]) -> Result<(), OptionsError> {
        match self.values.keys().find(|k| !known.contains(&k.as_str())) {
            None => Ok(()),
            Some(k) => Err(OptionsError::Unknown {
                key: k.clone(),
                known: if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                },
            }),
        }
    }
}

/// Read a NUL-terminated string of a descriptor (for tests and tools).
///
/// # Safety
/// `p` must be null or point to a NUL-terminated string that outlives `'a`.
pub unsafe fn c_str<'a>(p: *const c_char) -> Option<&'a [u8]> {
    if p.is_null() {
        None
    } else {
        // SAFETY: the caller guarantees a NUL-terminated string.
        Some(unsafe { std::ffi::CStr::from_ptr(p) }.to_bytes())
    }
}

#[cfg(test)]
mod tests;
