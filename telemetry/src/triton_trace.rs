//! Triton's trace mode: a traced request becomes the JSON objects Triton 2.51 writes (checked
//! against it by `tests/python/test_triton_diff_trace.py`), grouped with its child traces and
//! handed to the trace file ([`TraceFile`]).
//!
//! ```text
//! Tracer::start ─► TritonSink::begin(span, parent span) ─► Ids { id, parent_id, root }
//!                    (integer ids from 1; a parent counts only when it is one of this
//!                     process's open traces: an ensemble step, a BLS call)
//! RequestTrace ships ─► TritonTrace { ids, model, version, request id, stamps }
//!   ─► TritonSink::finish: a child waits beside its root; a root goes out with its children
//!      ─► TraceFile::add(group, log_frequency of the root's model)
//! ```
//!
//! One trace's objects, as Triton writes them: a header
//! `{"id":1,"model_name":"m","model_version":1,"request_id":"r","parent_id":4}` (`request_id`
//! only when the request has one, `parent_id` only for a child), then one object per timestamp,
//! `{"id":1,"timestamps":[{"name":"REQUEST_START","ns":...}]}`, and with level TENSORS one per
//! tensor, `{"id":1,"activity":"TENSOR_QUEUE_INPUT","tensor":{"name":..,"data":..,"shape":..,
//! "dtype":..}}`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use nereid_proto::{DataType, Tensor};
use parking_lot::Mutex;

use crate::span::SpanId;
use crate::trace_config::TraceSettingsStore;
use crate::triton_file::TraceFile;

/// A trace's place among the traces of this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ids {
    pub id: u64,
    pub parent: Option<u64>,
    /// The id of the trace at the top of this one's tree (its own for a root).
    pub root: u64,
}

/// A tensor as level TENSORS records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorRecord {
    /// `TENSOR_QUEUE_INPUT` or `TENSOR_BACKEND_OUTPUT`.
    pub activity: &'static str,
    pub name: String,
    /// The elements, comma-separated.
    pub data: String,
    /// The dimensions, comma-separated.
    pub shape: String,
    pub dtype: String,
}

impl TensorRecord {
    /// `tensor` as level TENSORS writes it: elements and dimensions comma-separated.
    pub fn of(input: bool, tensor: &Tensor) -> TensorRecord {
        let shape: Vec<String> = tensor.shape().iter().map(i64::to_string).collect();
        TensorRecord {
            activity: if input {
                "TENSOR_QUEUE_INPUT"
            } else {
                "TENSOR_BACKEND_OUTPUT"
            },
            name: tensor.name().to_string(),
            data: elements(tensor.datatype(), tensor.data()).join(","),
            shape: shape.join(","),
            dtype: tensor.datatype().as_wire().to_string(),
        }
    }
}

/// The elements of `data` (little-endian, as tensors hold them) as text.
fn elements(datatype: DataType, data: &[u8]) -> Vec<String> {
    fn each<const N: usize>(data: &[u8], f: impl Fn([u8; N]) -> String) -> Vec<String> {
        data.chunks_exact(N)
            .map(|c| {
                let mut b = [0u8; N];
                b.copy_from_slice(c);
                f(b)
            })
            .collect()
    }
    match datatype {
        DataType::Bool => data.iter().map(|b| (*b != 0).to_string()).collect(),
        DataType::Uint8 => data.iter().map(u8::to_string).collect(),
        DataType::Int8 => data.iter().map(|b| (*b as i8).to_string()).collect(),
        DataType::Uint16 => each(data, |b| u16::from_le_bytes(b).to_string()),
        DataType::Int16 => each(data, |b| i16::from_le_bytes(b).to_string()),
        DataType::Uint32 => each(data, |b| u32::from_le_bytes(b).to_string()),
        DataType::Int32 => each(data, |b| i32::from_le_bytes(b).to_string()),
        DataType::Uint64 => each(data, |b| u64::from_le_bytes(b).to_string()),
        DataType::Int64 => each(data, |b| i64::from_le_bytes(b).to_string()),
        DataType::Fp32 => each(data, |b| f32::from_le_bytes(b).to_string()),
        DataType::Fp64 => each(data, |b| f64::from_le_bytes(b).to_string()),
        DataType::Fp16 => each(data, |b| f16_to_f32(u16::from_le_bytes(b)).to_string()),
        DataType::Bf16 => each(data, |b| {
            f32::from_bits(u32::from(u16::from_le_bytes(b)) << 16).to_string()
        }),
        DataType::Bytes => {
            let mut out = Vec::new();
            let mut rest = data;
            while rest.len() >= 4 {
                let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
                let end = (4 + len).min(rest.len());
                out.push(String::from_utf8_lossy(&rest[4..end]).into_owned());
                rest = &rest[end..];
            }
            out
        }
    }
}

/// An IEEE half-precision number's value.
fn f16_to_f32(bits: u16) -> f32 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = i32::from((bits >> 10) & 0x1f);
    let fraction = f32::from(bits & 0x3ff);
    sign * match exponent {
        0 => fraction * 2f32.powi(-24),
        0x1f if fraction == 0.0 => f32::INFINITY,
        0x1f => f32::NAN,
        e => (1.0 + fraction / 1024.0) * 2f32.powi(e - 15),
    }
}

