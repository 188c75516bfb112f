//! Restricted APIs, as Triton has them: an operator puts categories of endpoints behind a
//! header, `--http-restricted-api <api>[,<api>...]:<key>=<value>` for HTTP and
//! `--grpc-restricted-protocol` (alias `--grpc-restricted-api`) for gRPC.
//!
//! ```text
//! flag values ──► RestrictedApis::parse ──► category ─► (header key, value)   (startup; errors
//!                                                                              name the flag)
//! HTTP  Route ─────────► http_category ─┐   (http::routes)
//! gRPC  /pkg.Service/Rpc ► grpc_category ┴─► RestrictedApis::check(category, header lookup)
//!                                             ├─ not restricted, or the header has the value: Ok
//!                                             └─ else: HTTP 403 "This API is restricted, …",
//!                                                gRPC UNAVAILABLE "This protocol is restricted, …"
//! ```
//!
//! A category may appear in one flag value only (Triton: "can not be specified in multiple
//! config groups"). gRPC clients send the header as the metadata `triton-grpc-protocol-<key>`;
//! [`RestrictedApis::parse_grpc`] stores that full name, so messages show what to send. Header
//! names are matched case-insensitively (HTTP/2 and gRPC lower-case them on the wire); values
//! must match exactly. Everything here is pure: the HTTP frontend calls the check in
//! `http::routes::dispatch`, the gRPC frontend in a layer over its routes (`grpc::routes`).

use std::collections::BTreeMap;
use std::fmt;

use http::HeaderMap;
use http::header::HeaderName;

/// A group of endpoints that can be put behind a header, named as Triton names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApiCategory {
    /// `health`: the server and model liveness and readiness endpoints.
    Health,
    /// `metadata`: server and model metadata.
    Metadata,
    /// `inference`: infer requests (and the generate extension).
    Inference,
    /// `shared-memory`: system and CUDA shared-memory region registration and status.
    SharedMemory,
    /// `model-config`: model configurations.
    ModelConfig,
    /// `model-repository`: the repository index and model load/unload.
    ModelRepository,
    /// `statistics`: model inference statistics.
    Statistics,
    /// `trace`: the trace settings.
    Trace,
    /// `logging`: the log settings.
    Logging,
    /// The OpenAI-compatible routes under `/v1/` (Nereid's own category; Triton's OpenAI
    /// frontend is a separate process with its own `--openai-restricted-api`).
    OpenAi,
}

impl ApiCategory {
    /// Every category, in Triton's order, then Nereid's own.
    pub const ALL: [ApiCategory; 10] = [
        ApiCategory::Health,
        ApiCategory::Metadata,
        ApiCategory::Inference,
        ApiCategory::SharedMemory,
        ApiCategory::ModelConfig,
        ApiCategory::ModelRepository,
        ApiCategory::Statistics,
        ApiCategory::Trace,
        ApiCategory::Logging,
        ApiCategory::OpenAi,
    ];

    /// The name used in the flags.
    pub fn name(self) -> &'static str {
        match self {
            ApiCategory::Health => "health",
            ApiCategory::Metadata => "metadata",
            ApiCategory::Inference => "inference",
            ApiCategory::SharedMemory => "shared-memory",
            ApiCategory::ModelConfig => "model-config",
            ApiCategory::ModelRepository => "model-repository",
            ApiCategory::Statistics => "statistics",
            ApiCategory::Trace => "trace",
            ApiCategory::Logging => "logging",
            ApiCategory::OpenAi => "openai",
        }
    }

    fn from_name(name: &str) -> Option<ApiCategory> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }
}

impl fmt::Display for ApiCategory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The header a restricted category asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequiredHeader {
    /// As the operator wrote it (with `triton-grpc-protocol-` in front for gRPC).
    pub key: String,
    /// The exact value expected.
    pub value: String,
    /// `key`, parsed (lower-cased) for lookups.
    name: HeaderName,
}

/// Why a restricted-API flag value was refused at startup.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestrictError {
    /// The value is not of the form `<api>[,<api>...]:<key>=<value>`.
    #[error(
        "{flag} '{value}' is malformed: {why}; expected <api>[,<api>...]:<key>=<value>, e.g. model-repository,statistics:admin-key=secret"
    )]
    Malformed {
        /// The flag the value came from, for the message.
        flag: &'static str,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The value names an API category that does not exist.
    #[error(
        "{flag} '{value}': unknown API '{api}'; the APIs are {}",
        valid_names()
    )]
    UnknownApi {
        /// The flag the value came from, for the message.
        flag: &'static str,
        /// The value as given.
        value: String,
        /// The unknown API name.
        api: String,
    },
    /// One API category is restricted by more than one value of the flag.
    #[error(
        "{flag}: API '{api}' is restricted in more than one {flag} value; each API can be in one only"
    )]
    Duplicate {
        /// The flag the values came from, for the message.
        flag: &'static str,
        /// The category named twice.
        api: ApiCategory,
    },
    /// The value's header key is not a valid HTTP header name.
    #[error("{flag} '{value}': '{key}' is not a valid header name")]
    BadHeaderName {
        /// The flag the value came from, for the message.
        flag: &'static str,
        /// The value as given.
        value: String,
        /// The invalid header name.
        key: String,
    },
}

fn valid_names() -> String {
    let names: Vec<&str> = ApiCategory::ALL.iter().map(|c| c.name()).collect();
    names.join(", ")
}

/// The categories put behind a header, for one protocol. Empty: nothing is restricted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestrictedApis {
    rules: BTreeMap<ApiCategory, RequiredHeader>,
}

