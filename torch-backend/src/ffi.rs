//! The exported `extern "C"` functions of the ABI (nereid-torch-abi): each turns the server's
//! raw pointers into borrowed slices, calls the safe code of `module.rs`, and turns a failure or
//! a panic into a status and a message the server frees with `nereid_torch_free_string`.
//!
//! ```text
//!  nereid_torch_load(spec)            ─► module::device ─► LoadedModule::load ─► Box ─► handle
//!  nereid_torch_execute(handle, ...)  ─► Input/OutputRequest views ─► LoadedModule::execute
//!                                         (outputs through HostSink: the server's alloc callback)
//!  nereid_torch_free_module / _string ─► dropped here, by the allocator that made them
//! ```
//!
//! Why `unsafe` is allowed here: this is the C boundary. Every pointer comes from the server,
//! which promises (nereid-torch-abi's docs) that it is valid for the call: texts and buffers of
//! the stated length, handles this library returned and has not freed.
#![allow(unsafe_code)]

use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use nereid_torch_abi::{
    ABI_VERSION, ElementType, NtExecOptions, NtInput, NtLoadSpec, NtModule, NtOutputRequest,
    NtOutputSink, NtStr, Status,
};

use crate::Fail;
use crate::convert::OutputSink;
use crate::module::{self, ExecOptions, Input, LoadedModule, OutputRequest};

/// A slice the server lent for this call; empty without touching the pointer when `len` is 0.
///
/// # Safety
/// `ptr` points to `len` initialised, aligned `T`s that outlive `'a`.
unsafe fn lent<'a, T>(ptr: *const T, len: usize) -> &'a [T] {
    if len == 0 || ptr.is_null() {
        return &[];
    }
    // SAFETY: the caller's promise, above; null and empty were handled.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// Borrowed text of the server.
///
/// # Safety
/// As [`lent`].
unsafe fn text<'a>(s: NtStr) -> Result<&'a str, Fail> {
    // SAFETY: an NtStr is `len` bytes at `ptr` for the call (the ABI's contract).
    let bytes = unsafe { lent(s.ptr, s.len) };
    std::str::from_utf8(bytes).map_err(|_| Fail::invalid("a name is not UTF-8".into()))
}

/// Runs `f`, turning a panic into a failure: nothing unwinds into the server.
fn guard<T>(f: impl FnOnce() -> Result<T, Fail>) -> Result<T, Fail> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|panic| {
        let why = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("unknown panic");
        Err(Fail::new(
            Status::Execution,
            format!("the PyTorch backend library failed: {why}"),
        ))
    })
}

/// Hands `fail`'s message to the server through `error` (when given); returns its status.
///
/// # Safety
/// `error` is null or points to a writable `*mut c_char`.
unsafe fn report(error: *mut *mut c_char, fail: Fail) -> i32 {
    if !error.is_null() {
        let message = CString::new(fail.message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: the caller's promise, above.
        unsafe { *error = message.into_raw() };
    }
    fail.status as i32
}

#[unsafe(no_mangle)]
pub extern "C" fn nereid_torch_abi_version() -> u32 {
    ABI_VERSION
}

/// Loads a TorchScript module; `*out` receives the handle.
///
/// # Safety
/// `spec` and `out` are valid; `error` as in [`report`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nereid_torch_load(
    spec: *const NtLoadSpec,
    out: *mut *mut NtModule,
    error: *mut *mut c_char,
) -> i32 {
    let loaded = guard(|| {
        // SAFETY: the caller's promise: `spec` points to a valid NtLoadSpec.
        let spec = unsafe { spec.as_ref() }
            .ok_or_else(|| Fail::new(Status::Load, "no load spec".into()))?;
        // SAFETY: the spec's path is lent for the call.
        let path = unsafe { text(spec.path) }?;
        let device = module::device(spec.device).map_err(|e| Fail::new(Status::Load, e))?;
        LoadedModule::load(Path::new(path), device).map_err(|e| Fail::new(Status::Load, e))
    });
    match loaded {
        Ok(module) if !out.is_null() => {
            // SAFETY: `out` is valid and writable (the caller's promise, checked non-null).
            unsafe { *out = Box::into_raw(Box::new(module)).cast::<NtModule>() };
            Status::Ok as i32
        }
        Ok(_) => Status::Load as i32,
        // SAFETY: `error` as promised.
        Err(fail) => unsafe { report(error, fail) },
    }
}

/// The server's output buffers, through its `alloc` callback.
struct HostSink<'a>(&'a NtOutputSink);

impl OutputSink for HostSink<'_> {
    fn buffer(
        &mut self,
        slot: usize,
        dtype: ElementType,
        shape: &[i64],
        len: usize,
    ) -> Option<&mut [u8]> {
        let sink = self.0;
        let ptr = (sink.alloc)(
            sink.ctx,
            slot,
            dtype.code(),
            shape.as_ptr(),
            shape.len(),
            len,
        );
        if ptr.is_null() {
            return None;
        }
        if len == 0 {
            return Some(&mut []);
        }
        // SAFETY: the server returned a writable buffer of exactly `len` bytes that it does not
        // touch until this call returns (AllocFn's contract); this borrow ends before the next
        // request for a buffer.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }
}

