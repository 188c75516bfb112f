//! Poll mode (`--model-control-mode=poll`): one pass over the repositories that brings the
//! served models in line with the files.
//!
//! ```text
//! synced_scan ─► models gone from the repository (and not overridden): unload, forget
//!             ─► new models, and models whose directory fingerprint changed: to load
//!             ─► ensembles (served, or on disk) that read a touched model, through nested
//!                ensembles: to load again
//!             ─► load_in_order (composing models first, in waves)
//! ```

use std::collections::{BTreeMap, BTreeSet};

use nereid_proto::ServiceError;

use super::ModelManager;
use super::dependencies::ensemble_plans;
use crate::config;
use crate::repository::Fingerprint;

impl ModelManager {
    /// Poll mode: loads new and changed models, unloads removed ones. Unchanged models are not
    /// touched; changed ones keep serving their old versions while the new ones load. Ensembles
    /// reading a changed or removed model are rebuilt too (they may load now, or report the
    /// model they miss).
    pub async fn poll_once(&self) -> Result<(), ServiceError> {
        let scan = self.synced_scan(None).await?;
        let known: Vec<(String, Option<Fingerprint>, bool)> = self
            .models
            .read()
            .iter()
            .map(|(n, e)| (n.clone(), e.fingerprint, e.overridden.is_some()))
            .collect();
        let mut touched: BTreeSet<String> = BTreeSet::new();
        for (name, _, overridden) in &known {
            let gone = !scan.models.contains_key(name) && !scan.duplicates.contains_key(name);
            if gone && !overridden {
                tracing::info!(model = %name, "model removed from the repository");
                let _ = self.unload(name).await;
                self.models.write().remove(name);
                touched.insert(name.clone());
            }
        }
        let mut to_load: BTreeSet<String> = BTreeSet::new();
        for (name, dir) in &scan.models {
            let previous = known.iter().find(|(n, _, _)| n == name);
            let changed = match previous {
                None => true,
                Some((_, _, true)) => false,
                Some((_, fp, false)) => *fp != Some(Fingerprint::of(&dir.path)),
            };
            if changed {
                to_load.insert(name.clone());
            }
        }
        for name in scan.duplicates.keys() {
            if !known.iter().any(|(n, _, _)| n == name) {
                to_load.insert(name.clone());
            }
        }
        touched.extend(to_load.iter().cloned());
        if touched.is_empty() {
            return Ok(());
        }
        // Served ensembles whose steps run on a touched model: with namespacing a step may
        // now mean a model of another namespace.
        let served: Vec<String> = self
            .models
            .read()
            .iter()
            .filter(|(name, entry)| {
                scan.models.contains_key(*name)
                    && !touched.contains(*name)
                    && ensemble_plans(entry)
                        .any(|p| p.steps.iter().any(|s| touched.contains(&s.model)))
            })
            .map(|(name, _)| name.clone())
            .collect();
        touched.extend(served.iter().cloned());
        to_load.extend(served);
        // Ensembles on disk that read a touched model, directly or through other ensembles.
        let composing: BTreeMap<&String, Vec<String>> = scan
            .models
            .iter()
            .filter_map(|(name, dir)| {
                let config = config::read_config_file(&dir.path, self.config_name()).ok()?;
                Some((name, self.composing_of(name, &config, &scan)))
            })
            .filter(|(_, steps)| !steps.is_empty())
            .collect();
        loop {
            let more: Vec<String> = composing
                .iter()
                .filter(|(name, steps)| {
                    !touched.contains(name.as_str()) && steps.iter().any(|s| touched.contains(s))
                })
                .map(|(name, _)| name.to_string())
                .collect();
            if more.is_empty() {
                break;
            }
            touched.extend(more.iter().cloned());
            to_load.extend(more);
        }
        self.load_in_order(&scan, to_load.into_iter().collect())
            .await;
        Ok(())
    }
}
