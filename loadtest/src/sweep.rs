//! `sweep`: a Model-Analyzer-like grid over instance count × max batch size × queue delay.
//!
//! ```text
//! original = GET config ─► grid_points (pure: skips, dedup) ─► for each point:
//!     sweep_config(original, point) (pure) ─► POST repository load {config} ─► run_levels
//! ─► restore: load {original}  (also after an error or Ctrl-C)
//! ─► table + best throughput with p99 ≤ --latency-budget-ms and no errors
//! ```
//! The server must run in explicit model control mode, or loads are refused. Requests are
//! prepared once from the original model: every point keeps the model's batch dimension (a
//! max batch size of 0 turns the dynamic batcher off rather than batching off), so the
//! inputs stay valid.

use serde_json::{Value, json};

use crate::cli::SweepArgs;
use crate::error::LoadtestError;
use crate::progress::Progress;
use crate::report::{self, GridPoint, LevelResult};
use crate::run::{self, Levels, Session};

/// The points to measure, and a note for each value that had to be skipped.
pub fn grid_points(
    args: &SweepArgs,
    model_max_batch: i64,
    batch_size: u32,
) -> (Vec<GridPoint>, Vec<String>) {
    let mut points = Vec::new();
    let mut notes = Vec::new();
    for &instances in &args.instance_counts {
        for &max_batch_size in &args.max_batch_sizes {
            if max_batch_size > 0 && model_max_batch <= 0 {
                notes.push(format!(
                    "skipped max batch size {max_batch_size}: the model does not batch (max_batch_size 0)"
                ));
                continue;
            }
            if max_batch_size > 0 && max_batch_size < batch_size {
                notes.push(format!(
                    "skipped max batch size {max_batch_size}: below -b {batch_size}"
                ));
                continue;
            }
            // Without dynamic batching the queue delay means nothing: measure it once.
            let delays: &[u64] = if max_batch_size == 0 {
                &[0]
            } else {
                &args.max_queue_delays_us
            };
            for &max_queue_delay_us in delays {
                let p = GridPoint {
                    instances,
                    max_batch_size,
                    max_queue_delay_us,
                };
                if !points.contains(&p) {
                    points.push(p);
                }
            }
        }
    }
    notes.dedup();
    (points, notes)
}

/// The model's original config (Triton-style JSON) changed to `point`'s settings.
pub fn sweep_config(original: &Value, point: GridPoint) -> Value {
    let mut config = original.clone();
    let Some(obj) = config.as_object_mut() else {
        return config;
    };
    match obj.get_mut("instance_group").and_then(Value::as_array_mut) {
        Some(groups) if !groups.is_empty() => {
            for g in groups {
                if let Some(g) = g.as_object_mut() {
                    g.insert("count".into(), json!(point.instances));
                }
            }
        }
        _ => {
            obj.insert(
                "instance_group".into(),
                json!([{ "count": point.instances }]),
            );
        }
    }
    if point.max_batch_size == 0 {
        obj.remove("dynamic_batching");
    } else {
        obj.insert("max_batch_size".into(), json!(point.max_batch_size));
        let mut batching = match obj.get("dynamic_batching") {
            Some(Value::Object(b)) => b.clone(),
            _ => serde_json::Map::new(),
        };
        batching.insert(
            "max_queue_delay_microseconds".into(),
            json!(point.max_queue_delay_us),
        );
        if let Some(Value::Array(preferred)) = batching.get_mut("preferred_batch_size") {
            preferred.retain(|p| {
                p.as_u64()
                    .is_some_and(|p| p <= u64::from(point.max_batch_size))
            });
        }
        obj.insert("dynamic_batching".into(), Value::Object(batching));
    }
    config
}

