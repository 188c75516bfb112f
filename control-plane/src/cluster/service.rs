//! The `Cluster` gRPC service workers and routers call. Registration, heartbeats, replica
//! reports and activations need the leader (its soft state and the log); a follower forwards
//! them. Watch is
//! answered by any node from its applied state.
//!
//! ```text
//!  RegisterNode ─► write RegisterNode ─► soft: heard from      (leader)
//!  Heartbeat    ─► soft: heard from + utilization; unknown node ─► reregister
//!  ReportReplica ─► unloaded ? RemoveReplica : SetReplicaState  (the replica must be the node's)
//!  Activate     ─► soft: demand for the model (scale from zero), wakes placement; without a
//!                 live replica, a plan that cannot place one even with the minimum residency
//!                 over (no room, nothing idle and unpinned to evict) answers
//!                 RESOURCE_EXHAUSTED naming why (the router's 503)
//!  LeaveNode    ─► soft: forget the node's heartbeats ─► write SetNodeStatus Down
//!  Watch        ─► WatchHub: snapshot or retained deltas, then live deltas
//! ```

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use nereid_proto::pb::cluster as pb;
use nereid_proto::pb::cluster::cluster_client::ClusterClient;
use nereid_proto::pb::cluster::cluster_server::Cluster;
use tonic::{Request, Response, Status};

use crate::api::error::ApiError;
use crate::consensus::Consensus;
use crate::convert;
use crate::forward::{LeaderChannels, was_forwarded};
use crate::leader::Observations;
use crate::leader::soft::SoftState;
use crate::state::{ClusterState, Command, EntityKind, NodeStatus, ReplicaState, StateError};
use crate::views;
use crate::watch::WatchHub;

pub struct ClusterService {
    consensus: Arc<dyn Consensus>,
    soft: Arc<SoftState>,
    hub: Arc<WatchHub>,
    leader: Arc<LeaderChannels>,
    heartbeat_interval: Duration,
}

impl ClusterService {
    pub fn new(
        consensus: Arc<dyn Consensus>,
        soft: Arc<SoftState>,
        hub: Arc<WatchHub>,
        leader: Arc<LeaderChannels>,
        heartbeat_interval: Duration,
    ) -> Self {
        ClusterService {
            consensus,
            soft,
            hub,
            leader,
            heartbeat_interval,
        }
    }

    /// Where a leader-only call goes: `None` when this node leads and answers; a client to the
    /// leader otherwise. A call that was already forwarded is not forwarded again (views of who
    /// leads may be stale during an election): the caller retries.
    fn leader_client<T>(
        &self,
        request: &Request<T>,
    ) -> Result<Option<ClusterClient<tonic::transport::Channel>>, Status> {
        if self.leader.is_leader() {
            return Ok(None);
        }
        if was_forwarded(request) {
            return Err(Status::unavailable(
                "this control-plane node is no longer the leader; retry",
            ));
        }
        Ok(Some(ClusterClient::new(self.leader.leader()?)))
    }

    fn revision(&self) -> u64 {
        self.consensus.local_state().revision()
    }

