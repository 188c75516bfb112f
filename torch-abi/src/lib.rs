//! The C ABI between the `nereid` server and its PyTorch backend library,
//! `libnereid_torch_backend.so` (crate `nereid-torch-backend`), which the server `dlopen`s on
//! the first PyTorch model load so that a server without PyTorch models never maps libtorch.
//!
//! Both sides compile this crate, so the `#[repr(C)]` layouts, the symbol names and the
//! element-type codes cannot drift apart within one build; [`ABI_VERSION`] guards against a
//! library of another build (the server refuses a library whose
//! `nereid_torch_abi_version()` differs).
//!
//! ```text
//!  server                                   libnereid_torch_backend.so (links libtorch)
//!  abi_version() ─────────────────────────► ABI_VERSION
//!  load(NtLoadSpec) ──────────────────────► CModule on the device ─► *mut NtModule | error
//!  execute(module, [NtInput] borrowed,      inputs read in place (no copy on this side)
//!          [NtOutputRequest], NtExecOptions, forward ─► per requested output:
//!          NtOutputSink) ◄── alloc(slot, dtype, shape, len) ── the library copies the result
//!                                           straight into the server's buffer
//!  free_module / free_string ─────────────► freed by the library that allocated them
//! ```
//! Every call returns a [`Status`] code; a failure also hands back a NUL-terminated message
//! that the caller frees with `nereid_torch_free_string`. No call unwinds across the boundary.

#![warn(missing_docs)]

use std::ffi::{c_char, c_void};

/// Bumped whenever a type, a symbol or a meaning here changes.
pub const ABI_VERSION: u32 = 1;

/// The library's file name as cargo builds it.
pub const LIBRARY_NAME: &str = "libnereid_torch_backend.so";

/// Symbol names (NUL-terminated, as `dlsym` takes them).
pub mod symbol {
    /// [`AbiVersionFn`](crate::AbiVersionFn): the library's [`ABI_VERSION`](crate::ABI_VERSION).
    pub const ABI_VERSION: &[u8] = b"nereid_torch_abi_version\0";
    /// [`LoadFn`](crate::LoadFn): loads a TorchScript module onto a device.
    pub const LOAD: &[u8] = b"nereid_torch_load\0";
    /// [`ExecuteFn`](crate::ExecuteFn): runs a module's forward on borrowed inputs.
    pub const EXECUTE: &[u8] = b"nereid_torch_execute\0";
    /// [`FreeModuleFn`](crate::FreeModuleFn): frees a module [`LOAD`] returned.
    pub const FREE_MODULE: &[u8] = b"nereid_torch_free_module\0";
    /// [`FreeStringFn`](crate::FreeStringFn): frees an error message the library returned.
    pub const FREE_STRING: &[u8] = b"nereid_torch_free_string\0";
    /// [`CudaDeviceCountFn`](crate::CudaDeviceCountFn): the CUDA devices libtorch can use.
    pub const CUDA_DEVICE_COUNT: &[u8] = b"nereid_torch_cuda_device_count\0";
    /// [`SetNumThreadsFn`](crate::SetNumThreadsFn): sets libtorch's intra-op thread count.
    pub const SET_NUM_THREADS: &[u8] = b"nereid_torch_set_num_threads\0";
    /// [`GetNumThreadsFn`](crate::GetNumThreadsFn): reads libtorch's intra-op thread count.
    pub const GET_NUM_THREADS: &[u8] = b"nereid_torch_get_num_threads\0";
    /// [`SetNumInteropThreadsFn`](crate::SetNumInteropThreadsFn): sets libtorch's inter-op
    /// thread count, once.
    pub const SET_NUM_INTEROP_THREADS: &[u8] = b"nereid_torch_set_num_interop_threads\0";
}

/// What a call's `i32` result means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The call succeeded; no message.
    Ok = 0,
    /// The request's inputs are wrong (shape, size, text): the client's fault.
    InvalidInput = 1,
    /// The model failed while running, or returned something that is not an output.
    Execution = 2,
    /// A datatype libtorch has no tensor for.
    Unsupported = 3,
    /// The model could not be loaded.
    Load = 4,
}

impl Status {
    /// The status of a returned code; an unknown code reads as [`Status::Load`].
    pub fn from_code(code: i32) -> Status {
        match code {
            0 => Status::Ok,
            1 => Status::InvalidInput,
            2 => Status::Execution,
            3 => Status::Unsupported,
            _ => Status::Load,
        }
    }
}

