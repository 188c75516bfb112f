//! The lease-backed leader election: exactly one control-plane process holds
//! `<prefix>/leader` and runs the leader loop (liveness, placement).
//!
//! ```text
//!  session: lease_grant(TTL) ─► put <prefix>/members/<id> (create-if-absent, under the lease)
//!   loop: txn if create_revision(<prefix>/leader) == 0 then put {id, address} under the lease
//!                                                    else get it
//!         publish Leadership { leader_id, term: the key's create_revision, is_self }
//!         until the key is deleted (watch): keep-alive every TTL/3, refresh the members
//!  keep-alive failed / lease expired / watch broke ─► is_self = false at once, new session
//!  stop ─► revoke the lease (the leader key goes with it: another process takes over at once)
//! ```

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, EventType, GetOptions, LeaseKeepAliveStream, LeaseKeeper,
    PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio::sync::watch;
use tracing::{info, warn};

use super::{REQUEST_TIMEOUT, Record, Shared, bounded};
use crate::consensus::{Leadership, Member};

pub(super) async fn run(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    let mut backoff = Duration::from_millis(100);
    // A lease this process could not revoke (etcd was down): etcd restores leases when it
    // restarts, so its keys would block this process's next registration until it expired.
    let mut stale: Option<i64> = None;
    loop {
        if *stop.borrow() {
            return;
        }
        let mut client = shared.client.clone();
        if let Some(old) = stale
            && revoke(&mut client, old).await == Revoke::Gone
        {
            stale = None;
        }
        let lease = match bounded(client.lease_grant(ttl_secs(&shared), None)).await {
            Ok(lease) => lease.id(),
            Err(e) => {
                lose(&shared, None);
                warn!(endpoints = %shared.endpoints, "etcd lease for leadership, retrying: {e}");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        let result = session(&shared, &mut client, lease, &mut stop).await;
        lose(&shared, None);
        // On a lost connection the lease expires on its own; revoked later if etcd returns
        // first (a lease etcd no longer knows is gone already).
        if revoke(&mut client, lease).await == Revoke::Unknown {
            stale = Some(lease);
        }
        match result {
            Ok(()) => return,
            Err(e) => {
                warn!(node = shared.node_id, "etcd leadership session ended: {e}");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => return,
                }
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

fn ttl_secs(shared: &Shared) -> i64 {
    i64::try_from(shared.lease_ttl.as_secs().max(1)).unwrap_or(60)
}

/// Not (or no longer) the leader: `is_self` false at once; the leader, when known, stays.
fn lose(shared: &Shared, leader: Option<(u64, u64)>) {
    shared.leadership_tx.send_if_modified(|l| {
        let next = match leader {
            Some((id, term)) => Leadership {
                leader_id: Some(id),
                term,
                is_self: false,
            },
            None => Leadership {
                leader_id: None,
                term: l.term,
                is_self: false,
            },
        };
        let changed = *l != next;
        *l = next;
        changed
    });
}

/// What revoking a lease came to.
#[derive(Debug, PartialEq, Eq)]
enum Revoke {
    /// The lease is gone: revoked now, or etcd no longer knows it (expired, revoked before).
    Gone,
    /// etcd did not answer in time, or failed otherwise: the lease may still exist.
    Unknown,
}

/// Revokes `lease` within [`REQUEST_TIMEOUT`].
async fn revoke(client: &mut Client, lease: i64) -> Revoke {
    match tokio::time::timeout(REQUEST_TIMEOUT, client.lease_revoke(lease)).await {
        Ok(Ok(_)) => Revoke::Gone,
        Ok(Err(e)) if lease_unknown(&e) => Revoke::Gone,
        Ok(Err(_)) | Err(_) => Revoke::Unknown,
    }
}

/// etcd's answer for a lease it does not know: gRPC NOT_FOUND ("etcdserver: requested lease
/// not found"), told by its status code, not its words.
fn lease_unknown(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(status) if status.code() == tonic::Code::NotFound)
}

/// Campaigns while the lease lives; `Ok` only when told to stop.
async fn session(
    shared: &Shared,
    client: &mut Client,
    lease: i64,
    stop: &mut watch::Receiver<bool>,
) -> Result<(), String> {
    let (mut keeper, mut acks) = bounded(client.lease_keep_alive(lease)).await?;
    register(shared, client, lease).await?;
    let mut tick = tokio::time::interval(shared.lease_ttl / 3);
    let me = Record {
        id: shared.node_id,
        address: shared.address.clone(),
    };
    let value = serde_json::to_vec(&me).map_err(|e| e.to_string())?;
    loop {
        let txn = Txn::new()
            .when([Compare::create_revision(
                shared.keys.leader.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([TxnOp::put(
                shared.keys.leader.as_str(),
                value.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(shared.keys.leader.as_str(), None)]);
        let response = bounded(client.txn(txn)).await?;
        let revision = response.header().map(|h| h.revision()).unwrap_or(0);
        let leader = if response.succeeded() {
            Some((me.clone(), revision, true))
        } else {
            response.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(get) => get.kvs().first().and_then(|kv| {
                    let record = serde_json::from_slice::<Record>(kv.value()).ok();
                    record.map(|r| (r, kv.create_revision(), kv.lease() == lease))
                }),
                TxnOpResponse::Put(_) | TxnOpResponse::Delete(_) | TxnOpResponse::Txn(_) => None,
            })
        };
        match leader {
            Some((record, term, is_self)) => {
                let term = u64::try_from(term).unwrap_or(0);
                *shared.leader_address.lock() = Some(record.address.clone());
                if is_self {
                    info!(
                        node = shared.node_id,
                        term, "elected control-plane leader (etcd)"
                    );
                    shared.leadership_tx.send_replace(Leadership {
                        leader_id: Some(record.id),
                        term,
                        is_self: true,
                    });
                } else {
                    lose(shared, Some((record.id, term)));
                }
            }
            None => {
                // The key vanished between the compare and the get, or holds no record.
                *shared.leader_address.lock() = None;
                lose(shared, None);
            }
        }
        let options = WatchOptions::new().with_start_revision(revision + 1);
        let mut stream = bounded(client.watch(shared.keys.leader.as_str(), Some(options))).await?;
        'watch: loop {
            tokio::select! {
                _ = stop.changed() => return Ok(()),
                _ = tick.tick() => {
                    keep_alive(&mut keeper, &mut acks, shared.lease_ttl / 3).await?;
                    refresh_members(shared, client).await;
                }
                message = stream.message() => {
                    let Some(message) = message.map_err(|e| super::tls::describe(&e))? else {
                        return Err("the leader watch closed".into());
                    };
                    if message.canceled() {
                        return Err(format!("the leader watch was canceled: {}", message.cancel_reason()));
                    }
                    if message.events().iter().any(|e| e.event_type() == EventType::Delete) {
                        break 'watch;
                    }
                }
            }
        }
    }
}

/// One keep-alive round trip; an error, silence or a zero TTL (the lease expired) ends the
/// session.
async fn keep_alive(
    keeper: &mut LeaseKeeper,
    acks: &mut LeaseKeepAliveStream,
    within: Duration,
) -> Result<(), String> {
    let round = async {
        keeper
            .keep_alive()
            .await
            .map_err(|e| super::tls::describe(&e))?;
        match acks.message().await.map_err(|e| super::tls::describe(&e))? {
            Some(ack) if ack.ttl() > 0 => Ok(()),
            Some(_) => Err("the lease expired".to_string()),
            None => Err("the keep-alive stream closed".to_string()),
        }
    };
    match tokio::time::timeout(within.max(Duration::from_millis(300)), round).await {
        Ok(result) => result,
        Err(_) => Err("no keep-alive answer in time".into()),
    }
}

/// Registers this process under `<prefix>/members/<id>` with the session's lease. A live
/// registration by another process with the same id is an error (retried: it may be this
/// process's previous life, whose lease has not expired yet).
async fn register(shared: &Shared, client: &mut Client, lease: i64) -> Result<(), String> {
    let key = format!("{}{}", shared.keys.members, shared.node_id);
    let value = serde_json::to_vec(&Record {
        id: shared.node_id,
        address: shared.address.clone(),
    })
    .map_err(|e| e.to_string())?;
    let txn = Txn::new()
        .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key.as_str(),
            value,
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(key.as_str(), None)]);
    let response = bounded(client.txn(txn)).await?;
    if response.succeeded() {
        refresh_members(shared, client).await;
        return Ok(());
    }
    let holder = response.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(get) => get
            .kvs()
            .first()
            .and_then(|kv| serde_json::from_slice::<Record>(kv.value()).ok()),
        TxnOpResponse::Put(_) | TxnOpResponse::Delete(_) | TxnOpResponse::Txn(_) => None,
    });
    Err(format!(
        "--node-id {} is registered by another control-plane process{} under {}; each \
         process needs its own id (waiting for that registration's lease to expire)",
        shared.node_id,
        holder
            .map(|h| format!(" at {}", h.address))
            .unwrap_or_default(),
        shared.keys.members
    ))
}

/// The processes registered under `<prefix>/members/`, for `status()`; kept as they were
/// when etcd cannot be read.
async fn refresh_members(shared: &Shared, client: &mut Client) {
    let options = GetOptions::new().with_prefix();
    let Ok(response) = bounded(client.get(shared.keys.members.as_str(), Some(options))).await
    else {
        return;
    };
    let members = response
        .kvs()
        .iter()
        .filter_map(|kv| serde_json::from_slice::<Record>(kv.value()).ok())
        .map(|r| Member {
            id: r.id,
            address: r.address,
            voter: true,
        })
        .collect();
    *shared.members.lock() = members;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_unknown_only_on_not_found() {
        let not_found = tonic::Status::not_found("etcdserver: requested lease not found");
        assert!(lease_unknown(&etcd_client::Error::GRpcStatus(not_found)));
        let unavailable = tonic::Status::unavailable("requested lease not found");
        assert!(!lease_unknown(&etcd_client::Error::GRpcStatus(unavailable)));
        assert!(!lease_unknown(&etcd_client::Error::LeaseKeepAliveError(
            "requested lease not found".into()
        )));
    }
}