    /// The leader's applied state when it satisfies `has`, else a linearizable read. With the
    /// etcd store another process can see a write (and tell a worker) before the process that
    /// made it has its answer, so a miss in the local state is checked again before refusing.
    async fn state_with(
        &self,
        has: impl Fn(&ClusterState) -> bool,
    ) -> Result<Arc<ClusterState>, Status> {
        let state = self.consensus.local_state();
        if has(&state) {
            return Ok(state);
        }
        self.consensus
            .linearizable_state()
            .await
            .map_err(|e| ApiError::from(e).into())
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn register_node(
        &self,
        request: Request<pb::RegisterNodeRequest>,
    ) -> Result<Response<pb::RegisterNodeResponse>, Status> {
        if let Some(mut leader) = self.leader_client(&request)? {
            return leader
                .register_node(self.leader.request(request.into_inner()))
                .await;
        }
        let spec =
            convert::node_spec_from_register(request.into_inner()).map_err(ApiError::from)?;
        let id = spec.id.clone();
        let applied = self
            .consensus
            .write(Command::RegisterNode(spec))
            .await
            .map_err(ApiError::from)?;
        self.soft.heard_from(&id, Instant::now(), None);
        Ok(Response::new(pb::RegisterNodeResponse {
            revision: applied.revision,
            heartbeat_interval_ms: self.heartbeat_interval.as_millis() as u64,
            heartbeat_timeout_ms: self.soft.heartbeat_timeout().as_millis() as u64,
        }))
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        if let Some(mut leader) = self.leader_client(&request)? {
            return leader
                .heartbeat(self.leader.request(request.into_inner()))
                .await;
        }
        let heartbeat = request.into_inner();
        if heartbeat.node_id.is_empty() {
            return Err(ApiError::from(StateError::invalid(
                "heartbeat",
                "node_id",
                "must not be empty",
            ))
            .into());
        }
        let state = self
            .state_with(|s| s.node(&heartbeat.node_id).is_some())
            .await?;
        if state.node(&heartbeat.node_id).is_none() {
            return Ok(Response::new(pb::HeartbeatResponse {
                reregister: true,
                revision: state.revision(),
            }));
        }
        let node = heartbeat.node_id.clone();
        self.soft.heard_from(&node, Instant::now(), Some(heartbeat));
        Ok(Response::new(pb::HeartbeatResponse {
            reregister: false,
            revision: state.revision(),
        }))
    }

    async fn report_replica(
        &self,
        request: Request<pb::ReportReplicaRequest>,
    ) -> Result<Response<pb::ReportReplicaResponse>, Status> {
        if let Some(mut leader) = self.leader_client(&request)? {
            return leader
                .report_replica(self.leader.request(request.into_inner()))
                .await;
        }
        let report = request.into_inner();
        let state = self
            .state_with(|s| s.replica(report.replica).is_some())
            .await?;
        let Some(replica) = state.replica(report.replica) else {
            if report.unloaded {
                // Already removed: a retried report.
                return Ok(Response::new(pb::ReportReplicaResponse {
                    revision: state.revision(),
                }));
            }
            return Err(
                ApiError::from(StateError::not_found(EntityKind::Replica, report.replica)).into(),
            );
        };
        if replica.node != report.node_id {
            return Err(ApiError::from(StateError::Conflict(format!(
                "replica {} is assigned to node '{}', not to '{}'",
                replica.id, replica.node, report.node_id
            )))
            .into());
        }
        let cmd = if report.unloaded {
            Command::RemoveReplica { id: replica.id }
        } else {
            Command::SetReplicaState {
                id: replica.id,
                state: convert::replica_state_from_pb(report.state, &report.failure_reason)
                    .map_err(ApiError::from)?,
                measured_memory_bytes: (report.measured_memory_bytes > 0)
                    .then_some(report.measured_memory_bytes),
                measured_gpu_memory_bytes: (report.measured_gpu_memory_bytes > 0)
                    .then_some(report.measured_gpu_memory_bytes),
            }
        };
        let applied = self.consensus.write(cmd).await.map_err(ApiError::from)?;
        Ok(Response::new(pb::ReportReplicaResponse {
            revision: applied.revision.max(self.revision()),
        }))
    }

    /// Records demand for a model so placement keeps one replica of a `min_replicas` 0 model
    /// (scale from zero). Refused for an unknown model and for one whose `max_replicas` is 0.
    async fn activate(
        &self,
        request: Request<pb::ActivateRequest>,
    ) -> Result<Response<pb::ActivateResponse>, Status> {
        if let Some(mut leader) = self.leader_client(&request)? {
            return leader
                .activate(self.leader.request(request.into_inner()))
                .await;
        }
        let model = request.into_inner().model;
        let state = self.state_with(|s| s.model(&model).is_some()).await?;
        let Some(spec) = state.model(&model) else {
            return Err(ApiError::from(StateError::not_found(EntityKind::Model, &model)).into());
        };
        if spec.max_replicas == 0 {
            return Err(ApiError::from(StateError::Conflict(format!(
                "model '{model}' has max_replicas 0: requests cannot start a replica; scale it to at least 1"
            )))
            .into());
        }
        let now = Instant::now();
        self.soft.activate(&model, now);
        let mut replicas = state.replicas_of(&model);
        if !replicas.any(|r| r.state == ReplicaState::Ready) {
            self.soft.cold_start(&model, now);
        }
        let live = state
            .replicas_of(&model)
            .any(|r| r.state != ReplicaState::Unloading);
        if !live {
            // Replicas too young to evict will not be for long: the request waits for them
            // (the leader places the model once they may go). Anything else is final now.
            let mut load = self.soft.load();
            load.cache.min_residency_ms = 0;
            let plan = views::plan_for(&state, &load);
            if let Some(unplaced) = plan.unplaced.iter().find(|u| u.model == model) {
                return Err(ApiError::NoCapacity(format!(
                    "model '{model}' cannot be loaded: {}",
                    unplaced.reason
                ))
                .into());
            }
        }
        Ok(Response::new(pb::ActivateResponse {
            renew_after_ms: (self.soft.scale_to_zero_after() / 2).as_millis() as u64,
        }))
    }

    /// Marks a leaving worker's node down at once; an unknown node is refused, one already
    /// down answers as a success (a retried call).
    async fn leave_node(
        &self,
        request: Request<pb::LeaveNodeRequest>,
    ) -> Result<Response<pb::LeaveNodeResponse>, Status> {
        if let Some(mut leader) = self.leader_client(&request)? {
            return leader
                .leave_node(self.leader.request(request.into_inner()))
                .await;
        }
        let id = request.into_inner().node_id;
        if id.is_empty() {
            return Err(ApiError::from(StateError::invalid(
                "leave node",
                "node_id",
                "must not be empty",
            ))
            .into());
        }
        let state = self.state_with(|s| s.node(&id).is_some()).await?;
        if state.node(&id).is_none() {
            return Err(ApiError::from(StateError::not_found(EntityKind::Node, &id)).into());
        }
        // Forgotten first, so that the liveness round does not turn it up again.
        self.soft.left(&id);
        let applied = self
            .consensus
            .write(Command::SetNodeStatus {
                id: id.clone(),
                status: NodeStatus::Down,
            })
            .await
            .map_err(ApiError::from)?;
        tracing::info!(node = %id, "node left the cluster");
        Ok(Response::new(pb::LeaveNodeResponse {
            revision: applied.revision.max(self.revision()),
        }))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let from = request.into_inner().from_revision;
        Ok(Response::new(Box::pin(self.hub.stream(from))))
    }
}
