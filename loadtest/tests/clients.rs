//! Both clients end to end against an in-process KServe v2 server: `nereid-proto`'s real HTTP
//! and gRPC frontends on 127.0.0.1:0 over a `FakeService`. The fake checks what arrives (names,
//! datatypes, shapes), so a wrongly encoded request shows up as errors.
//!
//! Model `add`: FP32 `X` [-1,4], max_batch_size 8. Model `broken`: same inputs, every
//! inference fails.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::sync::Arc;

use clap::Parser;
use nereid_loadtest::{Cli, Command, GridPoint, Level, LoadtestError};
use nereid_proto::ServiceError;
use nereid_proto::testing::{FakeModel, FakeService, tensor};
use tokio_stream::wrappers::TcpListenerStream;

/// Models `add` (checks its inputs, answers `Y` = `X`) and `broken` (every inference fails).
fn fake() -> FakeService {
    let model = || {
        FakeModel::echo()
            .platform("mock")
            .inputs(vec![tensor("X", "FP32", vec![-1, 4])])
            .outputs(vec![tensor("Y", "FP32", vec![-1, 4])])
            .max_batch_size(8)
            .config_input("X", 11, vec![4])
    };
    FakeService::new("mock")
        .model("add", model().check_inputs().output_names(&["Y"]))
        .model(
            "broken",
            model().answer(nereid_proto::testing::Answer::Fail(ServiceError::invalid(
                "broken model always fails",
            ))),
        )
}

/// Starts both frontends; returns (HTTP address, gRPC address, the fake).
async fn start() -> (String, String, Arc<FakeService>) {
    let mock = Arc::new(fake());
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (http_addr, grpc_addr) = (http.local_addr().unwrap(), grpc.local_addr().unwrap());
    let router = nereid_frontend::router(mock.clone(), Default::default());
    tokio::spawn(async move { axum::serve(http, router).await });
    let routes = nereid_frontend::routes(mock.clone(), Default::default());
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming(TcpListenerStream::new(grpc))
            .await
    });
    (http_addr.to_string(), grpc_addr.to_string(), mock)
}

