//! The REST mirror and the gRPC service over a socket: status codes, `{"error"}` bodies, the
//! token check, and the leader named on refusals. Helpers come from `tests.rs`.

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use http::{Request as HttpRequest, StatusCode};
use nereid_proto::pb::cluster as pb;
use tower::ServiceExt;

use super::rest::router;
use super::tests::{TOKEN, model, repo, setup};
use super::*;
use crate::consensus::Consensus;
use crate::consensus::memory::MemoryConsensus;
use crate::state::{Command, VersionPolicy};
use crate::testing::node;

struct Rest {
    router: axum::Router,
    consensus: Arc<MemoryConsensus>,
}

impl Rest {
    fn new() -> Self {
        let (svc, consensus) = setup();
        Rest {
            router: router(svc, AuthToken::from_value(TOKEN).unwrap()),
            consensus,
        }
    }

    async fn call(&self, method: &str, uri: &str, body: &str) -> (StatusCode, serde_json::Value) {
        self.call_with(method, uri, body, Some(TOKEN)).await
    }

    async fn call_with(
        &self,
        method: &str,
        uri: &str,
        body: &str,
        token: Option<&str>,
    ) -> (StatusCode, serde_json::Value) {
        let mut req = HttpRequest::builder().method(method).uri(uri);
        if let Some(t) = token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let response = self
            .router
            .clone()
            .oneshot(req.body(Body::from(body.to_string())).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let json = if bytes.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                panic!(
                    "{method} {uri}: not JSON ({e}): {}",
                    String::from_utf8_lossy(&bytes)
                )
            })
        };
        (status, json)
    }
}

fn error_of(json: &serde_json::Value) -> &str {
    json["error"].as_str().expect("an error body")
}

fn model_json(name: &str, dir: &Path) -> String {
    let m = model(name, dir, VersionPolicy::Latest { n: 1 });
    nereid_proto::message_to_json(&m).to_string()
}

