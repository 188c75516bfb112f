//! How a control-plane node runs Raft: its identity, peers, storage and timings.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use nereid_tls::ClusterDial;

/// Configuration of one Raft node. Build it with [`RaftConfig::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct RaftConfig {
    /// This node's id; unique in the cluster, never reused.
    pub node_id: u64,
    /// The gRPC address peers reach this node at (`host:port`).
    pub address: String,
    /// Where `raft.redb` lives.
    pub data_dir: PathBuf,
    /// Initial cluster, id → gRPC address, including this node. Empty: a single-node cluster
    /// (unless `join`). Only read when the node has never been initialized.
    pub peers: BTreeMap<u64, String>,
    /// Start empty and wait to be added by the leader (`add_member`).
    pub join: bool,
    pub heartbeat_interval: Duration,
    pub election_timeout_min: Duration,
    pub election_timeout_max: Duration,
    /// Build a snapshot (and compact the log) after this many applied entries.
    pub snapshot_threshold: u64,
    /// Log entries kept behind the latest snapshot, for slow followers.
    pub logs_to_keep_after_snapshot: u64,
    /// Bearer token outgoing Raft calls carry (`authorization: Bearer <token>`).
    pub auth_token: Option<String>,
    /// How long `write` and `linearizable_state` keep retrying while no leader is reachable.
    pub leader_wait: Duration,
    /// How peers are dialed: plaintext, or TLS with the cluster identity (`--cluster-tls-*`).
    pub dial: ClusterDial,
}

impl RaftConfig {
    /// A configuration with the default timings: heartbeat 250 ms, election timeout
    /// 1000–2000 ms, a snapshot every 1000 entries.
    pub fn new(node_id: u64, address: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        RaftConfig {
            node_id,
            address: address.into(),
            data_dir: data_dir.into(),
            peers: BTreeMap::new(),
            join: false,
            heartbeat_interval: Duration::from_millis(250),
            election_timeout_min: Duration::from_millis(1000),
            election_timeout_max: Duration::from_millis(2000),
            snapshot_threshold: 1000,
            logs_to_keep_after_snapshot: 100,
            auth_token: None,
            leader_wait: Duration::from_secs(5),
            dial: ClusterDial::plain(),
        }
    }

    pub(crate) fn openraft_config(&self) -> openraft::Config {
        openraft::Config {
            cluster_name: "nereid-control-plane".to_string(),
            heartbeat_interval: millis(self.heartbeat_interval),
            election_timeout_min: millis(self.election_timeout_min),
            election_timeout_max: millis(self.election_timeout_max),
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_threshold),
            max_in_snapshot_log_to_keep: self.logs_to_keep_after_snapshot,
            install_snapshot_timeout: millis(self.election_timeout_max).max(10_000),
            ..Default::default()
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
