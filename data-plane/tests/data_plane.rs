//! The data plane end to end, in process, with the real ONNX Runtime: model loading in each
//! control mode, inference through `InferenceService`, failures that leave other models
//! serving, reloads that keep unchanged versions, and repository overrides.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use nereid_data_plane::{Backends, ControlMode, DataPlane};
use nereid_proto::{InferRequest, InferenceService, LoadRequest, ServiceError, UnloadRequest};

mod common;
use common::{data_plane, ort_library, workspace};
use nereid_test_support::{floats, fp32};

fn fixture(name: &str) -> PathBuf {
    workspace()
        .join("data-plane/src/backend/onnx/testdata")
        .join(name)
}

const ADD_SUB_CONFIG: &str = r#"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"#;

fn add_model(repo: &Path, name: &str, config: Option<&str>, versions: &[i64]) {
    let dir = repo.join(name);
    for v in versions {
        std::fs::create_dir_all(dir.join(v.to_string())).unwrap();
        std::fs::copy(
            fixture("add_sub.onnx"),
            dir.join(v.to_string()).join("model.onnx"),
        )
        .unwrap();
    }
    if let Some(c) = config {
        std::fs::write(dir.join("config.pbtxt"), c).unwrap();
    }
}

fn plane(repo: &Path, mode: ControlMode, startup: &[&str]) -> Arc<DataPlane> {
    let backends = Backends::new(Some(ort_library()));
    data_plane(repo, mode, startup, backends, 16, true)
}

fn add_sub_request(model: &str, version: Option<i64>) -> InferRequest {
    InferRequest {
        model_name: model.into(),
        model_version: version,
        inputs: vec![
            fp32("INPUT0", vec![1, 4], &[1.0, 2.0, 3.0, 4.0]),
            fp32("INPUT1", vec![1, 4], &[0.5, 0.5, 0.5, 0.5]),
        ],
        ..Default::default()
    }
}

#[tokio::test]
async fn serves_a_model_and_keeps_statistics() {
    let repo = tempfile::tempdir().unwrap();
    add_model(repo.path(), "add_sub", Some(ADD_SUB_CONFIG), &[1]);
    let dp = plane(repo.path(), ControlMode::None, &[]);
    dp.manager().load_startup_models().await.unwrap();
    assert!(dp.server_ready().await);

    let response = dp.infer(add_sub_request("add_sub", None)).await.unwrap();
    assert_eq!(response.model_version, "1");
    assert_eq!(response.outputs.len(), 2);
    assert_eq!(response.outputs[0].name(), "OUTPUT0");
    assert_eq!(floats(&response.outputs[0]), vec![1.5, 2.5, 3.5, 4.5]);
    assert_eq!(floats(&response.outputs[1]), vec![0.5, 1.5, 2.5, 3.5]);
    assert_eq!(response.outputs[0].shape(), &[1, 4]);

    let bad = InferRequest {
        inputs: vec![fp32("INPUT0", vec![1, 4], &[0.0; 4])],
        ..add_sub_request("add_sub", None)
    };
    assert!(matches!(
        dp.infer(bad).await,
        Err(ServiceError::InvalidArgument(_))
    ));

    let stats = dp.model_statistics("add_sub", None).await.unwrap();
    let inference = stats[0].inference_stats.as_ref().unwrap();
    assert_eq!(inference.success.as_ref().unwrap().count, 1);
    assert_eq!(stats[0].inference_count, 1);

    let meta = dp.model_metadata("add_sub", None).await.unwrap();
    assert_eq!(meta.inputs[0].shape, vec![-1, 4]);
    assert_eq!(meta.platform, "onnxruntime_onnx");
}

