//! Path → [`Route`], method check, and dispatch to the handler modules.
//!
//! Matching reproduces Triton's `http_server.cc` regexes rather than axum's router, so the edge
//! cases behave the same: segments are taken raw (no percent-decoding), a version segment must be
//! all digits, `/v2/models/stats` wins over a model named `stats`, a version is not allowed on a
//! model's trace setting, and an unknown path is 404 while a known path with the wrong method is
//! 405. A known path whose category is restricted (`crate::restrict`) needs its header first
//! (403). [`parse_route`] is a pure function; [`dispatch`] is the one axum handler.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::Method;
use axum::response::{IntoResponse, Response};

use super::error::HttpError;
use super::{HttpState, generate, infer, metadata, repository, settings, shm};
use crate::restrict::{ApiCategory, http_refusal};
use nereid_proto::ServiceError;

/// A model endpoint: `/v2/models/{m}[/versions/{v}][/<action>]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelAction {
    /// `/v2/models/{m}[/versions/{v}]`: the model's metadata.
    Metadata,
    /// `.../ready`: whether the model (version) is ready.
    Ready,
    /// `.../config`: the model's configuration.
    Config,
    /// `.../stats`: the model's inference statistics.
    Stats,
    /// `.../infer`: a KServe v2 inference request.
    Infer,
    /// `.../generate`: Triton's generate extension, one JSON response.
    Generate,
    /// `.../generate_stream`: the generate extension, responses as server-sent events.
    GenerateStream,
    /// `/v2/models/{m}/trace/setting`: the model's trace settings (never per version).
    TraceSetting,
}

/// A shared-memory endpoint's last segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShmAction {
    Status,
    Register,
    Unregister,
}

/// A recognised path, with its raw segments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// `/v2`: the server's metadata.
    ServerMetadata,
    /// `/v2/health/live`: whether the server is live.
    Live,
    /// `/v2/health/ready`: whether the server is ready.
    Ready,
    /// `/v2/models/stats`: statistics of every model.
    AllModelStats,
    /// An endpoint of one model, `/v2/models/{m}[/versions/{v}][/<action>]`.
    Model {
        /// The model's name, the raw path segment.
        name: String,
        /// Digits, or empty for "latest".
        version: String,
        /// Which endpoint of the model.
        action: ModelAction,
    },
    /// `/v2/repository[/{r}]/index`: the models the repository holds.
    RepositoryIndex {
        /// The `{r}` segment, raw; `None` when the path names no repository.
        repository: Option<String>,
    },
    /// `/v2/repository[/{r}]/models/{m}/load`: load (or reload) a model.
    RepositoryLoad {
        /// The `{r}` segment, raw; `None` when the path names no repository.
        repository: Option<String>,
        /// The model's name, the raw path segment.
        model: String,
    },
    /// `/v2/repository[/{r}]/models/{m}/unload`: unload a model.
    RepositoryUnload {
        /// The `{r}` segment, raw; `None` when the path names no repository.
        repository: Option<String>,
        /// The model's name, the raw path segment.
        model: String,
    },
    /// `/v2/systemsharedmemory[/region/{name}]/<action>`: system shared-memory regions.
    SystemSharedMemory {
        /// The `/region/{name}` segment, raw; `None` for every region.
        region: Option<String>,
        /// Status, register or unregister.
        action: ShmAction,
    },
    /// `/v2/cudasharedmemory[/region/{name}]/<action>`: CUDA shared-memory regions; the region
    /// segment, raw (`None` for every region), and the action.
    CudaSharedMemory(Option<String>, ShmAction),
    /// `/v2/trace/setting`: the server-wide trace settings.
    TraceSetting,
    /// `/v2/logging`: the server's log settings.
    Logging,
}

impl Route {
    /// The methods the route takes, as an `Allow` header value.
    fn allowed(&self) -> &'static str {
        match self {
            Route::ServerMetadata | Route::Live | Route::Ready | Route::AllModelStats => "GET",
            Route::Model { action, .. } => match action {
                ModelAction::Metadata
                | ModelAction::Ready
                | ModelAction::Config
                | ModelAction::Stats => "GET",
                ModelAction::Infer | ModelAction::Generate | ModelAction::GenerateStream => "POST",
                ModelAction::TraceSetting => "GET, POST",
            },
            Route::RepositoryIndex { .. }
            | Route::RepositoryLoad { .. }
            | Route::RepositoryUnload { .. } => "POST",
            Route::SystemSharedMemory { action, .. } | Route::CudaSharedMemory(_, action) => {
                match action {
                    ShmAction::Status => "GET",
                    ShmAction::Register | ShmAction::Unregister => "POST",
                }
            }
            Route::TraceSetting | Route::Logging => "GET, POST",
        }
    }

    fn allows(&self, method: &Method) -> bool {
        self.allowed().split(", ").any(|m| m == method.as_str())
    }
}

