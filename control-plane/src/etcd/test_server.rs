//! A real `etcd` (Debian's `etcd-server`, installed by scripts/setup.sh) for tests: one member
//! on free 127.0.0.1 ports with its data in a tempdir, killed by PID when dropped.
//!
//! [`EtcdServer::start_tls`] serves clients over TLS with certificates made by
//! scripts/make_certs.sh in the tempdir:
//!
//! ```text
//!  certs/ca/ca.pem          the CA etcd trusts (--trusted-ca-file) and clients verify with
//!  certs/ca/127.0.0.1.pem   etcd's server certificate: subjectAltName IP:127.0.0.1 only
//!  certs/ca/client.pem      a client certificate it signed
//!  certs/other/ca.pem       an unrelated CA; certs/other/client.pem a client certificate of it
//! ```

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nereid_test_support::eventually_ok;
use tempfile::TempDir;

use super::EtcdTls;

/// A running etcd; killed (and its data removed) on drop.
pub(crate) struct EtcdServer {
    child: Child,
    endpoint: String,
    /// With TLS: the certificate directory ([`EtcdServer::tls`] reads from it).
    certs: Option<PathBuf>,
    _dir: TempDir,
}

/// Runs scripts/make_certs.sh `dir` `names...`.
fn make_certs(dir: &Path, names: &[&str]) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/make_certs.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg(dir)
        .args(names)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} {names:?}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The etcd binary: `$NEREID_ETCD_BIN`, else `etcd` on the PATH.
fn binary() -> Option<String> {
    if let Ok(bin) = std::env::var("NEREID_ETCD_BIN") {
        return Some(bin);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("etcd"))
        .find(|candidate| candidate.is_file())
        .map(|p| p.display().to_string())
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local addr").port()
}

impl EtcdServer {
    /// Starts etcd and waits (bounded) until it answers; `None`, with the reason printed, when
    /// no etcd binary is installed.
    pub(crate) async fn start() -> Option<EtcdServer> {
        EtcdServer::launch(false, false).await
    }

    /// Starts etcd serving clients over TLS at `https://127.0.0.1:PORT`; with
    /// `client_cert_auth`, etcd also demands a client certificate signed by `certs/ca`.
    pub(crate) async fn start_tls(client_cert_auth: bool) -> Option<EtcdServer> {
        EtcdServer::launch(true, client_cert_auth).await
    }

    async fn launch(tls: bool, client_cert_auth: bool) -> Option<EtcdServer> {
        let Some(bin) = binary() else {
            eprintln!(
                "SKIPPED: no etcd binary (install Debian's etcd-server: scripts/setup.sh does)"
            );
            return None;
        };
        let dir = TempDir::new().expect("tempdir");
        let (client, peer) = (free_port(), free_port());
        let scheme = if tls { "https" } else { "http" };
        let endpoint = format!("{scheme}://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut command = Command::new(&bin);
        let certs = tls.then(|| dir.path().join("certs"));
        if let Some(certs) = &certs {
            make_certs(&certs.join("ca"), &["127.0.0.1", "client"]);
            make_certs(&certs.join("other"), &["client"]);
            command
                .arg("--cert-file")
                .arg(certs.join("ca/127.0.0.1.pem"))
                .arg("--key-file")
                .arg(certs.join("ca/127.0.0.1.key"))
                .arg("--trusted-ca-file")
                .arg(certs.join("ca/ca.pem"));
            if client_cert_auth {
                command.arg("--client-cert-auth");
            }
        }
        let child = command
            .args(["--name", "nereid-test", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("nereid-test={peer_url}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {bin}: {e}"));
        let server = EtcdServer {
            child,
            endpoint,
            certs,
            _dir: dir,
        };
        server.wait_ready().await;
        Some(server)
    }

    pub(crate) fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// The TLS set-up trusting CA `ca` (`"ca"`: etcd's, `"other"`: an unrelated one), with
    /// `client`'s certificate when given (`"ca"` or `"other"`: `certs/<client>/client.pem`).
    pub(crate) fn tls(&self, ca: &str, client: Option<&str>) -> EtcdTls {
        let certs = self.certs.as_ref().expect("an etcd started with start_tls");
        EtcdTls {
            ca_pem: read(&certs.join(ca).join("ca.pem")),
            identity: client.map(|c| {
                (
                    read(&certs.join(c).join("client.pem")),
                    read(&certs.join(c).join("client.key")),
                )
            }),
        }
    }

    /// Polls etcd's status until it answers; etcd starts in well under a second.
    async fn wait_ready(&self) {
        eventually_ok("etcd answers", Duration::from_secs(20), || async {
            let answer = async {
                let options = self.certs.is_some().then(|| {
                    self.tls("ca", Some("ca"))
                        .apply(etcd_client::ConnectOptions::new())
                });
                let mut client = etcd_client::Client::connect([self.endpoint.as_str()], options)
                    .await
                    .map_err(|e| e.to_string())?;
                client.status().await.map_err(|e| e.to_string())
            };
            match tokio::time::timeout(Duration::from_secs(2), answer).await {
                Ok(answered) => answered.map(drop),
                Err(_) => Err("no answer within 2 s".to_string()),
            }
        })
        .await;
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
