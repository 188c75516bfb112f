//! Tests against the real ONNX Runtime library and the models in `testdata/`
//! (regenerate them with `testdata/make_fixtures.py`).
//!
//! The library comes from `NEREID_ORT_LIBRARY`, else the workspace's `.venv` that `make setup`
//! creates. Without it these tests fail (they do not skip): the backend is untested otherwise.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use nereid_proto::pb::inference::model_config::SchedulingChoice;
use nereid_proto::pb::inference::model_instance_group::Kind;
use nereid_proto::pb::inference::model_optimization_policy::execution_accelerators::Accelerator;
use nereid_proto::pb::inference::model_optimization_policy::{ExecutionAccelerators, Graph};
use nereid_proto::pb::inference::{
    ModelConfig, ModelInput, ModelOptimizationPolicy, ModelOutput, ModelParameter,
};
use nereid_proto::{DataType, Tensor, bytes_elements, push_bytes_element};

use super::OnnxRuntimeBackend;
use crate::backend::{
    Backend, BackendError, BackendInstance, Backends, BatchInputs, CompleteOptions, DeviceKind,
    InstanceContext, complete,
};
use crate::config::{GroupKind, ValidModelConfig};

pub(super) fn library() -> PathBuf {
    if let Some(path) = std::env::var_os("NEREID_ORT_LIBRARY") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "NEREID_ORT_LIBRARY={} does not exist",
            path.display()
        );
        return path;
    }
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../.venv/lib/python3.11/site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1");
    assert!(
        path.is_file(),
        "ONNX Runtime library not found at {}: run `make setup` (or set NEREID_ORT_LIBRARY)",
        path.display()
    );
    path
}

fn backend() -> OnnxRuntimeBackend {
    OnnxRuntimeBackend::new(Some(library()))
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("src/backend/onnx/testdata")
        .join(name)
}

fn input(name: &str, dt: DataType, dims: &[i64]) -> ModelInput {
    ModelInput {
        name: name.into(),
        data_type: dt.to_config() as i32,
        dims: dims.to_vec(),
        ..Default::default()
    }
}

fn output(name: &str, dt: DataType, dims: &[i64]) -> ModelOutput {
    ModelOutput {
        name: name.into(),
        data_type: dt.to_config() as i32,
        dims: dims.to_vec(),
        ..Default::default()
    }
}

fn add_sub_config() -> ModelConfig {
    let f = DataType::Fp32;
    ModelConfig {
        name: "add_sub".into(),
        max_batch_size: 8,
        input: vec![input("INPUT0", f, &[4]), input("INPUT1", f, &[4])],
        output: vec![output("OUTPUT0", f, &[4]), output("OUTPUT1", f, &[4])],
        ..Default::default()
    }
}

fn context(config: ModelConfig, model: &str, device: DeviceKind) -> InstanceContext {
    let model_path = fixture(model);
    InstanceContext {
        model_name: config.name.clone(),
        version: 1,
        model_dir: model_path.parent().map(PathBuf::from).unwrap_or_default(),
        model_path,
        config: Arc::new(ValidModelConfig::unchecked(config)),
        instance_name: format!("{}_0", "group"),
        device,
        health: Default::default(),
        server: Default::default(),
    }
}

fn load(config: ModelConfig, model: &str) -> Result<Box<dyn BackendInstance>, BackendError> {
    backend().load_instance(&context(config, model, DeviceKind::Cpu))
}

fn load_err(config: ModelConfig, model: &str) -> String {
    match load(config, model) {
        Ok(_) => panic!("loading {model} should fail"),
        Err(BackendError::Load(msg)) => msg,
        Err(other) => panic!("expected a Load error, got {other:?}"),
    }
}

fn f32_tensor(name: &str, shape: Vec<i64>, values: &[f32]) -> Tensor {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Tensor::new(name, DataType::Fp32, shape, Bytes::from(data)).unwrap()
}

