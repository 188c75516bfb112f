//! Shared-memory segments (docs/internals/python-stub-protocol.md, "Shared memory").
//!
//! * [`ParentSegments`]: segments the server wrote. Each message's tensors share one [`Lease`]
//!   on the segment's mapping; when the last tensor or NumPy array over it is gone the lease
//!   queues the segment's `release` in [`Releases`], which the next frame to the server (or the
//!   release thread) carries.
//! * [`StubSegments`]: segments the stub writes (outputs, BLS inputs), reused once the server
//!   releases them, grown with `ftruncate` and never shrunk.
//!
//! Files are created and opened by the protocol's rules (`nereid_stub_protocol::segment`: never
//! through a symlink, never inherited by a process a model starts, created exclusively, 0600).
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use nereid_stub_protocol::frame;
use nereid_stub_protocol::message::FromStub;
use nereid_stub_protocol::segment::{self as rules, Writer};

/// Stub segments grow in steps of this.
const GRANULE: usize = 64 << 10;

/// One `mmap` of a whole segment file, unmapped when the last user is gone.
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
    writable: bool,
}

// SAFETY: the mapping is plain shared memory; who reads or writes which range is decided by the
// protocol (a segment is written only while its writer holds it busy), not by the thread.
unsafe impl Send for Mapping {}
// SAFETY: as for Send: concurrent access to a range is ruled out by the protocol, not by `&`.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn map(file: &File, len: usize, writable: bool) -> io::Result<Mapping> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of `len` bytes of an open file; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
            writable,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Address of byte `offset` (the caller keeps `offset` within `len`).
    pub fn at(&self, offset: usize) -> *mut u8 {
        debug_assert!(offset <= self.len);
        self.ptr.wrapping_add(offset)
    }

    pub fn writable(&self) -> bool {
        self.writable
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nothing refers to the mapping any
        // more (every user holds an `Arc` to it).
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// Frames that go to the server ahead of the next frame sent (segment releases, metric
/// deletions from `__del__`), and the release thread's wake-up.
#[derive(Default)]
pub struct Releases {
    pending: Mutex<Vec<u8>>,
    wake: Condvar,
    /// An execute reply is being sent and will carry whatever is pending: no wake-up needed.
    replying: AtomicBool,
}

impl Releases {
    /// Queues `message`; safe anywhere, also inside the garbage collector.
    pub fn push(&self, message: &FromStub) {
        let Ok(bytes) = frame::encode(message) else {
            return;
        };
        self.pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(&bytes);
        if !self.replying.load(Ordering::Acquire) {
            self.wake.notify_one();
        }
    }

    /// Everything queued, as frames ready to write.
    pub fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn set_replying(&self, replying: bool) {
        self.replying.store(replying, Ordering::Release);
        let pending = !self
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        if !replying && pending {
            self.wake.notify_one();
        }
    }

    /// Blocks until something is queued outside a reply (the release thread).
    pub fn wait(&self) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        while pending.is_empty() || self.replying.load(Ordering::Acquire) {
            pending = self.wake.wait(pending).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The tensors of one message hold this on the parent segment they live in.
pub struct Lease {
    segment: String,
    pub mapping: Arc<Mapping>,
    releases: Arc<Releases>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.releases.push(&FromStub::Release {
            segment: std::mem::take(&mut self.segment),
        });
    }
}

/// Segments the server wrote, mapped once each and mapped again when a message reaches past
/// what was mapped (the server grew the file).
pub struct ParentSegments {
    prefix: String,
    maps: HashMap<String, Arc<Mapping>>,
    releases: Arc<Releases>,
}

impl ParentSegments {
    pub fn new(prefix: String, releases: Arc<Releases>) -> Self {
        ParentSegments {
            prefix,
            maps: HashMap::new(),
            releases,
        }
    }

    /// Releases a segment nothing will read (no tensor data in it, or a bad message).
    pub fn release_unused(&self, segment: Option<&str>) {
        if let Some(segment) = segment {
            self.releases.push(&FromStub::Release {
                segment: segment.to_owned(),
            });
        }
    }

    /// A lease on `segment` covering bytes `..end`; `None` when `end` is 0 (the segment, if
    /// any, is released at once).
    pub fn lease(
        &mut self,
        segment: Option<&str>,
        end: usize,
    ) -> Result<Option<Arc<Lease>>, String> {
        if end == 0 {
            self.release_unused(segment);
            return Ok(None);
        }
        let Some(segment) = segment else {
            return Err("message has tensor data but no 'segment'".into());
        };
        let result = self.mapping(segment, end);
        match result {
            Ok(mapping) => Ok(Some(Arc::new(Lease {
                segment: segment.to_owned(),
                mapping,
                releases: self.releases.clone(),
            }))),
            Err(e) => {
                self.release_unused(Some(segment));
                Err(e)
            }
        }
    }

    fn mapping(&mut self, segment: &str, end: usize) -> Result<Arc<Mapping>, String> {
        if !Writer::Parent.owns(segment) {
            return Err(format!("invalid parent segment id {segment:?}"));
        }
        if let Some(mapping) = self.maps.get(segment)
            && mapping.len() >= end
        {
            return Ok(mapping.clone());
        }
        let path = format!("{}{}", self.prefix, segment);
        let (file, writable) = match rules::open(Path::new(&path), true) {
            Ok(file) => (file, true),
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => (
                rules::open(Path::new(&path), false)
                    .map_err(|e| format!("cannot open segment '{segment}' ({path}): {e}"))?,
                false,
            ),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(format!("segment '{segment}' does not exist ({path})"));
            }
            Err(e) => return Err(format!("cannot open segment '{segment}' ({path}): {e}")),
        };
        let size = file
            .metadata()
            .map_err(|e| format!("cannot stat segment '{segment}': {e}"))?
            .len() as usize;
        if size < end {
            return Err(format!(
                "segment '{segment}' is {size} bytes, but its tensors end at byte {end}"
            ));
        }
        let mapping = Arc::new(
            Mapping::map(&file, size, writable)
                .map_err(|e| format!("cannot map segment '{segment}': {e}"))?,
        );
        self.maps.insert(segment.to_owned(), mapping.clone());
        Ok(mapping)
    }
}

/// `n` rounded up to the protocol's alignment.
pub fn align(n: usize) -> usize {
    rules::aligned(n as u64) as usize
}

struct StubSegment {
    id: String,
    file: File,
    mapping: Option<Mapping>,
    busy: bool,
}

impl StubSegment {
    fn size(&self) -> usize {
        self.mapping.as_ref().map_or(0, Mapping::len)
    }
}

/// A stub segment held busy for one message: write into it, then send its id (or give it back
/// with [`StubSegments::release`]).
pub struct Acquired {
    pub id: String,
    ptr: *mut u8,
    len: usize,
}

impl Acquired {
    /// Copies `len` bytes from `src` to `offset`.
    ///
    /// # Safety
    /// `src` must be readable for `len` bytes while the call runs.
    pub unsafe fn write(&self, offset: usize, src: *const u8, len: usize) {
        assert!(offset + len <= self.len, "write past the acquired segment");
        // SAFETY: the destination range is inside this busy segment's mapping (checked above),
        // which no one else writes or remaps while it is busy; the caller vouches for `src`.
        unsafe { std::ptr::copy_nonoverlapping(src, self.ptr.add(offset), len) };
    }
}

/// Segments the stub writes; shared by every thread that sends tensors.
pub struct StubSegments {
    prefix: String,
    segments: Mutex<Vec<StubSegment>>,
}

impl StubSegments {
    pub fn new(prefix: String) -> Self {
        StubSegments {
            prefix,
            segments: Mutex::new(Vec::new()),
        }
    }

    /// A free segment of at least `size` bytes, marked busy: the smallest free one that fits,
    /// else the largest free one grown, else a new one.
    pub fn acquire(&self, size: usize) -> Result<Acquired, String> {
        let mut segments = self.segments.lock().unwrap_or_else(|e| e.into_inner());
        let free = segments.iter().enumerate().filter(|(_, s)| !s.busy);
        let fitting = free
            .clone()
            .filter(|(_, s)| s.size() >= size)
            .min_by_key(|(_, s)| s.size())
            .map(|(i, _)| i);
        let index = match fitting.or_else(|| free.max_by_key(|(_, s)| s.size()).map(|(i, _)| i)) {
            Some(i) => i,
            None => {
                let id = Writer::Stub.id(segments.len() as u64);
                let path = format!("{}{}", self.prefix, id);
                let file = rules::create(Path::new(&path))
                    .map_err(|e| format!("cannot create shared-memory segment {path}: {e}"))?;
                segments.push(StubSegment {
                    id,
                    file,
                    mapping: None,
                    busy: false,
                });
                segments.len() - 1
            }
        };
        let segment = &mut segments[index];
        if segment.size() < size {
            let new_size = size.div_ceil(GRANULE) * GRANULE;
            let path = format!("{}{}", self.prefix, segment.id);
            segment.mapping = None;
            segment.file.set_len(new_size as u64).map_err(|e| {
                format!("cannot grow shared-memory segment {path} to {new_size} bytes: {e}")
            })?;
            segment.mapping = Some(
                Mapping::map(&segment.file, new_size, true)
                    .map_err(|e| format!("cannot map shared-memory segment {path}: {e}"))?,
            );
        }
        segment.busy = true;
        let mapping = segment.mapping.as_ref().ok_or_else(|| {
            format!(
                "shared-memory segment {}{} is not mapped",
                self.prefix, segment.id
            )
        })?;
        Ok(Acquired {
            id: segment.id.clone(),
            ptr: mapping.at(0),
            len: mapping.len(),
        })
    }

    /// Marks a segment free for reuse; false when it is not a busy segment of ours.
    pub fn release(&self, id: &str) -> bool {
        let mut segments = self.segments.lock().unwrap_or_else(|e| e.into_inner());
        match segments.iter_mut().find(|s| s.id == id) {
            Some(segment) if segment.busy => {
                segment.busy = false;
                true
            }
            _ => false,
        }
    }

    /// Removes every file under the prefix, the server's segments too (the stub is exiting and
    /// the server may be gone), and the directory when the prefix is one.
    pub fn unlink_prefix(&self) {
        let (dir, stem) = match self.prefix.rfind('/') {
            Some(i) => (&self.prefix[..i.max(1)], &self.prefix[i + 1..]),
            None => (".", self.prefix.as_str()),
        };
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with(stem) {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        if stem.is_empty() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}
