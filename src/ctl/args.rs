//! The flags of `nereid ctl`: global connection and output settings, then one subcommand per
//! management operation. Values that have a syntax of their own (sizes, version policies,
//! labels) are parsed here through the pure parsers of [`super::request`], so clap reports a
//! bad value as a usage error (exit 2) before any connection is made.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use nereid_proto::pb::cluster::VersionPolicy;

use nereid_control_plane::parse_bytes;

use super::request::{parse_label, parse_version_policy};

#[derive(Args, Debug)]
pub struct CtlArgs {
    /// Control-plane gRPC address(es), `host:port`; a comma-separated list is tried in order
    /// when a node cannot be reached or answers UNAVAILABLE (not leader).
    #[arg(
        long,
        env = "NEREID_CONTROL_PLANE",
        default_value = "127.0.0.1:7000",
        value_delimiter = ',',
        global = true
    )]
    pub control_plane: Vec<String>,
    /// File holding the admin token (sent as `authorization: Bearer <token>`); wins over
    /// `--token`.
    #[arg(long, global = true)]
    pub token_file: Option<PathBuf>,
    /// The admin token itself (prefer the environment variable over the flag).
    #[arg(long, env = "NEREID_AUTH_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// `table` for people, `json` for the response's proto-JSON (as the REST mirror returns it).
    #[arg(long, value_enum, default_value = "table", global = true)]
    pub output: OutputFormat,
    /// Read consistency: `local` answers from the contacted node's applied state;
    /// `linearizable` confirms with the leader first.
    #[arg(long, value_enum, default_value = "local", global = true)]
    pub consistency: ConsistencyArg,
    /// PEM CA certificate of a control plane that serves TLS (`--cluster-tls-*`): connect over
    /// TLS and trust only this CA.
    #[arg(long, env = "NEREID_CTL_TLS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate presented to a control plane that requires one (mutual TLS),
    /// signed by its cluster CA; needs --tls-key and --tls-ca.
    #[arg(long, env = "NEREID_CTL_TLS_CERT", global = true)]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "NEREID_CTL_TLS_KEY", global = true)]
    pub tls_key: Option<PathBuf>,
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ConsistencyArg {
    Local,
    Linearizable,
}

#[derive(Subcommand, Debug)]
pub enum CtlCommand {
    /// Register, scale, inspect and delete models.
    #[command(subcommand)]
    Models(ModelsCommand),
    /// Inspect, drain and undrain worker nodes.
    #[command(subcommand)]
    Nodes(NodesCommand),
    /// Every replica in the cluster and where it runs.
    Placements,
    /// Control-plane membership and Raft status.
    #[command(subcommand)]
    Cluster(ClusterCommand),
}

#[derive(Subcommand, Debug)]
pub enum ModelsCommand {
    /// Create or replace a model.
    Deploy(DeployArgs),
    /// All models with their ready replicas.
    List,
    /// One model and its replicas.
    Get { name: String },
    /// Change a model's replica count.
    Scale(ScaleArgs),
    /// Split the traffic of requests that name no version between versions (canary, A/B).
    Traffic(TrafficArgs),
    /// Scale a model's replicas with its load between --min and --max (or --off).
    Autoscale(super::autoscale::AutoscaleArgs),
    /// Remove a model; its replicas unload.
    Delete { name: String },
    /// Why each replica is where it is, what is pending, and recent decisions.
    Placement { name: String },
}

#[derive(Args, Debug)]
pub struct ReplicaArgs {
    /// Exact replica count (sets both min and max).
    #[arg(long, conflicts_with_all = ["min_replicas", "max_replicas"])]
    pub replicas: Option<u32>,
    /// Lowest replica count.
    #[arg(long, requires = "max_replicas")]
    pub min_replicas: Option<u32>,
    /// Highest replica count.
    #[arg(long, requires = "min_replicas")]
    pub max_replicas: Option<u32>,
}

