//! The process's log subscriber and its run-time control (`/v2/logging`, gRPC `LogSettings`).
//!
//! ```text
//! init(verbose, format) ─► tracing_subscriber: reloadable EnvFilter ─► fmt (text or JSON) ─► stderr
//!                              ▲
//! LogControl::apply(update) ───┘ validated settings ─► a new filter directive
//! ```
//!
//! Triton's switches map onto one maximum level: `log_verbose_level > 0` → debug (2 and more:
//! trace), else `log_info` → info, else `log_warning` → warn, else `log_error` → error, else
//! off. `RUST_LOG`, when set at startup, gives the initial filter; the first update through
//! the API replaces it. Request log lines of traced requests carry the W3C trace id (the
//! request paths open a `request` span with a `trace_id` field, which both formats print).

use std::sync::{Arc, OnceLock};

use nereid_proto::{LogSettings, LogValue, ServiceError, ServiceResult};
use parking_lot::Mutex;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

/// Log line format, chosen at startup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (`log_format` `default` or `ISO8601` in `/v2/logging`).
    Text,
    /// One JSON object per line (`log_format` `json`).
    Json,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct State {
    info: bool,
    warning: bool,
    error: bool,
    verbose: u32,
    format: LogFormat,
}

impl State {
    fn directive(&self) -> String {
        let quiet_deps = "h2=info,hyper=info,tower=info,openraft=info";
        match self.verbose {
            0 if self.info => "info".into(),
            0 if self.warning => "warn".into(),
            0 if self.error => "error".into(),
            0 => "off".into(),
            1 => format!("debug,{quiet_deps}"),
            _ => format!("trace,{quiet_deps}"),
        }
    }
}

/// Run-time control of the process's logging.
pub struct LogControl {
    state: Mutex<State>,
    /// `None` when this process did not install the subscriber (tests, embedding).
    filter: Option<reload::Handle<EnvFilter, Registry>>,
}

static CONTROL: OnceLock<Arc<LogControl>> = OnceLock::new();

/// Installs the process's subscriber (once; later calls return the first control).
pub fn init(verbose: u32, format: LogFormat) -> Arc<LogControl> {
    CONTROL
        .get_or_init(|| {
            let state = State {
                info: true,
                warning: true,
                error: true,
                verbose,
                format,
            };
            let filter = EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new(state.directive()));
            let (filter, handle) = reload::Layer::new(filter);
            let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
            let fmt = tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(ansi);
            let registry = tracing_subscriber::registry().with(filter);
            let installed = match format {
                LogFormat::Json => registry.with(fmt.json()).try_init(),
                LogFormat::Text => registry.with(fmt).try_init(),
            };
            Arc::new(LogControl {
                state: Mutex::new(state),
                filter: installed.is_ok().then_some(handle),
            })
        })
        .clone()
}

/// The process's control if [`init`] ran, else one that only keeps settings.
pub fn control() -> Arc<LogControl> {
    CONTROL
        .get()
        .cloned()
        .unwrap_or_else(|| Arc::new(LogControl::detached(LogFormat::Text)))
}

impl LogControl {
    /// Settings without a subscriber to drive (tests).
    pub fn detached(format: LogFormat) -> LogControl {
        LogControl {
            state: Mutex::new(State {
                info: true,
                warning: true,
                error: true,
                verbose: 0,
                format,
            }),
            filter: None,
        }
    }

