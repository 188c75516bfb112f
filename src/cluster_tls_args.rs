//! `--cluster-tls-cert/key/ca`: the one set of flags that turns on mutual TLS between cluster
//! processes (control plane, workers, router). All three or none; with them a process serves
//! its cluster-internal ports over TLS requiring client certificates signed by the CA, and dials
//! its peers over TLS trusting only that CA and presenting its own certificate. Without them
//! every cluster connection is plaintext (a loopback cluster's default).

use std::path::PathBuf;

use clap::Args;
use nereid_tls::{ClusterTls, ClusterTlsFiles, PemFile};

const CERT_FLAG: &str = "--cluster-tls-cert";
const KEY_FLAG: &str = "--cluster-tls-key";
const CA_FLAG: &str = "--cluster-tls-ca";

#[derive(Args, Debug, Default, Clone)]
pub struct ClusterTlsArgs {
    /// PEM certificate of this process for cluster-internal connections, signed by
    /// --cluster-tls-ca; its subject alternative names must include every address and host
    /// name peers dial this process by. Re-read when the file changes.
    #[arg(long, env = "NEREID_CLUSTER_TLS_CERT")]
    pub cluster_tls_cert: Option<PathBuf>,
    /// PEM private key of --cluster-tls-cert (re-read when the file changes).
    #[arg(long, env = "NEREID_CLUSTER_TLS_KEY")]
    pub cluster_tls_key: Option<PathBuf>,
    /// PEM CA certificate(s) of the cluster: peers' certificates, server and client, must be
    /// signed by it. Read at start.
    #[arg(long, env = "NEREID_CLUSTER_TLS_CA")]
    pub cluster_tls_ca: Option<PathBuf>,
}

impl ClusterTlsArgs {
    /// The three files, `None` when cluster TLS is off; a partial set is refused naming the
    /// missing flags. Reads nothing.
    pub fn files(&self) -> Result<Option<ClusterTlsFiles>, String> {
        match (
            &self.cluster_tls_cert,
            &self.cluster_tls_key,
            &self.cluster_tls_ca,
        ) {
            (None, None, None) => Ok(None),
            (Some(cert), Some(key), Some(ca)) => Ok(Some(ClusterTlsFiles {
                cert: PemFile::new(CERT_FLAG, cert),
                key: PemFile::new(KEY_FLAG, key),
                ca: PemFile::new(CA_FLAG, ca),
            })),
            (cert, key, ca) => {
                let missing: Vec<&str> = [(CERT_FLAG, cert), (KEY_FLAG, key), (CA_FLAG, ca)]
                    .into_iter()
                    .filter(|(_, given)| given.is_none())
                    .map(|(flag, _)| flag)
                    .collect();
                Err(format!(
                    "{} missing: cluster TLS needs {CERT_FLAG}, {KEY_FLAG} and {CA_FLAG} together (or none of them for plaintext)",
                    missing.join(" and ")
                ))
            }
        }
    }

    /// Checks the flags and reads every file (a bad one is an error naming its flag and path).
    pub fn load(&self) -> Result<Option<ClusterTls>, String> {
        self.files()?
            .map(|files| ClusterTls::load(files).map_err(|e| e.to_string()))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(cert: bool, key: bool, ca: bool) -> ClusterTlsArgs {
        ClusterTlsArgs {
            cluster_tls_cert: cert.then(|| "node.pem".into()),
            cluster_tls_key: key.then(|| "node.key".into()),
            cluster_tls_ca: ca.then(|| "ca.pem".into()),
        }
    }

    #[test]
    fn none_is_plaintext_and_all_three_name_their_files() {
        assert_eq!(args(false, false, false).files(), Ok(None));
        let files = args(true, true, true).files().unwrap().unwrap();
        assert_eq!(files.cert, PemFile::new(CERT_FLAG, "node.pem"));
        assert_eq!(files.key, PemFile::new(KEY_FLAG, "node.key"));
        assert_eq!(files.ca, PemFile::new(CA_FLAG, "ca.pem"));
    }

    #[test]
    fn a_partial_set_is_refused_naming_the_missing_flags() {
        let err = args(true, true, false).files().unwrap_err();
        assert!(err.starts_with("--cluster-tls-ca missing"), "{err}");
        let err = args(false, true, false).files().unwrap_err();
        assert!(
            err.starts_with("--cluster-tls-cert and --cluster-tls-ca missing"),
            "{err}"
        );
        let err = args(true, false, true).files().unwrap_err();
        assert!(err.starts_with("--cluster-tls-key missing"), "{err}");
    }

    #[test]
    fn an_unreadable_file_is_refused_naming_its_flag() {
        let dir = std::path::Path::new("/nonexistent/nereid-cluster-tls");
        let args = ClusterTlsArgs {
            cluster_tls_cert: Some(dir.join("absent.pem")),
            cluster_tls_key: Some(dir.join("absent.key")),
            cluster_tls_ca: Some(dir.join("absent-ca.pem")),
        };
        let err = args.load().unwrap_err();
        assert!(
            err.contains("--cluster-tls-") && err.contains("absent"),
            "{err}"
        );
    }
}
