//! `ModelStreamInfer` through the router's pass-through (`nereid_router::grpc_routes`,
//! in-process on 127.0.0.1:0) in front of a fake worker that speaks the wire directly: it
//! records every request's bytes and metadata and echoes each request on its own stream, so
//! the tests see what the router forwards and relays byte for byte.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{StreamExt, stream};
use nereid_frontend::{GrpcConfig, RestrictedApis};
use nereid_proto::pb::cluster::{
    Model, Replica, ReplicaState, StateSnapshot, WatchEvent, watch_event,
};
use nereid_proto::pb::inference::infer_parameter::ParameterChoice;
use nereid_proto::pb::inference::model_infer_request::InferInputTensor;
use nereid_proto::pb::inference::{
    InferParameter, ModelConfig, ModelConfigRequest, ModelConfigResponse, ModelInferRequest,
    ModelInferResponse, ModelStreamInferResponse, ModelTransactionPolicy,
};
use nereid_router::{
    PassThroughConfig, RawCodec, RawMessage, RouterService, RouterServiceConfig, SharedTable,
    SplitMix64, grpc_routes,
};
use nereid_test_support::{Gate, serve_routes};
use prost::Message;
use tonic::codegen::{BoxFuture, http};
use tonic::{Code, Status};

mod echo_cluster;

use echo_cluster::{bounded, node};

const STREAM_PATH: &str = "/inference.GRPCInferenceService/ModelStreamInfer";
const CONFIG_PATH: &str = "/inference.GRPCInferenceService/ModelConfig";

/// What the fake worker saw of one `ModelStreamInfer`: the message's bytes and whether the
/// call asked for errors as statuses.
#[derive(Clone, Debug)]
struct Seen {
    message: Bytes,
    grpc_error: bool,
}

/// A worker serving `echo` (not decoupled) and `dec` (decoupled) on the wire. Each request is
/// answered with one frame (see [`answer`]), or, for the id `fail`, with an error: in-band, or
/// as INVALID_ARGUMENT when asked for statuses. A request with the parameter `held` waits at
/// `held` under its id until the test releases it; `sent` records each id once its frame has
/// been handed to the worker's gRPC stream.
#[derive(Clone)]
struct FakeWorker {
    seen: Arc<Mutex<Vec<Seen>>>,
    held: Gate<String>,
    sent: Gate<String>,
}

impl Default for FakeWorker {
    fn default() -> Self {
        FakeWorker {
            seen: Arc::default(),
            held: Gate::new(),
            sent: Gate::opened(),
        }
    }
}

/// The frame the fake worker sends for `request`: its id, model and version (as the worker read
/// them), the final flag, and its raw inputs as outputs.
fn answer(request: &ModelInferRequest) -> Bytes {
    let mut response = ModelInferResponse {
        model_name: request.model_name.clone(),
        model_version: request.model_version.clone(),
        id: request.id.clone(),
        raw_output_contents: request.raw_input_contents.clone(),
        ..Default::default()
    };
    response
        .parameters
        .insert("triton_final_response".into(), bool_param(true));
    Bytes::from(
        ModelStreamInferResponse {
            error_message: String::new(),
            infer_response: Some(response),
        }
        .encode_to_vec(),
    )
}

fn bool_param(v: bool) -> InferParameter {
    InferParameter {
        parameter_choice: Some(ParameterChoice::BoolParam(v)),
    }
}

fn is_held(request: &ModelInferRequest) -> bool {
    request.parameters.contains_key("held")
}

type Frames = futures::stream::BoxStream<'static, Result<Bytes, Status>>;

