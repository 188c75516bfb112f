//! `ModelStreamInfer`: many requests on one bidirectional stream, each answered by zero or more
//! responses (decoupled models) or exactly one (all others).
//!
//! ```text
//! client ─ModelInferRequest─► stream_task (one per rpc, owns everything below)
//!                               ├─ codec::decode_stream_request
//!                               ├─ StreamOrder::admit   places in the start and send orders
//!                               └─ JoinSet: one request_task per request, run concurrently
//!                                    InferenceService::infer_stream ─► ResponseStream
//!                                      each item ─► response_message (+ triton_final_response)
//!                                        ─► Outbox (waits for its send turn) ─┐
//! client ◄─ReceiverStream◄─ bounded mpsc (GrpcConfig::stream_response_buffer) ◄┘
//! ```
//!
//! What the client sees, as with Triton's stream handler:
//! - Every response carries the parameter `triton_final_response` (bool), true on the last
//!   response of its request. A model that ends a request without a response (an empty final
//!   item) is answered with an empty response (only `id`, `model_name`, `model_version` and the
//!   flag) when the request set `triton_enable_empty_final_response: true`, else with nothing.
//! - Requests run concurrently. Responses of decoupled models go out as they are produced,
//!   interleaved with others; those of other models go out in request order (Triton's
//!   ordering), whether they are answers or errors. Requests of one sequence (model, version,
//!   `sequence_id`) start one after another in the order sent. See [`super::stream_order`].
//! - A failed request (decode error, refused request, error item) is answered with
//!   `error_message` and an `infer_response` naming the request, and the stream stays open.
//!   With the client metadata `triton_grpc_error: true` at stream start, the first error instead
//!   ends the rpc with its gRPC status (mapped in [`super::error`]).
//!
//! Whether a model is decoupled comes from its config, looked up once per model and version per
//! stream. Lifetime: the stream ends with OK once the client has half-closed and every request
//! has finished. A client that goes away drops the `ReceiverStream`; `stream_task` sees the
//! channel close and returns, and dropping its `JoinSet` aborts every request task, which drops
//! the service's futures and streams and so cancels the requests. A full channel makes the
//! request tasks wait, which stops pulling from the models' streams (back-pressure).

use std::collections::HashMap;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::metadata::MetadataMap;

use crate::grpc::stream_order::{StreamOrder, Turn, sequence_key};
use nereid_proto::codec::{self, RequestLimits, StreamRequest};
use nereid_proto::pb::inference::infer_parameter::ParameterChoice;
use nereid_proto::pb::inference::{
    InferParameter, ModelInferRequest, ModelInferResponse, ModelStreamInferResponse,
};
use nereid_proto::{
    InferRequest, InferenceService, RequestContext, ServiceError, ServiceResult, StreamedResponse,
};

/// Response parameter marking a request's last response.
pub(crate) const FINAL_RESPONSE_KEY: &str = "triton_final_response";

/// Client metadata that asks for errors as gRPC statuses.
pub(crate) const GRPC_ERROR_KEY: &str = "triton_grpc_error";

/// One item of the rpc's response stream.
pub(crate) type ResponseItem = Result<ModelStreamInferResponse, Status>;

/// The rpc's response stream, as tonic sends it.
pub(crate) type Responses = ReceiverStream<ResponseItem>;

/// How a failed request is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorMode {
    /// Triton's default: an `error_message` response; the stream stays open.
    InBand,
    /// The client sent `triton_grpc_error: true`: the first error ends the rpc with its status.
    Status,
}

impl ErrorMode {
    /// Reads the mode from the client's metadata at stream start (`true` exactly, as Triton).
    pub(crate) fn from_metadata(metadata: &MetadataMap) -> ErrorMode {
        match metadata.get(GRPC_ERROR_KEY).map(|v| v.to_str()) {
            Some(Ok("true")) => ErrorMode::Status,
            _ => ErrorMode::InBand,
        }
    }
}

/// Whether the stream goes on after a request task or an error report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    Continue,
    /// The client is gone, or an error ended the rpc.
    Stop,
}

