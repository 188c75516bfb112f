//! Ensembles on a worker: an ensemble runs its steps on composing models loaded on the same
//! data plane, so a worker assigned an ensemble also links the composing models (from the
//! cluster's catalog of registered models) into its repository; the data plane's explicit load
//! of the ensemble then loads them first. Composing models that only an ensemble brought are
//! unloaded with it; models the control plane assigned directly are never touched.
//!
//! ```text
//!  load E ─► link E ─► read E's config ─► for each step model M (nested ensembles too):
//!             catalog[M] = file:///src ─────────────────────────► link M
//!             catalog[M] = s3:// gs:// as:// ─► mirror into the ─► link M
//!                                               model cache
//!             not registered, or its source unusable ─► a problem, added to E's load error
//!  unload E ─► unload E ─► for each M brought by E, not assigned here, not used by another
//!              ensemble still loaded ─► unload M, unlink M
//! ```
//!
//! A composing model's source is resolved exactly as a directly assigned model's is
//! ([`source::fetch_source`]): object-store folders are brought up to date in
//! `<work-dir>/model-cache/` before the ensemble loads.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};

use super::source;
use nereid_data_plane::config;
use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::pb::inference::model_config::SchedulingChoice;

/// Nested ensembles deeper than this are not followed (the data plane refuses cycles anyway).
const MAX_DEPTH: usize = 8;

/// What linking an ensemble's composing models did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Companions {
    /// The composing models now linked into the repository.
    pub linked: BTreeSet<String>,
    /// One line per composing model that could not be linked, naming it and why; the
    /// ensemble's load fails on such a model, and these say what to fix.
    pub problems: Vec<String>,
}

/// The composing models of `config` (and of composing ensembles, recursively) that the catalog
/// knows, fetched from their sources (object-store folders mirrored beside `repository`, like
/// a directly assigned model's) and linked into `repository`. `catalog` maps model name →
/// source URI.
pub async fn link_composing(
    repository: &Path,
    config: &ModelConfig,
    catalog: &BTreeMap<String, String>,
) -> Companions {
    let cache = source::cache_dir(repository);
    link_with(repository, config, catalog, |uri| {
        let cache = cache.clone();
        async move { source::fetch_source(&uri, &cache).await }
    })
    .await
}