fn f32_values(t: &Tensor) -> Vec<f32> {
    t.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn add_sub_runs_with_requested_outputs_in_order() {
    let mut instance = load(add_sub_config(), "add_sub.onnx").unwrap();
    let a = f32_tensor("INPUT0", vec![2, 4], &[1., 2., 3., 4., 5., 6., 7., 8.]);
    // Unaligned input bytes: a slice starting one byte into the buffer.
    let mut raw = vec![0u8];
    raw.extend(std::iter::repeat_n(1.5f32.to_le_bytes(), 8).flatten());
    let b = Tensor::new(
        "INPUT1",
        DataType::Fp32,
        vec![2, 4],
        Bytes::from(raw).slice(1..),
    )
    .unwrap();

    let out = instance
        .execute(
            &BatchInputs::single(&[a.clone(), b.clone()]),
            &names(&["OUTPUT1", "OUTPUT0"]),
        )
        .unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(
        (out[0].name(), out[0].datatype(), out[0].shape()),
        ("OUTPUT1", DataType::Fp32, &[2i64, 4][..])
    );
    assert_eq!(
        f32_values(&out[0]),
        vec![-0.5, 0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5]
    );
    assert_eq!(out[1].name(), "OUTPUT0");
    assert_eq!(
        f32_values(&out[1]),
        vec![2.5, 3.5, 4.5, 5.5, 6.5, 7.5, 8.5, 9.5]
    );

    let only = instance
        .execute(&BatchInputs::single(&[a, b]), &names(&["OUTPUT0"]))
        .unwrap();
    assert_eq!(only.len(), 1);
    assert_eq!(only[0].name(), "OUTPUT0");
}

/// Element bytes for each datatype of `identity_types.onnx` (6 elements, shape [2, 3]).
fn sample(dt: DataType) -> Bytes {
    let mut v: Vec<u8> = Vec::new();
    match dt {
        DataType::Bool => v.extend([1, 0, 1, 1, 0, 0]),
        DataType::Int8 => v.extend([0x80u8, 0xff, 0, 1, 2, 0x7f]),
        DataType::Uint8 => v.extend([0u8, 1, 2, 128, 254, 255]),
        DataType::Int16 => [-32768i16, -1, 0, 1, 2, 32767]
            .iter()
            .for_each(|x| v.extend(x.to_le_bytes())),
        DataType::Uint16 => [0u16, 1, 2, 3, 40000, 65535]
            .iter()
            .for_each(|x| v.extend(x.to_le_bytes())),
        DataType::Int32 => [i32::MIN, -1, 0, 1, 7, i32::MAX]
            .iter()
            .for_each(|x| v.extend(x.to_le_bytes())),
        DataType::Uint32 => [0u32, 1, 2, 3, 1 << 31, u32::MAX]
            .iter()
            .for_each(|x| v.extend(x.to_le_bytes())),
        DataType::Int64 => [i64::MIN, -1, 0, 1, 7, i64::MAX]
            .iter()
            .for_each(|x| v.extend(x.to_le_bytes())),
        DataType::Uint64 => [0u64, 1, 2, 3, 1 << 63, u64::MAX]
            .iter()
            .for_each(|x| v.extend(x.to_le_bytes())),
        DataType::Fp16 => [0.0f32, -1.5, 2.25, 65504.0, -0.125, 3.0]
            .iter()
            .for_each(|x| v.extend(half::f16::from_f32(*x).to_bits().to_le_bytes())),
        DataType::Bf16 => [0.0f32, -1.5, 2.25, 1e30, -0.125, 3.0]
            .iter()
            .for_each(|x| v.extend(half::bf16::from_f32(*x).to_bits().to_le_bytes())),
        DataType::Fp32 => [0.0f32, -1.5, 2.25, f32::MAX, f32::MIN_POSITIVE, 3.0]
            .iter()
            .for_each(|x| v.extend(x.to_le_bytes())),
        DataType::Fp64 => [0.0f64, -1.5, 2.25, f64::MAX, 1e-300, 3.0]
            .iter()
            .for_each(|x| v.extend(x.to_le_bytes())),
        DataType::Bytes => {
            for s in ["", "a", "héllo", "two words", "🦀", "x"] {
                push_bytes_element(&mut v, s.as_bytes());
            }
        }
    }
    Bytes::from(v)
}

/// The suffix `make_fixtures.py` uses for a datatype's tensors.
fn suffix(dt: DataType) -> &'static str {
    if dt == DataType::Bytes {
        "STRING"
    } else {
        dt.as_wire()
    }
}

