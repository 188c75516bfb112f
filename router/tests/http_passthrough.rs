//! The HTTP pass-through end to end: the router's HTTP application (`nereid_router::http_app`,
//! in-process on 127.0.0.1:0) in front of recording HTTP workers (axum on 127.0.0.1:0 that
//! answer with what they received), and, for the fallback, a gRPC echo worker.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use nereid_frontend::HttpConfig;
use nereid_proto::pb::cluster::{
    Model, Node, NodeAddresses, NodeStatus, StateSnapshot, WatchEvent, watch_event,
};
use nereid_router::{
    HedgeConfig, RouterService, RouterServiceConfig, SharedTable, SplitMix64, http_app,
};

mod echo_cluster;

use echo_cluster::{FakeWorker, bounded, ready};

/// What a recording worker received.
#[derive(Clone, Debug)]
struct Received {
    path: String,
    headers: HeaderMap,
    body: Bytes,
}

#[derive(Clone)]
struct Recorder {
    name: &'static str,
    /// The status and error body to answer everything with (a worker unloading the model, or
    /// one that no longer has it), instead of the echo.
    refusal: Option<(StatusCode, &'static str)>,
    /// Never answer (a hung worker).
    hang: bool,
    seen: Arc<Mutex<Vec<Received>>>,
}

/// Records the request and answers 200 with its body, as a worker's binary response would
/// look (an Inference-Header-Content-Length and the worker's name in a header).
async fn record(State(rec): State<Recorder>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    rec.seen.lock().unwrap().push(Received {
        path: parts.uri.path().to_string(),
        headers: parts.headers,
        body: body.clone(),
    });
    if rec.hang {
        std::future::pending::<()>().await;
    }
    if let Some((status, body)) = rec.refusal {
        return (status, [("content-type", "application/json")], body).into_response();
    }
    (
        StatusCode::OK,
        [
            ("content-type", "application/octet-stream"),
            ("inference-header-content-length", "2"),
            ("x-worker", rec.name),
        ],
        body,
    )
        .into_response()
}

/// A worker that is unloading the model.
const UNLOADING: (StatusCode, &str) = (
    StatusCode::SERVICE_UNAVAILABLE,
    r#"{"error":"model 'echo' is unloading"}"#,
);
/// A worker that no longer has the replica the routing table still shows.
const UNLOADED: (StatusCode, &str) = (
    StatusCode::NOT_FOUND,
    r#"{"error":"Request for unknown model: 'echo' version 1 is not found"}"#,
);

async fn recording_worker(
    name: &'static str,
    refusal: Option<(StatusCode, &'static str)>,
) -> (SocketAddr, Recorder) {
    serve_recorder(Recorder {
        name,
        refusal,
        hang: false,
        seen: Arc::default(),
    })
    .await
}

async fn serve_recorder(rec: Recorder) -> (SocketAddr, Recorder) {
    let app = axum::Router::new().fallback(record).with_state(rec.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, rec)
}

fn node(id: &str, grpc: &str, http: Option<SocketAddr>) -> Node {
    Node {
        id: id.into(),
        addresses: Some(NodeAddresses {
            data_grpc: grpc.into(),
            data_http: http.map(|a| a.to_string()).unwrap_or_default(),
            ..Default::default()
        }),
        status: NodeStatus::Up as i32,
        ..Default::default()
    }
}

/// A router over `nodes`, each holding one ready replica of `echo`, serving its HTTP app.
async fn router_over(nodes: Vec<Node>) -> SocketAddr {
    router_with(nodes, RouterServiceConfig::default()).await
}

async fn router_with(nodes: Vec<Node>, config: RouterServiceConfig) -> SocketAddr {
    let table = Arc::new(SharedTable::default());
    let replicas = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| ready(i as u64 + 1, &n.id))
        .collect();
    table.apply(&WatchEvent {
        revision: 1,
        event: Some(watch_event::Event::Snapshot(StateSnapshot {
            models: vec![Model {
                name: "echo".into(),
                available_versions: vec![1],
                ..Default::default()
            }],
            nodes,
            replicas,
        })),
    });
    let router = RouterService::with_random(config, table, Box::new(SplitMix64::new(5)));
    let app = http_app(
        Arc::new(router),
        HttpConfig::default(),
        "not on the router".into(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// POSTs `body` with `headers` to `path` on `addr`: status, headers, body.
async fn post(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> (StatusCode, HeaderMap, Bytes) {
    let client: Client<HttpConnector, Body> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let mut request = axum::http::Request::post(format!("http://{addr}{path}"));
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let response = client
        .request(request.body(Body::from(body)).unwrap())
        .await
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = axum::body::to_bytes(Body::new(body), usize::MAX)
        .await
        .unwrap();
    (parts.status, parts.headers, body)
}

const JSON: &str =
    r#"{"id":"r1","inputs":[{"name":"x","shape":[1],"datatype":"INT32","data":[7]}]}"#;

#[tokio::test]
async fn a_json_body_reaches_the_worker_unchanged_and_its_answer_comes_back() {
    bounded(async {
        let (w, rec) = recording_worker("w1", None).await;
        let router = router_over(vec![node("w1", "127.0.0.1:9", Some(w))]).await;
        let (status, headers, body) = post(
            router,
            "/v2/models/echo/infer",
            &[("content-type", "application/json"), ("traceparent", "x")],
            Bytes::from_static(JSON.as_bytes()),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        // The worker's answer as it sent it.
        assert_eq!(body, JSON.as_bytes());
        assert_eq!(headers["inference-header-content-length"], "2");
        assert_eq!(headers["content-type"], "application/octet-stream");
        let seen = rec.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        // The version choice resolved, the body byte for byte, the headers that matter.
        assert_eq!(seen[0].path, "/v2/models/echo/versions/1/infer");
        assert_eq!(seen[0].body, JSON.as_bytes());
        assert_eq!(seen[0].headers["content-type"], "application/json");
        // An invalid traceparent is not forwarded.
        assert!(seen[0].headers.get("traceparent").is_none());
    })
    .await;
}

#[tokio::test]
async fn a_binary_body_keeps_its_header_length() {
    bounded(async {
        let (w, rec) = recording_worker("w1", None).await;
        let router = router_over(vec![node("w1", "127.0.0.1:9", Some(w))]).await;
        let header = r#"{"inputs":[{"name":"x","shape":[1],"datatype":"INT32","parameters":{"binary_data_size":4}}]}"#;
        let mut body = header.as_bytes().to_vec();
        body.extend_from_slice(&[7, 0, 0, 0xff]);
        let len = header.len().to_string();
        let (status, _, answer) = post(
            router,
            "/v2/models/echo/versions/1/infer",
            &[("inference-header-content-length", len.as_str())],
            Bytes::from(body.clone()),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer, body);
        let seen = rec.seen.lock().unwrap().clone();
        assert_eq!(seen[0].body, body);
        assert_eq!(seen[0].headers["inference-header-content-length"], len.as_str());
    })
    .await;
}

#[tokio::test]
async fn a_raw_binary_body_is_forwarded_as_it_is() {
    bounded(async {
        let (w, rec) = recording_worker("w1", None).await;
        let router = router_over(vec![node("w1", "127.0.0.1:9", Some(w))]).await;
        // Header length 0: the whole body is the one input's bytes, no JSON to scan.
        let body = vec![1u8, 0, 0, 0, 2, 0, 0, 0];
        let (status, headers, answer) = post(
            router,
            "/v2/models/echo/infer",
            &[
                ("inference-header-content-length", "0"),
                ("content-type", "application/octet-stream"),
            ],
            Bytes::from(body.clone()),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(answer, body);
        // The recording worker answered: the body went through the pass-through path.
        assert_eq!(headers["inference-header-content-length"], "2");
        let seen = rec.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].path, "/v2/models/echo/versions/1/infer");
        assert_eq!(seen[0].body, body);
        assert_eq!(seen[0].headers["inference-header-content-length"], "0");
    })
    .await;
}

#[tokio::test]
async fn an_unavailable_worker_is_retried_on_another() {
    for refusal in [UNLOADING, UNLOADED] {
        retried_on_another(refusal).await;
    }
}

/// Six `echo` inferences through `router`, each answered 200 with only the headers a client
/// reads the answer by.
async fn post_six(router: SocketAddr) {
    for _ in 0..6 {
        let (status, headers, _) = post(
            router,
            "/v2/models/echo/infer",
            &[],
            Bytes::from_static(JSON.as_bytes()),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert!(headers.get("x-worker").is_none());
    }
}

/// Requests a worker refuses with `refusal` before running them succeed on the other replica.
async fn retried_on_another(refusal: (StatusCode, &'static str)) {
    bounded(async {
        let (down, down_rec) = recording_worker("down", Some(refusal)).await;
        let (up, up_rec) = recording_worker("up", None).await;
        let router = router_over(vec![
            node("down", "127.0.0.1:9", Some(down)),
            node("up", "127.0.0.1:9", Some(up)),
        ])
        .await;
        post_six(router).await;
        assert_eq!(up_rec.seen.lock().unwrap().len(), 6, "{refusal:?}");
        // Some of the six went to the refusing one first.
        assert!(!down_rec.seen.lock().unwrap().is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_hung_worker_does_not_hold_requests_hostage() {
    bounded(async {
        let (stuck, stuck_rec) = hung_worker("stuck").await;
        let (up, up_rec) = recording_worker("up", None).await;
        let config = RouterServiceConfig {
            hedge: HedgeConfig {
                floor: Duration::from_millis(50),
                ceiling: Duration::from_millis(50),
            },
            ..Default::default()
        };
        let router = router_with(
            vec![
                node("stuck", "127.0.0.1:9", Some(stuck)),
                node("up", "127.0.0.1:9", Some(up)),
            ],
            config,
        )
        .await;
        post_six(router).await;
        // Every request was answered by the live replica; those sent to the hung one first were
        // hedged after the attempt timeout instead of waiting for it.
        assert_eq!(up_rec.seen.lock().unwrap().len(), 6);
        assert!(!stuck_rec.seen.lock().unwrap().is_empty());
    })
    .await;
}

/// A worker that records requests and never answers them.
async fn hung_worker(name: &'static str) -> (SocketAddr, Recorder) {
    serve_recorder(Recorder {
        name,
        refusal: None,
        hang: true,
        seen: Arc::default(),
    })
    .await
}

#[tokio::test]
async fn bad_requests_are_refused_by_the_router_naming_the_field() {
    bounded(async {
        let (w, rec) = recording_worker("w1", None).await;
        let router = router_over(vec![node("w1", "127.0.0.1:9", Some(w))]).await;
        let cases: [(&str, &str, StatusCode, &str); 4] = [
            (
                "/v2/models/echo/infer",
                r#"{"inputs":[{"name":"x","shape":[-2],"data":[1]}]}"#,
                StatusCode::BAD_REQUEST,
                "shape",
            ),
            (
                "/v2/models/echo/infer",
                r#"{"inputs": [1"#,
                StatusCode::BAD_REQUEST,
                "JSON",
            ),
            (
                "/v2/models/echo/infer",
                r#"{"inputs":[{"name":"x","shape":[1],"parameters":{"shared_memory_region":"r"}}]}"#,
                StatusCode::NOT_IMPLEMENTED,
                "not on the router",
            ),
            (
                "/v2/models/nope/infer",
                JSON,
                StatusCode::NOT_FOUND,
                "Request for unknown model: 'nope' is not found",
            ),
        ];
        for (path, body, status, needle) in cases {
            let (got, headers, answer) =
                post(router, path, &[], Bytes::from_static(body.as_bytes())).await;
            let text = String::from_utf8_lossy(&answer);
            assert_eq!(got, status, "{body}: {text}");
            assert_eq!(headers["content-type"], "application/json");
            assert!(text.contains(needle), "{body}: {text}");
        }
        assert!(rec.seen.lock().unwrap().is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_worker_without_an_http_address_is_served_over_grpc() {
    bounded(async {
        let worker = FakeWorker::start("g1").await;
        let router = router_over(vec![node("g1", &worker.addr.to_string(), None)]).await;
        let (status, _, answer) = post(
            router,
            "/v2/models/echo/infer",
            &[],
            Bytes::from_static(JSON.as_bytes()),
        )
        .await;
        let text = String::from_utf8_lossy(&answer);
        assert_eq!(status, StatusCode::OK, "{text}");
        // The typed path's JSON answer from the gRPC echo worker.
        assert!(text.contains(r#""worker":"g1""#), "{text}");
    })
    .await;
}
