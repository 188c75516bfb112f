//! Repository URLs in Triton's spellings, parsed into the store, the bucket and the prefix.
//!
//! ```text
//! s3://bucket/path/to/repo                     AWS S3 (region and endpoint from AWS_*)
//! s3://host:port/bucket/path                   S3-compatible endpoint, plain HTTP
//! s3://https://host:port/bucket/path           ... over HTTPS (http:// spelled out works too)
//! gs://bucket/path                             Google Cloud Storage
//! as://account/container/path                  Azure Blob Storage (Triton's form)
//! az://container/path                          Azure, account from AZURE_STORAGE_ACCOUNT
//! ```

use crate::RemoteError;

/// Which object store a URL names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Provider {
    /// S3 or an S3-compatible server; `endpoint` is set by the `s3://host:port/...` form.
    S3 {
        /// The `host:port` of an S3-compatible server; `None`: AWS's endpoint.
        endpoint: Option<String>,
    },
    /// Google Cloud Storage.
    Gcs,
    /// Azure Blob Storage; `account` is set by the `as://account/...` form.
    Azure {
        /// The storage account; `None`: the one in `AZURE_STORAGE_ACCOUNT`.
        account: Option<String>,
    },
}

/// A parsed repository or model URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepositoryUrl {
    /// The URL as the operator wrote it (for messages).
    pub original: String,
    /// Which object store.
    pub provider: Provider,
    /// The bucket (S3, GCS) or container (Azure).
    pub bucket: String,
    /// The key prefix inside the bucket, without leading or trailing `/`; empty for the root.
    pub prefix: String,
}

/// Whether `location` names an object store rather than a local directory.
pub fn is_remote(location: &str) -> bool {
    ["s3://", "gs://", "as://", "az://"]
        .iter()
        .any(|scheme| location.starts_with(scheme))
}

impl RepositoryUrl {
    /// Parses `s3://`, `gs://`, `as://` and `az://` URLs; anything else is an error naming the
    /// accepted forms.
    pub fn parse(url: &str) -> Result<RepositoryUrl, RemoteError> {
        let invalid = |reason: &str| RemoteError::InvalidUrl {
            url: url.to_string(),
            reason: reason.to_string(),
        };
        let Some((scheme, rest)) = url.split_once("://") else {
            return Err(invalid("expected s3://, gs://, as:// or az://"));
        };
        let (provider, rest) = match scheme {
            "s3" => {
                let (endpoint, rest) = s3_endpoint(rest).map_err(|r| invalid(&r))?;
                (Provider::S3 { endpoint }, rest)
            }
            "gs" => (Provider::Gcs, rest.to_string()),
            "as" => {
                let (account, rest) = rest.split_once('/').unwrap_or((rest, ""));
                if account.is_empty() {
                    return Err(invalid(
                        "as:// needs an account: as://account/container/path",
                    ));
                }
                let account = Some(account.to_string());
                (Provider::Azure { account }, rest.to_string())
            }
            "az" => (Provider::Azure { account: None }, rest.to_string()),
            other => {
                return Err(invalid(&format!(
                    "scheme '{other}' is not supported; use s3://, gs://, as:// or az://"
                )));
            }
        };
        let (bucket, prefix) = rest.split_once('/').unwrap_or((&rest, ""));
        if bucket.is_empty() {
            return Err(invalid("the URL names no bucket (or container)"));
        }
        let prefix = prefix.trim_matches('/');
        if prefix.split('/').any(|part| part == "." || part == "..") || prefix.contains("//") {
            return Err(invalid("the path has an empty, '.' or '..' segment"));
        }
        Ok(RepositoryUrl {
            original: url.to_string(),
            provider,
            bucket: bucket.to_string(),
            prefix: prefix.to_string(),
        })
    }

    /// Splits a model folder's URL (`s3://bucket/repo/model`) into its repository's URL and
    /// the folder's name.
    pub fn split_model(url: &str) -> Result<(String, String), RemoteError> {
        let parsed = RepositoryUrl::parse(url)?;
        let trimmed = url.trim_end_matches('/');
        match trimmed.rsplit_once('/') {
            Some((parent, name)) if !parsed.prefix.is_empty() => {
                Ok((parent.to_string(), name.to_string()))
            }
            _ => Err(RemoteError::InvalidUrl {
                url: url.to_string(),
                reason: "it names a bucket, not a model folder (s3://bucket/path/model)".into(),
            }),
        }
    }

    /// The endpoint messages name: the explicit one, or the provider's.
    pub fn endpoint(&self) -> String {
        match &self.provider {
            Provider::S3 {
                endpoint: Some(endpoint),
            } => endpoint.clone(),
            Provider::S3 { endpoint: None } => {
                "the AWS S3 endpoint (AWS_ENDPOINT_URL, AWS_REGION)".into()
            }
            Provider::Gcs => "the Google Cloud Storage endpoint".into(),
            Provider::Azure { .. } => "the Azure Blob Storage endpoint".into(),
        }
    }

