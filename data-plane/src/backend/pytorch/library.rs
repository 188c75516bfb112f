//! The PyTorch backend library, `libnereid_torch_backend.so` (crate `nereid-torch-backend`, the
//! only part of Nereid that links libtorch), opened on the first PyTorch model load and kept
//! for the life of the process, with safe wrappers over its C ABI (nereid-torch-abi).
//!
//! ```text
//!  library() ─► already open? ─► &'static TorchLibrary
//!            └► library_path::locate ─► dlopen (maps libtorch) ─► ABI version check ─► symbols
//!               ─► log "loaded libtorch" ─► kept (never unloaded)
//!  TorchLibrary::load_module ─► TorchModule (freed by the library on drop)
//!  TorchModule::execute(inputs borrowed in place) ─► alloc callback: one Vec per output,
//!                                                    filled by the library ─► Produced
//! ```
//! A failure to find or open the library is an error for the model being loaded, never a panic,
//! and is not remembered: a later load looks again (after `make build`, say).
//!
//! Why `unsafe` is allowed here: opening a library runs its initialisers and calling through
//! `dlsym`'d pointers trusts their types, which Rust cannot check. The library is Nereid's own,
//! of the same ABI version (checked before any other call), and it is never unloaded, so the
//! function pointers stay valid; every pointer handed to it lives across the call.
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_void};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use nereid_torch_abi::{
    ABI_VERSION, AbiVersionFn, CudaDeviceCountFn, ElementType, ExecuteFn, FreeModuleFn,
    FreeStringFn, GetNumThreadsFn, LIBRARY_NAME, LoadFn, NtExecOptions, NtInput, NtLoadSpec,
    NtModule, NtOutputRequest, NtOutputSink, NtStr, SetNumInteropThreadsFn, SetNumThreadsFn,
    Status, symbol,
};
use parking_lot::Mutex;

use crate::backend::library_path;

/// The open library: its entry points, valid while `_library` stays loaded (forever).
pub(crate) struct TorchLibrary {
    load: LoadFn,
    execute: ExecuteFn,
    free_module: FreeModuleFn,
    free_string: FreeStringFn,
    cuda_device_count: CudaDeviceCountFn,
    set_num_threads: SetNumThreadsFn,
    get_num_threads: GetNumThreadsFn,
    set_num_interop_threads: SetNumInteropThreadsFn,
    _library: libloading::Library,
}

static LOADED: Mutex<Option<&'static TorchLibrary>> = Mutex::new(None);

/// The process's PyTorch backend library, opened on first use. `Err` says what to install or
/// build.
pub(crate) fn library() -> Result<&'static TorchLibrary, String> {
    let mut loaded = LOADED.lock();
    if let Some(library) = *loaded {
        return Ok(library);
    }
    let path = library_path::locate(LIBRARY_NAME).map_err(|places| missing_message(&places))?;
    let library: &'static TorchLibrary = Box::leak(Box::new(open(&path)?));
    tracing::info!(library = %path.display(), "loaded libtorch (the PyTorch backend library)");
    *loaded = Some(library);
    Ok(library)
}

fn missing_message(places: &[PathBuf]) -> String {
    format!(
        "the PyTorch backend library {LIBRARY_NAME} was not found (looked at {}); build it with `make build` (cargo build --release -p nereid-torch-backend) and keep it next to the nereid binary",
        library_path::list(places)
    )
}

/// A function of the library, by name.
///
/// # Safety
/// `T` is the function pointer type the ABI gives that symbol.
unsafe fn entry<T: Copy>(library: &libloading::Library, name: &[u8]) -> Result<T, String> {
    // SAFETY: the caller's promise about `T`; the pointer is copied out and stays valid because
    // the library is never unloaded.
    unsafe { library.get::<T>(name) }
        .map(|symbol| *symbol)
        .map_err(|e| {
            format!(
                "the PyTorch backend library lacks {}: {e}",
                String::from_utf8_lossy(name.strip_suffix(b"\0").unwrap_or(name))
            )
        })
}

