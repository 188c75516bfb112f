//! Where a request's tensors live when they live in client shared memory (Triton's system shared
//! memory extension): the references the decoders find in tensor parameters, before any memory
//! is read.
//!
//! ```text
//! input / requested output parameters
//!   shared_memory_region = "r", shared_memory_offset = o (default 0), shared_memory_byte_size = n
//!     ──► ShmRef { region, offset, byte_size }
//! decoders (HTTP JSON, gRPC codec) ──► ShmPlan { inputs: [ShmInput], outputs: [ShmOutput] }
//!     ──► the frontend's shared-memory module reads the inputs into tensors before the
//!         service runs, and writes the outputs after it answers
//! ```
//!
//! Only the references are here; the registry of regions and the reads and writes belong to the
//! frontends of one server process (`nereid-frontend`), so the data plane and the router never
//! see a reference.

use crate::datatype::DataType;
use crate::error::{ServiceError, ServiceResult};
use crate::types::{ParamValue, Parameters};

/// Tensor parameter naming the registered region.
pub const SHM_REGION: &str = "shared_memory_region";
/// Tensor parameter: where in the region the tensor starts (default 0).
pub const SHM_OFFSET: &str = "shared_memory_offset";
/// Tensor parameter: the tensor's bytes (input) or the room for it (output).
pub const SHM_BYTE_SIZE: &str = "shared_memory_byte_size";

/// A span of a registered region, relative to the region's own start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmRef {
    /// The name the region was registered under.
    pub region: String,
    /// Where the span starts, in bytes from the region's start.
    pub offset: u64,
    /// The span's length in bytes.
    pub byte_size: u64,
}

impl ShmRef {
    /// Takes the shared-memory keys out of a tensor's parameters. `None` when the tensor names no
    /// region (a stray offset or byte size without a region is dropped, as Triton ignores it).
    /// `owner` names the tensor in errors, e.g. `input 'x'`.
    pub fn take(params: &mut Parameters, owner: &str) -> ServiceResult<Option<ShmRef>> {
        let region = params.remove(SHM_REGION);
        let offset = params.remove(SHM_OFFSET);
        let byte_size = params.remove(SHM_BYTE_SIZE);
        let Some(region) = region else {
            return Ok(None);
        };
        let ParamValue::String(region) = region else {
            return Err(ServiceError::invalid(format!(
                "{owner}: parameter '{SHM_REGION}' must be a string"
            )));
        };
        let offset = match offset {
            None => 0,
            Some(v) => non_negative(owner, SHM_OFFSET, &v)?,
        };
        let Some(byte_size) = byte_size else {
            return Err(ServiceError::invalid(format!(
                "{owner}: parameter '{SHM_BYTE_SIZE}' must be set with '{SHM_REGION}'"
            )));
        };
        let byte_size = non_negative(owner, SHM_BYTE_SIZE, &byte_size)?;
        Ok(Some(ShmRef {
            region,
            offset,
            byte_size,
        }))
    }
}

fn non_negative(owner: &str, key: &str, value: &ParamValue) -> ServiceResult<u64> {
    match *value {
        ParamValue::Int(v) if v >= 0 => Ok(v as u64),
        ParamValue::Uint(v) => Ok(v),
        _ => Err(ServiceError::invalid(format!(
            "{owner}: parameter '{key}' must be a non-negative integer"
        ))),
    }
}

/// An input whose bytes are in shared memory: everything a tensor needs but its data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmInput {
    /// Its index among the request's inputs, so the resolved tensor goes back in its place.
    pub position: usize,
    /// The input's name.
    pub name: String,
    /// Its element type.
    pub datatype: DataType,
    /// Its dims.
    pub shape: Vec<i64>,
    /// Where its bytes are.
    pub at: ShmRef,
}

/// A requested output the client wants written into shared memory instead of the response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmOutput {
    /// The output's name.
    pub name: String,
    /// Where its bytes go.
    pub at: ShmRef,
}

/// The shared-memory tensors of one request, as decoded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShmPlan {
    /// Inputs read from shared memory, in request order.
    pub inputs: Vec<ShmInput>,
    /// Outputs to write into shared memory.
    pub outputs: Vec<ShmOutput>,
}

impl ShmPlan {
    /// True when the request uses no shared memory at all.
    pub fn is_empty(&self) -> bool {
        self.inputs.is_empty() && self.outputs.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, ParamValue)]) -> Parameters {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn takes_the_three_keys_and_leaves_the_rest() {
        let mut p = params(&[
            (SHM_REGION, ParamValue::String("r".into())),
            (SHM_OFFSET, ParamValue::Int(8)),
            (SHM_BYTE_SIZE, ParamValue::Uint(16)),
            ("binary_data", ParamValue::Bool(true)),
        ]);
        let at = ShmRef::take(&mut p, "input 'x'").unwrap().unwrap();
        assert_eq!(
            at,
            ShmRef {
                region: "r".into(),
                offset: 8,
                byte_size: 16
            }
        );
        assert_eq!(p.len(), 1);
    }

    #[test]
    fn offset_defaults_to_zero_and_no_region_is_none() {
        let mut p = params(&[
            (SHM_REGION, ParamValue::String("r".into())),
            (SHM_BYTE_SIZE, ParamValue::Int(4)),
        ]);
        assert_eq!(ShmRef::take(&mut p, "o").unwrap().unwrap().offset, 0);
        let mut p = params(&[(SHM_BYTE_SIZE, ParamValue::Int(4))]);
        assert_eq!(ShmRef::take(&mut p, "o").unwrap(), None);
        assert!(p.is_empty());
    }

    #[test]
    fn bad_values_name_the_tensor_and_key() {
        let cases = [
            (
                params(&[(SHM_REGION, ParamValue::Int(1))]),
                "input 'x': parameter 'shared_memory_region' must be a string",
            ),
            (
                params(&[(SHM_REGION, ParamValue::String("r".into()))]),
                "input 'x': parameter 'shared_memory_byte_size' must be set with 'shared_memory_region'",
            ),
            (
                params(&[
                    (SHM_REGION, ParamValue::String("r".into())),
                    (SHM_BYTE_SIZE, ParamValue::Int(-4)),
                ]),
                "input 'x': parameter 'shared_memory_byte_size' must be a non-negative integer",
            ),
            (
                params(&[
                    (SHM_REGION, ParamValue::String("r".into())),
                    (SHM_OFFSET, ParamValue::String("0".into())),
                    (SHM_BYTE_SIZE, ParamValue::Int(4)),
                ]),
                "input 'x': parameter 'shared_memory_offset' must be a non-negative integer",
            ),
        ];
        for (mut p, message) in cases {
            let err = ShmRef::take(&mut p, "input 'x'").unwrap_err();
            assert_eq!(err, ServiceError::invalid(message));
        }
    }
}
