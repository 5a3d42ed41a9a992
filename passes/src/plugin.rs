//! Pass plugins: passes that live in shared libraries loaded at run time.
//!
//! A plugin exports the C ABI of [`ppcc_plugin::abi`] (version [`ABI_VERSION`]): one entry
//! point returning a descriptor with the plugin's name, version and passes. [`PassPlugin::load`]
//! opens the library, checks the descriptor, and wraps each pass as a [`PluginPass`], which
//! implements the same [`Pass`] trait as the built-in passes, so
//! [`PassRegistry::add_plugin`](crate::PassRegistry::add_plugin) makes plugin passes usable by
//! name anywhere a built-in pass is (`ppcc-opt --load-pass-plugin LIB.so --pass NAME`).
//!
//! The module crosses the boundary as ppir text: ppcc prints it, the plugin parses it, runs,
//! and prints its result, which ppcc parses and verifies before it replaces the module. So a
//! plugin needs no particular rustc, and whatever it returns is checked like user input: text
//! that does not parse or does not verify is an error naming the plugin and the pass.
//!
//! Every failure is a [`PluginError`] that names the plugin file. Loading a plugin runs its
//! code: plugins are trusted like the ppcc binary itself. A loaded library is never unloaded
//! (like LLVM's), so the passes and names it hands out stay valid for the whole process.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use ppcc_plugin::abi::{
    Buffer, Bytes, EntryPoint, FreeBufferFn, PluginDescriptor, RunPassFn, ENTRY_POINT,
    ENTRY_POINT_SYMBOL, STATUS_FAILED, STATUS_OK, STATUS_PANICKED,
};
use ppir::text::{parse_module, print_module, ParseError, PrintOptions};
use ppir::verify::VerifyError;
use ppir::Module;

use crate::{Pass, PassError, PassRegistry};

pub use ppcc_plugin::abi::ABI_VERSION;

/// More passes than this in one descriptor means it is garbage, not a plugin.
const MAX_PASSES: usize = 10_000;

/// What is wrong with a plugin's descriptor.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DescriptorDefect {
    #[error("the entry point returned null")]
    Null,
    #[error("`{field}` is null")]
    NullString { field: String },
    #[error("`{field}` is not UTF-8")]
    NotUtf8 { field: String },
    #[error("the plugin name is empty")]
    EmptyName,
    #[error("pass name `{name}` is not one of A-Z a-z 0-9 - _ . (and not empty)")]
    BadPassName { name: String },
    #[error("it has {count} passes but a null pass table")]
    NullPassTable { count: usize },
    #[error("it claims {count} passes (at most {MAX_PASSES})")]
    TooManyPasses { count: usize },
    #[error("`free_buffer` is null")]
    NoFreeBuffer,
    #[error("pass `{pass}` has a null `run` function")]
    NoRunFunction { pass: String },
}

/// A pass of a loaded plugin, for messages: `pass `P` of plugin `N` (PATH)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginPassId {
    pub pass: String,
    pub plugin: String,
    pub path: PathBuf,
}

impl std::fmt::Display for PluginPassId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "pass `{}` of plugin `{}` ({})",
            self.pass,
            self.plugin,
            self.path.display()
        )
    }
}

