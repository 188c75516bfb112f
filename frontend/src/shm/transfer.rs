//! Moving a request's shared-memory tensors: inputs read into ordinary tensors before the
//! service runs, outputs written into their regions after it answers. Both frontends call these
//! two functions; the service never sees a region.
//!
//! ```text
//! decoded request + ShmPlan
//!   resolve_inputs ── region(name).read(offset, byte_size) ─► Tensor::new ─► its place in inputs
//!   InferenceService::infer
//!   write_outputs  ── each planned output: fits? ─► region(name).write(offset, bytes)
//!                 ─► Written: what went where, for the response (no data for those outputs)
//! ```
//!
//! Copies of more than [`OFFLOAD_BYTES`](crate::offload::OFFLOAD_BYTES) in all run on tokio's blocking pool.

use std::collections::HashMap;

use bytes::Bytes;

use super::registry::SharedMemory;
use crate::offload::offload;
use nereid_proto::{
    InferRequest, InferResponse, ServiceError, ServiceResult, ShmInput, ShmOutput, ShmRef, Tensor,
    element_count,
};

/// The outputs written to shared memory, by name: region, offset and the bytes written.
pub type Written = HashMap<String, ShmRef>;

/// Reads `inputs` from their regions and puts each tensor at its place in `request.inputs`.
pub async fn resolve_inputs(
    shm: &SharedMemory,
    request: &mut InferRequest,
    inputs: Vec<ShmInput>,
) -> ServiceResult<()> {
    if inputs.is_empty() {
        return Ok(());
    }
    let total = inputs.iter().map(|i| i.at.byte_size).sum();
    let shm = shm.clone();
    let model = request.model_name.clone();
    let id = request.id.clone();
    let tensors = offload(total, "shared memory copy", move || {
        inputs
            .into_iter()
            .map(|input| Ok((input.position, read_input(&shm, &model, &id, input)?)))
            .collect::<ServiceResult<Vec<_>>>()
    })
    .await?;
    // Positions ascend, so each insert lands where the client put the input.
    for (position, tensor) in tensors {
        let at = position.min(request.inputs.len());
        request.inputs.insert(at, tensor);
    }
    Ok(())
}

fn read_input(shm: &SharedMemory, model: &str, id: &str, input: ShmInput) -> ServiceResult<Tensor> {
    let ShmInput {
        name,
        datatype,
        shape,
        at,
        ..
    } = input;
    if let Some(size) = datatype.element_size() {
        // Triton's words, request-id prefix included.
        let expected = element_count(&shape).and_then(|n| n.checked_mul(size));
        if expected.map(|e| e as u64) != Some(at.byte_size) {
            let id = if id.is_empty() { "<id_unknown>" } else { id };
            return Err(ServiceError::invalid(format!(
                "[request id: {id}] input byte size mismatch for input '{name}' for model '{model}'. Expected {}, got {}",
                expected.map_or_else(|| format!("more than {}", usize::MAX), |e| e.to_string()),
                at.byte_size,
            )));
        }
    }
    let data = shm.region(&at.region)?.read(at.offset, at.byte_size)?;
    Tensor::new(name, datatype, shape, Bytes::from(data))
}

