//! Command-line flags. Names follow `tritonserver` where a Triton user would look for them;
//! every flag can also be set through a `NEREID_*` environment variable.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use nereid_data_plane::agent::AgentConfig;
use nereid_data_plane::manager::{ControlMode, ManagerConfig};
use nereid_data_plane::metrics::MetricsConfig;
use nereid_data_plane::serve::ServeConfig;
use nereid_data_plane::server::DataPlaneConfig;

use crate::telemetry_args::TelemetryArgs;

#[derive(Parser, Debug)]
#[command(name = "nereid", version, about = "Triton-compatible inference server")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Serve a Triton model repository over KServe v2 HTTP and gRPC (single node).
    Serve(Box<ServeArgs>),
    /// Serve the models a Nereid control plane assigns to this node: the data plane of
    /// `serve` (explicit mode, repository API refused) plus an agent that follows the
    /// control plane.
    Worker(Box<WorkerArgs>),
    /// Run a control-plane node: the Raft-replicated registry of models, workers and
    /// replicas, placement, and the management API (gRPC and REST).
    ControlPlane(Box<crate::control_plane_args::ControlPlaneArgs>),
    /// Check config.pbtxt files or model directories; print the normalized config as JSON or
    /// the errors with file:line:col. Exit 1 on any error.
    CheckConfig(CheckConfigArgs),
    /// Operate a Nereid cluster through the control plane's management API (models, nodes,
    /// placements, control-plane members).
    Ctl(Box<crate::ctl::CtlArgs>),
    /// Route KServe v2 HTTP and gRPC requests to the workers of a Nereid cluster: the same
    /// API as `serve`, each request forwarded to a ready replica the control plane reports.
    Router(Box<crate::router_args::RouterArgs>),
}

/// Parses Triton-style booleans: true/false/1/0 (also yes/no, on/off).
fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(format!("expected true/false/1/0, got '{s}'")),
    }
}

#[derive(Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum ControlModeArg {
    None,
    Poll,
    Explicit,
}

#[derive(Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (Triton's `default` and `ISO8601` are accepted as aliases).
    #[value(alias = "default", alias = "ISO8601", alias = "iso8601")]
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Model repository directory (repeat for several). Triton layout: <repo>/<model>/config.pbtxt
    /// and numbered version folders.
    #[arg(
        long = "model-repository",
        alias = "model-store",
        env = "NEREID_MODEL_REPOSITORY",
        value_delimiter = ',',
        required = true
    )]
    pub model_repository: Vec<PathBuf>,
    #[command(flatten)]
    pub listen: ListenArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
    /// none: load every model at start, no load/unload API. poll: also follow changes on disk
    /// every --repository-poll-secs. explicit: load only --load-model, then the API decides.
    #[arg(
        long,
        env = "NEREID_MODEL_CONTROL_MODE",
        value_enum,
        default_value = "none"
    )]
    pub model_control_mode: ControlModeArg,
    /// Model to load at start in explicit mode (repeat; '*' loads all and must be alone).
    #[arg(long = "load-model", env = "NEREID_LOAD_MODEL", value_delimiter = ',')]
    pub load_model: Vec<String>,
    /// Seconds between repository scans in poll mode.
    #[arg(long, env = "NEREID_REPOSITORY_POLL_SECS", default_value_t = 15)]
    pub repository_poll_secs: u64,
    /// Ready only when every model loaded successfully (false: ready once started).
    #[arg(long, env = "NEREID_STRICT_READINESS", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub strict_readiness: bool,
    /// Exit at startup if any model fails to load (Triton's default is true; Nereid keeps
    /// serving the models that loaded unless this is set).
    #[arg(long, env = "NEREID_EXIT_ON_ERROR", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub exit_on_error: bool,
    /// Seconds in-flight requests get to finish after SIGTERM / Ctrl-C.
    #[arg(long, env = "NEREID_EXIT_TIMEOUT_SECS", default_value_t = 30)]
    pub exit_timeout_secs: u64,
    /// Do not fill model configs from model files (inputs, outputs, max_batch_size).
    #[arg(long, env = "NEREID_DISABLE_AUTO_COMPLETE_CONFIG")]
    pub disable_auto_complete_config: bool,
    /// Deprecated Triton spelling: true disables auto-complete.
    #[arg(long, env = "NEREID_STRICT_MODEL_CONFIG", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub strict_model_config: Option<bool>,
    /// Largest HTTP request body in bytes, also after decompression.
    #[arg(long, env = "NEREID_HTTP_MAX_INPUT_SIZE", default_value_t = 64 * 1024 * 1024)]
    pub http_max_input_size: usize,
    /// Requests that may wait per model version before new ones are refused (503).
    #[arg(long, env = "NEREID_MODEL_QUEUE_SIZE", default_value_t = 1024)]
    pub model_queue_size: usize,
    /// Verbose logging level (0 = info; 1 or more = debug).
    #[arg(long, env = "NEREID_LOG_VERBOSE", default_value_t = 0)]
    pub log_verbose: u32,
    /// Log line format.
    #[arg(long, env = "NEREID_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Server name reported in server metadata.
    #[arg(long, env = "NEREID_ID", default_value = "nereid")]
    pub id: String,
    /// ONNX Runtime shared library to load (default: ORT_DYLIB_PATH, then a library next to
    /// the executable, then the one found at build time).
    #[arg(long, env = "NEREID_ONNXRUNTIME_LIBRARY")]
    pub onnxruntime_library: Option<PathBuf>,
}

