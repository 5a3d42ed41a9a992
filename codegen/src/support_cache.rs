//! The per-user cache of the compiled runtime support object (`support.c`), and why what it
//! holds may be linked into generated code.
//!
//! Every `module.so` links the support object, so whoever can write the cache can run code in
//! every later `ppcc run`. The cache therefore lives in a directory of the current user
//! (`$PPCC_CACHE_DIR`, else `$XDG_CACHE_HOME/ppcc`, else `$HOME/.cache/ppcc`), created `0700`;
//! a directory that is a symbolic link, not owned by the effective user, or writable by group
//! or others is refused with an error. Files are written atomically (an exclusive temporary
//! file with an unpredictable name, mode `0600`, renamed into place) with the SHA-256 of the
//! object beside it (`support-<key>.o.sha256`). A cached object is read through a descriptor
//! opened without following links, checked (a regular file of ours, not group/world-writable,
//! the recorded hash), and only the verified bytes are linked; anything else is rebuilt and
//! replaced. When no per-user directory can be created the object is built in a private
//! temporary directory for this process only.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::compile::CompileError;

/// The SHA-256 of `parts`, each followed by a separator byte, as lowercase hex.
pub fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p);
        h.update([0xff]);
    }
    hex(&h.finalize())
}

/// The SHA-256 of `bytes` as lowercase hex.
pub fn sha256_of(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Where compiled support objects are kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheDir {
    /// A checked per-user directory.
    User(PathBuf),
    /// None could be created: build for this process only.
    None,
}

fn cache_err(path: &Path, message: impl Into<String>) -> CompileError {
    CompileError::Cache {
        path: path.to_path_buf(),
        message: message.into(),
    }
}

/// The cache directory for these environment values (`PPCC_CACHE_DIR`, `XDG_CACHE_HOME`,
/// `HOME`), created `0700` when missing. An explicit `PPCC_CACHE_DIR` must be usable; the
/// defaults fall through to the next (and finally to [`CacheDir::None`]) only when they
/// cannot be created, never when one exists but is not private.
pub fn resolve_cache_dir(
    explicit: Option<&Path>,
    xdg_cache_home: Option<&Path>,
    home: Option<&Path>,
) -> Result<CacheDir, CompileError> {
    if let Some(d) = explicit.filter(|d| !d.as_os_str().is_empty()) {
        ensure_private_dir(d)?;
        return Ok(CacheDir::User(d.to_path_buf()));
    }
    // The XDG base directory spec ignores relative paths.
    let candidates = [
        xdg_cache_home
            .filter(|d| d.is_absolute())
            .map(|d| d.join("ppcc")),
        home.filter(|d| d.is_absolute())
            .map(|d| d.join(".cache").join("ppcc")),
    ];
    for d in candidates.into_iter().flatten() {
        match ensure_private_dir(&d) {
            Ok(()) => return Ok(CacheDir::User(d)),
            Err(CompileError::Cache { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(CacheDir::None)
}

/// Create `dir` (mode 0700; its parents with the default mode) when missing, then check
/// that it is a real directory of the effective user that nobody else can write. A directory
/// that exists but fails the check is [`CompileError::UnsafeCache`]; one that cannot be
/// created is [`CompileError::Cache`].
pub fn ensure_private_dir(dir: &Path) -> Result<(), CompileError> {
    match std::fs::symlink_metadata(dir) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| {
                    cache_err(dir, format!("cannot create {}: {e}", parent.display()))
                })?;
            }
            match DirBuilder::new().mode(0o700).create(dir) {
                Ok(()) => {}
                // Another process made it meanwhile: checked below like any existing one.
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
                Err(e) => return Err(cache_err(dir, format!("cannot create it: {e}"))),
            }
        }
        Err(e) => return Err(cache_err(dir, format!("cannot inspect it: {e}"))),
    }
    let md = std::fs::symlink_metadata(dir)
        .map_err(|e| cache_err(dir, format!("cannot inspect it: {e}")))?;
    let unsafe_dir = |why: String| CompileError::UnsafeCache {
        path: dir.to_path_buf(),
        why,
    };
    if md.file_type().is_symlink() {
        return Err(unsafe_dir("it is a symbolic link".into()));
    }
    if !md.is_dir() {
        return Err(unsafe_dir("it is not a directory".into()));
    }
    let me = euid();
    if md.uid() != me {
        return Err(unsafe_dir(format!(
            "it is owned by uid {}, not by you (uid {me})",
            md.uid()
        )));
    }
    let mode = md.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(unsafe_dir(format!(
            "it is writable by {} (mode {mode:04o})",
            if mode & 0o002 != 0 {
                "everyone"
            } else {
                "its group"
            }
        )));
    }
    Ok(())
}

