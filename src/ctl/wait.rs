//! `ctl models deploy|scale --wait`: after the write, follow the model until the replicas it
//! asked for are ready, or until they cannot be (every replica still short has failed), or
//! until `--timeout` passes.
//!
//! ```text
//! write ─► GetModel every POLL ─► progress(status) ─┬─ Ready ──────► print the model, exit 0
//!                                                    ├─ Waiting ────► poll again (until timeout)
//!                                                    └─ Failed ─────► the replicas' reasons, exit 1
//! timeout ─► what is ready of what is wanted, and any failure reasons, exit 1
//! ```
//!
//! [`progress`] is a pure function of one `ModelStatus`, tested without a server.

use std::time::Duration;

use nereid_proto::pb::cluster::{ModelRef, ModelStatus, ReplicaState};

use super::client::{Connection, CtlError};

/// How often the model is read while waiting.
const POLL: Duration = Duration::from_millis(250);

/// Where a model stands against what it asked for.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    /// Every served version has at least `min_replicas` ready replicas.
    Ready,
    /// Some version is short, and replicas are still on their way.
    Waiting { ready: u32, wanted: u32 },
    /// Some version is short and none of its replicas is on its way: each one it has failed.
    Failed { reasons: Vec<String> },
}

/// Where `status` stands: each served version wants `min_replicas` ready replicas.
pub fn progress(status: &ModelStatus) -> Progress {
    let Some(model) = &status.model else {
        return Progress::Waiting {
            ready: 0,
            wanted: 0,
        };
    };
    let per_version = model.min_replicas;
    let wanted = per_version * model.served_versions.len().max(1) as u32;
    if per_version == 0 {
        return Progress::Ready;
    }
    if model.served_versions.is_empty() {
        return Progress::Waiting { ready: 0, wanted };
    }
    let state_is = |r: &nereid_proto::pb::cluster::Replica, s: ReplicaState| r.state == s as i32;
    let mut ready_total = 0;
    let mut short = false;
    let mut reasons = Vec::new();
    for &version in &model.served_versions {
        let replicas: Vec<_> = status
            .replicas
            .iter()
            .filter(|r| r.version == version)
            .collect();
        let ready = replicas
            .iter()
            .filter(|r| state_is(r, ReplicaState::Ready))
            .count() as u32;
        ready_total += ready.min(per_version);
        if ready >= per_version {
            continue;
        }
        short = true;
        let on_the_way = replicas.iter().any(|r| {
            state_is(r, ReplicaState::Pending)
                || state_is(r, ReplicaState::Loading)
                || state_is(r, ReplicaState::Unspecified)
        });
        let failed: Vec<String> = replicas
            .iter()
            .filter(|r| state_is(r, ReplicaState::Failed))
            .map(|r| {
                let why = if r.failure_reason.is_empty() {
                    "no reason given"
                } else {
                    &r.failure_reason
                };
                format!(
                    "version {version}, replica {} on node {}: {why}",
                    r.id, r.node
                )
            })
            .collect();
        if !on_the_way && !failed.is_empty() {
            reasons.extend(failed);
        }
    }
    match (short, reasons.is_empty()) {
        (false, _) => Progress::Ready,
        (true, false) => Progress::Failed { reasons },
        (true, true) => Progress::Waiting {
            ready: ready_total,
            wanted,
        },
    }
}

/// Polls `name` until [`progress`] says ready (its last status is returned) or failed, or
/// `timeout` passes.
pub async fn until_ready(
    connection: &Connection,
    name: &str,
    consistency: i32,
    timeout: Duration,
) -> Result<ModelStatus, CtlError> {
    let started = tokio::time::Instant::now();
    let mut ticks = tokio::time::interval(POLL);
    loop {
        ticks.tick().await;
        let message = ModelRef {
            name: name.to_string(),
            consistency,
        };
        let status = connection
            .call(message, |mut c, r| async move { c.get_model(r).await })
            .await?;
        match progress(&status) {
            Progress::Ready => return Ok(status),
            Progress::Failed { reasons } => {
                return Err(CtlError::Wait(format!(
                    "model {name} cannot reach its replica count; failed replicas:\n  {}",
                    reasons.join("\n  ")
                )));
            }
            Progress::Waiting { ready, wanted } if started.elapsed() >= timeout => {
                return Err(CtlError::Wait(format!(
                    "model {name}: {ready} of {wanted} replicas ready after {} s (--timeout); \
                     `nereid ctl models placement {name}` says what is pending",
                    timeout.as_secs()
                )));
            }
            Progress::Waiting { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_proto::pb::cluster::{Model, Replica};

    fn status(min: u32, versions: &[i64], replicas: &[(i64, ReplicaState, &str)]) -> ModelStatus {
        ModelStatus {
            model: Some(Model {
                name: "m".into(),
                min_replicas: min,
                max_replicas: min.max(1),
                served_versions: versions.to_vec(),
                ..Default::default()
            }),
            replicas: replicas
                .iter()
                .enumerate()
                .map(|(i, (version, state, reason))| Replica {
                    id: i as u64 + 1,
                    model: "m".into(),
                    version: *version,
                    node: format!("w{}", i + 1),
                    state: *state as i32,
                    failure_reason: reason.to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    use ReplicaState::{Failed, Loading, Pending, Ready};

    #[test]
    fn ready_when_every_served_version_has_its_replicas() {
        assert_eq!(
            progress(&status(2, &[1], &[(1, Ready, ""), (1, Ready, "")])),
            Progress::Ready
        );
        assert_eq!(
            progress(&status(1, &[1, 2], &[(1, Ready, ""), (2, Loading, "")])),
            Progress::Waiting {
                ready: 1,
                wanted: 2
            },
            "each served version counts"
        );
        assert_eq!(
            progress(&status(0, &[1], &[])),
            Progress::Ready,
            "scaled to zero"
        );
    }

    #[test]
    fn waiting_while_a_replica_is_on_its_way_even_beside_a_failure() {
        assert_eq!(
            progress(&status(2, &[1], &[(1, Ready, ""), (1, Pending, "")])),
            Progress::Waiting {
                ready: 1,
                wanted: 2
            }
        );
        assert!(matches!(
            progress(&status(1, &[1], &[(1, Failed, "oom"), (1, Loading, "")])),
            Progress::Waiting { .. }
        ));
        assert!(matches!(
            progress(&status(1, &[1], &[])),
            Progress::Waiting { .. }
        ));
    }

    #[test]
    fn failed_with_reasons_when_nothing_short_is_on_its_way() {
        let p = progress(&status(
            1,
            &[1],
            &[(1, Failed, "config name 'x' differs"), (1, Failed, "")],
        ));
        let Progress::Failed { reasons } = p else {
            panic!("{p:?}")
        };
        assert_eq!(reasons.len(), 2);
        assert!(reasons[0].contains("replica 1 on node w1: config name 'x' differs"));
        assert!(reasons[1].contains("no reason given"));
        assert_eq!(
            progress(&status(1, &[1], &[(1, Ready, ""), (1, Failed, "x")])),
            Progress::Ready,
            "a failed spare does not matter once the count is ready"
        );
    }
}
