//! [`ServiceError`] → [`tonic::Status`]: the gRPC side of error classification.
//!
//! Every error a gRPC handler returns passes through the one exhaustive `match` below, so a new
//! error class cannot reach a client without someone choosing its status code. The codes follow
//! Triton's `grpc_utils.cc` table; the message is the error's message, verbatim.

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
            ServiceError::Internal(m) => (Code::Internal, m),
        };
        Status::new(code, message)
    }
}

/// The answer to an rpc this server does not implement yet.
pub(crate) fn unimplemented_rpc(rpc: &str) -> Status {
    ServiceError::unsupported(format!("the {rpc} rpc is not supported by this server yet")).into()
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
        ];
        for (err, code) in cases {
            let message = err.message().to_string();
            let status = Status::from(err);
            assert_eq!(status.code(), code);
            assert_eq!(status.message(), message);
        }
    }

    #[test]
    fn unimplemented_rpc_names_the_rpc() {
        let status = unimplemented_rpc("TraceSetting");
        assert_eq!(status.code(), Code::Unimplemented);
        assert_eq!(
            status.message(),
            "the TraceSetting rpc is not supported by this server yet"
        );
    }
}
