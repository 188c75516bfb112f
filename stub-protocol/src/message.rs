//! Every message of the stub protocol as serde types (docs/internals/python-stub-protocol.md).
//!
//! [`ToStub`] is what the parent sends, [`FromStub`] what the stub sends; both are JSON objects
//! tagged by their `"op"` field. Tensor data never appears here: a [`TensorRef`] points into the
//! shared-memory segment named by the message's `segment` field.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Where one tensor lies in its message's segment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorRef {
    /// The tensor's name as the model's config declares it (`INPUT0`, `OUT0`...).
    pub name: String,
    /// KServe v2 wire name (`FP32`, `BYTES`...).
    pub datatype: String,
    /// The tensor's dimensions, outermost first; `[]` for a scalar.
    pub shape: Vec<i64>,
    /// Byte offset of the tensor's first byte from the start of the segment.
    pub offset: u64,
    /// Length of the tensor's data in bytes, starting at `offset`.
    pub nbytes: u64,
}

/// `pb_utils.TritonError`'s codes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorCode {
    /// `INTERNAL`: a failure inside the server or the model; what an error without a code means.
    #[default]
    Internal,
    /// `NOT_FOUND`: the named model, version, tensor or file does not exist.
    NotFound,
    /// `INVALID_ARG`: the caller passed a value that is not acceptable.
    InvalidArg,
    /// `UNAVAILABLE`: the target exists but cannot serve now (e.g. a model not ready).
    Unavailable,
    /// `UNSUPPORTED`: the operation is not supported in this configuration.
    Unsupported,
    /// `ALREADY_EXISTS`: the thing to be created is already there.
    AlreadyExists,
    /// `CANCELLED`: the request was cancelled before it completed.
    Cancelled,
    /// Also what an unrecognised code decodes to.
    #[serde(other)]
    Unknown,
}

/// An error as the protocol carries it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorObject {
    /// Human-readable text; for errors raised in Python it carries the traceback.
    pub message: String,
    /// The error's category; [`ErrorCode::Internal`] when the sender leaves it out.
    #[serde(default)]
    pub code: ErrorCode,
}

impl ErrorObject {
    /// An error with `code` and `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ErrorObject {
            message: message.into(),
            code,
        }
    }
}

/// A correlation id: an integer or a string.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum CorrelationValue {
    /// An integer id (JSON number); `0` means the request is in no sequence.
    Int(u64),
    /// A string id (JSON string).
    Str(String),
}

impl Default for CorrelationValue {
    fn default() -> Self {
        CorrelationValue::Int(0)
    }
}

/// A request: an `execute` request (parent → stub) or a BLS request (stub → parent).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestObject {
    /// The client's request id (`request.request_id()`); empty when the client gave none.
    #[serde(default)]
    pub request_id: String,
    /// The sequence the request belongs to (`request.correlation_id()`); `0` when none.
    #[serde(default)]
    pub correlation_id: CorrelationValue,
    /// 1 = sequence start, 2 = sequence end.
    #[serde(default)]
    pub flags: u32,
    /// Values are bool, integer, float or string.
    #[serde(default)]
    pub parameters: Map<String, Value>,
    /// The input tensors, located in the segment named by the enclosing message's `segment`.
    #[serde(default)]
    pub inputs: Vec<TensorRef>,
    /// The outputs the caller asked for; empty means every output.
    #[serde(default)]
    pub requested_output_names: Vec<String>,
    /// Names the request for decoupled responses and cancellation (parent → stub only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<u64>,
    /// The model a BLS request targets (stub → parent only; empty in `execute`).
    #[serde(default)]
    pub model_name: String,
    /// The version a BLS request targets (stub → parent only); `-1` (also the default when
    /// absent) = the latest version.
    #[serde(default = "latest_version")]
    pub model_version: i64,
    /// A BLS request's timeout in microseconds (stub → parent only); `0` = no timeout.
    #[serde(default)]
    pub timeout_us: u64,
    /// The W3C `traceparent` of the request's trace (parent → stub, when the request is
    /// traced), or of the trace a BLS call belongs to (stub → parent: the model passed
    /// `trace=request.trace()`, as in Triton).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
}

fn latest_version() -> i64 {
    -1
}

