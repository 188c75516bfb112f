//! [`LoadtestError`]: what can stop a load test, classified once near the cause.
//!
//! Request failures during a run are not errors of this kind: they are counted per window and
//! per level (see `stats`) and reported; only `--fail-on-errors` turns them into a non-zero
//! exit.

use std::path::PathBuf;

/// Errors that end the tool with exit status 1. Messages say what to fix.
#[derive(Debug, thiserror::Error)]
pub enum LoadtestError {
    #[error(
        "cannot reach the server at {url} ({protocol}): {detail}; is it running, and is -u right?"
    )]
    Unreachable {
        url: String,
        protocol: &'static str,
        detail: String,
    },
    #[error("model '{model}' is not available on {url}: {detail}")]
    ModelNotFound {
        model: String,
        url: String,
        detail: String,
    },
    #[error("{0}")]
    InvalidArgument(String),
    #[error("server at {url}: {detail}")]
    Server { url: String, detail: String },
    #[error("cannot write '{}': {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("interrupted")]
    Interrupted,
    #[error("could not restore the model's original config; reload it by hand: {0}")]
    RestoreFailed(String),
    #[error("{failed} of {total} request(s) failed (--fail-on-errors); first error: {first}")]
    RequestsFailed {
        failed: u64,
        total: u64,
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
