//! `ModelStreamInfer`: many requests on one bidirectional stream, each answered by zero or more
//! responses (decoupled models) or exactly one (all others).
//!
//! ```text
//! client ─request─► stream_task (one per rpc, owns everything below)
//!                     ├─ StreamHandler::place   read the request (typed: decode_stream_request)
//!                     ├─ StreamOrder::admit     places in the start and send orders
//!                     └─ JoinSet: one StreamHandler::run task per request, run concurrently
//!                          typed: InferenceService::infer_stream ─► ResponseStream
//!                            each item ─► response_message (+ triton_final_response)
//!                              ─► Outbox (waits for its send turn) ─┐
//! client ◄─ReceiverStream◄─ bounded mpsc (GrpcConfig::stream_response_buffer) ◄┘
//! ```
//!
//! The skeleton ([`serve_with`]: reading, orders, tasks, errors, cancellation) is generic over a
//! [`StreamHandler`]: the typed handler here decodes each request for an [`InferenceService`];
//! the router's pass-through (`nereid_router`, `stream_passthrough`) forwards each as bytes to a
//! worker's own `ModelStreamInfer` and keeps the same rules.
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
use std::future::Future;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::metadata::MetadataMap;

use crate::grpc::stream_order::{SequenceKey, StreamOrder, Turn, sequence_key};
use nereid_proto::codec::{self, RequestLimits, StreamRequest};
use nereid_proto::pb::inference::infer_parameter::ParameterChoice;
use nereid_proto::pb::inference::{
    InferParameter, ModelInferRequest, ModelInferResponse, ModelStreamInferResponse,
};
use nereid_proto::{
    InferenceService, Parameters, RequestContext, ServiceError, ServiceResult, StreamedResponse,
};

/// Response parameter marking a request's last response.
pub(crate) const FINAL_RESPONSE_KEY: &str = "triton_final_response";

/// Client metadata that asks for errors as gRPC statuses.
pub const GRPC_ERROR_KEY: &str = "triton_grpc_error";

/// One item of the rpc's response stream.
pub(crate) type ResponseItem = Result<ModelStreamInferResponse, Status>;

/// The rpc's response stream, as tonic sends it.
pub(crate) type Responses = ReceiverStream<ResponseItem>;

/// How a failed request is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorMode {
    /// Triton's default: an `error_message` response; the stream stays open.
    InBand,
    /// The client sent `triton_grpc_error: true`: the first error ends the rpc with its status.
    Status,
}

impl ErrorMode {
    /// Reads the mode from the client's metadata at stream start (`true` exactly, as Triton).
    pub fn from_metadata(metadata: &MetadataMap) -> ErrorMode {
        match metadata.get(GRPC_ERROR_KEY).map(|v| v.to_str()) {
            Some(Ok("true")) => ErrorMode::Status,
            _ => ErrorMode::InBand,
        }
    }
}

/// Whether the stream goes on after a request task or an error report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// The stream keeps reading requests and sending responses.
    Continue,
    /// The client is gone, or an error ended the rpc.
    Stop,
}

/// What one kind of `ModelStreamInfer` does with its requests; [`serve_with`] owns the rest:
/// reading the client's messages, the start and send orders, one task per request, the end of
/// the rpc and cancellation. The typed handler here decodes requests for an
/// [`InferenceService`]; the router's pass-through forwards them as bytes.
pub trait StreamHandler: Send + 'static {
    /// A client message as the rpc's codec delivers it.
    type Request: Send + 'static;
    /// A response message as the rpc's codec sends it; error responses are built as
    /// `ModelStreamInferResponse`s and converted.
    type Message: From<ModelStreamInferResponse> + Send + 'static;
    /// A request read and placed, ready to run.
    type Ready: Send + 'static;

    /// Reads one request, on the stream's task in arrival order: where it goes in the orders,
    /// and what [`Self::run`] gets. A request that cannot be read is placed too (in request
    /// order, as Triton answers it) and reports its error when run.
    fn place(&mut self, request: Self::Request)
    -> impl Future<Output = Placed<Self::Ready>> + Send;

    /// Runs one request in its own task: waits on `start` before starting it, sends its
    /// messages through `outbox`. Holding both to the end keeps later requests of the orders
    /// waiting.
    fn run(
        &self,
        ready: Self::Ready,
        start: Turn,
        outbox: Outbox<Self::Message>,
    ) -> impl Future<Output = Flow> + Send + 'static;
}

