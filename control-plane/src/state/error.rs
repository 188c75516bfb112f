//! Why a command was refused. Classified once, here, by meaning: the management API maps
//! [`StateError::NotFound`] to 404 / `NOT_FOUND`, [`StateError::Conflict`] to 409 /
//! `FAILED_PRECONDITION` and [`StateError::Invalid`] to 400 / `INVALID_ARGUMENT`.
//!
//! A refused command changes nothing, not even the revision, so every replica of the log
//! refuses it the same way and stays identical.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Which kind of object a [`StateError::NotFound`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EntityKind {
    Model,
    Node,
    Replica,
}

impl fmt::Display for EntityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EntityKind::Model => "model",
            EntityKind::Node => "node",
            EntityKind::Replica => "replica",
        })
    }
}

/// A command the state machine refused. Messages name the object and the field so an
/// operator knows what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum StateError {
    /// The command names a model, node or replica that does not exist.
    #[error("{kind} '{name}' not found")]
    NotFound { kind: EntityKind, name: String },
    /// The command is well formed but contradicts the current state (a drained node, a
    /// duplicate replica, an illegal replica state transition).
    #[error("{0}")]
    Conflict(String),
    /// The command itself is malformed, whatever the state.
    /// `subject` names the object (`model 'x'`), `field` the offending field.
    #[error("{subject}: {field} {reason}")]
    Invalid {
        subject: String,
        field: String,
        reason: String,
    },
}

impl StateError {
    pub(crate) fn not_found(kind: EntityKind, name: impl fmt::Display) -> Self {
        StateError::NotFound {
            kind,
            name: name.to_string(),
        }
    }

    pub(crate) fn invalid(
        subject: impl Into<String>,
        field: impl Into<String>,
        reason: impl Into<String>,
    ) -> Self {
        StateError::Invalid {
            subject: subject.into(),
            field: field.into(),
            reason: reason.into(),
        }
    }
}