/// Why a plugin could not be loaded, or why one of its passes failed.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("pass plugin {}: {source}", .path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("pass plugin {}: not a loadable shared library: {source}", .path.display())]
    NotALibrary {
        path: PathBuf,
        source: libloading::Error,
    },
    #[error("pass plugin {}: not a ppcc pass plugin: the library does not export `{ENTRY_POINT}`", .path.display())]
    NoEntryPoint { path: PathBuf },
    #[error(
        "pass plugin {}: built for plugin ABI version {found}, but this ppcc loads version {expected}; rebuild the plugin against ppcc-plugin of ABI version {expected}",
        .path.display()
    )]
    AbiMismatch {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
    #[error("pass plugin {}: invalid descriptor: {defect}", .path.display())]
    InvalidDescriptor {
        path: PathBuf,
        defect: DescriptorDefect,
    },
    #[error("pass plugin {}: defines pass `{pass}` twice", .path.display())]
    DuplicatePass { path: PathBuf, pass: String },
    #[error("pass plugin {}: pass `{pass}` is already registered ({existing})", .path.display())]
    NameTaken {
        path: PathBuf,
        pass: String,
        existing: PassOrigin,
    },
    #[error("{at} failed: {message}")]
    PassFailed { at: PluginPassId, message: String },
    #[error("{at} panicked: {message}")]
    PassPanicked { at: PluginPassId, message: String },
    #[error("{at} returned unknown status {status}")]
    UnknownStatus { at: PluginPassId, status: i32 },
    #[error("{at} returned text that is not UTF-8")]
    OutputNotUtf8 { at: PluginPassId },
    #[error("{at} returned a module that does not parse: {source}")]
    OutputParse {
        at: PluginPassId,
        source: ParseError,
    },
    #[error("{at} returned a module that does not verify: {}", format_errors(.errors))]
    OutputVerify {
        at: PluginPassId,
        errors: Vec<VerifyError>,
    },
}

fn format_errors(errors: &[VerifyError]) -> String {
    let mut s = format!("{} error(s)", errors.len());
    for e in errors {
        s.push_str("\n  ");
        s.push_str(&e.to_string());
    }
    s
}

/// Where a registered pass comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PassOrigin {
    Builtin,
    Plugin {
        name: String,
        version: String,
        path: PathBuf,
    },
}

impl std::fmt::Display for PassOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PassOrigin::Builtin => write!(f, "a built-in pass"),
            PassOrigin::Plugin { name, path, .. } => {
                write!(f, "by plugin `{name}` ({})", path.display())
            }
        }
    }
}

/// The part of a plugin its passes share.
#[derive(Debug)]
struct Library {
    name: String,
    version: String,
    path: PathBuf,
    free_buffer: FreeBufferFn,
}

/// One pass a plugin offers.
#[derive(Clone, Debug)]
pub struct PluginPassInfo {
    /// Copied out of the plugin and kept for the process (see the module docs).
    pub name: &'static str,
    pub description: &'static str,
    run: RunPassFn,
    library: Arc<Library>,
}

impl PluginPassInfo {
    /// This pass with options `key=value,...` (empty for none).
    pub fn instantiate(&self, options: impl Into<String>) -> PluginPass {
        PluginPass {
            info: self.clone(),
            options: options.into(),
        }
    }

    fn id(&self) -> PluginPassId {
        PluginPassId {
            pass: self.name.to_string(),
            plugin: self.library.name.clone(),
            path: self.library.path.clone(),
        }
    }
}

/// A loaded plugin: its name, version, file and passes.
#[derive(Clone, Debug)]
pub struct PassPlugin {
    library: Arc<Library>,
    passes: Vec<PluginPassInfo>,
}

impl PassPlugin {
    /// Load the plugin at `path` (a path to a file; it is not looked up on the library
    /// search path) and check its descriptor.
    pub fn load(path: impl AsRef<Path>) -> Result<PassPlugin, PluginError> {
        let path = path.as_ref();
        // A missing or unreadable file says so plainly (dlopen's message is cryptic), and an
        // explicit path keeps dlopen from searching LD_LIBRARY_PATH for a bare name.
        let open_path = std::fs::canonicalize(path).map_err(|source| PluginError::Unreadable {
            path: path.to_path_buf(),
            source,
        })?;
        // SAFETY: loading runs the library's initialisers; plugins are trusted code (module
        // docs). Nothing else is assumed about the file yet.
        let lib = unsafe { libloading::Library::new(&open_path) }.map_err(|source| {
            PluginError::NotALibrary {
                path: path.to_path_buf(),
                source,
            }
        })?;
        // SAFETY: the symbol's type is the ABI's; a library that exports the name with
        // another type breaks the plugin contract, which cannot be checked from here.
        let entry: EntryPoint = match unsafe { lib.get::<EntryPoint>(ENTRY_POINT_SYMBOL) } {
            Ok(sym) => *sym,
            Err(_) => return Err(PluginError::NoEntryPoint { path: path.into() }),
        };
        // Never unloaded: descriptors, pass functions and free_buffer point into it.
        std::mem::forget(lib);
        // SAFETY: `entry` is the plugin's entry point, of the ABI's type.
        let descriptor = unsafe { entry() };
        // SAFETY: the ABI promises a descriptor that lives as long as the library (forever).
        unsafe { PassPlugin::from_descriptor(path, descriptor) }
    }

