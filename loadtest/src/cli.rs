//! Command-line flags (clap derive) and their parsing into typed ranges and settings.
//!
//! Flag names follow perf_analyzer where a perf_analyzer user would look for them (`-i`, `-u`,
//! `-m`, `-x`, `-b`, `--concurrency-range`, `--request-rate-range`, `--measurement-interval`,
//! `--stability-percentage`, `--max-trials`, `--shape`, `--input-data`). The plain command runs a
//! load test; `sweep` runs it over a grid of batcher / instance settings; `placement-sim` times
//! the control plane's placement function offline (its flags live in `placement_sim`).
//!
//! ```text
//! argv ─► Cli ─┬─ (no subcommand) RunArgs ─► run::run
//!              ├─ sweep SweepArgs{RunArgs, grid} ─► sweep::sweep
//!              └─ placement-sim PlacementSimArgs ─► placement_sim::run
//! ```

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// perf_analyzer-style load generator for KServe v2 servers (Nereid, Triton, MLServer).
#[derive(Debug, Parser)]
#[command(
    name = "nereid-loadtest",
    version,
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct Cli {
    #[command(subcommand)]
    /// A subcommand (`sweep`, `placement`); `None`: the plain load test run by `run`.
    pub command: Option<Command>,
    #[command(flatten)]
    /// The load test's own options, used when no subcommand is given.
    pub run: RunArgs,
}

// Parsed once per process: the size difference between variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
/// The tool's subcommands beside the plain load test.
pub enum Command {
    /// Model-Analyzer-like grid: reload the model with each combination of instance count,
    /// max batch size and queue delay (server must run with `--model-control-mode explicit`),
    /// run the closed loop at `--concurrency-range` and report the best throughput within the
    /// latency budget. The original config is restored at the end.
    Sweep(SweepArgs),
    /// Time the control plane's placement function on a synthetic cluster (no server needed):
    /// initial placement, then rounds of node failures, drains and scaling; reports time per
    /// round and packing efficiency.
    PlacementSim(crate::placement_sim::PlacementSimArgs),
}

/// Wire protocol for inference and metadata.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Protocol {
    Http,
    Grpc,
}

/// Inter-arrival distribution of the open loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Distribution {
    /// Evenly spaced requests: exactly `rate` per second.
    Constant,
    /// Exponentially distributed gaps (Poisson arrivals) with mean `1/rate`.
    Poisson,
}

/// The flags of a load test; `sweep` takes them too.
#[derive(Debug, Args, Clone)]
pub struct RunArgs {
    /// Protocol: `http` (KServe v2 REST, binary tensor extension by default) or `grpc`.
    #[arg(short = 'i', long = "protocol", value_enum, default_value_t = Protocol::Http)]
    pub protocol: Protocol,

    /// Server address `host:port` (an `http://` prefix is accepted). Defaults to
    /// localhost:8000 for HTTP and localhost:8001 for gRPC.
    #[arg(short = 'u', long = "url")]
    pub url: Option<String>,

    /// Model to load-test.
    #[arg(short = 'm', long = "model-name", required = true)]
    pub model: Option<String>,

    /// Model version; empty means the server's latest.
    #[arg(short = 'x', long = "model-version")]
    pub model_version: Option<String>,

    /// Batch size of each request (the first dimension of every input for batching models).
    #[arg(short = 'b', long = "batch-size", default_value_t = 1)]
    pub batch_size: u32,

    /// Closed loop: `START:END:STEP` (or `N`, or `START:END`) concurrent workers, each with one
    /// outstanding request. The default when no rate range is given is `1`.
    #[arg(long = "concurrency-range", conflicts_with = "request_rate_range")]
    pub concurrency_range: Option<String>,

    /// Open loop: `START:END:STEP` requests per second, sent on a schedule regardless of
    /// completions.
    #[arg(long = "request-rate-range")]
    pub request_rate_range: Option<String>,

    /// Open loop inter-arrival distribution.
    #[arg(long = "request-distribution", value_enum, default_value_t = Distribution::Constant)]
    pub request_distribution: Distribution,

