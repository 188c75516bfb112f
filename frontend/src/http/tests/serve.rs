//! Through a real hyper server on port 0 (what `oneshot` skips): framing of chunked responses
//! and chunked uploads.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;

/// Serves the mock router on an ephemeral port and returns its address.
async fn serve(max_input_size: usize) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_, app) = app_with(fake(), max_input_size);
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Sends raw HTTP/1.1 bytes and reads until the server closes: (head, body).
async fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> (String, Vec<u8>) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("response head");
    let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
    (head, response[split + 4..].to_vec())
}

#[tokio::test]
async fn binary_response_has_content_length_over_the_wire() {
    let addr = serve(1 << 20).await;
    let json = r#"{"inputs":[{"name":"x","datatype":"UINT8","shape":[3],"data":[1,2,3]}],"outputs":[{"name":"y","parameters":{"binary_data":true}}]}"#;
    let request = format!(
        "POST /v2/models/echo/infer HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{json}",
        json.len()
    );
    let (head, body) = exchange(addr, request.as_bytes()).await;
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(
        head.contains(&format!("content-length: {}", body.len())),
        "{head}"
    );
    assert!(!head.contains("transfer-encoding"), "{head}");
    assert!(head.contains("inference-header-content-length:"), "{head}");
    assert_eq!(&body[body.len() - 3..], &[1, 2, 3]);
}

#[tokio::test]
async fn chunked_upload_over_the_limit_is_refused() {
    let addr = serve(64).await;
    let chunk = "x".repeat(50);
    let request = format!(
        "POST /v2/models/echo/infer HTTP/1.1\r\nhost: x\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n32\r\n{chunk}\r\n32\r\n{chunk}\r\n0\r\n\r\n"
    );
    let (head, body) = exchange(addr, request.as_bytes()).await;
    assert!(head.starts_with("http/1.1 400"), "{head}");
    let error: Value = serde_json::from_slice(&body).unwrap();
    assert!(
        error["error"]
            .as_str()
            .unwrap()
            .contains("maximum allowed input size of 64 bytes")
    );
}

/// The fake service's gRPC port, spawned as `nereid_frontend::spawn` serves it, with or
/// without the HTTP API on it; a channel to it, and the sender that stops it.
async fn grpc_port(
    http_on_grpc_port: bool,
) -> (
    tonic::transport::Channel,
    tokio::sync::watch::Sender<bool>,
    tokio::task::JoinSet<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop) = tokio::sync::watch::channel(false);
    let mut servers = tokio::task::JoinSet::new();
    crate::spawn(
        &mut servers,
        Arc::new(fake()),
        crate::Frontends {
            http: None,
            grpc: Some(listener),
            metrics: None,
            http_config: HttpConfig::default(),
            grpc_config: crate::GrpcConfig::default(),
            ports: crate::PortsConfig::default(),
            http_on_grpc_port,
        },
        &stop,
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    (channel, stop_tx, servers)
}

/// POSTs `body` to `path` on `channel` as an HTTP/2 request (what the router does under
/// cluster TLS).
async fn post_h2(
    channel: &mut tonic::transport::Channel,
    path: &str,
    body: &'static str,
) -> axum::http::Response<tonic::body::Body> {
    use tonic::codegen::Service;
    let request = Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/json")
        .body(tonic::body::Body::new(http_body_util::Full::new(
            Bytes::from_static(body.as_bytes()),
        )))
        .unwrap();
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .unwrap();
    channel.call(request).await.unwrap()
}

/// A gRPC port spawned with `http_on_grpc_port` (a worker under cluster TLS): HTTP/2 requests
/// under `/v2/` reach the HTTP routes, with their JSON body intact, while gRPC calls on the
/// same connection still reach the gRPC services.
#[tokio::test]
async fn a_grpc_port_with_the_http_api_answers_both() {
    use nereid_proto::pb::inference::ServerLiveRequest;
    use nereid_proto::pb::inference::grpc_inference_service_client::GrpcInferenceServiceClient;

    let (mut channel, stop_tx, mut servers) = grpc_port(true).await;
    let json = r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1.5,2.5]}]}"#;
    let response = post_h2(&mut channel, "/v2/models/echo/versions/1/infer", json).await;
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["model_name"], "echo", "{answer}");
    assert_eq!(answer["outputs"][0]["data"], serde_json::json!([1.5, 2.5]));

    let live = GrpcInferenceServiceClient::new(channel)
        .server_live(ServerLiveRequest {})
        .await
        .unwrap();
    assert!(live.into_inner().live);
    stop_tx.send(true).unwrap();
    while servers.join_next().await.is_some() {}
}

/// Without the option the gRPC port has no HTTP routes: tonic answers UNIMPLEMENTED.
#[tokio::test]
async fn a_plain_grpc_port_has_no_http_api() {
    let (mut channel, _stop_tx, _servers) = grpc_port(false).await;
    let response = post_h2(&mut channel, "/v2/models/echo/infer", "{}").await;
    assert_eq!(response.headers()["grpc-status"], "12", "{response:?}");
}
