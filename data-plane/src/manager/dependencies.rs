//! How models depend on each other through ensembles, as the manager needs it: the order in
//! which startup and poll load a set of models, the view of the other models an ensemble is
//! built against, and whether a served ensemble has what it needs right now.
//!
//! ```text
//! composing models of each model to load (config.pbtxt) ─► load_order:
//!     ensembles on a cycle ─► fail at once ("circular dependency between ensembles: a -> b -> a")
//!     the rest ─► waves: a model loads in a wave after every model it names
//! ensemble build ─► ModelsView::config(step model, version) ─► composing config, or why not
//! served ensemble (index, readiness, requests) ─► unavailable_reason: every step's model
//!     served and healthy, through nested ensembles
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::config::ValidModelConfig;

use super::{LoadedVersion, ModelEntry};
use crate::ensemble::EnsemblePlan;

/// The order to load a set of models in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoadOrder {
    /// Ensembles on a dependency cycle and the cycle (`a -> b -> a`): they cannot load.
    pub cyclic: Vec<(String, String)>,
    /// Waves loaded one after the other; the models of a wave load together. A model comes in
    /// a later wave than every model of the set it names as a composing model.
    pub waves: Vec<Vec<String>>,
}

/// Orders the models of `composing` (model -> the composing models its steps name; empty for
/// models that are not ensembles). Names outside the set are taken as loaded already.
pub fn load_order(composing: &BTreeMap<String, Vec<String>>) -> LoadOrder {
    let cyclic: Vec<(String, String)> = composing
        .keys()
        .filter_map(|name| path_back(composing, name).map(|p| (name.clone(), p.join(" -> "))))
        .collect();
    let blocked: BTreeSet<&str> = cyclic.iter().map(|(n, _)| n.as_str()).collect();
    let mut placed: BTreeSet<&str> = BTreeSet::new();
    let mut left: Vec<&str> = composing
        .keys()
        .map(String::as_str)
        .filter(|n| !blocked.contains(n))
        .collect();
    let mut waves = Vec::new();
    while !left.is_empty() {
        let waits = |name: &str| {
            composing[name].iter().any(|d| {
                composing.contains_key(d)
                    && !blocked.contains(d.as_str())
                    && !placed.contains(d.as_str())
            })
        };
        let (wave, rest): (Vec<&str>, Vec<&str>) = left.iter().partition(|n| !waits(n));
        if wave.is_empty() {
            // Only possible on a cycle, and cycles were taken out; load the rest regardless.
            waves.push(rest.iter().map(|n| n.to_string()).collect());
            break;
        }
        placed.extend(wave.iter().copied());
        waves.push(wave.iter().map(|n| n.to_string()).collect());
        left = rest;
    }
    LoadOrder { cyclic, waves }
}