/// [`link_composing`] with the source resolution given: `resolve(uri)` is the local
/// directory of a source URI.
async fn link_with<F, Fut>(
    repository: &Path,
    config: &ModelConfig,
    catalog: &BTreeMap<String, String>,
    resolve: F,
) -> Companions
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = Result<PathBuf, String>>,
{
    let mut done = Companions::default();
    let mut seen = BTreeSet::new();
    let mut pending: Vec<(String, usize)> =
        step_models(config).into_iter().map(|m| (m, 1)).collect();
    while let Some((name, depth)) = pending.pop() {
        if depth > MAX_DEPTH || name == config.name || !seen.insert(name.clone()) {
            continue;
        }
        let Some(uri) = catalog.get(&name) else {
            tracing::warn!(model = %name, ensemble = %config.name,
                "composing model is not registered in the cluster; the ensemble will not load");
            done.problems.push(format!(
                "composing model '{name}' is not registered in the cluster"
            ));
            continue;
        };
        let linked = match resolve(uri.clone()).await {
            Ok(dir) => source::link_model(repository, &name, &dir).map(|()| dir),
            Err(e) => Err(e),
        };
        let dir = match linked {
            Ok(dir) => dir,
            Err(e) => {
                tracing::warn!(model = %name, source = %uri, error = %e,
                    "cannot use composing model source");
                done.problems
                    .push(format!("composing model '{name}' (source '{uri}'): {e}"));
                continue;
            }
        };
        if let Ok(nested) = config::read_config_file(&dir, None) {
            pending.extend(step_models(&nested).into_iter().map(|m| (m, depth + 1)));
        }
        done.linked.insert(name);
    }
    done
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
    use std::sync::Arc;

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

    #[tokio::test]
    async fn composing_models_are_linked_from_the_catalog_nested_ones_too() {
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
        let done = link_composing(&repo, &outer, &catalog).await;
        assert_eq!(done.linked, set(&["a", "b", "inner"]));
        assert_eq!(
            done.problems,
            ["composing model 'missing' is not registered in the cluster"]
        );
        for name in ["a", "b", "inner"] {
            assert!(
                repo.join(name).join("config.pbtxt").exists(),
                "{name} linked"
            );
        }
        assert!(!repo.join("missing").exists());
        assert!(step_models(&ModelConfig::default()).is_empty());
    }

    /// Composing models whose sources are object-store folders are mirrored like a directly
    /// assigned model's source (here from object_store's in-memory store), then linked; a
    /// nested ensemble's own composing models are read from its mirrored config.
    #[tokio::test]
    async fn object_store_companions_are_mirrored_then_linked() {
        use nereid_remote_repository::{Mirror, RepositoryUrl, Scope};
        use object_store::{ObjectStore, PutPayload, memory::InMemory, path::Path as Key};

        let store = Arc::new(InMemory::new());
        let objects = [
            (
                "repo/a/config.pbtxt",
                "name: \"a\"\nbackend: \"identity\"\n",
            ),
            ("repo/a/1/model.bin", "a-weights"),
            (
                "repo/inner/config.pbtxt",
                "name: \"inner\"\nplatform: \"ensemble\"\nensemble_scheduling { step [ { \
                 model_name: \"b\" model_version: -1 } ] }\n",
            ),
            ("repo/inner/1/.keep", ""),
            (
                "repo/b/config.pbtxt",
                "name: \"b\"\nbackend: \"identity\"\n",
            ),
            ("repo/b/2/model.bin", "b-weights"),
        ];
        for (key, body) in objects {
            let payload = PutPayload::from(body.as_bytes().to_vec());
            store.put(&Key::from(key), payload).await.unwrap();
        }
        let root = tempfile::tempdir().unwrap();
        let repo = root.path().join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        let url = RepositoryUrl::parse("s3://bucket/repo").unwrap();
        let mirror = Mirror::with_store(store, url, root.path().join("cache"));
        let fetched = std::sync::Mutex::new(Vec::new());
        let resolve = |uri: String| {
            let (mirror, fetched) = (&mirror, &fetched);
            async move {
                fetched.lock().unwrap().push(uri.clone());
                let (_, model) = RepositoryUrl::split_model(&uri).map_err(|e| e.to_string())?;
                mirror
                    .sync(Scope::Model(&model))
                    .await
                    .map_err(|e| e.to_string())?;
                let dir = mirror.local_dir().join(&model);
                if dir.is_dir() {
                    Ok(dir)
                } else {
                    Err(format!("source '{uri}': the store has no objects under it"))
                }
            }
        };
        let catalog: BTreeMap<String, String> = ["a", "inner", "b", "gone"]
            .into_iter()
            .map(|m| (m.to_string(), format!("s3://bucket/repo/{m}")))
            .collect();
        let outer = ensemble("outer", &["a", "inner", "gone"]);
        let done = link_with(&repo, &outer, &catalog, resolve).await;
        assert_eq!(done.linked, set(&["a", "b", "inner"]));
        assert_eq!(
            done.problems,
            [
                "composing model 'gone' (source 's3://bucket/repo/gone'): source \
              's3://bucket/repo/gone': the store has no objects under it"
            ]
        );
        let mut fetched = fetched.into_inner().unwrap();
        fetched.sort();
        assert_eq!(
            fetched.len(),
            4,
            "every companion resolved once: {fetched:?}"
        );
        assert_eq!(
            std::fs::read_to_string(repo.join("a").join("1").join("model.bin")).unwrap(),
            "a-weights"
        );
        assert_eq!(
            std::fs::read_link(repo.join("b")).unwrap(),
            mirror.local_dir().join("b")
        );
        assert!(repo.join("b").join("2").join("model.bin").is_file());
        assert!(repo.join("inner").join("1").is_dir());
        assert!(!repo.join("gone").exists());
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
