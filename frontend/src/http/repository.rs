//! The model repository extension: `POST /v2/repository/index`,
//! `/v2/repository/models/{m}/load` and `/unload`. Bodies are optional JSON; a named repository
//! (`/v2/repository/{r}/...`) is refused with Triton's 501.

use axum::extract::Request;
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::GeneralPurpose;
use base64::engine::{DecodePaddingMode, GeneralPurposeConfig};
use bytes::Bytes;
use serde::Serialize;
use serde_json::{Map, Value};

use super::HttpState;
use super::body::read_body;
use super::error::HttpError;
use super::json_body::{MAX_DATA_DEPTH, parse_json};
use super::metadata::json_response;
use super::tensor_json::describe;
use nereid_proto::{Credential, LoadRequest, ServiceError, ServiceResult, UnloadRequest};

/// Standard alphabet, padding optional (clients differ).
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

pub fn named_repository() -> HttpError {
    ServiceError::unsupported("'repository_name' specification is not supported").into()
}

/// Reads an optional JSON object body; `None` when the body is empty.
pub(super) async fn optional_body(
    state: &HttpState,
    request: Request,
    what: &str,
) -> Result<Option<Map<String, Value>>, HttpError> {
    let (parts, body) = request.into_parts();
    let body = read_body(&parts.headers, body, state.config.max_input_size).await?;
    Ok(parse_optional(&body, what)?)
}

fn parse_optional(body: &Bytes, what: &str) -> ServiceResult<Option<Map<String, Value>>> {
    if body.is_empty() {
        return Ok(None);
    }
    match parse_json(body, MAX_DATA_DEPTH, what)? {
        Value::Object(map) => Ok(Some(map)),
        other => Err(ServiceError::invalid(format!(
            "the {what} JSON must be an object, got {}",
            describe(&other)
        ))),
    }
}

#[derive(Serialize)]
struct IndexEntryJson<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "is_empty")]
    version: &'a str,
    #[serde(skip_serializing_if = "is_empty")]
    state: &'a str,
    #[serde(skip_serializing_if = "is_empty")]
    reason: &'a str,
}

fn is_empty(s: &&str) -> bool {
    s.is_empty()
}

/// `POST /v2/repository/index`, body `{"ready": bool}` optional.
pub async fn index(state: &HttpState, request: Request) -> Result<Response, HttpError> {
    let body = optional_body(state, request, "repository index").await?;
    let ready = match body.as_ref().and_then(|b| b.get("ready")) {
        None => false,
        Some(Value::Bool(ready)) => *ready,
        Some(_) => {
            return Err(
                ServiceError::invalid("Invalid value for 'ready': expected a boolean").into(),
            );
        }
    };
    let entries = state.service.repository_index(ready).await?;
    let json: Vec<IndexEntryJson<'_>> = entries
        .iter()
        .map(|e| IndexEntryJson {
            name: &e.name,
            version: &e.version,
            state: &e.state,
            reason: &e.reason,
        })
        .collect();
    serde_json::to_vec(&json).map(json_response).map_err(|e| {
        ServiceError::internal(format!("failed to serialize the repository index: {e}")).into()
    })
}

/// `POST /v2/repository/models/{m}/load`, body
/// `{"parameters":{"config":"<json>","file:<version>/<path>":"<base64>"}}` optional.
pub async fn load(state: &HttpState, model: &str, request: Request) -> Result<Response, HttpError> {
    let credential = credential(&request);
    let body = optional_body(state, request, "load request").await?;
    let mut load = load_request(body.as_ref().and_then(|b| b.get("parameters")))?;
    load.credential = credential;
    state.service.load_model(model, load).await?;
    Ok(StatusCode::OK.into_response())
}

