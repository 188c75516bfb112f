//! Shared-memory segments: the files tensor data travels in between the parent and a stub.
//!
//! ```text
//!  parent writes (ParentSegments)                 stub writes (StubSegments reads them)
//!  <prefix>p0, <prefix>p1 ...                     <prefix>s0, <prefix>s1 ...
//!   checkout(n bytes) ─► write tensors at 64-byte   read_many(id, refs) ─► positioned reads
//!   aligned offsets ─► in use until the stub         into owned buffers ─► parent sends
//!   sends `release` ─► free for the next message     `release` for the segment
//! ```
//!
//! Segments are regular files on tmpfs (`/dev/shm` when it exists, else the temp directory), so
//! the stub can `mmap` them while the parent uses positioned reads and writes (`pread`/`pwrite`),
//! which need no `unsafe`. A segment grows with `set_len` and never shrinks; the stub maps it
//! again when it finds a range past what it mapped.
//!
//! Each stub's segments live in their own [`SegmentDir`], `/dev/shm/nereid-py-<server pid>-
//! <instance>-<random>/`, which the server creates with one `mkdir` (mode 0700, a fresh random
//! name, checked to be a directory of ours) and the stub is told as its `shm_prefix`
//! (`<dir>/`; segment `p0` is `<dir>/p0`). Clients register system shared memory by a single
//! name under `/dev/shm` (a key holding `/` is refused), so no client can name a segment to read
//! another client's tensors or write into one in use; other users cannot enter the directory.
//! Segment files are created with `O_CREAT|O_EXCL|O_NOFOLLOW|O_CLOEXEC`, mode 0600. The
//! directory goes with everything in it when its `SegmentDir` is dropped (the stub is dropped);
//! a stub whose server is gone empties and removes it itself before exiting.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::process::private_dir_in;

use nereid_stub_protocol::segment::{self as rules, Writer};

/// The smallest segment created; tmpfs files are sparse, so spare capacity costs nothing until
/// written.
const MIN_CAPACITY: u64 = 64 * 1024;

/// A segment that could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum ShmError {
    #[error("shared-memory segment '{path}': {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("'{0}' is not a stub segment id (expected 's' followed by digits)")]
    BadId(String),
    #[error(
        "tensor '{name}' lies at bytes {offset}..{end} of segment '{id}', which holds only {size} bytes"
    )]
    OutOfRange {
        id: String,
        name: String,
        offset: u64,
        end: u64,
        size: u64,
    },
}

