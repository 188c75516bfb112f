//! TLS for Nereid's listeners and its cluster's internal calls: PEM files named by flags
//! become `rustls` configs (ring provider), and a server's certificate follows its files on
//! disk without a restart.
//!
//! ```text
//!  ServerTlsFiles {cert, key, client_ca?} ─► server_config(alpn) ─► rustls::ServerConfig
//!      ReloadingCertResolver: on a handshake, at most once a second, stat cert+key; a newer
//!      mtime re-reads both (a bad pair keeps the old one and logs why)
//!  ClientTlsFiles {ca, cert?, key?}      ─► client_config(alpn) ─► rustls::ClientConfig
//!      (its certificate reloads the same way)
//!  ClusterDial::tls(ClientTlsFiles)       ─► tonic channels to cluster peers over TLS
//!  ClusterTls::load({cert, key, ca})      ─► both server configs (mutual) + the dialer
//! ```
//!
//! Every error names the flag and the file it came from, so a bad set-up stops the server
//! before any port is bound with a message that says what to fix.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod cluster;
mod config;
mod dial;
mod pem;
mod reload;
#[cfg(test)]
mod testing;

pub use cluster::{ClusterTls, ClusterTlsFiles};
pub use config::{ClientTlsFiles, ServerTlsFiles, client_config, server_config};
pub use dial::{ClusterDial, TlsDialer, host_and_port};
pub use pem::PemFile;
pub use reload::ReloadingCertResolver;
pub use rustls;
pub use tokio_rustls;

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{flag} '{path}': cannot read the file: {source}")]
    /// A file could not be read.
    Read {
        /// The flag that named the file.
        flag: &'static str,
        /// The path as given.
        path: String,
        /// The read error.
        source: std::io::Error,
    },
    #[error("{flag} '{path}': {what}")]
    /// A file was read but its contents are unusable (no PEM block, wrong kind, bad key).
    Invalid {
        /// The flag that named the file.
        flag: &'static str,
        /// The path as given.
        path: String,
        /// What is wrong with the contents.
        what: String,
    },
    #[error("{0}")]
    /// rustls refused the configuration itself (the message says which part).
    Config(String),
}

/// ALPN protocols of an HTTP port (HTTP/2 preferred, HTTP/1.1 for the rest).
pub const ALPN_HTTP: &[&[u8]] = &[b"h2", b"http/1.1"];
/// ALPN protocols of a gRPC port: HTTP/2 only.
pub const ALPN_GRPC: &[&[u8]] = &[b"h2"];