#[test]
fn every_datatype_round_trips_through_identity() {
    let config = ModelConfig {
        name: "identity_types".into(),
        input: DataType::ALL
            .iter()
            .map(|&dt| input(&format!("in_{}", suffix(dt)), dt, &[-1, -1]))
            .collect(),
        output: DataType::ALL
            .iter()
            .map(|&dt| output(&format!("out_{}", suffix(dt)), dt, &[-1, -1]))
            .collect(),
        ..Default::default()
    };
    let mut instance = load(config, "identity_types.onnx").unwrap();
    let inputs: Vec<Tensor> = DataType::ALL
        .iter()
        .map(|&dt| Tensor::new(format!("in_{}", suffix(dt)), dt, vec![2, 3], sample(dt)).unwrap())
        .collect();
    let wanted: Vec<String> = DataType::ALL
        .iter()
        .map(|&dt| format!("out_{}", suffix(dt)))
        .collect();
    let outputs = instance
        .execute(&BatchInputs::single(&inputs), &wanted)
        .unwrap();
    assert_eq!(outputs.len(), DataType::ALL.len());
    for (dt, out) in DataType::ALL.iter().zip(&outputs) {
        assert_eq!(out.datatype(), *dt, "{dt}");
        assert_eq!(out.shape(), &[2, 3], "{dt}");
        assert_eq!(out.data(), &sample(*dt), "{dt}");
    }
    let strings: Vec<&[u8]> = bytes_elements(outputs[12].data()).collect();
    assert_eq!(strings[2], "héllo".as_bytes());

    // Empty tensors pass too.
    let empty: Vec<Tensor> = DataType::ALL
        .iter()
        .map(|&dt| Tensor::new(format!("in_{}", suffix(dt)), dt, vec![1, 0], Bytes::new()).unwrap())
        .collect();
    let outputs = instance
        .execute(&BatchInputs::single(&empty), &wanted)
        .unwrap();
    assert!(
        outputs
            .iter()
            .all(|t| t.shape() == [1, 0] && t.data().is_empty())
    );
}

/// `sample(dt)` as two requests of one row ([1, 3]) each, the second one's bytes deliberately
/// misaligned (they start one byte into a buffer, as gRPC bytes may).
fn sample_rows(dt: DataType) -> [Tensor; 2] {
    let data = sample(dt);
    let split = match dt.element_size() {
        Some(size) => 3 * size,
        None => bytes_elements(&data).take(3).map(|e| 4 + e.len()).sum(),
    };
    let mut shifted = vec![0u8];
    shifted.extend_from_slice(&data[split..]);
    let second = Bytes::from(shifted).slice(1..);
    let name = format!("in_{}", suffix(dt));
    [
        Tensor::new(name.clone(), dt, vec![1, 3], data.slice(..split)).unwrap(),
        Tensor::new(name, dt, vec![1, 3], second).unwrap(),
    ]
}

#[test]
fn every_datatype_batches_straight_into_onnx_runtime() {
    let config = ModelConfig {
        name: "identity_types".into(),
        max_batch_size: 4,
        input: DataType::ALL
            .iter()
            .map(|&dt| input(&format!("in_{}", suffix(dt)), dt, &[-1]))
            .collect(),
        output: DataType::ALL
            .iter()
            .map(|&dt| output(&format!("out_{}", suffix(dt)), dt, &[-1]))
            .collect(),
        ..Default::default()
    };
    let mut instance = load(config, "identity_types.onnx").unwrap();
    let (first, second): (Vec<Tensor>, Vec<Tensor>) = DataType::ALL
        .iter()
        .map(|&dt| {
            let [a, b] = sample_rows(dt);
            (a, b)
        })
        .unzip();
    let wanted: Vec<String> = DataType::ALL
        .iter()
        .map(|&dt| format!("out_{}", suffix(dt)))
        .collect();
    let batch = BatchInputs::new(&[&first, &second]).unwrap();
    let outputs = instance.execute(&batch, &wanted).unwrap();
    for (dt, out) in DataType::ALL.iter().zip(&outputs) {
        assert_eq!((out.datatype(), out.shape()), (*dt, &[2i64, 3][..]), "{dt}");
        assert_eq!(out.data(), &sample(*dt), "{dt}");
    }

    // A bad string in the second request is named by its index in the batch.
    let mut bad = Vec::new();
    for s in [&b"ok"[..], b"nul\0", b""] {
        push_bytes_element(&mut bad, s);
    }
    let mut second = second;
    second[12] = Tensor::new("in_STRING", DataType::Bytes, vec![1, 3], Bytes::from(bad)).unwrap();
    let batch = BatchInputs::new(&[&first, &second]).unwrap();
    assert_eq!(
        instance.execute(&batch, &names(&["out_STRING"])).unwrap_err(),
        BackendError::InvalidInput(
            "input 'in_STRING': element 4 contains a NUL byte, which ONNX Runtime string tensors cannot hold"
                .into()
        )
    );
}

