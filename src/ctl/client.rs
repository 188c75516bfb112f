//! The `ctl` policy over the shared control-plane client ([`nereid_cluster_client`]): the admin
//! token on every call, one pass along `--control-plane`, and what an operator reads when it
//! fails.
//!
//! ```text
//! call(msg) ─► ControlPlaneClient::call_each: each address at most once, in order
//!                unreachable ───────────────────► next address
//!                RPC ─┬─ ok ─────────────────────► response
//!                     ├─ UNAVAILABLE ────────────► the leader it names if listed, else next
//!                     └─ other status ───────────► CtlError::Status
//!              all tried ─► last answer, with "the leader is at ..." when a node named it;
//!                           "cannot reach the control plane at ..." when none answered
//! ```
//!
//! A write refused with UNAVAILABLE was not applied (the node was not leader, or no leader was
//! known), so sending it to the next address is safe.

use std::future::Future;
use std::time::Duration;

use nereid_cluster_client::{ClientConfig, ClientError, ControlPlaneClient, PassError};
use nereid_proto::pb::cluster::management_client::ManagementClient;
use nereid_tls::ClusterDial;
use tonic::transport::Channel;
use tonic::{Code, Request, Response, Status};

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
    /// `--wait`: the replicas did not become ready (failed, or the timeout passed).
    Wait(String),
}

impl CtlError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CtlError::Usage(_) => 2,
            _ => 1,
        }
    }

    fn from_status(status: &Status) -> CtlError {
        CtlError::Status {
            code: status.code(),
            message: status.message().to_string(),
            leader: nereid_cluster_client::leader_hint(status).map(str::to_string),
        }
    }

    fn from_pass(error: PassError) -> CtlError {
        match error {
            PassError::Refused(status) => CtlError::from_status(&status),
            PassError::Exhausted {
                answered: Some(status),
                leader,
                ..
            } => match CtlError::from_status(&status) {
                CtlError::Status {
                    code,
                    message,
                    leader: own,
                } => CtlError::Status {
                    code,
                    message,
                    leader: own.or(leader),
                },
                other => other,
            },
            e @ PassError::Exhausted { answered: None, .. } => CtlError::Connect(e.to_string()),
        }
    }
}

impl std::fmt::Display for CtlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CtlError::Usage(m) | CtlError::Connect(m) | CtlError::Output(m) | CtlError::Wait(m) => {
                f.write_str(m)
            }
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
    client: ControlPlaneClient,
    /// Whether it dials over TLS, and presents a client certificate there (for the hint a
    /// failure below gRPC gets).
    tls: bool,
    identity: bool,
}

impl Connection {
    /// Checks `--control-plane` and the token (usage errors); connects nothing yet.
    pub fn new(addresses: Vec<String>, token: Option<String>) -> Result<Connection, CtlError> {
        let client = ControlPlaneClient::new(&ClientConfig {
            addresses,
            token,
            connect_timeout: Duration::from_secs(5),
            call_timeout: Duration::from_secs(30),
        })
        .map_err(|e| match e {
            ClientError::NoAddress => CtlError::Usage("--control-plane is empty".into()),
            ClientError::InvalidToken => {
                CtlError::Usage("the auth token has characters HTTP headers cannot carry".into())
            }
            e @ ClientError::InvalidAddress { .. } => CtlError::Usage(e.to_string()),
        })?;
        Ok(Connection {
            client,
            tls: false,
            identity: false,
        })
    }

    /// Connects with `dial` (TLS with `--tls-*`; `identity`: a client certificate is presented).
    pub fn with_dial(self, dial: ClusterDial, identity: bool) -> Connection {
        Connection {
            tls: dial.is_tls(),
            identity,
            client: self.client.with_dial(dial),
        }
    }

    /// What about the TLS flags may be wrong when a connection failed below gRPC.
    fn transport_hint(&self) -> &'static str {
        match (self.tls, self.identity) {
            (false, _) => PLAINTEXT_HINT,
            (true, false) => NO_IDENTITY_HINT,
            (true, true) => TLS_HINT,
        }
    }

    /// Sends `message` through `rpc` to the first address that answers and is not UNAVAILABLE.
    pub async fn call<M, T, F, Fut>(&self, message: M, rpc: F) -> Result<T, CtlError>
    where
        M: Clone,
        F: Fn(ManagementClient<Channel>, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<T>, Status>>,
    {
        self.client
            .call_each(message, |code| code == Code::Unavailable, rpc)
            .await
            .map_err(|e| {
                let transport = transport_failure(&e, self.tls);
                let e = CtlError::from_pass(e);
                if transport {
                    e.with_hint(self.transport_hint())
                } else {
                    e
                }
            })
    }
}

