//! PyTorch backend (`backend: "pytorch"`, `platform: "pytorch_libtorch"`): TorchScript models
//! (`model.pt`) run by libtorch in the PyTorch backend library `libnereid_torch_backend.so`
//! (crate `nereid-torch-backend`), which this module opens on the first PyTorch model load, as
//! Triton opens its backends. The `nereid` binary does not link libtorch, so a server without
//! PyTorch models never maps it.
//!
//! ```text
//!  auto_complete       nothing to fill: a TorchScript file does not describe its I/O (Triton's
//!                      backend does not auto-complete either); the config lists them
//!  load_instance(ctx)  ─► runtime::load: settings, library (dlopen once), device, signature
//!                      ─► binding ─► library load ─► TorchInstance (one per instance; weights
//!                      shared on request)
//!  execute             ─► instance: inputs lent in place ─► library ─► outputs in our buffers
//! ```
//! Pure parts: `settings.rs` (parameters), `signature.rs` (forward()'s arguments, read from
//! the file), `binding.rs` (Triton's naming conventions), `elements.rs` (datatypes). The C ABI
//! boundary: `library.rs`. Without the library, every PyTorch model fails to load with a
//! message saying how to build it.

mod binding;
mod elements;
mod instance;
mod library;
mod runtime;
mod settings;
mod signature;
// Against real libtorch: they need libnereid_torch_backend.so built (feature `torch`).
#[cfg(all(test, feature = "torch"))]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
mod tests;

use super::{Backend, BackendError, BackendInstance, InstanceContext, Platforms};

/// The PyTorch backend. Cheap to create: the library (and libtorch) is opened by the first load.
#[derive(Default)]
pub struct PyTorchBackend {
    shared: runtime::SharedModules,
}

impl Backend for PyTorchBackend {
    fn name(&self) -> &'static str {
        "pytorch"
    }

    fn default_model_filename(&self) -> &'static str {
        "model.pt"
    }

    /// TorchScript (`model.pt`, Triton writes its platform in) and AOTInductor packages
    /// (`model.pt2`, no platform written).
    fn platforms(&self) -> Platforms {
        Platforms {
            names: &["pytorch_libtorch", "libtorch", "torch_aoti"],
            implied: None,
            files: &[("model.pt", Some("pytorch_libtorch")), ("model.pt2", None)],
        }
    }

    /// libtorch must see a CUDA device (a CUDA build of libtorch, a driver and a GPU). Asked
    /// only for a PyTorch model on a host with GPUs; opens the library.
    fn gpu_support(&self) -> Result<(), String> {
        runtime::cuda_support()
    }

    fn load_instance(
        &self,
        ctx: &InstanceContext,
    ) -> Result<Box<dyn BackendInstance>, BackendError> {
        runtime::load(&self.shared, ctx)
    }
}