/// A response: output tensors, or an error.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponseObject {
    /// The output tensors, located in the segment named by the enclosing message's `segment`;
    /// empty when `error` is set.
    #[serde(default)]
    pub outputs: Vec<TensorRef>,
    /// Set when the response is an error (`InferenceResponse(error=...)`); `None` on success.
    #[serde(default)]
    pub error: Option<ErrorObject>,
    /// The response's parameters (bool, integer, float or string values); empty when none.
    #[serde(default)]
    pub parameters: Map<String, Value>,
}

/// `init`'s `args`: what the model's `initialize(self, args)` receives, all strings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InitArgs {
    /// The complete ModelConfig as JSON with Triton's field names.
    pub model_config: String,
    /// `CPU` or `GPU`.
    pub model_instance_kind: String,
    /// The name of the model instance being initialized.
    pub model_instance_name: String,
    /// The device id of the instance as a decimal string (`"0"` for CPU instances).
    pub model_instance_device_id: String,
    /// The model's directory (`<repository>/<model>`).
    pub model_repository: String,
    /// The version being loaded, as a decimal string.
    pub model_version: String,
    /// The model's name.
    pub model_name: String,
}

/// Parent → stub.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToStub {
    /// Start the model: import `model_file` and call `initialize(args)`; answered by
    /// [`FromStub::InitDone`].
    Init {
        /// [`crate::PROTOCOL_VERSION`] of the server; the stub refuses another.
        #[serde(default)]
        protocol_version: u32,
        /// Path prefix of every segment file of this stub (`<shm_prefix><segment id>`).
        shm_prefix: String,
        /// Path of the model's `model.py`.
        model_file: String,
        /// What `initialize(self, args)` receives.
        args: InitArgs,
        /// Whether the model uses the decoupled transaction policy: responses then go out as
        /// [`FromStub::Response`] messages instead of in `execute_done`.
        decoupled: bool,
    },
    /// Run the model's `auto_complete_config` on `config`; sent to a throw-away stub that
    /// answers [`FromStub::AutoCompleteDone`] and exits.
    AutoComplete {
        /// [`crate::PROTOCOL_VERSION`] of the server; the stub refuses another.
        #[serde(default)]
        protocol_version: u32,
        /// Path prefix of every segment file of this stub (`<shm_prefix><segment id>`).
        shm_prefix: String,
        /// Path of the model's `model.py`.
        model_file: String,
        /// The ModelConfig as JSON with Triton's field names, as read so far.
        config: Value,
    },
    /// Call the model's `execute` on a batch of requests; answered by [`FromStub::ExecuteDone`]
    /// with the same `id`.
    Execute {
        /// Chosen by the parent; the `execute_done` for this batch carries it back.
        id: u64,
        /// The batch, in the order `execute` receives it.
        requests: Vec<RequestObject>,
        /// The parent segment holding the requests' input tensors; `None` when they have no data.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        segment: Option<String>,
    },
    /// One response to the stub's BLS call `id`.
    BlsResponse {
        /// The `id` of the [`FromStub::BlsRequest`] this answers.
        id: u64,
        /// The response; `None` only on the final message of a decoupled call (or of a
        /// cancelled one).
        response: Option<ResponseObject>,
        /// Whether this is the call's last message (`"final"` on the wire); a non-decoupled
        /// call gets exactly one, with a response.
        #[serde(rename = "final")]
        is_final: bool,
        /// The parent segment holding the response's output tensors; `None` when there is no
        /// tensor data.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        segment: Option<String>,
    },
    /// The request with `key` was cancelled: its `is_cancelled()` (and its response sender's)
    /// becomes true.
    Cancel {
        /// The [`RequestObject::key`] of the cancelled request.
        key: u64,
    },
    /// The answer to the stub's `model_control` call `id`.
    ModelControlDone {
        /// The `id` of the [`FromStub::ModelControl`] this answers.
        id: u64,
        /// Why the action failed (raised in the waiting Python call); `None` on success.
        #[serde(default)]
        error: Option<ErrorObject>,
        /// `is_model_ready`'s answer (false for the other actions).
        #[serde(default)]
        ready: bool,
    },
    /// The answer to the stub's custom-metric call `id` (`family_new`, `value`).
    MetricDone {
        /// The `id` of the [`FromStub::Metric`] call this answers.
        id: u64,
        /// `value`'s answer: a number, `"NaN"`, `"Infinity"` or `"-Infinity"`; else null.
        value: Value,
        /// Why the call failed (raised in the waiting Python call); `None` on success.
        error: Option<ErrorObject>,
    },
    /// The parent is done with a stub segment; the stub may reuse it.
    Release {
        /// The id of the stub's segment (`s<k>`).
        segment: String,
    },
    /// Call the model's `finalize`; answered by [`FromStub::FinalizeDone`], then the stub exits.
    Finalize,
}

