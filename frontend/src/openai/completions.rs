//! `POST /v1/completions` and `POST /v1/chat/completions`: both end as prompts for a
//! generation model; chat renders its messages to one prompt with the model's template first.
//!
//! ```text
//! CompletionRequest ─ prompts ─────────────────────────┐
//! ChatRequest ─ template::load + render ─► one prompt ─┴─► models::resolve (generation, else 422)
//!   stream: generation::start ─► sse::respond (the body owns the request)
//!   else:   generation::start per prompt, all pieces gathered ─► one JSON answer
//! ```

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use futures::future::try_join_all;
use serde_json::Value;

use super::convention::{GenerationModel, ModelKind};
use super::errors::OpenAiError;
use super::generation::{Generate, Pieces, Tally, start};
use super::models::resolve;
use super::response::{Envelope, Kind};
use super::sse::{StreamStart, respond};
use super::template;
use super::types::{ChatRequest, CompletionRequest, Sampling, StreamMode};
use crate::http::{HttpState, request_context};
use crate::orca;

/// What both routes hand to [`run`].
struct Job {
    model: String,
    prompts: Vec<String>,
    sampling: Sampling,
    mode: StreamMode,
    echo: bool,
    kind: Kind,
}

/// `POST /v1/completions`.
pub async fn completions(
    state: &HttpState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, OpenAiError> {
    let request = CompletionRequest::parse(body)?;
    let job = Job {
        model: request.model,
        prompts: request.prompts,
        sampling: request.sampling,
        mode: request.mode,
        echo: request.echo,
        kind: Kind::Text,
    };
    let model = generation_model(state, &job.model).await?;
    run(state, headers, job, model).await
}

/// `POST /v1/chat/completions`.
pub async fn chat(
    state: &HttpState,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Response, OpenAiError> {
    let request = ChatRequest::parse(body)?;
    // Resolve first: an unknown model is a 404 before its template is looked for.
    let model = generation_model(state, &request.model).await?;
    let chat_template = template::load(&state.config.model_repositories, &request.model).await?;
    let prompt = template::render(&chat_template, &request.messages, request.tools.as_ref())?;
    let job = Job {
        model: request.model,
        prompts: vec![prompt],
        sampling: request.sampling,
        mode: request.mode,
        echo: false,
        kind: Kind::Chat,
    };
    run(state, headers, job, model).await
}

async fn generation_model(state: &HttpState, model: &str) -> Result<GenerationModel, OpenAiError> {
    match resolve(state, model).await? {
        ModelKind::Generation(g) => Ok(g),
        ModelKind::Embedding(_) => Err(OpenAiError::wrong_kind(
            model,
            "it is an embedding model; use /v1/embeddings",
        )),
    }
}

/// Starts one prompt's generation.
async fn ask(
    state: &HttpState,
    headers: &HeaderMap,
    job: &Job,
    model: &GenerationModel,
    prompt: &str,
) -> Result<Pieces, OpenAiError> {
    let ask = Generate {
        model_name: &job.model,
        model,
        prompt,
        sampling: &job.sampling,
        streaming: job.mode.stream,
        context: request_context(headers),
    };
    Ok(start(state, ask).await?)
}

async fn run(
    state: &HttpState,
    headers: &HeaderMap,
    job: Job,
    model: GenerationModel,
) -> Result<Response, OpenAiError> {
    let envelope = Envelope::new(job.kind, &job.model, job.mode.include_usage);
    if job.mode.stream {
        // `types` allows one prompt when streaming.
        let prompt = job.prompts.first().map(String::as_str).unwrap_or_default();
        let pieces = ask(state, headers, &job, &model, prompt).await?;
        let start = StreamStart {
            envelope,
            echo: job.echo.then(|| prompt.to_string()),
            tally: Tally::new(prompt, job.sampling.max_tokens),
            include_usage: job.mode.include_usage,
        };
        let mut response = respond(start, pieces).await?;
        orca::annotate(state.service.as_ref(), headers, &job.model, &mut response).await;
        return Ok(response);
    }
    let answers = try_join_all(job.prompts.iter().map(|prompt| async {
        let mut pieces = ask(state, headers, &job, &model, prompt).await?;
        let mut tally = Tally::new(prompt, job.sampling.max_tokens);
        let mut text = if job.echo {
            prompt.clone()
        } else {
            String::new()
        };
        while let Some(piece) = pieces.next().await {
            let piece = piece?;
            tally.add(&piece);
            text.push_str(&piece.text);
        }
        Ok::<_, OpenAiError>((text, tally))
    }))
    .await?;
    let (prompt_tokens, completion_tokens) = answers.iter().fold((0, 0), |(p, c), (_, t)| {
        (p + t.prompt_tokens(), c + t.completion_tokens())
    });
    let usage = serde_json::json!({
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    });
    let choices = answers
        .into_iter()
        .map(|(text, tally)| (text, tally.finish_reason()))
        .collect();
    let mut response = json_response(envelope.complete(choices, usage));
    orca::annotate(state.service.as_ref(), headers, &job.model, &mut response).await;
    Ok(response)
}

/// A 200 with a JSON body.
pub fn json_response(value: Value) -> Response {
    axum::Json(value).into_response()
}
