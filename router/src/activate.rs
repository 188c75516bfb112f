//! Calls the router makes to the control plane on a client's behalf:
//!
//! - **Scale from zero.** A request for a model with `min_replicas` 0 and no ready replica
//!   sends `Cluster.Activate`; the leader places a replica and the router waits for the routing
//!   table to show it ready (bounded by the request's deadline and the configured wait).
//!   While requests keep coming the router renews the activation in the background, at most
//!   once per renewal interval the control plane gave, so the replica stays; when they stop,
//!   the control plane scales the model back to zero.
//! - **Repository load/unload** (Triton's explicit model control), only with
//!   [`RepositoryControl::CallerCredential`]: the management calls carry the caller's own
//!   `authorization`, never the router's token, so the public inference port administers
//!   nothing by itself; the control plane decides whether that credential may (off, the
//!   default, refuses them). Load raises the model's replica floor to at least 1 (and, with a
//!   `config` override, redeploys it with that override), then waits until a replica is ready;
//!   unload sets the model's replicas to 0 (min and max, so requests do not start it again)
//!   and waits until none serves.
//!
//! ```text
//! request ─► no ready replica, min_replicas 0 ─► Activate ─► wait for the table ─► route
//! request ─► routed, min_replicas 0 ─► renewal due? ─► Activate (spawned, not awaited)
//! load    ─► GetModel ─► [DeployModel with config] ─► ScaleModel(min ≥ 1) ─► wait ready
//! unload  ─► ScaleModel(0, 0) ─► wait until no replica is ready
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nereid_proto::pb::cluster::cluster_client::ClusterClient;
use nereid_proto::pb::cluster::management_client::ManagementClient;
use nereid_proto::pb::cluster::{
    ActivateRequest, DeployModelRequest, ModelRef, ReplicaState, ScaleModelRequest,
};
use nereid_proto::{Credential, LoadRequest, UnloadRequest};

use crate::control::ControlPlane;
use crate::error::{RouterError, RouterResult};
use crate::table::{RoutingTable, SharedTable};

/// Whether repository load/unload through the router reach the control plane.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RepositoryControl {
    /// Refused; models are managed with `nereid ctl` or the management API.
    #[default]
    Off,
    /// Forwarded to the management API with the caller's own credential (its
    /// `Authorization` header or `authorization` metadata), which the control plane checks.
    CallerCredential,
}

/// Renewal interval used until the control plane has told one.
const DEFAULT_RENEW_AFTER: Duration = Duration::from_secs(30);

/// Activations and repository calls, with the renewal bookkeeping.
pub struct Activator {
    control: Arc<ControlPlane>,
    table: Arc<SharedTable>,
    /// How long a request (or a load) may wait for a replica to become ready.
    wait: Duration,
    repository_control: RepositoryControl,
    state: Mutex<Renewals>,
}

struct Renewals {
    /// When this router last activated each model.
    sent: HashMap<String, Instant>,
    renew_after: Duration,
}

impl Activator {
    pub fn new(
        control: Arc<ControlPlane>,
        table: Arc<SharedTable>,
        wait: Duration,
        repository_control: RepositoryControl,
    ) -> Activator {
        Activator {
            control,
            table,
            wait,
            repository_control,
            state: Mutex::new(Renewals {
                sent: HashMap::new(),
                renew_after: DEFAULT_RENEW_AFTER,
            }),
        }
    }

    /// Activates `model` and waits until it has a ready replica, at most until `deadline`
    /// (the request's) or the configured wait, whichever comes first.
    pub async fn scale_from_zero(
        &self,
        model: &str,
        deadline: Option<Instant>,
    ) -> RouterResult<()> {
        let started = Instant::now();
        self.activate(model).await?;
        let limit = match deadline {
            Some(d) => d.saturating_duration_since(started).min(self.wait),
            None => self.wait,
        };
        tracing::info!(
            model,
            "no ready replica: asked the control plane to start one"
        );
        self.wait_ready(model, started, limit).await
    }

    /// How long a request waits at most for an activated model to become ready.
    pub fn wait(&self) -> Duration {
        self.wait
    }

    /// Renews the activation of `model` in the background when it is due.
    pub fn keep_alive(self: &Arc<Self>, model: &str) {
        if !self.due(model, Instant::now()) {
            return;
        }
        let this = self.clone();
        let model = model.to_string();
        tokio::spawn(async move {
            if let Err(e) = this.activate(&model).await {
                tracing::warn!(model, error = %e, "could not renew the model's activation");
                this.forget(&model);
            }
        });
    }

