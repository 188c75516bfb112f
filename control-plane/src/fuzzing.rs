//! Entry points for the coverage-guided fuzz targets under `fuzz/` (not an API; hidden from the
//! docs, and nothing in the server calls them).
//!
//! [`rest_request`] takes a management REST request's body the way its route does
//! (`api::rest`: UTF-8 and proto-JSON parsing into the request message, the path's name), then
//! the pure steps the service takes before it writes: the model's validation, and the command
//! applied to a registry that holds model `m`. Every command the registry accepts must come
//! back unchanged from the JSON the replicated log stores it as.

use bytes::Bytes;
use nereid_proto::pb::cluster as pb;

use crate::api::rest::{body, consistency, name_from_path};
use crate::convert::{model_from_pb, model_to_pb};
use crate::state::{ClusterState, Command, ModelSpec, Resources, VersionPolicy};

/// Which route's body [`rest_request`] parses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestRoute {
    /// `POST /api/v1/models` (`path` ignored) and `PUT /api/v1/models/{path}`: a `Model`.
    DeployModel,
    /// `POST /api/v1/models/{path}/scale`: a `ScaleModelRequest`.
    ScaleModel,
    /// `PUT /api/v1/models/{path}/traffic`: a `SetTrafficRequest`.
    SetTraffic,
    /// `POST /api/v1/cluster/members`: an `AddMemberRequest`.
    AddMember,
    /// A read's query string (`?consistency=...`); the body is the query.
    ReadQuery,
}

/// Handles one request body for `route`, `path` being the `{name}` path segment. `Err` is the
/// refusal a client would read; a panic or a failed round trip is a bug.
pub fn rest_request(route: RestRoute, path: Option<&str>, bytes: &[u8]) -> Result<(), String> {
    let bytes = Bytes::copy_from_slice(bytes);
    let mut state = registry();
    match route {
        RestRoute::DeployModel => {
            let mut model: pb::Model = body(&bytes).map_err(|e| e.to_string())?;
            if let Some(path) = path {
                name_from_path(&mut model.name, path.to_string()).map_err(|e| e.to_string())?;
            }
            let spec = model_from_pb(model).map_err(|e| e.to_string())?;
            let again = model_from_pb(model_to_pb(&spec))
                .map_err(|e| format!("an accepted model does not read back: {e}"));
            assert_eq!(again.as_ref(), Ok(&spec), "model_to_pb round trip");
            apply(&mut state, Command::UpsertModel(spec))
        }
        RestRoute::ScaleModel => {
            let mut req: pb::ScaleModelRequest = body(&bytes).map_err(|e| e.to_string())?;
            name_from_path(&mut req.name, path.unwrap_or("m").to_string())
                .map_err(|e| e.to_string())?;
            apply(
                &mut state,
                Command::ScaleModel {
                    name: req.name,
                    min: req.min_replicas,
                    max: req.max_replicas,
                },
            )
        }
        RestRoute::SetTraffic => {
            let mut req: pb::SetTrafficRequest = body(&bytes).map_err(|e| e.to_string())?;
            name_from_path(&mut req.name, path.unwrap_or("m").to_string())
                .map_err(|e| e.to_string())?;
            apply(
                &mut state,
                Command::SetTraffic {
                    name: req.name,
                    weights: req.weights.into_iter().collect(),
                },
            )
        }
        RestRoute::AddMember => body::<pb::AddMemberRequest>(&bytes)
            .map(drop)
            .map_err(|e| e.to_string()),
        RestRoute::ReadQuery => {
            let query = std::str::from_utf8(&bytes).map_err(|e| e.to_string())?;
            consistency(Some(query.to_string()))
                .map(drop)
                .map_err(|e| e.to_string())
        }
    }
}

/// A registry holding model `m` (versions 1 and 2), so scale and traffic requests reach the
/// state machine's own checks.
fn registry() -> ClusterState {
    let mut state = ClusterState::new();
    let model = ModelSpec {
        name: "m".into(),
        source: "file:///models/m".into(),
        version_policy: VersionPolicy::All,
        config_override: None,
        min_replicas: 1,
        max_replicas: 2,
        resources: Resources::default(),
        labels: Default::default(),
        available_versions: vec![1, 2],
        traffic: Default::default(),
    };
    #[allow(clippy::expect_used, reason = "a fixed, valid model")]
    state
        .apply(Command::UpsertModel(model))
        .expect("the fixed model is valid");
    state
}

/// Applies `command`; an accepted one must survive the replicated log's JSON unchanged.
fn apply(state: &mut ClusterState, command: Command) -> Result<(), String> {
    state.apply(command.clone()).map_err(|e| e.to_string())?;
    let logged = serde_json::to_vec(&command);
    let replayed = logged
        .as_ref()
        .map_err(ToString::to_string)
        .and_then(|entry| serde_json::from_slice::<Command>(entry).map_err(|e| e.to_string()));
    assert_eq!(
        replayed,
        Ok(command),
        "an accepted command must replay from its log entry"
    );
    Ok(())
}
