//! The REST/JSON mirror of the management API. Every route calls the same
//! [`ManagementService`] method as its gRPC twin, so semantics and errors match; bodies and
//! answers are the proto-JSON of the same messages (snake_case fields, enums by name).
//!
//! | Route                                   | RPC              | Body                          |
//! |-----------------------------------------|------------------|-------------------------------|
//! | `POST   /api/v1/models`                 | DeployModel      | `Model`                       |
//! | `PUT    /api/v1/models/{name}`          | DeployModel      | `Model` (name empty or equal) |
//! | `POST   /api/v1/models/{name}/scale`    | ScaleModel       | `{min_replicas, max_replicas}`|
//! | `PUT    /api/v1/models/{name}/traffic`  | SetTraffic       | `{weights: {"1": 90, "2": 10}}`|
//! | `PUT    /api/v1/models/{name}/autoscale`| SetAutoscale     | `{min_replicas, max_replicas, policy}`|
//! | `DELETE /api/v1/models/{name}`          | DeleteModel      |                               |
//! | `GET    /api/v1/models`                 | ListModels       |                               |
//! | `GET    /api/v1/models/{name}`          | GetModel         |                               |
//! | `GET    /api/v1/models/{name}/placement`| ExplainPlacement |                               |
//! | `GET    /api/v1/nodes`                  | ListNodes        |                               |
//! | `GET    /api/v1/nodes/{id}`             | GetNode          |                               |
//! | `POST   /api/v1/nodes/{id}/drain`       | DrainNode        |                               |
//! | `POST   /api/v1/nodes/{id}/undrain`     | UndrainNode      |                               |
//! | `GET    /api/v1/placements`             | ListPlacements   |                               |
//! | `GET    /api/v1/cluster`                | GetClusterStatus |                               |
//! | `POST   /api/v1/cluster/members`        | AddMember        | `{id, address}`               |
//! | `DELETE /api/v1/cluster/members/{id}`   | RemoveMember     |                               |
//!
//! Reads take `?consistency=local|linearizable`; the default is `local`, as for gRPC (whose
//! enum's zero value is LOCAL). Every route requires a token ([`require_token`]): GET routes
//! a read-only or admin one, the others an admin one.
//! Errors are `{"error": "..."}` with the status of [`ApiError`]'s HTTP mapping.

use axum::extract::{Path, RawQuery, State};
use axum::http::{Method, Uri};
use axum::routing::{get, post, put};
use axum::{Json, Router, middleware};
use bytes::Bytes;
use nereid_proto::pb::cluster as pb;
use nereid_proto::{message_from_json, message_to_json};
use prost::{Message, Name};

use super::auth::{AuthToken, require_token};
use super::error::ApiError;
use super::service::ManagementService;

type Reply = Result<Json<serde_json::Value>, ApiError>;

fn json<M: Message + Name>(message: &M) -> Json<serde_json::Value> {
    Json(message_to_json(message))
}

/// The REST router, every route behind the token check.
pub fn router(service: ManagementService, token: AuthToken) -> Router {
    Router::new()
        .route("/api/v1/models", get(list_models).post(deploy_model))
        .route(
            "/api/v1/models/{name}",
            get(get_model).put(replace_model).delete(delete_model),
        )
        .route("/api/v1/models/{name}/scale", post(scale_model))
        .route("/api/v1/models/{name}/traffic", put(set_traffic))
        .route("/api/v1/models/{name}/autoscale", put(set_autoscale))
        .route("/api/v1/models/{name}/placement", get(explain_placement))
        .route("/api/v1/nodes", get(list_nodes))
        .route("/api/v1/nodes/{id}", get(get_node))
        .route("/api/v1/nodes/{id}/drain", post(drain_node))
        .route("/api/v1/nodes/{id}/undrain", post(undrain_node))
        .route("/api/v1/placements", get(list_placements))
        .route("/api/v1/cluster", get(cluster_status))
        .route("/api/v1/cluster/members", post(add_member))
        .route(
            "/api/v1/cluster/members/{id}",
            axum::routing::delete(remove_member),
        )
        .fallback(no_route)
        .with_state(service)
        .layer(middleware::from_fn_with_state(token, require_token))
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::NotFound(format!("no management endpoint {method} {}", uri.path()))
}

/// `?consistency=local|linearizable` as the ReadConsistency enum value; other parameters are
/// refused so a typo does not silently give a stale read.
pub(crate) fn consistency(query: Option<String>) -> Result<i32, ApiError> {
    let mut value = pb::ReadConsistency::Local;
    for pair in query
        .as_deref()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (key, v) = pair.split_once('=').unwrap_or((pair, ""));
        if key != "consistency" {
            return Err(ApiError::invalid(
                key,
                "is not a query parameter here; only consistency=local|linearizable is",
            ));
        }
        value = match v.to_ascii_lowercase().as_str() {
            "local" => pb::ReadConsistency::Local,
            "linearizable" => pb::ReadConsistency::Linearizable,
            other => {
                return Err(ApiError::invalid(
                    "consistency",
                    format!("'{other}' is not local or linearizable"),
                ));
            }
        };
    }
    Ok(value as i32)
}

