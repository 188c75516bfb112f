//! Forwarding an HTTP inference request's bytes to a worker (the HTTP pass-through): to its
//! HTTP port through one pooled hyper HTTP/1.1 client, keeping connections alive per worker
//! address, opened lazily and shared by every request; or, under cluster TLS, as an HTTP/2
//! request on the mutual-TLS connection the router's gRPC calls to that worker use (the
//! worker's gRPC port serves the HTTP API for `/v2/` paths, its HTTP port being outside the
//! cluster's TLS).
//!
//! ```text
//! body (as read and decompressed by the frontend's body rule)
//!   + Content-Type, Inference-Header-Content-Length, Accept-Encoding
//!   + traceparent / tracestate of this attempt's span
//!   ─► POST http://<worker http addr>/v2/models/<m>/versions/<v>/infer
//!      (cluster TLS: POST https://<worker grpc addr>/v2/..., on the gRPC channel)
//! ◄─ 503 from the worker      RouterError::Worker(Unavailable): retried like a gRPC UNAVAILABLE
//! ◄─ 404 "Request for unknown model" from the worker (it unloaded a replica the table still
//!                             shows): RouterError::Worker(NotFound), retried as over gRPC
//! ◄─ any other answer         status, Content-Type, Inference-Header-Content-Length,
//!                             Content-Encoding and body as the worker sent them
//! ◄─ no answer                RouterError::Unreachable (retried, the replica ejected)
//! ```

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use bytes::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use nereid_cluster_client::error_chain;
use nereid_proto::{RequestContext, ServiceError, TRACEPARENT, TRACESTATE};

use crate::error::{RouterError, RouterResult, is_unknown_model};
use crate::forward::{ForwardConfig, Workers};
use crate::table::Endpoint;

/// Client request headers the worker needs to read the body as the client meant it.
const REQUEST_HEADERS: [&str; 3] = [
    "content-type",
    "inference-header-content-length",
    "accept-encoding",
];
/// Worker response headers the client needs to read the answer.
const RESPONSE_HEADERS: [&str; 3] = [
    "content-type",
    "inference-header-content-length",
    "content-encoding",
];
/// How long an idle connection to a worker is kept.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// How HTTP inference reaches workers.
pub enum HttpWorkers {
    /// The pooled HTTP client to workers' HTTP ports (boxed: it is 300 bytes, the other
    /// variant a pointer).
    Plain(Box<Client<HttpConnector, Body>>),
    /// Cluster TLS: the gRPC connections of `Workers`, to workers' gRPC ports.
    OverGrpc(Arc<Workers>),
}

impl HttpWorkers {
    /// Plaintext HTTP to workers' HTTP ports, or, when `config` dials with cluster TLS, HTTP/2
    /// on `workers`' channels.
    pub fn new(config: &ForwardConfig, workers: Arc<Workers>) -> HttpWorkers {
        if config.dial.is_tls() {
            return HttpWorkers::OverGrpc(workers);
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(config.connect_timeout));
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(IDLE_TIMEOUT)
            .build(connector);
        HttpWorkers::Plain(Box::new(client))
    }