/// Where the data plane listens: shared by `serve` and `worker`.
#[derive(Args, Debug, Clone)]
pub struct ListenArgs {
    /// HTTP (KServe v2 REST) port.
    #[arg(long, env = "NEREID_HTTP_PORT", default_value_t = 8000)]
    pub http_port: u16,
    /// Address the HTTP service binds.
    #[arg(long, env = "NEREID_HTTP_ADDRESS", default_value = "0.0.0.0")]
    pub http_address: IpAddr,
    /// gRPC (inference.GRPCInferenceService) port.
    #[arg(long, env = "NEREID_GRPC_PORT", default_value_t = 8001)]
    pub grpc_port: u16,
    /// Address the gRPC service binds.
    #[arg(long, env = "NEREID_GRPC_ADDRESS", default_value = "0.0.0.0")]
    pub grpc_address: IpAddr,
    /// Prometheus metrics port (/metrics).
    #[arg(long, env = "NEREID_METRICS_PORT", default_value_t = 8002)]
    pub metrics_port: u16,
    /// Address the metrics service binds.
    #[arg(long, env = "NEREID_METRICS_ADDRESS", default_value = "0.0.0.0")]
    pub metrics_address: IpAddr,
    /// Serve HTTP.
    #[arg(long, env = "NEREID_ALLOW_HTTP", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub allow_http: bool,
    /// Serve gRPC.
    #[arg(long, env = "NEREID_ALLOW_GRPC", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub allow_grpc: bool,
    /// Serve Prometheus metrics.
    #[arg(long, env = "NEREID_ALLOW_METRICS", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub allow_metrics: bool,
}

/// What the metrics port reports: shared by `serve` and `worker`.
#[derive(Args, Debug, Clone)]
pub struct MetricsArgs {
    /// Metrics setting <key>=<value> (repeatable), Triton's vocabulary:
    /// counter_latencies=true|false (the *_duration_us counters, default true),
    /// summary_latencies=true|false (the *_summary_us summaries, default false),
    /// summary_quantiles=<q>:<error>,... (default 0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,0.999:0.001),
    /// histogram_latencies=true|false (nv_inference_first_response_histogram_ms, default false).
    #[arg(long, env = "NEREID_METRICS_CONFIG", value_delimiter = ';')]
    pub metrics_config: Vec<String>,
    /// Report host CPU and memory metrics (nv_cpu_*).
    #[arg(long, env = "NEREID_ALLOW_CPU_METRICS", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub allow_cpu_metrics: bool,
    /// Report GPU metrics (nv_gpu_*, nv_energy_consumption) through NVML; absent without GPUs.
    #[arg(long, env = "NEREID_ALLOW_GPU_METRICS", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub allow_gpu_metrics: bool,
    /// Milliseconds between samples of the CPU and GPU metrics (utilization is averaged over
    /// this interval).
    #[arg(long, env = "NEREID_METRICS_INTERVAL_MS", default_value_t = 2000)]
    pub metrics_interval_ms: u64,
}

