//! The pass-through path of gRPC `ModelStreamInfer`: each client message is scanned for what
//! routing needs and forwarded as bytes on a worker `ModelStreamInfer` of its own; the worker's
//! response frames go back to the client as the worker encoded them. No tensor is decoded or
//! re-encoded, either way.
//!
//! ```text
//! client ─ModelStreamInfer─► restricted-API check ─► ModelStreamInferRoute (RawCodec)
//!   ─► nereid_frontend::serve_stream_with(PassThroughStream)   the typed handler's skeleton:
//!        place (stream task, arrival order)                    orders, error mode, cancellation
//!          wire_scan::scan_request, checked_version, shared memory refused
//!          decoupled? RouterService::model_config, once per model/version per stream
//!        run (one task per request, after its start turn)
//!          RouterService::open_admitted: permit, choice, scale from zero, retry before opening
//!            ─► Workers::infer_stream_raw(client bytes + version field) ─► worker stream
//!               (its load report noted for choice, see crate::load)
//!          each worker frame ─► Outbox (its send turn) ─► client, bytes unchanged
//!          the worker's stream ends ─► the request is done
//! ```
//!
//! The rules are the typed handler's (`nereid_frontend`'s stream module): answers of models
//! that are not decoupled go out in request order, decoupled ones as produced; requests of one
//! sequence start one after another; a bad request is answered in-band, naming it, or ends the
//! rpc with its status when the client set `triton_grpc_error: true`. The worker's own frontend
//! marks `triton_final_response` and sends the empty final response when the client's message
//! asked for it (the client's parameters travel in its bytes). In status mode the worker is
//! asked for statuses too, so a request's error keeps its class; a worker frame carrying an
//! `error_message` still ends the rpc with a status. A worker stream that fails (unreachable,
//! cut) is that request's error. A client that goes away drops the stream task, which aborts
//! the request tasks: their worker streams, permits and in-flight guards go with them.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::{Stream, StreamExt};
use nereid_frontend::{
    DecoupledModels, ErrorMode, Flow, Origin, Outbox, Placed, StreamHandler, Turn,
    grpc_request_context, serve_stream_with, shared_memory_refused,
};
use nereid_proto::pb::inference::ModelStreamInferResponse;
use nereid_proto::{CorrelationId, InferenceService, RequestContext, ServiceError, ServiceResult};
use prost::Message;
use tonic::codegen::BoxFuture;

use crate::choice::Ask;
use crate::error::RouterResult;
use crate::metrics::{Classify, Outcome};
use crate::passthrough::{PassThroughConfig, checked_version};
use crate::raw_codec::RawMessage;
use crate::service::RouterService;
use crate::wire_scan::{ScannedRequest, scan_request, text_field, version_suffix};

/// `id`, field 3 of `ModelInferRequest`.
const REQUEST_ID_FIELD: u32 = 3;
/// `error_message`, field 1 of `ModelStreamInferResponse`.
const ERROR_MESSAGE_FIELD: u32 = 1;

/// The `ModelStreamInfer` rpc of the pass-through path (served by `grpc_routes`).
#[derive(Clone)]
pub(crate) struct ModelStreamInferRoute {
    router: Arc<RouterService>,
    config: Arc<PassThroughConfig>,
}

impl ModelStreamInferRoute {
    pub(crate) fn new(router: Arc<RouterService>, config: Arc<PassThroughConfig>) -> Self {
        ModelStreamInferRoute { router, config }
    }

    pub(crate) fn config(&self) -> &PassThroughConfig {
        &self.config
    }
}

impl tonic::server::StreamingService<Bytes> for ModelStreamInferRoute {
    type Response = RawMessage;
    type ResponseStream = tokio_stream::wrappers::ReceiverStream<Result<RawMessage, tonic::Status>>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<tonic::Streaming<Bytes>>) -> Self::Future {
        let route = self.clone();
        Box::pin(async move {
            let mode = ErrorMode::from_metadata(request.metadata());
            let context = grpc_request_context(request.metadata(), Instant::now());
            let buffer = route.config.grpc.stream_response_buffer;
            let handler = PassThroughStream {
                router: route.router,
                config: route.config,
                context,
                decoupled: DecoupledModels::default(),
            };
            let responses = serve_stream_with(handler, request.into_inner(), mode, buffer);
            Ok(tonic::Response::new(responses))
        })
    }
}

