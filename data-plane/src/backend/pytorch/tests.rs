//! Tests against real libtorch, through the PyTorch backend library (`libnereid_torch_backend.so`,
//! built first: `cargo build --release -p nereid-torch-backend`), and the TorchScript models in
//! `tests/models/pytorch/`, whose `expected.json` holds PyTorch's own outputs (regenerate with
//! scripts/gen_torch_models.py).

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use nereid_proto::pb::inference::model_instance_group::Kind;
use nereid_proto::pb::inference::{ModelConfig, ModelParameter};
use nereid_proto::{DataType, Tensor};
use serde_json::Value;

use super::PyTorchBackend;
use crate::backend::{
    Backend, BackendError, BackendInstance, BatchInputs, DeviceKind, InstanceContext,
};
use crate::config::ValidModelConfig;

fn model_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/models/pytorch")
        .join(name)
}

fn config(name: &str) -> ModelConfig {
    crate::config::read_config_file(&model_dir(name), None).unwrap()
}

fn context(config: ModelConfig, device: DeviceKind) -> InstanceContext {
    let dir = model_dir(&config.name);
    InstanceContext {
        model_name: config.name.clone(),
        version: 1,
        model_path: dir.join("1/model.pt"),
        model_dir: dir,
        config: Arc::new(ValidModelConfig::unchecked(config)),
        instance_name: "group_0".into(),
        device,
        health: Default::default(),
        server: Default::default(),
    }
}

fn load_with(
    backend: &PyTorchBackend,
    config: ModelConfig,
) -> Result<Box<dyn BackendInstance>, BackendError> {
    backend.load_instance(&context(config, DeviceKind::Cpu))
}

fn load(config: ModelConfig) -> Result<Box<dyn BackendInstance>, BackendError> {
    load_with(&PyTorchBackend::default(), config)
}

fn load_err(config: ModelConfig) -> String {
    match load(config) {
        Ok(_) => panic!("the model loaded"),
        Err(e) => e.to_string(),
    }
}

/// A JSON tensor of expected.json (`{"datatype", "shape", "data"}`) as a wire tensor.
fn tensor(name: &str, json: &Value) -> Tensor {
    let datatype = DataType::from_wire(json["datatype"].as_str().unwrap()).unwrap();
    let shape: Vec<i64> = serde_json::from_value(json["shape"].clone()).unwrap();
    let mut data = Vec::new();
    for v in json["data"].as_array().unwrap() {
        let f = v.as_f64();
        let i = v.as_i64();
        match datatype {
            DataType::Bool => data.push(u8::from(v.as_bool().unwrap())),
            DataType::Uint8 => data.push(i.unwrap() as u8),
            DataType::Int8 => data.extend((i.unwrap() as i8).to_le_bytes()),
            DataType::Int16 => data.extend((i.unwrap() as i16).to_le_bytes()),
            DataType::Int32 => data.extend((i.unwrap() as i32).to_le_bytes()),
            DataType::Int64 => data.extend(i.unwrap().to_le_bytes()),
            DataType::Fp16 => data.extend(half::f16::from_f64(f.unwrap()).to_le_bytes()),
            DataType::Bf16 => data.extend(half::bf16::from_f64(f.unwrap()).to_le_bytes()),
            DataType::Fp32 => data.extend((f.unwrap() as f32).to_le_bytes()),
            DataType::Fp64 => data.extend(f.unwrap().to_le_bytes()),
            DataType::Bytes => {
                nereid_proto::push_bytes_element(&mut data, v.as_str().unwrap().as_bytes())
            }
            other => panic!("no fixture uses {other}"),
        }
    }
    Tensor::new(name, datatype, shape, Bytes::from(data)).unwrap()
}

fn expected(name: &str) -> Value {
    let text = std::fs::read_to_string(model_dir(name).join("expected.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Element values as f64, for comparing floats with a tolerance.
fn values(t: &Tensor) -> Vec<f64> {
    let d = t.data();
    match t.datatype() {
        DataType::Fp32 => d
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        DataType::Fp16 => d
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes(c.try_into().unwrap()).to_f64())
            .collect(),
        DataType::Bf16 => d
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes(c.try_into().unwrap()).to_f64())
            .collect(),
        DataType::Fp64 => d
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        _ => panic!("not a float tensor"),
    }
}

/// Runs a fixture on its stored inputs and compares every output with PyTorch's.
fn check_fixture(name: &str, config: ModelConfig) {
    let exp = expected(name);
    let inputs: Vec<Tensor> = exp["inputs"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| tensor(k, v))
        .collect();
    let mut instance = load(config).unwrap();
    let outputs = instance
        .execute(&BatchInputs::single(&inputs), &[])
        .unwrap();
    let want = exp["outputs"].as_object().unwrap();
    assert_eq!(outputs.len(), want.len(), "{name}");
    for out in &outputs {
        let w = tensor(out.name(), &want[out.name()]);
        assert_eq!(
            (out.datatype(), out.shape()),
            (w.datatype(), w.shape()),
            "{name} {}",
            out.name()
        );
        if matches!(
            out.datatype(),
            DataType::Fp32 | DataType::Fp16 | DataType::Bf16 | DataType::Fp64
        ) {
            for (got, exp) in values(out).iter().zip(values(&w)) {
                assert!(
                    (got - exp).abs() <= 1e-5 * exp.abs().max(1.0),
                    "{name} {}: {got} vs {exp}",
                    out.name()
                );
            }
        } else {
            assert_eq!(out.data(), w.data(), "{name} {}", out.name());
        }
    }
}

#[test]
fn every_fixture_matches_pytorch() {
    for name in [
        "mlp_script",
        "conv_trace",
        "add_sub_script",
        "types_script",
        "dict_script",
        "strings_script",
    ] {
        check_fixture(name, config(name));
    }
}

#[test]
fn outputs_come_back_as_requested() {
    let exp = expected("add_sub_script");
    let inputs = [
        tensor("b", &exp["inputs"]["b"]),
        tensor("a", &exp["inputs"]["a"]),
    ];
    let mut instance = load(config("add_sub_script")).unwrap();
    let out = instance
        .execute(&BatchInputs::single(&inputs), &["DIFF__1".into()])
        .unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].name(), "DIFF__1");
    assert_eq!(
        out[0].data(),
        tensor("DIFF__1", &exp["outputs"]["DIFF__1"]).data()
    );
    let e = instance
        .execute(&BatchInputs::single(&inputs), &["NOPE".into()])
        .unwrap_err();
    assert_eq!(
        e,
        BackendError::InvalidInput(
            "unexpected inference output 'NOPE' for model 'add_sub_script'".into()
        )
    );
}