fn open(path: &Path) -> Result<TorchLibrary, String> {
    // SAFETY: Nereid's own backend library; loading it runs its and libtorch's initialisers,
    // which is what it is for. It is never unloaded (see `library`).
    let library = unsafe { libloading::Library::new(path) }.map_err(|e| {
        format!(
            "cannot load the PyTorch backend library '{}' (libtorch missing? `make setup` installs it): {e}",
            path.display()
        )
    })?;
    // SAFETY: the ABI's type of this symbol, in every version.
    let version: AbiVersionFn = unsafe { entry(&library, symbol::ABI_VERSION) }?;
    // SAFETY: takes nothing, returns a number.
    let found = unsafe { version() };
    if found != ABI_VERSION {
        return Err(format!(
            "the PyTorch backend library '{}' speaks ABI version {found}, this nereid speaks {ABI_VERSION}; install the library of the same build as the binary",
            path.display()
        ));
    }
    // SAFETY: for each symbol, the ABI of this version gives it exactly this type.
    unsafe {
        Ok(TorchLibrary {
            load: entry(&library, symbol::LOAD)?,
            execute: entry(&library, symbol::EXECUTE)?,
            free_module: entry(&library, symbol::FREE_MODULE)?,
            free_string: entry(&library, symbol::FREE_STRING)?,
            cuda_device_count: entry(&library, symbol::CUDA_DEVICE_COUNT)?,
            set_num_threads: entry(&library, symbol::SET_NUM_THREADS)?,
            get_num_threads: entry(&library, symbol::GET_NUM_THREADS)?,
            set_num_interop_threads: entry(&library, symbol::SET_NUM_INTEROP_THREADS)?,
            _library: library,
        })
    }
}

impl TorchLibrary {
    /// The message of a failed call, freed by the library.
    fn take_error(&self, message: *mut c_char) -> String {
        if message.is_null() {
            return "the PyTorch backend library gave no reason".into();
        }
        // SAFETY: a NUL-terminated message the library handed out and nobody freed yet.
        let text = unsafe { CStr::from_ptr(message) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: returned to the library that allocated it, once.
        unsafe { (self.free_string)(message) };
        text
    }

    /// Loads a TorchScript file on the CPU (`None`) or a CUDA device.
    pub fn load_module(
        &'static self,
        file: &Path,
        gpu: Option<usize>,
    ) -> Result<TorchModule, String> {
        let path = file
            .to_str()
            .ok_or_else(|| format!("model file '{}' is not a UTF-8 path", file.display()))?;
        let spec = NtLoadSpec {
            path: NtStr::new(path),
            device: gpu.map_or(-1, |id| i32::try_from(id).unwrap_or(i32::MAX)),
        };
        let mut handle: *mut NtModule = std::ptr::null_mut();
        let mut error: *mut c_char = std::ptr::null_mut();
        // SAFETY: `spec` (and the path it borrows), `handle` and `error` outlive the call.
        let status = unsafe { (self.load)(&spec, &mut handle, &mut error) };
        match NonNull::new(handle) {
            Some(handle) if status == Status::Ok as i32 => Ok(TorchModule {
                library: self,
                handle,
            }),
            _ => Err(self.take_error(error)),
        }
    }

    /// How many CUDA devices libtorch can use; `Err` says why none.
    pub fn cuda_device_count(&self) -> Result<i64, String> {
        let mut error: *mut c_char = std::ptr::null_mut();
        // SAFETY: `error` outlives the call.
        match unsafe { (self.cuda_device_count)(&mut error) } {
            n if n >= 0 => Ok(n),
            _ => Err(self.take_error(error)),
        }
    }

    /// libtorch's intra-op threads (process-wide).
    pub fn set_num_threads(&self, n: i32) {
        // SAFETY: takes a number.
        unsafe { (self.set_num_threads)(n) }
    }

    pub fn num_threads(&self) -> i32 {
        // SAFETY: takes nothing.
        unsafe { (self.get_num_threads)() }
    }

    /// libtorch's inter-op pool size; `false` when its pool has already started.
    pub fn set_num_interop_threads(&self, n: i32) -> bool {
        // SAFETY: takes a number.
        unsafe { (self.set_num_interop_threads)(n) == 0 }
    }
}

/// A module loaded by the library; freed by it when dropped.
pub(crate) struct TorchModule {
    library: &'static TorchLibrary,
    handle: NonNull<NtModule>,
}

// SAFETY: the handle is a libtorch module that, like the `Arc<CModule>` the backend shared
// between instance threads when libtorch was linked in, may run forward from several threads at
// once; the library keeps no per-handle state between calls, and only `Drop` frees it.
unsafe impl Send for TorchModule {}
// SAFETY: as for Send: execute takes the handle by shared reference, as libtorch allows.
unsafe impl Sync for TorchModule {}

impl Drop for TorchModule {
    fn drop(&mut self) {
        // SAFETY: a live handle of this library, given back once.
        unsafe { (self.library.free_module)(self.handle.as_ptr()) }
    }
}

/// One input, lent to the library for the call (read in place).
pub(crate) struct ExecInput<'a> {
    pub name: &'a str,
    pub element: ElementType,
    pub shape: &'a [i64],
    pub data: &'a [u8],
}

