//! One control-plane process: the Raft node, the gRPC services (Raft transport, management,
//! cluster) on one port, the REST mirror on another, and the leader loop.
//!
//! ```text
//!  run(config)
//!   ├─ RaftNode::start (redb in data_dir; bootstrap from peers, or wait to be added by --join)
//!   │  or, with Store::Etcd, EtcdStore::start (no Raft service; etcd holds the state)
//!   ├─ gRPC :listen   ── [mTLS] ── auth ─► Raft │ Management │ Cluster (Watch from WatchHub)
//!   ├─ REST :http     ── [mTLS] ── auth ─► /api/v1/... (same ManagementService)
//!   ├─ metrics :metrics ─► /metrics (metrics::ControlPlaneCollector; no auth, like a worker's)
//!   ├─ leader::task   (liveness + placement while this node leads)
//!   ├─ --join ADDR    ─► AddMember(self) on ADDR until accepted
//!   └─ --model-repository DIR ─► register each model not registered yet
//!  shutdown signal ─► stop accepting, leader loop ends, Raft shuts down
//! ```
//!
//! With `cluster_tls` (`--cluster-tls-*`) the gRPC and REST ports speak TLS only and require
//! client certificates signed by the cluster CA, and every call this node makes to a peer (Raft,
//! forwarding to the leader, joining) goes over TLS with its own certificate. Metrics stay
//! plaintext, like a worker's.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nereid_frontend::{PortConfig, PortsConfig};
use nereid_proto::pb::cluster as pb;
use nereid_proto::pb::cluster::cluster_server::ClusterServer;
use nereid_proto::pb::cluster::management_client::ManagementClient;
use nereid_proto::pb::cluster::management_server::ManagementServer;
use nereid_proto::pb::cluster::raft_server::RaftServer;
use nereid_telemetry::prometheus_router;
use nereid_tls::{ClusterDial, ClusterTls};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::api::auth::{AuthToken, Scope};
use crate::api::rest;
use crate::api::service::ManagementService;
use crate::cluster::service::ClusterService;
use crate::consensus::{Consensus, ConsensusError};
use crate::etcd::{EtcdConfig, EtcdStore};
use crate::forward::LeaderChannels;
use crate::leader::soft::SoftState;
use crate::leader::task::{self, LeaderConfig};
use crate::metrics::{ControlPlaneCollector, PlacementDecisions};
use crate::raft::{RaftConfig, RaftNode};
use crate::source::repository_models;
use crate::state::Command;
use crate::watch::WatchHub;

/// Everything `nereid control-plane` is configured with.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node's id, unique in the cluster: its Raft member id, or its identity among the
    /// processes sharing an etcd store.
    pub node_id: u64,
    /// gRPC: Raft transport, management and cluster services.
    pub listen: SocketAddr,
    /// The gRPC address peers, workers and `ctl` reach this node at; defaults to `listen`.
    pub advertise: Option<String>,
    /// REST mirror of the management API; `None` disables it.
    pub http_listen: Option<SocketAddr>,
    /// Prometheus `/metrics`; `None` disables it.
    pub metrics_listen: Option<SocketAddr>,
    /// Where the Raft log, snapshots and the state machine are kept (Raft store only).
    pub data_dir: PathBuf,
    /// Initial members (id → gRPC address), this node included. Empty: a single node.
    pub peers: BTreeMap<u64, String>,
    /// Join the cluster a member at this address belongs to, instead of bootstrapping.
    pub join: Option<String>,
    /// The bearer tokens callers must present (or `AuthToken::disabled()`).
    pub auth: AuthToken,
    /// The token as a string, for calls this node makes to its peers.
    pub auth_value: Option<String>,
    /// What workers are told to use between heartbeats.
    pub heartbeat_interval: Duration,
    /// Silence after which the leader declares a worker down.
    pub heartbeat_timeout: Duration,
    /// How often the leader runs a placement round (assignments, repairs, autoscaling).
    pub placement_interval: Duration,
    /// How long a model with min_replicas 0 keeps the replica requests started (scale from
    /// zero) after routers stop activating it.
    pub scale_to_zero_after: Duration,
    /// Rebalancing moves in flight at most; 0 turns rebalancing off.
    pub rebalance_max_moves: u32,
    /// Model cache: when a replica finds no room, evict least-recently-used idle replicas
    /// placed at least this long ago; `None` turns eviction off.
    pub evict_min_residency: Option<Duration>,
    /// Interval of the Raft leader's heartbeats to its followers.
    pub raft_heartbeat: Duration,
    /// A follower campaigns a random time in `election_timeout_min..election_timeout_max`
    /// after the dead leader's lease (`election_timeout_max`) ends; see `RaftConfig`.
    pub election_timeout_min: Duration,
    /// Upper end of the election timeout; also the leader's lease.
    pub election_timeout_max: Duration,
    /// Raft log entries since the last snapshot after which a new snapshot is taken.
    pub snapshot_threshold: u64,
    /// Model repositories whose models are registered at start (when not registered yet).
    pub model_repositories: Vec<PathBuf>,
    /// Replicas per model version for the models registered from `model_repositories`.
    pub default_replicas: u32,
    /// Mutual TLS on the gRPC and REST ports and to peers; `None`: plaintext.
    pub cluster_tls: Option<ClusterTls>,
    /// Where the state of record lives.
    pub store: Store,
}

