//! The Python backend end to end with the real interpreter (`.venv/bin/python`, numpy
//! installed): the `model.py` fixtures in `tests/python_models/` load through the data plane
//! (or the `Backend` API where a test needs to see a sink or a health board directly), and run
//! in real stub processes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use nereid_data_plane::backend::{
    Backend, BackendError, DeviceKind, Health, InstanceContext, Phases, PythonBackend,
    RequestOutcome, RequestView, ServerHandle, StreamEvent,
};
use nereid_data_plane::{Backends, ControlMode, DataPlane};
use nereid_proto::{
    DataType, InferRequest, InferenceService, ParamValue, Parameters, ServiceError, Tensor,
    push_bytes_element,
};

mod common;
use common::{data_plane, workspace};
use nereid_test_support::{eventually_async, floats, fp32_1d};

/// The interpreter every fixture runs with (`make setup` creates it).
fn python() -> PathBuf {
    let p = workspace().join(".venv/bin/python");
    assert!(
        p.exists(),
        "Python interpreter not found at {}: run `make setup`",
        p.display()
    );
    p
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python_models")
        .join(name)
}

/// A repository with copies of the named fixtures, each pointed at the test interpreter
/// through `EXECUTION_ENV_PATH`.
fn repository(models: &[&str]) -> tempfile::TempDir {
    let repo = tempfile::tempdir().unwrap();
    for model in models {
        let dir = repo.path().join(model);
        std::fs::create_dir_all(dir.join("1")).unwrap();
        let source = fixture(model);
        std::fs::copy(source.join("1/model.py"), dir.join("1/model.py")).unwrap();
        let config = std::fs::read_to_string(source.join("config.pbtxt")).unwrap();
        let config = format!(
            "{config}parameters {{ key: \"EXECUTION_ENV_PATH\" value {{ string_value: \"{}\" }} }}\n",
            python().display()
        );
        std::fs::write(dir.join("config.pbtxt"), config).unwrap();
    }
    repo
}

/// A data plane serving `repo`, bound as the server Python models call for BLS.
async fn plane(repo: &Path) -> Arc<DataPlane> {
    let backends = Backends::new(None);
    let dp = data_plane(repo, ControlMode::None, &[], backends.clone(), 16, true);
    let service: Weak<dyn InferenceService> = Arc::downgrade(&dp) as Weak<DataPlane>;
    backends
        .server()
        .bind(service, tokio::runtime::Handle::current());
    dp.manager().load_startup_models().await.unwrap();
    dp
}

/// An instance context for the `Backend` API, from a repository made by [`repository`].
fn context(repo: &Path, model: &str, instance: &str, health: &Arc<Health>) -> InstanceContext {
    let dir = repo.join(model);
    let mut config = nereid_data_plane::config::read_config_file(&dir, None).unwrap();
    config.name = model.to_string();
    nereid_data_plane::config::fill_defaults(&mut config);
    let config = nereid_data_plane::config::ValidModelConfig::try_from(config).unwrap();
    InstanceContext {
        model_name: model.to_string(),
        version: 1,
        model_dir: dir.clone(),
        model_path: dir.join("1/model.py"),
        config: Arc::new(config),
        instance_name: instance.to_string(),
        device: DeviceKind::Cpu,
        health: health.clone(),
        server: Arc::new(ServerHandle::default()),
    }
}

fn request(model: &str, inputs: Vec<Tensor>) -> InferRequest {
    InferRequest {
        model_name: model.into(),
        inputs,
        ..Default::default()
    }
}

