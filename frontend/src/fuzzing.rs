//! Entry points for the coverage-guided fuzz targets under `fuzz/` (not an API; hidden from the
//! docs, and nothing in the server calls them).
//!
//! [`http_infer_body`] runs the HTTP infer body decoder exactly as `POST .../infer` does after
//! the body is read: `Inference-Header-Content-Length` parsing, then the JSON (optionally
//! binary-extended) decoder, or the raw binary decoder when the header is `0`.

use axum::http::{HeaderMap, HeaderValue};
use bytes::Bytes;
use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::{InferRequest, ServiceError, ServiceResult};

use crate::http::{INFER_HEADER_CONTENT_LENGTH, decode_json, decode_raw, header_length};

/// Decodes an infer request body for model `m`. `header` is the raw
/// `Inference-Header-Content-Length` value (`None`: absent); `config` is the model's config,
/// read only by a raw request (header `0`). A value hyper would not deliver as a header is
/// refused before the decoder runs.
pub fn http_infer_body(
    header: Option<&[u8]>,
    body: &[u8],
    max_input_size: usize,
    config: &ModelConfig,
) -> ServiceResult<InferRequest> {
    let mut headers = HeaderMap::new();
    if let Some(value) = header {
        let value = HeaderValue::from_bytes(value)
            .map_err(|_| ServiceError::invalid("fuzzing: not a valid header value"))?;
        headers.insert(INFER_HEADER_CONTENT_LENGTH, value);
    }
    let body = Bytes::copy_from_slice(body);
    let decoded = match header_length(&headers, body.len())? {
        Some(0) => decode_raw("m", None, body, config)?,
        header_len => decode_json("m", None, body, header_len, max_input_size)?,
    };
    Ok(decoded.request)
}
