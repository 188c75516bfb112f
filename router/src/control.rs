//! The router's connection to the control plane: the addresses, the bearer token, and unary
//! calls that fail over between nodes. The watch ([`crate::watch`]) follows one stream;
//! activations (scale from zero) and repository load/unload ([`crate::activate`]) are unary
//! calls that any node answers (followers forward to the leader).

use std::future::Future;
use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

/// Where the control plane is and how to authenticate.
#[derive(Clone, Debug, Default)]
pub struct ControlPlaneConfig {
    /// gRPC addresses of control-plane nodes (`host:port` or a URI).
    pub control_plane: Vec<String>,
    /// Bearer token, when the control plane requires one.
    pub token: Option<String>,
}

/// The control-plane endpoints and the token header, checked before anything connects.
pub struct ControlPlane {
    nodes: Vec<(String, Channel)>,
    token: Option<MetadataValue<Ascii>>,
}

/// How long one unary call to a control-plane node may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

impl ControlPlane {
    pub fn new(config: &ControlPlaneConfig) -> Result<ControlPlane, String> {
        if config.control_plane.is_empty() {
            return Err("no control-plane address".into());
        }
        let nodes = config
            .control_plane
            .iter()
            .map(|a| {
                let uri = if a.contains("://") {
                    a.clone()
                } else {
                    format!("http://{a}")
                };
                Endpoint::from_shared(uri)
                    .map(|e| {
                        (
                            a.clone(),
                            e.connect_timeout(Duration::from_secs(2))
                                .tcp_nodelay(true)
                                .connect_lazy(),
                        )
                    })
                    .map_err(|e| format!("control-plane address '{a}': {e}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let token = config
            .token
            .as_deref()
            .map(|t| {
                MetadataValue::try_from(format!("Bearer {}", t.trim())).map_err(|_| {
                    "the auth token has characters not allowed in a header".to_string()
                })
            })
            .transpose()?;
        Ok(ControlPlane { nodes, token })
    }

    /// The nodes, as (address, channel).
    pub fn nodes(&self) -> &[(String, Channel)] {
        &self.nodes
    }

    /// `message` with the bearer token.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        if let Some(t) = &self.token {
            r.metadata_mut().insert("authorization", t.clone());
        }
        r
    }

    /// Calls each node in turn until one answers with something other than UNAVAILABLE (or a
    /// broken connection); the last error when none does.
    pub async fn call<M, R, F, Fut>(&self, message: M, call: F) -> Result<R, Status>
    where
        M: Clone,
        F: Fn(Channel, tonic::Request<M>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let mut last = Status::unavailable("no control-plane node answered");
        for (addr, channel) in &self.nodes {
            let mut request = self.request(message.clone());
            request.set_timeout(CALL_TIMEOUT);
            match call(channel.clone(), request).await {
                Ok(response) => return Ok(response.into_inner()),
                Err(status) if matches!(status.code(), Code::Unavailable | Code::Unknown) => {
                    tracing::debug!(%addr, error = %status, "control-plane node unavailable; trying the next");
                    last = status;
                }
                Err(status) => return Err(status),
            }
        }
        Err(last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn addresses_and_token_are_checked_up_front() {
        assert!(ControlPlane::new(&ControlPlaneConfig::default()).is_err());
        let bad = ControlPlaneConfig {
            control_plane: vec!["127.0.0.1:1".into()],
            token: Some("bad\ntoken".into()),
        };
        assert!(ControlPlane::new(&bad).is_err());
    }
}
