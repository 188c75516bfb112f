//! Outgoing Raft traffic over tonic: openraft's network factory and per-peer connections, and
//! the forwarding calls (`ForwardWrite`, `ReadIndex`) a follower makes to the leader.
//!
//! ```text
//!  openraft ─► Connection::{append_entries, vote, full_snapshot}
//!                 └► JSON(request) in RaftPayload ─► RaftClient (cached lazy Channel per address)
//!                 ◄─ JSON(response) ◄─ status → Unreachable (peer down) | Network (other)
//! ```
//!
//! Channels are plaintext, or TLS with the cluster identity when `--cluster-tls-*` is set
//! ([`ClusterDial`]). Every call carries `authorization: Bearer <token>` when a token is configured, and is bounded
//! by a timeout (openraft's soft TTL for Raft RPCs, [`Peers::call_timeout`] for forwarding).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use nereid_proto::pb::cluster::RaftPayload;
use nereid_proto::pb::cluster::raft_client::RaftClient;
use nereid_tls::ClusterDial;
use openraft::error::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, RaftNetworkFactory, RaftNetworkV2};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::types::{Snapshot, SnapshotData, SnapshotMeta, TypeConfig, Vote};

/// A whole snapshot as one `InstallSnapshot` message.
#[derive(Serialize, Deserialize)]
pub(crate) struct InstallSnapshotWire {
    pub(crate) vote: Vote,
    pub(crate) meta: SnapshotMeta,
    pub(crate) data: Vec<u8>,
}

/// Which RPC a call is, for the error it may turn into.
#[derive(Clone, Copy)]
pub(crate) enum Rpc {
    AppendEntries,
    Vote,
    InstallSnapshot,
    ForwardWrite,
    ReadIndex,
}

/// Cached channels to peers, by address, and the token calls carry.
pub(crate) struct Peers {
    channels: Mutex<HashMap<String, Channel>>,
    auth: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    connect_timeout: Duration,
    /// Bound on a forwarded write or read-index call.
    pub(crate) call_timeout: Duration,
    dial: ClusterDial,
}

impl Peers {
    pub(crate) fn new(auth_token: Option<&str>, connect_timeout: Duration) -> Result<Self, String> {
        let auth = match auth_token {
            Some(token) => Some(
                format!("Bearer {token}")
                    .parse()
                    .map_err(|_| "the auth token is not valid in an HTTP header".to_string())?,
            ),
            None => None,
        };
        Ok(Peers {
            channels: Mutex::new(HashMap::new()),
            auth,
            connect_timeout,
            call_timeout: Duration::from_secs(3),
            dial: ClusterDial::plain(),
        })
    }

    /// Dials peers with `dial` (TLS with the cluster identity when configured).
    pub(crate) fn with_dial(mut self, dial: ClusterDial) -> Self {
        self.dial = dial;
        self
    }

    /// The channel to `addr`, created lazily (connects on first use) and cached.
    fn channel(&self, addr: &str) -> Result<Channel, Status> {
        let mut channels = self.channels.lock();
        if let Some(ch) = channels.get(addr) {
            return Ok(ch.clone());
        }
        let uri = if addr.contains("://") {
            addr.to_string()
        } else {
            format!("{}://{addr}", self.dial.scheme())
        };
        let endpoint = Endpoint::from_shared(uri)
            .map_err(|e| Status::invalid_argument(format!("bad peer address {addr}: {e}")))?
            .connect_timeout(self.connect_timeout)
            .tcp_nodelay(true);
        let ch = self.dial.lazy(&endpoint);
        channels.insert(addr.to_string(), ch.clone());
        Ok(ch)
    }

