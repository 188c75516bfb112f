//! Checks an [`InferRequest`] against the model's config before anything runs, with Triton's
//! messages: unknown or missing inputs, datatypes, shapes, batch size, requested outputs.
//!
//! The result, [`ValidRequest`], is what instances execute: the inputs as the client shaped
//! them (backends apply a config `reshape` themselves) and the list of outputs to produce.

use std::collections::HashSet;

use nereid_proto::{
    CorrelationId, InferRequest, Parameters, RequestOptions, ServiceError, Tensor, format_shape,
};

use crate::backend::ResponseSink;
use crate::classification::{self, Classify};
use crate::config::ValidModelConfig;

/// A request that fits its model.
#[derive(Debug, Default)]
pub struct ValidRequest {
    /// The client's request id (may be empty).
    pub id: String,
    /// Custom request parameters (reserved keys removed), for backends that read them.
    pub parameters: Parameters,
    /// Inputs in order of arrival.
    pub inputs: Vec<Tensor>,
    /// Output names to produce, in response order.
    pub outputs: Vec<String>,
    /// The outputs asked for with the classification extension, and their top-k counts;
    /// applied to the answer by the request path, never seen by a backend.
    pub classify: Classify,
    /// The batch size (1 for models without batching).
    pub batch_size: usize,
    /// The client's options as sent: the scheduler reads the priority (0 = the model's default
    /// level) and queue timeout (µs, 0 = the model's default); an ensemble passes them all on
    /// to its steps.
    pub options: RequestOptions,
    /// The sequence this request belongs to; set for (and only for) `sequence_batching` models
    /// (an `iterative_sequence` one's request without an id gets its sequence from the
    /// scheduler).
    pub sequence: Option<SequenceFlags>,
    /// Where a decoupled model's responses go (any number, then [`crate::backend::StreamEvent::Final`]); set
    /// by the streaming endpoints, `None` for plain infer calls.
    pub stream: Option<ResponseSink>,
}

/// A request's place in its sequence (Triton's `sequence_id` / `sequence_start` / `sequence_end`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceFlags {
    /// Never `Uint(0)` nor an empty string.
    pub id: CorrelationId,
    pub start: bool,
    pub end: bool,
}

/// Validates `request` against `config`. Error messages carry Triton's
/// `[request id: <id>] ` prefix.
pub fn check(
    config: &ValidModelConfig,
    request: InferRequest,
) -> Result<ValidRequest, ServiceError> {
    let prefix = format!(
        "[request id: {}] ",
        if request.id.is_empty() {
            "<id_unknown>"
        } else {
            request.id.as_str()
        }
    );
    // Triton names an unknown requested output without the request-id prefix.
    if let Some(out) = request
        .outputs
        .iter()
        .find(|o| config.output(&o.name).is_none() && !is_state_output(config, &o.name))
    {
        return Err(ServiceError::invalid(format!(
            "unexpected inference output '{}' for model '{}'",
            out.name, config.name
        )));
    }
    // Triton refuses a bad classification parameter while it parses the request, unprefixed.
    let mut classify = Classify::new();
    for out in &request.outputs {
        if let Some(k) = classification::requested_count(&out.parameters)? {
            classify.insert(out.name.clone(), k);
        }
    }
    let mut valid = check_inner(config, request).map_err(|e| e.prefixed(&prefix))?;
    valid.classify = classify;
    Ok(valid)
}

/// A sequence model's state output, which a request may ask for by name.
fn is_state_output(config: &ValidModelConfig, name: &str) -> bool {
    config
        .sequence()
        .is_some_and(|io| io.states.iter().any(|s| s.output_name == name))
}

