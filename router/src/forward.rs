//! Forwarding to workers: one pooled tonic `Channel` (one HTTP/2 connection, many concurrent
//! streams) per worker address, opened lazily and reused by every request to that worker.
//!
//! Calls return [`RouterError`]s classified by [`crate::wire::classify_status`] (over the shared codec's status mapping), so the service
//! decides retries on the class, not on message text.
//!
//! An infer call carries the client's [`RequestContext`] as metadata: `traceparent` and
//! `tracestate` unchanged, and the time left to the deadline as `grpc-timeout` (computed per
//! attempt, so a retry gets less). A request whose deadline has passed is answered
//! [`RouterError::DeadlineExceeded`] without calling the worker; a call the deadline cut short
//! (tonic reports it as CANCELLED, a worker may say DEADLINE_EXCEEDED) is too.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nereid_proto::pb::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use nereid_proto::pb::inference::{
    ModelConfig, ModelConfigRequest, ModelInferResponse, ModelMetadataRequest,
    ModelMetadataResponse, ModelStatistics, ModelStatisticsRequest,
};
use tonic::transport::{Channel, Endpoint};

use futures::{Stream, StreamExt};
use nereid_proto::pb::inference::InferParameter;
use nereid_proto::pb::inference::infer_parameter::ParameterChoice;
use nereid_proto::{ModelLoadReport, RequestContext, StreamedResponse, TRACEPARENT, TRACESTATE};
use tonic::metadata::MetadataValue;

use crate::error::{RouterError, RouterResult};
use crate::load::parse_text_report;
use crate::raw_call::{UnaryAnswer, head_status, request_body};
use crate::raw_codec::{RawCodec, RawMessage};
use crate::wire::{WorkerRequest, classify_status, decode_response};
use nereid_cluster_client::error_chain;
use tonic::codegen::http;

/// The method the pass-through path calls on workers (and serves to clients).
pub const MODEL_INFER_PATH: &str = "/inference.GRPCInferenceService/ModelInfer";
/// The method the stream pass-through calls on workers (and serves to clients).
pub const MODEL_STREAM_INFER_PATH: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

/// Request parameter asking for an empty response that marks a request's end.
const EMPTY_FINAL_RESPONSE_KEY: &str = "triton_enable_empty_final_response";
/// Response parameter marking a request's last response.
const FINAL_RESPONSE_KEY: &str = "triton_final_response";
/// Stream metadata asking for errors as gRPC statuses.
const GRPC_ERROR_KEY: &str = "triton_grpc_error";
/// Stream metadata asking for the worker's ORCA load report, and its form.
const LOAD_FORMAT_KEY: &str = "endpoint-load-metrics-format";
/// Stream metadata naming the model to report on.
const LOAD_MODEL_KEY: &str = "endpoint-load-metrics-model";
/// The worker's initial metadata carrying the report.
const LOAD_METRICS_KEY: &str = "endpoint-load-metrics";

fn bool_param(v: bool) -> InferParameter {
    InferParameter {
        parameter_choice: Some(ParameterChoice::BoolParam(v)),
    }
}

/// `message` as a tonic request carrying `context` as metadata; `DeadlineExceeded` (for
/// `model`) when the deadline has already passed.
fn with_context<T>(
    message: T,
    context: &RequestContext,
    model: &str,
) -> RouterResult<tonic::Request<T>> {
    let mut call = tonic::Request::new(message);
    if let Some(deadline) = context.deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(RouterError::DeadlineExceeded {
                model: model.to_string(),
            });
        }
        call.set_timeout(left);
    }
    if let Some(trace) = &context.trace {
        let metadata = call.metadata_mut();
        // Both were header text when they arrived, so they are valid metadata; a value that is
        // not is left out rather than failing the request.
        if let Ok(v) = MetadataValue::try_from(trace.traceparent()) {
            metadata.insert(TRACEPARENT, v);
        }
        if let Some(Ok(v)) = trace.tracestate().map(MetadataValue::try_from) {
            metadata.insert(TRACESTATE, v);
        }
    }
    Ok(call)
}

/// Asks the worker for its ORCA load report on `model` in a stream's initial metadata (see
/// `crate::load`).
fn ask_for_load(metadata: &mut tonic::metadata::MetadataMap, model: &str) {
    metadata.insert(LOAD_FORMAT_KEY, MetadataValue::from_static("text"));
    if let Ok(v) = MetadataValue::try_from(model) {
        metadata.insert(LOAD_MODEL_KEY, v);
    }
}