/// The store behind the `Consensus` trait: this node's Raft group (`data_dir`, `peers`, `join`),
/// or an existing etcd shared by any number of stateless control-plane processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Store {
    /// This node's own Raft group.
    Raft,
    /// An etcd cluster holding the state of record for every control-plane process.
    Etcd(EtcdConfig),
}

/// The running store, for shutdown.
enum Backend {
    Raft(Arc<RaftNode>),
    Etcd(Arc<EtcdStore>),
}

/// Why a control-plane node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("cannot listen for {what} on {addr}: {source}")]
    /// A listener could not be bound.
    Bind {
        /// Which listener: `gRPC`, `REST` or `metrics`.
        what: &'static str,
        /// The address it was asked for.
        addr: SocketAddr,
        /// The bind error.
        source: std::io::Error,
    },
    #[error("raft: {0}")]
    /// The Raft group could not be started or joined.
    Raft(String),
    #[error("etcd store: {0}")]
    /// The etcd store could not be reached or set up.
    Etcd(String),
    #[error("{0}")]
    /// A setting that cannot work (the message says which).
    Config(String),
    #[error("gRPC server failed: {0}")]
    /// A server stopped with an error.
    Serve(String),
}

/// The largest message the control plane's gRPC services decode (tonic's default).
const CONTROL_PLANE_MAX_MESSAGE_SIZE: usize = 4 * 1024 * 1024;

/// A node's listeners, bound before anything starts so that a taken port fails fast.
pub struct Listeners {
    grpc: TcpListener,
    http: Option<TcpListener>,
    metrics: Option<TcpListener>,
}

impl Listeners {
    /// Binds the gRPC, REST and metrics addresses of `config` (the last two when enabled).
    pub async fn bind(config: &NodeConfig) -> Result<Listeners, NodeError> {
        let bind = |what, addr| async move {
            nereid_frontend::bind(what, addr, nereid_frontend::DEFAULT_LISTEN_BACKLOG)
                .await
                .map_err(|e| NodeError::Bind {
                    what: e.what,
                    addr: e.addr,
                    source: e.source,
                })
        };
        Ok(Listeners {
            grpc: bind("gRPC", Some(config.listen))
                .await?
                .ok_or_else(|| NodeError::Config("no gRPC address".into()))?,
            http: bind("REST", config.http_listen).await?,
            metrics: bind("metrics", config.metrics_listen).await?,
        })
    }

    /// Where gRPC listens (the port chosen when the config asked for port 0).
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.grpc.local_addr().ok()
    }

    /// Where the REST mirror listens, when enabled.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Where Prometheus metrics are served, when enabled.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics.as_ref().and_then(|l| l.local_addr().ok())
    }
}

