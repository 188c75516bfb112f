//! Follows the control plane's `Cluster.Watch` stream into the routing table.
//!
//! ```text
//! connect(address i) ─► Watch{from_revision: last applied, 0 before a snapshot}
//!   ─► snapshot / deltas ─► SharedTable::apply ─► on_change (prune worker connections)
//!   stream ends or fails ─► the leader a refusing node named (if listed), else the next
//!   address (nereid_cluster_client failover), growing backoff ─► reconnect
//! ```
//!
//! Any control-plane node serves the watch from its applied state, so the router moves to the
//! next address whenever a stream breaks. While no node answers (no quorum, partition) the
//! router keeps serving from the last table it has; a control plane that cannot serve deltas
//! from the router's revision answers with a snapshot, which replaces the table. The bearer
//! token goes on every call as `authorization: Bearer <token>`.

use std::sync::Arc;

use nereid_cluster_client::Backoff;
use nereid_proto::pb::cluster::WatchRequest;
use nereid_proto::pb::cluster::cluster_client::ClusterClient;
use tokio::sync::watch;

use crate::control::ControlPlane;
use crate::table::{RoutingTable, SharedTable};

/// Follows the watch until `stop` is set, applying every event to `table` and calling
/// `on_change` after each.
pub async fn watch_task(
    control_plane: Arc<ControlPlane>,
    table: Arc<SharedTable>,
    on_change: impl Fn(&RoutingTable) + Send,
    mut stop: watch::Receiver<bool>,
) {
    let client = control_plane.client();
    let mut backoff = Backoff::default();
    loop {
        if *stop.borrow() {
            return;
        }
        let addr = client.current_address();
        let from = {
            let t = table.load();
            if t.synced() { t.revision() } else { 0 }
        };
        let request = client.stream_request(WatchRequest {
            from_revision: from,
        });
        let call = client.attempt(client.current(), |mut c: ClusterClient<_>| async move {
            c.watch(request).await
        });
        let started = tokio::select! {
            r = call => r,
            _ = stop.wait_for(|s| *s) => return,
        };
        // The leader a failing node named, if any: the next node to try when it is listed.
        let hint = match started {
            Ok(mut events) => {
                tracing::info!(%addr, from_revision = from, "following the control plane's watch");
                loop {
                    let next = tokio::select! {
                        n = events.message() => n,
                        _ = stop.wait_for(|s| *s) => return,
                    };
                    match next {
                        Ok(Some(event)) => {
                            table.apply(&event);
                            on_change(&table.load());
                            backoff.reset();
                        }
                        Ok(None) => {
                            tracing::info!(%addr, "the control plane closed the watch");
                            break None;
                        }
                        Err(status) => {
                            tracing::warn!(%addr, error = %status, "the watch broke; serving the last routing table");
                            break nereid_cluster_client::leader_hint(&status).map(str::to_string);
                        }
                    }
                }
            }
            Err(failure) => {
                tracing::warn!(%addr, error = %failure, "cannot watch the control plane; serving the last routing table");
                failure.leader_hint().map(str::to_string)
            }
        };
        client.fail_over(hint.as_deref());
        tokio::select! {
            _ = tokio::time::sleep(backoff.next_wait()) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::time::Duration;

    use futures::Stream;
    use nereid_proto::pb::cluster::cluster_server::{Cluster, ClusterServer};
    use nereid_proto::pb::cluster::{
        HeartbeatRequest, HeartbeatResponse, Model, RegisterNodeRequest, RegisterNodeResponse,
        ReportReplicaRequest, ReportReplicaResponse, StateDelta, StateSnapshot, WatchEvent,
        watch_event,
    };
    use tonic::{Request, Response, Status};

    use super::*;

    /// Serves one prepared batch of events per Watch call, then ends the stream; records the
    /// revision and token each call came with.
    #[derive(Default)]
    struct FakeControlPlane {
        batches: Mutex<Vec<Vec<WatchEvent>>>,
        calls: Mutex<Vec<(u64, String)>>,
    }

    struct Fake(Arc<FakeControlPlane>);

    #[tonic::async_trait]
    impl Cluster for Fake {
        async fn register_node(
            &self,
            _: Request<RegisterNodeRequest>,
        ) -> Result<Response<RegisterNodeResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }
        async fn heartbeat(
            &self,
            _: Request<HeartbeatRequest>,
        ) -> Result<Response<HeartbeatResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }
        async fn report_replica(
            &self,
            _: Request<ReportReplicaRequest>,
        ) -> Result<Response<ReportReplicaResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }
        async fn activate(
            &self,
            _: Request<nereid_proto::pb::cluster::ActivateRequest>,
        ) -> Result<Response<nereid_proto::pb::cluster::ActivateResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }
        async fn leave_node(
            &self,
            _: Request<nereid_proto::pb::cluster::LeaveNodeRequest>,
        ) -> Result<Response<nereid_proto::pb::cluster::LeaveNodeResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }
        type WatchStream = Pin<Box<dyn Stream<Item = Result<WatchEvent, Status>> + Send>>;
        async fn watch(
            &self,
            request: Request<WatchRequest>,
        ) -> Result<Response<Self::WatchStream>, Status> {
            let token = request
                .metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            self.0
                .calls
                .lock()
                .unwrap()
                .push((request.get_ref().from_revision, token));
            let mut batches = self.0.batches.lock().unwrap();
            if batches.is_empty() {
                return Ok(Response::new(Box::pin(futures::stream::pending())));
            }
            let batch = batches.remove(0);
            Ok(Response::new(Box::pin(futures::stream::iter(
                batch.into_iter().map(Ok),
            ))))
        }
    }

    fn model(name: &str) -> Model {
        Model {
            name: name.into(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn resumes_from_the_last_revision_with_the_token_after_failover() {
        let fake = Arc::new(FakeControlPlane::default());
        fake.batches.lock().unwrap().extend([
            vec![WatchEvent {
                revision: 3,
                event: Some(watch_event::Event::Snapshot(StateSnapshot {
                    models: vec![model("a")],
                    ..Default::default()
                })),
            }],
            vec![WatchEvent {
                revision: 4,
                event: Some(watch_event::Event::Delta(StateDelta {
                    upserted_models: vec![model("b")],
                    ..Default::default()
                })),
            }],
        ]);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ClusterServer::new(Fake(fake.clone())))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        // The first address refuses connections: the task fails over to the second.
        let dead = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead_addr = dead.local_addr().unwrap();
        drop(dead);
        let cp = Arc::new(
            ControlPlane::new(&crate::control::ControlPlaneConfig {
                control_plane: vec![dead_addr.to_string(), addr.to_string()],
                token: Some("s3cret\n".into()),
                ..Default::default()
            })
            .unwrap(),
        );
        let table = Arc::new(SharedTable::default());
        let (stop_tx, stop) = watch::channel(false);
        let (changed_tx, mut changed) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(watch_task(
            cp,
            table.clone(),
            move |t: &RoutingTable| {
                let _ = changed_tx.send(t.revision());
            },
            stop,
        ));
        let bounded = tokio::time::timeout(Duration::from_secs(20), async {
            while changed.recv().await != Some(4) {}
        });
        bounded
            .await
            .expect("the delta after a reconnect was applied");
        let t = table.load();
        assert!(t.model("a").is_some() && t.model("b").is_some());
        let calls = fake.calls.lock().unwrap().clone();
        assert_eq!(calls[0], (0, "Bearer s3cret".to_string()));
        assert_eq!(calls[1].0, 3, "resumed from the last revision: {calls:?}");
        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
        server.abort();
    }
}
