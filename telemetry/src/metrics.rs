//! Metric families: what a component reports, independent of how it is exported.
//!
//! ```text
//! component ── collect() ─► Vec<Family> ─┬─► render_prometheus ─► GET /metrics (text 0.0.4)
//!                                        └─► otlp (crate::otlp_metrics) ─► OTLP exporter
//! ```
//!
//! A component builds its families from its own counters each time it is asked (a scrape, an
//! OTLP export tick); nothing here keeps state. Counters are cumulative since the process
//! started; gauges are the value now; histograms carry cumulative bucket counts; summaries carry
//! quantiles over a recent window plus cumulative sum and count.

use std::fmt::Write;
use std::sync::Arc;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

/// The Prometheus type of a family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A value that only grows, cumulative since the process started; series carry
    /// [`Value::Number`].
    Counter,
    /// A value as it is now, free to go up and down; series carry [`Value::Number`].
    Gauge,
    /// Observations counted into cumulative buckets; series carry [`Value::Histogram`].
    Histogram,
    /// Quantiles over a recent window with cumulative sum and count; series carry
    /// [`Value::Summary`].
    Summary,
}

impl Kind {
    fn prometheus(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
            Kind::Summary => "summary",
        }
    }
}

/// One observed value of a family, by kind.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A counter or gauge value.
    Number(f64),
    /// Bucket upper bounds with the cumulative count of observations at or below each (the
    /// implicit `+Inf` bucket is `count`), the sum and the count of observations.
    Histogram {
        /// `(upper bound, cumulative count)` pairs in increasing bound order, without `+Inf`.
        buckets: Vec<(f64, u64)>,
        /// The sum of every observed value, in the metric's unit.
        sum: f64,
        /// How many values were observed; also the count of the implicit `+Inf` bucket.
        count: u64,
    },
    /// Quantiles `(q, value)` with the sum and count of observations.
    Summary {
        /// `(quantile in [0, 1], value)` pairs over the recent window.
        quantiles: Vec<(f64, f64)>,
        /// The sum of every observed value since the process started, in the metric's unit.
        sum: f64,
        /// How many values were observed since the process started.
        count: u64,
    },
}

/// One labelled series of a family.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// `(name, value)` label pairs identifying the series, in the order they are written.
    pub labels: Vec<(String, String)>,
    /// The series' value; its variant matches the family's [`Kind`].
    pub value: Value,
}

/// A named metric with its help text, type and series.
#[derive(Clone, Debug, PartialEq)]
pub struct Family {
    /// The metric name as exported (`nv_inference_count`...).
    pub name: String,
    /// One line describing the metric (Prometheus `# HELP`).
    pub help: String,
    /// The metric type (Prometheus `# TYPE`), which decides the series' [`Value`] variant.
    pub kind: Kind,
    /// The series; a family with none is left out of the Prometheus text.
    pub samples: Vec<Sample>,
}

impl Family {
    /// A family of `kind` without series yet.
    pub fn new(name: impl Into<String>, help: impl Into<String>, kind: Kind) -> Family {
        Family {
            name: name.into(),
            help: help.into(),
            kind,
            samples: Vec::new(),
        }
    }

    /// A [`Kind::Counter`] family without series yet.
    pub fn counter(name: impl Into<String>, help: impl Into<String>) -> Family {
        Family::new(name, help, Kind::Counter)
    }

    /// A [`Kind::Gauge`] family without series yet.
    pub fn gauge(name: impl Into<String>, help: impl Into<String>) -> Family {
        Family::new(name, help, Kind::Gauge)
    }

    /// Adds a counter or gauge series.
    pub fn number(&mut self, labels: Labels, value: f64) -> &mut Family {
        self.samples.push(Sample {
            labels: labels.0,
            value: Value::Number(value),
        });
        self
    }

    /// Adds a series with any value.
    pub fn sample(&mut self, labels: Labels, value: Value) -> &mut Family {
        self.samples.push(Sample {
            labels: labels.0,
            value,
        });
        self
    }

    /// Builder form of [`Family::number`].
    pub fn with(mut self, labels: Labels, value: f64) -> Family {
        self.number(labels, value);
        self
    }
}

/// Label pairs of one series, in the order they are written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Labels(pub Vec<(String, String)>);

impl Labels {
    /// No labels: the family's only series.
    pub fn none() -> Labels {
        Labels(Vec::new())
    }

    /// The `(name, value)` pairs, in the given order.
    pub fn of<const N: usize>(pairs: [(&str, &str); N]) -> Labels {
        Labels(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
        )
    }

    /// Adds one pair.
    pub fn and(mut self, key: &str, value: impl Into<String>) -> Labels {
        self.0.push((key.to_string(), value.into()));
        self
    }
}

