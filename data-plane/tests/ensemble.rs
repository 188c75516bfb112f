//! Ensembles end to end, in process: identity-backend and ONNX Runtime (`add_sub.onnx`)
//! composing models wired into pipelines, a diamond and a nested ensemble; batching of
//! ensemble traffic by the composing model's scheduler; load order at startup; explicit loads
//! that bring composing models along, `unload_dependents`; `max_inflight_requests` holding a
//! step to its limit; a composing model that goes away;
//! load-time errors in the repository index and the load API.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::path::Path;
use std::sync::Arc;

use nereid_data_plane::{Backends, ControlMode, DataPlane};
use nereid_proto::{
    InferRequest, InferenceService, LoadRequest, ModelIndexEntry, ParamValue, RequestedOutput,
    ServiceError, Tensor, UnloadRequest,
};

mod common;
use common::{data_plane, ort_library, workspace};
use nereid_test_support::floats;

/// `add_sub`: INPUT0, INPUT1 FP32 [4] -> OUTPUT0 = a + b, OUTPUT1 = a - b (ONNX Runtime).
const ADD_SUB: &str = r#"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"#;

/// An identity-backend model: INPUT0 FP32 [4] -> OUTPUT0 (a copy).
fn identity(extra: &str) -> String {
    format!(
        r#"backend: "identity"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}"#
    )
}

/// A step: `(model, [(model input, tensor)], [(model output, tensor)])`.
type Step<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [(&'a str, &'a str)]);

/// An ensemble config: `io` (inputs and outputs) and `steps`.
fn ensemble(max_batch_size: i32, io: &str, steps: &[Step<'_>]) -> String {
    let steps: Vec<String> = steps
        .iter()
        .map(|(model, inputs, outputs)| {
            let map = |kind: &str, pairs: &[(&str, &str)]| {
                pairs
                    .iter()
                    .map(|(k, v)| format!("{kind} {{ key: \"{k}\" value: \"{v}\" }}\n"))
                    .collect::<String>()
            };
            format!(
                "{{ model_name: \"{model}\" model_version: -1\n{}{}}}",
                map("input_map", inputs),
                map("output_map", outputs)
            )
        })
        .collect();
    format!(
        "platform: \"ensemble\"\nmax_batch_size: {max_batch_size}\n{io}\nensemble_scheduling {{ step [ {} ] }}\n",
        steps.join(",\n")
    )
}

const IO_IN_SUM_DIFF: &str = r#"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "DIFF" data_type: TYPE_FP32 dims: [ 4 ] } ]"#;

const IO_IN_OUT: &str = r#"
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]"#;

/// `pipeline`: IN ─► copy (identity) ─► COPY; add_sub(COPY, IN) ─► SUM = 2 IN, DIFF = 0.
fn pipeline() -> String {
    ensemble(
        8,
        IO_IN_SUM_DIFF,
        &[
            ("copy", &[("INPUT0", "IN")], &[("OUTPUT0", "COPY")]),
            (
                "add_sub",
                &[("INPUT0", "COPY"), ("INPUT1", "IN")],
                &[("OUTPUT0", "SUM"), ("OUTPUT1", "DIFF")],
            ),
        ],
    )
}

/// `diamond`: IN ─► left (identity) ─► L, IN ─► right (identity) ─► R; add_sub(L, R).
fn diamond() -> String {
    ensemble(
        8,
        IO_IN_SUM_DIFF,
        &[
            (
                "add_sub",
                &[("INPUT0", "L"), ("INPUT1", "R")],
                &[("OUTPUT0", "SUM"), ("OUTPUT1", "DIFF")],
            ),
            ("left", &[("INPUT0", "IN")], &[("OUTPUT0", "L")]),
            ("right", &[("INPUT0", "IN")], &[("OUTPUT0", "R")]),
        ],
    )
}

fn write_model(repo: &Path, name: &str, config: &str, onnx: bool) {
    let version = repo.join(name).join("1");
    std::fs::create_dir_all(&version).unwrap();
    std::fs::write(repo.join(name).join("config.pbtxt"), config).unwrap();
    if onnx {
        std::fs::copy(
            workspace().join("data-plane/src/backend/onnx/testdata/add_sub.onnx"),
            version.join("model.onnx"),
        )
        .unwrap();
    }
}

