//! `serve::run` starts on free ports with no reachable control plane, and a shutdown signal
//! makes it return promptly.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::time::Duration;

use nereid_router::ControlPlaneConfig;
use nereid_router::RouterServiceConfig;
use nereid_router::{RouterConfig, run};

#[tokio::test]
async fn starts_without_a_control_plane_and_shuts_down_on_signal() {
    let any = Some("127.0.0.1:0".parse().unwrap());
    let config = RouterConfig {
        service: RouterServiceConfig::default(),
        control_plane: ControlPlaneConfig {
            control_plane: vec!["127.0.0.1:1".into()],
            token: None,
            ..Default::default()
        },
        http_addr: any,
        grpc_addr: any,
        metrics_addr: any,
        reuse_port: false,
        http_max_input_size: 1 << 20,
        frontend: Default::default(),
        exit_timeout: Duration::from_secs(5),
        telemetry: Default::default(),
        ports: Default::default(),
        repository_control: Default::default(),
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(run(config, async {
        let _ = rx.await;
    }));
    tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the router stops within its exit timeout")
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_bad_control_plane_address_is_refused_before_binding() {
    let config = RouterConfig {
        service: RouterServiceConfig::default(),
        control_plane: ControlPlaneConfig::default(),
        http_addr: None,
        grpc_addr: None,
        metrics_addr: None,
        reuse_port: false,
        http_max_input_size: 1 << 20,
        frontend: Default::default(),
        exit_timeout: Duration::from_secs(1),
        telemetry: Default::default(),
        ports: Default::default(),
        repository_control: Default::default(),
    };
    let err = run(config, std::future::pending()).await.unwrap_err();
    assert!(
        err.to_string().contains("no control-plane address"),
        "{err}"
    );
}