/// The highest throughput among rows with no errors and p99 within the budget.
pub fn best(results: &[LevelResult], latency_budget_ms: f64) -> Option<&LevelResult> {
    let budget_us = latency_budget_ms * 1000.0;
    results
        .iter()
        .filter(|r| {
            r.summary.errors == 0 && r.summary.requests > 0 && r.summary.p99_us as f64 <= budget_us
        })
        .max_by(|a, b| a.summary.throughput.total_cmp(&b.summary.throughput))
}

/// The whole sweep. The original config is restored however the grid ends.
pub async fn sweep(args: &SweepArgs) -> Result<Vec<LevelResult>, LoadtestError> {
    let levels = Levels::from_args(&args.run)?;
    if matches!(levels, Levels::Rate(_)) {
        return Err(LoadtestError::InvalidArgument(
            "sweep runs the closed loop; give --concurrency-range, not --request-rate-range".into(),
        ));
    }
    if !(args.latency_budget_ms.is_finite() && args.latency_budget_ms > 0.0) {
        return Err(LoadtestError::InvalidArgument(
            "--latency-budget-ms must be positive".into(),
        ));
    }
    let session = Session::open(&args.run).await?;
    let original = session.client.model_config().await?;
    let model_max_batch = original
        .get("max_batch_size")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let (points, skipped) = grid_points(args, model_max_batch, args.run.batch_size);
    if points.is_empty() {
        return Err(LoadtestError::InvalidArgument(format!(
            "no grid point to measure: {}",
            skipped.join("; ")
        )));
    }
    println!("{}", session.describe(&args.run));
    println!(
        "sweep: {} configuration(s), latency budget p99 <= {} ms",
        points.len(),
        args.latency_budget_ms
    );
    for note in &skipped {
        println!("note: {note}");
    }
    println!("{}", run::sweep_header());
    let progress = Progress::new(args.run.quiet);
    let mut results = Vec::new();
    let outcome = tokio::select! {
        r = run_grid(&session, &levels, &original, &points, &progress, &mut results) => r,
        _ = tokio::signal::ctrl_c() => Err(LoadtestError::Interrupted),
    };
    progress.set("restoring the original model config".into());
    let restored = session.client.load_model(Some(&original)).await;
    progress.finish();
    outcome?;
    restored.map_err(|e| LoadtestError::RestoreFailed(e.to_string()))?;
    run::finish(&args.run, &results)?;
    match best(&results, args.latency_budget_ms) {
        Some(b) => println!(
            "best within p99 <= {} ms: {}",
            args.latency_budget_ms,
            describe_best(b)
        ),
        None => println!(
            "no configuration met p99 <= {} ms without errors",
            args.latency_budget_ms
        ),
    }
    println!("original config restored");
    run::check_errors(&args.run, &results)?;
    Ok(results)
}

async fn run_grid(
    session: &Session,
    levels: &Levels,
    original: &Value,
    points: &[GridPoint],
    progress: &Progress,
    results: &mut Vec<LevelResult>,
) -> Result<(), LoadtestError> {
    for point in points {
        progress.set(format!(
            "loading: instances {}, max_batch {}, delay {} us",
            point.instances, point.max_batch_size, point.max_queue_delay_us
        ));
        session
            .client
            .load_model(Some(&sweep_config(original, *point)))
            .await?;
        results.extend(run::run_levels(session, levels, Some(*point), progress).await);
    }
    Ok(())
}

