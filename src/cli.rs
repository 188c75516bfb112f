//! Command-line flags. Names follow `tritonserver` where a Triton user would look for them;
//! every flag can also be set through a `NEREID_*` environment variable.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use nereid_agent::AgentConfig;
use nereid_data_plane::{ControlMode, DataPlaneConfig, ManagerConfig, ServeConfig};

use crate::common_args::{
    AuthTokenArgs, FrontendArgs, ListenArgs, MetricsArgs, ModelArgs, PythonArgs,
    control_plane_addrs, parse_bool,
};
use crate::forward_args::ForwardArgs;
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

#[derive(Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum ControlModeArg {
    None,
    Poll,
    Explicit,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Model repository directory (repeat for several). Triton layout: <repo>/<model>/config.pbtxt
    /// and numbered version folders. Object stores too: s3://bucket/path,
    /// s3://host:port/bucket/path, gs://bucket/path, as://account/container/path (mirrored into
    /// --model-cache-dir; credentials from AWS_*, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*).
    #[arg(
        long = "model-repository",
        alias = "model-store",
        env = "NEREID_MODEL_REPOSITORY",
        value_delimiter = ',',
        required = true
    )]
    pub model_repository: Vec<PathBuf>,
    /// Where object-store repositories are mirrored (one folder per URL; give each server its
    /// own). Default: $XDG_CACHE_HOME/nereid/models, else <temp dir>/nereid-model-cache.
    #[arg(long, env = "NEREID_MODEL_CACHE_DIR")]
    pub model_cache_dir: Option<PathBuf>,
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
    /// Read each model's config from `configs/<NAME>.pbtxt` where the model has one (else
    /// `config.pbtxt`), as Triton's flag: per-hardware configs such as `h100.pbtxt`.
    #[arg(long, env = "NEREID_MODEL_CONFIG_NAME", value_name = "NAME", value_parser = parse_config_name)]
    pub model_config_name: Option<String>,
    /// Let models of the same name in different --model-repository folders all load, each in
    /// its repository's namespace (as Triton's flag): a request naming a model found in several
    /// namespaces fails (400, "... resolve ambiguity"); an ensemble uses the models of its own
    /// repository first; per-model metrics get a `namespace` label.
    #[arg(long, env = "NEREID_MODEL_NAMESPACING", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub model_namespacing: bool,
    /// Ready only when every model loaded successfully (false: ready once started).
    #[arg(long, env = "NEREID_STRICT_READINESS", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub strict_readiness: bool,
    /// Exit (status 1) at startup if any model fails to load, as Triton by default;
    /// `--exit-on-error=false` keeps serving the models that loaded.
    #[arg(long, env = "NEREID_EXIT_ON_ERROR", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub exit_on_error: bool,
    #[command(flatten)]
    pub frontend: FrontendArgs,
    #[command(flatten)]
    pub forward: ForwardArgs,
    #[command(flatten)]
    pub tls: crate::tls_args::PortTlsArgs,
    #[command(flatten)]
    pub models: ModelArgs,
    /// Deprecated Triton spelling: true disables auto-complete.
    #[arg(long, env = "NEREID_STRICT_MODEL_CONFIG", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub strict_model_config: Option<bool>,
}