/// Renders families in the Prometheus text exposition format (version 0.0.4). Families without
/// series are left out entirely, so a metric that does not apply (no GPU) is absent, not zero.
pub fn render_prometheus(families: &[Family]) -> String {
    let mut out = String::with_capacity(families.len() * 256);
    for family in families.iter().filter(|f| !f.samples.is_empty()) {
        let name = &family.name;
        let _ = writeln!(out, "# HELP {name} {}", escape_help(&family.help));
        let _ = writeln!(out, "# TYPE {name} {}", family.kind.prometheus());
        for sample in &family.samples {
            match &sample.value {
                Value::Number(v) => line(&mut out, name, "", &sample.labels, None, *v),
                Value::Histogram {
                    buckets,
                    sum,
                    count,
                } => {
                    for (bound, cumulative) in buckets {
                        let le = format_number(*bound);
                        line(
                            &mut out,
                            name,
                            "_bucket",
                            &sample.labels,
                            Some(("le", &le)),
                            *cumulative as f64,
                        );
                    }
                    line(
                        &mut out,
                        name,
                        "_bucket",
                        &sample.labels,
                        Some(("le", "+Inf")),
                        *count as f64,
                    );
                    sum_and_count(&mut out, name, &sample.labels, *sum, *count);
                }
                Value::Summary {
                    quantiles,
                    sum,
                    count,
                } => {
                    for (q, v) in quantiles {
                        let q = format_number(*q);
                        line(
                            &mut out,
                            name,
                            "",
                            &sample.labels,
                            Some(("quantile", &q)),
                            *v,
                        );
                    }
                    sum_and_count(&mut out, name, &sample.labels, *sum, *count);
                }
            }
        }
    }
    out
}

/// The `_sum` and `_count` lines of a histogram or summary.
fn sum_and_count(out: &mut String, name: &str, labels: &[(String, String)], sum: f64, count: u64) {
    line(out, name, "_sum", labels, None, sum);
    line(out, name, "_count", labels, None, count as f64);
}

fn line(
    out: &mut String,
    name: &str,
    suffix: &str,
    labels: &[(String, String)],
    extra: Option<(&str, &str)>,
    value: f64,
) {
    out.push_str(name);
    out.push_str(suffix);
    if !labels.is_empty() || extra.is_some() {
        out.push('{');
        let mut first = true;
        for (k, v) in labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(extra)
        {
            if !first {
                out.push(',');
            }
            first = false;
            let _ = write!(out, "{k}=\"{}\"", escape_label(v));
        }
        out.push('}');
    }
    out.push(' ');
    out.push_str(&format_number(value));
    out.push('\n');
}

/// Integers without a fraction (counters read `12`, not `12.0`), Prometheus spellings for the
/// special values.
pub fn format_number(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_string()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.to_string()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Something that reports metric families when asked.
pub trait Collect: Send + Sync + 'static {
    /// The families as they are now, built fresh on each call (a scrape, an OTLP export tick).
    fn collect(&self) -> Vec<Family>;
}

impl<F> Collect for F
where
    F: Fn() -> Vec<Family> + Send + Sync + 'static,
{
    fn collect(&self) -> Vec<Family> {
        self()
    }
}

/// `GET /metrics` (and `/metrics/`) serving `source` in Prometheus text; other methods get 405.
pub fn prometheus_router(source: Arc<dyn Collect>) -> axum::Router {
    let handler = move || {
        let source = source.clone();
        async move {
            (
                [(
                    header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )],
                render_prometheus(&source.collect()),
            )
                .into_response()
        }
    };
    axum::Router::new()
        .route("/metrics", get(handler.clone()))
        .route("/metrics/", get(handler))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_gauges_histograms_and_summaries() {
        let mut requests = Family::counter("requests_total", "Requests.");
        requests
            .number(Labels::of([("model", "a\"b")]), 3.0)
            .number(Labels::of([("model", "c")]), 0.5);
        let absent = Family::gauge("nv_gpu_utilization", "GPU busy fraction.");
        let mut latency = Family::new("latency_ms", "Latency.", Kind::Histogram);
        latency.sample(
            Labels::none(),
            Value::Histogram {
                buckets: vec![(100.0, 1), (500.0, 2)],
                sum: 250.0,
                count: 3,
            },
        );
        let mut summary = Family::new("queue_us", "Queue.", Kind::Summary);
        summary.sample(
            Labels::of([("model", "m")]),
            Value::Summary {
                quantiles: vec![(0.5, 7.0)],
                sum: 20.0,
                count: 2,
            },
        );
        let text = render_prometheus(&[requests, absent, latency, summary]);
        assert_eq!(
            text,
            "# HELP requests_total Requests.\n# TYPE requests_total counter\n\
             requests_total{model=\"a\\\"b\"} 3\nrequests_total{model=\"c\"} 0.5\n\
             # HELP latency_ms Latency.\n# TYPE latency_ms histogram\n\
             latency_ms_bucket{le=\"100\"} 1\nlatency_ms_bucket{le=\"500\"} 2\n\
             latency_ms_bucket{le=\"+Inf\"} 3\nlatency_ms_sum 250\nlatency_ms_count 3\n\
             # HELP queue_us Queue.\n# TYPE queue_us summary\n\
             queue_us{model=\"m\",quantile=\"0.5\"} 7\nqueue_us_sum{model=\"m\"} 20\n\
             queue_us_count{model=\"m\"} 2\n"
        );
    }

    #[test]
    fn numbers_use_prometheus_spellings() {
        assert_eq!(format_number(12.0), "12");
        assert_eq!(format_number(0.25), "0.25");
        assert_eq!(format_number(f64::INFINITY), "+Inf");
        assert_eq!(format_number(f64::NAN), "NaN");
    }
}
