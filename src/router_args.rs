//! `nereid router` flags and their checks, turned into the router crate's config.

use std::time::Duration;

use clap::{Args, ValueEnum};
use nereid_router::ControlPlaneConfig;
use nereid_router::ForwardConfig;
use nereid_router::HedgeConfig;
use nereid_router::RepositoryControl;
use nereid_router::RouterConfig;
use nereid_router::RouterServiceConfig;

use crate::common_args::{AuthTokenArgs, FrontendArgs, ListenArgs, control_plane_addrs};
use crate::telemetry_args::TelemetryArgs;

#[derive(Args, Debug)]
pub struct RouterArgs {
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
    /// Control-plane gRPC addresses (host:port), comma-separated; the router fails over
    /// between them and keeps routing from its last table while none answers.
    #[arg(
        long,
        env = "NEREID_CONTROL_PLANE",
        value_delimiter = ',',
        required = true
    )]
    pub control_plane: Vec<String>,
    #[command(flatten)]
    pub auth: AuthTokenArgs,
    #[command(flatten)]
    pub listen: ListenArgs,
    /// Bind the HTTP, gRPC and metrics ports with SO_REUSEPORT, so a new router can start on
    /// the same ports while this one runs and take over without an outage: start the new one,
    /// wait until it is ready, then SIGTERM this one (docs/router.md). Every process sharing a
    /// port must set it and run as the same user.
    #[arg(long, env = "NEREID_REUSE_PORT", default_value_t = false)]
    pub reuse_port: bool,
    /// Requests in flight through this router; beyond it new requests are refused (503 /
    /// UNAVAILABLE) so clients back off. Size it to the workers' total queue capacity.
    #[arg(long, env = "NEREID_MAX_IN_FLIGHT", default_value_t = 4096)]
    pub max_in_flight: usize,
    /// Seconds a sequence (sequence_id) keeps its replica without a request; raise it above
    /// the models' max_sequence_idle_microseconds.
    #[arg(long, env = "NEREID_SEQUENCE_IDLE_TIMEOUT_SECS", default_value_t = 60)]
    pub sequence_idle_timeout_secs: u64,
    /// Seconds a request for a model scaled to zero (min_replicas 0), or a repository load
    /// through the router, waits for a replica to become ready; a gRPC deadline can shorten it.
    #[arg(long, env = "NEREID_SCALE_FROM_ZERO_WAIT_SECS", default_value_t = 60)]
    pub scale_from_zero_wait_secs: u64,
    /// Least time (milliseconds) an attempt runs before the request, if safe to repeat, is also
    /// sent to another replica (hedged). The attempt timeout is four times the model's observed
    /// p99 through this router, within this floor and --hedge-ceiling-secs.
    #[arg(long, env = "NEREID_HEDGE_FLOOR_MS", default_value_t = 1000)]
    pub hedge_floor_ms: u64,
    /// How long (milliseconds) a worker's load report counts in replica choice. The router
    /// asks for one on every stream it opens and weighs the work a worker reported from
    /// elsewhere (other routers, direct clients) on top of its own requests; after this long
    /// it weighs its own count alone until its next stream there. Longer: fewer streams sent
    /// to learn a busy worker's load; shorter: a drained worker is found sooner.
    #[arg(long, env = "NEREID_LOAD_REPORT_TTL_MS", default_value_t = 2000)]
    pub load_report_ttl_ms: u64,
    /// Longest time (seconds) an attempt runs before it is hedged; also the attempt timeout
    /// until the router has seen enough requests of a model. A replica that leaves the routing
    /// table's ready set (its node marked down) is hedged at once.
    #[arg(long, env = "NEREID_HEDGE_CEILING_SECS", default_value_t = 30)]
    pub hedge_ceiling_secs: u64,
    #[command(flatten)]
    pub frontend: FrontendArgs,
    #[command(flatten)]
    pub tls: crate::tls_args::PortTlsArgs,
    #[command(flatten)]
    pub cluster_tls: crate::cluster_tls_args::ClusterTlsArgs,
    /// Repository load/unload (Triton's explicit model control) through the router: `off`
    /// refuses them (503 / UNAVAILABLE naming this flag), so the public inference port
    /// administers nothing; `caller-credential` forwards them to the management API with the
    /// caller's own `Authorization` header (an admin token there), never the router's token.
    #[arg(
        long,
        env = "NEREID_REPOSITORY_CONTROL",
        value_enum,
        default_value = "off"
    )]
    pub repository_control: RepositoryControlArg,
    /// Async runtime threads (0 = one per CPU core the router may run on). One (the default)
    /// runs the single-threaded scheduler, which writes the answers of many requests in one
    /// system call: about half the CPU per request of two threads. For more than a core's
    /// worth of traffic run more routers (`--reuse-port` shares the ports) or raise it.
    #[arg(long, env = "NEREID_ROUTER_THREADS", default_value_t = 1)]
    pub threads: usize,
}

/// `--repository-control`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum RepositoryControlArg {
    Off,
    CallerCredential,
}

