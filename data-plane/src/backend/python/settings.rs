//! How a Python model's stub is run, read from the model config's `parameters`:
//!
//! | parameter | meaning | default |
//! |---|---|---|
//! | `EXECUTION_ENV_PATH` | the interpreter: a conda-pack archive (`.tar.gz`/`.tgz`, unpacked once and cached: `env_archive`), a directory (a virtual environment: `<dir>/bin/python3`) or an interpreter file; `$$TRITON_MODEL_DIRECTORY` expands to the model directory; relative paths are relative to the model directory | `--python` (`NEREID_PYTHON`), else `python3` on `PATH` |
//! | `STUB_TIMEOUT_SECONDS` | how long a new stub may take to start and connect, and to finalize on unload | 30 |
//! | `INITIALIZE_TIMEOUT_SECONDS` | how long the model's `initialize` (or `auto_complete_config`) may run | 600 |
//! | `SHARED_STUB_PROCESS` | (a Nereid extension) `true`: the instances of one instance group on one device share one stub process, each on its own thread; a number n ≥ 2: at most n instances per process; `false` or `1`: one process per instance | `false` |
//!
//! Triton's `EXECUTION_ENV_PATH` names a conda-pack archive; Nereid takes that, an unpacked
//! environment, or any interpreter.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::env_archive;
use crate::backend::params::{Params, param};

pub const EXECUTION_ENV_PATH: &str = "EXECUTION_ENV_PATH";
pub const STUB_TIMEOUT_SECONDS: &str = "STUB_TIMEOUT_SECONDS";
pub const INITIALIZE_TIMEOUT_SECONDS: &str = "INITIALIZE_TIMEOUT_SECONDS";
pub const SHARED_STUB_PROCESS: &str = "SHARED_STUB_PROCESS";

const MODEL_DIRECTORY_VARIABLE: &str = "$$TRITON_MODEL_DIRECTORY";
const DEFAULT_STUB_TIMEOUT: Duration = Duration::from_secs(30);
const DEFAULT_INITIALIZE_TIMEOUT: Duration = Duration::from_secs(600);
/// Found on `PATH` when nothing else names an interpreter.
const PATH_PYTHON: &str = "python3";

/// Everything the backend needs to know to run one model's stubs.
#[derive(Clone, Debug, PartialEq)]
pub struct StubSettings {
    /// The interpreter: a path, or a bare program name looked up on `PATH` when spawned.
    pub python: PathBuf,
    pub start_timeout: Duration,
    pub initialize_timeout: Duration,
    /// `SHARED_STUB_PROCESS`: at most this many instances of one group on one device per stub
    /// process (`usize::MAX` for all of them); `None`: a process per instance.
    pub shared: Option<usize>,
}

impl StubSettings {
    /// Reads the `parameters` of model `m` in `model_dir`. `default_python` is the
    /// server-wide default (`--python` / `NEREID_PYTHON`).
    pub fn new(
        m: &str,
        parameters: &Params,
        model_dir: &Path,
        default_python: Option<&Path>,
    ) -> Result<Self, String> {
        let python = resolve_interpreter(
            param(parameters, EXECUTION_ENV_PATH),
            model_dir,
            default_python,
        )
        .map_err(|e| format!("model '{m}': {e}"))?;
        let (start_timeout, initialize_timeout, shared) = tunables(m, parameters)?;
        Ok(StubSettings {
            python,
            start_timeout,
            initialize_timeout,
            shared,
        })
    }
}

/// Checks the parameters of model `m` that need no file system (the timeouts and
/// `SHARED_STUB_PROCESS`): what `check-config` and a load report before any stub starts.
pub fn check_parameters(m: &str, parameters: &Params) -> Result<(), String> {
    tunables(m, parameters).map(drop)
}

