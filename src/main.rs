//! The `nereid` binary: parses flags into typed configs and calls into the crates.
//!
//! - `nereid serve`: the single-node Triton-compatible server.
//! - `nereid control-plane`: a Raft-replicated control-plane node (registry, placement, API).
//! - `nereid worker`: the same server, with models assigned by a Nereid control plane.
//! - `nereid router`: the cluster's front door, forwarding each request to a worker replica.
//! - `nereid check-config`: lints `config.pbtxt` files and model directories.
//! - `nereid ctl`: the operator's client of the control plane's management API.

mod check_config;
mod cli;
mod cluster_tls_args;
mod common_args;
mod control_plane_args;
mod ctl;
mod forward_args;
mod grpc_keepalive_args;
mod ort_library;
mod router_args;
mod telemetry_args;
mod tls_args;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};

/// mimalloc instead of the system allocator: a request through the router or a worker makes
/// many small, short-lived allocations (HTTP/2 frames, protobuf messages, tensors' buffers),
/// and glibc's malloc/free took 10–16 % of the router's CPU (docs/benchmarks.md, "Router hop").
/// Only Rust's allocations move to it; ONNX Runtime keeps its own allocator. Built without
/// transparent huge pages (feature `no_thp`): most of the server's threads allocate little, and
/// a huge page per thread cost 2.4 MiB per Python model.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            init_logging(args.frontend.log_verbose, &args.frontend.log_format);
            match args.into_config() {
                Ok(config) => run_async(|| nereid_data_plane::serve(config, shutdown_signal())),
                Err(e) => usage_error(e),
            }
        }
        Command::Worker(args) => {
            init_logging(args.frontend.log_verbose, &args.frontend.log_format);
            match args.into_config(std::env::var("NEREID_AUTH_TOKEN").ok()) {
                Ok(config) => run_async(|| {
                    nereid_agent::run_worker(
                        config.serve,
                        config.agent,
                        config.advertise_host,
                        shutdown_signal(),
                    )
                }),
                Err(e) => usage_error(e),
            }
        }
        Command::ControlPlane(args) => {
            init_logging(args.log_verbose, &args.log_format);
            match args.into_config() {
                Ok(config) => run_async(|| nereid_control_plane::run(config, shutdown_signal())),
                Err(e) => usage_error(e),
            }
        }
        Command::Router(args) => {
            init_logging(args.frontend.log_verbose, &args.frontend.log_format);
            let threads = args.threads;
            match args.into_config(std::env::var("NEREID_AUTH_TOKEN").ok()) {
                Ok(config) => {
                    run_router_runtime(threads, || nereid_router::run(config, shutdown_signal()))
                }
                Err(e) => usage_error(e),
            }
        }
        Command::CheckConfig(args) => check_config::run(args),
        Command::Ctl(args) => ctl::run(*args),
    }
}

/// Prints a flag error and exits with the usage status.
fn usage_error(message: String) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(2)
}

/// Runs a server future on a multi-threaded runtime; any error is printed and exits 1.
fn run_async<F, E>(server: impl FnOnce() -> F) -> ExitCode
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    block_on(&mut builder, server)
}

/// The router's runtime: `threads` threads (0: one per core it may run on). With one, the
/// current-thread scheduler: it runs woken tasks in the order they were woken, so a
/// connection's task writes the frames of every request answered meanwhile in one system call
/// (measured: 0.3 writes per gRPC request at concurrency 32, against 2 with the multi-threaded
/// scheduler, which runs the last-woken task first and so flushes each request on its own).
fn run_router_runtime<F, E>(threads: usize, server: impl FnOnce() -> F) -> ExitCode
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    };
    let mut builder = if threads == 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads);
        builder
    };
    block_on(&mut builder, server)
}

/// Builds the runtime and runs `server` on it; any error is printed and exits 1.
fn block_on<F, E>(builder: &mut tokio::runtime::Builder, server: impl FnOnce() -> F) -> ExitCode
where
    F: std::future::Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(server()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(verbose: u32, format: &common_args::LogFormat) {
    let format = match format {
        common_args::LogFormat::Json => nereid_telemetry::logging::LogFormat::Json,
        common_args::LogFormat::Text => nereid_telemetry::logging::LogFormat::Text,
    };
    nereid_telemetry::logging::init(verbose, format);
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
