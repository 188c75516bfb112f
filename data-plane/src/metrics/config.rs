//! What the metrics endpoint reports: Triton's `--metrics-config <key>=<value>` vocabulary,
//! `--allow-cpu-metrics`, `--allow-gpu-metrics` and `--metrics-interval-ms`, parsed into one
//! typed [`MetricsConfig`] before any port is bound.
//!
//! ```text
//! ["summary_latencies=true", "summary_quantiles=0.5:0.05,0.9:0.01"]
//!   ─► MetricsConfig::with_settings ─► LatencyMetrics { counter, summary, quantiles, histogram }
//! ```
//!
//! Keys (Triton's): `counter_latencies` (default true), `summary_latencies` (default false),
//! `summary_quantiles` (`q:error,...`, default `0.5:0.05,0.9:0.01,0.95:0.001,0.99:0.001,
//! 0.999:0.001`), `histogram_latencies` (default false). Quantiles are computed exactly over a
//! bounded window of recent requests, so the error half of each pair is validated and kept
//! only for display.

use std::time::Duration;

/// Which latency families the per-model metrics include.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyMetrics {
    /// The cumulative `*_duration_us` counters.
    pub counter: bool,
    /// The `*_summary_us` summaries.
    pub summary: bool,
    /// Quantiles of the summaries, with their allowed error: `(quantile, error)`.
    pub quantiles: Vec<(f64, f64)>,
    /// `nv_inference_first_response_histogram_ms`.
    pub histogram: bool,
}

/// Triton's default summary quantiles with their errors.
pub const DEFAULT_QUANTILES: [(f64, f64); 5] = [
    (0.5, 0.05),
    (0.9, 0.01),
    (0.95, 0.001),
    (0.99, 0.001),
    (0.999, 0.001),
];

impl Default for LatencyMetrics {
    fn default() -> LatencyMetrics {
        LatencyMetrics {
            counter: true,
            summary: false,
            quantiles: DEFAULT_QUANTILES.to_vec(),
            histogram: false,
        }
    }
}

/// Everything the metrics endpoint needs to know about what to report.
#[derive(Clone, Debug, PartialEq)]
pub struct MetricsConfig {
    /// Which latency metrics (counters, summaries, histograms) are reported.
    pub latencies: LatencyMetrics,
    /// Report `nv_cpu_*` host metrics.
    pub cpu: bool,
    /// Report `nv_gpu_*` metrics (through NVML; absent without GPUs).
    pub gpu: bool,
    /// How often CPU and GPU metrics are sampled.
    pub interval: Duration,
}

impl Default for MetricsConfig {
    fn default() -> MetricsConfig {
        MetricsConfig {
            latencies: LatencyMetrics::default(),
            cpu: true,
            gpu: true,
            interval: Duration::from_millis(2000),
        }
    }
}

/// A `--metrics-config` setting that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MetricsConfigError {
    #[error("--metrics-config '{0}': expected <key>=<value>")]
    /// A setting that is not `<key>=<value>`; holds the setting.
    NotKeyValue(String),
    #[error(
        "--metrics-config: unknown key '{0}' (known: counter_latencies, summary_latencies, summary_quantiles, histogram_latencies)"
    )]
    /// A key this server does not know; holds the key.
    UnknownKey(String),
    #[error("--metrics-config {key}: expected true or false, got '{value}'")]
    /// A boolean key whose value is neither `true` nor `false`.
    NotBool {
        /// The key.
        key: String,
        /// The value given.
        value: String,
    },
    #[error(
        "--metrics-config summary_quantiles: '{0}' is not <quantile>:<error> with both between 0 and 1 (e.g. 0.5:0.05,0.9:0.01)"
    )]
    /// A `summary_quantiles` value that is not a list of `<quantile>:<error>` pairs in [0, 1];
    /// holds the value.
    BadQuantile(String),
}