/// What `ctl` adds when a connection failed below gRPC, by the TLS flags it was given.
const PLAINTEXT_HINT: &str = "if the control plane serves TLS (--cluster-tls-*), pass --tls-ca with its CA and --tls-cert/--tls-key with a client certificate signed by it";
const NO_IDENTITY_HINT: &str = "a control plane with --cluster-tls-* requires a client certificate: pass --tls-cert and --tls-key, signed by its cluster CA";
const TLS_HINT: &str = "check that the control plane serves TLS, that --tls-ca signed its certificate, that the certificate names the address dialed, and that --tls-cert is signed by its cluster CA";

/// True when the failure came from the connection, not from an answer of the control plane (a
/// status made from a transport error carries that error as its source). A TLS dial's handshake
/// happens while connecting, so with `tls` an unreachable node counts too; without, it is just
/// unreachable (refused, no route).
fn transport_failure(error: &PassError, tls: bool) -> bool {
    use std::error::Error;
    match error {
        PassError::Refused(status)
        | PassError::Exhausted {
            answered: Some(status),
            ..
        } => status.source().is_some(),
        PassError::Exhausted { answered: None, .. } => tls,
    }
}

impl CtlError {
    fn with_hint(self, hint: &str) -> CtlError {
        CtlError::Connect(format!("{self} ({hint})"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_names_the_leader() {
        let mut status = Status::unavailable("not the leader");
        status.metadata_mut().insert(
            nereid_cluster_client::LEADER_HINT,
            "10.0.0.2:7000".parse().unwrap(),
        );
        let e = CtlError::from_status(&status);
        assert_eq!(
            e.to_string(),
            "not the leader (the leader is at 10.0.0.2:7000; try --control-plane 10.0.0.2:7000)"
        );
        assert_eq!(e.exit_code(), 1);
        let e = CtlError::from_status(&Status::not_found("model 'x' not found"));
        assert_eq!(e.to_string(), "model 'x' not found");
    }

    #[test]
    fn a_pass_names_a_leader_an_earlier_node_named() {
        let e = CtlError::from_pass(PassError::Exhausted {
            answered: Some(Status::unavailable("no leader")),
            unreachable: vec![],
            leader: Some("cp-3:7000".into()),
        });
        assert!(
            e.to_string().ends_with("try --control-plane cp-3:7000)"),
            "{e}"
        );
        let e = CtlError::from_pass(PassError::Exhausted {
            answered: None,
            unreachable: vec!["a:1: refused".into()],
            leader: None,
        });
        assert_eq!(
            e.to_string(),
            "cannot reach the control plane at a:1: refused"
        );
    }

    #[test]
    fn only_failures_below_grpc_get_the_tls_hint() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let transport = Status::from_error(Box::new(io));
        assert!(transport_failure(&PassError::Refused(transport), false));
        let unreachable = || PassError::Exhausted {
            answered: None,
            unreachable: vec!["a:1: handshake failed".into()],
            leader: None,
        };
        assert!(transport_failure(&unreachable(), true));
        assert!(!transport_failure(&unreachable(), false));
        // An answer from the control plane itself is not about TLS.
        let answered = PassError::Exhausted {
            answered: Some(Status::unavailable("no leader")),
            unreachable: vec![],
            leader: None,
        };
        assert!(!transport_failure(&answered, true));
        let e = CtlError::Connect("transport error".into()).with_hint(PLAINTEXT_HINT);
        assert!(e.to_string().contains("pass --tls-ca"), "{e}");
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn bad_flags_are_usage_errors() {
        let e = Connection::new(vec![" ".into()], None).err().unwrap();
        assert_eq!(
            (e.to_string().as_str(), e.exit_code()),
            ("--control-plane is empty", 2)
        );
        let e = Connection::new(vec!["a:1".into()], Some("x\ny".into()))
            .err()
            .unwrap();
        assert_eq!(e.exit_code(), 2);
        let e = Connection::new(vec!["grpc://a:1".into()], None)
            .err()
            .unwrap();
        assert!(e.to_string().contains("'grpc://a:1'"), "{e}");
    }
}
