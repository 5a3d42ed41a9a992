//! The pass-plugin loader on descriptors built in this process (so every defect can be
//! produced without compiling a library) and on files that are not plugins.

use std::path::{Path, PathBuf};

use ppcc_passes::plugin::{
    load_pass_plugins, passes_at_points, DescriptorDefect, PassAtPoint, PassOrigin, PassPlugin,
    PluginError, ABI_VERSION,
};
use ppcc_passes::{PassError, PassManager, PassRegistry};
use ppcc_plugin::abi::PluginDescriptor;
use ppcc_plugin::{pass_entry, Descriptor, Options, OptionsError};
use ppir::text::{parse_module, print_module, PrintOptions};
use ppir::{Attr, Module};

const MODULE: &str = r#"module {
  func @main(%x: tensor<2x3xf32>) -> (tensor<2x3xf32>) {
    %y = "pp.relu"(%x) : (tensor<2x3xf32>) -> tensor<2x3xf32>
    return %y : tensor<2x3xf32>
  }
}
"#;

/// Renames @main to the `to` option.
fn rename(mut m: Module, options: &str) -> Result<Module, OptionsError> {
    let o = Options::parse(options)?;
    o.expect_only(&["to", "z"])?;
    m.functions[0].name = o.get("to").unwrap_or("renamed").to_string();
    Ok(m)
}

/// Records its options string in the function name, to see what ppcc passes.
fn echo_options(mut m: Module, options: &str) -> Result<Module, OptionsError> {
    m.functions[0].name = options.replace([',', '='], "_");
    Ok(m)
}

fn fails(_: Module, _: &str) -> Result<Module, OptionsError> {
    Err(OptionsError::NotKeyValue {
        item: "deliberately".into(),
    })
}

fn panics(_: Module, _: &str) -> Result<Module, OptionsError> {
    panic!("index out of range in the plugin")
}

/// Returns a module the verifier rejects (transpose with a string `perm`).
fn breaks(mut m: Module, _: &str) -> Result<Module, OptionsError> {
    let f = &mut m.functions[0];
    let op = f.ops()[0];
    f.op_mut(op).kind = ppir::OpKind::Transpose;
    f.op_mut(op).attrs.set("perm", Attr::Str("1,0".into()));
    Ok(m)
}

fn test_plugin() -> &'static Descriptor {
    Box::leak(Box::new(
        Descriptor::new(
            "test",
            "9.9",
            vec![
                pass_entry!("rename", "rename @main: rename{to=NAME}", rename),
                pass_entry!("echo-options", "name @main after the options", echo_options),
                pass_entry!("fails", "always fails", fails),
                pass_entry!("panics", "always panics", panics),
                pass_entry!("breaks", "returns an invalid module", breaks),
            ],
        )
        .unwrap(),
    ))
}

fn load_test_plugin() -> (PassRegistry, PassPlugin) {
    let plugin =
        unsafe { PassPlugin::from_descriptor("libtest_plugin.so", test_plugin().as_ptr()) }
            .unwrap();
    let mut registry = PassRegistry::builtin();
    registry.add_plugin(&plugin).unwrap();
    (registry, plugin)
}

fn run(registry: &PassRegistry, spec: &str) -> Result<Module, PassError> {
    let mut m = parse_module(MODULE).unwrap();
    let mut pm = PassManager::new();
    pm.add(registry.create(spec)?);
    pm.run(&mut m)?;
    Ok(m)
}

#[test]
fn plugin_passes_run_like_builtin_ones() {
    let (registry, plugin) = load_test_plugin();
    assert_eq!(plugin.name(), "test");
    assert_eq!(plugin.version(), "9.9");
    assert_eq!(plugin.path(), Path::new("libtest_plugin.so"));
    let names: Vec<&str> = plugin.passes().iter().map(|p| p.name).collect();
    assert_eq!(
        names,
        ["rename", "echo-options", "fails", "panics", "breaks"]
    );
    let info = registry.get("rename").unwrap();
    assert_eq!(info.description, "rename @main: rename{to=NAME}");
    assert!(matches!(&info.origin, PassOrigin::Plugin { name, .. } if name == "test"));
    assert_eq!(
        registry.get("canonicalize").unwrap().origin,
        PassOrigin::Builtin
    );

    let m = run(&registry, "rename{to=entry}").unwrap();
    assert_eq!(m.functions[0].name, "entry");
    // Options reach the plugin as `key=value,...`, sorted.
    let m = run(&registry, "echo-options{to=b, a=1}").unwrap();
    assert_eq!(m.functions[0].name, "a_1_to_b");
    // The rest of the module survives the text round trip exactly.
    let mut m = run(&registry, "rename{to=main}").unwrap();
    m.functions[0].name = "main".into();
    assert_eq!(print_module(&m, &PrintOptions::default()), MODULE);
}

