//! The `nereid-loadtest` binary: parses flags and calls [`nereid_loadtest::run`],
//! [`nereid_loadtest::sweep`] or [`nereid_loadtest::run_placement_sim`] (offline).
//! Exit status 0 on success, 1 on any error (including failed requests with
//! `--fail-on-errors`, and flags clap rejects).

use std::process::ExitCode;

use clap::Parser;
use nereid_loadtest::{Cli, Command, run, run_placement_sim, sweep};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // `--help` and `--version` come here too, and are not failures.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let threads = match &cli.command {
        Some(Command::PlacementSim(args)) => {
            // Pure computation: no runtime, no server.
            return match run_placement_sim(args, &mut std::io::stdout().lock()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Some(Command::Sweep(args)) => args.run.client_threads,
        None => cli.run.client_threads,
    };
    // One thread: everything on the calling thread, no cross-thread wake-ups per request.
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut b = tokio::runtime::Builder::new_multi_thread();
        b.worker_threads(threads);
        b
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(async {
        match &cli.command {
            Some(Command::Sweep(args)) => sweep(args).await.map(|_| ()),
            Some(Command::PlacementSim(_)) => Ok(()),
            None => run(&cli.run).await.map(|_| ()),
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
