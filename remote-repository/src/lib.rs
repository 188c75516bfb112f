//! `nereid-remote-repository`: model repositories in object stores (`s3://`, `gs://`,
//! `as://`, `az://`), mirrored into a local cache directory that the ordinary repository
//! scanner reads.
//!
//! ```text
//! URL ─► url::RepositoryUrl::parse ─► store::open (credentials from the environment)
//!     ─► Mirror::sync(scope): list the prefix ─► group by model ─► per model:
//!          plan (listing vs the last sync's etag/size/last-modified) ─► download changed
//!          units into a staging dir, sizes checked ─► all downloaded? rename into place
//!                                                  └─ any failure: staging dropped, the
//!                                                     local copy stays as it was
//! ```
//!
//! A *unit* is one version folder (`<model>/<n>/...`) or the model's other files
//! (`config.pbtxt`, labels, non-numeric folders). The local layout is Triton's, so
//! `<cache>/<slug of the URL>/` is an ordinary model repository; the mirror's bookkeeping
//! lives in dot-folders the scanner skips.
//!
//! Callers: the data plane's repository module (`--model-repository s3://...`, poll and
//! explicit loads) and the worker's agent (`ctl models deploy --source s3://...`).

#![warn(missing_docs)]

mod mirror;
mod plan;
mod store;
mod url;

use std::path::PathBuf;

pub use mirror::{Mirror, Scope, SyncReport, model_versions};
pub use url::{Provider, RepositoryUrl, is_remote};

/// Why a remote repository could not be read or mirrored.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The URL names no supported object store or has no bucket.
    #[error("repository URL '{url}' is not valid: {reason}")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The object store client could not be built (bad endpoint, account or settings).
    #[error("cannot open the object store of '{url}': {message}")]
    Config {
        /// The repository URL.
        url: String,
        /// The store client's error.
        message: String,
    },
    #[error(
        "access to bucket '{bucket}' was refused; check the credentials (AWS_ACCESS_KEY_ID / \
         AWS_SECRET_ACCESS_KEY, GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_ACCOUNT / \
         AZURE_STORAGE_KEY): {message}"
    )]
    /// The store refused the credentials (or their absence).
    Credentials {
        /// The bucket or container.
        bucket: String,
        /// The store's answer.
        message: String,
    },
    /// The store has no such bucket or container.
    #[error("bucket '{bucket}' does not exist: {message}")]
    BucketNotFound {
        /// The bucket or container.
        bucket: String,
        /// The store's answer.
        message: String,
    },
    /// No connection to the store could be made.
    #[error("object store endpoint {endpoint} is unreachable: {message}")]
    Unreachable {
        /// The endpoint dialed (the provider's default when the URL names none).
        endpoint: String,
        /// The connection error.
        message: String,
    },
    /// Any other error the store answered.
    #[error("bucket '{bucket}': {message}")]
    Store {
        /// The bucket or container.
        bucket: String,
        /// The store's answer.
        message: String,
    },
    /// One object could not be fetched.
    #[error("cannot download '{object}': {message}")]
    Download {
        /// The object's key.
        object: String,
        /// The store's answer.
        message: String,
    },
    /// The local mirror could not be written.
    #[error("model cache '{path}': {source}")]
    Io {
        /// The file or folder in the cache.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The default `--model-cache-dir`: `$XDG_CACHE_HOME/nereid/models` when that is set, else
/// `<system temp dir>/nereid-model-cache`.
pub fn default_cache_dir() -> PathBuf {
    match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(xdg) => PathBuf::from(xdg).join("nereid").join("models"),
        None => std::env::temp_dir().join("nereid-model-cache"),
    }
}
