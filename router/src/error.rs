//! [`RouterError`]: every way the router can fail a call, classified once and mapped to the
//! frontends' [`ServiceError`] in one exhaustive `match`.
//!
//! A worker's own error (an invalid input, a model error) comes back as
//! [`RouterError::Worker`] and reaches the client verbatim, so the router answers with the same
//! errors as a worker would.

use nereid_proto::{CorrelationId, ServiceError};

/// A routing or forwarding failure.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouterError {
    /// The model is not registered with the control plane (Triton's words for a model it does
    /// not have, which Triton's clients look for).
    #[error("Request for unknown model: '{model}' is not found")]
    UnknownModel {
        /// The model name as the client gave it.
        model: String,
    },
    /// The model is registered, but the version is not one of its versions.
    #[error("Request for unknown model: '{model}' version {version} is not found")]
    UnknownVersion {
        /// The model name as the client gave it.
        model: String,
        /// The requested version, which the model does not have.
        version: i64,
    },
    /// The router has had no routing table from the control plane since it started, so it
    /// cannot tell an unknown model from one it has not heard of yet.
    #[error(
        "the router has no routing table yet: it has not reached the control plane since it started; retry shortly"
    )]
    NoTable,
    /// The model (version) is registered, but no replica of it is ready right now.
    #[error("{}", no_ready_message(.model, .version))]
    NoReadyReplica {
        /// The model name as the client gave it.
        model: String,
        /// The version asked for; `None` when the request let the model's policy choose.
        version: Option<i64>,
    },
    /// A sequence request other than a start for a sequence this router has not routed.
    #[error(
        "inference request for sequence {} to model '{model}' must specify the START flag on the first request of the sequence",
        sequence_text(.sequence)
    )]
    SequenceNotStarted {
        /// The model name as the client gave it.
        model: String,
        /// The request's `sequence_id`, which has no routed start.
        sequence: CorrelationId,
    },
    /// The replica that holds a sequence's state is gone; the sequence cannot continue.
    #[error(
        "sequence {} of model '{model}' was running on replica {replica}, which is no longer ready; start the sequence again",
        sequence_text(.sequence)
    )]
    SequenceReplicaGone {
        /// The model name as the client gave it.
        model: String,
        /// The request's `sequence_id`.
        sequence: CorrelationId,
        /// The id (in the routing table) of the replica the sequence was pinned to.
        replica: u64,
    },
    /// The router's in-flight limit is reached.
    #[error("the router is at its limit of {limit} in-flight requests; retry later")]
    Overloaded {
        /// The configured maximum of concurrent requests (`max_in_flight`).
        limit: usize,
    },
    /// The request cannot be expressed on the worker protocol.
    #[error("{0}")]
    InvalidRequest(String),
    /// The worker could not be reached, or the connection broke.
    #[error("worker at {addr} is unreachable: {message}")]
    Unreachable {
        /// The worker's gRPC address (`host:port`).
        addr: String,
        /// The transport's description of the failure.
        message: String,
    },
    /// The worker answered with an error: passed to the client as the worker classified it.
    #[error("{error}")]
    Worker {
        /// The worker's gRPC address (`host:port`).
        addr: String,
        /// The worker's error, class and message unchanged.
        error: ServiceError,
    },
    /// The worker's answer does not decode.
    #[error("worker at {addr} sent a malformed answer: {message}")]
    BadResponse {
        /// The worker's gRPC address (`host:port`).
        addr: String,
        /// What is wrong with the answer.
        message: String,
    },
    /// The control plane refused or failed a call the router made for the client (activation,
    /// repository load/unload); its class and message pass through.
    #[error("control plane: {error}")]
    ControlPlane {
        /// The control plane's error, class and message unchanged.
        error: ServiceError,
    },
    /// A model asked for by a request (scale from zero) or a repository load did not get a
    /// ready replica in time.
    #[error("model '{model}' has no ready replica after waiting {waited_ms} ms for one to load{}", reason_suffix(.reason))]
    NotReadyInTime {
        /// The model name as the client gave it.
        model: String,
        /// How long the router waited for a ready replica, in milliseconds.
        waited_ms: u64,
        /// Why the last replica failed, when one did.
        reason: Option<String>,
    },
    /// The operation is not served by the router.
    #[error("{0}")]
    Unsupported(String),
    /// Repository load/unload through the router is off (`--repository-control off`, the
    /// default): the public inference port does not administer the cluster.
    #[error(
        "repository {operation} of model '{model}' through the router is off: manage models with `nereid ctl` or the management API, or start the router with --repository-control caller-credential (the caller's own management token is then required)"
    )]
    RepositoryControlOff {
        /// The model the load/unload named.
        model: String,
        /// `"load"` or `"unload"`, as it appears in the message.
        operation: &'static str,
    },
    /// The client's deadline (`grpc-timeout`) passed before a worker answered, or before the
    /// request could be forwarded. Never retried: the request may have run.
    #[error("model '{model}': the request's deadline passed before a worker answered")]
    DeadlineExceeded {
        /// The model name as the client gave it.
        model: String,
    },
}

fn no_ready_message(model: &str, version: &Option<i64>) -> String {
    match version {
        Some(v) => format!("model '{model}' version {v} has no ready replica in the cluster"),
        None => format!("model '{model}' has no ready replica in the cluster"),
    }
}

fn reason_suffix(reason: &Option<String>) -> String {
    match reason {
        Some(r) => format!(": {r}"),
        None => String::new(),
    }
}

fn sequence_text(id: &CorrelationId) -> String {
    match id {
        CorrelationId::Uint(v) => v.to_string(),
        CorrelationId::String(s) => format!("'{s}'"),
    }
}