    /// Open loop: most requests in flight at once; a scheduled request that finds this many
    /// outstanding is skipped and counted, meaning the client or server cannot keep up.
    #[arg(long = "max-outstanding", default_value_t = 1024)]
    pub max_outstanding: usize,

    /// Shape of a variable-dimension input, without the batch dimension: `NAME:d1,d2`.
    /// Repeat for several inputs.
    #[arg(long = "shape")]
    pub shapes: Vec<String>,

    /// Input data: `random` (seeded by `--seed`), `zero`, or a JSON file in perf_analyzer's
    /// format `{"data":[{"INPUT0":[...]}, ...]}` (each entry one batch element; several entries
    /// are sent in turn).
    #[arg(long = "input-data", default_value = "random")]
    pub input_data: String,

    /// Seed of the random input data and of the Poisson schedule.
    #[arg(long = "seed", default_value_t = 0)]
    pub seed: u64,

    /// Length of each random element of a BYTES input.
    #[arg(long = "string-length", default_value_t = 128)]
    pub string_length: usize,

    /// Send HTTP tensors as JSON `data` instead of the binary tensor extension.
    #[arg(long = "http-json")]
    pub http_json: bool,

    /// gRPC: number of HTTP/2 connections shared by all workers (requests are spread
    /// round-robin). Raise it when one connection's stream handling becomes the bottleneck.
    #[arg(long = "grpc-channels", default_value_t = 1)]
    pub grpc_channels: usize,

    /// Threads the load generator runs its workers on. `1` (the default) drives every
    /// connection from one thread, which costs the least CPU per request and leaves the other
    /// cores to a server on the same machine; raise it when the client itself saturates a core
    /// (its CPU column nears 100 %) against a remote server.
    #[arg(long = "client-threads", default_value_t = 1)]
    pub client_threads: usize,

    /// Load applied before measuring at each level, in seconds: in no measurement window, but
    /// its requests are in the level's `requests_total` / `errors_total`.
    #[arg(long = "warmup-secs", default_value_t = 1.0)]
    pub warmup_secs: f64,

    /// Length of one measurement window in milliseconds.
    #[arg(short = 'p', long = "measurement-interval", default_value_t = 5000)]
    pub measurement_interval_ms: u64,

    /// A level is stable when the last 3 windows' throughput and p99 latency are each within
    /// this percentage of their mean.
    #[arg(short = 's', long = "stability-percentage", default_value_t = 10.0)]
    pub stability_percentage: f64,

    /// Most measurement windows per level; a level that is still not stable is reported as such.
    #[arg(short = 'r', long = "max-trials", default_value_t = 10)]
    pub max_trials: u32,

    /// Measure each level for exactly this many seconds (after the warm-up) instead of until
    /// stable: equal windows of at most `-p`, all of them reported; `stable` still says
    /// whether the last 3 agreed. For fault and soak tests with a known load duration.
    #[arg(long = "duration-secs", conflicts_with = "max_trials")]
    pub duration_secs: Option<f64>,

    /// A request taking longer than this (seconds) is abandoned and counted as an error.
    #[arg(long = "request-timeout-secs", default_value_t = 30.0)]
    pub request_timeout_secs: f64,

    /// Write one CSV row per concurrency / rate level to this file.
    #[arg(long = "csv", alias = "latency-report-file", short = 'f')]
    pub csv: Option<PathBuf>,

    /// Write the results as JSON (an array of level objects) to this file.
    #[arg(long = "json")]
    pub json: Option<PathBuf>,

    /// No progress indicator on stderr (it is also off when stderr is not a terminal).
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,

    /// Exit with status 1 when any request failed, at any point of any level (warm-up and the
    /// requests drained at the end of a level included).
    #[arg(long = "fail-on-errors")]
    pub fail_on_errors: bool,
}

/// The grid of `sweep`.
#[derive(Debug, Args, Clone)]
pub struct SweepArgs {
    #[command(flatten)]
    pub run: RunArgs,

