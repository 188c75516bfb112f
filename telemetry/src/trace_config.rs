//! Trace settings: Triton's `--trace-config` vocabulary at startup, the trace setting API at run
//! time (global and per model), and the sampling decision they drive.
//!
//! ```text
//! --trace-config level=TIMESTAMPS --trace-config rate=100 --trace-config mode=triton
//! --trace-config triton,file=/tmp/trace.json | opentelemetry,url=http://collector:4318/v1/traces
//!        │ TelemetryConfig::parse (startup.rs, pure)
//!        ▼
//! Settings (global: level, rate, count, log_frequency, file, mode)
//!        │
//! TraceSettingsStore ── GET/POST /v2/trace/setting, /v2/models/{m}/trace/setting
//!        │                 (validated updates; null clears a model key / restores a global one)
//!        └─► sample(model, parent sampled?) ─► traced or not
//! ```
//!
//! Sampling follows Triton: with a level other than OFF, one request in `trace_rate` is traced
//! (the first, then every rate-th), until `trace_count` traces were taken (-1: no limit). A
//! request whose caller sent a sampled W3C `traceparent` is traced whenever the level is not
//! OFF — the caller already decided, so a trace across router → worker → ensemble steps is never
//! cut in the middle. (In Triton's mode the tracer takes only its own requests' contexts as
//! parents: see `tracer`.)
//!
//! As in Triton, `trace_file` cannot be set through the API (501), `trace_mode` is accepted and
//! ignored, and in Triton's mode without a file every update is refused.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};

use nereid_proto::{ServiceError, ServiceResult, TraceSettings, TraceSettingsUpdate};
use parking_lot::RwLock;

/// What a trace records: timestamps, and with TENSORS (in Triton's mode) the request's input
/// and output tensors too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TraceLevel {
    Timestamps,
    Tensors,
}

impl TraceLevel {
    fn name(self) -> &'static str {
        match self {
            TraceLevel::Timestamps => "TIMESTAMPS",
            TraceLevel::Tensors => "TENSORS",
        }
    }
}

/// Where traces go: Triton's JSON trace files, or OTLP spans.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TraceMode {
    /// Triton's default: JSON trace files (`triton,file=...`), see `triton_file`.
    #[default]
    Triton,
    OpenTelemetry,
}

impl TraceMode {
    pub fn name(self) -> &'static str {
        match self {
            TraceMode::Triton => "triton",
            TraceMode::OpenTelemetry => "opentelemetry",
        }
    }
}

/// The settings one scope (global, or a model's overrides) resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// Empty: OFF.
    pub level: Vec<TraceLevel>,
    pub rate: u64,
    /// Traces left to take; -1 for no limit.
    pub count: i64,
    pub log_frequency: u64,
    pub file: String,
    /// Set at startup only.
    pub mode: TraceMode,
}

impl Default for Settings {
    /// Triton's defaults: OFF, rate 1000, no count limit.
    fn default() -> Settings {
        Settings {
            level: Vec::new(),
            rate: 1000,
            count: -1,
            log_frequency: 0,
            file: String::new(),
            mode: TraceMode::Triton,
        }
    }
}

/// A model's overrides: `None` keys follow the global settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Overrides {
    level: Option<Vec<TraceLevel>>,
    rate: Option<u64>,
    count: Option<i64>,
    log_frequency: Option<u64>,
}

/// Keys of the trace setting API, as Triton names them.
pub const KEYS: [&str; 6] = [
    "trace_level",
    "trace_rate",
    "trace_count",
    "log_frequency",
    "trace_file",
    "trace_mode",
];

/// Triton's answer to an update while Triton's mode has no trace file.
pub const NO_TRACE_FILE: &str =
    "Attempting to set invalid trace setting :trace file name is not given";

/// Per-scope sampling state: requests seen and traces left.
#[derive(Debug)]
struct Counters {
    seen: AtomicU64,
    left: AtomicI64,
}

impl Counters {
    fn new(count: i64) -> Counters {
        Counters {
            seen: AtomicU64::new(0),
            left: AtomicI64::new(count),
        }
    }
}

#[derive(Debug)]
struct Model {
    overrides: Overrides,
    /// Own counters when the model overrides rate or count; else it shares the global ones.
    counters: Option<Counters>,
}