impl RouterArgs {
    /// Checks the flags and turns them into the router's config, before any port is bound.
    /// `env_token` is NEREID_AUTH_TOKEN, used when no token file is given.
    pub fn into_config(self, env_token: Option<String>) -> Result<RouterConfig, String> {
        let control_plane = control_plane_addrs(&self.control_plane)?;
        if self.max_in_flight == 0 {
            return Err("--max-in-flight must be at least 1".into());
        }
        if self.sequence_idle_timeout_secs == 0 {
            return Err("--sequence-idle-timeout-secs must be at least 1".into());
        }
        let token = self.auth.token(env_token)?;
        let addrs = self.listen.addrs()?;
        if self.listen.allow_client_shm {
            return Err("--allow-client-shm: the router cannot serve client shared memory (it forwards requests to workers on other hosts, which cannot read this host's memory); send tensors in the requests".into());
        }
        let ports = self.tls.ports(&self.frontend)?;
        let dial = self
            .cluster_tls
            .load()?
            .map(|tls| tls.dial)
            .unwrap_or_default();
        let frontend = self.frontend;
        let frontend_options = frontend.options()?;
        Ok(RouterConfig {
            service: RouterServiceConfig {
                server_name: frontend.id,
                max_in_flight: self.max_in_flight,
                sequence_idle_timeout: Duration::from_secs(self.sequence_idle_timeout_secs),
                ejection: RouterServiceConfig::default().ejection,
                load_report_ttl: Duration::from_millis(self.load_report_ttl_ms),
                scale_from_zero_wait: Duration::from_secs(self.scale_from_zero_wait_secs),
                hedge: HedgeConfig {
                    floor: Duration::from_millis(self.hedge_floor_ms),
                    ceiling: Duration::from_secs(self.hedge_ceiling_secs.max(1)),
                },
                forward: ForwardConfig {
                    dial: dial.clone(),
                    ..ForwardConfig::default()
                },
            },
            control_plane: ControlPlaneConfig {
                control_plane,
                token,
                dial,
            },
            http_addr: addrs.http,
            grpc_addr: addrs.grpc,
            metrics_addr: addrs.metrics,
            reuse_port: self.reuse_port,
            http_max_input_size: frontend.http_max_input_size,
            frontend: frontend_options,
            exit_timeout: Duration::from_secs(frontend.exit_timeout_secs),
            telemetry: self.telemetry.to_config("nereid-router")?,
            ports,
            repository_control: match self.repository_control {
                RepositoryControlArg::Off => RepositoryControl::Off,
                RepositoryControlArg::CallerCredential => RepositoryControl::CallerCredential,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::cli::{Cli, Command};

    fn parse(args: &[&str]) -> Result<nereid_router::RouterConfig, String> {
        let mut all = vec!["nereid", "router"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all).map_err(|e| e.to_string())?.command {
            Command::Router(r) => r.into_config(None),
            _ => Err("not the router".into()),
        }
    }

    #[test]
    fn flags_become_the_router_config() {
        let c = parse(&[
            "--control-plane",
            "a:1, b:2",
            "--grpc-port",
            "9001",
            "--max-in-flight",
            "8",
            "--allow-metrics",
            "false",
        ])
        .unwrap();
        assert_eq!(c.control_plane.control_plane, vec!["a:1", "b:2"]);
        assert_eq!(c.service.max_in_flight, 8);
        assert_eq!(c.grpc_addr.unwrap().port(), 9001);
        assert!(c.metrics_addr.is_none());
        assert!(c.control_plane.token.is_none());
        assert!(!c.reuse_port, "ports are not shared unless asked");
        assert!(
            parse(&["--control-plane", "a:1", "--reuse-port"])
                .unwrap()
                .reuse_port
        );
        assert_eq!(
            c.repository_control,
            nereid_router::RepositoryControl::Off,
            "the public port administers nothing unless asked"
        );
        let on = parse(&[
            "--control-plane",
            "a:1",
            "--repository-control",
            "caller-credential",
        ])
        .unwrap();
        assert_eq!(
            on.repository_control,
            nereid_router::RepositoryControl::CallerCredential
        );
        assert!(parse(&["--control-plane", "a:1", "--repository-control", "yes"]).is_err());
    }

    #[test]
    fn bad_flags_are_refused_before_anything_starts() {
        assert!(parse(&[]).is_err());
        assert!(
            parse(&["--control-plane", "a:1", "--max-in-flight", "0"])
                .unwrap_err()
                .contains("--max-in-flight")
        );
        assert!(
            parse(&[
                "--control-plane",
                "a:1",
                "--http-port",
                "9",
                "--grpc-port",
                "9"
            ])
            .unwrap_err()
            .contains("each service needs its own port")
        );
        assert!(
            parse(&[
                "--control-plane",
                "a:1",
                "--auth-token-file",
                "/nonexistent/t"
            ])
            .unwrap_err()
            .contains("--auth-token-file")
        );
    }

    #[test]
    fn the_router_config_carries_restrictions_and_limits() {
        let c = parse(&[
            "--control-plane",
            "a:1",
            "--http-restricted-api",
            "inference,model-repository:k=v",
            "--grpc-restricted-api",
            "health:g=1",
            "--max-request-inputs",
            "3",
            "--grpc-max-message-size",
            "4096",
        ])
        .unwrap();
        let options = &c.frontend;
        let inference = nereid_frontend::ApiCategory::Inference;
        assert_eq!(
            options.http_restricted.required(inference).unwrap().key,
            "k"
        );
        let health = nereid_frontend::ApiCategory::Health;
        assert_eq!(
            options.grpc_restricted.required(health).unwrap().key,
            "triton-grpc-protocol-g"
        );
        assert_eq!(options.limits.max_inputs, 3);
        assert_eq!(options.grpc_max_message_size, 4096);
        let e = parse(&[
            "--control-plane",
            "a:1",
            "--http-restricted-api",
            "inference",
        ])
        .unwrap_err();
        assert!(
            e.contains("--http-restricted-api 'inference' is malformed"),
            "{e}"
        );
    }
}
