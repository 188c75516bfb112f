//! [`ControlPlaneClient`]: the checked addresses, one cached channel per node, the bearer token,
//! the node in use; the effects around the pure choices of [`crate::failover`].
//!
//! ```text
//! attempt(node, rpc) ─► channel(node): cached, or connect (connect_timeout) ─┬─ Unreachable
//!                    ─► rpc(client, request with token [+ call_timeout]) ────┼─ Refused(status)
//!                                                                             └─ Ok(response)
//! call_each(msg, moves_on, rpc) ─► Pass: attempt node 0; Unreachable, or Refused with a
//!     code `moves_on` accepts ─► the named leader if listed, else the next untried node
//!     ─► all tried: PassError::Exhausted (last answer, unreachable nodes, leader hint)
//! fail_over(hint) ─► the node in use moves to the listed leader, else the next node
//! ```
//!
//! A node that could not be reached is connected to again on its next attempt; a cached
//! channel reconnects by itself when its connection breaks.

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nereid_proto::pb::cluster::cluster_client::ClusterClient;
use nereid_proto::pb::cluster::management_client::ManagementClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

use nereid_tls::ClusterDial;

use crate::address::{Address, parse_list, position_of};
use crate::error::{ClientError, Failure, PassError};
use crate::failover::{Pass, leader_hint, next_after};

/// Where the control plane is, how to authenticate, and how long to wait.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Control-plane gRPC addresses (`host:port` or `http://host:port`), in the order tried.
    pub addresses: Vec<String>,
    /// Sent as `authorization: Bearer <token>` on every call; blank means none.
    pub token: Option<String>,
    /// How long opening a connection to one node may take.
    pub connect_timeout: Duration,
    /// Deadline of one unary call (sent as `grpc-timeout`); streams have none.
    pub call_timeout: Duration,
}

/// A generated gRPC client (or the bare channel) built on a node's channel.
pub trait FromChannel {
    /// Wraps `channel` (already dialed to one node, plaintext or TLS) in the client type.
    fn from_channel(channel: Channel) -> Self;
}

impl FromChannel for Channel {
    fn from_channel(channel: Channel) -> Self {
        channel
    }
}

impl FromChannel for ClusterClient<Channel> {
    fn from_channel(channel: Channel) -> Self {
        ClusterClient::new(channel)
    }
}

impl FromChannel for ManagementClient<Channel> {
    fn from_channel(channel: Channel) -> Self {
        ManagementClient::new(channel)
    }
}

struct Node {
    address: Address,
    endpoint: Endpoint,
    /// The connection once one was opened; `None` until then (or while unreachable).
    channel: Mutex<Option<Channel>>,
}

/// The one client of the control plane (see the [crate] docs for the flow).
pub struct ControlPlaneClient {
    nodes: Vec<Node>,
    token: Option<MetadataValue<Ascii>>,
    call_timeout: Duration,
    /// The node long-lived callers use; moved by [`ControlPlaneClient::fail_over`].
    current: AtomicUsize,
    /// Plaintext, or TLS with the cluster (or `ctl`) identity.
    dial: ClusterDial,
}

