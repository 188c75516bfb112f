//! Running the frontends: the HTTP and gRPC services over one [`InferenceService`], plus a
//! metrics router, each on its own listener, all stopping together. `nereid serve`, `nereid
//! worker` (the data plane) and `nereid router` start their services through [`spawn`].
//!
//! ```text
//!  spawn(listeners, service, stop) ─► JoinSet: HTTP (hyper + axum) │ gRPC (tonic, large
//!                                              HTTP/2 windows)     │ metrics (hyper + axum)
//!  every port takes connections from listener::accept_task: connection limit, NODELAY, TLS,
//!  first-byte deadline; HTTP/2 stream limit and request budget on HTTP and gRPC
//!  stop = true ─► each finishes its in-flight requests, then its task ends
//! ```
//!
//! Each process fits the connection limits of its ports under its open-file limit once, at
//! start ([`fit_ports_to_fd_limit`], before it serves), leaving room for models and files:
//! otherwise connections on one port (say idle metrics scrapes) could use up the descriptors and
//! make `accept` fail on the others.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpSocket};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_stream::StreamExt;

use crate::budget::RequestBudget;
use crate::grpc::{GrpcConfig, routes};
use crate::grpc_buffer::BufferMessagesLayer;
use crate::http::{HttpConfig, router};
use crate::listener::{Conn, DEFAULT_LISTEN_BACKLOG, PortConfig, accept_task};
use crate::listener_http::{DEFAULT_MAX_CONCURRENT_STREAMS, HttpServing, HttpTimeouts, serve_http};
use nereid_proto::InferenceService;

/// A listener that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for {what} on {addr}: {source}")]
pub struct BindError {
    pub what: &'static str,
    pub addr: SocketAddr,
    pub source: std::io::Error,
}