/// Element types, by the codes that cross the boundary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElementType {
    /// Triton's `BOOL`: one byte per element, 0 or 1.
    Bool = 1,
    /// Triton's `UINT8`.
    Uint8 = 2,
    /// Triton's `INT8`.
    Int8 = 3,
    /// Triton's `INT16`, little-endian.
    Int16 = 4,
    /// Triton's `INT32`, little-endian.
    Int32 = 5,
    /// Triton's `INT64`, little-endian.
    Int64 = 6,
    /// Triton's `FP16`: IEEE half precision, little-endian.
    Fp16 = 7,
    /// Triton's `FP32`, little-endian.
    Fp32 = 8,
    /// Triton's `FP64`, little-endian.
    Fp64 = 9,
    /// Triton's `BF16`: bfloat16, little-endian.
    Bf16 = 10,
    /// Triton's `BYTES`: 4-byte little-endian length, then the bytes, per element; travels to
    /// and from TorchScript as a `List[str]`.
    Bytes = 11,
}

impl ElementType {
    /// Every element type, in code order.
    pub const ALL: [ElementType; 11] = [
        ElementType::Bool,
        ElementType::Uint8,
        ElementType::Int8,
        ElementType::Int16,
        ElementType::Int32,
        ElementType::Int64,
        ElementType::Fp16,
        ElementType::Fp32,
        ElementType::Fp64,
        ElementType::Bf16,
        ElementType::Bytes,
    ];

    /// The code that crosses the boundary.
    pub fn code(self) -> u32 {
        self as u32
    }

    /// The element type of `code`; `None` for a code this build does not know.
    pub fn from_code(code: u32) -> Option<ElementType> {
        ElementType::ALL.into_iter().find(|t| t.code() == code)
    }

    /// Triton's wire name (`FP32`), for messages.
    pub fn name(self) -> &'static str {
        match self {
            ElementType::Bool => "BOOL",
            ElementType::Uint8 => "UINT8",
            ElementType::Int8 => "INT8",
            ElementType::Int16 => "INT16",
            ElementType::Int32 => "INT32",
            ElementType::Int64 => "INT64",
            ElementType::Fp16 => "FP16",
            ElementType::Fp32 => "FP32",
            ElementType::Fp64 => "FP64",
            ElementType::Bf16 => "BF16",
            ElementType::Bytes => "BYTES",
        }
    }
}

/// Borrowed UTF-8 text: valid for the duration of the call it is passed to.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NtStr {
    /// Start of the UTF-8 bytes.
    pub ptr: *const u8,
    /// Length in bytes (no NUL terminator).
    pub len: usize,
}

impl NtStr {
    /// Borrows `text`; the caller keeps `text` alive for the call.
    pub fn new(text: &str) -> NtStr {
        NtStr {
            ptr: text.as_ptr(),
            len: text.len(),
        }
    }
}

/// A loaded module, opaque to the server.
#[repr(C)]
pub struct NtModule {
    _private: [u8; 0],
}

/// What to load.
#[repr(C)]
pub struct NtLoadSpec {
    /// The TorchScript file.
    pub path: NtStr,
    /// A CUDA device index, or `-1` for the CPU.
    pub device: i32,
}

/// One input, borrowed for the call: read in place, never kept.
#[repr(C)]
pub struct NtInput {
    /// The input's name, for messages (and the dict key with `dict_inputs`).
    pub name: NtStr,
    /// An [`ElementType`] code.
    pub dtype: u32,
    /// The dims, `ndim` of them.
    pub shape: *const i64,
    /// Number of dims.
    pub ndim: usize,
    /// The elements, in row-major order (see [`ElementType`] for their layout).
    pub data: *const u8,
    /// Length of `data` in bytes.
    pub len: usize,
}

/// One output to return: `index` is its position in the returned tuple/list, `name` is for
/// messages.
#[repr(C)]
pub struct NtOutputRequest {
    /// The output's name, for messages.
    pub name: NtStr,
    /// Its position in the module's returned tuple or list (0 for a lone tensor).
    pub index: usize,
}

/// Per-execution libtorch settings (Triton's PyTorch backend parameters).
#[repr(C)]
pub struct NtExecOptions {
    /// The model's name, for messages.
    pub model: NtStr,
    /// The graph executor's optimisation: 0 off, 1 on.
    pub optimized_execution: u8,
    /// JIT profiling mode: -1 leave alone, 0 off, 1 on.
    pub jit_profiling: i8,
    /// The TensorExpr fuser: -1 leave alone, 0 off, 1 on.
    pub tensor_fuser: i8,
    /// 1: pass the inputs as one `Dict[str, Tensor]` keyed by name; 0: positionally, in order.
    pub dict_inputs: u8,
}

