//! Custom metrics: metric families that models define while they run (Triton's
//! `TRITONSERVER_MetricFamily*` API, which Python models reach as `pb_utils.MetricFamily`),
//! exported on `/metrics` beside the server's own families.
//!
//! ```text
//!  Python stub ─► backend/python/custom_metrics ─► Owner (one per stub: the handles it holds)
//!                                                     └─► CustomMetrics (server-wide, by name)
//!  GET /metrics, OTLP tick ─► metrics::DataPlaneMetrics::collect ─► CustomMetrics::merge_into
//! ```
//!
//! A model names families and metrics by *handles* of its own choosing. Families are shared by
//! name: the same name with the same kind is one family, whoever creates it (the first
//! description is kept, as Triton's registry does); the same labels in one family are one
//! series. A family lives while any handle names it or any of its series, a series while any
//! handle names it; when an [`Owner`] goes (its stub exited), everything it held is released.
//! Every change is checked here, whatever the model side checked already.
//!
//! Every decision is a method of [`state::State`], plain data under one short-held lock, tested
//! without sockets in `tests`. Leaf module: it depends on nothing else in the crate, so the
//! backends (writers) and the metrics endpoint (reader) both sit above it.

mod state;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use nereid_telemetry::{Family, Kind};
use parking_lot::Mutex;

use self::state::State;

/// How many families and metrics one owner may hold at once: a model that creates a series per
/// request would otherwise grow the server's memory and every scrape without end.
pub const MAX_HANDLES_PER_OWNER: usize = 65_536;

/// The kind of a custom family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
    Histogram,
}

impl MetricKind {
    /// Triton's name for the kind (`TRITONSERVER_METRIC_KIND_<name>`).
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "COUNTER",
            MetricKind::Gauge => "GAUGE",
            MetricKind::Histogram => "HISTOGRAM",
        }
    }

    fn prometheus(self) -> Kind {
        match self {
            MetricKind::Counter => Kind::Counter,
            MetricKind::Gauge => Kind::Gauge,
            MetricKind::Histogram => Kind::Histogram,
        }
    }
}

/// A change to one metric's value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Update {
    /// Counters (never negative) and gauges.
    Increment(f64),
    /// Gauges.
    Set(f64),
    /// Histograms.
    Observe(f64),
}

impl Update {
    fn name(self) -> &'static str {
        match self {
            Update::Increment(_) => "Increment",
            Update::Set(_) => "Set",
            Update::Observe(_) => "Observe",
        }
    }
}

/// Why a custom-metric operation was refused; the texts follow Triton's where it has one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MetricError {
    #[error(
        "Invalid metric name '{0}': a name must match [a-zA-Z_:][a-zA-Z0-9_:]* and must not start with '__'"
    )]
    InvalidName(String),
    #[error(
        "Invalid label name '{0}': a label name must match [a-zA-Z_][a-zA-Z0-9_]* and must not start with '__' ('le' is reserved in histograms)"
    )]
    InvalidLabelName(String),
    #[error(
        "metric family '{name}' already exists with kind {}; it cannot also have kind {}",
        existing.as_str(),
        requested.as_str()
    )]
    KindConflict {
        name: String,
        existing: MetricKind,
        requested: MetricKind,
    },
    #[error("TRITONSERVER_METRIC_KIND_{} does not support {op}", kind.as_str())]
    Unsupported { kind: MetricKind, op: &'static str },
    #[error(
        "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values."
    )]
    NegativeIncrement,
    #[error("Bucket boundaries must be finite and strictly sorted, got {0:?}")]
    UnsortedBuckets(Vec<f64>),
    #[error("Missing required buckets: a histogram metric needs its bucket boundaries.")]
    MissingBuckets,
    #[error("Unexpected buckets found: only histogram metrics take bucket boundaries.")]
    UnexpectedBuckets,
    #[error("unknown metric family {0} (its creation failed, or it was deleted)")]
    UnknownFamily(u64),
    #[error("unknown metric {0} (its creation failed, or it was deleted)")]
    UnknownMetric(u64),
    #[error("handle {0} already names a family or metric of this model instance")]
    HandleInUse(u64),
    #[error(
        "too many custom metrics: one model instance may hold at most {MAX_HANDLES_PER_OWNER} metric families and metrics"
    )]
    TooMany,
}