    /// Instance counts (`instance_group[*].count`) to try, comma-separated.
    #[arg(long = "instance-counts", value_delimiter = ',', default_value = "1,2")]
    pub instance_counts: Vec<u32>,

    /// Max batch sizes to try; 0 turns dynamic batching off (the model's own
    /// `max_batch_size` is kept), a value above 0 sets `max_batch_size` and turns it on.
    #[arg(
        long = "max-batch-sizes",
        value_delimiter = ',',
        default_value = "0,8,32"
    )]
    pub max_batch_sizes: Vec<u32>,

    /// Dynamic batcher `max_queue_delay_microseconds` values to try.
    #[arg(
        long = "max-queue-delays-us",
        value_delimiter = ',',
        default_value = "0,100"
    )]
    pub max_queue_delays_us: Vec<u64>,

    /// The best configuration is the highest throughput whose p99 latency is within this
    /// budget (milliseconds) and that had no errors.
    #[arg(long = "latency-budget-ms", default_value_t = 100.0)]
    pub latency_budget_ms: f64,
}

/// An inclusive `START:END:STEP` range of integers (concurrency) or reals (request rate).
#[derive(Clone, Debug, PartialEq)]
pub struct Range<T> {
    pub start: T,
    pub end: T,
    pub step: T,
}

impl Range<u64> {
    /// Parses `N`, `START:END` (step 1) or `START:END:STEP`; all values at least 1.
    pub fn parse_concurrency(text: &str) -> Result<Range<u64>, String> {
        let parts = split_range(text, "--concurrency-range")?;
        let nums = parts
            .iter()
            .map(|p| {
                p.trim().parse::<u64>().map_err(|_| {
                    format!("--concurrency-range '{text}': '{p}' is not a whole number")
                })
            })
            .collect::<Result<Vec<u64>, String>>()?;
        let range = match nums.as_slice() {
            [n] => Range {
                start: *n,
                end: *n,
                step: 1,
            },
            [s, e] => Range {
                start: *s,
                end: *e,
                step: 1,
            },
            [s, e, st] => Range {
                start: *s,
                end: *e,
                step: *st,
            },
            _ => unreachable_parts(text)?,
        };
        if range.start == 0 || range.step == 0 {
            return Err(format!(
                "--concurrency-range '{text}': start and step must be at least 1"
            ));
        }
        if range.end < range.start {
            return Err(format!("--concurrency-range '{text}': end is below start"));
        }
        Ok(range)
    }

    /// The levels, in order.
    pub fn values(&self) -> Vec<u64> {
        (self.start..=self.end)
            .step_by(self.step as usize)
            .collect()
    }
}

impl Range<f64> {
    /// Parses `R`, `START:END` or `START:END:STEP` requests per second (`END`/`STEP` default
    /// to one level); values must be positive and finite.
    pub fn parse_rate(text: &str) -> Result<Range<f64>, String> {
        let parts = split_range(text, "--request-rate-range")?;
        let nums = parts
            .iter()
            .map(|p| match p.trim().parse::<f64>() {
                Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
                _ => Err(format!(
                    "--request-rate-range '{text}': '{p}' is not a positive number"
                )),
            })
            .collect::<Result<Vec<f64>, String>>()?;
        let range = match nums.as_slice() {
            [r] => Range {
                start: *r,
                end: *r,
                step: 1.0,
            },
            [s, e] => Range {
                start: *s,
                end: *e,
                step: (*e - *s).max(1.0),
            },
            [s, e, st] => Range {
                start: *s,
                end: *e,
                step: *st,
            },
            _ => unreachable_parts(text)?,
        };
        if range.end < range.start {
            return Err(format!("--request-rate-range '{text}': end is below start"));
        }
        Ok(range)
    }

    /// The levels, in order (the end is included when a step lands on it, within rounding).
    pub fn values(&self) -> Vec<f64> {
        let mut out = Vec::new();
        let mut i = 0u32;
        loop {
            let v = self.start + self.step * f64::from(i);
            if v > self.end * (1.0 + 1e-9) {
                break;
            }
            out.push(v);
            i += 1;
            if out.len() >= 10_000 {
                break;
            }
        }
        out
    }
}

