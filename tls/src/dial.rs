//! Dialing a cluster peer: [`ClusterDial`] turns a tonic [`Endpoint`] into a channel that is
//! either plaintext (the default of a loopback cluster) or TLS with the cluster's identity.
//!
//! ```text
//!  ClusterDial::tls(ClientTlsFiles) ─► TlsDialer (tower Service<Uri>)
//!  dial.lazy(endpoint) / dial.connect(endpoint)
//!     plain ─► endpoint.connect_lazy() / connect()          (tonic's own HTTP connector)
//!     TLS   ─► endpoint.connect_with_connector[_lazy](dialer):
//!               TCP connect host:port (NODELAY) ─► TLS handshake, server name = the URI's host
//!               ─► TokioIo<TlsStream> for hyper's HTTP/2
//! ```
//!
//! The name verified is the host part of the peer's address as the caller has it (an IP
//! address or a DNS name), so every certificate must carry the addresses and names its peers
//! dial it by as subject alternative names. The endpoint keeps its connect timeout (tonic wraps
//! the dialer with it) and everything else it was configured with.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::transport::{Channel, Endpoint};

use crate::{ALPN_GRPC, ClientTlsFiles, TlsError, client_config};

/// A tower service that opens a TLS connection to the host and port of a URI.
#[derive(Clone)]
pub struct TlsDialer {
    connector: TlsConnector,
}

impl std::fmt::Debug for TlsDialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsDialer")
    }
}

impl TlsDialer {
    /// A dialer that wraps each connection in TLS with `config`.
    pub fn new(config: Arc<rustls::ClientConfig>) -> Self {
        Self {
            connector: TlsConnector::from(config),
        }
    }
}

/// The host of `uri` to dial (an IPv6 literal unbracketed) and its port (the scheme's default
/// when the URI has none): what a connector given a peer's URI connects to.
pub fn host_and_port(uri: &Uri) -> io::Result<(String, u16)> {
    let host = uri.host().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("address '{uri}' has no host"),
        )
    })?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    Ok((host, port))
}

/// The server name a certificate must carry for `uri` (its host), with [`host_and_port`].
fn target(uri: &Uri) -> io::Result<(ServerName<'static>, String, u16)> {
    let (host, port) = host_and_port(uri)?;
    let name = ServerName::try_from(host.clone()).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("'{host}' is not a valid TLS server name: {e}"),
        )
    })?;
    Ok((name, host, port))
}

impl tower::Service<Uri> for TlsDialer {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = self.connector.clone();
        Box::pin(async move {
            let (name, host, port) = target(&uri)?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(name, tcp).await.map_err(|e| {
                io::Error::new(e.kind(), format!("TLS handshake with {host}:{port}: {e}"))
            })?;
            Ok(TokioIo::new(tls))
        })
    }
}

/// How a cluster process dials its peers' gRPC ports: plaintext, or TLS that trusts only the
/// cluster CA and presents the process's own certificate.
#[derive(Clone, Debug, Default)]
pub struct ClusterDial {
    tls: Option<TlsDialer>,
}

impl ClusterDial {
    /// Plaintext (no cluster TLS configured).
    pub fn plain() -> Self {
        Self::default()
    }

    /// TLS with `files` (read and checked now: a bad file is a startup error naming its flag).
    pub fn tls(files: &ClientTlsFiles) -> Result<Self, TlsError> {
        Ok(Self {
            tls: Some(TlsDialer::new(client_config(files, ALPN_GRPC)?)),
        })
    }