impl FakeWorker {
    fn respond(&self, message: Bytes, grpc_error: bool) -> Frames {
        self.seen.lock().unwrap().push(Seen {
            message: message.clone(),
            grpc_error,
        });
        let request = ModelInferRequest::decode(message).unwrap();
        let held = is_held(&request).then(|| (self.held.clone(), request.id.clone()));
        let (sent, id) = (self.sent.clone(), request.id.clone());
        let item = if request.id != "fail" {
            Ok(answer(&request))
        } else if grpc_error {
            Err(Status::invalid_argument("worker refused 'fail'"))
        } else {
            let mut named = ModelInferResponse {
                id: request.id.clone(),
                ..Default::default()
            };
            named
                .parameters
                .insert("triton_final_response".into(), bool_param(true));
            Ok(Bytes::from(
                ModelStreamInferResponse {
                    error_message: "worker refused 'fail'".into(),
                    infer_response: Some(named),
                }
                .encode_to_vec(),
            ))
        };
        let answered = stream::once(async move {
            if let Some((gate, id)) = held {
                gate.pass_async(id).await;
            }
            item
        });
        // Polled for after the frame was taken: the frame is on its way to the router.
        let recorded =
            stream::once(async move { sent.pass_async(id).await }).filter_map(|()| async { None });
        answered.chain(recorded).boxed()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

/// The fake worker's `ModelStreamInfer`: every message of the call answered on it.
#[derive(Clone)]
struct StreamRoute(FakeWorker);

impl tonic::server::StreamingService<Bytes> for StreamRoute {
    type Response = RawMessage;
    type ResponseStream = futures::stream::BoxStream<'static, Result<RawMessage, Status>>;
    type Future = BoxFuture<tonic::Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: tonic::Request<tonic::Streaming<Bytes>>) -> Self::Future {
        let worker = self.0.clone();
        let grpc_error = request
            .metadata()
            .get("triton_grpc_error")
            .is_some_and(|v| v == "true");
        let requests = request.into_inner();
        Box::pin(async move {
            let frames = requests
                .map(move |message| match message {
                    Ok(message) => worker.respond(message, grpc_error),
                    Err(status) => stream::once(async move { Err(status) }).boxed(),
                })
                .flatten_unordered(None)
                .map(|frame| frame.map(RawMessage::new))
                .boxed();
            Ok(tonic::Response::new(frames))
        })
    }
}

/// The fake worker's `ModelConfig`: `dec` is decoupled, every other model is not.
#[derive(Clone)]
struct ConfigRoute;

impl tonic::server::UnaryService<Bytes> for ConfigRoute {
    type Response = RawMessage;
    type Future = BoxFuture<tonic::Response<RawMessage>, Status>;

    fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
        Box::pin(async move {
            let asked = ModelConfigRequest::decode(request.into_inner()).unwrap();
            let config = ModelConfig {
                name: asked.name.clone(),
                model_transaction_policy: Some(ModelTransactionPolicy {
                    decoupled: asked.name == "dec",
                }),
                ..Default::default()
            };
            let response = ModelConfigResponse {
                config: Some(config),
            };
            Ok(tonic::Response::new(RawMessage::new(Bytes::from(
                response.encode_to_vec(),
            ))))
        })
    }
}

/// A tower service running one of the fake worker's rpcs with [`RawCodec`].
#[derive(Clone)]
enum Rpc {
    Stream(StreamRoute),
    Config(ConfigRoute),
}

impl tonic::codegen::Service<http::Request<axum::body::Body>> for Rpc {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, call: http::Request<axum::body::Body>) -> Self::Future {
        let rpc = self.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(RawCodec);
            Ok(match rpc {
                Rpc::Stream(route) => grpc.streaming(route, call).await,
                Rpc::Config(route) => grpc.unary(route, call).await,
            })
        })
    }
}

fn replica(id: u64, model: &str) -> Replica {
    Replica {
        id,
        model: model.into(),
        version: 1,
        node: "w1".into(),
        state: ReplicaState::Ready as i32,
        ..Default::default()
    }
}

/// The fake worker, and the router's gRPC routes in front of it (`echo` and `dec`, version 1).
async fn setup() -> (FakeWorker, SocketAddr) {
    let worker = FakeWorker::default();
    let router = axum::Router::new()
        .route_service(STREAM_PATH, Rpc::Stream(StreamRoute(worker.clone())))
        .route_service(CONFIG_PATH, Rpc::Config(ConfigRoute));
    let worker_addr = serve_routes(tonic::service::Routes::from(router)).await;
    let table = Arc::new(SharedTable::default());
    let model = |name: &str| Model {
        name: name.into(),
        available_versions: vec![1],
        ..Default::default()
    };
    table.apply(&WatchEvent {
        revision: 1,
        event: Some(watch_event::Event::Snapshot(StateSnapshot {
            models: vec![model("echo"), model("dec")],
            nodes: vec![node("w1", worker_addr)],
            replicas: vec![replica(1, "echo"), replica(2, "dec")],
        })),
    });
    let service = RouterService::with_random(
        RouterServiceConfig::default(),
        table,
        Box::new(SplitMix64::new(7)),
    );
    let config = PassThroughConfig {
        grpc: GrpcConfig {
            restricted: RestrictedApis::default(),
            ..Default::default()
        },
        shared_memory_off: "not on the router".into(),
    };
    let router_addr = serve_routes(grpc_routes(Arc::new(service), config)).await;
    (worker, router_addr)
}

