//! One `InferParameter` ⇄ one [`ParamValue`], the same both ways for requests, requested
//! outputs and responses. Which value types a key may take is the caller's rule (see
//! [`super::request`]); here a parameter only has to carry a value.

use crate::error::{ServiceError, ServiceResult};
use crate::pb::inference::InferParameter;
use crate::pb::inference::infer_parameter::ParameterChoice;
use crate::types::ParamValue;

/// The value a wire parameter carries; `key` names it in the error when it carries none.
pub(crate) fn param_from_wire(key: &str, param: InferParameter) -> ServiceResult<ParamValue> {
    match param.parameter_choice {
        Some(ParameterChoice::BoolParam(v)) => Ok(ParamValue::Bool(v)),
        Some(ParameterChoice::Int64Param(v)) => Ok(ParamValue::Int(v)),
        Some(ParameterChoice::StringParam(v)) => Ok(ParamValue::String(v)),
        Some(ParameterChoice::DoubleParam(v)) => Ok(ParamValue::Double(v)),
        Some(ParameterChoice::Uint64Param(v)) => Ok(ParamValue::Uint(v)),
        None => Err(ServiceError::invalid(format!(
            "parameter '{key}' has no value set"
        ))),
    }
}

/// The wire form of a parameter value.
pub(crate) fn param_to_wire(value: ParamValue) -> InferParameter {
    let choice = match value {
        ParamValue::Bool(v) => ParameterChoice::BoolParam(v),
        ParamValue::Int(v) => ParameterChoice::Int64Param(v),
        ParamValue::Uint(v) => ParameterChoice::Uint64Param(v),
        ParamValue::Double(v) => ParameterChoice::DoubleParam(v),
        ParamValue::String(v) => ParameterChoice::StringParam(v),
    };
    InferParameter {
        parameter_choice: Some(choice),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_round_trips() {
        for value in [
            ParamValue::Bool(true),
            ParamValue::Int(-3),
            ParamValue::Uint(u64::MAX),
            ParamValue::Double(0.5),
            ParamValue::String("s".into()),
        ] {
            assert_eq!(
                param_from_wire("k", param_to_wire(value.clone())),
                Ok(value)
            );
        }
        let err = param_from_wire("k", InferParameter::default()).unwrap_err();
        assert_eq!(err, ServiceError::invalid("parameter 'k' has no value set"));
    }
}