#[tokio::test]
async fn a_broken_model_does_not_stop_the_others() {
    let repo = tempfile::tempdir().unwrap();
    add_model(repo.path(), "good", Some(ADD_SUB_CONFIG), &[1]);
    add_model(
        repo.path(),
        "bad_config",
        Some("max_batch_size: 8\nbogus_field: 1\n"),
        &[1],
    );
    std::fs::create_dir_all(repo.path().join("corrupt/1")).unwrap();
    std::fs::write(
        repo.path().join("corrupt/1/model.onnx"),
        b"not an onnx file",
    )
    .unwrap();
    std::fs::write(
        repo.path().join("corrupt/config.pbtxt"),
        "platform: \"onnxruntime_onnx\"",
    )
    .unwrap();
    let dp = plane(repo.path(), ControlMode::None, &[]);
    dp.manager().load_startup_models().await.unwrap();

    assert!(
        !dp.server_ready().await,
        "strict readiness: a failed model makes the server not ready"
    );
    assert!(dp.infer(add_sub_request("good", None)).await.is_ok());
    let index = dp.repository_index(false).await.unwrap();
    let bad = index.iter().find(|r| r.name == "bad_config").unwrap();
    assert_eq!(bad.state, "UNAVAILABLE");
    assert!(bad.reason.contains("config.pbtxt:2:1"), "{}", bad.reason);
    let corrupt = index.iter().find(|r| r.name == "corrupt").unwrap();
    assert_eq!(corrupt.state, "UNAVAILABLE");
    assert!(!corrupt.reason.is_empty());
    let err = dp
        .infer(add_sub_request("bad_config", None))
        .await
        .unwrap_err();
    assert!(matches!(err, ServiceError::NotFound(_)), "{err:?}");
}

#[tokio::test]
async fn explicit_mode_loads_unloads_and_overrides() {
    let repo = tempfile::tempdir().unwrap();
    add_model(repo.path(), "a", Some(ADD_SUB_CONFIG), &[1, 2]);
    add_model(repo.path(), "b", Some(ADD_SUB_CONFIG), &[1]);
    let dp = plane(repo.path(), ControlMode::Explicit, &["a"]);
    dp.manager().load_startup_models().await.unwrap();
    assert!(dp.model_ready("a", None).await.unwrap());
    assert_eq!(
        dp.model_metadata("a", None).await.unwrap().versions,
        vec!["2"]
    );
    assert!(
        !dp.model_ready("b", None).await.unwrap(),
        "b is not loaded in explicit mode (unknown: not ready, as Triton)"
    );

    dp.load_model("b", LoadRequest::default()).await.unwrap();
    assert!(dp.infer(add_sub_request("b", None)).await.is_ok());
    dp.unload_model("b", UnloadRequest::new(false))
        .await
        .unwrap();
    assert!(dp.infer(add_sub_request("b", None)).await.is_err());
    let index = dp.repository_index(false).await.unwrap();
    let b = index.iter().find(|r| r.name == "b").unwrap();
    assert_eq!(
        (b.state.as_str(), b.reason.as_str(), b.version.as_str()),
        ("UNAVAILABLE", "unloaded", "1"),
        "an unloaded model keeps its version row, as Triton"
    );
    // Unloading a model that was never loaded succeeds and lists nothing new, as Triton.
    dp.unload_model("never_loaded", UnloadRequest::new(false))
        .await
        .unwrap();
    let index = dp.repository_index(false).await.unwrap();
    assert!(!index.iter().any(|r| r.name == "never_loaded"));

    // Config override: serve every version of 'a'.
    let config = r#"{"platform":"onnxruntime_onnx","max_batch_size":8,"version_policy":{"all":{}},
        "input":[{"name":"INPUT0","data_type":"TYPE_FP32","dims":[4]},{"name":"INPUT1","data_type":"TYPE_FP32","dims":[4]}],
        "output":[{"name":"OUTPUT0","data_type":"TYPE_FP32","dims":[4]},{"name":"OUTPUT1","data_type":"TYPE_FP32","dims":[4]}]}"#;
    dp.load_model(
        "a",
        LoadRequest {
            config: Some(config.into()),
            files: BTreeMap::new(),
            credential: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        dp.model_metadata("a", None).await.unwrap().versions,
        vec!["1", "2"]
    );
    assert!(dp.infer(add_sub_request("a", Some(1))).await.is_ok());

    // File override: a model that is not in the repository at all.
    let mut files = BTreeMap::new();
    files.insert(
        "file:3/model.onnx".to_string(),
        Bytes::from(std::fs::read(fixture("add_sub.onnx")).unwrap()),
    );
    let upload = || {
        dp.load_model(
            "uploaded",
            LoadRequest {
                config: Some(config.into()),
                files: files.clone(),
                credential: None,
            },
        )
    };
    upload().await.unwrap();
    assert_eq!(
        dp.infer(add_sub_request("uploaded", None))
            .await
            .unwrap()
            .model_version,
        "3"
    );
    // The same override again is a fresh load, never the running version kept: its files may
    // have the same names and sizes as the last ones within one mtime tick.
    upload().await.unwrap();
    let stats = dp.model_statistics("uploaded", None).await.unwrap();
    assert_eq!(stats[0].inference_count, 0, "a file override reloads");

    files.insert("file:../escape.onnx".to_string(), Bytes::from_static(b"x"));
    let err = dp
        .load_model(
            "evil",
            LoadRequest {
                config: Some(config.into()),
                files,
                credential: None,
            },
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ServiceError::InvalidArgument(_)), "{err:?}");
    assert!(!repo.path().join("escape.onnx").exists());
}

