//! Forwarding to workers: one pooled tonic `Channel` (one HTTP/2 connection, many concurrent
//! streams) per worker address, opened lazily and reused by every request to that worker.
//!
//! Calls return [`RouterError`]s classified by [`crate::wire::classify_status`], so the service
//! decides retries on the class, not on message text.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use nereid_proto::pb::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use nereid_proto::pb::inference::{
    ModelConfig, ModelConfigRequest, ModelInferRequest, ModelInferResponse, ModelMetadataRequest,
    ModelMetadataResponse, ModelStatistics, ModelStatisticsRequest,
};
use tonic::transport::{Channel, Endpoint};

use futures::{Stream, StreamExt};
use nereid_proto::pb::inference::InferParameter;
use nereid_proto::pb::inference::infer_parameter::ParameterChoice;
use nereid_proto::service::StreamedResponse;

use crate::error::{RouterError, RouterResult};
use crate::wire::{classify_status, decode_response};

/// Request parameter asking for an empty response that marks a request's end.
const EMPTY_FINAL_RESPONSE_KEY: &str = "triton_enable_empty_final_response";
/// Response parameter marking a request's last response.
const FINAL_RESPONSE_KEY: &str = "triton_final_response";
/// Stream metadata asking for errors as gRPC statuses.
const GRPC_ERROR_KEY: &str = "triton_grpc_error";

fn bool_param(v: bool) -> InferParameter {
    InferParameter {
        parameter_choice: Some(ParameterChoice::BoolParam(v)),
    }
}

/// How the router connects to workers.
#[derive(Clone, Debug)]
pub struct ForwardConfig {
    pub connect_timeout: Duration,
    /// Largest message sent to or accepted from a worker.
    pub max_message_size: usize,
}

impl Default for ForwardConfig {
    fn default() -> Self {
        ForwardConfig {
            connect_timeout: Duration::from_secs(2),
            max_message_size: i32::MAX as usize,
        }
    }
}

/// The pool of worker connections.
pub struct Workers {
    config: ForwardConfig,
    channels: Mutex<HashMap<String, Channel>>,
}

impl Workers {
    pub fn new(config: ForwardConfig) -> Workers {
        Workers {
            config,
            channels: Mutex::new(HashMap::new()),
        }
    }

    /// The channel to `addr`, created on first use.
    fn channel(&self, addr: &str) -> RouterResult<Channel> {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = channels.get(addr) {
            return Ok(c.clone());
        }
        let uri = if addr.contains("://") {
            addr.to_string()
        } else {
            format!("http://{addr}")
        };
        let channel = Endpoint::from_shared(uri)
            .map_err(|e| RouterError::Unreachable {
                addr: addr.to_string(),
                message: format!("invalid address: {e}"),
            })?
            .connect_timeout(self.config.connect_timeout)
            .tcp_nodelay(true)
            .http2_adaptive_window(true)
            .initial_connection_window_size(16 * 1024 * 1024)
            .initial_stream_window_size(4 * 1024 * 1024)
            .connect_lazy();
        channels.insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    /// Drops connections to workers that are no longer in `live`.
    pub fn retain(&self, live: &[String]) {
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        channels.retain(|addr, _| live.iter().any(|l| l == addr));
    }

    fn client(&self, addr: &str) -> RouterResult<GrpcInferenceServiceClient<Channel>> {
        Ok(GrpcInferenceServiceClient::new(self.channel(addr)?)
            .max_decoding_message_size(self.config.max_message_size)
            .max_encoding_message_size(self.config.max_message_size))
    }

    pub async fn infer(
        &self,
        addr: &str,
        request: ModelInferRequest,
    ) -> RouterResult<ModelInferResponse> {
        self.client(addr)?
            .model_infer(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| classify_status(addr, s))
    }

    /// Opens a `ModelStreamInfer` carrying the one request, and yields its answers as
    /// [`StreamedResponse`]s until the worker ends the stream. Errors come back as gRPC
    /// statuses (`triton_grpc_error`), which end the stream.
    pub async fn infer_stream(
        &self,
        addr: &str,
        mut request: ModelInferRequest,
    ) -> RouterResult<impl Stream<Item = RouterResult<StreamedResponse>> + Send + 'static + use<>>
    {
        request
            .parameters
            .insert(EMPTY_FINAL_RESPONSE_KEY.to_string(), bool_param(true));
        let mut call = tonic::Request::new(futures::stream::once(async move { request }));
        call.metadata_mut().insert(
            GRPC_ERROR_KEY,
            tonic::metadata::MetadataValue::from_static("true"),
        );
        let responses = self
            .client(addr)?
            .model_stream_infer(call)
            .await
            .map_err(|s| classify_status(addr, s))?
            .into_inner();
        let addr = addr.to_string();
        Ok(responses.map(move |item| {
            let message = item.map_err(|s| classify_status(&addr, s))?;
            let Some(mut response) = message.infer_response else {
                return Err(RouterError::BadResponse {
                    addr: addr.clone(),
                    message: format!("stream item without a response: {}", message.error_message),
                });
            };
            let last = matches!(
                response
                    .parameters
                    .remove(FINAL_RESPONSE_KEY)
                    .and_then(|p| p.parameter_choice),
                Some(ParameterChoice::BoolParam(true))
            );
            // The empty final marker: the model ended the request without a response.
            if last && response.outputs.is_empty() && response.raw_output_contents.is_empty() {
                return Ok(StreamedResponse {
                    response: None,
                    last,
                });
            }
            Ok(StreamedResponse {
                response: Some(decode_response(&addr, response)?),
                last,
            })
        }))
    }

    pub async fn model_metadata(
        &self,
        addr: &str,
        request: ModelMetadataRequest,
    ) -> RouterResult<ModelMetadataResponse> {
        self.client(addr)?
            .model_metadata(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| classify_status(addr, s))
    }

    pub async fn model_config(
        &self,
        addr: &str,
        request: ModelConfigRequest,
    ) -> RouterResult<ModelConfig> {
        let response = self
            .client(addr)?
            .model_config(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| classify_status(addr, s))?;
        response.config.ok_or_else(|| RouterError::BadResponse {
            addr: addr.to_string(),
            message: "model config response without a config".into(),
        })
    }

    pub async fn model_statistics(
        &self,
        addr: &str,
        request: ModelStatisticsRequest,
    ) -> RouterResult<Vec<ModelStatistics>> {
        self.client(addr)?
            .model_statistics(request)
            .await
            .map(|r| r.into_inner().model_stats)
            .map_err(|s| classify_status(addr, s))
    }
}