    /// Applies `update` (validated whole first) and returns the settings now in force.
    pub fn apply(&self, update: Option<LogSettings>) -> ServiceResult<LogSettings> {
        let mut state = self.state.lock();
        if let Some(update) = update {
            let mut next = state.clone();
            for (key, value) in update {
                match (key.as_str(), value) {
                    ("log_info", LogValue::Bool(b)) => next.info = b,
                    ("log_warning", LogValue::Bool(b)) => next.warning = b,
                    ("log_error", LogValue::Bool(b)) => next.error = b,
                    ("log_verbose_level", LogValue::Uint(n)) => next.verbose = n,
                    ("log_format", LogValue::Text(f)) => {
                        next.format = parse_format(&f, state.format)?;
                    }
                    ("log_file", LogValue::Text(_)) => {
                        return Err(ServiceError::unsupported(
                            "log_file cannot be changed through the API; logs go to stderr",
                        ));
                    }
                    (k @ ("log_info" | "log_warning" | "log_error"), _) => {
                        return Err(ServiceError::invalid(format!(
                            "log setting '{k}' must be a boolean"
                        )));
                    }
                    ("log_verbose_level", _) => {
                        return Err(ServiceError::invalid(
                            "log setting 'log_verbose_level' must be a non-negative integer",
                        ));
                    }
                    (k @ ("log_format" | "log_file"), _) => {
                        return Err(ServiceError::invalid(format!(
                            "log setting '{k}' must be a string"
                        )));
                    }
                    (other, _) => {
                        return Err(ServiceError::invalid(format!(
                            "unknown log setting '{other}'; expected one of log_file, log_info, log_warning, log_error, log_verbose_level, log_format"
                        )));
                    }
                }
            }
            if next != *state {
                if let Some(handle) = &self.filter {
                    handle
                        .reload(EnvFilter::new(next.directive()))
                        .map_err(|e| {
                            ServiceError::internal(format!("cannot change the log filter: {e}"))
                        })?;
                }
                *state = next;
            }
        }
        Ok(report(&state))
    }
}

/// Triton's `default` and `ISO8601` name the text format (Nereid writes RFC 3339 text lines
/// for both); `json` the JSON one. The format itself is fixed at startup.
fn parse_format(value: &str, current: LogFormat) -> ServiceResult<LogFormat> {
    let wanted = match value {
        "default" | "ISO8601" | "text" => LogFormat::Text,
        "json" => LogFormat::Json,
        other => {
            return Err(ServiceError::invalid(format!(
                "log setting 'log_format' must be 'default', 'ISO8601' or 'json', got '{other}'"
            )));
        }
    };
    if wanted != current {
        return Err(ServiceError::invalid(
            "log setting 'log_format': switching between text and JSON needs a restart with --log-format",
        ));
    }
    Ok(wanted)
}

fn report(state: &State) -> LogSettings {
    let mut out = LogSettings::new();
    out.insert("log_file".into(), LogValue::Text(String::new()));
    out.insert("log_info".into(), LogValue::Bool(state.info));
    out.insert("log_warning".into(), LogValue::Bool(state.warning));
    out.insert("log_error".into(), LogValue::Bool(state.error));
    out.insert("log_verbose_level".into(), LogValue::Uint(state.verbose));
    let format = match state.format {
        LogFormat::Text => "default",
        LogFormat::Json => "json",
    };
    out.insert("log_format".into(), LogValue::Text(format.into()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn update(pairs: Vec<(&str, LogValue)>) -> Option<LogSettings> {
        Some(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    #[test]
    fn switches_map_to_one_level() {
        let control = LogControl::detached(LogFormat::Text);
        let s = control.apply(None).unwrap();
        assert_eq!(s["log_info"], LogValue::Bool(true));
        assert_eq!(s["log_format"], LogValue::Text("default".into()));
        control
            .apply(update(vec![("log_info", LogValue::Bool(false))]))
            .unwrap();
        assert_eq!(control.state.lock().directive(), "warn");
        control
            .apply(update(vec![("log_verbose_level", LogValue::Uint(1))]))
            .unwrap();
        assert!(control.state.lock().directive().starts_with("debug"));
    }

    #[test]
    fn bad_updates_name_the_key_and_change_nothing() {
        let control = LogControl::detached(LogFormat::Text);
        let cases = [
            (
                update(vec![
                    ("log_info", LogValue::Bool(false)),
                    ("log_info2", LogValue::Bool(true)),
                ]),
                "unknown log setting 'log_info2'",
            ),
            (
                update(vec![("log_error", LogValue::Uint(1))]),
                "'log_error' must be a boolean",
            ),
            (
                update(vec![("log_format", LogValue::Text("xml".into()))]),
                "'log_format' must be",
            ),
            (
                update(vec![("log_format", LogValue::Text("json".into()))]),
                "needs a restart",
            ),
            (
                update(vec![("log_file", LogValue::Text("/tmp/x".into()))]),
                "log_file cannot be changed",
            ),
        ];
        for (update, message) in cases {
            let err = control.apply(update).unwrap_err();
            assert!(err.to_string().contains(message), "{err}");
        }
        assert_eq!(
            control.apply(None).unwrap()["log_info"],
            LogValue::Bool(true)
        );
    }
}
