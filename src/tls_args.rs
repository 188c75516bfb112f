//! TLS and connection flags of the KServe v2 ports, shared by `serve`, `worker` and `router`:
//! Triton's `--grpc-use-ssl*` flags, the same set for HTTPS (`--http-use-ssl*`, Nereid's
//! extension), connection limits and HTTP read deadlines. The PEM files are read and checked
//! here, before any port is bound.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use nereid_frontend::{HttpTimeouts, PortConfig, PortsConfig, RequestBudget};
use nereid_tls::{ALPN_GRPC, ALPN_HTTP, PemFile, ServerTlsFiles};

use crate::common_args::{FrontendArgs, parse_bool};

#[derive(Args, Debug)]
pub struct PortTlsArgs {
    /// Serve gRPC over TLS only (needs --grpc-server-cert and --grpc-server-key).
    #[arg(long, env = "NEREID_GRPC_USE_SSL", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub grpc_use_ssl: bool,
    /// Serve gRPC over mutual TLS: clients must present a certificate signed by
    /// --grpc-root-cert (implies --grpc-use-ssl).
    #[arg(long, env = "NEREID_GRPC_USE_SSL_MUTUAL", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub grpc_use_ssl_mutual: bool,
    /// PEM certificate chain of the gRPC port (re-read when the file changes).
    #[arg(long, env = "NEREID_GRPC_SERVER_CERT")]
    pub grpc_server_cert: Option<PathBuf>,
    /// PEM private key of the gRPC port's certificate (re-read when the file changes).
    #[arg(long, env = "NEREID_GRPC_SERVER_KEY")]
    pub grpc_server_key: Option<PathBuf>,
    /// PEM CA certificates that client certificates must be signed by (mutual TLS).
    #[arg(long, env = "NEREID_GRPC_ROOT_CERT")]
    pub grpc_root_cert: Option<PathBuf>,
    /// Serve HTTP over TLS only (HTTPS; needs --http-server-cert and --http-server-key).
    #[arg(long, env = "NEREID_HTTP_USE_SSL", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub http_use_ssl: bool,
    /// Serve HTTP over mutual TLS: clients must present a certificate signed by
    /// --http-root-cert (implies --http-use-ssl).
    #[arg(long, env = "NEREID_HTTP_USE_SSL_MUTUAL", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub http_use_ssl_mutual: bool,
    /// PEM certificate chain of the HTTP port (re-read when the file changes).
    #[arg(long, env = "NEREID_HTTP_SERVER_CERT")]
    pub http_server_cert: Option<PathBuf>,
    /// PEM private key of the HTTP port's certificate (re-read when the file changes).
    #[arg(long, env = "NEREID_HTTP_SERVER_KEY")]
    pub http_server_key: Option<PathBuf>,
    /// PEM CA certificates that client certificates must be signed by (mutual TLS).
    #[arg(long, env = "NEREID_HTTP_ROOT_CERT")]
    pub http_root_cert: Option<PathBuf>,
    /// Connections open at once on the HTTP port; further ones wait in the kernel's accept
    /// backlog until one closes. Each takes a file descriptor and a little memory.
    #[arg(long, env = "NEREID_HTTP_MAX_CONNECTIONS", default_value_t = nereid_frontend::DEFAULT_MAX_CONNECTIONS)]
    pub http_max_connections: usize,
    /// Connections open at once on the gRPC port; further ones wait in the accept backlog.
    #[arg(long, env = "NEREID_GRPC_MAX_CONNECTIONS", default_value_t = nereid_frontend::DEFAULT_MAX_CONNECTIONS)]
    pub grpc_max_connections: usize,
    /// Seconds an HTTP/1 client has to send a complete request head (after connecting or after
    /// the previous response); then the connection is closed.
    #[arg(long, env = "NEREID_HTTP_HEADER_READ_TIMEOUT_SECS", default_value_t = nereid_frontend::DEFAULT_HEADER_READ_TIMEOUT.as_secs())]
    pub http_header_read_timeout_secs: u64,
    /// Seconds an HTTP client has to send a request's whole body after its head; a slower
    /// request fails with 400 and its connection closes. Raise it for huge tensors on slow links.
    #[arg(long, env = "NEREID_HTTP_BODY_READ_TIMEOUT_SECS", default_value_t = nereid_frontend::DEFAULT_BODY_READ_TIMEOUT.as_secs())]
    pub http_body_read_timeout_secs: u64,
    /// Connections open at once on the metrics port (a Prometheus server needs one or two).
    #[arg(long, env = "NEREID_METRICS_MAX_CONNECTIONS", default_value_t = nereid_frontend::DEFAULT_METRICS_MAX_CONNECTIONS)]
    pub metrics_max_connections: usize,
    /// Seconds a new connection (HTTP, gRPC or metrics port, after any TLS handshake) may stay
    /// silent before its first byte; then it is closed, so connections that never send
    /// anything cannot hold the connection slots.
    #[arg(long, env = "NEREID_PREFACE_TIMEOUT_SECS", default_value_t = nereid_frontend::DEFAULT_FIRST_BYTE_TIMEOUT.as_secs())]
    pub preface_timeout_secs: u64,
    /// HTTP/2 streams (concurrent requests) one connection may have open on the HTTP and gRPC
    /// ports; a client opening more waits (gRPC clients queue the calls). Raise it only for
    /// clients that multiplex more calls than this over one connection.
    #[arg(long, env = "NEREID_MAX_CONCURRENT_STREAMS", default_value_t = nereid_frontend::DEFAULT_MAX_CONCURRENT_STREAMS)]
    pub max_concurrent_streams: u32,
    /// Bytes of requests still arriving that the process holds at most, every connection of
    /// every port together: HTTP bodies and gRPC messages take memory only as their bytes come,
    /// and a request that would go past this fails with 503 / RESOURCE_EXHAUSTED naming the flag.
    /// Must be at least --http-max-input-size and --grpc-max-message-size.
    #[arg(long, env = "NEREID_MAX_BUFFERED_REQUEST_BYTES", default_value_t = nereid_frontend::DEFAULT_MAX_BUFFERED_REQUEST_BYTES)]
    pub max_buffered_request_bytes: usize,
    /// Accept backlog of every listening port: connections the kernel queues while the server
    /// is at its connection limit or busy (capped by net.core.somaxconn).
    #[arg(long, env = "NEREID_LISTEN_BACKLOG", default_value_t = nereid_frontend::DEFAULT_LISTEN_BACKLOG)]
    pub listen_backlog: u32,
    #[command(flatten)]
    pub grpc_keepalive: crate::grpc_keepalive_args::GrpcKeepaliveArgs,
}

