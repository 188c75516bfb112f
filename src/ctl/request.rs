//! Pure request building: the value parsers behind the flags (sizes, version policies, labels)
//! and the messages `deploy` and `scale` send. No I/O except reading `--config-override @file`.

use std::collections::HashMap;

use nereid_proto::pb::cluster::version_policy::{All, Latest, Policy, Specific};
use nereid_proto::pb::cluster::{
    DeployModelRequest, Model, ReadConsistency, Resources, ScaleModelRequest, SetTrafficRequest,
    VersionPolicy,
};

use super::args::{ConsistencyArg, DeployArgs, ReplicaArgs, ScaleArgs, TrafficArgs};

/// Parses `latest:N`, `all`, or a comma-separated list of version numbers.
pub fn parse_version_policy(text: &str) -> Result<VersionPolicy, String> {
    let t = text.trim();
    let policy = if t.eq_ignore_ascii_case("all") {
        Policy::All(All {})
    } else if let Some(n) = t.strip_prefix("latest:") {
        let num_versions: u32 = n
            .trim()
            .parse()
            .map_err(|_| format!("'{text}': expected latest:N with N a positive integer"))?;
        if num_versions == 0 {
            return Err(format!("'{text}': latest:N needs N >= 1"));
        }
        Policy::Latest(Latest { num_versions })
    } else if t.eq_ignore_ascii_case("latest") {
        Policy::Latest(Latest { num_versions: 1 })
    } else {
        let versions = t
            .split(',')
            .map(|v| {
                v.trim()
                    .parse::<i64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| {
                        format!("'{text}': expected latest:N, all, or versions like 1,3")
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Policy::Specific(Specific { versions })
    };
    Ok(VersionPolicy {
        policy: Some(policy),
    })
}

/// Parses `key=value` (the value may be empty, the key may not).
pub fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("label '{text}' must be key=value")),
    }
}

/// `(min, max)` replicas from `--replicas N` or `--min-replicas/--max-replicas`.
pub fn replica_bounds(args: &ReplicaArgs) -> Result<(u32, u32), String> {
    let (min, max) = match (args.replicas, args.min_replicas, args.max_replicas) {
        (Some(n), _, _) => (n, n),
        (None, Some(min), Some(max)) => (min, max),
        _ => return Err("give --replicas N or both --min-replicas and --max-replicas".into()),
    };
    if min > max {
        return Err(format!(
            "--min-replicas {min} is above --max-replicas {max}"
        ));
    }
    Ok((min, max))
}

/// `--config-override`: inline JSON or `@path`; must be a JSON object.
pub fn config_override(value: &str) -> Result<String, String> {
    let text = match value.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read --config-override file {path}: {e}"))?,
        None => value.to_string(),
    };
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(serde_json::Value::Object(_)) => Ok(text.trim().to_string()),
        Ok(_) => Err("--config-override must be a JSON object".into()),
        Err(e) => Err(format!("--config-override is not valid JSON: {e}")),
    }
}

/// The `DeployModel` request for `ctl models deploy`. Without replica flags the model wants one.
pub fn deploy_request(args: &DeployArgs) -> Result<DeployModelRequest, String> {
    let (min_replicas, max_replicas) =
        if args.replicas.replicas.is_none() && args.replicas.min_replicas.is_none() {
            (1, 1)
        } else {
            replica_bounds(&args.replicas)?
        };
    let config_override = match &args.config_override {
        Some(v) => config_override(v)?,
        None => String::new(),
    };
    let resources = (args.memory.is_some()
        || args.cpu_millis.is_some()
        || args.gpus.is_some()
        || args.gpu_memory.is_some())
    .then(|| Resources {
        cpu_millis: args.cpu_millis.unwrap_or(0),
        memory_bytes: args.memory.unwrap_or(0),
        gpus: args.gpus.unwrap_or(0),
        gpu_memory_bytes: args.gpu_memory.unwrap_or(0),
    });
    let labels: HashMap<String, String> = args.labels.iter().cloned().collect();
    Ok(DeployModelRequest {
        model: Some(Model {
            name: args.name.clone(),
            source: args.source.clone(),
            version_policy: args.versions.clone(),
            config_override,
            min_replicas,
            max_replicas,
            resources,
            labels,
            ..Default::default()
        }),
    })
}

/// The `ScaleModel` request for `ctl models scale`.
pub fn scale_request(args: &ScaleArgs) -> Result<ScaleModelRequest, String> {
    let (min_replicas, max_replicas) = replica_bounds(&args.replicas)?;
    Ok(ScaleModelRequest {
        name: args.name.clone(),
        min_replicas,
        max_replicas,
    })
}

