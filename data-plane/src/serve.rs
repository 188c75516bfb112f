//! `nereid serve`: the single-node server's life from start to graceful exit.
//!
//! ```text
//! bind HTTP, gRPC, metrics ports (fail fast, before any model loads)
//!   ─► load startup models ─► serve HTTP + gRPC + metrics (+ poll loop in poll mode,
//!      + system metrics sampling while the metrics port is enabled)
//!   ─► shutdown signal: not ready, stop accepting, drain in-flight requests
//!   ─► unload every model: Python stubs run `finalize` and exit
//!   ─► stubs still running at the exit timeout (counted from the signal, for all of the
//!      above) are killed and reaped ─► return (an error naming them if any was killed)
//! ```

use nereid_frontend::Frontends;
use nereid_frontend::bind;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

use futures::future::BoxFuture;
use nereid_proto::InferenceService;
use tokio::sync::watch;

use crate::backend::Backends;
use crate::manager::{ControlMode, ManagerConfig, ModelManager};
use crate::metrics::{DataPlaneMetrics, MetricsConfig};
use crate::server::{DataPlane, DataPlaneConfig};
use crate::system_metrics::{self, SystemMetrics};

/// How long queued spans and a last metric export get at shutdown.
const TELEMETRY_FLUSH: Duration = Duration::from_secs(5);

/// Everything `nereid serve` needs, already validated by the binary.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// Model repositories, control mode and loading settings.
    pub manager: ManagerConfig,
    /// Settings of the request path shared by both frontends.
    pub data_plane: DataPlaneConfig,
    /// `None` disables the endpoint.
    pub http_addr: Option<SocketAddr>,
    /// The gRPC endpoint's address; `None` disables it.
    pub grpc_addr: Option<SocketAddr>,
    /// The metrics endpoint's address; `None` disables it.
    pub metrics_addr: Option<SocketAddr>,
    /// Which metrics the metrics port reports and how often system metrics are sampled.
    pub metrics: MetricsConfig,
    /// The largest HTTP request body accepted, in bytes (`--http-max-input-size`).
    pub http_max_input_size: usize,
    /// Restricted APIs, request limits and gRPC sizes of both frontends.
    pub frontend: nereid_frontend::FrontendOptions,
    /// How often the repositories are rescanned in `poll` control mode (`--repository-poll-secs`).
    pub poll_interval: Duration,
    /// How long in-flight requests and then the models' `finalize` may take after a shutdown
    /// signal, all together; Python stubs still running then are killed.
    pub exit_timeout: Duration,
    /// Fail startup when any model fails to load.
    pub exit_on_error: bool,
    /// The ONNX Runtime shared library the ONNX backend loads; `None`: none was found, and ONNX
    /// models fail to load.
    pub onnxruntime_library: Option<PathBuf>,
    /// Interpreter of Python models that name no `EXECUTION_ENV_PATH`; `None`: `python3` on
    /// `PATH`.
    pub python: Option<PathBuf>,
    /// Trace settings and OTLP export (spans; metrics when configured).
    pub telemetry: nereid_telemetry::TelemetryConfig,
    /// TLS, connection limits and read deadlines of the HTTP and gRPC ports.
    pub ports: nereid_frontend::PortsConfig,
    /// `--allow-client-shm`: clients may register system and CUDA shared-memory regions.
    pub allow_client_shm: bool,
    /// Serve the HTTP API on the gRPC port too (paths under `/v2/`): a worker under cluster
    /// TLS, whose router forwards HTTP inference over the mutual-TLS gRPC connection.
    pub http_on_grpc_port: bool,
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    /// An endpoint's address could not be bound.
    Bind(#[from] nereid_frontend::BindError),
    #[error("{0}")]
    /// Startup failed for another reason (e.g. the system metrics probe, or a model under
    /// `--exit-on-error`); holds the message.
    Startup(String),
    /// The server stopped, but had to kill Python stubs that were still running at the exit
    /// timeout.
    #[error("{0}")]
    Shutdown(String),
}

/// What a task started alongside the server (the worker's agent) gets: the models, the bound
/// data-plane addresses, and a flag set when the server stops.
pub struct Started {
    /// The server's models.
    pub manager: Arc<ModelManager>,
    /// The bound HTTP address; `None` when HTTP is off.
    pub http_addr: Option<SocketAddr>,
    /// The bound gRPC address; `None` when gRPC is off.
    pub grpc_addr: Option<SocketAddr>,
    /// Set to `true` when the server starts to shut down.
    pub stop: watch::Receiver<bool>,
}

