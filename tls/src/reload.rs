//! A certificate that follows its files: [`ReloadingCertResolver`] answers every handshake (a
//! server's, and a cluster client's when the server asks for a client certificate) with the current certificate and key, and at most once per check interval looks
//! at the files' modification times; when either changed it reads both again. A pair that no
//! longer loads (half-written, key not matching) keeps the previous one in service and is
//! logged, so a rotation never takes the port down.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::SignatureScheme;
use rustls::client::ResolvesClientCert;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::{PemFile, TlsError};

/// How often a handshake may look at the files (Nereid's documented reload delay).
pub const CHECK_INTERVAL: Duration = Duration::from_secs(1);

type Stamp = (Option<SystemTime>, Option<SystemTime>);

struct Current {
    key: Arc<CertifiedKey>,
    stamp: Stamp,
    checked: Instant,
}

/// Resolves every handshake to the certificate in `cert` and `key`, reloaded when they change.
pub struct ReloadingCertResolver {
    cert: PemFile,
    key: PemFile,
    provider: Arc<CryptoProvider>,
    check_interval: Duration,
    current: Mutex<Current>,
}

impl std::fmt::Debug for ReloadingCertResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCertResolver")
            .field("cert", &self.cert.path)
            .field("key", &self.key.path)
            .finish()
    }
}

impl ReloadingCertResolver {
    /// Loads the pair once (an error here is a startup error) and checks the files again at
    /// most every `check_interval`.
    pub fn new(
        cert: PemFile,
        key: PemFile,
        provider: Arc<CryptoProvider>,
        check_interval: Duration,
    ) -> Result<Self, TlsError> {
        let stamp = (cert.modified(), key.modified());
        let loaded = load(&cert, &key, &provider)?;
        Ok(Self {
            cert,
            key,
            provider,
            check_interval,
            current: Mutex::new(Current {
                key: loaded,
                stamp,
                checked: Instant::now(),
            }),
        })
    }

    /// The certificate to present now, reloading it first when the files changed.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let mut current = match self.current.lock() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        if current.checked.elapsed() >= self.check_interval {
            current.checked = Instant::now();
            let stamp = (self.cert.modified(), self.key.modified());
            if stamp != current.stamp {
                match load(&self.cert, &self.key, &self.provider) {
                    Ok(key) => {
                        tracing::info!(cert = %self.cert.path.display(), "TLS certificate reloaded");
                        current.key = key;
                        current.stamp = stamp;
                    }
                    // Kept unchanged so the next check tries again (a rotation may be half done).
                    Err(e) => {
                        tracing::warn!(error = %e, "TLS certificate not reloaded; keeping the previous one")
                    }
                }
            }
        }
        current.key.clone()
    }
}

impl ResolvesServerCert for ReloadingCertResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl ResolvesClientCert for ReloadingCertResolver {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// Reads a certificate chain and its key and checks that they belong together.
fn load(
    cert: &PemFile,
    key: &PemFile,
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = cert.certificates()?;
    let private = key.private_key()?;
    CertifiedKey::from_der(chain, private, provider)
        .map(Arc::new)
        .map_err(|e| TlsError::Invalid {
            flag: key.flag,
            path: key.path.display().to_string(),
            what: format!(
                "does not match the certificate in {} '{}': {e}",
                cert.flag,
                cert.path.display()
            ),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{self_signed, write_pair};

    fn resolver(dir: &std::path::Path, interval: Duration) -> ReloadingCertResolver {
        ReloadingCertResolver::new(
            PemFile::new("--cert", dir.join("cert.pem")),
            PemFile::new("--key", dir.join("key.pem")),
            Arc::new(rustls::crypto::ring::default_provider()),
            interval,
        )
        .expect("the first pair loads")
    }

    fn leaf(key: &CertifiedKey) -> Vec<u8> {
        key.cert[0].as_ref().to_vec()
    }

    #[test]
    fn a_replaced_pair_is_served_after_the_check_interval() {
        let dir = tempfile::tempdir().unwrap();
        let first = self_signed(dir.path(), "first");
        write_pair(
            dir.path(),
            &first,
            SystemTime::now() - Duration::from_secs(60),
        );
        let r = resolver(dir.path(), Duration::ZERO);
        let before = leaf(&r.current());
        assert_eq!(before, first.der);

        let second = self_signed(dir.path(), "second");
        write_pair(dir.path(), &second, SystemTime::now());
        assert_eq!(leaf(&r.current()), second.der, "new files are served");
    }

    #[test]
    fn files_are_not_looked_at_again_within_the_interval() {
        let dir = tempfile::tempdir().unwrap();
        let first = self_signed(dir.path(), "first");
        write_pair(
            dir.path(),
            &first,
            SystemTime::now() - Duration::from_secs(60),
        );
        let r = resolver(dir.path(), Duration::from_secs(3600));
        let second = self_signed(dir.path(), "second");
        write_pair(dir.path(), &second, SystemTime::now());
        assert_eq!(
            leaf(&r.current()),
            first.der,
            "no reload before the interval"
        );
    }

    #[test]
    fn a_broken_replacement_keeps_the_old_pair() {
        let dir = tempfile::tempdir().unwrap();
        let first = self_signed(dir.path(), "first");
        write_pair(
            dir.path(),
            &first,
            SystemTime::now() - Duration::from_secs(60),
        );
        let r = resolver(dir.path(), Duration::ZERO);
        // A key that belongs to another certificate: refused, the old pair stays.
        let other = self_signed(dir.path(), "other");
        std::fs::write(dir.path().join("key.pem"), &other.key_pem).unwrap();
        assert_eq!(leaf(&r.current()), first.der);
        // Completing the rotation is picked up on the next check.
        let third = self_signed(dir.path(), "third");
        write_pair(
            dir.path(),
            &third,
            SystemTime::now() + Duration::from_secs(5),
        );
        assert_eq!(leaf(&r.current()), third.der);
    }

    #[test]
    fn a_key_of_another_certificate_is_a_startup_error_naming_both_flags() {
        let dir = tempfile::tempdir().unwrap();
        let a = self_signed(dir.path(), "a");
        let b = self_signed(dir.path(), "b");
        write_pair(dir.path(), &a, SystemTime::now());
        std::fs::write(dir.path().join("key.pem"), &b.key_pem).unwrap();
        let err = ReloadingCertResolver::new(
            PemFile::new("--cert", dir.path().join("cert.pem")),
            PemFile::new("--key", dir.path().join("key.pem")),
            Arc::new(rustls::crypto::ring::default_provider()),
            CHECK_INTERVAL,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("--key") && err.contains("--cert") && err.contains("does not match"),
            "{err}"
        );
    }
}
