//! What a build directory promises about its files: the size and SHA-256 of every generated
//! file `ppcc run` loads (`stage<i>/module.so`, `params.npz`, `stage.ppir`), recorded in
//! `plan.json` (`"files"`) when `ppcc MODEL -o DIR` writes them and checked before they are
//! read or loaded.
//!
//! A build directory holds native code and is trusted like an executable: whoever can write
//! it can write `plan.json` and its hashes too. The check is against damage and mix-ups
//! (a truncated copy, a file from another compile, a disk error), which would otherwise
//! surface as a crash (SIGBUS in a truncated `module.so`) or as silently different weights.

use std::io::Read;
use std::path::{Component, Path, PathBuf};

use sha2::{Digest, Sha256};

/// Size and SHA-256 (lowercase hex) of one file, as plan.json records it.
pub use ppcc_plan::FileRecord;

/// Why a recorded file may not be used.
#[derive(Debug, thiserror::Error)]
pub enum IntegrityError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} has {found} bytes but plan.json records {expected}: the build directory was changed or damaged after ppcc wrote it (truncated copy? compile again)")]
    Size {
        path: PathBuf,
        expected: u64,
        found: u64,
    },
    #[error("{path} is not the file ppcc wrote: its SHA-256 is {found}, plan.json records {expected} (modified or from another compile? compile again)")]
    Hash {
        path: PathBuf,
        expected: String,
        found: String,
    },
    #[error("plan.json records no size and hash for {path}, so it cannot be checked before it is loaded; compile again with this ppcc")]
    NotRecorded { path: PathBuf },
}

/// SHA-256 of `bytes`, lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The record of `bytes`.
pub fn record_of(bytes: &[u8]) -> FileRecord {
    FileRecord {
        bytes: bytes.len() as u64,
        sha256: sha256_hex(bytes),
    }
}

/// The record of the file at `path` as it is now.
pub fn record_of_file(path: &Path) -> Result<FileRecord, IntegrityError> {
    let bytes = std::fs::read(path).map_err(|source| IntegrityError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(record_of(&bytes))
}

/// The contents of `path` if they are what `record` describes. The size is compared
/// before anything is read (a huge or truncated file fails at once) and the hash over the
/// bytes returned, so the caller uses exactly what was checked.
pub fn read_verified(record: &FileRecord, path: &Path) -> Result<Vec<u8>, IntegrityError> {
    let read_err = |source| IntegrityError::Read {
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::File::open(path).map_err(read_err)?;
    let found = f.metadata().map_err(read_err)?.len();
    if found != record.bytes {
        return Err(IntegrityError::Size {
            path: path.to_path_buf(),
            expected: record.bytes,
            found,
        });
    }
    let mut bytes = Vec::with_capacity(record.bytes as usize);
    // One byte more than recorded: a file growing meanwhile is caught below.
    f.take(record.bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(read_err)?;
    if bytes.len() as u64 != record.bytes {
        return Err(IntegrityError::Size {
            path: path.to_path_buf(),
            expected: record.bytes,
            found: bytes.len() as u64,
        });
    }
    let found = sha256_hex(&bytes);
    if found != record.sha256 {
        return Err(IntegrityError::Hash {
            path: path.to_path_buf(),
            expected: record.sha256.clone(),
            found,
        });
    }
    Ok(bytes)
}

/// Whether `rel` is a path below a directory: relative, no `..`, no `.`, not empty.
pub fn is_plain_relative(rel: &str) -> bool {
    let p = Path::new(rel);
    !rel.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_file_is_refused_with_its_name() {
        let dir = std::env::temp_dir().join(format!("ppcc-integrity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("module.so");
        std::fs::write(&p, b"0123456789").unwrap();
        let rec = record_of_file(&p).unwrap();
        assert_eq!(rec.bytes, 10);
        assert_eq!(read_verified(&rec, &p).unwrap(), b"0123456789");
        std::fs::write(&p, b"01234").unwrap();
        let e = read_verified(&rec, &p).unwrap_err().to_string();
        assert!(
            e.contains("module.so has 5 bytes but plan.json records 10"),
            "{e}"
        );
        std::fs::write(&p, b"0123456780").unwrap();
        let e = read_verified(&rec, &p).unwrap_err();
        assert!(matches!(e, IntegrityError::Hash { .. }), "{e}");
        assert!(e.to_string().contains(&p.display().to_string()));
        std::fs::remove_file(&p).unwrap();
        let e = read_verified(&rec, &p).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("cannot read {}", p.display())),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn known_digest() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn plain_relative_paths() {
        assert!(is_plain_relative("stage0/module.so"));
        for bad in ["", "/etc/passwd", "../x", "stage0/../../x", "./x"] {
            assert!(!is_plain_relative(bad), "{bad}");
        }
    }
}
