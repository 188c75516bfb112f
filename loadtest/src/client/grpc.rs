//! KServe v2 / Triton gRPC client over a few shared tonic HTTP/2 channels.
//!
//! `ModelInfer` goes through a pass-through codec: the `ModelInferRequest` (inputs in
//! `raw_input_contents`) is serialized once in `prepare`, each call sends those bytes as they
//! are, and the response message is skipped rather than decoded; the gRPC status says whether
//! it succeeded. Metadata, config and repository calls use the generated client.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Buf, BufMut, Bytes};
use nereid_proto::pb::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use nereid_proto::pb::inference::model_infer_request::InferInputTensor;
use nereid_proto::pb::inference::model_repository_parameter::ParameterChoice;
use nereid_proto::pb::inference::{
    ModelConfigRequest, ModelInferRequest, ModelMetadataRequest, ModelRepositoryParameter,
    RepositoryModelLoadRequest, ServerLiveRequest,
};
use prost::Message;
use serde_json::Value;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::{Client, EXPLICIT_MODE_HINT, Prepared, Target};
use crate::error::{LoadtestError, chain};
use crate::inputs::{ModelInfo, Step, TensorSpec};

const MODEL_INFER_PATH: &str = "/inference.GRPCInferenceService/ModelInfer";

/// A gRPC client for one model, spreading requests round-robin over its channels.
pub struct GrpcClient {
    channels: Vec<Channel>,
    next: AtomicUsize,
    base: String,
    target: Target,
}

impl GrpcClient {
    /// Opens `channels` HTTP/2 connections to `base` (`http://host:port`).
    pub async fn connect(
        base: String,
        target: Target,
        channels: usize,
    ) -> Result<GrpcClient, LoadtestError> {
        let endpoint = Endpoint::from_shared(base.clone())
            .map_err(|e| LoadtestError::InvalidArgument(format!("-u '{base}': {e}")))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5))
            .initial_connection_window_size(16 * 1024 * 1024)
            .initial_stream_window_size(4 * 1024 * 1024);
        let mut opened = Vec::with_capacity(channels);
        for _ in 0..channels.max(1) {
            let channel = endpoint
                .connect()
                .await
                .map_err(|e| LoadtestError::Unreachable {
                    url: base.clone(),
                    protocol: "gRPC",
                    detail: chain(&e),
                })?;
            opened.push(channel);
        }
        Ok(GrpcClient {
            channels: opened,
            next: AtomicUsize::new(0),
            base,
            target,
        })
    }

    fn channel(&self) -> Channel {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.channels.len();
        self.channels[i].clone()
    }

    fn stub(&self) -> GrpcInferenceServiceClient<Channel> {
        GrpcInferenceServiceClient::new(self.channel())
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX)
    }

    fn status_error(&self, what: &str, status: &Status) -> LoadtestError {
        match status.code() {
            Code::Unavailable if status.message().contains("error trying to connect") => {
                LoadtestError::Unreachable {
                    url: self.base.clone(),
                    protocol: "gRPC",
                    detail: status.message().into(),
                }
            }
            _ => LoadtestError::Server {
                url: self.base.clone(),
                detail: format!("{what}: {:?}: {}", status.code(), status.message()),
            },
        }
    }
}

/// Attempts of an inference call whose earlier attempts were never sent ([`never_sent`]).
const NOT_SENT_ATTEMPTS: u32 = 3;

/// Whether the call failed before any of it was written to a connection: hyper dropped it from
/// a connection that was closing (the server sent GOAWAY, or closed it) before sending it.
fn never_sent(status: &Status) -> bool {
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        if let Some(e) = e.downcast_ref::<hyper::Error>() {
            return e.is_canceled();
        }
        source = e.source();
    }
    false
}

/// The serialized `ModelInferRequest` of one step.
pub fn encode_request(target: &Target, step: &Step) -> Bytes {
    let request = ModelInferRequest {
        model_name: target.model.clone(),
        model_version: target.version.clone(),
        inputs: step
            .iter()
            .map(|t| InferInputTensor {
                name: t.name.clone(),
                datatype: t.datatype.as_wire().into(),
                shape: t.shape.clone(),
                ..Default::default()
            })
            .collect(),
        raw_input_contents: step.iter().map(|t| t.data.clone()).collect(),
        ..Default::default()
    };
    Bytes::from(request.encode_to_vec())
}

/// Sends pre-encoded message bytes as they are and skips the response body.
#[derive(Clone, Copy, Debug, Default)]
struct PassThroughCodec;

impl Codec for PassThroughCodec {
    type Encode = Bytes;
    type Decode = ();
    type Encoder = PassThroughCodec;
    type Decoder = PassThroughCodec;

    fn encoder(&mut self) -> Self::Encoder {
        *self
    }

    fn decoder(&mut self) -> Self::Decoder {
        *self
    }
}

impl Encoder for PassThroughCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for PassThroughCodec {
    type Item = ();
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<()>, Status> {
        src.advance(src.remaining());
        Ok(Some(()))
    }
}

#[async_trait]
impl Client for GrpcClient {
    fn prepare(&self, step: &Step) -> Result<Prepared, String> {
        Ok(Prepared::Grpc {
            message: encode_request(&self.target, step),
        })
    }