/// The `SetTraffic` request for `ctl models traffic`; a version named twice is refused.
pub fn traffic_request(args: &TrafficArgs) -> Result<SetTrafficRequest, String> {
    let mut weights = HashMap::new();
    for (version, weight) in &args.weights {
        if weights.insert(*version, *weight).is_some() {
            return Err(format!("version {version} is given twice"));
        }
    }
    Ok(SetTrafficRequest {
        name: args.name.clone(),
        weights,
    })
}

/// The wire value of `--consistency`.
pub fn consistency(arg: ConsistencyArg) -> i32 {
    match arg {
        ConsistencyArg::Local => ReadConsistency::Local as i32,
        ConsistencyArg::Linearizable => ReadConsistency::Linearizable as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_policies() {
        let p = |s| parse_version_policy(s).map(|v| v.policy.unwrap());
        assert_eq!(
            p("latest:2"),
            Ok(Policy::Latest(Latest { num_versions: 2 }))
        );
        assert_eq!(p("latest"), Ok(Policy::Latest(Latest { num_versions: 1 })));
        assert_eq!(p("all"), Ok(Policy::All(All {})));
        assert_eq!(
            p("1,3"),
            Ok(Policy::Specific(Specific {
                versions: vec![1, 3]
            }))
        );
        assert!(p("latest:0").is_err());
        assert!(p("latest:x").is_err());
        assert!(p("1,,3").is_err());
        assert!(p("-1").is_err());
    }

    #[test]
    fn labels() {
        assert_eq!(
            parse_label("team=vision"),
            Ok(("team".into(), "vision".into()))
        );
        assert_eq!(parse_label("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_label("empty="), Ok(("empty".into(), String::new())));
        assert!(parse_label("novalue").is_err());
        assert!(parse_label("=v").is_err());
    }

    fn replicas(r: Option<u32>, min: Option<u32>, max: Option<u32>) -> ReplicaArgs {
        ReplicaArgs {
            replicas: r,
            min_replicas: min,
            max_replicas: max,
        }
    }

    #[test]
    fn replica_flags() {
        assert_eq!(replica_bounds(&replicas(Some(3), None, None)), Ok((3, 3)));
        assert_eq!(
            replica_bounds(&replicas(None, Some(1), Some(4))),
            Ok((1, 4))
        );
        assert!(replica_bounds(&replicas(None, Some(5), Some(4))).is_err());
        assert!(replica_bounds(&replicas(None, None, None)).is_err());
    }

    #[test]
    fn deploy_builds_the_model() {
        let args = DeployArgs {
            name: "resnet".into(),
            source: "file:///models/resnet".into(),
            replicas: replicas(None, Some(2), Some(4)),
            versions: Some(parse_version_policy("latest:2").unwrap()),
            memory: Some(2 << 30),
            cpu_millis: Some(500),
            gpus: Some(2),
            gpu_memory: Some(3 << 30),
            config_override: Some(r#"{"max_batch_size": 8}"#.into()),
            labels: vec![("team".into(), "vision".into())],
            wait: crate::ctl::args::WaitArgs {
                wait: false,
                timeout: 300,
            },
        };
        let model = deploy_request(&args).unwrap().model.unwrap();
        assert_eq!(model.name, "resnet");
        assert_eq!((model.min_replicas, model.max_replicas), (2, 4));
        let resources = model.resources.unwrap();
        assert_eq!(resources.memory_bytes, 2 << 30);
        assert_eq!(resources.cpu_millis, 500);
        assert_eq!((resources.gpus, resources.gpu_memory_bytes), (2, 3 << 30));
        assert_eq!(model.labels["team"], "vision");
        assert_eq!(model.config_override, r#"{"max_batch_size": 8}"#);

        let bare = DeployArgs {
            replicas: replicas(None, None, None),
            versions: None,
            memory: None,
            cpu_millis: None,
            gpus: None,
            gpu_memory: None,
            config_override: None,
            labels: vec![],
            ..args
        };
        let model = deploy_request(&bare).unwrap().model.unwrap();
        assert_eq!((model.min_replicas, model.max_replicas), (1, 1));
        assert!(model.resources.is_none() && model.version_policy.is_none());
    }

    #[test]
    fn config_override_must_be_an_object() {
        assert!(config_override("[1]").is_err());
        assert!(config_override("{oops").is_err());
        let dir = std::env::temp_dir().join(format!("nereid-ctl-{}", std::process::id()));
        std::fs::write(&dir, "{\"a\": 1}\n").unwrap();
        assert_eq!(
            config_override(&format!("@{}", dir.display())),
            Ok("{\"a\": 1}".to_string())
        );
        let _ = std::fs::remove_file(&dir);
        assert!(config_override("@/nonexistent/nereid").is_err());
    }
}
