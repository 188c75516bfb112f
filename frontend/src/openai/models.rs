//! `GET /v1/models`, `GET /v1/models/{id}`, and the lookup every route starts with: a model's
//! kind ([`classify`]) from `InferenceService::model_metadata`.
//!
//! The list holds the ready models that serve some `/v1/` route (generation or embedding);
//! the rest of the repository is left out, as it is of no use to an OpenAI client.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use super::convention::{ModelKind, classify};
use super::errors::OpenAiError;
use crate::http::HttpState;
use nereid_proto::ServiceError;

/// Who the model list says owns the models.
const OWNER: &str = "nereid";

/// The kind of `model`: 404 for an unknown model, 422 for one that follows neither convention.
pub async fn resolve(state: &HttpState, model: &str) -> Result<ModelKind, OpenAiError> {
    let metadata = match state.service.model_metadata(model, None).await {
        Ok(metadata) => metadata,
        Err(ServiceError::NotFound(_)) => return Err(OpenAiError::model_not_found(model)),
        Err(e) => return Err(e.into()),
    };
    classify(&metadata).map_err(|why| OpenAiError::wrong_kind(model, why))
}

fn entry(id: &str) -> Value {
    json!({"id": id, "object": "model", "created": 0, "owned_by": OWNER})
}

/// `GET /v1/models`.
pub async fn list(state: &HttpState) -> Result<Value, OpenAiError> {
    let index = state.service.repository_index(true).await?;
    let names: BTreeSet<String> = index.into_iter().map(|e| e.name).collect();
    let mut data = Vec::new();
    for name in names {
        if let Ok(metadata) = state.service.model_metadata(&name, None).await
            && classify(&metadata).is_ok()
        {
            data.push(entry(&name));
        }
    }
    Ok(json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`: 404 also for a model that serves no `/v1/` route.
pub async fn one(state: &HttpState, id: &str) -> Result<Value, OpenAiError> {
    match resolve(state, id).await {
        Ok(_) => Ok(entry(id)),
        Err(e) if e.status.as_u16() == 422 => Err(OpenAiError::model_not_found(id)),
        Err(e) => Err(e),
    }
}
