//! [`LoadtestError`]: what can stop a load test, classified once near the cause.
//!
//! Request failures during a run are not errors of this kind: they are counted per window and
//! per level (see `stats`) and reported; only `--fail-on-errors` turns them into a non-zero
//! exit.

use std::path::PathBuf;

/// Errors that end the tool with exit status 1. Messages say what to fix.
#[derive(Debug, thiserror::Error)]
pub enum LoadtestError {
    /// No connection to the server could be made.
    #[error(
        "cannot reach the server at {url} ({protocol}): {detail}; is it running, and is -u right?"
    )]
    Unreachable {
        /// The server URL (`-u`).
        url: String,
        /// `HTTP` or `gRPC`.
        protocol: &'static str,
        /// The connection error with its causes.
        detail: String,
    },
    /// The server does not serve the model (or the asked version) or it is not ready.
    #[error("model '{model}' is not available on {url}: {detail}")]
    ModelNotFound {
        /// The model name (`-m`).
        model: String,
        /// The server URL.
        url: String,
        /// The server's answer.
        detail: String,
    },
    /// An option, or the model's metadata, rules the test out (the message names which).
    #[error("{0}")]
    InvalidArgument(String),
    /// The server answered a call with an error, or with an answer the tool cannot use.
    #[error("server at {url}: {detail}")]
    Server {
        /// The server URL.
        url: String,
        /// The server's answer.
        detail: String,
    },
    /// An output file (e.g. the report) could not be written.
    #[error("cannot write '{}': {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Ctrl-C stopped a sweep before it finished.
    #[error("interrupted")]
    Interrupted,
    /// A sweep could not load the model's original config back at its end.
    #[error("could not restore the model's original config; reload it by hand: {0}")]
    RestoreFailed(String),
    /// `--fail-on-errors` and some requests failed.
    #[error("{failed} of {total} request(s) failed (--fail-on-errors); first error: {first}")]
    RequestsFailed {
        /// Requests that failed.
        failed: u64,
        /// Requests sent.
        total: u64,
        /// The first failure's message.
        first: String,
    },
}

/// An error with its whole `source()` chain, e.g. `client error (Connect): tcp connect error:
/// Connection refused (os error 111)`.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(s) = source {
        let next = s.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = s.source();
    }
    text
}
