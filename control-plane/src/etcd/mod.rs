//! The control plane's state kept in an existing etcd instead of Nereid's own Raft group:
//! `nereid control-plane --store etcd`. Every control-plane process is stateless; any number of
//! them share one etcd prefix.
//!
//! ```text
//!  write(cmd) ─► get <prefix>/state (quorum read, mod_revision R)
//!               ─► ClusterState::apply(cmd) (the same pure apply the Raft store runs)
//!               ─► txn: if mod_revision(<prefix>/state) == R then put   (else: re-read, retry)
//!  follow:  get + watch <prefix>/state from the read's revision ─► watch<Arc<ClusterState>>
//!  elect:   lease (TTL) + txn create-if-absent <prefix>/leader, keep-alive every TTL/3,
//!           <prefix>/members/<node-id> under the same lease
//! ```
//!
//! Key layout: the whole [`ClusterState`] is one JSON value under `<prefix>/state`, so the
//! state machine's semantics (one global revision, validation against the whole state) are
//! exactly those of the Raft store. etcd refuses requests over 1.5 MiB by default
//! (`--max-request-bytes`), which bounds the state at roughly that size (thousands of models
//! and replicas); a write that would exceed [`MAX_STATE_BYTES`] is refused as `Unavailable`
//! with the size in the message. Membership is etcd's: `add_member`/`remove_member` refuse.
//!
//! - `election`: the lease-backed leader election and the member registry.
//! - `follow`: the watch that feeds [`Consensus::subscribe`].
//! - `tls`: `https://` endpoints (`--etcd-ca`, `--etcd-cert`, `--etcd-key`) and error messages
//!   that name the TLS cause.

mod election;
mod follow;
#[cfg(test)]
pub(crate) mod test_server;
mod tls;
#[cfg(test)]
mod tls_tests;

pub use tls::EtcdTls;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, Txn, TxnOp};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::warn;

use crate::consensus::{Consensus, ConsensusError, Leadership, Member, RaftStatus};
use crate::state::{Applied, ClusterState, Command};

/// The largest serialized state a write may put: etcd's default request limit (1.5 MiB) less
/// room for the transaction around it.
pub const MAX_STATE_BYTES: usize = 1536 * 1024 - 4096;
/// Conflicting writers re-read and retry at most this many times before giving up.
const MAX_WRITE_ATTEMPTS: u32 = 64;
/// Bound on one etcd request (watch streams are not bounded, keep-alives are).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How `--store etcd` reaches etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    /// Client URLs (`http://host:2379`, or all `https://` with [`EtcdConfig::tls`]), at least
    /// one.
    pub endpoints: Vec<String>,
    /// Every key this cluster uses starts with it (`/nereid`); clusters sharing an etcd need
    /// distinct prefixes.
    pub prefix: String,
    /// etcd user name and password, when etcd has authentication on.
    pub user: Option<(String, String)>,
    /// Time to live of the lease behind leadership and membership: a dead leader is replaced
    /// after at most this long. Whole seconds, at least 1.
    pub lease_ttl: Duration,
    /// TLS for `https://` endpoints: the CA to verify etcd with and an optional client
    /// certificate.
    pub tls: Option<EtcdTls>,
}

/// The keys under the prefix.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    state: String,
    leader: String,
    members: String,
}

impl Keys {
    fn new(prefix: &str) -> Keys {
        let prefix = prefix.trim_end_matches('/');
        Keys {
            state: format!("{prefix}/state"),
            leader: format!("{prefix}/leader"),
            members: format!("{prefix}/members/"),
        }
    }
}

/// The value of `<prefix>/leader` and of each `<prefix>/members/<id>`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct Record {
    id: u64,
    address: String,
}

/// What the store's tasks share.
struct Shared {
    node_id: u64,
    address: String,
    client: Client,
    keys: Keys,
    /// The endpoints as the operator wrote them, for error messages.
    endpoints: String,
    /// The endpoints one by one and the TLS set-up, for [`tls::explain`].
    endpoint_list: Vec<String>,
    tls: Option<EtcdTls>,
    lease_ttl: Duration,
    state_tx: watch::Sender<Arc<ClusterState>>,
    leadership_tx: watch::Sender<Leadership>,
    leader_address: Mutex<Option<String>>,
    members: Mutex<Vec<Member>>,
}

