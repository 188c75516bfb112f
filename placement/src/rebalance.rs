//! Rebalancing: moving ready replicas from loaded nodes to light ones, make-before-break, within
//! a budget of moves in flight. Runs after the other rules, on what the cluster will look like
//! once this plan and the moves in flight are carried out (the projection).
//!
//! ```text
//!  projection per eligible node: memory used (fraction of capacity) and replica count
//!    memory spread > 20 points ─► memory rule: move r from s to t if t, after, stays below
//!                                 what s used before (r takes memory on s)
//!    otherwise                  ─► count rule: move r from s to t if t holds at least 2 fewer
//!                                 replicas than s, and the memory spread stays ≤ 20 points
//!  a move = Addition { reason: Rebalance, moves: Some(r) }; later plans remove r once its
//!  replacement is ready (plan.rs, rule 7)
//! ```
//!
//! Why it cannot oscillate: each memory move takes a value off the sorted list of node loads and
//! puts back two values below it, so that list (read from the largest) strictly decreases; each
//! count move does the same to the sorted list of replica counts while the memory spread stays
//! within the threshold, so no memory move follows it. Both lists have finitely many values, so
//! rebalancing stops: repeated rounds make moves, then none.
//!
//! Only ready replicas of model versions this plan leaves alone (no addition, removal or move in
//! flight) move; the target must not hold that version, must have the memory (counted as
//! conservatively as every addition) and, for a GPU model, the GPUs ([`PoolNode::fit_gpus`]).
//! Each round tries the [`CANDIDATES`] most loaded sources against the [`CANDIDATES`] lightest
//! targets, so a round costs O(nodes · log nodes + candidates² · replicas on a source).

use std::collections::{BTreeMap, BTreeSet};

use super::pool::{Charge, ModelKey, NodePool, PoolNode, replica_charge};
use super::{Addition, CurrentReplica, ModelView, Plan, Reason, Rebalance};

/// Memory spread (most used fraction minus least used, in parts per million) above which
/// memory decides the moves.
pub const MEMORY_SKEW_PPM: u64 = 200_000;

/// How many sources and targets one move considers.
const CANDIDATES: usize = 16;

/// Which measure a round balances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    Memory,
    Count,
}

/// The cluster once this plan and the moves in flight are done, per pool node index.
struct Projection {
    used: Vec<u64>,
    count: Vec<u32>,
    capacity: Vec<u64>,
    /// Eligible nodes with memory: the only sources and targets.
    eligible: Vec<usize>,
    /// (model, version, node) that hold a replica, now or once the plan is done.
    hosting: BTreeSet<(String, i64, usize)>,
}

impl Projection {
    fn ppm(&self, i: usize) -> u64 {
        ppm(self.used[i], self.capacity[i])
    }

    /// The memory spread over eligible nodes, with `changed` nodes at the given fractions.
    fn spread_with(&self, changed: &[(usize, u64)]) -> u64 {
        let value = |i: usize| {
            changed
                .iter()
                .find(|(c, _)| *c == i)
                .map_or_else(|| self.ppm(i), |&(_, v)| v)
        };
        let (mut lo, mut hi) = (u64::MAX, 0u64);
        for &i in &self.eligible {
            let v = value(i);
            lo = lo.min(v);
            hi = hi.max(v);
        }
        hi.saturating_sub(lo)
    }
}

fn ppm(used: u64, capacity: u64) -> u64 {
    if capacity == 0 {
        return 0;
    }
    (u128::from(used) * 1_000_000 / u128::from(capacity)) as u64
}

struct Candidate<'r> {
    replica: &'r CurrentReplica,
    model: &'r ModelView,
    /// What leaves the source.
    freed: u64,
}

/// One move found: the replica, its target, the GPUs it gets there and why.
struct Found<'r> {
    candidate: &'r Candidate<'r>,
    source: usize,
    target: usize,
    gpus: Vec<u32>,
    why: String,
}

