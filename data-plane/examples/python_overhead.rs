//! Per-request cost of the Python backend path: one identity `model.py` instance, requests sent
//! one at a time through `BackendInstance::execute_requests` (no scheduler, no network), for a
//! 16-float tensor and a 4 MiB tensor. What is measured is everything the Python path adds:
//! the input copy into shared memory, two frames over the socket, the stub's dispatch and NumPy
//! wrapping, the output copy back, and the release messages.
//!
//! ```text
//! cargo run --release -p nereid-data-plane --example python_overhead [-- <python> [iterations]]
//! ```
//! The interpreter defaults to `NEREID_PYTHON`, else the workspace's `.venv/bin/python`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nereid_data_plane::backend::{
    Backend, BackendInstance, DeviceKind, Health, InstanceContext, Phases, PythonBackend,
    RequestView, ServerHandle,
};
use nereid_proto::{DataType, Parameters, Tensor};

const CONFIG: &str = r#"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ -1 ] } ]
"#;

const MODEL: &str = r#"
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"#;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let python = args
        .next()
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("NEREID_PYTHON").map(PathBuf::from))
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"));
    let scale: u32 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(1);

    let repo = tempfile::tempdir()?;
    let dir = repo.path().join("identity");
    std::fs::create_dir_all(dir.join("1"))?;
    std::fs::write(dir.join("1/model.py"), MODEL)?;
    let mut config =
        nereid_data_plane::config::parse_config_text(&dir, CONFIG).map_err(|e| e.to_string())?;
    config.name = "identity".into();
    nereid_data_plane::config::fill_defaults(&mut config);
    let config = nereid_data_plane::config::ValidModelConfig::try_from(config)?;
    let ctx = InstanceContext {
        model_name: "identity".into(),
        version: 1,
        model_dir: dir.clone(),
        model_path: dir.join("1/model.py"),
        config: Arc::new(config),
        instance_name: "identity_0".into(),
        device: DeviceKind::Cpu,
        health: Arc::new(Health::default()),
        server: Arc::new(ServerHandle::default()),
    };
    let started = Instant::now();
    let mut instance = PythonBackend::new(Some(python.clone()))
        .load_instance(&ctx)
        .map_err(|e| e.to_string())?;
    println!(
        "python: {}  (stub start + initialize: {:.0} ms)",
        python.display(),
        started.elapsed().as_secs_f64() * 1e3
    );
    for (label, floats, iterations) in [
        ("16 x FP32 (64 B)", 16usize, 5000 * scale),
        ("1 Mi x FP32 (4 MiB)", 1 << 20, 300 * scale),
    ] {
        let timings = measure(instance.as_mut(), floats, iterations)?;
        report(label, &timings);
    }
    Ok(())
}

/// Times `iterations` single-request executions of a `floats`-element tensor (after a warmup).
fn measure(
    instance: &mut dyn BackendInstance,
    floats: usize,
    iterations: u32,
) -> Result<Vec<Duration>> {
    let data: Vec<u8> = (0..floats).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let input = Tensor::new("IN", DataType::Fp32, vec![floats as i64], Bytes::from(data))?;
    let inputs = vec![input];
    let outputs = vec!["OUT".to_string()];
    let parameters = Parameters::new();
    let mut run = |key: u64| -> Result<Duration> {
        let view = RequestView {
            key,
            id: "",
            inputs: &inputs,
            outputs: &outputs,
            parameters: &parameters,
            correlation_id: None,
            flags: 0,
            stream: None,
        };
        let started = Instant::now();
        let results = instance
            .execute_requests(&[view], &mut Phases::default())
            .map_err(|e| e.to_string())?;
        let elapsed = started.elapsed();
        let out = results
            .into_iter()
            .next()
            .ok_or("no result")?
            .into_answer()
            .map_err(|e| e.to_string())?;
        if out.tensors[0].data() != inputs[0].data() {
            return Err("identity changed the data".into());
        }
        Ok(elapsed)
    };
    for key in 0..(iterations / 10).max(10) {
        run(u64::from(key))?;
    }
    (0..iterations)
        .map(|i| run(u64::from(i) + 1_000_000))
        .collect()
}

fn report(label: &str, timings: &[Duration]) {
    let mut us: Vec<f64> = timings.iter().map(|d| d.as_secs_f64() * 1e6).collect();
    us.sort_by(f64::total_cmp);
    let mean = us.iter().sum::<f64>() / us.len() as f64;
    let at = |q: f64| us[((us.len() - 1) as f64 * q).round() as usize];
    println!(
        "{label:>20}: mean {mean:8.1} µs   p50 {:8.1} µs   p90 {:8.1} µs   p99 {:8.1} µs   ({} requests)",
        at(0.5),
        at(0.9),
        at(0.99),
        us.len()
    );
}