/// The live trace settings of a process, shared by its frontends and request paths. Whoever
/// holds both locks takes `models` before `global`, so concurrent updates cannot deadlock.
#[derive(Debug)]
pub struct TraceSettingsStore {
    startup: Settings,
    global: RwLock<(Settings, Counters)>,
    models: RwLock<BTreeMap<String, Model>>,
    /// Some scope has a level other than OFF.
    any_on: AtomicBool,
}

impl TraceSettingsStore {
    pub fn new(startup: Settings) -> TraceSettingsStore {
        let counters = Counters::new(startup.count);
        TraceSettingsStore {
            any_on: AtomicBool::new(!startup.level.is_empty()),
            global: RwLock::new((startup.clone(), counters)),
            startup,
            models: RwLock::new(BTreeMap::new()),
        }
    }

    /// Whether tracing is off everywhere: the hot path's first question, one atomic load.
    pub fn all_off(&self) -> bool {
        !self.any_on.load(Ordering::Relaxed)
    }

    /// Whether a request for `model` is traced; `parent_sampled` is the caller's W3C sampled
    /// flag when it sent a trace context.
    pub fn sample(&self, model: &str, parent_sampled: Option<bool>) -> bool {
        let models = self.models.read();
        let global = self.global.read();
        let model_state = models.get(model);
        let level_on = match model_state.and_then(|m| m.overrides.level.as_ref()) {
            Some(level) => !level.is_empty(),
            None => !global.0.level.is_empty(),
        };
        if !level_on {
            return false;
        }
        if parent_sampled == Some(true) {
            return true;
        }
        let rate = model_state
            .and_then(|m| m.overrides.rate)
            .unwrap_or(global.0.rate)
            .max(1);
        let counters = model_state
            .and_then(|m| m.counters.as_ref())
            .unwrap_or(&global.1);
        let seen = counters.seen.fetch_add(1, Ordering::Relaxed);
        if !seen.is_multiple_of(rate) {
            return false;
        }
        take_one(&counters.left)
    }

    /// The mode chosen at startup.
    pub fn mode(&self) -> TraceMode {
        self.startup.mode
    }

    /// The trace file chosen at startup (empty: none).
    pub fn file(&self) -> &str {
        &self.startup.file
    }

    /// The `log_frequency` that applies to `model`'s traces.
    pub fn log_frequency(&self, model: &str) -> u64 {
        let models = self.models.read();
        let global = self.global.read();
        models
            .get(model)
            .and_then(|m| m.overrides.log_frequency)
            .unwrap_or(global.0.log_frequency)
    }

    /// Whether `model`'s traces record tensors (level TENSORS).
    pub fn tensors(&self, model: &str) -> bool {
        let models = self.models.read();
        let global = self.global.read();
        models
            .get(model)
            .and_then(|m| m.overrides.level.as_ref())
            .unwrap_or(&global.0.level)
            .contains(&TraceLevel::Tensors)
    }

    /// The settings of `model` (`None`: global) after applying `update`. Whether the model
    /// exists is the caller's check: it owns the model registry.
    pub fn apply(
        &self,
        model: Option<&str>,
        update: Option<TraceSettingsUpdate>,
    ) -> ServiceResult<TraceSettings> {
        if let Some(update) = update {
            if self.startup.mode == TraceMode::Triton && self.startup.file.is_empty() {
                return Err(ServiceError::invalid(NO_TRACE_FILE));
            }
            let parsed = parse_update(&update)?;
            match model {
                None => self.update_global(parsed),
                Some(name) => self.update_model(name, parsed),
            }
        }
        Ok(self.report(model))
    }

