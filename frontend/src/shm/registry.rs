//! The registry of shared-memory regions a server process serves, and the one way bytes move
//! in and out of a region. System regions are described here; CUDA regions (a client's device
//! allocation, same namespace, copies through the CUDA driver) are registered in `super::cuda`.
//!
//! A region is a span `[offset, offset + byte_size)` of a POSIX shared-memory object that a
//! client created (`shm_open` + `ftruncate`). On Linux such an object is the file
//! `/dev/shm/<key without its leading '/'>`; registering opens that file and keeps the `File`
//! until the region is unregistered (and until the last request using it finishes). Bytes move
//! with `read_exact_at` / `write_all_at`, never through a mapping: a client that shrinks or
//! removes the object behind the server's back gets a clear error for the next request that
//! touches it, never a `SIGBUS`, and the crate stays free of `unsafe`.
//!
//! ```text
//! register(name, key, offset, byte_size) ─► open /dev/shm/<key> (read-write, else read-only)
//!                                           check offset + byte_size ≤ object size
//! region(name) ─► Arc<Region> (lock held only for the lookup)
//! Region::read(span) / Region::write(span, bytes): span checked against the registered size,
//!                                                  then against the object's size now
//! ```

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use nereid_proto::{ServiceError, ServiceResult};

/// Where POSIX shared-memory objects live on Linux.
const SHM_DIR: &str = "/dev/shm";

/// What a status request reports for one region (Triton's `RegionStatus`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionStatus {
    /// The name the region was registered under.
    pub name: String,
    /// The shared-memory key it maps (e.g. `/my_region`, an object under `/dev/shm`).
    pub key: String,
    /// Where the region starts within the object, in bytes.
    pub offset: u64,
    /// The region's size in bytes.
    pub byte_size: u64,
}

/// One registered region, open until the last holder drops it.
#[derive(Debug)]
pub struct Region {
    name: String,
    byte_size: u64,
    pub(super) backing: Backing,
}

/// Where a region's bytes are.
#[derive(Debug)]
pub(super) enum Backing {
    /// `[offset, offset + byte_size)` of a POSIX shared-memory object.
    System {
        status: RegionStatus,
        file: File,
        /// Opened read-write; a read-only region cannot take outputs.
        writable: bool,
    },
    /// A client's CUDA allocation, opened through its IPC handle (`super::cuda`).
    Cuda {
        device_id: u64,
        memory: crate::cuda::DeviceRegion,
    },
}