/// Triton's message for a request whose inputs do not cover the model's required ones: a
/// count outside [required, declared], checked before any name, or a required input missing.
/// `names` are the request's distinct input names in order; Triton lists them last first (the
/// order of its hash map).
fn inputs_message(
    config: &ValidModelConfig,
    names: &[&str],
    server_fed: impl Fn(&str) -> bool,
) -> String {
    let declared: Vec<_> = config
        .inputs
        .iter()
        .filter(|i| !server_fed(&i.name))
        .collect();
    let required = declared.iter().filter(|i| !i.optional).count();
    let quoted = |n: &str| format!("'{n}'");
    let got: Vec<String> = names.iter().rev().map(|n| quoted(n)).collect();
    let missing: Vec<String> = declared
        .iter()
        .filter(|i| !i.optional && !names.contains(&i.name.as_str()))
        .map(|i| quoted(&i.name))
        .collect();
    // Triton drops the last character of "[a,b," to close the list, so an empty list reads "]".
    let list = |items: &[String]| {
        if items.is_empty() {
            "]".to_string()
        } else {
            format!("[{}]", items.join(","))
        }
    };
    let got = if names.is_empty() {
        "[]".to_string()
    } else {
        list(&got)
    };
    let expected = if required == declared.len() {
        format!("expected {required} inputs")
    } else {
        format!(
            "expected number of inputs between {required} and {}",
            declared.len()
        )
    };
    format!(
        "{expected} but got {} inputs for model '{}'. Got input(s) {got}, but missing required input(s) {}. Please provide all required input(s).",
        names.len(),
        config.name,
        list(&missing)
    )
}

fn check_inner(
    config: &ValidModelConfig,
    request: InferRequest,
) -> Result<ValidRequest, ServiceError> {
    let m = &config.name;
    let batching = config.batching();
    let sequence_batching = config.sequence();
    // The server feeds control and state inputs of a sequence model itself.
    let server_fed = |name: &str| {
        sequence_batching.is_some_and(|io| {
            io.control_inputs.iter().any(|c| c == name)
                || io.states.iter().any(|s| s.input_name == name)
        })
    };

    let mut seen = HashSet::new();
    let mut names = Vec::with_capacity(request.inputs.len());
    for input in &request.inputs {
        if !seen.insert(input.name().to_string()) {
            return Err(ServiceError::invalid(format!(
                "input '{}' already exists in request",
                input.name()
            )));
        }
        names.push(input.name());
    }
    let declared = config.inputs.iter().filter(|i| !server_fed(&i.name));
    let required = declared.clone().filter(|i| !i.optional).count();
    if names.len() < required || names.len() > declared.count() {
        return Err(ServiceError::invalid(inputs_message(
            config, &names, server_fed,
        )));
    }
    for name in &names {
        if config.input(name).is_none() {
            return Err(ServiceError::invalid(format!(
                "unexpected inference input '{name}' for model '{m}'"
            )));
        }
    }
    // The count was right, but a required input may have been swapped for an optional one.
    if config
        .inputs
        .iter()
        .any(|i| !i.optional && !seen.contains(&i.name) && !server_fed(&i.name))
    {
        return Err(ServiceError::invalid(inputs_message(
            config, &names, server_fed,
        )));
    }

    let mut batch_size: Option<i64> = None;
    let mut inputs = Vec::with_capacity(request.inputs.len());
    for tensor in request.inputs {
        let Some(spec) = config.input(tensor.name()) else {
            continue;
        };
        if spec.datatype != tensor.datatype() {
            return Err(ServiceError::invalid(format!(
                "inference input '{}' data-type is '{}', but model '{m}' expects '{}'",
                tensor.name(),
                tensor.datatype(),
                spec.datatype.as_wire()
            )));
        }
        let shape = tensor.shape();
        let dims = if batching {
            let Some((&batch, rest)) = shape.split_first() else {
                return Err(ServiceError::invalid(format!(
                    "inference input '{}' for model '{m}' has no batch dimension; the model has max_batch_size {} so the shape must be [batch, ...]",
                    tensor.name(),
                    config.max_batch_size
                )));
            };
            if batch < 1 || batch > i64::from(config.max_batch_size) {
                return Err(ServiceError::invalid(format!(
                    "inference request batch-size must be <= {} for '{m}'",
                    config.max_batch_size
                )));
            }
            match batch_size {
                None => batch_size = Some(batch),
                Some(b) if b != batch => {
                    return Err(ServiceError::invalid(format!(
                        "inference input '{}' for model '{m}' has batch size {batch}, but other inputs have {b}",
                        tensor.name()
                    )));
                }
                Some(_) => {}
            }
            rest
        } else {
            shape
        };
        if !dims_match(&spec.dims, dims) {
            let mut expected = spec.dims.clone();
            if batching {
                expected.insert(0, -1);
            }
            // Triton adds its note on the batch dimension only for models that batch.
            let note = if batching {
                "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to each input shape. If you want to specify the full shape including the batch dim in your input dims config, try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
            } else {
                ""
            };
            return Err(ServiceError::invalid(format!(
                "unexpected shape for input '{}' for model '{m}'. Expected {}, got {}. {note}",
                tensor.name(),
                format_shape(&expected),
                format_shape(shape)
            )));
        }
        inputs.push(tensor);
    }

    let outputs = if request.outputs.is_empty() {
        config.outputs.iter().map(|o| o.name.clone()).collect()
    } else {
        let mut names = Vec::with_capacity(request.outputs.len());
        // Unknown names were refused by `check`.
        for out in &request.outputs {
            if names.contains(&out.name) {
                return Err(ServiceError::invalid(format!(
                    "output '{}' already exists in request",
                    out.name
                )));
            }
            names.push(out.name.clone());
        }
        names
    };

    let batch_size = batch_size.unwrap_or(1) as usize;
    let sequence = match sequence_batching {
        None => None,
        Some(sb) => {
            let id = request.options.sequence_id.clone();
            // `iterative_sequence`: the scheduler gives a request without an id a sequence of
            // its own.
            if id.is_none() && !sb.iterative {
                return Err(ServiceError::invalid(format!(
                    "inference request to model '{m}' must specify a non-zero or non-empty correlation ID"
                )));
            }
            if batch_size != 1 {
                return Err(ServiceError::invalid(format!(
                    "inference request to model '{m}' must specify batch-size 1 due to requirements of sequence batcher"
                )));
            }
            id.map(|id| SequenceFlags {
                id,
                start: request.options.sequence_start,
                end: request.options.sequence_end,
            })
        }
    };

    Ok(ValidRequest {
        id: request.id,
        parameters: request.parameters,
        stream: None,
        inputs,
        outputs,
        classify: Classify::new(),
        batch_size,
        options: request.options,
        sequence,
    })
}

