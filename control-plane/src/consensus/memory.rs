//! A single-process [`Consensus`] with no log and no disk: commands apply at once to an
//! in-memory state. It exists for unit tests of the layers above consensus (API, cluster
//! service, leader loop); it is never what a control-plane node runs.

use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::{Consensus, ConsensusError, Leadership, Member, RaftStatus};
use crate::state::{Applied, ClusterState, Command};

/// Always the leader of term 1, unless a test says otherwise with [`MemoryConsensus::set_leader`].
pub struct MemoryConsensus {
    node_id: u64,
    state: Mutex<Arc<ClusterState>>,
    state_tx: watch::Sender<Arc<ClusterState>>,
    leadership_tx: watch::Sender<Leadership>,
    applied: Mutex<u64>,
}

impl MemoryConsensus {
    pub fn new(node_id: u64) -> Self {
        let state = Arc::new(ClusterState::new());
        let (state_tx, _) = watch::channel(state.clone());
        let (leadership_tx, _) = watch::channel(Leadership {
            leader_id: Some(node_id),
            term: 1,
            is_self: true,
        });
        MemoryConsensus {
            node_id,
            state: Mutex::new(state),
            state_tx,
            leadership_tx,
            applied: Mutex::new(0),
        }
    }

    /// Makes `leader` (or nobody) the leader of a new term.
    pub fn set_leader(&self, leader: Option<u64>) {
        let term = self.leadership_tx.borrow().term + 1;
        self.leadership_tx.send_replace(Leadership {
            leader_id: leader,
            term,
            is_self: leader == Some(self.node_id),
        });
    }
}

#[async_trait]
impl Consensus for MemoryConsensus {
    async fn write(&self, cmd: Command) -> Result<Applied, ConsensusError> {
        let leadership = *self.leadership_tx.borrow();
        if !leadership.is_self {
            return Err(ConsensusError::NotLeader {
                leader_id: leadership.leader_id,
                leader_address: None,
            });
        }
        let mut guard = self.state.lock();
        *self.applied.lock() += 1;
        let result = Arc::make_mut(&mut guard).apply(cmd);
        self.state_tx.send_replace(guard.clone());
        Ok(result?)
    }

    fn local_state(&self) -> Arc<ClusterState> {
        self.state.lock().clone()
    }

    fn subscribe(&self) -> watch::Receiver<Arc<ClusterState>> {
        self.state_tx.subscribe()
    }

    async fn linearizable_state(&self) -> Result<Arc<ClusterState>, ConsensusError> {
        Ok(self.local_state())
    }

    fn status(&self) -> RaftStatus {
        let leadership = *self.leadership_tx.borrow();
        let applied = *self.applied.lock();
        RaftStatus {
            node_id: self.node_id,
            leader_id: leadership.leader_id,
            leader_address: leadership.leader_id.map(|id| format!("memory://{id}")),
            term: leadership.term,
            commit_index: applied,
            applied_index: applied,
            last_log_index: applied,
            members: vec![Member {
                id: self.node_id,
                address: format!("memory://{}", self.node_id),
                voter: true,
            }],
        }
    }

    fn leadership(&self) -> watch::Receiver<Leadership> {
        self.leadership_tx.subscribe()
    }

    async fn add_member(&self, id: u64, _address: String) -> Result<(), ConsensusError> {
        Err(ConsensusError::InvalidMembership(format!(
            "the in-memory consensus has one member; cannot add node {id}"
        )))
    }

    async fn remove_member(&self, id: u64) -> Result<(), ConsensusError> {
        Err(ConsensusError::InvalidMembership(format!(
            "the in-memory consensus has one member; cannot remove node {id}"
        )))
    }
}