    /// Whether connections are wrapped in TLS (false: plaintext).
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// The scheme of URIs built from a bare `host:port`: always `http`. Whether a connection
    /// is TLS is decided here (by the dialer), not by the URI; and tonic, whose own TLS is
    /// compiled in (the etcd client uses it), refuses an `https` URI on a channel it did not
    /// configure TLS for, even when the connector makes the TLS connection itself.
    pub fn scheme(&self) -> &'static str {
        "http"
    }

    /// A channel that connects on first use (and again after its connection breaks).
    pub fn lazy(&self, endpoint: &Endpoint) -> Channel {
        match &self.tls {
            None => endpoint.connect_lazy(),
            Some(dialer) => endpoint.connect_with_connector_lazy(dialer.clone()),
        }
    }

    /// A channel connected now.
    pub async fn connect(&self, endpoint: &Endpoint) -> Result<Channel, tonic::transport::Error> {
        match &self.tls {
            None => endpoint.connect().await,
            Some(dialer) => endpoint.connect_with_connector(dialer.clone()).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ca_signed;
    use crate::{PemFile, ServerTlsFiles, server_config};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tower::Service;

    #[test]
    fn the_server_name_is_the_host_of_the_address() {
        let (name, host, port) = target(&"https://127.0.0.1:7000".parse().unwrap()).unwrap();
        assert_eq!((host.as_str(), port), ("127.0.0.1", 7000));
        assert!(matches!(name, ServerName::IpAddress(_)));
        let (name, _, port) = target(&"https://cp-0.cp:7000".parse().unwrap()).unwrap();
        assert_eq!(port, 7000);
        assert_eq!(name.to_str(), "cp-0.cp");
        let (_, host, port) = target(&"https://[::1]".parse().unwrap()).unwrap();
        assert_eq!((host.as_str(), port), ("::1", 443));
    }

    /// A mutual-TLS echo server on a loopback port; returns its port.
    async fn echo_server(dir: &std::path::Path) -> u16 {
        let config = server_config(
            &ServerTlsFiles {
                cert: PemFile::new("--cluster-tls-cert", dir.join("server.pem")),
                key: PemFile::new("--cluster-tls-key", dir.join("server.key")),
                client_ca: Some(PemFile::new("--cluster-tls-ca", dir.join("ca.pem"))),
            },
            ALPN_GRPC,
        )
        .unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let acceptor = tokio_rustls::TlsAcceptor::from(config);
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut tls) = acceptor.accept(tcp).await {
                        let mut byte = [0u8; 1];
                        if tls.read_exact(&mut byte).await.is_ok() {
                            let _ = tls.write_all(&byte).await;
                            let _ = tls.flush().await;
                        }
                    }
                });
            }
        });
        port
    }

    fn client_files(dir: &std::path::Path, ca: &str, name: &str) -> ClientTlsFiles {
        ClientTlsFiles {
            ca: PemFile::new("--cluster-tls-ca", dir.join(format!("{ca}.pem"))),
            identity: Some((
                PemFile::new("--cluster-tls-cert", dir.join(format!("{name}.pem"))),
                PemFile::new("--cluster-tls-key", dir.join(format!("{name}.key"))),
            )),
        }
    }

    async fn echo(files: &ClientTlsFiles, port: u16) -> io::Result<u8> {
        let mut dialer = TlsDialer::new(client_config(files, ALPN_GRPC).unwrap());
        let uri: Uri = format!("https://127.0.0.1:{port}").parse().unwrap();
        let mut io = dialer.call(uri).await?.into_inner();
        io.write_all(&[7]).await?;
        io.flush().await?;
        let mut byte = [0u8; 1];
        io.read_exact(&mut byte).await?;
        Ok(byte[0])
    }

    #[tokio::test]
    async fn a_peer_with_a_cluster_certificate_is_served_and_others_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        ca_signed(dir.path(), "server", "ca");
        ca_signed(dir.path(), "client", "ca");
        ca_signed(dir.path(), "stranger", "other-ca");
        let port = echo_server(dir.path()).await;

        assert_eq!(
            echo(&client_files(dir.path(), "ca", "client"), port)
                .await
                .unwrap(),
            7
        );
        // A client certificate from another CA: the server refuses it.
        assert!(
            echo(&client_files(dir.path(), "ca", "stranger"), port)
                .await
                .is_err()
        );
        // A client that trusts another CA refuses the server.
        let err = echo(&client_files(dir.path(), "other-ca", "stranger"), port)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("TLS handshake with 127.0.0.1"), "{err}");
    }
}
