//! libtorch's CUDA half, loaded at run time so one backend library runs on a CPU-only libtorch
//! and uses the GPU with a CUDA build of libtorch (the one the `torch` wheel ships).
//!
//! libtorch registers CUDA with the core library when `libtorch_cuda.so` is loaded (its static
//! initialisers install the CUDA hooks). This library references no symbol of that one, so
//! the linker's `--as-needed` drops it and `torch::cuda::is_available()` would say false even
//! on a GPU machine. Here it is opened once, by name, on first use — found through this
//! library's RUNPATH (the libtorch it was built against) or `LD_LIBRARY_PATH` — and kept loaded for the
//! life of the process. A CPU-only libtorch has no such file: the error says so, and every
//! CPU path works as before.
//!
//! Why `unsafe` is allowed here: opening a shared library runs its initialisers, which Rust
//! cannot check. The library is libtorch's own, of the same directory this library links, and it
//! is never unloaded (its hooks stay registered in the core library).
//!
//! ```text
//! cuda_devices() ─► OnceLock: dlopen libtorch_cuda.so (Err: why not) ─► tch::Cuda::device_count()
//! ```
#![allow(unsafe_code)]

use std::sync::OnceLock;

/// The file name of libtorch's CUDA library on Linux.
const TORCH_CUDA: &str = "libtorch_cuda.so";

/// Loads libtorch's CUDA library once; `Err` is the loader's reason, kept for every later call.
fn load() -> &'static Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED.get_or_init(|| {
        // SAFETY: libtorch_cuda.so is libtorch's own CUDA library; loading it runs its
        // registration of CUDA with libtorch, which is what it is for. It is never unloaded.
        match unsafe { libloading::Library::new(TORCH_CUDA) } {
            Ok(library) => {
                std::mem::forget(library);
                Ok(())
            }
            Err(e) => Err(format!(
                "{TORCH_CUDA} could not be loaded (a CPU-only libtorch, or CUDA libraries it needs are missing): {e}"
            )),
        }
    })
}

/// How many CUDA devices libtorch can use here; `Err` says why none.
pub(crate) fn cuda_devices() -> Result<i64, String> {
    load().clone()?;
    match tch::Cuda::device_count() {
        0 => Err("libtorch sees no CUDA device (no GPU or driver here)".into()),
        n => Ok(n),
    }
}