/// Whether request dims match config dims (-1 in the config matches any size).
pub fn dims_match(config: &[i64], request: &[i64]) -> bool {
    config.len() == request.len() && config.iter().zip(request).all(|(&c, &r)| c == -1 || c == r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_proto::RequestedOutput;
    use nereid_test_support::fp32_zeros;

    fn valid(text: &str) -> ValidModelConfig {
        ValidModelConfig::unchecked(crate::config::text::parse_model_config(text).unwrap())
    }

    fn config() -> ValidModelConfig {
        valid(
            r#"name: "m" max_batch_size: 4
               input [{name: "a" data_type: TYPE_FP32 dims: [2]}, {name: "b" data_type: TYPE_INT32 dims: [-1] optional: true}]
               output [{name: "y" data_type: TYPE_FP32 dims: [2]}]"#,
        )
    }

    fn request(inputs: Vec<Tensor>) -> InferRequest {
        InferRequest {
            model_name: "m".into(),
            id: "r1".into(),
            inputs,
            ..Default::default()
        }
    }

    #[test]
    fn accepts_a_good_request() {
        let v = check(&config(), request(vec![fp32_zeros("a", vec![3, 2])])).unwrap();
        assert_eq!(v.batch_size, 3);
        assert_eq!(v.outputs, vec!["y"]);
    }

    #[test]
    fn refuses_with_triton_messages() {
        let e = check(&config(), request(vec![fp32_zeros("a", vec![5, 2])])).unwrap_err();
        assert_eq!(
            e.message(),
            "[request id: r1] inference request batch-size must be <= 4 for 'm'"
        );
        let e = check(&config(), request(vec![fp32_zeros("a", vec![1, 3])])).unwrap_err();
        assert!(e.message().starts_with("[request id: r1] unexpected shape for input 'a' for model 'm'. Expected [-1,2], got [1,3]."));
        let e = check(&config(), request(vec![fp32_zeros("zz", vec![1, 2])])).unwrap_err();
        assert_eq!(
            e.message(),
            "[request id: r1] unexpected inference input 'zz' for model 'm'"
        );
        let e = check(
            &config(),
            request(vec![
                fp32_zeros("a", vec![1, 2]),
                fp32_zeros("b", vec![1, 2]),
            ]),
        )
        .unwrap_err();
        assert_eq!(
            e.message(),
            "[request id: r1] inference input 'b' data-type is 'FP32', but model 'm' expects 'INT32'"
        );
        let e = check(&config(), request(vec![])).unwrap_err();
        // 'b' is optional: Triton states the range (checked against Triton 2.51).
        assert_eq!(
            e.message(),
            "[request id: r1] expected number of inputs between 1 and 2 but got 0 inputs for model 'm'. Got input(s) [], but missing required input(s) ['a']. Please provide all required input(s)."
        );
        // Too many inputs: counted before any name is looked at; listed last first, as Triton.
        let e = check(
            &config(),
            request(vec![
                fp32_zeros("a", vec![1, 2]),
                fp32_zeros("zz", vec![1, 2]),
                fp32_zeros("b", vec![1, 2]),
            ]),
        )
        .unwrap_err();
        assert_eq!(
            e.message(),
            "[request id: r1] expected number of inputs between 1 and 2 but got 3 inputs for model 'm'. Got input(s) ['b','zz','a'], but missing required input(s) ]. Please provide all required input(s)."
        );
        // No batch-dimension note for a model that does not batch.
        let e = check(&unbatched(), request(vec![fp32_zeros("a", vec![3])])).unwrap_err();
        assert_eq!(
            e.message(),
            "[request id: r1] unexpected shape for input 'a' for model 'u'. Expected [2], got [3]. "
        );
    }

    fn unbatched() -> ValidModelConfig {
        valid(
            r#"name: "u" max_batch_size: 0
               input [{name: "a" data_type: TYPE_FP32 dims: [2]}]
               output [{name: "y" data_type: TYPE_FP32 dims: [2]}]"#,
        )
    }

    fn sequence_config() -> ValidModelConfig {
        valid(
            r#"name: "s" max_batch_size: 4
               input [{name: "a" data_type: TYPE_FP32 dims: [2]}]
               output [{name: "y" data_type: TYPE_FP32 dims: [2]}]
               sequence_batching { state [{input_name: "si" output_name: "so" data_type: TYPE_FP32 dims: [1]}] }"#,
        )
    }

    #[test]
    fn an_iterative_sequence_model_takes_a_request_without_an_id() {
        let config = valid(
            r#"name: "s" max_batch_size: 4
               input [{name: "a" data_type: TYPE_FP32 dims: [2]}]
               output [{name: "y" data_type: TYPE_FP32 dims: [2]}]
               sequence_batching { iterative_sequence: true }"#,
        );
        let mut r = request(vec![fp32_zeros("a", vec![1, 2])]);
        r.model_name = "s".into();
        let valid = check(&config, r).unwrap();
        assert_eq!(valid.sequence, None, "the scheduler gives it a sequence");
        let mut r = request(vec![fp32_zeros("a", vec![2, 2])]);
        r.model_name = "s".into();
        let e = check(&config, r).unwrap_err();
        assert_eq!(
            e.message(),
            "[request id: r1] inference request to model 's' must specify batch-size 1 due to requirements of sequence batcher"
        );
    }

    #[test]
    fn sequence_models_need_an_id_and_batch_size_one() {
        let mut r = request(vec![fp32_zeros("a", vec![1, 2])]);
        r.model_name = "s".into();
        let e = check(&sequence_config(), r).unwrap_err();
        assert_eq!(
            e.message(),
            "[request id: r1] inference request to model 's' must specify a non-zero or non-empty correlation ID"
        );
        let mut r = request(vec![fp32_zeros("a", vec![2, 2])]);
        r.options.sequence_id = Some(CorrelationId::Uint(7));
        let e = check(&sequence_config(), r).unwrap_err();
        assert_eq!(
            e.message(),
            "[request id: r1] inference request to model 's' must specify batch-size 1 due to requirements of sequence batcher"
        );
        let mut r = request(vec![fp32_zeros("a", vec![1, 2])]);
        r.options.sequence_id = Some(CorrelationId::String("x".into()));
        r.options.sequence_start = true;
        r.outputs = vec![RequestedOutput {
            name: "so".into(),
            ..Default::default()
        }];
        let v = check(&sequence_config(), r).unwrap();
        assert_eq!(v.outputs, vec!["so"]);
        assert_eq!(
            v.sequence,
            Some(SequenceFlags {
                id: CorrelationId::String("x".into()),
                start: true,
                end: false
            })
        );
        let v = check(&config(), request(vec![fp32_zeros("a", vec![1, 2])])).unwrap();
        assert_eq!(v.sequence, None);
    }

    #[test]
    fn checks_requested_outputs() {
        let mut r = request(vec![fp32_zeros("a", vec![1, 2])]);
        r.id.clear();
        r.outputs = vec![RequestedOutput {
            name: "nope".into(),
            ..Default::default()
        }];
        let e = check(&config(), r).unwrap_err();
        // Triton 2.51 names an unknown output without the request-id prefix.
        assert_eq!(
            e.message(),
            "unexpected inference output 'nope' for model 'm'"
        );
    }
}
