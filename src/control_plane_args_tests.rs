//! Tests of `nereid control-plane`'s flags: what each turns into in `NodeConfig`, and the
//! errors for flags that contradict each other.

use std::time::Duration;

use clap::Parser;
use nereid_control_plane::{NodeConfig, Store};

use crate::cli::{Cli, Command};

fn parse(args: &[&str]) -> Result<NodeConfig, String> {
    let mut argv = vec!["nereid", "control-plane", "--insecure-no-auth"];
    argv.extend_from_slice(args);
    let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
    match cli.command {
        Command::ControlPlane(args) => args.into_config(),
        _ => Err("not control-plane".into()),
    }
}

#[test]
fn raft_timings_default_to_loopback_and_lan_and_are_checked_against_each_other() {
    let c = parse(&[]).unwrap();
    assert_eq!(c.raft_heartbeat, Duration::from_millis(50));
    assert_eq!(c.election_timeout_min, Duration::from_millis(150));
    assert_eq!(c.election_timeout_max, Duration::from_millis(300));
    let c = parse(&[
        "--raft-heartbeat-ms",
        "250",
        "--election-timeout-ms",
        "1000",
    ])
    .unwrap();
    assert_eq!(
        (c.election_timeout_min, c.election_timeout_max),
        (Duration::from_millis(1000), Duration::from_millis(2000)),
        "one number N is N-2N, as before ranges"
    );
    let c = parse(&["--election-timeout-ms", " 400 - 900 "]).unwrap();
    assert_eq!(
        (c.election_timeout_min, c.election_timeout_max),
        (Duration::from_millis(400), Duration::from_millis(900))
    );
    for (args, needle) in [
        (
            &["--election-timeout-ms", "300-300"][..],
            "minimum must be below the maximum",
        ),
        (&["--election-timeout-ms", "600-300"], "below the maximum"),
        (&["--election-timeout-ms", "0-300"], "must be positive"),
        (&["--election-timeout-ms", "fast"], "is not MIN-MAX or MIN"),
        (&["--election-timeout-ms", "100-"], "is not MIN-MAX or MIN"),
        (
            &["--raft-heartbeat-ms", "0"],
            "--raft-heartbeat-ms must be positive",
        ),
        (
            &[
                "--raft-heartbeat-ms",
                "100",
                "--election-timeout-ms",
                "250-500",
            ],
            "at least 3 x --raft-heartbeat-ms (100)",
        ),
    ] {
        let e = parse(args).unwrap_err();
        assert!(e.contains(needle), "{args:?}: {e}");
        if !needle.starts_with("--") {
            assert!(e.contains("--election-timeout-ms"), "names the flag: {e}");
        }
    }
}

#[test]
fn metrics_are_off_by_default_and_listen_on_7002_when_allowed() {
    let c = parse(&[]).unwrap();
    assert!(c.metrics_listen.is_none());
    let c = parse(&["--allow-metrics"]).unwrap();
    assert_eq!(c.metrics_listen, Some("0.0.0.0:7002".parse().unwrap()));
    let c = parse(&[
        "--allow-metrics",
        "true",
        "--metrics-port",
        "9100",
        "--metrics-address",
        "127.0.0.1",
    ])
    .unwrap();
    assert_eq!(c.metrics_listen, Some("127.0.0.1:9100".parse().unwrap()));
}

