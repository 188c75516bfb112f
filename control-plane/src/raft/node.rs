//! A running Raft node and the [`Consensus`] implementation the control plane uses.
//!
//! ```text
//!  start: open raft.redb ─► restore snapshot ─► openraft::Raft::new ─► bootstrap (first start
//!         only: the lowest peer id initializes the voters; a joining node waits to be added)
//!         └► leadership task: raft metrics ─► watch<Leadership>
//!  leader: the one the metrics name, but none while this node leads without a quorum's ack
//!          for the leader lease, the maximum election timeout (cut off from the other voters:
//!          see `current_leader`)
//!  write: leader ─► client_write │ follower ─► ForwardWrite to the leader │ none ─► retry ≤ deadline
//!  linearizable_state: leader ─► confirm with a quorum │ follower ─► ReadIndex, wait applied
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use openraft::async_runtime::WatchReceiver;
use openraft::error::{ClientWriteError, RaftError as OpenRaftError};
use openraft::{BasicNode, ChangeMembers, Instant as _, RaftMetrics, ReadPolicy};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::{Code, Status};

use super::config::RaftConfig;
use super::error::RaftError;
use super::log_store::LogStore;
use super::network::{NetworkFactory, Peers, Rpc};
use super::service::RaftService;
use super::state_machine::StateMachineStore;
use super::store::{Closed, Store};
use super::types::{ApplyResult, LogCommand, Raft, TypeConfig};
use crate::consensus::{Consensus, ConsensusError, Leadership, Member, RaftStatus};
use crate::state::{Applied, ClusterState, Command};

/// A control-plane node's Raft participant. Serve its [`RaftService`] on the node's gRPC
/// address, then use it through [`Consensus`].
pub struct RaftNode {
    id: u64,
    raft: Raft,
    peers: Arc<Peers>,
    state_rx: watch::Receiver<Arc<ClusterState>>,
    leadership_rx: watch::Receiver<Leadership>,
    leadership_task: Mutex<Option<JoinHandle<()>>>,
    leader_wait: Duration,
    /// How long this node still calls itself leader without a quorum's acknowledgement.
    lease: Duration,
    /// Resolves when openraft has dropped the storage and `raft.redb` is closed.
    closed: Mutex<Option<Closed>>,
}

/// Backoff between retries while the leader is unknown or moving.
const RETRY_BACKOFF: Duration = Duration::from_millis(50);

/// How long `shutdown` waits for openraft's tasks to drop the storage.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

impl RaftNode {
    /// Opens the node's storage, starts Raft and, on a first start, bootstraps the cluster.
    /// Returns the node and the service to mount on its gRPC server.
    pub async fn start(config: RaftConfig) -> Result<(Arc<RaftNode>, RaftService), RaftError> {
        if !config.peers.is_empty() && !config.join && !config.peers.contains_key(&config.node_id) {
            return Err(RaftError::Config(format!(
                "peers must include this node ({})",
                config.node_id
            )));
        }
        let openraft_config = config
            .openraft_config()
            .validate()
            .map_err(|e| RaftError::Config(e.to_string()))?;
        let peers = Arc::new(
            // Raft RPCs are bounded by openraft's TTL (about a heartbeat); this bounds dialing a
            // peer, which a loaded machine or a TLS handshake may take longer for.
            Peers::new(config.auth_token.as_deref(), config.election_timeout_max)
                .map_err(RaftError::Config)?
                .with_dial(config.dial.clone()),
        );

        let dir = config.data_dir.clone();
        let (store, closed) = tokio::task::spawn_blocking(move || Store::open(&dir))
            .await
            .map_err(|e| RaftError::Node(e.to_string()))??;
        let log_store = LogStore::new(store.clone());
        let (state_machine, state_rx) = StateMachineStore::open(store).await?;

        let raft = Raft::new(
            config.node_id,
            Arc::new(openraft_config),
            NetworkFactory::new(peers.clone()),
            log_store,
            state_machine,
        )
        .await
        .map_err(|e| RaftError::Node(e.to_string()))?;

        bootstrap(&raft, &config).await?;

        let (leadership_tx, leadership_rx) = watch::channel(Leadership::default());
        // openraft's own leader lease: the followers refuse votes for this long after the
        // last heartbeat they got, and only then start their election timers, so no other
        // leader can exist before it ends. A shorter lease would make a leader that misses a
        // few acknowledgements on a loaded machine step aside for nothing.
        let lease = config.election_timeout_max;
        let task = tokio::spawn(follow_leadership(
            config.node_id,
            raft.clone(),
            leadership_tx,
            lease,
        ));

        let node = Arc::new(RaftNode {
            id: config.node_id,
            raft: raft.clone(),
            peers,
            state_rx,
            leadership_rx,
            leadership_task: Mutex::new(Some(task)),
            leader_wait: config.leader_wait,
            lease,
            closed: Mutex::new(Some(closed)),
        });
        Ok((node, RaftService::new(raft)))
    }

