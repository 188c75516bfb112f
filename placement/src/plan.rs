//! The rules, applied per model version, largest replicas first (they are the hardest to fit):
//!
//! 1. replicas of unregistered model versions are removed (`ModelRemoved`);
//! 2. replicas on down or unknown nodes are removed (`NodeDown`);
//! 3. a second replica on one node is removed (`SpreadConflict`), the ready one with the lowest
//!    id stays;
//! 4. surplus healthy replicas are removed, not-ready first, then from the most loaded, least
//!    free node (`ScaleDown`); healthy replicas are never removed otherwise;
//! 5. drained replicas stay until enough ready replicas run elsewhere, then go (`Drain`);
//! 6. missing replicas are added on the eligible node with the most free memory that does not
//!    hold the model version yet, ties broken by load then node id; a GPU model takes the first
//!    such node that also has enough GPUs with room, and its GPUs with the most free memory;
//!    when none fits and eviction is on, least-recently-used idle replicas of one node make
//!    room (`evict.rs`); otherwise the rest is reported `unplaced`.
//!
//! 7. a replica being moved away (an in-flight [`super::Move`] whose new replica exists) is
//!    treated like a drained one: kept until enough replicas are ready elsewhere, then removed
//!    (`Rebalance`);
//! 8. with a rebalancing budget, ready replicas of untouched model versions move from loaded to
//!    light nodes (`rebalance.rs`).
//!
//! GPU models are planned first (most GPU memory first), then the rest by host memory.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use super::evict::Evictor;
use super::pool::{Charge, ModelKey, NodePool, replica_charge};
use super::rebalance;
use super::{
    Addition, CurrentReplica, Load, ModelView, Move, NodeView, Plan, Reason, Removal, Unplaced,
};

/// Computes the changes that move `replicas` towards the placement `models` want on `nodes`.
/// Pure and deterministic: the same input always gives the same plan.
pub fn plan(
    nodes: &[NodeView],
    models: &[ModelView],
    replicas: &[CurrentReplica],
    load: &Load,
) -> Plan {
    let mut by_key: BTreeMap<ModelKey, &ModelView> = BTreeMap::new();
    for m in models {
        by_key.entry((m.name.as_str(), m.version)).or_insert(m);
    }
    let mut groups: BTreeMap<ModelKey, Vec<&CurrentReplica>> = BTreeMap::new();
    for r in replicas {
        groups
            .entry((r.model.as_str(), r.version))
            .or_default()
            .push(r);
    }
    let charged = replicas.iter().map(|r| {
        let model = by_key.get(&(r.model.as_str(), r.version)).copied();
        (r.node.as_str(), replica_charge(r, model))
    });
    let mut pool = NodePool::new(nodes, load, charged);
    let moves: BTreeMap<u64, &Move> = load
        .rebalance
        .in_flight
        .iter()
        .map(|m| (m.replica, m))
        .collect();
    let mut evictor = load.cache.evict.then(|| {
        Evictor::new(
            &load.cache,
            &by_key,
            replicas,
            &load.rebalance.in_flight,
            &pool,
        )
    });
    let mut out = Plan::default();

    for (key, group) in &groups {
        if !by_key.contains_key(key) {
            out.remove.extend(group.iter().map(|r| Removal {
                replica: r.id,
                reason: Reason::ModelRemoved,
            }));
        }
    }

    let mut order: Vec<&ModelView> = by_key.values().copied().collect();
    order.sort_by_key(|m| {
        (
            Reverse(u64::from(m.gpus).saturating_mul(m.replica_gpu_memory_bytes())),
            Reverse(m.gpus),
            Reverse(m.replica_memory_bytes()),
            m.name.as_str(),
            m.version,
        )
    });
    for model in order {
        let group = groups
            .get(&(model.name.as_str(), model.version))
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        plan_model(model, group, &moves, &mut pool, evictor.as_mut(), &mut out);
    }
    if load.rebalance.max_moves > 0 {
        rebalance::plan_moves(&by_key, replicas, &load.rebalance, &mut pool, &mut out);
    }

    out.add.sort_by(|a, b| {
        (a.model.as_str(), a.version, a.node.as_str()).cmp(&(
            b.model.as_str(),
            b.version,
            b.node.as_str(),
        ))
    });
    // Stable: an eviction (pushed first) wins over the owning model's own removal of it.
    out.remove.sort_by_key(|r| r.replica);
    out.remove.dedup_by_key(|r| r.replica);
    out.unplaced
        .sort_by(|a, b| (a.model.as_str(), a.version).cmp(&(b.model.as_str(), b.version)));
    out
}

