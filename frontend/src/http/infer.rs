//! `POST /v2/models/{m}[/versions/{v}]/infer`: body → [`InferRequest`] → service → response.
//!
//! Decoding and encoding large bodies (JSON parsing, compression) is CPU work; above
//! [`OFFLOAD_BYTES`](crate::offload::OFFLOAD_BYTES) it runs on tokio's blocking pool so it never stalls the async workers.
//!
//! [`InferRequest`]: nereid_proto::InferRequest

use axum::extract::Request;
use axum::response::Response;

use super::HttpState;
use super::body::read_body;
use super::compression::response_encoding;
use super::error::HttpError;
use super::infer_request::{decode_json_within, header_length, request_context};
use super::infer_response::build_response;
use super::raw_request::decode_raw;
use crate::offload::offload;
use crate::shm::{resolve_inputs, write_outputs};
use std::time::Instant;

use nereid_proto::{ResponseHook, parse_version};

pub async fn infer(
    state: &HttpState,
    model: &str,
    version: &str,
    request: Request,
) -> Result<Response, HttpError> {
    let received = Instant::now();
    let version = parse_version(version)?;
    let (parts, body) = request.into_parts();
    let limit = state.config.max_input_size;
    let body = read_body(&parts.headers, body, limit).await?;
    let header_len = header_length(&parts.headers, body.len())?;
    let decoded = if header_len == Some(0) {
        let config = state.service.model_config(model, version).await?;
        decode_raw(model, version, body, &config)?
    } else {
        let name = model.to_string();
        let limits = state.config.limits;
        let decoded = offload(body.len() as u64, "HTTP codec", move || {
            decode_json_within(&name, version, body, header_len, limit, &limits)
        })
        .await;
        match decoded {
            Ok(d) => d,
            // Like Triton, an unknown model is reported as such even when the body is bad too;
            // the lookup happens only on this error path, so good requests pay nothing for it.
            Err(e) => {
                state.service.model_metadata(model, version).await?;
                return Err(e.into());
            }
        }
    };
    let mut request = decoded.request;
    // Like Triton, after the body's own parameters: a forwarded header replaces one of its name.
    (state.config.header_forward).apply_http(&parts.headers, &mut request.parameters)?;
    let shm = &state.config.shared_memory;
    resolve_inputs(shm, &mut request, decoded.shm.inputs).await?;
    request.context = request_context(&parts.headers);
    request.context.received = Some(received);
    let hook = ResponseHook::new();
    request.context.response_hook = hook.clone();
    let response = state.service.infer(request).await?;
    let written = write_outputs(shm, decoded.shm.outputs, &response).await?;
    let encoding = response_encoding(&parts.headers);
    let format = decoded.format;
    let size: usize = response.outputs.iter().map(|t| t.data().len()).sum();
    let encoded = offload(size as u64, "HTTP codec", move || {
        build_response(&response, &format, &written, encoding)
    })
    .await?;
    hook.finish(Instant::now());
    Ok(encoded)
}