fn split_range<'a>(text: &'a str, flag: &str) -> Result<Vec<&'a str>, String> {
    let parts: Vec<&str> = text.split(':').collect();
    if text.trim().is_empty() || parts.len() > 3 {
        return Err(format!(
            "{flag} '{text}': expected START:END:STEP, START:END or N"
        ));
    }
    Ok(parts)
}

fn unreachable_parts<T>(text: &str) -> Result<T, String> {
    Err(format!(
        "range '{text}': expected START:END:STEP, START:END or N"
    ))
}

/// One `--shape NAME:d1,d2` flag.
pub fn parse_shape(text: &str) -> Result<(String, Vec<i64>), String> {
    let Some((name, dims)) = text.rsplit_once(':') else {
        return Err(format!("--shape '{text}': expected NAME:d1,d2,..."));
    };
    if name.is_empty() {
        return Err(format!("--shape '{text}': the input name is empty"));
    }
    let dims = dims
        .split(',')
        .filter(|d| !d.trim().is_empty())
        .map(|d| match d.trim().parse::<i64>() {
            Ok(v) if v >= 0 => Ok(v),
            _ => Err(format!(
                "--shape '{text}': '{d}' is not a non-negative dimension"
            )),
        })
        .collect::<Result<Vec<i64>, String>>()?;
    Ok((name.to_string(), dims))
}

impl RunArgs {
    /// `http://host:port` for the chosen protocol, from `-u` or the protocol's default port.
    pub fn base_url(&self) -> Result<String, String> {
        let raw = match (&self.url, self.protocol) {
            (Some(u), _) => u.trim().to_string(),
            (None, Protocol::Http) => "localhost:8000".to_string(),
            (None, Protocol::Grpc) => "localhost:8001".to_string(),
        };
        if raw.starts_with("https://") {
            return Err(format!("-u '{raw}': TLS is not supported; give host:port"));
        }
        let host_port = raw
            .strip_prefix("http://")
            .unwrap_or(&raw)
            .trim_end_matches('/');
        if host_port.is_empty() || host_port.contains('/') {
            return Err(format!("-u '{raw}': expected host:port"));
        }
        let url = format!("http://{host_port}");
        url.parse::<http::Uri>()
            .map_err(|e| format!("-u '{raw}': not a valid address: {e}"))?;
        Ok(url)
    }

    pub fn measurement_interval(&self) -> Duration {
        Duration::from_millis(self.measurement_interval_ms)
    }

