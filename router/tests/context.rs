//! A client's trace context and deadline through the router: the router's own HTTP and gRPC
//! frontends (in-process, on 127.0.0.1:0) in front of one fake worker (a tonic server over a
//! recording service) that keeps the `RequestContext` its gRPC frontend read from the router's
//! metadata.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use nereid_proto::pb::cluster::{
    Model, Node, NodeAddresses, NodeStatus, Replica, ReplicaState, StateSnapshot, WatchEvent,
    watch_event,
};
use nereid_proto::pb::inference::ModelInferRequest;
use nereid_proto::pb::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use nereid_proto::pb::inference::model_infer_request::InferInputTensor;
use nereid_proto::testing::{Answer, FakeModel, FakeService};
use nereid_proto::{
    DataType, InferRequest, InferenceService, RequestContext, ServiceError, Tensor, TraceContext,
};
use nereid_router::SharedTable;
use nereid_router::SplitMix64;
use nereid_router::{RouterService, RouterServiceConfig};
use nereid_test_support::{eventually, serve_routes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;
use tonic::transport::Channel;

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACESTATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";
/// How long the model `slow` takes: far longer than any deadline the tests set.
const SLOW: Duration = Duration::from_secs(5);

/// Serves `slow` (the echo after [`SLOW`]) and echoes every other model, recording each
/// request (its context, and when it arrived) and whether a request was dropped (cancelled)
/// before it finished.
fn recording_worker() -> FakeService {
    FakeService::new("worker")
        .fallback(FakeModel::echo())
        .model("slow", FakeModel::echo().answer(Answer::Delay(SLOW)))
}

/// Serves `service` over gRPC on a free port (until the test's runtime ends).
async fn serve_grpc(service: Arc<dyn InferenceService>) -> SocketAddr {
    serve_routes(nereid_frontend::routes(service, Default::default())).await
}

/// Serves `service` over HTTP on a free port (until the test's runtime ends).
async fn serve_http(service: Arc<dyn InferenceService>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = nereid_frontend::router(service, Default::default());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A worker and a router in front of it, with the router's gRPC and HTTP frontends.
struct Setup {
    worker: Arc<FakeService>,
    router: Arc<RouterService>,
    grpc: GrpcInferenceServiceClient<Channel>,
    http: SocketAddr,
}

async fn setup() -> Setup {
    let worker = Arc::new(recording_worker());
    let worker_addr = serve_grpc(worker.clone()).await;
    let table = Arc::new(SharedTable::default());
    let replica = |id, model: &str| Replica {
        id,
        model: model.into(),
        version: 1,
        node: "w".into(),
        state: ReplicaState::Ready as i32,
        ..Default::default()
    };
    let model = |name: &str| Model {
        name: name.into(),
        available_versions: vec![1],
        ..Default::default()
    };
    table.apply(&WatchEvent {
        revision: 1,
        event: Some(watch_event::Event::Snapshot(StateSnapshot {
            models: vec![model("echo"), model("slow")],
            nodes: vec![Node {
                id: "w".into(),
                addresses: Some(NodeAddresses {
                    data_grpc: worker_addr.to_string(),
                    ..Default::default()
                }),
                status: NodeStatus::Up as i32,
                ..Default::default()
            }],
            replicas: vec![replica(1, "echo"), replica(2, "slow")],
        })),
    });
    let router = Arc::new(RouterService::with_random(
        RouterServiceConfig::default(),
        table,
        Box::new(SplitMix64::new(3)),
    ));
    // The router's own gRPC routes: ModelInfer takes the pass-through path.
    let pass_through = nereid_router::PassThroughConfig {
        grpc: Default::default(),
        shared_memory_off: "off".into(),
    };
    let grpc_addr = serve_routes(nereid_router::grpc_routes(router.clone(), pass_through)).await;
    let http = serve_http(router.clone()).await;
    let grpc = GrpcInferenceServiceClient::connect(format!("http://{grpc_addr}"))
        .await
        .unwrap();
    Setup {
        worker,
        router,
        grpc,
        http,
    }
}

fn grpc_request(
    model: &str,
    metadata: &[(&'static str, &str)],
) -> tonic::Request<ModelInferRequest> {
    let mut request = tonic::Request::new(ModelInferRequest {
        model_name: model.into(),
        inputs: vec![InferInputTensor {
            name: "x".into(),
            datatype: "INT32".into(),
            shape: vec![1],
            ..Default::default()
        }],
        raw_input_contents: vec![Bytes::from_static(&[7, 0, 0, 0])],
        ..Default::default()
    });
    for (key, value) in metadata {
        request.metadata_mut().append(*key, value.parse().unwrap());
    }
    request
}

/// POSTs a one-input infer request to the router over HTTP/1.1 with extra `headers`; returns
/// the status code.
async fn http_infer(addr: SocketAddr, headers: &[(&str, &str)]) -> u16 {
    let body = r#"{"inputs":[{"name":"x","datatype":"INT32","shape":[1],"data":[7]}]}"#;
    let mut head = format!(
        "POST /v2/models/echo/infer HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("{head}\r\n{body}").as_bytes())
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer.split(' ').nth(1).unwrap_or_default();
    status
        .parse()
        .unwrap_or_else(|_| panic!("bad answer {answer:?}"))
}

fn infer_request(model: &str, context: RequestContext) -> InferRequest {
    InferRequest {
        model_name: model.into(),
        inputs: vec![
            Tensor::new(
                "x",
                DataType::Int32,
                vec![1],
                Bytes::from_static(&[7, 0, 0, 0]),
            )
            .unwrap(),
        ],
        context,
        ..Default::default()
    }
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("test took too long")
}

fn expected_trace() -> Option<TraceContext> {
    TraceContext::parse(TRACEPARENT, Some(TRACESTATE))
}

#[tokio::test]
async fn trace_context_reaches_the_worker_unchanged_from_grpc_and_http() {
    bounded(async {
        let mut s = setup().await;
        let trace = [("traceparent", TRACEPARENT), ("tracestate", TRACESTATE)];
        s.grpc
            .model_infer(grpc_request("echo", &trace))
            .await
            .unwrap();
        assert_eq!(http_infer(s.http, &trace).await, 200);
        let stream = futures::stream::iter([grpc_request("echo", &[]).into_inner()]);
        let mut call = tonic::Request::new(stream);
        for (key, value) in trace {
            call.metadata_mut().insert(key, value.parse().unwrap());
        }
        let mut responses = s.grpc.model_stream_infer(call).await.unwrap().into_inner();
        let first = responses.next().await.unwrap().unwrap();
        assert_eq!(first.error_message, "");

        let seen = s.worker.requests();
        assert_eq!(seen.len(), 3);
        for (i, request) in seen.iter().enumerate() {
            assert_eq!(
                request.request.context.trace,
                expected_trace(),
                "request {i}"
            );
            // No client set a timeout, so none is forwarded.
            assert_eq!(request.request.context.deadline, None, "request {i}");
        }
    })
    .await;
}

#[tokio::test]
async fn an_invalid_traceparent_is_not_forwarded() {
    bounded(async {
        let mut s = setup().await;
        let upper = TRACEPARENT.to_uppercase();
        let bad = [("traceparent", upper.as_str()), ("tracestate", TRACESTATE)];
        s.grpc
            .model_infer(grpc_request("echo", &bad))
            .await
            .unwrap();
        assert_eq!(http_infer(s.http, &bad).await, 200);
        let zero = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
        assert_eq!(http_infer(s.http, &[("traceparent", zero)]).await, 200);
        let seen = s.worker.requests();
        assert_eq!(seen.len(), 3);
        assert!(
            seen.iter().all(|r| r.request.context.trace.is_none()),
            "{seen:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_grpc_deadline_reaches_the_worker_as_the_time_left() {
    bounded(async {
        let mut s = setup().await;
        let mut request = grpc_request("echo", &[]);
        request.set_timeout(Duration::from_secs(2));
        s.grpc.model_infer(request).await.unwrap();
        let seen = s.worker.requests();
        let deadline = seen[0]
            .request
            .context
            .deadline
            .expect("the worker got a deadline");
        let left = deadline - seen[0].at;
        assert!(
            left <= Duration::from_secs(2) && left > Duration::from_secs(1),
            "{left:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_worker_slower_than_the_deadline_is_cut_off_and_the_router_serves_on() {
    bounded(async {
        let mut s = setup().await;
        let mut request = grpc_request("slow", &[]);
        request.set_timeout(Duration::from_millis(300));
        let started = Instant::now();
        let status = s.grpc.model_infer(request).await.unwrap_err();
        // tonic ends a call its grpc-timeout cut short with CANCELLED "Timeout expired" (on the
        // client's side and on the server's alike), not DEADLINE_EXCEEDED.
        assert_eq!(status.code(), Code::Cancelled, "{status:?}");
        assert_eq!(status.message(), "Timeout expired");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        // The router dropped its call to the worker, which cancelled the request there (before
        // `slow` would have answered).
        eventually(
            "the worker's request is cancelled",
            SLOW.saturating_sub(started.elapsed()),
            || s.worker.cancelled() > 0,
        )
        .await;
        s.grpc.model_infer(grpc_request("echo", &[])).await.unwrap();
        assert_eq!(http_infer(s.http, &[]).await, 200);
    })
    .await;
}

#[tokio::test]
async fn the_router_answers_deadline_exceeded_itself() {
    bounded(async {
        let s = setup().await;
        // Cut short on the way: the router's own call to the worker times out.
        let context = RequestContext {
            deadline: Some(Instant::now() + Duration::from_millis(300)),
            ..Default::default()
        };
        let err = s
            .router
            .infer(infer_request("slow", context))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            ServiceError::DeadlineExceeded(
                "model 'slow': the request's deadline passed before a worker answered".into()
            )
        );
        assert_eq!(s.worker.requests().len(), 1);
        // Already past: answered without calling the worker, unary and streamed alike.
        let past = RequestContext {
            deadline: Some(Instant::now() - Duration::from_millis(1)),
            ..Default::default()
        };
        let err = s
            .router
            .infer(infer_request("echo", past.clone()))
            .await
            .unwrap_err();
        assert!(matches!(err, ServiceError::DeadlineExceeded(_)), "{err:?}");
        let err = match s.router.infer_stream(infer_request("echo", past)).await {
            Ok(_) => panic!("a stream past its deadline was opened"),
            Err(err) => err,
        };
        assert!(matches!(err, ServiceError::DeadlineExceeded(_)), "{err:?}");
        assert_eq!(s.worker.requests().len(), 1);
    })
    .await;
}
