//! Tokens and their roles: the [`Role`] a token grants, the [`Permission`] an operation needs,
//! and the tokens file (`--auth-tokens-file`) parsed into a [`TokenSet`].
//!
//! The file has one token per line, `<role> <name> <secret>`, separated by blanks; a line whose
//! first non-blank character is `#` is a comment, blank lines are skipped:
//!
//! ```text
//! # role     name        secret
//! admin      ops         9f2c...e1
//! read-only  ci-reader   41aa...07
//! cluster    workers     c0de...99
//! ```
//!
//! Names are what logs and refusals show; secrets are never shown, by `Debug` or any error.

use std::fmt;
use std::path::Path;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Everything: every management call, the cluster service, and the Raft transport
    /// (control-plane nodes call each other with an admin token).
    Admin,
    /// Every management read (list, get, placement explanations, nodes, cluster status) and
    /// the cluster service's Watch; every write is refused.
    ReadOnly,
    /// What workers and routers need: the cluster service (register, heartbeat, report,
    /// activate, watch). No management call.
    Cluster,
}

impl Role {
    /// The names the tokens file uses.
    pub const NAMES: &'static str = "admin, read-only or cluster";

    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "admin" => Some(Role::Admin),
            "read-only" => Some(Role::ReadOnly),
            "cluster" => Some(Role::Cluster),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::ReadOnly => "read-only",
            Role::Cluster => "cluster",
        }
    }

    /// Whether a token with this role may perform an operation that needs `permission`.
    pub fn allows(self, permission: Permission) -> bool {
        match (self, permission) {
            (Role::Admin, _) => true,
            (Role::ReadOnly, Permission::Read | Permission::ClusterRead) => true,
            (Role::ReadOnly, Permission::Write | Permission::ClusterWrite | Permission::Peer) => {
                false
            }
            (Role::Cluster, Permission::ClusterRead | Permission::ClusterWrite) => true,
            (Role::Cluster, Permission::Read | Permission::Write | Permission::Peer) => false,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an operation needs, by the kind of operation it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permission {
    /// A management read (GET on REST).
    Read,
    /// A management write: deploy, scale, traffic, delete, drain, membership.
    Write,
    /// The cluster service's Watch.
    ClusterRead,
    /// The cluster service's other calls: register, heartbeat, report, activate.
    ClusterWrite,
    /// The Raft transport between control-plane nodes.
    Peer,
}

impl Permission {
    /// The roles that grant it, for refusals ("DeployModel needs admin").
    pub fn roles(self) -> &'static str {
        match self {
            Permission::Read => "read-only or admin",
            Permission::Write | Permission::Peer => "admin",
            Permission::ClusterRead => "cluster, read-only or admin",
            Permission::ClusterWrite => "cluster or admin",
        }
    }
}

/// One token: a name to show, a role, and a secret never shown.
#[derive(Clone)]
pub struct Token {
    pub name: String,
    pub role: Role,
    secret: Box<[u8]>,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({} {}, <redacted>)", self.role, self.name)
    }
}

impl Token {
    pub fn new(name: impl Into<String>, role: Role, secret: &str) -> Token {
        Token {
            name: name.into(),
            role,
            secret: secret.as_bytes().into(),
        }
    }

    pub(super) fn secret(&self) -> &[u8] {
        &self.secret
    }
}

/// Why a tokens file was refused. Names the file and the line; never a secret.
#[derive(Debug, thiserror::Error)]
pub enum TokensFileError {
    #[error("cannot read the tokens file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("tokens file {path} line {line}: {reason}")]
    Line {
        path: String,
        line: usize,
        reason: String,
    },
    #[error("tokens file {0} has no tokens; add lines '<role> <name> <secret>'")]
    NoTokens(String),
}

/// The tokens of one file, in file order.
#[derive(Debug, Clone, Default)]
pub struct TokenSet {
    pub tokens: Vec<Token>,
}

impl TokenSet {
    /// Parses the text of a tokens file; `path` is for the errors.
    pub fn parse(text: &str, path: &Path) -> Result<TokenSet, TokensFileError> {
        let line_error = |line: usize, reason: String| TokensFileError::Line {
            path: path.display().to_string(),
            line,
            reason,
        };
        let mut tokens: Vec<(usize, Token)> = Vec::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let content = raw.trim();
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            if content.chars().any(|c| c.is_control() && c != '\t') {
                return Err(line_error(line, "contains control characters".into()));
            }
            let fields: Vec<&str> = content.split_whitespace().collect();
            let (role, name, secret) = match fields.as_slice() {
                [role, name, secret] => (*role, *name, *secret),
                [_, name] => {
                    return Err(line_error(
                        line,
                        format!(
                            "token '{name}' has an empty secret; expected '<role> <name> <secret>'"
                        ),
                    ));
                }
                [_, name, _, ..] => {
                    return Err(line_error(
                        line,
                        format!(
                            "token '{name}' has {} fields; expected '<role> <name> <secret>' (a secret cannot contain blanks)",
                            fields.len()
                        ),
                    ));
                }
                _ => {
                    return Err(line_error(line, "expected '<role> <name> <secret>'".into()));
                }
            };
            let role = Role::parse(role).ok_or_else(|| {
                line_error(
                    line,
                    format!("unknown role '{role}'; expected {}", Role::NAMES),
                )
            })?;
            if !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            {
                return Err(line_error(
                    line,
                    format!("token name '{name}' may only hold letters, digits, '-', '_' and '.'"),
                ));
            }
            for (other_line, other) in &tokens {
                if other.name == name {
                    return Err(line_error(
                        line,
                        format!("duplicate token name '{name}' (first on line {other_line})"),
                    ));
                }
                if *other.secret == *secret.as_bytes() {
                    return Err(line_error(
                        line,
                        format!(
                            "token '{name}' has the same secret as token '{}' (line {other_line}); every token needs its own secret",
                            other.name
                        ),
                    ));
                }
            }
            tokens.push((line, Token::new(name, role, secret)));
        }
        if tokens.is_empty() {
            return Err(TokensFileError::NoTokens(path.display().to_string()));
        }
        Ok(TokenSet {
            tokens: tokens.into_iter().map(|(_, t)| t).collect(),
        })
    }
}
