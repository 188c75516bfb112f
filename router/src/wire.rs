//! The router's side of the shared gRPC codec (`nereid_proto::codec`): what the codec
//! encodes and decodes, classified as [`RouterError`]s with the worker's address.
//!
//! ```text
//! InferRequest ──codec::encode_request──► WorkerRequest.message   (refusal: InvalidRequest)
//! InferRequest.context ─────────────────► WorkerRequest.context   (sent as metadata by `forward`)
//! ModelInferResponse ──codec::decode_response──► InferResponse    (malformed: BadResponse)
//! tonic::Status ──► Unreachable (tonic's own, no answer) | Worker { ServiceError::from(status) }
//! ```

use nereid_proto::pb::inference::{ModelInferRequest, ModelInferResponse};
use nereid_proto::{InferRequest, InferResponse, RequestContext, ServiceError, codec};

use crate::error::{RouterError, RouterResult};

/// An infer request in the form a worker gets it: the message, and the context that travels
/// beside it as metadata (`traceparent`, `tracestate`, `grpc-timeout`; see `forward`).
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerRequest {
    /// The gRPC message the worker receives.
    pub message: ModelInferRequest,
    /// Trace context and deadline, sent as request metadata rather than in the message.
    pub context: RequestContext,
}

/// Encodes a request for a worker; a request the worker protocol cannot carry (a custom
/// `uint64` parameter too large for `int64`) is [`RouterError::InvalidRequest`].
pub fn encode_request(request: &InferRequest) -> RouterResult<WorkerRequest> {
    Ok(WorkerRequest {
        message: codec::encode_request(request)
            .map_err(|e| RouterError::InvalidRequest(e.into_message()))?,
        context: request.context.clone(),
    })
}

/// Decodes a worker's answer; tensor bytes stay the `Bytes` prost decoded.
pub fn decode_response(addr: &str, response: ModelInferResponse) -> RouterResult<InferResponse> {
    codec::decode_response(response).map_err(|e| RouterError::BadResponse {
        addr: addr.to_string(),
        message: e.into_message(),
    })
}

/// Classifies a failed call to a worker: its own answers keep the worker's class and message;
/// a call that never reached a worker (or lost it) is [`RouterError::Unreachable`].
pub fn classify_status(addr: &str, status: tonic::Status) -> RouterError {
    // A status tonic made itself (no connection, connection lost) carries the transport error
    // as its source; a worker's answer never does.
    if std::error::Error::source(&status).is_some() {
        return RouterError::Unreachable {
            addr: addr.to_string(),
            message: status.message().to_string(),
        };
    }
    RouterError::Worker {
        addr: addr.to_string(),
        error: ServiceError::from(status),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use nereid_proto::pb::inference::model_infer_response::InferOutputTensor;
    use nereid_proto::{DataType, ParamValue, Tensor};

    use super::*;

    fn request() -> InferRequest {
        let data = Bytes::from(vec![1u8, 0, 0, 0]);
        InferRequest {
            model_name: "m".into(),
            inputs: vec![Tensor::new("x", DataType::Int32, vec![1], data).unwrap()],
            ..Default::default()
        }
    }

    #[test]
    fn the_context_travels_beside_the_message() {
        let mut r = request();
        r.context.deadline = Some(std::time::Instant::now());
        let wire = encode_request(&r).unwrap();
        assert_eq!(wire.context, r.context);
        assert_eq!(wire.message, codec::encode_request(&r).unwrap());
    }

    #[test]
    fn oversized_custom_uint_is_refused() {
        let mut r = request();
        r.parameters
            .insert("big".into(), ParamValue::Uint(u64::MAX));
        let err = encode_request(&r).unwrap_err();
        assert!(matches!(err, RouterError::InvalidRequest(_)));
    }

    #[test]
    fn malformed_responses_name_the_worker() {
        let short = ModelInferResponse {
            outputs: vec![InferOutputTensor {
                name: "y".into(),
                datatype: "FP32".into(),
                shape: vec![1],
                ..Default::default()
            }],
            raw_output_contents: vec![Bytes::from_static(&[0])],
            ..Default::default()
        };
        assert!(matches!(
            decode_response("w", short),
            Err(RouterError::BadResponse { addr, .. }) if addr == "w"
        ));
    }

    #[test]
    fn worker_statuses_keep_their_class() {
        let e = classify_status("w", tonic::Status::invalid_argument("bad input"));
        assert_eq!(
            e,
            RouterError::Worker {
                addr: "w".into(),
                error: ServiceError::InvalidArgument("bad input".into())
            }
        );
        assert!(classify_status("w", tonic::Status::unavailable("queue full")).retryable());
        assert!(!classify_status("w", tonic::Status::internal("boom")).retryable());
        let late = classify_status("w", tonic::Status::deadline_exceeded("too late"));
        assert!(!late.retryable());
        assert_eq!(
            ServiceError::from(late),
            ServiceError::DeadlineExceeded("too late".into())
        );
    }
}
