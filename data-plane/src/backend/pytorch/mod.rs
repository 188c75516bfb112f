//! PyTorch backend (`backend: "pytorch"`, `platform: "pytorch_libtorch"`): TorchScript models
//! (`model.pt`) run by libtorch through `tch`, behind the cargo feature `torch`.
//!
//! ```text
//!  auto_complete       nothing to fill: a TorchScript file does not describe its I/O (Triton's
//!                      backend does not auto-complete either); the config lists them
//!  load_instance(ctx)  ─► runtime::load: settings, device, signature ─► binding ─► CModule
//!                      ─► TorchInstance (one per instance; weights shared on request)
//! ```
//! Pure parts: `settings.rs` (parameters), `signature.rs` (forward()'s arguments, read from
//! the file), `binding.rs` (Triton's naming conventions). libtorch parts, compiled only with the
//! feature: `runtime.rs`, `instance.rs`, `convert.rs`. Without the feature, every PyTorch model
//! fails to load with a message saying how to get a build that has the backend.

// Used by the libtorch parts only; tested without them.
#[cfg_attr(not(feature = "torch"), allow(dead_code))]
mod binding;
#[cfg_attr(not(feature = "torch"), allow(dead_code))]
mod settings;
#[cfg_attr(not(feature = "torch"), allow(dead_code))]
mod signature;

#[cfg(feature = "torch")]
mod convert;
#[cfg(feature = "torch")]
mod cuda;
#[cfg(feature = "torch")]
mod instance;
#[cfg(feature = "torch")]
mod runtime;
#[cfg(all(test, feature = "torch"))]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
mod tests;

use super::{Backend, BackendError, BackendInstance, InstanceContext, Platforms};

/// The PyTorch backend. Cheap to create; libtorch is linked in (feature `torch`) or absent.
#[derive(Default)]
pub struct PyTorchBackend {
    #[cfg(feature = "torch")]
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

    /// libtorch must see a CUDA device (a CUDA build of libtorch, a driver and a GPU).
    fn gpu_support(&self) -> Result<(), String> {
        #[cfg(feature = "torch")]
        {
            runtime::cuda_support()
        }
        #[cfg(not(feature = "torch"))]
        {
            Err(
                "this nereid binary was built without the PyTorch backend (cargo feature 'torch')"
                    .into(),
            )
        }
    }

    fn load_instance(
        &self,
        ctx: &InstanceContext,
    ) -> Result<Box<dyn BackendInstance>, BackendError> {
        #[cfg(feature = "torch")]
        {
            runtime::load(&self.shared, ctx)
        }
        #[cfg(not(feature = "torch"))]
        {
            Err(BackendError::Load(format!(
                "unable to load model '{}': this nereid binary was built without the PyTorch backend (cargo feature 'torch'); `make build` builds it in",
                ctx.model_name
            )))
        }
    }
}