/// Read `path` if it is a regular file of the effective user that group and others cannot
/// write, through a descriptor opened without following a symbolic link; `None` when it is
/// missing or fails a check (the caller rebuilds it).
fn read_private_file(path: &Path) -> Option<Vec<u8>> {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let md = f.metadata().ok()?;
    if !md.is_file() || md.uid() != euid() || md.mode() & 0o022 != 0 {
        return None;
    }
    let mut bytes = Vec::with_capacity(md.len() as usize);
    f.read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The cached object `dir/<name>` when it is private and its bytes have the SHA-256 recorded
/// in `dir/<name>.sha256`.
pub fn read_verified(dir: &Path, name: &str) -> Option<Vec<u8>> {
    let recorded = read_private_file(&dir.join(format!("{name}.sha256")))?;
    let recorded = String::from_utf8(recorded).ok()?;
    let recorded = recorded.split_whitespace().next()?;
    let bytes = read_private_file(&dir.join(name))?;
    (sha256_of(&bytes) == recorded).then_some(bytes)
}

/// Write `bytes` to `dir/<name>` atomically: an exclusive temporary file with an
/// unpredictable name and mode 0600 in `dir`, renamed over the target.
pub fn write_private_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), CompileError> {
    let target = dir.join(name);
    let werr = |path: &Path, e: std::io::Error| CompileError::Write {
        path: path.to_path_buf(),
        source: e,
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .permissions(std::fs::Permissions::from_mode(0o600))
        .tempfile_in(dir)
        .map_err(|e| werr(&target, e))?;
    tmp.write_all(bytes)
        .and_then(|_| tmp.as_file().sync_all())
        .map_err(|e| werr(tmp.path(), e))?;
    tmp.persist(&target).map_err(|e| werr(&target, e.error))?;
    Ok(())
}

/// The support object named `name` from the cache `dir` when it verifies, else `build()`'s,
/// stored (with its hash) for the next time.
pub fn load_or_build(
    dir: &CacheDir,
    name: &str,
    build: impl FnOnce() -> Result<Vec<u8>, CompileError>,
) -> Result<Vec<u8>, CompileError> {
    let CacheDir::User(dir) = dir else {
        return build();
    };
    if let Some(bytes) = read_verified(dir, name) {
        return Ok(bytes);
    }
    let bytes = build()?;
    // The object first: a reader that sees the new hash with the old object (or no hash)
    // rebuilds; it never links bytes the hash does not vouch for.
    write_private_atomic(dir, name, &bytes)?;
    write_private_atomic(
        dir,
        &format!("{name}.sha256"),
        format!("{}  {name}\n", sha256_of(&bytes)).as_bytes(),
    )?;
    Ok(bytes)
}

/// A file of `bytes` in a private (0700, unpredictable name) temporary directory, for tools
/// that need a path; removed with the returned guard.
pub fn private_temp_file(
    prefix: &str,
    name: &str,
    bytes: &[u8],
) -> Result<(tempfile::TempDir, PathBuf), CompileError> {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .map_err(|e| CompileError::Write {
            path: std::env::temp_dir().join(format!("{prefix}XXXXXX")),
            source: e,
        })?;
    let path = dir.path().join(name);
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| CompileError::Write {
            path: path.clone(),
            source: e,
        })?;
    f.write_all(bytes).map_err(|e| CompileError::Write {
        path: path.clone(),
        source: e,
    })?;
    drop::<File>(f);
    Ok((dir, path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("ppcc-cache-test-")
            .tempdir()
            .unwrap()
    }

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn defaults_are_per_user_and_private() {
        let t = scratch();
        let home = t.path().join("home");
        std::fs::create_dir(&home).unwrap();
        let d = resolve_cache_dir(None, None, Some(&home)).unwrap();
        assert_eq!(d, CacheDir::User(home.join(".cache/ppcc")));
        assert_eq!(mode(&home.join(".cache/ppcc")), 0o700);
        let xdg = t.path().join("xdg");
        let d = resolve_cache_dir(None, Some(&xdg), Some(&home)).unwrap();
        assert_eq!(d, CacheDir::User(xdg.join("ppcc")));
        // A relative XDG_CACHE_HOME is ignored (XDG spec); the explicit one wins over both.
        let d = resolve_cache_dir(None, Some(Path::new("rel")), Some(&home)).unwrap();
        assert_eq!(d, CacheDir::User(home.join(".cache/ppcc")));
        let own = t.path().join("own");
        let d = resolve_cache_dir(Some(&own), Some(&xdg), Some(&home)).unwrap();
        assert_eq!(d, CacheDir::User(own.clone()));
        assert_eq!(mode(&own), 0o700);
    }

    #[test]
    fn an_uncreatable_default_falls_back_to_none() {
        let t = scratch();
        // A regular file where the parent directory would be: creating below it fails.
        let file = t.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert_eq!(
            resolve_cache_dir(None, None, Some(&file)).unwrap(),
            CacheDir::None
        );
        assert_eq!(resolve_cache_dir(None, None, None).unwrap(), CacheDir::None);
        // ... but an explicit directory that cannot be created is an error naming it.
        let bad = file.join("cache");
        let e = resolve_cache_dir(Some(&bad), None, None).unwrap_err();
        assert!(e.to_string().contains(&bad.display().to_string()), "{e}");
    }

    #[test]
    fn shared_or_foreign_or_linked_dirs_are_refused() {
        let t = scratch();
        let d = t.path().join("c");
        std::fs::create_dir(&d).unwrap();
        for (m, word) in [(0o777, "everyone"), (0o770, "group"), (0o1777, "everyone")] {
            std::fs::set_permissions(&d, std::fs::Permissions::from_mode(m)).unwrap();
            let e = ensure_private_dir(&d).unwrap_err().to_string();
            assert!(
                e.contains(&d.display().to_string()) && e.contains(word),
                "{m:o}: {e}"
            );
            // Also when it is only the default location: refused, not skipped.
            let home = t.path().join(format!("h{m:o}"));
            std::fs::create_dir_all(home.join(".cache")).unwrap();
            std::fs::create_dir(home.join(".cache/ppcc")).unwrap();
            std::fs::set_permissions(home.join(".cache/ppcc"), std::fs::Permissions::from_mode(m))
                .unwrap();
            assert!(resolve_cache_dir(None, None, Some(&home)).is_err());
        }
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
        ensure_private_dir(&d).unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        let e = ensure_private_dir(&link).unwrap_err().to_string();
        assert!(e.contains("symbolic link"), "{e}");
        if euid() == 0 {
            std::os::unix::fs::chown(&d, Some(12345), None).unwrap();
            let e = ensure_private_dir(&d).unwrap_err().to_string();
            assert!(e.contains("owned by uid 12345"), "{e}");
        }
    }

    #[test]
    fn only_verified_objects_are_reused() {
        let t = scratch();
        let dir = t.path().join("c");
        ensure_private_dir(&dir).unwrap();
        let cache = CacheDir::User(dir.clone());
        let mut builds = 0;
        let get = |builds: &mut i32| {
            load_or_build(&cache, "support-k.o", || {
                *builds += 1;
                Ok(b"good object".to_vec())
            })
            .unwrap()
        };
        assert_eq!(get(&mut builds), b"good object");
        assert_eq!(builds, 1);
        assert_eq!(mode(&dir.join("support-k.o")), 0o600);
        assert_eq!(mode(&dir.join("support-k.o.sha256")), 0o600);
        assert_eq!(get(&mut builds), b"good object");
        assert_eq!(builds, 1, "a verified object is reused");
        // Planted bytes with the old hash: rebuilt and replaced, never returned.
        std::fs::write(dir.join("support-k.o"), b"planted").unwrap();
        assert_eq!(get(&mut builds), b"good object");
        assert_eq!(builds, 2);
        assert_eq!(
            std::fs::read(dir.join("support-k.o")).unwrap(),
            b"good object"
        );
        // A symbolic link (even to matching bytes) is not followed.
        let elsewhere = t.path().join("elsewhere.o");
        std::fs::write(&elsewhere, b"good object").unwrap();
        std::fs::remove_file(dir.join("support-k.o")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.join("support-k.o")).unwrap();
        assert_eq!(get(&mut builds), b"good object");
        assert_eq!(builds, 3);
        assert!(!std::fs::symlink_metadata(dir.join("support-k.o"))
            .unwrap()
            .file_type()
            .is_symlink());
        // A group-writable file is not trusted either.
        std::fs::set_permissions(
            dir.join("support-k.o"),
            std::fs::Permissions::from_mode(0o666),
        )
        .unwrap();
        assert_eq!(get(&mut builds), b"good object");
        assert_eq!(builds, 4);
        // No temporary files are left behind.
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["support-k.o", "support-k.o.sha256"]);
    }

    #[test]
    fn private_temp_files_are_private_and_unpredictable() {
        let (a, pa) = private_temp_file("ppcc-t-", "x.o", b"1").unwrap();
        let (b, pb) = private_temp_file("ppcc-t-", "x.o", b"2").unwrap();
        assert_ne!(a.path(), b.path());
        assert_eq!(mode(a.path()), 0o700);
        assert_eq!(mode(&pa), 0o600);
        assert_eq!(std::fs::read(&pb).unwrap(), b"2");
    }
}
