//! Tokens with roles through both transports: a read-only token reads and is refused every
//! write with 403 / PERMISSION_DENIED naming its role and the operation, a cluster token has
//! no management access, a wrong token is 401 / UNAUTHENTICATED, and a rotated tokens file
//! takes effect without a restart. Unit tests of the check itself are in `auth/tests.rs`.

use std::path::Path;
use std::time::Duration;

use axum::body::Body;
use http::{Request as HttpRequest, StatusCode};
use nereid_proto::pb::cluster as pb;
use tower::ServiceExt;

use super::auth::Scope;
use super::rest::router;
use super::tests::{model, repo, setup};
use super::*;
use crate::state::VersionPolicy;

const TOKENS: &str = "\
# role      name        secret
admin       ops         adm1n-secret
read-only   ci-reader   r3ad-secret
cluster     workers     clust3r-secret
";

/// Tokens from a file in `dir`, checked for changes on every request.
fn tokens(dir: &Path) -> (AuthToken, std::path::PathBuf) {
    let path = dir.join("tokens");
    std::fs::write(&path, TOKENS).unwrap();
    let auth = AuthToken::from_tokens_file_every(&path, None, Duration::ZERO).unwrap();
    (auth, path)
}

async fn call(
    app: &axum::Router,
    method: &str,
    uri: &str,
    body: String,
    secret: &str,
) -> (StatusCode, serde_json::Value) {
    let req = HttpRequest::builder()
        .method(method)
        .uri(uri)
        .header("authorization", format!("Bearer {secret}"))
        .body(Body::from(body))
        .unwrap();
    let response = app.clone().oneshot(req).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, json)
}

fn model_json(name: &str, dir: &Path) -> String {
    let m = model(name, dir, VersionPolicy::Latest { n: 1 });
    nereid_proto::message_to_json(&m).to_string()
}

#[tokio::test]
async fn rest_read_only_tokens_read_and_are_refused_every_write() {
    let dir = tempfile::tempdir().unwrap();
    let (auth, _) = tokens(dir.path());
    let (svc, _) = setup();
    let app = router(svc, auth);
    let models = repo(&[1]);
    let (code, json) = call(
        &app,
        "POST",
        "/api/v1/models",
        model_json("m", models.path()),
        "adm1n-secret",
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{json}");

    for uri in [
        "/api/v1/models",
        "/api/v1/models/m",
        "/api/v1/models/m/placement",
        "/api/v1/nodes",
        "/api/v1/placements",
        "/api/v1/cluster",
    ] {
        let (code, json) = call(&app, "GET", uri, String::new(), "r3ad-secret").await;
        assert_eq!(code, StatusCode::OK, "GET {uri}: {json}");
    }

    let writes = [
        (
            "POST",
            "/api/v1/models",
            model_json("n", models.path()),
            "DeployModel",
        ),
        (
            "PUT",
            "/api/v1/models/m",
            model_json("m", models.path()),
            "DeployModel",
        ),
        (
            "POST",
            "/api/v1/models/m/scale",
            r#"{"min_replicas": 0}"#.into(),
            "ScaleModel",
        ),
        (
            "PUT",
            "/api/v1/models/m/traffic",
            r#"{"weights": {"1": 100}}"#.into(),
            "SetTraffic",
        ),
        ("DELETE", "/api/v1/models/m", String::new(), "DeleteModel"),
        ("POST", "/api/v1/nodes/a/drain", String::new(), "DrainNode"),
        (
            "POST",
            "/api/v1/nodes/a/undrain",
            String::new(),
            "UndrainNode",
        ),
        (
            "POST",
            "/api/v1/cluster/members",
            r#"{"id": 2, "address": "x:1"}"#.into(),
            "AddMember",
        ),
        (
            "DELETE",
            "/api/v1/cluster/members/2",
            String::new(),
            "RemoveMember",
        ),
    ];
    for (method, uri, body, rpc) in writes {
        let (code, json) = call(&app, method, uri, body, "r3ad-secret").await;
        assert_eq!(code, StatusCode::FORBIDDEN, "{method} {uri}: {json}");
        assert_eq!(
            json["error"],
            format!("token 'ci-reader' has role read-only; {rpc} needs admin"),
            "{method} {uri}"
        );
    }
    // The refused delete did nothing.
    let (code, json) = call(
        &app,
        "GET",
        "/api/v1/models/m",
        String::new(),
        "r3ad-secret",
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{json}");
    assert_eq!(json["model"]["name"], "m");

    let (code, json) = call(
        &app,
        "GET",
        "/api/v1/models",
        String::new(),
        "clust3r-secret",
    )
    .await;
    assert_eq!(code, StatusCode::FORBIDDEN, "{json}");
    assert_eq!(
        json["error"],
        "token 'workers' has role cluster; ListModels needs read-only or admin"
    );
    let (code, json) = call(&app, "GET", "/api/v1/models", String::new(), "r3ad-secre").await;
    assert_eq!(code, StatusCode::UNAUTHORIZED, "{json}");
    assert!(!json.to_string().contains("r3ad"), "{json}");
}

#[tokio::test]
async fn rest_tokens_rotate_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (auth, path) = tokens(dir.path());
    let (svc, _) = setup();
    let app = router(svc, auth);
    let get = |secret: &'static str| {
        let app = app.clone();
        async move {
            call(&app, "GET", "/api/v1/models", String::new(), secret)
                .await
                .0
        }
    };
    assert_eq!(get("r3ad-secret").await, StatusCode::OK);

    std::fs::write(
        &path,
        "admin ops adm1n-secret\nread-only ci-reader n3w-reader-secret\n",
    )
    .unwrap();
    assert_eq!(get("n3w-reader-secret").await, StatusCode::OK);
    assert_eq!(get("r3ad-secret").await, StatusCode::UNAUTHORIZED);

    // A broken file is refused and the tokens in use stay.
    std::fs::write(&path, "admin ops adm1n-secret\nread-only ci-reader\n").unwrap();
    assert_eq!(get("n3w-reader-secret").await, StatusCode::OK);
    assert_eq!(get("adm1n-secret").await, StatusCode::OK);
}

fn with_token<T>(msg: T, secret: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut()
        .insert("authorization", format!("Bearer {secret}").parse().unwrap());
    req
}

#[tokio::test]
async fn grpc_roles_over_a_socket() {
    use pb::management_client::ManagementClient;
    use pb::management_server::ManagementServer;

    let dir = tempfile::tempdir().unwrap();
    let (auth, _) = tokens(dir.path());
    let (svc, _) = setup();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(auth.guard(Scope::Management, ManagementServer::new(svc)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut client = ManagementClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let models = repo(&[1]);
    let deploy = |secret| {
        with_token(
            pb::DeployModelRequest {
                model: Some(model("m", models.path(), VersionPolicy::All)),
            },
            secret,
        )
    };

    let status = client
        .deploy_model(deploy("r3ad-secret"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert_eq!(
        status.message(),
        "token 'ci-reader' has role read-only; DeployModel needs admin"
    );
    client.deploy_model(deploy("adm1n-secret")).await.unwrap();
    let listed = client
        .list_models(with_token(pb::ListModelsRequest::default(), "r3ad-secret"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.models.len(), 1);
    let status = client
        .explain_placement(with_token(
            pb::ModelRef {
                name: "m".into(),
                consistency: 0,
            },
            "clust3r-secret",
        ))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    assert!(
        status
            .message()
            .contains("ExplainPlacement needs read-only or admin"),
        "{}",
        status.message()
    );
    let status = client
        .list_models(with_token(pb::ListModelsRequest::default(), "guess"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    server.abort();
}
