//! Admin token authentication for the management API, gRPC and REST alike.
//!
//! ```text
//!  request ─► authorization: Bearer <token> ─► AuthToken::check ─┬─ ok: the handler runs
//!                                                                └─ 401 / UNAUTHENTICATED
//! ```
//!
//! The token comes from a file (its trimmed contents) or a value; [`AuthToken::disabled`]
//! turns the check off and exists only for an operator who asks for it explicitly. Tokens are
//! compared in constant time and never echoed, logged or printed by `Debug`.
//!
//! gRPC: `ManagementServer::with_interceptor(service, token)` ([`AuthToken`] is a tonic
//! [`Interceptor`]). REST: [`crate::api::rest::router`] wraps every route in [`require_token`].

use std::path::Path;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tonic::service::Interceptor;

use super::error::ApiError;

/// The header carrying the admin token, as `Bearer <token>`.
pub const AUTH_HEADER: &str = "authorization";

/// The admin token; `None` when authentication is disabled.
#[derive(Clone)]
pub struct AuthToken(Option<Arc<str>>);

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            Some(_) => f.write_str("AuthToken(<redacted>)"),
            None => f.write_str("AuthToken(disabled)"),
        }
    }
}

/// Why a token could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum AuthTokenError {
    #[error("cannot read the admin token file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the admin token {0} is empty; put a secret in it or disable auth explicitly")]
    Empty(String),
    #[error("the admin token {0} contains whitespace or control characters inside it")]
    Malformed(String),
}

impl AuthToken {
    /// No authentication: every request passes. Only for an explicit operator choice.
    pub fn disabled() -> Self {
        AuthToken(None)
    }

    /// A token given as a value; surrounding whitespace is trimmed.
    pub fn from_value(value: &str) -> Result<Self, AuthTokenError> {
        Self::parse(value, "value".to_string())
    }

    /// The trimmed contents of a file (a trailing newline is fine).
    pub fn from_file(path: &Path) -> Result<Self, AuthTokenError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthTokenError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, format!("in file {}", path.display()))
    }

    fn parse(text: &str, what: String) -> Result<Self, AuthTokenError> {
        let token = text.trim();
        if token.is_empty() {
            return Err(AuthTokenError::Empty(what));
        }
        if token.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(AuthTokenError::Malformed(what));
        }
        Ok(AuthToken(Some(token.into())))
    }

    pub fn is_enabled(&self) -> bool {
        self.0.is_some()
    }

    /// Checks the value of an `authorization` header (absent: `None`).
    pub fn check(&self, header: Option<&[u8]>) -> Result<(), ApiError> {
        let Some(expected) = &self.0 else {
            return Ok(());
        };
        let Some(header) = header else {
            return Err(ApiError::Unauthenticated(
                "missing admin token: send the header 'authorization: Bearer <token>'".into(),
            ));
        };
        let presented = match header.split_first_chunk::<7>() {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case(b"bearer ") => rest.trim_ascii(),
            _ => {
                return Err(ApiError::Unauthenticated(
                    "the authorization header must have the form 'Bearer <token>'".into(),
                ));
            }
        };
        if constant_time_eq(presented, expected.as_bytes()) {
            Ok(())
        } else {
            Err(ApiError::Unauthenticated(
                "invalid admin token in the 'authorization: Bearer <token>' header".into(),
            ))
        }
    }
}

/// Compares without an early exit, so the time taken says nothing about where the inputs
/// differ (only, at most, that their lengths do).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        let y = if b.is_empty() { 0 } else { b[i % b.len()] };
        diff |= x ^ y;
    }
    diff == 0
}

/// gRPC: checks the `authorization` metadata of every call.
impl Interceptor for AuthToken {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let header = request.metadata().get(AUTH_HEADER).map(|v| v.as_bytes());
        self.check(header)?;
        Ok(request)
    }
}

/// REST: an axum middleware (`axum::middleware::from_fn_with_state(token, require_token)`).
pub async fn require_token(
    State(token): State<AuthToken>,
    request: Request,
    next: Next,
) -> Response {
    let header = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    match token.check(header) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unauthenticated(r: Result<(), ApiError>) -> String {
        match r {
            Err(ApiError::Unauthenticated(msg)) => msg,
            other => panic!("expected Unauthenticated, got {other:?}"),
        }
    }

    #[test]
    fn checks_bearer_tokens() {
        let t = AuthToken::from_value(" s3cret\n").unwrap();
        assert!(t.check(Some(b"Bearer s3cret")).is_ok());
        assert!(t.check(Some(b"bearer s3cret")).is_ok());
        let msg = unauthenticated(t.check(None));
        assert!(msg.contains("authorization: Bearer <token>"), "{msg}");
        let msg = unauthenticated(t.check(Some(b"Basic abc")));
        assert!(msg.contains("Bearer <token>"), "{msg}");
        for wrong in [
            &b"Bearer s3cre"[..],
            b"Bearer s3cret2",
            b"Bearer ",
            b"Bearer S3CRET",
        ] {
            let msg = unauthenticated(t.check(Some(wrong)));
            assert!(!msg.contains("s3cret"), "token echoed: {msg}");
        }
        assert!(!format!("{t:?}").contains("s3cret"));
    }

    #[test]
    fn disabled_lets_everything_through() {
        let t = AuthToken::disabled();
        assert!(!t.is_enabled());
        assert!(t.check(None).is_ok());
    }

    #[test]
    fn loads_from_files_and_refuses_empty_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "abc123\n").unwrap();
        let t = AuthToken::from_file(&path).unwrap();
        assert!(t.check(Some(b"Bearer abc123")).is_ok());
        std::fs::write(&path, "  \n").unwrap();
        assert!(matches!(
            AuthToken::from_file(&path),
            Err(AuthTokenError::Empty(_))
        ));
        assert!(matches!(
            AuthToken::from_file(&dir.path().join("absent")),
            Err(AuthTokenError::Read { .. })
        ));
        assert!(matches!(
            AuthToken::from_value("a b"),
            Err(AuthTokenError::Malformed(_))
        ));
    }

    #[test]
    fn constant_time_eq_is_equality() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcabc"));
        assert!(!constant_time_eq(b"abcabc", b"abc"));
        assert!(!constant_time_eq(b"", b"abc"));
        assert!(!constant_time_eq(b"abc", b""));
        assert!(constant_time_eq(b"", b""));
    }
}