impl Shared {
    fn unavailable(&self, what: &str, e: impl std::fmt::Display) -> ConsensusError {
        ConsensusError::Unavailable(format!("etcd at {} ({what}): {e}", self.endpoints))
    }

    /// `message` with the TLS cause a direct handshake finds, when it names none.
    async fn explain(&self, message: String) -> String {
        tls::explain(self.tls.as_ref(), &self.endpoint_list, message).await
    }

    /// Publishes `state` if it is newer than what subscribers have.
    fn publish(&self, state: Arc<ClusterState>) {
        self.state_tx.send_if_modified(|current| {
            if state.revision() > current.revision() {
                *current = state;
                true
            } else {
                false
            }
        });
    }

    /// Reads the state with a quorum read: its value and the key's mod_revision (0: absent).
    async fn read(&self) -> Result<(Arc<ClusterState>, i64), ConsensusError> {
        let mut client = self.client.clone();
        let response = bounded(client.get(self.keys.state.as_str(), None))
            .await
            .map_err(|e| self.unavailable("reading the state", e))?;
        let Some(kv) = response.kvs().first() else {
            return Ok((Arc::new(ClusterState::new()), 0));
        };
        let state = Arc::new(decode_state(&self.keys.state, kv.value())?);
        self.publish(state.clone());
        Ok((state, kv.mod_revision()))
    }
}

fn decode_state(key: &str, bytes: &[u8]) -> Result<ClusterState, ConsensusError> {
    serde_json::from_slice(bytes).map_err(|e| {
        ConsensusError::Unavailable(format!(
            "etcd key {key} does not hold a Nereid cluster state: {e}"
        ))
    })
}

/// Runs one etcd request with [`REQUEST_TIMEOUT`].
async fn bounded<T>(fut: impl Future<Output = Result<T, etcd_client::Error>>) -> Result<T, String> {
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(tls::describe(&e)),
        Err(_) => Err(format!("no answer within {}s", REQUEST_TIMEOUT.as_secs())),
    }
}