/// One port's TLS flags, named for messages.
struct PortFlags<'a> {
    port: &'static str,
    use_ssl: bool,
    mutual: bool,
    cert: &'a Option<PathBuf>,
    key: &'a Option<PathBuf>,
    root: &'a Option<PathBuf>,
    alpn: &'static [&'static [u8]],
}

impl PortTlsArgs {
    /// Checks the flags (the request budget against `frontend`'s largest request), reads the
    /// PEM files and returns how the ports accept connections.
    pub fn ports(&self, frontend: &FrontendArgs) -> Result<PortsConfig, String> {
        let at_least_one = [
            ("--http-max-connections", self.http_max_connections as u64),
            ("--grpc-max-connections", self.grpc_max_connections as u64),
            (
                "--metrics-max-connections",
                self.metrics_max_connections as u64,
            ),
            (
                "--http-header-read-timeout-secs",
                self.http_header_read_timeout_secs,
            ),
            (
                "--http-body-read-timeout-secs",
                self.http_body_read_timeout_secs,
            ),
            ("--preface-timeout-secs", self.preface_timeout_secs),
            (
                "--max-concurrent-streams",
                u64::from(self.max_concurrent_streams),
            ),
            ("--listen-backlog", u64::from(self.listen_backlog)),
        ];
        if let Some((flag, _)) = at_least_one.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{flag} must be at least 1"));
        }
        let largest = [
            ("--http-max-input-size", frontend.http_max_input_size),
            ("--grpc-max-message-size", frontend.grpc_max_message_size),
        ];
        for (flag, size) in largest {
            if self.max_buffered_request_bytes < size {
                return Err(format!(
                    "--max-buffered-request-bytes ({}) is smaller than {flag} ({size}): a request of that size could never be received; raise --max-buffered-request-bytes or lower {flag}",
                    self.max_buffered_request_bytes
                ));
            }
        }
        let http = port_tls(PortFlags {
            port: "http",
            use_ssl: self.http_use_ssl,
            mutual: self.http_use_ssl_mutual,
            cert: &self.http_server_cert,
            key: &self.http_server_key,
            root: &self.http_root_cert,
            alpn: ALPN_HTTP,
        })?;
        let grpc = port_tls(PortFlags {
            port: "grpc",
            use_ssl: self.grpc_use_ssl,
            mutual: self.grpc_use_ssl_mutual,
            cert: &self.grpc_server_cert,
            key: &self.grpc_server_key,
            root: &self.grpc_root_cert,
            alpn: ALPN_GRPC,
        })?;
        let first_byte_timeout = Duration::from_secs(self.preface_timeout_secs);
        Ok(PortsConfig {
            http: PortConfig {
                tls: http,
                max_connections: self.http_max_connections,
                first_byte_timeout,
            },
            grpc: PortConfig {
                tls: grpc,
                max_connections: self.grpc_max_connections,
                first_byte_timeout,
            },
            metrics: PortConfig {
                tls: None,
                max_connections: self.metrics_max_connections,
                first_byte_timeout,
            },
            http_timeouts: HttpTimeouts {
                header_read: Duration::from_secs(self.http_header_read_timeout_secs),
                body_read: Duration::from_secs(self.http_body_read_timeout_secs),
            },
            max_concurrent_streams: self.max_concurrent_streams,
            request_budget: RequestBudget::new(self.max_buffered_request_bytes),
            backlog: self.listen_backlog,
            grpc_keepalive: self.grpc_keepalive.keepalive()?,
        })
    }
}