impl RouterError {
    /// Whether another replica may succeed where this attempt failed before running the request.
    pub fn retryable(&self) -> bool {
        match self {
            RouterError::Unreachable { .. } => true,
            RouterError::Worker { error, .. } => match error {
                ServiceError::Unavailable(_) | ServiceError::Overloaded(_) => true,
                // The routing table said this worker holds the model: it unloaded it (it was
                // marked down and its replica moved) before the table caught up. The request
                // did not run.
                ServiceError::NotFound(message) => is_unknown_model(message),
                _ => false,
            },
            RouterError::UnknownModel { .. }
            | RouterError::UnknownVersion { .. }
            | RouterError::NoTable
            | RouterError::NoReadyReplica { .. }
            | RouterError::SequenceNotStarted { .. }
            | RouterError::SequenceReplicaGone { .. }
            | RouterError::Overloaded { .. }
            | RouterError::InvalidRequest(_)
            | RouterError::BadResponse { .. }
            | RouterError::Unsupported(_)
            | RouterError::ControlPlane { .. }
            | RouterError::RepositoryControlOff { .. }
            | RouterError::NotReadyInTime { .. }
            | RouterError::DeadlineExceeded { .. } => false,
        }
    }
}

/// Whether a worker's NOT_FOUND is its "unknown model or version" (Triton's words), as opposed
/// to, say, an unknown shared-memory region.
pub fn is_unknown_model(message: &str) -> bool {
    message.starts_with("Request for unknown model: ")
}

impl From<RouterError> for ServiceError {
    fn from(err: RouterError) -> ServiceError {
        let message = err.to_string();
        match err {
            RouterError::UnknownModel { .. } | RouterError::UnknownVersion { .. } => {
                ServiceError::NotFound(message)
            }
            RouterError::ControlPlane { error } => error.prefixed("control plane: "),
            RouterError::NoReadyReplica { .. }
            | RouterError::NoTable
            | RouterError::RepositoryControlOff { .. }
            | RouterError::NotReadyInTime { .. }
            | RouterError::SequenceReplicaGone { .. }
            | RouterError::Unreachable { .. } => ServiceError::Unavailable(message),
            RouterError::SequenceNotStarted { .. } | RouterError::InvalidRequest(_) => {
                ServiceError::InvalidArgument(message)
            }
            RouterError::Overloaded { .. } => ServiceError::Overloaded(message),
            RouterError::Worker { error, .. } => error,
            RouterError::BadResponse { addr, .. } => {
                tracing::warn!(%addr, error = %message, "malformed worker answer");
                ServiceError::Internal(format!(
                    "the worker that served the request sent a malformed answer ({message})"
                ))
            }
            RouterError::Unsupported(_) => ServiceError::Unsupported(message),
            RouterError::DeadlineExceeded { .. } => ServiceError::DeadlineExceeded(message),
        }
    }
}

/// The result of a router operation: a value, or the [`RouterError`] that failed it.
pub type RouterResult<T> = Result<T, RouterError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_map_to_service_errors() {
        let e: ServiceError = RouterError::NoReadyReplica {
            model: "m".into(),
            version: Some(2),
        }
        .into();
        assert_eq!(
            e,
            ServiceError::Unavailable(
                "model 'm' version 2 has no ready replica in the cluster".into()
            )
        );
        let e: ServiceError = RouterError::Overloaded { limit: 4 }.into();
        assert!(matches!(e, ServiceError::Overloaded(_)));
        let e: ServiceError = RouterError::UnknownModel { model: "x".into() }.into();
        assert_eq!(
            e,
            ServiceError::NotFound("Request for unknown model: 'x' is not found".into())
        );
        let e: ServiceError = RouterError::NoTable.into();
        assert!(
            matches!(&e, ServiceError::Unavailable(m) if m.contains("no routing table")),
            "{e:?}"
        );
        let worker = ServiceError::invalid("input 'x': bad");
        let e: ServiceError = RouterError::Worker {
            addr: "a".into(),
            error: worker.clone(),
        }
        .into();
        assert_eq!(e, worker);
        let e: ServiceError = RouterError::SequenceNotStarted {
            model: "m".into(),
            sequence: CorrelationId::String("s".into()),
        }
        .into();
        assert!(
            e.message()
                .contains("sequence 's' to model 'm' must specify the START flag")
        );
    }

    #[test]
    fn only_failures_before_execution_retry() {
        let unreachable = RouterError::Unreachable {
            addr: "a".into(),
            message: "refused".into(),
        };
        assert!(unreachable.retryable());
        let busy = RouterError::Worker {
            addr: "a".into(),
            error: ServiceError::Overloaded("full".into()),
        };
        assert!(busy.retryable());
        let invalid = RouterError::Worker {
            addr: "a".into(),
            error: ServiceError::invalid("bad"),
        };
        assert!(!invalid.retryable());
        let unloaded = RouterError::Worker {
            addr: "a".into(),
            error: ServiceError::NotFound(
                "Request for unknown model: 'm' version 1 is not found".into(),
            ),
        };
        assert!(unloaded.retryable(), "a replica the worker no longer has");
        let other_not_found = RouterError::Worker {
            addr: "a".into(),
            error: ServiceError::NotFound("Unable to find shared memory region 'r'".into()),
        };
        assert!(!other_not_found.retryable());
        let late = RouterError::DeadlineExceeded { model: "m".into() };
        assert!(!late.retryable());
        assert_eq!(
            ServiceError::from(late),
            ServiceError::DeadlineExceeded(
                "model 'm': the request's deadline passed before a worker answered".into()
            )
        );
    }
}