/// One rpc's requests, forwarded as bytes.
struct PassThroughStream {
    router: Arc<RouterService>,
    config: Arc<PassThroughConfig>,
    /// Read from the rpc's metadata: every request of the stream carries its deadline and
    /// trace context.
    context: RequestContext,
    decoupled: DecoupledModels,
}

/// A client message read and checked, ready to run.
struct Ready {
    message: Bytes,
    origin: Origin,
    checked: ServiceResult<Checked>,
}

/// What routing reads of a request that passed the checks.
struct Checked {
    scanned: ScannedRequest,
    version: Option<i64>,
}

impl PassThroughStream {
    /// The unary pass-through's checks, with shared memory refused as the typed stream
    /// handler refuses it.
    fn check(&self, message: &[u8]) -> ServiceResult<Checked> {
        let scanned = scan_request(message)?;
        let version = checked_version(
            &scanned.model_name,
            &scanned.model_version,
            &scanned.inputs,
            scanned.outputs,
            None,
            &self.config.grpc.limits,
            &self.config.shared_memory_off,
        )?;
        if scanned.shared_memory.is_some() {
            return Err(shared_memory_refused());
        }
        Ok(Checked { scanned, version })
    }
}

/// What a message names itself, for its error responses: read field by field so that a message
/// that does not scan is still named as far as it can be.
fn origin_of(message: &[u8], scanned: Option<&ScannedRequest>) -> Origin {
    let (model_name, model_version) = match scanned {
        Some(s) => (s.model_name.clone(), s.model_version.clone()),
        None => (
            text_field(message, 1).unwrap_or_default(),
            text_field(message, 2).unwrap_or_default(),
        ),
    };
    Origin {
        model_name,
        model_version,
        id: text_field(message, REQUEST_ID_FIELD).unwrap_or_default(),
    }
}

impl StreamHandler for PassThroughStream {
    type Request = Bytes;
    type Message = RawMessage;
    type Ready = Ready;

    async fn place(&mut self, message: Bytes) -> Placed<Ready> {
        let checked = self.check(&message);
        let origin = origin_of(&message, checked.as_ref().ok().map(|c| &c.scanned));
        let (sequence, ordered) = match &checked {
            Ok(Checked { scanned, version }) => {
                let service: &dyn InferenceService = self.router.as_ref();
                let decoupled = self
                    .decoupled
                    .check(service, &scanned.model_name, *version)
                    .await;
                let sequence = scanned
                    .options
                    .sequence_id
                    .clone()
                    .map(|id: CorrelationId| (scanned.model_name.clone(), *version, id));
                (sequence, !decoupled)
            }
            // Triton too answers a request it could not read in request order.
            Err(_) => (None, true),
        };
        Placed {
            sequence,
            ordered,
            ready: Ready {
                message,
                origin,
                checked,
            },
        }
    }

    fn run(
        &self,
        ready: Ready,
        start: Turn,
        outbox: Outbox<RawMessage>,
    ) -> impl Future<Output = Flow> + Send + 'static {
        request_task(
            self.router.clone(),
            self.context.clone(),
            ready,
            start,
            outbox,
        )
    }
}

/// Runs one request once its start turn comes: opens its worker stream and relays the frames
/// through `outbox` until the worker ends it.
async fn request_task(
    router: Arc<RouterService>,
    context: RequestContext,
    ready: Ready,
    mut start: Turn,
    mut outbox: Outbox<RawMessage>,
) -> Flow {
    let Ready {
        message,
        origin,
        checked,
    } = ready;
    let Checked { scanned, version } = match checked {
        Ok(checked) => checked,
        Err(err) => return outbox.error(&origin, err).await,
    };
    start.wait().await;
    let status_mode = outbox.mode() == ErrorMode::Status;
    let opened = router
        .open_stream_raw(&message, &scanned, version, context, status_mode)
        .await;
    let mut frames = match opened {
        Ok(frames) => std::pin::pin!(frames),
        Err(err) => return outbox.error(&origin, err.into()).await,
    };
    while let Some(frame) = frames.next().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(err) => return outbox.error(&origin, err.into()).await,
        };
        if status_mode && let Some(error) = in_band_error(&frame) {
            return outbox.error(&origin, error).await;
        }
        if outbox.send(Ok(RawMessage::new(frame))).await == Flow::Stop {
            return Flow::Stop;
        }
    }
    Flow::Continue
}

