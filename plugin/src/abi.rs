//! The pass-plugin ABI, version [`ABI_VERSION`]: the C types a plugin and ppcc exchange.
//!
//! A plugin is a shared library that exports one C function, [`ENTRY_POINT`]
//! (`ppcc_pass_plugin`), of type [`EntryPoint`]. It returns a pointer to a
//! [`PluginDescriptor`] that stays valid, unchanged, for as long as the library is loaded (ppcc
//! never unloads a plugin). The descriptor's first field is the ABI version; ppcc reads it
//! before anything else and refuses every other version, so later versions may change
//! everything after it.
//!
//! Each pass is a [`RunPassFn`]: it receives the module as ppir text (what
//! `ppir::text::print_module` writes and `ppir::text::parse_module` reads) and the pass's
//! options (`key=value,key=value`, sorted by key, from `--pass NAME{key=value,...}`), and writes
//! either the new module's text (status [`STATUS_OK`]) or an error message (any other status)
//! into a [`Buffer`] it allocated. ppcc copies the buffer and hands it back to the plugin's
//! [`FreeBufferFn`], so memory is allocated and freed by the same allocator. Text, not Rust
//! values, crosses the boundary, so a plugin need not be built by the same rustc as ppcc (or
//! in Rust at all: `include/ppcc_plugin.h` declares the same types for C).
//!
//! Rules a plugin must keep:
//! - No unwinding out of any function of the ABI (a Rust plugin catches panics and returns
//!   [`STATUS_PANICKED`]; [`crate::declare_plugin!`] does this).
//! - Every string of the descriptor is NUL-terminated UTF-8. Pass names use only
//!   `A-Z a-z 0-9 - _ .` (they appear in `--pass NAME{...}` and `NAME@POINT`).
//! - A pass may be called from any thread, and from several at once.

use std::os::raw::c_char;

/// The ABI version this crate describes. ppcc loads plugins of exactly this version.
pub const ABI_VERSION: u32 = 1;

/// The symbol every plugin exports.
pub const ENTRY_POINT: &str = "ppcc_pass_plugin";

/// `ENTRY_POINT` as a NUL-terminated symbol name (what `dlsym` wants).
pub const ENTRY_POINT_SYMBOL: &[u8] = b"ppcc_pass_plugin\0";

/// The entry point's type: returns the plugin's descriptor (null means "cannot initialise").
pub type EntryPoint = unsafe extern "C" fn() -> *const PluginDescriptor;

/// The pass succeeded; the buffer holds the new module's ppir text.
pub const STATUS_OK: i32 = 0;
/// The pass failed; the buffer holds a message for the user (UTF-8; may be empty).
pub const STATUS_FAILED: i32 = 1;
/// The pass panicked (or threw) and the plugin caught it; the buffer holds what it said.
pub const STATUS_PANICKED: i32 = 2;

/// Borrowed bytes (UTF-8 text) that ppcc passes in; valid only during the call.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Bytes {
    pub ptr: *const u8,
    pub len: usize,
}

impl Bytes {
    /// Borrow `s` for a call.
    pub fn of(s: &str) -> Bytes {
        Bytes {
            ptr: s.as_ptr(),
            len: s.len(),
        }
    }

    /// The bytes as a slice.
    ///
    /// # Safety
    /// `ptr` must point to `len` readable bytes that outlive `'a` (or `len` must be 0).
    pub unsafe fn as_slice<'a>(self) -> &'a [u8] {
        if self.len == 0 || self.ptr.is_null() {
            &[]
        } else {
            // SAFETY: the caller guarantees `len` readable bytes at `ptr`.
            unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
        }
    }
}

/// Bytes the plugin allocated and hands out; ppcc returns them through [`FreeBufferFn`].
/// `ptr` may be null when `len` is 0.
#[repr(C)]
#[derive(Debug)]
pub struct Buffer {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Buffer {
    pub const EMPTY: Buffer = Buffer {
        ptr: std::ptr::null_mut(),
        len: 0,
    };
}

/// Run one pass: `module` is ppir text, `options` is `key=value,...` (maybe empty). The pass
/// writes its result into `*out` (new module text, or a message) and returns a status.
pub type RunPassFn = unsafe extern "C" fn(module: Bytes, options: Bytes, out: *mut Buffer) -> i32;

/// Free a [`Buffer`] that a [`RunPassFn`] of the same plugin returned.
pub type FreeBufferFn = unsafe extern "C" fn(buffer: Buffer);

/// One pass of a plugin.
#[repr(C)]
#[derive(Debug)]
pub struct PassDescriptor {
    /// The name used in `--pass NAME` (NUL-terminated).
    pub name: *const c_char,
    /// One line for `ppcc-opt --list-passes`, options included (NUL-terminated).
    pub description: *const c_char,
    pub run: Option<RunPassFn>,
}

/// What [`ENTRY_POINT`] returns. `abi_version` must stay the first field in every version.
#[repr(C)]
#[derive(Debug)]
pub struct PluginDescriptor {
    /// [`ABI_VERSION`] of the ABI the plugin was built against.
    pub abi_version: u32,
    /// The plugin's name, shown with its passes (NUL-terminated).
    pub name: *const c_char,
    /// The plugin's own version, for messages (NUL-terminated).
    pub version: *const c_char,
    /// Frees every buffer the plugin's passes return.
    pub free_buffer: Option<FreeBufferFn>,
    /// `num_passes` pass descriptors.
    pub passes: *const PassDescriptor,
    pub num_passes: usize,
}

// SAFETY: descriptors are immutable after the entry point returns them and point only at
// data that lives as long as the library; sharing them between threads is sound.
unsafe impl Sync for PluginDescriptor {}
unsafe impl Send for PluginDescriptor {}
unsafe impl Sync for PassDescriptor {}
unsafe impl Send for PassDescriptor {}
