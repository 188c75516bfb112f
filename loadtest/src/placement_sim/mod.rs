//! `nereid-loadtest placement-sim`: times the control plane's pure placement function
//! ([`nereid_placement::plan`]) on a synthetic cluster, no server involved.
//!
//! ```text
//! generate nodes (weighted memory sizes) + models (skewed sizes), seeded
//!   ─► initial   plan on an empty cluster (timed --rounds times; plan is pure), apply
//!   ─► steady    replan a settled cluster (should change nothing)
//!   ─► per round: kill-1%    mark 1% of up nodes down, plan, apply
//!                 drain      drain one node: plan (replacements), apply, plan (removals), apply
//!                 scale-1%   give 1% of models a new replica count, plan, apply
//!   ─► report: p50/max time per kind of round, adds/removes, unplaced replicas, and packing
//! ```
//!
//! With `--cache`, the model cache instead (`cache.rs`): every model `min_replicas` 0, Zipf
//! requests per leader round, eviction of least recently used idle replicas; hit rate, loads,
//! evictions and plan time.
//!
//! Applying a plan makes every added replica ready at once, so each round starts settled.
//! Packing efficiency is the memory of placed replicas over the capacity of the nodes that host
//! at least one; utilization is over every up node.

mod cache;
mod cluster;
mod report;

use nereid_placement::parse_bytes;
use std::io::Write;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::json;

use crate::rng::SplitMix64;
use cluster::{Cluster, ModelSizes, Weighted};
use report::{Report, RoundStats};