    fn update_global(&self, update: Vec<(Key, Option<Value>)>) {
        let mut guard = self.global.write();
        let (s, counters) = &mut *guard;
        for (key, value) in update {
            match (key, value) {
                (Key::Level, Some(Value::Level(l))) => s.level = l,
                (Key::Level, None) => s.level = self.startup.level.clone(),
                (Key::Rate, Some(Value::Number(n))) => s.rate = n as u64,
                (Key::Rate, None) => s.rate = self.startup.rate,
                (Key::Count, v) => {
                    s.count = match v {
                        Some(Value::Number(n)) => n,
                        _ => self.startup.count,
                    };
                    counters.left.store(s.count, Ordering::Relaxed);
                }
                (Key::LogFrequency, Some(Value::Number(n))) => s.log_frequency = n as u64,
                (Key::LogFrequency, None) => s.log_frequency = self.startup.log_frequency,
                _ => {}
            }
        }
        // New settings count afresh: the next request is the first of the new rate.
        counters.seen.store(0, Ordering::Relaxed);
        drop(guard);
        self.refresh_any_on();
    }

    fn update_model(&self, name: &str, update: Vec<(Key, Option<Value>)>) {
        let mut models = self.models.write();
        let model = models.entry(name.to_string()).or_insert_with(|| Model {
            overrides: Overrides::default(),
            counters: None,
        });
        let o = &mut model.overrides;
        for (key, value) in update {
            match (key, value) {
                (Key::Level, Some(Value::Level(l))) => o.level = Some(l),
                (Key::Level, None) => o.level = None,
                (Key::Rate, Some(Value::Number(n))) => o.rate = Some(n as u64),
                (Key::Rate, None) => o.rate = None,
                (Key::Count, Some(Value::Number(n))) => o.count = Some(n),
                (Key::Count, None) => o.count = None,
                (Key::LogFrequency, Some(Value::Number(n))) => o.log_frequency = Some(n as u64),
                (Key::LogFrequency, None) => o.log_frequency = None,
                _ => {}
            }
        }
        model.counters = (o.rate.is_some() || o.count.is_some())
            .then(|| Counters::new(o.count.unwrap_or(self.global.read().0.count)));
        if model.overrides == Overrides::default() {
            models.remove(name);
        }
        drop(models);
        self.refresh_any_on();
    }

    fn refresh_any_on(&self) {
        let models = self.models.read();
        let global = self.global.read();
        let on = !global.0.level.is_empty()
            || models
                .values()
                .any(|m| m.overrides.level.as_ref().is_some_and(|l| !l.is_empty()));
        self.any_on.store(on, Ordering::Relaxed);
    }

    /// The settings `model` (`None`: global) resolves to, in the API's shape.
    pub fn report(&self, model: Option<&str>) -> TraceSettings {
        let models = self.models.read();
        let global = self.global.read();
        let overrides = model
            .and_then(|m| models.get(m))
            .map(|m| m.overrides.clone())
            .unwrap_or_default();
        let count_left = match model.and_then(|m| models.get(m)) {
            Some(Model {
                counters: Some(c), ..
            }) => c.left.load(Ordering::Relaxed),
            _ => global.1.left.load(Ordering::Relaxed),
        };
        let level = overrides.level.unwrap_or_else(|| global.0.level.clone());
        let level = if level.is_empty() {
            vec!["OFF".to_string()]
        } else {
            level.iter().map(|l| l.name().to_string()).collect()
        };
        let mut out = TraceSettings::new();
        out.insert("trace_level".into(), level);
        out.insert(
            "trace_rate".into(),
            vec![overrides.rate.unwrap_or(global.0.rate).to_string()],
        );
        out.insert("trace_count".into(), vec![count_left.to_string()]);
        out.insert(
            "log_frequency".into(),
            vec![
                overrides
                    .log_frequency
                    .unwrap_or(global.0.log_frequency)
                    .to_string(),
            ],
        );
        out.insert("trace_file".into(), vec![global.0.file.clone()]);
        out.insert("trace_mode".into(), vec![global.0.mode.name().to_string()]);
        out
    }
}

/// Takes one trace from `left` (-1: unlimited); false when none are left.
fn take_one(left: &AtomicI64) -> bool {
    left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| match n {
        n if n < 0 => Some(n),
        0 => None,
        n => Some(n - 1),
    })
    .is_ok()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    Level,
    Rate,
    Count,
    LogFrequency,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Value {
    Level(Vec<TraceLevel>),
    Number(i64),
}

