//! Which version a request goes to: a pure function of the routing table, the request and a
//! random draw.
//!
//! ```text
//! version named ──────────────► that version (UnknownVersion if the model never had it)
//! none, traffic split set ────► weighted draw among the split's versions that have a ready
//!                               replica (weights renormalized over those)
//! none, no split (or none of ─► the highest version the policy serves that has a ready
//!   its versions is ready)      replica; else the highest ready version at all (a rollout
//!                               in progress: the old version serves until the new is ready)
//! ```
//!
//! Renormalizing keeps a canary from becoming an outage: while the canary version is still
//! loading, or after its replicas failed, the other versions of the split take its share.

use crate::error::{RouterError, RouterResult};
use crate::random::RandomSource;
use crate::table::RoutingTable;

/// The version a request for `model` goes to; `version` is what the request named.
pub fn resolve_version(
    table: &RoutingTable,
    model: &str,
    version: Option<i64>,
    rng: &mut dyn RandomSource,
) -> RouterResult<i64> {
    let Some(spec) = table.model(model) else {
        return Err(table.missing_model(model));
    };
    if let Some(v) = version {
        if table.has_version(model, v) {
            return Ok(v);
        }
        return Err(RouterError::UnknownVersion {
            model: model.to_string(),
            version: v,
        });
    }
    let ready = table.ready_versions(model);
    let split: Vec<(i64, u32)> = ready
        .iter()
        .filter_map(|v| spec.traffic.get(v).map(|w| (*v, *w)))
        .collect();
    if let Some(v) = weighted(&split, rng) {
        return Ok(v);
    }
    ready
        .iter()
        .rev()
        .find(|v| spec.served_versions.contains(v))
        .or(ready.last())
        .copied()
        .ok_or_else(|| RouterError::NoReadyReplica {
            model: model.to_string(),
            version: None,
        })
}

/// A draw from `(value, weight)` pairs in proportion to the weights; `None` when they add up to
/// zero.
pub fn weighted(choices: &[(i64, u32)], rng: &mut dyn RandomSource) -> Option<i64> {
    let total: u64 = choices.iter().map(|(_, w)| u64::from(*w)).sum();
    if total == 0 {
        return None;
    }
    let mut point = rng.next_u64() % total;
    for (value, weight) in choices {
        let w = u64::from(*weight);
        if point < w {
            return Some(*value);
        }
        point -= w;
    }
    None
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::random::SplitMix64;
    use crate::table::tests::{model, node, replica, snapshot};

    fn table(traffic: &[(i64, u32)], served: &[i64], ready: &[i64]) -> RoutingTable {
        let mut m = model("m", &[1, 2, 3]);
        m.traffic = traffic.iter().copied().collect();
        m.served_versions = served.to_vec();
        let replicas = [1, 2, 3]
            .into_iter()
            .map(|v| replica(v as u64, "m", v, "a", ready.contains(&v)))
            .collect();
        let mut t = RoutingTable::default();
        t.apply(&snapshot(
            1,
            vec![m, model("cold", &[1])],
            vec![node("a", "a:1")],
            replicas,
        ));
        t
    }

    fn counts(t: &RoutingTable, n: usize) -> HashMap<i64, usize> {
        let mut rng = SplitMix64::new(7);
        let mut out = HashMap::new();
        for _ in 0..n {
            *out.entry(resolve_version(t, "m", None, &mut rng).unwrap())
                .or_default() += 1;
        }
        out
    }

    #[test]
    fn named_versions_and_unknown_models() {
        let t = table(&[], &[1, 2, 3], &[1, 2]);
        let mut rng = SplitMix64::new(1);
        assert_eq!(resolve_version(&t, "m", Some(3), &mut rng), Ok(3));
        assert_eq!(
            resolve_version(&t, "m", Some(9), &mut rng),
            Err(RouterError::UnknownVersion {
                model: "m".into(),
                version: 9
            })
        );
        assert_eq!(
            resolve_version(&t, "nope", None, &mut rng),
            Err(RouterError::UnknownModel {
                model: "nope".into()
            })
        );
        assert_eq!(
            resolve_version(&t, "cold", None, &mut rng),
            Err(RouterError::NoReadyReplica {
                model: "cold".into(),
                version: None
            })
        );
    }

    #[test]
    fn before_the_first_snapshot_no_model_is_called_unknown() {
        let empty = RoutingTable::default();
        let mut rng = SplitMix64::new(1);
        assert_eq!(
            resolve_version(&empty, "m", None, &mut rng),
            Err(RouterError::NoTable)
        );
    }

    #[test]
    fn unversioned_goes_to_the_highest_served_ready_version() {
        let mut rng = SplitMix64::new(1);
        let t = table(&[], &[1, 2, 3], &[1, 2]);
        assert_eq!(
            resolve_version(&t, "m", None, &mut rng),
            Ok(2),
            "3 is loading"
        );
        let t = table(&[], &[1], &[1, 2]);
        assert_eq!(
            resolve_version(&t, "m", None, &mut rng),
            Ok(1),
            "the policy serves 1 only; 2 is on its way out"
        );
        let t = table(&[], &[3], &[1, 2]);
        assert_eq!(
            resolve_version(&t, "m", None, &mut rng),
            Ok(2),
            "nothing served is ready yet: the highest ready version answers meanwhile"
        );
        let t = table(&[], &[], &[1, 2]);
        assert_eq!(resolve_version(&t, "m", None, &mut rng), Ok(2));
    }

    #[test]
    fn a_split_follows_its_weights() {
        let t = table(&[(1, 90), (2, 10)], &[1, 2, 3], &[1, 2, 3]);
        let c = counts(&t, 20_000);
        let share = c[&2] as f64 / 20_000.0;
        assert!((share - 0.10).abs() < 0.01, "{c:?}");
        assert!(!c.contains_key(&3), "3 is not in the split: {c:?}");
    }

    #[test]
    fn a_split_renormalizes_over_ready_versions_and_falls_back() {
        let t = table(&[(1, 50), (2, 50)], &[1, 2, 3], &[1, 3]);
        assert_eq!(counts(&t, 1000), HashMap::from([(1, 1000)]), "2 not ready");
        let t = table(&[(2, 1)], &[1, 2, 3], &[1, 3]);
        assert_eq!(
            counts(&t, 100),
            HashMap::from([(3, 100)]),
            "no split version ready: the default rule"
        );
        let t = table(&[(1, 0), (2, 5)], &[1, 2], &[1, 2]);
        assert_eq!(
            counts(&t, 100),
            HashMap::from([(2, 100)]),
            "weight 0 gets none"
        );
    }

    #[test]
    fn weighted_draws_cover_the_whole_range() {
        struct Seq(u64);
        impl RandomSource for Seq {
            fn next_u64(&mut self) -> u64 {
                self.0 += 1;
                self.0 - 1
            }
        }
        let mut rng = Seq(0);
        let got: Vec<i64> = (0..4)
            .map(|_| weighted(&[(1, 1), (2, 3)], &mut rng).unwrap())
            .collect();
        assert_eq!(got, vec![1, 2, 2, 2]);
        assert_eq!(weighted(&[(1, 0)], &mut rng), None);
        assert_eq!(weighted(&[], &mut rng), None);
    }
}