/// Matches a request path the way Triton's regexes do; `None` means 404.
pub fn parse_route(path: &str) -> Option<Route> {
    let rest = path.strip_prefix("/v2")?;
    if rest.is_empty() {
        return Some(Route::ServerMetadata);
    }
    let segments: Vec<&str> = rest.strip_prefix('/')?.split('/').collect();
    if segments.iter().any(|s| s.is_empty()) {
        return None;
    }
    match segments.as_slice() {
        ["health", "live"] => Some(Route::Live),
        ["health", "ready"] => Some(Route::Ready),
        ["models", "stats"] => Some(Route::AllModelStats),
        ["models", name, tail @ ..] => parse_model_route(name, tail),
        ["repository", tail @ ..] => parse_repository_route(tail),
        ["systemsharedmemory", tail @ ..] => {
            parse_shm_action(tail).map(|(region, action)| Route::SystemSharedMemory {
                region: region.map(str::to_string),
                action,
            })
        }
        ["cudasharedmemory", tail @ ..] => parse_shm_action(tail)
            .map(|(r, action)| Route::CudaSharedMemory(r.map(str::to_string), action)),
        ["trace", "setting"] => Some(Route::TraceSetting),
        ["logging"] => Some(Route::Logging),
        _ => None,
    }
}

fn parse_model_route(name: &str, tail: &[&str]) -> Option<Route> {
    let (version, tail) = match tail {
        ["versions", version, rest @ ..] => {
            if !version.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            (*version, rest)
        }
        _ => ("", tail),
    };
    let action = match tail {
        [] => ModelAction::Metadata,
        ["ready"] => ModelAction::Ready,
        ["config"] => ModelAction::Config,
        ["stats"] => ModelAction::Stats,
        ["infer"] => ModelAction::Infer,
        ["generate"] => ModelAction::Generate,
        ["generate_stream"] => ModelAction::GenerateStream,
        // Trace settings are per model, never per version.
        ["trace", "setting"] if version.is_empty() => ModelAction::TraceSetting,
        _ => return None,
    };
    Some(Route::Model {
        name: name.to_string(),
        version: version.to_string(),
        action,
    })
}

fn parse_repository_route(tail: &[&str]) -> Option<Route> {
    let (repository, tail) = match tail {
        ["index"] | ["models", _, _] => (None, tail),
        [repository, rest @ ..] => (Some(repository.to_string()), rest),
        [] => return None,
    };
    match tail {
        ["index"] => Some(Route::RepositoryIndex { repository }),
        ["models", model, "load"] => Some(Route::RepositoryLoad {
            repository,
            model: model.to_string(),
        }),
        ["models", model, "unload"] => Some(Route::RepositoryUnload {
            repository,
            model: model.to_string(),
        }),
        _ => None,
    }
}

/// `[/region/{name}]/{action}`: the region's raw name, if any, and the action.
fn parse_shm_action<'a>(tail: &[&'a str]) -> Option<(Option<&'a str>, ShmAction)> {
    let (region, action) = match tail {
        [action] => (None, *action),
        ["region", name, action] => (Some(*name), *action),
        _ => return None,
    };
    let action = match action {
        "status" => ShmAction::Status,
        "register" => ShmAction::Register,
        "unregister" => ShmAction::Unregister,
        _ => return None,
    };
    Some((region, action))
}