#[tokio::test]
async fn load_is_refused_outside_explicit_mode() {
    let repo = tempfile::tempdir().unwrap();
    add_model(repo.path(), "a", Some(ADD_SUB_CONFIG), &[1]);
    let dp = plane(repo.path(), ControlMode::None, &[]);
    dp.manager().load_startup_models().await.unwrap();
    let err = dp
        .load_model("a", LoadRequest::default())
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ServiceError::Unavailable(
            "explicit model load / unload is not allowed if polling is enabled".into()
        )
    );
}

#[tokio::test]
async fn poll_picks_up_new_versions_and_removals() {
    let repo = tempfile::tempdir().unwrap();
    let policy_all = format!("{ADD_SUB_CONFIG}\nversion_policy: {{ all: {{}} }}\n");
    add_model(repo.path(), "a", Some(&policy_all), &[1]);
    add_model(repo.path(), "b", Some(ADD_SUB_CONFIG), &[1]);
    let dp = plane(repo.path(), ControlMode::Poll, &[]);
    dp.manager().load_startup_models().await.unwrap();
    let before = dp.manager().get("a", Some(1)).unwrap();

    add_model(repo.path(), "a", None, &[2]);
    add_model(repo.path(), "c", Some(ADD_SUB_CONFIG), &[1]);
    std::fs::remove_dir_all(repo.path().join("b")).unwrap();
    dp.manager().poll_once().await.unwrap();

    assert_eq!(
        dp.model_metadata("a", None).await.unwrap().versions,
        vec!["1", "2"]
    );
    let after = dp.manager().get("a", Some(1)).unwrap();
    assert!(
        Arc::ptr_eq(&before, &after),
        "the unchanged version keeps running as it was"
    );
    assert!(dp.infer(add_sub_request("c", None)).await.is_ok());
    assert!(matches!(
        dp.infer(add_sub_request("b", None)).await,
        Err(ServiceError::NotFound(_))
    ));
}

#[tokio::test]
async fn auto_complete_fills_a_missing_config() {
    let repo = tempfile::tempdir().unwrap();
    add_model(repo.path(), "auto", None, &[1]);
    let dp = plane(repo.path(), ControlMode::None, &[]);
    dp.manager().load_startup_models().await.unwrap();
    let config = dp.model_config("auto", None).await.unwrap();
    assert_eq!(config.backend, "onnxruntime");
    assert_eq!(config.input.len(), 2);
    assert!(
        config.max_batch_size > 0,
        "dynamic batch dim gives a batching config"
    );
    assert_eq!(config.input[0].dims, vec![4]);
    assert!(dp.infer(add_sub_request("auto", None)).await.is_ok());
}
