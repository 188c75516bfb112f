//! The PyTorch backend's model `parameters`, with the keys and defaults of Triton's PyTorch
//! backend. Pure: what each setting does to libtorch is in `runtime.rs` and `instance.rs`.
//!
//! | Parameter                     | Default      | Effect in Nereid                                |
//! |-------------------------------|--------------|-------------------------------------------------|
//! | `DISABLE_OPTIMIZED_EXECUTION` | `false`      | graph executor optimisation off, per execution  |
//! | `INFERENCE_MODE`              | `true`       | accepted; execution always runs without autograd |
//! | `DISABLE_CUDNN`               | `false`      | cuDNN off (process-wide; GPU builds only matter) |
//! | `ENABLE_WEIGHT_SHARING`       | `false`      | instances share one loaded module               |
//! | `ENABLE_CACHE_CLEANING`       | `false`      | accepted; no CUDA cache on CPU                  |
//! | `INTRA_OP_THREAD_COUNT`       | libtorch's   | threads inside an operator (process-wide)       |
//! | `INTER_OP_THREAD_COUNT`       | libtorch's   | inter-op pool size (process-wide, set once)     |
//! | `ENABLE_JIT_PROFILING`        | unset        | JIT profiling mode on/off, per execution        |
//! | `ENABLE_TENSOR_FUSER`         | unset        | TensorExpr fuser on/off, per execution          |
//! | `ENABLE_JIT_EXECUTOR`         | unset        | accepted; libtorch's executor mode is not reachable through tch |
//!
//! Booleans take Triton's spellings (`true`/`false`, `1`/`0`, `on`/`off`); anything else, or a
//! thread count that is not a positive integer, fails the load with a message naming the key.

use crate::backend::params::{Params, boolean, param};
use crate::config::ValidModelConfig;

/// One model's PyTorch settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TorchSettings {
    /// `!DISABLE_OPTIMIZED_EXECUTION`.
    pub optimized_execution: bool,
    /// `INFERENCE_MODE` (recorded for the model's log line; see the module table).
    pub inference_mode: bool,
    /// `!DISABLE_CUDNN`.
    pub cudnn: bool,
    pub weight_sharing: bool,
    pub cache_cleaning: bool,
    pub intra_op_threads: Option<i32>,
    pub inter_op_threads: Option<i32>,
    /// `None`: leave libtorch's current setting alone.
    pub jit_profiling: Option<bool>,
    pub tensor_fuser: Option<bool>,
    pub jit_executor: Option<bool>,
}

impl TorchSettings {
    /// Reads the settings; `Err` names the parameter and what it must be.
    pub fn from_config(config: &ValidModelConfig) -> Result<TorchSettings, String> {
        let params = &config.parameters;
        Ok(TorchSettings {
            optimized_execution: !boolean(params, "DISABLE_OPTIMIZED_EXECUTION")?.unwrap_or(false),
            inference_mode: boolean(params, "INFERENCE_MODE")?.unwrap_or(true),
            cudnn: !boolean(params, "DISABLE_CUDNN")?.unwrap_or(false),
            weight_sharing: boolean(params, "ENABLE_WEIGHT_SHARING")?.unwrap_or(false),
            cache_cleaning: boolean(params, "ENABLE_CACHE_CLEANING")?.unwrap_or(false),
            intra_op_threads: thread_count(params, "INTRA_OP_THREAD_COUNT")?,
            inter_op_threads: thread_count(params, "INTER_OP_THREAD_COUNT")?,
            jit_profiling: boolean(params, "ENABLE_JIT_PROFILING")?,
            tensor_fuser: boolean(params, "ENABLE_TENSOR_FUSER")?,
            jit_executor: boolean(params, "ENABLE_JIT_EXECUTOR")?,
        })
    }
}

/// A positive thread count (`0` is refused, as Triton does: libtorch would reject it).
fn thread_count(params: &Params, key: &str) -> Result<Option<i32>, String> {
    match param(params, key) {
        None => Ok(None),
        Some(v) => match v.parse::<i32>() {
            Ok(n) if n > 0 => Ok(Some(n)),
            _ => Err(format!(
                "parameter '{key}' must be a positive integer, got '{v}'"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::params::config_with as with;

    #[test]
    fn defaults_match_triton() {
        let s = TorchSettings::from_config(&with(&[])).unwrap();
        assert!(s.optimized_execution && s.inference_mode && s.cudnn);
        assert!(!s.weight_sharing && !s.cache_cleaning);
        assert_eq!((s.intra_op_threads, s.inter_op_threads), (None, None));
        assert_eq!(
            (s.jit_profiling, s.tensor_fuser, s.jit_executor),
            (None, None, None)
        );
    }

    #[test]
    fn parameters_are_read() {
        let s = TorchSettings::from_config(&with(&[
            ("DISABLE_OPTIMIZED_EXECUTION", "true"),
            ("INFERENCE_MODE", "false"),
            ("DISABLE_CUDNN", "1"),
            ("ENABLE_WEIGHT_SHARING", "On"),
            ("INTRA_OP_THREAD_COUNT", "3"),
            ("INTER_OP_THREAD_COUNT", " 2 "),
            ("ENABLE_JIT_PROFILING", "false"),
            ("ENABLE_TENSOR_FUSER", "0"),
            ("ENABLE_JIT_EXECUTOR", "true"),
        ]))
        .unwrap();
        assert!(!s.optimized_execution && !s.inference_mode && !s.cudnn && s.weight_sharing);
        assert_eq!((s.intra_op_threads, s.inter_op_threads), (Some(3), Some(2)));
        assert_eq!(
            (s.jit_profiling, s.tensor_fuser, s.jit_executor),
            (Some(false), Some(false), Some(true))
        );
    }

    #[test]
    fn bad_values_name_the_parameter() {
        let e = TorchSettings::from_config(&with(&[("INFERENCE_MODE", "maybe")])).unwrap_err();
        assert_eq!(
            e,
            "parameter 'INFERENCE_MODE' must be a boolean (true/false, 1/0, on/off), got 'maybe'"
        );
        for bad in ["0", "-1", "two"] {
            let e =
                TorchSettings::from_config(&with(&[("INTRA_OP_THREAD_COUNT", bad)])).unwrap_err();
            assert_eq!(
                e,
                format!(
                    "parameter 'INTRA_OP_THREAD_COUNT' must be a positive integer, got '{bad}'"
                )
            );
        }
    }
}
