//! Reaching the leader from a follower: one lazily connected gRPC channel per leader address,
//! and requests that carry the cluster's bearer token and a mark that they were forwarded, so a
//! stale view of who leads never sends a call around in circles.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use nereid_tls::ClusterDial;
use parking_lot::Mutex;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

use crate::consensus::Consensus;

/// Metadata on a call one control-plane node forwarded to another.
pub const FORWARDED: &str = "x-nereid-forwarded";

/// True when `request` was forwarded by another control-plane node.
pub fn was_forwarded<T>(request: &Request<T>) -> bool {
    request.metadata().contains_key(FORWARDED)
}

/// Channels to whichever node leads, cached by address.
pub struct LeaderChannels {
    consensus: Arc<dyn Consensus>,
    token: Option<String>,
    channels: Mutex<HashMap<String, Channel>>,
    /// Plaintext, or TLS with the cluster identity.
    dial: ClusterDial,
}

impl LeaderChannels {
    pub fn new(consensus: Arc<dyn Consensus>, token: Option<String>) -> Self {
        LeaderChannels {
            consensus,
            token,
            channels: Mutex::new(HashMap::new()),
            dial: ClusterDial::plain(),
        }
    }

    /// Dials the leader with `dial` (TLS with the cluster identity when configured).
    pub fn with_dial(mut self, dial: ClusterDial) -> Self {
        self.dial = dial;
        self
    }

    /// True when this node is the leader and should answer itself.
    pub fn is_leader(&self) -> bool {
        self.consensus.status().is_leader()
    }

    /// A channel to the current leader, or UNAVAILABLE naming what is missing.
    pub fn leader(&self) -> Result<Channel, Status> {
        let status = self.consensus.status();
        let Some(address) = status.leader_address.filter(|_| status.leader_id.is_some()) else {
            return Err(Status::unavailable(
                "no control-plane leader is known (election in progress or no quorum); retry",
            ));
        };
        let mut channels = self.channels.lock();
        if let Some(channel) = channels.get(&address) {
            return Ok(channel.clone());
        }
        let endpoint = Endpoint::from_shared(format!("{}://{address}", self.dial.scheme()))
            .map_err(|e| Status::internal(format!("leader address '{address}': {e}")))?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .tcp_nodelay(true);
        let channel = self.dial.lazy(&endpoint);
        channels.insert(address, channel.clone());
        Ok(channel)
    }

    /// Wraps `message` in a request that carries the bearer token, if any, and the mark that it
    /// was forwarded (the receiver answers it itself instead of forwarding it again).
    pub fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request
            .metadata_mut()
            .insert(FORWARDED, tonic::metadata::MetadataValue::from_static("1"));
        if let Some(token) = &self.token
            && let Ok(value) = format!("Bearer {token}").parse()
        {
            request.metadata_mut().insert("authorization", value);
        }
        request
    }
}