/// The load report in a worker's initial metadata, when it sent one.
fn load_report(metadata: &tonic::metadata::MetadataMap) -> Option<ModelLoadReport> {
    metadata
        .get(LOAD_METRICS_KEY)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_text_report)
}

/// Classifies a failed infer call; with a deadline set, a call it cut short (CANCELLED, as tonic
/// reports its own timeout, or DEADLINE_EXCEEDED) is [`RouterError::DeadlineExceeded`].
fn classify_infer_status(
    addr: &str,
    model: &str,
    context: &RequestContext,
    status: tonic::Status,
) -> RouterError {
    let cut_short = matches!(
        status.code(),
        tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
    );
    if context.deadline.is_some() && cut_short {
        return RouterError::DeadlineExceeded {
            model: model.to_string(),
        };
    }
    classify_status(addr, status)
}

/// How the router connects to workers.
#[derive(Clone, Debug)]
pub struct ForwardConfig {
    /// How long establishing a connection to a worker may take before the call fails as
    /// unreachable (default 2 s).
    pub connect_timeout: Duration,
    /// Largest message sent to or accepted from a worker.
    pub max_message_size: usize,
    /// Plaintext, or TLS with the cluster identity (`--cluster-tls-*`): workers' gRPC ports
    /// then require the cluster's client certificates.
    pub dial: nereid_tls::ClusterDial,
}

impl Default for ForwardConfig {
    fn default() -> Self {
        ForwardConfig {
            connect_timeout: Duration::from_secs(2),
            max_message_size: i32::MAX as usize,
            dial: nereid_tls::ClusterDial::plain(),
        }
    }
}

/// The pool of worker connections.
pub struct Workers {
    config: ForwardConfig,
    channels: Mutex<HashMap<String, Channel>>,
}

