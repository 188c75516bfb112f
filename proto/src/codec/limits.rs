//! [`RequestLimits`]: the request-level resource limits every infer request meets before any
//! of its tensor data is decoded, whichever protocol brought it.
//!
//! ```text
//! gRPC ModelInferRequest ── decode_stream_request ─┐
//!                                                   ├─► RequestLimits::check_counts (inputs, outputs)
//! HTTP JSON header ─────── http::infer_request ────┘    RequestLimits::check_shape (each input's
//!                                                        declared shape, before its data is read)
//! ```
//!
//! Both frontends call these two checks and nothing else decides, so a request refused over one
//! protocol is refused over the other with the same message. The messages name the limit, the
//! value seen and the flag that raises it; the class is [`ServiceError::InvalidArgument`]
//! (HTTP 400, gRPC INVALID_ARGUMENT).

use crate::error::{ServiceError, ServiceResult};
use crate::types::format_shape;

/// Bounds on the size of one infer request, set by the operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestLimits {
    /// Inputs one request may carry (`--max-request-inputs`).
    pub max_inputs: usize,
    /// Outputs one request may ask for by name (`--max-request-outputs`).
    pub max_outputs: usize,
    /// Elements of one input tensor, the product of its declared shape
    /// (`--max-tensor-elements`).
    pub max_tensor_elements: u64,
}

impl RequestLimits {
    /// Default of [`RequestLimits::max_inputs`] and [`RequestLimits::max_outputs`]: far above
    /// any model's tensor count, low enough that a request cannot make the server walk millions
    /// of entries.
    pub const DEFAULT_MAX_TENSORS: usize = 1024;
    /// Default of [`RequestLimits::max_tensor_elements`]: `INT32_MAX`, what the largest gRPC
    /// message Triton accepts could hold at one byte per element.
    pub const DEFAULT_MAX_TENSOR_ELEMENTS: u64 = i32::MAX as u64;

    /// Refuses a request with more inputs or requested outputs than allowed.
    pub fn check_counts(&self, inputs: usize, outputs: usize) -> ServiceResult<()> {
        if inputs > self.max_inputs {
            return Err(ServiceError::invalid(format!(
                "request has {inputs} inputs; the server accepts at most {} (--max-request-inputs)",
                self.max_inputs
            )));
        }
        if outputs > self.max_outputs {
            return Err(ServiceError::invalid(format!(
                "request asks for {outputs} outputs; the server accepts at most {} (--max-request-outputs)",
                self.max_outputs
            )));
        }
        Ok(())
    }

    /// Refuses an input whose declared shape holds more elements than allowed, or so many that
    /// their count does not fit in 64 bits. A negative dimension is left to the shape checks
    /// that follow (they name it as such).
    pub fn check_shape(&self, model: &str, input: &str, shape: &[i64]) -> ServiceResult<()> {
        let mut dims = Vec::with_capacity(shape.len());
        for &d in shape {
            match u64::try_from(d) {
                Ok(d) => dims.push(d),
                Err(_) => return Ok(()),
            }
        }
        // A zero dimension empties the tensor whatever the others are.
        if dims.contains(&0) {
            return Ok(());
        }
        let limit = self.max_tensor_elements;
        match dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)) {
            Some(elements) if elements <= limit => Ok(()),
            Some(elements) => Err(ServiceError::invalid(format!(
                "input '{input}' for model '{model}' has {elements} elements (shape {}); the server accepts at most {limit} per tensor (--max-tensor-elements)",
                format_shape(shape)
            ))),
            None => Err(ServiceError::invalid(format!(
                "input '{input}' for model '{model}': the element count of shape {} overflows 64 bits; the server accepts at most {limit} per tensor (--max-tensor-elements)",
                format_shape(shape)
            ))),
        }
    }
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_inputs: Self::DEFAULT_MAX_TENSORS,
            max_outputs: Self::DEFAULT_MAX_TENSORS,
            max_tensor_elements: Self::DEFAULT_MAX_TENSOR_ELEMENTS,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> RequestLimits {
        RequestLimits {
            max_inputs: 2,
            max_outputs: 1,
            max_tensor_elements: 100,
        }
    }

    #[test]
    fn counts_at_the_limit_pass_and_above_it_are_refused_naming_the_flag() {
        assert_eq!(small().check_counts(2, 1), Ok(()));
        let err = small().check_counts(3, 0).unwrap_err();
        assert_eq!(
            err,
            ServiceError::invalid(
                "request has 3 inputs; the server accepts at most 2 (--max-request-inputs)"
            )
        );
        let err = small().check_counts(0, 2).unwrap_err();
        assert_eq!(
            err.message(),
            "request asks for 2 outputs; the server accepts at most 1 (--max-request-outputs)"
        );
    }

    #[test]
    fn tensor_elements_are_the_product_of_the_declared_shape() {
        let limits = small();
        assert_eq!(limits.check_shape("m", "x", &[10, 10]), Ok(()));
        assert_eq!(limits.check_shape("m", "x", &[]), Ok(()));
        let err = limits.check_shape("m", "x", &[10, 11]).unwrap_err();
        assert!(matches!(err, ServiceError::InvalidArgument(_)));
        assert_eq!(
            err.message(),
            "input 'x' for model 'm' has 110 elements (shape [10,11]); the server accepts at most 100 per tensor (--max-tensor-elements)"
        );
    }

    #[test]
    fn an_overflowing_product_is_refused_and_a_zero_dimension_is_empty() {
        let limits = RequestLimits::default();
        let huge = [i64::MAX, i64::MAX];
        let err = limits.check_shape("m", "x", &huge).unwrap_err();
        assert!(err.message().contains("overflows 64 bits"), "{err}");
        assert!(err.message().contains("--max-tensor-elements"), "{err}");
        assert_eq!(
            limits.check_shape("m", "x", &[i64::MAX, i64::MAX, 0]),
            Ok(())
        );
        // Negative dimensions are reported by the shape validation that follows.
        assert_eq!(limits.check_shape("m", "x", &[-1, i64::MAX, 4]), Ok(()));
    }
}
