//! Trace and log settings as the frontends carry them (Triton's trace and logging extensions:
//! `/v2/trace/setting`, `/v2/models/{m}/trace/setting`, `/v2/logging`, gRPC `TraceSetting` and
//! `LogSettings`).
//!
//! Both are string-keyed maps on the wire; the frontends only translate JSON or protobuf into
//! these types and back. Which keys exist and what values mean is decided by the service
//! (`nereid-telemetry` validates them), so an unknown key is refused in one place, naming it.

use std::collections::BTreeMap;

/// Trace settings: key → values (strings, as on the wire; `trace_level` may hold several).
pub type TraceSettings = BTreeMap<String, Vec<String>>;

/// A trace settings update: key → new values, or `None` to clear the key (a model's setting
/// falls back to the global one; a global setting to its startup value).
pub type TraceSettingsUpdate = BTreeMap<String, Option<Vec<String>>>;

/// One log setting's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogValue {
    /// A switch (`log_info`, `log_warning`, `log_error`).
    Bool(bool),
    /// A level or count (`log_verbose_level`).
    Uint(u32),
    /// A string (`log_format`, `log_file`).
    Text(String),
}

/// Log settings: key → value (`log_file`, `log_info`, `log_warning`, `log_error`,
/// `log_verbose_level`, `log_format`).
pub type LogSettings = BTreeMap<String, LogValue>;
