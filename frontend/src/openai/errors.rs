//! [`OpenAiError`]: every failed `/v1/` request, in OpenAI's error shape
//! `{"error": {"message", "type", "param", "code"}}`, with the status the `openai` Python client
//! maps to its exception classes (400 `BadRequestError`, 401 `AuthenticationError`, 403
//! `PermissionDeniedError`, 404 `NotFoundError`, 409 `ConflictError`, 422
//! `UnprocessableEntityError`, 429 `RateLimitError`, 5xx `InternalServerError`).
//!
//! A [`ServiceError`] from the inference path becomes one through [`status_and_type`], one
//! exhaustive `match`: this is the OpenAI transport's mapping, as `http::error` is the KServe
//! one. It differs from KServe's where OpenAI clients act on the class: a full queue is 429 (the
//! client's retry-with-backoff class), not Triton's 503.

use axum::http::HeaderValue;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use nereid_proto::ServiceError;

/// A failed OpenAI request.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenAiError {
    pub status: StatusCode,
    /// What the user should fix; shown as it is.
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `authentication_error`, ...
    pub kind: &'static str,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `invalid_api_key`), when there is one.
    pub code: Option<&'static str>,
}

impl OpenAiError {
    /// A request field is missing or wrong (400, naming the field).
    pub fn bad_field(param: &str, message: impl Into<String>) -> OpenAiError {
        OpenAiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: None,
        }
    }

    /// The body is not a JSON object (400).
    pub fn bad_body(message: impl Into<String>) -> OpenAiError {
        OpenAiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// No such model, or none that serves this route's kind (404).
    pub fn model_not_found(model: &str) -> OpenAiError {
        OpenAiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model '{model}' does not exist"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// The model exists but does not follow the input/output convention this route needs
    /// (422): e.g. embeddings asked of a generation model.
    pub fn wrong_kind(model: &str, why: impl std::fmt::Display) -> OpenAiError {
        OpenAiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            message: format!("model '{model}' cannot serve this route: {why}"),
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_supported"),
        }
    }

    /// No API key, or not the configured one (401).
    pub fn bad_api_key() -> OpenAiError {
        OpenAiError {
            status: StatusCode::UNAUTHORIZED,
            message: "Incorrect or missing API key: send it as 'Authorization: Bearer <key>'"
                .into(),
            kind: "authentication_error",
            param: None,
            code: Some("invalid_api_key"),
        }
    }

    /// No route under `/v1/` matches (404), or the method is wrong (405).
    pub fn no_route(method: &str, path: &str, status: StatusCode) -> OpenAiError {
        OpenAiError {
            status,
            message: format!("Invalid URL ({method} {path})"),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// The JSON body: `{"error": {...}}`.
    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

/// The status and OpenAI `type` of each inference error class.
pub fn status_and_type(err: &ServiceError) -> (StatusCode, &'static str) {
    match err {
        ServiceError::InvalidArgument(_) => (StatusCode::BAD_REQUEST, "invalid_request_error"),
        ServiceError::NotFound(_) => (StatusCode::NOT_FOUND, "invalid_request_error"),
        ServiceError::Unavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "server_error"),
        // OpenAI clients back off and retry on 429.
        ServiceError::Overloaded(_) => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
        ServiceError::Unsupported(_) => (StatusCode::NOT_IMPLEMENTED, "invalid_request_error"),
        ServiceError::AlreadyExists(_) => (StatusCode::CONFLICT, "invalid_request_error"),
        ServiceError::Cancelled(_) => (StatusCode::BAD_REQUEST, "invalid_request_error"),
        ServiceError::DeadlineExceeded(_) => (StatusCode::GATEWAY_TIMEOUT, "timeout_error"),
        ServiceError::Unauthenticated(_) => (StatusCode::UNAUTHORIZED, "authentication_error"),
        ServiceError::PermissionDenied(_) => (StatusCode::FORBIDDEN, "permission_error"),
        ServiceError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
    }
}

impl From<ServiceError> for OpenAiError {
    fn from(err: ServiceError) -> OpenAiError {
        let (status, kind) = status_and_type(&err);
        OpenAiError {
            status,
            message: err.into_message(),
            kind,
            param: None,
            code: None,
        }
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, self.body().to_string()).into_response();
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_map_to_the_statuses_openai_clients_know() {
        let cases = [
            (ServiceError::InvalidArgument("a".into()), 400),
            (ServiceError::NotFound("b".into()), 404),
            (ServiceError::Unavailable("c".into()), 503),
            (ServiceError::Overloaded("d".into()), 429),
            (ServiceError::Unsupported("e".into()), 501),
            (ServiceError::AlreadyExists("f".into()), 409),
            (ServiceError::Cancelled("g".into()), 400),
            (ServiceError::DeadlineExceeded("i".into()), 504),
            (ServiceError::Internal("h".into()), 500),
            (ServiceError::Unauthenticated("j".into()), 401),
            (ServiceError::PermissionDenied("k".into()), 403),
        ];
        for (err, status) in cases {
            let message = err.message().to_string();
            let e = OpenAiError::from(err);
            assert_eq!(e.status.as_u16(), status);
            assert_eq!(e.body()["error"]["message"], message);
        }
    }

    #[test]
    fn body_has_openai_shape() {
        let body = OpenAiError::bad_field("temperature", "too hot").body();
        assert_eq!(
            body,
            json!({"error": {"message": "too hot", "type": "invalid_request_error",
                             "param": "temperature", "code": null}})
        );
    }
}