/// Starts serving one `ModelStreamInfer` rpc and returns its response stream at once; a task
/// reads `requests` until the client half-closes. At most `buffer` (at least 1) responses wait
/// unsent. Every request of the stream carries `context`, read from the rpc's metadata: the
/// stream's trace context and deadline are those of each of its requests. Each request is
/// decoded within `limits`; one beyond them is answered with its error like any bad request.
pub(crate) fn serve_stream<S>(
    service: Arc<dyn InferenceService>,
    requests: S,
    mode: ErrorMode,
    context: RequestContext,
    buffer: usize,
    limits: RequestLimits,
) -> Responses
where
    S: Stream<Item = Result<ModelInferRequest, Status>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(buffer.max(1));
    tokio::spawn(stream_task(service, requests, mode, context, limits, tx));
    ReceiverStream::new(rx)
}

/// What a request is called on the wire, kept before decoding to label its error responses.
#[derive(Clone, Debug, Default, PartialEq)]
struct Origin {
    model_name: String,
    model_version: String,
    id: String,
}

impl Origin {
    fn of(request: &ModelInferRequest) -> Origin {
        Origin {
            model_name: request.model_name.clone(),
            model_version: request.model_version.clone(),
            id: request.id.clone(),
        }
    }

    /// A response naming only the request, marked final: the empty final response, and the
    /// `infer_response` of an error.
    fn final_marker(&self) -> ModelInferResponse {
        let mut response = ModelInferResponse {
            model_name: self.model_name.clone(),
            model_version: self.model_version.clone(),
            id: self.id.clone(),
            ..Default::default()
        };
        mark_final(&mut response, true);
        response
    }
}

fn mark_final(response: &mut ModelInferResponse, last: bool) {
    response.parameters.insert(
        FINAL_RESPONSE_KEY.to_string(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::BoolParam(last)),
        },
    );
}

/// The message for one item of a request's response stream; `None` when there is nothing to
/// send (an empty final item the client did not ask to see).
fn response_message(
    item: StreamedResponse,
    origin: &Origin,
    empty_final_response: bool,
) -> Option<ModelStreamInferResponse> {
    let infer_response = match item.response {
        Some(response) => {
            let mut response = codec::encode_response(response);
            mark_final(&mut response, item.last);
            response
        }
        None if item.last && empty_final_response => origin.final_marker(),
        None => return None,
    };
    Some(ModelStreamInferResponse {
        error_message: String::new(),
        infer_response: Some(infer_response),
    })
}

/// The message (or terminal status) reporting a failed request.
fn error_item(mode: ErrorMode, origin: &Origin, err: ServiceError) -> ResponseItem {
    match mode {
        ErrorMode::InBand => Ok(ModelStreamInferResponse {
            error_message: err.into_message(),
            infer_response: Some(origin.final_marker()),
        }),
        ErrorMode::Status => Err(Status::from(err)),
    }
}

/// Where a request's messages go: onto the rpc's channel, each in the request's send turn.
struct Outbox {
    tx: mpsc::Sender<ResponseItem>,
    turn: Turn,
    mode: ErrorMode,
}

impl Outbox {
    async fn send(&mut self, item: ResponseItem) -> Flow {
        self.turn.wait().await;
        match self.tx.send(item).await {
            Ok(()) => Flow::Continue,
            Err(_) => Flow::Stop,
        }
    }

    /// Reports a failed request; in [`ErrorMode::Status`] that ends the rpc.
    async fn error(&mut self, origin: &Origin, err: ServiceError) -> Flow {
        let id = if origin.id.is_empty() {
            "<id_unknown>"
        } else {
            &origin.id
        };
        tracing::debug!(
            model = %origin.model_name,
            "[request id: {id}] ModelStreamInfer request failed: {}",
            err.message()
        );
        match (
            self.send(error_item(self.mode, origin, err)).await,
            self.mode,
        ) {
            (Flow::Continue, ErrorMode::InBand) => Flow::Continue,
            (Flow::Continue, ErrorMode::Status) | (Flow::Stop, _) => Flow::Stop,
        }
    }
}

/// Whether each model (version) a stream uses is decoupled, looked up once per stream.
#[derive(Debug, Default)]
struct DecoupledModels(HashMap<(String, Option<i64>), bool>);