impl Region {
    pub(super) fn new(name: &str, byte_size: u64, backing: Backing) -> Region {
        Region {
            name: name.to_string(),
            byte_size,
            backing,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn byte_size(&self) -> u64 {
        self.byte_size
    }

    /// Checks `[offset, offset + len)` of the region, with Triton's messages, and returns the
    /// span's start in the region's backing (the object for system memory, the allocation for
    /// CUDA memory).
    fn span(&self, offset: u64, len: u64) -> ServiceResult<u64> {
        let name = self.name();
        let size = self.byte_size;
        if offset >= size && !(offset == 0 && len == 0) {
            return Err(ServiceError::invalid(format!(
                "Invalid offset for shared memory region: '{name}'"
            )));
        }
        match offset.checked_add(len) {
            Some(end) if end <= size => {}
            _ => {
                return Err(ServiceError::invalid(format!(
                    "Invalid offset + byte size for shared memory region: '{name}'"
                )));
            }
        }
        let Backing::System { status, file, .. } = &self.backing else {
            return Ok(offset);
        };
        let start = status.offset + offset;
        // The object may have been truncated since it was registered.
        let now = file
            .metadata()
            .map_err(|e| self.io_error("cannot read the size of", e))?
            .len();
        if start + len > now {
            return Err(ServiceError::invalid(format!(
                "shared memory region '{name}': its shared memory object '{}' is now {now} bytes, too small for bytes {start}..{}; was it shrunk or removed after registration?",
                status.key,
                start + len
            )));
        }
        Ok(start)
    }

    /// Copies `len` bytes at `offset` (relative to the region) out of the region.
    pub fn read(&self, offset: u64, len: u64) -> ServiceResult<Vec<u8>> {
        let start = self.span(offset, len)?;
        let len = usize::try_from(len).map_err(|_| {
            ServiceError::invalid(format!(
                "shared memory region '{}': {len} bytes do not fit in memory",
                self.name()
            ))
        })?;
        let mut data = vec![0u8; len];
        match &self.backing {
            Backing::System { file, .. } => file
                .read_exact_at(&mut data, start)
                .map_err(|e| self.io_error("cannot read from", e))?,
            Backing::Cuda { memory, .. } => memory
                .read(start, &mut data)
                .map_err(|e| self.cuda_error("cannot copy from", e))?,
        }
        Ok(data)
    }

    /// Copies `data` into the region at `offset` (relative to the region).
    pub fn write(&self, offset: u64, data: &[u8]) -> ServiceResult<()> {
        if let Backing::System {
            writable: false,
            status,
            ..
        } = &self.backing
        {
            return Err(ServiceError::invalid(format!(
                "shared memory region '{}' is read-only to the server (its shared memory object '{}' could only be opened for reading), so it cannot hold outputs",
                self.name(),
                status.key
            )));
        }
        let start = self.span(offset, data.len() as u64)?;
        match &self.backing {
            Backing::System { file, .. } => file
                .write_all_at(data, start)
                .map_err(|e| self.io_error("cannot write to", e)),
            Backing::Cuda { memory, .. } => memory
                .write(start, data)
                .map_err(|e| self.cuda_error("cannot copy to", e)),
        }
    }

    fn io_error(&self, what: &str, e: std::io::Error) -> ServiceError {
        let key = match &self.backing {
            Backing::System { status, .. } => status.key.as_str(),
            Backing::Cuda { .. } => "",
        };
        ServiceError::invalid(format!(
            "shared memory region '{}': {what} its shared memory object '{key}': {e}",
            self.name(),
        ))
    }

    fn cuda_error(&self, what: &str, e: crate::cuda::CudaError) -> ServiceError {
        ServiceError::internal(format!(
            "CUDA shared memory region '{}': {what} the device: {e}",
            self.name()
        ))
    }
}

/// The regions of one server process, shared by its HTTP and gRPC frontends (a cheap handle:
/// clones share the same regions). A disabled registry (the router's) answers every use with the
/// reason it is off.
#[derive(Clone)]
pub struct SharedMemory(Arc<Inner>);

enum Inner {
    Enabled(Mutex<BTreeMap<String, Arc<Region>>>),
    Disabled(String),
    /// The operator did not opt in (`--allow-client-shm`): Triton's refusal, word for word.
    ClientOff,
}

/// Triton's refusal of client shared memory when `--allow-client-shm` is off.
pub const CLIENT_SHM_OFF: &str =
    "Client shared memory is disabled. Start the server with '--allow-client-shm=true' to enable.";

impl std::fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_ref() {
            Inner::Enabled(_) => f.write_str("SharedMemory(enabled)"),
            Inner::Disabled(reason) => write!(f, "SharedMemory(disabled: {reason})"),
            Inner::ClientOff => f.write_str("SharedMemory(off: --allow-client-shm)"),
        }
    }
}

/// Two handles are equal when they share the same regions.
impl PartialEq for SharedMemory {
    fn eq(&self, other: &SharedMemory) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedMemory {}

/// Off, with a generic reason: a frontend built without a registry of its own.
impl Default for SharedMemory {
    fn default() -> Self {
        SharedMemory::disabled("this server was started without a shared-memory registry")
    }
}

impl SharedMemory {
    /// An empty registry that serves regions.
    pub fn enabled() -> SharedMemory {
        SharedMemory(Arc::new(Inner::Enabled(Mutex::default())))
    }

    /// A registry that refuses every region; `reason` tells the client why.
    pub fn disabled(reason: impl Into<String>) -> SharedMemory {
        SharedMemory(Arc::new(Inner::Disabled(reason.into())))
    }

    /// A registry that refuses every region because the operator left client shared memory off
    /// (Triton's default since `--allow-client-shm`): registering answers 501 / UNIMPLEMENTED
    /// with Triton's message naming the flag, status lists nothing.
    pub fn client_off() -> SharedMemory {
        SharedMemory(Arc::new(Inner::ClientOff))
    }

    /// The registry `--allow-client-shm` asks for.
    pub fn for_clients(allow: bool) -> SharedMemory {
        if allow {
            SharedMemory::enabled()
        } else {
            SharedMemory::client_off()
        }
    }

    fn regions(&self) -> ServiceResult<std::sync::MutexGuard<'_, BTreeMap<String, Arc<Region>>>> {
        self.regions_of("system")
    }