/// The start and initialize timeouts and `SHARED_STUB_PROCESS`, each checked.
fn tunables(m: &str, parameters: &Params) -> Result<(Duration, Duration, Option<usize>), String> {
    let parameter = |key: &str| param(parameters, key);
    let seconds = |key: &str, default: Duration| -> Result<Duration, String> {
        match parameter(key) {
            None => Ok(default),
            Some(text) => parse_seconds(text).ok_or_else(|| {
                format!("model '{m}': parameter {key} must be a positive number of seconds, got '{text}'")
            }),
        }
    };
    let start = seconds(STUB_TIMEOUT_SECONDS, DEFAULT_STUB_TIMEOUT)?;
    let initialize = seconds(INITIALIZE_TIMEOUT_SECONDS, DEFAULT_INITIALIZE_TIMEOUT)?;
    let shared = parameter(SHARED_STUB_PROCESS)
        .map(|text| {
            parse_shared(text).ok_or_else(|| {
                format!("model '{m}': parameter {SHARED_STUB_PROCESS} must be 'true', 'false' or the most instances one stub process hosts (a positive integer), got '{text}'")
            })
        })
        .transpose()?
        .flatten();
    Ok((start, initialize, shared))
}

/// `true` / `false` (any case, as Triton reads boolean parameters) or a count; a count of 1 is
/// a process per instance.
fn parse_shared(text: &str) -> Option<Option<usize>> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("true") {
        return Some(Some(usize::MAX));
    }
    if text.eq_ignore_ascii_case("false") {
        return Some(None);
    }
    match text.parse::<usize>().ok()? {
        0 => None,
        1 => Some(None),
        n => Some(Some(n)),
    }
}

/// The interpreter for a model: `EXECUTION_ENV_PATH` (`setting`), else `default_python`, else
/// `python3` on `PATH`. Paths are checked to exist; a directory means a virtual environment.
pub fn resolve_interpreter(
    setting: Option<&str>,
    model_dir: &Path,
    default_python: Option<&Path>,
) -> Result<PathBuf, String> {
    if let Some(raw) = setting.filter(|s| !s.is_empty()) {
        let expanded = raw.replace(MODEL_DIRECTORY_VARIABLE, &model_dir.to_string_lossy());
        let path = model_dir.join(&expanded);
        return interpreter_at(&path).map_err(|why| {
            format!(
                "{EXECUTION_ENV_PATH} '{raw}' (resolved to '{}') {why}",
                path.display()
            )
        });
    }
    match default_python {
        // A bare program name is looked up on PATH when the stub is spawned.
        Some(p) if p.components().count() == 1 && !p.is_absolute() => Ok(p.to_path_buf()),
        Some(p) => {
            interpreter_at(p).map_err(|why| format!("NEREID_PYTHON '{}' {why}", p.display()))
        }
        None => Ok(PathBuf::from(PATH_PYTHON)),
    }
}

/// `path` itself if it is a file, `<path>/bin/python3` (or `python`) if it is a directory, the
/// same in the unpacked copy if it is a conda-pack archive.
fn interpreter_at(path: &Path) -> Result<PathBuf, String> {
    if env_archive::is_archive(path) {
        let unpacked = env_archive::unpacked(path)?;
        return interpreter_at(&unpacked)
            .map_err(|why| format!("(unpacked into '{}') {why}", unpacked.display()));
    }
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    if path.is_dir() {
        let bin = path.join("bin");
        return ["python3", "python"]
            .iter()
            .map(|exe| bin.join(exe))
            .find(|p| p.is_file())
            .ok_or_else(|| {
                "is a directory without bin/python3; name a virtual environment or an interpreter"
                    .to_string()
            });
    }
    Err("does not exist; name a virtual environment directory or a Python interpreter".into())
}

