//! Server and client configs from PEM files: a server presents a reloading certificate and,
//! with a client CA, requires and verifies client certificates (mutual TLS); a client trusts
//! only the given CA and presents its own certificate when it has one. Certificates and keys are
//! re-read when their files change; CA files are read once, at start.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, ServerConfig};

use crate::reload::{CHECK_INTERVAL, ReloadingCertResolver};
use crate::{PemFile, TlsError};

/// A TLS server's files: its certificate chain and key, and for mutual TLS the CA that client
/// certificates must be signed by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// The certificate chain the server presents.
    pub cert: PemFile,
    /// The private key of `cert`.
    pub key: PemFile,
    /// `Some`: every client must present a certificate signed by this CA.
    pub client_ca: Option<PemFile>,
}

/// A TLS client's files: the CA its servers' certificates are signed by, and its own
/// certificate and key when the servers require one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// The CA the servers' certificates must be signed by (the only root trusted).
    pub ca: PemFile,
    /// The client's certificate chain and key, presented when a server asks for one.
    pub identity: Option<(PemFile, PemFile)>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads and checks every file now (a startup error names the flag and file) and returns a
/// server config whose certificate follows its files (checked at most once a second).
pub fn server_config(
    files: &ServerTlsFiles,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = provider();
    let resolver = ReloadingCertResolver::new(
        files.cert.clone(),
        files.key.clone(),
        provider.clone(),
        CHECK_INTERVAL,
    )?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(format!("TLS protocol versions: {e}")))?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let roots = ca.root_store()?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| TlsError::Invalid {
                    flag: ca.flag,
                    path: ca.path.display().to_string(),
                    what: format!("cannot verify client certificates with it: {e}"),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Reads and checks every file now and returns a client config that trusts only `files.ca`;
/// its own certificate, when it has one, follows its files like a server's.
pub fn client_config(
    files: &ClientTlsFiles,
    alpn: &[&[u8]],
) -> Result<Arc<ClientConfig>, TlsError> {
    let roots = files.ca.root_store()?;
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(format!("TLS protocol versions: {e}")))?
        .with_root_certificates(roots);
    let mut config = match &files.identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder.with_client_cert_resolver(Arc::new(
            ReloadingCertResolver::new(cert.clone(), key.clone(), provider(), CHECK_INTERVAL)?,
        )),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ca_signed;

    fn files(dir: &std::path::Path, mutual: bool) -> ServerTlsFiles {
        ServerTlsFiles {
            cert: PemFile::new("--grpc-server-cert", dir.join("server.pem")),
            key: PemFile::new("--grpc-server-key", dir.join("server.key")),
            client_ca: mutual.then(|| PemFile::new("--grpc-root-cert", dir.join("ca.pem"))),
        }
    }

    #[test]
    fn missing_and_invalid_files_name_the_flag_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = server_config(&files(dir.path(), false), crate::ALPN_GRPC)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--grpc-server-cert")
                && err.contains("server.pem")
                && err.contains("cannot read"),
            "{err}"
        );

        ca_signed(dir.path(), "server", "ca");
        std::fs::write(dir.path().join("server.key"), "not a key").unwrap();
        let err = server_config(&files(dir.path(), false), crate::ALPN_GRPC)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--grpc-server-key") && err.contains("no usable PEM private key"),
            "{err}"
        );

        ca_signed(dir.path(), "server", "ca");
        std::fs::write(dir.path().join("ca.pem"), "-----BEGIN NOTHING-----\n").unwrap();
        let err = server_config(&files(dir.path(), true), crate::ALPN_GRPC)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--grpc-root-cert") && err.contains("ca.pem"),
            "{err}"
        );
    }

    #[test]
    fn good_files_build_server_and_client_configs() {
        let dir = tempfile::tempdir().unwrap();
        ca_signed(dir.path(), "server", "ca");
        ca_signed(dir.path(), "client", "ca");
        let server = server_config(&files(dir.path(), true), crate::ALPN_HTTP).unwrap();
        assert_eq!(
            server.alpn_protocols,
            vec![b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        let client = ClientTlsFiles {
            ca: PemFile::new("--tls-ca", dir.path().join("ca.pem")),
            identity: Some((
                PemFile::new("--tls-cert", dir.path().join("client.pem")),
                PemFile::new("--tls-key", dir.path().join("client.key")),
            )),
        };
        let config = client_config(&client, crate::ALPN_GRPC).unwrap();
        assert!(config.client_auth_cert_resolver.has_certs());
    }
}
