//! Custom metrics from a Python model (`pb_utils.MetricFamily`): the stub's `metric` messages,
//! applied to the stub's [`Owner`] in the server-wide registry ([`crate::custom_metrics`]).
//!
//! ```text
//!  reader thread: metric {action: family_new | value, id} ─► Owner ─► metric_done {id, value, error}
//!                 metric {action: family_delete | new | delete | increment | set | observe}
//!                                                        ─► Owner (a refusal is logged, never answered)
//!  reader ends (the stub is gone) ─► Owner::clear ─► its families and metrics leave /metrics
//! ```
//!
//! The stub checks what it can before sending, so a model sees its mistakes as exceptions at
//! once; the registry checks everything again. A message that does not decode is logged and
//! skipped (answered with an error when it carries an `id`, so no model thread waits forever).

use std::collections::BTreeMap;

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Map, Value};

use super::link::Link;
use crate::custom_metrics::{MetricError, MetricKind, Owner, Update};
use nereid_stub_protocol::message::{ErrorCode, ErrorObject, ToStub};

/// One `metric` message, by its `action`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum MetricCall {
    /// `MetricFamily(name, description, kind)`; answered.
    FamilyNew {
        id: u64,
        family: u64,
        name: String,
        description: String,
        kind: WireKind,
    },
    /// The `MetricFamily` object is garbage.
    FamilyDelete {
        family: u64,
    },
    /// `family.Metric(labels, buckets)`.
    New {
        metric: u64,
        family: u64,
        #[serde(default)]
        labels: BTreeMap<String, String>,
        #[serde(default)]
        buckets: Option<Vec<WireNumber>>,
    },
    /// The `Metric` object is garbage.
    Delete {
        metric: u64,
    },
    Increment {
        metric: u64,
        value: WireNumber,
    },
    Set {
        metric: u64,
        value: WireNumber,
    },
    Observe {
        metric: u64,
        value: WireNumber,
    },
    /// `metric.value()`; answered.
    Value {
        id: u64,
        metric: u64,
    },
}

/// `pb_utils.MetricFamily`'s kinds, as Triton names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum WireKind {
    Counter,
    Gauge,
    Histogram,
}

impl From<WireKind> for MetricKind {
    fn from(kind: WireKind) -> MetricKind {
        match kind {
            WireKind::Counter => MetricKind::Counter,
            WireKind::Gauge => MetricKind::Gauge,
            WireKind::Histogram => MetricKind::Histogram,
        }
    }
}

/// A float on the wire: a JSON number, or `"NaN"`, `"Infinity"`, `"-Infinity"` (JSON has no
/// spelling for those; Triton accepts them as metric values).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WireNumber(pub f64);

impl Serialize for WireNumber {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let v = self.0;
        if v.is_finite() {
            serializer.serialize_f64(v)
        } else if v.is_nan() {
            serializer.serialize_str("NaN")
        } else if v > 0.0 {
            serializer.serialize_str("Infinity")
        } else {
            serializer.serialize_str("-Infinity")
        }
    }
}

impl<'de> Deserialize<'de> for WireNumber {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Number(v) => Ok(WireNumber(v)),
            Raw::Text(text) => match text.as_str() {
                "NaN" => Ok(WireNumber(f64::NAN)),
                "Infinity" => Ok(WireNumber(f64::INFINITY)),
                "-Infinity" => Ok(WireNumber(f64::NEG_INFINITY)),
                other => Err(de::Error::custom(format!(
                    "expected a number, \"NaN\", \"Infinity\" or \"-Infinity\", got \"{other}\""
                ))),
            },
        }
    }
}