/// Validates a whole update before any of it applies, naming the first bad key.
fn parse_update(update: &TraceSettingsUpdate) -> ServiceResult<Vec<(Key, Option<Value>)>> {
    let mut out = Vec::new();
    for (key, values) in update {
        let parsed_key = match key.as_str() {
            "trace_level" => Key::Level,
            "trace_rate" => Key::Rate,
            "trace_count" => Key::Count,
            "log_frequency" => Key::LogFrequency,
            "trace_file" => {
                return Err(ServiceError::unsupported(
                    "trace file location can not be updated through network protocol",
                ));
            }
            // Triton accepts the key and keeps the startup mode.
            "trace_mode" => continue,
            other => {
                return Err(ServiceError::invalid(format!(
                    "unknown trace setting '{other}'; expected one of {}",
                    KEYS.join(", ")
                )));
            }
        };
        let value = match values {
            None => None,
            Some(values) => Some(parse_value(key, parsed_key, values)?),
        };
        out.push((parsed_key, value));
    }
    Ok(out)
}

fn parse_value(name: &str, key: Key, values: &[String]) -> ServiceResult<Value> {
    if key == Key::Level {
        return parse_levels(values).map(Value::Level);
    }
    let [value] = values else {
        return Err(ServiceError::invalid(format!(
            "trace setting '{name}' takes exactly one value, got {}",
            values.len()
        )));
    };
    let n: i64 = value.trim().parse().map_err(|_| {
        ServiceError::invalid(format!(
            "trace setting '{name}' must be an integer, got '{value}'"
        ))
    })?;
    let ok = match key {
        Key::Rate => n >= 1,
        Key::Count => n >= -1,
        _ => n >= 0,
    };
    if !ok {
        let bound = match key {
            Key::Rate => "at least 1",
            Key::Count => "-1 (no limit) or more",
            _ => "non-negative",
        };
        return Err(ServiceError::invalid(format!(
            "trace setting '{name}' must be {bound}, got {n}"
        )));
    }
    Ok(Value::Number(n))
}

