//! Why a Raft node could not start or stop. Operations after start report
//! [`crate::consensus::ConsensusError`] instead.

/// A failure starting or stopping a [`super::RaftNode`].
#[derive(Debug, thiserror::Error)]
pub enum RaftError {
    /// The configuration is inconsistent (timings, peers, token).
    #[error("invalid raft configuration: {0}")]
    Config(String),
    /// `raft.redb` could not be opened or read.
    #[error("raft storage: {0}")]
    Storage(#[from] std::io::Error),
    /// openraft refused to start or stopped with an error.
    #[error("raft node: {0}")]
    Node(String),
}
