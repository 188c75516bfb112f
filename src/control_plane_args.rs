//! Flags of `nereid control-plane`, turned into the control-plane crate's `NodeConfig`.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use nereid_control_plane::AuthToken;
use nereid_control_plane::NodeConfig;
use nereid_control_plane::{EtcdConfig, EtcdTls, Store};
use nereid_tls::{ClientTlsFiles, PemFile};

use crate::common_args::LogFormat;

#[derive(Args, Debug)]
pub struct ControlPlaneArgs {
    /// This node's id in the Raft cluster (a positive integer, never reused).
    #[arg(long, env = "NEREID_NODE_ID", default_value_t = 1)]
    pub node_id: u64,
    /// gRPC address for the Raft transport, the management API and the cluster API.
    #[arg(long, env = "NEREID_LISTEN", default_value = "0.0.0.0:7000")]
    pub listen: SocketAddr,
    /// Address peers, workers and `nereid ctl` use to reach this node (default: --listen).
    #[arg(long, env = "NEREID_ADVERTISE_ADDRESS")]
    pub advertise_address: Option<String>,
    /// REST mirror of the management API (/api/v1/...).
    #[arg(long, env = "NEREID_HTTP_LISTEN", default_value = "0.0.0.0:7080")]
    pub http_listen: SocketAddr,
    /// Prometheus metrics port (/metrics: nereid_raft_*, nereid_cluster_*,
    /// nereid_placement_*), served without authentication like a worker's. Only with
    /// --allow-metrics.
    #[arg(long, env = "NEREID_METRICS_PORT", default_value_t = 7002)]
    pub metrics_port: u16,
    /// Address the metrics service binds.
    #[arg(long, env = "NEREID_METRICS_ADDRESS", default_value = "0.0.0.0")]
    pub metrics_address: IpAddr,
    /// Serve Prometheus metrics (true/false). Off by default because several control-plane
    /// nodes often share one host (make cluster, the end-to-end suite), where one fixed port
    /// would collide: give each node its own --metrics-port when turning it on.
    #[arg(
        long,
        env = "NEREID_ALLOW_METRICS",
        default_value = "false",
        value_parser = clap::builder::BoolishValueParser::new(),
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub allow_metrics: bool,
    /// Where the Raft log, vote and snapshots are kept (one redb file).
    #[arg(long, env = "NEREID_DATA_DIR", default_value = "nereid-data")]
    pub data_dir: PathBuf,
    /// Initial members as ID=HOST:PORT,... (this node included). Omit for a single node.
    #[arg(long, env = "NEREID_PEERS", value_delimiter = ',')]
    pub peers: Vec<String>,
    /// Join the cluster of the control-plane node at this gRPC address instead of bootstrapping.
    #[arg(long, env = "NEREID_JOIN", conflicts_with = "peers")]
    pub join: Option<String>,
    /// File holding the admin token required on every API call (`authorization: Bearer`).
    #[arg(long, env = "NEREID_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    /// File of named tokens with roles, one `<role> <name> <secret>` a line (roles: admin,
    /// read-only, cluster; see docs/security.md). Re-read when it changes, so tokens rotate
    /// without a restart. Needs an admin token (here or in --auth-token-file): nodes use it
    /// to call each other.
    #[arg(long, env = "NEREID_AUTH_TOKENS_FILE")]
    pub auth_tokens_file: Option<PathBuf>,
    /// Turn authentication off (local development only).
    #[arg(long, env = "NEREID_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
    /// Interval between worker heartbeats (told to workers at registration).
    #[arg(long, env = "NEREID_HEARTBEAT_INTERVAL_MS", default_value_t = 500)]
    pub heartbeat_interval_ms: u64,
    /// Silence after which the leader declares a worker down and re-places its replicas.
    #[arg(long, env = "NEREID_HEARTBEAT_TIMEOUT_MS", default_value_t = 3000)]
    pub heartbeat_timeout_ms: u64,
    /// How often the leader re-checks liveness and placement without a state change.
    #[arg(long, env = "NEREID_PLACEMENT_INTERVAL_MS", default_value_t = 250)]
    pub placement_interval_ms: u64,
    /// Seconds a model with min_replicas 0 keeps the replica that requests through a router
    /// started (scale from zero) after the last such request; then it scales back to zero.
    #[arg(long, env = "NEREID_SCALE_TO_ZERO_AFTER_SECS", default_value_t = 300)]
    pub scale_to_zero_after_secs: u64,
    /// Rebalancing: at most this many replica moves in flight at once (make-before-break: the
    /// new replica loads before the old one unloads). Moves start when a node holds at least 2
    /// replicas more than another, or memory use is more than 20 points apart. 0 turns it off.
    #[arg(long, env = "NEREID_REBALANCE_MAX_MOVES", default_value_t = 2)]
    pub rebalance_max_moves: u32,
    /// Model cache (more models than memory): when a replica finds no node with room (a request
    /// for a model scaled to zero, a scale up), evict the least recently used idle replicas of
    /// one node that were placed at least this many milliseconds ago (pinned replicas, those
    /// serving requests or holding a live sequence always stay). Raise it if models are evicted
    /// and loaded again too often; 0 turns eviction off (placement then refuses what does not
    /// fit).
    #[arg(long, env = "NEREID_EVICT_MIN_RESIDENCY_MS", default_value_t = 60_000)]
    pub evict_min_residency_ms: u64,
    /// Raft heartbeat between control-plane nodes, in milliseconds; also the timeout of one
    /// heartbeat. At most a third of the minimum --election-timeout-ms.
    #[arg(long, env = "NEREID_RAFT_HEARTBEAT_MS", default_value_t = 50)]
    pub raft_heartbeat_ms: u64,
    /// Raft election timeout range, MIN-MAX milliseconds (one number N means N-2N). A
    /// follower that hears no heartbeat campaigns a random MIN..MAX after the leader's lease
    /// (MAX) ends, so a dead leader is replaced MAX+MIN to 2*MAX after its last heartbeat. The
    /// defaults suit loopback and a LAN; across a WAN, or on machines that stall for hundreds
    /// of milliseconds, raise both flags together (for example --raft-heartbeat-ms 250
    /// --election-timeout-ms 1000-2000).
    #[arg(long, env = "NEREID_ELECTION_TIMEOUT_MS", default_value = "150-300")]
    pub election_timeout_ms: ElectionTimeoutMs,
    /// Snapshot the state and compact the log after this many entries.
    #[arg(long, env = "NEREID_SNAPSHOT_THRESHOLD", default_value_t = 1000)]
    pub snapshot_threshold: u64,
    /// Register every model of this Triton repository at start (repeatable); models already
    /// registered are left as they are.
    #[arg(
        long = "model-repository",
        env = "NEREID_MODEL_REPOSITORY",
        value_delimiter = ','
    )]
    pub model_repository: Vec<PathBuf>,
    /// Replicas per model version for models registered from --model-repository.
    #[arg(long, env = "NEREID_DEFAULT_REPLICAS", default_value_t = 1)]
    pub default_replicas: u32,
    #[arg(long, env = "NEREID_LOG_VERBOSE", default_value_t = 0)]
    pub log_verbose: u32,
    #[arg(long, env = "NEREID_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    #[command(flatten)]
    pub cluster_tls: crate::cluster_tls_args::ClusterTlsArgs,
    /// Where the state of record lives: `raft` (this node's own Raft group: --data-dir,
    /// --peers, --join) or `etcd` (an existing etcd at --etcd-endpoints, shared by any number
    /// of stateless control-plane processes; see docs/cluster.md).
    #[arg(long, env = "NEREID_STORE", value_enum, default_value = "raft")]
    pub store: StoreKind,
    /// etcd client URLs, comma-separated (`http://host:2379,...`, or all `https://` with
    /// --etcd-ca); with --store etcd.
    #[arg(long, env = "NEREID_ETCD_ENDPOINTS", value_delimiter = ',')]
    pub etcd_endpoints: Vec<String>,
    /// CA certificates (PEM) etcd's server certificate must chain to: required by, and only
    /// for, https:// --etcd-endpoints. Only these CAs are trusted; for an etcd whose
    /// certificate a public CA signed, pass the system bundle
    /// (/etc/ssl/certs/ca-certificates.crt).
    #[arg(long, env = "NEREID_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate chain (PEM) for an etcd run with --client-cert-auth; needs
    /// --etcd-key and https:// endpoints.
    #[arg(long, env = "NEREID_ETCD_CERT")]
    pub etcd_cert: Option<PathBuf>,
    /// Private key (PEM) of --etcd-cert.
    #[arg(long, env = "NEREID_ETCD_KEY")]
    pub etcd_key: Option<PathBuf>,
    /// Key prefix of this cluster in etcd; clusters sharing one etcd need distinct prefixes.
    #[arg(long, env = "NEREID_ETCD_PREFIX", default_value = "/nereid")]
    pub etcd_prefix: String,
    /// etcd user, when etcd has authentication on (needs --etcd-password-file).
    #[arg(long, env = "NEREID_ETCD_USER")]
    pub etcd_user: Option<String>,
    /// File holding the etcd user's password (one line).
    #[arg(long, env = "NEREID_ETCD_PASSWORD_FILE")]
    pub etcd_password_file: Option<PathBuf>,
    /// Seconds the leader's etcd lease lives without a keep-alive: a dead leader is replaced
    /// within this long.
    #[arg(long, env = "NEREID_ETCD_LEASE_TTL_SECS", default_value_t = 5)]
    pub etcd_lease_ttl_secs: u64,
}

