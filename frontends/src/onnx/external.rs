//! External tensor data (`data_location = EXTERNAL`): the bytes of a tensor live in a file
//! next to the model, named by the `location` key, at `offset` for `length` bytes.
//!
//! The location comes from the (untrusted) model, so it is confined to the model's folder:
//! absolute paths, `..` components, and links or paths whose canonical form leaves the folder
//! are refused before anything is opened, and only the named byte range is read.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Component, Path, PathBuf};

use super::error::OnnxError;
use super::proto::TensorProto;

fn err(tp: &TensorProto, message: impl Into<String>) -> OnnxError {
    OnnxError::ExternalData {
        tensor: tp.name.clone(),
        message: message.into(),
    }
}

/// Resolve `location` inside `model_dir`, refusing anything that could name a file outside.
pub fn resolve_location(model_dir: &Path, location: &str) -> Result<PathBuf, String> {
    if location.is_empty() {
        return Err("empty `location`".into());
    }
    if location.contains('\0') {
        return Err(format!("location {location:?} contains a NUL byte"));
    }
    let rel = Path::new(location);
    // Refuse Windows-style roots too, whatever platform reads the model.
    let drive = location.len() >= 2
        && location.as_bytes()[0].is_ascii_alphabetic()
        && location.as_bytes()[1] == b':';
    if rel.is_absolute() || location.starts_with('/') || location.starts_with('\\') || drive {
        return Err(format!("location {location:?} is an absolute path; external data must be a relative path inside the model's folder"));
    }
    for c in rel.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => {
                return Err(format!("location {location:?} contains `..`; external data must stay inside the model's folder"))
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(format!("location {location:?} is an absolute path"))
            }
        }
    }
    if location.split(['/', '\\']).any(|part| part == "..") {
        return Err(format!("location {location:?} contains `..`; external data must stay inside the model's folder"));
    }
    let dir = model_dir.canonicalize().map_err(|e| {
        format!(
            "cannot resolve the model's folder {}: {e}",
            model_dir.display()
        )
    })?;
    let joined = dir.join(rel);
    let canonical = joined
        .canonicalize()
        .map_err(|e| format!("cannot open {}: {e}", joined.display()))?;
    if !canonical.starts_with(&dir) {
        return Err(format!(
            "location {location:?} resolves to {}, outside the model's folder {} (through a symbolic link)",
            canonical.display(),
            dir.display()
        ));
    }
    if !canonical.is_file() {
        return Err(format!("location {location:?} is not a regular file"));
    }
    Ok(canonical)
}

fn parse_u64(tp: &TensorProto, key: &str, value: &str) -> Result<u64, OnnxError> {
    value.trim().parse::<u64>().map_err(|_| {
        err(
            tp,
            format!("`{key}` is {value:?}, not a non-negative integer"),
        )
    })
}

/// Read the bytes of an external tensor. `expected` is the byte size its shape and type
/// need (`None` if that overflows); the range must match it exactly.
pub fn read_external(
    tp: &TensorProto,
    model_dir: Option<&Path>,
    expected: Option<usize>,
) -> Result<Vec<u8>, OnnxError> {
    let mut location = None;
    let mut offset = 0u64;
    let mut length = None;
    for kv in &tp.external_data {
        match kv.key.as_str() {
            "location" => location = Some(kv.value.as_str()),
            "offset" => offset = parse_u64(tp, "offset", &kv.value)?,
            "length" => length = Some(parse_u64(tp, "length", &kv.value)?),
            _ => {} // `checksum` and future keys are informational
        }
    }
    let location = location.ok_or_else(|| err(tp, "no `location` key"))?;
    let dir = model_dir.ok_or_else(|| {
        err(tp, format!(
            "stored in external file {location:?}, but the model was read from bytes with no folder; import it from its file (import_onnx_file) or set ImportOptions::model_dir"
        ))
    })?;
    let path = resolve_location(dir, location).map_err(|m| err(tp, m))?;
    let mut file =
        File::open(&path).map_err(|e| err(tp, format!("cannot open {}: {e}", path.display())))?;
    let file_len = file
        .metadata()
        .map_err(|e| err(tp, format!("cannot stat {}: {e}", path.display())))?
        .len();
    if offset > file_len {
        return Err(err(
            tp,
            format!("offset {offset} is past the end of {location:?} ({file_len} bytes)"),
        ));
    }
    let length = length.unwrap_or(file_len - offset);
    if length > file_len - offset {
        return Err(err(
            tp,
            format!(
            "offset {offset} + length {length} is past the end of {location:?} ({file_len} bytes)"
        ),
        ));
    }
    let expected = expected.ok_or_else(|| err(tp, "shape has too many elements"))?;
    if length != expected as u64 {
        return Err(err(
            tp,
            format!(
                "length {length} does not match the {expected} bytes its shape {:?} and type need",
                tp.dims
            ),
        ));
    }
    file.seek(SeekFrom::Start(offset))
        .map_err(|e| err(tp, format!("cannot seek in {location:?}: {e}")))?;
    let mut bytes = vec![0u8; expected];
    file.read_exact(&mut bytes)
        .map_err(|e| err(tp, format!("cannot read {location:?}: {e}")))?;
    Ok(bytes)
}
