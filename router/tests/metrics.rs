//! The router's `/metrics` against two in-process fake workers (the harness of
//! `forwarding.rs`): request outcomes, outstanding requests per replica, retries and ejections,
//! read back over HTTP in the Prometheus text format.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use nereid_proto::error::ServiceResult;
use nereid_proto::pb::cluster::{
    Model, Node, NodeAddresses, NodeStatus, Replica, ReplicaState, StateSnapshot, WatchEvent,
    watch_event,
};
use nereid_proto::pb::inference::{ModelConfig, ModelStatistics, ModelTransactionPolicy};
use nereid_proto::service::{
    LoadRequest, ModelIndexEntry, ModelMetadata, ResponseStream, ServerMetadata, StreamedResponse,
};
use nereid_proto::types::{InferRequest, InferResponse, ParamValue, RequestOptions, Tensor};
use nereid_proto::{DataType, InferenceService, ServiceError};
use nereid_router::choice::SplitMix64;
use nereid_router::metrics::RouterCollector;
use nereid_router::table::SharedTable;
use nereid_router::{RouterService, RouterServiceConfig};
use nereid_telemetry::metrics::prometheus_router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Echoes the inputs back and names the worker in the response parameter `worker`.
struct EchoWorker {
    name: String,
}

#[async_trait]
impl InferenceService for EchoWorker {
    async fn server_live(&self) -> bool {
        true
    }
    async fn server_ready(&self) -> bool {
        true
    }
    fn server_metadata(&self) -> ServerMetadata {
        ServerMetadata {
            name: self.name.clone(),
            version: "0".into(),
            extensions: vec![],
        }
    }
    async fn model_ready(&self, _: &str, _: Option<i64>) -> ServiceResult<bool> {
        Ok(true)
    }
    async fn model_metadata(&self, name: &str, _: Option<i64>) -> ServiceResult<ModelMetadata> {
        Ok(ModelMetadata {
            name: name.into(),
            versions: vec!["1".into()],
            platform: self.name.clone(),
            inputs: vec![],
            outputs: vec![],
        })
    }
    async fn model_config(&self, name: &str, _: Option<i64>) -> ServiceResult<ModelConfig> {
        Ok(ModelConfig {
            name: name.into(),
            model_transaction_policy: Some(ModelTransactionPolicy { decoupled: true }),
            ..Default::default()
        })
    }
    /// A decoupled echo: the answer twice, then an empty final item.
    async fn infer_stream(&self, request: InferRequest) -> ServiceResult<ResponseStream> {
        let response = self.infer(request).await?;
        let items = vec![
            Ok(StreamedResponse {
                response: Some(response.clone()),
                last: false,
            }),
            Ok(StreamedResponse {
                response: Some(response),
                last: false,
            }),
            Ok(StreamedResponse {
                response: None,
                last: true,
            }),
        ];
        Ok(Box::pin(futures::stream::iter(items)))
    }
    async fn model_statistics(
        &self,
        _: &str,
        _: Option<i64>,
    ) -> ServiceResult<Vec<ModelStatistics>> {
        Ok(vec![])
    }
    async fn infer(&self, request: InferRequest) -> ServiceResult<InferResponse> {
        if request.model_name != "echo" {
            return Err(ServiceError::not_found(format!(
                "unknown model: '{}'",
                request.model_name
            )));
        }
        let mut parameters = BTreeMap::new();
        parameters.insert("worker".to_string(), ParamValue::String(self.name.clone()));
        Ok(InferResponse {
            model_name: request.model_name,
            model_version: "1".into(),
            id: request.id,
            parameters,
            outputs: request.inputs,
        })
    }
    async fn repository_index(&self, _: bool) -> ServiceResult<Vec<ModelIndexEntry>> {
        Ok(vec![])
    }
    async fn load_model(&self, _: &str, _: LoadRequest) -> ServiceResult<()> {
        Ok(())
    }
    async fn unload_model(&self, _: &str, _: bool) -> ServiceResult<()> {
        Ok(())
    }
}

