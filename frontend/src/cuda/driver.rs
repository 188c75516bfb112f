//! The CUDA driver API, loaded at run time from `libcuda.so.1`: just the calls CUDA shared
//! memory needs (open a client's IPC handle on its device, copy to and from it, close it).
//!
//! Why `unsafe` is allowed here and nowhere else: the driver is a C library opened with
//! `dlopen`; resolving its symbols and calling them is FFI, which Rust cannot check. Every call
//! is made with arguments this module owns (a pointer and length from a live slice, a device
//! pointer the driver returned and a byte range [`DeviceRegion`] checked against the registered
//! size), and every result code is checked. Nothing outside this file sees a raw pointer.
//!
//! Why not the `cudarc` crate: its dynamic loader resolves every symbol of the CUDA version it
//! was built for with `expect`, and `culib()` panics when no driver is found, so an older driver
//! (or none) would panic the server inside a request; here a missing driver or symbol is an
//! error the registry answers with.
//!
//! ```text
//! Driver::get() ─ dlopen libcuda.so.1, cuInit(0) (once per process; Err kept: no GPU/driver)
//! Driver::open_ipc(handle, device) ─ cuDevicePrimaryCtxRetain ─ cuIpcOpenMemHandle ─► DeviceRegion
//! DeviceRegion::read/write ─ cuCtxSetCurrent(primary) ─ cuMemcpyDtoH / cuMemcpyHtoD (synchronous)
//! drop ─ cuIpcCloseMemHandle ─ cuDevicePrimaryCtxRelease
//! ```
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use libloading::{Library, Symbol};

use super::CudaError;

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
type CuDevicePtr = u64;

/// `CUipcMemHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
struct IpcHandle {
    reserved: [u8; 64],
}

/// The size of a CUDA IPC memory handle (`cudaIpcMemHandle_t`).
pub const IPC_HANDLE_BYTES: usize = 64;

/// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, as Triton opens client handles.
const LAZY_ENABLE_PEER_ACCESS: c_uint = 1;

/// The resolved entry points; the library stays loaded for the life of the process.
struct Api {
    _library: Library,
    get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    primary_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    primary_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    ipc_open: unsafe extern "C" fn(*mut CuDevicePtr, IpcHandle, c_uint) -> CuResult,
    ipc_close: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    copy_dtoh: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize) -> CuResult,
    copy_htod: unsafe extern "C" fn(CuDevicePtr, *const c_void, usize) -> CuResult,
}

/// The process's CUDA driver, once it loaded and initialized.
pub struct Driver {
    api: Api,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Driver(libcuda)")
    }
}

/// Copies one symbol's address out of the library (the library outlives it: both live in
/// [`Api`], which is never dropped).
fn symbol<T: Copy>(library: &Library, name: &str) -> Result<T, CudaError> {
    let mut with_nul = name.as_bytes().to_vec();
    with_nul.push(0);
    // SAFETY: `T` is the C signature of `name` as documented in cuda.h.
    let found: Result<Symbol<'_, T>, _> = unsafe { library.get(&with_nul) };
    found
        .map(|s| *s)
        .map_err(|e| CudaError::NoDriver(format!("libcuda has no {name}: {e}")))
}

fn load() -> Result<Driver, CudaError> {
    let mut reasons = Vec::new();
    let mut library = None;
    for name in ["libcuda.so.1", "libcuda.so"] {
        // SAFETY: loading the NVIDIA driver library runs its initializers, which is how every
        // CUDA program starts.
        match unsafe { Library::new(name) } {
            Ok(l) => {
                library = Some(l);
                break;
            }
            Err(e) => reasons.push(format!("{name}: {e}")),
        }
    }
    let Some(library) = library else {
        return Err(CudaError::NoDriver(format!(
            "the CUDA driver library could not be loaded ({})",
            reasons.join("; ")
        )));
    };
    let init: unsafe extern "C" fn(c_uint) -> CuResult = symbol(&library, "cuInit")?;
    let api = Api {
        get_error_string: symbol(&library, "cuGetErrorString")?,
        device_get: symbol(&library, "cuDeviceGet")?,
        primary_retain: symbol(&library, "cuDevicePrimaryCtxRetain")?,
        primary_release: symbol(&library, "cuDevicePrimaryCtxRelease_v2")?,
        set_current: symbol(&library, "cuCtxSetCurrent")?,
        ipc_open: symbol(&library, "cuIpcOpenMemHandle_v2")?,
        ipc_close: symbol(&library, "cuIpcCloseMemHandle")?,
        copy_dtoh: symbol(&library, "cuMemcpyDtoH_v2")?,
        copy_htod: symbol(&library, "cuMemcpyHtoD_v2")?,
        _library: library,
    };
    let driver = Driver { api };
    // SAFETY: cuInit takes flags (must be 0).
    driver.check("cuInit", unsafe { init(0) })?;
    Ok(driver)
}

