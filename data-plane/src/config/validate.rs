//! Config checks Triton makes when it loads a model, with messages that name the model, the
//! tensor and the field. Runs on the complete config (after defaults and auto-complete).

use std::collections::HashSet;

use nereid_proto::pb::inference::model_config::SchedulingChoice;
use nereid_proto::pb::inference::model_input::Format;
use nereid_proto::pb::inference::model_instance_group::Kind;
use nereid_proto::pb::inference::model_sequence_batching::State as StateConfig;
use nereid_proto::pb::inference::model_sequence_batching::control::Kind as ControlKind;
use nereid_proto::pb::inference::model_sequence_batching::initial_state::StateData;
use nereid_proto::pb::inference::{
    DataType as ConfigDataType, ModelConfig, ModelSequenceBatching, ModelTensorReshape,
};

/// Checks a complete config; returns every problem found, each a full sentence.
pub fn validate(config: &ModelConfig) -> Vec<String> {
    let mut errors = Vec::new();
    let m = &config.name;
    if config.max_batch_size < 0 {
        errors.push(format!(
            "'max_batch_size' must be non-negative value for {m}"
        ));
    }
    let is_ensemble = config.platform == super::ENSEMBLE_PLATFORM;
    if is_ensemble && !config.backend.is_empty() {
        errors.push(format!(
            "Ensemble model '{m}' must have platform type 'ensemble' and empty backend type"
        ));
    }
    if !is_ensemble && config.backend.is_empty() {
        errors.push(format!(
            "unable to find a backend for model '{m}': set 'backend' or 'platform' in config.pbtxt, or put a model file (model.onnx, model.pt, model.py) in a version directory"
        ));
    }

    let mut tags: Vec<&String> = config.metric_tags.keys().collect();
    tags.sort();
    for key in tags {
        let valid = key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !key.is_empty();
        if !valid {
            errors.push(format!(
                "metric_tags key '{key}' of model '{m}' is not usable as a metric label: use letters, digits and '_' (it is exported as the label '_{key}')"
            ));
        }
    }

    let mut names = HashSet::new();
    for input in &config.input {
        check_tensor(
            &mut errors,
            m,
            "input",
            &input.name,
            input.data_type,
            &input.dims,
            input.reshape.as_ref(),
        );
        if !names.insert(("input", input.name.as_str())) {
            errors.push(format!(
                "model input '{}' is specified more than once for {m}",
                input.name
            ));
        }
        let format = Format::try_from(input.format).unwrap_or(Format::None);
        if format != Format::None && input.dims.len() != 3 {
            errors.push(format!(
                "model input '{}' has format {} and must have exactly 3 dims (got {}) for {m}",
                input.name,
                format.as_str_name(),
                input.dims.len()
            ));
        }
    }
    for output in &config.output {
        check_tensor(
            &mut errors,
            m,
            "output",
            &output.name,
            output.data_type,
            &output.dims,
            output.reshape.as_ref(),
        );
        if !names.insert(("output", output.name.as_str())) {
            errors.push(format!(
                "model output '{}' is specified more than once for {m}",
                output.name
            ));
        }
    }

    for group in &config.instance_group {
        let name = &group.name;
        if group.count < 1 {
            errors.push(format!(
                "instance group '{name}' of model '{m}' must have count >= 1, got {}",
                group.count
            ));
        }
        let kind = Kind::try_from(group.kind).unwrap_or(Kind::Auto);
        if kind == Kind::Gpu && group.gpus.iter().any(|g| *g < 0) {
            errors.push(format!(
                "instance group '{name}' of model '{m}' has a negative GPU id"
            ));
        }
        if kind == Kind::Cpu && !group.gpus.is_empty() {
            errors.push(format!(
                "instance group '{name}' of model '{m}' has kind KIND_CPU but specifies 'gpus'"
            ));
        }
        let resources = group.rate_limiter.iter().flat_map(|r| &r.resources);
        let mut seen = HashSet::new();
        for resource in resources {
            if resource.name.is_empty() {
                errors.push(format!(
                    "instance group '{name}' of model '{m}' has a rate_limiter resource without a name"
                ));
            } else if !seen.insert(resource.name.as_str()) {
                errors.push(format!(
                    "instance group '{name}' of model '{m}' lists rate_limiter resource '{}' more than once",
                    resource.name
                ));
            }
        }
    }
    if is_ensemble {
        check_ensemble(&mut errors, config);
    }

    if let Some(SchedulingChoice::DynamicBatching(db)) = &config.scheduling_choice {
        for &size in &db.preferred_batch_size {
            if size < 1 {
                errors.push(format!(
                    "dynamic batching preferred size must be positive for {m}"
                ));
            } else if size > config.max_batch_size {
                errors.push(format!(
                    "dynamic batching preferred size must be <= max batch size for {m}"
                ));
            }
        }
        if db.priority_levels > 0
            && (db.default_priority_level < 1 || db.default_priority_level > db.priority_levels)
        {
            errors.push(format!(
                "default priority level must be in range [1, {}] for {m}",
                db.priority_levels
            ));
        }
        if db.preserve_ordering && db.priority_levels > 1 {
            errors.push(format!(
                "Only one priority level is allowed when 'preserve_ordering' is true for {m}"
            ));
        }
        for level in db.priority_queue_policy.keys() {
            if *level < 1 || *level > db.priority_levels {
                errors.push(format!(
                    "'priority_queue_policy' level {level} is not in range [1, {}] for {m}",
                    db.priority_levels
                ));
            }
        }
    }
    if let Some(SchedulingChoice::EnsembleScheduling(_)) = &config.scheduling_choice
        && !is_ensemble
    {
        errors.push(format!(
            "ensemble scheduling cannot be set for model '{m}' whose platform is not ensemble"
        ));
    }
    if let Some(SchedulingChoice::SequenceBatching(sb)) = &config.scheduling_choice {
        if config.max_batch_size < 0 {
            errors.push(format!(
                "sequence batching requires 'max_batch_size' >= 0 for {m}"
            ));
        }
        check_sequence_batching(&mut errors, m, sb);
    }
    super::batch_io::check(&mut errors, config);
    check_response_cache(&mut errors, config);
    errors
}