#[tokio::test]
async fn rest_models() {
    let rest = Rest::new();
    let dir = repo(&[1, 2]);
    let (code, json) = rest
        .call("POST", "/api/v1/models", &model_json("m", dir.path()))
        .await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(
        json["model"]["available_versions"],
        serde_json::json!([1, 2])
    );
    assert_eq!(json["model"]["version_policy"]["latest"]["num_versions"], 1);
    assert_eq!(json["revision"], 1);

    let (code, json) = rest.call("GET", "/api/v1/models/m", "").await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(json["model"]["name"], "m");
    let (code, json) = rest
        .call("GET", "/api/v1/models?consistency=linearizable", "")
        .await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(json["models"][0]["model"]["name"], "m");

    let (code, json) = rest.call("GET", "/api/v1/models/zz", "").await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(error_of(&json), "model 'zz' not found");

    let (code, json) = rest.call("POST", "/api/v1/models", "{\"name\": ").await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(error_of(&json).contains("body"), "{json}");
    let (code, json) = rest
        .call("POST", "/api/v1/models", "{\"nme\": \"m\"}")
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(error_of(&json).contains("nme"), "{json}");
    let (code, json) = rest.call("POST", "/api/v1/models", "").await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(error_of(&json).contains("empty"), "{json}");

    let mut bad = model("m", dir.path(), VersionPolicy::Latest { n: 0 });
    bad.min_replicas = 1;
    let (code, json) = rest
        .call(
            "PUT",
            "/api/v1/models/m",
            &nereid_proto::message_to_json(&bad).to_string(),
        )
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(error_of(&json).contains("version_policy"), "{json}");

    let (code, json) = rest
        .call("PUT", "/api/v1/models/other", &model_json("m", dir.path()))
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(error_of(&json).contains("does not match"), "{json}");
    let (code, json) = rest
        .call("PUT", "/api/v1/models/m2", &model_json("", dir.path()))
        .await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(json["model"]["name"], "m2");

    let (code, json) = rest
        .call(
            "POST",
            "/api/v1/models/m/scale",
            r#"{"min_replicas": 2, "max_replicas": 3}"#,
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(json["model"]["min_replicas"], 2);
    let (code, _) = rest
        .call(
            "POST",
            "/api/v1/models/zz/scale",
            r#"{"min_replicas": 1, "max_replicas": 1}"#,
        )
        .await;
    assert_eq!(code, StatusCode::NOT_FOUND);

    let (code, json) = rest.call("GET", "/api/v1/models/m/placement", "").await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(json["model"], "m");
    assert_eq!(json["pending"][0]["action"], "unplaced", "{json}");

    let (code, json) = rest.call("DELETE", "/api/v1/models/m", "").await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert!(json["revision"].as_u64().unwrap() > 1);
    let (code, _) = rest.call("DELETE", "/api/v1/models/m", "").await;
    assert_eq!(code, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn rest_nodes_placements_and_cluster() {
    let rest = Rest::new();
    rest.consensus
        .write(Command::RegisterNode(node("a")))
        .await
        .unwrap();
    let (code, json) = rest.call("GET", "/api/v1/nodes", "").await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(json["nodes"][0]["node"]["status"], "NODE_STATUS_UP");
    let (code, json) = rest
        .call("GET", "/api/v1/nodes/a?consistency=local", "")
        .await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(json["node"]["id"], "a");
    let (code, json) = rest.call("POST", "/api/v1/nodes/a/drain", "").await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(json["node"]["drained"], true);
    let (code, json) = rest.call("POST", "/api/v1/nodes/a/undrain", "").await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(json["node"]["drained"], false);
    let (code, json) = rest.call("POST", "/api/v1/nodes/zz/drain", "").await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert_eq!(error_of(&json), "node 'zz' not found");

    let (code, json) = rest.call("GET", "/api/v1/placements", "").await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(json["replicas"], serde_json::json!([]));
    let (code, json) = rest
        .call("GET", "/api/v1/placements?consistency=eventual", "")
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(error_of(&json).contains("consistency"), "{json}");
    let (code, json) = rest.call("GET", "/api/v1/placements?limit=3", "").await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(error_of(&json).contains("limit"), "{json}");

    let (code, json) = rest.call("GET", "/api/v1/cluster", "").await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(json["leader_id"], 1);
    let (code, json) = rest
        .call(
            "POST",
            "/api/v1/cluster/members",
            r#"{"id": 2, "address": "cp-2:7000"}"#,
        )
        .await;
    assert_eq!(code, StatusCode::CONFLICT, "{json}");
    let (code, json) = rest.call("DELETE", "/api/v1/cluster/members/two", "").await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert!(error_of(&json).contains("id"), "{json}");

    let (code, json) = rest.call("GET", "/api/v1/nothing", "").await;
    assert_eq!(code, StatusCode::NOT_FOUND);
    assert!(error_of(&json).contains("/api/v1/nothing"), "{json}");

    rest.consensus.set_leader(Some(2));
    let (code, json) = rest.call("POST", "/api/v1/nodes/a/drain", "").await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    assert!(error_of(&json).contains("leader"), "{json}");
}

#[tokio::test]
async fn rest_requires_the_token() {
    let rest = Rest::new();
    let (code, json) = rest.call_with("GET", "/api/v1/models", "", None).await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    assert!(error_of(&json).contains("authorization: Bearer"), "{json}");
    let (code, json) = rest
        .call_with("GET", "/api/v1/models", "", Some("guess"))
        .await;
    assert_eq!(code, StatusCode::UNAUTHORIZED);
    assert!(!error_of(&json).contains("guess"));
    let (code, _) = rest.call_with("GET", "/api/v1/nothing", "", None).await;
    assert_eq!(
        code,
        StatusCode::UNAUTHORIZED,
        "unknown routes are behind the token too"
    );

    let (svc, _) = setup();
    let open = Rest {
        router: router(svc, AuthToken::disabled()),
        consensus: rest.consensus.clone(),
    };
    let (code, _) = open.call_with("GET", "/api/v1/models", "", None).await;
    assert_eq!(code, StatusCode::OK);
}

fn authed<T>(msg: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    req
}

#[tokio::test]
async fn grpc_over_a_socket_checks_the_token_and_names_the_leader() {
    use pb::management_client::ManagementClient;
    use pb::management_server::ManagementServer;

    let (svc, consensus) = setup();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(
                AuthToken::from_value(TOKEN)
                    .unwrap()
                    .guard(auth::Scope::Management, ManagementServer::new(svc)),
            )
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut client = ManagementClient::connect(format!("http://{addr}"))
        .await
        .unwrap();

    let status = client
        .list_models(pb::ListModelsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    assert!(status.message().contains("authorization: Bearer <token>"));

    let dir = repo(&[1]);
    let deployed = client
        .deploy_model(authed(pb::DeployModelRequest {
            model: Some(model("m", dir.path(), VersionPolicy::All)),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(deployed.model.unwrap().available_versions, vec![1]);

    let status = client
        .get_model(authed(pb::ModelRef {
            name: "zz".into(),
            consistency: 0,
        }))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);

    consensus.set_leader(Some(2));
    let status = client
        .drain_node(authed(pb::NodeRef {
            id: "a".into(),
            consistency: 0,
        }))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(status.message().contains("node 2"), "{}", status.message());
    server.abort();
}

#[tokio::test]
async fn rest_traffic_split() {
    let rest = Rest::new();
    let dir = repo(&[1, 2]);
    let m = model("m", dir.path(), VersionPolicy::All);
    let (code, json) = rest
        .call(
            "POST",
            "/api/v1/models",
            &nereid_proto::message_to_json(&m).to_string(),
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(json["model"]["served_versions"], serde_json::json!([1, 2]));

    let (code, json) = rest
        .call(
            "PUT",
            "/api/v1/models/m/traffic",
            r#"{"weights": {"1": 90, "2": 10}}"#,
        )
        .await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(
        json["model"]["traffic"],
        serde_json::json!({"1": 90, "2": 10})
    );

    let (code, json) = rest
        .call(
            "PUT",
            "/api/v1/models/m/traffic",
            r#"{"weights": {"3": 1}}"#,
        )
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST);
    assert_eq!(
        error_of(&json),
        "invalid traffic: version 3 is not served by the model's version policy (served: 1, 2) (model 'm')"
    );
    let (code, json) = rest
        .call(
            "PUT",
            "/api/v1/models/m/traffic",
            r#"{"weights": {"x": 1}}"#,
        )
        .await;
    assert_eq!(code, StatusCode::BAD_REQUEST, "{json}");
    let (code, _) = rest
        .call(
            "PUT",
            "/api/v1/models/zz/traffic",
            r#"{"weights": {"1": 1}}"#,
        )
        .await;
    assert_eq!(code, StatusCode::NOT_FOUND);

    let (code, json) = rest.call("PUT", "/api/v1/models/m/traffic", "{}").await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert!(
        json["model"].get("traffic").is_none() || json["model"]["traffic"] == serde_json::json!({}),
        "{json}"
    );
}