    /// The lock on the regions; `kind` ("system", "CUDA") names what a disabled registry
    /// refuses.
    pub(super) fn regions_of(
        &self,
        kind: &str,
    ) -> ServiceResult<std::sync::MutexGuard<'_, BTreeMap<String, Arc<Region>>>> {
        match self.0.as_ref() {
            Inner::Enabled(regions) => regions
                .lock()
                .map_err(|_| ServiceError::internal("the shared memory registry is poisoned")),
            Inner::Disabled(reason) => Err(ServiceError::unsupported(format!(
                "{kind} shared memory is not available: {reason}"
            ))),
            Inner::ClientOff => Err(ServiceError::unsupported(CLIENT_SHM_OFF)),
        }
    }

    /// Registers `name` as `[offset, offset + byte_size)` of the object `key`.
    pub fn register(
        &self,
        name: &str,
        key: &str,
        offset: u64,
        byte_size: u64,
    ) -> ServiceResult<()> {
        if self.regions()?.contains_key(name) {
            return Err(already_registered(name));
        }
        let (file, writable) = open_object(key)?;
        let size = file
            .metadata()
            .map_err(|_| ServiceError::invalid(format!("Invalid shared memory region: '{key}'")))?
            .len();
        if offset.checked_add(byte_size).is_none_or(|end| end > size) {
            return Err(ServiceError::invalid(format!(
                "failed to register shared memory region '{name}': invalid args"
            )));
        }
        let status = RegionStatus {
            name: name.to_string(),
            key: key.to_string(),
            offset,
            byte_size,
        };
        let region = Region::new(
            name,
            byte_size,
            Backing::System {
                status,
                file,
                writable,
            },
        );
        // Opened outside the lock; a concurrent registration of the same name may have won.
        let mut regions = self.regions()?;
        if regions.contains_key(name) {
            return Err(already_registered(name));
        }
        regions.insert(name.to_string(), Arc::new(region));
        Ok(())
    }

    /// The region to read or write, held by the caller for as long as it uses it.
    pub fn region(&self, name: &str) -> ServiceResult<Arc<Region>> {
        self.regions()?.get(name).cloned().ok_or_else(|| {
            ServiceError::not_found(format!("Unable to find shared memory region: '{name}'"))
        })
    }

    /// Every system region (`None`) or the one named, by name.
    pub fn status(&self, name: Option<&str>) -> ServiceResult<Vec<RegionStatus>> {
        let regions = match self.regions() {
            Ok(regions) => regions,
            // Nothing can be registered here, so nothing is.
            Err(ServiceError::Unsupported(_)) if name.is_none() => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let system = |r: &Region| match &r.backing {
            Backing::System { status, .. } => Some(status.clone()),
            Backing::Cuda { .. } => None,
        };
        match name {
            None => Ok(regions.values().filter_map(|r| system(r)).collect()),
            Some(name) => match regions.get(name) {
                Some(r) => system(r).map(|s| vec![s]).ok_or_else(|| {
                    ServiceError::not_found(format!(
                        "The region named '{name}' is registered as CUDA shared memory, not system shared memory"
                    ))
                }),
                None => Err(ServiceError::not_found(format!(
                    "Unable to find system shared memory region: '{name}'"
                ))),
            },
        }
    }

    /// Unregisters one system region, or every system region (`None`); CUDA regions stay. An
    /// unknown name is not an error, as in Triton. Requests already using a region finish with
    /// it; its file closes after them.
    pub fn unregister(&self, name: Option<&str>) -> ServiceResult<()> {
        let mut regions = self.regions()?;
        remove_where(&mut regions, name, |b| matches!(b, Backing::System { .. }));
        Ok(())
    }
}

/// Removes the region `name` (or every region, `None`) whose backing `is_kind`.
pub(super) fn remove_where(
    regions: &mut BTreeMap<String, Arc<Region>>,
    name: Option<&str>,
    is_kind: impl Fn(&Backing) -> bool,
) {
    match name {
        None => regions.retain(|_, r| !is_kind(&r.backing)),
        Some(name) => {
            if regions.get(name).is_some_and(|r| is_kind(&r.backing)) {
                regions.remove(name);
            }
        }
    }
}

pub(super) fn already_registered(name: &str) -> ServiceError {
    ServiceError::AlreadyExists(format!("shared memory region '{name}' already in manager"))
}