/// A task run alongside the server once it serves; it must return soon after `stop` is set.
pub type Companion = Box<dyn FnOnce(Started) -> BoxFuture<'static, ()> + Send>;

/// Runs the server until `shutdown` resolves, then drains and returns.
pub async fn run(
    config: ServeConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    run_with(config, shutdown, None).await
}

/// Warns, loudly and at start, when any client of the HTTP or gRPC port can load models: in
/// `--model-control-mode explicit` a `load` request may carry a config and files, and a Python
/// model's `model.py` then runs with the server's permissions (as in Triton). Restricting the
/// `model-repository` category on every enabled port silences it.
fn warn_if_clients_can_load_code(config: &ServeConfig) {
    let manager = &config.manager;
    if manager.control_mode != ControlMode::Explicit || manager.cluster_managed {
        return;
    }
    let category = nereid_frontend::ApiCategory::ModelRepository;
    let open: Vec<&str> = [
        (
            "HTTP (--http-restricted-api)",
            config.http_addr.is_some(),
            &config.frontend.http_restricted,
        ),
        (
            "gRPC (--grpc-restricted-protocol)",
            config.grpc_addr.is_some(),
            &config.frontend.grpc_restricted,
        ),
    ]
    .into_iter()
    .filter(|(_, enabled, restricted)| *enabled && restricted.required(category).is_none())
    .map(|(port, _, _)| port)
    .collect();
    if !open.is_empty() {
        tracing::warn!(
            "--model-control-mode explicit with the model-repository API unrestricted on {}: ANY client of that port can load a model with its own config and files, and a Python model runs its code with this server's permissions. Restrict it (e.g. --http-restricted-api model-repository:<header>=<secret>) or bind the port to a trusted address; see docs/security.md",
            open.join(" and ")
        );
    }
}

