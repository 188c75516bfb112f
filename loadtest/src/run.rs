//! The plain load test: connect, read the model, prepare requests, run each level, report.
//!
//! ```text
//! RunArgs ─► Session::open: connect (liveness) ─► model_info ─► inputs::build_steps ─► prepare
//!        ─► run_levels: closed_loop / open_loop per level ─► report rows (streamed to stdout)
//!        ─► notes, totals line, --csv, --json ─► --fail-on-errors (whole-level totals)
//! ```
//! `sweep` reuses [`Session`] and [`run_levels`] with a grid point attached to each row.

use std::sync::Arc;
use std::time::Duration;

use crate::cli::{Range, RunArgs};
use crate::client::{self, Client, Prepared, Target};
use crate::error::LoadtestError;
use crate::inputs::{self, DataSource, InputOptions, ModelInfo};
use crate::measure::LevelSettings;
use crate::open_loop::OpenLoopSettings;
use crate::progress::Progress;
use crate::report::{self, GridPoint, Level, LevelResult};
use crate::{closed_loop, open_loop};

/// The levels of a run, from `--concurrency-range` or `--request-rate-range`.
#[derive(Clone, Debug, PartialEq)]
pub enum Levels {
    Concurrency(Vec<u64>),
    Rate(Vec<f64>),
}

impl Levels {
    pub fn from_args(args: &RunArgs) -> Result<Levels, LoadtestError> {
        match (&args.concurrency_range, &args.request_rate_range) {
            (_, Some(rate)) => Ok(Levels::Rate(
                Range::parse_rate(rate)
                    .map_err(LoadtestError::InvalidArgument)?
                    .values(),
            )),
            (Some(c), None) => Ok(Levels::Concurrency(
                Range::parse_concurrency(c)
                    .map_err(LoadtestError::InvalidArgument)?
                    .values(),
            )),
            (None, None) => Ok(Levels::Concurrency(vec![1])),
        }
    }

    fn first(&self) -> Level {
        match self {
            Levels::Concurrency(c) => Level::Concurrency(c.first().copied().unwrap_or(1)),
            Levels::Rate(r) => Level::RequestRate(r.first().copied().unwrap_or(1.0)),
        }
    }
}

/// A connected client, the model it targets and the requests prepared for it.
pub struct Session {
    pub client: Arc<dyn Client>,
    pub model: ModelInfo,
    pub requests: Arc<Vec<Prepared>>,
    pub settings: LevelSettings,
    pub open: OpenLoopSettings,
}

impl Session {
    pub async fn open(args: &RunArgs) -> Result<Session, LoadtestError> {
        args.validate().map_err(LoadtestError::InvalidArgument)?;
        let target = Target {
            model: args.model.clone().unwrap_or_default(),
            version: args.model_version.clone().unwrap_or_default(),
        };
        if target.model.is_empty() {
            return Err(LoadtestError::InvalidArgument(
                "-m/--model-name must not be empty".into(),
            ));
        }
        let options = InputOptions {
            batch_size: args.batch_size,
            shapes: inputs::shape_map(&args.shapes).map_err(LoadtestError::InvalidArgument)?,
            source: DataSource::parse(&args.input_data),
            seed: args.seed,
            string_length: args.string_length,
        };
        let client = client::connect(args, target).await?;
        let model = client.model_info().await?;
        let steps =
            inputs::build_steps(&model, &options).map_err(LoadtestError::InvalidArgument)?;
        let requests = steps
            .iter()
            .map(|s| client.prepare(s))
            .collect::<Result<Vec<Prepared>, String>>()
            .map_err(LoadtestError::InvalidArgument)?;
        Ok(Session {
            client,
            model,
            requests: Arc::new(requests),
            settings: LevelSettings {
                warmup: Duration::from_secs_f64(args.warmup_secs),
                interval: args.measurement_interval(),
                stability_percentage: args.stability_percentage,
                max_trials: args.max_trials,
                duration: args.duration_secs.map(Duration::from_secs_f64),
                batch_size: args.batch_size,
                request_timeout: Duration::from_secs_f64(args.request_timeout_secs),
            },
            open: OpenLoopSettings {
                distribution: args.request_distribution,
                seed: args.seed,
                max_outstanding: args.max_outstanding,
            },
        })
    }

    /// The settings line printed before the table.
    pub fn describe(&self, args: &RunArgs) -> String {
        let windows = match args.duration_secs {
            Some(d) => format!(
                "fixed {d} s per level in windows of at most {} ms",
                args.measurement_interval_ms
            ),
            None => format!(
                "measurement {} ms, stability {}% over 3 windows, max {} windows",
                args.measurement_interval_ms, args.stability_percentage, args.max_trials
            ),
        };
        format!(
            "model '{}' on {}: batch size {}, {} request variant(s), {windows}",
            self.model.name,
            self.client.describe(),
            args.batch_size,
            self.requests.len(),
        )
    }
}

