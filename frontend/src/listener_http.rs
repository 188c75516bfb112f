//! Serving HTTP/1.1 and HTTP/2 (cleartext or over TLS) from [`accept_task`]'s connections
//! with hyper, under read deadlines axum's own `serve` does not offer: a client must send its
//! request head within the header timeout and its whole body within the body timeout, so a
//! slow or stalled client cannot hold a connection's handler forever. Body bytes are charged to
//! the server-wide [`RequestBudget`] as they arrive, and HTTP/2 connections take a bounded
//! number of concurrent streams.
//!
//! ```text
//!  Conn ─► hyper auto (h1: header_read_timeout │ h2: max_concurrent_streams)
//!       ─► IncomingBody (body deadline, budget lease) ─► axum Router
//!  stop ─► no new connections; open ones finish their requests (graceful), then return
//! ```
//!
//! [`accept_task`]: crate::listener::accept_task

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::Request;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::sync::{mpsc, watch};
use tokio::time::Sleep;
use tower::ServiceExt;

use crate::budget::{Lease, RequestBudget};
use crate::listener::Conn;

/// Default of `--http-header-read-timeout-secs`.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Default of `--http-body-read-timeout-secs`.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(300);

/// Read deadlines of the HTTP port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpTimeouts {
    /// From the connection (or the previous response) to a complete request head (HTTP/1).
    pub header_read: Duration,
    /// From the request head to the end of its body.
    pub body_read: Duration,
}

impl Default for HttpTimeouts {
    fn default() -> Self {
        Self {
            header_read: DEFAULT_HEADER_READ_TIMEOUT,
            body_read: DEFAULT_BODY_READ_TIMEOUT,
        }
    }
}

/// Default of `--max-concurrent-streams`: HTTP/2 streams one connection may have open.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 1024;

/// How an HTTP port serves its connections once accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpServing {
    /// Deadlines for reading a request's head and body and for idle connections.
    pub timeouts: HttpTimeouts,
    /// HTTP/2 streams one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// Where request body bytes are charged while they arrive.
    pub budget: RequestBudget,
}

/// Serves `app` on every connection from `conns` until `stop` turns true, then lets the open
/// connections finish their requests.
pub async fn serve_http(
    mut conns: mpsc::Receiver<Conn>,
    app: axum::Router,
    serving: HttpServing,
    mut stop: watch::Receiver<bool>,
) {
    let timeouts = serving.timeouts;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header_read);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(serving.max_concurrent_streams);
    let graceful = GracefulShutdown::new();
    loop {
        let conn = tokio::select! {
            conn = conns.recv() => match conn {
                Some(conn) => conn,
                None => break,
            },
            _ = stop.wait_for(|s| *s) => break,
        };
        let app = app.clone();
        let body_read = timeouts.body_read;
        let budget = serving.budget.clone();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let request =
                request.map(|body| Body::new(IncomingBody::new(body, body_read, budget.lease())));
            app.clone().oneshot(request)
        });
        let remote = conn.remote_addr();
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(conn), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(?remote, error = %e, "HTTP connection ended with an error");
            }
        });
    }
    drop(conns);
    graceful.shutdown().await;
}

/// A request body that fails once its deadline passes before it ends, or once its bytes would
/// take the server past its request budget. The bytes it charged are returned when it is
/// dropped (read to the end or abandoned).
struct IncomingBody {
    inner: Incoming,
    deadline: Pin<Box<Sleep>>,
    limit: Duration,
    lease: Lease,
}

impl IncomingBody {
    fn new(inner: Incoming, limit: Duration, lease: Lease) -> Self {
        Self {
            inner,
            deadline: Box::pin(tokio::time::sleep(limit)),
            limit,
            lease,
        }
    }
}

/// The body did not arrive in time.
#[derive(Debug, thiserror::Error)]
#[error("request body not received within {0} s (--http-body-read-timeout-secs)")]
struct BodyTimeout(u64);

impl hyper::body::Body for IncomingBody {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if let Some(Ok(frame)) = &frame
                && let Some(data) = frame.data_ref()
                && let Err(e) = this.lease.grow(data.len())
            {
                return Poll::Ready(Some(Err(e.into())));
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(BodyTimeout(this.limit.as_secs()).into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        hyper::body::Body::is_end_stream(&self.inner)
    }

    fn size_hint(&self) -> SizeHint {
        hyper::body::Body::size_hint(&self.inner)
    }
}
