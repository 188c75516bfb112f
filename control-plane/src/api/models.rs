//! Model RPCs: deploy, scale, delete, get, list, and the placement explanation.

use nereid_proto::pb::cluster as pb;

use super::error::ApiError;
use super::service::{ManagementService, required};
use super::source::{check_config_name, resolve_versions};
use crate::convert::{model_from_pb, model_to_pb, plan_to_decisions, replica_to_pb};
use crate::state::{ClusterState, Command, EntityKind, ModelSpec, ReplicaState, StateError};
use crate::views;

/// A model and its replicas as `state` has them, with the memory a replica measured (the
/// largest over its served versions, as placement counts it; with no replica left, what the
/// leader remembers of them, `remembered`; 0 until one measured).
fn model_status(
    spec: &ModelSpec,
    state: &ClusterState,
    remembered: (Option<u64>, Option<u64>),
) -> pb::ModelStatus {
    let replicas: Vec<_> = state.replicas_of(&spec.name).collect();
    let served = spec.served_versions();
    let measured = |of: fn(&crate::state::Replica) -> Option<u64>, kept: Option<u64>| {
        replicas
            .iter()
            .filter(|r| served.contains(&r.version))
            .filter_map(|r| of(r))
            .max()
            .or(kept)
            .unwrap_or(0)
    };
    pb::ModelStatus {
        measured_memory_bytes: measured(|r| r.measured_memory_bytes, remembered.0),
        measured_gpu_memory_bytes: measured(|r| r.measured_gpu_memory_bytes, remembered.1),
        model: Some(model_to_pb(spec)),
        ready_replicas: replicas
            .iter()
            .filter(|r| r.state == ReplicaState::Ready)
            .count() as u32,
        replicas: replicas.into_iter().map(replica_to_pb).collect(),
        revision: state.revision(),
    }
}

fn find<'a>(state: &'a ClusterState, name: &str) -> Result<&'a ModelSpec, ApiError> {
    state.model(name).ok_or_else(|| {
        StateError::NotFound {
            kind: EntityKind::Model,
            name: name.to_string(),
        }
        .into()
    })
}

impl ManagementService {
    /// [`model_status`] with what the leader remembers of the model's measured memory.
    fn status_of(&self, spec: &ModelSpec, state: &ClusterState) -> pb::ModelStatus {
        model_status(spec, state, self.observations.remembered_memory(&spec.name))
    }

    /// Validates the model, lists its source's version folders and writes it (create or
    /// replace). The answer reflects the write.
    pub async fn deploy(&self, req: pb::DeployModelRequest) -> Result<pb::ModelStatus, ApiError> {
        let Some(model) = req.model else {
            return Err(ApiError::invalid("model", "is missing"));
        };
        let mut spec = model_from_pb(model)?;
        check_config_name(&spec).await?;
        resolve_versions(&mut spec).await?;
        let applied = self
            .consensus
            .write(Command::UpsertModel(spec.clone()))
            .await?;
        let state = self.state_at_least(applied.revision).await?;
        Ok(self.status_of(state.model(&spec.name).unwrap_or(&spec), &state))
    }

    pub async fn scale(&self, req: pb::ScaleModelRequest) -> Result<pb::ModelStatus, ApiError> {
        required("name", &req.name)?;
        let applied = self
            .consensus
            .write(Command::ScaleModel {
                name: req.name.clone(),
                min: req.min_replicas,
                max: req.max_replicas,
            })
            .await?;
        let state = self.state_at_least(applied.revision).await?;
        Ok(self.status_of(find(&state, &req.name)?, &state))
    }

    /// Replaces the model's traffic split (no weights: clears it).
    pub async fn set_traffic(
        &self,
        req: pb::SetTrafficRequest,
    ) -> Result<pb::ModelStatus, ApiError> {
        required("name", &req.name)?;
        let applied = self
            .consensus
            .write(Command::SetTraffic {
                name: req.name.clone(),
                weights: req.weights.into_iter().collect(),
            })
            .await?;
        let state = self.state_at_least(applied.revision).await?;
        Ok(self.status_of(find(&state, &req.name)?, &state))
    }

    /// Removes the model; its replicas unload.
    pub async fn delete(&self, req: pb::ModelRef) -> Result<pb::DeleteModelResponse, ApiError> {
        required("name", &req.name)?;
        let applied = self
            .consensus
            .write(Command::DeleteModel { name: req.name })
            .await?;
        Ok(pb::DeleteModelResponse {
            revision: applied.revision,
        })
    }

    pub async fn model(&self, req: pb::ModelRef) -> Result<pb::ModelStatus, ApiError> {
        required("name", &req.name)?;
        let state = self.read(req.consistency).await?;
        Ok(self.status_of(find(&state, &req.name)?, &state))
    }

    pub async fn models(
        &self,
        req: pb::ListModelsRequest,
    ) -> Result<pb::ListModelsResponse, ApiError> {
        let state = self.read(req.consistency).await?;
        Ok(pb::ListModelsResponse {
            models: state
                .models()
                .values()
                .map(|m| self.status_of(m, &state))
                .collect(),
            revision: state.revision(),
        })
    }

    /// Where each replica is and why, what placement would do now, and the leader's recent
    /// decisions. A deleted model whose replicas are still unloading can be explained too.
    pub async fn explain(&self, req: pb::ModelRef) -> Result<pb::PlacementExplanation, ApiError> {
        required("name", &req.name)?;
        let request = req.clone();
        let asked = self
            .ask_leader(|mut leader, channels| {
                let request = channels.request(request);
                async move { leader.explain_placement(request).await }
            })
            .await?;
        if let Some(answer) = asked {
            return Ok(answer);
        }
        let state = self.read(req.consistency).await?;
        let name = req.name.as_str();
        if state.model(name).is_none() && state.replicas_of(name).next().is_none() {
            find(&state, name)?;
        }
        let plan = views::plan_for(&state, &self.observations.load())
            .for_model(name, |id| state.replica(id).map(|r| r.model.clone()));
        Ok(pb::PlacementExplanation {
            model: req.name.clone(),
            replicas: state.replicas_of(name).map(replica_to_pb).collect(),
            pending: plan_to_decisions(&plan, &state),
            history: self.observations.placement_history(name),
            revision: state.revision(),
            autoscale: state.autoscale(name).and_then(|_| {
                super::autoscale::autoscale_status(&state, &*self.observations, name)
            }),
        })
    }
}