impl ServeArgs {
    /// Checks the flags and turns them into the server's config, before any port is bound.
    pub fn into_config(mut self) -> Result<ServeConfig, String> {
        let cache_dir = self
            .model_cache_dir
            .clone()
            .unwrap_or_else(nereid_data_plane::default_cache_dir);
        for repo in &mut self.model_repository {
            if let Some(url) = repo.to_str().filter(|r| nereid_data_plane::is_remote(r)) {
                *repo = nereid_data_plane::mirror_repository(url, &cache_dir)
                    .map_err(|e| format!("--model-repository: {e}"))?;
            } else if !repo.is_dir() {
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
        let (frontend, models) = (self.frontend, self.models);
        let mut frontend_options = frontend.options()?;
        self.forward.apply(&mut frontend_options)?;
        if models.model_queue_size == 0 {
            return Err("--model-queue-size must be at least 1".into());
        }
        let rate_limit = models.rate_limit()?;
        let response_cache_bytes = nereid_data_plane::parse_cache_config(&models.cache_config)
            .map_err(|e| e.to_string())?;
        let addrs = self.listen.addrs()?;
        let ports = self.tls.ports(&frontend)?;
        let metrics = self.metrics.into_config()?;
        let auto_complete =
            !models.disable_auto_complete_config && self.strict_model_config != Some(true);
        Ok(ServeConfig {
            manager: ManagerConfig {
                repositories: self.model_repository,
                control_mode,
                startup_models: self.load_model,
                auto_complete,
                queue_capacity: models.model_queue_size,
                cluster_managed: false,
                rate_limit,
                response_cache_bytes,
                config_name: self.model_config_name,
                namespacing: self.model_namespacing,
            },
            data_plane: DataPlaneConfig {
                server_name: frontend.id,
                strict_readiness: self.strict_readiness,
            },
            http_addr: addrs.http,
            grpc_addr: addrs.grpc,
            metrics_addr: addrs.metrics,
            metrics,
            http_max_input_size: frontend.http_max_input_size,
            frontend: frontend_options,
            poll_interval: Duration::from_secs(self.repository_poll_secs),
            exit_timeout: Duration::from_secs(frontend.exit_timeout_secs),
            exit_on_error: self.exit_on_error,
            onnxruntime_library: crate::ort_library::resolve(models.onnxruntime_library),
            python: models.python.interpreter(),
            telemetry: self.telemetry.to_config("nereid")?,
            ports,
            allow_client_shm: self.listen.allow_client_shm,
            http_on_grpc_port: false,
        })
    }
}

/// A `--model-config-name`: a file name stem, not a path.
fn parse_config_name(text: &str) -> Result<String, String> {
    if text.is_empty() || text.contains(['/', '\\']) || text == "." || text == ".." {
        return Err(format!(
            "'{text}' is not a config name: give the file name under configs/ without '.pbtxt' (e.g. h100)"
        ));
    }
    Ok(text.to_string())
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
    #[command(flatten)]
    pub auth: AuthTokenArgs,
    #[command(flatten)]
    pub listen: ListenArgs,
    #[command(flatten)]
    pub metrics: MetricsArgs,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
    /// Ready only when every assigned model loaded successfully (false: ready once started).
    #[arg(long, env = "NEREID_STRICT_READINESS", default_value = "true", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub strict_readiness: bool,
    #[command(flatten)]
    pub frontend: FrontendArgs,
    #[command(flatten)]
    pub forward: ForwardArgs,
    #[command(flatten)]
    pub tls: crate::tls_args::PortTlsArgs,
    #[command(flatten)]
    pub cluster_tls: crate::cluster_tls_args::ClusterTlsArgs,
    #[command(flatten)]
    pub models: ModelArgs,
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
        let addrs = control_plane_addrs(&self.control_plane)?;
        let node_id = self.node_id.unwrap_or_else(|| {
            format!(
                "{}-{}",
                nereid_data_plane::hostname(),
                self.listen.grpc_port
            )
        });
        if node_id.trim().is_empty() {
            return Err("--node-id must not be empty".into());
        }
        let token = self.auth.token(env_token)?;
        let cluster_tls = self.cluster_tls.load()?;
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
            model_cache_dir: None,
            listen: self.listen,
            metrics: self.metrics,
            telemetry: TelemetryArgs::default(),
            model_control_mode: ControlModeArg::Explicit,
            load_model: Vec::new(),
            repository_poll_secs: 15,
            model_config_name: None,
            model_namespacing: false,
            strict_readiness: self.strict_readiness,
            exit_on_error: false,
            frontend: self.frontend,
            forward: self.forward,
            tls: self.tls,
            models: self.models,
            strict_model_config: None,
        };
        let mut serve = serve.into_config()?;
        serve.manager.cluster_managed = true;
        // The router reaches this gRPC port: with cluster TLS it requires the cluster's client
        // certificates, unless --grpc-use-ssl* configured the port otherwise.
        if let Some(tls) = &cluster_tls
            && serve.ports.grpc.tls.is_none()
        {
            serve.ports.grpc.tls = Some(tls.grpc.clone());
        }
        // The HTTP port is outside the cluster's mutual TLS (kubelet probes reach it), so the
        // router forwards HTTP inference to the gRPC port, which serves the HTTP API too.
        serve.http_on_grpc_port = cluster_tls.is_some();
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
                cluster_dial: cluster_tls.map(|tls| tls.dial).unwrap_or_default(),
            },
            advertise_host: self.advertise_host,
        })
    }
}

