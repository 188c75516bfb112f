//! ONNX Runtime session options from a model config, with Triton's ORT backend's keys.
//!
//! | Config                                   | Session option                                    |
//! |------------------------------------------|---------------------------------------------------|
//! | `parameters` `intra_op_thread_count`     | threads inside one operator; `0` = ORT decides     |
//! | `parameters` `inter_op_thread_count`     | threads across operators (parallel mode only)     |
//! | `parameters` `execution_mode`            | `0` sequential (default), `1` parallel            |
//! | `parameters` `enable_mem_arena`          | CPU arena allocator on/off (`1`/`0`, `true`/...)  |
//! | `parameters` `enable_mem_pattern`        | memory pattern optimisation on/off                |
//! | `optimization { graph { level } }`       | see [`graph_level`]                               |
//!
//! Default intra-op threads (no parameter): Triton leaves it to ORT, which starts one thread per
//! core *per session*. Every instance owns a session, so on a small box (2 cores, Triton's
//! default of 2 CPU instances) that oversubscribes the cores. Nereid instead gives each session
//! `max(1, cores / instances of the model)` threads; set `intra_op_thread_count` to override
//! (`0` restores ORT's choice).

use ort::session::builder::GraphOptimizationLevel;

use crate::backend::params::{boolean, non_negative, param};
use crate::config::ValidModelConfig;

/// The session options one model's instances use.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct SessionSettings {
    /// `None`: let ONNX Runtime decide.
    pub intra_threads: Option<usize>,
    pub inter_threads: Option<usize>,
    pub parallel: bool,
    pub level: GraphOptimizationLevel,
    pub mem_arena: Option<bool>,
    pub mem_pattern: Option<bool>,
    /// ONNX Runtime session config entries given as parameters whose key starts with
    /// `session.` (e.g. `session.intra_op.allow_spinning`), passed through as they are.
    pub config_entries: Vec<(String, String)>,
}

/// Reads the settings; `Err` names the parameter and what it must be.
pub(crate) fn session_settings(
    config: &ValidModelConfig,
    cores: usize,
) -> Result<SessionSettings, String> {
    let params = &config.parameters;
    let intra_threads = match non_negative(params, "intra_op_thread_count")? {
        None => Some(default_intra_threads(config, cores)),
        Some(0) => None,
        Some(n) => Some(n),
    };
    let inter_threads = non_negative(params, "inter_op_thread_count")?.filter(|&n| n > 0);
    let parallel = match param(params, "execution_mode") {
        None => false,
        Some("0") => false,
        Some("1") => true,
        Some(other) => {
            return Err(format!(
                "parameter 'execution_mode' must be 0 (sequential) or 1 (parallel), got '{other}'"
            ));
        }
    };
    let level = graph_level(config.graph_level)?;
    Ok(SessionSettings {
        intra_threads,
        inter_threads,
        parallel,
        level,
        mem_arena: boolean(params, "enable_mem_arena")?,
        mem_pattern: boolean(params, "enable_mem_pattern")?,
        config_entries: params
            .iter()
            .filter(|(k, _)| k.starts_with("session."))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    })
}

/// Triton's ORT backend mapping of `optimization.graph.level` (its README and `onnxruntime.cc`):
/// `-1` → basic only (ORT_ENABLE_BASIC), `1` → basic + extended (ORT_ENABLE_EXTENDED),
/// `2` → all disabled (ORT_DISABLE_ALL), `0` or absent → everything (ORT_ENABLE_ALL).
/// Triton silently treats other values as 0; Nereid refuses them so a typo is noticed.
pub(crate) fn graph_level(level: i32) -> Result<GraphOptimizationLevel, String> {
    match level {
        0 => Ok(GraphOptimizationLevel::All),
        -1 => Ok(GraphOptimizationLevel::Level1),
        1 => Ok(GraphOptimizationLevel::Level2),
        2 => Ok(GraphOptimizationLevel::Disable),
        other => Err(format!(
            "optimization.graph.level must be -1 (basic), 0 (all, default), 1 (extended) or 2 (disabled), got {other}"
        )),
    }
}

/// Total instances of the model, to share the cores between their sessions.
fn default_intra_threads(config: &ValidModelConfig, cores: usize) -> usize {
    let instances: usize = config
        .instance_groups
        .iter()
        .map(|g| g.count as usize)
        .sum();
    (cores / instances.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{GroupKind, InstanceGroup};

    use crate::backend::params::config_with as with;

    #[test]
    fn defaults_share_cores_between_instances() {
        let mut c = with(&[]);
        let s = session_settings(&c, 2).unwrap();
        assert_eq!(s.intra_threads, Some(2));
        assert_eq!(
            (s.inter_threads, s.parallel, s.level),
            (None, false, GraphOptimizationLevel::All)
        );
        let group = |count| InstanceGroup {
            name: "g".into(),
            count,
            kind: GroupKind::Cpu,
            resources: Vec::new(),
            priority: 0,
        };
        c.instance_groups.push(group(2));
        assert_eq!(session_settings(&c, 2).unwrap().intra_threads, Some(1));
        c.instance_groups.push(group(3));
        assert_eq!(session_settings(&c, 2).unwrap().intra_threads, Some(1));
    }

    #[test]
    fn parameters_are_parsed() {
        let c = with(&[
            ("intra_op_thread_count", "0"),
            ("inter_op_thread_count", "3"),
            ("execution_mode", "1"),
            ("enable_mem_arena", "OFF"),
            ("enable_mem_pattern", "true"),
        ]);
        let s = session_settings(&c, 2).unwrap();
        assert_eq!(
            (s.intra_threads, s.inter_threads, s.parallel),
            (None, Some(3), true)
        );
        assert_eq!((s.mem_arena, s.mem_pattern), (Some(false), Some(true)));
        assert_eq!(
            session_settings(&with(&[("intra_op_thread_count", "4")]), 2)
                .unwrap()
                .intra_threads,
            Some(4)
        );
    }

    #[test]
    fn bad_values_name_the_parameter() {
        for (key, value, needle) in [
            (
                "intra_op_thread_count",
                "-1",
                "parameter 'intra_op_thread_count' must be a non-negative integer, got '-1'",
            ),
            (
                "inter_op_thread_count",
                "x",
                "parameter 'inter_op_thread_count'",
            ),
            (
                "execution_mode",
                "2",
                "parameter 'execution_mode' must be 0 (sequential) or 1 (parallel), got '2'",
            ),
            (
                "enable_mem_arena",
                "maybe",
                "parameter 'enable_mem_arena' must be a boolean",
            ),
        ] {
            let err = session_settings(&with(&[(key, value)]), 2).unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn graph_levels_follow_triton() {
        let level = |l| {
            let mut c = with(&[]);
            c.graph_level = l;
            session_settings(&c, 1).map(|s| s.level)
        };
        assert_eq!(level(0), Ok(GraphOptimizationLevel::All));
        assert_eq!(level(-1), Ok(GraphOptimizationLevel::Level1));
        assert_eq!(level(1), Ok(GraphOptimizationLevel::Level2));
        assert_eq!(level(2), Ok(GraphOptimizationLevel::Disable));
        assert!(
            level(3)
                .unwrap_err()
                .contains("optimization.graph.level must be")
        );
    }
}
