//! The router's protobuf scanner of a gRPC `ModelInferRequest` (`nereid-router`'s
//! `wire_scan.rs`: what the pass-through reads before forwarding the client's bytes), against
//! prost's decode of the same bytes. Two properties:
//!
//! - exact: the scan answers as prost does for the fields the scanner reads. [`Routed`] is those
//!   fields as prost messages, with the same numbers and types; every other field is unknown to
//!   it, so prost skips it as the scanner does. Decoded, then derived by the scanner's rules
//!   ([`derive`]), it must equal the scan, and one refuses exactly what the other refuses (wire
//!   rules included: varint and field-number bounds, prost's nesting limit of 100 levels).
//! - routing is what the worker reads: when prost decodes the whole `ModelInferRequest` (the
//!   worker's decode), the scan succeeds with the model, version, sequence options, tensor
//!   names and shapes, output count and shared-memory tensor derived from that decode.
//!
//! One exception, to the second property only: prost reads a map field (`parameters`: the
//! request's field 4, an input's 4, an output's 2) as length-delimited whatever wire type its
//! key says (prost-derive hands the map merge no wire type), so it takes a malformed message
//! that the scan, keeping to protobuf's rule, refuses ([`prost_reads_a_map_field_anyway`]).
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use nereid_proto::pb::inference::infer_parameter::ParameterChoice;
use nereid_proto::pb::inference::{InferParameter, ModelInferRequest};
use nereid_proto::{ParamValue, Parameters, RequestOptions};
use prost::Message;
use wire_scan::{ScanError, ScannedInput, ScannedRequest, scan_request};

/// The router's scanner, compiled in from its source: it uses nothing else of `nereid-router`,
/// whose server (tonic, OpenTelemetry, tracing-subscriber) the light build leaves out.
#[path = "../../router/src/wire_scan.rs"]
#[allow(dead_code)]
mod wire_scan;

/// The parameter keys replica choice reads.
const ROUTING_KEYS: [&str; 3] = ["sequence_id", "sequence_start", "sequence_end"];

fuzz_target!(|data: &[u8]| {
    let scanned = scan_request(data);
    let routed = Routed::decode(data)
        .map_err(drop)
        .and_then(|r| derive(r.into()));
    match (&scanned, &routed) {
        (Ok(s), Ok(r)) => assert_eq!(s, r, "the scan differs from prost's decode"),
        (Err(_), Err(_)) => {}
        (s, r) => panic!("scan {s:?} but prost's decode of the scanned fields {r:?}"),
    }
    if let Ok(full) = ModelInferRequest::decode(data) {
        let worker = derive(full.into());
        match (&scanned, &worker) {
            (Ok(s), Ok(w)) => assert_eq!(s, w, "the scan differs from the worker's decode"),
            (Err(_), Err(_)) => {}
            (Err(e), Ok(_)) if prost_reads_a_map_field_anyway(e) => {}
            (s, w) => panic!("scan {s:?} but the worker's decode gives {w:?}"),
        }
    }
});

/// The exception of the module docs: the scan refused a map field for its wire type.
fn prost_reads_a_map_field_anyway(e: &ScanError) -> bool {
    let ScanError::WireType { at, field, .. } = e else {
        return false;
    };
    match *field {
        4 => at == "ModelInferRequest" || at.starts_with("ModelInferRequest.inputs["),
        2 => at.starts_with("ModelInferRequest.outputs["),
        _ => false,
    }
}

/// What the scanner reads of a `ModelInferRequest` (see the module docs). A map entry is a
/// message of key (1) and value (2), so `parameters` keeps every entry in order: the scanner
/// decodes the value of each routing entry, even one that a later entry replaces.
#[derive(Clone, PartialEq, Message)]
struct Routed {
    #[prost(string, tag = "1")]
    model_name: String,
    #[prost(string, tag = "2")]
    model_version: String,
    #[prost(message, repeated, tag = "4")]
    parameters: Vec<ParamEntry>,
    #[prost(message, repeated, tag = "5")]
    inputs: Vec<RoutedInput>,
    #[prost(message, repeated, tag = "6")]
    outputs: Vec<RoutedOutput>,
}

#[derive(Clone, PartialEq, Message)]
struct ParamEntry {
    #[prost(string, tag = "1")]
    key: String,
    /// An `InferParameter`, decoded only for a routing key. A message field: each occurrence
    /// is merged into it, so they are kept apart here.
    #[prost(bytes = "vec", repeated, tag = "2")]
    value: Vec<Vec<u8>>,
}

#[derive(Clone, PartialEq, Message)]
struct RoutedInput {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(int64, repeated, tag = "3")]
    shape: Vec<i64>,
    #[prost(message, repeated, tag = "4")]
    parameters: Vec<ParamKey>,
}