/// Handles one `metric` message (its fields without `op`) for the stub behind `link`.
pub fn handle(link: &Link, fields: Map<String, Value>) {
    let owner = &link.custom_metrics;
    let id = fields.get("id").and_then(Value::as_u64);
    let call = match serde_json::from_value::<MetricCall>(Value::Object(fields)) {
        Ok(call) => call,
        Err(e) => {
            tracing::warn!(model = %link.model, instance = %link.instance, error = %e, "the Python stub sent an invalid custom-metric message; ignored");
            if let Some(id) = id {
                let error = ErrorObject::new(
                    ErrorCode::InvalidArg,
                    format!("invalid custom-metric message: {e}"),
                );
                answer(link, id, Err(error));
            }
            return;
        }
    };
    match call {
        MetricCall::FamilyNew {
            id,
            family,
            name,
            description,
            kind,
        } => {
            let result = owner.family_new(family, &name, &description, kind.into());
            answer(link, id, result.map(|()| None).map_err(error_object));
        }
        MetricCall::Value { id, metric } => {
            let result = owner.value(metric);
            answer(link, id, result.map(Some).map_err(error_object));
        }
        call => {
            if let Err(e) = apply(owner, call) {
                tracing::warn!(model = %link.model, instance = %link.instance, error = %e, "a custom-metric operation of the Python model was refused");
            }
        }
    }
}

/// The calls that get no answer.
fn apply(owner: &Owner, call: MetricCall) -> Result<(), MetricError> {
    match call {
        MetricCall::FamilyDelete { family } => owner.family_delete(family),
        MetricCall::New {
            metric,
            family,
            labels,
            buckets,
        } => {
            let buckets = buckets.map(|b| b.into_iter().map(|n| n.0).collect());
            owner.metric_new(metric, family, labels, buckets)
        }
        MetricCall::Delete { metric } => owner.metric_delete(metric),
        MetricCall::Increment { metric, value } => owner.update(metric, Update::Increment(value.0)),
        MetricCall::Set { metric, value } => owner.update(metric, Update::Set(value.0)),
        MetricCall::Observe { metric, value } => owner.update(metric, Update::Observe(value.0)),
        MetricCall::FamilyNew { .. } | MetricCall::Value { .. } => Ok(()),
    }
}

fn error_object(e: MetricError) -> ErrorObject {
    let code = match e {
        MetricError::UnknownFamily(_) | MetricError::UnknownMetric(_) => ErrorCode::NotFound,
        MetricError::Unsupported { .. } => ErrorCode::Unsupported,
        MetricError::TooMany => ErrorCode::Unavailable,
        MetricError::InvalidName(_)
        | MetricError::InvalidLabelName(_)
        | MetricError::KindConflict { .. }
        | MetricError::NegativeIncrement
        | MetricError::UnsortedBuckets(_)
        | MetricError::MissingBuckets
        | MetricError::UnexpectedBuckets
        | MetricError::HandleInUse(_) => ErrorCode::InvalidArg,
    };
    ErrorObject::new(code, e.to_string())
}

fn wire_number(v: f64) -> Value {
    serde_json::to_value(WireNumber(v)).unwrap_or(Value::Null)
}