    /// Whether an activation of `model` is due at `now`; if so, counts it as sent.
    fn due(&self, model: &str, now: Instant) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let renew_after = s.renew_after;
        match s.sent.get(model) {
            Some(t) if now.saturating_duration_since(*t) < renew_after => false,
            _ => {
                s.sent.insert(model.to_string(), now);
                true
            }
        }
    }

    fn forget(&self, model: &str) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.sent.remove(model);
    }

    async fn activate(&self, model: &str) -> RouterResult<()> {
        let answer =
            self.control
                .call(
                    ActivateRequest {
                        model: model.to_string(),
                    },
                    |channel, request| async move {
                        ClusterClient::new(channel).activate(request).await
                    },
                )
                .await
                .map_err(control_plane_error)?;
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.sent.insert(model.to_string(), Instant::now());
        if answer.renew_after_ms > 0 {
            s.renew_after = Duration::from_millis(answer.renew_after_ms);
        }
        Ok(())
    }

    /// Triton's repository load: the model serves at least one replica (with the request's
    /// config override, if any) and a replica is ready when this returns.
    pub async fn load(&self, name: &str, request: LoadRequest) -> RouterResult<()> {
        self.repository_control_on(name, "load")?;
        let caller = request.credential.as_ref();
        if !request.files.is_empty() {
            return Err(RouterError::InvalidRequest(format!(
                "load of model '{name}' through the router cannot carry model files; put them in the model's source and deploy it with the management API"
            )));
        }
        let started = Instant::now();
        let status = self
            .control
            .call(
                ModelRef {
                    name: name.to_string(),
                    ..Default::default()
                },
                |c, r| async move {
                    ManagementClient::new(c)
                        .get_model(as_caller(r, caller))
                        .await
                },
            )
            .await
            .map_err(control_plane_error)?;
        let mut model = status.model.unwrap_or_default();
        if let Some(config) = request.config {
            model.config_override = config;
            self.control
                .call(
                    DeployModelRequest {
                        model: Some(model.clone()),
                    },
                    |c, r| async move {
                        ManagementClient::new(c)
                            .deploy_model(as_caller(r, caller))
                            .await
                    },
                )
                .await
                .map_err(control_plane_error)?;
        }
        if model.min_replicas == 0 {
            self.scale(name, 1, model.max_replicas.max(1), caller)
                .await?;
        }
        self.wait_ready(name, started, self.wait).await
    }

    /// Triton's repository unload: the model keeps no replica (and requests do not start one)
    /// until it is loaded again; no replica is ready when this returns.
    pub async fn unload(&self, name: &str, request: UnloadRequest) -> RouterResult<()> {
        self.repository_control_on(name, "unload")?;
        let started = Instant::now();
        self.scale(name, 0, 0, request.credential.as_ref()).await?;
        self.forget(name);
        let remaining = self.wait.saturating_sub(started.elapsed());
        if self
            .table
            .wait_until(remaining, |t| t.ready_versions(name).is_empty())
            .await
        {
            return Ok(());
        }
        Err(RouterError::ControlPlane {
            error: nereid_proto::ServiceError::Unavailable(format!(
                "model '{name}' still has a ready replica {} ms after the unload",
                started.elapsed().as_millis()
            )),
        })
    }

    /// Refuses a repository call unless repository control is on.
    fn repository_control_on(&self, model: &str, operation: &'static str) -> RouterResult<()> {
        match self.repository_control {
            RepositoryControl::Off => Err(RouterError::RepositoryControlOff {
                model: model.to_string(),
                operation,
            }),
            RepositoryControl::CallerCredential => Ok(()),
        }
    }

    async fn scale(
        &self,
        name: &str,
        min: u32,
        max: u32,
        caller: Option<&Credential>,
    ) -> RouterResult<()> {
        self.control
            .call(
                ScaleModelRequest {
                    name: name.to_string(),
                    min_replicas: min,
                    max_replicas: max,
                },
                |c, r| async move {
                    ManagementClient::new(c)
                        .scale_model(as_caller(r, caller))
                        .await
                },
            )
            .await
            .map(|_| ())
            .map_err(control_plane_error)
    }

    /// Waits until `model` has a ready replica, every replica it has failed, or `limit` from
    /// `started` passes; an error (with a failed replica's reason) unless one is ready.
    async fn wait_ready(&self, model: &str, started: Instant, limit: Duration) -> RouterResult<()> {
        let remaining = limit.saturating_sub(started.elapsed());
        self.table
            .wait_until(remaining, |t| ready_or_failed(t, model))
            .await;
        let table = self.table.load();
        if !table.ready_versions(model).is_empty() {
            return Ok(());
        }
        Err(RouterError::NotReadyInTime {
            model: model.to_string(),
            waited_ms: started.elapsed().as_millis() as u64,
            reason: failure_reason(&table, model),
        })
    }
}

/// Whether `model` has a ready replica, or every replica it has failed (waiting longer would
/// not help).
fn ready_or_failed(table: &RoutingTable, model: &str) -> bool {
    if !table.ready_versions(model).is_empty() {
        return true;
    }
    let mut replicas = table.replicas_of(model).peekable();
    replicas.peek().is_some() && replicas.all(|r| r.state == ReplicaState::Failed as i32)
}

/// Why a replica of `model` failed to load, if one did.
fn failure_reason(table: &RoutingTable, model: &str) -> Option<String> {
    table
        .replicas_of(model)
        .filter(|r| r.state == ReplicaState::Failed as i32)
        .map(|r| r.failure_reason.clone())
        .find(|r| !r.is_empty())
}

