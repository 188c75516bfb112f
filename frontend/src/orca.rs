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
//! Triton fills `named_metrics` with the TensorRT-LLM backend's KV-cache figures
//! (`kv_cache_utilization`, `max_token_capacity`); Nereid has no KV cache of its own to report,
//! so it names the queue figures every model has. The generate endpoints and the OpenAI routes
//! add it; the load is read when the answer's headers go out.

use axum::http::{HeaderMap, HeaderValue};
use axum::response::Response;
use serde_json::json;

use nereid_proto::{InferenceService, ModelLoadReport};

/// The request header asking for the report, and its format.
pub const FORMAT_HEADER: &str = "endpoint-load-metrics-format";
/// The response header carrying it.
pub const METRICS_HEADER: &str = "endpoint-load-metrics";

/// The report's two forms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// The format the request asks for, if any.
pub fn requested(headers: &HeaderMap) -> Option<Format> {
    let value = headers.get(FORMAT_HEADER)?.to_str().ok()?.trim();
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
}
