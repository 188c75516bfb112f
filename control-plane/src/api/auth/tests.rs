//! The token check on its own: bearer parsing, the tokens file, roles, and rotation.

use std::path::Path;
use std::time::Duration;

use super::*;

fn unauthenticated(r: Result<(), ApiError>) -> String {
    match r {
        Err(ApiError::Unauthenticated(msg)) => msg,
        other => panic!("expected Unauthenticated, got {other:?}"),
    }
}

fn denied(r: Result<(), ApiError>) -> String {
    match r {
        Err(ApiError::PermissionDenied(msg)) => msg,
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
}

fn bearer_of(secret: &str) -> Vec<u8> {
    format!("Bearer {secret}").into_bytes()
}

/// `authorize` for a write, the strictest management permission.
fn check(t: &AuthToken, header: Option<&[u8]>) -> Result<(), ApiError> {
    t.authorize(header, Permission::Write, "DeployModel")
}

const FILE: &str = "\
# role      name        secret
admin       ops         adm1n-secret

read-only   ci-reader   r3ad-secret
  # indented comment
cluster     workers     clust3r-secret
";

fn tokens_file(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("tokens");
    std::fs::write(&path, text).unwrap();
    path
}

fn parse_err(text: &str) -> String {
    TokenSet::parse(text, Path::new("/etc/nereid/tokens"))
        .unwrap_err()
        .to_string()
}

#[test]
fn checks_bearer_tokens() {
    let t = AuthToken::from_value(" s3cret\n").unwrap();
    assert!(check(&t, Some(b"Bearer s3cret")).is_ok());
    assert!(check(&t, Some(b"bearer s3cret")).is_ok());
    let msg = unauthenticated(check(&t, None));
    assert!(msg.contains("authorization: Bearer <token>"), "{msg}");
    let msg = unauthenticated(check(&t, Some(b"Basic abc")));
    assert!(msg.contains("Bearer <token>"), "{msg}");
    for wrong in [
        &b"Bearer s3cre"[..],
        b"Bearer s3cret2",
        b"Bearer ",
        b"Bearer S3CRET",
    ] {
        let msg = unauthenticated(check(&t, Some(wrong)));
        assert!(!msg.contains("s3cret"), "token echoed: {msg}");
    }
    assert!(!format!("{t:?}").contains("s3cret"));
}

#[test]
fn disabled_lets_everything_through() {
    let t = AuthToken::disabled();
    assert!(!t.is_enabled());
    assert!(check(&t, None).is_ok());
    assert_eq!(t.peer_secret(), None);
}

#[test]
fn loads_single_tokens_from_files_and_refuses_empty_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    std::fs::write(&path, "abc123\n").unwrap();
    let t = AuthToken::from_file(&path).unwrap();
    assert!(check(&t, Some(b"Bearer abc123")).is_ok());
    assert_eq!(t.peer_secret().as_deref(), Some("abc123"));
    std::fs::write(&path, "  \n").unwrap();
    assert!(matches!(
        AuthToken::from_file(&path),
        Err(AuthTokenError::Empty(_))
    ));
    assert!(matches!(
        AuthToken::from_file(&dir.path().join("absent")),
        Err(AuthTokenError::Read { .. })
    ));
    assert!(matches!(
        AuthToken::from_value("a b"),
        Err(AuthTokenError::Malformed(_))
    ));
}

#[test]
fn the_single_token_is_admin_for_every_scope() {
    let t = AuthToken::from_value("s3cret").unwrap();
    for scope in [Scope::Management, Scope::Cluster, Scope::Raft] {
        for rpc in [
            "DeployModel",
            "ListModels",
            "Watch",
            "Heartbeat",
            "AppendEntries",
        ] {
            let header = bearer_of("s3cret");
            assert!(
                t.authorize(Some(&header), scope.permission(rpc), rpc)
                    .is_ok(),
                "{scope:?} {rpc}"
            );
        }
    }
}

#[test]
fn parses_a_tokens_file() {
    let set = TokenSet::parse(FILE, Path::new("tokens")).unwrap();
    let names: Vec<(&str, Role)> = set
        .tokens
        .iter()
        .map(|t| (t.name.as_str(), t.role))
        .collect();
    assert_eq!(
        names,
        [
            ("ops", Role::Admin),
            ("ci-reader", Role::ReadOnly),
            ("workers", Role::Cluster)
        ]
    );
    let debug = format!("{set:?}");
    assert!(
        debug.contains("ci-reader") && !debug.contains("secret"),
        "{debug}"
    );
}