/// Binds `addr` for the `what` endpoint with an accept backlog of `backlog` connections (the
/// kernel caps it at `net.core.somaxconn`); `None` (the endpoint is disabled) binds nothing.
pub async fn bind(
    what: &'static str,
    addr: Option<SocketAddr>,
    backlog: u32,
) -> Result<Option<TcpListener>, BindError> {
    let Some(addr) = addr else {
        return Ok(None);
    };
    let listen = || {
        let socket = match addr {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        // As std's TcpListener::bind: a restarted server can bind while old connections linger.
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(backlog.max(1))
    };
    listen()
        .map(Some)
        .map_err(|source| BindError { what, addr, source })
}

/// How the HTTP, gRPC and metrics ports accept and serve connections: TLS, connection limits,
/// deadlines, HTTP/2 stream limits, the request budget and the accept backlog.
#[derive(Clone, Debug)]
pub struct PortsConfig {
    pub http: PortConfig,
    pub grpc: PortConfig,
    pub metrics: PortConfig,
    pub http_timeouts: HttpTimeouts,
    /// HTTP/2 streams one connection may have open at once (HTTP and gRPC ports).
    pub max_concurrent_streams: u32,
    /// Bytes of unfinished requests the process holds at most, all ports together.
    pub request_budget: RequestBudget,
    /// Accept backlog of every listening port.
    pub backlog: u32,
}

impl Default for PortsConfig {
    fn default() -> Self {
        PortsConfig {
            http: PortConfig::default(),
            grpc: PortConfig::default(),
            metrics: PortConfig {
                max_connections: DEFAULT_METRICS_MAX_CONNECTIONS,
                ..PortConfig::default()
            },
            http_timeouts: HttpTimeouts::default(),
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            request_budget: RequestBudget::default(),
            backlog: DEFAULT_LISTEN_BACKLOG,
        }
    }
}

impl PortsConfig {
    /// How the HTTP (and metrics) ports serve their connections.
    pub fn http_serving(&self) -> HttpServing {
        HttpServing {
            timeouts: self.http_timeouts,
            max_concurrent_streams: self.max_concurrent_streams,
            budget: self.request_budget.clone(),
        }
    }

    /// How a gRPC port whose messages may be `max_message_size` bytes serves its connections.
    pub fn grpc_serving(&self, max_message_size: usize) -> GrpcServing {
        GrpcServing {
            max_concurrent_streams: self.max_concurrent_streams,
            budget: self.request_budget.clone(),
            max_message_size,
        }
    }
}

/// Default of `--metrics-max-connections`: scrapers need one or two each.
pub const DEFAULT_METRICS_MAX_CONNECTIONS: usize = 64;

/// How a gRPC port serves its connections once accepted.
#[derive(Clone, Debug)]
pub struct GrpcServing {
    /// HTTP/2 streams one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Where message bytes are charged while they arrive.
    pub budget: RequestBudget,
    /// The largest message the port's services decode.
    pub max_message_size: usize,
}

/// The listeners of a server (`None`: that service is off) and how its frontends behave.
pub struct Frontends {
    pub http: Option<TcpListener>,
    pub grpc: Option<TcpListener>,
    /// `/metrics` (or whatever the caller routes), served as it is.
    pub metrics: Option<(TcpListener, axum::Router)>,
    pub http_config: HttpConfig,
    pub grpc_config: GrpcConfig,
    pub ports: PortsConfig,
}

/// Starts every configured frontend on `servers`; each stops gracefully once `stop` is true.
pub fn spawn(
    servers: &mut JoinSet<()>,
    service: Arc<dyn InferenceService>,
    frontends: Frontends,
    stop: &watch::Receiver<bool>,
) {
    let ports = frontends.ports;
    if let Some(listener) = frontends.http {
        let tls = ports.http.tls.is_some();
        tracing::info!(addr = ?listener.local_addr().ok(), tls, "HTTP service listening");
        let app = router(service.clone(), frontends.http_config);
        servers.spawn(serve_http_port(
            "HTTP",
            listener,
            app,
            ports.http.clone(),
            ports.http_serving(),
            stop.clone(),
        ));
    }
    if let Some(listener) = frontends.grpc {
        let serving = ports.grpc_serving(frontends.grpc_config.max_message_size);
        let grpc_routes = routes(service, frontends.grpc_config);
        let served = serve_grpc_port(
            "gRPC",
            listener,
            grpc_routes,
            ports.grpc.clone(),
            serving,
            stop.clone(),
        );
        servers.spawn(async move {
            let _ = served.await;
        });
    }
    if let Some((listener, app)) = frontends.metrics {
        servers.spawn(serve_metrics_port(
            "metrics",
            listener,
            app,
            &ports,
            stop.clone(),
        ));
    }
}

/// Serves a metrics router on `listener` like an HTTP port (connection limit, first-byte and
/// header deadlines from `ports.metrics` and `ports.http_timeouts`) until `stop` turns true.
pub fn serve_metrics_port(
    what: &'static str,
    listener: TcpListener,
    app: axum::Router,
    ports: &PortsConfig,
    stop: watch::Receiver<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    tracing::info!(addr = ?listener.local_addr().ok(), "{what} service listening");
    let serving = HttpServing {
        timeouts: HttpTimeouts {
            header_read: ports.http_timeouts.header_read,
            // A scrape carries no body.
            body_read: ports.http_timeouts.header_read,
        },
        ..ports.http_serving()
    };
    serve_http_port(what, listener, app, ports.metrics.clone(), serving, stop)
}

/// Serves tonic `routes` on `listener` (connection limit, TLS and first-byte deadline from
/// `port`; HTTP/2 stream limit, message budget and large windows from `serving`) until `stop`
/// turns true and open calls finish. `serve`, `worker`, `router` and `control-plane` serve
/// their gRPC ports through here. A failure is logged and returned.
pub async fn serve_grpc_port(
    what: &'static str,
    listener: TcpListener,
    routes: tonic::service::Routes,
    port: PortConfig,
    serving: GrpcServing,
    stop: watch::Receiver<bool>,
) -> Result<(), tonic::transport::Error> {
    let tls = port.tls.is_some();
    tracing::info!(addr = ?listener.local_addr().ok(), tls, "{what} service listening");
    let done = stopped(stop.clone());
    let incoming = incoming(what, listener, port, stop);
    // Large HTTP/2 windows: many concurrent streams share one client connection, and tensors
    // are often bigger than the 64 KiB defaults.
    let result = tonic::transport::Server::builder()
        .initial_connection_window_size(Some(16 * 1024 * 1024))
        .initial_stream_window_size(Some(4 * 1024 * 1024))
        .max_frame_size(Some(1024 * 1024))
        .max_concurrent_streams(serving.max_concurrent_streams)
        .layer(BufferMessagesLayer::new(
            serving.budget,
            serving.max_message_size,
        ))
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, done)
        .await;
    if let Err(e) = &result {
        tracing::error!(port = what, error = %e, "gRPC service failed");
    }
    result
}

