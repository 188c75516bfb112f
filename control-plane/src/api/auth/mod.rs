//! Bearer-token authentication and role checks for the control plane's APIs, gRPC and REST.
//!
//! ```text
//!  request ─► authorization: Bearer <secret>
//!     └─► AuthToken::authorize(header, permission, operation)
//!          ├─ refresh: tokens file re-read at most once a second; a bad file keeps the old set
//!          ├─ compare with every token in constant time ─ none: 401 / UNAUTHENTICATED
//!          ├─ the token's role lacks the permission ───────── 403 / PERMISSION_DENIED
//!          └─ ok: the handler runs
//! ```
//!
//! Tokens come from `--auth-token-file` / `NEREID_AUTH_TOKEN` (one admin token, fixed for the
//! life of the process) and from `--auth-tokens-file` (any number of named tokens with roles,
//! [`tokens`], rotated without a restart). [`AuthToken::disabled`] turns the check off and
//! exists only for an operator who asks for it explicitly. Secrets are compared in constant
//! time and never echoed, logged or printed by `Debug`; every refusal is logged on the
//! `nereid::audit` target with the token's name when one matched, never its secret.
//!
//! gRPC: each service is wrapped in [`Guarded`] (which sees the method path, so a read-only
//! token can list but not deploy). REST: [`crate::api::rest::router`] wraps every route in
//! [`require_token`] (GET needs read, everything else write).

mod guard;
mod tokens;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};
use tracing::{error, info, warn};

pub use guard::{Scope, require_token};
pub use tokens::{Permission, Role, Token, TokenSet, TokensFileError};

use super::error::ApiError;

/// The header carrying the token, as `Bearer <secret>`.
pub const AUTH_HEADER: &str = "authorization";

/// The name the token of `--auth-token-file` / `NEREID_AUTH_TOKEN` goes by in logs.
pub const SINGLE_TOKEN_NAME: &str = "auth-token";

/// How often, at most, the tokens file is checked for a change.
pub const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// The tokens a control-plane node accepts; `None` when authentication is disabled.
#[derive(Clone)]
pub struct AuthToken(Option<Arc<Keyring>>);

struct Keyring {
    /// The single admin token of `--auth-token-file`, checked first.
    single: Option<Token>,
    file: Option<TokensFile>,
}

/// The tokens of `--auth-tokens-file` and what is needed to notice that the file changed.
struct TokensFile {
    path: PathBuf,
    every: Duration,
    tokens: RwLock<Arc<TokenSet>>,
    poll: Mutex<Poll>,
}

struct Poll {
    checked: Instant,
    /// The text last parsed, good or bad: the same text again is neither re-parsed nor
    /// re-reported.
    seen: String,
    /// The last read error, so a missing file is reported once, not every second.
    read_error: Option<String>,
}

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(keyring) = &self.0 else {
            return f.write_str("AuthToken(disabled)");
        };
        let mut d = f.debug_struct("AuthToken");
        d.field("single", &keyring.single);
        if let Some(file) = &keyring.file {
            d.field("file", &file.path);
            d.field("tokens", &file.tokens.read().tokens);
        }
        d.finish()
    }
}

/// Why the tokens could not be loaded at start.
#[derive(Debug, thiserror::Error)]
pub enum AuthTokenError {
    #[error("cannot read the admin token file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the admin token {0} is empty; put a secret in it or disable auth explicitly")]
    Empty(String),
    #[error("the admin token {0} contains whitespace or control characters inside it")]
    Malformed(String),
    #[error(transparent)]
    TokensFile(#[from] TokensFileError),
}

impl AuthToken {
    /// No authentication: every request passes. Only for an explicit operator choice.
    pub fn disabled() -> Self {
        AuthToken(None)
    }

    /// One admin token given as a value; surrounding whitespace is trimmed.
    pub fn from_value(value: &str) -> Result<Self, AuthTokenError> {
        Ok(Self::single(parse_single(value, "value".to_string())?))
    }

