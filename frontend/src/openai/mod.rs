//! The OpenAI-compatible API under `/v1/` on the HTTP port: a thin translation onto the same
//! `InferenceService` the KServe routes call, with requests to generation models built the way
//! `/generate_stream` builds them (`http::request_from_keys`).
//!
//! ```text
//! /v1/<path> ─► dispatch ── API key: restricted category `openai` (Authorization: Bearer <key>)
//!                 │          missing or wrong ─► 401; Triton's `inference` / `metadata`
//!                 │          categories still apply to the routes they cover (403)
//!                 ├─ GET  models, models/{id}     models      (kinds from model metadata)
//!                 ├─ POST completions             completions ─► generation ─► sse / JSON
//!                 ├─ POST chat/completions        completions (template renders the prompt)
//!                 └─ POST embeddings              embeddings
//! every error ─► errors::OpenAiError ─► {"error": {"message", "type", "param", "code"}}
//! ```
//!
//! Which models serve which route is `convention`; request bodies are read in `types`, answers
//! written by `response` (whole) and `sse` (streamed). A client that disconnects drops the
//! handler's future or the event stream's body, and with it the `InferenceService` stream, which
//! cancels the request in the model (a Python model sees `is_cancelled()`).

mod completions;
mod convention;
mod embeddings;
mod errors;
mod generation;
mod models;
mod response;
#[cfg(test)]
mod route_tests;
mod sse;
mod template;
mod types;

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::http::{HttpState, read_body};
use crate::restrict::{ApiCategory, http_refusal};
pub use errors::OpenAiError;

/// A `/v1/` route.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Route {
    Models,
    Model(String),
    Completions,
    ChatCompletions,
    Embeddings,
}

impl Route {
    fn parse(path: &str) -> Option<Route> {
        let rest = path.strip_prefix("/v1/")?;
        match rest.split('/').collect::<Vec<_>>().as_slice() {
            ["models"] => Some(Route::Models),
            ["models", id] if !id.is_empty() => Some(Route::Model(id.to_string())),
            ["completions"] => Some(Route::Completions),
            ["chat", "completions"] => Some(Route::ChatCompletions),
            ["embeddings"] => Some(Route::Embeddings),
            _ => None,
        }
    }

    fn method(&self) -> Method {
        match self {
            Route::Models | Route::Model(_) => Method::GET,
            Route::Completions | Route::ChatCompletions | Route::Embeddings => Method::POST,
        }
    }

    /// Triton's category for what the route does, checked besides `openai`.
    fn triton_category(&self) -> ApiCategory {
        match self {
            Route::Models | Route::Model(_) => ApiCategory::Metadata,
            Route::Completions | Route::ChatCompletions | Route::Embeddings => {
                ApiCategory::Inference
            }
        }
    }
}

/// The handler of every `/v1/` path.
pub async fn dispatch(State(state): State<Arc<HttpState>>, request: Request) -> Response {
    handle(&state, request)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn handle(state: &HttpState, request: Request) -> Result<Response, OpenAiError> {
    let path = request.uri().path().to_string();
    let method = request.method().clone();
    let Some(route) = Route::parse(&path) else {
        return Err(OpenAiError::no_route(
            method.as_str(),
            &path,
            StatusCode::NOT_FOUND,
        ));
    };
    authorize(state, &route, request.headers())?;
    if method != route.method() {
        return Err(OpenAiError::no_route(
            method.as_str(),
            &path,
            StatusCode::METHOD_NOT_ALLOWED,
        ));
    }
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    match route {
        Route::Models => models::list(state).await.map(completions::json_response),
        Route::Model(id) => models::one(state, &id)
            .await
            .map(completions::json_response),
        Route::Completions => {
            let body = read(state, headers, body).await?;
            completions::completions(state, headers, &body).await
        }
        Route::ChatCompletions => {
            let body = read(state, headers, body).await?;
            completions::chat(state, headers, &body).await
        }
        Route::Embeddings => {
            let body = read(state, headers, body).await?;
            embeddings::embeddings(state, headers, &body).await
        }
    }
}

/// The API key (category `openai`: 401 without it), then Triton's category of the route (403,
/// as on the KServe routes).
fn authorize(state: &HttpState, route: &Route, headers: &HeaderMap) -> Result<(), OpenAiError> {
    let restricted = &state.config.restricted;
    if restricted.check(ApiCategory::OpenAi, headers).is_err() {
        return Err(OpenAiError::bad_api_key());
    }
    if let Err(missing) = restricted.check(route.triton_category(), headers) {
        return Err(OpenAiError {
            status: StatusCode::FORBIDDEN,
            message: http_refusal(missing),
            kind: "permission_error",
            param: None,
            code: None,
        });
    }
    Ok(())
}

/// The request body, within `--http-max-input-size`.
async fn read(
    state: &HttpState,
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Result<bytes::Bytes, OpenAiError> {
    read_body(headers, body, state.config.max_input_size)
        .await
        .map_err(|e| {
            let (status, message) = e.into_parts();
            OpenAiError {
                status,
                message,
                kind: "invalid_request_error",
                param: None,
                code: None,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(Route::parse("/v1/models"), Some(Route::Models));
        assert_eq!(Route::parse("/v1/models/m"), Some(Route::Model("m".into())));
        assert_eq!(
            Route::parse("/v1/chat/completions"),
            Some(Route::ChatCompletions)
        );
        assert_eq!(Route::parse("/v1/completions"), Some(Route::Completions));
        assert_eq!(Route::parse("/v1/embeddings"), Some(Route::Embeddings));
        assert_eq!(Route::parse("/v1/models/"), None);
        assert_eq!(Route::parse("/v1/models/a/b"), None);
        assert_eq!(Route::parse("/v1/chat"), None);
        assert_eq!(Route::parse("/v2/models"), None);
    }
}