impl MetricsArgs {
    /// The metrics config, or what is wrong with a setting.
    pub fn into_config(self) -> Result<MetricsConfig, String> {
        if self.metrics_interval_ms == 0 {
            return Err("--metrics-interval-ms must be at least 1".into());
        }
        let config = MetricsConfig {
            cpu: self.allow_cpu_metrics,
            gpu: self.allow_gpu_metrics,
            interval: Duration::from_millis(self.metrics_interval_ms),
            ..MetricsConfig::default()
        };
        config
            .with_settings(&self.metrics_config)
            .map_err(|e| e.to_string())
    }
}

impl ServeArgs {
    /// Checks the flags and turns them into the server's config, before any port is bound.
    pub fn into_config(self) -> Result<ServeConfig, String> {
        for repo in &self.model_repository {
            if !repo.is_dir() {
                return Err(format!(
                    "--model-repository '{}' is not a directory",
                    repo.display()
                ));
            }
        }
        let control_mode = match self.model_control_mode {
            ControlModeArg::None => ControlMode::None,
            ControlModeArg::Poll => ControlMode::Poll,
            ControlModeArg::Explicit => ControlMode::Explicit,
        };
        if self.load_model.iter().any(|m| m == "*") && self.load_model.len() > 1 {
            return Err(
                "--load-model '*' loads every model and must be the only --load-model".into(),
            );
        }
        if !self.load_model.is_empty() && control_mode != ControlMode::Explicit {
            return Err("--load-model requires --model-control-mode explicit".into());
        }
        if control_mode == ControlMode::Poll && self.repository_poll_secs == 0 {
            return Err("--repository-poll-secs must be at least 1".into());
        }
        if self.model_queue_size == 0 {
            return Err("--model-queue-size must be at least 1".into());
        }
        let enabled = [
            (self.listen.allow_http, "--http-port", self.listen.http_port),
            (self.listen.allow_grpc, "--grpc-port", self.listen.grpc_port),
            (
                self.listen.allow_metrics,
                "--metrics-port",
                self.listen.metrics_port,
            ),
        ];
        for (i, a) in enabled.iter().enumerate() {
            for b in &enabled[i + 1..] {
                if a.0 && b.0 && a.2 == b.2 && a.2 != 0 {
                    return Err(format!(
                        "{} and {} are both {}: each service needs its own port",
                        a.1, b.1, a.2
                    ));
                }
            }
        }
        let metrics = self.metrics.into_config()?;
        let auto_complete =
            !self.disable_auto_complete_config && self.strict_model_config != Some(true);
        let addr = |allow: bool, ip: IpAddr, port: u16| allow.then_some(SocketAddr::new(ip, port));
        Ok(ServeConfig {
            manager: ManagerConfig {
                repositories: self.model_repository,
                control_mode,
                startup_models: self.load_model,
                auto_complete,
                queue_capacity: self.model_queue_size,
                cluster_managed: false,
            },
            data_plane: DataPlaneConfig {
                server_name: self.id,
                strict_readiness: self.strict_readiness,
            },
            http_addr: addr(
                self.listen.allow_http,
                self.listen.http_address,
                self.listen.http_port,
            ),
            grpc_addr: addr(
                self.listen.allow_grpc,
                self.listen.grpc_address,
                self.listen.grpc_port,
            ),
            metrics_addr: addr(
                self.listen.allow_metrics,
                self.listen.metrics_address,
                self.listen.metrics_port,
            ),
            metrics,
            http_max_input_size: self.http_max_input_size,
            poll_interval: Duration::from_secs(self.repository_poll_secs),
            exit_timeout: Duration::from_secs(self.exit_timeout_secs),
            exit_on_error: self.exit_on_error,
            onnxruntime_library: crate::ort_library::resolve(self.onnxruntime_library),
            telemetry: self.telemetry.to_config("nereid")?,
        })
    }
}

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// Control-plane gRPC addresses (host:port), comma-separated; the worker fails over
    /// between them.
    #[arg(
        long,
        env = "NEREID_CONTROL_PLANE",
        value_delimiter = ',',
        required = true
    )]
    pub control_plane: Vec<String>,
    /// This node's id in the cluster (default: <hostname>-<grpc port>).
    #[arg(long, env = "NEREID_NODE_ID")]
    pub node_id: Option<String>,
    /// Host name or IP other machines reach this node's data plane at.
    #[arg(long, env = "NEREID_ADVERTISE_HOST", default_value = "127.0.0.1")]
    pub advertise_host: String,
    /// Milliseconds between heartbeats.
    #[arg(long, env = "NEREID_HEARTBEAT_INTERVAL_MS", default_value_t = 500)]
    pub heartbeat_interval_ms: u64,
    /// Private directory of the worker; its `models/` holds a link per assigned model
    /// (default: <tmp>/nereid-worker-<node id>).
    #[arg(long, env = "NEREID_WORK_DIR")]
    pub work_dir: Option<PathBuf>,
    /// Memory this node offers, in bytes (default: the host's total memory).
    #[arg(long, env = "NEREID_MEMORY_CAPACITY")]
    pub memory_capacity: Option<u64>,
    /// File holding the bearer token sent to the control plane (else NEREID_AUTH_TOKEN).
    #[arg(long, env = "NEREID_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
    #[command(flatten)]
    pub listen: ListenArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
    /// Ready only when every assigned model loaded successfully (false: ready once started).
    #[arg(long, env = "NEREID_STRICT_READINESS", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub strict_readiness: bool,
    /// Seconds in-flight requests get to finish after SIGTERM / Ctrl-C.
    #[arg(long, env = "NEREID_EXIT_TIMEOUT_SECS", default_value_t = 30)]
    pub exit_timeout_secs: u64,
    /// Do not fill model configs from model files (inputs, outputs, max_batch_size).
    #[arg(long, env = "NEREID_DISABLE_AUTO_COMPLETE_CONFIG")]
    pub disable_auto_complete_config: bool,
    /// Largest HTTP request body in bytes, also after decompression.
    #[arg(long, env = "NEREID_HTTP_MAX_INPUT_SIZE", default_value_t = 64 * 1024 * 1024)]
    pub http_max_input_size: usize,
    /// Requests that may wait per model version before new ones are refused (503).
    #[arg(long, env = "NEREID_MODEL_QUEUE_SIZE", default_value_t = 1024)]
    pub model_queue_size: usize,
    /// Verbose logging level (0 = info; 1 or more = debug).
    #[arg(long, env = "NEREID_LOG_VERBOSE", default_value_t = 0)]
    pub log_verbose: u32,
    /// Log line format.
    #[arg(long, env = "NEREID_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Server name reported in server metadata.
    #[arg(long, env = "NEREID_ID", default_value = "nereid")]
    pub id: String,
    /// ONNX Runtime shared library to load (default: ORT_DYLIB_PATH, then a library next to
    /// the executable, then the one found at build time).
    #[arg(long, env = "NEREID_ONNXRUNTIME_LIBRARY")]
    pub onnxruntime_library: Option<PathBuf>,
}