    /// Check a descriptor and wrap it; `path` names the plugin in messages. Reads the ABI
    /// version first and nothing else unless it is [`ABI_VERSION`].
    ///
    /// # Safety
    /// `descriptor` must be null or point to a readable `u32`, and if that is
    /// [`ABI_VERSION`], to a [`PluginDescriptor`] whose pointers are null or valid (strings
    /// NUL-terminated, `num_passes` pass descriptors, functions of the ABI's types) for the
    /// rest of the process.
    pub unsafe fn from_descriptor(
        path: impl AsRef<Path>,
        descriptor: *const PluginDescriptor,
    ) -> Result<PassPlugin, PluginError> {
        let path = path.as_ref();
        let invalid = |defect| PluginError::InvalidDescriptor {
            path: path.to_path_buf(),
            defect,
        };
        if descriptor.is_null() {
            return Err(invalid(DescriptorDefect::Null));
        }
        // SAFETY: the first field of every ABI version is the u32 version (caller's promise).
        let found = unsafe { descriptor.cast::<u32>().read() };
        if found != ABI_VERSION {
            return Err(PluginError::AbiMismatch {
                path: path.to_path_buf(),
                found,
                expected: ABI_VERSION,
            });
        }
        // SAFETY: a version-1 descriptor (caller's promise).
        let d = unsafe { &*descriptor };
        // SAFETY (both): descriptor strings are null or NUL-terminated (caller's promise).
        let name = unsafe { c_string(d.name, "name") }.map_err(invalid)?;
        let version = unsafe { c_string(d.version, "version") }.map_err(invalid)?;
        if name.is_empty() {
            return Err(invalid(DescriptorDefect::EmptyName));
        }
        let free_buffer = d
            .free_buffer
            .ok_or(invalid(DescriptorDefect::NoFreeBuffer))?;
        if d.num_passes > MAX_PASSES {
            return Err(invalid(DescriptorDefect::TooManyPasses {
                count: d.num_passes,
            }));
        }
        let table = if d.num_passes == 0 {
            &[][..]
        } else if d.passes.is_null() {
            return Err(invalid(DescriptorDefect::NullPassTable {
                count: d.num_passes,
            }));
        } else {
            // SAFETY: `num_passes` descriptors at `passes` (caller's promise).
            unsafe { std::slice::from_raw_parts(d.passes, d.num_passes) }
        };
        let library = Arc::new(Library {
            name,
            version,
            path: path.to_path_buf(),
            free_buffer,
        });
        let mut passes: Vec<PluginPassInfo> = Vec::with_capacity(table.len());
        for (i, p) in table.iter().enumerate() {
            // SAFETY (both): as above.
            let pass_name =
                unsafe { c_string(p.name, &format!("passes[{i}].name")) }.map_err(invalid)?;
            let description =
                unsafe { c_string(p.description, &format!("passes[{i}].description")) }
                    .map_err(invalid)?;
            if !is_pass_name(&pass_name) {
                return Err(invalid(DescriptorDefect::BadPassName { name: pass_name }));
            }
            let run = p.run.ok_or_else(|| {
                invalid(DescriptorDefect::NoRunFunction {
                    pass: pass_name.clone(),
                })
            })?;
            if passes.iter().any(|q| q.name == pass_name) {
                return Err(PluginError::DuplicatePass {
                    path: path.to_path_buf(),
                    pass: pass_name,
                });
            }
            passes.push(PluginPassInfo {
                name: Box::leak(pass_name.into_boxed_str()),
                description: Box::leak(description.into_boxed_str()),
                run,
                library: library.clone(),
            });
        }
        Ok(PassPlugin { library, passes })
    }

