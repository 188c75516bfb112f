//! Flag groups shared by several subcommands, each flag defined once and flattened
//! (`#[command(flatten)]`) where it applies, with the checks that go with it:
//!
//! | group | `serve` | `worker` | `router` | `check-config` |
//! |---|---|---|---|---|
//! | [`ListenArgs`]: ports, addresses, `--allow-*` | ✓ | ✓ | ✓ | |
//! | [`MetricsArgs`]: what `/metrics` reports | ✓ | ✓ | | |
//! | [`FrontendArgs`]: request limits, restricted APIs, drain time, logging, server name | ✓ | ✓ | ✓ | |
//! | [`ModelArgs`]: auto-complete, queue size, ONNX Runtime, Python | ✓ | ✓ | | |
//! | [`PythonArgs`]: the Python models' interpreter | ✓ | ✓ | | ✓ |
//! | [`AuthTokenArgs`]: the token sent to the control plane | | ✓ | ✓ | |
//!
//! The telemetry flags are [`crate::telemetry_args::TelemetryArgs`].

use std::ffi::OsString;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use nereid_data_plane::{MetricsConfig, RateLimitConfig};

/// Parses Triton-style booleans: true/false/1/0 (also yes/no, on/off).
pub fn parse_bool(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(format!("expected true/false/1/0, got '{s}'")),
    }
}

#[derive(Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (Triton's `default` and `ISO8601` are accepted as aliases).
    #[value(alias = "default", alias = "ISO8601", alias = "iso8601")]
    Text,
    /// One JSON object per line.
    Json,
}

/// Where the KServe v2 services listen: shared by `serve`, `worker` and `router`.
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
    /// Let clients register system and CUDA shared-memory regions (Triton's flag, off by
    /// default as in current Triton). A client that can register a region makes the server read
    /// and write that shared-memory object: turn it on only for clients on this host that you
    /// trust. Off, registering answers 501 / UNIMPLEMENTED naming this flag.
    #[arg(long, env = "NEREID_ALLOW_CLIENT_SHM", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub allow_client_shm: bool,
}

/// The addresses of the enabled services; `None` for a disabled one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenAddrs {
    pub http: Option<SocketAddr>,
    pub grpc: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
}

