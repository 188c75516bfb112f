//! The [`Client`] trait the load loops drive, and its HTTP and gRPC implementations.
//!
//! ```text
//! inputs::Step ──prepare()──► Prepared (request body encoded once, before the run)
//!                                │ shared by all workers (Arc)
//!                                ▼
//! closed_loop / open_loop ──infer(&Prepared)──► http::HttpClient  (hyper-util keep-alive pool)
//!                                          └──► grpc::GrpcClient  (a few shared tonic channels)
//! sweep / run ──model_info, model_config, load_model──► the same clients
//! ```
//!
//! Encoding happens in `prepare`, never per request, so the measured client cost is sending
//! and receiving only. Responses are checked for success, not decoded.

pub mod grpc;
pub mod http;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use serde_json::Value;

use crate::cli::{Protocol, RunArgs};
use crate::error::LoadtestError;
use crate::inputs::{ModelInfo, Step};

/// A request body encoded for one protocol.
#[derive(Clone, Debug)]
pub enum Prepared {
    /// The HTTP body; with the binary tensor extension, `header_length` is the length of the
    /// leading JSON (`Inference-Header-Content-Length`).
    Http {
        body: Bytes,
        header_length: Option<usize>,
    },
    /// A serialized `ModelInferRequest` with `raw_input_contents`.
    Grpc { message: Bytes },
}

/// Which model the client talks to.
#[derive(Clone, Debug)]
pub struct Target {
    pub model: String,
    /// Empty: the server's latest version.
    pub version: String,
}

/// A KServe v2 client for one model.
#[async_trait]
pub trait Client: Send + Sync + 'static {
    /// Encodes one request's tensors. No outputs are named, so the server returns all of them.
    fn prepare(&self, step: &Step) -> Result<Prepared, String>;
    /// Sends one inference request and waits for a successful response.
    async fn infer(&self, request: &Prepared) -> Result<(), String>;
    /// Checks that the server answers (liveness).
    async fn server_live(&self) -> Result<(), LoadtestError>;
    /// Model metadata plus `max_batch_size` from the config when the server offers it.
    async fn model_info(&self) -> Result<ModelInfo, LoadtestError>;
    /// The model's config as Triton-style JSON (protobuf JSON, snake_case names).
    async fn model_config(&self) -> Result<Value, LoadtestError>;
    /// Loads or reloads the model, with `config` overriding its `config.pbtxt` when given.
    async fn load_model(&self, config: Option<&Value>) -> Result<(), LoadtestError>;
    /// `host:port` and protocol, for messages.
    fn describe(&self) -> String;
}

/// Connects the client `args` ask for; fails early when the server cannot be reached.
pub async fn connect(args: &RunArgs, target: Target) -> Result<Arc<dyn Client>, LoadtestError> {
    let base = args.base_url().map_err(LoadtestError::InvalidArgument)?;
    let client: Arc<dyn Client> = match args.protocol {
        Protocol::Http => Arc::new(http::HttpClient::new(base, target, args.http_json)?),
        Protocol::Grpc => {
            Arc::new(grpc::GrpcClient::connect(base, target, args.grpc_channels).await?)
        }
    };
    client.server_live().await?;
    Ok(client)
}

/// The hint added to a failed repository load in `none`/`poll` control mode.
pub const EXPLICIT_MODE_HINT: &str =
    "model loading needs the server in explicit model control mode (--model-control-mode explicit)";