impl DecoupledModels {
    async fn check(&mut self, service: &dyn InferenceService, request: &InferRequest) -> bool {
        let key = (request.model_name.clone(), request.model_version);
        if let Some(decoupled) = self.0.get(&key) {
            return *decoupled;
        }
        match service.model_config(&key.0, key.1).await {
            Ok(config) => {
                let decoupled = config
                    .model_transaction_policy
                    .is_some_and(|policy| policy.decoupled);
                self.0.insert(key, decoupled);
                decoupled
            }
            // The request itself will fail the same way; its error keeps request order.
            Err(_) => false,
        }
    }
}

/// Owns the rpc: reads requests, runs each in its own task, and returns when the client is gone,
/// an error ended the rpc, or the client half-closed and every request finished. Returning
/// drops the `JoinSet`, which aborts the request tasks still running.
async fn stream_task<S>(
    service: Arc<dyn InferenceService>,
    requests: S,
    mode: ErrorMode,
    context: RequestContext,
    limits: RequestLimits,
    tx: mpsc::Sender<ResponseItem>,
) where
    S: Stream<Item = Result<ModelInferRequest, Status>> + Send,
{
    let mut requests = std::pin::pin!(requests);
    let mut in_flight: JoinSet<Flow> = JoinSet::new();
    let mut order = StreamOrder::default();
    let mut decoupled = DecoupledModels::default();
    let mut reading = true;
    while reading || !in_flight.is_empty() {
        tokio::select! {
            () = tx.closed() => return,
            next = requests.next(), if reading => match next {
                Some(Ok(message)) => {
                    let origin = Origin::of(&message);
                    let decoded = codec::decode_stream_request(message, &limits).map(|mut r| {
                        r.request.context = context.clone();
                        r
                    });
                    let turns = match &decoded {
                        Ok(r) => {
                            let ordered = !decoupled.check(service.as_ref(), &r.request).await;
                            order.admit(sequence_key(&r.request), ordered)
                        }
                        // Triton too answers a request it could not read in request order.
                        Err(_) => order.admit(None, true),
                    };
                    let outbox = Outbox { tx: tx.clone(), turn: turns.send, mode };
                    let task = request_task(service.clone(), decoded, turns.start, origin, outbox);
                    in_flight.spawn(task);
                }
                // The request stream broke (reset, oversized or malformed message): pass the
                // status on; nothing more can be read.
                Some(Err(status)) => {
                    let _ = tx.send(Err(status)).await;
                    return;
                }
                None => reading = false,
            },
            Some(joined) = in_flight.join_next(), if !in_flight.is_empty() => match joined {
                Ok(Flow::Continue) => {}
                Ok(Flow::Stop) => return,
                Err(err) => tracing::error!("a ModelStreamInfer request task failed: {err}"),
            },
        }
    }
}

/// Runs one request once its start turn comes and forwards its messages through `outbox`.
/// Holding `start` and `outbox` to the end keeps later requests of the orders waiting.
async fn request_task(
    service: Arc<dyn InferenceService>,
    decoded: ServiceResult<StreamRequest>,
    mut start: Turn,
    origin: Origin,
    mut outbox: Outbox,
) -> Flow {
    let StreamRequest {
        request,
        empty_final_response,
        shm,
    } = match decoded {
        Ok(decoded) => decoded,
        Err(err) => return outbox.error(&origin, err).await,
    };
    if !shm.is_empty() {
        let err = ServiceError::unsupported(
            "client shared memory is not supported on ModelStreamInfer yet; use ModelInfer or HTTP infer, or send the tensors in the message",
        );
        return outbox.error(&origin, err).await;
    }
    start.wait().await;
    let mut responses = match service.infer_stream(request).await {
        Ok(responses) => responses,
        Err(err) => return outbox.error(&origin, err).await,
    };
    while let Some(item) = responses.next().await {
        let item = match item {
            Ok(item) => item,
            Err(err) => return outbox.error(&origin, err).await,
        };
        let last = item.last;
        if let Some(message) = response_message(item, &origin, empty_final_response)
            && outbox.send(Ok(message)).await == Flow::Stop
        {
            return Flow::Stop;
        }
        if last {
            return Flow::Continue;
        }
    }
    // The stream ended without an item marked last: close the request for a client waiting on
    // the final flag, as an empty final item would have.
    let end = StreamedResponse {
        response: None,
        last: true,
    };
    match response_message(end, &origin, empty_final_response) {
        Some(message) => outbox.send(Ok(message)).await,
        None => Flow::Continue,
    }
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