fn answer(link: &Link, id: u64, result: Result<Option<f64>, ErrorObject>) {
    let (value, error) = match result {
        Ok(value) => (value.map_or(Value::Null, wire_number), None),
        Err(error) => (Value::Null, Some(error)),
    };
    if let Err(e) = link.send(&ToStub::MetricDone { id, value, error }) {
        // The stub died meanwhile; its death is handled by the reader.
        tracing::debug!(instance = %link.instance, error = %e, "cannot answer a custom-metric call");
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixStream;
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::backend::ServerHandle;
    use nereid_stub_protocol::frame::{decode, read_frame};

    fn link() -> (Link, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let link = Link::new(
            "m".into(),
            "m_0".into(),
            Arc::new(ServerHandle::default()),
            ours,
            "/nonexistent/seg-",
        );
        (link, theirs)
    }

    fn send(link: &Link, message: Value) {
        let Value::Object(fields) = message else {
            panic!("not an object");
        };
        handle(link, fields);
    }

    fn next(stub: &mut UnixStream) -> Value {
        decode(&read_frame(stub).unwrap().unwrap()).unwrap()
    }

    #[test]
    fn calls_with_an_id_are_answered_and_the_rest_are_not() {
        let (link, mut stub) = link();
        send(
            &link,
            json!({"action": "family_new", "id": 1, "family": 10, "name": "g", "description": "d", "kind": "GAUGE"}),
        );
        assert_eq!(
            next(&mut stub),
            json!({"op": "metric_done", "id": 1, "value": null, "error": null})
        );
        send(
            &link,
            json!({"action": "new", "metric": 11, "family": 10, "labels": {"a": "b"}}),
        );
        send(
            &link,
            json!({"action": "set", "metric": 11, "value": "Infinity"}),
        );
        send(&link, json!({"action": "value", "id": 2, "metric": 11}));
        assert_eq!(
            next(&mut stub),
            json!({"op": "metric_done", "id": 2, "value": "Infinity", "error": null})
        );
        send(
            &link,
            json!({"action": "increment", "metric": 11, "value": -1.5}),
        );
        send(&link, json!({"action": "set", "metric": 11, "value": 2}));
        send(
            &link,
            json!({"action": "observe", "metric": 11, "value": 2}),
        );
        send(&link, json!({"action": "value", "id": 3, "metric": 11}));
        assert_eq!(
            next(&mut stub),
            json!({"op": "metric_done", "id": 3, "value": 2.0, "error": null}),
            "the refused observe changed nothing"
        );
        let text = nereid_telemetry::render_prometheus(&link.server.custom_metrics().families());
        assert!(text.contains("g{a=\"b\"} 2\n"), "{text}");
    }

    #[test]
    fn refusals_and_undecodable_calls_answer_with_an_error() {
        let (link, mut stub) = link();
        send(
            &link,
            json!({"action": "family_new", "id": 1, "family": 1, "name": "bad name", "description": "", "kind": "COUNTER"}),
        );
        let answer = next(&mut stub);
        assert_eq!(answer["error"]["code"], "INVALID_ARG");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("Invalid metric name 'bad name'"),
            "{answer}"
        );
        send(
            &link,
            json!({"action": "family_new", "id": 2, "family": 1, "name": "x", "description": "", "kind": "SUMMARY"}),
        );
        let answer = next(&mut stub);
        assert_eq!(answer["id"], 2);
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains("invalid custom-metric message"),
            "{answer}"
        );
        send(&link, json!({"action": "value", "id": 3, "metric": 99}));
        assert_eq!(next(&mut stub)["error"]["code"], "NOT_FOUND");
        // No id: nothing to answer, nothing breaks.
        send(
            &link,
            json!({"action": "increment", "metric": 1, "value": "many"}),
        );
        send(&link, json!({"action": "teleport"}));
        send(&link, json!({"action": "value", "id": 4, "metric": 99}));
        assert_eq!(next(&mut stub)["id"], 4);
    }

    #[test]
    fn wire_numbers_spell_what_json_cannot() {
        for (v, wire) in [
            (1.5, json!(1.5)),
            (f64::INFINITY, json!("Infinity")),
            (f64::NEG_INFINITY, json!("-Infinity")),
        ] {
            assert_eq!(serde_json::to_value(WireNumber(v)).unwrap(), wire);
            assert_eq!(
                serde_json::from_value::<WireNumber>(wire).unwrap(),
                WireNumber(v)
            );
        }
        assert_eq!(
            serde_json::to_value(WireNumber(f64::NAN)).unwrap(),
            json!("NaN")
        );
        assert!(
            serde_json::from_value::<WireNumber>(json!("NaN"))
                .unwrap()
                .0
                .is_nan()
        );
        assert!(serde_json::from_value::<WireNumber>(json!(3)).is_ok());
        assert!(serde_json::from_value::<WireNumber>(json!("1.0")).is_err());
        assert!(serde_json::from_value::<WireNumber>(json!(null)).is_err());
    }
}
