//! Triton's gRPC channel options (`--grpc-keepalive-*`, `--grpc-http2-*`,
//! `--grpc-max-connection-age*`), in milliseconds with Triton's defaults, shared by `serve`,
//! `worker` and `router` through the TLS-args module's `PortTlsArgs`, which flattens these.
//! Keepalive time and timeout and the connection age take effect
//! ([`nereid_frontend::GrpcKeepalive`]); the age grace and the ping-policing four are accepted
//! and checked only, tonic's server has no counterpart.

use std::time::Duration;

use clap::Args;
use nereid_frontend::GrpcKeepalive;

use crate::common_args::parse_bool;

#[derive(Args, Debug, Clone)]
pub struct GrpcKeepaliveArgs {
    /// Milliseconds between the keepalive pings the gRPC port sends on each connection (Triton's
    /// default, 2 hours); a client that does not answer one within --grpc-keepalive-timeout is
    /// disconnected. Lower it to find dead clients behind NATs and load balancers sooner.
    #[arg(long, env = "NEREID_GRPC_KEEPALIVE_TIME", default_value_t = 7_200_000)]
    pub grpc_keepalive_time: u64,
    /// Milliseconds a keepalive ping may go unanswered before its connection is closed.
    #[arg(long, env = "NEREID_GRPC_KEEPALIVE_TIMEOUT", default_value_t = 20_000)]
    pub grpc_keepalive_timeout: u64,
    /// Triton's GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS; accepted for compatibility, no effect
    /// (the server pings whether or not calls are open, and answers every client ping).
    #[arg(long, env = "NEREID_GRPC_KEEPALIVE_PERMIT_WITHOUT_CALLS", default_value = "false", value_parser = parse_bool, num_args = 0..=1, default_missing_value = "true")]
    pub grpc_keepalive_permit_without_calls: bool,
    /// Triton's GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA; accepted for compatibility, no effect.
    #[arg(
        long,
        env = "NEREID_GRPC_HTTP2_MAX_PINGS_WITHOUT_DATA",
        default_value_t = 2
    )]
    pub grpc_http2_max_pings_without_data: u32,
    /// Triton's GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS; accepted for
    /// compatibility, no effect (client pings are never counted as strikes).
    #[arg(
        long,
        env = "NEREID_GRPC_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA",
        default_value_t = 300_000
    )]
    pub grpc_http2_min_recv_ping_interval_without_data: u64,
    /// Triton's GRPC_ARG_HTTP2_MAX_PING_STRIKES; accepted for compatibility, no effect.
    #[arg(long, env = "NEREID_GRPC_HTTP2_MAX_PING_STRIKES", default_value_t = 2)]
    pub grpc_http2_max_ping_strikes: u32,
    /// Milliseconds after which a gRPC connection is told to go away (GOAWAY; clients reconnect,
    /// which spreads them over replicas behind a load balancer). Default: no limit.
    #[arg(long, env = "NEREID_GRPC_MAX_CONNECTION_AGE")]
    pub grpc_max_connection_age: Option<u64>,
    /// Triton's GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS; accepted for compatibility, no effect: a
    /// connection told to go away closes once its calls finish, however long they take.
    #[arg(long, env = "NEREID_GRPC_MAX_CONNECTION_AGE_GRACE")]
    pub grpc_max_connection_age_grace: Option<u64>,
}

impl GrpcKeepaliveArgs {
    /// The settings that take effect, or the first flag that is 0 where it must not be.
    pub fn keepalive(&self) -> Result<GrpcKeepalive, String> {
        let positive = [
            ("--grpc-keepalive-time", Some(self.grpc_keepalive_time)),
            (
                "--grpc-keepalive-timeout",
                Some(self.grpc_keepalive_timeout),
            ),
            ("--grpc-max-connection-age", self.grpc_max_connection_age),
        ];
        if let Some((flag, _)) = positive.iter().find(|(_, v)| *v == Some(0)) {
            return Err(format!("{flag} must be at least 1 (milliseconds)"));
        }
        Ok(GrpcKeepalive {
            time: Duration::from_millis(self.grpc_keepalive_time),
            timeout: Duration::from_millis(self.grpc_keepalive_timeout),
            max_connection_age: self.grpc_max_connection_age.map(Duration::from_millis),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;
    use nereid_frontend::GrpcKeepalive;

    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<nereid_frontend::PortsConfig, String> {
        let mut argv = vec!["nereid", "serve", "--model-repository", "."];
        argv.extend_from_slice(args);
        match Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .command
        {
            Command::Serve(a) => a.into_config().map(|c| c.ports),
            _ => unreachable!(),
        }
    }

    #[test]
    fn tritons_defaults_and_values_in_milliseconds() {
        assert_eq!(parse(&[]).unwrap().grpc_keepalive, GrpcKeepalive::default());
        assert_eq!(
            GrpcKeepalive::default().time,
            Duration::from_millis(7_200_000)
        );
        assert_eq!(
            GrpcKeepalive::default().timeout,
            Duration::from_millis(20_000)
        );
        let ports = parse(&[
            "--grpc-keepalive-time",
            "1000",
            "--grpc-keepalive-timeout",
            "500",
            "--grpc-keepalive-permit-without-calls",
            "1",
            "--grpc-http2-max-pings-without-data",
            "0",
            "--grpc-http2-min-recv-ping-interval-without-data",
            "10",
            "--grpc-http2-max-ping-strikes",
            "0",
            "--grpc-max-connection-age",
            "60000",
            "--grpc-max-connection-age-grace",
            "5000",
        ])
        .unwrap();
        let k = ports.grpc_keepalive;
        assert_eq!(k.time, Duration::from_secs(1));
        assert_eq!(k.timeout, Duration::from_millis(500));
        assert_eq!(k.max_connection_age, Some(Duration::from_secs(60)));
        assert_eq!(ports.grpc_serving(1).keepalive, k);
    }

    #[test]
    fn zero_times_are_refused() {
        let e = parse(&["--grpc-keepalive-time", "0"]).unwrap_err();
        assert_eq!(e, "--grpc-keepalive-time must be at least 1 (milliseconds)");
        let e = parse(&["--grpc-max-connection-age", "0"]).unwrap_err();
        assert!(e.contains("--grpc-max-connection-age must be"), "{e}");
    }
}