/// Triton's flag for HTTP.
pub const HTTP_FLAG: &str = "--http-restricted-api";
/// Triton's flag for gRPC (`--grpc-restricted-api` is accepted as an alias).
pub const GRPC_FLAG: &str = "--grpc-restricted-protocol";
/// What a gRPC client puts before the key in its metadata.
pub const GRPC_KEY_PREFIX: &str = "triton-grpc-protocol-";

impl RestrictedApis {
    /// The HTTP restrictions from every `--http-restricted-api` value.
    pub fn parse_http(values: &[String]) -> Result<RestrictedApis, RestrictError> {
        Self::parse(HTTP_FLAG, "", values)
    }

    /// The gRPC restrictions from every `--grpc-restricted-protocol` value; keys get the
    /// `triton-grpc-protocol-` prefix clients send.
    pub fn parse_grpc(values: &[String]) -> Result<RestrictedApis, RestrictError> {
        Self::parse(GRPC_FLAG, GRPC_KEY_PREFIX, values)
    }

    fn parse(
        flag: &'static str,
        prefix: &str,
        values: &[String],
    ) -> Result<RestrictedApis, RestrictError> {
        let mut rules = BTreeMap::new();
        for value in values {
            let malformed = |why| RestrictError::Malformed {
                flag,
                value: value.clone(),
                why,
            };
            let (apis, header) = value
                .split_once(':')
                .ok_or_else(|| malformed("no ':' between the APIs and the header"))?;
            let (key, expected) = header
                .split_once('=')
                .ok_or_else(|| malformed("no '=' between the header name and its value"))?;
            if apis.trim().is_empty() {
                return Err(malformed("no API is named"));
            }
            if key.is_empty() {
                return Err(malformed("the header name is empty"));
            }
            let full_key = format!("{prefix}{key}");
            let name = HeaderName::from_bytes(full_key.as_bytes()).map_err(|_| {
                RestrictError::BadHeaderName {
                    flag,
                    value: value.clone(),
                    key: key.to_string(),
                }
            })?;
            for api in apis.split(',').map(str::trim) {
                let category =
                    ApiCategory::from_name(api).ok_or_else(|| RestrictError::UnknownApi {
                        flag,
                        value: value.clone(),
                        api: api.to_string(),
                    })?;
                let rule = RequiredHeader {
                    key: full_key.clone(),
                    value: expected.to_string(),
                    name: name.clone(),
                };
                if rules.insert(category, rule).is_some() {
                    return Err(RestrictError::Duplicate {
                        flag,
                        api: category,
                    });
                }
            }
        }
        Ok(RestrictedApis { rules })
    }

    /// Whether no category is restricted.
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// The header `category` asks for, if it is restricted.
    pub fn required(&self, category: ApiCategory) -> Option<&RequiredHeader> {
        self.rules.get(&category)
    }

    /// `Ok` when `category` is open or `headers` carry its header with exactly the expected
    /// value (any of several occurrences); else the header the request lacks.
    pub fn check(&self, category: ApiCategory, headers: &HeaderMap) -> Result<(), &RequiredHeader> {
        let Some(rule) = self.rules.get(&category) else {
            return Ok(());
        };
        let found = headers
            .get_all(&rule.name)
            .iter()
            .any(|v| v.as_bytes() == rule.value.as_bytes());
        if found { Ok(()) } else { Err(rule) }
    }
}

/// Triton's HTTP message for a request that lacks the header.
pub fn http_refusal(missing: &RequiredHeader) -> String {
    format!("This API is restricted, expecting header '{}'", missing.key)
}

/// Triton's gRPC message (status UNAVAILABLE) for a call that lacks the metadata.
pub fn grpc_refusal(missing: &RequiredHeader) -> String {
    format!(
        "This protocol is restricted, expecting header '{}'",
        missing.key
    )
}

/// The category of a gRPC method path (`/inference.GRPCInferenceService/ModelInfer`), as
/// Triton's `grpc_server.cc` files them; the standard health service counts as `health`.
/// `None` for a path no category holds (an unknown rpc, answered UNIMPLEMENTED as before).
pub fn grpc_category(path: &str) -> Option<ApiCategory> {
    let (service, method) = path.strip_prefix('/')?.split_once('/')?;
    match service {
        "grpc.health.v1.Health" => Some(ApiCategory::Health),
        "inference.GRPCInferenceService" => Some(match method {
            "ServerLive" | "ServerReady" | "ModelReady" => ApiCategory::Health,
            "ServerMetadata" | "ModelMetadata" => ApiCategory::Metadata,
            "ModelInfer" | "ModelStreamInfer" => ApiCategory::Inference,
            "ModelConfig" => ApiCategory::ModelConfig,
            "ModelStatistics" => ApiCategory::Statistics,
            "RepositoryIndex" | "RepositoryModelLoad" | "RepositoryModelUnload" => {
                ApiCategory::ModelRepository
            }
            "SystemSharedMemoryStatus"
            | "SystemSharedMemoryRegister"
            | "SystemSharedMemoryUnregister"
            | "CudaSharedMemoryStatus"
            | "CudaSharedMemoryRegister"
            | "CudaSharedMemoryUnregister" => ApiCategory::SharedMemory,
            "TraceSetting" => ApiCategory::Trace,
            "LogSettings" => ApiCategory::Logging,
            _ => return None,
        }),
        _ => None,
    }
}

#[cfg(test)]
#[path = "restrict_tests.rs"]
mod tests;
