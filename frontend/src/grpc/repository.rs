//! Model repository rpc parameters → [`LoadRequest`] / the unload flag.
//!
//! `RepositoryModelLoad` carries its overrides as a map of typed parameters:
//!
//! ```text
//! "config"                → string_param: a ModelConfig in protobuf JSON   → LoadRequest.config
//! "file:<version>/<path>" → bytes_param: raw file contents (not base64)     → LoadRequest.files
//! ```
//!
//! Override files only make sense with an override config, so files without `config` are
//! refused here. `RepositoryModelUnload` knows one parameter, `unload_dependents` (bool).

use std::collections::HashMap;

use bytes::Bytes;

use nereid_proto::pb::inference::ModelRepositoryParameter;
use nereid_proto::pb::inference::model_repository_parameter::ParameterChoice;
use nereid_proto::{Credential, LoadRequest, ServiceError, ServiceResult};

/// The caller's `authorization` metadata, passed on to a service that acts on the caller's
/// behalf (the router's load and unload).
pub(crate) fn credential(metadata: &tonic::metadata::MetadataMap) -> Option<Credential> {
    Credential::new(metadata.get("authorization")?.to_str().ok()?)
}

/// The message Triton answers a non-empty `repository_name` with.
pub(crate) const REPOSITORY_NAME_UNSUPPORTED: &str =
    "'repository_name' specification is not supported";

/// Refuses a request that names a repository: a server has exactly one repository set.
pub(crate) fn check_repository_name(repository_name: &str) -> ServiceResult<()> {
    if repository_name.is_empty() {
        Ok(())
    } else {
        Err(ServiceError::unsupported(REPOSITORY_NAME_UNSUPPORTED))
    }
}

/// Converts `RepositoryModelLoad` parameters. Keys are kept whole in `files`
/// (`"file:1/model.onnx"`), as the load request documents them.
pub(crate) fn load_request(
    parameters: HashMap<String, ModelRepositoryParameter>,
) -> ServiceResult<LoadRequest> {
    let mut request = LoadRequest::default();
    for (key, param) in parameters {
        match (key.as_str(), param.parameter_choice) {
            ("config", Some(ParameterChoice::StringParam(config))) => request.config = Some(config),
            ("config", _) => return Err(wrong_type(&key, "string_param")),
            (k, Some(ParameterChoice::BytesParam(content))) if k.starts_with("file:") => {
                request.files.insert(key, Bytes::from(content));
            }
            (k, _) if k.starts_with("file:") => return Err(wrong_type(&key, "bytes_param")),
            (k, _) => {
                return Err(ServiceError::invalid(format!(
                    "unrecognized load parameter '{k}'."
                )));
            }
        }
    }
    if request.config.is_none()
        && let Some(file) = request.files.keys().next()
    {
        return Err(ServiceError::invalid(format!(
            "load parameter '{file}' needs a 'config' parameter too: override files are only accepted together with an override model configuration"
        )));
    }
    Ok(request)
}

/// Reads `unload_dependents` from `RepositoryModelUnload` parameters (default false); other
/// keys are ignored, as Triton does.
pub(crate) fn unload_dependents(
    parameters: &HashMap<String, ModelRepositoryParameter>,
) -> ServiceResult<bool> {
    match parameters
        .get("unload_dependents")
        .map(|p| &p.parameter_choice)
    {
        None => Ok(false),
        Some(Some(ParameterChoice::BoolParam(v))) => Ok(*v),
        Some(_) => Err(ServiceError::invalid(
            "invalid value type for 'unload_dependents' parameter, expected bool_param.",
        )),
    }
}

fn wrong_type(key: &str, expected: &str) -> ServiceError {
    ServiceError::invalid(format!(
        "invalid value type for load parameter '{key}', expected {expected}."
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(choice: ParameterChoice) -> ModelRepositoryParameter {
        ModelRepositoryParameter {
            parameter_choice: Some(choice),
        }
    }

    #[test]
    fn config_and_files_become_a_load_request() {
        let mut p = HashMap::new();
        p.insert(
            "config".to_string(),
            param(ParameterChoice::StringParam("{}".into())),
        );
        p.insert(
            "file:1/model.onnx".to_string(),
            param(ParameterChoice::BytesParam(vec![1, 2])),
        );
        let req = load_request(p).unwrap();
        assert_eq!(req.config.as_deref(), Some("{}"));
        assert_eq!(req.files["file:1/model.onnx"], Bytes::from_static(&[1, 2]));
        assert_eq!(
            load_request(HashMap::new()).unwrap(),
            LoadRequest::default()
        );
    }

    #[test]
    fn files_without_config_are_refused() {
        let mut p = HashMap::new();
        p.insert(
            "file:1/model.onnx".to_string(),
            param(ParameterChoice::BytesParam(vec![1])),
        );
        let err = load_request(p).unwrap_err();
        assert!(matches!(err, ServiceError::InvalidArgument(_)));
        assert!(
            err.message().contains("'file:1/model.onnx'") && err.message().contains("'config'")
        );
    }

    #[test]
    fn wrong_types_and_unknown_keys_name_the_key() {
        let mut p = HashMap::new();
        p.insert(
            "config".to_string(),
            param(ParameterChoice::BoolParam(true)),
        );
        assert_eq!(
            load_request(p).unwrap_err().message(),
            "invalid value type for load parameter 'config', expected string_param."
        );
        let mut p = HashMap::new();
        p.insert(
            "file:1/m".to_string(),
            param(ParameterChoice::StringParam("x".into())),
        );
        assert_eq!(
            load_request(p).unwrap_err().message(),
            "invalid value type for load parameter 'file:1/m', expected bytes_param."
        );
        let mut p = HashMap::new();
        p.insert("colour".to_string(), param(ParameterChoice::Int64Param(1)));
        assert_eq!(
            load_request(p).unwrap_err().message(),
            "unrecognized load parameter 'colour'."
        );
    }

    #[test]
    fn unload_dependents_must_be_bool() {
        let mut p = HashMap::new();
        assert!(!unload_dependents(&p).unwrap());
        p.insert(
            "unload_dependents".to_string(),
            param(ParameterChoice::BoolParam(true)),
        );
        assert!(unload_dependents(&p).unwrap());
        p.insert(
            "unload_dependents".to_string(),
            param(ParameterChoice::Int64Param(1)),
        );
        assert!(
            unload_dependents(&p)
                .unwrap_err()
                .message()
                .contains("'unload_dependents'")
        );
    }

    #[test]
    fn repository_name_is_unsupported() {
        assert!(check_repository_name("").is_ok());
        let err = check_repository_name("other").unwrap_err();
        assert_eq!(err, ServiceError::unsupported(REPOSITORY_NAME_UNSUPPORTED));
    }
}