/// The least minimum election timeout, in heartbeats (openraft's rule of thumb).
const HEARTBEATS_PER_ELECTION_TIMEOUT: u64 = 3;

/// `--election-timeout-ms`: `MIN-MAX`, or `MIN` for `MIN-2*MIN`; `0 < MIN < MAX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ElectionTimeoutMs {
    pub min: u64,
    pub max: u64,
}

impl std::str::FromStr for ElectionTimeoutMs {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let number = |part: &str| {
            part.trim().parse::<u64>().map_err(|_| {
                format!("'{s}' is not MIN-MAX or MIN milliseconds (for example 150-300)")
            })
        };
        let (min, max) = match s.split_once('-') {
            Some((min, max)) => (number(min)?, number(max)?),
            None => {
                let min = number(s)?;
                (min, min.saturating_mul(2))
            }
        };
        if min == 0 {
            return Err(format!("'{s}': the minimum must be positive"));
        }
        if min >= max {
            return Err(format!(
                "'{s}': the minimum must be below the maximum (the timeout is drawn at random \
                 between them, so that the followers do not all campaign at once)"
            ));
        }
        Ok(ElectionTimeoutMs { min, max })
    }
}

/// `--store`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    Raft,
    Etcd,
}

impl ControlPlaneArgs {
    pub fn into_config(self) -> Result<NodeConfig, String> {
        if self.node_id == 0 {
            return Err("--node-id must be a positive integer".into());
        }
        let mut peers = BTreeMap::new();
        for peer in &self.peers {
            let (id, addr) = peer
                .split_once('=')
                .ok_or_else(|| format!("--peers: '{peer}' is not ID=HOST:PORT"))?;
            let id: u64 = id
                .trim()
                .parse()
                .map_err(|_| format!("--peers: '{id}' in '{peer}' is not a node id"))?;
            if peers.insert(id, addr.trim().to_string()).is_some() {
                return Err(format!("--peers: node {id} is listed twice"));
            }
        }
        if !peers.is_empty() && !peers.contains_key(&self.node_id) {
            return Err(format!(
                "--peers must include this node (--node-id {})",
                self.node_id
            ));
        }
        let auth = self.auth()?;
        let auth_value = auth.peer_secret();
        if self.heartbeat_timeout_ms <= self.heartbeat_interval_ms {
            return Err(format!(
                "--heartbeat-timeout-ms ({}) must exceed --heartbeat-interval-ms ({})",
                self.heartbeat_timeout_ms, self.heartbeat_interval_ms
            ));
        }
        self.check_raft_timings()?;
        let metrics_listen = self
            .allow_metrics
            .then_some(SocketAddr::new(self.metrics_address, self.metrics_port));
        if let Some(m) = metrics_listen
            && m.port() != 0
        {
            for (flag, other) in [
                ("--listen", self.listen),
                ("--http-listen", self.http_listen),
            ] {
                if other.port() == m.port()
                    && (other.ip() == m.ip()
                        || other.ip().is_unspecified()
                        || m.ip().is_unspecified())
                {
                    return Err(format!(
                        "--metrics-port {} is also the port of {flag} {other}: each service needs its own port",
                        m.port()
                    ));
                }
            }
        }
        for repo in &self.model_repository {
            if !repo.is_dir() {
                return Err(format!(
                    "--model-repository '{}' is not a directory",
                    repo.display()
                ));
            }
        }
        let cluster_tls = self.cluster_tls.load()?;
        let store = self.store()?;
        Ok(NodeConfig {
            node_id: self.node_id,
            listen: self.listen,
            advertise: self.advertise_address,
            http_listen: Some(self.http_listen),
            metrics_listen,
            data_dir: self.data_dir,
            peers,
            join: self.join,
            auth,
            auth_value,
            heartbeat_interval: Duration::from_millis(self.heartbeat_interval_ms),
            heartbeat_timeout: Duration::from_millis(self.heartbeat_timeout_ms),
            placement_interval: Duration::from_millis(self.placement_interval_ms.max(10)),
            scale_to_zero_after: Duration::from_secs(self.scale_to_zero_after_secs.max(1)),
            rebalance_max_moves: self.rebalance_max_moves,
            evict_min_residency: (self.evict_min_residency_ms > 0)
                .then(|| Duration::from_millis(self.evict_min_residency_ms)),
            raft_heartbeat: Duration::from_millis(self.raft_heartbeat_ms),
            election_timeout_min: Duration::from_millis(self.election_timeout_ms.min),
            election_timeout_max: Duration::from_millis(self.election_timeout_ms.max),
            snapshot_threshold: self.snapshot_threshold.max(1),
            model_repositories: self.model_repository,
            default_replicas: self.default_replicas,
            cluster_tls,
            store,
        })
    }