/// Runs a control-plane node until `shutdown` resolves.
pub async fn run(
    config: NodeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError> {
    let listeners = Listeners::bind(&config).await?;
    serve(config, listeners, shutdown).await
}

/// [`run`] on listeners already bound.
pub async fn serve(
    config: NodeConfig,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), NodeError> {
    let Listeners {
        grpc: grpc_listener,
        http: http_listener,
        metrics: metrics_listener,
    } = listeners;
    let grpc_addr = grpc_listener.local_addr().unwrap_or(config.listen);
    let advertise = config
        .advertise
        .clone()
        .unwrap_or_else(|| grpc_addr.to_string());
    let repositories = config
        .model_repositories
        .iter()
        .map(|repo| repository_models(repo, config.default_replicas))
        .collect::<Result<Vec<_>, _>>()
        .map_err(NodeError::Config)?;

    let mut raft_config = RaftConfig::new(config.node_id, advertise.clone(), &config.data_dir);
    raft_config.peers = config.peers.clone();
    raft_config.join = config.join.is_some();
    raft_config.heartbeat_interval = config.raft_heartbeat;
    raft_config.election_timeout_min = config.election_timeout_min;
    raft_config.election_timeout_max = config.election_timeout_max;
    raft_config.snapshot_threshold = config.snapshot_threshold;
    raft_config.auth_token = config.auth_value.clone();
    let dial = config
        .cluster_tls
        .as_ref()
        .map(|tls| tls.dial.clone())
        .unwrap_or_default();
    raft_config.dial = dial.clone();
    let (backend, raft_service) = match &config.store {
        Store::Raft => {
            let (raft, service) = RaftNode::start(raft_config)
                .await
                .map_err(|e| NodeError::Raft(e.to_string()))?;
            (Backend::Raft(raft), Some(service))
        }
        Store::Etcd(etcd) => {
            let store = EtcdStore::start(config.node_id, advertise.clone(), etcd.clone())
                .await
                .map_err(|e| NodeError::Etcd(e.to_string()))?;
            (Backend::Etcd(store), None)
        }
    };
    let consensus: Arc<dyn Consensus> = match &backend {
        Backend::Raft(raft) => raft.clone(),
        Backend::Etcd(store) => store.clone(),
    };

    let soft = Arc::new(
        SoftState::new(config.heartbeat_timeout)
            .with_scale_to_zero_after(config.scale_to_zero_after)
            .with_rebalance_max_moves(config.rebalance_max_moves)
            .with_min_residency(config.evict_min_residency),
    );
    let hub = Arc::new(WatchHub::spawn(consensus.as_ref()));
    let leader_channels = Arc::new(
        LeaderChannels::new(consensus.clone(), config.auth_value.clone()).with_dial(dial.clone()),
    );
    let management = ManagementService::new(consensus.clone(), soft.clone())
        .with_leader(leader_channels.clone());
    let cluster = ClusterService::new(
        consensus.clone(),
        soft.clone(),
        hub,
        leader_channels,
        config.heartbeat_interval,
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let decisions = Arc::new(PlacementDecisions::default());
    let cache_stats = soft.cache_stats();
    let leader_task = tokio::spawn(task::run(
        consensus.clone(),
        soft,
        LeaderConfig {
            round_interval: config.placement_interval,
        },
        decisions.clone(),
        stop_rx.clone(),
    ));

    let auth = config.auth.clone();
    let mut ports = PortsConfig::default();
    nereid_frontend::fit_ports_to_fd_limit(&mut ports);
    let with_tls =
        |base: &PortConfig, tls: Option<&Arc<nereid_tls::rustls::ServerConfig>>| PortConfig {
            tls: tls.cloned(),
            ..base.clone()
        };
    let grpc_port = with_tls(&ports.grpc, config.cluster_tls.as_ref().map(|t| &t.grpc));
    let rest_port = with_tls(&ports.http, config.cluster_tls.as_ref().map(|t| &t.http));
    let mut routes = tonic::service::Routes::builder();
    if let Some(raft) = raft_service {
        routes.add_service(auth.guard(Scope::Raft, RaftServer::new(raft)));
    }
    routes
        .add_service(auth.guard(Scope::Management, ManagementServer::new(management.clone())))
        .add_service(auth.guard(Scope::Cluster, ClusterServer::new(cluster)));
    let grpc = tokio::spawn(nereid_frontend::serve_grpc_port(
        "control-plane gRPC",
        grpc_listener,
        routes.routes(),
        grpc_port,
        ports.grpc_serving(CONTROL_PLANE_MAX_MESSAGE_SIZE),
        stop_rx.clone(),
    ));
    let rest = http_listener.map(|listener| {
        let app = rest::router(management, auth.clone());
        tokio::spawn(nereid_frontend::serve_http_port(
            "control-plane REST",
            listener,
            app,
            rest_port,
            ports.http_serving(),
            stop_rx.clone(),
        ))
    });
    let metrics_addr = metrics_listener.as_ref().and_then(|l| l.local_addr().ok());
    let metrics = metrics_listener.map(|listener| {
        let app = prometheus_router(Arc::new(ControlPlaneCollector {
            consensus: consensus.clone(),
            decisions,
            cache: cache_stats,
        }));
        tokio::spawn(nereid_frontend::serve_metrics_port(
            "control-plane metrics",
            listener,
            app,
            &ports,
            stop_rx.clone(),
        ))
    });
    info!(
        node = config.node_id,
        grpc = %grpc_addr,
        rest = ?config.http_listen,
        metrics = ?metrics_addr,
        advertise = %advertise,
        tls = config.cluster_tls.is_some(),
        "control-plane node serving"
    );

    if let Some(target) = config.join.clone() {
        tokio::spawn(join(
            target,
            config.node_id,
            advertise.clone(),
            config.auth_value.clone(),
            dial.clone(),
            stop_rx.clone(),
        ));
    }
    tokio::spawn(config.auth.clone().reload_on_hangup_task(stop_rx.clone()));
    for models in repositories {
        tokio::spawn(register_models(consensus.clone(), models, stop_rx.clone()));
    }

    shutdown.await;
    info!("shutting down the control-plane node");
    let _ = stop_tx.send(true);
    let _ = leader_task.await;
    if let Some(rest) = rest {
        let _ = rest.await;
    }
    if let Some(metrics) = metrics {
        let _ = metrics.await;
    }
    let served = grpc.await;
    match backend {
        Backend::Raft(raft) => {
            if let Err(e) = raft.shutdown().await {
                warn!("raft shutdown: {e}");
            }
        }
        Backend::Etcd(store) => store.shutdown().await,
    }
    match served {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(NodeError::Serve(e.to_string())),
        Err(e) => Err(NodeError::Serve(e.to_string())),
    }
}

/// Asks the cluster at `target` to add this node, until it accepts or we stop.
async fn join(
    target: String,
    id: u64,
    address: String,
    token: Option<String>,
    dial: ClusterDial,
    stop: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        if *stop.borrow() {
            return;
        }
        match add_self(&target, id, &address, token.as_deref(), &dial).await {
            Ok(()) => {
                info!(%target, "joined the control-plane cluster");
                return;
            }
            Err(e) => warn!(%target, "join failed, retrying: {e}"),
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

async fn add_self(
    target: &str,
    id: u64,
    address: &str,
    token: Option<&str>,
    dial: &ClusterDial,
) -> Result<(), tonic::Status> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("{}://{target}", dial.scheme()))
        .map_err(|e| tonic::Status::invalid_argument(format!("--join '{target}': {e}")))?
        .connect_timeout(Duration::from_secs(2));
    let channel = dial
        .connect(&endpoint)
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut client = ManagementClient::new(channel);
    let mut request = tonic::Request::new(pb::AddMemberRequest {
        id,
        address: address.to_string(),
    });
    if let Some(token) = token
        && let Ok(value) = format!("Bearer {token}").parse()
    {
        request.metadata_mut().insert("authorization", value);
    }
    client.add_member(request).await.map(|_| ())
}

/// Registers the models of a repository that the cluster does not know yet. Runs once a leader
/// is known; models an operator already registered (or changed) are left alone.
async fn register_models(
    consensus: Arc<dyn Consensus>,
    models: Vec<crate::state::ModelSpec>,
    stop: watch::Receiver<bool>,
) {
    let mut pending = models;
    let mut backoff = Duration::from_millis(100);
    while !pending.is_empty() && !*stop.borrow() {
        let state = match consensus.linearizable_state().await {
            Ok(state) => state,
            Err(e) => {
                tracing::debug!("waiting for a leader to register the repository: {e}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        pending.retain(|m| state.model(&m.name).is_none());
        let Some(spec) = pending.first().cloned() else {
            return;
        };
        let name = spec.name.clone();
        match consensus.write(Command::UpsertModel(spec)).await {
            Ok(_) => {
                info!(model = %name, "registered from the model repository");
                pending.remove(0);
            }
            Err(ConsensusError::Rejected(e)) => {
                warn!(model = %name, "cannot register from the model repository: {e}");
                pending.remove(0);
            }
            Err(e) => {
                tracing::debug!("registering {name}: {e}; retrying");
                tokio::time::sleep(backoff).await;
            }
        }
    }
}