#[derive(Clone, PartialEq, Message)]
struct RoutedOutput {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, repeated, tag = "2")]
    parameters: Vec<ParamKey>,
}

/// A tensor's parameter entry: only the key is read (the value is skipped, any wire type).
#[derive(Clone, PartialEq, Message)]
struct ParamKey {
    #[prost(string, tag = "1")]
    key: String,
}

/// The fields routing reads, from either decode. `routing`: each routing key's last value, or
/// `Err` when an entry's value does not decode.
struct Fields {
    model_name: String,
    model_version: String,
    routing: Result<BTreeMap<String, Option<ParameterChoice>>, ()>,
    /// Name, shape, whether a parameter key starts with `shared_memory`.
    inputs: Vec<(String, Vec<i64>, bool)>,
    outputs: Vec<(String, bool)>,
}

fn names_shm<'a>(mut keys: impl Iterator<Item = &'a String>) -> bool {
    keys.any(|k| k.starts_with("shared_memory"))
}

impl From<Routed> for Fields {
    fn from(r: Routed) -> Fields {
        let mut routing = Ok(BTreeMap::new());
        for e in r
            .parameters
            .iter()
            .filter(|e| ROUTING_KEYS.contains(&e.key.as_str()))
        {
            let mut param = InferParameter::default();
            let merged = e.value.iter().try_for_each(|v| param.merge(v.as_slice()));
            match (merged.map(|()| param), &mut routing) {
                (Ok(param), Ok(map)) => {
                    map.insert(e.key.clone(), param.parameter_choice);
                }
                (Ok(_), Err(())) => {}
                (Err(_), _) => routing = Err(()),
            }
        }
        Fields {
            model_name: r.model_name,
            model_version: r.model_version,
            routing,
            inputs: r
                .inputs
                .into_iter()
                .map(|i| {
                    (
                        i.name,
                        i.shape,
                        names_shm(i.parameters.iter().map(|p| &p.key)),
                    )
                })
                .collect(),
            outputs: r
                .outputs
                .into_iter()
                .map(|o| (o.name, names_shm(o.parameters.iter().map(|p| &p.key))))
                .collect(),
        }
    }
}

impl From<ModelInferRequest> for Fields {
    fn from(m: ModelInferRequest) -> Fields {
        let routing = ROUTING_KEYS
            .iter()
            .filter_map(|&k| Some((k.to_string(), m.parameters.get(k)?.parameter_choice.clone())))
            .collect();
        Fields {
            model_name: m.model_name,
            model_version: m.model_version,
            routing: Ok(routing),
            inputs: m
                .inputs
                .into_iter()
                .map(|i| {
                    let shm = names_shm(i.parameters.keys());
                    (i.name, i.shape, shm)
                })
                .collect(),
            outputs: m
                .outputs
                .into_iter()
                .map(|o| {
                    let shm = names_shm(o.parameters.keys());
                    (o.name, shm)
                })
                .collect(),
        }
    }
}

/// The scan's answer by its documented rules: a model name is required; a routing parameter
/// needs a value of the type `RequestOptions` takes; the shared-memory tensor named is the
/// first input that has a `shared_memory*` parameter, else the first such output.
fn derive(f: Fields) -> Result<ScannedRequest, ()> {
    if f.model_name.is_empty() {
        return Err(());
    }
    let routing: Parameters = f
        .routing?
        .into_iter()
        .map(|(key, choice)| Ok((key, param_value(choice.ok_or(())?))))
        .collect::<Result<_, ()>>()?;
    let (options, _) = RequestOptions::split(routing).map_err(drop)?;
    let shared_memory = f
        .inputs
        .iter()
        .find(|i| i.2)
        .map(|i| format!("input '{}'", i.0))
        .or_else(|| {
            f.outputs
                .iter()
                .find(|o| o.1)
                .map(|o| format!("output '{}'", o.0))
        });
    Ok(ScannedRequest {
        model_name: f.model_name,
        model_version: f.model_version,
        options,
        outputs: f.outputs.len(),
        inputs: f
            .inputs
            .into_iter()
            .map(|(name, shape, _)| ScannedInput { name, shape })
            .collect(),
        shared_memory,
    })
}

fn param_value(choice: ParameterChoice) -> ParamValue {
    match choice {
        ParameterChoice::BoolParam(v) => ParamValue::Bool(v),
        ParameterChoice::Int64Param(v) => ParamValue::Int(v),
        ParameterChoice::StringParam(v) => ParamValue::String(v),
        ParameterChoice::DoubleParam(v) => ParamValue::Double(v),
        ParameterChoice::Uint64Param(v) => ParamValue::Uint(v),
    }
}