/// Asks the server for the buffer of requested output `slot` (its position in the request's
/// output list): `len` bytes of elements of type `dtype` shaped `shape[..ndim]`. The server
/// returns a writable buffer of exactly `len` bytes that stays valid until the call returns, or
/// null if it cannot; the library fills it.
pub type AllocFn = extern "C" fn(
    ctx: *mut c_void,
    slot: usize,
    dtype: u32,
    shape: *const i64,
    ndim: usize,
    len: usize,
) -> *mut u8;

/// Where outputs go: `alloc(ctx, ...)` for each requested output, in request order.
#[repr(C)]
pub struct NtOutputSink {
    /// The server's context, passed back to `alloc` untouched.
    pub ctx: *mut c_void,
    /// Returns the buffer of one output (see [`AllocFn`]).
    pub alloc: AllocFn,
}

/// `() -> ABI_VERSION` of the library's build.
pub type AbiVersionFn = unsafe extern "C" fn() -> u32;
/// `(spec, module out, error out) -> status`.
pub type LoadFn =
    unsafe extern "C" fn(*const NtLoadSpec, *mut *mut NtModule, *mut *mut c_char) -> i32;
/// `(module, inputs, n, outputs, n, options, sink, error out) -> status`.
pub type ExecuteFn = unsafe extern "C" fn(
    *const NtModule,
    *const NtInput,
    usize,
    *const NtOutputRequest,
    usize,
    *const NtExecOptions,
    *const NtOutputSink,
    *mut *mut c_char,
) -> i32;
/// Frees a module that `load` returned; the server calls it once per module.
pub type FreeModuleFn = unsafe extern "C" fn(*mut NtModule);
/// Frees an error message the library handed back.
pub type FreeStringFn = unsafe extern "C" fn(*mut c_char);
/// `(error out) -> count`, `-1` with an error when libtorch cannot use CUDA.
pub type CudaDeviceCountFn = unsafe extern "C" fn(*mut *mut c_char) -> i64;
/// libtorch's intra-op thread count (process-wide).
pub type SetNumThreadsFn = unsafe extern "C" fn(i32);
/// libtorch's intra-op thread count.
pub type GetNumThreadsFn = unsafe extern "C" fn() -> i32;
/// libtorch's inter-op thread count: 0 set, 1 refused (its pool has already started).
pub type SetNumInteropThreadsFn = unsafe extern "C" fn(i32) -> i32;

/// The elements of a `BYTES` buffer; `None` for a truncated one.
pub fn bytes_elements(data: &[u8]) -> Option<Vec<&[u8]>> {
    let mut elements = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let (len, tail) = rest.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        if tail.len() < len {
            return None;
        }
        let (element, tail) = tail.split_at(len);
        elements.push(element);
        rest = tail;
    }
    Some(elements)
}

/// Appends one `BYTES` element (4-byte little-endian length, then the bytes) to `out` at
/// `at`; returns the position after it. `out` must have room (see [`bytes_len`]).
pub fn put_bytes_element(out: &mut [u8], at: usize, element: &[u8]) -> usize {
    let start = at + 4;
    out[at..start].copy_from_slice(&(element.len() as u32).to_le_bytes());
    out[start..start + element.len()].copy_from_slice(element);
    start + element.len()
}

/// The size of a `BYTES` buffer holding `elements`.
pub fn bytes_len<'a>(elements: impl IntoIterator<Item = &'a [u8]>) -> usize {
    elements.into_iter().map(|e| 4 + e.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_truncation_is_refused() {
        let items: [&[u8]; 3] = [b"a", "ünï".as_bytes(), b""];
        let mut buffer = vec![0u8; bytes_len(items)];
        let mut at = 0;
        for item in items {
            at = put_bytes_element(&mut buffer, at, item);
        }
        assert_eq!(at, buffer.len());
        assert_eq!(bytes_elements(&buffer).unwrap(), items);
        assert!(bytes_elements(&buffer[..buffer.len() - 3]).is_none());
        assert!(bytes_elements(&[1, 0]).is_none());
    }

    #[test]
    fn element_codes_round_trip() {
        for t in ElementType::ALL {
            assert_eq!(ElementType::from_code(t.code()), Some(t));
        }
        assert_eq!(ElementType::from_code(0), None);
        assert_eq!(Status::from_code(2), Status::Execution);
    }
}
