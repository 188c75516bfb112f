//! Running the frontends: the HTTP and gRPC services over one [`InferenceService`], plus a
//! metrics router, each on its own listener, all stopping together. `nereid serve`, `nereid
//! worker` (the data plane) and `nereid router` start their services through [`spawn`].
//!
//! ```text
//!  spawn(listeners, service, stop) ─► JoinSet: HTTP (hyper + axum) │ gRPC (tonic, large
//!                                              HTTP/2 windows)     │ metrics (axum)
//!  HTTP and gRPC take connections from listener::accept_task: connection limit, NODELAY, TLS
//!  stop = true ─► each finishes its in-flight requests, then its task ends
//! ```

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_stream::StreamExt;

use crate::grpc::{GrpcConfig, routes};
use crate::http::{HttpConfig, router};
use crate::listener::{Conn, PortConfig, accept_task};
use crate::listener_http::{HttpTimeouts, serve_http};
use nereid_proto::InferenceService;

/// A listener that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for {what} on {addr}: {source}")]
pub struct BindError {
    pub what: &'static str,
    pub addr: SocketAddr,
    pub source: std::io::Error,
}

/// Binds `addr` for the `what` endpoint; `None` (the endpoint is disabled) binds nothing.
pub async fn bind(
    what: &'static str,
    addr: Option<SocketAddr>,
) -> Result<Option<TcpListener>, BindError> {
    match addr {
        None => Ok(None),
        Some(addr) => TcpListener::bind(addr)
            .await
            .map(Some)
            .map_err(|source| BindError { what, addr, source }),
    }
}

/// How the HTTP and gRPC ports accept connections: TLS, connection limits, read deadlines.
#[derive(Clone, Debug, Default)]
pub struct PortsConfig {
    pub http: PortConfig,
    pub grpc: PortConfig,
    pub http_timeouts: HttpTimeouts,
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
    raise_fd_limit();
    if let Some(listener) = frontends.http {
        let tls = frontends.ports.http.tls.is_some();
        tracing::info!(addr = ?listener.local_addr().ok(), tls, "HTTP service listening");
        let app = router(service.clone(), frontends.http_config);
        servers.spawn(serve_http_port(
            "HTTP",
            listener,
            app,
            frontends.ports.http,
            frontends.ports.http_timeouts,
            stop.clone(),
        ));
    }
    if let Some(listener) = frontends.grpc {
        let tls = frontends.ports.grpc.tls.is_some();
        tracing::info!(addr = ?listener.local_addr().ok(), tls, "gRPC service listening");
        let grpc_routes = routes(service, frontends.grpc_config);
        let done = stopped(stop.clone());
        let incoming = incoming("gRPC", listener, frontends.ports.grpc, stop.clone());
        servers.spawn(async move {
            // Large HTTP/2 windows: many concurrent streams share one client connection, and
            // tensors are often bigger than the 64 KiB defaults.
            let result = tonic::transport::Server::builder()
                .initial_connection_window_size(Some(16 * 1024 * 1024))
                .initial_stream_window_size(Some(4 * 1024 * 1024))
                .max_frame_size(Some(1024 * 1024))
                .add_routes(grpc_routes)
                .serve_with_incoming_shutdown(incoming, done)
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "gRPC service failed");
            }
        });
    }
    if let Some((listener, app)) = frontends.metrics {
        tracing::info!(addr = ?listener.local_addr().ok(), "metrics service listening");
        let done = stopped(stop.clone());
        servers.spawn(async move {
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(done)
                .await
            {
                tracing::error!(error = %e, "metrics service failed");
            }
        });
    }
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
/// deadlines from `timeouts`) until `stop` turns true and open requests finish.
pub async fn serve_http_port(
    what: &'static str,
    listener: TcpListener,
    app: axum::Router,
    port: PortConfig,
    timeouts: HttpTimeouts,
    stop: watch::Receiver<bool>,
) {
    let conns = accept_task(what, listener, port, stop.clone());
    serve_http(conns, app, timeouts, stop).await
}

/// Resolves once `stop` turns true (or its sender is gone).
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Raises this process's open-file limit to its hard limit: every connection is a file
/// descriptor, and the usual soft limit (1024) is far below `--*-max-connections`.
fn raise_fd_limit() {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => tracing::debug!(limit, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
}