/// A request's places in the stream's orders (see `super::stream_order`).
#[derive(Debug)]
pub struct Placed<R> {
    /// The sequence it belongs to: it starts after the sequence's previous request.
    pub sequence: Option<SequenceKey>,
    /// Whether its messages go out in request order (a model that is not decoupled).
    pub ordered: bool,
    /// The decoded request, handed to the handler once its turn is placed.
    pub ready: R,
}

/// Starts serving one `ModelStreamInfer` rpc with `handler` and returns its response stream
/// at once; a task reads `requests` until the client half-closes. At most `buffer` (at least 1)
/// messages wait unsent.
pub fn serve_with<H, S>(
    handler: H,
    requests: S,
    mode: ErrorMode,
    buffer: usize,
) -> ReceiverStream<Result<H::Message, Status>>
where
    H: StreamHandler,
    S: Stream<Item = Result<H::Request, Status>> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(buffer.max(1));
    tokio::spawn(stream_task(handler, requests, mode, tx));
    ReceiverStream::new(rx)
}

/// Starts serving one `ModelStreamInfer` rpc over `service` (see [`serve_with`]). Every
/// request of the stream carries `context`, read from the rpc's metadata: the stream's trace
/// context and deadline are those of each of its requests. Each request is decoded within
/// `limits`; one beyond them is answered with its error like any bad request. `forwarded` are
/// the stream's metadata forwarded as parameters (`--grpc-header-forward-pattern`), added to each
/// request's own; when forwarding failed, each request is answered with that error.
pub(crate) fn serve_stream<S>(
    service: Arc<dyn InferenceService>,
    requests: S,
    mode: ErrorMode,
    context: RequestContext,
    forwarded: ServiceResult<Parameters>,
    buffer: usize,
    limits: RequestLimits,
) -> Responses
where
    S: Stream<Item = Result<ModelInferRequest, Status>> + Send + 'static,
{
    let handler = TypedStream {
        service,
        context,
        forwarded,
        limits,
        decoupled: DecoupledModels::default(),
    };
    serve_with(handler, requests, mode, buffer)
}

/// What a request is called on the wire, kept before decoding to label its error responses.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Origin {
    /// The `model_name` field as the client sent it.
    pub model_name: String,
    /// The `model_version` field as the client sent it; empty for the latest version.
    pub model_version: String,
    /// The request's `id` field, echoed in its responses; may be empty.
    pub id: String,
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
pub struct Outbox<M> {
    tx: mpsc::Sender<Result<M, Status>>,
    turn: Turn,
    mode: ErrorMode,
}

impl<M: From<ModelStreamInferResponse>> Outbox<M> {
    /// How the rpc reports a failed request.
    pub fn mode(&self) -> ErrorMode {
        self.mode
    }

    /// Sends `item` in the request's turn; a status ends the rpc (the caller stops).
    pub async fn send(&mut self, item: Result<M, Status>) -> Flow {
        self.turn.wait().await;
        match self.tx.send(item).await {
            Ok(()) => Flow::Continue,
            Err(_) => Flow::Stop,
        }
    }

    /// Reports a failed request; in [`ErrorMode::Status`] that ends the rpc.
    pub async fn error(&mut self, origin: &Origin, err: ServiceError) -> Flow {
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
        let item = error_item(self.mode, origin, err).map(M::from);
        match (self.send(item).await, self.mode) {
            (Flow::Continue, ErrorMode::InBand) => Flow::Continue,
            (Flow::Continue, ErrorMode::Status) | (Flow::Stop, _) => Flow::Stop,
        }
    }
}

/// Whether each model (version) a stream uses is decoupled, looked up once per stream.
#[derive(Debug, Default)]
pub struct DecoupledModels(HashMap<(String, Option<i64>), bool>);

