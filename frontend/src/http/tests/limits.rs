//! `--http-max-input-size` and content codings, end to end.

use std::convert::Infallible;
use std::io::{Read, Write};

use axum::http::StatusCode;
use flate2::Compression;
use flate2::read::{GzDecoder, ZlibDecoder};
use flate2::write::{GzEncoder, ZlibEncoder};
use serde_json::json;

use super::*;

const URI: &str = "/v2/models/echo/infer";
const LIMIT: usize = 4096;

fn request_json(count: usize) -> Value {
    json!({"inputs": [{"name": "x", "datatype": "UINT8", "shape": [count], "data": vec![7; count]}]})
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

fn limit_message(prefix: &str) -> String {
    format!(
        "{prefix}request body size exceeds the maximum allowed input size of {LIMIT} bytes. Use --http-max-input-size to increase the limit."
    )
}

#[tokio::test]
async fn oversized_body_with_content_length() {
    let (mock, app) = app_with(fake(), LIMIT);
    let body = vec![b' '; LIMIT + 1];
    let request = Request::post(URI)
        .header("content-length", body.len())
        .body(Body::from(body))
        .unwrap();
    let reply = send(&app, request).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.error(), limit_message(""));
    assert!(mock.requests().is_empty());
}

#[tokio::test]
async fn oversized_streamed_body_without_content_length() {
    let (_, app) = app_with(fake(), LIMIT);
    let chunks = (0..10).map(|_| Ok::<_, Infallible>(Bytes::from(vec![b' '; 1000])));
    let request = Request::post(URI)
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .unwrap();
    let reply = send(&app, request).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.error(), limit_message(""));
}

#[tokio::test]
async fn body_at_the_limit_is_accepted() {
    let (_, app) = app_with(fake(), LIMIT);
    let mut body = request_json(4).to_string().into_bytes();
    body.resize(LIMIT, b' ');
    let chunks = body
        .chunks(1000)
        .map(|c| Ok::<_, Infallible>(Bytes::copy_from_slice(c)))
        .collect::<Vec<_>>();
    let request = Request::post(URI)
        .body(Body::from_stream(futures::stream::iter(chunks)))
        .unwrap();
    assert_eq!(send(&app, request).await.status, StatusCode::OK);
}

#[tokio::test]
async fn gzip_bomb_is_stopped_at_the_limit() {
    let (_, app) = app_with(fake(), LIMIT);
    // 1 MB of zeros compresses to about 1 KB: under the limit as sent, 250 times it inflated.
    let bomb = gzip(&vec![0u8; 1_000_000]);
    assert!(bomb.len() < LIMIT);
    let request = Request::post(URI)
        .header("content-encoding", "gzip")
        .body(Body::from(bomb))
        .unwrap();
    let reply = send(&app, request).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(reply.error(), limit_message("decompressed "));
}

#[tokio::test]
async fn gzip_and_deflate_requests_are_decompressed() {
    let (mock, app) = app();
    let json = request_json(3).to_string();
    let request = Request::post(URI)
        .header("content-encoding", "gzip")
        .body(Body::from(gzip(json.as_bytes())))
        .unwrap();
    let reply = send(&app, request).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["outputs"][0]["data"], json!([7, 7, 7]));

    let mut encoder = ZlibEncoder::new(Vec::new(), Compression::default());
    encoder.write_all(json.as_bytes()).unwrap();
    let request = Request::post(URI)
        .header("content-encoding", "deflate")
        .body(Body::from(encoder.finish().unwrap()))
        .unwrap();
    assert_eq!(send(&app, request).await.status, StatusCode::OK);
    assert!(!mock.requests().is_empty());

    // Binary extension inside a compressed body: the header length counts decompressed bytes.
    let header = json!({"inputs": [{"name": "x", "datatype": "UINT8", "shape": [2], "parameters": {"binary_data_size": 2}}]}).to_string();
    let mut plain = header.clone().into_bytes();
    plain.extend_from_slice(&[9, 8]);
    let request = Request::post(URI)
        .header("content-encoding", "gzip")
        .header("inference-header-content-length", header.len())
        .body(Body::from(gzip(&plain)))
        .unwrap();
    let reply = send(&app, request).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["outputs"][0]["data"], json!([9, 8]));
}

#[tokio::test]
async fn corrupt_or_unknown_codings_are_refused() {
    let (_, app) = app();
    let request = Request::post(URI)
        .header("content-encoding", "gzip")
        .body(Body::from("not gzip"))
        .unwrap();
    let reply = send(&app, request).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert!(
        reply
            .error()
            .starts_with("failed to decompress the request body")
    );

    let request = Request::post(URI)
        .header("content-encoding", "br")
        .body(Body::from("{}"))
        .unwrap();
    let reply = send(&app, request).await;
    assert_eq!(reply.status, StatusCode::NOT_IMPLEMENTED);
    assert_eq!(reply.header("accept-encoding"), Some("gzip, deflate"));
    assert!(reply.error().contains("'br'"));
}

#[tokio::test]
async fn responses_are_compressed_per_accept_encoding() {
    let (_, app) = app();
    let json = request_json(100);
    let plain = send(&app, post_json(URI, &json)).await;
    assert!(plain.header("content-encoding").is_none());

    let request = |accept: &str| {
        Request::post(URI)
            .header("accept-encoding", accept)
            .body(Body::from(json.to_string()))
            .unwrap()
    };
    let reply = send(&app, request("deflate;q=0.5, gzip")).await;
    assert_eq!(reply.header("content-encoding"), Some("gzip"));
    assert_eq!(reply.header("content-type"), Some("application/json"));
    let mut unpacked = Vec::new();
    GzDecoder::new(&reply.body[..])
        .read_to_end(&mut unpacked)
        .unwrap();
    assert_eq!(unpacked, plain.body);

    let reply = send(&app, request("gzip;q=0.1, deflate;q=0.9")).await;
    assert_eq!(reply.header("content-encoding"), Some("deflate"));
    let mut unpacked = Vec::new();
    ZlibDecoder::new(&reply.body[..])
        .read_to_end(&mut unpacked)
        .unwrap();
    assert_eq!(unpacked, plain.body);

    let reply = send(&app, request("br")).await;
    assert!(reply.header("content-encoding").is_none());
    assert_eq!(reply.body, plain.body);
}

#[tokio::test]
async fn compressed_binary_response_keeps_the_header_length() {
    let (_, app) = app();
    let json =
        json!({"parameters": {"binary_data_output": true}, "inputs": request_json(5)["inputs"]});
    let request = Request::post(URI)
        .header("accept-encoding", "gzip")
        .body(Body::from(json.to_string()))
        .unwrap();
    let reply = send(&app, request).await;
    let header_len = reply.binary_header_len();
    let mut unpacked = Vec::new();
    GzDecoder::new(&reply.body[..])
        .read_to_end(&mut unpacked)
        .unwrap();
    assert_eq!(&unpacked[header_len..], &[7u8; 5]);
}
