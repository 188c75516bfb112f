//! Human views of the management responses: aligned tables (see [`super::table`]) and
//! `key: value` blocks. `--output json` bypasses this module and prints the proto-JSON.

use nereid_proto::pb::cluster::version_policy::Policy;
use nereid_proto::pb::cluster::{
    ClusterStatus, ListModelsResponse, ListNodesResponse, ListPlacementsResponse, ModelStatus,
    NodeStatus, NodeStatusResponse, PlacementDecision, PlacementExplanation, Replica, ReplicaState,
    VersionPolicy,
};

use super::table::{Table, age_ms, bytes, fields, utc};

/// `latest:2`, `all`, `1,3`; `latest:1` when unset (the server's default).
pub fn version_policy(policy: Option<&VersionPolicy>) -> String {
    match policy.and_then(|p| p.policy.as_ref()) {
        None => "latest:1".into(),
        Some(Policy::Latest(l)) => format!("latest:{}", l.num_versions),
        Some(Policy::All(_)) => "all".into(),
        Some(Policy::Specific(s)) => s
            .versions
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(","),
    }
}

fn replica_state(state: i32) -> String {
    match ReplicaState::try_from(state) {
        Ok(ReplicaState::Pending) => "pending",
        Ok(ReplicaState::Loading) => "loading",
        Ok(ReplicaState::Ready) => "ready",
        Ok(ReplicaState::Failed) => "failed",
        Ok(ReplicaState::Unloading) => "unloading",
        _ => "unknown",
    }
    .into()
}

fn node_status(status: i32) -> &'static str {
    match NodeStatus::try_from(status) {
        Ok(NodeStatus::Up) => "up",
        Ok(NodeStatus::Down) => "down",
        _ => "unknown",
    }
}

fn labels(map: &std::collections::HashMap<String, String>) -> String {
    let mut pairs: Vec<_> = map.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.sort();
    pairs.join(",")
}

/// `1=90% 2=10%`, by version; `-` without a split.
fn traffic(weights: &std::collections::HashMap<i64, u32>) -> String {
    let total: u64 = weights.values().map(|w| u64::from(*w)).sum();
    if total == 0 {
        return "-".into();
    }
    let mut versions: Vec<_> = weights.iter().collect();
    versions.sort();
    versions
        .into_iter()
        .map(|(v, w)| format!("{v}={:.0}%", u64::from(*w) as f64 * 100.0 / total as f64))
        .collect::<Vec<_>>()
        .join(" ")
}

fn replicas_wanted(min: u32, max: u32) -> String {
    if min == max {
        min.to_string()
    } else {
        format!("{min}-{max}")
    }
}

/// A replica's GPU indices and, once measured, the GPU memory it took on each: `0,1 (3.0 GiB)`;
/// `-` for a CPU replica.
fn replica_gpus(r: &Replica) -> String {
    if r.gpus.is_empty() {
        return "-".into();
    }
    let list: Vec<String> = r.gpus.iter().map(u32::to_string).collect();
    match r.measured_gpu_memory_bytes {
        0 => list.join(","),
        m => format!("{} ({} each)", list.join(","), bytes(m)),
    }
}

/// Replicas with the columns `models get`, `nodes get` and `placements` share.
fn replica_table(replicas: &[Replica], with_reason: bool) -> String {
    let mut header = vec![
        "REPLICA", "MODEL", "VERSION", "NODE", "STATE", "MEMORY", "GPUS",
    ];
    if with_reason {
        header.push("REASON");
    }
    let mut t = Table::new(&header);
    for r in replicas {
        let detail = if r.failure_reason.is_empty() {
            r.placement_reason.clone()
        } else {
            format!("failed: {}", r.failure_reason)
        };
        t.row(vec![
            r.id.to_string(),
            r.model.clone(),
            r.version.to_string(),
            r.node.clone(),
            replica_state(r.state),
            bytes(r.measured_memory_bytes),
            replica_gpus(r),
            detail,
        ]);
    }
    t.render()
}

/// A model's memory per replica as placement counts it: the measured figure where a replica
/// measured one (`24.1 MiB measured`), else the declared one (`16.0 MiB declared`).
fn model_memory(status: &ModelStatus) -> String {
    let declared = status
        .model
        .as_ref()
        .and_then(|m| m.resources)
        .map_or(0, |r| r.memory_bytes);
    match status.measured_memory_bytes {
        0 if declared == 0 => "-".into(),
        0 => format!("{} declared", bytes(declared)),
        measured => format!("{} measured", bytes(measured)),
    }
}