#[test]
fn wrong_input_datatype_and_bad_strings_are_invalid_input() {
    let mut instance = load(add_sub_config(), "add_sub.onnx").unwrap();
    let a = Tensor::new(
        "INPUT0",
        DataType::Fp64,
        vec![1, 4],
        Bytes::from(vec![0u8; 32]),
    )
    .unwrap();
    let b = f32_tensor("INPUT1", vec![1, 4], &[0.; 4]);
    let err = instance
        .execute(&BatchInputs::single(&[a, b.clone()]), &names(&["OUTPUT0"]))
        .unwrap_err();
    assert_eq!(
        err,
        BackendError::InvalidInput(
            "inference input 'INPUT0' data-type is 'FP64', but model 'add_sub' expects 'FP32'"
                .into()
        )
    );
    let unknown = f32_tensor("INPUT9", vec![1, 4], &[0.; 4]);
    assert!(
        matches!(instance.execute(&BatchInputs::single(&[unknown]), &[]), Err(BackendError::InvalidInput(m)) if m.contains("'INPUT9'"))
    );
    let a = f32_tensor("INPUT0", vec![1, 4], &[0.; 4]);
    let err = instance
        .execute(&BatchInputs::single(&[a, b]), &names(&["NOPE"]))
        .unwrap_err();
    assert!(matches!(err, BackendError::InvalidInput(m) if m.contains("output 'NOPE'")));

    let config = ModelConfig {
        name: "identity_types".into(),
        ..Default::default()
    };
    let mut ids = backend().load_instance(&context(config, "identity_types.onnx", DeviceKind::Cpu));
    assert!(
        ids.is_err(),
        "a config without inputs cannot load: the model needs 14 inputs"
    );
    let mut config = ModelConfig {
        name: "identity_types".into(),
        ..Default::default()
    };
    backend()
        .auto_complete(&mut config, &fixture("identity_types.onnx"))
        .unwrap();
    ids = backend().load_instance(&context(config, "identity_types.onnx", DeviceKind::Cpu));
    let mut ids = ids.unwrap();
    let mut inputs: Vec<Tensor> = DataType::ALL
        .iter()
        .map(|&dt| Tensor::new(format!("in_{}", suffix(dt)), dt, vec![2, 3], sample(dt)).unwrap())
        .collect();
    let mut bad = Vec::new();
    for s in [&b"ok"[..], b"\xff\xfe", b"", b"", b"", b""] {
        push_bytes_element(&mut bad, s);
    }
    inputs[12] = Tensor::new("in_STRING", DataType::Bytes, vec![2, 3], Bytes::from(bad)).unwrap();
    let err = ids
        .execute(&BatchInputs::single(&inputs), &names(&["out_STRING"]))
        .unwrap_err();
    assert_eq!(
        err,
        BackendError::InvalidInput(
            "input 'in_STRING': element 1 is not valid UTF-8; ONNX string tensors hold UTF-8 text"
                .into()
        )
    );
}

#[test]
fn onnx_runtime_failures_are_execution_errors() {
    let f = DataType::Fp32;
    let config = ModelConfig {
        name: "fixed".into(),
        input: vec![input("x", f, &[1, 3])],
        output: vec![output("y", f, &[1, 3])],
        ..Default::default()
    };
    let mut instance = load(config, "fixed_batch.onnx").unwrap();
    let out = instance
        .execute(
            &BatchInputs::single(&[f32_tensor("x", vec![1, 3], &[1., -2., 3.])]),
            &[],
        )
        .unwrap();
    assert_eq!(f32_values(&out[0]), vec![-1., 2., -3.]);
    let err = instance
        .execute(
            &BatchInputs::single(&[f32_tensor("x", vec![2, 3], &[0.; 6])]),
            &names(&["y"]),
        )
        .unwrap_err();
    match err {
        BackendError::Execution(m) => {
            assert!(
                m.starts_with("onnxruntime execute failure for model 'fixed': "),
                "{m}"
            );
            assert!(m.contains("dimensions"), "{m}");
        }
        other => panic!("expected an Execution error, got {other:?}"),
    }
}

