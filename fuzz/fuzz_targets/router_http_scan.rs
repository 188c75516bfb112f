//! The router's scan of an HTTP infer body (`nereid-router`'s `http_scan.rs`: what the HTTP
//! pass-through reads of the JSON header before forwarding the body), against a full decode:
//!
//! - the JSON header decoded by serde_json (every object's entries kept, see [`Json`]), then
//!   the scan's fields derived from it by the scan's documented rules ([`derive`]): the scan
//!   must equal that, and refuse exactly what that refuses;
//! - what the typed path (`nereid_frontend`'s decoder, which the worker runs) accepts, the scan
//!   accepts with the same id, sequence options, input names and shapes and output count.
//!
//! The two exceptions `http_scan.rs` documents, and no other:
//! - a key the scan reads (`id`, `parameters`, `inputs`, `outputs`; a tensor's `name`, `shape`,
//!   `parameters`) twice in one object: the scan refuses it, where serde_json's `Value` and the
//!   typed path keep the last;
//! - JSON that serde_json's `Value` refuses for what only a decoded value can have (invalid
//!   UTF-8, a lone surrogate or bad code point in a string, a number past f64's range, nesting
//!   past 128 levels): the scan skips tensor data and unknown keys without decoding them, so it
//!   may accept such a header; nothing is compared.
//!
//! Input: `<Inference-Header-Content-Length>\n<body>` when the first line is a number, else the
//! whole input is a body sent without that header.
#![no_main]

use std::collections::HashSet;
use std::fmt;