/// add_sub, copy, left, right, slow (identity, 150 ms per execution, dynamic batching),
/// pipeline, diamond, outer (pipeline nested), batched (over slow).
fn repository() -> tempfile::TempDir {
    let repo = tempfile::tempdir().unwrap();
    let r = repo.path();
    write_model(r, "add_sub", ADD_SUB, true);
    for name in ["copy", "left", "right"] {
        write_model(r, name, &identity(""), false);
    }
    write_model(
        r,
        "slow",
        &identity(
            "parameters { key: \"execute_delay_ms\" value: { string_value: \"150\" } }\ndynamic_batching { max_queue_delay_microseconds: 50000 }",
        ),
        false,
    );
    write_model(r, "pipeline", &pipeline(), false);
    write_model(r, "diamond", &diamond(), false);
    write_model(
        r,
        "outer",
        &ensemble(
            4,
            IO_IN_SUM_DIFF,
            &[(
                "pipeline",
                &[("IN", "IN")],
                &[("SUM", "SUM"), ("DIFF", "DIFF")],
            )],
        ),
        false,
    );
    write_model(
        r,
        "batched",
        &ensemble(
            8,
            IO_IN_OUT,
            &[("slow", &[("INPUT0", "IN")], &[("OUTPUT0", "OUT")])],
        ),
        false,
    );
    repo
}

fn plane(repo: &Path, mode: ControlMode, startup: &[&str]) -> Arc<DataPlane> {
    let backends = Backends::new(Some(ort_library()));
    data_plane(repo, mode, startup, backends, 64, false)
}

fn fp32(name: &str, values: &[f32]) -> Tensor {
    nereid_test_support::fp32(name, vec![1, values.len() as i64], values)
}

fn request(model: &str, inputs: Vec<Tensor>) -> InferRequest {
    InferRequest {
        model_name: model.into(),
        id: "r-1".into(),
        inputs,
        ..Default::default()
    }
}

fn output<'a>(outputs: &'a [Tensor], name: &str) -> &'a Tensor {
    outputs
        .iter()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("no output '{name}' in {outputs:?}"))
}

async fn index_row(dp: &DataPlane, name: &str) -> ModelIndexEntry {
    let index = dp.repository_index(false).await.unwrap();
    index
        .into_iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("'{name}' is not in the index"))
}

async fn success_count(dp: &DataPlane, model: &str) -> u64 {
    let stats = dp.model_statistics(model, None).await.unwrap();
    let inference = stats[0].inference_stats.as_ref().unwrap();
    inference.success.as_ref().unwrap().count
}

const X: [f32; 4] = [1.0, -2.0, 3.5, 10.0];