/// A worker's validated settings: the data plane's, the agent's, and the advertised host.
pub struct WorkerConfig {
    pub serve: ServeConfig,
    pub agent: AgentConfig,
    pub advertise_host: String,
}

impl WorkerArgs {
    /// Checks the flags, prepares the work directory and turns them into the worker's config.
    /// `env_token` is NEREID_AUTH_TOKEN, used when no token file is given.
    pub fn into_config(self, env_token: Option<String>) -> Result<WorkerConfig, String> {
        if self.heartbeat_interval_ms == 0 {
            return Err("--heartbeat-interval-ms must be at least 1".into());
        }
        let addrs: Vec<String> = self
            .control_plane
            .iter()
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect();
        if addrs.is_empty() {
            return Err("--control-plane needs at least one address".into());
        }
        let node_id = self.node_id.unwrap_or_else(|| {
            format!(
                "{}-{}",
                nereid_data_plane::agent::host::hostname(),
                self.listen.grpc_port
            )
        });
        if node_id.trim().is_empty() {
            return Err("--node-id must not be empty".into());
        }
        let token =
            match &self.auth_token_file {
                Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                    format!("cannot read --auth-token-file '{}': {e}", path.display())
                })?),
                None => env_token,
            }
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty());
        let work_dir = self.work_dir.unwrap_or_else(|| {
            let safe: String = node_id
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            std::env::temp_dir().join(format!("nereid-worker-{safe}"))
        });
        let repository = work_dir.join("models");
        std::fs::create_dir_all(&repository).map_err(|e| {
            format!(
                "cannot create the work directory '{}': {e}",
                repository.display()
            )
        })?;
        let serve = ServeArgs {
            model_repository: vec![repository.clone()],
            listen: self.listen.clone(),
            metrics: self.metrics.clone(),
            telemetry: TelemetryArgs::default(),
            model_control_mode: ControlModeArg::Explicit,
            load_model: Vec::new(),
            repository_poll_secs: 15,
            strict_readiness: self.strict_readiness,
            exit_on_error: false,
            exit_timeout_secs: self.exit_timeout_secs,
            disable_auto_complete_config: self.disable_auto_complete_config,
            strict_model_config: None,
            http_max_input_size: self.http_max_input_size,
            model_queue_size: self.model_queue_size,
            log_verbose: self.log_verbose,
            log_format: self.log_format,
            id: self.id,
            onnxruntime_library: self.onnxruntime_library,
        };
        let mut serve = serve.into_config()?;
        serve.manager.cluster_managed = true;
        serve.telemetry = self.telemetry.to_config("nereid-worker")?;
        Ok(WorkerConfig {
            serve,
            agent: AgentConfig {
                control_plane: addrs,
                node_id,
                // Filled from the advertised host and the bound ports.
                data_http: String::new(),
                data_grpc: String::new(),
                heartbeat_interval: Duration::from_millis(self.heartbeat_interval_ms),
                repository,
                memory_capacity: self.memory_capacity,
                auth_token: token,
            },
            advertise_host: self.advertise_host,
        })
    }
}

