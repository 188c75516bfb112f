//! Nereid's PyTorch backend library, `libnereid_torch_backend.so`: the only part of Nereid that
//! links libtorch (through `tch`). The server `dlopen`s it on the first PyTorch model load
//! (data-plane/src/backend/pytorch/library.rs), so an idle server, or one serving only ONNX or
//! Python models, never maps libtorch.
//!
//! ```text
//!  server (data-plane backend/pytorch: config, settings, signature, binding, reshapes)
//!    │ C ABI of nereid-torch-abi (versioned; #[repr(C)] types; no unwinding across it)
//!    ▼
//!  ffi.rs      exported extern "C" functions: raw pointers → borrowed slices, panics → errors
//!  module.rs   load a TorchScript file; run forward; pick the requested outputs
//!  convert.rs  input bytes → tch::Tensor; results → the server's output buffers
//!  cuda.rs     libtorch's CUDA half, opened on first use
//! ```
//! Inputs are read in place from the server's buffers and outputs are copied once, straight
//! into buffers the server allocates, so a request costs no more copies than when libtorch was
//! linked into the server.

mod convert;
mod cuda;
mod ffi;
mod module;

use nereid_torch_abi::Status;

/// A failed call: its class (how the server reports it) and the message.
#[derive(Debug)]
pub(crate) struct Fail {
    pub status: Status,
    pub message: String,
}

impl Fail {
    pub fn new(status: Status, message: String) -> Fail {
        Fail { status, message }
    }

    pub fn invalid(message: String) -> Fail {
        Fail::new(Status::InvalidInput, message)
    }
}
