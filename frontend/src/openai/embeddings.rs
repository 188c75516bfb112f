//! `POST /v1/embeddings`: each input text is one request to an embedding model (its BYTES input
//! ─► its FP32 output, see `convention`), a few at a time, answered in input order.
//!
//! ```text
//! EmbeddingRequest ─► models::resolve (embedding, else 422)
//!   per text: http::request_from_keys({input: text}) ─► InferenceService::infer
//!             ─► the output's f32 elements ─► a list of numbers, or base64 of the bytes
//! ```
//!
//! Usage counts each text's whitespace-separated words as its tokens (the model returns no
//! count).

use axum::http::HeaderMap;
use axum::response::Response;
use base64::Engine;
use futures::{StreamExt, TryStreamExt, stream};
use serde_json::{Value, json};

use super::completions::json_response;
use super::convention::{EmbeddingModel, ModelKind};
use super::errors::OpenAiError;
use super::models::resolve;
use super::types::EmbeddingRequest;
use crate::http::{HttpState, request_context, request_from_keys};
use crate::orca;
use nereid_proto::{DataType, InferRequest, ServiceError, ServiceResult};

/// Texts in flight at once for one request.
const CONCURRENCY: usize = 8;

/// `POST /v1/embeddings`.
pub async fn embeddings(
    state: &HttpState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, OpenAiError> {
    let request = EmbeddingRequest::parse(body)?;
    let model = match resolve(state, &request.model).await? {
        ModelKind::Embedding(e) => e,
        ModelKind::Generation(_) => {
            return Err(OpenAiError::wrong_kind(
                &request.model,
                "it is a generation model; use /v1/completions or /v1/chat/completions",
            ));
        }
    };
    let model = &model;
    let name = request.model.as_str();
    let vectors: Vec<Vec<u8>> = stream::iter(request.inputs.iter().cloned())
        .map(|text| async move { embed(state, headers, name, model, &text).await })
        .buffered(CONCURRENCY)
        .try_collect()
        .await?;
    let data: Vec<Value> = vectors
        .into_iter()
        .enumerate()
        .map(|(index, bytes)| {
            let embedding = if request.base64 {
                json!(base64::engine::general_purpose::STANDARD.encode(&bytes))
            } else {
                json!(floats(&bytes))
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    let tokens: usize = request
        .inputs
        .iter()
        .map(|t| t.split_whitespace().count())
        .sum();
    let mut response = json_response(json!({
        "object": "list",
        "data": data,
        "model": request.model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }));
    orca::annotate(state.service.as_ref(), headers, name, &mut response).await;
    Ok(response)
}

/// One text's vector, as little-endian f32 bytes.
async fn embed(
    state: &HttpState,
    headers: &HeaderMap,
    name: &str,
    model: &EmbeddingModel,
    text: &str,
) -> ServiceResult<Vec<u8>> {
    let keys = [(model.input.clone(), json!(text))];
    let request = request_from_keys(name, None, keys, &model.inputs, state.config.max_input_size)?;
    let request = InferRequest {
        context: request_context(headers),
        ..request
    };
    let response = state.service.infer(request).await?;
    let output = response
        .outputs
        .into_iter()
        .find(|o| o.name() == model.output)
        .ok_or_else(|| {
            ServiceError::internal(format!(
                "model '{name}' answered without its output '{}'",
                model.output
            ))
        })?;
    if output.datatype() != DataType::Fp32 {
        return Err(ServiceError::internal(format!(
            "model '{name}' output '{}' is not FP32",
            model.output
        )));
    }
    Ok(output.data().to_vec())
}

/// Little-endian f32s as JSON numbers (NaN and infinities as null).
fn floats(bytes: &[u8]) -> Vec<Value> {
    bytes
        .chunks_exact(4)
        .map(|b| json!(f32::from_le_bytes([b[0], b[1], b[2], b[3]])))
        .collect()
}