#[test]
fn tokens_file_errors_name_the_file_the_line_and_the_problem() {
    let e = parse_err("admin a x1\nreader b x2\n");
    assert!(e.contains("/etc/nereid/tokens line 2"), "{e}");
    assert!(
        e.contains("unknown role 'reader'") && e.contains("read-only"),
        "{e}"
    );

    let e = parse_err("admin a x1\n# c\nread-only a x2\n");
    assert!(
        e.contains("line 3") && e.contains("duplicate token name 'a'"),
        "{e}"
    );
    assert!(e.contains("line 1"), "{e}");

    let e = parse_err("admin a same-secret\ncluster b same-secret\n");
    assert!(
        e.contains("line 2") && e.contains("same secret as token 'a'"),
        "{e}"
    );
    assert!(!e.contains("same-secret"), "secret echoed: {e}");

    let e = parse_err("admin a\n");
    assert!(e.contains("line 1") && e.contains("empty secret"), "{e}");
    let e = parse_err("admin a b c\n");
    assert!(e.contains("4 fields"), "{e}");
    let e = parse_err("admin\n");
    assert!(e.contains("<role> <name> <secret>"), "{e}");
    let e = parse_err("admin a/b x1\n");
    assert!(e.contains("token name 'a/b'"), "{e}");
    let e = parse_err("# only comments\n\n");
    assert!(e.contains("has no tokens"), "{e}");

    let e = AuthToken::from_tokens_file(Path::new("/nonexistent/tokens"), None).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/tokens"), "{e}");
}

#[test]
fn roles_allow_what_they_say() {
    use Permission::*;
    let all = [Read, Write, ClusterRead, ClusterWrite, Peer];
    let allowed =
        |role: Role| -> Vec<Permission> { all.into_iter().filter(|p| role.allows(*p)).collect() };
    assert_eq!(allowed(Role::Admin), all);
    assert_eq!(allowed(Role::ReadOnly), [Read, ClusterRead]);
    assert_eq!(allowed(Role::Cluster), [ClusterRead, ClusterWrite]);

    assert_eq!(Scope::Management.permission("ListModels"), Read);
    assert_eq!(Scope::Management.permission("ExplainPlacement"), Read);
    assert_eq!(Scope::Management.permission("DeployModel"), Write);
    assert_eq!(Scope::Management.permission("SomethingNew"), Write);
    assert_eq!(Scope::Cluster.permission("Watch"), ClusterRead);
    assert_eq!(Scope::Cluster.permission("Heartbeat"), ClusterWrite);
    assert_eq!(Scope::Raft.permission("Vote"), Peer);
}

#[test]
fn a_token_with_too_small_a_role_is_refused_with_its_name_and_role() {
    let dir = tempfile::tempdir().unwrap();
    let t = AuthToken::from_tokens_file(&tokens_file(dir.path(), FILE), None).unwrap();
    let reader = bearer_of("r3ad-secret");
    assert!(
        t.authorize(Some(&reader), Permission::Read, "ListModels")
            .is_ok()
    );
    let msg = denied(t.authorize(Some(&reader), Permission::Write, "DeployModel"));
    assert_eq!(
        msg,
        "token 'ci-reader' has role read-only; DeployModel needs admin"
    );

    let workers = bearer_of("clust3r-secret");
    assert!(
        t.authorize(Some(&workers), Permission::ClusterWrite, "Heartbeat")
            .is_ok()
    );
    let msg = denied(t.authorize(Some(&workers), Permission::Read, "ListModels"));
    assert!(msg.contains("'workers' has role cluster"), "{msg}");
    denied(t.authorize(Some(&workers), Permission::Peer, "AppendEntries"));

    let admin = bearer_of("adm1n-secret");
    assert!(
        t.authorize(Some(&admin), Permission::Peer, "AppendEntries")
            .is_ok()
    );
    assert_eq!(t.peer_secret().as_deref(), Some("adm1n-secret"));
    unauthenticated(check(&t, Some(&bearer_of("adm1n-secre"))));

    let debug = format!("{t:?}");
    assert!(
        debug.contains("ci-reader") && !debug.contains("secret\""),
        "{debug}"
    );
    assert!(!debug.contains("r3ad-secret"), "{debug}");
}

