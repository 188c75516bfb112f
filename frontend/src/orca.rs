//! The ORCA `endpoint-load-metrics` response header, as Triton sends it for load balancers
//! (Envoy, the Gateway API inference extension): a request that carries
//! `endpoint-load-metrics-format: text` or `json` gets the model's current load on its answer.
//!
//! ```text
//! request header endpoint-load-metrics-format: text | json   (anything else: no header)
//!   ─► InferenceService::model_load(model)   None (router, model gone): no header
//!   ─► endpoint-load-metrics: TEXT named_metrics.pending_requests=2, named_metrics.in_flight_requests=3
//!                             JSON {"named_metrics":{"pending_requests":2,"in_flight_requests":3}}
//! ```
//!
//! Over gRPC (what the router asks of a worker when it opens a stream, see `nereid_router`'s
//! `load` module): request metadata `endpoint-load-metrics-format` and
//! `endpoint-load-metrics-model` (the model whose load to report, since a stream names its
//! model only in its messages) ─► the same value in the response's initial metadata
//! `endpoint-load-metrics`, taken before the stream's first request is read.
//!
//! Triton fills `named_metrics` with the TensorRT-LLM backend's KV-cache figures
//! (`kv_cache_utilization`, `max_token_capacity`); Nereid has no KV cache of its own to report,
//! so it names the queue figures every model has. The generate endpoints and the OpenAI routes
//! add it; the load is read when the answer's headers go out.

use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use serde_json::json;
use tonic::metadata::{MetadataMap, MetadataValue};

use nereid_proto::{InferenceService, ModelLoadReport};

/// The request header asking for the report, and its format.
pub const FORMAT_HEADER: &str = "endpoint-load-metrics-format";
/// The response header carrying it.
pub const METRICS_HEADER: &str = "endpoint-load-metrics";

/// The gRPC request metadata naming the model to report on (a stream's messages name it, its
/// metadata does not).
pub const MODEL_KEY: &str = "endpoint-load-metrics-model";

/// The report's two forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// The format the request asks for, if any.
pub fn requested(headers: &HeaderMap) -> Option<Format> {
    parse_format(headers.get(FORMAT_HEADER)?.to_str().ok()?)
}

/// `text` or `json` (any case), else `None`.
fn parse_format(value: &str) -> Option<Format> {
    let value = value.trim();
    if value.eq_ignore_ascii_case("text") {
        Some(Format::Text)
    } else if value.eq_ignore_ascii_case("json") {
        Some(Format::Json)
    } else {
        None
    }
}

/// The header's value.
pub fn header_value(format: Format, load: ModelLoadReport) -> String {
    match format {
        Format::Text => format!(
            "TEXT named_metrics.pending_requests={}, named_metrics.in_flight_requests={}",
            load.pending_requests, load.in_flight_requests
        ),
        Format::Json => format!(
            "JSON {}",
            json!({"named_metrics": {
                "pending_requests": load.pending_requests,
                "in_flight_requests": load.in_flight_requests,
            }})
        ),
    }
}

/// Adds the report on `model` to `response` when `request` asks for one.
pub async fn annotate(
    service: &dyn InferenceService,
    request: &HeaderMap,
    model: &str,
    response: &mut Response,
) {
    let Some(format) = requested(request) else {
        return;
    };
    let Some(load) = service.model_load(model).await else {
        return;
    };
    if let Ok(value) = HeaderValue::from_str(&header_value(format, load)) {
        response.headers_mut().insert(METRICS_HEADER, value);
    }
}

/// The format and model gRPC request `metadata` asks a report in and on, if it asks.
fn grpc_asked(metadata: &MetadataMap) -> Option<(Format, &str)> {
    let get = |key| metadata.get(key).and_then(|v| v.to_str().ok());
    Some((parse_format(get(FORMAT_HEADER)?)?, get(MODEL_KEY)?))
}

/// Adds the report on the model that gRPC request `metadata` names to `response` when the
/// metadata asks for one (see the module docs).
pub async fn annotate_grpc(
    service: &dyn InferenceService,
    metadata: &MetadataMap,
    response: &mut MetadataMap,
) {
    let Some((format, model)) = grpc_asked(metadata) else {
        return;
    };
    let Some(load) = service.model_load(model).await else {
        return;
    };
    if let Ok(value) = MetadataValue::try_from(header_value(format, load)) {
        response.insert(METRICS_HEADER, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        let load = ModelLoadReport {
            pending_requests: 2,
            in_flight_requests: 3,
        };
        assert_eq!(
            header_value(Format::Text, load),
            "TEXT named_metrics.pending_requests=2, named_metrics.in_flight_requests=3"
        );
        assert_eq!(
            header_value(Format::Json, load),
            r#"JSON {"named_metrics":{"pending_requests":2,"in_flight_requests":3}}"#
        );
        let mut headers = HeaderMap::new();
        assert_eq!(requested(&headers), None);
        headers.insert(FORMAT_HEADER, HeaderValue::from_static("JSON"));
        assert_eq!(requested(&headers), Some(Format::Json));
        headers.insert(FORMAT_HEADER, HeaderValue::from_static("xml"));
        assert_eq!(requested(&headers), None);
    }

    #[test]
    fn grpc_metadata_asks_with_a_format_and_a_model() {
        let mut metadata = MetadataMap::new();
        assert_eq!(grpc_asked(&metadata), None);
        metadata.insert(FORMAT_HEADER, MetadataValue::from_static("text"));
        // A stream's metadata must name the model: its messages are read later.
        assert_eq!(grpc_asked(&metadata), None);
        metadata.insert(MODEL_KEY, MetadataValue::from_static("tiny_llm"));
        assert_eq!(grpc_asked(&metadata), Some((Format::Text, "tiny_llm")));
        metadata.insert(FORMAT_HEADER, MetadataValue::from_static("yaml"));
        assert_eq!(grpc_asked(&metadata), None);
    }
}