/// Polls (the way a client polls readiness) until `ready` says so or 60 s pass.
async fn wait_until_ready(dp: &DataPlane, model: &str) {
    let what = format!("model '{model}' is ready again");
    eventually_async(&what, Duration::from_secs(60), || async {
        dp.model_ready(model, None).await.unwrap()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_fp32_and_bytes_models() {
    let repo = repository(&["add_one", "bytes_echo"]);
    let dp = plane(repo.path()).await;
    assert!(dp.server_ready().await);

    let response = dp
        .infer(request(
            "add_one",
            vec![fp32_1d("INPUT0", &[1.0, 2.5, -4.0])],
        ))
        .await
        .unwrap();
    assert_eq!(response.outputs.len(), 1);
    assert_eq!(response.outputs[0].name(), "OUTPUT0");
    assert_eq!(floats(&response.outputs[0]), vec![2.0, 3.5, -3.0]);

    let mut data = Vec::new();
    for element in [&b"abc"[..], b"", b"\x00\xffz"] {
        push_bytes_element(&mut data, element);
    }
    let strings = Tensor::new("IN", DataType::Bytes, vec![3], Bytes::from(data)).unwrap();
    let response = dp
        .infer(request("bytes_echo", vec![strings]))
        .await
        .unwrap();
    let out = &response.outputs[0];
    assert_eq!((out.name(), out.datatype()), ("OUT", DataType::Bytes));
    let elements: Vec<&[u8]> = nereid_proto::bytes_elements(out.data()).collect();
    assert_eq!(elements, vec![&b"cba"[..], b"", b"z\xff\x00"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raising_execute_fails_only_its_request() {
    let repo = repository(&["raises"]);
    let dp = plane(repo.path()).await;

    let err = dp
        .infer(request("raises", vec![fp32_1d("INPUT0", &[-1.0])]))
        .await
        .unwrap_err();
    assert!(matches!(err, ServiceError::Internal(_)), "{err:?}");
    assert!(
        err.message().contains("negative input is not allowed"),
        "{err:?}"
    );
    let err = dp
        .infer(request("raises", vec![fp32_1d("INPUT0", &[0.0])]))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ServiceError::InvalidArgument(m) if m.contains("zero is not a valid input")),
        "a TritonError response keeps its INVALID_ARG class: {err:?}"
    );
    let ok = dp
        .infer(request("raises", vec![fp32_1d("INPUT0", &[5.0])]))
        .await
        .unwrap();
    assert_eq!(floats(&ok.outputs[0]), vec![5.0]);
    assert!(dp.model_ready("raises", None).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_syntax_error_fails_the_load_with_the_traceback() {
    let repo = repository(&["syntax_error", "add_one"]);
    // Through the data plane: auto-complete imports the model first.
    let dp = plane(repo.path()).await;
    let index = dp.repository_index(false).await.unwrap();
    let row = index.iter().find(|r| r.name == "syntax_error").unwrap();
    assert_eq!(row.state, "UNAVAILABLE");
    assert!(row.reason.contains("SyntaxError"), "{}", row.reason);
    assert!(row.reason.contains("model.py"), "{}", row.reason);
    assert!(dp.model_ready("add_one", None).await.unwrap());

    // Through load_instance: the stub's `init`.
    let backend = PythonBackend::new(None);
    let health = Arc::new(Health::default());
    let ctx = context(repo.path(), "syntax_error", "syntax_error_0", &health);
    let Err(BackendError::Load(reason)) = backend.load_instance(&ctx) else {
        panic!("a syntax error must fail the load");
    };
    assert!(reason.contains("SyntaxError"), "{reason}");
    assert!(reason.contains("instance 'syntax_error_0'"), "{reason}");
}

#[test]
fn a_missing_interpreter_is_named() {
    let repo = repository(&["add_one"]);
    let config_path = repo.path().join("add_one/config.pbtxt");
    let config = std::fs::read_to_string(&config_path).unwrap();
    let python = python().display().to_string();
    std::fs::write(&config_path, config.replace(&python, "/no/such/python3")).unwrap();
    let health = Arc::new(Health::default());
    let ctx = context(repo.path(), "add_one", "add_one_0", &health);
    let Err(BackendError::Load(reason)) = PythonBackend::new(None).load_instance(&ctx) else {
        panic!("a missing interpreter must fail the load");
    };
    assert!(
        reason.contains("EXECUTION_ENV_PATH '/no/such/python3'")
            && reason.contains("does not exist"),
        "{reason}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashing_stub_is_restarted() {
    let repo = repository(&["crasher"]);
    let dp = plane(repo.path()).await;
    let pid_of =
        |outputs: &[Tensor]| i64::from_le_bytes(outputs[1].data()[..8].try_into().unwrap());
    let first = dp
        .infer(request("crasher", vec![fp32_1d("INPUT0", &[7.0])]))
        .await
        .unwrap();
    let mut pid = pid_of(&first.outputs);

    for (trigger, how) in [
        (1.0, "exited with status 3"),
        (2.0, "was killed by signal 9 (SIGKILL)"),
    ] {
        let err = dp
            .infer(request("crasher", vec![fp32_1d("INPUT0", &[trigger])]))
            .await
            .unwrap_err();
        // Triton's reason, naming the instance (`crasher_0`, or `crasher_0_0` where the group
        // index is appended).
        let message = err.message();
        assert!(
            message.contains("Stub process 'crasher_0")
                && message.contains("' is not healthy.")
                && message.contains(how),
            "{err:?}"
        );
        // The version is UNAVAILABLE until the new stub has initialized.
        assert!(!dp.model_ready("crasher", None).await.unwrap());
        let index = dp.repository_index(false).await.unwrap();
        let row = index.iter().find(|r| r.name == "crasher").unwrap();
        assert_eq!(row.state, "UNAVAILABLE");
        assert!(row.reason.contains("is not healthy"), "{}", row.reason);

        wait_until_ready(&dp, "crasher").await;
        let ok = dp
            .infer(request("crasher", vec![fp32_1d("INPUT0", &[4.0])]))
            .await
            .unwrap();
        assert_eq!(floats(&ok.outputs[0]), vec![4.0]);
        let new_pid = pid_of(&ok.outputs);
        assert_ne!(new_pid, pid, "a new stub process serves");
        pid = new_pid;
    }
}

#[test]
fn dropping_an_instance_finalizes_and_cleans_up() {
    let repo = repository(&["crasher"]);
    let health = Arc::new(Health::default());
    let ctx = context(repo.path(), "crasher", "cleanup_check_0", &health);
    let mut instance = PythonBackend::new(None).load_instance(&ctx).unwrap();
    assert!(instance.request_level());
    let inputs = vec![fp32_1d("INPUT0", &[3.0])];
    let outputs = vec!["PID".to_string(), "OUTPUT0".to_string()];
    let params = Parameters::new();
    let view = RequestView {
        key: 1,
        id: "r",
        inputs: &inputs,
        outputs: &outputs,
        parameters: &params,
        correlation_id: None,
        flags: 0,
        stream: None,
    };
    let results = instance
        .execute_requests(&[view], &mut Phases::default())
        .unwrap();
    let got = results
        .into_iter()
        .next()
        .unwrap()
        .into_answer()
        .unwrap()
        .tensors;
    let names: Vec<&str> = got.iter().map(Tensor::name).collect();
    assert_eq!(
        names,
        vec!["PID", "OUTPUT0"],
        "outputs in the requested order"
    );
    let pid = i64::from_le_bytes(got[0].data()[..8].try_into().unwrap());

    // (segment directories of this instance, segment files in them)
    let segments = || {
        let prefix = format!("nereid-py-{}-cleanup_check_0-", std::process::id());
        let dirs: Vec<_> = std::fs::read_dir("/dev/shm")
            .map(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                    .map(|e| e.path())
                    .collect()
            })
            .unwrap_or_default();
        let files = dirs
            .iter()
            .map(|dir| std::fs::read_dir(dir).map_or(0, |entries| entries.count()))
            .sum::<usize>();
        (dirs.len(), files)
    };
    let (dirs, files) = segments();
    assert_eq!(dirs, 1, "one private segment directory for the stub");
    assert!(files > 0, "tensors travelled through segments");
    drop(instance);
    assert!(
        repo.path().join("crasher/finalized").exists(),
        "the model's finalize ran"
    );
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the stub process is gone and reaped"
    );
    assert_eq!(
        segments(),
        (0, 0),
        "the segment directory and every segment file are removed"
    );
    assert!(health.unavailable_reason().is_none());
}

#[test]
fn a_decoupled_model_streams_responses_into_the_sink() {
    let repo = repository(&["decoupled"]);
    let health = Arc::new(Health::default());
    let ctx = context(repo.path(), "decoupled", "decoupled_0", &health);
    let mut instance = PythonBackend::new(None).load_instance(&ctx).unwrap();
    let int32 = |v: i32| {
        Tensor::new(
            "IN",
            DataType::Int32,
            vec![1],
            Bytes::copy_from_slice(&v.to_le_bytes()),
        )
        .unwrap()
    };
    let (inputs_a, inputs_b) = (vec![int32(7)], vec![int32(5)]);
    let outputs = vec!["OUT".to_string()];
    let no_params = Parameters::new();
    let mut one = Parameters::new();
    one.insert("count".into(), ParamValue::Int(1));
    let (sink, mut events) = tokio::sync::mpsc::unbounded_channel();
    let streamed = RequestView {
        key: 11,
        id: "a",
        inputs: &inputs_a,
        outputs: &outputs,
        parameters: &no_params,
        correlation_id: None,
        flags: 0,
        stream: Some(&sink),
    };
    // No stream: exactly one response is expected and becomes the result.
    let unary = RequestView {
        key: 12,
        id: "b",
        inputs: &inputs_b,
        outputs: &outputs,
        parameters: &one,
        correlation_id: None,
        flags: 0,
        stream: None,
    };
    let mut results = instance
        .execute_requests(&[streamed, unary], &mut Phases::default())
        .unwrap()
        .into_iter()
        .map(RequestOutcome::into_answer);
    assert!(results.next().unwrap().unwrap().tensors.is_empty());
    let single = &results.next().unwrap().unwrap().tensors;
    assert_eq!(single[0].data().as_ref(), &5i32.to_le_bytes());

    // The stub sends its responses before `execute` returns, so all are queued by now.
    let mut values = Vec::new();
    loop {
        match events.try_recv().expect("the stream ends with Final") {
            StreamEvent::Response(Ok(response)) => {
                let tensors = &response.tensors;
                assert_eq!(tensors[0].name(), "OUT");
                values.push(i32::from_le_bytes(
                    tensors[0].data()[..4].try_into().unwrap(),
                ));
            }
            StreamEvent::Final => break,
            other => panic!("unexpected event {other:?}"),
        }
    }
    assert_eq!(values, vec![7, 14, 21]);
    assert!(events.try_recv().is_err(), "nothing after Final");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bls_model_calls_another_model() {
    let repo = repository(&["bls", "add_one"]);
    let dp = plane(repo.path()).await;
    let response = dp
        .infer(request("bls", vec![fp32_1d("INPUT0", &[1.0, 2.0])]))
        .await
        .unwrap();
    assert_eq!(floats(&response.outputs[0]), vec![4.0, 6.0]);

    let err = dp
        .infer(request("bls", vec![fp32_1d("INPUT0", &[-1.0])]))
        .await
        .unwrap_err();
    assert!(err.message().contains("missing_model"), "{err:?}");
    // The calling model keeps serving.
    let again = dp
        .infer(request("bls", vec![fp32_1d("INPUT0", &[0.0])]))
        .await
        .unwrap();
    assert_eq!(floats(&again.outputs[0]), vec![2.0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bls_model_streams_from_a_decoupled_model() {
    let repo = repository(&["bls_decoupled", "decoupled"]);
    let dp = plane(repo.path()).await;
    let input = Tensor::new(
        "IN",
        DataType::Int32,
        vec![1],
        Bytes::copy_from_slice(&4i32.to_le_bytes()),
    )
    .unwrap();
    let response = dp
        .infer(request("bls_decoupled", vec![input]))
        .await
        .unwrap();
    let int = |t: &Tensor| i32::from_le_bytes(t.data()[..4].try_into().unwrap());
    assert_eq!(
        int(&response.outputs[0]),
        4 + 8 + 12,
        "the sum of the three responses"
    );
    assert_eq!(int(&response.outputs[1]), 3);
}

/// A Python model's memory is its stubs' own (anonymous) memory, summed over instances: the
/// same on every load, and twice as much with two instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_models_memory_is_its_stubs_anonymous_memory() {
    let memory = |dp: &Arc<DataPlane>| {
        let loaded = dp.manager().get("add_one", Some(1)).unwrap();
        loaded.stats.load().unwrap().memory_bytes
    };
    let (first_repo, second_repo) = (repository(&["add_one"]), repository(&["add_one"]));
    let two_repo = repository(&["add_one"]);
    let config = two_repo.path().join("add_one/config.pbtxt");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("count: 1", "count: 2")).unwrap();

    let first = memory(&plane(first_repo.path()).await);
    let second = memory(&plane(second_repo.path()).await);
    let two = memory(&plane(two_repo.path()).await);
    eprintln!("add_one: {first} B, again {second} B, with two instances {two} B");
    // An interpreter that imported numpy holds megabytes of its own.
    assert!(first > 4 << 20, "one stub measured only {first} B");
    let (low, high) = (first.min(second), first.max(second));
    assert!(
        (high - low) * 10 <= high,
        "the same model measured {first} B and {second} B"
    );
    assert!(
        two * 10 >= first * 18 && two * 10 <= first * 22,
        "two instances measured {two} B, one {first} B"
    );
}
