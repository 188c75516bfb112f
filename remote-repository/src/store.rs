//! Opening the object store a [`RepositoryUrl`] names, with the credentials of the standard
//! environment, and classifying the store's errors into [`RemoteError`]s that name the bucket
//! or the endpoint.
//!
//! Credentials are read here, once per store opened, the way Triton and the cloud SDKs read
//! them: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//! `AWS_DEFAULT_REGION` / `AWS_REGION`, `AWS_ENDPOINT_URL` / `AWS_ENDPOINT`;
//! `GOOGLE_APPLICATION_CREDENTIALS`; `AZURE_STORAGE_ACCOUNT` / `AZURE_STORAGE_KEY` (and
//! object_store's own `AZURE_STORAGE_ACCOUNT_NAME` / `AZURE_STORAGE_ACCOUNT_KEY`).

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};

use crate::RemoteError;
use crate::url::{Provider, RepositoryUrl};

/// How long one request may take to connect: an unreachable endpoint fails in seconds.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long one request may take in all (a large model file streams within it).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// Opens the store of `url` with the credentials of the environment.
pub fn open(url: &RepositoryUrl) -> Result<Arc<dyn ObjectStore>, RemoteError> {
    let config_error = |e: object_store::Error| RemoteError::Config {
        url: url.original.clone(),
        message: e.to_string(),
    };
    let options = ClientOptions::new()
        .with_connect_timeout(CONNECT_TIMEOUT)
        .with_timeout(REQUEST_TIMEOUT);
    let retry = RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: 2,
        retry_timeout: Duration::from_secs(20),
    };
    let store: Arc<dyn ObjectStore> = match &url.provider {
        Provider::S3 { endpoint } => {
            let mut builder = AmazonS3Builder::from_env()
                .with_bucket_name(&url.bucket)
                .with_retry(retry);
            let mut options = options;
            if let Some(endpoint) = endpoint {
                builder = builder.with_endpoint(endpoint);
            }
            let env_endpoint = std::env::var("AWS_ENDPOINT_URL")
                .or_else(|_| std::env::var("AWS_ENDPOINT"))
                .ok();
            let effective = endpoint.clone().or(env_endpoint);
            if effective
                .as_deref()
                .is_some_and(|e| e.starts_with("http://"))
            {
                options = options.with_allow_http(true);
            }
            Arc::new(
                builder
                    .with_client_options(options)
                    .build()
                    .map_err(config_error)?,
            )
        }
        Provider::Gcs => Arc::new(
            GoogleCloudStorageBuilder::from_env()
                .with_bucket_name(&url.bucket)
                .with_retry(retry)
                .with_client_options(options)
                .build()
                .map_err(config_error)?,
        ),
        Provider::Azure { account } => {
            let mut builder = MicrosoftAzureBuilder::from_env()
                .with_container_name(&url.bucket)
                .with_retry(retry)
                .with_client_options(options);
            let account = account
                .clone()
                .or_else(|| std::env::var("AZURE_STORAGE_ACCOUNT").ok());
            if let Some(account) = account {
                builder = builder.with_account(account);
            }
            if let Ok(key) = std::env::var("AZURE_STORAGE_KEY") {
                builder = builder.with_access_key(key);
            }
            Arc::new(builder.build().map_err(config_error)?)
        }
    };
    Ok(store)
}

/// Classifies an error of listing the repository: credentials, a missing bucket, an
/// unreachable endpoint, or another store error, each naming what to fix.
pub fn classify_list_error(url: &RepositoryUrl, error: object_store::Error) -> RemoteError {
    let message = error.to_string();
    let bucket = url.bucket.clone();
    let unreachable = || RemoteError::Unreachable {
        endpoint: url.endpoint(),
        message: message.clone(),
    };
    match &error {
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => RemoteError::Credentials {
            bucket,
            message: message.clone(),
        },
        object_store::Error::NotFound { .. } => RemoteError::BucketNotFound {
            bucket,
            message: message.clone(),
        },
        object_store::Error::Generic { .. } if is_connect_failure(&error) => unreachable(),
        object_store::Error::Generic { .. }
        | object_store::Error::InvalidPath { .. }
        | object_store::Error::JoinError { .. }
        | object_store::Error::NotSupported { .. }
        | object_store::Error::AlreadyExists { .. }
        | object_store::Error::Precondition { .. }
        | object_store::Error::NotModified { .. }
        | object_store::Error::NotImplemented
        | object_store::Error::UnknownConfigurationKey { .. } => classify_by_message(url, message),
        // object_store's Error is non_exhaustive: variants added later read by their message.
        _ => classify_by_message(url, message),
    }
}

/// S3 answers some failures with codes in the body rather than the status object_store maps.
fn classify_by_message(url: &RepositoryUrl, message: String) -> RemoteError {
    let bucket = url.bucket.clone();
    let has = |needles: &[&str]| needles.iter().any(|n| message.contains(n));
    if has(&["NoSuchBucket", "404 Not Found", "ContainerNotFound"]) {
        RemoteError::BucketNotFound { bucket, message }
    } else if has(&[
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "AccessDenied",
        "403 Forbidden",
        "401 Unauthorized",
        "AuthenticationFailed",
    ]) {
        RemoteError::Credentials { bucket, message }
    } else if has(&["error sending request", "Connection refused", "dns error"]) {
        RemoteError::Unreachable {
            endpoint: url.endpoint(),
            message,
        }
    } else {
        RemoteError::Store { bucket, message }
    }
}

/// Whether the error chain holds an I/O error: the request never reached a server.
fn is_connect_failure(error: &object_store::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.downcast_ref::<std::io::Error>().is_some() {
            return true;
        }
        let text = e.to_string();
        if text.contains("error sending request") || text.contains("client error (Connect)") {
            return true;
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url() -> RepositoryUrl {
        RepositoryUrl::parse("s3://127.0.0.1:1/models/repo").unwrap()
    }

    #[test]
    fn status_errors_name_the_bucket() {
        let denied = object_store::Error::PermissionDenied {
            path: "repo".into(),
            source: "InvalidAccessKeyId".into(),
        };
        let e = classify_list_error(&url(), denied).to_string();
        assert!(
            e.contains("bucket 'models'") && e.contains("credentials"),
            "{e}"
        );
        let missing = object_store::Error::NotFound {
            path: "repo".into(),
            source: "NoSuchBucket".into(),
        };
        let e = classify_list_error(&url(), missing).to_string();
        assert!(
            e.contains("bucket 'models'") && e.contains("does not exist"),
            "{e}"
        );
    }

    #[test]
    fn body_codes_and_connect_failures_are_classified() {
        let generic = |msg: &str| object_store::Error::Generic {
            store: "S3",
            source: msg.to_string().into(),
        };
        let e = classify_list_error(&url(), generic("Error: NoSuchBucket")).to_string();
        assert!(e.contains("does not exist"), "{e}");
        let refused = object_store::Error::Generic {
            store: "S3",
            source: Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
        };
        let e = classify_list_error(&url(), refused).to_string();
        assert!(
            e.contains("http://127.0.0.1:1") && e.contains("unreachable"),
            "{e}"
        );
        let e = classify_list_error(&url(), generic("teapot")).to_string();
        assert!(e.contains("bucket 'models'") && e.contains("teapot"), "{e}");
    }

    #[test]
    fn stores_open_without_network() {
        let s3 = RepositoryUrl::parse("s3://127.0.0.1:9/b/p").unwrap();
        assert!(open(&s3).is_ok());
        let azure = RepositoryUrl::parse("as://account/container/p").unwrap();
        assert!(open(&azure).is_ok());
    }
}