/// Parses a proto-JSON request body; the error names what is wrong in it.
pub(crate) fn body<M: Message + Name + Default>(bytes: &Bytes) -> Result<M, ApiError> {
    let what = M::NAME;
    let text = std::str::from_utf8(bytes)
        .map_err(|e| ApiError::invalid("body", format!("is not UTF-8 text: {e}")))?;
    if text.trim().is_empty() {
        return Err(ApiError::invalid(
            "body",
            format!("is empty; send a JSON {what} object"),
        ));
    }
    message_from_json(text)
        .map_err(|e| ApiError::invalid("body", format!("is not a valid JSON {what}: {e}")))
}

async fn deploy_model(State(s): State<ManagementService>, bytes: Bytes) -> Reply {
    let model: pb::Model = body(&bytes)?;
    let status = s
        .deploy(pb::DeployModelRequest { model: Some(model) })
        .await?;
    Ok(json(&status))
}

async fn replace_model(
    State(s): State<ManagementService>,
    Path(name): Path<String>,
    bytes: Bytes,
) -> Reply {
    let mut model: pb::Model = body(&bytes)?;
    name_from_path(&mut model.name, name)?;
    let status = s
        .deploy(pb::DeployModelRequest { model: Some(model) })
        .await?;
    Ok(json(&status))
}

async fn scale_model(
    State(s): State<ManagementService>,
    Path(name): Path<String>,
    bytes: Bytes,
) -> Reply {
    let mut req: pb::ScaleModelRequest = body(&bytes)?;
    name_from_path(&mut req.name, name)?;
    Ok(json(&s.scale(req).await?))
}

async fn set_traffic(
    State(s): State<ManagementService>,
    Path(name): Path<String>,
    bytes: Bytes,
) -> Reply {
    let mut req: pb::SetTrafficRequest = body(&bytes)?;
    name_from_path(&mut req.name, name)?;
    Ok(json(&s.set_traffic(req).await?))
}

async fn set_autoscale(
    State(s): State<ManagementService>,
    Path(name): Path<String>,
    bytes: Bytes,
) -> Reply {
    let mut req: pb::SetAutoscaleRequest = body(&bytes)?;
    name_from_path(&mut req.name, name)?;
    Ok(json(&s.set_autoscale(req).await?))
}

/// Fills a body's empty `name` from the path; a different name in the body is refused.
pub(crate) fn name_from_path(body_name: &mut String, path: String) -> Result<(), ApiError> {
    if body_name.is_empty() {
        *body_name = path;
        return Ok(());
    }
    if *body_name != path {
        return Err(ApiError::invalid(
            "name",
            format!("'{body_name}' in the body does not match '{path}' in the path"),
        ));
    }
    Ok(())
}

async fn delete_model(State(s): State<ManagementService>, Path(name): Path<String>) -> Reply {
    let req = pb::ModelRef {
        name,
        consistency: 0,
    };
    Ok(json(&s.delete(req).await?))
}

async fn list_models(State(s): State<ManagementService>, RawQuery(q): RawQuery) -> Reply {
    let req = pb::ListModelsRequest {
        consistency: consistency(q)?,
    };
    Ok(json(&s.models(req).await?))
}

async fn get_model(
    State(s): State<ManagementService>,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Reply {
    let req = pb::ModelRef {
        name,
        consistency: consistency(q)?,
    };
    Ok(json(&s.model(req).await?))
}

async fn explain_placement(
    State(s): State<ManagementService>,
    Path(name): Path<String>,
    RawQuery(q): RawQuery,
) -> Reply {
    let req = pb::ModelRef {
        name,
        consistency: consistency(q)?,
    };
    Ok(json(&s.explain(req).await?))
}

async fn list_nodes(State(s): State<ManagementService>, RawQuery(q): RawQuery) -> Reply {
    let req = pb::ListNodesRequest {
        consistency: consistency(q)?,
    };
    Ok(json(&s.nodes(req).await?))
}

async fn get_node(
    State(s): State<ManagementService>,
    Path(id): Path<String>,
    RawQuery(q): RawQuery,
) -> Reply {
    let req = pb::NodeRef {
        id,
        consistency: consistency(q)?,
    };
    Ok(json(&s.node(req).await?))
}

async fn drain_node(State(s): State<ManagementService>, Path(id): Path<String>) -> Reply {
    let req = pb::NodeRef { id, consistency: 0 };
    Ok(json(&s.set_drained(req, true).await?))
}

async fn undrain_node(State(s): State<ManagementService>, Path(id): Path<String>) -> Reply {
    let req = pb::NodeRef { id, consistency: 0 };
    Ok(json(&s.set_drained(req, false).await?))
}

async fn list_placements(State(s): State<ManagementService>, RawQuery(q): RawQuery) -> Reply {
    let req = pb::ListPlacementsRequest {
        consistency: consistency(q)?,
    };
    Ok(json(&s.placements(req).await?))
}

async fn cluster_status(State(s): State<ManagementService>) -> Reply {
    Ok(json(&s.cluster_status()))
}

async fn add_member(State(s): State<ManagementService>, bytes: Bytes) -> Reply {
    let req: pb::AddMemberRequest = body(&bytes)?;
    Ok(json(&s.admit_member(req).await?))
}

async fn remove_member(State(s): State<ManagementService>, Path(id): Path<String>) -> Reply {
    let id = id
        .parse::<u64>()
        .map_err(|_| ApiError::invalid("id", format!("'{id}' is not a numeric member id")))?;
    Ok(json(&s.evict_member(pb::RemoveMemberRequest { id }).await?))
}
