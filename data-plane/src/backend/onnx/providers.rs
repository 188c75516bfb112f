//! The execution providers of one instance's session, chosen as Triton's ONNX Runtime backend
//! chooses them.
//!
//! ```text
//!  KIND_CPU            ─► CPU provider only; gpu_execution_accelerator entries are ignored
//!  KIND_GPU (GPU n)    ─► gpu_plan (pure): names and parameters checked
//!                      ─► each provider must be in the loaded library (GetAvailableProviders),
//!                         else the load fails naming it and onnxruntime-gpu
//!                      ─► [TensorRT on n] then CUDA on n, registered with error_on_failure
//! ```
//!
//! Accelerators (`optimization { execution_accelerators { gpu_execution_accelerator [...] } }`):
//! `tensorrt` puts the TensorRT provider before CUDA (Triton's keys `precision_mode`
//! `FP32`/`FP16`/`INT8` and `max_workspace_size_bytes`, and ORT's own `trt_*` keys);
//! `cuda` passes its parameters to the CUDA provider as they are. Other names are refused with
//! Triton's message. The GPU path has never run on a GPU in Nereid's tests (no test machine had
//! one): only its refusals and the pure plan are tested.

use ort::ep::{self, ArbitrarilyConfigurableExecutionProvider, ExecutionProvider};

use crate::config::Accelerator;

/// The GPU providers of one `KIND_GPU` instance, before any is registered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GpuPlan {
    pub device_id: i32,
    /// TensorRT options (ORT keys) when a `tensorrt` accelerator is configured.
    pub tensorrt: Option<Vec<(String, String)>>,
    /// CUDA options (ORT keys) from a `cuda` accelerator.
    pub cuda: Vec<(String, String)>,
}

/// Reads the `gpu_execution_accelerator` entries for an instance on GPU `device_id`. `Err`:
/// Triton's message for an unknown accelerator, precision mode or TensorRT parameter.
pub(crate) fn gpu_plan(accelerators: &[Accelerator], device_id: i32) -> Result<GpuPlan, String> {
    let mut plan = GpuPlan {
        device_id,
        tensorrt: None,
        cuda: Vec::new(),
    };
    for accelerator in accelerators {
        match accelerator.name.as_str() {
            "tensorrt" => plan.tensorrt = Some(tensorrt_options(accelerator)?),
            "cuda" => plan.cuda.extend(
                accelerator
                    .parameters
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone())),
            ),
            other => {
                return Err(format!(
                    "unknown Execution Accelerator '{other}' is requested"
                ));
            }
        }
    }
    Ok(plan)
}

/// Triton's TensorRT accelerator keys in ONNX Runtime's terms.
fn tensorrt_options(accelerator: &Accelerator) -> Result<Vec<(String, String)>, String> {
    let mut options = Vec::new();
    for (key, value) in &accelerator.parameters {
        match key.as_str() {
            "precision_mode" => match value.as_str() {
                "FP32" => {}
                "FP16" => options.push(("trt_fp16_enable".into(), "1".into())),
                "INT8" => options.push(("trt_int8_enable".into(), "1".into())),
                other => return Err(format!("unsupported precision mode '{other}' is requested")),
            },
            "max_workspace_size_bytes" => {
                options.push(("trt_max_workspace_size".into(), value.clone()))
            }
            k if k.starts_with("trt_") => options.push((key.clone(), value.clone())),
            other => {
                return Err(format!(
                    "unknown parameter '{other}' is provided for TensorRT Execution Accelerator"
                ));
            }
        }
    }
    Ok(options)
}

/// Whether the loaded ONNX Runtime library has the provider `P`; `Err` names it and says how to
/// get it. Call only once the library is loaded.
fn require<P: ExecutionProvider>(accelerator: &str) -> Result<(), String> {
    match P::is_available() {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!(
            "{accelerator} needs ONNX Runtime's {}, which the loaded ONNX Runtime library does not have (it is a CPU-only build): install the onnxruntime-gpu wheel and point --onnxruntime-library at its libonnxruntime.so, or use KIND_CPU",
            P::NAME
        )),
        Err(e) => Err(format!(
            "cannot list ONNX Runtime's execution providers: {e}"
        )),
    }
}

/// Whether this library can run sessions on a GPU (has the CUDA provider).
pub(crate) fn cuda_available() -> Result<(), String> {
    require::<ep::CUDA>("a GPU instance")
}

/// The providers to register for `plan`, in order, each failing the load if it cannot be
/// registered (never a silent fall back to the CPU).
pub(crate) fn gpu_providers(plan: &GpuPlan) -> Result<Vec<ep::ExecutionProviderDispatch>, String> {
    let gpu = plan.device_id;
    let mut providers = Vec::new();
    if let Some(options) = &plan.tensorrt {
        require::<ep::TensorRT>("execution accelerator 'tensorrt'")?;
        let mut trt = ep::TensorRT::default().with_device_id(gpu);
        for (k, v) in options {
            trt = trt.with_arbitrary_config(k, v);
        }
        providers.push(trt.build().error_on_failure());
    }
    require::<ep::CUDA>(&format!("KIND_GPU (GPU {gpu})"))?;
    let mut cuda = ep::CUDA::default().with_device_id(gpu);
    for (k, v) in &plan.cuda {
        cuda = cuda.with_arbitrary_config(k, v);
    }
    providers.push(cuda.build().error_on_failure());
    Ok(providers)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accelerator(name: &str, params: &[(&str, &str)]) -> Accelerator {
        Accelerator {
            name: name.into(),
            parameters: params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn plans_tensorrt_before_cuda_with_triton_keys() {
        let plan = gpu_plan(
            &[
                accelerator(
                    "tensorrt",
                    &[
                        ("precision_mode", "FP16"),
                        ("max_workspace_size_bytes", "1073741824"),
                        ("trt_engine_cache_enable", "1"),
                    ],
                ),
                accelerator("cuda", &[("cudnn_conv_algo_search", "HEURISTIC")]),
            ],
            1,
        )
        .unwrap();
        assert_eq!(plan.device_id, 1);
        let trt = plan.tensorrt.unwrap();
        assert!(trt.contains(&("trt_fp16_enable".into(), "1".into())));
        assert!(trt.contains(&("trt_max_workspace_size".into(), "1073741824".into())));
        assert!(trt.contains(&("trt_engine_cache_enable".into(), "1".into())));
        assert_eq!(
            plan.cuda,
            vec![("cudnn_conv_algo_search".into(), "HEURISTIC".into())]
        );
        // No accelerator: CUDA alone.
        assert_eq!(
            gpu_plan(&[], 0).unwrap(),
            GpuPlan {
                device_id: 0,
                tensorrt: None,
                cuda: vec![]
            }
        );
    }

    #[test]
    fn refuses_what_triton_refuses() {
        let err = |a: Accelerator| gpu_plan(&[a], 0).unwrap_err();
        assert_eq!(
            err(accelerator("openvino", &[])),
            "unknown Execution Accelerator 'openvino' is requested"
        );
        assert_eq!(
            err(accelerator("tensorrt", &[("precision_mode", "FP8")])),
            "unsupported precision mode 'FP8' is requested"
        );
        assert_eq!(
            err(accelerator("tensorrt", &[("workspace", "1")])),
            "unknown parameter 'workspace' is provided for TensorRT Execution Accelerator"
        );
    }
}