fn parse(extra: &[&str]) -> Cli {
    let base = [
        "nereid-loadtest",
        "-q",
        "-p",
        "100",
        "--warmup-secs",
        "0.05",
        "--max-trials",
        "3",
    ];
    Cli::try_parse_from(base.iter().chain(extra)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_over_every_encoding() {
    let (http, grpc, _) = start().await;
    let cases: [&[&str]; 3] = [
        &[
            "-u",
            &http,
            "-m",
            "add",
            "-b",
            "2",
            "--concurrency-range",
            "1:3:2",
        ],
        &[
            "-u",
            &http,
            "-m",
            "add",
            "--http-json",
            "--concurrency-range",
            "2",
        ],
        &[
            "-i",
            "grpc",
            "-u",
            &grpc,
            "-m",
            "add",
            "-b",
            "8",
            "--concurrency-range",
            "2",
            "--grpc-channels",
            "2",
        ],
    ];
    for args in cases {
        let cli = parse(args);
        let results = nereid_loadtest::run(&cli.run).await.unwrap();
        assert!(!results.is_empty(), "{args:?}");
        for r in &results {
            assert_eq!(r.summary.errors, 0, "{args:?}: {:?}", r.summary.first_error);
            assert!(
                r.summary.requests > 0 && r.summary.throughput > 0.0,
                "{args:?}"
            );
            assert!(r.summary.p50_us <= r.summary.p99_us && r.summary.p99_us <= r.summary.max_us);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_sends_at_the_asked_rate() {
    let (http, _, _) = start().await;
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("out.csv");
    let csv_arg = csv.to_str().unwrap();
    let cli = parse(&[
        "-u",
        &http,
        "-m",
        "add",
        "--request-rate-range",
        "200",
        "--csv",
        csv_arg,
    ]);
    let results = nereid_loadtest::run(&cli.run).await.unwrap();
    let s = &results[0].summary;
    assert_eq!(results[0].level, Level::RequestRate(200.0));
    assert!(
        (150.0..250.0).contains(&s.send_rate),
        "send rate {}",
        s.send_rate
    );
    assert_eq!((s.errors, s.skipped), (0, 0));
    let text = std::fs::read_to_string(&csv).unwrap();
    assert_eq!(text.lines().count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_reported_and_classified() {
    let (http, grpc, _) = start().await;
    // Request errors are counted; --fail-on-errors turns them into an error.
    for (proto, addr) in [("http", &http), ("grpc", &grpc)] {
        let cli = parse(&["-i", proto, "-u", addr, "-m", "broken", "--fail-on-errors"]);
        match nereid_loadtest::run(&cli.run).await {
            Err(LoadtestError::RequestsFailed {
                failed,
                total,
                first,
            }) => {
                assert!(failed > 0 && failed == total, "{failed} of {total}");
                assert!(first.contains("broken model always fails"), "{first}");
            }
            other => panic!("{proto}: expected RequestsFailed, got {other:?}"),
        }
        let cli = parse(&["-i", proto, "-u", addr, "-m", "nope"]);
        let err = nereid_loadtest::run(&cli.run).await.unwrap_err();
        assert!(
            matches!(err, LoadtestError::ModelNotFound { .. }),
            "{proto}: {err}"
        );
    }
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dead = closed.local_addr().unwrap().to_string();
    drop(closed);
    for proto in ["http", "grpc"] {
        let cli = parse(&["-i", proto, "-u", &dead, "-m", "add"]);
        let err = nereid_loadtest::run(&cli.run).await.unwrap_err();
        assert!(
            matches!(err, LoadtestError::Unreachable { .. }),
            "{proto}: {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn totals_count_every_request_the_server_received() {
    // Warm-up, windows and the requests in flight when the last window closes: the server's
    // count of received requests is the level's `requests_total`, in both loops and both modes.
    let (http, grpc, mock) = start().await;
    let windows: &[&str] = &[
        "-q",
        "-p",
        "100",
        "--warmup-secs",
        "0.05",
        "--max-trials",
        "3",
    ];
    let fixed: &[&str] = &[
        "-q",
        "-p",
        "100",
        "--warmup-secs",
        "0.05",
        "--duration-secs",
        "0.25",
    ];
    let cases: [(&[&str], &[&str]); 4] = [
        (
            windows,
            &["-u", &http, "-m", "add", "--concurrency-range", "1:4:3"],
        ),
        (
            windows,
            &[
                "-i",
                "grpc",
                "-u",
                &grpc,
                "-m",
                "broken",
                "--concurrency-range",
                "3",
            ],
        ),
        (
            windows,
            &["-u", &http, "-m", "add", "--request-rate-range", "300"],
        ),
        (
            fixed,
            &[
                "-i",
                "grpc",
                "-u",
                &grpc,
                "-m",
                "add",
                "--concurrency-range",
                "2",
            ],
        ),
    ];
    for (base, args) in cases {
        let cli = Cli::try_parse_from([&["nereid-loadtest"][..], base, args].concat()).unwrap();
        let before = mock.requests().len() as u64;
        let results = nereid_loadtest::run(&cli.run).await.unwrap();
        let received = mock.requests().len() as u64 - before;
        let sent: u64 = results.iter().map(|r| r.totals.requests_total).sum();
        assert_eq!(sent, received, "{args:?}");
        for r in &results {
            let windows = r.summary.requests + r.summary.errors;
            assert!(
                r.totals.requests_total > windows,
                "{args:?}: the warm-up and the drain add to the windows' {windows}"
            );
            if args.contains(&"broken") {
                assert_eq!(r.totals.errors_total, r.totals.requests_total);
                assert_eq!(
                    r.totals.first_errors.len(),
                    1,
                    "{:?}",
                    r.totals.first_errors
                );
            } else {
                assert_eq!(r.totals.errors_total, 0, "{:?}", r.totals.first_errors);
            }
        }
        if base == fixed {
            let r = &results[0];
            assert_eq!(r.windows, 3, "0.25 s in windows of at most 100 ms");
            assert!(
                (0.2..0.4).contains(&r.summary.seconds),
                "all windows reported: {} s",
                r.summary.seconds
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_reloads_each_point_and_restores_the_config() {
    let (http, _, mock) = start().await;
    let argv = [
        "nereid-loadtest",
        "sweep",
        "-q",
        "-p",
        "50",
        "--warmup-secs",
        "0",
        "--max-trials",
        "3",
        "-u",
        &http,
        "-m",
        "add",
        "--instance-counts",
        "3",
        "--max-batch-sizes",
        "0,4",
        "--max-queue-delays-us",
        "250",
    ];
    let Some(Command::Sweep(args)) = Cli::try_parse_from(argv).unwrap().command else {
        panic!("expected sweep");
    };
    let results = nereid_loadtest::sweep(&args).await.unwrap();
    let grids: Vec<GridPoint> = results.iter().filter_map(|r| r.grid).collect();
    assert_eq!(grids.len(), 2);
    let loads = mock.loads();
    let configs: Vec<serde_json::Value> = loads
        .iter()
        .map(|(_, load)| serde_json::from_str(load.config.as_deref().unwrap()).unwrap())
        .collect();
    assert_eq!(configs.len(), 3, "two points, then the restore");
    assert_eq!(configs[0]["instance_group"][0]["count"], 3);
    assert!(configs[0].get("dynamic_batching").is_none());
    assert_eq!(configs[1]["max_batch_size"], 4);
    assert_eq!(
        configs[1]["dynamic_batching"]["max_queue_delay_microseconds"],
        250
    );
    assert_eq!(configs[2]["max_batch_size"], 8, "the original comes back");
    assert!(
        configs[2]["instance_group"]
            .as_array()
            .is_none_or(|g| g.is_empty())
    );
}
