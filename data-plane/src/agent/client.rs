//! The worker's connection to the control plane: 1..n node addresses, failover between them,
//! the bearer token on every call, retries with backoff.
//!
//! Any control-plane node serves every Cluster call (followers forward writes to their leader),
//! so a call that finds its node unreachable moves on to the next address. Calls that fail for
//! a reason another attempt cannot fix (bad token, invalid request) are returned at once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nereid_proto::pb::cluster::cluster_client::ClusterClient;
use tokio::sync::watch;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

/// Longest wait between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Deadline of one unary call.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Clients for the control-plane nodes, with the one in use.
pub struct ControlPlane {
    addrs: Vec<String>,
    channels: Vec<Channel>,
    current: AtomicUsize,
    token: Option<MetadataValue<Ascii>>,
}

/// Whether another attempt (maybe on another node) may succeed.
pub fn retryable(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::Unknown
            | Code::DeadlineExceeded
            | Code::Cancelled
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::Internal
    )
}

/// The next wait after `current`.
pub fn next_backoff(current: Duration) -> Duration {
    (current * 2).clamp(FIRST_BACKOFF, MAX_BACKOFF)
}

impl ControlPlane {
    /// Clients for `addrs` (`host:port` or `http://host:port`); connections open lazily.
    pub fn new(addrs: &[String], token: Option<&str>) -> Result<ControlPlane, String> {
        if addrs.is_empty() {
            return Err("no control-plane address".into());
        }
        let channels = addrs
            .iter()
            .map(|a| {
                let uri = if a.contains("://") {
                    a.clone()
                } else {
                    format!("http://{a}")
                };
                Endpoint::from_shared(uri)
                    .map(|e| {
                        e.connect_timeout(Duration::from_secs(2))
                            .tcp_nodelay(true)
                            .connect_lazy()
                    })
                    .map_err(|e| format!("control-plane address '{a}': {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let token = token
            .map(|t| {
                MetadataValue::try_from(format!("Bearer {}", t.trim())).map_err(|_| {
                    "the auth token has characters not allowed in a header".to_string()
                })
            })
            .transpose()?;
        Ok(ControlPlane {
            addrs: addrs.to_vec(),
            channels,
            current: AtomicUsize::new(0),
            token,
        })
    }

    /// The address in use.
    pub fn current_addr(&self) -> &str {
        &self.addrs[self.current.load(Ordering::Relaxed) % self.addrs.len()]
    }

    /// A client for the node in use.
    pub fn client(&self) -> ClusterClient<Channel> {
        let i = self.current.load(Ordering::Relaxed) % self.channels.len();
        ClusterClient::new(self.channels[i].clone())
    }

    /// Moves on to the next node.
    pub fn fail_over(&self) {
        if self.addrs.len() > 1 {
            self.current.fetch_add(1, Ordering::Relaxed);
            tracing::info!(addr = %self.current_addr(), "switching control-plane node");
        }
    }

    /// `message` with the bearer token and, for unary calls, a deadline.
    pub fn request<T>(&self, message: T, unary: bool) -> Request<T> {
        let mut r = Request::new(message);
        if let Some(t) = &self.token {
            r.metadata_mut().insert("authorization", t.clone());
        }
        if unary {
            r.set_timeout(CALL_TIMEOUT);
        }
        r
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
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut backoff = Duration::ZERO;
        loop {
            if *stop.borrow() {
                return None;
            }
            match f(self.client()).await {
                Ok(r) => return Some(Ok(r.into_inner())),
                Err(s) if retryable(s.code()) => {
                    tracing::debug!(call = what, addr = %self.current_addr(), error = %s, "control-plane call failed; retrying");
                    if matches!(
                        s.code(),
                        Code::Unavailable | Code::Unknown | Code::DeadlineExceeded
                    ) {
                        self.fail_over();
                    }
                    backoff = next_backoff(backoff);
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = stop.wait_for(|s| *s) => return None,
                    }
                }
                Err(s) => return Some(Err(s)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_to_a_bound() {
        let mut b = Duration::ZERO;
        b = next_backoff(b);
        assert_eq!(b, FIRST_BACKOFF);
        for _ in 0..20 {
            b = next_backoff(b);
        }
        assert_eq!(b, MAX_BACKOFF);
    }

    #[tokio::test]
    async fn addresses_rotate_and_requests_carry_the_token() {
        let cp = ControlPlane::new(
            &["127.0.0.1:1".into(), "http://127.0.0.1:2".into()],
            Some("s3cret\n"),
        )
        .unwrap();
        assert_eq!(cp.current_addr(), "127.0.0.1:1");
        cp.fail_over();
        assert_eq!(cp.current_addr(), "http://127.0.0.1:2");
        cp.fail_over();
        assert_eq!(cp.current_addr(), "127.0.0.1:1");
        let r = cp.request((), true);
        assert_eq!(r.metadata().get("authorization").unwrap(), "Bearer s3cret");
        assert!(ControlPlane::new(&[], None).is_err());
        assert!(retryable(Code::Unavailable));
        assert!(!retryable(Code::Unauthenticated));
    }
}
