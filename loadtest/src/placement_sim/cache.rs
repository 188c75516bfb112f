//! `placement-sim --cache`: the model cache (more models than memory) at scale. Every model is
//! cacheable (`min_replicas` 0, floor 0); requests arrive in leader rounds, Zipf-distributed
//! over the models; the control plane's pure `plan` makes room by evicting least recently used
//! idle replicas ([`nereid_placement::plan`] with `Load::cache`), as the leader does.
//!
//! ```text
//! per round (one leader round, `--cache-batch` requests):
//!   each request: its model has a replica ─► hit (last used = now)
//!                 none                      ─► miss: activated (wanted 1, last used = now)
//!   busy = the replicas of models requested this round (in flight: never evicted)
//!   plan (timed) ─► apply: additions load at once (placed now), evicted replicas go and their
//!                   models lose their activation (as the leader forgets it)
//! report: hit rate, evictions and loads per round, unplaced activations, plan time p50/max
//! ```
//!
//! The clock advances `--cache-round-ms` per round; a replica is evictable once it has stayed
//! `--cache-min-residency-ms` (the leader's `--evict-min-residency-ms`). A miss is served in a
//! later round once its replica is placed; a request that finds the replica placed in the same
//! round's plan counted as a miss (a cold start), which is what a client sees.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::cluster::Cluster;
use crate::rng::SplitMix64;

/// Settings of the cache simulation.
#[derive(Debug, Clone, Copy)]
pub struct CacheSim {
    /// Requests in all.
    pub requests: usize,
    /// Requests per leader round.
    pub batch: usize,
    /// Zipf exponent of model popularity (model i has rank i + 1).
    pub zipf: f64,
    /// Simulated time per round.
    pub round_ms: u64,
    /// Minimum residency before a replica may be evicted.
    pub min_residency_ms: u64,
}

/// What the simulation measured.
#[derive(Debug, Clone, Default)]
pub struct CacheReport {
    pub requests: u64,
    pub hits: u64,
    pub rounds: u64,
    pub loads: u64,
    pub evictions: u64,
    /// Activations that found no room and nothing evictable, summed over rounds.
    pub unplaced: u64,
    pub plan_times: Vec<Duration>,
    /// Replicas at the end, and the memory they hold over the cluster's capacity.
    pub final_replicas: u64,
    pub final_utilization: f64,
}

impl CacheReport {
    pub fn hit_rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.hits as f64 / self.requests as f64
        }
    }

    fn plan_ms(&self, q: f64) -> f64 {
        let mut t: Vec<Duration> = self.plan_times.clone();
        t.sort();
        t.get(((t.len().saturating_sub(1)) as f64 * q).round() as usize)
            .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
    }

    pub fn to_json(&self) -> Value {
        json!({
            "requests": self.requests,
            "hits": self.hits,
            "hit_rate": self.hit_rate(),
            "rounds": self.rounds,
            "loads": self.loads,
            "evictions": self.evictions,
            "unplaced_activations": self.unplaced,
            "plan_ms_p50": self.plan_ms(0.5),
            "plan_ms_max": self.plan_ms(1.0),
            "final_replicas": self.final_replicas,
            "final_utilization": self.final_utilization,
        })
    }

    pub fn to_table(&self) -> String {
        format!(
            "requests {}  hit rate {:.1} %  loads (cold starts) {}  evictions {}  unplaced activations {}\n\
             rounds {}  plan p50 {:.1} ms  max {:.1} ms  replicas at the end {}  memory utilization {:.1} %\n",
            self.requests,
            100.0 * self.hit_rate(),
            self.loads,
            self.evictions,
            self.unplaced,
            self.rounds,
            self.plan_ms(0.5),
            self.plan_ms(1.0),
            self.final_replicas,
            100.0 * self.final_utilization,
        )
    }
}

/// Cumulative Zipf weights over `n` ranks, for sampling by binary search.
fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (1..=n)
        .map(|k| {
            acc += 1.0 / (k as f64).powf(s);
            acc
        })
        .collect();
    for c in &mut cdf {
        *c /= acc;
    }
    cdf
}

fn sample(cdf: &[f64], rng: &mut SplitMix64) -> usize {
    let u = rng.next_f64();
    cdf.partition_point(|&c| c < u).min(cdf.len() - 1)
}