    /// `--raft-heartbeat-ms` against `--election-timeout-ms`: a follower must not campaign
    /// because one or two heartbeats were late.
    fn check_raft_timings(&self) -> Result<(), String> {
        let heartbeat = self.raft_heartbeat_ms;
        let ElectionTimeoutMs { min, max } = self.election_timeout_ms;
        if heartbeat == 0 {
            return Err("--raft-heartbeat-ms must be positive (milliseconds)".into());
        }
        if min < HEARTBEATS_PER_ELECTION_TIMEOUT * heartbeat {
            return Err(format!(
                "--election-timeout-ms {min}-{max}: the minimum must be at least \
                 {HEARTBEATS_PER_ELECTION_TIMEOUT} x --raft-heartbeat-ms ({heartbeat}), so that a \
                 late heartbeat or two does not start an election; raise it or lower \
                 --raft-heartbeat-ms"
            ));
        }
        Ok(())
    }

    /// `--store` and the etcd flags, checked together.
    fn store(&self) -> Result<Store, String> {
        if self.store == StoreKind::Raft {
            for (flag, given) in [
                ("--etcd-endpoints", !self.etcd_endpoints.is_empty()),
                ("--etcd-user", self.etcd_user.is_some()),
                ("--etcd-password-file", self.etcd_password_file.is_some()),
                ("--etcd-ca", self.etcd_ca.is_some()),
                ("--etcd-cert", self.etcd_cert.is_some()),
                ("--etcd-key", self.etcd_key.is_some()),
            ] {
                if given {
                    return Err(format!("{flag} needs --store etcd"));
                }
            }
            return Ok(Store::Raft);
        }
        if !self.peers.is_empty() || self.join.is_some() {
            return Err(
                "--peers and --join are for --store raft; with --store etcd, every \
                 control-plane process pointed at the same --etcd-endpoints and --etcd-prefix \
                 is a member"
                    .into(),
            );
        }
        if self.etcd_endpoints.is_empty() {
            return Err("--store etcd needs --etcd-endpoints (http://HOST:PORT,...)".into());
        }
        let mut endpoints = Vec::new();
        let mut schemes = Vec::new();
        for endpoint in &self.etcd_endpoints {
            let endpoint = endpoint.trim();
            let (scheme, rest) = match endpoint.split_once("://") {
                Some((scheme @ ("http" | "https"), rest)) => (scheme, rest),
                _ => {
                    return Err(format!(
                        "--etcd-endpoints: '{endpoint}' is not an http://HOST:PORT or \
                         https://HOST:PORT URL"
                    ));
                }
            };
            if rest.is_empty() || rest.contains('/') || !rest.contains(':') {
                return Err(format!(
                    "--etcd-endpoints: '{endpoint}' is not a {scheme}://HOST:PORT URL"
                ));
            }
            if !schemes.contains(&scheme) {
                schemes.push(scheme);
            }
            endpoints.push(endpoint.to_string());
        }
        if schemes.len() > 1 {
            return Err(
                "--etcd-endpoints mixes http:// and https:// URLs: every endpoint of one etcd \
                 cluster is reached the same way"
                    .into(),
            );
        }
        let tls = self.etcd_tls(schemes == ["https"])?;
        let prefix = self.etcd_prefix.trim_end_matches('/');
        if !prefix.starts_with('/') || prefix.chars().any(char::is_whitespace) {
            return Err(format!(
                "--etcd-prefix '{}' must start with '/', name more than the root, and hold no \
                 spaces (for example /nereid)",
                self.etcd_prefix
            ));
        }
        let user = match (&self.etcd_user, &self.etcd_password_file) {
            (None, None) => None,
            (Some(_), None) => return Err("--etcd-user needs --etcd-password-file".into()),
            (None, Some(_)) => return Err("--etcd-password-file needs --etcd-user".into()),
            (Some(user), Some(path)) => {
                let password = std::fs::read_to_string(path)
                    .map_err(|e| format!("--etcd-password-file {}: {e}", path.display()))?;
                let password = password.trim_end_matches(['\n', '\r']).to_string();
                if password.is_empty() {
                    return Err(format!("--etcd-password-file {} is empty", path.display()));
                }
                Some((user.clone(), password))
            }
        };
        if self.etcd_lease_ttl_secs == 0 {
            return Err("--etcd-lease-ttl-secs must be at least 1".into());
        }
        Ok(Store::Etcd(EtcdConfig {
            endpoints,
            prefix: prefix.to_string(),
            user,
            lease_ttl: Duration::from_secs(self.etcd_lease_ttl_secs),
            tls,
        }))
    }