/// Stub → parent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum FromStub {
    /// The answer to [`ToStub::Init`].
    InitDone {
        /// Why loading or `initialize` failed, with the Python traceback; `None` on success.
        #[serde(default)]
        error: Option<ErrorObject>,
    },
    /// The answer to [`ToStub::AutoComplete`].
    AutoCompleteDone {
        /// The completed ModelConfig as JSON; `None` when `error` is set.
        #[serde(default)]
        config: Option<Value>,
        /// Why auto-completion failed, with the Python traceback; `None` on success.
        #[serde(default)]
        error: Option<ErrorObject>,
    },
    /// The answer to [`ToStub::Execute`], sent once the model's `execute` has returned.
    ExecuteDone {
        /// The `id` of the `execute` this answers.
        id: u64,
        /// Non-decoupled: one per request, in order. Decoupled: absent.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        responses: Vec<ResponseObject>,
        /// `execute` itself failed: every request fails with it.
        #[serde(default)]
        error: Option<ErrorObject>,
        /// The stub segment holding the responses' output tensors; `None` when there is no
        /// tensor data.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        segment: Option<String>,
        /// Indexes (in `requests`) of the requests the model rescheduled (Triton's
        /// `set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`): not complete, to be
        /// run again; their `responses` entries are empty, and a decoupled one's key stays open.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        rescheduled: Vec<usize>,
        /// With `rescheduled` (decoupled): how many `response` messages the stub had sent in
        /// all when it wrote this answer, so that the parent runs those requests again only
        /// once it has delivered their responses (in order, and their segments released).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        responses_sent: Option<u64>,
    },
    /// The answer to [`ToStub::Finalize`]; the stub exits after sending it.
    FinalizeDone {
        /// Why `finalize` failed, with the Python traceback; `None` on success.
        #[serde(default)]
        error: Option<ErrorObject>,
    },
    /// A decoupled response sender's `send(response, flags)`.
    Response {
        /// The [`RequestObject::key`] of the request answered; dead after a final response.
        key: u64,
        /// The response; `None` when the sender only sends the final flag.
        #[serde(default)]
        response: Option<ResponseObject>,
        /// 1 = final.
        #[serde(default)]
        flags: u32,
        /// The stub segment holding the response's output tensors; `None` when there is no
        /// tensor data.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        segment: Option<String>,
    },
    /// An `InferenceRequest.exec()` / `async_exec()` (BLS) call; answered by
    /// [`ToStub::BlsResponse`] messages with the same `id`.
    BlsRequest {
        /// Chosen by the stub, unique per stub.
        id: u64,
        /// The request to run, with `model_name`, `model_version` and `timeout_us` set.
        request: RequestObject,
        /// Whether the caller expects a stream of responses (`exec(decoupled=True)`).
        #[serde(default)]
        decoupled: bool,
        /// The stub segment holding the request's input tensors; `None` when they have no data.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        segment: Option<String>,
    },
    /// A `pb_utils.Logger` line; the parent writes it to its log with the instance name.
    Log {
        /// `INFO`, `WARNING`, `ERROR` or `VERBOSE`; empty when absent.
        #[serde(default)]
        level: String,
        /// The text to log.
        message: String,
    },
    /// `ResponseIterator.cancel()` of the decoupled BLS call `id`.
    BlsCancel {
        /// The `id` of the decoupled [`FromStub::BlsRequest`] to cancel; one that already
        /// ended is ignored.
        id: u64,
    },
    /// `pb_utils.load_model` / `unload_model` / `is_model_ready`, answered by
    /// `model_control_done` with the same `id`.
    ModelControl {
        /// Chosen by the stub, unique per stub.
        id: u64,
        /// What to do; its fields sit beside `id` on the wire, tagged by `action`.
        #[serde(flatten)]
        action: ModelControlAction,
    },
    /// `pb_utils.MetricFamily` and its metrics: the fields by `action`, decoded (and, when
    /// they do not decode, logged and skipped) by `custom_metrics`.
    Metric {
        /// Every field of the frame but `op`, kept undecoded (flattened on the wire).
        #[serde(flatten)]
        fields: Map<String, Value>,
    },
    /// The stub is done with a parent segment; the parent may reuse it.
    Release {
        /// The id of the parent's segment (`p<k>`).
        segment: String,
    },
}