/// `listener`'s connections (connection limit, NODELAY, TLS handshake when `port` has a
/// certificate) as the stream tonic's `Server::serve_with_incoming*` takes; ends with `stop`.
pub fn incoming(
    what: &'static str,
    listener: TcpListener,
    port: PortConfig,
    stop: watch::Receiver<bool>,
) -> impl tokio_stream::Stream<Item = Result<Conn, std::io::Error>> + Send + 'static {
    let conns = accept_task(what, listener, port, stop);
    tokio_stream::wrappers::ReceiverStream::new(conns).map(Ok::<_, std::io::Error>)
}

/// Serves `app` over HTTP/1.1 and HTTP/2 on `listener` (limits and TLS from `port`, read
/// deadlines, stream limit and budget from `serving`) until `stop` turns true and open requests
/// finish.
pub async fn serve_http_port(
    what: &'static str,
    listener: TcpListener,
    app: axum::Router,
    port: PortConfig,
    serving: HttpServing,
    stop: watch::Receiver<bool>,
) {
    let conns = accept_task(what, listener, port, stop.clone());
    serve_http(conns, app, serving, stop).await
}

/// Resolves once `stop` turns true (or its sender is gone).
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Raises this process's open-file limit to its hard limit (every connection is a file
/// descriptor, and the usual soft limit, 1024, is far below `--*-max-connections`), then
/// lowers the ports' connection limits where together they would not fit under it.
pub fn fit_ports_to_fd_limit(ports: &mut PortsConfig) {
    let limit = match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => limit,
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
            match rlimit::getrlimit(rlimit::Resource::NOFILE) {
                Ok((soft, _)) => soft,
                Err(_) => return,
            }
        }
    };
    tracing::debug!(limit, "open-file limit");
    let asked = [
        ports.http.max_connections,
        ports.grpc.max_connections,
        ports.metrics.max_connections,
    ];
    let fitted = fit_connections(asked, limit);
    if fitted != asked {
        tracing::warn!(
            open_file_limit = limit,
            "connection limits lowered to fit the open-file limit (ulimit -n), keeping {FD_RESERVE} descriptors for models and files: --http-max-connections {} -> {}, --grpc-max-connections {} -> {}, --metrics-max-connections {} -> {}; raise the limit to keep them",
            asked[0],
            fitted[0],
            asked[1],
            fitted[1],
            asked[2],
            fitted[2],
        );
    }
    ports.http.max_connections = fitted[0];
    ports.grpc.max_connections = fitted[1];
    ports.metrics.max_connections = fitted[2];
}

/// File descriptors kept out of the connection limits: model files, backends' libraries, Python
/// stubs' pipes and segments, outgoing connections, logs.
pub const FD_RESERVE: u64 = 256;

/// The HTTP, gRPC and metrics connection limits, scaled down together (each keeping at least
/// one connection) so that their sum stays `FD_RESERVE` below `fd_limit`; unchanged when they
/// fit.
pub fn fit_connections(asked: [usize; 3], fd_limit: u64) -> [usize; 3] {
    let room = fd_limit.saturating_sub(FD_RESERVE).max(3);
    let total: u64 = asked.iter().map(|&n| n as u64).sum();
    if total <= room {
        return asked;
    }
    asked.map(|n| ((n as u128 * room as u128 / total as u128) as usize).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_limits_that_fit_are_kept() {
        assert_eq!(
            fit_connections([10_000, 10_000, 64], 1 << 20),
            [10_000, 10_000, 64]
        );
    }

    #[test]
    fn connection_limits_shrink_together_under_a_low_fd_limit() {
        let fitted = fit_connections([10_000, 10_000, 64], 1024);
        let total: usize = fitted.iter().sum();
        assert!(total as u64 <= 1024 - FD_RESERVE, "{fitted:?}");
        assert!(fitted[0] > 300 && fitted[1] > 300, "{fitted:?}");
        assert!(fitted[2] >= 1, "{fitted:?}");
    }

    #[test]
    fn every_port_keeps_a_connection_even_with_almost_no_descriptors() {
        assert_eq!(fit_connections([5, 5, 5], 10), [1, 1, 1]);
    }
}
