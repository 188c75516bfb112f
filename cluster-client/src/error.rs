//! The client's errors: [`ClientError`] for a configuration that cannot work (checked before
//! anything connects), [`Failure`] for one attempt at one node, [`PassError`] for a call that
//! tried each node once.

use tonic::{Code, Status};

use crate::failover::leader_hint;

/// A client configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// The address list is empty.
    #[error("no control-plane address")]
    NoAddress,
    /// One address cannot be made into a gRPC endpoint.
    #[error("control-plane address '{address}': {reason}")]
    InvalidAddress {
        /// The address as configured.
        address: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The token cannot be sent as the `authorization` header's value.
    #[error("the auth token has characters not allowed in a header")]
    InvalidToken,
}

/// Why one attempt at one node failed.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// No connection could be opened (refused, timed out, name not resolved).
    #[error("cannot connect to {address}: {error}")]
    Unreachable {
        /// The node's address.
        address: String,
        /// The connection error, as text.
        error: String,
    },
    /// The node answered with an error status.
    #[error("{0}")]
    Refused(Status),
}

impl Failure {
    /// The gRPC code: UNAVAILABLE for an unreachable node.
    pub fn code(&self) -> Code {
        match self {
            Failure::Unreachable { .. } => Code::Unavailable,
            Failure::Refused(status) => status.code(),
        }
    }

    /// The leader a refusing node named, if any.
    pub fn leader_hint(&self) -> Option<&str> {
        match self {
            Failure::Unreachable { .. } => None,
            Failure::Refused(status) => leader_hint(status),
        }
    }

    /// As a status (an unreachable node becomes UNAVAILABLE naming it).
    pub fn into_status(self) -> Status {
        match self {
            Failure::Refused(status) => status,
            unreachable @ Failure::Unreachable { .. } => {
                Status::unavailable(unreachable.to_string())
            }
        }
    }
}

/// Why a call that tries each node at most once failed.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// A node answered with a status the caller's policy does not retry elsewhere.
    #[error("{0}")]
    Refused(Status),
    /// Every node was tried.
    #[error("{}", exhausted_message(.answered, .unreachable))]
    Exhausted {
        /// The last refusal that moved the call on, when some node answered at all.
        answered: Option<Status>,
        /// `address: error` of each node no connection could be opened to.
        unreachable: Vec<String>,
        /// The leader some node named (the last one named), listed or not.
        leader: Option<String>,
    },
}

fn exhausted_message(answered: &Option<Status>, unreachable: &[String]) -> String {
    match answered {
        Some(status) => status.message().to_string(),
        None => format!(
            "cannot reach the control plane at {}",
            unreachable.join("; ")
        ),
    }
}

impl PassError {
    /// As a status: the refusal, the last answer, or UNAVAILABLE naming the unreachable nodes.
    pub fn into_status(self) -> Status {
        match self {
            PassError::Refused(status)
            | PassError::Exhausted {
                answered: Some(status),
                ..
            } => status,
            e @ PassError::Exhausted { answered: None, .. } => Status::unavailable(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_nodes_read_as_unavailable() {
        let f = Failure::Unreachable {
            address: "cp:1".into(),
            error: "connection refused".into(),
        };
        assert_eq!(f.code(), Code::Unavailable);
        assert_eq!(f.leader_hint(), None);
        let s = f.into_status();
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(s.message(), "cannot connect to cp:1: connection refused");

        let e = PassError::Exhausted {
            answered: None,
            unreachable: vec!["a:1: refused".into(), "b:2: timed out".into()],
            leader: None,
        };
        assert_eq!(
            e.to_string(),
            "cannot reach the control plane at a:1: refused; b:2: timed out"
        );
        assert_eq!(e.into_status().code(), Code::Unavailable);
        let e = PassError::Exhausted {
            answered: Some(Status::unavailable("no leader")),
            unreachable: vec![],
            leader: None,
        };
        assert_eq!(e.into_status().message(), "no leader");
    }
}
