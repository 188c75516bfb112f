//! Running the frontends: the HTTP and gRPC services over one [`InferenceService`], plus a
//! metrics router, each on its own listener, all stopping together. `nereid serve`, `nereid
//! worker` (the data plane) and `nereid router` start their services through [`spawn`].
//!
//! ```text
//!  spawn(listeners, service, stop) ─► JoinSet: HTTP (axum, NODELAY) │ gRPC (tonic, large
//!                                              HTTP/2 windows)      │ metrics (axum)
//!  stop = true ─► each finishes its in-flight requests, then its task ends
//! ```

use std::net::SocketAddr;
use std::sync::Arc;

use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::grpc::{GrpcConfig, routes};
use crate::http::{HttpConfig, router};
use nereid_proto::InferenceService;

/// The listeners of a server (`None`: that service is off) and how its frontends behave.
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

pub struct Frontends {
    pub http: Option<TcpListener>,
    pub grpc: Option<TcpListener>,
    /// `/metrics` (or whatever the caller routes), served as it is.
    pub metrics: Option<(TcpListener, axum::Router)>,
    pub http_config: HttpConfig,
    pub grpc_config: GrpcConfig,
}

/// Starts every configured frontend on `servers`; each stops gracefully once `stop` is true.
pub fn spawn(
    servers: &mut JoinSet<()>,
    service: Arc<dyn InferenceService>,
    frontends: Frontends,
    stop: &watch::Receiver<bool>,
) {
    if let Some(listener) = frontends.http {
        tracing::info!(addr = ?listener.local_addr().ok(), "HTTP service listening");
        let app = router(service.clone(), frontends.http_config);
        // Small responses go out at once instead of waiting on Nagle's algorithm.
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let done = stopped(stop.clone());
        servers.spawn(async move {
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(done)
                .await
            {
                tracing::error!(error = %e, "HTTP service failed");
            }
        });
    }
    if let Some(listener) = frontends.grpc {
        tracing::info!(addr = ?listener.local_addr().ok(), "gRPC service listening");
        let grpc_routes = routes(service, frontends.grpc_config);
        let done = stopped(stop.clone());
        servers.spawn(async move {
            let incoming =
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
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

/// Resolves once `stop` turns true (or its sender is gone).
pub async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