fn describe_best(r: &LevelResult) -> String {
    let grid = r.grid.map_or_else(String::new, |g| {
        format!(
            "instances {}, max_batch {}{}, ",
            g.instances,
            g.max_batch_size,
            if g.max_batch_size == 0 {
                " (dynamic batching off)".to_string()
            } else {
                format!(", delay {} us", g.max_queue_delay_us)
            }
        )
    });
    let level = match r.level {
        report::Level::Concurrency(c) => format!("concurrency {c}"),
        report::Level::RequestRate(x) => format!("rate {x}/s"),
    };
    format!(
        "{grid}{level}: {:.1} infer/s, p99 {} us",
        r.summary.throughput, r.summary.p99_us
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::{Cli, Command};
    use crate::report::Level;
    use crate::stats::Window;

    fn args(extra: &[&str]) -> SweepArgs {
        let argv = [&["lt", "sweep", "-m", "m"], extra].concat();
        match Cli::try_parse_from(argv).unwrap().command {
            Some(Command::Sweep(s)) => s,
            _ => panic!("expected sweep"),
        }
    }

    #[test]
    fn grid_dedups_delay_without_batching_and_skips_impossible_points() {
        let (points, notes) = grid_points(&args(&[]), 8, 1);
        // 2 instance counts × (mbs 0 once + mbs 8 and 32 × 2 delays)
        assert_eq!(points.len(), 2 * (1 + 2 * 2));
        assert!(notes.is_empty());
        let (points, notes) = grid_points(&args(&[]), 0, 1);
        assert_eq!(points.len(), 2);
        assert!(notes[0].contains("does not batch"));
        let (points, notes) = grid_points(&args(&["--max-batch-sizes", "4,16"]), 8, 8);
        assert_eq!(points.len(), 2 * 2);
        assert!(notes[0].contains("below -b 8"));
    }

    #[test]
    fn config_override() {
        let original = json!({
            "name": "m", "max_batch_size": 8,
            "instance_group": [{"count": 1, "kind": "KIND_CPU"}],
            "dynamic_batching": {"preferred_batch_size": [4, 16], "max_queue_delay_microseconds": 0}
        });
        let c = sweep_config(
            &original,
            GridPoint {
                instances: 3,
                max_batch_size: 8,
                max_queue_delay_us: 100,
            },
        );
        assert_eq!(
            c["instance_group"][0],
            json!({"count": 3, "kind": "KIND_CPU"})
        );
        assert_eq!(c["dynamic_batching"]["max_queue_delay_microseconds"], 100);
        assert_eq!(c["dynamic_batching"]["preferred_batch_size"], json!([4]));
        let off = sweep_config(
            &original,
            GridPoint {
                instances: 1,
                max_batch_size: 0,
                max_queue_delay_us: 0,
            },
        );
        assert!(off.get("dynamic_batching").is_none());
        assert_eq!(off["max_batch_size"], 8, "the batch dimension is kept");
        let bare = sweep_config(
            &json!({"name": "m", "max_batch_size": 4}),
            GridPoint {
                instances: 2,
                max_batch_size: 32,
                max_queue_delay_us: 0,
            },
        );
        assert_eq!(bare["instance_group"], json!([{"count": 2}]));
        assert_eq!(bare["max_batch_size"], 32);
    }

    #[test]
    fn best_respects_budget_and_errors() {
        let row = |instances, us: u64, n: u64, errors: bool| {
            let mut w = Window::default();
            for _ in 0..n {
                w.record(std::time::Duration::from_micros(us), &Ok(()));
            }
            if errors {
                w.record(std::time::Duration::ZERO, &Err("x".into()));
            }
            w.elapsed = std::time::Duration::from_secs(1);
            LevelResult {
                grid: Some(GridPoint {
                    instances,
                    max_batch_size: 0,
                    max_queue_delay_us: 0,
                }),
                level: Level::Concurrency(1),
                summary: w.summary(1),
                stable: true,
                windows: 3,
                totals: Default::default(),
            }
        };
        let rows = [
            row(1, 1000, 10, false),
            row(2, 50_000, 100, false),
            row(3, 1000, 1000, true),
        ];
        assert_eq!(
            best(&rows, 10.0).and_then(|r| r.grid).map(|g| g.instances),
            Some(1)
        );
        assert_eq!(
            best(&rows, 100.0).and_then(|r| r.grid).map(|g| g.instances),
            Some(2)
        );
        assert!(best(&rows, 0.5).is_none());
        assert!(describe_best(&rows[0]).contains("dynamic batching off"));
    }
}