    /// One admin token: the trimmed contents of a file (a trailing newline is fine).
    pub fn from_file(path: &Path) -> Result<Self, AuthTokenError> {
        let text = read_single(path)?;
        Ok(Self::single(parse_single(
            &text,
            format!("in file {}", path.display()),
        )?))
    }

    fn single(token: Token) -> Self {
        AuthToken(Some(Arc::new(Keyring {
            single: Some(token),
            file: None,
        })))
    }

    /// The tokens of a tokens file (see `tokens.rs` for its format), plus the single admin
    /// token `admin` when one is given too. The file is re-read when it changes.
    pub fn from_tokens_file(path: &Path, admin: Option<&str>) -> Result<Self, AuthTokenError> {
        Self::from_tokens_file_every(path, admin, RELOAD_EVERY)
    }

    /// [`AuthToken::from_tokens_file`], checking the file for changes at most every `every`.
    pub fn from_tokens_file_every(
        path: &Path,
        admin: Option<&str>,
        every: Duration,
    ) -> Result<Self, AuthTokenError> {
        let single = admin
            .map(|value| parse_single(value, "value".to_string()))
            .transpose()?;
        let text = std::fs::read_to_string(path).map_err(|source| TokensFileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let set = TokenSet::parse(&text, path)?;
        Ok(AuthToken(Some(Arc::new(Keyring {
            single,
            file: Some(TokensFile {
                path: path.to_path_buf(),
                every,
                tokens: RwLock::new(Arc::new(set)),
                poll: Mutex::new(Poll {
                    checked: Instant::now(),
                    seen: text,
                    read_error: None,
                }),
            }),
        }))))
    }

    /// Whether callers must present a token (false for [`AuthToken::disabled`]).
    pub fn is_enabled(&self) -> bool {
        self.0.is_some()
    }

    /// The secret of an admin token, for the calls this node makes to its peers: the single
    /// token if there is one, else the first admin token of the tokens file as it is now.
    pub fn peer_secret(&self) -> Option<String> {
        let keyring = self.0.as_ref()?;
        let admin = |t: &Token| {
            (t.role == Role::Admin).then(|| String::from_utf8_lossy(t.secret()).into_owned())
        };
        if let Some(secret) = keyring.single.as_ref().and_then(admin) {
            return Some(secret);
        }
        let file = keyring.file.as_ref()?;
        let set = file.tokens.read().clone();
        set.tokens.iter().find_map(admin)
    }

    /// Re-reads the tokens file now if it changed (the request path does so at most once a
    /// second by itself).
    pub fn reload_now(&self) {
        if let Some(file) = self.0.as_ref().and_then(|k| k.file.as_ref()) {
            file.refresh(true);
        }
    }

    /// Re-reads the tokens file on every SIGHUP until `stop` turns true; returns at once when
    /// there is no tokens file (SIGHUP then keeps its default meaning).
    pub async fn reload_on_hangup_task(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        use tokio::signal::unix::{SignalKind, signal};
        if self.0.as_ref().is_none_or(|k| k.file.is_none()) {
            return;
        }
        let mut hangup = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                warn!(
                    "cannot listen for SIGHUP; the tokens file is still re-read when it changes: {e}"
                );
                return;
            }
        };
        loop {
            tokio::select! {
                _ = hangup.recv() => {
                    info!("SIGHUP: re-reading the tokens file");
                    self.reload_now();
                }
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
        }
    }