/// Runs every level, printing each row as it completes.
pub async fn run_levels(
    session: &Session,
    levels: &Levels,
    grid: Option<GridPoint>,
    progress: &Progress,
) -> Vec<LevelResult> {
    let mut results = Vec::new();
    let points: Vec<Level> = match levels {
        Levels::Concurrency(c) => c.iter().map(|c| Level::Concurrency(*c)).collect(),
        Levels::Rate(r) => r.iter().map(|r| Level::RequestRate(*r)).collect(),
    };
    for level in points {
        let outcome = match level {
            Level::Concurrency(c) => {
                closed_loop::run_level(
                    session.client.clone(),
                    session.requests.clone(),
                    c,
                    &session.settings,
                    progress,
                )
                .await
            }
            Level::RequestRate(r) => {
                open_loop::run_level(
                    session.client.clone(),
                    session.requests.clone(),
                    r,
                    &session.open,
                    &session.settings,
                    progress,
                )
                .await
            }
        };
        let result = LevelResult {
            grid,
            level,
            summary: outcome.measurement.summary,
            stable: outcome.measurement.stable,
            windows: outcome.measurement.windows,
            totals: outcome.totals,
        };
        progress.suspend(|| println!("{}", report::table_row(&result)));
        results.push(result);
    }
    results
}

/// Prints the notes and the totals line, and writes `--csv` / `--json`.
pub fn finish(args: &RunArgs, results: &[LevelResult]) -> Result<(), LoadtestError> {
    for note in report::notes(results) {
        println!("{note}");
    }
    println!("{}", report::totals_line(results));
    if let Some(path) = &args.csv {
        report::write_file(path, &report::csv(results))?;
    }
    if let Some(path) = &args.json {
        report::write_file(path, &report::json(results))?;
    }
    Ok(())
}

/// Fails when `--fail-on-errors` is set and any request of any level failed: warm-up,
/// measurement windows and drain alike.
pub fn check_errors(args: &RunArgs, results: &[LevelResult]) -> Result<(), LoadtestError> {
    if args.fail_on_errors {
        failed_requests(results)?;
    }
    Ok(())
}

fn failed_requests(results: &[LevelResult]) -> Result<(), LoadtestError> {
    let failed: u64 = results.iter().map(|r| r.totals.errors_total).sum();
    if failed == 0 {
        return Ok(());
    }
    let first = results
        .iter()
        .find_map(|r| r.totals.first_errors.first().cloned())
        .unwrap_or_default();
    Err(LoadtestError::RequestsFailed {
        failed,
        total: results.iter().map(|r| r.totals.requests_total).sum(),
        first,
    })
}

/// The whole plain load test.
pub async fn run(args: &RunArgs) -> Result<Vec<LevelResult>, LoadtestError> {
    let levels = Levels::from_args(args)?;
    let session = Session::open(args).await?;
    println!("{}", session.describe(args));
    println!("{}", report::table_header(&levels.first(), false));
    let progress = Progress::new(args.quiet);
    let results = run_levels(&session, &levels, None, &progress).await;
    progress.finish();
    finish(args, &results)?;
    check_errors(args, &results)?;
    Ok(results)
}

/// The table header for a sweep (grid columns, concurrency levels).
pub fn sweep_header() -> String {
    report::table_header(&Level::Concurrency(1), true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{Tally, Totals, Window};

    fn level(totals: Totals) -> LevelResult {
        LevelResult {
            grid: None,
            level: Level::Concurrency(1),
            summary: Window::default().summary(1),
            stable: true,
            windows: 3,
            totals,
        }
    }

    #[test]
    fn failures_outside_the_windows_fail_the_run() {
        let clean = level(Tally::default().totals(0));
        let mut tally = Tally::default();
        tally.record(&Ok(()));
        tally.record(&Err("warm-up failure".into()));
        // The windows saw no error (an empty summary); the level's totals did.
        let failing = level(tally.totals(3));
        assert!(failed_requests(std::slice::from_ref(&clean)).is_ok());
        match failed_requests(&[clean, failing]) {
            Err(LoadtestError::RequestsFailed {
                failed,
                total,
                first,
            }) => {
                assert_eq!((failed, total), (2, 3));
                assert_eq!(first, "warm-up failure");
            }
            other => panic!("expected RequestsFailed, got {other:?}"),
        }
    }
}