/// Triton's refusals of `response_cache { enable: true }` where a response cannot be reused:
/// sequence models (a request's answer depends on the sequence's state) and decoupled models
/// (any number of responses). Checked whether or not the server runs a cache, as Triton does.
fn check_response_cache(errors: &mut Vec<String>, config: &ModelConfig) {
    if !config.response_cache.as_ref().is_some_and(|c| c.enable) {
        return;
    }
    let m = &config.name;
    if let Some(SchedulingChoice::SequenceBatching(_)) = &config.scheduling_choice {
        errors.push(format!(
            "Response Cache does not currently support model {m} with sequence batching scheduler. Please disable the response cache."
        ));
    }
    if decoupled(config) {
        errors.push(format!(
            "Response Cache does not currently support model {m} with 'decoupled' transaction policy. Please disable the response cache."
        ));
    }
}

fn decoupled(config: &ModelConfig) -> bool {
    config
        .model_transaction_policy
        .as_ref()
        .is_some_and(|p| p.decoupled)
}

/// What an ensemble may not have (it runs no instances of its own), and its data flow as far as
/// it can be checked without the composing models (see [`super::ensemble_graph`]).
fn check_ensemble(errors: &mut Vec<String>, config: &ModelConfig) {
    let m = &config.name;
    if !config.instance_group.is_empty() {
        errors.push(format!(
            "instance group should not be specified for ensemble '{m}'"
        ));
    }
    if config.optimization.is_some() {
        errors.push(format!(
            "optimization should not be specified for ensemble '{m}'"
        ));
    }
    if !config.model_warmup.is_empty() {
        errors.push(format!(
            "model_warmup can not be specified for ensemble '{m}' (warm up its composing models instead)"
        ));
    }
    // `model_transaction_policy` of an ensemble is computed at load from its steps (whatever
    // the file says): see `ensemble::plan::completed_config`.
    let steps = super::ensemble_steps(config);
    let inputs: Vec<&str> = config.input.iter().map(|i| i.name.as_str()).collect();
    let outputs: Vec<&str> = config.output.iter().map(|o| o.name.as_str()).collect();
    let declared = super::ensemble_graph::Declared {
        name: m,
        inputs: &inputs,
        outputs: &outputs,
        steps: &steps,
    };
    if let Err(graph_errors) = super::ensemble_graph::analyze(declared) {
        errors.extend(graph_errors);
    }
}