impl ListenArgs {
    /// The enabled services' addresses, or an error when two of them share a port (port 0,
    /// "any free port", excepted).
    pub fn addrs(&self) -> Result<ListenAddrs, String> {
        let enabled = [
            (self.allow_http, "--http-port", self.http_port),
            (self.allow_grpc, "--grpc-port", self.grpc_port),
            (self.allow_metrics, "--metrics-port", self.metrics_port),
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
        let addr = |allow: bool, ip: IpAddr, port: u16| allow.then_some(SocketAddr::new(ip, port));
        Ok(ListenAddrs {
            http: addr(self.allow_http, self.http_address, self.http_port),
            grpc: addr(self.allow_grpc, self.grpc_address, self.grpc_port),
            metrics: addr(self.allow_metrics, self.metrics_address, self.metrics_port),
        })
    }
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

/// What every process serving the KServe v2 API has: `serve`, `worker` and `router`.
#[derive(Args, Debug, Clone)]
pub struct FrontendArgs {
    /// Largest HTTP request body in bytes, also after decompression.
    #[arg(long, env = "NEREID_HTTP_MAX_INPUT_SIZE", default_value_t = 64 * 1024 * 1024)]
    pub http_max_input_size: usize,
    /// Put HTTP endpoint categories behind a header, Triton's form
    /// `<api>[,<api>...]:<key>=<value>` (repeatable; `;` separates values in the env var): a
    /// request to them without header <key> set to exactly <value> gets 403. APIs: health,
    /// metadata, inference, shared-memory, model-config, model-repository, statistics, trace,
    /// logging, openai (the OpenAI-compatible `/v1/` routes, whose clients send API keys as
    /// `openai:authorization=Bearer <key>`; docs/openai.md); each in one value only.
    #[arg(long, env = "NEREID_HTTP_RESTRICTED_API", value_delimiter = ';')]
    pub http_restricted_api: Vec<String>,
    /// Put gRPC rpc categories behind a metadata header, same form and APIs as
    /// --http-restricted-api; clients send `triton-grpc-protocol-<key>: <value>`, else the rpc
    /// fails with UNAVAILABLE.
    #[arg(
        long,
        alias = "grpc-restricted-api",
        env = "NEREID_GRPC_RESTRICTED_PROTOCOL",
        value_delimiter = ';'
    )]
    pub grpc_restricted_protocol: Vec<String>,
    /// Inputs one infer request may carry (HTTP and gRPC); more is refused with 400 /
    /// INVALID_ARGUMENT before any tensor is decoded.
    #[arg(long, env = "NEREID_MAX_REQUEST_INPUTS", default_value_t = nereid_frontend::RequestLimits::DEFAULT_MAX_TENSORS)]
    pub max_request_inputs: usize,
    /// Outputs one infer request may ask for by name (HTTP and gRPC).
    #[arg(long, env = "NEREID_MAX_REQUEST_OUTPUTS", default_value_t = nereid_frontend::RequestLimits::DEFAULT_MAX_TENSORS)]
    pub max_request_outputs: usize,
    /// Elements one input tensor may declare (the product of its shape), checked before its
    /// data is read; lower it to bound the memory one request can make the server allocate.
    #[arg(long, env = "NEREID_MAX_TENSOR_ELEMENTS", default_value_t = nereid_frontend::RequestLimits::DEFAULT_MAX_TENSOR_ELEMENTS)]
    pub max_tensor_elements: u64,
    /// Largest gRPC message in bytes, received or sent; a larger message fails its rpc with
    /// OUT_OF_RANGE naming both sizes. Triton's is INT32_MAX (2147483647): raise it to that for
    /// single tensors over 256 MiB (and --max-buffered-request-bytes with it).
    #[arg(long, env = "NEREID_GRPC_MAX_MESSAGE_SIZE", default_value_t = nereid_frontend::GrpcConfig::DEFAULT_MAX_MESSAGE_SIZE)]
    pub grpc_max_message_size: usize,
    /// Responses a ModelStreamInfer stream holds for a client that reads slower than its models
    /// answer; when full, the stream's requests wait. Raise it for token streaming on a slow link.
    #[arg(long, env = "NEREID_GRPC_STREAM_BUFFER", default_value_t = nereid_frontend::GrpcConfig::DEFAULT_STREAM_RESPONSE_BUFFER)]
    pub grpc_stream_buffer: usize,
    /// Seconds after SIGTERM / Ctrl-C for in-flight requests to finish, models to unload and
    /// Python stubs to run `finalize()`; stubs still running then are killed (exit status 1).
    #[arg(long, env = "NEREID_EXIT_TIMEOUT_SECS", default_value_t = 30)]
    pub exit_timeout_secs: u64,
    /// Verbose logging level (0 = info; 1 or more = debug).
    #[arg(long, env = "NEREID_LOG_VERBOSE", default_value_t = 0)]
    pub log_verbose: u32,
    /// Log line format.
    #[arg(long, env = "NEREID_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Server identifier reported as `name` in server metadata, as Triton's `--id`. The default
    /// is Triton's (`triton`) so clients that check the name (Triton's own examples do) work
    /// unchanged; the version field still says which Nereid answers.
    #[arg(long, env = "NEREID_ID", default_value = "triton")]
    pub id: String,
}

impl FrontendArgs {
    /// The frontends' restricted APIs, request limits and gRPC sizes, or the first bad flag.
    pub fn options(&self) -> Result<nereid_frontend::FrontendOptions, String> {
        let at_least_one = [
            ("--max-request-inputs", self.max_request_inputs as u64),
            ("--max-request-outputs", self.max_request_outputs as u64),
            ("--max-tensor-elements", self.max_tensor_elements),
            ("--grpc-max-message-size", self.grpc_max_message_size as u64),
            ("--grpc-stream-buffer", self.grpc_stream_buffer as u64),
        ];
        if let Some((flag, _)) = at_least_one.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{flag} must be at least 1"));
        }
        let restricted =
            |r: Result<_, nereid_frontend::RestrictError>| r.map_err(|e| e.to_string());
        Ok(nereid_frontend::FrontendOptions {
            http_restricted: restricted(nereid_frontend::RestrictedApis::parse_http(
                &self.http_restricted_api,
            ))?,
            grpc_restricted: restricted(nereid_frontend::RestrictedApis::parse_grpc(
                &self.grpc_restricted_protocol,
            ))?,
            limits: nereid_frontend::RequestLimits {
                max_inputs: self.max_request_inputs,
                max_outputs: self.max_request_outputs,
                max_tensor_elements: self.max_tensor_elements,
            },
            grpc_max_message_size: self.grpc_max_message_size,
            grpc_stream_buffer: self.grpc_stream_buffer,
            // Set by `serve` and `worker` from their forwarding flags (crate::forward_args).
            ..Default::default()
        })
    }
}