/// The file behind a POSIX shared-memory key, opened read-write, else read-only; the flag says
/// which. Keys are single names (`/name` or `name`), as `shm_open` takes them.
/// Opens the shared-memory object `key` as `shm_open` would: one name directly under
/// `/dev/shm`, never through a symbolic link (`O_NOFOLLOW`; a planted `/dev/shm/x ->
/// /etc/passwd` would otherwise hand that file to any client), never a FIFO or device
/// (`O_NONBLOCK` keeps the open itself from blocking; anything but a regular file is refused),
/// and not inherited by child processes (`O_CLOEXEC`).
fn open_object(key: &str) -> ServiceResult<(File, bool)> {
    let unable = || ServiceError::invalid(format!("Unable to open shared memory region: '{key}'"));
    let name = key.strip_prefix('/').unwrap_or(key);
    if name.is_empty() || name.contains('/') || name == "." || name == ".." || name.contains('\0') {
        return Err(unable());
    }
    let path = PathBuf::from(SHM_DIR).join(name);
    let open = |write: bool| {
        OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
            .open(&path)
    };
    let (file, writable) = match open(true) {
        Ok(file) => (file, true),
        Err(e) if e.kind() == ErrorKind::PermissionDenied || e.raw_os_error() == Some(30) => {
            // EROFS or no write permission: inputs can still be read.
            match open(false) {
                Ok(file) => (file, false),
                Err(_) => return Err(unable()),
            }
        }
        Err(e) => {
            if e.raw_os_error() == Some(libc::ELOOP) {
                tracing::warn!(key, "refused a shared memory key that is a symbolic link");
            }
            return Err(unable());
        }
    };
    match file.metadata() {
        Ok(meta) if meta.is_file() => Ok((file, writable)),
        _ => Err(unable()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::test_object::TestObject;

    /// A name under /dev/shm unique to this test run.
    fn shm_name(what: &str) -> (String, PathBuf) {
        let name = format!("nereid_test_{what}_{}", std::process::id());
        (name.clone(), PathBuf::from(SHM_DIR).join(name))
    }

    #[test]
    fn a_symbolic_link_is_never_followed() {
        let target = TestObject::new(64);
        target.fill(0, b"secret");
        let (name, link) = shm_name("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&target.path, &link).unwrap();
        let shm = SharedMemory::enabled();
        let err = shm.register("r", &name, 0, 6).unwrap_err();
        std::fs::remove_file(&link).unwrap();
        assert_eq!(
            err,
            ServiceError::invalid(format!("Unable to open shared memory region: '{name}'"))
        );
        assert!(shm.status(None).unwrap().is_empty());
    }

    #[test]
    fn only_regular_files_are_objects() {
        let (name, dir) = shm_name("dir");
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap();
        let shm = SharedMemory::enabled();
        let refused = shm.register("d", &name, 0, 0);
        std::fs::remove_dir(&dir).unwrap();
        assert!(refused.is_err());
        // A FIFO would block a plain open until a writer came; it is refused at once.
        let (name, fifo) = shm_name("fifo");
        let _ = std::fs::remove_file(&fifo);
        let status = std::process::Command::new("mkfifo").arg(&fifo).status();
        if status.is_ok_and(|s| s.success()) {
            let refused = shm.register("f", &name, 0, 0);
            std::fs::remove_file(&fifo).unwrap();
            assert!(refused.is_err());
        }
    }

    #[test]
    fn keys_are_one_name_under_dev_shm() {
        let shm = SharedMemory::enabled();
        for key in ["", "/", "//x", "../etc/passwd", "/a/b", ".", "..", "a\0b"] {
            assert!(shm.register("r", key, 0, 0).is_err(), "{key:?}");
        }
    }

    #[test]
    fn client_shared_memory_off_names_the_flag() {
        let obj = TestObject::new(64);
        let shm = SharedMemory::for_clients(false);
        let err = shm.register("a", &obj.key, 0, 64).unwrap_err();
        assert_eq!(err, ServiceError::unsupported(CLIENT_SHM_OFF));
        assert!(err.to_string().contains("--allow-client-shm=true"));
        assert_eq!(shm.unregister(None).unwrap_err(), err);
        assert!(shm.status(None).unwrap().is_empty());
        assert!(
            SharedMemory::for_clients(true)
                .register("a", &obj.key, 0, 64)
                .is_ok()
        );
    }

    #[test]
    fn register_status_unregister() {
        let obj = TestObject::new(64);
        let shm = SharedMemory::enabled();
        shm.register("a", &obj.key, 0, 64).unwrap();
        shm.register("b", &obj.key, 16, 32).unwrap();
        let all = shm.status(None).unwrap();
        assert_eq!(
            all.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert_eq!(
            shm.status(Some("b")).unwrap(),
            vec![RegionStatus {
                name: "b".into(),
                key: obj.key.clone(),
                offset: 16,
                byte_size: 32
            }]
        );
        shm.unregister(Some("a")).unwrap();
        shm.unregister(Some("never")).unwrap();
        assert_eq!(shm.status(None).unwrap().len(), 1);
        shm.unregister(None).unwrap();
        assert!(shm.status(None).unwrap().is_empty());
        assert_eq!(
            shm.status(Some("b")).unwrap_err(),
            ServiceError::not_found("Unable to find system shared memory region: 'b'")
        );
    }

    #[test]
    fn registration_errors_use_tritons_words() {
        let obj = TestObject::new(64);
        let shm = SharedMemory::enabled();
        shm.register("a", &obj.key, 0, 8).unwrap();
        assert_eq!(
            shm.register("a", &obj.key, 0, 8).unwrap_err(),
            ServiceError::AlreadyExists("shared memory region 'a' already in manager".into())
        );
        assert_eq!(
            shm.register("b", &obj.key, 60, 8).unwrap_err(),
            ServiceError::invalid("failed to register shared memory region 'b': invalid args")
        );
        assert!(shm.register("c", &obj.key, u64::MAX, 2).is_err());
        for key in ["/nereid_no_such_object", "/a/b", "/..", "", "/"] {
            assert_eq!(
                shm.register("d", key, 0, 1).unwrap_err(),
                ServiceError::invalid(format!("Unable to open shared memory region: '{key}'"))
            );
        }
        // A key without the leading '/' names the same object, as with shm_open.
        shm.register("e", obj.key.trim_start_matches('/'), 0, 8)
            .unwrap();
    }

    #[test]
    fn reads_and_writes_stay_inside_the_region() {
        let obj = TestObject::new(32);
        obj.fill(8, &[1, 2, 3, 4, 5, 6, 7, 8]);
        let shm = SharedMemory::enabled();
        shm.register("r", &obj.key, 8, 16).unwrap();
        let r = shm.region("r").unwrap();
        assert_eq!(r.read(2, 4).unwrap(), vec![3, 4, 5, 6]);
        r.write(12, &[9, 9, 9, 9]).unwrap();
        assert_eq!(&obj.contents()[20..24], &[9, 9, 9, 9]);
        assert_eq!(
            r.read(16, 1).unwrap_err(),
            ServiceError::invalid("Invalid offset for shared memory region: 'r'")
        );
        assert_eq!(
            r.read(8, 9).unwrap_err(),
            ServiceError::invalid("Invalid offset + byte size for shared memory region: 'r'")
        );
        assert!(r.read(1, u64::MAX).is_err());
        assert!(r.write(13, &[0; 4]).is_err());
        assert_eq!(r.read(0, 0).unwrap(), Vec::<u8>::new());
        assert_eq!(
            shm.region("nope").unwrap_err(),
            ServiceError::not_found("Unable to find shared memory region: 'nope'")
        );
    }

    #[test]
    fn a_shrunk_object_is_an_error_not_a_crash() {
        let obj = TestObject::new(32);
        let shm = SharedMemory::enabled();
        shm.register("r", &obj.key, 0, 32).unwrap();
        let r = shm.region("r").unwrap();
        OpenOptions::new()
            .write(true)
            .open(&obj.path)
            .unwrap()
            .set_len(8)
            .unwrap();
        let err = r.read(0, 16).unwrap_err();
        assert!(
            err.message().contains("is now 8 bytes") && err.message().contains("'r'"),
            "{err:?}"
        );
        assert!(r.write(4, &[0; 8]).is_err());
        assert_eq!(r.read(0, 8).unwrap(), vec![0; 8]);
        // Removed: the open file still holds the memory; the region keeps working.
        drop(obj);
        assert_eq!(r.read(0, 8).unwrap(), vec![0; 8]);
    }

    #[test]
    fn an_unregistered_region_stays_usable_by_its_holders() {
        let obj = TestObject::new(8);
        obj.fill(0, &[5; 8]);
        let shm = SharedMemory::enabled();
        shm.register("r", &obj.key, 0, 8).unwrap();
        let held = shm.region("r").unwrap();
        shm.unregister(None).unwrap();
        assert_eq!(held.read(0, 8).unwrap(), vec![5; 8]);
        assert!(shm.region("r").is_err());
    }

    #[test]
    fn a_disabled_registry_says_why() {
        let shm = SharedMemory::disabled("the router cannot read a client's memory");
        let err = shm.register("r", "/k", 0, 1).unwrap_err();
        assert_eq!(
            err,
            ServiceError::unsupported(
                "system shared memory is not available: the router cannot read a client's memory"
            )
        );
        assert!(shm.status(None).unwrap().is_empty());
        assert!(shm.status(Some("r")).is_err());
        assert!(shm.unregister(None).is_err());
        assert!(shm.region("r").is_err());
        assert_eq!(shm.clone(), shm);
        assert_ne!(shm, SharedMemory::enabled());
    }
}
