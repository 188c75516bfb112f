//! Why a management request failed, once, by meaning; and the one mapping of that meaning to
//! each transport: [`tonic::Status`] for gRPC and an HTTP status with a `{"error": "..."}` body
//! for the REST mirror.
//!
//! | ApiError                | gRPC                | HTTP |
//! |-------------------------|---------------------|------|
//! | `NotFound`              | NOT_FOUND           | 404  |
//! | `Conflict`              | FAILED_PRECONDITION | 409  |
//! | `Invalid`               | INVALID_ARGUMENT    | 400  |
//! | `NotLeader`, `NoLeader` | UNAVAILABLE         | 503  |
//! | `Unavailable`           | UNAVAILABLE         | 503  |
//! | `Unauthenticated`       | UNAUTHENTICATED     | 401  |
//! | `PermissionDenied`      | PERMISSION_DENIED   | 403  |
//! | `Internal`              | INTERNAL            | 500  |
//! | `Relayed` (the leader's answer to a forwarded read) | its code | as above |
//!
//! `NotLeader` names the leader in the message and, when its address is known, in the
//! `x-nereid-leader` metadata / header, so a client can retry there.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode};

use crate::consensus::ConsensusError;
use crate::state::StateError;

/// gRPC metadata key and HTTP header naming the leader's address on `NotLeader`.
pub const LEADER_HEADER: &str = "x-nereid-leader";

/// A failed management request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// This node cannot serve the request and cannot forward it; retry at the leader.
    #[error("{}", not_leader(.leader_id, .leader_address))]
    NotLeader {
        leader_id: Option<u64>,
        leader_address: Option<String>,
    },
    #[error("no control-plane leader is available: {0}; retry shortly")]
    NoLeader(String),
    /// The named model, node or replica does not exist; the message names it.
    #[error("{0}")]
    NotFound(String),
    /// Well formed, but contradicts the current state.
    #[error("{0}")]
    Conflict(String),
    /// The request is malformed: `field` names what to fix.
    #[error("invalid {field}: {reason}")]
    Invalid { field: String, reason: String },
    /// Missing or wrong token; the message says which header is expected.
    #[error("{0}")]
    Unauthenticated(String),
    /// A known token whose role does not allow the operation; the message names both.
    #[error("{0}")]
    PermissionDenied(String),
    #[error("control plane unavailable: {0}")]
    Unavailable(String),
    /// No node can take what was asked for (a model's replica: no memory, nothing to evict);
    /// the message says why. A capacity problem, not an outage: the router answers 503.
    #[error("{0}")]
    NoCapacity(String),
    #[error("internal error: {0}")]
    Internal(String),
    /// The leader's own answer to a call this node forwarded, passed on as it came.
    #[error("{message}")]
    Relayed { code: tonic::Code, message: String },
}

impl From<tonic::Status> for ApiError {
    fn from(status: tonic::Status) -> Self {
        ApiError::Relayed {
            code: status.code(),
            message: status.message().to_string(),
        }
    }
}

fn not_leader(leader_id: &Option<u64>, leader_address: &Option<String>) -> String {
    ConsensusError::NotLeader {
        leader_id: *leader_id,
        leader_address: leader_address.clone(),
    }
    .to_string()
}

impl ApiError {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ApiError::Invalid {
            field: field.into(),
            reason: reason.into(),
        }
    }

    fn leader_address(&self) -> Option<&str> {
        match self {
            ApiError::NotLeader {
                leader_address: Some(addr),
                ..
            } => Some(addr),
            _ => None,
        }
    }
}

impl From<StateError> for ApiError {
    fn from(e: StateError) -> Self {
        match e {
            StateError::NotFound { .. } => ApiError::NotFound(e.to_string()),
            StateError::Conflict(msg) => ApiError::Conflict(msg),
            StateError::Invalid {
                subject,
                field,
                reason,
            } => ApiError::Invalid {
                field,
                reason: format!("{reason} ({subject})"),
            },
        }
    }
}

impl From<ConsensusError> for ApiError {
    fn from(e: ConsensusError) -> Self {
        match e {
            ConsensusError::NotLeader {
                leader_id,
                leader_address,
            } => ApiError::NotLeader {
                leader_id,
                leader_address,
            },
            ConsensusError::NoLeader(msg) => ApiError::NoLeader(msg),
            ConsensusError::Rejected(e) => e.into(),
            ConsensusError::InvalidMembership(msg) => {
                ApiError::Conflict(format!("invalid membership change: {msg}"))
            }
            ConsensusError::Unavailable(msg) => ApiError::Unavailable(msg),
        }
    }
}

/// The gRPC mapping.
impl From<ApiError> for tonic::Status {
    fn from(e: ApiError) -> Self {
        let message = e.to_string();
        let mut status = match &e {
            ApiError::NotFound(_) => tonic::Status::not_found(message),
            ApiError::Conflict(_) => tonic::Status::failed_precondition(message),
            ApiError::Invalid { .. } => tonic::Status::invalid_argument(message),
            ApiError::NotLeader { .. } | ApiError::NoLeader(_) | ApiError::Unavailable(_) => {
                tonic::Status::unavailable(message)
            }
            ApiError::NoCapacity(_) => tonic::Status::resource_exhausted(message),
            ApiError::Unauthenticated(_) => tonic::Status::unauthenticated(message),
            ApiError::PermissionDenied(_) => tonic::Status::permission_denied(message),
            ApiError::Internal(_) => tonic::Status::internal(message),
            ApiError::Relayed { code, .. } => tonic::Status::new(*code, message),
        };
        if let Some(addr) = e.leader_address()
            && let Ok(value) = addr.parse()
        {
            status.metadata_mut().insert(LEADER_HEADER, value);
        }
        status
    }
}

