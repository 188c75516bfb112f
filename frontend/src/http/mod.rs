//! HTTP frontend: the KServe v2 REST API with Triton's extensions (binary tensor data,
//! compression, model repository, statistics, model configuration).
//!
//! ```text
//! axum::Router (one fallback handler, no global state)
//!   └─► routes::dispatch ── path ─► Route (Triton's regexes, raw segments), restricted-API
//!         │                  header check (403, crate::restrict), method check (405)
//!         ├─ body            Content-Length / streamed size limit, then compression::decompress
//!         ├─ metadata        health, server/model metadata, ready, config, statistics
//!         ├─ repository      index, load (config + file overrides), unload
//!         ├─ settings        trace settings (global, per model), logging: JSON ↔ settings maps
//!         ├─ shm             system shared memory: status, register, unregister (crate::shm)
//!         ├─ generate        POST .../generate, .../generate_stream: flat JSON keys ─► inputs
//!         │                  or parameters (by model metadata) ─► InferenceService::infer_stream
//!         │                  ─► one JSON response, or server-sent events as they arrive
//!         └─ infer           POST .../infer
//!              ├─ infer_request   JSON header + binary section (zero-copy slices)
//!              │    └─ tensor_json     JSON `data` ─► raw little-endian bytes
//!              ├─ raw_request     or the whole body as the single input (shape from config)
//!              ├─ crate::shm      shared-memory inputs read in, outputs written out
//!              ├─ InferenceService::infer   the one shared implementation
//!              └─ infer_response  JSON header + binary outputs as separate chunks,
//!                                 optionally compressed per Accept-Encoding
//! every error ─► error::HttpError ─► {"error":"<message>"} (one exhaustive status match)
//! ```
//!
//! The crate's `router` (module `app`) serves these routes, with the OpenAI-compatible ones
//! under `/v1/` beside them; the caller owns the listener and graceful shutdown
//! (`axum::serve(listener, router).with_graceful_shutdown(..)`). A client that disconnects drops
//! the handler future (or, for `generate_stream`, the response body), which drops the in-flight
//! `InferenceService` future or stream and so cancels the request. System and CUDA shared
//! memory are both served (`shm`); an unsupported request (an unknown content coding, a named
//! repository) answers 501 naming what is not supported.

mod body;
mod compression;
mod error;
mod generate;
mod infer;
mod infer_request;
mod infer_response;
mod json_body;
mod metadata;
mod raw_request;
mod repository;
pub(crate) mod routes;
mod settings;
mod shm;
mod tensor_json;
#[cfg(test)]
mod tests;

/// What a proxy in front of these routes reads to take `POST .../infer` itself (the router's
/// HTTP pass-through): the same path matching, request context, header-length rule and error
/// bodies as the typed path.
pub use body::read_body;
pub use error::HttpError;
pub use infer_request::request_context as http_request_context;
pub use routes::{ModelAction, Route, parse_route};

/// What the OpenAI-compatible routes (the `openai` module) share with the generate endpoints: the state, the
/// mapping of flat keys to a model's inputs, the request context, the error body.
pub(crate) use generate::{event as sse_event, request_from_keys};
pub(crate) use infer_request::request_context;

/// What the fuzz targets drive ([`crate::fuzzing`]).
pub(crate) use infer_request::decode_json;
pub use infer_request::{INFER_HEADER_CONTENT_LENGTH, header_length, param_value};
pub(crate) use raw_request::decode_raw;

use std::path::PathBuf;
use std::sync::Arc;

use crate::forward::HeaderForward;
use crate::restrict::RestrictedApis;
use crate::shm::SharedMemory;
use nereid_proto::InferenceService;
use nereid_proto::codec::RequestLimits;

/// Settings of the HTTP frontend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpConfig {
    /// Largest request body accepted, in bytes (`--http-max-input-size`), both as received and
    /// after decompression; also bounds each JSON-decoded input tensor. Triton's default is
    /// 64 MiB.
    pub max_input_size: usize,
    /// The process's shared-memory registry (the same handle as the gRPC frontend's).
    pub shared_memory: SharedMemory,
    /// Endpoint categories put behind a header (`--http-restricted-api`); empty: all open.
    pub restricted: RestrictedApis,
    /// Input / output counts and tensor sizes an infer request may have (the gRPC frontend
    /// checks the same).
    pub limits: RequestLimits,
    /// Headers copied into infer requests' parameters (`--http-header-forward-pattern`);
    /// default: none.
    pub header_forward: HeaderForward,
    /// The local model repositories (`--model-repository`), where the OpenAI chat route looks
    /// for a model's `tokenizer_config.json`; empty (the router): every model gets the default
    /// chat template.
    pub model_repositories: Vec<PathBuf>,
}

impl HttpConfig {
    /// Triton's default `--http-max-input-size`: 2^26 bytes.
    pub const DEFAULT_MAX_INPUT_SIZE: usize = 64 * 1024 * 1024;
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            max_input_size: Self::DEFAULT_MAX_INPUT_SIZE,
            shared_memory: SharedMemory::default(),
            restricted: RestrictedApis::default(),
            limits: RequestLimits::default(),
            header_forward: HeaderForward::default(),
            model_repositories: Vec::new(),
        }
    }
}

/// What every handler shares: the service it translates to, and the settings.
pub(crate) struct HttpState {
    pub service: Arc<dyn InferenceService>,
    pub config: HttpConfig,
}
