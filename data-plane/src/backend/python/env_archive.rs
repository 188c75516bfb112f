//! `EXECUTION_ENV_PATH` archives: a Python environment packed with conda-pack (`.tar.gz` /
//! `.tgz`), as Triton takes it, unpacked once per archive and reused by every load of every
//! model that names it.
//!
//! ```text
//!  archive ─► key = hash(canonical path, size, mtime)
//!          ─► <temp>/nereid-python-envs-<uid>/<key>/ exists with its marker ─► reuse
//!          └► else unpack into <key>.unpacking-<random>/ (tar: no absolute paths, no `..`)
//!             ─► marker ─► rename to <key>/ (another process that won keeps its copy)
//! ```
//!
//! The cache directory is private (mode 0700, owned by this user, not a link), so nobody else
//! can swap the interpreter a model runs. Changing the archive (size or mtime) unpacks it anew
//! under a new key; old copies stay until the temp directory is cleaned.

use std::fs::File;
use std::hash::{Hash, Hasher};
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A file in an unpacked environment that says the unpack finished.
const MARKER: &str = ".nereid-unpacked";

/// True when `path` names an archive Nereid unpacks.
pub fn is_archive(path: &Path) -> bool {
    let name = path.to_string_lossy();
    name.ends_with(".tar.gz") || name.ends_with(".tgz")
}

/// The unpacked environment of the archive `archive`, unpacking it first unless a finished copy
/// is in the cache.
pub fn unpacked(archive: &Path) -> Result<PathBuf, String> {
    unpacked_in(&cache_root(), archive)
}

fn cache_root() -> PathBuf {
    let uid = rustix::process::geteuid().as_raw();
    std::env::temp_dir().join(format!("nereid-python-envs-{uid}"))
}

fn unpacked_in(root: &Path, archive: &Path) -> Result<PathBuf, String> {
    let meta = std::fs::metadata(archive).map_err(|e| format!("cannot be read: {e}"))?;
    if !meta.is_file() {
        return Err("is not a file".into());
    }
    let canonical = archive
        .canonicalize()
        .map_err(|e| format!("cannot be resolved: {e}"))?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (canonical, meta.len(), meta.mtime(), meta.mtime_nsec()).hash(&mut hasher);
    let key = format!("{:016x}", hasher.finish());
    private_root(root).map_err(|e| format!("cannot prepare '{}': {e}", root.display()))?;
    let target = root.join(&key);
    if target.join(MARKER).is_file() {
        return Ok(target);
    }
    let staging = tempfile::Builder::new()
        .prefix(&format!("{key}.unpacking-"))
        .tempdir_in(root)
        .map_err(|e| format!("cannot make a directory in '{}': {e}", root.display()))?;
    tracing::info!(archive = %archive.display(), into = %target.display(), "unpacking a Python environment archive");
    let file = File::open(archive).map_err(|e| format!("cannot be opened: {e}"))?;
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(io::BufReader::new(file)));
    tar.set_preserve_permissions(true);
    tar.set_overwrite(false);
    // `unpack` refuses entries outside the directory (absolute paths, `..`, links through links).
    tar.unpack(staging.path())
        .map_err(|e| format!("is not a gzip tar archive that unpacks cleanly: {e}"))?;
    File::create(staging.path().join(MARKER))
        .map_err(|e| format!("cannot mark the unpack: {e}"))?;
    let staged = staging.keep();
    if let Err(e) = std::fs::rename(&staged, &target) {
        let _ = std::fs::remove_dir_all(&staged);
        // Another process unpacked the same archive first: use its copy.
        if !target.join(MARKER).is_file() {
            return Err(format!(
                "cannot move the unpacked environment into place: {e}"
            ));
        }
    }
    Ok(target)
}

