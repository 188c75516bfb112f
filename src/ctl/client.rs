//! The connection to the control plane: one `Management` gRPC client per address, the admin
//! token on every call, and failover along the `--control-plane` list.
//!
//! ```text
//! call(msg) ─► for each address in order:
//!                connect ── fails ──────────────► next address
//!                RPC ─┬─ ok ─────────────────────► response
//!                     ├─ UNAVAILABLE ────────────► next address (remember the leader hint)
//!                     └─ other status ───────────► CtlError::Status
//!              all tried ─► last error, with "the leader is at ..." when a node named it
//! ```
//!
//! A write refused with UNAVAILABLE was not applied (the node was not leader, or no leader was
//! known), so sending it to the next address is safe.

use std::future::Future;
use std::time::Duration;

use nereid_proto::pb::cluster::management_client::ManagementClient;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

/// Metadata key a control-plane node sets to the leader's address when it refuses as follower.
pub const LEADER_HINT: &str = "x-nereid-leader";

/// What ends a `ctl` command; maps to the exit status (2 for usage, 1 otherwise).
#[derive(Debug)]
pub enum CtlError {
    /// Bad flag values found after parsing (exit 2).
    Usage(String),
    /// No address could be reached.
    Connect(String),
    /// The control plane answered with an error status.
    Status {
        code: Code,
        message: String,
        leader: Option<String>,
    },
    /// Writing the output failed.
    Output(String),
}

impl CtlError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CtlError::Usage(_) => 2,
            _ => 1,
        }
    }

    fn from_status(status: &Status) -> CtlError {
        let leader = status
            .metadata()
            .get(LEADER_HINT)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty())
            .map(str::to_string);
        CtlError::Status {
            code: status.code(),
            message: status.message().to_string(),
            leader,
        }
    }
}

impl std::fmt::Display for CtlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CtlError::Usage(m) | CtlError::Connect(m) | CtlError::Output(m) => f.write_str(m),
            CtlError::Status {
                code,
                message,
                leader,
            } => {
                let message = if message.is_empty() {
                    code.description()
                } else {
                    message
                };
                match code {
                    Code::Unauthenticated => write!(
                        f,
                        "{message} (pass the admin token with --token-file or NEREID_AUTH_TOKEN)"
                    ),
                    Code::Unavailable => match leader {
                        Some(l) => write!(
                            f,
                            "{message} (the leader is at {l}; try --control-plane {l})"
                        ),
                        None => write!(f, "{message} (no leader known; retry shortly)"),
                    },
                    _ => f.write_str(message),
                }
            }
        }
    }
}

impl From<std::io::Error> for CtlError {
    fn from(e: std::io::Error) -> CtlError {
        CtlError::Output(format!("cannot write output: {e}"))
    }
}

/// The addresses to try and the token to present.
pub struct Connection {
    addresses: Vec<String>,
    token: Option<String>,
}

impl Connection {
    pub fn new(addresses: Vec<String>, token: Option<String>) -> Connection {
        let addresses = addresses
            .into_iter()
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty())
            .collect();
        Connection { addresses, token }
    }

    fn request<M>(&self, message: M) -> Result<Request<M>, CtlError> {
        let mut request = Request::new(message);
        request.set_timeout(Duration::from_secs(30));
        if let Some(token) = &self.token {
            let value = format!("Bearer {token}").parse().map_err(|_| {
                CtlError::Usage("the auth token has characters HTTP headers cannot carry".into())
            })?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }

    /// Sends `message` through `rpc` to the first address that answers and is not UNAVAILABLE.
    pub async fn call<M, T, F, Fut>(&self, message: M, rpc: F) -> Result<T, CtlError>
    where
        M: Clone,
        F: Fn(ManagementClient<Channel>, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        if self.addresses.is_empty() {
            return Err(CtlError::Usage("--control-plane is empty".into()));
        }
        let mut last = None;
        let mut hint = None;
        let mut unreachable = Vec::new();
        for address in &self.addresses {
            let channel = match connect(address).await {
                Ok(c) => c,
                Err(e) => {
                    unreachable.push(format!("{address}: {e}"));
                    continue;
                }
            };
            match rpc(
                ManagementClient::new(channel),
                self.request(message.clone())?,
            )
            .await
            {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) if status.code() == Code::Unavailable => {
                    let error = CtlError::from_status(&status);
                    if let CtlError::Status {
                        leader: Some(l), ..
                    } = &error
                    {
                        hint = Some(l.clone());
                    }
                    last = Some(error);
                }
                Err(status) => return Err(CtlError::from_status(&status)),
            }
        }
        let Some(mut error) = last else {
            return Err(CtlError::Connect(format!(
                "cannot reach the control plane at {}",
                unreachable.join("; ")
            )));
        };
        if let (CtlError::Status { leader, .. }, Some(h)) = (&mut error, hint) {
            leader.get_or_insert(h);
        }
        Err(error)
    }
}

/// Opens a channel to `host:port` (an `http://` or `https://` prefix is kept as given).
async fn connect(address: &str) -> Result<Channel, String> {
    let uri = if address.contains("://") {
        address.to_string()
    } else {
        format!("http://{address}")
    };
    let endpoint = Endpoint::from_shared(uri)
        .map_err(|e| format!("invalid address: {e}"))?
        .connect_timeout(Duration::from_secs(5));
    endpoint.connect().await.map_err(|e| {
        // The transport nests the cause several times; print each distinct layer once.
        let mut parts = vec![e.to_string()];
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            let text = s.to_string();
            if parts.last() != Some(&text) {
                parts.push(text);
            }
            source = s.source();
        }
        parts.join(": ")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_names_the_leader() {
        let mut status = Status::unavailable("not the leader");
        status
            .metadata_mut()
            .insert(LEADER_HINT, "10.0.0.2:7000".parse().unwrap());
        let e = CtlError::from_status(&status);
        assert_eq!(
            e.to_string(),
            "not the leader (the leader is at 10.0.0.2:7000; try --control-plane 10.0.0.2:7000)"
        );
        assert_eq!(e.exit_code(), 1);
        let e = CtlError::from_status(&Status::not_found("model 'x' not found"));
        assert_eq!(e.to_string(), "model 'x' not found");
    }
}
