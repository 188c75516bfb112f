//! Running the frontends: the HTTP and gRPC services over one [`InferenceService`], plus a
//! metrics router, each on its own listener, all stopping together. `nereid serve`, `nereid
//! worker` (the data plane) and `nereid router` start their services through [`spawn`].
//!
//! ```text
//!  spawn(listeners, service, stop) ─► JoinSet: HTTP (hyper + axum) │ gRPC (tonic, large
//!                                              HTTP/2 windows)     │ metrics (hyper + axum)
//!  every port takes connections from listener::accept_task: connection limit, NODELAY, TLS,
//!  first-byte deadline; HTTP/2 stream limit and request budget on HTTP and gRPC
//!  stop = true ─► each closes its listener first, then finishes its in-flight requests (HTTP/1.1
//!                 answers `Connection: close`, HTTP/2 and gRPC send GOAWAY), then its task ends
//! ```
//!
//! Bound with `SO_REUSEPORT` ([`bind_reusable`]), a replacement process listens on the same
//! ports beside this one; closing the listener before telling clients to go away sends their
//! reconnections to the replacement. Connections the kernel had queued on a listener that
//! closes, not yet accepted, are reset (unless `net.ipv4.tcp_migrate_req` moves them).
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

use crate::app::router;
use crate::budget::RequestBudget;
use crate::cork::Corked;
use crate::grpc::{GrpcConfig, routes};
use crate::grpc_buffer::{BufferMessagesLayer, HTTP_API_PREFIX};
use crate::http::HttpConfig;
use crate::keepalive::GrpcKeepalive;
use crate::listener::{Conn, DEFAULT_LISTEN_BACKLOG, PortConfig, accept_task};
use crate::listener_http::{DEFAULT_MAX_CONCURRENT_STREAMS, HttpServing, HttpTimeouts, serve_http};
use nereid_proto::InferenceService;

/// A listener that could not be bound.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen for {what} on {addr}: {source}")]
pub struct BindError {
    /// The service the listener was for (e.g. `HTTP`), for the message.
    pub what: &'static str,
    /// The address that could not be bound.
    pub addr: SocketAddr,
    /// The operating system's error.
    pub source: std::io::Error,
}

/// Binds `addr` for the `what` endpoint with an accept backlog of `backlog` connections (the
/// kernel caps it at `net.core.somaxconn`); `None` (the endpoint is disabled) binds nothing.
pub async fn bind(
    what: &'static str,
    addr: Option<SocketAddr>,
    backlog: u32,
) -> Result<Option<TcpListener>, BindError> {
    bind_reusable(what, addr, backlog, false).await
}

/// [`bind`], with `SO_REUSEPORT` when `reuse_port`: another process (a replacement) can bind
/// the same address while this one listens, and the kernel spreads new connections over both
/// listeners until one closes.
pub async fn bind_reusable(
    what: &'static str,
    addr: Option<SocketAddr>,
    backlog: u32,
    reuse_port: bool,
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
        if reuse_port {
            set_reuse_port(&socket)?;
        }
        socket.bind(addr)?;
        socket.listen(backlog.max(1))
    };
    listen()
        .map(Some)
        .map_err(|source| BindError { what, addr, source })
}

#[cfg(unix)]
fn set_reuse_port(socket: &TcpSocket) -> std::io::Result<()> {
    socket.set_reuseport(true)
}

#[cfg(not(unix))]
fn set_reuse_port(_: &TcpSocket) -> std::io::Result<()> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "SO_REUSEPORT (--reuse-port) needs a Unix system",
    ))
}

/// How the HTTP, gRPC and metrics ports accept and serve connections: TLS, connection limits,
/// deadlines, HTTP/2 stream limits, the request budget and the accept backlog.
#[derive(Clone, Debug)]
pub struct PortsConfig {
    /// The HTTP port's TLS, connection limit and accept settings.
    pub http: PortConfig,
    /// The gRPC port's TLS, connection limit and accept settings.
    pub grpc: PortConfig,
    /// The metrics port's TLS, connection limit and accept settings.
    pub metrics: PortConfig,
    /// Deadlines for the HTTP port's request heads, bodies and idle connections.
    pub http_timeouts: HttpTimeouts,
    /// HTTP/2 streams one connection may have open at once (HTTP and gRPC ports).
    pub max_concurrent_streams: u32,
    /// Bytes of unfinished requests the process holds at most, all ports together.
    pub request_budget: RequestBudget,
    /// Accept backlog of every listening port.
    pub backlog: u32,
    /// HTTP/2 keepalive pings and connection ages of the gRPC port.
    pub grpc_keepalive: GrpcKeepalive,
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
            grpc_keepalive: GrpcKeepalive::default(),
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
            keepalive: self.grpc_keepalive,
            max_concurrent_streams: self.max_concurrent_streams,
            budget: self.request_budget.clone(),
            max_message_size,
            http_api: None,
        }
    }
}

