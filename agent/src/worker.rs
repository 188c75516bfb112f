//! `nereid worker`: the single-node server in explicit mode over the agent's private model
//! repository, with the agent running alongside it.
//!
//! ```text
//! clear stale links in the repository ─► serve (explicit, no startup models, repository API
//! refused) ─► agent (register, watch, reconcile, heartbeat) ─► shutdown signal or agent
//! failure ─► drain like `nereid serve`
//! ```

use std::future::Future;

use tokio::sync::oneshot;

use nereid_data_plane::{Companion, ControlMode, ServeConfig, ServeError, Started, serve_with};

use crate::AgentConfig;

/// Removes the symlinks a previous run left in the repository (nothing is loaded from it at
/// start: the control plane's snapshot decides).
fn clear_links(repository: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(repository)?;
    for entry in std::fs::read_dir(repository)? {
        let entry = entry?;
        if entry.file_type()?.is_symlink() {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// Runs the worker until `shutdown` resolves (or the agent fails), then drains and returns.
/// Empty data-plane addresses in `agent` are filled from `advertise_host` and the bound ports.
pub async fn run(
    mut config: ServeConfig,
    agent: AgentConfig,
    advertise_host: String,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    clear_links(&agent.repository).map_err(|e| {
        ServeError::Startup(format!(
            "cannot prepare the model directory '{}': {e}",
            agent.repository.display()
        ))
    })?;
    config.manager.repositories = vec![agent.repository.clone()];
    config.manager.control_mode = ControlMode::Explicit;
    config.manager.startup_models.clear();
    config.manager.cluster_managed = true;

    let (failed_tx, failed_rx) = oneshot::channel::<String>();
    let companion: Companion = Box::new(move |started: Started| {
        Box::pin(async move {
            let mut agent = agent;
            let addr = |a: Option<std::net::SocketAddr>| {
                a.map(|a| format!("{advertise_host}:{}", a.port()))
                    .unwrap_or_default()
            };
            if agent.data_http.is_empty() {
                agent.data_http = addr(started.http_addr);
            }
            if agent.data_grpc.is_empty() {
                agent.data_grpc = addr(started.grpc_addr);
            }
            if let Err(e) = crate::run(agent, started.manager, started.stop).await {
                tracing::error!(error = %e, "agent failed");
                let _ = failed_tx.send(e.to_string());
            }
        })
    });
    let failure = std::sync::Arc::new(parking_lot::Mutex::new(None::<String>));
    let failure_seen = failure.clone();
    let stop = async move {
        tokio::select! {
            _ = shutdown => {}
            Ok(reason) = failed_rx => { *failure_seen.lock() = Some(reason); }
        }
    };
    serve_with(config, stop, Some(companion)).await?;
    match failure.lock().take() {
        Some(reason) => Err(ServeError::Startup(reason)),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_links_are_cleared_and_other_files_kept() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("models");
        std::fs::create_dir_all(&repo).unwrap();
        std::os::unix::fs::symlink(dir.path(), repo.join("old")).unwrap();
        std::fs::write(repo.join("note"), "x").unwrap();
        clear_links(&repo).unwrap();
        assert!(std::fs::symlink_metadata(repo.join("old")).is_err());
        assert!(repo.join("note").exists());
    }
}
