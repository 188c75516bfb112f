//! The router's policy over the shared control-plane client ([`nereid_cluster_client`]). The
//! watch (the `watch` module) follows one stream at the node in use and moves on (to a listed
//! leader a node names, else the next) whenever it breaks; activations (scale from zero) and
//! repository load/unload (the `activate` module) are unary calls that try each node once, moving
//! on when one is unreachable or answers UNAVAILABLE / UNKNOWN (any node answers them:
//! followers forward to the leader).

use std::future::Future;
use std::time::Duration;

use nereid_cluster_client::{ClientConfig, ControlPlaneClient, PassError};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// Where the control plane is and how to authenticate.
#[derive(Clone, Debug, Default)]
pub struct ControlPlaneConfig {
    /// gRPC addresses of control-plane nodes (`host:port` or a URI).
    pub control_plane: Vec<String>,
    /// Bearer token, when the control plane requires one.
    pub token: Option<String>,
    /// Plaintext, or TLS with the cluster identity (`--cluster-tls-*`).
    pub dial: nereid_tls::ClusterDial,
}

/// The control-plane client, checked before anything connects.
pub struct ControlPlane {
    client: ControlPlaneClient,
}

/// How long one unary call to a control-plane node may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long opening a connection to one node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

impl ControlPlane {
    pub fn new(config: &ControlPlaneConfig) -> Result<ControlPlane, String> {
        let client = ControlPlaneClient::new(&ClientConfig {
            addresses: config.control_plane.clone(),
            token: config.token.clone(),
            connect_timeout: CONNECT_TIMEOUT,
            call_timeout: CALL_TIMEOUT,
        })
        .map_err(|e| e.to_string())?
        .with_dial(config.dial.clone());
        Ok(ControlPlane { client })
    }

    /// The shared client (the watch uses its node in use and failover).
    pub fn client(&self) -> &ControlPlaneClient {
        &self.client
    }

    /// Calls each node at most once until one answers with something other than UNAVAILABLE
    /// or UNKNOWN (or a broken connection); the last error when none does.
    pub async fn call<M, R, F, Fut>(&self, message: M, call: F) -> Result<R, Status>
    where
        M: Clone,
        F: Fn(Channel, tonic::Request<M>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        self.client
            .call_each(
                message,
                |code| matches!(code, Code::Unavailable | Code::Unknown),
                call,
            )
            .await
            .map_err(PassError::into_status)
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
            ..Default::default()
        };
        assert!(ControlPlane::new(&bad).is_err());
    }
}