    /// One unary call to `addr` with `data`, bounded by `timeout`.
    pub(crate) async fn call(
        &self,
        addr: &str,
        rpc: Rpc,
        data: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, Status> {
        let mut client = RaftClient::new(self.channel(addr)?)
            .max_decoding_message_size(usize::MAX)
            .max_encoding_message_size(usize::MAX);
        let mut request = tonic::Request::new(RaftPayload { data });
        request.set_timeout(timeout);
        if let Some(auth) = &self.auth {
            request.metadata_mut().insert("authorization", auth.clone());
        }
        let call = async {
            match rpc {
                Rpc::AppendEntries => client.append_entries(request).await,
                Rpc::Vote => client.vote(request).await,
                Rpc::InstallSnapshot => client.install_snapshot(request).await,
                Rpc::ForwardWrite => client.forward_write(request).await,
                Rpc::ReadIndex => client.read_index(request).await,
            }
        };
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(response)) => Ok(response.into_inner().data),
            Ok(Err(status)) => Err(status),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "no answer from {addr} within {timeout:?}"
            ))),
        }
    }
}

/// Builds one [`Connection`] per target for openraft.
pub(crate) struct NetworkFactory {
    peers: Arc<Peers>,
}

impl NetworkFactory {
    pub(crate) fn new(peers: Arc<Peers>) -> Self {
        NetworkFactory { peers }
    }
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Connection;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Self::Network {
        Connection {
            peers: self.peers.clone(),
            target,
            addr: node.addr.clone(),
        }
    }
}

/// openraft's view of one peer.
pub(crate) struct Connection {
    peers: Arc<Peers>,
    target: u64,
    addr: String,
}

/// A transport failure as openraft classifies it: a peer that cannot be reached (refused, down,
/// timed out) is `Unreachable`, so openraft backs off and elections proceed without it.
fn unreachable_or_network(
    target: u64,
    status: &Status,
) -> Result<Unreachable<TypeConfig>, NetworkError<TypeConfig>> {
    let msg = format!(
        "raft rpc to node {target}: {}: {}",
        status.code(),
        status.message()
    );
    match status.code() {
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
            Ok(Unreachable::from_string(msg))
        }
        _ => Err(NetworkError::from_string(msg)),
    }
}

fn rpc_error(target: u64, status: &Status) -> RPCError<TypeConfig> {
    match unreachable_or_network(target, status) {
        Ok(u) => RPCError::Unreachable(u),
        Err(n) => RPCError::Network(n),
    }
}

fn decode_error(target: u64, e: &serde_json::Error) -> NetworkError<TypeConfig> {
    NetworkError::from_string(format!("bad raft payload from node {target}: {e}"))
}

impl Connection {
    async fn unary<Req: Serialize, Resp: serde::de::DeserializeOwned>(
        &self,
        rpc: Rpc,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<TypeConfig>> {
        let data = serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let bytes = self
            .peers
            .call(&self.addr, rpc, data, option.soft_ttl())
            .await
            .map_err(|s| rpc_error(self.target, &s))?;
        serde_json::from_slice(&bytes).map_err(|e| RPCError::Network(decode_error(self.target, &e)))
    }
}

impl RaftNetworkV2<TypeConfig> for Connection {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.unary(Rpc::AppendEntries, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.unary(Rpc::Vote, &rpc, &option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        cancel: impl Future<Output = ReplicationClosed> + Send + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let wire = InstallSnapshotWire {
            vote,
            meta: snapshot.meta,
            data: snapshot.snapshot.into_inner(),
        };
        let data = serde_json::to_vec(&wire).map_err(|e| NetworkError::new(&e))?;
        // A whole snapshot may take longer than a heartbeat-sized TTL.
        let timeout = option.hard_ttl().max(Duration::from_secs(10));
        let send = self
            .peers
            .call(&self.addr, Rpc::InstallSnapshot, data, timeout);
        let bytes = tokio::select! {
            closed = cancel => return Err(StreamingError::Closed(closed)),
            result = send => result,
        };
        let bytes = bytes.map_err(|s| match unreachable_or_network(self.target, &s) {
            Ok(u) => StreamingError::Unreachable(u),
            Err(n) => StreamingError::Network(n),
        })?;
        serde_json::from_slice(&bytes)
            .map_err(|e| StreamingError::Network(decode_error(self.target, &e)))
    }
}
