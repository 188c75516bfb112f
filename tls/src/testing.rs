//! Test certificates made with the `openssl` command: self-signed pairs and a CA with leaves.

use std::path::Path;
use std::process::Command;
use std::time::SystemTime;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

/// A certificate and key in PEM, and the certificate's DER.
pub struct Pair {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub der: Vec<u8>,
}

fn openssl(args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ec_key(path: &Path) {
    openssl(&[
        "genpkey",
        "-algorithm",
        "EC",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-out",
        path.to_str().unwrap(),
    ]);
}

/// A self-signed certificate for localhost, made in `dir` under `name`.
pub fn self_signed(dir: &Path, name: &str) -> Pair {
    let (cert, key) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.k")),
    );
    ec_key(&key);
    openssl(&[
        "req",
        "-x509",
        "-key",
        key.to_str().unwrap(),
        "-out",
        cert.to_str().unwrap(),
        "-days",
        "1",
        "-subj",
        &format!("/CN={name}"),
        "-addext",
        "subjectAltName=DNS:localhost",
    ]);
    let cert_pem = std::fs::read(&cert).unwrap();
    let der = CertificateDer::from_pem_slice(&cert_pem)
        .unwrap()
        .as_ref()
        .to_vec();
    Pair {
        cert_pem,
        key_pem: std::fs::read(&key).unwrap(),
        der,
    }
}

/// Writes `pair` as `cert.pem` and `key.pem` in `dir`, both with modification time `mtime`.
pub fn write_pair(dir: &Path, pair: &Pair, mtime: SystemTime) {
    for (name, bytes) in [("cert.pem", &pair.cert_pem), ("key.pem", &pair.key_pem)] {
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
    }
}

/// `<ca>.pem`/`<ca>.key` (made when missing) and `<name>.pem`/`<name>.key` signed by it.
pub fn ca_signed(dir: &Path, name: &str, ca: &str) {
    let (ca_pem, ca_key) = (dir.join(format!("{ca}.pem")), dir.join(format!("{ca}.key")));
    if !ca_pem.exists() {
        ec_key(&ca_key);
        openssl(&[
            "req",
            "-x509",
            "-key",
            ca_key.to_str().unwrap(),
            "-out",
            ca_pem.to_str().unwrap(),
            "-days",
            "1",
            "-subj",
            "/CN=test CA",
        ]);
    }
    let (pem, key, csr) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.csr")),
    );
    ec_key(&key);
    openssl(&[
        "req",
        "-new",
        "-key",
        key.to_str().unwrap(),
        "-out",
        csr.to_str().unwrap(),
        "-subj",
        &format!("/CN={name}"),
    ]);
    let ext = dir.join(format!("{name}.ext"));
    std::fs::write(&ext, "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        csr.to_str().unwrap(),
        "-CA",
        ca_pem.to_str().unwrap(),
        "-CAkey",
        ca_key.to_str().unwrap(),
        "-CAcreateserial",
        "-out",
        pem.to_str().unwrap(),
        "-days",
        "1",
        "-extfile",
        ext.to_str().unwrap(),
    ]);
}