    /// --etcd-ca, --etcd-cert and --etcd-key, each file read and checked now (a certificate
    /// and key that do not match are refused here, not at the first handshake).
    fn etcd_tls(&self, https: bool) -> Result<Option<EtcdTls>, String> {
        let identity = match (&self.etcd_cert, &self.etcd_key) {
            (None, None) => None,
            (Some(_), None) => return Err("--etcd-cert needs --etcd-key".into()),
            (None, Some(_)) => return Err("--etcd-key needs --etcd-cert".into()),
            (Some(cert), Some(key)) => Some((
                PemFile::new("--etcd-cert", cert),
                PemFile::new("--etcd-key", key),
            )),
        };
        let Some(ca) = &self.etcd_ca else {
            if https {
                return Err(
                    "https:// --etcd-endpoints need --etcd-ca: the CA bundle that signed etcd's \
                     server certificate (/etc/ssl/certs/ca-certificates.crt for a publicly \
                     signed one)"
                        .into(),
                );
            }
            if identity.is_some() {
                return Err("--etcd-cert and --etcd-key need https:// --etcd-endpoints".into());
            }
            return Ok(None);
        };
        if !https {
            return Err(
                "--etcd-ca needs https:// --etcd-endpoints (the endpoints given are http://)"
                    .into(),
            );
        }
        let files = ClientTlsFiles {
            ca: PemFile::new("--etcd-ca", ca),
            identity,
        };
        nereid_tls::client_config(&files, &[]).map_err(|e| e.to_string())?;
        let read = |flag: &str, path: &PathBuf| {
            std::fs::read(path).map_err(|e| format!("{flag} '{}': {e}", path.display()))
        };
        let identity = match (&self.etcd_cert, &self.etcd_key) {
            (Some(cert), Some(key)) => Some((read("--etcd-cert", cert)?, read("--etcd-key", key)?)),
            _ => None,
        };
        Ok(Some(EtcdTls {
            ca_pem: read("--etcd-ca", ca)?,
            identity,
        }))
    }
}