pub fn model_list(response: &ListModelsResponse) -> String {
    let mut t = Table::new(&["NAME", "READY", "WANTED", "VERSIONS", "MEMORY", "SOURCE"]);
    for status in &response.models {
        let Some(m) = &status.model else { continue };
        t.row(vec![
            m.name.clone(),
            format!("{}/{}", status.ready_replicas, status.replicas.len()),
            replicas_wanted(m.min_replicas, m.max_replicas),
            version_policy(m.version_policy.as_ref()),
            model_memory(status),
            m.source.clone(),
        ]);
    }
    t.render()
}

pub fn model(status: &ModelStatus) -> String {
    let mut out = String::new();
    if let Some(m) = &status.model {
        let resources = m.resources.unwrap_or_default();
        out.push_str(&fields(&[
            ("name", m.name.clone()),
            ("source", m.source.clone()),
            ("versions", version_policy(m.version_policy.as_ref())),
            (
                "available",
                m.available_versions
                    .iter()
                    .map(i64::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            ),
            ("traffic", traffic(&m.traffic)),
            ("replicas", replicas_wanted(m.min_replicas, m.max_replicas)),
            ("ready", status.ready_replicas.to_string()),
            ("memory", model_memory(status)),
            (
                "cpu",
                if resources.cpu_millis == 0 {
                    "-".into()
                } else {
                    format!("{}m", resources.cpu_millis)
                },
            ),
            (
                "gpus",
                match resources.gpus {
                    0 => "-".into(),
                    n => format!("{n} x {}", bytes(resources.gpu_memory_bytes)),
                },
            ),
            ("labels", labels(&m.labels)),
            (
                "override",
                if m.config_override.is_empty() {
                    "-".into()
                } else {
                    m.config_override.clone()
                },
            ),
            ("revision", status.revision.to_string()),
        ]));
    }
    out.push('\n');
    out.push_str(&replica_table(&status.replicas, true));
    out
}

fn decision_table(decisions: &[PlacementDecision]) -> String {
    let mut t = Table::new(&[
        "ACTION",
        "VERSION",
        "NODE",
        "REPLICA",
        "MISSING",
        "RULE",
        "EXPLANATION",
    ]);
    for d in decisions {
        t.row(vec![
            d.action.clone(),
            d.version.to_string(),
            if d.node.is_empty() {
                "-".into()
            } else {
                d.node.clone()
            },
            if d.replica == 0 {
                "-".into()
            } else {
                d.replica.to_string()
            },
            if d.missing == 0 {
                "-".into()
            } else {
                d.missing.to_string()
            },
            d.rule.clone(),
            d.explanation.clone(),
        ]);
    }
    t.render()
}

pub fn placement(explanation: &PlacementExplanation) -> String {
    let mut out = format!(
        "model {} (revision {})\n\nReplicas:\n",
        explanation.model, explanation.revision
    );
    out.push_str(&replica_table(&explanation.replicas, true));
    out.push_str("\nPending:\n");
    if explanation.pending.is_empty() {
        out.push_str("settled: placement wants no change\n");
    } else {
        out.push_str(&decision_table(&explanation.pending));
    }
    out.push_str(&super::autoscale::placement_section(explanation));
    out.push_str("\nHistory (newest last):\n");
    if explanation.history.is_empty() {
        out.push_str("no recorded decisions\n");
    }
    for record in &explanation.history {
        out.push_str(&format!(
            "revision {} decided at {}\n",
            record.revision,
            utc(record.decided_at_ms)
        ));
        for input in &record.inputs {
            out.push_str(&format!("  input: {input}\n"));
        }
        for line in decision_table(&record.decisions).lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

fn node_row(status: &NodeStatusResponse) -> Vec<String> {
    let node = status.node.clone().unwrap_or_default();
    let capacity = node.capacity.clone().unwrap_or_default();
    let used = status
        .utilization
        .as_ref()
        .map_or(0, |u| u.memory_used_bytes);
    vec![
        node.id.clone(),
        node_status(node.status).into(),
        if node.drained {
            "yes".into()
        } else {
            "no".into()
        },
        status.replicas.len().to_string(),
        if status.utilization.is_some() {
            format!("{} / {}", bytes(used), bytes(capacity.memory_bytes))
        } else {
            format!("? / {}", bytes(capacity.memory_bytes))
        },
        capacity.gpus.len().to_string(),
        status
            .utilization
            .as_ref()
            .map_or("-".into(), |u| age_ms(u.last_heartbeat_age_ms)),
        node.addresses.map(|a| a.data_grpc).unwrap_or_default(),
    ]
}

const NODE_HEADER: [&str; 8] = [
    "NODE",
    "STATUS",
    "DRAINED",
    "REPLICAS",
    "MEMORY USED/TOTAL",
    "GPUS",
    "HEARTBEAT",
    "GRPC",
];

pub fn node_list(response: &ListNodesResponse) -> String {
    let mut t = Table::new(&NODE_HEADER);
    for n in &response.nodes {
        t.row(node_row(n));
    }
    t.render()
}

pub fn node(status: &NodeStatusResponse) -> String {
    let mut t = Table::new(&NODE_HEADER);
    t.row(node_row(status));
    let mut out = t.render();
    let node = status.node.clone().unwrap_or_default();
    let mut pairs = vec![("labels", labels(&node.labels))];
    if let Some(a) = &node.addresses {
        pairs.push(("http", a.data_http.clone()));
        pairs.push(("agent", a.agent.clone()));
    }
    if let Some(u) = &status.utilization {
        pairs.push(("cpu", format!("{:.0}%", u.cpu * 100.0)));
    }
    pairs.push(("revision", status.revision.to_string()));
    out.push('\n');
    out.push_str(&fields(&pairs));
    out.push('\n');
    out.push_str(&replica_table(&status.replicas, true));
    out
}

pub fn placements(response: &ListPlacementsResponse) -> String {
    replica_table(&response.replicas, false)
}

pub fn cluster(status: &ClusterStatus) -> String {
    let leader = if status.leader_id == 0 {
        "none known".to_string()
    } else {
        format!("{} ({})", status.leader_id, status.leader_address)
    };
    let mut out = fields(&[
        ("answered by", status.node_id.to_string()),
        ("leader", leader),
        ("term", status.term.to_string()),
        ("commit index", status.commit_index.to_string()),
        ("applied index", status.applied_index.to_string()),
        ("revision", status.revision.to_string()),
    ]);
    out.push('\n');
    let mut t = Table::new(&["MEMBER", "ADDRESS", "ROLE"]);
    for m in &status.members {
        let role = match (m.id == status.leader_id, m.voter) {
            (true, _) => "leader",
            (false, true) => "voter",
            (false, false) => "learner",
        };
        t.row(vec![m.id.to_string(), m.address.clone(), role.into()]);
    }
    out.push_str(&t.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_proto::pb::cluster::{Member, Model};

    #[test]
    fn model_list_shows_ready_and_wanted() {
        let response = ListModelsResponse {
            models: vec![ModelStatus {
                model: Some(Model {
                    name: "resnet50".into(),
                    source: "file:///models/resnet50".into(),
                    min_replicas: 2,
                    max_replicas: 2,
                    ..Default::default()
                }),
                replicas: vec![Replica::default(), Replica::default()],
                ready_replicas: 1,
                revision: 7,
                ..Default::default()
            }],
            revision: 7,
        };
        assert_eq!(
            model_list(&response),
            "NAME      READY  WANTED  VERSIONS  MEMORY  SOURCE\n\
             resnet50  1/2    2       latest:1  -       file:///models/resnet50\n"
        );
    }

    #[test]
    fn model_memory_is_the_measured_figure_where_a_replica_measured_one() {
        let mut status = ModelStatus {
            model: Some(Model {
                name: "simple".into(),
                resources: Some(nereid_proto::pb::cluster::Resources {
                    memory_bytes: 16 << 20,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(model_memory(&status), "16.0 MiB declared");
        status.measured_memory_bytes = 24 << 20;
        assert_eq!(model_memory(&status), "24.0 MiB measured");
        let list = model_list(&ListModelsResponse {
            models: vec![status.clone()],
            revision: 1,
        });
        assert!(list.contains("24.0 MiB measured"), "{list}");
        assert!(model(&status).contains("24.0 MiB measured"));
    }

    #[test]
    fn replicas_show_their_gpus() {
        let gpu = Replica {
            id: 4,
            model: "llm".into(),
            version: 1,
            node: "gpu-a".into(),
            gpus: vec![0, 2],
            measured_gpu_memory_bytes: 3 << 30,
            ..Default::default()
        };
        let table = replica_table(&[gpu, Replica::default()], false);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].contains("GPUS"), "{table}");
        assert!(lines[1].contains("0,2 (3.0 GiB each)"), "{table}");
        assert!(lines[2].contains(" - "), "{table}");
    }

    #[test]
    fn cluster_marks_the_leader() {
        let status = ClusterStatus {
            node_id: 2,
            leader_id: 1,
            leader_address: "10.0.0.1:7000".into(),
            term: 3,
            commit_index: 42,
            applied_index: 42,
            members: vec![
                Member {
                    id: 1,
                    address: "10.0.0.1:7000".into(),
                    voter: true,
                },
                Member {
                    id: 4,
                    address: "10.0.0.4:7000".into(),
                    voter: false,
                },
            ],
            revision: 9,
        };
        let text = cluster(&status);
        assert!(
            text.contains("leader:        1 (10.0.0.1:7000)\n"),
            "{text}"
        );
        assert!(text.ends_with("1       10.0.0.1:7000  leader\n4       10.0.0.4:7000  learner\n"));
    }
}