    /// Checks the value of an `authorization` header (absent: `None`) for an operation that
    /// needs `permission`; `operation` names it in refusals ("DeployModel").
    pub fn authorize(
        &self,
        header: Option<&[u8]>,
        permission: Permission,
        operation: &str,
    ) -> Result<(), ApiError> {
        let Some(keyring) = &self.0 else {
            return Ok(());
        };
        let refuse = |name: Option<&str>, e: ApiError| {
            warn!(
                target: "nereid::audit",
                token = name.unwrap_or("-"),
                operation,
                reason = %e,
                "refused a control-plane request"
            );
            Err(e)
        };
        let presented = match bearer(header) {
            Ok(p) => p,
            Err(e) => return refuse(None, e),
        };
        let from_file = keyring.file.as_ref().map(|file| {
            file.refresh(false);
            file.tokens.read().clone()
        });
        let candidates: Vec<&Token> = keyring
            .single
            .iter()
            .chain(from_file.iter().flat_map(|set| set.tokens.iter()))
            .collect();
        let Some(token) = find(presented, &candidates) else {
            return refuse(
                None,
                ApiError::Unauthenticated(
                    "invalid token in the 'authorization: Bearer <token>' header".into(),
                ),
            );
        };
        if token.role.allows(permission) {
            return Ok(());
        }
        refuse(
            Some(token.name.as_str()),
            ApiError::PermissionDenied(format!(
                "token '{}' has role {}; {operation} needs {}",
                token.name,
                token.role,
                permission.roles()
            )),
        )
    }
}

impl TokensFile {
    /// Re-reads the file when `every` has passed since the last look (or `now`); a changed
    /// file that parses replaces the tokens, one that does not is reported and ignored.
    fn refresh(&self, now: bool) {
        // A request that finds another one checking goes on with the tokens as they are.
        let Some(mut poll) = self.poll.try_lock() else {
            return;
        };
        if !now && poll.checked.elapsed() < self.every {
            return;
        }
        poll.checked = Instant::now();
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) => {
                let message = e.to_string();
                if poll.read_error.as_deref() != Some(message.as_str()) {
                    error!(
                        path = %self.path.display(),
                        error = %message,
                        "cannot read the tokens file; the previous tokens stay in use"
                    );
                    poll.read_error = Some(message);
                }
                return;
            }
        };
        poll.read_error = None;
        if text == poll.seen {
            return;
        }
        match TokenSet::parse(&text, &self.path) {
            Ok(set) => {
                info!(
                    path = %self.path.display(),
                    tokens = set.tokens.len(),
                    "reloaded the tokens file"
                );
                *self.tokens.write() = Arc::new(set);
            }
            Err(e) => error!(
                error = %e,
                "the changed tokens file is refused; the previous tokens stay in use"
            ),
        }
        poll.seen = text;
    }
}

fn read_single(path: &Path) -> Result<String, AuthTokenError> {
    std::fs::read_to_string(path).map_err(|source| AuthTokenError::Read {
        path: path.display().to_string(),
        source,
    })
}

fn parse_single(text: &str, what: String) -> Result<Token, AuthTokenError> {
    let secret = text.trim();
    if secret.is_empty() {
        return Err(AuthTokenError::Empty(what));
    }
    if secret.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(AuthTokenError::Malformed(what));
    }
    Ok(Token::new(SINGLE_TOKEN_NAME, Role::Admin, secret))
}

/// The secret of a `Bearer <secret>` header.
fn bearer(header: Option<&[u8]>) -> Result<&[u8], ApiError> {
    let Some(header) = header else {
        return Err(ApiError::Unauthenticated(
            "missing token: send the header 'authorization: Bearer <token>'".into(),
        ));
    };
    match header.split_first_chunk::<7>() {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case(b"bearer ") => Ok(rest.trim_ascii()),
        _ => Err(ApiError::Unauthenticated(
            "the authorization header must have the form 'Bearer <token>'".into(),
        )),
    }
}

/// The first token whose secret is `presented`. Every token is compared, to the end, whatever
/// matched before, so the time taken says nothing about which token (if any) matched.
fn find<'a>(presented: &[u8], tokens: &[&'a Token]) -> Option<&'a Token> {
    let mut found = usize::MAX;
    for (i, token) in tokens.iter().enumerate() {
        let hit = usize::from(constant_time_eq(presented, token.secret()));
        let first = usize::from(found == usize::MAX);
        let mask = (hit & first).wrapping_neg();
        found = (i & mask) | (found & !mask);
    }
    tokens.get(found).copied()
}

/// Compares without an early exit, so the time taken says nothing about where the inputs
/// differ (only, at most, that their lengths do).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, x) in a.iter().enumerate() {
        let y = if b.is_empty() { 0 } else { b[i % b.len()] };
        diff |= x ^ y;
    }
    diff == 0
}
