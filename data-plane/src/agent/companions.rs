//! Ensembles on a worker: an ensemble runs its steps on composing models loaded on the same
//! data plane, so a worker assigned an ensemble also links the composing models (from the
//! cluster's catalog of registered models) into its repository; the data plane's explicit load
//! of the ensemble then loads them first. Composing models that only an ensemble brought are
//! unloaded with it; models the control plane assigned directly are never touched.
//!
//! ```text
//!  load E ─► link E ─► read E's config ─► for each step model M (nested ensembles too):
//!             catalog[M] = file:///src ─► link M          (not registered: left to the load error)
//!  unload E ─► unload E ─► for each M brought by E, not assigned here, not used by another
//!              ensemble still loaded ─► unload M, unlink M
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::source;
use crate::config;
use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::pb::inference::model_config::SchedulingChoice;

/// Nested ensembles deeper than this are not followed (the data plane refuses cycles anyway).
const MAX_DEPTH: usize = 8;

/// The composing models of `config` (and of composing ensembles, recursively) that the catalog
/// knows, linked into `repository`; returns their names. `catalog` maps model name → source URI.
pub fn link_composing(
    repository: &Path,
    config: &ModelConfig,
    catalog: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    let mut linked = BTreeSet::new();
    let mut pending: Vec<(String, usize)> =
        step_models(config).into_iter().map(|m| (m, 1)).collect();
    while let Some((name, depth)) = pending.pop() {
        if linked.contains(&name) || depth > MAX_DEPTH || name == config.name {
            continue;
        }
        let Some(uri) = catalog.get(&name) else {
            tracing::warn!(model = %name, ensemble = %config.name,
                "composing model is not registered in the cluster; the ensemble will not load");
            continue;
        };
        let dir = match source::source_dir(uri) {
            Ok(dir) => dir,
            Err(e) => {
                tracing::warn!(model = %name, error = %e, "cannot use composing model source");
                continue;
            }
        };
        if let Err(e) = source::link_model(repository, &name, &dir) {
            tracing::warn!(model = %name, error = %e, "cannot link composing model");
            continue;
        }
        if let Ok(nested) = config::read_config_file(&dir) {
            pending.extend(step_models(&nested).into_iter().map(|m| (m, depth + 1)));
        }
        linked.insert(name);
    }
    linked
}

/// The model names an ensemble's steps call; empty for any other model.
pub fn step_models(config: &ModelConfig) -> BTreeSet<String> {
    match &config.scheduling_choice {
        Some(SchedulingChoice::EnsembleScheduling(e)) => {
            e.step.iter().map(|s| s.model_name.clone()).collect()
        }
        _ => BTreeSet::new(),
    }
}

/// Which companions of `ensemble` may go when it unloads: not assigned to this node directly and
/// not brought by another ensemble that stays.
pub fn releasable(
    ensemble: &str,
    brought: &BTreeMap<String, BTreeSet<String>>,
    assigned: &BTreeSet<String>,
) -> BTreeSet<String> {
    let Some(mine) = brought.get(ensemble) else {
        return BTreeSet::new();
    };
    let kept: BTreeSet<&String> = brought
        .iter()
        .filter(|(e, _)| e.as_str() != ensemble)
        .flat_map(|(_, models)| models)
        .collect();
    mine.iter()
        .filter(|m| !assigned.contains(*m) && !kept.contains(m))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_proto::pb::inference::{ModelEnsembling, model_ensembling::Step};

    fn ensemble(name: &str, steps: &[&str]) -> ModelConfig {
        ModelConfig {
            name: name.into(),
            platform: "ensemble".into(),
            scheduling_choice: Some(SchedulingChoice::EnsembleScheduling(ModelEnsembling {
                step: steps
                    .iter()
                    .map(|m| Step {
                        model_name: m.to_string(),
                        model_version: -1,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn composing_models_are_linked_from_the_catalog_nested_ones_too() {
        let root = tempfile::tempdir().unwrap();
        let repo = root.path().join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        let src = |name: &str, config: &str| {
            let dir = root.path().join("src").join(name);
            std::fs::create_dir_all(dir.join("1")).unwrap();
            std::fs::write(dir.join("config.pbtxt"), config).unwrap();
            format!("file://{}", dir.display())
        };
        let catalog: BTreeMap<String, String> = [
            (
                "a".to_string(),
                src("a", "name: \"a\"\nbackend: \"identity\"\n"),
            ),
            (
                "inner".to_string(),
                src(
                    "inner",
                    "name: \"inner\"\nplatform: \"ensemble\"\nensemble_scheduling { step [ { \
                     model_name: \"b\" model_version: -1 } ] }\n",
                ),
            ),
            (
                "b".to_string(),
                src("b", "name: \"b\"\nbackend: \"identity\"\n"),
            ),
        ]
        .into();
        let outer = ensemble("outer", &["a", "inner", "missing"]);
        let linked = link_composing(&repo, &outer, &catalog);
        assert_eq!(linked, set(&["a", "b", "inner"]));
        for name in ["a", "b", "inner"] {
            assert!(
                repo.join(name).join("config.pbtxt").exists(),
                "{name} linked"
            );
        }
        assert!(!repo.join("missing").exists());
        assert!(step_models(&ModelConfig::default()).is_empty());
    }

    #[test]
    fn only_companions_nobody_else_needs_are_released() {
        let brought: BTreeMap<String, BTreeSet<String>> = [
            ("e1".to_string(), set(&["a", "b", "c"])),
            ("e2".to_string(), set(&["b"])),
        ]
        .into();
        let assigned = set(&["c", "e1", "e2"]);
        assert_eq!(releasable("e1", &brought, &assigned), set(&["a"]));
        assert!(releasable("unknown", &brought, &assigned).is_empty());
    }
}