/// A request of `model` named `id`; `held`: the fake worker holds it until the test releases it.
fn request(model: &str, id: &str, held: bool) -> ModelInferRequest {
    let mut request = ModelInferRequest {
        model_name: model.into(),
        id: id.into(),
        inputs: vec![InferInputTensor {
            name: "x".into(),
            datatype: "INT32".into(),
            shape: vec![1],
            ..Default::default()
        }],
        raw_input_contents: vec![Bytes::from_static(&[7, 0, 0, 0])],
        ..Default::default()
    };
    if held {
        request.parameters.insert("held".into(), bool_param(true));
    }
    request
}

/// Sends `messages` on one `ModelStreamInfer` to `addr` (then half-closes) and returns what
/// comes back: the frames, or the status that refused the rpc.
async fn open(
    addr: SocketAddr,
    messages: Vec<Bytes>,
    grpc_error: bool,
) -> Result<tonic::Streaming<Bytes>, Status> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let mut call = tonic::Request::new(stream::iter(messages.into_iter().map(RawMessage::new)));
    if grpc_error {
        call.metadata_mut()
            .insert("triton_grpc_error", "true".parse().unwrap());
    }
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(STREAM_PATH);
    let response = grpc.streaming(call, path, RawCodec).await?;
    Ok(response.into_inner())
}

/// [`open`], collecting every frame's bytes and the status that ended the rpc.
async fn call(addr: SocketAddr, messages: Vec<Bytes>, grpc_error: bool) -> (Vec<Bytes>, Status) {
    let mut frames = match open(addr, messages, grpc_error).await {
        Ok(frames) => frames,
        Err(status) => return (Vec::new(), status),
    };
    let mut got = Vec::new();
    loop {
        match frames.next().await {
            Some(Ok(frame)) => got.push(frame),
            Some(Err(status)) => return (got, status),
            None => return (got, Status::ok("")),
        }
    }
}

fn decode(frame: &Bytes) -> ModelStreamInferResponse {
    ModelStreamInferResponse::decode(frame.clone()).unwrap()
}

fn id_of(frame: &Bytes) -> String {
    decode(frame).infer_response.unwrap_or_default().id
}

#[tokio::test]
async fn bytes_go_through_unchanged_but_for_the_version() {
    bounded(async {
        let (worker, router) = setup().await;
        let sent = Bytes::from(request("echo", "r1", false).encode_to_vec());
        let (frames, status) = call(router, vec![sent.clone()], false).await;
        assert_eq!(status.code(), Code::Ok, "{status:?}");

        let seen = worker.seen();
        assert_eq!(seen.len(), 1);
        // The client named no version: the router appends the one it chose (field 2, "1").
        let mut expected = sent.to_vec();
        expected.extend_from_slice(&[0x12, 0x01, b'1']);
        assert_eq!(seen[0].message, expected);
        assert!(!seen[0].grpc_error, "errors stay in-band for the worker");

        let forwarded = ModelInferRequest::decode(seen[0].message.clone()).unwrap();
        assert_eq!(
            frames,
            vec![answer(&forwarded)],
            "the worker's frame, unchanged"
        );
        assert_eq!(
            decode(&frames[0]).infer_response.unwrap().model_version,
            "1"
        );

        // A client that names the version is forwarded byte for byte.
        let mut named = request("echo", "r2", false);
        named.model_version = "1".into();
        let sent = Bytes::from(named.encode_to_vec());
        let (frames, _) = call(router, vec![sent.clone()], false).await;
        assert_eq!(worker.seen()[1].message, sent);
        assert_eq!(frames, vec![answer(&named)]);
    })
    .await;
}