/// One finished trace in Triton's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TritonTrace {
    pub ids: Ids,
    pub model: String,
    pub version: Option<i64>,
    pub request_id: String,
    /// Timestamp names and wall-clock nanoseconds, in the order they are written.
    pub stamps: Vec<(&'static str, u64)>,
    pub tensors: Vec<TensorRecord>,
}

impl TritonTrace {
    /// The trace's objects, comma-separated (a JSON array's inside). As in Triton, the HTTP
    /// receive stamps come before the header (Triton learns the model after reading the body),
    /// and tensors right after the queue start (else last).
    pub fn to_json(&self) -> String {
        let id = self.ids.id;
        let mut header = format!("{{\"id\":{id},\"model_name\":{}", json_string(&self.model));
        if let Some(version) = self.version {
            let _ = write!(header, ",\"model_version\":{version}");
        }
        if !self.request_id.is_empty() {
            let _ = write!(header, ",\"request_id\":{}", json_string(&self.request_id));
        }
        if let Some(parent) = self.ids.parent {
            let _ = write!(header, ",\"parent_id\":{parent}");
        }
        header.push('}');
        let mut header = Some(header);
        let mut objects = Vec::with_capacity(self.stamps.len() + self.tensors.len() + 1);
        let mut tensors = Some(self.tensor_objects());
        for (name, ns) in &self.stamps {
            if !name.starts_with("HTTP_RECV")
                && let Some(h) = header.take()
            {
                objects.push(h);
            }
            objects.push(format!(
                "{{\"id\":{id},\"timestamps\":[{{\"name\":\"{name}\",\"ns\":{ns}}}]}}"
            ));
            if *name == "QUEUE_START"
                && let Some(t) = tensors.take()
            {
                objects.extend(t);
            }
        }
        objects.extend(header);
        objects.extend(tensors.into_iter().flatten());
        objects.join(",")
    }

    fn tensor_objects(&self) -> Vec<String> {
        self.tensors
            .iter()
            .map(|t| {
                format!(
                    "{{\"id\":{},\"activity\":\"{}\",\"tensor\":{{\"name\":{},\"data\":{},\"shape\":{},\"dtype\":{}}}}}",
                    self.ids.id,
                    t.activity,
                    json_string(&t.name),
                    json_string(&t.data),
                    json_string(&t.shape),
                    json_string(&t.dtype)
                )
            })
            .collect()
    }
}

/// A JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Assigns ids, groups children with their roots and hands groups to the file.
pub struct TritonSink {
    settings: Arc<TraceSettingsStore>,
    /// `None` when Triton's mode has no file: traces are taken and discarded, as in Triton.
    file: Option<TraceFile>,
    next_id: AtomicU64,
    /// Open traces by span id (what a child's W3C context names as its parent).
    open: Mutex<HashMap<SpanId, Ids>>,
    /// Finished children waiting for their open root, by root id.
    waiting: Mutex<HashMap<u64, Vec<String>>>,
}

impl std::fmt::Debug for TritonSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TritonSink")
            .field("file", &self.file)
            .finish()
    }
}

impl TritonSink {
    pub fn new(settings: Arc<TraceSettingsStore>, file: Option<TraceFile>) -> TritonSink {
        TritonSink {
            settings,
            file,
            next_id: AtomicU64::new(1),
            open: Mutex::new(HashMap::new()),
            waiting: Mutex::new(HashMap::new()),
        }
    }

    /// Whether `span` is an open trace of this process (so a request naming it is its child).
    pub fn is_open(&self, span: &SpanId) -> bool {
        self.open.lock().contains_key(span)
    }

    /// Opens the trace of `span`, a child of `parent` when that is an open trace here.
    pub fn begin(&self, span: SpanId, parent: Option<SpanId>) -> Ids {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut open = self.open.lock();
        let parent = parent.and_then(|p| open.get(&p).copied());
        let ids = Ids {
            id,
            parent: parent.map(|p| p.id),
            root: parent.map_or(id, |p| p.root),
        };
        open.insert(span, ids);
        drop(open);
        if ids.parent.is_none() {
            self.waiting.lock().insert(id, Vec::new());
        }
        ids
    }

    /// Takes a finished trace: a child waits for its root (or goes alone once the root is
    /// gone); a root goes to the file with its children, children first, as Triton writes them.
    pub fn finish(&self, span: SpanId, trace: TritonTrace) {
        self.open.lock().remove(&span);
        let text = trace.to_json();
        let ids = trace.ids;
        let group = if ids.parent.is_some() {
            let mut waiting = self.waiting.lock();
            match waiting.get_mut(&ids.root) {
                Some(children) => {
                    children.push(text);
                    return;
                }
                None => text,
            }
        } else {
            let mut parts = self.waiting.lock().remove(&ids.id).unwrap_or_default();
            parts.push(text);
            parts.join(",")
        };
        if let Some(file) = &self.file {
            let frequency = self.settings.log_frequency(&trace.model);
            file.add(group, frequency);
        }
    }