#[derive(Args, Debug)]
pub struct CheckConfigArgs {
    /// config.pbtxt files, model directories or model repositories.
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Fill inputs/outputs from model files where a directory has them (needs ONNX Runtime).
    #[arg(long)]
    pub auto_complete: bool,
    /// Do not load model files to check their signatures against the configs.
    #[arg(long)]
    pub no_load: bool,
    /// ONNX Runtime shared library (for model files and --auto-complete).
    #[arg(long, env = "NEREID_ONNXRUNTIME_LIBRARY")]
    pub onnxruntime_library: Option<PathBuf>,
    #[command(flatten)]
    pub python: PythonArgs,
}

#[cfg(test)]
mod tests {
    use nereid_data_plane::MetricsConfig;

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
    fn frontend_options_from_flags() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.frontend, nereid_frontend::FrontendOptions::default());
        let c = parse(&[
            "--http-restricted-api",
            "statistics:k=v",
            "--max-request-outputs",
            "5",
            "--max-tensor-elements",
            "100",
            "--grpc-stream-buffer",
            "7",
        ])
        .unwrap();
        let statistics = nereid_frontend::ApiCategory::Statistics;
        assert!(c.frontend.http_restricted.required(statistics).is_some());
        assert!(c.frontend.grpc_restricted.is_empty());
        assert_eq!(c.frontend.limits.max_outputs, 5);
        assert_eq!(c.frontend.limits.max_tensor_elements, 100);
        assert_eq!(c.frontend.grpc_stream_buffer, 7);
        let e = parse(&["--max-request-inputs", "0"]).unwrap_err();
        assert_eq!(e, "--max-request-inputs must be at least 1");
        let e = parse(&["--grpc-restricted-protocol", "x:k=v"]).unwrap_err();
        assert!(e.contains("unknown API 'x'"), "{e}");
    }

    #[test]
    fn cache_config_in_tritons_form() {
        assert_eq!(parse(&[]).unwrap().manager.config_name, None);
        let c = parse(&["--model-config-name", "h100"]).unwrap();
        assert_eq!(c.manager.config_name.as_deref(), Some("h100"));
        assert_eq!(parse(&[]).unwrap().manager.response_cache_bytes, None);
        let c = parse(&["--cache-config=local,size=1048576"]).unwrap();
        assert_eq!(c.manager.response_cache_bytes, Some(1_048_576));
        let c = parse(&["--cache-config", "local,size=2048"]).unwrap();
        assert_eq!(c.manager.response_cache_bytes, Some(2048));
        let e = parse(&["--cache-config", "redis,host=localhost"]).unwrap_err();
        assert!(e.contains("the 'redis' cache is not supported"), "{e}");
        let e = parse(&["--cache-config", "local,size=lots"]).unwrap_err();
        assert!(e.contains("expected a size in bytes"), "{e}");
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
        // Triton's default: a model that fails at startup stops the server.
        assert!(parse(&[]).unwrap().exit_on_error);
        assert!(!parse(&["--exit-on-error=false"]).unwrap().exit_on_error);
        assert!(!parse(&[]).unwrap().manager.namespacing);
        assert!(parse(&["--model-namespacing"]).unwrap().manager.namespacing);
        assert!(
            parse(&["--model-namespacing=true"])
                .unwrap()
                .manager
                .namespacing
        );
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
        // A worker keeps serving when an assigned model fails; the control plane sees it.
        assert!(!w.serve.exit_on_error);
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
    fn python_flag_reaches_the_config() {
        assert_eq!(parse(&[]).unwrap().python, None);
        let c = parse(&["--python", "/opt/venv"]).unwrap();
        assert_eq!(c.python, Some(PathBuf::from("/opt/venv")));
        assert_eq!(parse(&["--python="]).unwrap().python, None);
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
