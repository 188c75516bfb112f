//! The router's `/metrics` against two in-process fake workers (the harness of
//! `forwarding.rs`): request outcomes, outstanding requests per replica, retries and ejections,
//! read back over HTTP in the Prometheus text format.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use nereid_proto::InferenceService;
use nereid_router::RouterCollector;
use nereid_router::RouterService;
use nereid_router::SharedTable;
use nereid_telemetry::prometheus_router;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod echo_cluster;

use echo_cluster::*;

/// Serves the router's `/metrics` on 127.0.0.1:0; its address.
async fn serve_metrics(router: Arc<RouterService>, table: Arc<SharedTable>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = prometheus_router(Arc::new(RouterCollector { router, table }));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// `GET /metrics` over plain HTTP/1.0; the body.
async fn scrape(addr: SocketAddr) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: test\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}

/// The value of the series written exactly as `series` (name and labels); `None` when absent.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.rsplit_once(' '))
        .find(|(s, _)| *s == series)
        .and_then(|(_, v)| v.parse().ok())
}

#[tokio::test]
async fn every_request_is_counted_once_and_replicas_go_back_to_idle() {
    bounded(async {
        let (_workers, router, table) = cluster(64).await;
        let addr = serve_metrics(router.clone(), table).await;
        const N: usize = 37;
        for _ in 0..N {
            router.infer(request(Default::default())).await.unwrap();
        }
        let mut unknown = request(Default::default());
        unknown.model_name = "no-such-model".into();
        router.infer(unknown).await.unwrap_err();

        let text = scrape(addr).await;
        let get = |series: &str| value(&text, series);
        assert_eq!(
            get(r#"nereid_router_requests_total{model="echo",outcome="success"}"#),
            Some(N as f64),
            "{text}"
        );
        assert_eq!(
            get(r#"nereid_router_requests_total{model="echo",outcome="failure"}"#),
            Some(0.0)
        );
        assert_eq!(
            get(r#"nereid_router_requests_total{model="_other",outcome="failure"}"#),
            Some(1.0)
        );
        assert_eq!(
            get(r#"nereid_router_request_duration_seconds_count{model="echo"}"#),
            Some(N as f64)
        );
        assert_eq!(
            get(r#"nereid_router_request_duration_seconds_bucket{model="echo",le="+Inf"}"#),
            Some(N as f64)
        );
        for node in ["w1", "w2"] {
            let series = format!(
                r#"nereid_router_replica_in_flight{{model="echo",version="1",node="{node}"}}"#
            );
            assert_eq!(get(&series), Some(0.0), "{series} in\n{text}");
        }
        assert_eq!(get("nereid_router_in_flight"), Some(0.0));
        assert_eq!(get("nereid_router_table_revision"), Some(1.0));
        assert_eq!(
            get(r#"nereid_router_retries_total{model="echo"}"#),
            Some(0.0)
        );
        for node in ["w1", "w2"] {
            let series = format!("nereid_router_ejections_total{{node=\"{node}\"}}");
            assert_eq!(get(&series), Some(0.0), "{series} in\n{text}");
        }
    })
    .await;
}

#[tokio::test]
async fn a_stream_holds_its_replica_until_it_is_dropped() {
    bounded(async {
        let (_workers, router, table) = cluster(64).await;
        let addr = serve_metrics(router.clone(), table).await;
        let stream = router
            .infer_stream(request(Default::default()))
            .await
            .unwrap();
        let text = scrape(addr).await;
        let busy: f64 = text
            .lines()
            .filter(|l| l.starts_with("nereid_router_replica_in_flight{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum();
        assert_eq!(busy, 1.0, "{text}");
        assert_eq!(value(&text, "nereid_router_in_flight"), Some(1.0));
        let items: Vec<_> = stream.collect().await;
        assert_eq!(items.len(), 3);
        let text = scrape(addr).await;
        assert!(
            text.lines()
                .filter(|l| l.starts_with("nereid_router_replica_in_flight{"))
                .all(|l| l.ends_with(" 0")),
            "{text}"
        );
        assert_eq!(
            value(
                &text,
                r#"nereid_router_requests_total{model="echo",outcome="success"}"#
            ),
            Some(1.0)
        );
    })
    .await;
}

#[tokio::test]
async fn a_killed_worker_counts_one_retry_and_one_ejection() {
    bounded(async {
        let (mut workers, router, table) = cluster(64).await;
        let addr = serve_metrics(router.clone(), table).await;
        // Warm both connections, then kill one worker.
        for _ in 0..10 {
            router.infer(request(Default::default())).await.unwrap();
        }
        workers[0].kill().await;
        // Every request still succeeds: the one that meets the dead worker is re-sent to the
        // other, and the dead one is then avoided for the ejection time (5 s).
        for _ in 0..30 {
            router.infer(request(Default::default())).await.unwrap();
        }
        let text = scrape(addr).await;
        let get = |series: &str| value(&text, series);
        assert_eq!(
            get(r#"nereid_router_requests_total{model="echo",outcome="success"}"#),
            Some(40.0),
            "{text}"
        );
        assert_eq!(
            get(r#"nereid_router_requests_total{model="echo",outcome="failure"}"#),
            Some(0.0)
        );
        assert_eq!(
            get(r#"nereid_router_retries_total{model="echo"}"#),
            Some(1.0)
        );
        assert_eq!(
            get(r#"nereid_router_ejections_total{node="w1"}"#),
            Some(1.0)
        );
        assert_eq!(
            get(r#"nereid_router_ejections_total{node="w2"}"#),
            Some(0.0)
        );
    })
    .await;
}