/// Makes `root` (mode 0700) if missing, and checks that it is a directory of this user's that
/// only this user can write (not a link someone planted).
fn private_root(root: &Path) -> io::Result<()> {
    match std::fs::create_dir(root) {
        Ok(()) => std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))?,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(root)?;
    let ours = meta.uid() == rustix::process::geteuid().as_raw();
    if !meta.file_type().is_dir() || !ours || meta.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "not a directory that only this user can use (remove it and retry)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::Compression;
    use flate2::write::GzEncoder;

    /// A .tar.gz with `bin/python3` (a script) and whatever `extra` adds.
    fn archive(
        dir: &Path,
        name: &str,
        extra: impl FnOnce(&mut tar::Builder<GzEncoder<File>>),
    ) -> PathBuf {
        let path = dir.join(name);
        let mut builder = tar::Builder::new(GzEncoder::new(
            File::create(&path).unwrap(),
            Compression::fast(),
        ));
        let script = b"#!/bin/sh\necho env\n";
        let mut header = tar::Header::new_gnu();
        header.set_size(script.len() as u64);
        header.set_mode(0o755);
        builder
            .append_data(&mut header, "bin/python3", &script[..])
            .unwrap();
        extra(&mut builder);
        builder.into_inner().unwrap().finish().unwrap();
        path
    }

    #[test]
    fn an_archive_is_unpacked_once_and_reused() {
        let work = tempfile::tempdir().unwrap();
        let root = work.path().join("cache");
        let env = archive(work.path(), "env.tar.gz", |_| {});
        let first = unpacked_in(&root, &env).unwrap();
        let python = first.join("bin/python3");
        assert!(python.is_file());
        assert_eq!(
            python.metadata().unwrap().mode() & 0o111,
            0o111,
            "kept executable"
        );
        assert_eq!(root.metadata().unwrap().mode() & 0o777, 0o700);
        // Reused: a file left in the unpacked copy is still there the second time.
        std::fs::write(first.join("left-here"), b"x").unwrap();
        let second = unpacked_in(&root, &env).unwrap();
        assert_eq!(second, first);
        assert!(second.join("left-here").is_file());
        // No staging directory is left behind.
        let entries: Vec<_> = std::fs::read_dir(&root).unwrap().collect();
        assert_eq!(entries.len(), 1);
    }

    #[test]
    fn a_changed_archive_is_unpacked_anew() {
        let work = tempfile::tempdir().unwrap();
        let root = work.path().join("cache");
        let env = archive(work.path(), "env.tgz", |_| {});
        let first = unpacked_in(&root, &env).unwrap();
        let env = archive(work.path(), "env.tgz", |b| {
            let mut header = tar::Header::new_gnu();
            header.set_size(1);
            header.set_mode(0o644);
            b.append_data(&mut header, "lib/new", &b"n"[..]).unwrap();
        });
        let second = unpacked_in(&root, &env).unwrap();
        assert_ne!(first, second);
        assert!(second.join("lib/new").is_file());
    }

    #[test]
    fn entries_outside_the_directory_and_bad_archives_are_refused() {
        let work = tempfile::tempdir().unwrap();
        let root = work.path().join("cache");
        let env = archive(work.path(), "evil.tar.gz", |b| {
            let mut header = tar::Header::new_gnu();
            header.set_size(1);
            header.set_mode(0o644);
            // `append_data` refuses `..` itself; write the name into the header raw.
            header.as_gnu_mut().unwrap().name[..12].copy_from_slice(b"../../escape");
            header.set_cksum();
            b.append(&header, &b"e"[..]).unwrap();
        });
        let unpacked = unpacked_in(&root, &env);
        assert!(!work.path().join("escape").exists());
        assert!(!root.parent().unwrap().join("escape").exists());
        // tar skips or refuses the entry; either way nothing lands outside.
        if let Ok(dir) = unpacked {
            assert!(dir.join("bin/python3").is_file());
        }
        let not_gzip = work.path().join("plain.tar.gz");
        std::fs::write(&not_gzip, b"not an archive").unwrap();
        let err = unpacked_in(&root, &not_gzip).unwrap_err();
        assert!(err.contains("is not a gzip tar archive"), "{err}");
        assert!(unpacked_in(&root, &work.path().join("missing.tgz")).is_err());
    }

    #[test]
    fn a_cache_root_others_can_write_is_refused() {
        let work = tempfile::tempdir().unwrap();
        let root = work.path().join("cache");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o777)).unwrap();
        let env = archive(work.path(), "env.tar.gz", |_| {});
        let err = unpacked_in(&root, &env).unwrap_err();
        assert!(err.contains("only this user"), "{err}");
    }
}
