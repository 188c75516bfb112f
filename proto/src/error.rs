//! [`ServiceError`]: the one error type that crosses the [`crate::InferenceService`] boundary.
//!
//! Errors are classified once, where they arise, by what the client should do about them. Each
//! transport maps the class exhaustively: HTTP in `nereid_frontend`'s `http::error`, gRPC in
//! the codec (`codec::status`, both ways). Messages are shown to the client verbatim, so they name the model,
//! tensor and field and say what is wrong.

/// A failed call, classified like Triton's `TRITONSERVER_Error` codes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServiceError {
    /// The request is malformed or does not fit the model (HTTP 400, gRPC INVALID_ARGUMENT).
    #[error("{0}")]
    InvalidArgument(String),
    /// Unknown model, version or route (HTTP 404, gRPC NOT_FOUND).
    #[error("{0}")]
    NotFound(String),
    /// Not possible right now: model not ready, server shutting down, operation refused in this
    /// mode (HTTP 503, gRPC UNAVAILABLE).
    #[error("{0}")]
    Unavailable(String),
    /// A queue or limit is full; retry later (HTTP 503, gRPC UNAVAILABLE, like Triton).
    #[error("{0}")]
    Overloaded(String),
    /// Recognised but not supported by this server or for this model (HTTP 501, gRPC UNIMPLEMENTED).
    #[error("{0}")]
    Unsupported(String),
    /// Already exists (HTTP 400, gRPC ALREADY_EXISTS).
    #[error("{0}")]
    AlreadyExists(String),
    /// The request was cancelled (HTTP 400, gRPC CANCELLED).
    #[error("{0}")]
    Cancelled(String),
    /// The client's deadline passed before the answer came (HTTP 504, gRPC DEADLINE_EXCEEDED).
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The caller gave no credential, or one that is not valid, for an operation that needs
    /// one (HTTP 401, gRPC UNAUTHENTICATED).
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller's credential is valid but does not allow the operation (HTTP 403, gRPC
    /// PERMISSION_DENIED).
    #[error("{0}")]
    PermissionDenied(String),
    /// A failure inside the server or the backend (HTTP 500, gRPC INTERNAL).
    #[error("{0}")]
    Internal(String),
}

impl ServiceError {
    /// A [`ServiceError::InvalidArgument`] with `msg`.
    pub fn invalid(msg: impl Into<String>) -> Self {
        ServiceError::InvalidArgument(msg.into())
    }

    /// A [`ServiceError::NotFound`] with `msg`.
    pub fn not_found(msg: impl Into<String>) -> Self {
        ServiceError::NotFound(msg.into())
    }

    /// A [`ServiceError::Unavailable`] with `msg`.
    pub fn unavailable(msg: impl Into<String>) -> Self {
        ServiceError::Unavailable(msg.into())
    }

    /// A [`ServiceError::Unsupported`] with `msg`.
    pub fn unsupported(msg: impl Into<String>) -> Self {
        ServiceError::Unsupported(msg.into())
    }

    /// A [`ServiceError::Internal`] with `msg`.
    pub fn internal(msg: impl Into<String>) -> Self {
        ServiceError::Internal(msg.into())
    }

    /// The message shown to the client.
    pub fn message(&self) -> &str {
        match self {
            ServiceError::InvalidArgument(m)
            | ServiceError::NotFound(m)
            | ServiceError::Unavailable(m)
            | ServiceError::Overloaded(m)
            | ServiceError::Unsupported(m)
            | ServiceError::AlreadyExists(m)
            | ServiceError::Cancelled(m)
            | ServiceError::DeadlineExceeded(m)
            | ServiceError::Unauthenticated(m)
            | ServiceError::PermissionDenied(m)
            | ServiceError::Internal(m) => m,
        }
    }

    /// The message, by value.
    pub fn into_message(self) -> String {
        self.split().1
    }

    /// The same class with a prefix on the message (e.g. Triton's `[request id: x] `).
    pub fn prefixed(self, prefix: &str) -> Self {
        let (class, message) = self.split();
        class(format!("{prefix}{message}"))
    }

    /// The class (as a constructor) and the message.
    fn split(self) -> (fn(String) -> ServiceError, String) {
        match self {
            ServiceError::InvalidArgument(m) => (ServiceError::InvalidArgument, m),
            ServiceError::NotFound(m) => (ServiceError::NotFound, m),
            ServiceError::Unavailable(m) => (ServiceError::Unavailable, m),
            ServiceError::Overloaded(m) => (ServiceError::Overloaded, m),
            ServiceError::Unsupported(m) => (ServiceError::Unsupported, m),
            ServiceError::AlreadyExists(m) => (ServiceError::AlreadyExists, m),
            ServiceError::Cancelled(m) => (ServiceError::Cancelled, m),
            ServiceError::DeadlineExceeded(m) => (ServiceError::DeadlineExceeded, m),
            ServiceError::Unauthenticated(m) => (ServiceError::Unauthenticated, m),
            ServiceError::PermissionDenied(m) => (ServiceError::PermissionDenied, m),
            ServiceError::Internal(m) => (ServiceError::Internal, m),
        }
    }
}

/// What every [`InferenceService`](crate::InferenceService) call returns.
pub type ServiceResult<T> = Result<T, ServiceError>;
