//! A unary `ModelInfer` call ─► [`InferRequest`]: the message through the shared codec
//! ([`nereid_proto::codec::decode_stream_request`]), the call's metadata into its
//! [`RequestContext`]; and back, outputs written to shared memory sent without data.
//!
//! ```text
//! tonic::Request<ModelInferRequest>
//!   ├─ metadata: traceparent / tracestate (W3C, ignored when invalid), grpc-timeout (deadline,
//!   │            counted from arrival) ──► RequestContext
//!   └─ message ──► codec::decode_stream_request ──► InferRequest + ShmPlan (crate::shm)
//! ```

use std::time::Instant;

use crate::forward::HeaderForward;
use crate::shm::Written;
use nereid_proto::codec::{RequestLimits, decode_stream_request};
use nereid_proto::pb::inference::{ModelInferRequest, ModelInferResponse};
use nereid_proto::{
    Frontend, GRPC_TIMEOUT, InferRequest, RequestContext, ServiceResult, ShmPlan, TRACEPARENT,
    TRACESTATE, TraceContext, parse_grpc_timeout,
};
use tonic::metadata::MetadataMap;

/// Validates and converts a unary `ModelInfer` call within `limits`, its metadata included (the
/// entries `forward` matches become parameters, after the message's own); its shared-memory
/// tensors come back beside it, still to be read and written.
pub(crate) fn decode_call(
    call: tonic::Request<ModelInferRequest>,
    limits: &RequestLimits,
    forward: &HeaderForward,
) -> ServiceResult<(InferRequest, ShmPlan)> {
    let context = request_context(call.metadata(), Instant::now());
    let (metadata, _, message) = call.into_parts();
    // A unary call ignores `triton_enable_empty_final_response`.
    let decoded = decode_stream_request(message, limits)?;
    let mut request = decoded.request;
    forward.apply_grpc(&metadata, &mut request.parameters)?;
    request.context = context;
    Ok((request, decoded.shm))
}

/// Empties the raw contents of the outputs written to shared memory: like Triton, the response
/// keeps one (empty) entry per output so positions still pair with `outputs`.
pub(crate) fn drop_written_contents(response: &mut ModelInferResponse, written: &Written) {
    if written.is_empty() {
        return;
    }
    for (output, raw) in response
        .outputs
        .iter()
        .zip(response.raw_output_contents.iter_mut())
    {
        if written.contains_key(&output.name) {
            *raw = bytes::Bytes::new();
        }
    }
}

/// The trace context and deadline a call's metadata carries; `now` is when the call arrived.
/// A malformed `grpc-timeout` is ignored, as tonic's server does.
pub fn request_context(metadata: &MetadataMap, now: Instant) -> RequestContext {
    let text = |key: &'static str| {
        metadata
            .get_all(key)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
    };
    let deadline = metadata
        .get(GRPC_TIMEOUT)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)
        .and_then(|timeout| now.checked_add(timeout));
    RequestContext {
        trace: TraceContext::from_values(text(TRACEPARENT), text(TRACESTATE)),
        deadline,
        received: Some(now),
        frontend: Some(Frontend::Grpc),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_gives_the_trace_context_and_deadline() {
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut metadata = MetadataMap::new();
        metadata.insert("traceparent", traceparent.parse().unwrap());
        metadata.insert("tracestate", "a=1".parse().unwrap());
        metadata.insert("grpc-timeout", "1500m".parse().unwrap());
        let now = Instant::now();
        let context = request_context(&metadata, now);
        let trace = context.trace.unwrap();
        assert_eq!(trace.traceparent(), traceparent);
        assert_eq!(trace.tracestate(), Some("a=1"));
        assert_eq!(
            context.deadline,
            Some(now + std::time::Duration::from_millis(1500))
        );

        let mut bad = MetadataMap::new();
        bad.insert("traceparent", traceparent.to_uppercase().parse().unwrap());
        bad.insert("tracestate", "a=1".parse().unwrap());
        bad.insert("grpc-timeout", "1.5S".parse().unwrap());
        let context = request_context(&bad, now);
        assert_eq!((context.trace, context.deadline), (None, None));
        assert_eq!(context.received, Some(now));
        // The largest timeout the format allows does not overflow.
        let mut huge = MetadataMap::new();
        huge.insert("grpc-timeout", "99999999H".parse().unwrap());
        let _ = request_context(&huge, now);
    }
}