#[test]
fn external_data_directory_loads_and_runs() {
    let mut config = ModelConfig {
        name: "external".into(),
        ..Default::default()
    };
    backend()
        .auto_complete(&mut config, &fixture("external"))
        .unwrap();
    assert_eq!(config.max_batch_size, 4);
    let mut instance = load(config, "external").unwrap();
    let out = instance
        .execute(
            &BatchInputs::single(&[f32_tensor("x", vec![1, 4], &[10., 20., 30., 40.])]),
            &names(&["y"]),
        )
        .unwrap();
    assert_eq!(f32_values(&out[0]), vec![11., 22., 33., 44.]);
}

#[test]
fn auto_complete_fills_like_triton() {
    let b = backend();
    let mut add = ModelConfig {
        name: "add_sub".into(),
        ..Default::default()
    };
    b.auto_complete(&mut add, &fixture("add_sub.onnx")).unwrap();
    assert_eq!(add.max_batch_size, 4);
    assert_eq!(
        add.input,
        vec![
            input("INPUT0", DataType::Fp32, &[4]),
            input("INPUT1", DataType::Fp32, &[4])
        ]
    );
    assert_eq!(
        add.output,
        vec![
            output("OUTPUT0", DataType::Fp32, &[4]),
            output("OUTPUT1", DataType::Fp32, &[4])
        ]
    );
    assert!(matches!(
        add.scheduling_choice,
        Some(SchedulingChoice::DynamicBatching(_))
    ));
    load(add, "add_sub.onnx").expect("an auto-completed config loads");

    let mut ids = ModelConfig::default();
    b.auto_complete(&mut ids, &fixture("identity_types.onnx"))
        .unwrap();
    assert_eq!(ids.max_batch_size, 4);
    let bytes = ids.input.iter().find(|i| i.name == "in_STRING").unwrap();
    assert_eq!(
        *bytes,
        input("in_STRING", DataType::Bytes, &[-1]),
        "symbolic dims become -1"
    );
    assert!(
        ids.input
            .iter()
            .any(|i| *i == input("in_BF16", DataType::Bf16, &[-1]))
    );

    let mut fixed = ModelConfig::default();
    b.auto_complete(&mut fixed, &fixture("fixed_batch.onnx"))
        .unwrap();
    assert_eq!(fixed.max_batch_size, 0);
    assert_eq!(fixed.input, vec![input("x", DataType::Fp32, &[1, 3])]);
    assert!(fixed.scheduling_choice.is_none());

    let mut wants_batching = ModelConfig {
        name: "fixed".into(),
        max_batch_size: 8,
        ..Default::default()
    };
    let err = b
        .auto_complete(&mut wants_batching, &fixture("fixed_batch.onnx"))
        .unwrap_err();
    assert!(
        matches!(&err, BackendError::Load(m) if m.contains("model does not support batching")),
        "{err:?}"
    );
    assert!(
        wants_batching.input.is_empty(),
        "a failed auto-complete leaves the config unchanged"
    );

    let mut missing = ModelConfig::default();
    let err = b
        .auto_complete(&mut missing, &fixture("nope.onnx"))
        .unwrap_err();
    assert!(
        matches!(&err, BackendError::Load(m) if m.contains("nope.onnx' does not exist")),
        "{err:?}"
    );
}

#[test]
fn config_mismatches_fail_to_load() {
    let mut one_input = add_sub_config();
    one_input.input.pop();
    assert_eq!(
        load_err(one_input, "add_sub.onnx"),
        "unable to load model 'add_sub', configuration expects 1 inputs, model provides 2 (model input 'INPUT1' is not in the configuration)"
    );
    let mut renamed = add_sub_config();
    renamed.input[1].name = "INPUTX".into();
    assert!(
        load_err(renamed, "add_sub.onnx")
            .contains("model input 'INPUT1' is not in the configuration")
    );
    let mut extra = add_sub_config();
    extra.input.push(input("INPUT2", DataType::Fp32, &[4]));
    assert!(
        load_err(extra, "add_sub.onnx")
            .contains("configuration input 'INPUT2' is not an input of the model")
    );
    let mut dtype = add_sub_config();
    dtype.input[0].data_type = DataType::Int32.to_config() as i32;
    assert_eq!(
        load_err(dtype, "add_sub.onnx"),
        "unable to load model 'add_sub', configuration expects datatype TYPE_INT32 for input 'INPUT0', model provides TYPE_FP32"
    );
    let mut dims = add_sub_config();
    dims.output[1].dims = vec![3];
    assert!(
        load_err(dims, "add_sub.onnx")
            .contains("tensor 'OUTPUT1': the model expects 2 dimensions (shape [-1,4])")
    );
    let f = DataType::Fp32;
    let batched_fixed = ModelConfig {
        name: "fixed".into(),
        max_batch_size: 2,
        input: vec![input("x", f, &[3])],
        output: vec![output("y", f, &[3])],
        ..Default::default()
    };
    assert!(load_err(batched_fixed, "fixed_batch.onnx").contains("the first dimension must be -1"));
    assert!(load_err(add_sub_config(), "missing.onnx").contains("missing.onnx' does not exist"));
}

