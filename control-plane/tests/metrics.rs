//! A real single-node control plane (Raft on disk in a temporary directory, every listener on
//! 127.0.0.1:0) serves `/metrics`: once it has elected itself, the Raft and cluster families are
//! there over HTTP, and the endpoint stops with the node.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use nereid_control_plane::AuthToken;
use nereid_control_plane::{Listeners, NodeConfig, serve};
use nereid_test_support::eventually_ok;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn config(data_dir: &std::path::Path) -> NodeConfig {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    NodeConfig {
        node_id: 1,
        listen: any,
        advertise: None,
        http_listen: None,
        metrics_listen: Some(any),
        data_dir: data_dir.to_path_buf(),
        peers: BTreeMap::new(),
        join: None,
        auth: AuthToken::disabled(),
        auth_value: None,
        heartbeat_interval: Duration::from_millis(100),
        heartbeat_timeout: Duration::from_millis(1000),
        placement_interval: Duration::from_millis(50),
        scale_to_zero_after: Duration::from_secs(60),
        rebalance_max_moves: 2,
        evict_min_residency: Some(Duration::from_secs(60)),
        raft_heartbeat: Duration::from_millis(50),
        election_timeout_min: Duration::from_millis(200),
        election_timeout_max: Duration::from_millis(400),
        snapshot_threshold: 1000,
        model_repositories: vec![],
        default_replicas: 1,
        cluster_tls: None,
        store: nereid_control_plane::Store::Raft,
    }
}

/// `GET /metrics` over HTTP/1.0; the body, or why not.
async fn scrape(addr: SocketAddr) -> Result<String, String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    if !response.starts_with("HTTP/1.0 200") {
        return Err(response);
    }
    Ok(response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default())
}

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(s, _)| *s == series)
        .and_then(|(_, v)| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_reports_itself_leader_and_the_cluster_families() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let listeners = Listeners::bind(&config).await.unwrap();
    let addr = listeners.metrics_addr().expect("metrics enabled");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let node = tokio::spawn(serve(config, listeners, async {
        let _ = stop_rx.await;
    }));

    // Poll until the node has elected itself and applied its first entry (the leader's blank
    // entry: applied a moment after the election, not with it).
    let ready = |text: &str| {
        value(text, "nereid_raft_is_leader") == Some(1.0)
            && value(text, "nereid_raft_applied_index").is_some_and(|a| a >= 1.0)
    };
    let text = eventually_ok("the node is leader", Duration::from_secs(20), || async {
        match scrape(addr).await {
            Ok(text) if ready(&text) => Ok(text),
            last => Err(format!("scrape {last:?}")),
        }
    })
    .await;

    assert!(
        value(&text, "nereid_raft_term").is_some_and(|t| t >= 1.0),
        "{text}"
    );
    assert_eq!(value(&text, "nereid_raft_leader_id"), Some(1.0), "{text}");
    let applied = value(&text, "nereid_raft_applied_index").unwrap_or(0.0);
    assert!(applied >= 1.0, "{text}");
    assert!(value(&text, "nereid_raft_commit_index").is_some_and(|c| c >= applied));
    assert!(value(&text, "nereid_raft_last_log_index").is_some_and(|l| l >= applied));
    for state in ["up", "down"] {
        let series = format!("nereid_cluster_nodes{{state=\"{state}\"}}");
        assert_eq!(value(&text, &series), Some(0.0), "{series} in\n{text}");
    }
    for state in ["pending", "loading", "ready", "failed", "unloading"] {
        let series = format!("nereid_cluster_replicas{{state=\"{state}\"}}");
        assert_eq!(value(&text, &series), Some(0.0), "{series} in\n{text}");
    }
    assert_eq!(value(&text, "nereid_cluster_models"), Some(0.0));
    assert_eq!(
        value(&text, "nereid_placement_decisions_total{action=\"place\"}"),
        Some(0.0)
    );
    assert!(text.contains("# TYPE nereid_placement_decisions_total counter"));

    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(20), node)
        .await
        .expect("the node stops")
        .unwrap()
        .unwrap();
    assert!(
        scrape(addr).await.is_err(),
        "metrics still served after stop"
    );
}