    /// The plugin's own name (from its descriptor).
    pub fn name(&self) -> &str {
        &self.library.name
    }

    pub fn version(&self) -> &str {
        &self.library.version
    }

    /// The file it was loaded from, as given.
    pub fn path(&self) -> &Path {
        &self.library.path
    }

    pub fn passes(&self) -> &[PluginPassInfo] {
        &self.passes
    }

    pub fn origin(&self) -> PassOrigin {
        PassOrigin::Plugin {
            name: self.library.name.clone(),
            version: self.library.version.clone(),
            path: self.library.path.clone(),
        }
    }
}

/// `A-Z a-z 0-9 - _ .`, not empty: what `--pass NAME{..}` and `NAME@POINT` can carry.
fn is_pass_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// # Safety
/// `p` must be null or point to a NUL-terminated string.
unsafe fn c_string(
    p: *const std::os::raw::c_char,
    field: &str,
) -> Result<String, DescriptorDefect> {
    // SAFETY: forwarded to the caller.
    let bytes = unsafe { ppcc_plugin::c_str(p) }.ok_or_else(|| DescriptorDefect::NullString {
        field: field.to_string(),
    })?;
    String::from_utf8(bytes.to_vec()).map_err(|_| DescriptorDefect::NotUtf8 {
        field: field.to_string(),
    })
}

/// A plugin's pass with its options, runnable like any other [`Pass`].
#[derive(Clone, Debug)]
pub struct PluginPass {
    info: PluginPassInfo,
    options: String,
}

impl PluginPass {
    /// The pass as a typed result: ppcc's module in, the plugin's verified module out.
    pub fn run_plugin(&self, module: &Module) -> Result<Module, PluginError> {
        let at = || self.info.id();
        let text = print_module(module, &PrintOptions::default());
        let mut out = Buffer::EMPTY;
        // SAFETY: borrowed bytes valid for the call and a writable `out`, as the ABI asks.
        let status =
            unsafe { (self.info.run)(Bytes::of(&text), Bytes::of(&self.options), &mut out) };
        // SAFETY: the plugin wrote a buffer of `len` bytes (or left it empty); we copy it and
        // hand it back to the plugin's own free function exactly once.
        let bytes = unsafe {
            Bytes {
                ptr: out.ptr,
                len: out.len,
            }
            .as_slice()
        }
        .to_vec();
        if !out.ptr.is_null() {
            unsafe { (self.info.library.free_buffer)(out) };
        }
        let message = || String::from_utf8_lossy(&bytes).trim_end().to_string();
        match status {
            STATUS_OK => {}
            STATUS_FAILED => {
                return Err(PluginError::PassFailed {
                    at: at(),
                    message: message(),
                })
            }
            STATUS_PANICKED => {
                return Err(PluginError::PassPanicked {
                    at: at(),
                    message: message(),
                })
            }
            status => return Err(PluginError::UnknownStatus { at: at(), status }),
        }
        let text = String::from_utf8(bytes).map_err(|_| PluginError::OutputNotUtf8 { at: at() })?;
        let new =
            parse_module(&text).map_err(|source| PluginError::OutputParse { at: at(), source })?;
        ppir::verify::verify_module(&new)
            .map_err(|errors| PluginError::OutputVerify { at: at(), errors })?;
        Ok(new)
    }

    pub fn options(&self) -> &str {
        &self.options
    }
}

impl Pass for PluginPass {
    fn name(&self) -> &'static str {
        self.info.name
    }

    fn run(&self, module: &mut Module) -> Result<(), PassError> {
        *module = self.run_plugin(module)?;
        Ok(())
    }
}

