//! What the router's integration tests share: in-process echo workers (tonic servers on
//! 127.0.0.1:0 serving `nereid_frontend::routes`), a routing table over two of them, and
//! request helpers.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nereid_proto::pb::cluster::{
    Model, Node, NodeAddresses, NodeStatus, Replica, ReplicaState, StateSnapshot, WatchEvent,
    watch_event,
};
use nereid_proto::testing::{FakeModel, FakeService, Step};
use nereid_proto::{
    DataType, InferRequest, InferResponse, InferenceService, ParamValue, RequestOptions, Tensor,
};
use nereid_router::SharedTable;
use nereid_router::SplitMix64;
use nereid_router::{RouterService, RouterServiceConfig};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A worker serving only `echo`: a decoupled echo (the answer twice, then an empty final item
/// when streamed) that names the worker in the response parameter `worker` and in its
/// metadata's platform.
pub fn echo_worker(name: &str) -> FakeService {
    let echo = FakeModel::echo()
        .decoupled()
        .platform(name)
        .response_parameter("worker", ParamValue::String(name.into()))
        .stream(vec![
            Step::respond(false),
            Step::respond(false),
            Step::EmptyFinal,
        ]);
    FakeService::new(name).model("echo", echo)
}

pub struct FakeWorker {
    pub addr: SocketAddr,
    pub stop: Option<oneshot::Sender<()>>,
    pub task: Option<JoinHandle<()>>,
}

impl FakeWorker {
    pub async fn start(name: &str) -> FakeWorker {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service: Arc<dyn InferenceService> = Arc::new(echo_worker(name));
        let routes = nereid_frontend::routes(service, Default::default());
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
    pub async fn kill(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

pub fn node(id: &str, addr: SocketAddr) -> Node {
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

pub fn ready(id: u64, node: &str) -> Replica {
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
pub async fn cluster(
    max_in_flight: usize,
) -> (Vec<FakeWorker>, Arc<RouterService>, Arc<SharedTable>) {
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

pub fn request(options: RequestOptions) -> InferRequest {
    let data = Bytes::from(vec![7u8, 0, 0, 0]);
    InferRequest {
        model_name: "echo".into(),
        options,
        inputs: vec![Tensor::new("x", DataType::Int32, vec![1], data).unwrap()],
        ..Default::default()
    }
}

pub fn worker_of(response: &InferResponse) -> String {
    match &response.parameters["worker"] {
        ParamValue::String(s) => s.clone(),
        other => panic!("unexpected worker parameter {other:?}"),
    }
}

pub async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f)
        .await
        .expect("test took too long")
}
