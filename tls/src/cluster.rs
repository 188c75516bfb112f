//! The one identity every cluster process is given (`--cluster-tls-cert/key/ca`), loaded once
//! into what the process needs: server configs that require client certificates signed by the
//! cluster CA (its gRPC port, its REST port) and the dialer for its peers.
//!
//! ```text
//!  ClusterTlsFiles {cert, key, ca} ─► ClusterTls::load
//!     grpc: ServerConfig (h2, mutual)   http: ServerConfig (h2 + http/1.1, mutual)
//!     dial: ClusterDial (trusts only ca, presents cert)
//! ```
//!
//! Certificate and key follow their files on both sides (see [`crate::ReloadingCertResolver`]);
//! the CA is read at start.

use std::sync::Arc;

use rustls::ServerConfig;

use crate::{
    ALPN_GRPC, ALPN_HTTP, ClientTlsFiles, ClusterDial, PemFile, ServerTlsFiles, TlsError,
    server_config,
};

/// The three files of a cluster identity, each with the flag that named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterTlsFiles {
    /// This process's certificate chain, presented both as a server and as a client.
    pub cert: PemFile,
    /// The private key of `cert`.
    pub key: PemFile,
    /// The cluster's CA: the only signer trusted for peers, in both directions.
    pub ca: PemFile,
}

impl ClusterTlsFiles {
    /// As a server: present `cert`, require client certificates signed by `ca`.
    pub fn server(&self) -> ServerTlsFiles {
        ServerTlsFiles {
            cert: self.cert.clone(),
            key: self.key.clone(),
            client_ca: Some(self.ca.clone()),
        }
    }

    /// As a client: trust only `ca`, present `cert`.
    pub fn client(&self) -> ClientTlsFiles {
        ClientTlsFiles {
            ca: self.ca.clone(),
            identity: Some((self.cert.clone(), self.key.clone())),
        }
    }
}

/// A cluster process's mutual-TLS set-up, every file read and checked.
#[derive(Clone)]
pub struct ClusterTls {
    /// The files it was built from (reloaded when they change).
    pub files: ClusterTlsFiles,
    /// For gRPC ports (ALPN h2).
    pub grpc: Arc<ServerConfig>,
    /// For HTTP ports (ALPN h2, http/1.1).
    pub http: Arc<ServerConfig>,
    /// How this process dials other cluster members (TLS with `files.client()`).
    pub dial: ClusterDial,
}

impl std::fmt::Debug for ClusterTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTls")
            .field("files", &self.files)
            .finish()
    }
}

impl ClusterTls {
    /// Reads every file now: a bad one is a startup error naming its flag and path.
    pub fn load(files: ClusterTlsFiles) -> Result<Self, TlsError> {
        Ok(Self {
            grpc: server_config(&files.server(), ALPN_GRPC)?,
            http: server_config(&files.server(), ALPN_HTTP)?,
            dial: ClusterDial::tls(&files.client())?,
            files,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::ca_signed;

    fn files(dir: &std::path::Path) -> ClusterTlsFiles {
        ClusterTlsFiles {
            cert: PemFile::new("--cluster-tls-cert", dir.join("node.pem")),
            key: PemFile::new("--cluster-tls-key", dir.join("node.key")),
            ca: PemFile::new("--cluster-tls-ca", dir.join("ca.pem")),
        }
    }

    #[test]
    fn one_identity_serves_both_protocols_and_dials_over_tls() {
        let dir = tempfile::tempdir().unwrap();
        ca_signed(dir.path(), "node", "ca");
        let tls = ClusterTls::load(files(dir.path())).unwrap();
        assert_eq!(tls.grpc.alpn_protocols, vec![b"h2".to_vec()]);
        assert_eq!(tls.http.alpn_protocols.len(), 2);
        assert!(tls.dial.is_tls());
        assert_eq!(tls.dial.scheme(), "http");
    }

    #[test]
    fn a_bad_ca_file_is_refused_naming_its_flag() {
        let dir = tempfile::tempdir().unwrap();
        ca_signed(dir.path(), "node", "ca");
        std::fs::write(dir.path().join("ca.pem"), "not a certificate").unwrap();
        let err = ClusterTls::load(files(dir.path())).unwrap_err().to_string();
        assert!(
            err.contains("--cluster-tls-ca") && err.contains("ca.pem"),
            "{err}"
        );
    }
}