#[test]
fn plugin_pass_failures_name_the_plugin_and_pass() {
    let (registry, _) = load_test_plugin();
    let e = run(&registry, "rename{bogus=1}").unwrap_err();
    assert!(
        matches!(&e, PassError::Plugin(p) if matches!(**p, PluginError::PassFailed { .. })),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "pass `rename` of plugin `test` (libtest_plugin.so) failed: unknown option `bogus` (options: to, z)"
    );

    let e = run(&registry, "fails").unwrap_err().to_string();
    assert!(
        e.ends_with("failed: option `deliberately` is not key=value"),
        "{e}"
    );

    // A panic is caught in the plugin and reported; this process goes on.
    let e = run(&registry, "panics").unwrap_err().to_string();
    assert_eq!(
        e,
        "pass `panics` of plugin `test` (libtest_plugin.so) panicked: index out of range in the plugin"
    );

    let e = run(&registry, "breaks").unwrap_err();
    let PassError::Plugin(p) = &e else {
        panic!("{e:?}")
    };
    let PluginError::OutputVerify { at, errors } = &**p else {
        panic!("{p:?}")
    };
    assert_eq!(at.pass, "breaks");
    assert_eq!(errors.len(), 1);
    let e = e.to_string();
    assert!(
        e.starts_with("pass `breaks` of plugin `test` (libtest_plugin.so) returned a module that does not verify: 1 error(s)\n  @main: "),
        "{e}"
    );
    assert!(e.contains("attribute `perm`"), "{e}");

    // Even with the pass manager's verification off, a plugin's output is verified.
    let mut m = parse_module(MODULE).unwrap();
    let mut pm = PassManager::new();
    pm.verify_each(false);
    pm.add(registry.create("breaks").unwrap());
    assert!(pm.run(&mut m).is_err());
}

fn raw(version: u32) -> PluginDescriptor {
    PluginDescriptor {
        abi_version: version,
        name: c"raw".as_ptr(),
        version: c"1".as_ptr(),
        free_buffer: Some(ppcc_plugin::free_buffer),
        passes: std::ptr::null(),
        num_passes: 0,
    }
}

