//! The system and CUDA shared memory extensions' endpoints, a thin translation onto the
//! process's registry (`crate::shm`):
//!
//! ```text
//! GET  /v2/systemsharedmemory[/region/{r}]/status   ─► [{"name","key","offset","byte_size"}]
//! POST /v2/systemsharedmemory/region/{r}/register   {"key","offset"?,"byte_size"} ─► 200, empty
//! POST /v2/systemsharedmemory[/region/{r}]/unregister                              ─► 200, empty
//! GET  /v2/cudasharedmemory[/region/{r}]/status     ─► [{"name","device_id","byte_size"}]
//! POST /v2/cudasharedmemory/region/{r}/register
//!      {"raw_handle":{"b64": base64 cudaIpcMemHandle_t},"device_id","byte_size"}   ─► 200, empty
//! POST /v2/cudasharedmemory[/region/{r}]/unregister                                ─► 200, empty
//! ```
//!
//! The CUDA register body is read as Triton 2.51 reads it, with its answers for a body that
//! lacks a field or has one of the wrong type (checked against it by
//! tests/python/test_cuda_shared_memory.py).

use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::Serialize;
use serde_json::{Map, Value};

use super::HttpState;
use super::error::HttpError;
use super::metadata::json_response;
use super::repository::optional_body;
use super::routes::ShmAction;
use super::tensor_json::describe;
use crate::cuda::IPC_HANDLE_BYTES;
use crate::shm::{CudaRegionStatus, RegionStatus};
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

#[derive(Serialize)]
struct CudaStatusJson<'a> {
    name: &'a str,
    device_id: u64,
    byte_size: u64,
}

/// Serves one CUDA shared memory endpoint; `region` is the path's raw region name, if any.
pub async fn cuda_endpoint(
    state: &HttpState,
    region: Option<&str>,
    action: ShmAction,
    request: Request,
) -> Result<Response, HttpError> {
    let shm = &state.config.shared_memory;
    match action {
        ShmAction::Status => {
            let regions: Vec<CudaRegionStatus> = shm.cuda_status(region)?;
            let json: Vec<CudaStatusJson<'_>> = regions
                .iter()
                .map(|r| CudaStatusJson {
                    name: &r.name,
                    device_id: r.device_id,
                    byte_size: r.byte_size,
                })
                .collect();
            serde_json::to_vec(&json).map(json_response).map_err(|e| {
                ServiceError::internal(format!(
                    "failed to serialize the CUDA shared memory status: {e}"
                ))
                .into()
            })
        }
        ShmAction::Register => {
            let Some(name) = region else {
                return Err(ServiceError::invalid(
                    "'region name' is necessary to register cuda shared memory region",
                )
                .into());
            };
            let body = optional_body(state, request, "shared memory register request").await?;
            let (handle, device_id, byte_size) = cuda_register_body(body)?;
            shm.register_cuda(name, &handle, device_id, byte_size)?;
            Ok(StatusCode::OK.into_response())
        }
        ShmAction::Unregister => {
            shm.unregister_cuda(region)?;
            Ok(StatusCode::OK.into_response())
        }
    }
}

/// `{"raw_handle": {"b64": string}, "device_id": uint, "byte_size": uint}`, with Triton's
/// answers: a missing `raw_handle` is a 400, a missing or mistyped member a 500 in its JSON
/// reader's words, a handle that is not 64 bytes of base64 a 400.
fn cuda_register_body(body: Option<Map<String, Value>>) -> ServiceResult<(Vec<u8>, i64, u64)> {
    let body = body.unwrap_or_default();
    let Some(raw_handle) = body.get("raw_handle") else {
        return Err(missing("raw_handle"));
    };
    let b64 = match raw_handle.get("b64") {
        Some(Value::String(b64)) => b64,
        Some(_) => return Err(json_reader("attempt to access JSON non-string as string")),
        None => return Err(no_member("b64")),
    };
    let uint = |field: &str| match body.get(field) {
        Some(v) => v.as_u64().ok_or_else(|| {
            json_reader("attempt to access JSON non-unsigned-integer as unsigned-integer")
        }),
        None => Err(no_member(field)),
    };
    let device_id = uint("device_id")?;
    let byte_size = uint("byte_size")?;
    let handle = STANDARD
        .decode(b64)
        .ok()
        .filter(|h| h.len() == IPC_HANDLE_BYTES)
        .ok_or_else(|| {
            ServiceError::invalid("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")
        })?;
    // A device id past i64 is no device; the registry refuses it.
    Ok((
        handle,
        i64::try_from(device_id).unwrap_or(i64::MAX),
        byte_size,
    ))
}

/// Triton's JSON reader's words for a missing member (an internal error there).
fn no_member(field: &str) -> ServiceError {
    json_reader(&format!(
        "attempt to access non-existing object member '{field}'"
    ))
}

fn json_reader(message: &str) -> ServiceError {
    ServiceError::internal(message)
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

    #[test]
    fn cuda_register_body_reads_as_triton() {
        let handle = STANDARD.encode([7u8; 64]);
        let ok = cuda_register_body(body(
            json!({"raw_handle": {"b64": handle}, "device_id": 1, "byte_size": 32}),
        ))
        .unwrap();
        assert_eq!(ok, (vec![7u8; 64], 1, 32));
        let err = |v: Value| cuda_register_body(body(v)).unwrap_err();
        assert_eq!(
            err(json!({"device_id": 0, "byte_size": 8})),
            ServiceError::invalid("Shared memory register request has no 'raw_handle' field")
        );
        assert_eq!(
            err(json!({"raw_handle": "x", "device_id": 0, "byte_size": 8})),
            ServiceError::internal("attempt to access non-existing object member 'b64'")
        );
        assert_eq!(
            err(json!({"raw_handle": {"b64": 5}, "device_id": 0, "byte_size": 8})),
            ServiceError::internal("attempt to access JSON non-string as string")
        );
        assert_eq!(
            err(json!({"raw_handle": {"b64": handle}, "byte_size": 8})),
            ServiceError::internal("attempt to access non-existing object member 'device_id'")
        );
        assert_eq!(
            err(json!({"raw_handle": {"b64": handle}, "device_id": -1, "byte_size": 8})),
            ServiceError::internal(
                "attempt to access JSON non-unsigned-integer as unsigned-integer"
            )
        );
        for bad in ["!!", "AAAA"] {
            assert_eq!(
                err(json!({"raw_handle": {"b64": bad}, "device_id": 0, "byte_size": 8})),
                ServiceError::invalid(
                    "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"
                )
            );
        }
    }

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