/// Runs one execution; the requested outputs go to `sink`, in order.
///
/// # Safety
/// `module` is a live handle of [`nereid_torch_load`]; `inputs`/`outputs` point to
/// `n_inputs`/`n_outputs` valid entries whose texts and buffers are lent for the call;
/// `options` and `sink` are valid; `error` as in [`report`].
#[unsafe(no_mangle)]
#[allow(
    clippy::too_many_arguments,
    reason = "the C ABI's shape (nereid-torch-abi ExecuteFn)"
)]
pub unsafe extern "C" fn nereid_torch_execute(
    module: *const NtModule,
    inputs: *const NtInput,
    n_inputs: usize,
    outputs: *const NtOutputRequest,
    n_outputs: usize,
    options: *const NtExecOptions,
    sink: *const NtOutputSink,
    error: *mut *mut c_char,
) -> i32 {
    let result = guard(|| {
        let missing = || Fail::new(Status::Execution, "null argument".into());
        // SAFETY: a live handle of nereid_torch_load is a boxed LoadedModule.
        let module = unsafe { module.cast::<LoadedModule>().as_ref() }.ok_or_else(missing)?;
        // SAFETY: options and sink are valid for the call (the caller's promise).
        let (options, sink) = unsafe { (options.as_ref(), sink.as_ref()) };
        let (options, sink) = (options.ok_or_else(missing)?, sink.ok_or_else(missing)?);
        // SAFETY: `n_inputs` valid entries, lent for the call.
        let raw_inputs = unsafe { lent(inputs, n_inputs) };
        let mut views = Vec::with_capacity(raw_inputs.len());
        for input in raw_inputs {
            // SAFETY: each entry's name, shape and data are lent for the call.
            let (name, shape, data) = unsafe {
                (
                    text(input.name)?,
                    lent(input.shape, input.ndim),
                    lent(input.data, input.len),
                )
            };
            let dtype = ElementType::from_code(input.dtype).ok_or_else(|| {
                Fail::new(
                    Status::Unsupported,
                    format!("input '{name}': unknown element type code {}", input.dtype),
                )
            })?;
            views.push(Input {
                name,
                dtype,
                shape,
                data,
            });
        }
        // SAFETY: `n_outputs` valid entries, lent for the call.
        let raw_outputs = unsafe { lent(outputs, n_outputs) };
        let mut requests = Vec::with_capacity(raw_outputs.len());
        for output in raw_outputs {
            requests.push(OutputRequest {
                // SAFETY: the name is lent for the call.
                name: unsafe { text(output.name) }?,
                index: output.index,
            });
        }
        let toggle = |v: i8| (v >= 0).then_some(v > 0);
        let options = ExecOptions {
            // SAFETY: the model name is lent for the call.
            model: unsafe { text(options.model) }?,
            optimized_execution: options.optimized_execution != 0,
            jit_profiling: toggle(options.jit_profiling),
            tensor_fuser: toggle(options.tensor_fuser),
            dict_inputs: options.dict_inputs != 0,
        };
        module.execute(&views, &requests, &options, &mut HostSink(sink))
    });
    match result {
        Ok(()) => Status::Ok as i32,
        // SAFETY: `error` as promised.
        Err(fail) => unsafe { report(error, fail) },
    }
}

/// Frees a handle of [`nereid_torch_load`] (null is ignored).
///
/// # Safety
/// `module` is null or a live handle, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nereid_torch_free_module(module: *mut NtModule) {
    if module.is_null() {
        return;
    }
    // SAFETY: a live handle is a Box<LoadedModule> this library leaked; the caller gives it up.
    let module = unsafe { Box::from_raw(module.cast::<LoadedModule>()) };
    let _ = catch_unwind(AssertUnwindSafe(move || drop(module)));
}

/// Frees an error message this library handed out (null is ignored).
///
/// # Safety
/// `message` is null or a message of this library, not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nereid_torch_free_string(message: *mut c_char) {
    if !message.is_null() {
        // SAFETY: it came from CString::into_raw in `report`.
        drop(unsafe { CString::from_raw(message) });
    }
}

/// How many CUDA devices libtorch can use, or -1 with the reason in `error`.
///
/// # Safety
/// `error` as in [`report`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nereid_torch_cuda_device_count(error: *mut *mut c_char) -> i64 {
    match guard(|| crate::cuda::cuda_devices().map_err(|e| Fail::new(Status::Load, e))) {
        Ok(n) => n,
        Err(fail) => {
            // SAFETY: `error` as promised.
            unsafe { report(error, fail) };
            -1
        }
    }
}

/// libtorch's intra-op thread count (process-wide).
#[unsafe(no_mangle)]
pub extern "C" fn nereid_torch_set_num_threads(n: i32) {
    let _ = guard(|| {
        tch::set_num_threads(n);
        Ok(())
    });
}

#[unsafe(no_mangle)]
pub extern "C" fn nereid_torch_get_num_threads() -> i32 {
    guard(|| Ok(tch::get_num_threads())).unwrap_or(-1)
}

/// libtorch's inter-op pool size: 0 set, 1 refused (the pool has already started; tch reports
/// that by panicking, caught here).
#[unsafe(no_mangle)]
pub extern "C" fn nereid_torch_set_num_interop_threads(n: i32) -> i32 {
    match catch_unwind(|| tch::set_num_interop_threads(n)) {
        Ok(()) => 0,
        Err(_) => 1,
    }
}