struct FakeWorker {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl FakeWorker {
    async fn start(name: &str) -> FakeWorker {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service: Arc<dyn InferenceService> = Arc::new(EchoWorker { name: name.into() });
        let routes = nereid_proto::grpc::routes(service, Default::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            tonic::transport::Server::builder()
                .add_routes(routes)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = stopped.await;
                })
                .await
                .unwrap();
        });
        FakeWorker {
            addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the server: closes the listener and its connections (GOAWAY), and waits until
    /// it has.
    async fn kill(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

fn node(id: &str, addr: SocketAddr) -> Node {
    Node {
        id: id.into(),
        addresses: Some(NodeAddresses {
            data_grpc: addr.to_string(),
            ..Default::default()
        }),
        status: NodeStatus::Up as i32,
        ..Default::default()
    }
}

fn ready(id: u64, node: &str) -> Replica {
    Replica {
        id,
        model: "echo".into(),
        version: 1,
        node: node.into(),
        state: ReplicaState::Ready as i32,
        ..Default::default()
    }
}

/// Two workers, one ready replica of `echo` on each, and a router over them.
async fn cluster(max_in_flight: usize) -> (Vec<FakeWorker>, Arc<RouterService>, Arc<SharedTable>) {
    let workers = vec![FakeWorker::start("w1").await, FakeWorker::start("w2").await];
    let table = Arc::new(SharedTable::default());
    table.apply(&WatchEvent {
        revision: 1,
        event: Some(watch_event::Event::Snapshot(StateSnapshot {
            models: vec![Model {
                name: "echo".into(),
                available_versions: vec![1],
                ..Default::default()
            }],
            nodes: vec![node("w1", workers[0].addr), node("w2", workers[1].addr)],
            replicas: vec![ready(1, "w1"), ready(2, "w2")],
        })),
    });
    let config = RouterServiceConfig {
        max_in_flight,
        ..Default::default()
    };
    let router = RouterService::with_random(config, table.clone(), Box::new(SplitMix64::new(11)));
    (workers, Arc::new(router), table)
}

fn request(options: RequestOptions) -> InferRequest {
    let data = Bytes::from(vec![7u8, 0, 0, 0]);
    InferRequest {
        model_name: "echo".into(),
        options,
        inputs: vec![Tensor::new("x", DataType::Int32, vec![1], data).unwrap()],
        ..Default::default()
    }
}

async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("test took too long")
}

/// Serves the router's `/metrics` on 127.0.0.1:0; its address.
async fn serve_metrics(router: Arc<RouterService>, table: Arc<SharedTable>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = prometheus_router(Arc::new(RouterCollector { router, table }));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// `GET /metrics` over plain HTTP/1.0; the body.
async fn scrape(addr: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}

/// The value of the series written exactly as `series` (name and labels); `None` when absent.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(s, _)| *s == series)
        .and_then(|(_, v)| v.parse().ok())
}

#[tokio::test]
async fn every_request_is_counted_once_and_replicas_go_back_to_idle() {
    bounded(async {
        let (_workers, router, table) = cluster(64).await;
        let addr = serve_metrics(router.clone(), table).await;
        const N: usize = 37;
        for _ in 0..N {
            router.infer(request(Default::default())).await.unwrap();
        }
        let mut unknown = request(Default::default());
        unknown.model_name = "no-such-model".into();
        router.infer(unknown).await.unwrap_err();

        let text = scrape(addr).await;
        let get = |series: &str| value(&text, series);
        assert_eq!(
            get(r#"nereid_router_requests_total{model="echo",outcome="success"}"#),
            Some(N as f64),
            "{text}"
        );
        assert_eq!(
            get(r#"nereid_router_requests_total{model="echo",outcome="failure"}"#),
            Some(0.0)
        );
        assert_eq!(
            get(r#"nereid_router_requests_total{model="_other",outcome="failure"}"#),
            Some(1.0)
        );
        assert_eq!(
            get(r#"nereid_router_request_duration_seconds_count{model="echo"}"#),
            Some(N as f64)
        );
        assert_eq!(
            get(r#"nereid_router_request_duration_seconds_bucket{model="echo",le="+Inf"}"#),
            Some(N as f64)
        );
        for node in ["w1", "w2"] {
            let series = format!(
                r#"nereid_router_replica_in_flight{{model="echo",version="1",node="{node}"}}"#
            );
            assert_eq!(get(&series), Some(0.0), "{series} in\n{text}");
        }
        assert_eq!(get("nereid_router_in_flight"), Some(0.0));
        assert_eq!(get("nereid_router_table_revision"), Some(1.0));
        assert_eq!(
            get(r#"nereid_router_retries_total{model="echo"}"#),
            Some(0.0)
        );
        assert!(!text.contains("nereid_router_ejections_total{"), "{text}");
    })
    .await;
}

#[tokio::test]
async fn a_stream_holds_its_replica_until_it_is_dropped() {
    bounded(async {
        let (_workers, router, table) = cluster(64).await;
        let addr = serve_metrics(router.clone(), table).await;
        let stream = router
            .infer_stream(request(Default::default()))
            .await
            .unwrap();
        let text = scrape(addr).await;
        let busy: f64 = text
            .lines()
            .filter(|l| l.starts_with("nereid_router_replica_in_flight{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        assert_eq!(busy, 1.0, "{text}");
        assert_eq!(value(&text, "nereid_router_in_flight"), Some(1.0));
        let items: Vec<_> = stream.collect().await;
        assert_eq!(items.len(), 3);
        let text = scrape(addr).await;
        assert!(
            text.lines()
                .filter(|l| l.starts_with("nereid_router_replica_in_flight{"))
                .all(|l| l.ends_with(" 0")),
            "{text}"
        );
        assert_eq!(
            value(
                &text,
                r#"nereid_router_requests_total{model="echo",outcome="success"}"#
            ),
            Some(1.0)
        );
    })
    .await;
}

#[tokio::test]
async fn a_killed_worker_counts_one_retry_and_one_ejection() {
    bounded(async {
        let (mut workers, router, table) = cluster(64).await;
        let addr = serve_metrics(router.clone(), table).await;
        // Warm both connections, then kill one worker.
        for _ in 0..10 {
            router.infer(request(Default::default())).await.unwrap();
        }
        workers[0].kill().await;
        // Every request still succeeds: the one that meets the dead worker is re-sent to the
        // other, and the dead one is then avoided for the ejection time (5 s).
        for _ in 0..30 {
            router.infer(request(Default::default())).await.unwrap();
        }
        let text = scrape(addr).await;
        let get = |series: &str| value(&text, series);
        assert_eq!(
            get(r#"nereid_router_requests_total{model="echo",outcome="success"}"#),
            Some(40.0),
            "{text}"
        );
        assert_eq!(
            get(r#"nereid_router_requests_total{model="echo",outcome="failure"}"#),
            Some(0.0)
        );
        assert_eq!(
            get(r#"nereid_router_retries_total{model="echo"}"#),
            Some(1.0)
        );
        assert_eq!(
            get(r#"nereid_router_ejections_total{node="w1"}"#),
            Some(1.0)
        );
        assert_eq!(get(r#"nereid_router_ejections_total{node="w2"}"#), None);
    })
    .await;
}