use http_scan::{HttpScanError, HttpScanned, scan_http_request};
use libfuzzer_sys::fuzz_target;
use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::{Parameters, RequestOptions};
use serde::Deserialize;
use serde::de::{MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use wire_scan::ScannedInput;

/// The router's scanner (and the wire scanner's types it shares), compiled in from their
/// source: they use nothing else of `nereid-router`, whose server (tonic, OpenTelemetry,
/// tracing-subscriber) the light build leaves out.
#[path = "../../router/src/http_scan.rs"]
#[allow(dead_code)]
mod http_scan;
#[path = "../../router/src/wire_scan.rs"]
#[allow(dead_code)]
mod wire_scan;

/// The parameter keys replica choice reads.
const ROUTING_KEYS: [&str; 3] = ["sequence_id", "sequence_start", "sequence_end"];

/// `--http-max-input-size` for the typed decoder: small, so the limit is reachable.
const MAX_INPUT_SIZE: usize = 1 << 16;

fuzz_target!(|data: &[u8]| {
    let (header_len, body) = split(data);
    let scanned = scan_http_request(body, header_len);
    let header = match header_len {
        Some(0) => {
            assert_eq!(scanned, Ok(None), "a raw binary body has nothing to scan");
            return;
        }
        Some(len) if len > body.len() => {
            assert!(scanned.is_err(), "a header length past the body is refused");
            return;
        }
        Some(len) => &body[..len],
        None => body,
    };
    let scanned = scanned.map(|s| s.expect("a JSON header is scanned"));
    let doc: Json = match serde_json::from_slice(header) {
        Ok(doc) => doc,
        Err(e) if only_decoding_refuses(&e) => return,
        Err(e) => {
            assert!(
                scanned.is_err(),
                "scan {scanned:?} of JSON that does not parse: {e}"
            );
            return;
        }
    };
    if doc.repeats_a_scanned_key() {
        assert!(scanned.is_err(), "scan {scanned:?} of a repeated key");
        return;
    }
    let expected = derive(&doc.to_value());
    match (&scanned, &expected) {
        (Ok(s), Ok(e)) => assert_eq!(s, e, "the scan differs from serde_json's decode"),
        (Err(_), Err(_)) => {}
        (s, e) => panic!("scan {s:?} but serde_json's decode gives {e:?}"),
    }
    typed_agrees(header_len, body, &scanned);
});

/// The header length and the body (see the module docs).
fn split(data: &[u8]) -> (Option<usize>, &[u8]) {
    if let Some(at) = data.iter().position(|&b| b == b'\n') {
        let line = std::str::from_utf8(&data[..at]).ok();
        if let Some(len) = line.and_then(|l| l.parse().ok()) {
            return (Some(len), &data[at + 1..]);
        }
    }
    (None, data)
}

/// serde_json errors that decoding a value raises but skipping it (serde's `IgnoredAny`) does
/// not: the second exception of the module docs.
fn only_decoding_refuses(e: &serde_json::Error) -> bool {
    let message = e.to_string();
    [
        "invalid unicode code point",
        "lone leading surrogate in hex escape",
        "unexpected end of hex escape",
        "number out of range",
        "recursion limit exceeded",
    ]
    .iter()
    .any(|m| message.starts_with(m))
}

/// A JSON document with every object's entries in order, repeated keys included (serde_json's
/// `Value` keeps only the last of them). Read through serde_json's `deserialize_any` as `Value`
/// is, so it accepts and refuses the same documents.
enum Json {
    Scalar(Value),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    /// The `Value` serde_json would decode: the last of repeated keys.
    fn to_value(&self) -> Value {
        match self {
            Json::Scalar(v) => v.clone(),
            Json::Array(items) => Value::Array(items.iter().map(Json::to_value).collect()),
            Json::Object(entries) => {
                let mut map = Map::new();
                for (k, v) in entries {
                    map.insert(k.clone(), v.to_value());
                }
                Value::Object(map)
            }
        }
    }

    /// The last value of `key` in an object.
    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(entries) => entries.iter().rev().find(|(k, _)| k == key).map(|e| &e.1),
            _ => None,
        }
    }

    /// Whether an object has one of `keys` more than once.
    fn repeats(&self, keys: &[&str]) -> bool {
        let Json::Object(entries) = self else {
            return false;
        };
        let mut seen = HashSet::new();
        entries
            .iter()
            .any(|(k, _)| keys.contains(&k.as_str()) && !seen.insert(k.as_str()))
    }

    /// The first exception of the module docs: the request object, or one of its (last)
    /// `inputs` or `outputs` objects, has a key the scan reads twice.
    fn repeats_a_scanned_key(&self) -> bool {
        let tensors = |list: &str, keys: &[&str]| match self.get(list) {
            Some(Json::Array(items)) => items.iter().any(|t| t.repeats(keys)),
            _ => false,
        };
        self.repeats(&["id", "parameters", "inputs", "outputs"])
            || tensors("inputs", &["name", "shape", "parameters"])
            || tensors("outputs", &["name", "parameters"])
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Json, D::Error> {
        d.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = Json;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Json, E> {
        Ok(Json::Scalar(Value::Bool(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Json, E> {
        Ok(Json::Scalar(Value::from(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Json, E> {
        Ok(Json::Scalar(Value::from(v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Json, E> {
        Ok(Json::Scalar(Value::from(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Json, E> {
        Ok(Json::Scalar(Value::String(v.to_string())))
    }

    fn visit_unit<E>(self) -> Result<Json, E> {
        Ok(Json::Scalar(Value::Null))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Json::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry::<String, Json>()? {
            entries.push(entry);
        }
        Ok(Json::Object(entries))
    }
}

/// The scan's answer by its documented rules (`http_scan.rs`), which are the typed decoder's
/// for these fields: an object; `id` a string; `parameters` an object whose routing keys have a
/// string, boolean or number value of the type `RequestOptions` takes; `inputs` and `outputs`
/// arrays of objects with a string `name`; an input's `shape` an array of non-negative
/// integers; a tensor's `parameters` an object, a key starting with `shared_memory` naming it
/// (the first such input, else the first such output). An absent key is empty, `null` is not.
fn derive(doc: &Value) -> Result<HttpScanned, ()> {
    let Value::Object(doc) = doc else {
        return Err(());
    };
    let id = match doc.get("id") {
        None => String::new(),
        Some(Value::String(id)) => id.clone(),
        Some(_) => return Err(()),
    };
    let mut routing = Parameters::new();
    if let Some(params) = object(doc.get("parameters"))? {
        for key in ROUTING_KEYS {
            if let Some(v) = params.get(key) {
                routing.insert(key.to_string(), nereid_frontend::param_value(v).ok_or(())?);
            }
        }
    }
    let (options, _) = RequestOptions::split(routing).map_err(drop)?;
    let mut shm_input = None;
    let mut inputs = Vec::new();
    for input in array(doc.get("inputs"))? {
        let Value::Object(input) = input else {
            return Err(());
        };
        let Some(Value::String(name)) = input.get("name") else {
            return Err(());
        };
        let Some(Value::Array(dims)) = input.get("shape") else {
            return Err(());
        };
        let shape = dims
            .iter()
            .map(|d| d.as_i64().filter(|d| *d >= 0).ok_or(()))
            .collect::<Result<_, ()>>()?;
        if names_shared_memory(input.get("parameters"))? && shm_input.is_none() {
            shm_input = Some(format!("input '{name}'"));
        }
        inputs.push(ScannedInput {
            name: name.clone(),
            shape,
        });
    }
    let mut shm_output = None;
    let outputs = array(doc.get("outputs"))?;
    for output in outputs {
        let Value::Object(output) = output else {
            return Err(());
        };
        let Some(Value::String(name)) = output.get("name") else {
            return Err(());
        };
        if names_shared_memory(output.get("parameters"))? && shm_output.is_none() {
            shm_output = Some(format!("output '{name}'"));
        }
    }
    Ok(HttpScanned {
        id,
        options,
        inputs,
        outputs: outputs.len(),
        shared_memory: shm_input.or(shm_output),
    })
}

fn object(value: Option<&Value>) -> Result<Option<&Map<String, Value>>, ()> {
    match value {
        None => Ok(None),
        Some(Value::Object(map)) => Ok(Some(map)),
        Some(_) => Err(()),
    }
}

fn array(value: Option<&Value>) -> Result<&[Value], ()> {
    match value {
        None => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(()),
    }
}

fn names_shared_memory(parameters: Option<&Value>) -> Result<bool, ()> {
    Ok(object(parameters)?.is_some_and(|m| m.keys().any(|k| k.starts_with("shared_memory"))))
}


/// The second property: what the typed decoder accepts, the scan accepts alike. The typed
/// request leaves shared-memory inputs out (they are read later), so inputs are compared only
/// without them.
fn typed_agrees(
    header_len: Option<usize>,
    body: &[u8],
    scanned: &Result<HttpScanned, HttpScanError>,
) {
    let header = header_len.map(|len| len.to_string());
    let config = ModelConfig::default();
    let Ok(request) = nereid_frontend::fuzzing::http_infer_body(
        header.as_deref().map(str::as_bytes),
        body,
        MAX_INPUT_SIZE,
        &config,
    ) else {
        return;
    };
    let Ok(s) = scanned else {
        panic!("the typed decoder accepts what the scan refuses: {scanned:?}");
    };
    assert_eq!(s.id, request.id);
    let o = &request.options;
    assert_eq!(
        (
            &s.options.sequence_id,
            s.options.sequence_start,
            s.options.sequence_end
        ),
        (&o.sequence_id, o.sequence_start, o.sequence_end),
    );
    assert_eq!(s.outputs, request.outputs.len());
    if s.shared_memory.is_none() {
        let typed: Vec<_> = request
            .inputs
            .iter()
            .map(|t| (t.name().to_string(), t.shape().to_vec()))
            .collect();
        let scanned: Vec<_> = s
            .inputs
            .iter()
            .map(|i| (i.name.clone(), i.shape.clone()))
            .collect();
        assert_eq!(scanned, typed);
    }
}
