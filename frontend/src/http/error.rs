//! [`ServiceError`] → HTTP status, and the JSON error body every failed request gets.
//!
//! Every error an HTTP handler returns passes through [`status_of`], one exhaustive `match`, so a
//! new error class cannot reach a client without someone choosing its status. The statuses
//! follow Triton's `HttpCodeFromError`. Routing failures (404 unknown path, 405 wrong method) are
//! HTTP-only and built directly. The body is always `{"error":"<message>"}` with
//! `Content-Type: application/json`, the form `tritonclient` reads into its exception.

use axum::http::header::{ALLOW, CONTENT_TYPE};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use nereid_proto::ServiceError;

/// The HTTP status Triton answers for each error class.
pub fn status_of(err: &ServiceError) -> StatusCode {
    match err {
        ServiceError::InvalidArgument(_) => StatusCode::BAD_REQUEST,
        ServiceError::NotFound(_) => StatusCode::NOT_FOUND,
        ServiceError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        // Triton reports a full queue as UNAVAILABLE (503); clients retry on it.
        ServiceError::Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
        ServiceError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
        ServiceError::AlreadyExists(_) => StatusCode::BAD_REQUEST,
        ServiceError::Cancelled(_) => StatusCode::BAD_REQUEST,
        ServiceError::DeadlineExceeded(_) => StatusCode::GATEWAY_TIMEOUT,
        ServiceError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
        ServiceError::PermissionDenied(_) => StatusCode::FORBIDDEN,
        ServiceError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A failed HTTP request: status, message, and the odd extra header some errors carry
/// (`Allow` on 405, `Accept-Encoding` on an unsupported `Content-Encoding`).
#[derive(Debug)]
pub struct HttpError {
    status: StatusCode,
    message: String,
    header: Option<(HeaderName, HeaderValue)>,
}

impl HttpError {
    /// No route matches the path.
    pub fn not_found() -> HttpError {
        HttpError {
            status: StatusCode::NOT_FOUND,
            message: "Not Found".into(),
            header: None,
        }
    }

    /// The path is known but not for this method; `allow` lists the methods it takes.
    pub fn method_not_allowed(allow: &'static str) -> HttpError {
        HttpError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            message: "Method Not Allowed".into(),
            header: Some((ALLOW, HeaderValue::from_static(allow))),
        }
    }

    /// The same error with one more response header.
    pub fn with_header(mut self, name: HeaderName, value: &'static str) -> HttpError {
        self.header = Some((name, HeaderValue::from_static(value)));
        self
    }

    /// The status and message, for a frontend that writes its own error body (the OpenAI
    /// routes).
    pub(crate) fn into_parts(self) -> (StatusCode, String) {
        (self.status, self.message)
    }

    /// The HTTP status the error is answered with.
    #[cfg(test)]
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The error text put in the response body's `error` field.
    #[cfg(test)]
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<ServiceError> for HttpError {
    fn from(err: ServiceError) -> HttpError {
        let status = status_of(&err);
        let message = err.into_message();
        HttpError {
            status,
            message,
            header: None,
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "error": self.message }).to_string();
        let mut response = (self.status, body).into_response();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some((name, value)) = self.header {
            headers.insert(name, value);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_maps_to_triton_status() {
        let cases = [
            (ServiceError::InvalidArgument("a".into()), 400),
            (ServiceError::NotFound("b".into()), 404),
            (ServiceError::Unavailable("c".into()), 503),
            (ServiceError::Overloaded("d".into()), 503),
            (ServiceError::Unsupported("e".into()), 501),
            (ServiceError::AlreadyExists("f".into()), 400),
            (ServiceError::Cancelled("g".into()), 400),
            (ServiceError::DeadlineExceeded("i".into()), 504),
            (ServiceError::Internal("h".into()), 500),
            (ServiceError::Unauthenticated("j".into()), 401),
            (ServiceError::PermissionDenied("k".into()), 403),
        ];
        for (err, status) in cases {
            let message = err.message().to_string();
            let http = HttpError::from(err);
            assert_eq!(http.status().as_u16(), status);
            assert_eq!(http.message(), message);
        }
    }

    #[test]
    fn error_response_is_json_with_extra_header() {
        let response = HttpError::method_not_allowed("GET").into_response();
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(response.headers()[CONTENT_TYPE], "application/json");
        assert_eq!(response.headers()[ALLOW], "GET");
    }
}