    async fn infer(&self, request: &Prepared) -> Result<(), String> {
        let Prepared::Grpc { message } = request else {
            return Err("internal: an HTTP request was given to the gRPC client".into());
        };
        let mut attempt = 1;
        loop {
            let mut grpc =
                tonic::client::Grpc::new(self.channel()).max_decoding_message_size(usize::MAX);
            grpc.ready()
                .await
                .map_err(|e| format!("gRPC channel not ready: {}", chain(&e)))?;
            let path = http::uri::PathAndQuery::from_static(MODEL_INFER_PATH);
            match grpc
                .unary(tonic::Request::new(message.clone()), path, PassThroughCodec)
                .await
            {
                Ok(_) => return Ok(()),
                // As gRPC's own clients do (transparent retry): the call never left this client,
                // its connection was going away (GOAWAY) or gone, so sending it again on a new
                // connection cannot run it twice.
                Err(s) if never_sent(&s) && attempt < NOT_SENT_ATTEMPTS => attempt += 1,
                Err(s) => return Err(format!("gRPC {:?}: {}", s.code(), s.message())),
            }
        }
    }

    async fn server_live(&self) -> Result<(), LoadtestError> {
        let live = self
            .stub()
            .server_live(ServerLiveRequest {})
            .await
            .map_err(|s| self.status_error("ServerLive", &s))?
            .into_inner()
            .live;
        if live {
            Ok(())
        } else {
            Err(LoadtestError::Server {
                url: self.base.clone(),
                detail: "ServerLive answered live=false".into(),
            })
        }
    }

    async fn model_info(&self) -> Result<ModelInfo, LoadtestError> {
        let request = ModelMetadataRequest {
            name: self.target.model.clone(),
            version: self.target.version.clone(),
        };
        let meta = match self.stub().model_metadata(request).await {
            Ok(r) => r.into_inner(),
            Err(s) if matches!(s.code(), Code::NotFound | Code::InvalidArgument) => {
                return Err(LoadtestError::ModelNotFound {
                    model: self.target.model.clone(),
                    url: self.base.clone(),
                    detail: s.message().into(),
                });
            }
            Err(s) => return Err(self.status_error("ModelMetadata", &s)),
        };
        let specs =
            |list: Vec<nereid_proto::pb::inference::model_metadata_response::TensorMetadata>| {
                list.into_iter()
                    .map(|t| TensorSpec {
                        name: t.name,
                        datatype: t.datatype,
                        shape: t.shape,
                    })
                    .collect()
            };
        let max_batch_size = match self.model_config().await {
            Ok(config) => config.get("max_batch_size").and_then(Value::as_i64),
            Err(_) => None,
        };
        Ok(ModelInfo {
            name: self.target.model.clone(),
            inputs: specs(meta.inputs),
            outputs: specs(meta.outputs),
            max_batch_size,
        })
    }

    async fn model_config(&self) -> Result<Value, LoadtestError> {
        let request = ModelConfigRequest {
            name: self.target.model.clone(),
            version: self.target.version.clone(),
        };
        let response = self
            .stub()
            .model_config(request)
            .await
            .map_err(|s| self.status_error("ModelConfig", &s))?
            .into_inner();
        let config = response.config.ok_or_else(|| LoadtestError::Server {
            url: self.base.clone(),
            detail: "ModelConfig answered without a config".into(),
        })?;
        Ok(nereid_proto::message_to_json(&config))
    }

    async fn load_model(&self, config: Option<&Value>) -> Result<(), LoadtestError> {
        let mut parameters = HashMap::new();
        if let Some(c) = config {
            parameters.insert(
                "config".to_string(),
                ModelRepositoryParameter {
                    parameter_choice: Some(ParameterChoice::StringParam(c.to_string())),
                },
            );
        }
        let request = RepositoryModelLoadRequest {
            repository_name: String::new(),
            model_name: self.target.model.clone(),
            parameters,
        };
        match self.stub().repository_model_load(request).await {
            Ok(_) => Ok(()),
            Err(s) => {
                let mut error = self.status_error("RepositoryModelLoad", &s);
                if s.code() == Code::Unavailable
                    && let LoadtestError::Server { detail, .. } = &mut error
                {
                    detail.push_str(&format!(" ({EXPLICIT_MODE_HINT})"));
                }
                Err(error)
            }
        }
    }

    fn describe(&self) -> String {
        format!("{} (gRPC, {} channel(s))", self.base, self.channels.len())
    }
}

#[cfg(test)]
mod tests {
    use nereid_proto::DataType;

    use super::*;
    use crate::inputs::InputTensor;

    #[test]
    fn request_carries_raw_inputs() {
        let target = Target {
            model: "m".into(),
            version: "2".into(),
        };
        let step = vec![InputTensor {
            name: "A".into(),
            datatype: DataType::Fp32,
            shape: vec![1, 1],
            data: Bytes::from_static(&[0, 0, 128, 63]),
        }];
        let bytes = encode_request(&target, &step);
        let decoded = ModelInferRequest::decode(bytes).unwrap();
        assert_eq!(decoded.model_version, "2");
        assert_eq!(decoded.inputs[0].datatype, "FP32");
        assert!(decoded.outputs.is_empty(), "all outputs are returned");
        assert_eq!(&decoded.raw_input_contents[0][..], &[0, 0, 128, 63]);
    }
}