/// Per-execution settings.
pub(crate) struct ExecOptions<'a> {
    pub model: &'a str,
    pub optimized_execution: bool,
    pub jit_profiling: Option<bool>,
    pub tensor_fuser: Option<bool>,
    pub dict_inputs: bool,
}

/// One output the library wrote: its buffer is ours (no copy after the library's).
pub(crate) struct Produced {
    pub element: ElementType,
    pub shape: Vec<i64>,
    pub data: Vec<u8>,
}

/// The buffers of one execution, by requested slot.
struct Collector(Vec<Option<Produced>>);

/// `AllocFn`: a zeroed buffer of `len` bytes for `slot`, owned by the collector at `ctx`.
extern "C" fn alloc_output(
    ctx: *mut c_void,
    slot: usize,
    dtype: u32,
    shape: *const i64,
    ndim: usize,
    len: usize,
) -> *mut u8 {
    // SAFETY: `ctx` is the `Collector` that `execute` lent for this call, not otherwise used
    // while the library runs.
    let Some(collector) = (unsafe { ctx.cast::<Collector>().as_mut() }) else {
        return std::ptr::null_mut();
    };
    let (Some(place), Some(element)) = (collector.0.get_mut(slot), ElementType::from_code(dtype))
    else {
        return std::ptr::null_mut();
    };
    let shape = if ndim == 0 || shape.is_null() {
        Vec::new()
    } else {
        // SAFETY: the library passes `ndim` dimensions, valid for this callback.
        unsafe { std::slice::from_raw_parts(shape, ndim) }.to_vec()
    };
    let mut data = vec![0u8; len];
    // The Vec's heap buffer does not move when the Vec does.
    let ptr = data.as_mut_ptr();
    *place = Some(Produced {
        element,
        shape,
        data,
    });
    ptr
}

impl TorchModule {
    /// Runs forward on `inputs` (in binding order) and returns the requested outputs
    /// (`(name, index in what forward returns)`), in order. `Err` carries the library's class.
    pub fn execute(
        &self,
        inputs: &[ExecInput<'_>],
        outputs: &[(&str, usize)],
        options: &ExecOptions<'_>,
    ) -> Result<Vec<Produced>, (Status, String)> {
        let raw_inputs: Vec<NtInput> = inputs
            .iter()
            .map(|i| NtInput {
                name: NtStr::new(i.name),
                dtype: i.element.code(),
                shape: i.shape.as_ptr(),
                ndim: i.shape.len(),
                data: i.data.as_ptr(),
                len: i.data.len(),
            })
            .collect();
        let raw_outputs: Vec<NtOutputRequest> = outputs
            .iter()
            .map(|&(name, index)| NtOutputRequest {
                name: NtStr::new(name),
                index,
            })
            .collect();
        let toggle = |v: Option<bool>| v.map_or(-1, i8::from);
        let raw_options = NtExecOptions {
            model: NtStr::new(options.model),
            optimized_execution: u8::from(options.optimized_execution),
            jit_profiling: toggle(options.jit_profiling),
            tensor_fuser: toggle(options.tensor_fuser),
            dict_inputs: u8::from(options.dict_inputs),
        };
        let mut collector = Collector(outputs.iter().map(|_| None).collect());
        let sink = NtOutputSink {
            ctx: (&raw mut collector).cast::<c_void>(),
            alloc: alloc_output,
        };
        let mut error: *mut c_char = std::ptr::null_mut();
        // SAFETY: a live handle; every array, text and buffer lent here (and `collector`, reached
        // only through `sink` during the call) outlives the call.
        let status = unsafe {
            (self.library.execute)(
                self.handle.as_ptr(),
                raw_inputs.as_ptr(),
                raw_inputs.len(),
                raw_outputs.as_ptr(),
                raw_outputs.len(),
                &raw_options,
                &sink,
                &mut error,
            )
        };
        let status = Status::from_code(status);
        if status != Status::Ok {
            return Err((status, self.library.take_error(error)));
        }
        collector
            .0
            .into_iter()
            .zip(outputs)
            .map(|(produced, (name, _))| {
                produced.ok_or_else(|| {
                    (
                        Status::Execution,
                        format!("the PyTorch backend library returned no output '{name}'"),
                    )
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_says_where_it_was_looked_for_and_what_to_build() {
        let message = missing_message(&[PathBuf::from("/opt/nereid/libnereid_torch_backend.so")]);
        assert!(
            message.contains("/opt/nereid/libnereid_torch_backend.so"),
            "{message}"
        );
        assert!(
            message.contains("cargo build --release -p nereid-torch-backend"),
            "{message}"
        );
    }
}