    /// Stops Raft (no more votes, appends or applies) and waits, up to `CLOSE_WAIT`, until its
    /// tasks have let go of the storage, so that `raft.redb` can be opened again.
    pub async fn shutdown(&self) -> Result<(), RaftError> {
        if let Some(task) = self.leadership_task.lock().take() {
            task.abort();
        }
        self.raft
            .shutdown()
            .await
            .map_err(|e| RaftError::Node(e.to_string()))?;
        let closed = self.closed.lock().take();
        if let Some(closed) = closed {
            // The sender is never used: the receiver wakes when the database is dropped.
            if tokio::time::timeout(CLOSE_WAIT, closed).await.is_err() {
                return Err(RaftError::Node(
                    "raft stopped but its storage is still open".to_string(),
                ));
            }
        }
        Ok(())
    }

    /// The openraft handle, for tests that wait on its metrics.
    #[cfg(test)]
    pub(crate) fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The known leader and its address, from the metrics.
    fn leader(&self) -> Option<(u64, Option<String>)> {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        let leader = current_leader(self.id, &m, self.lease)?;
        let addr = m
            .membership_config
            .membership()
            .get_node(&leader)
            .map(|n| n.addr.clone());
        Some((leader, addr))
    }

    fn not_leader(&self) -> ConsensusError {
        let leader = self.leader();
        ConsensusError::NotLeader {
            leader_id: leader.as_ref().map(|l| l.0),
            leader_address: leader.and_then(|l| l.1),
        }
    }

    /// Waits a little before the next retry, or says the deadline passed.
    async fn backoff(&self, deadline: Instant, why: &str) -> Result<(), ConsensusError> {
        let now = Instant::now();
        if now >= deadline {
            return Err(ConsensusError::NoLeader(why.to_string()));
        }
        tokio::time::sleep(RETRY_BACKOFF.min(deadline - now)).await;
        Ok(())
    }

    /// Forwards to the leader at `addr` and decodes its JSON answer. `Ok(Err(why))`: the
    /// leader refused for now (not leader any more, unreachable); retry after a backoff.
    async fn ask_leader<T: serde::de::DeserializeOwned>(
        &self,
        leader: u64,
        addr: &str,
        rpc: Rpc,
        data: Vec<u8>,
        deadline: Instant,
    ) -> Result<Result<T, String>, ConsensusError> {
        match self.forward(addr, rpc, data, deadline).await {
            Ok(bytes) => serde_json::from_slice(&bytes).map(Ok).map_err(|e| {
                ConsensusError::Unavailable(format!("bad answer from the leader: {e}"))
            }),
            Err(status) if retryable(&status) => Ok(Err(format!(
                "leader {leader} at {addr}: {}",
                status.message()
            ))),
            Err(status) => Err(ConsensusError::Unavailable(format!(
                "leader {leader} at {addr}: {}",
                status.message()
            ))),
        }
    }

    /// One forwarded call to the leader at `addr`, bounded by the deadline.
    async fn forward(
        &self,
        addr: &str,
        rpc: Rpc,
        data: Vec<u8>,
        deadline: Instant,
    ) -> Result<Vec<u8>, Status> {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = self
            .peers
            .call_timeout
            .min(left)
            .max(Duration::from_millis(100));
        self.peers.call(addr, rpc, data, timeout).await
    }
}