/// The load parameters → [`LoadRequest`]. Triton answers 500 for a key that is neither
/// `config` nor `file:...`; it is the client's mistake, so this is a 400 naming the key.
fn load_request(params: Option<&Value>) -> ServiceResult<LoadRequest> {
    let mut load = LoadRequest::default();
    let params = match params {
        None => return Ok(load),
        Some(Value::Object(params)) => params,
        Some(other) => {
            return Err(ServiceError::invalid(format!(
                "'parameters' must be an object, got {}",
                describe(other)
            )));
        }
    };
    for (key, value) in params {
        let Value::String(text) = value else {
            return Err(ServiceError::invalid(format!(
                "load parameter '{key}' must be a string, got {}",
                describe(value)
            )));
        };
        if key == "config" {
            load.config = Some(text.clone());
        } else if key.starts_with("file:") {
            let content = BASE64.decode(text).map_err(|e| {
                ServiceError::invalid(format!(
                    "failed to decode the base64 content of '{key}': {e}"
                ))
            })?;
            load.files.insert(key.clone(), Bytes::from(content));
        } else {
            return Err(ServiceError::invalid(format!(
                "unknown load parameter '{key}'; expected 'config' or 'file:<version>/<path>'"
            )));
        }
    }
    if !load.files.is_empty() && load.config.is_none() {
        return Err(ServiceError::invalid(
            "Load parameter 'config' must be specified for model file override",
        ));
    }
    Ok(load)
}

/// `POST /v2/repository/models/{m}/unload`, body `{"parameters":{"unload_dependents":bool}}`
/// optional.
pub async fn unload(
    state: &HttpState,
    model: &str,
    request: Request,
) -> Result<Response, HttpError> {
    let credential = credential(&request);
    let body = optional_body(state, request, "unload request").await?;
    let params = body.as_ref().and_then(|b| b.get("parameters"));
    let dependents = match params.and_then(|p| p.get("unload_dependents")) {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(ServiceError::invalid(format!(
                "Unable to parse 'unload_dependents': expected a boolean, got {}",
                describe(other)
            ))
            .into());
        }
    };
    let unload = UnloadRequest {
        unload_dependents: dependents,
        credential,
    };
    state.service.unload_model(model, unload).await?;
    Ok(StatusCode::OK.into_response())
}

/// The caller's `Authorization` header, passed on to a service that acts on the caller's behalf.
fn credential(request: &Request) -> Option<Credential> {
    let value = request.headers().get(AUTHORIZATION)?.to_str().ok()?;
    Credential::new(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn load_parameters() {
        let load =
            load_request(Some(&json!({"config": "{}", "file:1/model.onnx": "AAEC"}))).unwrap();
        assert_eq!(load.config.as_deref(), Some("{}"));
        assert_eq!(&load.files["file:1/model.onnx"][..], &[0, 1, 2]);
        let unpadded = load_request(Some(&json!({"config": "{}", "file:1/a": "AAE"}))).unwrap();
        assert_eq!(&unpadded.files["file:1/a"][..], &[0, 1]);
        assert_eq!(load_request(None).unwrap(), LoadRequest::default());
    }

    #[test]
    fn load_parameter_errors() {
        let msg = |v: Value| load_request(Some(&v)).unwrap_err().message().to_string();
        assert_eq!(
            msg(json!({"file:1/model.onnx": "AAEC"})),
            "Load parameter 'config' must be specified for model file override"
        );
        assert!(msg(json!({"config": "{}", "file:1/m": "!!"})).contains("'file:1/m'"));
        assert!(msg(json!({"config": 5})).contains("'config' must be a string"));
        assert!(msg(json!({"other": "x"})).contains("unknown load parameter 'other'"));
        assert!(msg(json!([1])).contains("'parameters' must be an object"));
    }

    #[test]
    fn optional_bodies() {
        assert_eq!(parse_optional(&Bytes::new(), "x").unwrap(), None);
        assert!(
            parse_optional(&Bytes::from_static(b"{}"), "x")
                .unwrap()
                .is_some()
        );
        assert!(parse_optional(&Bytes::from_static(b"[]"), "x").is_err());
        assert!(parse_optional(&Bytes::from_static(b"{"), "x").is_err());
    }
}