#[test]
fn the_single_admin_token_works_beside_a_tokens_file() {
    let dir = tempfile::tempdir().unwrap();
    let t = AuthToken::from_tokens_file(&tokens_file(dir.path(), FILE), Some("0ld-admin")).unwrap();
    assert!(check(&t, Some(&bearer_of("0ld-admin"))).is_ok());
    assert!(check(&t, Some(&bearer_of("adm1n-secret"))).is_ok());
    assert_eq!(t.peer_secret().as_deref(), Some("0ld-admin"));
}

#[test]
fn find_picks_the_first_match_and_compares_all() {
    let a = Token::new("a", Role::Admin, "one");
    let b = Token::new("b", Role::ReadOnly, "two");
    let c = Token::new("c", Role::Cluster, "one");
    let tokens = [&a, &b, &c];
    assert_eq!(find(b"two", &tokens).map(|t| t.name.as_str()), Some("b"));
    assert_eq!(find(b"one", &tokens).map(|t| t.name.as_str()), Some("a"));
    assert!(find(b"three", &tokens).is_none());
    assert!(find(b"", &tokens).is_none());
    assert!(find(b"one", &[]).is_none());
}

#[test]
fn constant_time_eq_is_equality() {
    assert!(constant_time_eq(b"abc", b"abc"));
    assert!(!constant_time_eq(b"abc", b"abd"));
    assert!(!constant_time_eq(b"abc", b"abcabc"));
    assert!(!constant_time_eq(b"abcabc", b"abc"));
    assert!(!constant_time_eq(b"", b"abc"));
    assert!(!constant_time_eq(b"abc", b""));
    assert!(constant_time_eq(b"", b""));
}

#[test]
fn a_changed_tokens_file_is_picked_up_and_a_bad_one_keeps_the_old_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let path = tokens_file(dir.path(), "admin ops first-secret\n");
    let t = AuthToken::from_tokens_file_every(&path, None, Duration::ZERO).unwrap();
    let first = bearer_of("first-secret");
    let second = bearer_of("second-secret");
    assert!(check(&t, Some(&first)).is_ok());

    // Rotation: the new secret is added, then the old one removed.
    std::fs::write(&path, "admin ops first-secret\nadmin ops2 second-secret\n").unwrap();
    assert!(check(&t, Some(&second)).is_ok());
    assert!(check(&t, Some(&first)).is_ok());
    std::fs::write(&path, "admin ops2 second-secret\n").unwrap();
    unauthenticated(check(&t, Some(&first)));
    assert!(check(&t, Some(&second)).is_ok());

    // A bad file (unknown role), an emptied file and a missing file keep the tokens in use.
    for bad in ["admin ops2 second-secret\nsuperuser x y\n", "\n"] {
        std::fs::write(&path, bad).unwrap();
        assert!(check(&t, Some(&second)).is_ok(), "{bad:?}");
    }
    std::fs::remove_file(&path).unwrap();
    assert!(check(&t, Some(&second)).is_ok());

    // A role change takes effect on the next check.
    std::fs::write(&path, "read-only ops2 second-secret\nadmin ops3 third\n").unwrap();
    let msg = denied(check(&t, Some(&second)));
    assert!(msg.contains("'ops2' has role read-only"), "{msg}");
    assert_eq!(t.peer_secret().as_deref(), Some("third"));
}

#[test]
fn the_tokens_file_is_checked_at_most_once_per_interval() {
    let dir = tempfile::tempdir().unwrap();
    let path = tokens_file(dir.path(), "admin ops first-secret\n");
    let t = AuthToken::from_tokens_file_every(&path, None, Duration::from_secs(3600)).unwrap();
    std::fs::write(&path, "admin ops second-secret\n").unwrap();
    // Within the interval the old tokens stay; reload_now (SIGHUP) picks the change up.
    assert!(check(&t, Some(&bearer_of("first-secret"))).is_ok());
    unauthenticated(check(&t, Some(&bearer_of("second-secret"))));
    t.reload_now();
    assert!(check(&t, Some(&bearer_of("second-secret"))).is_ok());
    unauthenticated(check(&t, Some(&bearer_of("first-secret"))));
}