/// On a node that never initialized: the lowest peer id (or a lone node) initializes the
/// cluster; everyone else waits to be contacted. A restarted node never re-initializes.
async fn bootstrap(raft: &Raft, config: &RaftConfig) -> Result<(), RaftError> {
    if config.join {
        return Ok(());
    }
    let initialized = raft
        .is_initialized()
        .await
        .map_err(|e| RaftError::Node(e.to_string()))?;
    if initialized {
        return Ok(());
    }
    let members: BTreeMap<u64, BasicNode> = if config.peers.is_empty() {
        BTreeMap::from([(
            config.node_id,
            BasicNode {
                addr: config.address.clone(),
            },
        )])
    } else {
        if config.peers.keys().next() != Some(&config.node_id) {
            return Ok(());
        }
        config
            .peers
            .iter()
            .map(|(id, addr)| (*id, BasicNode { addr: addr.clone() }))
            .collect()
    };
    match raft.initialize(members).await {
        Ok(()) => Ok(()),
        Err(OpenRaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => Ok(()),
        Err(e) => Err(RaftError::Node(format!(
            "cannot initialize the cluster: {e}"
        ))),
    }
}

/// The leader the metrics name, except that a leader no quorum has acknowledged for `lease`
/// names none. Such a leader is cut off from the other voters: it can commit nothing, and they
/// elect another within an election timeout, so it must stop acting as leader (accepting
/// worker heartbeats the real leader never sees, holding writes it cannot commit) and send
/// callers elsewhere. A single voter is its own quorum.
fn current_leader(id: u64, m: &RaftMetrics<TypeConfig>, lease: Duration) -> Option<u64> {
    let leader = m.current_leader?;
    let isolated = leader == id
        && m.membership_config
            .membership()
            .voter_ids()
            .nth(1)
            .is_some()
        && m.last_quorum_acked
            .as_ref()
            .is_some_and(|acked| acked.elapsed() > lease);
    (!isolated).then_some(leader)
}

/// Publishes leadership changes from the metrics until Raft stops; also every quarter `lease`,
/// as a leader's lease runs out without any metric changing.
async fn follow_leadership(id: u64, raft: Raft, tx: watch::Sender<Leadership>, lease: Duration) {
    let mut metrics = raft.metrics();
    loop {
        let now = {
            let m = metrics.borrow_watched();
            let leader_id = current_leader(id, &m, lease);
            Leadership {
                leader_id,
                term: m.current_term,
                is_self: leader_id == Some(id),
            }
        };
        tx.send_if_modified(|l| {
            let changed = *l != now;
            *l = now;
            changed
        });
        tokio::select! {
            changed = metrics.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = tokio::time::sleep(lease / 4) => {}
        }
    }
}

fn retryable(status: &Status) -> bool {
    matches!(status.code(), Code::FailedPrecondition | Code::Unavailable)
}

fn membership_error(
    node: &RaftNode,
    e: OpenRaftError<TypeConfig, ClientWriteError<TypeConfig>>,
) -> ConsensusError {
    if e.forward_to_leader().is_some() {
        return node.not_leader();
    }
    match e {
        OpenRaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            ConsensusError::InvalidMembership(e.to_string())
        }
        other => ConsensusError::Unavailable(other.to_string()),
    }
}

#[async_trait]
impl Consensus for RaftNode {
    async fn write(&self, cmd: Command) -> Result<Applied, ConsensusError> {
        let deadline = Instant::now() + self.leader_wait;
        let data = serde_json::to_vec(&cmd)
            .map_err(|e| ConsensusError::Unavailable(format!("cannot encode command: {e}")))?;
        loop {
            let why = match self.leader() {
                Some((leader, _)) if leader == self.id => {
                    match self.raft.client_write(LogCommand(cmd.clone())).await {
                        Ok(response) => return Ok(response.data?),
                        Err(e) if e.forward_to_leader().is_some() => {
                            "leadership moved during the write".to_string()
                        }
                        Err(e) => return Err(ConsensusError::Unavailable(e.to_string())),
                    }
                }
                Some((leader, Some(addr))) => {
                    let asked = self
                        .ask_leader::<ApplyResult>(
                            leader,
                            &addr,
                            Rpc::ForwardWrite,
                            data.clone(),
                            deadline,
                        )
                        .await?;
                    match asked {
                        Ok(result) => return Ok(result?),
                        Err(why) => why,
                    }
                }
                Some((leader, None)) => format!("leader {leader} has no known address"),
                None => "no leader is known".to_string(),
            };
            self.backoff(deadline, &why).await?;
        }
    }