fn parse_seconds(text: &str) -> Option<Duration> {
    let secs: f64 = text.parse().ok()?;
    (secs.is_finite() && secs > 0.0).then(|| Duration::from_secs_f64(secs.min(1e9)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(params: &[(&str, &str)]) -> Params {
        params
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// A model directory holding `env/bin/python3` and `interp`.
    fn model_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("env/bin")).unwrap();
        std::fs::write(dir.path().join("env/bin/python3"), "").unwrap();
        std::fs::write(dir.path().join("interp"), "").unwrap();
        dir
    }

    #[test]
    fn execution_env_path_forms() {
        let dir = model_dir();
        let d = dir.path();
        let venv = d.join("env/bin/python3");
        assert_eq!(resolve_interpreter(Some("env"), d, None).unwrap(), venv);
        assert_eq!(
            resolve_interpreter(Some("$$TRITON_MODEL_DIRECTORY/env"), d, None).unwrap(),
            venv
        );
        let absolute = d.join("interp");
        assert_eq!(
            resolve_interpreter(
                Some(absolute.to_str().unwrap()),
                Path::new("/elsewhere"),
                None
            )
            .unwrap(),
            absolute
        );
        assert_eq!(
            resolve_interpreter(Some("interp"), d, Some(Path::new("/ignored"))).unwrap(),
            absolute,
            "the model's setting wins over the server default"
        );
    }

    #[test]
    fn missing_or_unusable_interpreters_are_named() {
        let dir = model_dir();
        let d = dir.path();
        let err = resolve_interpreter(Some("nope"), d, None).unwrap_err();
        assert!(
            err.contains("EXECUTION_ENV_PATH 'nope'")
                && err.contains(&d.join("nope").display().to_string())
                && err.contains("does not exist"),
            "{err}"
        );
        std::fs::create_dir(d.join("empty")).unwrap();
        let err = resolve_interpreter(Some("empty"), d, None).unwrap_err();
        assert!(err.contains("without bin/python3"), "{err}");
        let err = resolve_interpreter(Some("env.tar.gz"), d, None).unwrap_err();
        assert!(
            err.contains("EXECUTION_ENV_PATH 'env.tar.gz'") && err.contains("cannot be read"),
            "{err}"
        );
        let err = resolve_interpreter(None, d, Some(Path::new("/no/such/python"))).unwrap_err();
        assert!(err.contains("NEREID_PYTHON '/no/such/python'"), "{err}");
    }

    #[test]
    fn defaults_come_from_the_server_then_path() {
        let dir = model_dir();
        let d = dir.path();
        assert_eq!(
            resolve_interpreter(None, d, None).unwrap(),
            PathBuf::from("python3")
        );
        assert_eq!(
            resolve_interpreter(Some(""), d, Some(Path::new("python3.11"))).unwrap(),
            PathBuf::from("python3.11"),
            "a bare name is left for PATH lookup"
        );
        let venv = d.join("env");
        assert_eq!(
            resolve_interpreter(None, d, Some(&venv)).unwrap(),
            venv.join("bin/python3")
        );
    }

    #[test]
    fn timeouts_are_parameters() {
        let dir = model_dir();
        let s = StubSettings::new("m", &config(&[]), dir.path(), None).unwrap();
        assert_eq!(s.start_timeout, Duration::from_secs(30));
        assert_eq!(s.initialize_timeout, Duration::from_secs(600));
        let s = StubSettings::new(
            "m",
            &config(&[
                (STUB_TIMEOUT_SECONDS, "2.5"),
                (INITIALIZE_TIMEOUT_SECONDS, "7"),
            ]),
            dir.path(),
            None,
        )
        .unwrap();
        assert_eq!(s.start_timeout, Duration::from_millis(2500));
        assert_eq!(s.initialize_timeout, Duration::from_secs(7));
        assert_eq!(s.shared, None);
        for bad in ["0", "-1", "abc", "inf"] {
            let err = StubSettings::new(
                "m",
                &config(&[(STUB_TIMEOUT_SECONDS, bad)]),
                dir.path(),
                None,
            )
            .unwrap_err();
            assert!(
                err.starts_with("model 'm': parameter STUB_TIMEOUT_SECONDS"),
                "{err}"
            );
        }
    }

    #[test]
    fn shared_stub_process_is_a_boolean_or_a_count() {
        let dir = model_dir();
        let shared = |value: &str| {
            StubSettings::new(
                "m",
                &config(&[(SHARED_STUB_PROCESS, value)]),
                dir.path(),
                None,
            )
            .map(|s| s.shared)
        };
        assert_eq!(shared("true"), Ok(Some(usize::MAX)));
        assert_eq!(shared("TRUE"), Ok(Some(usize::MAX)));
        assert_eq!(shared("false"), Ok(None));
        assert_eq!(shared("1"), Ok(None));
        assert_eq!(shared("4"), Ok(Some(4)));
        for bad in ["0", "-2", "yes", ""] {
            let err = shared(bad).unwrap_err();
            assert!(
                err.starts_with("model 'm': parameter SHARED_STUB_PROCESS must be 'true', 'false'")
                    && err.ends_with(&format!("got '{bad}'")),
                "{err}"
            );
        }
    }
}
