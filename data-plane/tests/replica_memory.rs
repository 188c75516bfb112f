//! The memory a loaded version reports (a replica's memory in a cluster) means the same on
//! every worker: one ONNX model with real weights, loaded by a fresh data plane and by one
//! that loaded other models first, measures the same within 10 %, and at least half its
//! weights.
//!
//! One test in a binary of its own: the C heap is the whole process's, so no other test may
//! allocate beside the loads measured here.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::path::Path;
use std::sync::Arc;

use nereid_data_plane::{Backends, ControlMode, DataPlane};
use nereid_proto::{InferenceService, LoadRequest};

mod common;
use common::{data_plane, ort_library};

/// Elements of the weights model's initializer: 16 MiB of FP32.
const WEIGHTS: usize = 4 << 20;

/// Protobuf wire format, as much as an ONNX model needs.
mod wire {
    pub fn varint(mut value: u64, out: &mut Vec<u8>) {
        while value >= 0x80 {
            out.push((value as u8) | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
    }

    pub fn int(field: u64, value: u64, out: &mut Vec<u8>) {
        varint(field << 3, out);
        varint(value, out);
    }

    pub fn bytes(field: u64, value: &[u8], out: &mut Vec<u8>) {
        varint((field << 3) | 2, out);
        varint(value.len() as u64, out);
        out.extend_from_slice(value);
    }
}

/// `ValueInfoProto` of a 1-D FP32 tensor of `len` elements.
fn fp32_value_info(name: &str, len: usize) -> Vec<u8> {
    let mut dim = Vec::new();
    wire::int(1, len as u64, &mut dim); // dim_value
    let mut shape = Vec::new();
    wire::bytes(1, &dim, &mut shape); // dim
    let mut tensor = Vec::new();
    wire::int(1, 1, &mut tensor); // elem_type FLOAT
    wire::bytes(2, &shape, &mut tensor); // shape
    let mut ty = Vec::new();
    wire::bytes(1, &tensor, &mut ty); // tensor_type
    let mut info = Vec::new();
    wire::bytes(1, name.as_bytes(), &mut info);
    wire::bytes(2, &ty, &mut info);
    info
}

/// An ONNX model `Y = X + W` over `len` FP32 elements, `W` an initializer of distinct values.
fn add_weights_model(len: usize) -> Vec<u8> {
    let mut node = Vec::new();
    wire::bytes(1, b"X", &mut node);
    wire::bytes(1, b"W", &mut node);
    wire::bytes(2, b"Y", &mut node);
    wire::bytes(4, b"Add", &mut node); // op_type
    let raw: Vec<u8> = (0..len).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let mut weights = Vec::new();
    wire::int(1, len as u64, &mut weights); // dims
    wire::int(2, 1, &mut weights); // data_type FLOAT
    wire::bytes(8, b"W", &mut weights); // name
    wire::bytes(9, &raw, &mut weights); // raw_data
    let mut graph = Vec::new();
    wire::bytes(1, &node, &mut graph);
    wire::bytes(2, b"add_weights", &mut graph);
    wire::bytes(5, &weights, &mut graph); // initializer
    wire::bytes(11, &fp32_value_info("X", len), &mut graph);
    wire::bytes(12, &fp32_value_info("Y", len), &mut graph);
    let mut opset = Vec::new();
    wire::int(2, 13, &mut opset);
    let mut model = Vec::new();
    wire::int(1, 8, &mut model); // ir_version
    wire::bytes(7, &graph, &mut model);
    wire::bytes(8, &opset, &mut model); // opset_import
    model
}

/// Adds model `name` (`Y = X + W`, `len` weights, one CPU instance) to `repo`; the size of
/// its model file.
fn add_model(repo: &Path, name: &str, len: usize) -> u64 {
    let version = repo.join(name).join("1");
    std::fs::create_dir_all(&version).unwrap();
    let model = add_weights_model(len);
    std::fs::write(version.join("model.onnx"), &model).unwrap();
    let config = format!(
        "name: \"{name}\"\nbackend: \"onnxruntime\"\nmax_batch_size: 0\n\
         input [{{ name: \"X\" data_type: TYPE_FP32 dims: [ {len} ] }}]\n\
         output [{{ name: \"Y\" data_type: TYPE_FP32 dims: [ {len} ] }}]\n\
         instance_group [{{ kind: KIND_CPU count: 1 }}]\n"
    );
    std::fs::write(repo.join(name).join("config.pbtxt"), config).unwrap();
    model.len() as u64
}

/// Loads each of `models` in turn into a fresh data plane over `repo`; the data plane (its
/// models stay loaded while it lives) and the memory the last model reports.
async fn load_and_measure(repo: &Path, models: &[&str]) -> (Arc<DataPlane>, u64) {
    let backends = Backends::new(Some(ort_library()));
    let dp = data_plane(repo, ControlMode::Explicit, &[], backends, 16, true);
    for model in models {
        dp.load_model(model, LoadRequest::default())
            .await
            .unwrap_or_else(|e| panic!("loading '{model}': {e:?}"));
    }
    let last = models.last().unwrap();
    let loaded = dp.manager().get(last, Some(1)).unwrap();
    let memory = loaded.stats.load().unwrap().memory_bytes;
    (dp, memory)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_model_measures_the_same_after_other_loads() {
    let repo = tempfile::tempdir().unwrap();
    let file_bytes = add_model(repo.path(), "weights", WEIGHTS);
    add_model(repo.path(), "small", WEIGHTS / 8);
    add_model(repo.path(), "large", WEIGHTS * 2);

    let (_first, fresh) = load_and_measure(repo.path(), &["weights"]).await;
    let (_second, after_others) =
        load_and_measure(repo.path(), &["large", "small", "weights"]).await;
    // Once more, beside the models both data planes above still hold.
    let (_third, again) = load_and_measure(repo.path(), &["weights"]).await;
    eprintln!(
        "model file {file_bytes} B; measured fresh {fresh} B, after other models {after_others} B, again {again} B"
    );

    for (what, measured) in [
        ("fresh", fresh),
        ("after other models", after_others),
        ("again", again),
    ] {
        assert!(
            measured > file_bytes / 2,
            "{what}: {measured} B is less than half the {file_bytes} B of weights"
        );
        assert!(
            measured < file_bytes * 3,
            "{what}: {measured} B is more than three times the {file_bytes} B of weights"
        );
    }
    let (low, high) = [fresh, after_others, again]
        .into_iter()
        .fold((u64::MAX, 0), |(lo, hi), m| (lo.min(m), hi.max(m)));
    assert!(
        (high - low) * 10 <= high,
        "measurements differ by more than 10 %: fresh {fresh}, after others {after_others}, again {again}"
    );
}