impl Driver {
    /// The driver, loaded and initialized on first use; the error (no library, no device) is
    /// kept and returned to every later caller.
    pub fn get() -> Result<&'static Driver, CudaError> {
        static DRIVER: OnceLock<Result<Driver, CudaError>> = OnceLock::new();
        DRIVER.get_or_init(load).as_ref().map_err(Clone::clone)
    }

    fn check(&self, call: &'static str, code: CuResult) -> Result<(), CudaError> {
        if code == 0 {
            return Ok(());
        }
        let mut text: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString writes a pointer to a static string, or leaves it null.
        let described = unsafe { (self.api.get_error_string)(code, &mut text) };
        let message = if described == 0 && !text.is_null() {
            // SAFETY: a NUL-terminated static string owned by the driver.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        } else {
            format!("error {code}")
        };
        Err(CudaError::Call {
            call,
            code,
            message,
        })
    }

    /// Opens a client's IPC handle on device `device_id` (its primary context, retained until
    /// the region drops).
    pub fn open_ipc(
        &'static self,
        handle: &[u8; IPC_HANDLE_BYTES],
        device_id: i32,
        byte_size: u64,
    ) -> Result<DeviceRegion, CudaError> {
        let mut device: CuDevice = 0;
        // SAFETY: out-pointer to a local.
        self.check("cuDeviceGet", unsafe {
            (self.api.device_get)(&mut device, device_id)
        })?;
        let mut context: CuContext = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; `device` came from cuDeviceGet.
        self.check("cuDevicePrimaryCtxRetain", unsafe {
            (self.api.primary_retain)(&mut context, device)
        })?;
        let opened = self.open_in(context, handle);
        match opened {
            Ok(ptr) => Ok(DeviceRegion {
                driver: self,
                device,
                context,
                ptr,
                byte_size,
            }),
            Err(e) => {
                // SAFETY: releases the retain above.
                unsafe { (self.api.primary_release)(device) };
                Err(e)
            }
        }
    }

    fn open_in(
        &self,
        context: CuContext,
        handle: &[u8; IPC_HANDLE_BYTES],
    ) -> Result<CuDevicePtr, CudaError> {
        // SAFETY: `context` is a retained primary context.
        self.check("cuCtxSetCurrent", unsafe {
            (self.api.set_current)(context)
        })?;
        let mut ptr: CuDevicePtr = 0;
        let handle = IpcHandle { reserved: *handle };
        // SAFETY: out-pointer to a local; the handle is passed by value.
        self.check("cuIpcOpenMemHandle", unsafe {
            (self.api.ipc_open)(&mut ptr, handle, LAZY_ENABLE_PEER_ACCESS)
        })?;
        Ok(ptr)
    }
}

/// A client's device allocation opened through its IPC handle: `byte_size` bytes at `ptr` on
/// `device`. Closed (and its context released) on drop.
pub struct DeviceRegion {
    driver: &'static Driver,
    device: CuDevice,
    context: CuContext,
    ptr: CuDevicePtr,
    byte_size: u64,
}

// SAFETY: a CUDA context and device pointer may be used from any thread once made current
// there, which every method does first; the driver serializes its own state.
unsafe impl Send for DeviceRegion {}
// SAFETY: as above; methods take &self and make no Rust-visible mutation.
unsafe impl Sync for DeviceRegion {}

impl std::fmt::Debug for DeviceRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceRegion(device {}, {} bytes)",
            self.device, self.byte_size
        )
    }
}

impl DeviceRegion {
    /// The device address of `[offset, offset + len)`, if it lies inside the region.
    fn at(&self, offset: u64, len: usize) -> Result<CuDevicePtr, CudaError> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.byte_size => Ok(self.ptr + offset),
            _ => Err(CudaError::OutOfRange {
                offset,
                end: offset.saturating_add(len as u64),
                byte_size: self.byte_size,
            }),
        }
    }

    /// Copies `out.len()` bytes at `offset` off the device (synchronous).
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), CudaError> {
        let src = self.at(offset, out.len())?;
        let api = &self.driver.api;
        // SAFETY: the context is retained by this region.
        self.driver.check("cuCtxSetCurrent", unsafe {
            (api.set_current)(self.context)
        })?;
        // SAFETY: `out` is a live, writable slice of exactly the length copied; `src..+len` is
        // inside the opened allocation (checked by `at`).
        self.driver.check("cuMemcpyDtoH", unsafe {
            (api.copy_dtoh)(out.as_mut_ptr().cast(), src, out.len())
        })
    }

    /// Copies `data` to `offset` on the device (synchronous).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), CudaError> {
        let dst = self.at(offset, data.len())?;
        let api = &self.driver.api;
        // SAFETY: the context is retained by this region.
        self.driver.check("cuCtxSetCurrent", unsafe {
            (api.set_current)(self.context)
        })?;
        // SAFETY: `data` is a live slice of exactly the length copied; `dst..+len` is inside
        // the opened allocation (checked by `at`).
        self.driver.check("cuMemcpyHtoD", unsafe {
            (api.copy_htod)(dst, data.as_ptr().cast(), data.len())
        })
    }
}

impl Drop for DeviceRegion {
    fn drop(&mut self) {
        let api = &self.driver.api;
        // SAFETY: closes the handle this region opened, in its context, then releases the
        // context it retained; failures can only be logged.
        let closed = unsafe {
            (api.set_current)(self.context);
            (api.ipc_close)(self.ptr)
        };
        if let Err(e) = self.driver.check("cuIpcCloseMemHandle", closed) {
            tracing::warn!(error = %e, "closing a CUDA shared memory region");
        }
        // SAFETY: as above.
        unsafe { (api.primary_release)(self.device) };
    }
}
