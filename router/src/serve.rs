//! `nereid router`: the router's life from start to graceful exit.
//!
//! ```text
//! check control-plane addresses and token ─► bind HTTP, gRPC, metrics (fail fast)
//!   ─► watch task fills the routing table (ready once the first snapshot arrives)
//!   ─► serve HTTP + gRPC over RouterService (gRPC ModelInfer: passthrough::grpc_routes),
//!      metrics (/metrics: collector::RouterCollector)
//!   ─► shutdown signal: close the listeners, tell clients to go away (GOAWAY, HTTP/1.1
//!      `Connection: close`), drain in-flight requests (bounded by the exit timeout), stop the
//!      watch ─► return
//!
//! With `reuse_port` a replacement router binds the same ports while this one runs; once this
//! one closes its listeners, every new connection goes to the replacement.
//! ```

use nereid_frontend::bind_reusable;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use nereid_frontend::Frontends;
use nereid_proto::InferenceService;
use nereid_telemetry::prometheus_router;
use tokio::sync::watch;

use crate::activate::{Activator, RepositoryControl};
use crate::collector::RouterCollector;
use crate::control::{ControlPlane, ControlPlaneConfig};
use crate::grpc_routes::grpc_routes;
use crate::http_passthrough::http_app;
use crate::passthrough::PassThroughConfig;
use crate::service::{HedgeConfig, RouterService, RouterServiceConfig};
use crate::table::{RoutingTable, SharedTable};
use crate::watch::watch_task;

/// Why the router refuses client shared memory (register, and tensors in requests).
const SHARED_MEMORY_OFF: &str = "the router forwards requests to workers on other hosts, which cannot read a client's memory; send the tensors in the request instead";

/// Everything `nereid router` needs, validated by the binary.
#[derive(Clone, Debug)]
pub struct RouterConfig {
    /// Admission, retries, hedging and worker connections of the routing service.
    pub service: RouterServiceConfig,
    /// Where and how the router reaches the control plane for its routing table.
    pub control_plane: ControlPlaneConfig,
    /// The KServe v2 HTTP port; `None` disables the endpoint.
    pub http_addr: Option<SocketAddr>,
    /// The KServe v2 gRPC port; `None` disables the endpoint.
    pub grpc_addr: Option<SocketAddr>,
    /// The Prometheus `/metrics` port; `None` disables the endpoint.
    pub metrics_addr: Option<SocketAddr>,
    /// Bind the ports with SO_REUSEPORT, so a replacement router can listen on them beside this
    /// one and take over without an outage (see docs/router.md).
    pub reuse_port: bool,
    /// Largest HTTP request body accepted, in bytes (also after decompression).
    pub http_max_input_size: usize,
    /// Restricted APIs, request limits and gRPC sizes of both frontends.
    pub frontend: nereid_frontend::FrontendOptions,
    /// How long in-flight requests may take to finish after a shutdown signal.
    pub exit_timeout: Duration,
    /// Trace settings and OTLP export.
    pub telemetry: nereid_telemetry::TelemetryConfig,
    /// TLS, connection limits and read deadlines of the HTTP and gRPC ports.
    pub ports: nereid_frontend::PortsConfig,
    /// Whether repository load/unload requests reach the control plane (with the caller's own
    /// credential) or are refused.
    pub repository_control: RepositoryControl,
}

