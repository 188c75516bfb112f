//! The read-only GET endpoints: health, server and model metadata, model readiness, model
//! configuration and statistics. Each is a thin translation of one [`InferenceService`] call into
//! Triton's JSON.

use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::error::HttpError;
use nereid_proto::{
    InferenceService, ServiceError, TensorMetadata, message_to_json, parse_version,
};

/// A 200 response with a JSON body.
pub fn json_response(body: Vec<u8>) -> Response {
    let mut response = (StatusCode::OK, body).into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

fn to_json<T: Serialize>(value: &T) -> Result<Response, HttpError> {
    serde_json::to_vec(value).map(json_response).map_err(|e| {
        ServiceError::internal(format!("failed to serialize the response: {e}")).into()
    })
}

/// `GET /v2/health/live` and `/v2/health/ready`: 200 or 400, empty body either way.
pub async fn health(service: &dyn InferenceService, readiness: bool) -> Response {
    let ok = if readiness {
        service.server_ready().await
    } else {
        service.server_live().await
    };
    if ok {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    }
    .into_response()
}

#[derive(Serialize)]
struct ServerMetadataJson<'a> {
    name: &'a str,
    version: &'a str,
    extensions: &'a [String],
}

/// `GET /v2`.
pub fn server_metadata(service: &dyn InferenceService) -> Response {
    let metadata = service.server_metadata();
    to_json(&ServerMetadataJson {
        name: &metadata.name,
        version: &metadata.version,
        extensions: &metadata.extensions,
    })
    .unwrap_or_else(IntoResponse::into_response)
}

#[derive(Serialize)]
struct TensorMetadataJson<'a> {
    name: &'a str,
    datatype: &'a str,
    shape: &'a [i64],
}

#[derive(Serialize)]
struct ModelMetadataJson<'a> {
    name: &'a str,
    versions: &'a [String],
    platform: &'a str,
    inputs: Vec<TensorMetadataJson<'a>>,
    outputs: Vec<TensorMetadataJson<'a>>,
}

fn tensors_json(tensors: &[TensorMetadata]) -> Vec<TensorMetadataJson<'_>> {
    tensors
        .iter()
        .map(|t| TensorMetadataJson {
            name: &t.name,
            datatype: &t.datatype,
            shape: &t.shape,
        })
        .collect()
}

/// `GET /v2/models/{m}[/versions/{v}]`.
pub async fn model_metadata(
    service: &dyn InferenceService,
    name: &str,
    version: &str,
) -> Result<Response, HttpError> {
    let version = parse_version(version)?;
    let metadata = service.model_metadata(name, version).await?;
    to_json(&ModelMetadataJson {
        name: &metadata.name,
        versions: &metadata.versions,
        platform: &metadata.platform,
        inputs: tensors_json(&metadata.inputs),
        outputs: tensors_json(&metadata.outputs),
    })
}

/// `GET /v2/models/{m}[/versions/{v}]/ready`: 200 empty, or 400 "Model version not ready";
/// an unknown model or version is the service's 404.
pub async fn model_ready(
    service: &dyn InferenceService,
    name: &str,
    version: &str,
) -> Result<Response, HttpError> {
    let version = parse_version(version)?;
    if service.model_ready(name, version).await? {
        Ok(StatusCode::OK.into_response())
    } else {
        Err(ServiceError::invalid("Model version not ready").into())
    }
}

/// `GET /v2/models/{m}[/versions/{v}]/config`: the `ModelConfig` in Triton's JSON form.
pub async fn model_config(
    service: &dyn InferenceService,
    name: &str,
    version: &str,
) -> Result<Response, HttpError> {
    let version = parse_version(version)?;
    let config = service.model_config(name, version).await?;
    to_json(&message_to_json(&config))
}

/// `GET /v2/models/stats`, `/v2/models/{m}[/versions/{v}]/stats` (`name` empty for all models).
pub async fn model_stats(
    service: &dyn InferenceService,
    name: &str,
    version: &str,
) -> Result<Response, HttpError> {
    let version = parse_version(version)?;
    let stats = service.model_statistics(name, version).await?;
    let model_stats: Vec<serde_json::Value> = stats.iter().map(message_to_json).collect();
    to_json(&serde_json::json!({ "model_stats": model_stats }))
}
