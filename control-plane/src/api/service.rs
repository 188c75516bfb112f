//! [`ManagementService`]: the management API's one implementation, and its gRPC face.
//!
//! Each RPC is an inherent method taking and returning the `nereid.cluster.v1` messages with an
//! [`ApiError`]; the tonic [`Management`] impl below and the REST router
//! ([`super::rest`]) are thin wrappers over them. Model RPCs live in `models.rs`, node, placement
//! and cluster RPCs in `nodes.rs`; this file holds what they share: how a read picks its state
//! and how a write's answer waits for its own effect.

use std::sync::Arc;
use std::time::Duration;

use nereid_proto::pb::cluster as pb;
use pb::management_client::ManagementClient;
use pb::management_server::Management;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::error::ApiError;
use crate::consensus::Consensus;
use crate::forward::{LeaderChannels, was_forwarded};
use crate::leader::Observations;
use crate::state::ClusterState;

/// How long a write's answer waits for this node to apply the write before asking for a
/// linearizable read instead.
const APPLY_WAIT: Duration = Duration::from_secs(2);

/// How long a follower waits for the leader's answer to a read of the leader's soft state
/// before it answers from its own state.
const LEADER_READ_TIMEOUT: Duration = Duration::from_secs(1);

/// Whether a forwarded call failed because the leader could not be reached (rather than
/// refusing the request): the connection was refused, broke, or never answered.
fn leader_unreachable(status: &Status) -> bool {
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::Cancelled | tonic::Code::DeadlineExceeded => true,
        tonic::Code::Unknown => status.message().contains("transport error"),
        _ => false,
    }
}

/// The management API over a [`Consensus`] (state and writes) and the leader's
/// [`Observations`] (soft state). Cheap to clone.
#[derive(Clone)]
pub struct ManagementService {
    pub(super) consensus: Arc<dyn Consensus>,
    pub(super) observations: Arc<dyn Observations>,
    /// Set on cluster nodes: reads that need the leader's soft state (node utilization,
    /// placement history) are answered by the leader when this node follows.
    leader: Option<Arc<LeaderChannels>>,
}

impl ManagementService {
    pub fn new(consensus: Arc<dyn Consensus>, observations: Arc<dyn Observations>) -> Self {
        ManagementService {
            consensus,
            observations,
            leader: None,
        }
    }

    /// Answers soft-state reads from the leader when this node is a follower.
    pub fn with_leader(mut self, leader: Arc<LeaderChannels>) -> Self {
        self.leader = Some(leader);
        self
    }

    /// This service without forwarding: for calls another node already forwarded here.
    fn answering_here(&self) -> Self {
        ManagementService {
            leader: None,
            ..self.clone()
        }
    }

    /// On a follower that knows its leader: a client to the leader's management service and
    /// the channels that stamp requests. `None`: answer here (this node leads, no leader is
    /// known, or forwarding is off).
    fn leader_management(&self) -> Option<(ManagementClient<Channel>, &LeaderChannels)> {
        let leader = self.leader.as_deref()?;
        if leader.is_leader() {
            return None;
        }
        let channel = leader.leader().ok()?;
        Some((ManagementClient::new(channel), leader))
    }

    /// A read of the leader's soft state (heartbeats, placement decisions), asked of the
    /// leader: `None` when this node is the leader, knows none, or the leader it knows does not
    /// answer within [`LEADER_READ_TIMEOUT`] (it died and the election has not ended yet). The
    /// caller then answers from this node's own state, as docs/ctl.md says a follower does.
    pub(super) async fn ask_leader<T, F, Fut>(&self, call: F) -> Result<Option<T>, ApiError>
    where
        F: FnOnce(ManagementClient<Channel>, &LeaderChannels) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>>,
    {
        let Some((leader, channels)) = self.leader_management() else {
            return Ok(None);
        };
        match tokio::time::timeout(LEADER_READ_TIMEOUT, call(leader, channels)).await {
            Ok(Ok(answer)) => Ok(Some(answer.into_inner())),
            Ok(Err(status)) if leader_unreachable(&status) => {
                tracing::debug!(error = %status, "the leader did not answer a read; answering from this node's state");
                Ok(None)
            }
            Ok(Err(status)) => Err(status.into()),
            Err(_) => {
                tracing::debug!(
                    "the leader did not answer a read in time; answering from this node's state"
                );
                Ok(None)
            }
        }
    }

    /// The service for a gRPC call: forwarded calls are answered here.
    fn for_call<T>(&self, request: &Request<T>) -> Self {
        if was_forwarded(request) {
            self.answering_here()
        } else {
            self.clone()
        }
    }

    /// The state a read sees: LOCAL (the default, enum value 0) answers from this node's
    /// applied state; LINEARIZABLE reflects every write committed before the call.
    pub(super) async fn read(&self, consistency: i32) -> Result<Arc<ClusterState>, ApiError> {
        match pb::ReadConsistency::try_from(consistency) {
            Ok(pb::ReadConsistency::Local) => Ok(self.consensus.local_state()),
            Ok(pb::ReadConsistency::Linearizable) => {
                Ok(self.consensus.linearizable_state().await?)
            }
            Err(_) => Err(ApiError::invalid(
                "consistency",
                format!(
                    "{consistency} is not a read consistency; use LOCAL (0) or LINEARIZABLE (1)"
                ),
            )),
        }
    }