/// Triton's checks of `sequence_batching` controls and states.
fn check_sequence_batching(errors: &mut Vec<String>, m: &str, sb: &ModelSequenceBatching) {
    let mut kinds = HashSet::new();
    for input in &sb.control_input {
        if input.name.is_empty() {
            errors.push(format!(
                "sequence batching control input must specify 'name' for {m}"
            ));
        }
        for c in &input.control {
            let Ok(kind) = ControlKind::try_from(c.kind) else {
                errors.push(format!(
                    "sequence batching control '{}' has an unknown kind for {m}",
                    input.name
                ));
                continue;
            };
            let kind_name = kind.as_str_name();
            if !kinds.insert(c.kind) {
                errors.push(format!(
                    "sequence batching specifies multiple {kind_name} tensors for {m}"
                ));
            }
            let lists = [
                ("int32_false_true", c.int32_false_true.len()),
                ("fp32_false_true", c.fp32_false_true.len()),
                ("bool_false_true", c.bool_false_true.len()),
            ];
            let given: Vec<_> = lists.iter().filter(|(_, n)| *n > 0).collect();
            if kind == ControlKind::ControlSequenceCorrid {
                if !given.is_empty() {
                    errors.push(format!(
                        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for {kind_name} for {m}"
                    ));
                }
                let allowed = [
                    ConfigDataType::TypeUint64,
                    ConfigDataType::TypeInt64,
                    ConfigDataType::TypeUint32,
                    ConfigDataType::TypeInt32,
                    ConfigDataType::TypeString,
                ];
                if !allowed.iter().any(|t| *t as i32 == c.data_type) {
                    errors.push(format!(
                        "sequence batching must specify 'data_type' TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING for {kind_name} for {m}"
                    ));
                }
                continue;
            }
            match given[..] {
                [(field, n)] if *n != 2 => errors.push(format!(
                    "sequence batching control '{field}' must have exactly 2 entries for {kind_name} for {m}"
                )),
                [_] => {}
                _ => errors.push(format!(
                    "sequence batching must specify exactly one of 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for {kind_name} for {m}"
                )),
            }
        }
    }
    for state in &sb.state {
        if state.input_name.is_empty() || state.output_name.is_empty() {
            errors.push(format!(
                "sequence batching state must specify 'input_name' and 'output_name' for {m}"
            ));
        }
        if matches!(
            ConfigDataType::try_from(state.data_type),
            Ok(ConfigDataType::TypeInvalid) | Err(_)
        ) {
            errors.push(format!(
                "sequence batching state '{}' must specify 'data_type' for {m}",
                state.input_name
            ));
        }
        check_initial_state(errors, state);
    }
}

