//! Where the token check sits on each transport, and what each operation needs.
//!
//! ```text
//!  gRPC  /nereid.cluster.v1.Management/DeployModel ─► Guarded(Scope::Management) ─► Write
//!        /nereid.cluster.v1.Cluster/Heartbeat       ─► Guarded(Scope::Cluster)    ─► ClusterWrite
//!        /nereid.cluster.v1.Raft/AppendEntries      ─► Guarded(Scope::Raft)       ─► Peer
//!  REST  GET  /api/v1/...  ─► require_token ─► Read
//!        POST|PUT|DELETE   ─► require_token ─► Write
//! ```
//!
//! A tonic interceptor never sees the method path, so [`Guarded`] wraps a generated server
//! instead: it reads the path, checks the token, and answers a refusal itself.

use std::convert::Infallible;
use std::task::{Context, Poll};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::future::{Either, Ready, ready};
use tonic::server::NamedService;
use tower::Service;

use super::{AUTH_HEADER, AuthToken, Permission};

/// Which gRPC service a [`Guarded`] wraps, which decides what each of its methods needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// `nereid.cluster.v1.Management`: the reads below need [`Permission::Read`], every
    /// other method (and any method added later) [`Permission::Write`].
    Management,
    /// `nereid.cluster.v1.Cluster`: Watch is a read, the rest are the workers' and routers'
    /// writes.
    Cluster,
    /// `nereid.cluster.v1.Raft`: control-plane nodes only.
    Raft,
}

/// The Management methods that only read.
const MANAGEMENT_READS: &[&str] = &[
    "GetModel",
    "ListModels",
    "ExplainPlacement",
    "ListNodes",
    "GetNode",
    "ListPlacements",
    "GetClusterStatus",
];

impl Scope {
    /// What the method `rpc` of this service needs.
    pub fn permission(self, rpc: &str) -> Permission {
        match self {
            Scope::Management if MANAGEMENT_READS.contains(&rpc) => Permission::Read,
            Scope::Management => Permission::Write,
            Scope::Cluster if rpc == "Watch" => Permission::ClusterRead,
            Scope::Cluster => Permission::ClusterWrite,
            Scope::Raft => Permission::Peer,
        }
    }
}

/// A generated gRPC server behind the token check.
#[derive(Debug, Clone)]
pub struct Guarded<S> {
    inner: S,
    auth: AuthToken,
    scope: Scope,
}

impl AuthToken {
    /// Wraps the generated server `inner` of the service `scope` in this token check.
    pub fn guard<S>(&self, scope: Scope, inner: S) -> Guarded<S> {
        Guarded {
            inner,
            auth: self.clone(),
            scope,
        }
    }
}

impl<S: NamedService> NamedService for Guarded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> Service<http::Request<B>> for Guarded<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>, Error = Infallible>,
    R: Default,
{
    type Response = http::Response<R>;
    type Error = Infallible;
    type Future = Either<Ready<Result<http::Response<R>, Infallible>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let rpc = request.uri().path().rsplit('/').next().unwrap_or_default();
        let header = request.headers().get(AUTH_HEADER).map(|v| v.as_bytes());
        match self.auth.authorize(header, self.scope.permission(rpc), rpc) {
            Ok(()) => Either::Right(self.inner.call(request)),
            Err(e) => Either::Left(ready(Ok(tonic::Status::from(e).into_http()))),
        }
    }
}

/// REST: an axum middleware (`axum::middleware::from_fn_with_state(token, require_token)`).
/// GET and HEAD are reads; every other method is a write. Refusals name the route's RPC
/// ([`rest_operation`]), as gRPC refusals do, never the client's path.
pub async fn require_token(
    State(token): State<AuthToken>,
    request: Request,
    next: Next,
) -> Response {
    let method = request.method();
    let permission = if method == http::Method::GET || method == http::Method::HEAD {
        Permission::Read
    } else {
        Permission::Write
    };
    let operation = rest_operation(method, request.uri().path());
    let header = request
        .headers()
        .get(http::header::AUTHORIZATION)
        .map(|v| v.as_bytes());
    match token.authorize(header, permission, operation) {
        Ok(()) => next.run(request).await,
        Err(e) => e.into_response(),
    }
}

/// The RPC a REST route mirrors (the table in [`crate::api::rest`]), to name it in refusals.
pub fn rest_operation(method: &http::Method, path: &str) -> &'static str {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let Some(rest) = segments.strip_prefix(&["api", "v1"][..]) else {
        return "this request";
    };
    match (method.as_str(), rest) {
        ("GET", ["models"]) => "ListModels",
        ("POST", ["models"]) | ("PUT", ["models", _]) => "DeployModel",
        ("GET", ["models", _]) => "GetModel",
        ("DELETE", ["models", _]) => "DeleteModel",
        ("POST", ["models", _, "scale"]) => "ScaleModel",
        ("PUT", ["models", _, "traffic"]) => "SetTraffic",
        ("PUT", ["models", _, "autoscale"]) => "SetAutoscale",
        ("GET", ["models", _, "placement"]) => "ExplainPlacement",
        ("GET", ["nodes"]) => "ListNodes",
        ("GET", ["nodes", _]) => "GetNode",
        ("POST", ["nodes", _, "drain"]) => "DrainNode",
        ("POST", ["nodes", _, "undrain"]) => "UndrainNode",
        ("GET", ["placements"]) => "ListPlacements",
        ("GET", ["cluster"]) => "GetClusterStatus",
        ("POST", ["cluster", "members"]) => "AddMember",
        ("DELETE", ["cluster", "members", _]) => "RemoveMember",
        _ => "this request",
    }
}