impl DecoupledModels {
    /// Whether `model` (`version`) is decoupled, from its config; `false` when the config
    /// cannot be read (the request itself will fail the same way, and its error keeps request
    /// order).
    pub async fn check(
        &mut self,
        service: &dyn InferenceService,
        model: &str,
        version: Option<i64>,
    ) -> bool {
        let key = (model.to_string(), version);
        if let Some(decoupled) = self.0.get(&key) {
            return *decoupled;
        }
        match service.model_config(model, version).await {
            Ok(config) => {
                let decoupled = config
                    .model_transaction_policy
                    .is_some_and(|policy| policy.decoupled);
                self.0.insert(key, decoupled);
                decoupled
            }
            Err(_) => false,
        }
    }
}

/// Owns the rpc: reads requests, runs each in its own task, and returns when the client is gone,
/// an error ended the rpc, or the client half-closed and every request finished. Returning
/// drops the `JoinSet`, which aborts the request tasks still running.
async fn stream_task<H, S>(
    mut handler: H,
    requests: S,
    mode: ErrorMode,
    tx: mpsc::Sender<Result<H::Message, Status>>,
) where
    H: StreamHandler,
    S: Stream<Item = Result<H::Request, Status>> + Send,
{
    let mut requests = std::pin::pin!(requests);
    let mut in_flight: JoinSet<Flow> = JoinSet::new();
    let mut order = StreamOrder::default();
    let mut reading = true;
    while reading || !in_flight.is_empty() {
        tokio::select! {
            () = tx.closed() => return,
            next = requests.next(), if reading => match next {
                Some(Ok(message)) => {
                    let placed = handler.place(message).await;
                    let turns = order.admit(placed.sequence, placed.ordered);
                    let outbox = Outbox { tx: tx.clone(), turn: turns.send, mode };
                    in_flight.spawn(handler.run(placed.ready, turns.start, outbox));
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

/// The typed stream: each request decoded (`codec::decode_stream_request`) and run by an
/// [`InferenceService`].
struct TypedStream {
    service: Arc<dyn InferenceService>,
    context: RequestContext,
    /// The stream's forwarded metadata, or why forwarding it failed.
    forwarded: ServiceResult<Parameters>,
    limits: RequestLimits,
    decoupled: DecoupledModels,
}

impl StreamHandler for TypedStream {
    type Request = ModelInferRequest;
    type Message = ModelStreamInferResponse;
    type Ready = (ServiceResult<StreamRequest>, Origin);

    async fn place(&mut self, message: ModelInferRequest) -> Placed<Self::Ready> {
        let origin = Origin::of(&message);
        let decoded = codec::decode_stream_request(message, &self.limits).and_then(|mut r| {
            r.request.context = self.context.clone();
            // Each request of the stream is traced on its own, from when it was read.
            r.request.context.received = Some(std::time::Instant::now());
            let forwarded = self.forwarded.clone()?;
            r.request.parameters.extend(forwarded);
            Ok(r)
        });
        let (sequence, ordered) = match &decoded {
            Ok(r) => {
                let request = &r.request;
                let decoupled = self
                    .decoupled
                    .check(
                        self.service.as_ref(),
                        &request.model_name,
                        request.model_version,
                    )
                    .await;
                (sequence_key(request), !decoupled)
            }
            // Triton too answers a request it could not read in request order.
            Err(_) => (None, true),
        };
        Placed {
            sequence,
            ordered,
            ready: (decoded, origin),
        }
    }

    fn run(
        &self,
        (decoded, origin): Self::Ready,
        start: Turn,
        outbox: Outbox<ModelStreamInferResponse>,
    ) -> impl Future<Output = Flow> + Send + 'static {
        request_task(self.service.clone(), decoded, start, origin, outbox)
    }
}

/// Runs one request once its start turn comes and forwards its messages through `outbox`.
/// Holding `start` and `outbox` to the end keeps later requests of the orders waiting.
async fn request_task(
    service: Arc<dyn InferenceService>,
    decoded: ServiceResult<StreamRequest>,
    mut start: Turn,
    origin: Origin,
    mut outbox: Outbox<ModelStreamInferResponse>,
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
        return outbox.error(&origin, shared_memory_refused()).await;
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

/// Why a stream request naming client shared memory is refused.
pub fn shared_memory_refused() -> ServiceError {
    ServiceError::unsupported(
        "client shared memory is not supported on ModelStreamInfer yet; use ModelInfer or HTTP infer, or send the tensors in the message",
    )
}

#[cfg(test)]
#[path = "stream_tests.rs"]
mod tests;