/// Triton's checks of a state's `initial_state` (its wording: the messages name the state).
fn check_initial_state(errors: &mut Vec<String>, state: &StateConfig) {
    let input = &state.input_name;
    let initial = match &state.initial_state[..] {
        [] => return,
        [initial] => initial,
        many => {
            errors.push(format!(
                "initial_state field for state input '{input}' must contain exactly one or zero element. Found '{}' elements.",
                many.len()
            ));
            return;
        }
    };
    if initial.data_type != state.data_type {
        errors.push(format!(
            "The data type used for 'initial_state' field of state '{input}' does not match the state data type."
        ));
    }
    if initial.name.is_empty() {
        errors.push(format!(
            "Field 'name' must be set when using initial_state for state input '{input}'."
        ));
    }
    if initial.dims.len() != state.dims.len() {
        errors.push(format!(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state input '{input}'. {} != {}",
            initial.dims.len(),
            state.dims.len()
        ));
    } else {
        for (&init, &dim) in initial.dims.iter().zip(&state.dims) {
            if init < 0 {
                errors.push(format!(
                    "'initial_state' field for state input name '{input}' contains variable dimensions."
                ));
                break;
            }
            if dim >= 0 && init != dim {
                errors.push(format!(
                    "'initial_state' dim for input name '{input}' doesn't match 'state' dim description. {init} != {dim}"
                ));
                break;
            }
        }
    }
    match &initial.state_data {
        Some(StateData::DataFile(file)) if file.is_empty() => errors.push(format!(
            "initial_state of state input '{input}': 'data_file' must name a file under the model's initial_state folder"
        )),
        Some(StateData::DataFile(file)) if !is_plain_relative(file) => errors.push(format!(
            "initial_state of state input '{input}': 'data_file' '{file}' must be a relative path inside the model's initial_state folder"
        )),
        Some(_) => {}
        None => errors.push(format!(
            "initial_state setting expects state'{input}' to have state_data set"
        )),
    }
}

/// A relative path that stays inside its folder (no root, no `..`).
fn is_plain_relative(file: &str) -> bool {
    std::path::Path::new(file)
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)))
}