/// Writes the planned outputs of `response` into their regions; returns what went where.
pub async fn write_outputs(
    shm: &SharedMemory,
    outputs: Vec<ShmOutput>,
    response: &InferResponse,
) -> ServiceResult<Written> {
    if outputs.is_empty() {
        return Ok(Written::new());
    }
    let mut jobs = Vec::with_capacity(outputs.len());
    for planned in outputs {
        // An output the model did not produce has nothing to write.
        let Some(tensor) = response.outputs.iter().find(|t| t.name() == planned.name) else {
            continue;
        };
        let data = tensor.data().clone();
        if data.len() as u64 > planned.at.byte_size {
            return Err(ServiceError::invalid(format!(
                "shared memory size specified with the request for output '{}' ({} bytes) should be at least {} bytes to hold the results",
                planned.name,
                planned.at.byte_size,
                data.len()
            )));
        }
        jobs.push((planned, data));
    }
    let total = jobs.iter().map(|(_, d)| d.len() as u64).sum();
    let shm = shm.clone();
    offload(total, "shared memory copy", move || {
        let mut written = Written::new();
        for (planned, data) in jobs {
            let region = shm.region(&planned.at.region)?;
            region.write(planned.at.offset, &data)?;
            written.insert(
                planned.name,
                ShmRef {
                    byte_size: data.len() as u64,
                    ..planned.at
                },
            );
        }
        Ok(written)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::test_object::TestObject;
    use nereid_proto::DataType;
    use nereid_proto::testing::int32_tensor as int32;

    fn at(region: &str, offset: u64, byte_size: u64) -> ShmRef {
        ShmRef {
            region: region.into(),
            offset,
            byte_size,
        }
    }

    #[tokio::test]
    async fn inputs_are_read_into_their_places() {
        let obj = TestObject::new(64);
        obj.fill(16, &[1, 0, 0, 0, 2, 0, 0, 0]);
        // BYTES in Triton's layout: a 4-byte little-endian length before each element.
        obj.fill(32, &[2, 0, 0, 0, b'h', b'i', 0, 0, 0, 0]);
        let shm = SharedMemory::enabled();
        shm.register("r", &obj.key, 0, 64).unwrap();
        let mut request = InferRequest {
            model_name: "m".into(),
            inputs: vec![int32("b", &[7])],
            ..Default::default()
        };
        let inputs = vec![
            ShmInput {
                position: 0,
                name: "a".into(),
                datatype: DataType::Int32,
                shape: vec![2],
                at: at("r", 16, 8),
            },
            ShmInput {
                position: 2,
                name: "s".into(),
                datatype: DataType::Bytes,
                shape: vec![2],
                at: at("r", 32, 10),
            },
        ];
        resolve_inputs(&shm, &mut request, inputs).await.unwrap();
        let names: Vec<&str> = request.inputs.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["a", "b", "s"]);
        assert_eq!(request.inputs[0], int32("a", &[1, 2]));
        assert_eq!(request.inputs[2].element_count(), 2);
    }

    #[tokio::test]
    async fn input_errors_name_the_input_or_region() {
        let obj = TestObject::new(16);
        let shm = SharedMemory::enabled();
        shm.register("r", &obj.key, 0, 16).unwrap();
        let input = |at: ShmRef| ShmInput {
            position: 0,
            name: "a".into(),
            datatype: DataType::Int32,
            shape: vec![2],
            at,
        };
        let mut request = InferRequest {
            model_name: "m".into(),
            ..Default::default()
        };
        let cases = [
            (
                at("r", 0, 4),
                "[request id: <id_unknown>] input byte size mismatch for input 'a' for model 'm'. Expected 8, got 4",
            ),
            (
                at("nope", 0, 8),
                "Unable to find shared memory region: 'nope'",
            ),
            (
                at("r", 12, 8),
                "Invalid offset + byte size for shared memory region: 'r'",
            ),
        ];
        for (place, message) in cases {
            let err = resolve_inputs(&shm, &mut request, vec![input(place)])
                .await
                .unwrap_err();
            assert_eq!(err.message(), message);
        }
        // Malformed BYTES data in the region is refused like any malformed tensor.
        obj.fill(0, &[9, 0, 0, 0]);
        let bytes_input = ShmInput {
            datatype: DataType::Bytes,
            shape: vec![1],
            ..input(at("r", 0, 6))
        };
        assert!(
            resolve_inputs(&shm, &mut request, vec![bytes_input])
                .await
                .is_err()
        );
    }

    #[tokio::test]
    async fn outputs_are_written_and_reported() {
        let obj = TestObject::new(32);
        let shm = SharedMemory::enabled();
        shm.register("o", &obj.key, 8, 24).unwrap();
        let response = InferResponse {
            outputs: vec![int32("y", &[3, 4]), int32("z", &[5])],
            ..Default::default()
        };
        let planned = vec![ShmOutput {
            name: "y".into(),
            at: at("o", 4, 16),
        }];
        let written = write_outputs(&shm, planned, &response).await.unwrap();
        assert_eq!(written.len(), 1);
        assert_eq!(written["y"], at("o", 4, 8));
        assert_eq!(&obj.contents()[12..20], &[3, 0, 0, 0, 4, 0, 0, 0]);

        let too_small = vec![ShmOutput {
            name: "y".into(),
            at: at("o", 0, 4),
        }];
        let err = write_outputs(&shm, too_small, &response).await.unwrap_err();
        assert_eq!(
            err.message(),
            "shared memory size specified with the request for output 'y' (4 bytes) should be at least 8 bytes to hold the results"
        );
    }
}
