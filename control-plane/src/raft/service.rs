//! Incoming Raft traffic: the tonic `Raft` service a node mounts on its gRPC server.
//!
//! ```text
//!  AppendEntries / Vote / InstallSnapshot ─► JSON decode ─► local openraft ─► JSON response
//!  ForwardWrite(JSON Command) ─► leader: client_write ─► JSON Result<Applied, StateError>
//!                               follower: FAILED_PRECONDITION "not leader"
//!  ReadIndex ─► leader: read index confirmed with a quorum ─► JSON u64
//!               follower: FAILED_PRECONDITION "not leader"
//! ```
//!
//! Authentication is the mounting server's job (an interceptor), not this service's.

use std::io::Cursor;

use nereid_proto::pb::cluster::RaftPayload;
use nereid_proto::pb::cluster::raft_server::Raft as RaftRpc;
use openraft::ReadPolicy;
use openraft::raft::{AppendEntriesRequest, VoteRequest};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status};

use super::network::InstallSnapshotWire;
use super::types::{LogCommand, Raft, Snapshot, TypeConfig};
use crate::state::Command;

/// The message a follower answers forwarded calls with; the forwarding side retries on it.
pub(crate) const NOT_LEADER: &str = "not leader";

/// The tonic server side of the Raft transport. Mount it with
/// `nereid_proto::pb::cluster::raft_server::RaftServer::new(service)`.
#[derive(Clone)]
pub struct RaftService {
    raft: Raft,
}

impl RaftService {
    pub(crate) fn new(raft: Raft) -> Self {
        RaftService { raft }
    }
}

fn decode<T: DeserializeOwned>(request: Request<RaftPayload>) -> Result<T, Status> {
    serde_json::from_slice(&request.into_inner().data)
        .map_err(|e| Status::invalid_argument(format!("bad raft payload: {e}")))
}

fn encode<T: Serialize>(value: &T) -> Result<Response<RaftPayload>, Status> {
    serde_json::to_vec(value)
        .map(|data| Response::new(RaftPayload { data }))
        .map_err(|e| Status::internal(format!("cannot encode raft payload: {e}")))
}

fn stopped(e: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("raft node is not running: {e}"))
}

#[tonic::async_trait]
impl RaftRpc for RaftService {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let rpc: AppendEntriesRequest<TypeConfig> = decode(request)?;
        let response = self.raft.append_entries(rpc).await.map_err(stopped)?;
        encode(&response)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc: VoteRequest<TypeConfig> = decode(request)?;
        let response = self.raft.vote(rpc).await.map_err(stopped)?;
        encode(&response)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let wire: InstallSnapshotWire = decode(request)?;
        let snapshot = Snapshot {
            meta: wire.meta,
            snapshot: Cursor::new(wire.data),
        };
        let response = self
            .raft
            .install_full_snapshot(wire.vote, snapshot)
            .await
            .map_err(stopped)?;
        encode(&response)
    }

    async fn forward_write(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let cmd: Command = decode(request)?;
        match self.raft.client_write(LogCommand(cmd)).await {
            Ok(response) => encode(&response.data),
            Err(e) if e.forward_to_leader().is_some() => {
                Err(Status::failed_precondition(NOT_LEADER))
            }
            Err(e) => Err(stopped(e)),
        }
    }

    async fn read_index(
        &self,
        _request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        match self.raft.get_read_log_id(ReadPolicy::ReadIndex).await {
            Ok((read_log_id, _applied)) => encode(&read_log_id.index()),
            Err(e) if e.forward_to_leader().is_some() => {
                Err(Status::failed_precondition(NOT_LEADER))
            }
            Err(e) => Err(Status::unavailable(format!(
                "cannot confirm leadership: {e}"
            ))),
        }
    }
}