/// What a `model_control` call asks of the server's model repository.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum ModelControlAction {
    /// `pb_utils.load_model`: load (or reload) a model.
    Load {
        /// The model to load.
        model_name: String,
        /// A `ModelConfig` as JSON that replaces the model's `config.pbtxt`; empty: none.
        #[serde(default)]
        config: String,
        /// `file:<version>/<path>` → the file's bytes, base64.
        #[serde(default)]
        files: BTreeMap<String, String>,
    },
    /// `pb_utils.unload_model`: unload a model.
    Unload {
        /// The model to unload.
        model_name: String,
        /// Whether the models it depends on (an ensemble's composing models) are unloaded too.
        #[serde(default)]
        unload_dependents: bool,
    },
    /// `pb_utils.is_model_ready`: whether a model version is ready.
    Ready {
        /// The model to check.
        model_name: String,
        /// A version number; empty: the latest.
        #[serde(default)]
        model_version: String,
    },
}

/// The `op` names [`FromStub`] knows; a frame with another op is ignored (newer stub), a frame
/// with one of these that does not decode is a protocol error.
pub const KNOWN_STUB_OPS: [&str; 11] = [
    "init_done",
    "auto_complete_done",
    "execute_done",
    "finalize_done",
    "response",
    "bls_request",
    "log",
    "bls_cancel",
    "model_control",
    "metric",
    "release",
];

/// The `op` names [`ToStub`] knows; the stub ignores a frame with another op (newer server)
/// and treats one of these that does not decode as a protocol error.
pub const KNOWN_PARENT_OPS: [&str; 9] = [
    "init",
    "auto_complete",
    "execute",
    "bls_response",
    "cancel",
    "model_control_done",
    "metric_done",
    "release",
    "finalize",
];