/// Load every plugin of `paths` into `registry`, in order.
pub fn load_pass_plugins(
    registry: &mut PassRegistry,
    paths: &[PathBuf],
) -> Result<Vec<PassPlugin>, PluginError> {
    paths.iter().map(|p| registry.load_plugin(p)).collect()
}

/// `NAME@POINT` (`ppcc ... --plugin-pass NAME@POINT`): run pass `NAME` (with options:
/// `NAME{k=v,...}`) right after the compile pipeline's point `POINT`. The driver checks that
/// the point exists; this only splits the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PassAtPoint {
    /// `NAME` or `NAME{k=v,...}`, as [`PassRegistry::create`] takes it.
    pub pass: String,
    pub point: String,
}

/// Why `NAME@POINT` did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PassAtPointError {
    #[error("`{spec}`: expected NAME@POINT (a pass and the pipeline point to run it after)")]
    NoPoint { spec: String },
    #[error("`{spec}`: no pass name before `@`")]
    NoPass { spec: String },
    #[error("`{spec}`: no pipeline point after `@`")]
    NoPointName { spec: String },
}

impl FromStr for PassAtPoint {
    type Err = PassAtPointError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let spec = spec.trim();
        // Options may contain anything but `}`, so the `@` is looked for after them.
        let tail = spec.rfind('}').map_or(0, |i| i + 1);
        let at = spec[tail..]
            .find('@')
            .map(|i| tail + i)
            .ok_or_else(|| PassAtPointError::NoPoint { spec: spec.into() })?;
        let (pass, point) = (spec[..at].trim(), spec[at + 1..].trim());
        if pass.is_empty() || pass.starts_with('{') {
            return Err(PassAtPointError::NoPass { spec: spec.into() });
        }
        if point.is_empty() {
            return Err(PassAtPointError::NoPointName { spec: spec.into() });
        }
        Ok(PassAtPoint {
            pass: pass.to_string(),
            point: point.to_string(),
        })
    }
}

/// A pass to run at a point of the compile pipeline.
pub struct PlacedPass {
    /// The pipeline point it runs after.
    pub point: String,
    pub pass: Box<dyn Pass>,
}

/// Build the passes of `--plugin-pass NAME@POINT` specs from `registry` (after
/// [`load_pass_plugins`]), in the order given. Any registered pass may be placed so.
pub fn passes_at_points(
    registry: &PassRegistry,
    specs: &[PassAtPoint],
) -> Result<Vec<PlacedPass>, PassError> {
    specs
        .iter()
        .map(|s| {
            Ok(PlacedPass {
                point: s.point.clone(),
                pass: registry.create(&s.pass)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_at_point_parses_and_refuses() {
        let p: PassAtPoint = "op-stats@partition".parse().unwrap();
        assert_eq!(
            p,
            PassAtPoint {
                pass: "op-stats".into(),
                point: "partition".into()
            }
        );
        let p: PassAtPoint = " op-stats{file=a@b, top=3} @ autodiff ".parse().unwrap();
        assert_eq!(p.pass, "op-stats{file=a@b, top=3}");
        assert_eq!(p.point, "autodiff");
        assert_eq!(
            "op-stats{x=a@b}".parse::<PassAtPoint>(),
            Err(PassAtPointError::NoPoint {
                spec: "op-stats{x=a@b}".into()
            })
        );
        assert!(matches!(
            "@partition".parse::<PassAtPoint>(),
            Err(PassAtPointError::NoPass { .. })
        ));
        assert!(matches!(
            "op-stats@".parse::<PassAtPoint>(),
            Err(PassAtPointError::NoPointName { .. })
        ));
        let e = "op-stats".parse::<PassAtPoint>().unwrap_err().to_string();
        assert!(e.contains("expected NAME@POINT"), "{e}");
    }

    #[test]
    fn pass_names() {
        assert!(is_pass_name("op-stats"));
        assert!(is_pass_name("a.b_c-9"));
        assert!(!is_pass_name(""));
        assert!(!is_pass_name("a{b}"));
        assert!(!is_pass_name("a@b"));
        assert!(!is_pass_name("a b"));
    }
}