#[tokio::test]
async fn a_pipeline_gives_what_its_steps_give_by_hand() {
    let repo = repository();
    let dp = plane(repo.path(), ControlMode::None, &[]);
    dp.manager().load_startup_models().await.unwrap();
    assert!(dp.model_ready("pipeline", None).await.unwrap());

    let by_ensemble = dp
        .infer(request("pipeline", vec![fp32("IN", &X)]))
        .await
        .unwrap();
    assert_eq!(by_ensemble.model_name, "pipeline");
    assert_eq!(by_ensemble.model_version, "1");
    assert_eq!(by_ensemble.id, "r-1");

    let copied = dp
        .infer(request("copy", vec![fp32("INPUT0", &X)]))
        .await
        .unwrap();
    let by_hand = dp
        .infer(request(
            "add_sub",
            vec![
                copied.outputs[0].clone().renamed("INPUT0"),
                fp32("INPUT1", &X),
            ],
        ))
        .await
        .unwrap();
    let names: Vec<&str> = by_ensemble.outputs.iter().map(Tensor::name).collect();
    assert_eq!(names, ["SUM", "DIFF"], "all outputs, in config order");
    assert_eq!(by_ensemble.outputs[0].data(), by_hand.outputs[0].data());
    assert_eq!(by_ensemble.outputs[1].data(), by_hand.outputs[1].data());
    assert_eq!(floats(&by_ensemble.outputs[0]), vec![2.0, -4.0, 7.0, 20.0]);
    assert_eq!(by_ensemble.outputs[0].shape(), &[1, 4]);

    // Only what was asked for.
    let mut only_diff = request("pipeline", vec![fp32("IN", &X)]);
    only_diff.outputs = vec![RequestedOutput {
        name: "DIFF".into(),
        ..Default::default()
    }];
    let r = dp.infer(only_diff).await.unwrap();
    assert_eq!(r.outputs.len(), 1);
    assert_eq!(floats(&r.outputs[0]), vec![0.0; 4]);

    // A nested ensemble runs the inner one as a step.
    let nested = dp
        .infer(request("outer", vec![fp32("IN", &X)]))
        .await
        .unwrap();
    assert_eq!(
        floats(output(&nested.outputs, "SUM")),
        vec![2.0, -4.0, 7.0, 20.0]
    );

    // The ensemble counts its own requests; its steps count in the composing models.
    assert_eq!(success_count(&dp, "pipeline").await, 3);
    assert_eq!(success_count(&dp, "outer").await, 1);
    assert_eq!(
        success_count(&dp, "copy").await,
        4,
        "3 ensemble steps + 1 by hand"
    );
    let stats = dp.model_statistics("pipeline", None).await.unwrap();
    assert_eq!(stats[0].inference_count, 3);
    assert_eq!(
        stats[0].execution_count, 0,
        "an ensemble executes nothing itself"
    );

    let meta = dp.model_metadata("pipeline", None).await.unwrap();
    assert_eq!(meta.platform, "ensemble");
    assert_eq!(meta.inputs[0].shape, vec![-1, 4]);
    let config = dp.model_config("pipeline", None).await.unwrap();
    assert!(config.instance_group.is_empty());
    assert_eq!(config.backend, "");
}

#[tokio::test]
async fn a_diamond_joins_two_parallel_steps() {
    let repo = repository();
    let dp = plane(repo.path(), ControlMode::None, &[]);
    dp.manager().load_startup_models().await.unwrap();
    let r = dp
        .infer(request("diamond", vec![fp32("IN", &X)]))
        .await
        .unwrap();
    assert_eq!(
        floats(output(&r.outputs, "SUM")),
        vec![2.0, -4.0, 7.0, 20.0]
    );
    assert_eq!(floats(output(&r.outputs, "DIFF")), vec![0.0; 4]);
    assert_eq!(success_count(&dp, "left").await, 1);
    assert_eq!(success_count(&dp, "right").await, 1);
}

#[tokio::test]
async fn ensemble_traffic_is_batched_by_the_composing_model() {
    let repo = repository();
    let dp = plane(repo.path(), ControlMode::None, &[]);
    dp.manager().load_startup_models().await.unwrap();
    let calls = (0..6).map(|i| {
        let dp = dp.clone();
        async move {
            let values = [i as f32; 4];
            let r = dp
                .infer(request("batched", vec![fp32("IN", &values)]))
                .await
                .unwrap();
            assert_eq!(
                floats(&r.outputs[0]),
                values,
                "each request gets its own answer"
            );
        }
    });
    futures::future::join_all(calls).await;
    let slow = &dp.model_statistics("slow", None).await.unwrap()[0];
    assert_eq!(slow.inference_count, 6);
    assert!(
        slow.execution_count < 6,
        "6 concurrent ensemble requests ran in {} executions of 'slow'",
        slow.execution_count
    );
}