/// The error a worker frame reports in-band (a non-empty `error_message`), if any. Its class
/// did not travel with it: it is reported as the worker's internal error.
fn in_band_error(frame: &[u8]) -> Option<ServiceError> {
    text_field(frame, ERROR_MESSAGE_FIELD)
        .filter(|message| !message.is_empty())
        .map(ServiceError::internal)
}

/// A worker stream that opened (its later errors reach the client in the stream).
struct Opened<S>(S);

impl<S> Classify for Opened<S> {
    fn outcome(&self) -> Outcome {
        Outcome::Success
    }
}

impl RouterService {
    /// Opens the worker stream of one scanned request (`message`, `version` as checked),
    /// counted as `infer_stream` counts it: the permit and in-flight guard live as long as the
    /// returned frames. With `grpc_error` the worker reports the request's errors as statuses.
    async fn open_stream_raw(
        &self,
        message: &Bytes,
        scanned: &ScannedRequest,
        version: Option<i64>,
        context: RequestContext,
        grpc_error: bool,
    ) -> RouterResult<impl Stream<Item = RouterResult<Bytes>> + Send + 'static + use<>> {
        let ask = Ask::of(&scanned.model_name, version, &scanned.options);
        let context = &context;
        let opening = self.open_admitted(&ask, context.deadline, |target, guard| {
            let raw = RawMessage {
                head: message.clone(),
                tail: version_suffix(&scanned.model_version, &target.version.to_string()),
            };
            async move {
                let (frames, load) = self
                    .workers
                    .infer_stream_raw(&target.addr, raw, context, &scanned.model_name, grpc_error)
                    .await?;
                if let Some(load) = load {
                    self.note_load(&scanned.model_name, &target, load);
                }
                Ok(frames.map(move |frame| {
                    let _held = &guard;
                    frame
                }))
            }
        });
        let opened = self.counted(&scanned.model_name, async {
            opening.await.map(|(frames, permit)| {
                Opened(frames.map(move |frame| {
                    let _held = &permit;
                    frame
                }))
            })
        });
        let Opened(frames) = opened.await?;
        Ok(frames)
    }
}

/// An in-band error response encoded for the client, as the typed handler sends it.
impl From<ModelStreamInferResponse> for RawMessage {
    fn from(response: ModelStreamInferResponse) -> RawMessage {
        RawMessage::new(Bytes::from(response.encode_to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_proto::pb::inference::{ModelInferRequest, ModelInferResponse};

    #[test]
    fn a_request_is_named_even_when_it_does_not_scan() {
        let request = ModelInferRequest {
            model_name: "m".into(),
            model_version: "2".into(),
            id: "r1".into(),
            ..Default::default()
        };
        let bytes = request.encode_to_vec();
        let scanned = scan_request(&bytes).unwrap();
        let named = origin_of(&bytes, Some(&scanned));
        assert_eq!((named.model_name.as_str(), named.id.as_str()), ("m", "r1"));
        // A truncated tail: the fields before it still name the request.
        let mut broken = bytes.clone();
        broken.extend_from_slice(&[0x2a, 0x05, 0x01]);
        assert!(scan_request(&broken).is_err());
        assert_eq!(origin_of(&broken, None), named);
        assert_eq!(named.model_version, "2");
        assert_eq!(origin_of(b"\xff", None), Origin::default());
    }

    #[test]
    fn an_in_band_error_frame_is_recognised() {
        let failed = ModelStreamInferResponse {
            error_message: "no such input 'y'".into(),
            infer_response: Some(ModelInferResponse::default()),
        };
        let error = in_band_error(&failed.encode_to_vec()).unwrap();
        assert_eq!(error.message(), "no such input 'y'");
        let answer = ModelStreamInferResponse {
            error_message: String::new(),
            infer_response: Some(ModelInferResponse {
                id: "r1".into(),
                ..Default::default()
            }),
        };
        assert!(in_band_error(&answer.encode_to_vec()).is_none());
    }
}