/// Runs the cache simulation on `cluster` (its models' wanted counts are reset to 0: all
/// cacheable).
pub fn run(cluster: &mut Cluster, sim: &CacheSim, rng: &mut SplitMix64) -> CacheReport {
    for m in &mut cluster.models {
        m.replicas_wanted = 0;
    }
    let cdf = zipf_cdf(cluster.models.len(), sim.zipf);
    let index: BTreeMap<String, usize> = cluster
        .models
        .iter()
        .enumerate()
        .map(|(i, m)| (m.name.clone(), i))
        .collect();
    let cache = &mut cluster.load.cache;
    cache.evict = true;
    cache.min_residency_ms = sim.min_residency_ms;
    cache.floor = cluster.models.iter().map(|m| (m.name.clone(), 0)).collect();

    let mut report = CacheReport::default();
    let mut now_ms = sim.min_residency_ms.max(1);
    let mut remaining = sim.requests;
    let batch = sim.batch.max(1);
    while remaining > 0 {
        let n = remaining.min(batch);
        remaining -= n;
        let mut requested: BTreeSet<usize> = BTreeSet::new();
        let mut hits = 0;
        {
            let hosted: BTreeSet<&str> =
                cluster.replicas.iter().map(|r| r.model.as_str()).collect();
            for _ in 0..n {
                let i = sample(&cdf, rng);
                if hosted.contains(cluster.models[i].name.as_str()) {
                    hits += 1;
                }
                requested.insert(i);
            }
        }
        report.requests += n as u64;
        report.hits += hits;
        for &i in &requested {
            let m = &mut cluster.models[i];
            m.replicas_wanted = m.replicas_wanted.max(1);
            cluster
                .load
                .cache
                .last_used_ms
                .insert(m.name.clone(), now_ms);
        }
        let busy: BTreeSet<(String, i64, String)> = cluster
            .replicas
            .iter()
            .filter(|r| index.get(&r.model).is_some_and(|i| requested.contains(i)))
            .map(|r| (r.model.clone(), r.version, r.node.clone()))
            .collect();
        cluster.load.cache.busy = busy;
        cluster.load.cache.now_ms = now_ms;

        let started = Instant::now();
        let plan = cluster.plan();
        report.plan_times.push(started.elapsed());
        report.rounds += 1;
        report.loads += plan.add.len() as u64;
        report.unplaced += plan
            .unplaced
            .iter()
            .map(|u| u64::from(u.missing))
            .sum::<u64>();
        let evicted: Vec<String> = plan
            .add
            .iter()
            .flat_map(|a| a.evicted.iter().map(|e| e.model.clone()))
            .collect();
        report.evictions += evicted.len() as u64;
        let before = cluster.replicas.len() - plan.remove.len();
        cluster.apply(&plan);
        for r in &cluster.replicas[before..] {
            cluster.load.cache.placed_at_ms.insert(r.id, now_ms);
        }
        for model in evicted {
            if let Some(&i) = index.get(&model) {
                cluster.models[i].replicas_wanted = 0;
            }
        }
        let live: BTreeSet<u64> = cluster.replicas.iter().map(|r| r.id).collect();
        cluster
            .load
            .cache
            .placed_at_ms
            .retain(|id, _| live.contains(id));
        now_ms += sim.round_ms;
    }
    let packing = cluster.packing();
    report.final_replicas = packing.replicas;
    report.final_utilization = packing.utilization();
    report
}

#[cfg(test)]
mod tests {
    use super::super::cluster::{ModelSizes, Weighted};
    use super::*;

    const GIB: u64 = 1 << 30;

    fn small(nodes: usize, models: usize) -> Cluster {
        Cluster::generate(
            nodes,
            models,
            0,
            &Weighted(vec![(8 * GIB, 1)]),
            ModelSizes {
                min: GIB,
                max: GIB,
                skew: 1.0,
            },
            &mut SplitMix64::new(7),
        )
    }

    #[test]
    fn zipf_favours_low_ranks_and_stays_in_range() {
        let cdf = zipf_cdf(100, 1.1);
        assert!((cdf[99] - 1.0).abs() < 1e-9);
        let mut rng = SplitMix64::new(1);
        let draws: Vec<usize> = (0..10_000).map(|_| sample(&cdf, &mut rng)).collect();
        assert!(draws.iter().all(|&i| i < 100));
        let top = draws.iter().filter(|&&i| i < 10).count();
        assert!(
            top > 5_000,
            "the 10 most popular of 100 take most requests ({top})"
        );
    }

    #[test]
    fn more_models_than_memory_evict_and_never_overfill() {
        // 2 nodes of 8 GiB, 40 models of 1 GiB: 16 fit at once.
        let mut c = small(2, 40);
        let sim = CacheSim {
            requests: 4_000,
            batch: 20,
            zipf: 1.1,
            round_ms: 1_000,
            min_residency_ms: 2_000,
        };
        let r = run(&mut c, &sim, &mut SplitMix64::new(3));
        assert_eq!(r.requests, 4_000);
        assert!(r.evictions > 0, "{r:?}");
        assert!(r.hit_rate() > 0.5 && r.hit_rate() < 1.0, "{r:?}");
        assert!(r.final_replicas <= 16, "{r:?}");
        assert!(r.final_utilization <= 1.0, "{r:?}");
    }

    #[test]
    fn everything_fits_no_eviction_and_only_first_requests_miss() {
        let mut c = small(4, 20);
        let sim = CacheSim {
            requests: 2_000,
            batch: 10,
            zipf: 1.1,
            round_ms: 1_000,
            min_residency_ms: 2_000,
        };
        let r = run(&mut c, &sim, &mut SplitMix64::new(3));
        assert_eq!(r.evictions, 0);
        assert_eq!(r.unplaced, 0);
        assert!(r.loads <= 20, "{r:?}");
        assert!(
            r.requests - r.hits <= 2 * 20,
            "misses only before a model's first load"
        );
    }
}