fn defect(d: &PluginDescriptor) -> DescriptorDefect {
    match unsafe { PassPlugin::from_descriptor("raw.so", d) } {
        Err(PluginError::InvalidDescriptor { path, defect }) => {
            assert_eq!(path, PathBuf::from("raw.so"));
            defect
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn abi_version_mismatch_is_reported_before_anything_else_is_read() {
    let e = unsafe { PassPlugin::from_descriptor("old.so", &raw(ABI_VERSION + 1)) }.unwrap_err();
    assert!(
        matches!(e, PluginError::AbiMismatch { found, expected, .. } if found == ABI_VERSION + 1 && expected == ABI_VERSION)
    );
    assert_eq!(
        e.to_string(),
        format!(
            "pass plugin old.so: built for plugin ABI version {}, but this ppcc loads version {ABI_VERSION}; rebuild the plugin against ppcc-plugin of ABI version {ABI_VERSION}",
            ABI_VERSION + 1
        )
    );
    // A future descriptor may be nothing like this one after its version: only the u32 is read.
    let version_only: u32 = 0;
    let e = unsafe { PassPlugin::from_descriptor("v0.so", (&version_only as *const u32).cast()) }
        .unwrap_err();
    assert!(
        matches!(e, PluginError::AbiMismatch { found: 0, .. }),
        "{e:?}"
    );
}

#[test]
fn invalid_descriptors_are_refused() {
    assert_eq!(
        unsafe { PassPlugin::from_descriptor("raw.so", std::ptr::null()) }
            .unwrap_err()
            .to_string(),
        "pass plugin raw.so: invalid descriptor: the entry point returned null"
    );
    assert!(unsafe { PassPlugin::from_descriptor("raw.so", &raw(ABI_VERSION)) }.is_ok());

    let mut d = raw(ABI_VERSION);
    d.name = std::ptr::null();
    assert_eq!(
        defect(&d),
        DescriptorDefect::NullString {
            field: "name".into()
        }
    );
    let mut d = raw(ABI_VERSION);
    d.name = c"".as_ptr();
    assert_eq!(defect(&d), DescriptorDefect::EmptyName);
    let mut d = raw(ABI_VERSION);
    d.version = c"\xff".as_ptr();
    assert_eq!(
        defect(&d),
        DescriptorDefect::NotUtf8 {
            field: "version".into()
        }
    );
    let mut d = raw(ABI_VERSION);
    d.free_buffer = None;
    assert_eq!(defect(&d), DescriptorDefect::NoFreeBuffer);
    let mut d = raw(ABI_VERSION);
    d.num_passes = 3;
    assert_eq!(defect(&d), DescriptorDefect::NullPassTable { count: 3 });
    let mut d = raw(ABI_VERSION);
    d.num_passes = usize::MAX;
    assert_eq!(
        defect(&d),
        DescriptorDefect::TooManyPasses { count: usize::MAX }
    );
}

#[test]
fn duplicate_and_clashing_pass_names_are_refused() {
    let dup = Descriptor::new(
        "dup",
        "1",
        vec![
            pass_entry!("rename", "one", rename),
            pass_entry!("rename", "two", rename),
        ],
    )
    .unwrap();
    let e = unsafe { PassPlugin::from_descriptor("dup.so", dup.as_ptr()) }.unwrap_err();
    assert_eq!(
        e.to_string(),
        "pass plugin dup.so: defines pass `rename` twice"
    );

    let builtin = Descriptor::new("b", "1", vec![pass_entry!("verify", "mine", rename)]).unwrap();
    let plugin = unsafe { PassPlugin::from_descriptor("b.so", builtin.as_ptr()) }.unwrap();
    let e = PassRegistry::builtin().add_plugin(&plugin).unwrap_err();
    assert_eq!(
        e.to_string(),
        "pass plugin b.so: pass `verify` is already registered (a built-in pass)"
    );

    let (mut registry, plugin) = load_test_plugin();
    let e = registry.add_plugin(&plugin).unwrap_err().to_string();
    assert_eq!(
        e,
        "pass plugin libtest_plugin.so: pass `rename` is already registered (by plugin `test` (libtest_plugin.so))"
    );

    let bad = Descriptor::new("bad", "1", vec![pass_entry!("a{b}", "braces", rename)]).unwrap();
    let e = unsafe { PassPlugin::from_descriptor("bad.so", bad.as_ptr()) }.unwrap_err();
    assert!(
        e.to_string().contains("pass name `a{b}` is not one of"),
        "{e}"
    );
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ppcc-plugin-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn files_that_are_not_plugins_are_refused_with_their_path() {
    let garbage = scratch("garbage.so");
    std::fs::write(&garbage, b"\x7fELF but not really").unwrap();
    let e = PassPlugin::load(&garbage).unwrap_err();
    assert!(matches!(e, PluginError::NotALibrary { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!(
            "pass plugin {}: not a loadable shared library: ",
            garbage.display()
        )),
        "{msg}"
    );

    let missing = scratch("missing.so");
    let e = PassPlugin::load(&missing).unwrap_err();
    assert!(matches!(e, PluginError::Unreadable { .. }), "{e:?}");
    assert!(e.to_string().contains("missing.so"), "{e}");

    // A real shared library without the entry point.
    let libz = [
        "/lib/x86_64-linux-gnu/libz.so.1",
        "/usr/lib/x86_64-linux-gnu/libz.so.1",
    ]
    .into_iter()
    .map(Path::new)
    .find(|p| p.exists());
    if let Some(libz) = libz {
        let e = PassPlugin::load(libz).unwrap_err();
        assert!(matches!(e, PluginError::NoEntryPoint { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "pass plugin {}: not a ppcc pass plugin: the library does not export `ppcc_pass_plugin`",
                libz.display()
            )
        );
    }
    let _ = std::fs::remove_dir_all(garbage.parent().unwrap());
}

#[test]
fn plugin_passes_can_be_placed_at_pipeline_points() {
    let (registry, _) = load_test_plugin();
    let specs: Vec<PassAtPoint> = ["rename{to=a}@autodiff", "canonicalize@partition"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let placed = passes_at_points(&registry, &specs).unwrap();
    let got: Vec<(&str, &str)> = placed
        .iter()
        .map(|p| (p.point.as_str(), p.pass.name()))
        .collect();
    assert_eq!(got, [("autodiff", "rename"), ("partition", "canonicalize")]);
    let mut m = parse_module(MODULE).unwrap();
    placed[0].pass.run(&mut m).unwrap();
    assert_eq!(m.functions[0].name, "a");

    let bad = ["nope@partition".parse().unwrap()];
    let e = passes_at_points(&registry, &bad).err().unwrap().to_string();
    assert!(e.starts_with("unknown pass `nope`"), "{e}");

    let mut registry = PassRegistry::builtin();
    let e =
        load_pass_plugins(&mut registry, &[PathBuf::from("/nonexistent/absent.so")]).unwrap_err();
    assert!(matches!(e, PluginError::Unreadable { .. }), "{e:?}");
}