/// With the CPU-only ONNX Runtime of the test setup (the `onnxruntime` wheel), GPU instances
/// fail to load naming the missing provider; a GPU build would load them instead (never run).
#[test]
fn kind_gpu_without_a_gpu_build_of_onnx_runtime_is_refused() {
    let gpu_err = |config: ModelConfig, device_id: i32| match backend().load_instance(&context(
        config,
        "add_sub.onnx",
        DeviceKind::Gpu { device_id },
    )) {
        Ok(_) => None,
        Err(BackendError::Load(msg)) => Some(msg),
        Err(other) => panic!("expected a Load error, got {other:?}"),
    };
    let with_accelerator = |name: &str| {
        let mut c = add_sub_config();
        c.optimization = Some(ModelOptimizationPolicy {
            execution_accelerators: Some(ExecutionAccelerators {
                gpu_execution_accelerator: vec![Accelerator {
                    name: name.into(),
                    parameters: Default::default(),
                }],
                cpu_execution_accelerator: vec![],
            }),
            ..Default::default()
        });
        c
    };
    // Unknown accelerator names are refused before any library is asked, as Triton.
    assert_eq!(
        gpu_err(with_accelerator("tensorrt_llm"), 0).unwrap(),
        "model 'add_sub' instance 'group_0': unknown Execution Accelerator 'tensorrt_llm' is requested"
    );
    // A GPU instance loads on the CPU only when ORT was never asked for one: KIND_CPU ignores
    // gpu accelerators, as Triton does.
    assert!(
        backend()
            .load_instance(&context(
                with_accelerator("tensorrt_llm"),
                "add_sub.onnx",
                DeviceKind::Cpu
            ))
            .is_ok()
    );
    if backend().gpu_support().is_ok() {
        return; // A GPU build of ONNX Runtime: the refusals below do not apply.
    }
    assert_eq!(
        backend().gpu_support().unwrap_err(),
        "a GPU instance needs ONNX Runtime's CUDAExecutionProvider, which the loaded ONNX Runtime library does not have (it is a CPU-only build): install the onnxruntime-gpu wheel and point --onnxruntime-library at its libonnxruntime.so, or use KIND_CPU"
    );
    assert_eq!(
        gpu_err(add_sub_config(), 1).unwrap(),
        "model 'add_sub' instance 'group_0': KIND_GPU (GPU 1) needs ONNX Runtime's CUDAExecutionProvider, which the loaded ONNX Runtime library does not have (it is a CPU-only build): install the onnxruntime-gpu wheel and point --onnxruntime-library at its libonnxruntime.so, or use KIND_CPU"
    );
    for name in ["cuda", "tensorrt"] {
        let provider = if name == "cuda" {
            "KIND_GPU (GPU 0) needs ONNX Runtime's CUDAExecutionProvider"
        } else {
            "execution accelerator 'tensorrt' needs ONNX Runtime's TensorrtExecutionProvider"
        };
        let e = gpu_err(with_accelerator(name), 0).unwrap();
        assert!(e.contains(provider) && e.contains("onnxruntime-gpu"), "{e}");
    }
}

