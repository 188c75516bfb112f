//! Reading PEM files: certificate chains, private keys and CA bundles, each error naming the
//! flag the path came from.

use std::path::{Path, PathBuf};

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::TlsError;

/// A PEM file and the flag that named it (for error messages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PemFile {
    /// The command-line flag that named the file (e.g. `--cluster-tls-cert`).
    pub flag: &'static str,
    /// The file's path.
    pub path: PathBuf,
}

impl PemFile {
    /// Names the file at `path`, given by `flag`.
    pub fn new(flag: &'static str, path: impl Into<PathBuf>) -> Self {
        Self {
            flag,
            path: path.into(),
        }
    }

    fn read(&self) -> Result<Vec<u8>, TlsError> {
        std::fs::read(&self.path).map_err(|source| TlsError::Read {
            flag: self.flag,
            path: display(&self.path),
            source,
        })
    }

    fn invalid(&self, what: impl Into<String>) -> TlsError {
        TlsError::Invalid {
            flag: self.flag,
            path: display(&self.path),
            what: what.into(),
        }
    }

    /// Every certificate of the file, in order (leaf first for a chain); at least one.
    pub fn certificates(&self) -> Result<Vec<CertificateDer<'static>>, TlsError> {
        let bytes = self.read()?;
        let certs = CertificateDer::pem_slice_iter(&bytes)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| self.invalid(format!("not a PEM certificate file: {e}")))?;
        if certs.is_empty() {
            return Err(self.invalid("holds no PEM certificate (-----BEGIN CERTIFICATE-----)"));
        }
        Ok(certs)
    }

    /// The file's private key (PKCS#8, PKCS#1 or SEC1 PEM).
    pub fn private_key(&self) -> Result<PrivateKeyDer<'static>, TlsError> {
        let bytes = self.read()?;
        PrivateKeyDer::from_pem_slice(&bytes)
            .map_err(|e| self.invalid(format!("holds no usable PEM private key: {e}")))
    }

    /// The file's certificates as a trust store.
    pub fn root_store(&self) -> Result<RootCertStore, TlsError> {
        let mut store = RootCertStore::empty();
        for cert in self.certificates()? {
            store
                .add(cert)
                .map_err(|e| self.invalid(format!("not a usable CA certificate: {e}")))?;
        }
        Ok(store)
    }

    /// The file's modification time, `None` when it cannot be read.
    pub(crate) fn modified(&self) -> Option<std::time::SystemTime> {
        std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok()
    }
}

fn display(path: &Path) -> String {
    path.display().to_string()
}