/// `request` with the caller's credential in place of the router's token (none when the
/// caller sent none): a repository call is the caller's, not the router's.
fn as_caller<M>(mut request: tonic::Request<M>, caller: Option<&Credential>) -> tonic::Request<M> {
    let metadata = request.metadata_mut();
    metadata.remove("authorization");
    if let Some(value) = caller.and_then(|c| c.header_value().parse().ok()) {
        metadata.insert("authorization", value);
    }
    request
}

fn control_plane_error(status: tonic::Status) -> RouterError {
    RouterError::ControlPlane {
        error: nereid_proto::ServiceError::from(status),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::ControlPlaneConfig;
    use crate::table::tests::{model, node, replica, snapshot};

    fn table_with(states: &[(u64, ReplicaState, &str)]) -> RoutingTable {
        let replicas = states
            .iter()
            .map(|(id, state, reason)| {
                let mut r = replica(*id, "m", 1, "a", false);
                r.state = *state as i32;
                r.failure_reason = reason.to_string();
                r
            })
            .collect();
        let mut t = RoutingTable::default();
        t.apply(&snapshot(
            1,
            vec![model("m", &[1])],
            vec![node("a", "a:1")],
            replicas,
        ));
        t
    }

    #[test]
    fn waiting_ends_on_a_ready_replica_or_when_every_replica_failed() {
        assert!(
            !ready_or_failed(&table_with(&[]), "m"),
            "nothing placed yet"
        );
        let loading = table_with(&[(1, ReplicaState::Loading, "")]);
        assert!(!ready_or_failed(&loading, "m"));
        let ready = table_with(&[(1, ReplicaState::Ready, "")]);
        assert!(ready_or_failed(&ready, "m"));
        let failed = table_with(&[(1, ReplicaState::Failed, "bad onnx")]);
        assert!(ready_or_failed(&failed, "m"));
        assert_eq!(failure_reason(&failed, "m").as_deref(), Some("bad onnx"));
        let mixed = table_with(&[
            (1, ReplicaState::Failed, "bad onnx"),
            (2, ReplicaState::Loading, ""),
        ]);
        assert!(
            !ready_or_failed(&mixed, "m"),
            "another replica may still load"
        );
    }

    /// An activator whose control plane is unreachable, with the router's own token.
    fn activator(repository_control: RepositoryControl) -> Activator {
        let control = Arc::new(
            ControlPlane::new(&ControlPlaneConfig {
                control_plane: vec!["127.0.0.1:1".into()],
                token: Some("router-secret".into()),
                ..Default::default()
            })
            .unwrap(),
        );
        Activator::new(
            control,
            Arc::default(),
            Duration::from_secs(1),
            repository_control,
        )
    }

    #[tokio::test]
    async fn repository_calls_are_refused_when_repository_control_is_off() {
        let a = activator(RepositoryControl::Off);
        let admin = Credential::new("Bearer admin-secret");
        let load = a
            .load(
                "m",
                LoadRequest {
                    credential: admin.clone(),
                    ..Default::default()
                },
            )
            .await
            .unwrap_err();
        assert!(
            matches!(&load, RouterError::RepositoryControlOff { model, operation: "load" } if model == "m"),
            "{load:?}"
        );
        assert!(load.to_string().contains("--repository-control"));
        let unload = a
            .unload(
                "m",
                UnloadRequest {
                    unload_dependents: false,
                    credential: admin,
                },
            )
            .await
            .unwrap_err();
        assert!(matches!(
            unload,
            RouterError::RepositoryControlOff {
                operation: "unload",
                ..
            }
        ));
        let on = activator(RepositoryControl::CallerCredential);
        let reached = on.unload("m", UnloadRequest::new(false)).await.unwrap_err();
        assert!(
            matches!(reached, RouterError::ControlPlane { .. }),
            "with repository control on, the call goes to the control plane: {reached:?}"
        );
    }

    #[test]
    fn repository_calls_carry_the_callers_credential_never_the_routers() {
        let control = ControlPlane::new(&ControlPlaneConfig {
            control_plane: vec!["127.0.0.1:1".into()],
            token: Some("router-secret".into()),
            ..Default::default()
        })
        .unwrap();
        let with_router_token = || control.client().request(());
        assert_eq!(
            with_router_token().metadata().get("authorization").unwrap(),
            "Bearer router-secret"
        );
        let caller = Credential::new("Bearer caller-secret");
        let sent = as_caller(with_router_token(), caller.as_ref());
        assert_eq!(
            sent.metadata().get("authorization").unwrap(),
            "Bearer caller-secret"
        );
        let anonymous = as_caller(with_router_token(), None);
        assert!(anonymous.metadata().get("authorization").is_none());
    }

    #[tokio::test]
    async fn renewals_are_due_once_per_interval() {
        let a = activator(RepositoryControl::Off);
        let t0 = Instant::now();
        assert!(a.due("m", t0), "never sent");
        assert!(!a.due("m", t0 + Duration::from_secs(1)));
        assert!(a.due("n", t0), "per model");
        assert!(a.due("m", t0 + DEFAULT_RENEW_AFTER));
        a.forget("m");
        assert!(
            a.due("m", t0 + DEFAULT_RENEW_AFTER),
            "a failed renewal is retried"
        );
    }
}
