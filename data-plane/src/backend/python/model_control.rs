//! Model control from Python: a model's `pb_utils.load_model()`, `unload_model()` and
//! `is_model_ready()` act on the server's own model repository, through the same
//! [`nereid_proto::InferenceService`] calls as the repository API (so the server's control mode
//! applies: loads and unloads need `--model-control-mode explicit`, as in Triton).
//!
//! ```text
//!  reader thread: model_control {id, action} ─► spawn on the server's runtime
//!  tokio:         load   ─► service.load_model(name, config + files)
//!                 unload ─► service.unload_model(name, unload_dependents)
//!                 ready  ─► service.model_ready(name, version)   (unknown model: false)
//!  blocking pool: model_control_done {id, error, ready} ─► the stub's waiting call returns
//! ```
//!
//! The reader never waits for the call, so a model blocked in `load_model()` keeps receiving
//! messages.

use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use nereid_proto::{InferenceService, LoadRequest, ServiceError, UnloadRequest};

use super::convert;
use super::link::Link;
use nereid_stub_protocol::message::{ErrorCode, ErrorObject, ModelControlAction, ToStub};

/// What a call answers: whether the model is ready (for `is_model_ready`), or its error.
type Outcome = Result<bool, ErrorObject>;

/// Starts the model-control call `id`; its answer is sent when the server has acted.
pub fn call(link: &Arc<Link>, id: u64, action: ModelControlAction) {
    let Some((service, runtime)) = link.server.get() else {
        let error = ErrorObject::new(
            ErrorCode::Unavailable,
            "model control from Python: the server is not accepting requests",
        );
        answer(link, id, Err(error));
        return;
    };
    let link = link.clone();
    runtime.spawn(async move {
        let outcome = act(service.as_ref(), action).await;
        let sender = link.clone();
        let sent = tokio::task::spawn_blocking(move || answer(&sender, id, outcome)).await;
        if let Err(e) = sent {
            tracing::warn!(instance = %link.instance, error = %e, "a model-control answer could not be sent");
        }
    });
}

/// Carries out `action` on `service`.
async fn act(service: &dyn InferenceService, action: ModelControlAction) -> Outcome {
    let failed = |e: ServiceError| convert::service_error_object(e);
    match action {
        ModelControlAction::Load {
            model_name,
            config,
            files,
        } => {
            let request = load_request(&model_name, config, files)?;
            service
                .load_model(&model_name, request)
                .await
                .map(|()| false)
                .map_err(failed)
        }
        ModelControlAction::Unload {
            model_name,
            unload_dependents,
        } => service
            .unload_model(&model_name, UnloadRequest::new(unload_dependents))
            .await
            .map(|()| false)
            .map_err(failed),
        ModelControlAction::Ready {
            model_name,
            model_version,
        } => {
            let version = parse_version(&model_name, &model_version)?;
            match service.model_ready(&model_name, version).await {
                Ok(ready) => Ok(ready),
                // As Triton's server API: a model it does not know is not ready.
                Err(ServiceError::NotFound(_)) => Ok(false),
                Err(e) => Err(failed(e)),
            }
        }
    }
}

/// The repository load request of a `load_model(name, config, files)`.
fn load_request(
    model: &str,
    config: String,
    files: std::collections::BTreeMap<String, String>,
) -> Result<LoadRequest, ErrorObject> {
    let invalid = |what: String| {
        ErrorObject::new(
            ErrorCode::InvalidArg,
            format!("load_model('{model}'): {what}"),
        )
    };
    let mut decoded = std::collections::BTreeMap::new();
    for (name, data) in files {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.as_bytes())
            .map_err(|e| invalid(format!("file '{name}' is not base64: {e}")))?;
        decoded.insert(name, Bytes::from(bytes));
    }
    if !decoded.is_empty() && config.is_empty() {
        return Err(invalid(
            "files were given without a config; Triton needs the config to load a model from files"
                .into(),
        ));
    }
    Ok(LoadRequest {
        config: (!config.is_empty()).then_some(config),
        files: decoded,
        credential: None,
    })
}

/// `is_model_ready`'s version: empty is the latest, else a version number.
fn parse_version(model: &str, version: &str) -> Result<Option<i64>, ErrorObject> {
    if version.is_empty() {
        return Ok(None);
    }
    version.parse::<i64>().map(Some).map_err(|_| {
        ErrorObject::new(
            ErrorCode::InvalidArg,
            format!("is_model_ready('{model}'): model_version '{version}' is not a number"),
        )
    })
}

/// Sends `model_control_done`; the stub may be gone, which the reader handles.
fn answer(link: &Link, id: u64, outcome: Outcome) {
    let (ready, error) = match outcome {
        Ok(ready) => (ready, None),
        Err(error) => (false, Some(error)),
    };
    if let Err(e) = link.send(&ToStub::ModelControlDone { id, error, ready }) {
        tracing::debug!(instance = %link.instance, error = %e, "cannot send a model-control answer");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_decoded_and_need_a_config() {
        let files = [("file:1/model.onnx".to_string(), "AAEC".to_string())].into();
        let request = load_request("m", "{}".into(), files).unwrap();
        assert_eq!(request.config.as_deref(), Some("{}"));
        assert_eq!(&request.files["file:1/model.onnx"][..], &[0, 1, 2]);

        let files = [("file:1/model.onnx".to_string(), "AAEC".to_string())].into();
        let err = load_request("m", String::new(), files).unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArg);
        assert!(err.message.contains("without a config"), "{}", err.message);

        let files = [("file:1/x".to_string(), "not base64!".to_string())].into();
        let err = load_request("m", "{}".into(), files).unwrap_err();
        assert!(
            err.message.contains("file 'file:1/x' is not base64"),
            "{}",
            err.message
        );

        let plain = load_request("m", String::new(), Default::default()).unwrap();
        assert_eq!(plain, LoadRequest::default());
    }

    #[test]
    fn versions_are_numbers_or_empty() {
        assert_eq!(parse_version("m", "").unwrap(), None);
        assert_eq!(parse_version("m", "3").unwrap(), Some(3));
        let err = parse_version("m", "latest").unwrap_err();
        assert!(
            err.message.contains("'latest' is not a number"),
            "{}",
            err.message
        );
    }

    #[test]
    fn the_messages_have_the_documented_shape() {
        let load: nereid_stub_protocol::message::FromStub = serde_json::from_str(
            r#"{"op": "model_control", "id": 4, "action": "load", "model_name": "m", "config": "{}", "files": {"file:1/a": "AA=="}}"#,
        )
        .unwrap();
        let nereid_stub_protocol::message::FromStub::ModelControl { id, action } = load else {
            panic!("{load:?}")
        };
        assert_eq!(id, 4);
        assert!(
            matches!(action, ModelControlAction::Load { ref model_name, .. } if model_name == "m")
        );
        let ready: nereid_stub_protocol::message::FromStub = serde_json::from_str(
            r#"{"op": "model_control", "id": 5, "action": "ready", "model_name": "m"}"#,
        )
        .unwrap();
        assert!(matches!(
            ready,
            nereid_stub_protocol::message::FromStub::ModelControl { action: ModelControlAction::Ready { ref model_version, .. }, .. } if model_version.is_empty()
        ));
        let done = serde_json::to_value(ToStub::ModelControlDone {
            id: 5,
            error: None,
            ready: true,
        })
        .unwrap();
        assert_eq!(
            done,
            serde_json::json!({"op": "model_control_done", "id": 5, "error": null, "ready": true})
        );
    }
}