/// Why the router could not start.
#[derive(Debug, thiserror::Error)]
pub enum RouterServeError {
    /// A port could not be bound (in use, no permission, bad TLS files).
    #[error(transparent)]
    Bind(#[from] nereid_frontend::BindError),
    /// The configuration cannot be served; the text says which setting and why.
    #[error("{0}")]
    Config(String),
}

/// Runs the router until `shutdown` resolves, then drains and returns.
pub async fn run(
    config: RouterConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RouterServeError> {
    let control_plane =
        Arc::new(ControlPlane::new(&config.control_plane).map_err(RouterServeError::Config)?);
    let mut ports = config.ports.clone();
    nereid_frontend::fit_ports_to_fd_limit(&mut ports);
    let reuse = config.reuse_port;
    let http = bind_reusable("HTTP", config.http_addr, ports.backlog, reuse).await?;
    let grpc = bind_reusable("gRPC", config.grpc_addr, ports.backlog, reuse).await?;
    let metrics_listener =
        bind_reusable("metrics", config.metrics_addr, ports.backlog, reuse).await?;

    let table = Arc::new(SharedTable::default());
    let activator = Arc::new(Activator::new(
        control_plane.clone(),
        table.clone(),
        config.service.scale_from_zero_wait,
        config.repository_control,
    ));
    let mut telemetry = nereid_telemetry::Telemetry::start(
        &config.telemetry,
        nereid_telemetry::logging::control(),
        None,
    )
    .map_err(RouterServeError::Config)?;
    let router = Arc::new(
        RouterService::new(config.service.clone(), table.clone())
            .with_activator(activator)
            .with_telemetry(telemetry.tracer.clone(), telemetry.logs.clone()),
    );
    let service: Arc<dyn InferenceService> = router.clone();
    let collector = Arc::new(RouterCollector {
        router: router.clone(),
        table: table.clone(),
    });
    telemetry
        .export_metrics(&config.telemetry, collector.clone())
        .map_err(RouterServeError::Config)?;

    let (stop_tx, stop_rx) = watch::channel(false);
    let workers = router.workers();
    let watcher = tokio::spawn(watch_task(
        control_plane,
        table.clone(),
        move |t: &RoutingTable| workers.retain(&t.worker_addrs()),
        stop_rx.clone(),
    ));

    let mut servers = tokio::task::JoinSet::new();
    servers.spawn(keep_timer_ahead(config.service.hedge, stop_rx.clone()));
    let shared_memory = nereid_frontend::SharedMemory::disabled(SHARED_MEMORY_OFF);
    let grpc_config = config.frontend.grpc_config(shared_memory.clone());
    let http_config = config
        .frontend
        .http_config(config.http_max_input_size, shared_memory);
    // HTTP and gRPC are served here rather than by `nereid_frontend::spawn`: their inference
    // takes the pass-through paths (`http_passthrough`, `passthrough`). With cluster TLS, HTTP
    // inference goes as HTTP/2 to the workers' gRPC ports (`http_forward`).
    nereid_frontend::spawn(
        &mut servers,
        service,
        Frontends {
            http: None,
            grpc: None,
            metrics: metrics_listener.map(|l| (l, prometheus_router(collector))),
            http_config: http_config.clone(),
            grpc_config: grpc_config.clone(),
            ports: ports.clone(),
            http_on_grpc_port: false,
        },
        &stop_rx,
    );
    if let Some(listener) = http {
        let tls = ports.http.tls.is_some();
        tracing::info!(addr = ?listener.local_addr().ok(), tls, "HTTP service listening");
        let app = http_app(router.clone(), http_config, SHARED_MEMORY_OFF.to_string());
        servers.spawn(nereid_frontend::serve_http_port(
            "HTTP",
            listener,
            app,
            ports.http.clone(),
            ports.http_serving(),
            stop_rx.clone(),
        ));
    }
    if let Some(listener) = grpc {
        let serving = ports.grpc_serving(grpc_config.max_message_size);
        let routes = grpc_routes(
            router.clone(),
            PassThroughConfig {
                grpc: grpc_config,
                shared_memory_off: SHARED_MEMORY_OFF.to_string(),
            },
        );
        let served = nereid_frontend::serve_grpc_port(
            "gRPC",
            listener,
            routes,
            ports.grpc.clone(),
            serving,
            stop_rx.clone(),
        );
        servers.spawn(async move {
            let _ = served.await;
        });
    }

    shutdown.await;
    tracing::info!("shutting down: draining in-flight requests");
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(config.exit_timeout, async {
        while servers.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            in_flight = router.in_flight(),
            "exit timeout reached with requests in flight"
        );
        servers.abort_all();
    }
    let _ = watcher.await;
    telemetry.shutdown(Duration::from_secs(5)).await;
    Ok(())
}

/// Keeps one timer pending that is due before any request's attempt timeout (half the hedge
/// floor ahead, at least 10 ms) until `stop` turns true.
///
/// Every request arms a timer for its attempt timeout (`RouterService::with_retry`). When
/// that timer is the earliest one, tokio's driver must be woken to re-arm its wait: a write to
/// its eventfd and one more `epoll_wait`, per request at low concurrency, where a request's
/// timer is often the only one. With this timer always due sooner, arming a request's timer
/// costs no system call. Hedging's timing does not change.
async fn keep_timer_ahead(hedge: HedgeConfig, mut stop: tokio::sync::watch::Receiver<bool>) {
    let period = (hedge.floor / 2).max(Duration::from_millis(10));
    loop {
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
