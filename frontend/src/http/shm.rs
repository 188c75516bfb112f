//! The system shared memory extension's endpoints, a thin translation onto the process's
//! registry (`crate::shm`):
//!
//! ```text
//! GET  /v2/systemsharedmemory[/region/{r}]/status   ─► [{"name","key","offset","byte_size"}]
//! POST /v2/systemsharedmemory/region/{r}/register   {"key","offset"?,"byte_size"} ─► 200, empty
//! POST /v2/systemsharedmemory[/region/{r}]/unregister                              ─► 200, empty
//! ```

use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value};

use super::HttpState;
use super::error::HttpError;
use super::metadata::json_response;
use super::repository::optional_body;
use super::routes::ShmAction;
use super::tensor_json::describe;
use crate::shm::RegionStatus;
use nereid_proto::{ServiceError, ServiceResult};

#[derive(Serialize)]
struct StatusJson<'a> {
    name: &'a str,
    key: &'a str,
    offset: u64,
    byte_size: u64,
}

/// Serves one system shared memory endpoint; `region` is the path's raw region name, if any.
pub async fn endpoint(
    state: &HttpState,
    region: Option<&str>,
    action: ShmAction,
    request: Request,
) -> Result<Response, HttpError> {
    let shm = &state.config.shared_memory;
    match action {
        ShmAction::Status => status_response(&shm.status(region)?),
        ShmAction::Register => {
            let Some(name) = region else {
                return Err(ServiceError::invalid(
                    "a shared memory region is registered at /v2/systemsharedmemory/region/{name}/register",
                )
                .into());
            };
            let body = optional_body(state, request, "shared memory register request").await?;
            let (key, offset, byte_size) = register_body(body)?;
            shm.register(name, &key, offset, byte_size)?;
            Ok(StatusCode::OK.into_response())
        }
        ShmAction::Unregister => {
            shm.unregister(region)?;
            Ok(StatusCode::OK.into_response())
        }
    }
}

fn status_response(regions: &[RegionStatus]) -> Result<Response, HttpError> {
    let json: Vec<StatusJson<'_>> = regions
        .iter()
        .map(|r| StatusJson {
            name: &r.name,
            key: &r.key,
            offset: r.offset,
            byte_size: r.byte_size,
        })
        .collect();
    serde_json::to_vec(&json).map(json_response).map_err(|e| {
        ServiceError::internal(format!("failed to serialize the shared memory status: {e}")).into()
    })
}

/// `{"key": string, "offset": uint (default 0), "byte_size": uint}`.
fn register_body(body: Option<Map<String, Value>>) -> ServiceResult<(String, u64, u64)> {
    let body = body.unwrap_or_default();
    let key = match body.get("key") {
        Some(Value::String(key)) => key.clone(),
        None => return Err(missing("key")),
        other => return Err(bad_field("key", "a string", other)),
    };
    let uint = |field: &str, default: Option<u64>| match (body.get(field), default) {
        (None, Some(default)) => Ok(default),
        (None, None) => Err(missing(field)),
        (Some(v), _) if v.as_u64().is_some() => Ok(v.as_u64().unwrap_or_default()),
        (other, _) => Err(bad_field(field, "a non-negative integer", other)),
    };
    let offset = uint("offset", Some(0))?;
    let byte_size = uint("byte_size", None)?;
    Ok((key, offset, byte_size))
}

/// Triton's words for a missing field.
fn missing(field: &str) -> ServiceError {
    ServiceError::invalid(format!(
        "Shared memory register request has no '{field}' field"
    ))
}

fn bad_field(field: &str, expected: &str, got: Option<&Value>) -> ServiceError {
    ServiceError::invalid(format!(
        "shared memory register request: '{field}' must be {expected}, got {}",
        got.map_or("nothing".to_string(), describe)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Option<Map<String, Value>> {
        match v {
            Value::Object(m) => Some(m),
            _ => None,
        }
    }

    #[test]
    fn register_body_fields() {
        assert_eq!(
            register_body(body(json!({"key": "/k", "byte_size": 8}))).unwrap(),
            ("/k".to_string(), 0, 8)
        );
        assert_eq!(
            register_body(body(json!({"key": "/k", "offset": 4, "byte_size": 8}))).unwrap(),
            ("/k".to_string(), 4, 8)
        );
        let err = register_body(None).unwrap_err();
        assert_eq!(
            err.message(),
            "Shared memory register request has no 'key' field"
        );
        let err = register_body(body(json!({"key": 1, "byte_size": 8}))).unwrap_err();
        assert_eq!(
            err.message(),
            "shared memory register request: 'key' must be a string, got 1"
        );
        let err = register_body(body(json!({"key": "/k", "byte_size": -1}))).unwrap_err();
        assert!(
            err.message()
                .contains("'byte_size' must be a non-negative integer")
        );
        let err = register_body(body(json!({"key": "/k"}))).unwrap_err();
        assert_eq!(
            err.message(),
            "Shared memory register request has no 'byte_size' field"
        );
    }
}