/// [`run`], with a `companion` task started once the services listen and awaited with them
/// at shutdown.
pub async fn run_with(
    config: ServeConfig,
    shutdown: impl Future<Output = ()>,
    companion: Option<Companion>,
) -> Result<(), ServeError> {
    // Polled once now so that a signal handler it installs is in place before any port opens
    // or stub starts: a signal during startup is then honoured once the startup models are
    // loaded, instead of ending the process at once and leaving its stubs behind.
    let mut shutdown = std::pin::pin!(shutdown);
    let signalled_early = futures::poll!(shutdown.as_mut()).is_ready();
    let backlog = config.ports.backlog;
    let http = bind("HTTP", config.http_addr, backlog).await?;
    let grpc = bind("gRPC", config.grpc_addr, backlog).await?;
    let metrics_listener = bind("metrics", config.metrics_addr, backlog).await?;
    let local = |l: &Option<TcpListener>| l.as_ref().and_then(|l| l.local_addr().ok());
    let (http_bound, grpc_bound) = (local(&http), local(&grpc));

    let backends =
        Backends::new(config.onnxruntime_library.clone()).with_python(config.python.clone());
    let server_handle = backends.server().clone();
    let backend_files = backends.clone();
    let manager = Arc::new(ModelManager::new(config.manager.clone(), backends));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut servers = tokio::task::JoinSet::new();
    // Host and GPU metrics are sampled only while something reads them: the metrics port or
    // OTLP metric export.
    let m = &config.metrics;
    let exported = metrics_listener.is_some() || config.telemetry.metrics.is_some();
    let system = if exported && (m.cpu || m.gpu) {
        let (cpu, gpu) = (m.cpu, m.gpu);
        let system = tokio::task::spawn_blocking(move || SystemMetrics::probe(cpu, gpu))
            .await
            .map(Arc::new)
            .map_err(|e| ServeError::Startup(format!("system metrics probe failed: {e}")))?;
        servers.spawn(system_metrics::refresh_task(
            system.clone(),
            m.interval,
            stop_rx.clone(),
        ));
        Some(system)
    } else {
        None
    };
    let metrics = Arc::new(
        DataPlaneMetrics::new(manager.clone(), config.metrics.latencies.clone(), system)
            .with_custom_metrics(server_handle.custom_metrics().clone()),
    );
    let telemetry = nereid_telemetry::Telemetry::start(
        &config.telemetry,
        nereid_telemetry::logging::control(),
        Some(metrics.clone()),
    )
    .map_err(ServeError::Startup)?;
    let data_plane = Arc::new(
        DataPlane::new(config.data_plane.clone(), manager.clone())
            .with_telemetry(telemetry.tracer.clone(), telemetry.logs.clone()),
    );
    let service: Arc<dyn InferenceService> = data_plane.clone();
    // Models that call other models (Python BLS) reach them through this handle, from
    // their first `initialize` on.
    server_handle.bind(Arc::downgrade(&service), tokio::runtime::Handle::current());
    manager
        .load_startup_models()
        .await
        .map_err(|e| ServeError::Startup(e.to_string()))?;
    if config.exit_on_error && !manager.all_ready() {
        return Err(ServeError::Startup(
            "a model failed to load and --exit-on-error is on (see the errors above; --exit-on-error=false serves the models that loaded)".into(),
        ));
    }

    // One registry of client shared-memory regions for both protocols: a region registered over
    // HTTP serves gRPC requests too.
    let shared_memory = nereid_frontend::SharedMemory::for_clients(config.allow_client_shm);
    let mut ports = config.ports.clone();
    nereid_frontend::fit_ports_to_fd_limit(&mut ports);
    nereid_frontend::spawn(
        &mut servers,
        service.clone(),
        Frontends {
            http,
            grpc,
            metrics: metrics_listener.map(|l| (l, metrics.clone().router())),
            http_config: nereid_frontend::HttpConfig {
                // Where the OpenAI chat route finds a model's tokenizer_config.json.
                model_repositories: config.manager.repositories.clone(),
                ..config
                    .frontend
                    .http_config(config.http_max_input_size, shared_memory.clone())
            },
            grpc_config: config.frontend.grpc_config(shared_memory),
            ports,
            http_on_grpc_port: config.http_on_grpc_port,
        },
        &stop_rx,
    );
    if manager.control_mode() == ControlMode::Poll {
        let manager = manager.clone();
        let interval = config.poll_interval;
        let stop = stop_rx.clone();
        tokio::spawn(crate::ticker::every(interval, stop, move || {
            let manager = manager.clone();
            async move {
                if let Err(e) = manager.poll_once().await {
                    tracing::error!(error = %e, "repository poll failed");
                }
            }
        }));
    }
    if let Some(companion) = companion {
        servers.spawn(companion(Started {
            manager: manager.clone(),
            http_addr: http_bound,
            grpc_addr: grpc_bound,
            stop: stop_rx.clone(),
        }));
    }
    warn_if_clients_can_load_code(&config);
    tracing::info!("server started");

    if !signalled_early {
        shutdown.await;
    }
    let deadline = Instant::now() + config.exit_timeout;
    tracing::info!(
        timeout_s = config.exit_timeout.as_secs(),
        "shutting down: draining in-flight requests"
    );
    data_plane.begin_shutdown();
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout_at(deadline.into(), async {
        while servers.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!("exit timeout reached with requests still in flight; stopping anyway");
        servers.abort_all();
    }
    let killed = stop_models(&manager, backend_files.clone(), deadline).await;
    backend_files.cleanup();
    telemetry.shutdown(TELEMETRY_FLUSH).await;
    if !killed.is_empty() {
        return Err(ServeError::Shutdown(format!(
            "server stopped, but had to kill Python stubs that had not finished finalize within the exit timeout (--exit-timeout-secs {}): {}",
            config.exit_timeout.as_secs(),
            killed.join(", ")
        )));
    }
    tracing::info!("server stopped");
    Ok(())
}

/// Unloads every model so that each Python stub runs `finalize`, waits for the stubs to exit
/// until `deadline`, then kills and reaps those left; returns the ones it killed.
async fn stop_models(manager: &ModelManager, backends: Backends, deadline: Instant) -> Vec<String> {
    tracing::info!("shutting down: unloading models");
    if tokio::time::timeout_at(deadline.into(), manager.unload_all())
        .await
        .is_err()
    {
        tracing::warn!("exit timeout reached while unloading models");
    }
    match tokio::task::spawn_blocking(move || backends.stop_children(deadline)).await {
        Ok(killed) => killed,
        Err(e) => vec![format!("(waiting for the stubs failed: {e})")],
    }
}