/// `KIND_AUTO` on a host with GPUs (a pretend count of 2): an ONNX model goes on every GPU only
/// when the loaded library has the CUDA provider; with the CPU-only library it stays on the CPU
/// with ONNX Runtime's CPU count, and loads there.
#[test]
fn kind_auto_with_gpus_takes_them_only_with_the_cuda_provider() {
    let dir = tempfile::tempdir().unwrap();
    let version = dir.path().join("1");
    std::fs::create_dir_all(&version).unwrap();
    std::fs::copy(fixture("add_sub.onnx"), version.join("model.onnx")).unwrap();
    let backends = Backends::new(Some(library())).with_gpu_count(2);
    let raw = ModelConfig {
        backend: "onnxruntime".into(),
        ..add_sub_config()
    };
    let options = CompleteOptions {
        auto_complete: true,
    };
    let config = complete(
        "add_sub",
        raw,
        std::slice::from_ref(&version),
        &backends,
        options,
    )
    .unwrap();
    let group = &config.wire().instance_group[0];
    if backend().gpu_support().is_ok() {
        // onnxruntime-gpu: one group on both GPUs, as Triton.
        assert_eq!(
            config.instance_groups[0].kind,
            GroupKind::Gpu { gpus: vec![0, 1] }
        );
        return;
    }
    assert_eq!(config.instance_groups[0].kind, GroupKind::Cpu);
    assert_eq!((group.kind, group.count), (Kind::Cpu as i32, 2));
    assert!(group.gpus.is_empty());
    let ctx = InstanceContext {
        model_path: version.join("model.onnx"),
        config: Arc::new(config),
        ..context(add_sub_config(), "add_sub.onnx", DeviceKind::Cpu)
    };
    let mut instance = backend().load_instance(&ctx).unwrap();
    let a = f32_tensor("INPUT0", vec![1, 4], &[1.; 4]);
    let b = f32_tensor("INPUT1", vec![1, 4], &[2.; 4]);
    let out = instance
        .execute(&BatchInputs::single(&[a, b]), &names(&["OUTPUT0"]))
        .unwrap();
    assert_eq!(f32_values(&out[0]), vec![3.; 4]);
}

#[test]
fn session_parameters_are_applied_or_refused() {
    let with = |params: &[(&str, &str)], level: Option<i32>| {
        let mut c = add_sub_config();
        for (k, v) in params {
            c.parameters.insert(
                k.to_string(),
                ModelParameter {
                    string_value: v.to_string(),
                },
            );
        }
        c.optimization = level.map(|level| ModelOptimizationPolicy {
            graph: Some(Graph { level }),
            ..Default::default()
        });
        c
    };
    let good = [
        ("intra_op_thread_count", "1"),
        ("inter_op_thread_count", "2"),
        ("execution_mode", "1"),
        ("enable_mem_arena", "0"),
        ("enable_mem_pattern", "false"),
    ];
    for level in [None, Some(-1), Some(1), Some(2)] {
        let mut instance = load(with(&good, level), "add_sub.onnx").unwrap();
        let a = f32_tensor("INPUT0", vec![1, 4], &[1.; 4]);
        let b = f32_tensor("INPUT1", vec![1, 4], &[2.; 4]);
        assert_eq!(
            f32_values(
                &instance
                    .execute(&BatchInputs::single(&[a, b]), &names(&["OUTPUT0"]))
                    .unwrap()[0]
            ),
            vec![3.; 4]
        );
    }
    let err = load_err(
        with(&[("intra_op_thread_count", "two")], None),
        "add_sub.onnx",
    );
    assert_eq!(
        err,
        "unable to load model 'add_sub': parameter 'intra_op_thread_count' must be a non-negative integer, got 'two'"
    );
    assert!(
        load_err(with(&[("execution_mode", "2")], None), "add_sub.onnx")
            .contains("parameter 'execution_mode'")
    );
    assert!(
        load_err(with(&[], Some(5)), "add_sub.onnx").contains("optimization.graph.level must be")
    );
}

#[test]
fn a_missing_library_is_a_load_error() {
    let b = OnnxRuntimeBackend::new(Some(PathBuf::from("/nonexistent/libonnxruntime.so.1.31.1")));
    let err = b
        .load_instance(&context(add_sub_config(), "add_sub.onnx", DeviceKind::Cpu))
        .err()
        .unwrap();
    assert!(
        matches!(&err, BackendError::Load(m) if m.contains("'/nonexistent/libonnxruntime.so.1.31.1' does not exist") && m.contains("make setup")),
        "{err:?}"
    );
    // A file that is not a library: refused whether or not the real library is loaded already.
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("libonnxruntime.so");
    std::fs::write(&fake, b"not a shared library").unwrap();
    let err = OnnxRuntimeBackend::new(Some(fake.clone()))
        .auto_complete(&mut ModelConfig::default(), &fixture("add_sub.onnx"))
        .unwrap_err();
    assert!(
        matches!(&err, BackendError::Load(m) if m.contains(&*fake.to_string_lossy())),
        "{err:?}"
    );
}