/// Adds up to the budget's free moves to `out` (see the module docs for the rule).
pub(super) fn plan_moves(
    models: &BTreeMap<ModelKey, &ModelView>,
    replicas: &[CurrentReplica],
    rebalance: &Rebalance,
    pool: &mut NodePool,
    out: &mut Plan,
) {
    let removed: BTreeSet<u64> = out.remove.iter().map(|r| r.replica).collect();
    let live: BTreeMap<u64, &CurrentReplica> = replicas
        .iter()
        .filter(|r| !removed.contains(&r.id))
        .map(|r| (r.id, r))
        .collect();
    let mut proj = project(models, &live, pool, out);

    // Moves still in flight: their replica is there and so is its replacement.
    let mut touched: BTreeSet<(String, i64)> = BTreeSet::new();
    let mut leaving: BTreeSet<u64> = BTreeSet::new();
    for m in &rebalance.in_flight {
        let arrived = pool.index_of(&m.to).is_some_and(|t| {
            pool.node(t).eligible() && proj.hosting.contains(&(m.model.clone(), m.version, t))
        });
        if live.contains_key(&m.replica) && arrived {
            leaving.insert(m.replica);
            touched.insert((m.model.clone(), m.version));
        }
    }
    for r in leaving.iter().filter_map(|id| live.get(id)) {
        if let Some(i) = pool.index_of(&r.node) {
            let model = models.get(&(r.model.as_str(), r.version)).copied();
            proj.used[i] = proj.used[i].saturating_sub(replica_charge(r, model).memory);
            proj.count[i] = proj.count[i].saturating_sub(1);
        }
    }
    let mut budget = (rebalance.max_moves as usize).saturating_sub(leaving.len());
    if budget == 0 {
        return;
    }
    touched.extend(out.add.iter().map(|a| (a.model.clone(), a.version)));
    touched.extend(
        replicas
            .iter()
            .filter(|r| removed.contains(&r.id))
            .map(|r| (r.model.clone(), r.version)),
    );

    // Movable replicas per source node: ready, on an eligible node, of an untouched version.
    let mut movable: BTreeMap<usize, Vec<Candidate>> = BTreeMap::new();
    for r in live
        .values()
        .filter(|r| r.ready && !leaving.contains(&r.id))
    {
        let (Some(i), Some(&model)) = (
            pool.index_of(&r.node),
            models.get(&(r.model.as_str(), r.version)),
        ) else {
            continue;
        };
        if !proj.eligible.contains(&i) || touched.contains(&(r.model.clone(), r.version)) {
            continue;
        }
        movable.entry(i).or_default().push(Candidate {
            replica: r,
            model,
            freed: replica_charge(r, Some(model)).memory,
        });
    }

    let mut moved: BTreeSet<u64> = BTreeSet::new();
    while budget > 0 {
        let Some(found) = find_move(&proj, &movable, &moved, pool) else {
            break;
        };
        let c = found.candidate;
        let bytes = c.model.replica_memory_bytes();
        pool.charge(
            found.target,
            &Charge {
                memory: bytes,
                gpus: &found.gpus,
                gpu_memory: c.model.replica_gpu_memory_bytes(),
            },
        );
        proj.used[found.source] = proj.used[found.source].saturating_sub(c.freed);
        proj.count[found.source] = proj.count[found.source].saturating_sub(1);
        proj.used[found.target] = proj.used[found.target].saturating_add(bytes);
        proj.count[found.target] += 1;
        proj.hosting
            .insert((c.model.name.clone(), c.model.version, found.target));
        // One move per model version at a time.
        for list in movable.values() {
            moved.extend(
                list.iter()
                    .filter(|o| o.model.name == c.model.name && o.model.version == c.model.version)
                    .map(|o| o.replica.id),
            );
        }
        out.add.push(Addition {
            model: c.model.name.clone(),
            version: c.model.version,
            node: pool.node(found.target).view.id.clone(),
            reason: Reason::Rebalance {
                from: c.replica.node.clone(),
                to: pool.node(found.target).view.id.clone(),
                why: found.why,
            },
            gpus: found.gpus,
            skipped: Vec::new(),
            moves: Some(c.replica.id),
            evicted: Vec::new(),
        });
        budget -= 1;
    }
}

/// Memory and replica counts per node once `out` and the current replicas are in place.
fn project(
    models: &BTreeMap<ModelKey, &ModelView>,
    live: &BTreeMap<u64, &CurrentReplica>,
    pool: &NodePool,
    out: &Plan,
) -> Projection {
    let n = pool.len();
    let mut proj = Projection {
        used: vec![0; n],
        count: vec![0; n],
        capacity: (0..n)
            .map(|i| pool.node(i).view.memory_capacity_bytes)
            .collect(),
        eligible: (0..n)
            .filter(|&i| pool.node(i).eligible() && pool.node(i).view.memory_capacity_bytes > 0)
            .collect(),
        hosting: BTreeSet::new(),
    };
    for r in live.values() {
        if let Some(i) = pool.index_of(&r.node) {
            let model = models.get(&(r.model.as_str(), r.version)).copied();
            proj.used[i] = proj.used[i].saturating_add(replica_charge(r, model).memory);
            proj.count[i] += 1;
            proj.hosting.insert((r.model.clone(), r.version, i));
        }
    }
    for a in &out.add {
        if let Some(i) = pool.index_of(&a.node) {
            let bytes = models
                .get(&(a.model.as_str(), a.version))
                .map_or(0, |m| m.replica_memory_bytes());
            proj.used[i] = proj.used[i].saturating_add(bytes);
            proj.count[i] += 1;
            proj.hosting.insert((a.model.clone(), a.version, i));
        }
    }
    proj
}