/// Default of `--metrics-max-connections`: scrapers need one or two each.
pub const DEFAULT_METRICS_MAX_CONNECTIONS: usize = 64;

/// How a gRPC port serves its connections once accepted.
#[derive(Clone, Debug)]
pub struct GrpcServing {
    /// Keepalive pings and connection ages.
    pub keepalive: GrpcKeepalive,
    /// HTTP/2 streams one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Where message bytes are charged while they arrive.
    pub budget: RequestBudget,
    /// The largest message the port's services decode.
    pub max_message_size: usize,
    /// The HTTP API served on this port too, for HTTP/2 requests whose path starts with
    /// `/v2/`: a worker under cluster TLS, so that the router forwards HTTP inference as bytes
    /// over the mutual-TLS connection its gRPC calls use.
    pub http_api: Option<axum::Router>,
}

/// The listeners of a server (`None`: that service is off) and how its frontends behave.
pub struct Frontends {
    /// The HTTP/REST (KServe v2) port's listener; `None`: no HTTP service.
    pub http: Option<TcpListener>,
    /// The gRPC (KServe v2) port's listener; `None`: no gRPC service.
    pub grpc: Option<TcpListener>,
    /// `/metrics` (or whatever the caller routes), served as it is.
    pub metrics: Option<(TcpListener, axum::Router)>,
    /// How the HTTP frontend behaves: size limits, compression, restricted APIs.
    pub http_config: HttpConfig,
    /// How the gRPC frontend behaves: message sizes, compression, restricted APIs.
    pub grpc_config: GrpcConfig,
    /// How all ports accept and serve connections.
    pub ports: PortsConfig,
    /// Serve the HTTP API on the gRPC port as well ([`GrpcServing::http_api`]).
    pub http_on_grpc_port: bool,
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
        let app = router(service.clone(), frontends.http_config.clone());
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
        let mut serving = ports.grpc_serving(frontends.grpc_config.max_message_size);
        if frontends.http_on_grpc_port {
            serving.http_api = Some(router(service.clone(), frontends.http_config));
        }
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
    // `stop` ends the accept task, which closes the listener; only then does `incoming` end,
    // after the connections it accepted, and tonic sends GOAWAY on every connection and waits
    // for their calls. In that order a client reconnecting on GOAWAY reaches another listener
    // on the port (--reuse-port), and no accepted connection is dropped unserved.
    let incoming =
        incoming(what, listener, port, stop).map(|conn| conn.map(Corked::for_this_runtime));
    let mut buffering = BufferMessagesLayer::new(serving.budget, serving.max_message_size);
    let routes = match serving.http_api {
        Some(http) => {
            buffering = buffering.serving_http_api();
            let path = format!("{HTTP_API_PREFIX}{{*rest}}");
            tonic::service::Routes::from(
                routes
                    .into_axum_router()
                    .route_service(&path, http.into_service()),
            )
        }
        None => routes,
    };
    // Large HTTP/2 windows: many concurrent streams share one client connection, and tensors
    // are often bigger than the 64 KiB defaults.
    let result = (serving.keepalive)
        .configure(tonic::transport::Server::builder())
        .initial_connection_window_size(Some(16 * 1024 * 1024))
        .initial_stream_window_size(Some(4 * 1024 * 1024))
        .max_frame_size(Some(1024 * 1024))
        .max_concurrent_streams(serving.max_concurrent_streams)
        .layer(buffering)
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, std::future::pending::<()>())
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
///
/// Once `stop` is true the listener closes first (new connections go to another listener on
/// the port, if one shares it with --reuse-port), then for `HTTP1_CLOSE_WINDOW` the port goes
/// on serving the connections it has, every HTTP/1.1 response saying `Connection: close`, so a
/// keep-alive client learns from a response that the connection ends instead of sending its
/// next request into a connection the server is closing. Then the rest shut down gracefully:
/// idle HTTP/1.1 connections close, HTTP/2 ones get GOAWAY, requests in flight finish.
pub async fn serve_http_port(
    what: &'static str,
    listener: TcpListener,
    app: axum::Router,
    port: PortConfig,
    serving: HttpServing,
    stop: watch::Receiver<bool>,
) {
    let accepted = accept_task(what, listener, port, stop.clone());
    let (conns, serve_stop) = close_window(accepted, HTTP1_CLOSE_WINDOW);
    let app = app.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            let stop = stop.clone();
            async move {
                let http1 = request.version() < http::Version::HTTP_2;
                let mut response = next.run(request).await;
                if http1 && *stop.borrow() {
                    response.headers_mut().insert(
                        http::header::CONNECTION,
                        http::HeaderValue::from_static("close"),
                    );
                }
                response
            }
        },
    ));
    serve_http(conns, app, serving, serve_stop).await
}

