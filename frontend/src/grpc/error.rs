//! gRPC errors of the frontend itself. Every [`ServiceError`] a handler returns becomes a
//! [`tonic::Status`] through the codec's one exhaustive `match` (`nereid_proto::codec`).

use tonic::Status;

use nereid_proto::ServiceError;

/// The answer to an rpc this server does not implement yet.
pub(crate) fn unimplemented_rpc(rpc: &str) -> Status {
    ServiceError::unsupported(format!("the {rpc} rpc is not supported by this server yet")).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

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