impl Workers {
    /// An empty pool; connections are made lazily, on a worker's first call.
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
            format!("{}://{addr}", self.config.dial.scheme())
        };
        let endpoint = Endpoint::from_shared(uri)
            .map_err(|e| RouterError::Unreachable {
                addr: addr.to_string(),
                message: format!("invalid address: {e}"),
            })?
            .connect_timeout(self.config.connect_timeout)
            .tcp_nodelay(true)
            // Fixed large windows, as the workers' gRPC servers set them: hyper's adaptive
            // window would ignore these sizes, start every stream at 64 KiB and send BDP
            // pings to grow them.
            .initial_connection_window_size(16 * 1024 * 1024)
            .initial_stream_window_size(4 * 1024 * 1024);
        let channel = if self.config.dial.is_tls() {
            self.config.dial.lazy(&endpoint)
        } else {
            endpoint.connect_with_connector_lazy(CorkedDialer)
        };
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

    /// Forwards one infer call with its context (see the module docs).
    pub async fn infer(
        &self,
        addr: &str,
        request: WorkerRequest,
    ) -> RouterResult<ModelInferResponse> {
        let WorkerRequest { message, context } = request;
        let model = message.model_name.clone();
        let call = with_context(message, &context, &model)?;
        self.client(addr)?
            .model_infer(call)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| classify_infer_status(addr, &model, &context, s))
    }

    /// A client of the worker at `addr` for the pass-through rpcs, ready to call.
    async fn raw_client(&self, addr: &str) -> RouterResult<tonic::client::Grpc<Channel>> {
        let mut grpc = tonic::client::Grpc::new(self.channel(addr)?)
            .max_decoding_message_size(self.config.max_message_size)
            .max_encoding_message_size(self.config.max_message_size);
        grpc.ready().await.map_err(|e| RouterError::Unreachable {
            addr: addr.to_string(),
            message: e.to_string(),
        })?;
        Ok(grpc)
    }

    /// Sends an HTTP request (the HTTP API, under cluster TLS) on the gRPC channel to `addr`;
    /// the request's URI is only its path, the channel adds the worker's scheme and authority.
    pub async fn send_http(
        &self,
        addr: &str,
        request: axum::http::Request<tonic::body::Body>,
    ) -> RouterResult<axum::http::Response<tonic::body::Body>> {
        use tonic::codegen::Service;
        let unreachable = |message: String| RouterError::Unreachable {
            addr: addr.to_string(),
            message,
        };
        let mut channel = self.channel(addr)?;
        std::future::poll_fn(|cx| channel.poll_ready(cx))
            .await
            .map_err(|e| unreachable(error_chain(&e)))?;
        channel
            .call(request)
            .await
            .map_err(|e| unreachable(error_chain(&e)))
    }

    /// Forwards one `ModelInfer` as bytes (the pass-through path): `message` goes out as it
    /// is, the worker's answer comes back undecoded. Context and errors as [`Self::infer`].
    /// The call is framed here (`raw_call`), not by tonic's codec: HEADERS and the message's
    /// DATA frame, which ends the stream, leave in one write.
    pub async fn infer_raw(
        &self,
        addr: &str,
        message: RawMessage,
        context: &RequestContext,
        model: &str,
    ) -> RouterResult<bytes::Bytes> {
        use tonic::codegen::Service;
        let classify = |status| classify_infer_status(addr, model, context, status);
        let call = with_context((), context, model)?;
        let body = request_body(&message).map_err(classify)?;
        let mut request = http::Request::new(body);
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = http::Uri::from_static(MODEL_INFER_PATH);
        let headers = request.headers_mut();
        *headers = call.into_parts().0.into_headers();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/grpc"),
        );
        headers.insert(http::header::TE, http::HeaderValue::from_static("trailers"));
        let mut channel = self.channel(addr)?;
        std::future::poll_fn(|cx| channel.poll_ready(cx))
            .await
            .map_err(|e| RouterError::Unreachable {
                addr: addr.to_string(),
                message: e.to_string(),
            })?;
        let response = channel
            .call(request)
            .await
            .map_err(|e| classify(tonic::Status::from_error(e.into())))?;
        let (parts, mut body) = response.into_parts();
        if let Some(status) = head_status(parts.status, &parts.headers)
            && status.code() != tonic::Code::Ok
        {
            return Err(classify(status));
        }
        let mut answer = UnaryAnswer::new(self.config.max_message_size);
        let mut trailers = None;
        while let Some(frame) = std::future::poll_fn(|cx| {
            tonic::codegen::Body::poll_frame(std::pin::Pin::new(&mut body), cx)
        })
        .await
        {
            let frame = frame.map_err(classify)?;
            match frame.into_data() {
                Ok(data) => answer.push(data),
                Err(frame) => trailers = frame.into_trailers().ok(),
            }
        }
        answer.finish(trailers.as_ref()).map_err(classify)
    }

    /// Opens a `ModelStreamInfer` carrying one request as bytes (the stream pass-through):
    /// `message` goes out as it is, and the worker's response frames come back undecoded until
    /// it ends the stream. With `grpc_error` the worker is asked for errors as statuses
    /// (`triton_grpc_error`), else it reports them in-band as frames. Context and errors as
    /// [`Self::infer`]; a status that ends the stream is its last item. The worker's load
    /// report comes beside the stream, as for [`Self::infer_stream`].
    pub async fn infer_stream_raw(
        &self,
        addr: &str,
        message: RawMessage,
        context: &RequestContext,
        model: &str,
        grpc_error: bool,
    ) -> RouterResult<(
        impl Stream<Item = RouterResult<bytes::Bytes>> + Send + 'static + use<>,
        Option<ModelLoadReport>,
    )> {
        let mut call = with_context(
            futures::stream::once(async move { message }),
            context,
            model,
        )?;
        if grpc_error {
            call.metadata_mut()
                .insert(GRPC_ERROR_KEY, MetadataValue::from_static("true"));
        }
        ask_for_load(call.metadata_mut(), model);
        let mut grpc = self.raw_client(addr).await?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(MODEL_STREAM_INFER_PATH);
        let opened = grpc
            .streaming(call, path, RawCodec)
            .await
            .map_err(|s| classify_infer_status(addr, model, context, s))?;
        let load = load_report(opened.metadata());
        let frames = opened.into_inner();
        let (addr, model, context) = (addr.to_string(), model.to_string(), context.clone());
        let frames = frames
            .map(move |frame| frame.map_err(|s| classify_infer_status(&addr, &model, &context, s)));
        Ok((frames, load))
    }

    /// Opens a `ModelStreamInfer` carrying the one request, and yields its answers as
    /// [`StreamedResponse`]s until the worker ends the stream. Errors come back as gRPC
    /// statuses (`triton_grpc_error`), which end the stream.
    ///
    /// The worker is asked for its ORCA load report on the model (see `crate::load`), returned
    /// beside the stream when it gave one.
    pub async fn infer_stream(
        &self,
        addr: &str,
        request: WorkerRequest,
    ) -> RouterResult<(
        impl Stream<Item = RouterResult<StreamedResponse>> + Send + 'static + use<>,
        Option<ModelLoadReport>,
    )> {
        let WorkerRequest {
            mut message,
            context,
        } = request;
        message
            .parameters
            .insert(EMPTY_FINAL_RESPONSE_KEY.to_string(), bool_param(true));
        let model = message.model_name.clone();
        let mut call = with_context(
            futures::stream::once(async move { message }),
            &context,
            &model,
        )?;
        call.metadata_mut()
            .insert(GRPC_ERROR_KEY, MetadataValue::from_static("true"));
        ask_for_load(call.metadata_mut(), &model);
        let opened = self
            .client(addr)?
            .model_stream_infer(call)
            .await
            .map_err(|s| classify_infer_status(addr, &model, &context, s))?;
        let load = load_report(opened.metadata());
        let responses = opened.into_inner();
        let addr = addr.to_string();
        let responses = responses.map(move |item| {
            let message = item.map_err(|s| classify_infer_status(&addr, &model, &context, s))?;
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
        });
        Ok((responses, load))
    }

    /// Asks the worker at `addr` for a model's metadata (`ModelMetadata`), errors classified as
    /// for inference.
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

    /// Asks the worker at `addr` for a model's configuration (`ModelConfig`); an answer without
    /// a config is a [`RouterError::BadResponse`].
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

    /// Asks the worker at `addr` for its statistics of the models `request` names
    /// (`ModelStatistics`), errors classified as for inference.
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