/// How long an HTTP port, once stopped and no longer accepting, goes on serving its open
/// connections (answering `Connection: close`) before it closes the idle ones: long enough for a
/// busy keep-alive connection to get one more response, short enough not to hold up an exit.
pub const HTTP1_CLOSE_WINDOW: std::time::Duration = std::time::Duration::from_millis(500);

/// Passes on `accepted`'s connections; once they end (the accept task stopped and closed its
/// listener), waits `window` if any connection was accepted, then closes the returned channel
/// and turns the returned stop true, in that order.
fn close_window(
    mut accepted: tokio::sync::mpsc::Receiver<Conn>,
    window: std::time::Duration,
) -> (tokio::sync::mpsc::Receiver<Conn>, watch::Receiver<bool>) {
    let (tx, conns) = tokio::sync::mpsc::channel(1);
    let (stop_tx, stop) = watch::channel(false);
    tokio::spawn(async move {
        let mut any = false;
        while let Some(conn) = accepted.recv().await {
            any = true;
            if tx.send(conn).await.is_err() {
                return;
            }
        }
        if any {
            tokio::time::sleep(window).await;
        }
        drop(tx);
        let _ = stop_tx.send(true);
    });
    (conns, stop)
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn with_reuse_port_a_second_process_can_listen_on_the_same_port() {
        let any = Some("127.0.0.1:0".parse().unwrap());
        let first = bind_reusable("HTTP", any, 16, true).await.unwrap().unwrap();
        let addr = Some(first.local_addr().unwrap());
        let second = bind_reusable("HTTP", addr, 16, true).await.unwrap();
        assert!(second.is_some());
        let refused = bind("HTTP", addr, 16).await.unwrap_err();
        assert_eq!(refused.source.kind(), std::io::ErrorKind::AddrInUse);
    }

    /// Reads one response (no body) from `conn`, returning its head in lower case.
    async fn response_head(conn: &mut tokio::net::TcpStream) -> String {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(conn.read(&mut byte).await.unwrap(), 1, "{head:?}");
            head.push(byte[0]);
        }
        String::from_utf8(head).unwrap().to_lowercase()
    }

    #[tokio::test]
    async fn a_stopped_http_port_closes_its_listener_and_answers_connection_close() {
        let listener = bind("HTTP", Some("127.0.0.1:0".parse().unwrap()), 16)
            .await
            .unwrap()
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "" }));
        let ports = PortsConfig::default();
        let (stop_tx, stop) = watch::channel(false);
        let served = tokio::spawn(serve_http_port(
            "HTTP",
            listener,
            app,
            ports.http.clone(),
            ports.http_serving(),
            stop,
        ));
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n";
        conn.write_all(request).await.unwrap();
        let head = response_head(&mut conn).await;
        assert!(!head.contains("connection: close"), "{head}");

        stop_tx.send(true).unwrap();
        // The open connection is still served, and told to close.
        conn.write_all(request).await.unwrap();
        let head = response_head(&mut conn).await;
        assert!(head.starts_with("http/1.1 200"), "{head}");
        assert!(head.contains("connection: close"), "{head}");
        assert_eq!(conn.read(&mut [0u8; 1]).await.unwrap(), 0, "then closed");
        // The listener is gone: a new connection is refused.
        let refused = tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while tokio::net::TcpStream::connect(addr).await.is_ok() {
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(refused.is_ok(), "the stopped port still accepts");
        tokio::time::timeout(std::time::Duration::from_secs(5), served)
            .await
            .expect("the port ends after its close window")
            .unwrap();
    }

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
