//! Node, placement and control-plane membership RPCs.

use nereid_proto::pb::cluster as pb;

use super::error::ApiError;
use super::service::{ManagementService, required};
use crate::convert::{node_to_pb, replica_to_pb};
use crate::state::{ClusterState, Command, EntityKind, Node, StateError};

impl ManagementService {
    fn node_status(&self, node: &Node, state: &ClusterState) -> pb::NodeStatusResponse {
        pb::NodeStatusResponse {
            node: Some(node_to_pb(node)),
            replicas: state
                .replicas_on(&node.spec.id)
                .map(replica_to_pb)
                .collect(),
            utilization: self.observations.node_utilization(&node.spec.id),
            revision: state.revision(),
        }
    }

    fn find_node<'a>(state: &'a ClusterState, id: &str) -> Result<&'a Node, ApiError> {
        state.node(id).ok_or_else(|| {
            StateError::NotFound {
                kind: EntityKind::Node,
                name: id.to_string(),
            }
            .into()
        })
    }

    pub async fn nodes(
        &self,
        req: pb::ListNodesRequest,
    ) -> Result<pb::ListNodesResponse, ApiError> {
        let request = req;
        let asked = self
            .ask_leader(|mut leader, channels| {
                let request = channels.request(request);
                async move { leader.list_nodes(request).await }
            })
            .await?;
        if let Some(answer) = asked {
            return Ok(answer);
        }
        let state = self.read(req.consistency).await?;
        Ok(pb::ListNodesResponse {
            nodes: state
                .nodes()
                .values()
                .map(|n| self.node_status(n, &state))
                .collect(),
            revision: state.revision(),
        })
    }

    /// A node, its replicas and (on the leader) its utilization from heartbeats.
    pub async fn node(&self, req: pb::NodeRef) -> Result<pb::NodeStatusResponse, ApiError> {
        required("id", &req.id)?;
        let request = req.clone();
        let asked = self
            .ask_leader(|mut leader, channels| {
                let request = channels.request(request);
                async move { leader.get_node(request).await }
            })
            .await?;
        if let Some(answer) = asked {
            return Ok(answer);
        }
        let state = self.read(req.consistency).await?;
        Ok(self.node_status(Self::find_node(&state, &req.id)?, &state))
    }

    /// Drains (no new replicas; existing ones move away) or undrains a node.
    pub async fn set_drained(
        &self,
        req: pb::NodeRef,
        drained: bool,
    ) -> Result<pb::NodeStatusResponse, ApiError> {
        required("id", &req.id)?;
        let applied = self
            .consensus
            .write(Command::SetNodeDrained {
                id: req.id.clone(),
                drained,
            })
            .await?;
        let state = self.state_at_least(applied.revision).await?;
        Ok(self.node_status(Self::find_node(&state, &req.id)?, &state))
    }

    /// Every replica in the cluster, in id order.
    pub async fn placements(
        &self,
        req: pb::ListPlacementsRequest,
    ) -> Result<pb::ListPlacementsResponse, ApiError> {
        let state = self.read(req.consistency).await?;
        Ok(pb::ListPlacementsResponse {
            replicas: state.replicas().values().map(replica_to_pb).collect(),
            revision: state.revision(),
        })
    }

    /// What this node knows of the control-plane cluster, with its applied state's revision.
    pub fn cluster_status(&self) -> pb::ClusterStatus {
        let status = self.consensus.status();
        pb::ClusterStatus {
            node_id: status.node_id,
            leader_id: status.leader_id.unwrap_or(0),
            leader_address: status.leader_address.unwrap_or_default(),
            term: status.term,
            commit_index: status.commit_index,
            applied_index: status.applied_index,
            members: status
                .members
                .into_iter()
                .map(|m| pb::Member {
                    id: m.id,
                    address: m.address,
                    voter: m.voter,
                })
                .collect(),
            revision: self.consensus.local_state().revision(),
        }
    }

    /// Adds a control-plane node (learner, then voter once caught up).
    pub async fn admit_member(
        &self,
        req: pb::AddMemberRequest,
    ) -> Result<pb::ClusterStatus, ApiError> {
        if req.id == 0 {
            return Err(ApiError::invalid("id", "must be a positive node id"));
        }
        required("address", &req.address)?;
        if !req.address.contains(':') {
            return Err(ApiError::invalid(
                "address",
                format!("'{}' has no port; expected host:port", req.address),
            ));
        }
        self.consensus.add_member(req.id, req.address).await?;
        Ok(self.cluster_status())
    }

    pub async fn evict_member(
        &self,
        req: pb::RemoveMemberRequest,
    ) -> Result<pb::ClusterStatus, ApiError> {
        if req.id == 0 {
            return Err(ApiError::invalid("id", "must be a positive node id"));
        }
        self.consensus.remove_member(req.id).await?;
        Ok(self.cluster_status())
    }
}