/// `max_inflight_requests: 2`: however many ensemble requests come at once, the step's model
/// never holds more than 2 of them, so its dynamic batcher (which batches 6 unthrottled
/// requests, see above) never forms a batch of more than 2.
#[tokio::test]
async fn max_inflight_requests_bounds_what_a_step_holds_at_once() {
    let repo = repository();
    let throttled = ensemble(
        8,
        IO_IN_OUT,
        &[("slow", &[("INPUT0", "IN")], &[("OUTPUT0", "OUT")])],
    )
    .replace(
        "ensemble_scheduling {",
        "ensemble_scheduling { max_inflight_requests: 2",
    );
    write_model(repo.path(), "throttled", &throttled, false);
    let dp = plane(repo.path(), ControlMode::None, &[]);
    dp.manager().load_startup_models().await.unwrap();
    let calls = (0..6).map(|i| {
        let dp = dp.clone();
        async move {
            let values = [i as f32; 4];
            let r = dp
                .infer(request("throttled", vec![fp32("IN", &values)]))
                .await
                .unwrap();
            assert_eq!(floats(&r.outputs[0]), values);
        }
    });
    futures::future::join_all(calls).await;
    let slow = &dp.model_statistics("slow", None).await.unwrap()[0];
    assert_eq!(slow.inference_count, 6);
    let sizes: Vec<u64> = slow.batch_stats.iter().map(|b| b.batch_size).collect();
    assert!(
        sizes.iter().all(|&n| n <= 2),
        "'slow' ran batches of sizes {sizes:?} under max_inflight_requests 2"
    );
    assert!(slow.execution_count >= 3, "{}", slow.execution_count);
}

#[tokio::test]
async fn a_step_error_keeps_its_class_and_names_the_step() {
    let repo = repository();
    // IN has a variable size, but `copy` takes exactly 4 values: valid at load, the request
    // decides.
    let loose = ensemble(
        8,
        r#"input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
           output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]"#,
        &[("copy", &[("INPUT0", "IN")], &[("OUTPUT0", "OUT")])],
    );
    write_model(repo.path(), "loose", &loose, false);
    let dp = plane(repo.path(), ControlMode::None, &[]);
    dp.manager().load_startup_models().await.unwrap();

    let mut bad = request("loose", vec![fp32("IN", &[1.0, 2.0, 3.0])]);
    bad.id = "r-9".into();
    bad.parameters
        .insert("note".into(), ParamValue::String("x".into()));
    let err = dp.infer(bad).await.unwrap_err();
    let ServiceError::InvalidArgument(message) = &err else {
        panic!("a composing model's 400 must stay a 400: {err:?}")
    };
    assert!(
        message.starts_with(
            "ensemble 'loose' step 0 (model 'copy'): [request id: r-9] unexpected shape for input 'INPUT0' for model 'copy'"
        ),
        "{message}"
    );
    let stats = dp.model_statistics("loose", None).await.unwrap();
    let inference = stats[0].inference_stats.as_ref().unwrap();
    assert_eq!(inference.fail.as_ref().unwrap().count, 1);

    // The ensemble's own inputs are checked with its own name.
    let err = dp
        .infer(request("pipeline", vec![fp32("IN", &[1.0])]))
        .await
        .unwrap_err();
    assert!(
        err.message()
            .contains("unexpected shape for input 'IN' for model 'pipeline'"),
        "{err:?}"
    );
}