fn parse_with_tokens(tokens: &str, args: &[&str]) -> Result<NodeConfig, String> {
    let dir = std::env::temp_dir().join(format!(
        "nereid-cp-args-{}-{}",
        std::process::id(),
        tokens.len()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let path = dir.join("tokens");
    std::fs::write(&path, tokens).map_err(|e| e.to_string())?;
    let path = path.display().to_string();
    let mut argv = vec!["nereid", "control-plane", "--auth-tokens-file", &path];
    argv.extend_from_slice(args);
    let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
    let result = match cli.command {
        Command::ControlPlane(args) => args.into_config(),
        _ => Err("not control-plane".into()),
    };
    let _ = std::fs::remove_dir_all(&dir);
    result
}

#[test]
fn a_tokens_file_gives_roles_and_needs_an_admin_token() {
    let c = parse_with_tokens("admin ops s3cret\nread-only ci r3ad\n", &[]).unwrap();
    assert_eq!(
        c.auth_value.as_deref(),
        Some("s3cret"),
        "peers use the admin token"
    );
    assert!(c.auth.is_enabled());

    let err = parse_with_tokens("read-only ci r3ad\n", &[]).unwrap_err();
    assert!(err.contains("no token has role admin"), "{err}");
    let err = parse_with_tokens("admin ops s3cret\nroot x y\n", &[]).unwrap_err();
    assert!(err.starts_with("--auth-tokens-file"), "{err}");
    assert!(
        err.contains("line 2") && err.contains("unknown role 'root'"),
        "{err}"
    );
    let err = parse_with_tokens("admin ops s3cret\n", &["--insecure-no-auth"]).unwrap_err();
    assert!(err.contains("contradict"), "{err}");
}

#[test]
fn the_etcd_store_flags_are_checked_together() {
    assert_eq!(parse(&[]).unwrap().store, Store::Raft);
    let c = parse(&[
        "--store",
        "etcd",
        "--etcd-endpoints",
        "http://10.0.0.1:2379,http://10.0.0.2:2379",
        "--etcd-prefix",
        "/prod/nereid/",
    ])
    .unwrap();
    let Store::Etcd(etcd) = c.store else {
        panic!("not etcd: {:?}", c.store)
    };
    assert_eq!(etcd.endpoints.len(), 2);
    assert_eq!(etcd.prefix, "/prod/nereid");
    assert_eq!(etcd.lease_ttl.as_secs(), 5);
    assert!(etcd.user.is_none());

    let etcd = ["--store", "etcd", "--etcd-endpoints", "http://e:2379"];
    let with = |more: &[&'static str]| [&etcd[..], more].concat();
    for (args, expected) in [
        (vec!["--store", "etcd"], "needs --etcd-endpoints"),
        (
            vec!["--etcd-endpoints", "http://e:2379"],
            "needs --store etcd",
        ),
        (
            vec!["--store", "etcd", "--etcd-endpoints", "e:2379"],
            "'e:2379'",
        ),
        (
            vec!["--store", "etcd", "--etcd-endpoints", "https://e:2379"],
            "https:// --etcd-endpoints need --etcd-ca",
        ),
        (
            vec!["--store", "etcd", "--etcd-endpoints", "ftp://e:2379"],
            "'ftp://e:2379' is not an http://HOST:PORT or https://HOST:PORT URL",
        ),
        (
            vec![
                "--store",
                "etcd",
                "--etcd-endpoints",
                "http://e:2379,https://f:2379",
            ],
            "mixes http:// and https://",
        ),
        (with(&["--etcd-ca", "ca.pem"]), "--etcd-ca needs https://"),
        (
            with(&["--etcd-cert", "c.pem", "--etcd-key", "c.key"]),
            "--etcd-cert and --etcd-key need https://",
        ),
        (vec!["--etcd-ca", "ca.pem"], "--etcd-ca needs --store etcd"),
        (with(&["--etcd-prefix", "x"]), "--etcd-prefix 'x'"),
        (with(&["--etcd-prefix", "/"]), "--etcd-prefix '/'"),
        (with(&["--etcd-user", "u"]), "needs --etcd-password-file"),
        (with(&["--etcd-lease-ttl-secs", "0"]), "at least 1"),
        (
            with(&["--join", "cp:7000"]),
            "--peers and --join are for --store raft",
        ),
    ] {
        let err = parse(&args).unwrap_err();
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

/// scripts/make_certs.sh `dir` `names...` (a CA and a certificate per name).
fn make_certs(dir: &std::path::Path, names: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/make_certs.sh");
    let out = std::process::Command::new("bash")
        .arg(script)
        .arg(dir)
        .args(names)
        .output()
        .expect("run make_certs.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn etcd_tls_files_are_read_and_checked_at_start_up() {
    let dir = std::env::temp_dir().join(format!("nereid-etcd-tls-{}", std::process::id()));
    make_certs(&dir, &["localhost", "other"]);
    let file = |name: &str| dir.join(name).display().to_string();
    let (ca, cert, key, other_key) = (
        file("ca.pem"),
        file("localhost.pem"),
        file("localhost.key"),
        file("other.key"),
    );
    std::fs::write(dir.join("junk.pem"), "not a certificate\n").unwrap();
    let (junk, missing) = (file("junk.pem"), file("missing.pem"));
    let https = |more: &[&str]| -> Result<NodeConfig, String> {
        let mut args = vec![
            "--store",
            "etcd",
            "--etcd-endpoints",
            "https://e1:2379,https://e2:2379",
        ];
        args.extend_from_slice(more);
        parse(&args)
    };

    let Store::Etcd(etcd) = https(&["--etcd-ca", &ca]).unwrap().store else {
        panic!("not etcd")
    };
    let tls = etcd.tls.expect("TLS with --etcd-ca");
    assert_eq!(tls.ca_pem, std::fs::read(&ca).unwrap());
    assert!(tls.identity.is_none());
    let with_cert = https(&["--etcd-ca", &ca, "--etcd-cert", &cert, "--etcd-key", &key]);
    let Store::Etcd(etcd) = with_cert.unwrap().store else {
        panic!("not etcd")
    };
    let (cert_pem, key_pem) = etcd.tls.and_then(|t| t.identity).expect("identity");
    assert_eq!(cert_pem, std::fs::read(&cert).unwrap());
    assert_eq!(key_pem, std::fs::read(&key).unwrap());

    let cert_only = ["--etcd-ca", &ca, "--etcd-cert", &cert];
    let err = https(&cert_only).unwrap_err();
    assert!(err.contains("--etcd-cert needs --etcd-key"), "{err}");
    let err = https(&["--etcd-ca", &ca, "--etcd-key", &key]).unwrap_err();
    assert!(err.contains("--etcd-key needs --etcd-cert"), "{err}");
    for (args, expected) in [
        (
            vec!["--etcd-ca", &missing],
            "--etcd-ca '{missing}': cannot read the file",
        ),
        (
            vec!["--etcd-ca", &junk],
            "--etcd-ca '{junk}': holds no PEM certificate",
        ),
        (
            vec!["--etcd-ca", &ca, "--etcd-cert", &junk, "--etcd-key", &key],
            "--etcd-cert '{junk}': holds no PEM certificate",
        ),
        (
            vec![
                "--etcd-ca",
                &ca,
                "--etcd-cert",
                &cert,
                "--etcd-key",
                &other_key,
            ],
            "--etcd-key '{other_key}': does not match the certificate",
        ),
    ] {
        let expected = expected
            .replace("{missing}", &missing)
            .replace("{junk}", &junk)
            .replace("{other_key}", &other_key);
        let err = https(&args).unwrap_err();
        assert!(err.contains(&expected), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_metrics_port_shared_with_another_service_is_refused() {
    let err = parse(&["--allow-metrics", "--metrics-port", "7080"]).unwrap_err();
    assert!(err.contains("--http-listen"), "{err}");
    let err = parse(&["--allow-metrics", "--metrics-port", "7000"]).unwrap_err();
    assert!(err.contains("--listen"), "{err}");
}