/// Flags of `placement-sim`.
#[derive(Debug, Args, Clone)]
pub struct PlacementSimArgs {
    /// Worker nodes in the simulated cluster.
    #[arg(long, default_value_t = 1000)]
    pub nodes: usize,
    /// Models (one version each).
    #[arg(long, default_value_t = 10_000)]
    pub models: usize,
    /// Replicas each model wants.
    #[arg(long, default_value_t = 2)]
    pub replicas: u32,
    /// Seed of the generator (same seed, same cluster and events).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Incremental rounds (each: kill 1% of nodes, drain a node, rescale 1% of models).
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Node memory sizes with relative weights, `SIZE[:WEIGHT],...` (Ki/Mi/Gi/Ti suffixes).
    #[arg(long, default_value = "32Gi:4,64Gi:3,128Gi:2,256Gi:1", value_parser = parse_weighted)]
    pub node_memory: Weighted,
    /// Smallest model replica.
    #[arg(long, default_value = "256Mi", value_parser = parse_size)]
    pub model_memory_min: u64,
    /// Largest model replica.
    #[arg(long, default_value = "16Gi", value_parser = parse_size)]
    pub model_memory_max: u64,
    /// Size skew: 1 = log-uniform between min and max; higher = more small models.
    #[arg(long, default_value_t = 2.0)]
    pub model_memory_skew: f64,
    /// Slowest acceptable round, for the verdict line.
    #[arg(long, default_value_t = 100)]
    pub target_ms: u64,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Simulate the model cache instead (more models than memory, every model `min_replicas`
    /// 0): Zipf-distributed requests, placement evicting least recently used idle replicas.
    #[arg(long)]
    pub cache: bool,
    /// With --cache: requests in all.
    #[arg(long, default_value_t = 50_000)]
    pub cache_requests: usize,
    /// With --cache: requests per leader round.
    #[arg(long, default_value_t = 500)]
    pub cache_batch: usize,
    /// With --cache: Zipf exponent of model popularity.
    #[arg(long, default_value_t = 1.1)]
    pub cache_zipf: f64,
    /// With --cache: simulated time per leader round (ms).
    #[arg(long, default_value_t = 1_000)]
    pub cache_round_ms: u64,
    /// With --cache: minimum residency before eviction (ms), as `--evict-min-residency-ms`.
    #[arg(long, default_value_t = 60_000)]
    pub cache_min_residency_ms: u64,
}

/// A positive byte count (`512Mi`, `16Gi`...), see [`parse_bytes`].
pub fn parse_size(text: &str) -> Result<u64, String> {
    match parse_bytes(text)? {
        0 => Err(format!("'{text}' is not a positive size")),
        n => Ok(n),
    }
}

/// Parses `SIZE[:WEIGHT],...`.
pub fn parse_weighted(text: &str) -> Result<Weighted, String> {
    let entries = text
        .split(',')
        .map(|part| {
            let (size, weight) = part.split_once(':').unwrap_or((part, "1"));
            let weight: u32 = weight
                .trim()
                .parse()
                .ok()
                .filter(|w| *w > 0)
                .ok_or_else(|| format!("'{part}': weight must be a positive integer"))?;
            Ok((parse_size(size)?, weight))
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(Weighted(entries))
}

/// Plans, records the timing and outcome under `stats`, applies the plan.
fn round(cluster: &mut Cluster, stats: &mut RoundStats) {
    let started = Instant::now();
    let plan = cluster.plan();
    stats.times.push(started.elapsed());
    stats.adds.push(plan.add.len());
    stats.removes.push(plan.remove.len());
    stats
        .unplaced
        .push(plan.unplaced.iter().map(|u| u64::from(u.missing)).sum());
    cluster.apply(&plan);
}

/// Picks `n` distinct indices below `len` whose element passes `eligible`.
fn pick(
    rng: &mut SplitMix64,
    len: usize,
    n: usize,
    eligible: impl Fn(usize) -> bool,
) -> Vec<usize> {
    let mut candidates: Vec<usize> = (0..len).filter(|&i| eligible(i)).collect();
    let mut chosen = Vec::new();
    while chosen.len() < n && !candidates.is_empty() {
        let i = rng.below(candidates.len() as u64) as usize;
        chosen.push(candidates.swap_remove(i));
    }
    chosen
}

/// Runs the simulation and writes the report (table, or JSON with `--json`) to `out`.
pub fn run(args: &PlacementSimArgs, out: &mut dyn Write) -> Result<(), String> {
    if args.model_memory_min == 0 || args.model_memory_min > args.model_memory_max {
        return Err("--model-memory-min must be positive and at most --model-memory-max".into());
    }
    if !(args.model_memory_skew > 0.0 && args.model_memory_skew.is_finite()) {
        return Err("--model-memory-skew must be a positive number".into());
    }
    let mut rng = SplitMix64::new(args.seed);
    let sizes = ModelSizes {
        min: args.model_memory_min,
        max: args.model_memory_max,
        skew: args.model_memory_skew,
    };
    let mut cluster = Cluster::generate(
        args.nodes,
        args.models,
        args.replicas,
        &args.node_memory,
        sizes,
        &mut rng,
    );
    if args.cache {
        return run_cache(args, &mut cluster, &mut rng, out);
    }
    let samples = args.rounds.max(1);

    // Initial placement: the same pure input timed several times, applied once.
    let mut initial = RoundStats::new("initial");
    for _ in 0..samples - 1 {
        let started = Instant::now();
        let _ = cluster.plan();
        initial.times.push(started.elapsed());
    }
    round(&mut cluster, &mut initial);
    let initial_packing = cluster.packing();

    let mut steady = RoundStats::new("steady");
    let mut kill = RoundStats::new("kill-1%");
    let mut drain = RoundStats::new("drain-node");
    let mut scale = RoundStats::new("scale-1%");
    for _ in 0..args.rounds {
        round(&mut cluster, &mut steady);

        let n = (cluster.nodes.len() / 100).max(1);
        let up: Vec<bool> = cluster.nodes.iter().map(|n| n.up).collect();
        for i in pick(&mut rng, up.len(), n, |i| up[i]) {
            cluster.nodes[i].up = false;
        }
        round(&mut cluster, &mut kill);

        let usable: Vec<bool> = cluster.nodes.iter().map(|n| n.up && !n.drained).collect();
        for i in pick(&mut rng, usable.len(), 1, |i| usable[i]) {
            cluster.nodes[i].drained = true;
        }
        round(&mut cluster, &mut drain); // replacements (make)
        round(&mut cluster, &mut drain); // drained replicas go (break)

        let n = (cluster.models.len() / 100).max(1);
        for i in pick(&mut rng, cluster.models.len(), n, |_| true) {
            let wanted = 1 + rng.below(u64::from(args.replicas) + 2) as u32;
            cluster.models[i].replicas_wanted = wanted;
        }
        round(&mut cluster, &mut scale);
    }

    let mut rounds = vec![initial];
    rounds.extend(
        [steady, kill, drain, scale]
            .into_iter()
            .filter(|r| !r.times.is_empty()),
    );
    let report = Report {
        settings: json!({
            "nodes": args.nodes,
            "models": args.models,
            "replicas": args.replicas,
            "seed": args.seed,
            "rounds": args.rounds,
            "node_memory": args.node_memory.0.iter()
                .map(|(s, w)| json!({"bytes": s, "weight": w})).collect::<Vec<_>>(),
            "model_memory_min": args.model_memory_min,
            "model_memory_max": args.model_memory_max,
            "model_memory_skew": args.model_memory_skew,
        }),
        rounds,
        initial: initial_packing,
        last: cluster.packing(),
        target: Duration::from_millis(args.target_ms),
    };
    let text = if args.json {
        serde_json::to_string_pretty(&report.to_json()).map_err(|e| e.to_string())? + "\n"
    } else {
        format!(
            "placement-sim: {} nodes, {} models x {} replicas, seed {}, {} rounds\n\n{}",
            args.nodes,
            args.models,
            args.replicas,
            args.seed,
            args.rounds,
            report.to_table()
        )
    };
    out.write_all(text.as_bytes())
        .map_err(|e| format!("cannot write the report: {e}"))
}

/// `--cache`: the model cache simulation on the generated cluster, reported as a table or JSON.
fn run_cache(
    args: &PlacementSimArgs,
    cluster: &mut Cluster,
    rng: &mut SplitMix64,
    out: &mut dyn Write,
) -> Result<(), String> {
    if !(args.cache_zipf > 0.0 && args.cache_zipf.is_finite()) {
        return Err("--cache-zipf must be a positive number".into());
    }
    let sim = cache::CacheSim {
        requests: args.cache_requests,
        batch: args.cache_batch,
        zipf: args.cache_zipf,
        round_ms: args.cache_round_ms,
        min_residency_ms: args.cache_min_residency_ms,
    };
    let report = cache::run(cluster, &sim, rng);
    let text = if args.json {
        let v = json!({
            "settings": {
                "nodes": args.nodes,
                "models": args.models,
                "seed": args.seed,
                "requests": args.cache_requests,
                "batch": args.cache_batch,
                "zipf": args.cache_zipf,
                "round_ms": args.cache_round_ms,
                "min_residency_ms": args.cache_min_residency_ms,
            },
            "cache": report.to_json(),
        });
        serde_json::to_string_pretty(&v).map_err(|e| e.to_string())? + "\n"
    } else {
        format!(
            "placement-sim --cache: {} nodes, {} models (all min_replicas 0), Zipf {}, {} requests in rounds of {}, seed {}\n\n{}",
            args.nodes,
            args.models,
            args.cache_zipf,
            args.cache_requests,
            args.cache_batch,
            args.seed,
            report.to_table()
        )
    };
    out.write_all(text.as_bytes())
        .map_err(|e| format!("cannot write the report: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn args(extra: &[&str]) -> PlacementSimArgs {
        let argv = [&["lt", "placement-sim"], extra].concat();
        match Cli::try_parse_from(argv).unwrap().command {
            Some(Command::PlacementSim(a)) => a,
            _ => panic!("expected placement-sim"),
        }
    }

    #[test]
    fn flags_and_parsers() {
        let a = args(&[]);
        assert_eq!((a.nodes, a.models, a.replicas), (1000, 10_000, 2));
        assert_eq!(a.node_memory.0.len(), 4);
        assert_eq!(a.model_memory_min, 256 << 20);
        assert_eq!(parse_size("2Gi"), Ok(2 << 30));
        assert!(parse_size("0").is_err());
        assert!(parse_size("2Qi").is_err());
        assert_eq!(
            parse_weighted("64Gi:3,1Ti"),
            Ok(Weighted(vec![(64 << 30, 3), (1 << 40, 1)]))
        );
        assert!(parse_weighted("64Gi:0").is_err());
    }

    #[test]
    fn small_simulation_reports_json() {
        let a = args(&["--nodes", "20", "--models", "60", "--rounds", "2", "--json"]);
        let mut out = Vec::new();
        run(&a, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let rounds = v["rounds"].as_array().unwrap();
        let names: Vec<&str> = rounds
            .iter()
            .map(|r| r["round"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            ["initial", "steady", "kill-1%", "drain-node", "scale-1%"]
        );
        assert_eq!(rounds[3]["samples"], 4);
        assert_eq!(v["initial_packing"]["replicas_placed"], 120);
        let e = v["final_packing"]["packing_efficiency"].as_f64().unwrap();
        assert!(e > 0.0 && e <= 1.0);
    }

    #[test]
    fn cache_mode_reports_json() {
        let a = args(&[
            "--nodes",
            "4",
            "--models",
            "60",
            "--cache",
            "--cache-requests",
            "600",
            "--cache-batch",
            "20",
            "--cache-min-residency-ms",
            "2000",
            "--json",
            "--model-memory-min",
            "4Gi",
            "--model-memory-max",
            "4Gi",
            "--node-memory",
            "32Gi",
        ]);
        let mut out = Vec::new();
        run(&a, &mut out).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["cache"]["requests"], 600);
        assert!(v["cache"]["evictions"].as_u64().unwrap() > 0, "{v}");
        assert!(v["cache"]["final_replicas"].as_u64().unwrap() <= 32, "{v}");
    }

    #[test]
    fn table_output() {
        let a = args(&["--nodes", "10", "--models", "20", "--rounds", "1"]);
        let mut out = Vec::new();
        run(&a, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("ROUND"), "{text}");
        assert!(text.contains("packing efficiency"), "{text}");
    }
}