    /// Checks the values clap cannot check on its own.
    pub fn validate(&self) -> Result<(), String> {
        if self.batch_size == 0 {
            return Err("-b/--batch-size must be at least 1".into());
        }
        if self.measurement_interval_ms == 0 {
            return Err("--measurement-interval must be at least 1 ms".into());
        }
        if self.max_trials < 1 {
            return Err("--max-trials must be at least 1".into());
        }
        if !(self.stability_percentage.is_finite() && self.stability_percentage > 0.0) {
            return Err("--stability-percentage must be a positive number".into());
        }
        if self
            .duration_secs
            .is_some_and(|d| !(d.is_finite() && d > 0.0 && d < 1e9))
        {
            return Err("--duration-secs must be a positive number of seconds".into());
        }
        if !(self.warmup_secs.is_finite() && self.warmup_secs >= 0.0) {
            return Err("--warmup-secs must be zero or more".into());
        }
        if !(self.request_timeout_secs.is_finite() && self.request_timeout_secs > 0.0) {
            return Err("--request-timeout-secs must be positive".into());
        }
        if self.grpc_channels == 0 {
            return Err("--grpc-channels must be at least 1".into());
        }
        if self.client_threads == 0 {
            return Err("--client-threads must be at least 1".into());
        }
        if self.max_outstanding == 0 {
            return Err("--max-outstanding must be at least 1".into());
        }
        if self.http_json && self.protocol == Protocol::Grpc {
            return Err("--http-json only applies to -i http".into());
        }
        self.base_url()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn concurrency_ranges() {
        assert_eq!(
            Range::parse_concurrency("1:8:2").unwrap().values(),
            vec![1, 3, 5, 7]
        );
        assert_eq!(Range::parse_concurrency("4").unwrap().values(), vec![4]);
        assert_eq!(
            Range::parse_concurrency("2:4").unwrap().values(),
            vec![2, 3, 4]
        );
        assert!(Range::parse_concurrency("0:4").is_err());
        assert!(Range::parse_concurrency("4:2").is_err());
        assert!(Range::parse_concurrency("1:4:0").is_err());
        assert!(Range::parse_concurrency("a:4").unwrap_err().contains("'a'"));
        assert!(Range::parse_concurrency("1:2:3:4").is_err());
        assert!(Range::parse_concurrency("").is_err());
    }

    #[test]
    fn rate_ranges() {
        assert_eq!(
            Range::parse_rate("100:300:100").unwrap().values(),
            vec![100.0, 200.0, 300.0]
        );
        assert_eq!(Range::parse_rate("50").unwrap().values(), vec![50.0]);
        assert_eq!(Range::parse_rate("0.1:0.3:0.1").unwrap().values().len(), 3);
        assert!(Range::parse_rate("0").is_err());
        assert!(Range::parse_rate("-5").is_err());
        assert!(Range::parse_rate("10:5").is_err());
    }

    #[test]
    fn shapes() {
        assert_eq!(
            parse_shape("INPUT0:3,224").unwrap(),
            ("INPUT0".to_string(), vec![3, 224])
        );
        assert_eq!(
            parse_shape("ns:x:4").unwrap(),
            ("ns:x".to_string(), vec![4])
        );
        assert!(parse_shape("INPUT0").is_err());
        assert!(parse_shape("INPUT0:-1").is_err());
        assert!(parse_shape(":3").is_err());
    }

    #[test]
    fn urls_and_subcommand() {
        let cli = Cli::try_parse_from(["lt", "-m", "simple", "-i", "grpc"]).unwrap();
        assert_eq!(cli.run.base_url().unwrap(), "http://localhost:8001");
        let cli = Cli::try_parse_from(["lt", "-m", "s", "-u", "http://127.0.0.1:9/"]).unwrap();
        assert_eq!(cli.run.base_url().unwrap(), "http://127.0.0.1:9");
        let cli = Cli::try_parse_from(["lt", "-m", "s", "-u", "https://x:1"]).unwrap();
        assert!(cli.run.validate().is_err());
        assert!(Cli::try_parse_from(["lt"]).is_err(), "-m is required");
        assert!(
            Cli::try_parse_from([
                "lt",
                "-m",
                "s",
                "--concurrency-range",
                "1",
                "--request-rate-range",
                "5"
            ])
            .is_err()
        );
        let cli =
            Cli::try_parse_from(["lt", "sweep", "-m", "s", "--max-batch-sizes", "0,4"]).unwrap();
        match cli.command {
            Some(Command::Sweep(s)) => {
                assert_eq!(s.max_batch_sizes, vec![0, 4]);
                assert_eq!(s.run.model.as_deref(), Some("s"));
            }
            _ => panic!("expected sweep"),
        }
    }
    #[test]
    fn duration_replaces_max_trials() {
        let cli = Cli::try_parse_from(["lt", "-m", "s", "--duration-secs", "2.5"]).unwrap();
        assert_eq!(cli.run.duration_secs, Some(2.5));
        assert!(cli.run.validate().is_ok());
        for bad in ["0", "-1", "inf", "NaN"] {
            let flag = format!("--duration-secs={bad}");
            let cli = Cli::try_parse_from(["lt", "-m", "s", &flag]).unwrap();
            assert!(cli.run.validate().is_err(), "{bad}");
        }
        assert!(
            Cli::try_parse_from(["lt", "-m", "s", "--duration-secs", "2", "-r", "3"]).is_err(),
            "a fixed duration has no trial count"
        );
    }
}