    /// Where HTTP inference for `target` goes: its HTTP address (`None` when it reports none),
    /// or under cluster TLS its gRPC address.
    pub fn address<'a>(&self, target: &'a Endpoint) -> Option<&'a str> {
        match self {
            HttpWorkers::Plain(_) => target.http_addr.as_deref(),
            HttpWorkers::OverGrpc(_) => Some(&target.addr),
        }
    }

    /// Sends `body` to `path` on the worker at `addr` (`host:port`) with the client's
    /// `headers` that matter and this attempt's trace context; the answer as the worker gave
    /// it, except a 503, which is an error so that the caller may retry elsewhere.
    pub async fn infer(
        &self,
        addr: &str,
        path: &str,
        headers: &HeaderMap,
        context: &RequestContext,
        body: Bytes,
    ) -> RouterResult<Response<Body>> {
        let unreachable = |message: String| RouterError::Unreachable {
            addr: addr.to_string(),
            message,
        };
        let uri = match self {
            HttpWorkers::Plain(_) => format!("http://{addr}{path}"),
            // The channel sets the scheme and authority of its worker.
            HttpWorkers::OverGrpc(_) => path.to_string(),
        };
        let mut request = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .body(Body::from(body))
            .map_err(|e| unreachable(format!("invalid worker HTTP address: {e}")))?;
        copy_headers(headers, request.headers_mut(), &REQUEST_HEADERS);
        if let Some(trace) = &context.trace {
            let out = request.headers_mut();
            if let Ok(v) = HeaderValue::from_str(trace.traceparent()) {
                out.insert(HeaderName::from_static(TRACEPARENT), v);
            }
            if let Some(Ok(v)) = trace.tracestate().map(HeaderValue::from_str) {
                out.insert(HeaderName::from_static(TRACESTATE), v);
            }
        }
        let (parts, body) = match self {
            HttpWorkers::Plain(client) => {
                let response = client
                    .request(request)
                    .await
                    .map_err(|e| unreachable(error_chain(&e)))?;
                let (parts, incoming) = response.into_parts();
                (parts, Body::new(incoming))
            }
            HttpWorkers::OverGrpc(workers) => {
                let response = workers
                    .send_http(addr, request.map(tonic::body::Body::new))
                    .await?;
                let (parts, incoming) = response.into_parts();
                if parts.headers.contains_key("grpc-status") {
                    // A gRPC answer (UNIMPLEMENTED): a worker that does not serve the HTTP
                    // API on its gRPC port.
                    return Err(RouterError::Worker {
                        addr: addr.to_string(),
                        error: ServiceError::Unavailable(format!(
                            "worker {addr} does not serve HTTP inference on its gRPC port (a worker older than the router?)"
                        )),
                    });
                }
                (parts, Body::new(incoming))
            }
        };
        let body = axum::body::to_bytes(body, usize::MAX)
            .await
            .map_err(|e| unreachable(format!("the response broke off: {e}")))?;
        if parts.status == StatusCode::SERVICE_UNAVAILABLE {
            return Err(RouterError::Worker {
                addr: addr.to_string(),
                error: ServiceError::Unavailable(error_message(&body)),
            });
        }
        if parts.status == StatusCode::NOT_FOUND {
            let message = error_message(&body);
            if is_unknown_model(&message) {
                // Retryable on another replica, as over gRPC; if it is the last word, the
                // client gets the same status and message.
                return Err(RouterError::Worker {
                    addr: addr.to_string(),
                    error: ServiceError::NotFound(message),
                });
            }
        }
        let mut answer = Response::new(Body::from(body));
        *answer.status_mut() = parts.status;
        copy_headers(&parts.headers, answer.headers_mut(), &RESPONSE_HEADERS);
        Ok(answer)
    }
}

fn copy_headers(from: &HeaderMap, to: &mut HeaderMap, names: &[&'static str]) {
    for name in names {
        if let Some(value) = from.get(*name) {
            to.insert(HeaderName::from_static(name), value.clone());
        }
    }
}

/// The `error` of a KServe error body, else the body as text.
fn error_message(body: &[u8]) -> String {
    #[derive(serde::Deserialize)]
    struct ErrorBody {
        error: String,
    }
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(e) => e.error,
        Err(_) => String::from_utf8_lossy(body).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_give_their_message() {
        assert_eq!(
            error_message(br#"{"error":"model is unloading"}"#),
            "model is unloading"
        );
        assert_eq!(error_message(b"plain text"), "plain text");
    }

    #[tokio::test]
    async fn a_closed_port_is_unreachable() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        drop(listener);
        let config = ForwardConfig {
            connect_timeout: Duration::from_secs(1),
            ..ForwardConfig::default()
        };
        let workers = HttpWorkers::new(&config, Arc::new(Workers::new(config.clone())));
        let err = workers
            .infer(
                &addr,
                "/v2/models/m/versions/1/infer",
                &HeaderMap::new(),
                &RequestContext::default(),
                Bytes::from_static(b"{}"),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, RouterError::Unreachable { .. }), "{err:?}");
        assert!(err.retryable());
    }
}