#[tokio::test]
async fn startup_builds_ensembles_after_their_composing_models() {
    // Names that sort the wrong way round: the ensemble first, its models last.
    let repo = tempfile::tempdir().unwrap();
    let r = repo.path();
    write_model(r, "zz_add_sub", ADD_SUB, true);
    write_model(r, "zz_copy", &identity(""), false);
    let a = pipeline()
        .replace("\"copy\"", "\"zz_copy\"")
        .replace("\"add_sub\"", "\"zz_add_sub\"");
    write_model(r, "a_ensemble", &a, false);
    write_model(
        r,
        "a_outer",
        &ensemble(
            8,
            IO_IN_SUM_DIFF,
            &[(
                "a_ensemble",
                &[("IN", "IN")],
                &[("SUM", "SUM"), ("DIFF", "DIFF")],
            )],
        ),
        false,
    );
    let dp = plane(r, ControlMode::None, &[]);
    dp.manager().load_startup_models().await.unwrap();
    for name in ["a_ensemble", "a_outer"] {
        let row = index_row(&dp, name).await;
        assert_eq!(
            (row.state.as_str(), row.reason.as_str()),
            ("READY", ""),
            "{name}"
        );
    }
    assert!(
        dp.infer(request("a_outer", vec![fp32("IN", &X)]))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn explicit_load_brings_composing_models_and_unload_dependents_takes_them_away() {
    let repo = repository();
    let dp = plane(repo.path(), ControlMode::Explicit, &[]);
    dp.manager().load_startup_models().await.unwrap();
    assert!(
        dp.manager().readiness("copy", None).is_err(),
        "nothing loaded yet: the model is not known at all"
    );
    assert!(!dp.model_ready("copy", None).await.unwrap());

    dp.load_model("pipeline", LoadRequest::default())
        .await
        .unwrap();
    for name in ["pipeline", "copy", "add_sub"] {
        assert!(dp.model_ready(name, None).await.unwrap(), "{name}");
    }
    assert!(
        dp.infer(request("pipeline", vec![fp32("IN", &X)]))
            .await
            .is_ok()
    );
    // `diamond` shares add_sub with `pipeline`.
    dp.load_model("diamond", LoadRequest::default())
        .await
        .unwrap();

    // Without unload_dependents only the ensemble goes.
    dp.unload_model("diamond", UnloadRequest::new(false))
        .await
        .unwrap();
    assert!(dp.model_ready("left", None).await.unwrap());
    dp.load_model("diamond", LoadRequest::default())
        .await
        .unwrap();

    // With it, the composing models go too, except add_sub, which `diamond` still uses.
    dp.unload_model("pipeline", UnloadRequest::new(true))
        .await
        .unwrap();
    assert_eq!(index_row(&dp, "pipeline").await.reason, "unloaded");
    assert_eq!(index_row(&dp, "copy").await.reason, "unloaded");
    assert!(dp.model_ready("add_sub", None).await.unwrap());
    dp.unload_model("diamond", UnloadRequest::new(true))
        .await
        .unwrap();
    for name in ["diamond", "left", "right", "add_sub"] {
        let row = index_row(&dp, name).await;
        assert_eq!(
            (row.state.as_str(), row.reason.as_str()),
            ("UNAVAILABLE", "unloaded"),
            "{name}"
        );
    }
}

#[tokio::test]
async fn a_missing_composing_model_makes_the_ensemble_unavailable_until_it_is_back() {
    let repo = repository();
    let dp = plane(repo.path(), ControlMode::Explicit, &["pipeline"]);
    dp.manager().load_startup_models().await.unwrap();
    assert!(
        dp.infer(request("pipeline", vec![fp32("IN", &X)]))
            .await
            .is_ok()
    );

    dp.unload_model("copy", UnloadRequest::new(false))
        .await
        .unwrap();
    let err = dp
        .infer(request("pipeline", vec![fp32("IN", &X)]))
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ServiceError::Unavailable(
            "ensemble 'pipeline' is not available: composing model 'copy' of ensemble 'pipeline' is not loaded".into()
        )
    );
    assert!(!dp.model_ready("pipeline", None).await.unwrap());
    let row = index_row(&dp, "pipeline").await;
    assert_eq!(row.state, "UNAVAILABLE");
    assert!(row.reason.contains("'copy'"), "{}", row.reason);
    assert!(
        !dp.repository_index(true)
            .await
            .unwrap()
            .iter()
            .any(|r| r.name == "pipeline"),
        "a ready-only index leaves it out"
    );

    dp.load_model("copy", LoadRequest::default()).await.unwrap();
    assert!(dp.model_ready("pipeline", None).await.unwrap());
    assert!(
        dp.infer(request("pipeline", vec![fp32("IN", &X)]))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn load_errors_name_the_ensemble_the_step_and_the_tensor() {
    let repo = repository();
    let r = repo.path();
    let one_step = |model: &str| {
        ensemble(
            8,
            IO_IN_OUT,
            &[(model, &[("INPUT0", "IN")], &[("OUTPUT0", "OUT")])],
        )
    };
    write_model(r, "bad_unknown", &one_step("no_such_model"), false);
    write_model(
        r,
        "bad_dtype",
        &one_step("copy").replacen("TYPE_FP32", "TYPE_INT32", 1),
        false,
    );
    write_model(
        r,
        "bad_cycle_a",
        &one_step("bad_cycle_b")
            .replace("INPUT0", "IN")
            .replace("OUTPUT0", "OUT"),
        false,
    );
    write_model(
        r,
        "bad_cycle_b",
        &one_step("bad_cycle_a")
            .replace("INPUT0", "IN")
            .replace("OUTPUT0", "OUT"),
        false,
    );

    // Startup (none mode): the reasons are in the index.
    let dp = plane(r, ControlMode::None, &[]);
    dp.manager().load_startup_models().await.unwrap();
    let expect = [
        (
            "bad_unknown",
            "ensemble 'bad_unknown' step 0: composing model 'no_such_model' is not available: it is not in the model repository",
        ),
        (
            "bad_dtype",
            "ensemble 'bad_dtype' tensor 'IN': data type mismatch: step 0 (model 'copy') input 'INPUT0' expects TYPE_FP32, but ensemble input 'IN' is TYPE_INT32",
        ),
        (
            "bad_cycle_a",
            "circular dependency between ensembles: bad_cycle_a -> bad_cycle_b -> bad_cycle_a",
        ),
    ];
    for (name, reason) in expect {
        let row = index_row(&dp, name).await;
        assert_eq!(
            (row.state.as_str(), row.reason.as_str()),
            ("UNAVAILABLE", reason)
        );
    }
    assert!(
        dp.model_ready("pipeline", None).await.unwrap(),
        "the good ones still load"
    );

    // Explicit mode: the load API answers with the same reasons.
    let dp = plane(r, ControlMode::Explicit, &[]);
    dp.manager().load_startup_models().await.unwrap();
    let err = dp
        .load_model("bad_dtype", LoadRequest::default())
        .await
        .unwrap_err();
    assert_eq!(
        err,
        ServiceError::InvalidArgument(format!("failed to load 'bad_dtype': {}", expect[1].1))
    );
    let err = dp
        .load_model("bad_cycle_a", LoadRequest::default())
        .await
        .unwrap_err();
    assert!(
        err.message().contains(
            "circular dependency between ensembles: bad_cycle_a -> bad_cycle_b -> bad_cycle_a"
        ),
        "{err:?}"
    );
    // The composing model it did load (copy) stays loaded.
    assert!(dp.model_ready("copy", None).await.unwrap());
}

#[tokio::test]
async fn poll_mode_rebuilds_ensembles_when_their_models_come_and_go() {
    let repo = tempfile::tempdir().unwrap();
    let r = repo.path();
    write_model(r, "copy", "backend: \"identity\"\nnot_a_field: 1\n", false);
    let one_step = ensemble(
        8,
        IO_IN_OUT,
        &[("copy", &[("INPUT0", "IN")], &[("OUTPUT0", "OUT")])],
    );
    write_model(r, "ens", &one_step, false);
    let dp = plane(r, ControlMode::Poll, &[]);
    dp.manager().load_startup_models().await.unwrap();
    let row = index_row(&dp, "ens").await;
    assert_eq!(row.state, "UNAVAILABLE");
    assert!(
        row.reason.starts_with(
            "ensemble 'ens' step 0: composing model 'copy' is not available: it failed to load: "
        ),
        "{}",
        row.reason
    );

    // The composing model is fixed: the ensemble, unchanged on disk, loads with it.
    std::fs::write(r.join("copy/config.pbtxt"), identity("")).unwrap();
    dp.manager().poll_once().await.unwrap();
    assert!(dp.model_ready("ens", None).await.unwrap());
    assert!(dp.infer(request("ens", vec![fp32("IN", &X)])).await.is_ok());

    // Removed: the ensemble keeps its version but cannot serve.
    std::fs::remove_dir_all(r.join("copy")).unwrap();
    dp.manager().poll_once().await.unwrap();
    let row = index_row(&dp, "ens").await;
    assert_eq!(
        (row.state.as_str(), row.reason.as_str()),
        (
            "UNAVAILABLE",
            "composing model 'copy' of ensemble 'ens' is not loaded"
        )
    );
    let err = dp
        .infer(request("ens", vec![fp32("IN", &X)]))
        .await
        .unwrap_err();
    assert!(matches!(err, ServiceError::Unavailable(_)), "{err:?}");

    // Back again.
    write_model(r, "copy", &identity(""), false);
    dp.manager().poll_once().await.unwrap();
    assert!(dp.model_ready("ens", None).await.unwrap());
    assert!(dp.infer(request("ens", vec![fp32("IN", &X)])).await.is_ok());
}
