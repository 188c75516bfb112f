//! The registry's state and every decision on it: plain data, no locks, no I/O.

use std::collections::{BTreeMap, HashMap, HashSet};

use nereid_telemetry::{Family, Labels, Value};

use super::{LabelSet, MAX_HANDLES_PER_OWNER, MetricError, MetricKind, Update};

/// The registry's state: plain data, every decision a method of it.
#[derive(Default)]
pub(super) struct State {
    pub(super) families: BTreeMap<String, FamilyEntry>,
    pub(super) owners: HashMap<u64, Handles>,
    pub(super) next_owner: u64,
    /// Names whose clash with a server family was logged.
    pub(super) clashes_warned: HashSet<String>,
}

/// One owner's handles.
#[derive(Default)]
pub(super) struct Handles {
    /// Family handle → family name.
    families: HashMap<u64, String>,
    /// Metric handle → its series.
    metrics: HashMap<u64, (String, LabelSet)>,
}

impl Handles {
    fn check_new(&self, handle: u64) -> Result<(), MetricError> {
        if self.families.contains_key(&handle) || self.metrics.contains_key(&handle) {
            return Err(MetricError::HandleInUse(handle));
        }
        if self.families.len() + self.metrics.len() >= MAX_HANDLES_PER_OWNER {
            return Err(MetricError::TooMany);
        }
        Ok(())
    }
}

pub(super) struct FamilyEntry {
    kind: MetricKind,
    help: String,
    /// Family handles naming it, over all owners.
    handles: usize,
    series: BTreeMap<LabelSet, Series>,
}

struct Series {
    /// Metric handles naming it, over all owners.
    handles: usize,
    value: SeriesValue,
}

enum SeriesValue {
    Number(f64),
    Histogram {
        bounds: Vec<f64>,
        /// Observations per bucket (not cumulative); the last one is `+Inf`'s.
        counts: Vec<u64>,
        sum: f64,
        count: u64,
    },
}

impl State {
    pub(super) fn family_new(
        &mut self,
        owner: u64,
        handle: u64,
        name: &str,
        description: &str,
        kind: MetricKind,
    ) -> Result<(), MetricError> {
        if !valid_metric_name(name) {
            return Err(MetricError::InvalidName(name.to_string()));
        }
        let handles = self.owners.entry(owner).or_default();
        handles.check_new(handle)?;
        match self.families.get_mut(name) {
            Some(family) if family.kind != kind => {
                return Err(MetricError::KindConflict {
                    name: name.to_string(),
                    existing: family.kind,
                    requested: kind,
                });
            }
            Some(family) => family.handles += 1,
            None => {
                self.families.insert(
                    name.to_string(),
                    FamilyEntry {
                        kind,
                        help: description.to_string(),
                        handles: 1,
                        series: BTreeMap::new(),
                    },
                );
            }
        }
        handles.families.insert(handle, name.to_string());
        Ok(())
    }

    pub(super) fn family_delete(&mut self, owner: u64, handle: u64) -> Result<(), MetricError> {
        let name = self
            .owners
            .get_mut(&owner)
            .and_then(|h| h.families.remove(&handle))
            .ok_or(MetricError::UnknownFamily(handle))?;
        if let Some(family) = self.families.get_mut(&name) {
            family.handles -= 1;
        }
        self.drop_if_unused(&name);
        Ok(())
    }

    pub(super) fn metric_new(
        &mut self,
        owner: u64,
        handle: u64,
        family_handle: u64,
        labels: LabelSet,
        buckets: Option<Vec<f64>>,
    ) -> Result<(), MetricError> {
        let handles = self.owners.entry(owner).or_default();
        let name = handles
            .families
            .get(&family_handle)
            .ok_or(MetricError::UnknownFamily(family_handle))?;
        let family = self
            .families
            .get_mut(name)
            .ok_or(MetricError::UnknownFamily(family_handle))?;
        if let Some(bad) = labels.keys().find(|k| !valid_label_name(k, family.kind)) {
            return Err(MetricError::InvalidLabelName(bad.clone()));
        }
        let value = match (family.kind, buckets) {
            (MetricKind::Histogram, None) => return Err(MetricError::MissingBuckets),
            (MetricKind::Histogram, Some(bounds)) => {
                let sorted =
                    bounds.iter().all(|b| b.is_finite()) && bounds.windows(2).all(|w| w[0] < w[1]);
                if !sorted {
                    return Err(MetricError::UnsortedBuckets(bounds));
                }
                SeriesValue::Histogram {
                    counts: vec![0; bounds.len() + 1],
                    bounds,
                    sum: 0.0,
                    count: 0,
                }
            }
            (_, Some(_)) => return Err(MetricError::UnexpectedBuckets),
            (_, None) => SeriesValue::Number(0.0),
        };
        handles.check_new(handle)?;
        // The same labels are the same series; a second histogram's own buckets are ignored.
        family
            .series
            .entry(labels.clone())
            .or_insert(Series { handles: 0, value })
            .handles += 1;
        handles.metrics.insert(handle, (name.clone(), labels));
        Ok(())
    }