#[derive(Args, Debug)]
pub struct CheckConfigArgs {
    /// config.pbtxt files or model directories.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Fill inputs/outputs from model files where a directory has them (needs ONNX Runtime).
    #[arg(long)]
    pub auto_complete: bool,
    /// ONNX Runtime shared library (for --auto-complete).
    #[arg(long, env = "NEREID_ONNXRUNTIME_LIBRARY")]
    pub onnxruntime_library: Option<PathBuf>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<ServeConfig, String> {
        let mut argv = vec!["nereid", "serve", "--model-repository", "."];
        argv.extend_from_slice(args);
        let Cli {
            command: Command::Serve(a),
        } = Cli::try_parse_from(argv).map_err(|e| e.to_string())?
        else {
            unreachable!()
        };
        a.into_config()
    }

    #[test]
    fn triton_style_flags_parse() {
        let c = parse(&[
            "--strict-readiness",
            "false",
            "--model-control-mode",
            "explicit",
            "--load-model",
            "a",
            "--load-model",
            "b",
        ])
        .unwrap();
        assert!(!c.data_plane.strict_readiness);
        assert_eq!(c.manager.startup_models, vec!["a", "b"]);
        assert_eq!(c.http_addr.unwrap().port(), 8000);
        let c = parse(&["--strict-model-config=true"]).unwrap();
        assert!(!c.manager.auto_complete);
    }

    /// A directory removed when dropped.
    struct Work(PathBuf);