    fn local_state(&self) -> Arc<ClusterState> {
        self.state_rx.borrow().clone()
    }

    fn subscribe(&self) -> watch::Receiver<Arc<ClusterState>> {
        self.state_rx.clone()
    }

    async fn linearizable_state(&self) -> Result<Arc<ClusterState>, ConsensusError> {
        let deadline = Instant::now() + self.leader_wait;
        loop {
            let why = match self.leader() {
                Some((leader, _)) if leader == self.id => {
                    match self.raft.ensure_linearizable(ReadPolicy::ReadIndex).await {
                        Ok(_) => return Ok(self.local_state()),
                        Err(OpenRaftError::Fatal(e)) => {
                            return Err(ConsensusError::Unavailable(e.to_string()));
                        }
                        Err(e) => e.to_string(),
                    }
                }
                Some((leader, Some(addr))) => {
                    let asked = self
                        .ask_leader::<u64>(leader, &addr, Rpc::ReadIndex, Vec::new(), deadline)
                        .await?;
                    match asked {
                        Ok(index) => {
                            let left = deadline.saturating_duration_since(Instant::now());
                            self.raft
                                .wait(Some(left))
                                .applied_index_at_least(Some(index), "read index")
                                .await
                                .map_err(|e| {
                                    ConsensusError::Unavailable(format!(
                                        "not caught up with the leader's read index {index}: {e}"
                                    ))
                                })?;
                            return Ok(self.local_state());
                        }
                        Err(why) => why,
                    }
                }
                Some((leader, None)) => format!("leader {leader} has no known address"),
                None => "no leader is known".to_string(),
            };
            self.backoff(deadline, &why).await?;
        }
    }

    fn status(&self) -> RaftStatus {
        let metrics = self.raft.metrics();
        let m = metrics.borrow_watched();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, node)| Member {
                id: *id,
                address: node.addr.clone(),
                voter: voters.contains(id),
            })
            .collect();
        let leader_id = current_leader(self.id, &m, self.lease);
        RaftStatus {
            node_id: self.id,
            leader_id,
            leader_address: leader_id
                .and_then(|l| membership.get_node(&l))
                .map(|n| n.addr.clone()),
            term: m.current_term,
            commit_index: m.local_committed.as_ref().map_or(0, |id| id.index),
            applied_index: m.last_applied.as_ref().map_or(0, |id| id.index),
            last_log_index: m.last_log_index.unwrap_or(0),
            members,
        }
    }

    fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership_rx.clone()
    }

    async fn add_member(&self, id: u64, address: String) -> Result<(), ConsensusError> {
        if !self.raft.is_leader() {
            return Err(self.not_leader());
        }
        self.raft
            .add_learner(id, BasicNode { addr: address }, true)
            .await
            .map_err(|e| membership_error(self, e))?;
        self.raft
            .change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
            .await
            .map_err(|e| membership_error(self, e))?;
        Ok(())
    }

    async fn remove_member(&self, id: u64) -> Result<(), ConsensusError> {
        if !self.raft.is_leader() {
            return Err(self.not_leader());
        }
        let (voters, known) = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            let membership = m.membership_config.membership();
            let voters: BTreeSet<u64> = membership.voter_ids().collect();
            let known = membership.get_node(&id).is_some();
            (voters, known)
        };
        if !known {
            return Err(ConsensusError::InvalidMembership(format!(
                "node {id} is not a member"
            )));
        }
        if voters.contains(&id) {
            if voters.len() == 1 {
                return Err(ConsensusError::InvalidMembership(format!(
                    "node {id} is the last voter"
                )));
            }
            self.raft
                .change_membership(ChangeMembers::RemoveVoters(BTreeSet::from([id])), false)
                .await
                .map_err(|e| membership_error(self, e))?;
        }
        let still_known = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            m.membership_config.membership().get_node(&id).is_some()
        };
        if still_known {
            self.raft
                .change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                .await
                .map_err(|e| membership_error(self, e))?;
        }
        Ok(())
    }
}