impl ControlPlaneClient {
    /// Checks the addresses and the token; connects nothing.
    pub fn new(config: &ClientConfig) -> Result<ControlPlaneClient, ClientError> {
        let token = config
            .token
            .as_deref()
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| {
                MetadataValue::try_from(format!("Bearer {t}"))
                    .map_err(|_| ClientError::InvalidToken)
            })
            .transpose()?;
        let nodes = parse_list(&config.addresses)?
            .into_iter()
            .map(|address| {
                let endpoint = Endpoint::from_shared(address.uri().to_string())
                    .map_err(|e| ClientError::InvalidAddress {
                        address: address.given().to_string(),
                        reason: e.to_string(),
                    })?
                    .connect_timeout(config.connect_timeout)
                    .tcp_nodelay(true);
                Ok(Node {
                    address,
                    endpoint,
                    channel: Mutex::new(None),
                })
            })
            .collect::<Result<Vec<_>, ClientError>>()?;
        Ok(ControlPlaneClient {
            nodes,
            token,
            call_timeout: config.call_timeout,
            current: AtomicUsize::new(0),
            dial: ClusterDial::plain(),
        })
    }

    /// Dials every node with `dial` (TLS when the control plane serves mutual TLS).
    pub fn with_dial(mut self, dial: ClusterDial) -> ControlPlaneClient {
        self.dial = dial;
        self
    }

    /// How many nodes are listed (at least one).
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// The address of `node` as configured.
    pub fn address(&self, node: usize) -> &str {
        self.nodes[node % self.nodes.len()].address.given()
    }

    /// The node in use by long-lived callers.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed) % self.nodes.len()
    }

    /// The address of the node in use.
    pub fn current_address(&self) -> &str {
        self.address(self.current())
    }

    /// The listed node a leader hint names.
    pub fn hinted(&self, hint: Option<&str>) -> Option<usize> {
        let addresses: Vec<Address> = self.nodes.iter().map(|n| n.address.clone()).collect();
        position_of(&addresses, hint?)
    }

    /// Moves the node in use on after it failed: to the leader `hint` names when listed, else
    /// to the next node.
    pub fn fail_over(&self, hint: Option<&str>) {
        let len = self.nodes.len();
        if len < 2 {
            return;
        }
        let hinted = self.hinted(hint);
        let _ = self
            .current
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| {
                Some(next_after(c % len, len, hinted))
            });
        tracing::info!(addr = %self.current_address(), leader_hint = hint, "switching control-plane node");
    }

    /// `message` with the token and the unary call deadline.
    pub fn request<M>(&self, message: M) -> Request<M> {
        let mut request = self.stream_request(message);
        request.set_timeout(self.call_timeout);
        request
    }

    /// `message` with the token, for a streaming call (no deadline).
    pub fn stream_request<M>(&self, message: M) -> Request<M> {
        let mut request = Request::new(message);
        if let Some(token) = &self.token {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        request
    }

    /// The channel to `node`: the cached one, or a new connection.
    pub async fn channel(&self, node: usize) -> Result<Channel, Failure> {
        let node = &self.nodes[node % self.nodes.len()];
        if let Some(channel) = lock(&node.channel).clone() {
            return Ok(channel);
        }
        let channel =
            self.dial
                .connect(&node.endpoint)
                .await
                .map_err(|e| Failure::Unreachable {
                    address: node.address.given().to_string(),
                    error: error_chain(&e),
                })?;
        *lock(&node.channel) = Some(channel.clone());
        Ok(channel)
    }

    /// One call at `node`: `rpc` gets a client on its channel (build the request with
    /// [`Self::request`] or [`Self::stream_request`]).
    pub async fn attempt<C, T, F, Fut>(&self, node: usize, rpc: F) -> Result<T, Failure>
    where
        C: FromChannel,
        F: FnOnce(C) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let channel = self.channel(node).await?;
        rpc(C::from_channel(channel))
            .await
            .map(Response::into_inner)
            .map_err(Failure::Refused)
    }

    /// Sends `message` to each node at most once (in list order, a named leader first) until
    /// one answers; an unreachable node, or a refusal whose code `moves_on` accepts, moves on.
    pub async fn call_each<C, M, T, F, Fut>(
        &self,
        message: M,
        moves_on: impl Fn(Code) -> bool,
        rpc: F,
    ) -> Result<T, PassError>
    where
        C: FromChannel,
        M: Clone,
        F: Fn(C, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        let mut pass = Pass::new(self.nodes.len());
        let mut next_hint = None;
        let mut answered = None;
        let mut unreachable = Vec::new();
        let mut leader = None;
        while let Some(node) = pass.next(next_hint) {
            let request = self.request(message.clone());
            match self.attempt(node, |c| rpc(c, request)).await {
                Ok(response) => return Ok(response),
                Err(Failure::Unreachable { address, error }) => {
                    tracing::debug!(addr = %address, %error, "control-plane node unreachable; trying the next");
                    unreachable.push(format!("{address}: {error}"));
                    next_hint = None;
                }
                Err(Failure::Refused(status)) if moves_on(status.code()) => {
                    let hint = leader_hint(&status);
                    tracing::debug!(addr = %self.address(node), error = %status, leader_hint = hint, "control-plane node refused; trying the next");
                    next_hint = self.hinted(hint);
                    if let Some(h) = hint {
                        leader = Some(h.to_string());
                    }
                    answered = Some(status);
                }
                Err(Failure::Refused(status)) => return Err(PassError::Refused(status)),
            }
        }
        Err(PassError::Exhausted {
            answered,
            unreachable,
            leader,
        })
    }
}

/// The cache lock; a panic elsewhere cannot leave a channel half-written, so poison is ignored.
fn lock(m: &Mutex<Option<Channel>>) -> std::sync::MutexGuard<'_, Option<Channel>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// An error with its causes: transports nest the cause several times; each distinct layer
/// once.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if parts.last() != Some(&text) {
            parts.push(text);
        }
        source = s.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(addresses: &[&str], token: Option<&str>) -> ClientConfig {
        ClientConfig {
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            token: token.map(str::to_string),
            connect_timeout: Duration::from_secs(1),
            call_timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn configuration_is_checked_before_connecting() {
        assert_eq!(
            ControlPlaneClient::new(&config(&[], None)).err(),
            Some(ClientError::NoAddress)
        );
        assert_eq!(
            ControlPlaneClient::new(&config(&["a:1"], Some("bad\ntoken"))).err(),
            Some(ClientError::InvalidToken)
        );
        assert!(matches!(
            ControlPlaneClient::new(&config(&["a:1", "ftp://b"], None)),
            Err(ClientError::InvalidAddress { .. })
        ));
    }

    #[tokio::test]
    async fn requests_carry_the_token_and_unary_ones_a_deadline() {
        let cp = ControlPlaneClient::new(&config(&["a:1"], Some(" s3cret\n"))).unwrap();
        let r = cp.request(());
        assert_eq!(r.metadata().get("authorization").unwrap(), "Bearer s3cret");
        assert_eq!(r.metadata().get("grpc-timeout").unwrap(), "5000000u");
        let r = cp.stream_request(());
        assert_eq!(r.metadata().get("authorization").unwrap(), "Bearer s3cret");
        assert!(r.metadata().get("grpc-timeout").is_none());
        let cp = ControlPlaneClient::new(&config(&["a:1"], Some("  "))).unwrap();
        assert!(cp.request(()).metadata().get("authorization").is_none());
    }

    #[tokio::test]
    async fn the_node_in_use_rotates_and_follows_listed_hints() {
        let cp =
            ControlPlaneClient::new(&config(&["127.0.0.1:1", "http://127.0.0.1:2", "c:3"], None))
                .unwrap();
        assert_eq!(cp.current_address(), "127.0.0.1:1");
        cp.fail_over(None);
        assert_eq!(cp.current_address(), "http://127.0.0.1:2");
        cp.fail_over(Some("127.0.0.1:1"));
        assert_eq!(cp.current_address(), "127.0.0.1:1", "to the leader named");
        cp.fail_over(Some("10.9.9.9:7000"));
        assert_eq!(
            cp.current_address(),
            "http://127.0.0.1:2",
            "an unlisted leader is not followed"
        );
        cp.fail_over(None);
        cp.fail_over(None);
        assert_eq!(cp.current_address(), "127.0.0.1:1", "wraps around");
    }
}