fn plan_model(
    model: &ModelView,
    group: &[&CurrentReplica],
    moves: &BTreeMap<u64, &Move>,
    pool: &mut NodePool,
    mut evictor: Option<&mut Evictor>,
    out: &mut Plan,
) {
    let wanted = model.replicas_wanted as usize;
    let mut remove = |replica: &CurrentReplica, reason: Reason| {
        out.remove.push(Removal {
            replica: replica.id,
            reason,
        })
    };

    // Per node, the ready replica with the lowest id is the keeper.
    let mut sorted: Vec<&CurrentReplica> = group.to_vec();
    sorted.sort_by_key(|r| (r.node.as_str(), !r.ready, r.id));
    let mut hosting: BTreeSet<usize> = BTreeSet::new();
    let mut healthy: Vec<(&CurrentReplica, usize)> = Vec::new();
    let mut draining: Vec<&CurrentReplica> = Vec::new();
    let (mut dead, mut conflicts) = (0usize, 0usize);
    for r in sorted {
        match pool.index_of(&r.node) {
            Some(i) if pool.node(i).view.up => {
                if !hosting.insert(i) {
                    remove(r, Reason::SpreadConflict);
                    conflicts += 1;
                } else if pool.node(i).view.drained {
                    draining.push(r);
                } else {
                    healthy.push((r, i));
                }
            }
            _ => {
                remove(r, Reason::NodeDown);
                dead += 1;
            }
        }
    }

    // A replica being moved away leaves `healthy` once its replacement exists on an eligible
    // node: like a drained one, it stays until enough replicas are ready elsewhere.
    let mut moving: Vec<(&CurrentReplica, &Move)> = Vec::new();
    healthy.retain(|&(r, i)| {
        let Some(&m) = moves.get(&r.id) else {
            return true;
        };
        let arrived = m.model == model.name
            && m.version == model.version
            && pool
                .index_of(&m.to)
                .is_some_and(|t| t != i && hosting.contains(&t) && pool.node(t).eligible());
        if arrived {
            moving.push((r, m));
        }
        !arrived
    });

    if healthy.len() > wanted {
        healthy.sort_by_key(|&(r, i)| {
            let n = pool.node(i);
            (r.ready, Reverse(n.load_ppm), n.free(), i, r.id)
        });
        let surplus = healthy.len() - wanted;
        for (r, _) in healthy.drain(..surplus) {
            remove(r, Reason::ScaleDown);
        }
    }

    let ready_healthy = healthy.iter().filter(|(r, _)| r.ready).count();
    let keep_leaving = wanted.saturating_sub(ready_healthy);
    let mut leaving: Vec<(&CurrentReplica, Option<&Move>)> = draining
        .iter()
        .map(|r| (*r, None))
        .chain(moving.iter().map(|&(r, m)| (r, Some(m))))
        .collect();
    leaving.sort_by_key(|(r, _)| (!r.ready, r.id));
    for (r, moved) in leaving.into_iter().skip(keep_leaving) {
        let reason = match moved {
            _ if wanted == 0 => Reason::ScaleDown,
            None => Reason::Drain,
            Some(m) => Reason::Rebalance {
                from: m.from.clone(),
                to: m.to.clone(),
                why: format!("its replacement on {} is in place", m.to),
            },
        };
        remove(r, reason);
    }

    let need = wanted.saturating_sub(healthy.len());
    let fresh = if group.is_empty() {
        Reason::NewModel
    } else {
        Reason::ScaleUp
    };
    let reasons = std::iter::repeat_n(Reason::NodeDown, dead)
        .chain(std::iter::repeat_n(Reason::Drain, draining.len()))
        .chain(std::iter::repeat_n(Reason::SpreadConflict, conflicts))
        .chain(std::iter::repeat(fresh))
        .take(need);
    let bytes = model.replica_memory_bytes();
    let gpu_bytes = model.replica_gpu_memory_bytes();
    for (placed, reason) in reasons.enumerate() {
        let picked = if model.gpus == 0 {
            pool.pick(bytes, &hosting)
                .map(|i| (i, Vec::new(), Vec::new()))
        } else {
            pool.pick_gpus(bytes, model.gpus, gpu_bytes, &hosting)
                .map(|p| (p.node, p.gpus, p.skipped))
        };
        let picked = match (picked, evictor.as_deref_mut()) {
            (
                Err(why @ (Reason::NoCapacity { .. } | Reason::NoGpuCapacity { .. })),
                Some(evictor),
            ) if pool.has_capacity_for(bytes, &hosting) => {
                match evictor.make_room(model, &hosting, pool, out) {
                    Some(room) => Ok((room.node, room.gpus, Vec::new(), room.evicted)),
                    None => Err(match evictor.held() {
                        Some(held) => Reason::CacheFull {
                            cause: Box::new(why),
                            held,
                        },
                        None => why,
                    }),
                }
            }
            (picked, _) => picked.map(|(i, gpus, skipped)| (i, gpus, skipped, Vec::new())),
        };
        match picked {
            Ok((i, gpus, skipped, evicted)) => {
                pool.charge(
                    i,
                    &Charge {
                        memory: bytes,
                        gpus: &gpus,
                        gpu_memory: gpu_bytes,
                    },
                );
                hosting.insert(i);
                out.add.push(Addition {
                    model: model.name.clone(),
                    version: model.version,
                    node: pool.node(i).view.id.clone(),
                    reason,
                    gpus,
                    skipped,
                    moves: None,
                    evicted,
                });
            }
            Err(why) => {
                out.unplaced.push(Unplaced {
                    model: model.name.clone(),
                    version: model.version,
                    missing: (need - placed) as u32,
                    reason: why,
                });
                break;
            }
        }
    }
}
