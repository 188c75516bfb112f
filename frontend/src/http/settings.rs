//! `GET|POST /v2/trace/setting`, `GET|POST /v2/models/{m}/trace/setting` and
//! `GET|POST /v2/logging`: JSON ↔ `nereid_proto` settings maps, then the service decides.
//!
//! Trace values are strings on the wire (`trace_level` an array of them); a POST may give a
//! string, an array of strings, a number or a bool (written as its string) or `null` (clear the
//! key). Log values are booleans, non-negative integers or strings. A GET, or a POST with an
//! empty body, only reads.

use axum::extract::Request;
use axum::http::Method;
use axum::response::Response;
use serde_json::{Map, Value};

use super::HttpState;
use super::error::HttpError;
use super::metadata::json_response;
use super::repository::optional_body;
use super::tensor_json::describe;
use nereid_proto::{
    LogSettings, LogValue, ServiceError, ServiceResult, TraceSettings, TraceSettingsUpdate,
};

/// Keys whose value is always an array in responses, like Triton's.
const LIST_KEYS: [&str; 1] = ["trace_level"];

pub async fn trace(
    state: &HttpState,
    model: Option<&str>,
    request: Request,
) -> Result<Response, HttpError> {
    let update = match read_update(state, request, "trace setting").await? {
        Some(body) => Some(trace_update(body)?),
        None => None,
    };
    let settings = state.service.trace_settings(model, update).await?;
    Ok(json_response(trace_json(&settings)))
}

pub async fn logging(state: &HttpState, request: Request) -> Result<Response, HttpError> {
    let update = match read_update(state, request, "log setting").await? {
        Some(body) => Some(log_update(body)?),
        None => None,
    };
    let settings = state.service.log_settings(update).await?;
    Ok(json_response(log_json(&settings)))
}

async fn read_update(
    state: &HttpState,
    request: Request,
    what: &str,
) -> Result<Option<Map<String, Value>>, HttpError> {
    if request.method() != Method::POST {
        return Ok(None);
    }
    optional_body(state, request, what).await
}

fn trace_update(body: Map<String, Value>) -> ServiceResult<TraceSettingsUpdate> {
    body.into_iter()
        .map(|(key, value)| {
            let values = match value {
                Value::Null => None,
                Value::Array(items) => Some(
                    items
                        .into_iter()
                        .map(|item| scalar(&key, item))
                        .collect::<ServiceResult<Vec<_>>>()?,
                ),
                other => Some(vec![scalar(&key, other)?]),
            };
            Ok((key, values))
        })
        .collect()
}

fn scalar(key: &str, value: Value) -> ServiceResult<String> {
    match value {
        Value::String(s) => Ok(s),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        other => Err(ServiceError::invalid(format!(
            "trace setting '{key}' must be a string, an array of strings or null, got {}",
            describe(&other)
        ))),
    }
}

fn trace_json(settings: &TraceSettings) -> Vec<u8> {
    let object: Map<String, Value> = settings
        .iter()
        .map(|(key, values)| {
            let value = if values.len() == 1 && !LIST_KEYS.contains(&key.as_str()) {
                Value::String(values[0].clone())
            } else {
                Value::Array(values.iter().cloned().map(Value::String).collect())
            };
            (key.clone(), value)
        })
        .collect();
    serde_json::to_vec(&object).unwrap_or_default()
}

fn log_update(body: Map<String, Value>) -> ServiceResult<LogSettings> {
    body.into_iter()
        .map(|(key, value)| {
            let value = match value {
                Value::Bool(b) => LogValue::Bool(b),
                Value::String(s) => LogValue::Text(s),
                Value::Number(n) => match n.as_u64().and_then(|n| u32::try_from(n).ok()) {
                    Some(n) => LogValue::Uint(n),
                    None => {
                        return Err(ServiceError::invalid(format!(
                            "log setting '{key}' must be a non-negative 32-bit integer, got {n}"
                        )));
                    }
                },
                other => {
                    return Err(ServiceError::invalid(format!(
                        "log setting '{key}' must be a boolean, a number or a string, got {}",
                        describe(&other)
                    )));
                }
            };
            Ok((key, value))
        })
        .collect()
}

fn log_json(settings: &LogSettings) -> Vec<u8> {
    let object: Map<String, Value> = settings
        .iter()
        .map(|(key, value)| {
            let value = match value {
                LogValue::Bool(b) => Value::Bool(*b),
                LogValue::Uint(n) => Value::from(*n),
                LogValue::Text(s) => Value::String(s.clone()),
            };
            (key.clone(), value)
        })
        .collect();
    serde_json::to_vec(&object).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(text: &str) -> Map<String, Value> {
        match serde_json::from_str(text).unwrap() {
            Value::Object(map) => map,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn trace_updates_accept_strings_arrays_numbers_and_null() {
        let update = trace_update(object(
            r#"{"trace_rate":"5","trace_count":3,"trace_level":["TIMESTAMPS","TENSORS"],"log_frequency":null}"#,
        ))
        .unwrap();
        assert_eq!(update["trace_rate"], Some(vec!["5".to_string()]));
        assert_eq!(update["trace_count"], Some(vec!["3".to_string()]));
        assert_eq!(update["trace_level"].as_ref().unwrap().len(), 2);
        assert_eq!(update["log_frequency"], None);
        let err = trace_update(object(r#"{"trace_rate":{"x":1}}"#)).unwrap_err();
        assert!(err.to_string().contains("'trace_rate'"), "{err}");
    }

    #[test]
    fn trace_level_is_always_an_array() {
        let mut settings = TraceSettings::new();
        settings.insert("trace_level".into(), vec!["OFF".into()]);
        settings.insert("trace_rate".into(), vec!["1000".into()]);
        let json: Value = serde_json::from_slice(&trace_json(&settings)).unwrap();
        assert_eq!(json["trace_level"], serde_json::json!(["OFF"]));
        assert_eq!(json["trace_rate"], "1000");
    }

    #[test]
    fn log_updates_name_bad_values() {
        let update = log_update(object(
            r#"{"log_info":false,"log_verbose_level":2,"log_format":"ISO8601"}"#,
        ))
        .unwrap();
        assert_eq!(update["log_info"], LogValue::Bool(false));
        assert_eq!(update["log_verbose_level"], LogValue::Uint(2));
        let err = log_update(object(r#"{"log_verbose_level":-1}"#)).unwrap_err();
        assert!(err.to_string().contains("'log_verbose_level'"), "{err}");
        let err = log_update(object(r#"{"log_info":null}"#)).unwrap_err();
        assert!(err.to_string().contains("'log_info'"), "{err}");
    }
}