/// `OFF` alone, or TIMESTAMPS and/or TENSORS (any case).
pub fn parse_levels(values: &[String]) -> ServiceResult<Vec<TraceLevel>> {
    let mut levels = Vec::new();
    for value in values {
        match value.trim().to_ascii_uppercase().as_str() {
            "OFF" => {
                if values.len() > 1 {
                    return Err(ServiceError::invalid(
                        "trace setting 'trace_level': OFF cannot be combined with other levels",
                    ));
                }
            }
            "TIMESTAMPS" => levels.push(TraceLevel::Timestamps),
            "TENSORS" => levels.push(TraceLevel::Tensors),
            other => {
                return Err(ServiceError::invalid(format!(
                    "trace setting 'trace_level' must be OFF, TIMESTAMPS or TENSORS, got '{other}'"
                )));
            }
        }
    }
    if values.is_empty() {
        return Err(ServiceError::invalid(
            "trace setting 'trace_level' needs at least one value",
        ));
    }
    levels.sort();
    levels.dedup();
    Ok(levels)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(pairs: &[(&str, Option<&[&str]>)]) -> TraceSettingsUpdate {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    v.map(|v| v.iter().map(|s| s.to_string()).collect()),
                )
            })
            .collect()
    }

    /// Off, in the OpenTelemetry mode (which takes updates without a trace file).
    fn off() -> Settings {
        Settings {
            mode: TraceMode::OpenTelemetry,
            ..Settings::default()
        }
    }

    fn on(rate: u64, count: i64) -> Settings {
        Settings {
            level: vec![TraceLevel::Timestamps],
            rate,
            count,
            ..off()
        }
    }

    fn triton(file: &str) -> Settings {
        Settings {
            mode: TraceMode::Triton,
            file: file.into(),
            ..on(1, -1)
        }
    }

    #[test]
    fn rate_traces_the_first_then_every_nth_until_the_count() {
        let store = TraceSettingsStore::new(on(3, 2));
        let traced: Vec<bool> = (0..10).map(|_| store.sample("m", None)).collect();
        assert_eq!(
            traced,
            [
                true, false, false, true, false, false, false, false, false, false
            ]
        );
        assert_eq!(store.report(None)["trace_count"], ["0"]);
    }

    #[test]
    fn off_traces_nothing_even_with_a_sampled_parent() {
        let store = TraceSettingsStore::new(off());
        assert!(store.all_off());
        assert!(!store.sample("m", Some(true)));
        let on = TraceSettingsStore::new(on(1000, -1));
        assert!(on.sample("m", None));
        assert!(!on.sample("m", None));
        assert!(on.sample("m", Some(true)), "the caller's decision wins");
        assert!(!on.sample("m", Some(false)));
    }

    #[test]
    fn model_overrides_and_clearing_them() {
        let store = TraceSettingsStore::new(off());
        let s = store
            .apply(
                Some("m"),
                Some(update(&[
                    ("trace_level", Some(&["TIMESTAMPS"])),
                    ("trace_rate", Some(&["1"])),
                ])),
            )
            .unwrap();
        assert_eq!(s["trace_level"], ["TIMESTAMPS"]);
        assert_eq!(s["trace_rate"], ["1"]);
        assert_eq!(store.report(None)["trace_level"], ["OFF"]);
        assert!(!store.all_off());
        assert!(store.sample("m", None) && store.sample("m", None));
        assert!(!store.sample("other", None));
        store
            .apply(
                Some("m"),
                Some(update(&[("trace_level", None), ("trace_rate", None)])),
            )
            .unwrap();
        assert!(store.all_off());
        assert_eq!(store.report(Some("m"))["trace_rate"], ["1000"]);
    }

    #[test]
    fn global_null_restores_the_startup_value() {
        let store = TraceSettingsStore::new(on(10, -1));
        store
            .apply(None, Some(update(&[("trace_rate", Some(&["2"]))])))
            .unwrap();
        assert_eq!(store.report(None)["trace_rate"], ["2"]);
        store
            .apply(None, Some(update(&[("trace_rate", None)])))
            .unwrap();
        assert_eq!(store.report(None)["trace_rate"], ["10"]);
    }

    #[test]
    fn bad_updates_name_the_key_and_change_nothing() {
        let store = TraceSettingsStore::new(off());
        let cases: [(&str, &[&str], &str); 6] = [
            ("trace_rate", &["0"], "'trace_rate' must be at least 1"),
            ("trace_rate", &["x"], "'trace_rate' must be an integer"),
            ("trace_count", &["-2"], "'trace_count' must be -1"),
            ("trace_level", &["LOUD"], "'trace_level' must be OFF"),
            ("trace_level", &["OFF", "TENSORS"], "OFF cannot be combined"),
            ("bogus", &["1"], "unknown trace setting 'bogus'"),
        ];
        for (key, values, message) in cases {
            let update = update(&[("trace_count", Some(&["5"])), (key, Some(values))]);
            let err = store.apply(None, Some(update)).unwrap_err();
            assert!(err.to_string().contains(message), "{key}: {err}");
            assert_eq!(store.report(None)["trace_count"], ["-1"], "nothing applied");
        }
        let err = store
            .apply(None, Some(update(&[("trace_file", Some(&["/tmp/x"]))])))
            .unwrap_err();
        assert!(matches!(err, ServiceError::Unsupported(_)), "{err}");
        assert!(err.to_string().contains("can not be updated"), "{err}");
    }

    #[test]
    fn the_mode_is_reported_and_updates_of_it_are_ignored_as_in_triton() {
        let otel = TraceSettingsStore::new(on(1, -1));
        let s = otel
            .apply(None, Some(update(&[("trace_mode", Some(&["triton"]))])))
            .unwrap();
        assert_eq!(s["trace_mode"], ["opentelemetry"]);
        // Triton's mode without a file refuses every update with Triton's words.
        let no_file = TraceSettingsStore::new(triton(""));
        assert_eq!(no_file.report(None)["trace_mode"], ["triton"]);
        let err = no_file
            .apply(None, Some(update(&[("trace_rate", Some(&["2"]))])))
            .unwrap_err();
        assert_eq!(err, ServiceError::invalid(NO_TRACE_FILE));
        let with_file = TraceSettingsStore::new(triton("/tmp/t.json"));
        let s = with_file
            .apply(None, Some(update(&[("log_frequency", Some(&["3"]))])))
            .unwrap();
        assert_eq!(s["log_frequency"], ["3"]);
        assert_eq!(s["trace_file"], ["/tmp/t.json"]);
    }
}
