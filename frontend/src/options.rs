//! [`FrontendOptions`]: the operator's settings of both frontends, as the binary parses them
//! from flags, turned into each protocol's config once the process's shared pieces (the
//! shared-memory registry) exist.
//!
//! ```text
//! flags ─► FrontendOptions ─┬─ http_config(max input size, shm) ─► HttpConfig
//!                           └─ grpc_config(shm) ─────────────────► GrpcConfig
//! ```

use nereid_proto::codec::RequestLimits;

use crate::forward::HeaderForward;
use crate::grpc::{GrpcConfig, InferCompression};
use crate::http::HttpConfig;
use crate::restrict::RestrictedApis;
use crate::shm::SharedMemory;

/// What `serve`, `worker` and `router` configure alike on their HTTP and gRPC frontends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FrontendOptions {
    /// `--http-restricted-api`.
    pub http_restricted: RestrictedApis,
    /// `--grpc-restricted-protocol`.
    pub grpc_restricted: RestrictedApis,
    /// `--max-request-inputs`, `--max-request-outputs`, `--max-tensor-elements`: checked by
    /// both protocols.
    pub limits: RequestLimits,
    /// `--grpc-max-message-size`: [`GrpcConfig::max_message_size`].
    pub grpc_max_message_size: usize,
    /// `--grpc-stream-buffer`: [`GrpcConfig::stream_response_buffer`].
    pub grpc_stream_buffer: usize,
    /// `--http-header-forward-pattern`: [`HttpConfig::header_forward`].
    pub http_header_forward: HeaderForward,
    /// `--grpc-header-forward-pattern`: [`GrpcConfig::header_forward`].
    pub grpc_header_forward: HeaderForward,
    /// `--grpc-infer-response-compression-level`: [`GrpcConfig::infer_compression`].
    pub grpc_infer_compression: InferCompression,
}

impl Default for FrontendOptions {
    fn default() -> Self {
        let grpc = GrpcConfig::default();
        FrontendOptions {
            http_restricted: RestrictedApis::default(),
            grpc_restricted: RestrictedApis::default(),
            limits: RequestLimits::default(),
            grpc_max_message_size: grpc.max_message_size,
            grpc_stream_buffer: grpc.stream_response_buffer,
            http_header_forward: HeaderForward::default(),
            grpc_header_forward: HeaderForward::default(),
            grpc_infer_compression: InferCompression::None,
        }
    }
}

impl FrontendOptions {
    /// The HTTP frontend's config, with the body limit and the process's shared memory.
    pub fn http_config(&self, max_input_size: usize, shared_memory: SharedMemory) -> HttpConfig {
        HttpConfig {
            max_input_size,
            shared_memory,
            restricted: self.http_restricted.clone(),
            limits: self.limits,
            header_forward: self.http_header_forward.clone(),
            model_repositories: Vec::new(),
        }
    }

    /// The gRPC frontend's config, with the process's shared memory.
    pub fn grpc_config(&self, shared_memory: SharedMemory) -> GrpcConfig {
        GrpcConfig {
            max_message_size: self.grpc_max_message_size,
            stream_response_buffer: self.grpc_stream_buffer,
            shared_memory,
            restricted: self.grpc_restricted.clone(),
            limits: self.limits,
            header_forward: self.grpc_header_forward.clone(),
            infer_compression: self.grpc_infer_compression,
        }
    }
}