fn check_tensor(
    errors: &mut Vec<String>,
    m: &str,
    what: &str,
    name: &str,
    data_type: i32,
    dims: &[i64],
    reshape: Option<&ModelTensorReshape>,
) {
    if name.is_empty() {
        errors.push(format!("model {what} must specify 'name' for {m}"));
        return;
    }
    match ConfigDataType::try_from(data_type) {
        Ok(ConfigDataType::TypeInvalid) | Err(_) => {
            errors.push(format!(
                "model {what} '{name}' must specify 'data_type' for {m}"
            ));
        }
        Ok(_) => {}
    }
    if dims.is_empty() && reshape.is_none() {
        errors.push(format!("model {what} '{name}' must specify 'dims' for {m}"));
    }
    if dims.iter().any(|&d| d == 0 || d < -1) {
        errors.push(format!(
            "model {what} '{name}' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for {m}"
        ));
    }
    if let Some(reshape) = reshape {
        if reshape.shape.iter().any(|&d| d == 0 || d < -1) {
            errors.push(format!(
                "model {what} '{name}' reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension for {m}"
            ));
        }
        let fixed = |s: &[i64]| -> Option<i64> {
            if s.contains(&-1) {
                None
            } else {
                Some(s.iter().product())
            }
        };
        if let (Some(a), Some(b)) = (fixed(dims), fixed(&reshape.shape))
            && a != b
        {
            errors.push(format!(
                "model {what} '{name}' has different size for dims and reshape for {m}"
            ));
        }
        let vars = |s: &[i64]| s.iter().filter(|&&d| d == -1).count();
        if (vars(dims) == 0) != (vars(&reshape.shape) == 0) {
            errors.push(format!(
                "model {what} '{name}' has different number of variable-size dimensions for dims and reshape for {m}"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::text::parse_model_config;

    fn errors_of(text: &str) -> Vec<String> {
        let mut c = parse_model_config(text).unwrap();
        if c.name.is_empty() {
            c.name = "m".into();
        }
        if c.backend.is_empty() && c.platform != "ensemble" {
            c.backend = "onnxruntime".into();
        }
        validate(&c)
    }

    #[test]
    fn metric_tags_keys_must_be_label_names() {
        assert!(errors_of(r#"metric_tags { key: "team_1" value: "a b" }"#).is_empty());
        let errors = errors_of(r#"metric_tags { key: "team-1" value: "x" }"#);
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].contains("metric_tags key 'team-1' of model 'm'"),
            "{errors:?}"
        );
    }

    #[test]
    fn valid_config_has_no_errors() {
        let e = errors_of(
            r#"max_batch_size: 8 input [{name: "x" data_type: TYPE_FP32 dims: [4]}]
               output [{name: "y" data_type: TYPE_FP32 dims: [-1]}]
               dynamic_batching { preferred_batch_size: [4, 8] }"#,
        );
        assert!(e.is_empty(), "{e:?}");
    }

    #[test]
    fn reports_tensor_problems_by_name() {
        let e = errors_of(r#"input [{name: "input" dims: [0]}]"#);
        assert!(
            e.contains(&"model input 'input' must specify 'data_type' for m".to_string()),
            "{e:?}"
        );
        assert!(
            e.iter()
                .any(|s| s.starts_with("model input 'input' dimension must be integer >= 1"))
        );
        let e = errors_of(r#"output [{name: "o" data_type: TYPE_FP32}]"#);
        assert_eq!(e, vec!["model output 'o' must specify 'dims' for m"]);
    }

    #[test]
    fn reports_batching_problems() {
        let e = errors_of("max_batch_size: -1");
        assert_eq!(e, vec!["'max_batch_size' must be non-negative value for m"]);
        let e = errors_of("max_batch_size: 4 dynamic_batching { preferred_batch_size: [8] }");
        assert_eq!(
            e,
            vec!["dynamic batching preferred size must be <= max batch size for m"]
        );
        let e = errors_of(
            "max_batch_size: 4 dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 1 }",
        );
        assert_eq!(
            e,
            vec!["Only one priority level is allowed when 'preserve_ordering' is true for m"]
        );
    }

    #[test]
    fn reports_sequence_control_problems() {
        let e = errors_of(
            r#"sequence_batching { control_input [
                 {name: "a" control [{kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]}]},
                 {name: "b" control [{kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1]}]},
                 {name: "c" control [{kind: CONTROL_SEQUENCE_READY fp32_false_true: [1]}]},
                 {name: "d" control [{kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32}]} ] }"#,
        );
        assert_eq!(
            e,
            vec![
                "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m",
                "sequence batching control 'fp32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_READY for m",
                "sequence batching must specify 'data_type' TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING for CONTROL_SEQUENCE_CORRID for m",
            ]
        );
    }

    #[test]
    fn reports_initial_state_problems_in_tritons_words() {
        let state = |initial: &str| {
            errors_of(&format!(
                r#"sequence_batching {{ state [{{input_name: "si" output_name: "so"
                     data_type: TYPE_INT32 dims: [2, -1] {initial} }}] }}"#
            ))
        };
        let ok = state(
            r#"initial_state { name: "i" data_type: TYPE_INT32 dims: [2, 3] data_file: "f" }"#,
        );
        assert!(ok.is_empty(), "{ok:?}");
        assert_eq!(
            state(
                r#"initial_state { name: "i" data_type: TYPE_FP32 dims: [2, 3] zero_data: true }"#
            ),
            vec![
                "The data type used for 'initial_state' field of state 'si' does not match the state data type."
            ]
        );
        assert_eq!(
            state(r#"initial_state { data_type: TYPE_INT32 dims: [2, 3] zero_data: true }"#),
            vec!["Field 'name' must be set when using initial_state for state input 'si'."]
        );
        assert_eq!(
            state(r#"initial_state { name: "i" data_type: TYPE_INT32 dims: [2] zero_data: true }"#),
            vec![
                "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state input 'si'. 1 != 2"
            ]
        );
        assert_eq!(
            state(
                r#"initial_state { name: "i" data_type: TYPE_INT32 dims: [2, -1] zero_data: true }"#
            ),
            vec!["'initial_state' field for state input name 'si' contains variable dimensions."]
        );
        assert_eq!(
            state(
                r#"initial_state { name: "i" data_type: TYPE_INT32 dims: [3, 1] zero_data: true }"#
            ),
            vec![
                "'initial_state' dim for input name 'si' doesn't match 'state' dim description. 3 != 2"
            ]
        );
        assert_eq!(
            state(r#"initial_state { name: "i" data_type: TYPE_INT32 dims: [2, 1] }"#),
            vec!["initial_state setting expects state'si' to have state_data set"]
        );
        assert_eq!(
            state(
                r#"initial_state { name: "i" data_type: TYPE_INT32 dims: [2, 1] data_file: "../x" }"#
            ),
            vec![
                "initial_state of state input 'si': 'data_file' '../x' must be a relative path inside the model's initial_state folder"
            ]
        );
        let two = r#"initial_state [{ name: "a" data_type: TYPE_INT32 dims: [2, 1] zero_data: true },
                                    { name: "b" data_type: TYPE_INT32 dims: [2, 1] zero_data: true }]"#;
        assert_eq!(
            state(two),
            vec![
                "initial_state field for state input 'si' must contain exactly one or zero element. Found '2' elements."
            ]
        );
    }

    #[test]
    fn response_cache_refused_for_sequence_and_decoupled_models() {
        assert!(errors_of("response_cache { enable: true }").is_empty());
        assert!(errors_of("sequence_batching {} response_cache { enable: false }").is_empty());
        assert_eq!(
            errors_of("sequence_batching {} response_cache { enable: true }"),
            vec![
                "Response Cache does not currently support model m with sequence batching scheduler. Please disable the response cache."
            ]
        );
        assert_eq!(
            errors_of(
                "model_transaction_policy { decoupled: true } response_cache { enable: true }"
            ),
            vec![
                "Response Cache does not currently support model m with 'decoupled' transaction policy. Please disable the response cache."
            ]
        );
    }

    #[test]
    fn reshape_must_keep_element_count() {
        let e = errors_of(
            r#"input [{name: "x" data_type: TYPE_FP32 dims: [4] reshape: { shape: [2, 3] }}]"#,
        );
        assert_eq!(
            e,
            vec!["model input 'x' has different size for dims and reshape for m"]
        );
    }

    #[test]
    fn ensemble_rules() {
        let e = errors_of(r#"platform: "ensemble" backend: "onnxruntime""#);
        assert!(e[0].contains("must have platform type 'ensemble' and empty backend type"));
        let steps = r#"input [{name: "IN" data_type: TYPE_FP32 dims: [4]}]
            output [{name: "OUT" data_type: TYPE_FP32 dims: [4]}]
            ensemble_scheduling { step [{ model_name: "m" model_version: -1
              input_map { key: "x" value: "IN" } output_map { key: "y" value: "OUT" } }] }"#;
        assert!(errors_of(&format!(r#"platform: "ensemble" {steps}"#)).is_empty());
        let e = errors_of(&format!(
            r#"platform: "ensemble" {steps}
               instance_group [{{ count: 1 kind: KIND_CPU }}]
               optimization {{ graph {{ level: 1 }} }}
               model_warmup [{{ name: "w" batch_size: 1 }}]
               model_transaction_policy {{ decoupled: true }}"#
        ));
        assert_eq!(
            e,
            vec![
                "instance group should not be specified for ensemble 'm'",
                "optimization should not be specified for ensemble 'm'",
                "model_warmup can not be specified for ensemble 'm' (warm up its composing models instead)",
            ]
        );
        // The data flow is checked too (the details are graph's tests).
        let e = errors_of(
            r#"platform: "ensemble" input [{name: "IN" data_type: TYPE_FP32 dims: [4]}]"#,
        );
        assert_eq!(
            e,
            vec!["ensemble 'm' must specify 'ensemble_scheduling' with one or more 'step's"]
        );
    }
}