/// The `response` flag that ends a decoupled request.
pub const RESPONSE_FINAL: u32 = 1;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn to_value(m: &ToStub) -> Value {
        serde_json::to_value(m).unwrap()
    }

    #[test]
    fn parent_messages_have_the_documented_shape() {
        let execute = ToStub::Execute {
            id: 7,
            requests: vec![RequestObject {
                request_id: "abc".into(),
                correlation_id: CorrelationValue::Str("seq".into()),
                flags: 1,
                inputs: vec![TensorRef {
                    name: "INPUT0".into(),
                    datatype: "FP32".into(),
                    shape: vec![2, 16],
                    offset: 0,
                    nbytes: 128,
                }],
                requested_output_names: vec!["OUT0".into()],
                key: Some(17),
                model_name: "m".into(),
                model_version: 1,
                ..Default::default()
            }],
            segment: Some("p3".into()),
        };
        assert_eq!(
            to_value(&execute),
            json!({"op": "execute", "id": 7, "segment": "p3", "requests": [{
                "request_id": "abc", "correlation_id": "seq", "flags": 1, "parameters": {},
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 16], "offset": 0, "nbytes": 128}],
                "requested_output_names": ["OUT0"], "key": 17, "model_name": "m",
                "model_version": 1, "timeout_us": 0}]})
        );
        assert_eq!(to_value(&ToStub::Finalize), json!({"op": "finalize"}));
        assert_eq!(
            to_value(&ToStub::BlsResponse {
                id: 3,
                response: None,
                is_final: true,
                segment: None
            }),
            json!({"op": "bls_response", "id": 3, "response": null, "final": true})
        );
        assert_eq!(
            to_value(&ToStub::Release {
                segment: "s1".into()
            }),
            json!({"op": "release", "segment": "s1"})
        );
    }

    #[test]
    fn stub_messages_decode_with_defaults() {
        let done: FromStub = serde_json::from_value(json!({
            "op": "execute_done", "id": 2, "segment": "s0", "error": null,
            "responses": [{"outputs": [{"name": "OUT0", "datatype": "BYTES", "shape": [1], "offset": 64, "nbytes": 7}],
                           "error": null, "parameters": {"p": 1}}]
        }))
        .unwrap();
        let FromStub::ExecuteDone {
            id,
            responses,
            error,
            segment,
            rescheduled,
            responses_sent,
        } = done
        else {
            panic!("wrong variant");
        };
        assert_eq!((id, error, segment.as_deref()), (2, None, Some("s0")));
        assert_eq!(responses[0].outputs[0].offset, 64);
        assert!(rescheduled.is_empty(), "absent: nothing rescheduled");
        assert_eq!(responses_sent, None);

        let decoupled_done: FromStub =
            serde_json::from_value(json!({"op": "execute_done", "id": 4, "error": null})).unwrap();
        assert!(
            matches!(decoupled_done, FromStub::ExecuteDone { responses, .. } if responses.is_empty())
        );
        let again: FromStub = serde_json::from_value(
            json!({"op": "execute_done", "id": 5, "error": null, "rescheduled": [1]}),
        )
        .unwrap();
        assert!(matches!(again, FromStub::ExecuteDone { rescheduled, .. } if rescheduled == [1]));

        let bls: FromStub = serde_json::from_value(json!({
            "op": "bls_request", "id": 9, "decoupled": false,
            "request": {"model_name": "add", "requested_output_names": ["OUT"], "correlation_id": 5, "inputs": []}
        }))
        .unwrap();
        let FromStub::BlsRequest { request, .. } = bls else {
            panic!("wrong variant");
        };
        assert_eq!(request.model_version, -1, "absent version means latest");
        assert_eq!(request.correlation_id, CorrelationValue::Int(5));
    }

    #[test]
    fn error_codes_use_triton_names_and_tolerate_unknown_ones() {
        let e: ErrorObject =
            serde_json::from_value(json!({"message": "bad", "code": "INVALID_ARG"})).unwrap();
        assert_eq!(e.code, ErrorCode::InvalidArg);
        let e: ErrorObject =
            serde_json::from_value(json!({"message": "x", "code": "SOMETHING_NEW"})).unwrap();
        assert_eq!(e.code, ErrorCode::Unknown);
        let e: ErrorObject = serde_json::from_value(json!({"message": "x"})).unwrap();
        assert_eq!(e.code, ErrorCode::Internal);
        assert_eq!(
            serde_json::to_value(ErrorObject::new(ErrorCode::AlreadyExists, "m")).unwrap(),
            json!({"message": "m", "code": "ALREADY_EXISTS"})
        );
    }

    #[test]
    fn every_parent_op_is_known() {
        let messages = [
            ToStub::Execute {
                id: 1,
                requests: Vec::new(),
                segment: None,
            },
            ToStub::BlsResponse {
                id: 1,
                response: None,
                is_final: true,
                segment: None,
            },
            ToStub::Cancel { key: 1 },
            ToStub::ModelControlDone {
                id: 1,
                error: None,
                ready: false,
            },
            ToStub::MetricDone {
                id: 1,
                value: Value::Null,
                error: None,
            },
            ToStub::Release {
                segment: "s0".into(),
            },
            ToStub::Finalize,
        ];
        for m in messages {
            let v = serde_json::to_value(&m).unwrap();
            assert!(KNOWN_PARENT_OPS.contains(&v["op"].as_str().unwrap()), "{v}");
        }
        for op in ["init", "auto_complete"] {
            assert!(KNOWN_PARENT_OPS.contains(&op));
        }
    }

    #[test]
    fn every_stub_op_round_trips() {
        let messages = [
            FromStub::InitDone { error: None },
            FromStub::AutoCompleteDone {
                config: Some(json!({"name": "m"})),
                error: None,
            },
            FromStub::FinalizeDone {
                error: Some(ErrorObject::new(ErrorCode::Internal, "boom")),
            },
            FromStub::Response {
                key: 1,
                response: None,
                flags: RESPONSE_FINAL,
                segment: None,
            },
            FromStub::Log {
                level: "INFO".into(),
                message: "hi".into(),
            },
            FromStub::Release {
                segment: "p0".into(),
            },
        ];
        for m in messages {
            let v = serde_json::to_value(&m).unwrap();
            assert!(KNOWN_STUB_OPS.contains(&v["op"].as_str().unwrap()));
            assert_eq!(serde_json::from_value::<FromStub>(v).unwrap(), m);
        }
    }
}
