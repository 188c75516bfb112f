//! Accepting a port's connections: a bound on how many are open at once, TCP_NODELAY, the
//! TLS handshake when the port has a certificate, and a deadline for the first byte. The HTTP,
//! gRPC and metrics servers take their connections from here, so every port behaves alike.
//!
//! ```text
//!  accept_task: permit (≤ max_connections open) ─► accept ─► NODELAY
//!      plain ─► Conn ───────────────────────────────┐
//!      TLS   ─► spawned handshake (≤ 10 s) ─► Conn ─┴─► channel ─► HTTP / gRPC server
//!  Conn read: no byte within first_byte_timeout ─► TimedOut error, the server closes it
//!  Conn dropped (connection closed) ─► its permit frees a slot
//! ```
//!
//! The first-byte deadline matters because hyper's protocol detection (HTTP/1 or HTTP/2) and
//! HTTP/2's preface read have no timeout of their own: a connection that never sends a byte
//! would hold its slot forever, and a few of them lock every client out of a port.
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
use tokio::time::Sleep;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Default of `--http-max-connections` and `--grpc-max-connections`.
pub const DEFAULT_MAX_CONNECTIONS: usize = 10_000;
/// How long a client gets to complete its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `--preface-timeout-secs`.
pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default of `--listen-backlog`.
pub const DEFAULT_LISTEN_BACKLOG: u32 = 1024;
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
    /// How long a new connection may stay silent (after its TLS handshake) before its first
    /// byte; then it is closed.
    pub first_byte_timeout: Duration,
}

impl Default for PortConfig {
    fn default() -> Self {
        Self {
            tls: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            first_byte_timeout: DEFAULT_FIRST_BYTE_TIMEOUT,
        }
    }
}

/// An accepted connection (after its TLS handshake, if any); holds its slot until dropped.
pub struct Conn {
    io: ConnIo,
    local: Option<SocketAddr>,
    remote: Option<SocketAddr>,
    /// Until the first byte arrives: when the connection is closed for silence.
    first_byte: Option<Pin<Box<Sleep>>>,
    _slot: OwnedSemaphorePermit,
}

enum ConnIo {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl Conn {
    fn new(
        io: ConnIo,
        local: Option<SocketAddr>,
        remote: SocketAddr,
        first_byte_timeout: Duration,
        slot: OwnedSemaphorePermit,
    ) -> Conn {
        Conn {
            io,
            local,
            remote: Some(remote),
            first_byte: Some(Box::pin(tokio::time::sleep(first_byte_timeout))),
            _slot: slot,
        }
    }

    /// The peer's address, when the connection came over TCP.
    pub fn remote_addr(&self) -> Option<SocketAddr> {
        self.remote
    }
}

/// A connection closed because it sent nothing in time.
fn silent() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "connection sent no bytes within --preface-timeout-secs",
    )
}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        let polled = match &mut this.io {
            ConnIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        };
        if let Some(deadline) = &mut this.first_byte {
            match &polled {
                Poll::Ready(Ok(())) if buf.filled().len() > before => this.first_byte = None,
                Poll::Ready(_) => {}
                Poll::Pending => {
                    if deadline.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Err(silent()));
                    }
                }
            }
        }
        polled
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
    let first_byte = port.first_byte_timeout;
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
                    let conn = Conn::new(ConnIo::Plain(tcp), local, remote, first_byte, slot);
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
                                let io = ConnIo::Tls(Box::new(tls));
                                let conn = Conn::new(io, local, remote, first_byte, slot);
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

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn port(first_byte_timeout: Duration) -> (SocketAddr, mpsc::Receiver<Conn>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let config = PortConfig {
            first_byte_timeout,
            ..PortConfig::default()
        };
        // The sender is leaked: the task runs as long as the test's runtime.
        let (stop_tx, stop) = watch::channel(false);
        std::mem::forget(stop_tx);
        (addr, accept_task("test", listener, config, stop))
    }

    #[tokio::test]
    async fn a_silent_connection_is_cut_at_the_first_byte_deadline() {
        let (addr, mut conns) = port(Duration::from_millis(100)).await;
        let _client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut conn = conns.recv().await.unwrap();
        let mut buf = [0u8; 8];
        let read = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
            .await
            .expect("the deadline fires long before 10 s");
        let err = read.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("--preface-timeout-secs"), "{err}");
    }

    #[tokio::test]
    async fn once_a_byte_arrived_the_deadline_is_gone() {
        let (addr, mut conns) = port(Duration::from_millis(50)).await;
        let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut conn = conns.recv().await.unwrap();
        client.write_all(b"x").await.unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(conn.read(&mut buf).await.unwrap(), 1);
        // Silent again, well past the deadline: the read just waits.
        let waited = tokio::time::timeout(Duration::from_millis(300), conn.read(&mut buf)).await;
        assert!(
            waited.is_err(),
            "a connection that spoke once is not cut: {waited:?}"
        );
        client.write_all(b"yz").await.unwrap();
        assert_eq!(conn.read(&mut buf).await.unwrap(), 2);
    }
}