/// The TLS config of one port, `None` when it is off; flags given without TLS on are refused
/// (a forgotten `--*-use-ssl` would otherwise serve in the clear).
fn port_tls(
    f: PortFlags<'_>,
) -> Result<Option<std::sync::Arc<nereid_tls::rustls::ServerConfig>>, String> {
    let p = f.port;
    if !f.use_ssl && !f.mutual {
        for (flag, given) in [
            ("server-cert", f.cert),
            ("server-key", f.key),
            ("root-cert", f.root),
        ] {
            if given.is_some() {
                return Err(format!(
                    "--{p}-{flag} is given but TLS is off on that port: add --{p}-use-ssl (or --{p}-use-ssl-mutual)"
                ));
            }
        }
        return Ok(None);
    }
    let (cert_flag, key_flag, root_flag) = match p {
        "http" => (
            "--http-server-cert",
            "--http-server-key",
            "--http-root-cert",
        ),
        _ => (
            "--grpc-server-cert",
            "--grpc-server-key",
            "--grpc-root-cert",
        ),
    };
    let switch = if f.mutual {
        "use-ssl-mutual"
    } else {
        "use-ssl"
    };
    let (Some(cert), Some(key)) = (f.cert, f.key) else {
        return Err(format!(
            "--{p}-{switch} needs {cert_flag} and {key_flag} (PEM files)"
        ));
    };
    let client_ca = match (f.mutual, f.root) {
        (true, Some(root)) => Some(PemFile::new(root_flag, root)),
        (true, None) => {
            return Err(format!(
                "--{p}-use-ssl-mutual needs {root_flag}: the CA that client certificates must be signed by"
            ));
        }
        (false, Some(_)) => {
            return Err(format!(
                "{root_flag} is only used with --{p}-use-ssl-mutual (client certificates)"
            ));
        }
        (false, None) => None,
    };
    let files = ServerTlsFiles {
        cert: PemFile::new(cert_flag, cert),
        key: PemFile::new(key_flag, key),
        client_ca,
    };
    nereid_tls::server_config(&files, f.alpn)
        .map(Some)
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::PortTlsArgs;
    use crate::common_args::FrontendArgs;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        tls: PortTlsArgs,
        #[command(flatten)]
        frontend: FrontendArgs,
    }

    fn ports(args: &[&str]) -> Result<nereid_frontend::PortsConfig, String> {
        let mut all = vec!["nereid"];
        all.extend_from_slice(args);
        let flags = Flags::try_parse_from(all).map_err(|e| e.to_string())?;
        flags.tls.ports(&flags.frontend)
    }

    #[test]
    fn hostile_client_limits_have_safe_defaults_and_flags() {
        let p = ports(&[]).unwrap();
        assert_eq!(p.metrics.max_connections, 64);
        assert_eq!(p.max_concurrent_streams, 1024);
        assert_eq!(p.request_budget.limit(), 1 << 30);
        assert_eq!(p.backlog, 1024);
        assert_eq!(p.grpc.first_byte_timeout.as_secs(), 10);
        let p = ports(&[
            "--metrics-max-connections",
            "3",
            "--preface-timeout-secs",
            "2",
            "--max-concurrent-streams",
            "8",
            "--max-buffered-request-bytes",
            "300000000",
            "--listen-backlog",
            "77",
        ])
        .unwrap();
        assert_eq!(p.metrics.max_connections, 3);
        assert_eq!(p.http.first_byte_timeout.as_secs(), 2);
        assert_eq!(p.metrics.first_byte_timeout.as_secs(), 2);
        assert_eq!(p.max_concurrent_streams, 8);
        assert_eq!(p.request_budget.limit(), 300_000_000);
        assert_eq!(p.backlog, 77);
    }

    #[test]
    fn a_budget_below_the_largest_request_is_refused() {
        let err = ports(&["--max-buffered-request-bytes", "1000"]).unwrap_err();
        assert!(
            err.contains(
                "--max-buffered-request-bytes (1000) is smaller than --http-max-input-size"
            ),
            "{err}"
        );
        let err = ports(&[
            "--max-buffered-request-bytes",
            "100000000",
            "--http-max-input-size",
            "1000",
        ])
        .unwrap_err();
        assert!(err.contains("--grpc-max-message-size"), "{err}");
        assert!(
            ports(&["--preface-timeout-secs", "0"])
                .unwrap_err()
                .contains("--preface-timeout-secs must be at least 1")
        );
    }

    #[test]
    fn defaults_are_plaintext_with_documented_limits() {
        let p = ports(&[]).unwrap();
        assert!(p.http.tls.is_none() && p.grpc.tls.is_none());
        assert_eq!(p.http.max_connections, 10_000);
        assert_eq!(p.http_timeouts.header_read.as_secs(), 30);
        let p = ports(&[
            "--grpc-max-connections",
            "5",
            "--http-body-read-timeout-secs",
            "7",
        ])
        .unwrap();
        assert_eq!(p.grpc.max_connections, 5);
        assert_eq!(p.http_timeouts.body_read.as_secs(), 7);
    }

    #[test]
    fn incomplete_or_contradictory_tls_flags_are_refused() {
        let err = |args: &[&str]| ports(args).unwrap_err();
        assert!(
            err(&["--grpc-use-ssl"])
                .contains("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
        );
        assert!(
            err(&[
                "--http-use-ssl-mutual",
                "--http-server-cert",
                "c",
                "--http-server-key",
                "k"
            ])
            .contains("needs --http-root-cert")
        );
        assert!(err(&["--grpc-server-cert", "c"]).contains("TLS is off"));
        assert!(
            err(&[
                "--http-use-ssl",
                "--http-server-cert",
                "c",
                "--http-server-key",
                "k",
                "--http-root-cert",
                "r"
            ])
            .contains("only used with --http-use-ssl-mutual")
        );
        assert!(err(&["--http-max-connections", "0"]).contains("at least 1"));
        let missing = err(&[
            "--grpc-use-ssl",
            "--grpc-server-cert",
            "/nonexistent/c.pem",
            "--grpc-server-key",
            "k",
        ]);
        assert!(
            missing.contains("--grpc-server-cert '/nonexistent/c.pem'")
                && missing.contains("cannot read"),
            "{missing}"
        );
    }
}