/// Where segment directories go: `/dev/shm` when it exists, else the temp directory.
pub fn shm_dir() -> PathBuf {
    let dev_shm = Path::new("/dev/shm");
    if dev_shm.is_dir() {
        dev_shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// The private directory (mode 0700) that one stub's segments live in, both sides'; removed
/// with its contents on drop.
#[derive(Debug)]
pub struct SegmentDir {
    path: PathBuf,
}

impl SegmentDir {
    /// A new directory `<shm_dir>/<name_prefix><random>`.
    pub fn create(name_prefix: &str) -> io::Result<Self> {
        let path = private_dir_in(&shm_dir(), name_prefix)?.keep();
        Ok(SegmentDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The stub's `shm_prefix`: segment `<id>` is the file `<prefix><id>`.
    pub fn prefix(&self) -> String {
        format!("{}/", self.path().display())
    }
}

impl Drop for SegmentDir {
    /// Best effort: a failure is logged. Already gone is fine (a stub whose server went away
    /// removes it).
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove a Python stub's shared-memory directory");
        }
    }
}

/// The tensors of one message, laid out at aligned offsets ([`rules::ALIGN`]) of one segment.
#[derive(Debug, Default)]
pub struct Packer<'a> {
    parts: Vec<&'a [u8]>,
    offsets: Vec<u64>,
    end: u64,
}

impl<'a> Packer<'a> {
    /// Places `data` after the previous part; returns its offset.
    pub fn add(&mut self, data: &'a [u8]) -> u64 {
        let offset = rules::aligned(self.end);
        self.parts.push(data);
        self.offsets.push(offset);
        self.end = offset + data.len() as u64;
        offset
    }

    /// No tensor at all: the message needs no segment.
    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// Bytes the segment must hold.
    pub fn len(&self) -> u64 {
        self.end
    }
}

/// One parent-owned segment file.
#[derive(Debug)]
pub struct Segment {
    id: String,
    path: PathBuf,
    file: File,
    capacity: u64,
}

impl Segment {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Writes every part of `packed` at its offset.
    pub fn write(&self, packed: &Packer<'_>) -> Result<(), ShmError> {
        for (part, &offset) in packed.parts.iter().zip(&packed.offsets) {
            self.file
                .write_all_at(part, offset)
                .map_err(|source| self.error(source))?;
        }
        Ok(())
    }

    fn grow_to(&mut self, needed: u64) -> Result<(), ShmError> {
        if needed <= self.capacity {
            return Ok(());
        }
        let capacity = needed.max(MIN_CAPACITY).next_power_of_two();
        self.file
            .set_len(capacity)
            .map_err(|source| self.error(source))?;
        self.capacity = capacity;
        Ok(())
    }

    fn error(&self, source: io::Error) -> ShmError {
        ShmError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

/// The parent's segments for one stub: free ones to reuse, and those the stub still reads.
#[derive(Debug)]
pub struct ParentSegments {
    prefix: String,
    free: Vec<Segment>,
    in_use: HashMap<String, Segment>,
    next: u64,
}

impl ParentSegments {
    /// `prefix`: the stub's `shm_prefix` ([`SegmentDir::prefix`]; `p<k>` is appended).
    pub fn new(prefix: impl Into<String>) -> Self {
        ParentSegments {
            prefix: prefix.into(),
            free: Vec::new(),
            in_use: HashMap::new(),
            next: 0,
        }
    }

    /// A segment holding at least `needed` bytes: the smallest free one that fits, else the
    /// largest free one grown, else a new one. Hand it back with [`Self::mark_in_use`] once
    /// written, or [`Self::put_back`] if writing failed.
    pub fn checkout(&mut self, needed: u64) -> Result<Segment, ShmError> {
        let fitting = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, s)| s.capacity >= needed)
            .min_by_key(|(_, s)| s.capacity)
            .map(|(i, _)| i);
        let largest = || {
            self.free
                .iter()
                .enumerate()
                .max_by_key(|(_, s)| s.capacity)
                .map(|(i, _)| i)
        };
        let mut segment = match fitting.or_else(largest) {
            Some(i) => self.free.swap_remove(i),
            None => self.create()?,
        };
        if let Err(e) = segment.grow_to(needed) {
            self.free.push(segment);
            return Err(e);
        }
        Ok(segment)
    }

    /// The segment was written and sent: it is the stub's until it sends `release`.
    pub fn mark_in_use(&mut self, segment: Segment) {
        self.in_use.insert(segment.id.clone(), segment);
    }

    /// A checked-out segment that was not sent.
    pub fn put_back(&mut self, segment: Segment) {
        self.free.push(segment);
    }

    /// The stub released `id`; `false` if no such segment was in use.
    pub fn release(&mut self, id: &str) -> bool {
        match self.in_use.remove(id) {
            Some(segment) => {
                self.free.push(segment);
                true
            }
            None => false,
        }
    }

    /// How many segments exist (free and in use).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.free.len() + self.in_use.len()
    }

    /// Segments the stub has not released yet.
    #[cfg(test)]
    pub fn in_use(&self) -> usize {
        self.in_use.len()
    }

    fn create(&mut self) -> Result<Segment, ShmError> {
        let id = Writer::Parent.id(self.next);
        self.next += 1;
        let path = PathBuf::from(format!("{}{id}", self.prefix));
        let file = rules::create(&path).map_err(|source| ShmError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(Segment {
            id,
            path,
            file,
            capacity: 0,
        })
    }
}

/// Read access to the stub's segments; files stay open (stub ids are never reused).
#[derive(Debug)]
pub struct StubSegments {
    prefix: String,
    open: HashMap<String, File>,
}

impl StubSegments {
    pub fn new(prefix: impl Into<String>) -> Self {
        StubSegments {
            prefix: prefix.into(),
            open: HashMap::new(),
        }
    }

    /// Copies the ranges `(name, offset, nbytes)` out of segment `id`. Every range is checked
    /// against the file's size first, so a corrupt reference cannot make the parent allocate
    /// more than the segment holds.
    pub fn read_many(
        &mut self,
        id: &str,
        ranges: &[(&str, u64, u64)],
    ) -> Result<Vec<Vec<u8>>, ShmError> {
        let path = self.path(id)?;
        let file = match self.open.entry(id.to_string()) {
            Entry::Occupied(open) => open.into_mut(),
            Entry::Vacant(slot) => {
                let file = rules::open(&path, false).map_err(|source| ShmError::Io {
                    path: path.clone(),
                    source,
                })?;
                slot.insert(file)
            }
        };
        let io_error = |source| ShmError::Io {
            path: path.clone(),
            source,
        };
        let size = file.metadata().map_err(io_error)?.len();
        ranges
            .iter()
            .map(|&(name, offset, nbytes)| {
                let end = offset.checked_add(nbytes).filter(|&e| e <= size);
                let Some(end) = end else {
                    return Err(ShmError::OutOfRange {
                        id: id.to_string(),
                        name: name.to_string(),
                        offset,
                        end: offset.saturating_add(nbytes),
                        size,
                    });
                };
                let len = usize::try_from(end - offset).map_err(|_| ShmError::OutOfRange {
                    id: id.to_string(),
                    name: name.to_string(),
                    offset,
                    end,
                    size,
                })?;
                read_range(file, offset, len).map_err(io_error)
            })
            .collect()
    }

    /// `s<digits>` only: the id becomes part of a path.
    fn path(&self, id: &str) -> Result<PathBuf, ShmError> {
        if !Writer::Stub.owns(id) {
            return Err(ShmError::BadId(id.to_string()));
        }
        Ok(PathBuf::from(format!("{}{id}", self.prefix)))
    }
}

/// Reads `len` bytes at `offset` into a new buffer. Through the file's cursor (this handle is
/// used under a lock only) because `read_to_end` fills spare capacity without zeroing it first,
/// which a positioned read into a `vec![0; len]` would cost for every large output.
fn read_range(mut file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    file.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::with_capacity(len);
    file.take(len as u64).read_to_end(&mut buf)?;
    if buf.len() != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("read {} of {len} bytes", buf.len()),
        ));
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(dir: &tempfile::TempDir) -> String {
        format!("{}/seg-", dir.path().display())
    }

    #[test]
    fn packer_aligns_every_part() {
        let mut packed = Packer::default();
        assert!(packed.is_empty());
        let offsets: Vec<u64> = [&[1u8; 3][..], &[2; 64], &[], &[3]]
            .into_iter()
            .map(|part| packed.add(part))
            .collect();
        assert_eq!(offsets, vec![0, 64, 128, 128]);
        assert_eq!(packed.len(), 129);
    }

    #[test]
    fn segments_are_reused_after_release_and_grow_when_needed() {
        let dir = tempfile::tempdir().unwrap();
        let mut pool = ParentSegments::new(prefix(&dir));
        let a = pool.checkout(100).unwrap();
        assert_eq!(a.id(), "p0");
        let mut packed = Packer::default();
        packed.add(b"x");
        packed.add(b"hello");
        a.write(&packed).unwrap();
        pool.mark_in_use(a);
        let on_disk = std::fs::read(format!("{}p0", prefix(&dir))).unwrap();
        assert_eq!(&on_disk[64..69], b"hello");
        // p0 is in use: a second message gets a new segment.
        let b = pool.checkout(10).unwrap();
        assert_eq!(b.id(), "p1");
        pool.mark_in_use(b);
        assert_eq!((pool.len(), pool.in_use()), (2, 2));

        assert!(pool.release("p0"));
        assert!(!pool.release("p0"), "a second release is refused");
        let big = 5 * MIN_CAPACITY;
        let reused = pool.checkout(big).unwrap();
        assert_eq!(
            reused.id(),
            "p0",
            "the free segment is grown, not a new one made"
        );
        assert!(reused.capacity >= big);
        let on_disk = std::fs::metadata(format!("{}p0", prefix(&dir)))
            .unwrap()
            .len();
        assert_eq!(on_disk, reused.capacity);
        let grown = reused.capacity;
        pool.mark_in_use(reused);
        pool.release("p0");
        let again = pool.checkout(1).unwrap();
        assert_eq!(again.capacity, grown, "segments never shrink");
        pool.put_back(again);
        assert_eq!((pool.len(), pool.in_use()), (2, 1));
    }

    #[test]
    fn best_fit_prefers_the_smallest_segment_that_holds_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let mut pool = ParentSegments::new(prefix(&dir));
        let small = pool.checkout(1).unwrap();
        let large = pool.checkout(4 * MIN_CAPACITY).unwrap();
        pool.put_back(large);
        pool.put_back(small);
        assert_eq!(pool.checkout(10).unwrap().id(), "p0");
        assert_eq!(pool.checkout(10).unwrap().id(), "p1");
    }

    #[test]
    fn stub_segments_read_ranges_and_refuse_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = format!("{}s3", prefix(&dir));
        let mut data = vec![0u8; 200];
        data[64..69].copy_from_slice(b"world");
        std::fs::write(&path, &data).unwrap();
        let mut segments = StubSegments::new(prefix(&dir));
        let got = segments
            .read_many("s3", &[("A", 64, 5), ("B", 0, 0)])
            .unwrap();
        assert_eq!(got, vec![b"world".to_vec(), vec![]]);
        let err = segments.read_many("s3", &[("A", 190, 20)]).unwrap_err();
        assert!(
            err.to_string()
                .contains("tensor 'A' lies at bytes 190..210"),
            "{err}"
        );
        assert!(matches!(
            segments.read_many("s3", &[("A", u64::MAX, 2)]),
            Err(ShmError::OutOfRange { .. })
        ));
        for bad in ["p0", "s", "s1/../x", "../s1"] {
            assert!(matches!(
                segments.read_many(bad, &[]),
                Err(ShmError::BadId(_))
            ));
        }
    }

    #[test]
    fn stub_segments_see_growth_of_an_open_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = format!("{}s0", prefix(&dir));
        std::fs::write(&path, [1u8; 8]).unwrap();
        let mut segments = StubSegments::new(prefix(&dir));
        assert!(segments.read_many("s0", &[("x", 0, 8)]).is_ok());
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(&[7u8; 8], 1024).unwrap();
        let got = segments.read_many("s0", &[("x", 1024, 8)]).unwrap();
        assert_eq!(got[0], vec![7u8; 8]);
    }

    #[test]
    fn segments_live_in_a_private_directory_that_goes_on_drop() {
        use std::os::unix::fs::PermissionsExt;
        let dir = SegmentDir::create("nereid-test-segments-").unwrap();
        let path = dir.path().to_path_buf();
        assert_eq!(dir.prefix(), format!("{}/", path.display()));
        assert_eq!(path.parent(), Some(shm_dir().as_path()));
        let mut pool = ParentSegments::new(dir.prefix());
        let segment = pool.checkout(10).unwrap();
        let mode = std::fs::metadata(path.join("p0"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "segment files are owner-only");
        pool.mark_in_use(segment);
        // What the stub writes lands beside the parent's segments.
        std::fs::write(path.join("s0"), [1u8; 8]).unwrap();
        let mut stub = StubSegments::new(dir.prefix());
        assert!(stub.read_many("s0", &[("x", 0, 8)]).is_ok());
        drop(dir);
        assert!(
            !path.exists(),
            "the directory and both sides' segments are removed"
        );
        // Handles still open keep working on unlinked files.
        assert!(pool.release("p0"));
    }

    #[test]
    fn segments_are_never_opened_through_a_planted_path() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        std::fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("seg-p0")).unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("seg-s0")).unwrap();
        let mut pool = ParentSegments::new(prefix(&dir));
        assert!(matches!(pool.checkout(1), Err(ShmError::Io { .. })));
        let mut stub = StubSegments::new(prefix(&dir));
        assert!(matches!(
            stub.read_many("s0", &[("x", 0, 4)]),
            Err(ShmError::Io { .. })
        ));
        std::fs::write(dir.path().join("seg-p1"), b"").unwrap();
        assert!(
            matches!(pool.checkout(1), Err(ShmError::Io { .. })),
            "an existing file is not taken over"
        );
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    }
}
