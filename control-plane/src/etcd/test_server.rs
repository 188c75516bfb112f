//! A real `etcd` (Debian's `etcd-server`, installed by scripts/setup.sh) for tests: one member
//! on free 127.0.0.1 ports with its data in a tempdir, killed by PID when dropped.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// A running etcd; killed (and its data removed) on drop.
pub(crate) struct EtcdServer {
    child: Child,
    endpoint: String,
    _dir: TempDir,
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
        let Some(bin) = binary() else {
            eprintln!(
                "SKIPPED: no etcd binary (install Debian's etcd-server: scripts/setup.sh does)"
            );
            return None;
        };
        let dir = TempDir::new().expect("tempdir");
        let (client, peer) = (free_port(), free_port());
        let endpoint = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new(&bin)
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
            _dir: dir,
        };
        server.wait_ready().await;
        Some(server)
    }

    pub(crate) fn endpoint(&self) -> String {
        self.endpoint.clone()
    }

    /// Polls etcd's status until it answers; etcd starts in well under a second.
    async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let answer = async {
                let mut client = etcd_client::Client::connect([self.endpoint.as_str()], None)
                    .await
                    .map_err(|e| e.to_string())?;
                client.status().await.map_err(|e| e.to_string())
            };
            match tokio::time::timeout(Duration::from_secs(2), answer).await {
                Ok(Ok(_)) => return,
                Ok(Err(e)) if Instant::now() > deadline => panic!("etcd never answered: {e}"),
                Err(_) if Instant::now() > deadline => panic!("etcd never answered"),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