    /// Writes what is left (at shutdown).
    pub async fn close(&self) {
        if let Some(file) = &self.file {
            file.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace_config::Settings;

    fn trace(ids: Ids, stamps: &[&'static str]) -> TritonTrace {
        TritonTrace {
            ids,
            model: "m\"x".into(),
            version: Some(1),
            request_id: String::new(),
            stamps: stamps
                .iter()
                .enumerate()
                .map(|(i, n)| (*n, i as u64))
                .collect(),
            tensors: Vec::new(),
        }
    }

    #[test]
    fn objects_have_tritons_keys_and_escaping() {
        let ids = Ids {
            id: 6,
            parent: Some(4),
            root: 4,
        };
        let mut t = trace(ids, &["REQUEST_START", "QUEUE_START", "REQUEST_END"]);
        t.request_id = "e1".into();
        t.tensors.push(TensorRecord {
            activity: "TENSOR_QUEUE_INPUT",
            name: "IN".into(),
            data: "1,2".into(),
            shape: "2".into(),
            dtype: "INT32".into(),
        });
        let parsed = format!("[{}]", t.to_json());
        assert_eq!(
            parsed,
            concat!(
                r#"[{"id":6,"model_name":"m\"x","model_version":1,"request_id":"e1","parent_id":4},"#,
                r#"{"id":6,"timestamps":[{"name":"REQUEST_START","ns":0}]},"#,
                r#"{"id":6,"timestamps":[{"name":"QUEUE_START","ns":1}]},"#,
                r#"{"id":6,"activity":"TENSOR_QUEUE_INPUT","tensor":{"name":"IN","data":"1,2","shape":"2","dtype":"INT32"}},"#,
                r#"{"id":6,"timestamps":[{"name":"REQUEST_END","ns":2}]}]"#
            )
        );
        let mut bare = trace(
            Ids {
                id: 1,
                parent: None,
                root: 1,
            },
            &["REQUEST_START"],
        );
        bare.version = None;
        assert_eq!(
            bare.to_json(),
            r#"{"id":1,"model_name":"m\"x"},{"id":1,"timestamps":[{"name":"REQUEST_START","ns":0}]}"#
        );
    }

    #[test]
    fn tensors_are_written_as_comma_separated_text() {
        let t = |dtype, shape: Vec<i64>, data: Vec<u8>| {
            TensorRecord::of(true, &Tensor::new("x", dtype, shape, data.into()).unwrap())
        };
        let ints = t(
            DataType::Int32,
            vec![1, 2],
            [7i32, -1].iter().flat_map(|v| v.to_le_bytes()).collect(),
        );
        assert_eq!((ints.data.as_str(), ints.shape.as_str()), ("7,-1", "1,2"));
        assert_eq!(
            (ints.activity, ints.dtype.as_str()),
            ("TENSOR_QUEUE_INPUT", "INT32")
        );
        let half = t(
            DataType::Fp16,
            vec![3],
            [0x3c00u16, 0xc000, 0x3800]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        );
        assert_eq!(half.data, "1,-2,0.5");
        let bf = t(DataType::Bf16, vec![1], 0x3fc0u16.to_le_bytes().to_vec());
        assert_eq!(bf.data, "1.5");
        let mut bytes = Vec::new();
        for s in ["ab", ""] {
            bytes.extend((s.len() as u32).to_le_bytes());
            bytes.extend(s.as_bytes());
        }
        assert_eq!(t(DataType::Bytes, vec![2], bytes).data, "ab,");
        assert_eq!(t(DataType::Bool, vec![2], vec![1, 0]).data, "true,false");
    }

    #[test]
    fn children_take_their_parents_id_and_wait_for_the_root() {
        let sink = TritonSink::new(Arc::new(TraceSettingsStore::new(Settings::default())), None);
        let root = sink.begin([1; 8], None);
        let step = sink.begin([2; 8], Some([1; 8]));
        let bls = sink.begin([3; 8], Some([2; 8]));
        let stranger = sink.begin([4; 8], Some([9; 8]));
        assert_eq!((root.id, root.parent, root.root), (1, None, 1));
        assert_eq!((step.parent, step.root), (Some(1), 1));
        assert_eq!((bls.parent, bls.root), (Some(2), 1));
        assert_eq!(
            stranger.parent, None,
            "a context from elsewhere is no parent"
        );
        assert!(sink.is_open(&[2; 8]));
        sink.finish([3; 8], trace(bls, &[]));
        sink.finish([2; 8], trace(step, &[]));
        assert_eq!(sink.waiting.lock()[&1].len(), 2);
        sink.finish([1; 8], trace(root, &[]));
        assert!(sink.waiting.lock().get(&1).is_none());
        assert!(!sink.is_open(&[2; 8]));
        // A child finishing after its root goes out alone.
        let late = sink.begin([5; 8], Some([4; 8]));
        sink.finish([4; 8], trace(stranger, &[]));
        sink.finish([5; 8], trace(late, &[]));
        assert!(sink.waiting.lock().is_empty());
    }
}
