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

/// Why the `location` of external data names no file the importer may read.
#[derive(Debug, thiserror::Error)]
pub enum LocationError {
    #[error("empty `location`")]
    Empty,
    #[error("location {location:?} contains a NUL byte")]
    NulByte { location: String },
    #[error("location {location:?} is an absolute path; external data must be a relative path inside the model's folder")]
    Absolute { location: String },
    #[error(
        "location {location:?} contains `..`; external data must stay inside the model's folder"
    )]
    ParentDir { location: String },
    #[error("cannot resolve the model's folder {}: {error}", .dir.display())]
    ModelDir { dir: PathBuf, error: std::io::Error },
    #[error("cannot open {}: {error}", .path.display())]
    Open {
        path: PathBuf,
        error: std::io::Error,
    },
    /// The path leaves the folder through a symbolic link.
    #[error("location {location:?} resolves to {}, outside the model's folder {} (through a symbolic link)", .resolved.display(), .dir.display())]
    Outside {
        location: String,
        resolved: PathBuf,
        dir: PathBuf,
    },
    #[error("location {location:?} is not a regular file")]
    NotAFile { location: String },
}

/// Resolve `location` inside `model_dir`, refusing anything that could name a file outside.
pub fn resolve_location(model_dir: &Path, location: &str) -> Result<PathBuf, LocationError> {
    let loc = || location.to_string();
    if location.is_empty() {
        return Err(LocationError::Empty);
    }
    if location.contains('\0') {
        return Err(LocationError::NulByte { location: loc() });
    }
    let rel = Path::new(location);
    // Refuse Windows-style roots too, whatever platform reads the model.
    let drive = location.len() >= 2
        && location.as_bytes()[0].is_ascii_alphabetic()
        && location.as_bytes()[1] == b':';
    if rel.is_absolute() || location.starts_with('/') || location.starts_with('\\') || drive {
        return Err(LocationError::Absolute { location: loc() });
    }
    for c in rel.components() {
        match c {
            Component::Normal(_) | Component::CurDir => {}
            Component::ParentDir => return Err(LocationError::ParentDir { location: loc() }),
            Component::RootDir | Component::Prefix(_) => {
                return Err(LocationError::Absolute { location: loc() })
            }
        }
    }
    if location.split(['/', '\\']).any(|part| part == "..") {
        return Err(LocationError::ParentDir { location: loc() });
    }
    let dir = model_dir
        .canonicalize()
        .map_err(|error| LocationError::ModelDir {
            dir: model_dir.to_path_buf(),
            error,
        })?;
    let joined = dir.join(rel);
    let canonical = joined.canonicalize().map_err(|error| LocationError::Open {
        path: joined.clone(),
        error,
    })?;
    if !canonical.starts_with(&dir) {
        return Err(LocationError::Outside {
            location: loc(),
            resolved: canonical,
            dir,
        });
    }
    if !canonical.is_file() {
        return Err(LocationError::NotAFile { location: loc() });
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
    let path = resolve_location(dir, location).map_err(|source| OnnxError::ExternalLocation {
        tensor: tp.name.clone(),
        source,
    })?;
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