impl MetricsConfig {
    /// Applies `key=value` settings in order (a later one wins) on top of `self`.
    pub fn with_settings<S: AsRef<str>>(
        mut self,
        settings: &[S],
    ) -> Result<MetricsConfig, MetricsConfigError> {
        for setting in settings {
            let setting = setting.as_ref();
            let Some((key, value)) = setting.split_once('=') else {
                return Err(MetricsConfigError::NotKeyValue(setting.to_string()));
            };
            let (key, value) = (key.trim(), value.trim());
            let l = &mut self.latencies;
            match key {
                "counter_latencies" => l.counter = parse_bool(key, value)?,
                "summary_latencies" => l.summary = parse_bool(key, value)?,
                "histogram_latencies" => l.histogram = parse_bool(key, value)?,
                "summary_quantiles" => l.quantiles = parse_quantiles(value)?,
                _ => return Err(MetricsConfigError::UnknownKey(key.to_string())),
            }
        }
        Ok(self)
    }
}

fn parse_bool(key: &str, value: &str) -> Result<bool, MetricsConfigError> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(MetricsConfigError::NotBool {
            key: key.to_string(),
            value: value.to_string(),
        }),
    }
}

/// `0.5:0.05,0.9:0.01` ─► `[(0.5, 0.05), (0.9, 0.01)]`.
fn parse_quantiles(value: &str) -> Result<Vec<(f64, f64)>, MetricsConfigError> {
    let bad = |part: &str| MetricsConfigError::BadQuantile(part.to_string());
    let fraction = |s: &str| {
        s.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| (0.0..=1.0).contains(v))
    };
    let quantiles = value
        .split(',')
        .map(|part| {
            let (q, e) = part.split_once(':').ok_or_else(|| bad(part))?;
            Ok((
                fraction(q).ok_or_else(|| bad(part))?,
                fraction(e).ok_or_else(|| bad(part))?,
            ))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if quantiles.is_empty() {
        return Err(bad(value));
    }
    Ok(quantiles)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(settings: &[&str]) -> Result<LatencyMetrics, MetricsConfigError> {
        MetricsConfig::default()
            .with_settings(settings)
            .map(|c| c.latencies)
    }

    #[test]
    fn defaults_follow_triton() {
        let l = parse(&[]).unwrap();
        assert!(l.counter && !l.summary && !l.histogram);
        assert_eq!(l.quantiles.len(), 5);
        assert_eq!(
            MetricsConfig::default().interval,
            Duration::from_millis(2000)
        );
    }

    #[test]
    fn keys_switch_families_and_later_settings_win() {
        let l = parse(&[
            "counter_latencies=false",
            "summary_latencies=true",
            "histogram_latencies=1",
            "summary_latencies=TRUE",
        ])
        .unwrap();
        assert!(!l.counter && l.summary && l.histogram);
    }

    #[test]
    fn quantiles_override() {
        let l = parse(&["summary_quantiles=0.5:0.05, 0.9:0.01"]).unwrap();
        assert_eq!(l.quantiles, vec![(0.5, 0.05), (0.9, 0.01)]);
    }

    #[test]
    fn errors_name_the_key_and_the_problem() {
        let e = parse(&["summary_latency=true"]).unwrap_err();
        assert_eq!(e, MetricsConfigError::UnknownKey("summary_latency".into()));
        assert!(e.to_string().contains("unknown key 'summary_latency'"));
        let e = parse(&["counter_latencies=maybe"]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--metrics-config counter_latencies: expected true or false, got 'maybe'"
        );
        assert_eq!(
            parse(&["counter_latencies"]).unwrap_err(),
            MetricsConfigError::NotKeyValue("counter_latencies".into())
        );
        for bad in ["0.5", "1.5:0.1", "0.5:x", "", "0.5:0.05,"] {
            let e = parse(&[&format!("summary_quantiles={bad}")]).unwrap_err();
            assert!(
                matches!(e, MetricsConfigError::BadQuantile(_)),
                "{bad}: {e:?}"
            );
        }
    }
}