#[cfg(test)]
mod tests {
    use nereid_proto::TraceContext;

    use super::*;

    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_context_becomes_metadata() {
        let context = RequestContext {
            trace: TraceContext::parse(TRACEPARENT, Some("a=1")),
            deadline: Some(Instant::now() + Duration::from_secs(2)),
            ..Default::default()
        };
        let call = with_context((), &context, "m").unwrap();
        let metadata = call.metadata();
        assert_eq!(metadata.get("traceparent").unwrap(), TRACEPARENT);
        assert_eq!(metadata.get("tracestate").unwrap(), "a=1");
        let timeout = metadata.get("grpc-timeout").unwrap().to_str().unwrap();
        let left = nereid_proto::parse_grpc_timeout(timeout).unwrap();
        assert!(left <= Duration::from_secs(2) && left > Duration::from_secs(1));

        let bare = with_context((), &RequestContext::default(), "m").unwrap();
        assert!(bare.metadata().is_empty());
    }

    #[test]
    fn a_passed_deadline_is_not_forwarded() {
        let context = RequestContext {
            deadline: Some(Instant::now()),
            ..Default::default()
        };
        assert!(context.expired(Instant::now()));
        assert!(!RequestContext::default().expired(Instant::now()));
        assert_eq!(
            with_context((), &context, "m").unwrap_err(),
            RouterError::DeadlineExceeded { model: "m".into() }
        );
    }

    #[test]
    fn a_call_cut_short_by_the_deadline_is_classified_as_such() {
        let with_deadline = RequestContext {
            deadline: Some(Instant::now()),
            ..Default::default()
        };
        let cut = classify_infer_status(
            "w",
            "m",
            &with_deadline,
            tonic::Status::cancelled("Timeout expired"),
        );
        assert_eq!(cut, RouterError::DeadlineExceeded { model: "m".into() });
        // Without a deadline, CANCELLED is the worker's answer as usual.
        let plain = classify_infer_status(
            "w",
            "m",
            &RequestContext::default(),
            tonic::Status::cancelled("gone"),
        );
        assert!(matches!(plain, RouterError::Worker { .. }), "{plain:?}");
    }
}

/// Dials a worker in plaintext with writes corked for one pass of the connection's task
/// (`nereid_frontend::Corked`, on the router's default current-thread runtime): the frames of
/// every call sent meanwhile leave together.
#[derive(Clone, Copy, Debug)]
struct CorkedDialer;

type CorkedTcp = hyper_util::rt::TokioIo<nereid_frontend::Corked<tokio::net::TcpStream>>;

impl tonic::codegen::Service<http::Uri> for CorkedDialer {
    type Response = CorkedTcp;
    type Error = std::io::Error;
    type Future = tonic::codegen::BoxFuture<CorkedTcp, std::io::Error>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        Box::pin(async move {
            let (host, port) = nereid_tls::host_and_port(&uri)?;
            let tcp = tokio::net::TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            Ok(hyper_util::rt::TokioIo::new(nereid_frontend::Corked::new(
                tcp,
            )))
        })
    }
}