/// A control-plane process's view of the etcd-backed state; implements [`Consensus`].
pub struct EtcdStore {
    shared: Arc<Shared>,
    stop_tx: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl EtcdStore {
    /// Connects, reads the state once (so a wrong endpoint fails here, naming it) and starts
    /// following the state and campaigning for leadership. `address` is this process's gRPC
    /// address, which the leader record and the member registry carry.
    pub async fn start(
        node_id: u64,
        address: String,
        config: EtcdConfig,
    ) -> Result<Arc<EtcdStore>, ConsensusError> {
        let endpoints = config.endpoints.join(",");
        if config.endpoints.is_empty() {
            return Err(ConsensusError::Unavailable(
                "--etcd-endpoints: no endpoint given".into(),
            ));
        }
        let mut options = ConnectOptions::new()
            .with_connect_timeout(REQUEST_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_keep_alive_while_idle(true);
        if let Some((user, password)) = &config.user {
            options = options.with_user(user.clone(), password.clone());
        }
        if let Some(tls) = &config.tls {
            options = tls.apply(options);
        }
        let client = bounded(Client::connect(&config.endpoints, Some(options)))
            .await
            .map_err(|e| ConsensusError::Unavailable(format!("etcd at {endpoints}: {e}")))?;
        let (state_tx, _) = watch::channel(Arc::new(ClusterState::new()));
        let (leadership_tx, _) = watch::channel(Leadership::default());
        let shared = Arc::new(Shared {
            node_id,
            address,
            client,
            keys: Keys::new(&config.prefix),
            endpoints,
            endpoint_list: config.endpoints.clone(),
            tls: config.tls.clone(),
            lease_ttl: Duration::from_secs(config.lease_ttl.as_secs().max(1)),
            state_tx,
            leadership_tx,
            leader_address: Mutex::new(None),
            members: Mutex::new(Vec::new()),
        });
        if let Err(e) = shared.read().await {
            return Err(match e {
                ConsensusError::Unavailable(message) => {
                    ConsensusError::Unavailable(shared.explain(message).await)
                }
                other => other,
            });
        }
        let (stop_tx, stop_rx) = watch::channel(false);
        let tasks = vec![
            tokio::spawn(follow::run(shared.clone(), stop_rx.clone())),
            tokio::spawn(election::run(shared.clone(), stop_rx)),
        ];
        Ok(Arc::new(EtcdStore {
            shared,
            stop_tx,
            tasks: Mutex::new(tasks),
        }))
    }

    /// Stops following and campaigning; gives up leadership at once (the lease is revoked, so
    /// another process takes over without waiting for the TTL).
    pub async fn shutdown(&self) {
        let _ = self.stop_tx.send(true);
        let tasks = std::mem::take(&mut *self.tasks.lock());
        for task in tasks {
            if let Err(e) = task.await {
                warn!("etcd store task: {e}");
            }
        }
    }
}

#[async_trait]
impl Consensus for EtcdStore {
    async fn write(&self, cmd: Command) -> Result<Applied, ConsensusError> {
        let shared = &self.shared;
        for attempt in 0..MAX_WRITE_ATTEMPTS {
            let (state, mod_revision) = shared.read().await?;
            let mut next = (*state).clone();
            let applied = next.apply(cmd.clone())?;
            if !applied.changed {
                return Ok(applied);
            }
            let bytes = serde_json::to_vec(&next)
                .map_err(|e| ConsensusError::Unavailable(format!("encoding the state: {e}")))?;
            if bytes.len() > MAX_STATE_BYTES {
                return Err(ConsensusError::Unavailable(format!(
                    "the cluster state would be {} bytes, over the {MAX_STATE_BYTES} bytes one \
                     etcd request may carry (--store etcd keeps it in one key); use --store raft \
                     for a cluster this large",
                    bytes.len()
                )));
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    shared.keys.state.as_str(),
                    CompareOp::Equal,
                    mod_revision,
                )])
                .and_then([TxnOp::put(shared.keys.state.as_str(), bytes, None)]);
            let mut client = shared.client.clone();
            let response = bounded(client.txn(txn))
                .await
                .map_err(|e| shared.unavailable("writing the state", e))?;
            if response.succeeded() {
                shared.publish(Arc::new(next));
                return Ok(applied);
            }
            // Another process wrote first: re-read and apply again on its state. A short,
            // per-node staggered pause keeps two busy writers from colliding in lockstep.
            let pause = (shared.node_id % 7 + 1) * u64::from(attempt.min(10) + 1);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        Err(ConsensusError::Unavailable(format!(
            "etcd at {}: gave up after {MAX_WRITE_ATTEMPTS} writes lost to concurrent writers",
            shared.endpoints
        )))
    }

    fn local_state(&self) -> Arc<ClusterState> {
        self.shared.state_tx.borrow().clone()
    }

    fn subscribe(&self) -> watch::Receiver<Arc<ClusterState>> {
        self.shared.state_tx.subscribe()
    }

    async fn linearizable_state(&self) -> Result<Arc<ClusterState>, ConsensusError> {
        // etcd's default range read is linearizable (a quorum read through its Raft leader).
        self.shared.read().await.map(|(state, _)| state)
    }

    fn status(&self) -> RaftStatus {
        let leadership = *self.shared.leadership_tx.borrow();
        let revision = self.local_state().revision();
        RaftStatus {
            node_id: self.shared.node_id,
            leader_id: leadership.leader_id,
            leader_address: self.shared.leader_address.lock().clone(),
            term: leadership.term,
            commit_index: revision,
            applied_index: revision,
            last_log_index: revision,
            members: self.shared.members.lock().clone(),
        }
    }

    fn leadership(&self) -> watch::Receiver<Leadership> {
        self.shared.leadership_tx.subscribe()
    }

    async fn add_member(&self, id: u64, _address: String) -> Result<(), ConsensusError> {
        Err(ConsensusError::InvalidMembership(format!(
            "cannot add node {id}: with --store etcd, membership is etcd's; start another \
             control-plane process with the same --etcd-endpoints and --etcd-prefix instead"
        )))
    }

    async fn remove_member(&self, id: u64) -> Result<(), ConsensusError> {
        Err(ConsensusError::InvalidMembership(format!(
            "cannot remove node {id}: with --store etcd, membership is etcd's; stop that \
             control-plane process and its registration expires with its lease"
        )))
    }
}