/// How the data plane loads and queues models: shared by `serve` and `worker`.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Do not fill model configs from model files (inputs, outputs, max_batch_size).
    #[arg(long, env = "NEREID_DISABLE_AUTO_COMPLETE_CONFIG")]
    pub disable_auto_complete_config: bool,
    /// Requests that may wait per model version before new ones are refused (503).
    #[arg(long, env = "NEREID_MODEL_QUEUE_SIZE", default_value_t = 1024)]
    pub model_queue_size: usize,
    /// ONNX Runtime shared library to load (default: ORT_DYLIB_PATH, then a library next to
    /// the executable, then the one found at build time).
    #[arg(long, env = "NEREID_ONNXRUNTIME_LIBRARY")]
    pub onnxruntime_library: Option<PathBuf>,
    /// The response cache, Triton's form: `local,size=<bytes>` (repeatable). One in-memory
    /// cache for every model whose config sets `response_cache { enable: true }`, bounded in
    /// bytes with least-recently-used eviction; without this flag no model is cached. Size it
    /// to the answers you expect to repeat (each entry counts its outputs' bytes plus about
    /// 128 bytes).
    #[arg(long, env = "NEREID_CACHE_CONFIG", value_delimiter = ';')]
    pub cache_config: Vec<String>,
    #[command(flatten)]
    pub python: PythonArgs,
    /// `execution_count`: a model instance executes only when the resources its instance
    /// group's `rate_limiter` lists are free, in priority order across models (Triton's
    /// `--rate-limit`); `off`: instances run as soon as they have work.
    #[arg(long, env = "NEREID_RATE_LIMIT", value_enum, default_value = "off")]
    pub rate_limit: RateLimitMode,
    /// Size of a rate-limiter resource pool, `<name>:<count>[:<device>]` (without a device:
    /// every device's pool); repeat for several. Unlisted resources get the largest count any
    /// loaded instance needs.
    #[arg(long, env = "NEREID_RATE_LIMIT_RESOURCE", value_delimiter = ',')]
    pub rate_limit_resource: Vec<String>,
}

/// `--rate-limit`.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum RateLimitMode {
    Off,
    #[value(name = "execution_count")]
    ExecutionCount,
}

impl ModelArgs {
    /// The rate limiter's config, or the first bad `--rate-limit-resource`.
    pub fn rate_limit(&self) -> Result<RateLimitConfig, String> {
        let mut config = RateLimitConfig {
            enabled: self.rate_limit == RateLimitMode::ExecutionCount,
            ..Default::default()
        };
        for spec in &self.rate_limit_resource {
            config.add_resource(spec)?;
        }
        Ok(config)
    }
}

/// The interpreter of Python models: shared by `serve`, `worker` and `check-config`.
#[derive(Args, Debug, Clone, Default)]
pub struct PythonArgs {
    /// Interpreter of the Python models that set no EXECUTION_ENV_PATH: an interpreter file, a
    /// virtual environment directory, or a program name looked up on PATH (default: python3 on
    /// PATH).
    // Any OS string: an empty NEREID_PYTHON means unset, as it always has.
    #[arg(long = "python", env = "NEREID_PYTHON", value_parser = clap::builder::ValueParser::os_string())]
    pub python: Option<OsString>,
}

impl PythonArgs {
    /// The interpreter; an empty value counts as unset.
    pub fn interpreter(self) -> Option<PathBuf> {
        self.python.filter(|p| !p.is_empty()).map(PathBuf::from)
    }
}

/// The bearer token sent to the control plane: shared by `worker` and `router`.
#[derive(Args, Debug, Clone)]
pub struct AuthTokenArgs {
    /// File holding the bearer token sent to the control plane (else NEREID_AUTH_TOKEN).
    #[arg(long, env = "NEREID_AUTH_TOKEN_FILE")]
    pub auth_token_file: Option<PathBuf>,
}

impl AuthTokenArgs {
    /// The token from `--auth-token-file`, else `env_token` (NEREID_AUTH_TOKEN), trimmed;
    /// `None` when neither gives a non-empty one.
    pub fn token(&self, env_token: Option<String>) -> Result<Option<String>, String> {
        let token =
            match &self.auth_token_file {
                Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                    format!("cannot read --auth-token-file '{}': {e}", path.display())
                })?),
                None => env_token,
            };
        Ok(token
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty()))
    }
}

/// The `--control-plane` addresses, trimmed, empty entries dropped; at least one is required.
pub fn control_plane_addrs(raw: &[String]) -> Result<Vec<String>, String> {
    let addrs: Vec<String> = raw
        .iter()
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .collect();
    if addrs.is_empty() {
        return Err("--control-plane needs at least one address".into());
    }
    Ok(addrs)
}