/// The HTTP mapping: status code and `{"error": "<message>"}`.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = match &self {
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::Invalid { .. } => StatusCode::BAD_REQUEST,
            ApiError::NotLeader { .. } | ApiError::NoLeader(_) | ApiError::Unavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::NoCapacity(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            ApiError::PermissionDenied(_) => StatusCode::FORBIDDEN,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Relayed { code, .. } => http_status_of(*code),
        };
        let body = Json(serde_json::json!({ "error": self.to_string() }));
        let mut response = (code, body).into_response();
        let headers = response.headers_mut();
        if let Some(addr) = self.leader_address()
            && let Ok(value) = HeaderValue::from_str(addr)
        {
            headers.insert(LEADER_HEADER, value);
        }
        if code == StatusCode::UNAUTHORIZED {
            headers.insert(
                http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
        }
        response
    }
}

/// The HTTP status of a relayed gRPC code, matching the table above.
fn http_status_of(code: tonic::Code) -> StatusCode {
    use tonic::Code;
    match code {
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::FailedPrecondition | Code::AlreadyExists => StatusCode::CONFLICT,
        Code::InvalidArgument => StatusCode::BAD_REQUEST,
        Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        // The management API never relays these by design; a leader that sends one hit a fault.
        Code::Ok
        | Code::Cancelled
        | Code::Unknown
        | Code::OutOfRange
        | Code::Aborted
        | Code::Unimplemented
        | Code::Internal
        | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::EntityKind;

    #[test]
    fn a_relayed_answer_keeps_its_code_on_both_transports() {
        let e = ApiError::from(tonic::Status::not_found("node 'x' not found"));
        assert_eq!(e.to_string(), "node 'x' not found");
        assert_eq!(tonic::Status::from(e.clone()).code(), tonic::Code::NotFound);
        assert_eq!(e.into_response().status(), StatusCode::NOT_FOUND);
        let e = ApiError::from(tonic::Status::unavailable("no leader"));
        assert_eq!(e.into_response().status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn every_relayed_code_has_an_http_status() {
        use tonic::Code;
        let expected = [
            (Code::NotFound, StatusCode::NOT_FOUND),
            (Code::FailedPrecondition, StatusCode::CONFLICT),
            (Code::AlreadyExists, StatusCode::CONFLICT),
            (Code::InvalidArgument, StatusCode::BAD_REQUEST),
            (Code::Unavailable, StatusCode::SERVICE_UNAVAILABLE),
            (Code::DeadlineExceeded, StatusCode::SERVICE_UNAVAILABLE),
            (Code::Unauthenticated, StatusCode::UNAUTHORIZED),
            (Code::Internal, StatusCode::INTERNAL_SERVER_ERROR),
            (Code::PermissionDenied, StatusCode::FORBIDDEN),
            (Code::Unknown, StatusCode::INTERNAL_SERVER_ERROR),
        ];
        for (code, status) in expected {
            assert_eq!(http_status_of(code), status, "{code:?}");
        }
    }

    #[test]
    fn state_errors_keep_their_meaning() {
        let e: ApiError = StateError::NotFound {
            kind: EntityKind::Model,
            name: "m".into(),
        }
        .into();
        assert_eq!(e, ApiError::NotFound("model 'm' not found".into()));
        let s = tonic::Status::from(e);
        assert_eq!(s.code(), tonic::Code::NotFound);

        let e: ApiError = ConsensusError::Rejected(StateError::Invalid {
            subject: "model 'm'".into(),
            field: "version_policy".into(),
            reason: "latest 0 serves nothing".into(),
        })
        .into();
        let s = tonic::Status::from(e.clone());
        assert_eq!(s.code(), tonic::Code::InvalidArgument);
        assert!(s.message().contains("version_policy"), "{}", s.message());
        assert_eq!(e.into_response().status(), StatusCode::BAD_REQUEST);

        let e: ApiError = StateError::Conflict("drained".into()).into();
        assert_eq!(
            tonic::Status::from(e.clone()).code(),
            tonic::Code::FailedPrecondition
        );
        assert_eq!(e.into_response().status(), StatusCode::CONFLICT);
    }

    #[test]
    fn not_leader_names_the_leader() {
        let e: ApiError = ConsensusError::NotLeader {
            leader_id: Some(2),
            leader_address: Some("cp-2:7000".into()),
        }
        .into();
        let s = tonic::Status::from(e.clone());
        assert_eq!(s.code(), tonic::Code::Unavailable);
        assert!(s.message().contains("cp-2:7000"), "{}", s.message());
        assert_eq!(s.metadata().get(LEADER_HEADER).unwrap(), "cp-2:7000");
        let r = e.into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[LEADER_HEADER], "cp-2:7000");

        let e: ApiError = ConsensusError::NoLeader("election".into()).into();
        assert_eq!(tonic::Status::from(e).code(), tonic::Code::Unavailable);
    }

    #[test]
    fn permission_denied_is_403_on_both_transports() {
        let e = ApiError::PermissionDenied("token 'r' has role read-only".into());
        let s = tonic::Status::from(e.clone());
        assert_eq!(s.code(), tonic::Code::PermissionDenied);
        assert_eq!(s.message(), "token 'r' has role read-only");
        assert_eq!(e.into_response().status(), StatusCode::FORBIDDEN);
    }

    #[test]
    fn unauthenticated_asks_for_a_bearer_token() {
        let e = ApiError::Unauthenticated("missing".into());
        assert_eq!(
            tonic::Status::from(e.clone()).code(),
            tonic::Code::Unauthenticated
        );
        let r = e.into_response();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(r.headers()[http::header::WWW_AUTHENTICATE], "Bearer");
    }
}