/// Label names to values; ordered by name, as they are rendered.
pub type LabelSet = BTreeMap<String, String>;

/// The server-wide registry of custom families.
#[derive(Default)]
pub struct CustomMetrics {
    state: Mutex<State>,
}

impl std::fmt::Debug for CustomMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomMetrics")
            .field("families", &self.state.lock().families.len())
            .finish()
    }
}

impl CustomMetrics {
    /// The custom families as they are now, by name; a family without series is left out.
    #[cfg(test)]
    pub(crate) fn families(&self) -> Vec<Family> {
        self.state.lock().families()
    }

    /// Adds the custom families to the server's `out`. A custom family with the name of one of
    /// the server's own joins it when the kinds agree (Triton keeps both in one registry) and is
    /// left out otherwise, with one warning per name.
    pub fn merge_into(&self, out: &mut Vec<Family>) {
        let mut state = self.state.lock();
        for family in state.families() {
            match out.iter_mut().find(|f| f.name == family.name) {
                None => out.push(family),
                Some(existing) if existing.kind == family.kind => {
                    existing.samples.extend(family.samples)
                }
                Some(_) => {
                    if state.clashes_warned.insert(family.name.clone()) {
                        tracing::warn!(family = %family.name, "a model's custom metric family has the name of one of the server's own with another type; it is not exported");
                    }
                }
            }
        }
    }
}

/// What one model instance (one Python stub) holds in the registry. Dropping it releases
/// everything it holds.
pub struct Owner {
    registry: Arc<CustomMetrics>,
    id: u64,
}

impl Owner {
    pub fn new(registry: Arc<CustomMetrics>) -> Owner {
        let id = {
            let mut state = registry.state.lock();
            state.next_owner += 1;
            state.next_owner
        };
        Owner { registry, id }
    }

    /// Creates family `handle`, or joins the family of that name.
    pub fn family_new(
        &self,
        handle: u64,
        name: &str,
        description: &str,
        kind: MetricKind,
    ) -> Result<(), MetricError> {
        self.registry
            .state
            .lock()
            .family_new(self.id, handle, name, description, kind)
    }

    /// Releases family `handle`.
    pub fn family_delete(&self, handle: u64) -> Result<(), MetricError> {
        self.registry.state.lock().family_delete(self.id, handle)
    }

    /// Creates metric `handle` in family `family`, or joins the series with the same labels.
    /// `buckets` (upper bounds, strictly increasing) for histograms only.
    pub fn metric_new(
        &self,
        handle: u64,
        family: u64,
        labels: LabelSet,
        buckets: Option<Vec<f64>>,
    ) -> Result<(), MetricError> {
        self.registry
            .state
            .lock()
            .metric_new(self.id, handle, family, labels, buckets)
    }

    /// Releases metric `handle`.
    pub fn metric_delete(&self, handle: u64) -> Result<(), MetricError> {
        self.registry.state.lock().metric_delete(self.id, handle)
    }

    pub fn update(&self, handle: u64, update: Update) -> Result<(), MetricError> {
        self.registry.state.lock().update(self.id, handle, update)
    }

    /// A counter's or gauge's value.
    pub fn value(&self, handle: u64) -> Result<f64, MetricError> {
        self.registry.state.lock().value(self.id, handle)
    }

    /// Releases everything this owner holds (its stub is gone).
    pub fn clear(&self) {
        self.registry.state.lock().remove_owner(self.id);
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.clear();
    }
}