/// The router's only handler: match the path, check the restricted-API header, check the
/// method, run the endpoint. Like Triton, a restricted endpoint answers 403 before its method is
/// looked at, and an unknown path stays 404 whatever is restricted.
pub async fn dispatch(State(state): State<Arc<HttpState>>, request: Request) -> Response {
    let Some(route) = parse_route(request.uri().path()) else {
        return HttpError::not_found().into_response();
    };
    let restricted = &state.config.restricted;
    if let Err(missing) = restricted.check(http_category(&route), request.headers()) {
        return HttpError::from(ServiceError::PermissionDenied(http_refusal(missing)))
            .into_response();
    }
    if !route.allows(request.method()) {
        return HttpError::method_not_allowed(route.allowed()).into_response();
    }
    let service = state.service.as_ref();
    let result = match route {
        Route::ServerMetadata => Ok(metadata::server_metadata(service)),
        Route::Live => Ok(metadata::health(service, false).await),
        Route::Ready => Ok(metadata::health(service, true).await),
        Route::AllModelStats => metadata::model_stats(service, "", "").await,
        Route::Model {
            name,
            version,
            action,
        } => match action {
            ModelAction::Metadata => metadata::model_metadata(service, &name, &version).await,
            ModelAction::Ready => metadata::model_ready(service, &name, &version).await,
            ModelAction::Config => metadata::model_config(service, &name, &version).await,
            ModelAction::Stats => metadata::model_stats(service, &name, &version).await,
            ModelAction::Infer => infer::infer(&state, &name, &version, request).await,
            ModelAction::Generate => {
                generate::generate(&state, &name, &version, request, false).await
            }
            ModelAction::GenerateStream => {
                generate::generate(&state, &name, &version, request, true).await
            }
            ModelAction::TraceSetting => settings::trace(&state, Some(&name), request).await,
        },
        Route::RepositoryIndex { repository } => match repository {
            Some(_) => Err(repository::named_repository()),
            None => repository::index(&state, request).await,
        },
        Route::RepositoryLoad { repository, model } => match repository {
            Some(_) => Err(repository::named_repository()),
            None => repository::load(&state, &model, request).await,
        },
        Route::RepositoryUnload { repository, model } => match repository {
            Some(_) => Err(repository::named_repository()),
            None => repository::unload(&state, &model, request).await,
        },
        Route::SystemSharedMemory { region, action } => {
            shm::endpoint(&state, region.as_deref(), action, request).await
        }
        Route::CudaSharedMemory(region, action) => {
            shm::cuda_endpoint(&state, region.as_deref(), action, request).await
        }
        Route::TraceSetting => settings::trace(&state, None, request).await,
        Route::Logging => settings::logging(&state, request).await,
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

/// The category of an HTTP endpoint, as Triton's `http_server.cc` files them.
pub fn http_category(route: &Route) -> ApiCategory {
    match route {
        Route::Live | Route::Ready => ApiCategory::Health,
        Route::ServerMetadata => ApiCategory::Metadata,
        Route::AllModelStats => ApiCategory::Statistics,
        Route::Model { action, .. } => match action {
            ModelAction::Metadata => ApiCategory::Metadata,
            ModelAction::Ready => ApiCategory::Health,
            ModelAction::Config => ApiCategory::ModelConfig,
            ModelAction::Stats => ApiCategory::Statistics,
            ModelAction::Infer | ModelAction::Generate | ModelAction::GenerateStream => {
                ApiCategory::Inference
            }
            ModelAction::TraceSetting => ApiCategory::Trace,
        },
        Route::RepositoryIndex { .. }
        | Route::RepositoryLoad { .. }
        | Route::RepositoryUnload { .. } => ApiCategory::ModelRepository,
        Route::SystemSharedMemory { .. } | Route::CudaSharedMemory(..) => ApiCategory::SharedMemory,
        Route::TraceSetting => ApiCategory::Trace,
        Route::Logging => ApiCategory::Logging,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(name: &str, version: &str, action: ModelAction) -> Option<Route> {
        Some(Route::Model {
            name: name.into(),
            version: version.into(),
            action,
        })
    }

    #[test]
    fn server_and_health_paths() {
        assert_eq!(parse_route("/v2"), Some(Route::ServerMetadata));
        assert_eq!(parse_route("/v2/health/live"), Some(Route::Live));
        assert_eq!(parse_route("/v2/health/ready"), Some(Route::Ready));
        assert_eq!(parse_route("/v2/"), None);
        assert_eq!(parse_route("/v2/health"), None);
        assert_eq!(parse_route("/v2/health/live/"), None);
        assert_eq!(parse_route("/v3"), None);
        assert_eq!(parse_route("/v2x"), None);
        assert_eq!(parse_route("/"), None);
    }

    #[test]
    fn model_paths() {
        assert_eq!(
            parse_route("/v2/models/m"),
            model("m", "", ModelAction::Metadata)
        );
        assert_eq!(
            parse_route("/v2/models/m/versions/3"),
            model("m", "3", ModelAction::Metadata)
        );
        assert_eq!(
            parse_route("/v2/models/m/versions/12/infer"),
            model("m", "12", ModelAction::Infer)
        );
        assert_eq!(
            parse_route("/v2/models/m/ready"),
            model("m", "", ModelAction::Ready)
        );
        assert_eq!(
            parse_route("/v2/models/m/config"),
            model("m", "", ModelAction::Config)
        );
        assert_eq!(
            parse_route("/v2/models/m/stats"),
            model("m", "", ModelAction::Stats)
        );
        assert_eq!(
            parse_route("/v2/models/m/generate_stream"),
            model("m", "", ModelAction::GenerateStream)
        );
        assert_eq!(
            parse_route("/v2/models/m/trace/setting"),
            model("m", "", ModelAction::TraceSetting)
        );
        assert_eq!(parse_route("/v2/models/stats"), Some(Route::AllModelStats));
        assert_eq!(
            parse_route("/v2/models/stats/ready"),
            model("stats", "", ModelAction::Ready)
        );
        // Raw segments: no percent-decoding.
        assert_eq!(
            parse_route("/v2/models/a%2Fb"),
            model("a%2Fb", "", ModelAction::Metadata)
        );
    }

    #[test]
    fn malformed_model_paths_are_not_found() {
        assert_eq!(parse_route("/v2/models/m/versions/x"), None);
        assert_eq!(parse_route("/v2/models/m/versions/-1/infer"), None);
        assert_eq!(parse_route("/v2/models/m/versions/"), None);
        assert_eq!(parse_route("/v2/models/m/versions"), None);
        assert_eq!(parse_route("/v2/models/m/versions/1/trace/setting"), None);
        assert_eq!(parse_route("/v2/models/m/unknown"), None);
        assert_eq!(parse_route("/v2/models//infer"), None);
        assert_eq!(parse_route("/v2/models"), None);
    }

    #[test]
    fn repository_paths() {
        assert_eq!(
            parse_route("/v2/repository/index"),
            Some(Route::RepositoryIndex { repository: None })
        );
        assert_eq!(
            parse_route("/v2/repository/r/index"),
            Some(Route::RepositoryIndex {
                repository: Some("r".into())
            })
        );
        assert_eq!(
            parse_route("/v2/repository/models/m/load"),
            Some(Route::RepositoryLoad {
                repository: None,
                model: "m".into()
            })
        );
        assert_eq!(
            parse_route("/v2/repository/r/models/m/unload"),
            Some(Route::RepositoryUnload {
                repository: Some("r".into()),
                model: "m".into()
            })
        );
        assert_eq!(parse_route("/v2/repository/models/m/delete"), None);
        assert_eq!(parse_route("/v2/repository"), None);
        assert_eq!(parse_route("/v2/repository/a/b/index"), None);
    }

    #[test]
    fn other_extension_paths() {
        assert_eq!(
            parse_route("/v2/systemsharedmemory/status"),
            Some(Route::SystemSharedMemory {
                region: None,
                action: ShmAction::Status
            })
        );
        assert_eq!(
            parse_route("/v2/systemsharedmemory/region/in%20put/unregister"),
            Some(Route::SystemSharedMemory {
                region: Some("in%20put".into()),
                action: ShmAction::Unregister
            })
        );
        assert_eq!(
            parse_route("/v2/cudasharedmemory/region/r/register"),
            Some(Route::CudaSharedMemory(
                Some("r".into()),
                ShmAction::Register
            ))
        );
        assert_eq!(parse_route("/v2/systemsharedmemory/region/r"), None);
        assert_eq!(parse_route("/v2/trace/setting"), Some(Route::TraceSetting));
        assert_eq!(parse_route("/v2/logging"), Some(Route::Logging));
    }

    #[test]
    fn methods() {
        let infer = parse_route("/v2/models/m/infer").unwrap();
        assert!(infer.allows(&Method::POST) && !infer.allows(&Method::GET));
        let trace = Route::TraceSetting;
        assert!(
            trace.allows(&Method::GET)
                && trace.allows(&Method::POST)
                && !trace.allows(&Method::PUT)
        );
        assert!(Route::Live.allows(&Method::GET) && !Route::Live.allows(&Method::HEAD));
    }
}
