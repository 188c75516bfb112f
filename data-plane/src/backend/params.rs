//! Reading a model config's `parameters` (string values, as Triton's backends read them), with
//! errors that name the parameter and what its value must be.

use std::collections::BTreeMap;

/// A config's `parameters`, by key ([`crate::config::ValidModelConfig::parameters`]).
pub(crate) type Params = BTreeMap<String, String>;

/// The trimmed value of parameter `key`, if set.
pub(crate) fn param<'c>(params: &'c Params, key: &str) -> Option<&'c str> {
    params.get(key).map(|v| v.trim())
}

pub(crate) fn non_negative(params: &Params, key: &str) -> Result<Option<usize>, String> {
    match param(params, key) {
        None => Ok(None),
        Some(v) => v
            .parse::<usize>()
            .map(Some)
            .map_err(|_| format!("parameter '{key}' must be a non-negative integer, got '{v}'")),
    }
}

/// Triton's `ParseBoolValue`: true/on/1 and false/off/0, any case.
pub(crate) fn boolean(params: &Params, key: &str) -> Result<Option<bool>, String> {
    match param(params, key) {
        None => Ok(None),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "true" | "on" | "1" => Ok(Some(true)),
            "false" | "off" | "0" => Ok(Some(false)),
            _ => Err(format!(
                "parameter '{key}' must be a boolean (true/false, 1/0, on/off), got '{v}'"
            )),
        },
    }
}

/// A config with only these `parameters`, for tests of the readers above and their users.
#[cfg(test)]
pub(crate) fn config_with(params: &[(&str, &str)]) -> crate::config::ValidModelConfig {
    let mut c = crate::config::ValidModelConfig::unchecked(Default::default());
    for (k, v) in params {
        c.parameters.insert(k.to_string(), v.to_string());
    }
    c
}
