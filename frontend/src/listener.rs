//! Accepting a port's connections: a bound on how many are open at once, TCP_NODELAY, and the
//! TLS handshake when the port has a certificate. Both the HTTP and the gRPC server take their
//! connections from here, so the two ports behave alike.
//!
//! ```text
//!  accept_task: permit (≤ max_connections open) ─► accept ─► NODELAY
//!      plain ─► Conn ───────────────────────────────┐
//!      TLS   ─► spawned handshake (≤ 10 s) ─► Conn ─┴─► channel ─► HTTP / gRPC server
//!  Conn dropped (connection closed) ─► its permit frees a slot
//! ```
//!
//! At the limit the task stops calling `accept`: new connections wait in the kernel's accept
//! backlog (and time out there, or are refused once it is full) until a slot frees.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Default of `--http-max-connections` and `--grpc-max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// How long a client gets to complete its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after an accept error that is not about one connection (out of file descriptors):
/// retrying at once would spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// How one port accepts connections.
#[derive(Clone, Debug)]
pub struct PortConfig {
    /// `Some`: the port speaks TLS only (the config may require client certificates).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Connections open at once; more wait in the accept backlog.
    pub max_connections: usize,
}

impl Default for PortConfig {
    fn default() -> Self {
        Self {
            tls: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// An accepted connection (after its TLS handshake, if any); holds its slot until dropped.
pub struct Conn {
    io: ConnIo,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    _slot: OwnedSemaphorePermit,
}

enum ConnIo {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Conn {
    pub fn remote_addr(&self) -> Option<SocketAddr> {
        self.remote
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.io {
            ConnIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.io {
            ConnIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.io {
            ConnIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match &self.io {
            ConnIo::Plain(s) => s.is_write_vectored(),
            ConnIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            ConnIo::Plain(s) => Pin::new(s).poll_flush(cx),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.io {
            ConnIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: self.local,
            remote_addr: self.remote,
        }
    }
}

/// Accepts `listener`'s connections until `stop` turns true; the returned channel yields them
/// ready to serve (the channel closes, and the port with it, when the task ends).
pub fn accept_task(
    what: &'static str,
    listener: TcpListener,
    port: PortConfig,
    mut stop: watch::Receiver<bool>,
) -> mpsc::Receiver<Conn> {
    let (tx, rx) = mpsc::channel(64);
    let slots = Arc::new(Semaphore::new(port.max_connections.max(1)));
    let acceptor = port.tls.map(TlsAcceptor::from);
    tokio::spawn(async move {
        loop {
            let slot = tokio::select! {
                slot = slots.clone().acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => break,
                },
                _ = stop.wait_for(|s| *s) => break,
            };
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = stop.wait_for(|s| *s) => break,
                // The server stopped taking connections.
                _ = tx.closed() => break,
            };
            let (tcp, remote) = match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    tracing::warn!(port = what, error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            };
            // Small responses go out at once instead of waiting on Nagle's algorithm.
            let _ = tcp.set_nodelay(true);
            let local = tcp.local_addr().ok();
            match &acceptor {
                None => {
                    let conn = Conn {
                        io: ConnIo::Plain(tcp),
                        local,
                        remote: Some(remote),
                        _slot: slot,
                    };
                    if tx.send(conn).await.is_err() {
                        break;
                    }
                }
                Some(acceptor) => {
                    let handshake = acceptor.accept(tcp);
                    let tx = tx.clone();
                    tokio::spawn(async move {
                        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
                            Ok(Ok(tls)) => {
                                let conn = Conn {
                                    io: ConnIo::Tls(Box::new(tls)),
                                    local,
                                    remote: Some(remote),
                                    _slot: slot,
                                };
                                let _ = tx.send(conn).await;
                            }
                            Ok(Err(e)) => {
                                tracing::debug!(port = what, %remote, error = %e, "TLS handshake failed")
                            }
                            Err(_) => {
                                tracing::debug!(port = what, %remote, "TLS handshake timed out")
                            }
                        }
                    });
                }
            }
        }
        tracing::debug!(port = what, "stopped accepting connections");
    });
    rx
}