    impl Work {
        fn path(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for Work {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn parse_worker(args: &[&str], env_token: Option<&str>) -> Result<WorkerConfig, String> {
        let mut argv = vec!["nereid", "worker"];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Worker(a) => a.into_config(env_token.map(String::from)),
            _ => unreachable!(),
        }
    }

    #[test]
    fn worker_flags_parse() {
        let dir = std::env::temp_dir().join(format!("nereid-worker-flags-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let work = Work(dir);
        let token = work.path().join("token");
        std::fs::write(&token, "abc\n").unwrap();
        let w = parse_worker(
            &[
                "--control-plane",
                "cp1:7000, cp2:7000",
                "--node-id",
                "n1",
                "--work-dir",
                work.path().to_str().unwrap(),
                "--grpc-port",
                "9001",
                "--heartbeat-interval-ms",
                "250",
                "--memory-capacity",
                "1000",
                "--auth-token-file",
                token.to_str().unwrap(),
            ],
            Some("ignored"),
        )
        .unwrap();
        assert_eq!(w.agent.control_plane, vec!["cp1:7000", "cp2:7000"]);
        assert_eq!(w.agent.node_id, "n1");
        assert_eq!(w.agent.auth_token.as_deref(), Some("abc"));
        assert_eq!(w.agent.memory_capacity, Some(1000));
        assert_eq!(w.agent.heartbeat_interval, Duration::from_millis(250));
        assert_eq!(w.agent.repository, work.path().join("models"));
        assert!(w.agent.repository.is_dir());
        assert_eq!(w.advertise_host, "127.0.0.1");
        assert!(w.serve.manager.cluster_managed);
        assert_eq!(w.serve.manager.control_mode, ControlMode::Explicit);
        assert!(w.serve.manager.startup_models.is_empty());
        assert_eq!(w.serve.grpc_addr.unwrap().port(), 9001);

        let w = parse_worker(
            &[
                "--control-plane",
                "cp:1",
                "--work-dir",
                work.path().to_str().unwrap(),
            ],
            Some("from-env"),
        )
        .unwrap();
        assert_eq!(w.agent.auth_token.as_deref(), Some("from-env"));
        assert!(w.agent.node_id.ends_with("-8001"));
        assert!(parse_worker(&[], None).is_err());
        assert!(
            parse_worker(
                &["--control-plane", "cp:1", "--heartbeat-interval-ms", "0"],
                None
            )
            .is_err()
        );
    }

    #[test]
    fn bad_combinations_are_refused() {
        assert!(
            parse(&["--load-model", "a"])
                .unwrap_err()
                .contains("explicit")
        );
        assert!(
            parse(&[
                "--model-control-mode",
                "explicit",
                "--load-model",
                "*",
                "--load-model",
                "a"
            ])
            .is_err()
        );
        assert!(
            parse(&["--http-port", "9000", "--grpc-port", "9000"])
                .unwrap_err()
                .contains("own port")
        );
        assert!(parse(&["--strict-readiness", "maybe"]).is_err());
    }

    #[test]
    fn metrics_flags_parse() {
        let c = parse(&[]).unwrap().metrics;
        assert_eq!(c, MetricsConfig::default());
        let c = parse(&[
            "--metrics-config",
            "summary_latencies=true",
            "--metrics-config",
            "counter_latencies=false",
            "--allow-gpu-metrics=false",
            "--allow-cpu-metrics",
            "0",
            "--metrics-interval-ms",
            "500",
        ])
        .unwrap()
        .metrics;
        assert!(c.latencies.summary && !c.latencies.counter);
        assert!(!c.gpu && !c.cpu);
        assert_eq!(c.interval, Duration::from_millis(500));
        let e = parse(&["--metrics-config", "histogram_latency=true"]).unwrap_err();
        assert!(e.contains("unknown key 'histogram_latency'"), "{e}");
        let e = parse(&["--metrics-config", "summary_latencies=yes please"]).unwrap_err();
        assert!(e.contains("summary_latencies"), "{e}");
        assert!(parse(&["--metrics-interval-ms", "0"]).is_err());
    }
}
