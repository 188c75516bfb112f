//! How a control-plane node runs Raft: its identity, peers, storage and timings.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use nereid_tls::ClusterDial;

/// Default heartbeat interval, for loopback and LAN.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_millis(50);

/// Default election timeout range (min, max), for loopback and LAN: a dead leader is replaced
/// 450–600 ms after its last heartbeat (see [`RaftConfig::election_timeout_min`]), while a
/// follower tolerates 450 ms of silence (9 heartbeats) before it campaigns.
pub const DEFAULT_ELECTION_TIMEOUT: (Duration, Duration) =
    (Duration::from_millis(150), Duration::from_millis(300));

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
    /// How often the leader sends heartbeats; also openraft's timeout of one heartbeat RPC.
    pub heartbeat_interval: Duration,
    /// A follower that hears nothing from the leader campaigns after a random time in
    /// `election_timeout_min..election_timeout_max`, counted from the end of the leader's
    /// lease, which openraft sets to `election_timeout_max`: a dead leader is replaced about
    /// `election_timeout_max + (min..max)` after its last heartbeat. Until that lease ends a
    /// follower refuses to vote, so one slow node cannot depose a leader the others hear.
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
    /// A configuration with the default timings ([`DEFAULT_HEARTBEAT`],
    /// [`DEFAULT_ELECTION_TIMEOUT`]), a snapshot every 1000 entries.
    pub fn new(node_id: u64, address: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        RaftConfig {
            node_id,
            address: address.into(),
            data_dir: data_dir.into(),
            peers: BTreeMap::new(),
            join: false,
            heartbeat_interval: DEFAULT_HEARTBEAT,
            election_timeout_min: DEFAULT_ELECTION_TIMEOUT.0,
            election_timeout_max: DEFAULT_ELECTION_TIMEOUT.1,
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