/// `--wait` and `--timeout` of the commands that change a model's replicas.
#[derive(Args, Debug, Clone, Copy)]
pub struct WaitArgs {
    /// Return only once every served version has its `min_replicas` ready (exit 0), or with
    /// the failed replicas' reasons (exit 1).
    #[arg(long)]
    pub wait: bool,
    /// Seconds `--wait` waits before giving up (exit 1, saying what is ready).
    #[arg(long, default_value_t = 300, requires = "wait")]
    pub timeout: u64,
}

#[derive(Args, Debug)]
pub struct DeployArgs {
    pub name: String,
    /// URI of a Triton-layout model directory: file:///models/resnet50 (a path every worker
    /// sees) or s3://bucket/prefix/resnet50, gs://..., as://... (workers mirror it).
    #[arg(long)]
    pub source: String,
    #[command(flatten)]
    pub replicas: ReplicaArgs,
    /// Versions to serve: `latest:N`, `all`, or a list such as `1,3`.
    #[arg(long, value_parser = parse_version_policy)]
    pub versions: Option<VersionPolicy>,
    /// Memory per replica for placement until measured: bytes or 512Mi, 2Gi, 1G...
    #[arg(long, value_parser = parse_bytes)]
    pub memory: Option<u64>,
    /// CPU per replica in millicores.
    #[arg(long)]
    pub cpu_millis: Option<u64>,
    /// GPUs per replica, all on one node; placement assigns the GPU indices.
    #[arg(long)]
    pub gpus: Option<u32>,
    /// Memory per replica on each of its GPUs until measured: bytes or 512Mi, 2Gi, 1G...
    #[arg(long, value_parser = parse_bytes)]
    pub gpu_memory: Option<u64>,
    /// JSON object merged over config.pbtxt, inline or `@file`.
    #[arg(long)]
    pub config_override: Option<String>,
    /// Label `key=value` (repeat).
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    #[command(flatten)]
    pub wait: WaitArgs,
}

#[derive(Args, Debug)]
pub struct ScaleArgs {
    pub name: String,
    #[command(flatten)]
    pub replicas: ReplicaArgs,
    #[command(flatten)]
    pub wait: WaitArgs,
}

#[derive(Args, Debug)]
pub struct TrafficArgs {
    pub name: String,
    /// `VERSION=WEIGHT` pairs, e.g. `1=90 2=10`; weights are relative.
    #[arg(value_parser = parse_weight, required_unless_present = "clear")]
    pub weights: Vec<(i64, u32)>,
    /// Remove the split: the highest served version takes every unversioned request.
    #[arg(long, conflicts_with = "weights")]
    pub clear: bool,
}

fn parse_weight(s: &str) -> Result<(i64, u32), String> {
    let (version, weight) = s
        .split_once('=')
        .ok_or_else(|| format!("'{s}' is not VERSION=WEIGHT"))?;
    let version = version
        .trim()
        .parse::<i64>()
        .ok()
        .filter(|v| *v >= 1)
        .ok_or_else(|| format!("'{version}' in '{s}' is not a version number (1 or more)"))?;
    let weight = weight
        .trim()
        .parse::<u32>()
        .map_err(|_| format!("'{weight}' in '{s}' is not a weight (a non-negative integer)"))?;
    Ok((version, weight))
}

#[derive(Subcommand, Debug)]
pub enum NodesCommand {
    /// All worker nodes with capacity, state and replica count.
    List,
    /// One node, its utilization and its replicas.
    Get { id: String },
    /// Move the node's replicas away (make-before-break) and place nothing new on it.
    Drain { id: String },
    /// Let placement use the node again.
    Undrain { id: String },
}

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// The answering node, the leader, term, commit/applied index and members.
    Status,
    /// Add a control-plane node (learner first, voter once caught up).
    AddMember {
        #[arg(long)]
        id: u64,
        /// gRPC address of the new node.
        #[arg(long)]
        address: String,
    },
    /// Remove a control-plane node.
    RemoveMember { id: u64 },
}
