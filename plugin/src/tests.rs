use super::*;

const MODULE: &str = r#"module {
  func @main(%x: tensor<2xf32>) -> (tensor<2xf32>) {
    %y = "pp.relu"(%x) : (tensor<2xf32>) -> tensor<2xf32>
    return %y : tensor<2xf32>
  }
}
"#;

fn call(entry: PassEntry, module: &[u8], options: &str) -> (i32, String) {
    let mut out = Buffer::EMPTY;
    let module = Bytes {
        ptr: module.as_ptr(),
        len: module.len(),
    };
    // SAFETY: valid bytes and a writable out buffer, freed below by the same library.
    let status = unsafe { (entry.run)(module, Bytes::of(options), &mut out) };
    let text = String::from_utf8(
        unsafe {
            Bytes {
                ptr: out.ptr,
                len: out.len,
            }
            .as_slice()
        }
        .to_vec(),
    )
    .unwrap();
    unsafe { free_buffer(out) };
    (status, text)
}

fn keep(m: Module, options: &str) -> Result<Module, OptionsError> {
    Options::parse(options)?.expect_only(&["ok"])?;
    Ok(m)
}

fn explode(_: Module, _: &str) -> Result<Module, OptionsError> {
    panic!("boom at op 3")
}

#[test]
fn a_pass_round_trips_the_module_text() {
    let e = pass_entry!("keep", "keep the module", keep);
    let (status, text) = call(e, MODULE.as_bytes(), "ok=1");
    assert_eq!(status, STATUS_OK);
    assert_eq!(text, MODULE);
}

#[test]
fn errors_and_panics_become_messages() {
    let e = pass_entry!("keep", "keep the module", keep);
    let (status, text) = call(e, MODULE.as_bytes(), "bad=1");
    assert_eq!(status, STATUS_FAILED);
    assert_eq!(text, "unknown option `bad` (options: ok)");

    let (status, text) = call(e, b"module {", "");
    assert_eq!(status, STATUS_FAILED);
    assert!(
        text.starts_with("the module text does not parse: "),
        "{text}"
    );

    let (status, text) = call(e, b"\xff\xfe", "");
    assert_eq!(status, STATUS_FAILED);
    assert!(text.contains("not UTF-8"), "{text}");

    let e = pass_entry!("explode", "panic", explode);
    let (status, text) = call(e, MODULE.as_bytes(), "");
    assert_eq!(status, STATUS_PANICKED);
    assert_eq!(text, "boom at op 3");
}

#[test]
fn a_null_out_pointer_is_a_failure_not_a_crash() {
    let e = pass_entry!("keep", "keep the module", keep);
    let status = unsafe { (e.run)(Bytes::of(MODULE), Bytes::of(""), std::ptr::null_mut()) };
    assert_eq!(status, STATUS_FAILED);
}

#[test]
fn the_descriptor_describes_the_passes() {
    let d = Descriptor::new(
        "test",
        "1.2.3",
        vec![
            pass_entry!("keep", "keep the module", keep),
            pass_entry!("explode", "panic", explode),
        ],
    )
    .unwrap();
    let p = unsafe { &*d.as_ptr() };
    assert_eq!(p.abi_version, ABI_VERSION);
    assert!(Descriptor::new("te\0st", "1", vec![]).is_err());
    assert_eq!(unsafe { c_str(p.name) }, Some(&b"test"[..]));
    assert_eq!(unsafe { c_str(p.version) }, Some(&b"1.2.3"[..]));
    assert_eq!(p.num_passes, 2);
    let passes = unsafe { std::slice::from_raw_parts(p.passes, p.num_passes) };
    assert_eq!(unsafe { c_str(passes[1].name) }, Some(&b"explode"[..]));
    assert_eq!(
        unsafe { c_str(passes[0].description) },
        Some(&b"keep the module"[..])
    );
    assert!(p.free_buffer.is_some() && passes.iter().all(|p| p.run.is_some()));
}

#[test]
fn options_parse_and_refuse() {
    let o = Options::parse(" a = 1 , b=x,").unwrap();
    assert_eq!(o.get("a"), Some("1"));
    assert_eq!(o.u64("a"), Ok(Some(1)));
    assert_eq!(o.get("b"), Some("x"));
    assert!(o.u64("b").is_err());
    assert_eq!(
        Options::parse("a=1,a=2"),
        Err(OptionsError::Duplicate { key: "a".into() })
    );
    assert_eq!(
        Options::parse("a"),
        Err(OptionsError::NotKeyValue { item: "a".into() })
    );
    assert!(Options::parse("").unwrap().expect_only(&[]).is_ok());
    assert_eq!(
        o.expect_only(&["a"]).unwrap_err().to_string(),
        "unknown option `b` (options: a)"
    );
}
