//! [`ServiceError`] ⇄ [`tonic::Status`]: the gRPC side of error classification, both ways.
//!
//! Every error a gRPC handler returns passes through the one exhaustive `match` of
//! `From<ServiceError> for Status`, so a new error class cannot reach a client without someone
//! choosing its status code. The codes follow Triton's `grpc_utils.cc` table; the message is the
//! error's message, verbatim. `From<Status> for ServiceError` reads a server's answer back into
//! its class (the router does this for a worker's and the control plane's answers), so an error
//! crosses a hop with its class and message intact:
//!
//! ```text
//! ServiceError ──► (Code, message) ──► wire ──► (Code, message) ──► ServiceError
//!   Overloaded ──► UNAVAILABLE (Triton's code; clients retry) ──► Unavailable
//! ```

use tonic::{Code, Status};

use crate::error::ServiceError;

impl From<ServiceError> for Status {
    fn from(err: ServiceError) -> Status {
        let (code, message) = match err {
            ServiceError::InvalidArgument(m) => (Code::InvalidArgument, m),
            ServiceError::NotFound(m) => (Code::NotFound, m),
            ServiceError::Unavailable(m) => (Code::Unavailable, m),
            // Triton reports a full queue as UNAVAILABLE, and clients retry on it.
            ServiceError::Overloaded(m) => (Code::Unavailable, m),
            ServiceError::Unsupported(m) => (Code::Unimplemented, m),
            ServiceError::AlreadyExists(m) => (Code::AlreadyExists, m),
            ServiceError::Cancelled(m) => (Code::Cancelled, m),
            ServiceError::DeadlineExceeded(m) => (Code::DeadlineExceeded, m),
            ServiceError::Unauthenticated(m) => (Code::Unauthenticated, m),
            ServiceError::PermissionDenied(m) => (Code::PermissionDenied, m),
            ServiceError::Internal(m) => (Code::Internal, m),
        };
        Status::new(code, message)
    }
}

/// The error class of a gRPC answer (a worker's or the control plane's), keeping its message.
impl From<Status> for ServiceError {
    fn from(status: Status) -> ServiceError {
        let message = status.message().to_string();
        match status.code() {
            Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
                ServiceError::InvalidArgument(message)
            }
            Code::NotFound => ServiceError::NotFound(message),
            Code::Unavailable => ServiceError::Unavailable(message),
            Code::ResourceExhausted => ServiceError::Overloaded(message),
            Code::Unimplemented => ServiceError::Unsupported(message),
            Code::AlreadyExists => ServiceError::AlreadyExists(message),
            Code::Cancelled => ServiceError::Cancelled(message),
            Code::DeadlineExceeded => ServiceError::DeadlineExceeded(message),
            Code::Aborted => ServiceError::Unavailable(message),
            Code::Unauthenticated => ServiceError::Unauthenticated(message),
            Code::PermissionDenied => ServiceError::PermissionDenied(message),
            Code::Ok | Code::Unknown | Code::Internal | Code::DataLoss => {
                ServiceError::Internal(message)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_class_maps_to_its_triton_code() {
        let cases = [
            (
                ServiceError::InvalidArgument("a".into()),
                Code::InvalidArgument,
            ),
            (ServiceError::NotFound("b".into()), Code::NotFound),
            (ServiceError::Unavailable("c".into()), Code::Unavailable),
            (ServiceError::Overloaded("d".into()), Code::Unavailable),
            (ServiceError::Unsupported("e".into()), Code::Unimplemented),
            (ServiceError::AlreadyExists("f".into()), Code::AlreadyExists),
            (ServiceError::Cancelled("g".into()), Code::Cancelled),
            (
                ServiceError::DeadlineExceeded("i".into()),
                Code::DeadlineExceeded,
            ),
            (ServiceError::Internal("h".into()), Code::Internal),
            (
                ServiceError::Unauthenticated("j".into()),
                Code::Unauthenticated,
            ),
            (
                ServiceError::PermissionDenied("k".into()),
                Code::PermissionDenied,
            ),
        ];
        for (err, code) in cases {
            let message = err.message().to_string();
            let status = Status::from(err);
            assert_eq!(status.code(), code);
            assert_eq!(status.message(), message);
        }
    }

    #[test]
    fn every_class_but_overloaded_survives_a_hop() {
        for err in [
            ServiceError::InvalidArgument("a".into()),
            ServiceError::NotFound("b".into()),
            ServiceError::Unavailable("c".into()),
            ServiceError::Unsupported("e".into()),
            ServiceError::AlreadyExists("f".into()),
            ServiceError::Cancelled("g".into()),
            ServiceError::DeadlineExceeded("i".into()),
            ServiceError::Internal("h".into()),
            ServiceError::Unauthenticated("j".into()),
            ServiceError::PermissionDenied("k".into()),
        ] {
            assert_eq!(ServiceError::from(Status::from(err.clone())), err);
        }
        assert_eq!(
            ServiceError::from(Status::from(ServiceError::Overloaded("d".into()))),
            ServiceError::Unavailable("d".into())
        );
        assert_eq!(
            ServiceError::from(Status::resource_exhausted("full")),
            ServiceError::Overloaded("full".into())
        );
        assert_eq!(
            ServiceError::from(Status::data_loss("no")),
            ServiceError::Internal("no".into())
        );
    }
}