#[tokio::test]
async fn answers_keep_request_order_unless_the_model_is_decoupled() {
    bounded(async {
        let (worker, router) = setup().await;
        // Both requests reach the worker; it answers the second one first, then the first.
        let messages = |model: &str| {
            vec![
                Bytes::from(request(model, "slow", true).encode_to_vec()),
                Bytes::from(request(model, "fast", true).encode_to_vec()),
            ]
        };
        let answer_fast_first = async || {
            worker.held.arrived(&"slow".into()).await;
            worker.held.arrived(&"fast".into()).await;
            worker.held.release("fast".into());
            worker.sent.arrived(&"fast".into()).await;
        };

        let mut frames = open(router, messages("echo"), false).await.unwrap();
        answer_fast_first().await;
        worker.held.release("slow".into());
        let mut ids = Vec::new();
        while let Some(frame) = frames.next().await {
            ids.push(id_of(&frame.unwrap()));
        }
        assert_eq!(ids, ["slow", "fast"], "request order");

        let mut frames = open(router, messages("dec"), false).await.unwrap();
        answer_fast_first().await;
        // Relayed as produced: the client has the second answer while the first is held.
        let first = frames.next().await.unwrap().unwrap();
        assert_eq!(id_of(&first), "fast", "decoupled: as produced");
        worker.held.release("slow".into());
        let second = frames.next().await.unwrap().unwrap();
        assert_eq!(id_of(&second), "slow");
        assert!(frames.next().await.is_none());
    })
    .await;
}

#[tokio::test]
async fn errors_are_answered_in_band_naming_the_request() {
    bounded(async {
        let (worker, router) = setup().await;
        let mut bad_version = request("echo", "bad", false);
        bad_version.model_version = "one".into();
        let messages = vec![
            Bytes::from(bad_version.encode_to_vec()),
            Bytes::from(request("echo", "fail", false).encode_to_vec()),
            Bytes::from(request("echo", "ok", false).encode_to_vec()),
        ];
        let (frames, status) = call(router, messages, false).await;
        assert_eq!(status.code(), Code::Ok, "the stream stays open: {status:?}");
        assert_eq!(frames.len(), 3);

        // Refused by the router: never forwarded, answered in order, named and marked final.
        let refused = decode(&frames[0]);
        assert!(
            refused.error_message.contains("one"),
            "{}",
            refused.error_message
        );
        let named = refused.infer_response.unwrap();
        assert_eq!(
            (named.id.as_str(), named.model_name.as_str()),
            ("bad", "echo")
        );
        assert!(matches!(
            named.parameters["triton_final_response"].parameter_choice,
            Some(ParameterChoice::BoolParam(true))
        ));
        // Refused by the worker: its frame, relayed as it is.
        let failed = decode(&frames[1]);
        assert_eq!(failed.error_message, "worker refused 'fail'");
        assert_eq!(id_of(&frames[2]), "ok");
        assert_eq!(worker.seen().len(), 2, "the bad request was not forwarded");
    })
    .await;
}

#[tokio::test]
async fn triton_grpc_error_turns_errors_into_a_status() {
    bounded(async {
        let (worker, router) = setup().await;
        let mut bad_version = request("echo", "bad", false);
        bad_version.model_version = "one".into();
        let messages = vec![
            Bytes::from(bad_version.encode_to_vec()),
            Bytes::from(request("echo", "ok", false).encode_to_vec()),
        ];
        let (frames, status) = call(router, messages, true).await;
        assert!(frames.is_empty(), "{frames:?}");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

        // The worker's error ends the rpc with its own class.
        let messages = vec![Bytes::from(request("echo", "fail", false).encode_to_vec())];
        let (frames, status) = call(router, messages, true).await;
        assert!(frames.is_empty(), "{frames:?}");
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert_eq!(status.message(), "worker refused 'fail'");
        assert!(worker.seen().iter().all(|s| s.grpc_error));
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_worker_is_the_request_error() {
    bounded(async {
        let table = Arc::new(SharedTable::default());
        // Nothing listens on port 1.
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        table.apply(&WatchEvent {
            revision: 1,
            event: Some(watch_event::Event::Snapshot(StateSnapshot {
                models: vec![Model {
                    name: "echo".into(),
                    available_versions: vec![1],
                    ..Default::default()
                }],
                nodes: vec![node("w1", addr)],
                replicas: vec![replica(1, "echo")],
            })),
        });
        let service = RouterService::new(RouterServiceConfig::default(), table);
        let config = PassThroughConfig {
            grpc: GrpcConfig::default(),
            shared_memory_off: String::new(),
        };
        let router = serve_routes(grpc_routes(Arc::new(service), config)).await;
        let messages = vec![Bytes::from(request("echo", "r1", false).encode_to_vec())];
        let (frames, status) = call(router, messages, false).await;
        assert_eq!(status.code(), Code::Ok, "{status:?}");
        let failed = decode(&frames[0]);
        assert!(!failed.error_message.is_empty());
        assert_eq!(failed.infer_response.unwrap().id, "r1");
    })
    .await;
}
