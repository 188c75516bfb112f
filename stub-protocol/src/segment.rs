//! The rules both sides follow for shared-memory segment files (docs/internals/
//! python-stub-protocol.md, "Shared memory"): ids, alignment, and how a file is created and
//! opened.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Tensors start at multiples of this within a segment (cache-line and SIMD friendly for NumPy).
pub const ALIGN: u64 = 64;

/// Never through a symlink, and not inherited by processes either side starts (a model's
/// subprocesses, the server's other children).
const OPEN_FLAGS: i32 = libc::O_NOFOLLOW | libc::O_CLOEXEC;

/// Who wrote a segment: the first character of its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    /// `p<k>`.
    Parent,
    /// `s<k>`.
    Stub,
}

impl Writer {
    fn prefix(self) -> char {
        match self {
            Writer::Parent => 'p',
            Writer::Stub => 's',
        }
    }

    /// The id of this writer's segment number `k`.
    pub fn id(self, k: u64) -> String {
        format!("{}{k}", self.prefix())
    }

    /// Whether `id` is one of this writer's segment ids: the letter then digits only, since
    /// the id becomes part of a path.
    pub fn owns(self, id: &str) -> bool {
        id.strip_prefix(self.prefix())
            .is_some_and(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()))
    }
}

/// `offset` rounded up to [`ALIGN`].
pub fn aligned(offset: u64) -> u64 {
    offset.next_multiple_of(ALIGN)
}

/// Creates a new segment file (it must not exist), mode 0600, open for reading and writing.
pub fn create(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(OPEN_FLAGS)
        .open(path)
}

/// Opens the other side's segment file, for reading and, when `writable`, writing.
pub fn open(path: &Path, writable: bool) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(writable)
        .custom_flags(OPEN_FLAGS)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_writer_and_nothing_else() {
        assert_eq!(Writer::Parent.id(3), "p3");
        assert!(Writer::Parent.owns("p12"));
        for bad in ["s1", "p", "p1/../x", "../p1", "p-1", "P1"] {
            assert!(!Writer::Parent.owns(bad), "{bad}");
        }
        assert!(Writer::Stub.owns("s0"));
        assert_eq!(
            (aligned(0), aligned(1), aligned(64), aligned(65)),
            (0, 64, 64, 128)
        );
    }

    #[test]
    fn files_are_created_once_private_and_never_through_a_link() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("nereid-seg-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s0");
        let _ = std::fs::remove_file(&path);
        create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(create(&path).is_err(), "O_EXCL");
        let link = dir.join("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(open(&link, false).is_err(), "O_NOFOLLOW");
        assert!(open(&path, true).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
