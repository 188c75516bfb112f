//! The agent's policy over the shared control-plane client ([`nereid_cluster_client`]): which
//! failures are worth another attempt, which move it to another node, and the retry loop of
//! register and report calls, which try until they succeed, fail for good, or the agent stops.
//!
//! ```text
//! call(what, f) ─► attempt at the node in use ─┬─ ok ─────────────────────► Some(Ok)
//!                                               ├─ not retryable ──────────► Some(Err)
//!                                               └─ retryable ─► [fail over: the named leader
//!                                                   if listed, else the next node] ─► backoff
//!                                                   ─► again (or None once stopped)
//! ```
//!
//! Any control-plane node serves every Cluster call (followers forward writes to their leader),
//! so a call that finds its node unreachable moves on to the next address. Calls that fail for
//! a reason another attempt cannot fix (bad token, invalid request) are returned at once.

use std::future::Future;
use std::time::Duration;

use nereid_cluster_client::{Backoff, ClientConfig, ControlPlaneClient, Failure};
use nereid_proto::pb::cluster::cluster_client::ClusterClient;
use tokio::sync::watch;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

/// Deadline of one unary call.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long opening a connection to one node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The control-plane nodes, with the one in use.
pub struct ControlPlane {
    client: ControlPlaneClient,
}

/// Whether another attempt (maybe on another node) may succeed.
pub fn retryable(code: Code) -> bool {
    match code {
        Code::Unavailable
        | Code::Unknown
        | Code::DeadlineExceeded
        | Code::Cancelled
        | Code::Aborted
        | Code::ResourceExhausted
        | Code::Internal => true,
        Code::Ok
        | Code::InvalidArgument
        | Code::NotFound
        | Code::AlreadyExists
        | Code::PermissionDenied
        | Code::FailedPrecondition
        | Code::OutOfRange
        | Code::Unimplemented
        | Code::DataLoss
        | Code::Unauthenticated => false,
    }
}

/// Whether a retried unary call should move to another node (rather than retry the same one,
/// which is busy or aborted the call but is up).
fn fails_over(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable | Code::Unknown | Code::DeadlineExceeded
    )
}

impl ControlPlane {
    /// Clients for `addrs` (`host:port` or `http://host:port`); connections open on first use.
    pub fn new(addrs: &[String], token: Option<&str>) -> Result<ControlPlane, String> {
        let client = ControlPlaneClient::new(&ClientConfig {
            addresses: addrs.to_vec(),
            token: token.map(str::to_string),
            connect_timeout: CONNECT_TIMEOUT,
            call_timeout: CALL_TIMEOUT,
        })
        .map_err(|e| e.to_string())?;
        Ok(ControlPlane { client })
    }

    /// Dials the control plane with `dial` (TLS with the cluster identity when configured).
    pub fn with_dial(self, dial: nereid_tls::ClusterDial) -> ControlPlane {
        ControlPlane {
            client: self.client.with_dial(dial),
        }
    }

    /// How many control-plane addresses there are.
    pub fn addresses(&self) -> usize {
        self.client.node_count()
    }

    /// The address in use.
    pub fn current_addr(&self) -> &str {
        self.client.current_address()
    }

    /// Moves on to another node after `failure` (the leader it names when listed, else the
    /// next); `None`: the node in use ended a stream.
    pub fn fail_over(&self, failure: Option<&Failure>) {
        self.client
            .fail_over(failure.and_then(Failure::leader_hint));
    }

    /// `message` with the bearer token and, for unary calls, a deadline.
    pub fn request<T>(&self, message: T, unary: bool) -> Request<T> {
        if unary {
            self.client.request(message)
        } else {
            self.client.stream_request(message)
        }
    }

    /// One call at the node in use.
    pub async fn once<T, F, Fut>(&self, f: F) -> Result<T, Failure>
    where
        F: FnOnce(ClusterClient<Channel>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.client.attempt(self.client.current(), f).await
    }

    /// Calls `f` until it succeeds, fails for good, or `stop` is set (then `None`). Unreachable
    /// nodes are skipped; waits grow between attempts.
    pub async fn call<T, F, Fut>(
        &self,
        what: &str,
        stop: &mut watch::Receiver<bool>,
        mut f: F,
    ) -> Option<Result<T, Status>>
    where
        F: FnMut(ClusterClient<Channel>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let mut backoff = Backoff::default();
        loop {
            if *stop.borrow() {
                return None;
            }
            match self.once(&mut f).await {
                Ok(r) => return Some(Ok(r)),
                Err(failure) if retryable(failure.code()) => {
                    tracing::debug!(call = what, addr = %self.current_addr(), error = %failure, "control-plane call failed; retrying");
                    if fails_over(failure.code()) {
                        self.fail_over(Some(&failure));
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff.next_wait()) => {}
                        _ = stop.wait_for(|s| *s) => return None,
                    }
                }
                Err(failure) => return Some(Err(failure.into_status())),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn addresses_rotate_and_requests_carry_the_token() {
        let cp = ControlPlane::new(
            &["127.0.0.1:1".into(), "http://127.0.0.1:2".into()],
            Some("s3cret\n"),
        )
        .unwrap();
        assert_eq!(cp.current_addr(), "127.0.0.1:1");
        cp.fail_over(None);
        assert_eq!(cp.current_addr(), "http://127.0.0.1:2");
        cp.fail_over(None);
        assert_eq!(cp.current_addr(), "127.0.0.1:1");
        let r = cp.request((), true);
        assert_eq!(r.metadata().get("authorization").unwrap(), "Bearer s3cret");
        assert!(ControlPlane::new(&[], None).is_err());
        assert!(retryable(Code::Unavailable));
        assert!(!retryable(Code::Unauthenticated));
        assert!(fails_over(Code::DeadlineExceeded) && !fails_over(Code::ResourceExhausted));
    }
}