#[test]
fn a_failed_execution_leaves_the_instance_serving() {
    let mut instance = load(config("mlp_script")).unwrap();
    let wrong = Tensor::new(
        "INPUT__0",
        DataType::Fp32,
        vec![2, 5],
        Bytes::from(vec![0u8; 40]),
    )
    .unwrap();
    match instance.execute(&BatchInputs::single(&[wrong]), &[]) {
        Err(BackendError::Execution(message)) => {
            assert!(
                message.starts_with("PyTorch execute failure for model 'mlp_script': "),
                "{message}"
            );
            assert!(!message.contains("frame #"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    check_fixture("mlp_script", config("mlp_script"));
}

#[test]
fn kind_gpu_fails_to_load_without_a_cuda_libtorch() {
    let mut c = config("mlp_script");
    c.instance_group[0].kind = Kind::Gpu as i32;
    let e = PyTorchBackend::default()
        .load_instance(&context(c, DeviceKind::Gpu { device_id: 0 }))
        .err()
        .unwrap();
    if let Err(why) = PyTorchBackend::default().gpu_support() {
        // KIND_AUTO stays on the CPU for PyTorch models here, for this reason.
        assert!(
            why.starts_with("libtorch_cuda.so could not be loaded")
                || why.starts_with("libtorch sees no CUDA device"),
            "{why}"
        );
        assert_eq!(
            e.to_string(),
            format!(
                "model 'mlp_script' instance 'group_0': KIND_GPU (GPU 0) requested, but libtorch cannot use CUDA here: {why}; use KIND_CPU to run this model on the CPU"
            )
        );
    }
}

#[test]
fn configs_that_cannot_work_fail_to_load_with_reasons() {
    let mut c = config("mlp_script");
    c.input.push(c.input[0].clone());
    c.input[1].name = "INPUT__1".into();
    assert_eq!(
        load_err(c),
        "unable to load model 'mlp_script': configuration expects 2 inputs, model provides 1 (forward(x: Tensor))"
    );

    let mut c = config("mlp_script");
    c.parameters.insert(
        "DISABLE_OPTIMIZED_EXECUTION".into(),
        ModelParameter {
            string_value: "sometimes".into(),
        },
    );
    assert_eq!(
        load_err(c),
        "unable to load model 'mlp_script': parameter 'DISABLE_OPTIMIZED_EXECUTION' must be a boolean (true/false, 1/0, on/off), got 'sometimes'"
    );

    let mut c = config("mlp_script");
    c.output[0].data_type = DataType::Uint32.to_config() as i32;
    assert_eq!(
        load_err(c),
        "unable to load model 'mlp_script': output 'OUTPUT__0': data type TYPE_UINT32 is not supported by the PyTorch backend (libtorch has no tensor of that type)"
    );

    let mut c = config("mlp_script");
    c.output.clear();
    assert!(load_err(c).contains("config.pbtxt lists no outputs"));

    let mut c = config("mlp_script");
    c.output[0].name = "OUTPUT__1".into();
    assert_eq!(
        load_err(c),
        "unable to load model 'mlp_script': output 'OUTPUT__1': index 1 is out of range, the model has 1 outputs (indices start at 0)"
    );

    let dir = tempfile::tempdir().unwrap();
    let mut ctx = context(config("mlp_script"), DeviceKind::Cpu);
    ctx.model_path = dir.path().join("model.pt");
    std::fs::write(&ctx.model_path, b"not a zip").unwrap();
    let e = PyTorchBackend::default().load_instance(&ctx).err().unwrap();
    assert!(
        e.to_string().starts_with(&format!(
            "model 'mlp_script' instance 'group_0': cannot load TorchScript file '{}'",
            ctx.model_path.display()
        )),
        "{e}"
    );
}

#[test]
fn parameters_keep_results_and_weights_can_be_shared() {
    let mut c = config("mlp_script");
    for (k, v) in [
        ("DISABLE_OPTIMIZED_EXECUTION", "true"),
        ("ENABLE_JIT_PROFILING", "false"),
        ("ENABLE_WEIGHT_SHARING", "true"),
        ("INTRA_OP_THREAD_COUNT", "1"),
    ] {
        c.parameters.insert(
            k.into(),
            ModelParameter {
                string_value: v.into(),
            },
        );
    }
    check_fixture("mlp_script", c.clone());
    let backend = PyTorchBackend::default();
    let first = load_with(&backend, c.clone()).unwrap();
    let _second = load_with(&backend, c).unwrap();
    assert_eq!(backend.shared.len(), 1);
    drop(first);
    assert_eq!(super::library::library().unwrap().num_threads(), 1);
}