    /// This URL with `child` appended to its prefix (a model of a repository).
    pub fn join(&self, child: &str) -> RepositoryUrl {
        let prefix = if self.prefix.is_empty() {
            child.to_string()
        } else {
            format!("{}/{child}", self.prefix)
        };
        RepositoryUrl {
            original: format!("{}/{child}", self.original.trim_end_matches('/')),
            provider: self.provider.clone(),
            bucket: self.bucket.clone(),
            prefix,
        }
    }
}

/// Splits Triton's `[http(s)://]host:port/` endpoint off an `s3://` URL's rest. A first
/// segment without `:port` is a bucket name (bucket names cannot hold ':').
fn s3_endpoint(rest: &str) -> Result<(Option<String>, String), String> {
    let (scheme, after) = if let Some(after) = rest.strip_prefix("https://") {
        ("https", after)
    } else if let Some(after) = rest.strip_prefix("http://") {
        ("http", after)
    } else {
        ("http", rest)
    };
    let (first, tail) = after.split_once('/').unwrap_or((after, ""));
    let Some((host, port)) = first.rsplit_once(':') else {
        if after.len() != rest.len() {
            return Err(format!(
                "an endpoint needs host:port ({scheme}://host:port/bucket/path)"
            ));
        }
        return Ok((None, rest.to_string()));
    };
    if host.is_empty() || port.parse::<u16>().is_err() {
        return Err(format!(
            "endpoint '{first}' is not host:port with a port number (s3://host:port/bucket/path)"
        ));
    }
    Ok((Some(format!("{scheme}://{first}")), tail.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s3(endpoint: Option<&str>) -> Provider {
        Provider::S3 {
            endpoint: endpoint.map(str::to_string),
        }
    }

    #[test]
    fn s3_with_and_without_endpoint() {
        let u = RepositoryUrl::parse("s3://bucket/models/repo/").unwrap();
        assert_eq!(
            (u.provider, u.bucket.as_str(), u.prefix.as_str()),
            (s3(None), "bucket", "models/repo")
        );
        let u = RepositoryUrl::parse("s3://127.0.0.1:9000/bucket/path/x").unwrap();
        assert_eq!(u.provider, s3(Some("http://127.0.0.1:9000")));
        assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("bucket", "path/x"));
        let u = RepositoryUrl::parse("s3://https://minio.local:443/b").unwrap();
        assert_eq!(u.provider, s3(Some("https://minio.local:443")));
        assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("b", ""));
        assert_eq!(RepositoryUrl::parse("s3://bucket").unwrap().prefix, "");
    }

    #[test]
    fn gcs_and_azure_forms() {
        let u = RepositoryUrl::parse("gs://models/triton").unwrap();
        assert_eq!(
            (u.provider, u.bucket.as_str(), u.prefix.as_str()),
            (Provider::Gcs, "models", "triton")
        );
        let u = RepositoryUrl::parse("as://acct/container/a/b").unwrap();
        let account = Some("acct".to_string());
        assert_eq!(u.provider, Provider::Azure { account });
        assert_eq!((u.bucket.as_str(), u.prefix.as_str()), ("container", "a/b"));
        let u = RepositoryUrl::parse("az://container/p").unwrap();
        assert_eq!(u.provider, Provider::Azure { account: None });
        assert_eq!(u.bucket, "container");
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        let err = |url: &str| RepositoryUrl::parse(url).unwrap_err().to_string();
        assert!(
            err("ftp://x/y").contains("scheme 'ftp' is not supported"),
            "{}",
            err("ftp://x/y")
        );
        assert!(err("s3://").contains("no bucket"));
        assert!(err("s3://host:notaport/b").contains("not host:port"));
        assert!(err("s3://https://nohost/b").contains("host:port"));
        assert!(err("as:///container").contains("needs an account"));
        assert!(err("s3://b/a/../c").contains("'..'"));
        assert!(err("/local/dir").contains("expected s3://"));
    }

    #[test]
    fn model_urls_split_into_repository_and_folder() {
        let split = |u: &str| RepositoryUrl::split_model(u).map_err(|e| e.to_string());
        let pair = |a: &str, b: &str| Ok((a.to_string(), b.to_string()));
        assert_eq!(split("s3://h:9/b/repo/m/"), pair("s3://h:9/b/repo", "m"));
        assert_eq!(split("gs://b/m"), pair("gs://b", "m"));
        assert!(split("s3://b").unwrap_err().contains("not a model folder"));
        assert!(
            split("s3://h:9/b")
                .unwrap_err()
                .contains("not a model folder")
        );
    }

    #[test]
    fn join_and_remote_detection() {
        let u = RepositoryUrl::parse("s3://h:1/b/repo").unwrap().join("m");
        assert_eq!(
            (u.prefix.as_str(), u.original.as_str()),
            ("repo/m", "s3://h:1/b/repo/m")
        );
        assert_eq!(
            RepositoryUrl::parse("gs://b").unwrap().join("m").prefix,
            "m"
        );
        assert!(is_remote("s3://b") && is_remote("as://a/c") && !is_remote("/models"));
        assert!(!is_remote("file:///models"));
    }
}