/// A path `start -> ... -> start` through composing models of the set, if there is one.
fn path_back(composing: &BTreeMap<String, Vec<String>>, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![vec![start.to_string()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = &path[path.len() - 1];
        for next in composing.get(last).into_iter().flatten().rev() {
            let mut longer = path.clone();
            longer.push(next.clone());
            if next == start {
                return Some(longer);
            }
            if composing.contains_key(next) && seen.insert(next.clone()) {
                stack.push(longer);
            }
        }
    }
    None
}

/// What an ensemble's build sees of the other models: the configs of their served versions,
/// or why none is served. Taken from the manager's map before the build, which then runs on a
/// blocking thread without any lock.
#[derive(Clone, Debug, Default)]
pub struct ModelsView {
    models: BTreeMap<String, Result<BTreeMap<i64, Arc<ValidModelConfig>>, String>>,
    /// The explicit loads that led to this build, outermost first, this model last: any of
    /// them as a composing model is a circular dependency.
    chain: Vec<String>,
}

impl ModelsView {
    /// `models`: every known model, with its served versions' configs or why it has none.
    pub fn new(
        models: BTreeMap<String, Result<BTreeMap<i64, Arc<ValidModelConfig>>, String>>,
        chain: Vec<String>,
    ) -> ModelsView {
        ModelsView { models, chain }
    }

    /// The config of `name` (`version`, or its latest served version), or why it cannot be a
    /// composing model now.
    pub fn config(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> Result<Arc<ValidModelConfig>, String> {
        if let Some(p) = self.chain.iter().position(|c| c == name) {
            let mut path = self.chain[p..].to_vec();
            path.push(name.to_string());
            return Err(format!(
                "circular dependency between ensembles: {}",
                path.join(" -> ")
            ));
        }
        // A bare name may still mean one namespaced model (`--model-namespacing`).
        let matching = crate::repository::namespace::matching(name, self.models.keys());
        let key = match matching.as_slice() {
            [one] => one.as_str(),
            [] => name,
            many => {
                return Err(crate::repository::namespace::ambiguity(name, many.len()));
            }
        };
        let versions = match self.models.get(key) {
            None => return Err("it is not in the model repository".to_string()),
            Some(Err(why)) => return Err(why.clone()),
            Some(Ok(versions)) => versions,
        };
        match version {
            None => versions
                .values()
                .next_back()
                .cloned()
                .ok_or_else(|| "it has no served version".to_string()),
            Some(v) => versions.get(&v).cloned().ok_or_else(|| {
                let served: Vec<String> = versions.keys().map(i64::to_string).collect();
                format!("version {v} is not served (served: {})", served.join(", "))
            }),
        }
    }
}

/// The plans of a model's served ensemble versions (none for other models).
pub(super) fn ensemble_plans(entry: &ModelEntry) -> impl Iterator<Item = &Arc<EnsemblePlan>> {
    entry.versions.values().filter_map(|lv| lv.plan())
}

/// Why `loaded` cannot take requests now: an instance recovering from a crash, or (through
/// nested ensembles) a composing model with no served version of the one a step names.
pub(super) fn unavailable_reason(
    models: &BTreeMap<String, ModelEntry>,
    loaded: &LoadedVersion,
) -> Option<String> {
    if let Some(reason) = loaded.health.unavailable_reason() {
        return Some(reason);
    }
    let mut pending: Vec<&Arc<EnsemblePlan>> = loaded.plan().into_iter().collect();
    let mut seen = vec![loaded.name.as_str()];
    while let Some(plan) = pending.pop() {
        for step in &plan.steps {
            let served = models
                .get(&step.model)
                .and_then(|entry| match step.version {
                    None => entry.versions.values().next_back(),
                    Some(v) => entry.versions.get(&v),
                });
            let Some(composing) = served else {
                let version = step
                    .version
                    .map_or(String::new(), |v| format!(" version {v}"));
                return Some(format!(
                    "composing model '{}'{version} of ensemble '{}' is not loaded",
                    step.model, plan.name
                ));
            };
            if let Some(reason) = composing.health.unavailable_reason() {
                return Some(format!(
                    "composing model '{}' of ensemble '{}' is unavailable: {reason}",
                    step.model, plan.name
                ));
            }
            if let Some(inner) = composing.plan()
                && !seen.contains(&inner.name.as_str())
            {
                seen.push(&inner.name);
                pending.push(inner);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_proto::pb::inference::ModelConfig;

    fn graph(edges: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        edges
            .iter()
            .map(|(n, d)| (n.to_string(), d.iter().map(|s| s.to_string()).collect()))
            .collect()
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn ensembles_load_after_their_composing_models() {
        // `a_pipeline` sorts first but needs `z_model`; `outer` nests `a_pipeline`; `ghost` is
        // not in the set (loaded already, or missing: the build says which).
        let order = load_order(&graph(&[
            ("a_pipeline", &["z_model", "m"]),
            ("m", &[]),
            ("outer", &["a_pipeline", "ghost"]),
            ("z_model", &[]),
        ]));
        assert!(order.cyclic.is_empty());
        assert_eq!(
            order.waves,
            vec![
                names(&["m", "z_model"]),
                names(&["a_pipeline"]),
                names(&["outer"])
            ]
        );
    }

    #[test]
    fn cycles_are_named_and_kept_out_of_the_waves() {
        let order = load_order(&graph(&[
            ("e1", &["e2"]),
            ("e2", &["e1", "m"]),
            ("m", &[]),
            ("me", &["me"]),
            ("uses_cycle", &["e1"]),
        ]));
        assert_eq!(
            order.cyclic,
            vec![
                ("e1".to_string(), "e1 -> e2 -> e1".to_string()),
                ("e2".to_string(), "e2 -> e1 -> e2".to_string()),
                ("me".to_string(), "me -> me".to_string()),
            ]
        );
        // `uses_cycle` still loads (after the cyclic ones failed) and reports its composing
        // model as unavailable.
        assert_eq!(order.waves, vec![names(&["m", "uses_cycle"])]);
    }

    #[test]
    fn the_view_says_why_a_model_cannot_be_used() {
        let config = |n: &str| {
            Arc::new(ValidModelConfig::unchecked(ModelConfig {
                name: n.into(),
                ..Default::default()
            }))
        };
        let mut models = BTreeMap::new();
        models.insert(
            "m".to_string(),
            Ok(BTreeMap::from([(1, config("m1")), (3, config("m3"))])),
        );
        models.insert(
            "broken".to_string(),
            Err("it failed to load: bad".to_string()),
        );
        let view = ModelsView::new(models, names(&["outer", "inner"]));
        assert_eq!(view.config("m", None).unwrap().name, "m3");
        assert_eq!(view.config("m", Some(1)).unwrap().name, "m1");
        assert_eq!(
            view.config("m", Some(2)).unwrap_err(),
            "version 2 is not served (served: 1, 3)"
        );
        assert_eq!(
            view.config("broken", None).unwrap_err(),
            "it failed to load: bad"
        );
        assert_eq!(
            view.config("ghost", None).unwrap_err(),
            "it is not in the model repository"
        );
        assert_eq!(
            view.config("outer", None).unwrap_err(),
            "circular dependency between ensembles: outer -> inner -> outer"
        );
    }
}