impl ControlPlaneArgs {
    /// The tokens from --auth-token-file (or NEREID_AUTH_TOKEN) and --auth-tokens-file, or
    /// none with --insecure-no-auth.
    fn auth(&self) -> Result<AuthToken, String> {
        if self.insecure_no_auth {
            for (flag, given) in [
                ("--auth-token-file", self.auth_token_file.is_some()),
                ("--auth-tokens-file", self.auth_tokens_file.is_some()),
            ] {
                if given {
                    return Err(format!(
                        "{flag} and --insecure-no-auth contradict each other"
                    ));
                }
            }
            return Ok(AuthToken::disabled());
        }
        let single = match &self.auth_token_file {
            Some(path) => {
                Some(AuthToken::from_file(path).map_err(|e| format!("--auth-token-file: {e}"))?)
            }
            None => match std::env::var("NEREID_AUTH_TOKEN") {
                Ok(value) if !value.trim().is_empty() => Some(
                    AuthToken::from_value(value.trim())
                        .map_err(|e| format!("NEREID_AUTH_TOKEN: {e}"))?,
                ),
                _ => None,
            },
        };
        let Some(path) = &self.auth_tokens_file else {
            return single.ok_or_else(|| {
                "the management API needs an admin token: pass --auth-token-file (or set \
                 NEREID_AUTH_TOKEN) or --auth-tokens-file, or --insecure-no-auth for local \
                 development"
                    .to_string()
            });
        };
        let admin = single.as_ref().and_then(AuthToken::peer_secret);
        let auth = AuthToken::from_tokens_file(path, admin.as_deref())
            .map_err(|e| format!("--auth-tokens-file: {e}"))?;
        if auth.peer_secret().is_none() {
            return Err(format!(
                "--auth-tokens-file {}: no token has role admin; add one (control-plane nodes \
                 call each other with it) or pass --auth-token-file too",
                path.display()
            ));
        }
        Ok(auth)
    }
}

#[cfg(test)]
#[path = "control_plane_args_tests.rs"]
mod tests;
