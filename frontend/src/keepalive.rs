//! [`GrpcKeepalive`]: the HTTP/2 keepalive and connection-age settings of a gRPC port, Triton's
//! `--grpc-keepalive-*` and `--grpc-max-connection-age*` channel options as far as tonic's server
//! has them.
//!
//! ```text
//! --grpc-keepalive-time     ─► http2_keepalive_interval: the server pings a connection it has
//! --grpc-keepalive-timeout  ─► http2_keepalive_timeout   heard nothing on, closes it unanswered
//! --grpc-max-connection-age ─► max_connection_age: GOAWAY once a connection is this old; it
//!                              closes when its open calls have finished
//! ```
//!
//! `--grpc-max-connection-age-grace` has no counterpart: tonic 0.14's `max_connection_age_grace`
//! replaces the GOAWAY at the connection's age with a plain close at age + grace, which would
//! break calls without warning, so it is not set. Nor have Triton's ping-policing options
//! (`--grpc-keepalive-permit-without-calls`, `--grpc-http2-max-pings-without-data`,
//! `--grpc-http2-min-recv-ping-interval-without-data`, `--grpc-http2-max-ping-strikes`): hyper
//! answers every client ping and never sends GOAWAY for too many. The binary accepts and checks
//! those flags; they take no effect.

use std::time::Duration;

use tonic::transport::Server;

/// How a gRPC port keeps connections alive and how long it lets them live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrpcKeepalive {
    /// Time between the server's keepalive pings on a connection (Triton: 2 hours).
    pub time: Duration,
    /// How long a ping may go unanswered before the connection is closed (Triton: 20 s).
    pub timeout: Duration,
    /// Age after which a connection is told to go away (GOAWAY); `None`: no limit, as Triton.
    pub max_connection_age: Option<Duration>,
}

impl GrpcKeepalive {
    /// Triton's `--grpc-keepalive-time` default: 7200000 ms.
    pub const DEFAULT_TIME: Duration = Duration::from_secs(2 * 60 * 60);
    /// Triton's `--grpc-keepalive-timeout` default: 20000 ms.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);

    /// `builder` with these settings.
    pub fn configure(&self, builder: Server) -> Server {
        let mut builder = builder
            .http2_keepalive_interval(Some(self.time))
            .http2_keepalive_timeout(Some(self.timeout));
        if let Some(age) = self.max_connection_age {
            builder = builder.max_connection_age(age);
        }
        builder
    }
}

impl Default for GrpcKeepalive {
    fn default() -> Self {
        GrpcKeepalive {
            time: Self::DEFAULT_TIME,
            timeout: Self::DEFAULT_TIMEOUT,
            max_connection_age: None,
        }
    }
}
