//! TLS to etcd (`https://` endpoints): the CA bundle etcd's server certificate must chain to
//! (`--etcd-ca`) and, for an etcd started with `--client-cert-auth`, a client certificate
//! (`--etcd-cert`/`--etcd-key`). The handshake runs on tonic's rustls with ring, the same
//! provider the `tls/` crate uses for the cluster's own TLS.
//!
//! tonic keeps the reason a connection failed (an unknown issuer, a certificate that does not
//! name the host, a client certificate etcd refused) in the error's source chain, not in its
//! message; [`describe`] walks the chain so every log line and start-up error names the cause,
//! with a hint at the flag that fixes it. With TLS 1.3 the server judges the client
//! certificate after the handshake, so a refused one reaches the gRPC client only as a closed
//! connection; [`explain`] then opens one TLS connection itself, reads etcd's alert and adds it.

use std::error::Error as StdError;
use std::fmt;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use nereid_tls::rustls::pki_types::pem::PemObject;
use nereid_tls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use nereid_tls::rustls::{self, ClientConfig, RootCertStore};
use nereid_tls::tokio_rustls::TlsConnector;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bound on [`EtcdTls::probe`].
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// The HTTP/2 client preface and an empty SETTINGS frame: what a gRPC client sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// The PEM files of `--etcd-ca`, `--etcd-cert` and `--etcd-key`, read (and checked) at start-up.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA certificates (PEM) etcd's server certificate is verified against; only these
    /// are trusted (not the system's roots).
    pub ca_pem: Vec<u8>,
    /// The client certificate chain and its private key (both PEM), for etcd's
    /// `--client-cert-auth`.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl fmt::Debug for EtcdTls {
    /// The private key never reaches a log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_pem_bytes", &self.ca_pem.len())
            .field("client_certificate", &self.identity.is_some())
            .finish()
    }
}

impl EtcdTls {
    /// `options` with this TLS set-up; every endpoint must be `https://` (etcd-client refuses
    /// TLS options with an `http://` one).
    pub(super) fn apply(&self, options: ConnectOptions) -> ConnectOptions {
        let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            tls = tls.identity(Identity::from_pem(cert, key));
        }
        options.with_tls(tls)
    }

    /// The same TLS set-up as a rustls config, for [`EtcdTls::probe`].
    fn rustls_config(&self) -> Result<ClientConfig, String> {
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(&self.ca_pem) {
            let cert = cert.map_err(|e| format!("--etcd-ca: {e}"))?;
            roots.add(cert).map_err(|e| format!("--etcd-ca: {e}"))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
        let mut config = match &self.identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = CertificateDer::pem_slice_iter(cert)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| format!("--etcd-cert: {e}"))?;
                let key =
                    PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("--etcd-key: {e}"))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|e| format!("--etcd-cert/--etcd-key: {e}"))?
            }
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }

    /// Opens one TLS connection to `endpoint` (`https://HOST:PORT`), sends the HTTP/2 preface
    /// and reads etcd's first answer; the error, if any (`None`: the connection works, or the
    /// endpoint is no URL this can dial).
    async fn probe(&self, endpoint: &str) -> Option<String> {
        let authority = endpoint.strip_prefix("https://")?;
        let (host, _) = authority.rsplit_once(':')?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(host.to_string()).ok()?;
        let config = match self.rustls_config() {
            Ok(config) => config,
            Err(e) => return Some(e),
        };
        let attempt = async {
            let tcp = tokio::net::TcpStream::connect(authority)
                .await
                .map_err(|e| e.to_string())?;
            let mut tls = TlsConnector::from(Arc::new(config))
                .connect(name, tcp)
                .await
                .map_err(|e| e.to_string())?;
            let mut written = 0;
            while written < H2_PREFACE.len() {
                let rest = &H2_PREFACE[written..];
                written += poll_fn(|cx| Pin::new(&mut tls).poll_write(cx, rest))
                    .await
                    .map_err(|e| e.to_string())?;
            }
            poll_fn(|cx| Pin::new(&mut tls).poll_flush(cx))
                .await
                .map_err(|e| e.to_string())?;
            let mut buf = [0u8; 256];
            let mut read = ReadBuf::new(&mut buf);
            poll_fn(|cx| Pin::new(&mut tls).poll_read(cx, &mut read))
                .await
                .map_err(|e| e.to_string())
        };
        match tokio::time::timeout(PROBE_TIMEOUT, attempt).await {
            Ok(Err(e)) => Some(e),
            Ok(Ok(())) | Err(_) => None,
        }
    }
}

/// `message` (an etcd request's failure), with the TLS cause each endpoint's own handshake
/// reports when the message names none: TLS 1.3 delivers a refused client certificate as an
/// alert after the handshake, which the gRPC client sees only as a closed connection.
pub(super) async fn explain(
    tls: Option<&EtcdTls>,
    endpoints: &[String],
    message: String,
) -> String {
    let Some(tls) = tls else {
        return message;
    };
    if hint(&message).is_some() {
        return message;
    }
    let mut message = message;
    for endpoint in endpoints {
        if let Some(cause) = tls.probe(endpoint).await {
            message.push_str(&format!("; a TLS connection to {endpoint}: {cause}"));
            if let Some(hint) = hint(&cause) {
                message.push_str(&format!(" ({hint})"));
            }
        }
    }
    message
}

/// An etcd client error with every cause in its source chain, and a hint for the TLS causes
/// an operator can act on.
pub(super) fn describe(e: &etcd_client::Error) -> String {
    let mut message = e.to_string();
    let mut source: Option<&(dyn StdError + 'static)> = match e {
        etcd_client::Error::TransportError(e) => e.source(),
        etcd_client::Error::GRpcStatus(status) => status.source(),
        _ => None,
    };
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    if let Some(hint) = hint(&message) {
        message.push_str(" (");
        message.push_str(hint);
        message.push(')');
    }
    message
}

/// What to do about a TLS failure, judged from rustls's wording of it.
fn hint(message: &str) -> Option<&'static str> {
    if message.contains("UnknownIssuer") || message.contains("BadSignature") {
        Some("etcd's server certificate is not signed by a CA in --etcd-ca")
    } else if message.contains("NotValidForName") {
        Some(
            "etcd's server certificate does not name the endpoint's host: use a host name or \
             address its subjectAltName lists",
        )
    } else if message.contains("Expired") || message.contains("NotValidYet") {
        Some("etcd's server certificate is outside its validity period")
    } else if message.contains("CertificateRequired")
        || message.contains("BadCertificate")
        || message.contains("UnknownCA")
    {
        Some(
            "etcd refused the client certificate: it runs with --client-cert-auth and needs \
             --etcd-cert/--etcd-key signed by its --trusted-ca-file",
        )
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hints_name_the_flag_that_fixes_each_tls_failure() {
        let hinted = |m: &str| hint(m).unwrap_or_default();
        assert!(hinted("invalid peer certificate: UnknownIssuer").contains("--etcd-ca"));
        assert!(hinted("invalid peer certificate: NotValidForName").contains("subjectAltName"));
        assert!(hinted("received fatal alert: CertificateRequired").contains("--etcd-cert"));
        assert!(hinted("received fatal alert: BadCertificate").contains("--etcd-key"));
        assert_eq!(hint("connection refused"), None);
    }

    #[test]
    fn the_private_key_stays_out_of_debug_output() {
        let tls = EtcdTls {
            ca_pem: b"ca".to_vec(),
            identity: Some((b"cert".to_vec(), b"SECRET KEY".to_vec())),
        };
        let shown = format!("{tls:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("client_certificate: true"), "{shown}");
    }
}