    pub(super) fn metric_delete(&mut self, owner: u64, handle: u64) -> Result<(), MetricError> {
        let (name, labels) = self
            .owners
            .get_mut(&owner)
            .and_then(|h| h.metrics.remove(&handle))
            .ok_or(MetricError::UnknownMetric(handle))?;
        if let Some(family) = self.families.get_mut(&name)
            && let Some(series) = family.series.get_mut(&labels)
        {
            series.handles -= 1;
            if series.handles == 0 {
                family.series.remove(&labels);
            }
        }
        self.drop_if_unused(&name);
        Ok(())
    }

    /// The series metric `handle` names, with its family's kind.
    fn series(
        &mut self,
        owner: u64,
        handle: u64,
    ) -> Result<(MetricKind, &mut Series), MetricError> {
        let (name, labels) = self
            .owners
            .get(&owner)
            .and_then(|h| h.metrics.get(&handle))
            .ok_or(MetricError::UnknownMetric(handle))?;
        let family = self
            .families
            .get_mut(name)
            .ok_or(MetricError::UnknownMetric(handle))?;
        let series = family
            .series
            .get_mut(labels)
            .ok_or(MetricError::UnknownMetric(handle))?;
        Ok((family.kind, series))
    }

    pub(super) fn update(
        &mut self,
        owner: u64,
        handle: u64,
        update: Update,
    ) -> Result<(), MetricError> {
        let (kind, series) = self.series(owner, handle)?;
        let unsupported = MetricError::Unsupported {
            kind,
            op: update.name(),
        };
        match (&mut series.value, kind, update) {
            (SeriesValue::Number(_), MetricKind::Counter, Update::Increment(v)) if v < 0.0 => {
                Err(MetricError::NegativeIncrement)
            }
            (
                SeriesValue::Number(value),
                MetricKind::Counter | MetricKind::Gauge,
                Update::Increment(v),
            ) => {
                *value += v;
                Ok(())
            }
            (SeriesValue::Number(value), MetricKind::Gauge, Update::Set(v)) => {
                *value = v;
                Ok(())
            }
            (
                SeriesValue::Histogram {
                    bounds,
                    counts,
                    sum,
                    count,
                },
                MetricKind::Histogram,
                Update::Observe(v),
            ) => {
                // `le` is inclusive; NaN lands in +Inf, as in prometheus-cpp.
                let bucket = bounds.iter().position(|b| v <= *b).unwrap_or(bounds.len());
                counts[bucket] += 1;
                *sum += v;
                *count += 1;
                Ok(())
            }
            _ => Err(unsupported),
        }
    }

    pub(super) fn value(&mut self, owner: u64, handle: u64) -> Result<f64, MetricError> {
        let (kind, series) = self.series(owner, handle)?;
        match series.value {
            SeriesValue::Number(v) => Ok(v),
            SeriesValue::Histogram { .. } => Err(MetricError::Unsupported { kind, op: "Value" }),
        }
    }

    pub(super) fn remove_owner(&mut self, owner: u64) {
        let Some(handles) = self.owners.get(&owner) else {
            return;
        };
        let metrics: Vec<u64> = handles.metrics.keys().copied().collect();
        let families: Vec<u64> = handles.families.keys().copied().collect();
        for handle in metrics {
            let _ = self.metric_delete(owner, handle);
        }
        for handle in families {
            let _ = self.family_delete(owner, handle);
        }
        self.owners.remove(&owner);
    }

    fn drop_if_unused(&mut self, name: &str) {
        if self
            .families
            .get(name)
            .is_some_and(|f| f.handles == 0 && f.series.is_empty())
        {
            self.families.remove(name);
        }
    }

    pub(super) fn families(&self) -> Vec<Family> {
        self.families
            .iter()
            .filter(|(_, f)| !f.series.is_empty())
            .map(|(name, entry)| {
                let mut family =
                    Family::new(name.clone(), entry.help.clone(), entry.kind.prometheus());
                for (labels, series) in &entry.series {
                    let labels =
                        Labels(labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect());
                    family.sample(labels, series.value.rendered());
                }
                family
            })
            .collect()
    }
}

impl SeriesValue {
    fn rendered(&self) -> Value {
        match self {
            SeriesValue::Number(v) => Value::Number(*v),
            SeriesValue::Histogram {
                bounds,
                counts,
                sum,
                count,
            } => {
                let mut cumulative = 0;
                let buckets = bounds
                    .iter()
                    .zip(counts)
                    .map(|(bound, n)| {
                        cumulative += n;
                        (*bound, cumulative)
                    })
                    .collect();
                Value::Histogram {
                    buckets,
                    sum: *sum,
                    count: *count,
                }
            }
        }
    }
}

/// Prometheus' metric name rule.
fn valid_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':');
    first_ok
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        && !name.starts_with("__")
}

/// Prometheus' label name rule; `le` belongs to a histogram's buckets.
fn valid_label_name(name: &str, kind: MetricKind) -> bool {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    first_ok
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with("__")
        && !(kind == MetricKind::Histogram && name == "le")
}