/// The best move under the rule the projection calls for, if any.
fn find_move<'r>(
    proj: &Projection,
    movable: &'r BTreeMap<usize, Vec<Candidate<'r>>>,
    moved: &BTreeSet<u64>,
    pool: &NodePool,
) -> Option<Found<'r>> {
    let rule = if proj.spread_with(&[]) > MEMORY_SKEW_PPM {
        Rule::Memory
    } else {
        Rule::Count
    };
    let weight = |i: usize| match rule {
        Rule::Memory => (proj.ppm(i), u64::from(proj.count[i])),
        Rule::Count => (u64::from(proj.count[i]), proj.ppm(i)),
    };
    let mut sources: Vec<usize> = proj.eligible.clone();
    sources.sort_by_key(|&i| (std::cmp::Reverse(weight(i)), i));
    let mut targets: Vec<usize> = proj.eligible.clone();
    targets.sort_by_key(|&i| (weight(i), i));

    for &s in sources.iter().take(CANDIDATES) {
        let Some(list) = movable.get(&s) else {
            continue;
        };
        for &t in targets.iter().take(CANDIDATES) {
            if t == s {
                continue;
            }
            // Targets are sorted lightest first: once one is too heavy, so are the rest.
            let heavy = match rule {
                Rule::Memory => proj.ppm(t) >= proj.ppm(s),
                Rule::Count => proj.count[t] + 1 >= proj.count[s],
            };
            if heavy {
                break;
            }
            if let Some(found) = best_on(proj, rule, list, moved, pool, s, t) {
                return Some(found);
            }
        }
    }
    None
}

/// A candidate move's rank (the larger used fraction of the two nodes after it, then model,
/// version and replica id), the candidate and the GPUs it would get.
type Best<'r> = ((u64, &'r str, i64, u64), &'r Candidate<'r>, Vec<u32>);

/// Among the replicas on `s`, the one whose move to `t` the rule allows and that leaves the two
/// nodes most even (the lower of their larger used fraction), ties by model, version, id.
fn best_on<'r>(
    proj: &Projection,
    rule: Rule,
    list: &'r [Candidate<'r>],
    moved: &BTreeSet<u64>,
    pool: &NodePool,
    s: usize,
    t: usize,
) -> Option<Found<'r>> {
    let target: &PoolNode = pool.node(t);
    let mut best: Option<Best> = None;
    for c in list.iter().filter(|c| !moved.contains(&c.replica.id)) {
        let m = c.model;
        if proj.hosting.contains(&(m.name.clone(), m.version, t)) {
            continue;
        }
        let bytes = m.replica_memory_bytes();
        if target.free() < bytes {
            continue;
        }
        let source_after = ppm(proj.used[s].saturating_sub(c.freed), proj.capacity[s]);
        let target_after = ppm(proj.used[t].saturating_add(bytes), proj.capacity[t]);
        let allowed = match rule {
            Rule::Memory => c.freed > 0 && target_after < proj.ppm(s),
            Rule::Count => {
                proj.spread_with(&[(s, source_after), (t, target_after)]) <= MEMORY_SKEW_PPM
            }
        };
        if !allowed {
            continue;
        }
        let gpus = if m.gpus == 0 {
            Vec::new()
        } else {
            match target.fit_gpus(m.gpus, m.replica_gpu_memory_bytes()) {
                Ok(gpus) => gpus,
                Err(_) => continue,
            }
        };
        let key = (
            source_after.max(target_after),
            m.name.as_str(),
            m.version,
            c.replica.id,
        );
        if best.as_ref().is_none_or(|(k, _, _)| key < *k) {
            best = Some((key, c, gpus));
        }
    }
    let (_, candidate, gpus) = best?;
    let (from, to) = (&pool.node(s).view.id, &target.view.id);
    let why = match rule {
        Rule::Memory => format!(
            "memory {}% used on {from}, {}% on {to}: more than {} points apart",
            proj.ppm(s) / 10_000,
            proj.ppm(t) / 10_000,
            MEMORY_SKEW_PPM / 10_000
        ),
        Rule::Count => format!(
            "{from} holds {} replicas, {to} holds {}",
            proj.count[s], proj.count[t]
        ),
    };
    Some(Found {
        candidate,
        source: s,
        target: t,
        gpus,
        why,
    })
}
