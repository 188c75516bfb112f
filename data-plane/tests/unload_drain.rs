//! An unload never drops work the model accepted: requests queued or running when the unload
//! starts are answered (the unload waits for them, up to its drain timeout; queued ones left
//! then are refused UNAVAILABLE), and requests arriving during the unload are refused
//! UNAVAILABLE, which a router retries on another replica, never "Request for unknown model".
//! A worker whose replica the control plane moved away unloads it this way.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use nereid_data_plane::{
    Backends, ControlMode, DataPlane, DataPlaneConfig, ManagerConfig, ModelManager,
};
use nereid_proto::{InferRequest, InferenceService, ServiceError, ServiceResult, UnloadRequest};
use nereid_test_support::{eventually, floats, fp32};

mod common;

/// `slow`: an identity model, one instance, one request per execution of `delay_ms`.
fn repository(delay_ms: u64) -> tempfile::TempDir {
    let repo = tempfile::tempdir().unwrap();
    let model = repo.path().join("slow");
    std::fs::create_dir_all(model.join("1")).unwrap();
    std::fs::write(
        model.join("config.pbtxt"),
        format!(
            r#"backend: "identity"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}
"#
        ),
    )
    .unwrap();
    repo
}

/// A data plane serving `slow` from `repo`, whose unloads drain for at most `drain`.
async fn plane(repo: &Path, drain: Duration) -> Arc<DataPlane> {
    let manager = ModelManager::new(
        ManagerConfig {
            repositories: vec![repo.to_path_buf()],
            control_mode: ControlMode::Explicit,
            startup_models: vec!["slow".into()],
            auto_complete: true,
            queue_capacity: 64,
            cluster_managed: false,
            rate_limit: Default::default(),
            response_cache_bytes: None,
            config_name: None,
            namespacing: false,
        },
        Backends::new(None),
    )
    .with_unload_drain_timeout(drain);
    let manager = Arc::new(manager);
    manager.load_startup_models().await.unwrap();
    Arc::new(DataPlane::new(
        DataPlaneConfig {
            server_name: "nereid".into(),
            strict_readiness: true,
        },
        manager,
    ))
}

fn request(i: usize) -> InferRequest {
    let x = i as f32;
    InferRequest {
        model_name: "slow".into(),
        inputs: vec![fp32("INPUT0", vec![1, 4], &[x, x + 1.0, x + 2.0, x + 3.0])],
        ..Default::default()
    }
}

/// How long a wait for the data plane's own progress may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// Requests of `slow` received and not answered yet.
fn in_flight(dp: &DataPlane) -> u64 {
    dp.manager()
        .get("slow", None)
        .map_or(0, |v| v.stats.in_flight())
}

/// Starts `n` requests of `slow` and waits until all of them are in flight (one running, the
/// others queued behind it).
async fn accept(
    dp: &Arc<DataPlane>,
    n: usize,
) -> Vec<tokio::task::JoinHandle<ServiceResult<Vec<f32>>>> {
    let tasks = (0..n)
        .map(|i| {
            let dp = dp.clone();
            tokio::spawn(async move {
                let response = dp.infer(request(i)).await?;
                Ok(floats(&response.outputs[0]))
            })
        })
        .collect();
    eventually("every request is in flight", PATIENCE, || {
        in_flight(dp) == n as u64
    })
    .await;
    tasks
}

/// Starts unloading `slow` and waits until the manager no longer hands its version out.
async fn start_unload(dp: &Arc<DataPlane>) -> tokio::task::JoinHandle<ServiceResult<()>> {
    let unloading = dp.clone();
    let unload = tokio::spawn(async move {
        unloading
            .unload_model("slow", UnloadRequest::new(false))
            .await
    });
    eventually("the unload has started", PATIENCE, || {
        dp.manager().get("slow", None).is_err()
    })
    .await;
    unload
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unload_answers_every_request_it_accepted_and_refuses_new_ones_retryably() {
    let repo = repository(100);
    let dp = plane(repo.path(), Duration::from_secs(30)).await;
    let accepted = accept(&dp, 5).await;
    let unload = start_unload(&dp).await;

    // Arriving during the unload: refused UNAVAILABLE (retryable), not "unknown model".
    match dp.infer(request(9)).await {
        Err(ServiceError::Unavailable(m)) => {
            assert_eq!(m, "model 'slow' version 1 is unloading")
        }
        other => panic!("a request during the unload: expected UNAVAILABLE, got {other:?}"),
    }
    let explicit = InferRequest {
        model_version: Some(1),
        ..request(9)
    };
    assert!(matches!(
        dp.infer(explicit).await,
        Err(ServiceError::Unavailable(_))
    ));
    assert!(
        !unload.is_finished(),
        "the unload waits for the requests it accepted"
    );

    // Every accepted request gets its answer.
    for (i, task) in accepted.into_iter().enumerate() {
        let x = i as f32;
        assert_eq!(
            task.await.unwrap().unwrap(),
            vec![x, x + 1.0, x + 2.0, x + 3.0],
            "request {i}"
        );
    }
    unload.await.unwrap().unwrap();

    // Unloaded: an unknown model again, as in Triton, and listed as unloaded.
    match dp.infer(request(0)).await {
        Err(ServiceError::NotFound(m)) => {
            assert!(m.starts_with("Request for unknown model"), "{m}")
        }
        other => panic!("after the unload: expected NOT_FOUND, got {other:?}"),
    }
    let index = dp.repository_index(false).await.unwrap();
    let row = index.iter().find(|r| r.name == "slow").unwrap();
    assert_eq!(
        (row.state.as_str(), row.reason.as_str()),
        ("UNAVAILABLE", "unloaded")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unload_out_of_time_refuses_the_queued_requests_retryably() {
    let repo = repository(300);
    let drain = Duration::from_millis(100);
    let dp = plane(repo.path(), drain).await;
    let accepted = accept(&dp, 6).await;
    let started = Instant::now();
    let unload = start_unload(&dp).await;
    unload.await.unwrap().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the unload stops waiting after its drain timeout"
    );

    let mut answered = 0;
    let mut refused = 0;
    for (i, task) in accepted.into_iter().enumerate() {
        match task.await.unwrap() {
            Ok(_) => answered += 1,
            Err(ServiceError::Unavailable(m)) => {
                assert_eq!(
                    m,
                    "model 'slow' version 1 is unloading: its queued requests did not start within the 100 ms unload drain",
                    "request {i}"
                );
                refused += 1;
            }
            Err(other) => panic!("request {i}: expected an answer or UNAVAILABLE, got {other:?}"),
        }
    }
    assert!(
        answered >= 1,
        "the running request finishes on its instance"
    );
    assert!(
        refused >= 1,
        "queued requests are refused, not left waiting"
    );
    assert_eq!(answered + refused, 6);
}