    /// A state that includes revision `revision` (a write this node just made): the local
    /// state once it caught up, or a linearizable read if it does not within [`APPLY_WAIT`].
    pub(super) async fn state_at_least(
        &self,
        revision: u64,
    ) -> Result<Arc<ClusterState>, ApiError> {
        let local = self.consensus.local_state();
        if local.revision() >= revision {
            return Ok(local);
        }
        let mut rx = self.consensus.subscribe();
        let caught_up = tokio::time::timeout(APPLY_WAIT, async {
            rx.wait_for(|s| s.revision() >= revision)
                .await
                .map(|s| s.clone())
        })
        .await;
        match caught_up {
            Ok(Ok(state)) => Ok(state),
            _ => Ok(self.consensus.linearizable_state().await?),
        }
    }
}

/// Checks that a name or id field is present; the state machine checks the rest.
pub(super) fn required(field: &str, value: &str) -> Result<(), ApiError> {
    if value.trim().is_empty() {
        return Err(ApiError::invalid(field, "must not be empty"));
    }
    Ok(())
}

type Rpc<T> = Result<Response<T>, Status>;

fn reply<T>(result: Result<T, ApiError>) -> Rpc<T> {
    result.map(Response::new).map_err(Status::from)
}

#[tonic::async_trait]
impl Management for ManagementService {
    async fn deploy_model(&self, r: Request<pb::DeployModelRequest>) -> Rpc<pb::ModelStatus> {
        reply(self.deploy(r.into_inner()).await)
    }

    async fn scale_model(&self, r: Request<pb::ScaleModelRequest>) -> Rpc<pb::ModelStatus> {
        reply(self.scale(r.into_inner()).await)
    }

    async fn set_traffic(&self, r: Request<pb::SetTrafficRequest>) -> Rpc<pb::ModelStatus> {
        reply(self.set_traffic(r.into_inner()).await)
    }

    async fn set_autoscale(&self, r: Request<pb::SetAutoscaleRequest>) -> Rpc<pb::AutoscaleStatus> {
        reply(self.set_autoscale(r.into_inner()).await)
    }

    async fn delete_model(&self, r: Request<pb::ModelRef>) -> Rpc<pb::DeleteModelResponse> {
        reply(self.delete(r.into_inner()).await)
    }

    async fn get_model(&self, r: Request<pb::ModelRef>) -> Rpc<pb::ModelStatus> {
        reply(self.model(r.into_inner()).await)
    }

    async fn list_models(&self, r: Request<pb::ListModelsRequest>) -> Rpc<pb::ListModelsResponse> {
        reply(self.models(r.into_inner()).await)
    }

    async fn explain_placement(&self, r: Request<pb::ModelRef>) -> Rpc<pb::PlacementExplanation> {
        reply(self.for_call(&r).explain(r.into_inner()).await)
    }

    async fn list_nodes(&self, r: Request<pb::ListNodesRequest>) -> Rpc<pb::ListNodesResponse> {
        reply(self.for_call(&r).nodes(r.into_inner()).await)
    }

    async fn get_node(&self, r: Request<pb::NodeRef>) -> Rpc<pb::NodeStatusResponse> {
        reply(self.for_call(&r).node(r.into_inner()).await)
    }

    async fn drain_node(&self, r: Request<pb::NodeRef>) -> Rpc<pb::NodeStatusResponse> {
        reply(self.set_drained(r.into_inner(), true).await)
    }

    async fn undrain_node(&self, r: Request<pb::NodeRef>) -> Rpc<pb::NodeStatusResponse> {
        reply(self.set_drained(r.into_inner(), false).await)
    }

    async fn list_placements(
        &self,
        r: Request<pb::ListPlacementsRequest>,
    ) -> Rpc<pb::ListPlacementsResponse> {
        reply(self.placements(r.into_inner()).await)
    }

    async fn get_cluster_status(
        &self,
        _r: Request<pb::ClusterStatusRequest>,
    ) -> Rpc<pb::ClusterStatus> {
        reply(Ok(self.cluster_status()))
    }

    async fn add_member(&self, r: Request<pb::AddMemberRequest>) -> Rpc<pb::ClusterStatus> {
        reply(self.admit_member(r.into_inner()).await)
    }

    async fn remove_member(&self, r: Request<pb::RemoveMemberRequest>) -> Rpc<pb::ClusterStatus> {
        reply(self.evict_member(r.into_inner()).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unreachable_leader_sends_a_read_back_to_local_state() {
        for status in [
            Status::unavailable("tcp connect error"),
            Status::unknown("transport error"),
            Status::cancelled("the connection broke"),
            Status::deadline_exceeded("no answer"),
        ] {
            assert!(leader_unreachable(&status), "{status:?}");
        }
        for status in [
            Status::not_found("node 'x' is not registered"),
            Status::invalid_argument("bad consistency"),
            Status::unknown("something the leader said"),
            Status::permission_denied("token"),
        ] {
            assert!(!leader_unreachable(&status), "{status:?}");
        }
    }
}
