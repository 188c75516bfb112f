//! Replica choice: a pure function of (routing table, outstanding requests, affinity, time,
//! randomness) to one ready replica. No sockets, no clocks, no global randomness.
//!
//! ```text
//! request (model, version?, sequence?) ─┬─ sequence, not start ─► the replica that got the
//!                                       │                         start (or a typed error)
//!                                       └─ otherwise ─► resolve version ─► ready endpoints
//!                                             minus `exclude` ─► power of two choices on
//!                                             outstanding requests ─► (start: remember it)
//! ```
//!
//! - **Version.** [`crate::version::resolve_version`]: the named version, else the model's
//!   traffic split, else the highest served version with a ready replica; a version still
//!   loading does not take traffic until it is ready, and the previous one serves meanwhile.
//! - **Power of two choices.** Two distinct candidates drawn at random; the one with fewer
//!   outstanding requests wins (ties go to the first drawn). This avoids both the herd behaviour
//!   of "least loaded" on stale counts and the imbalance of pure random choice.
//! - **Sequence affinity.** A `sequence_id` sticks to the replica that got its start until a
//!   request with the end flag, or until no request of the sequence came for the idle timeout.
//!   If that replica is no longer ready the affinity breaks: non-start requests get
//!   [`RouterError::SequenceReplicaGone`] (the sequence's state died with the replica); a new
//!   start is routed afresh.
//! - **Exclude.** A retry passes the replicas that already failed it.
//! - **Passive ejection.** A replica that could not be reached is [`Chooser::eject`]ed for a
//!   while: new requests avoid it until then, unless every candidate is ejected (then all are
//!   tried, so a recovered cluster is found without waiting). Sequences keep their replica.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use nereid_proto::{CorrelationId, RequestOptions};

use crate::error::{RouterError, RouterResult};
use crate::random::RandomSource;
use crate::table::{Endpoint, RoutingTable};
use crate::version::resolve_version;

/// What choice needs to know of a request.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ask<'a> {
    pub model: &'a str,
    pub version: Option<i64>,
    pub sequence: Option<&'a CorrelationId>,
    pub start: bool,
    pub end: bool,
}

impl<'a> Ask<'a> {
    /// What choice needs of a request for `model` (`version` as parsed, `None`: let the
    /// router choose) with these request options (its sequence id and flags).
    pub fn of(model: &'a str, version: Option<i64>, options: &'a RequestOptions) -> Ask<'a> {
        Ask {
            model,
            version,
            sequence: options.sequence_id.as_ref(),
            start: options.sequence_start,
            end: options.sequence_end,
        }
    }
}

/// Picks the less loaded of two distinct random candidates; `None` when there is none.
pub fn power_of_two<'e>(
    candidates: &[&'e Endpoint],
    outstanding: impl Fn(u64) -> usize,
    rng: &mut dyn RandomSource,
) -> Option<&'e Endpoint> {
    match candidates.len() {
        0 => None,
        1 => Some(candidates[0]),
        n => {
            let i = rng.below(n);
            let mut j = rng.below(n - 1);
            if j >= i {
                j += 1;
            }
            let (a, b) = (candidates[i], candidates[j]);
            Some(if outstanding(b.replica) < outstanding(a.replica) {
                b
            } else {
                a
            })
        }
    }
}

#[derive(Clone, Debug)]
struct Sticky {
    replica: u64,
    last_used: Instant,
}

/// Replica choice with the state it needs between requests: sequence affinity and randomness.
pub struct Chooser {
    affinity: HashMap<(String, CorrelationId), Sticky>,
    /// Replicas to avoid until the given time.
    ejected: HashMap<u64, Instant>,
    idle_timeout: Duration,
    rng: Box<dyn RandomSource>,
}

impl Chooser {
    pub fn new(idle_timeout: Duration, rng: Box<dyn RandomSource>) -> Chooser {
        Chooser {
            affinity: HashMap::new(),
            ejected: HashMap::new(),
            idle_timeout,
            rng,
        }
    }

    /// Sequences currently pinned to a replica.
    #[cfg(test)]
    pub fn sequences(&self) -> usize {
        self.affinity.len()
    }

    /// Avoids `replica` for new requests until `until`.
    pub fn eject(&mut self, replica: u64, until: Instant) {
        self.ejected.insert(replica, until);
    }

    /// Forgets sequences idle for longer than the timeout.
    pub fn expire(&mut self, now: Instant) {
        let timeout = self.idle_timeout;
        self.affinity
            .retain(|_, s| now.saturating_duration_since(s.last_used) <= timeout);
    }

    /// Chooses the replica for `ask`. `outstanding` gives each replica's requests in flight;
    /// `exclude` the replicas that already failed this request.
    pub fn choose(
        &mut self,
        table: &RoutingTable,
        ask: &Ask<'_>,
        outstanding: impl Fn(u64) -> usize,
        exclude: &HashSet<u64>,
        now: Instant,
    ) -> RouterResult<Endpoint> {
        let key = ask.sequence.map(|id| (ask.model.to_string(), id.clone()));
        if let Some(key) = &key
            && !ask.start
        {
            return self.follow(table, key, ask.end, now);
        }
        let version = resolve_version(table, ask.model, ask.version, self.rng.as_mut())?;
        let mut candidates: Vec<&Endpoint> = table
            .ready(ask.model, version)
            .iter()
            .filter(|e| !exclude.contains(&e.replica))
            .collect();
        self.ejected.retain(|_, until| *until > now);
        if candidates
            .iter()
            .any(|e| !self.ejected.contains_key(&e.replica))
        {
            candidates.retain(|e| !self.ejected.contains_key(&e.replica));
        }
        let chosen = power_of_two(&candidates, outstanding, self.rng.as_mut())
            .cloned()
            .ok_or_else(|| RouterError::NoReadyReplica {
                model: ask.model.to_string(),
                version: Some(version),
            })?;
        if let Some(key) = key {
            self.expire(now);
            if ask.end {
                self.affinity.remove(&key);
            } else {
                self.affinity.insert(
                    key,
                    Sticky {
                        replica: chosen.replica,
                        last_used: now,
                    },
                );
            }
        }
        Ok(chosen)
    }

    fn follow(
        &mut self,
        table: &RoutingTable,
        key: &(String, CorrelationId),
        end: bool,
        now: Instant,
    ) -> RouterResult<Endpoint> {
        let sticky = match self.affinity.get(key) {
            Some(s) if now.saturating_duration_since(s.last_used) <= self.idle_timeout => s.clone(),
            _ => {
                self.affinity.remove(key);
                return Err(RouterError::SequenceNotStarted {
                    model: key.0.clone(),
                    sequence: key.1.clone(),
                });
            }
        };
        let Some(endpoint) = table.endpoint(&key.0, sticky.replica).cloned() else {
            self.affinity.remove(key);
            return Err(RouterError::SequenceReplicaGone {
                model: key.0.clone(),
                sequence: key.1.clone(),
                replica: sticky.replica,
            });
        };
        if end {
            self.affinity.remove(key);
        } else if let Some(s) = self.affinity.get_mut(key) {
            s.last_used = now;
        }
        Ok(endpoint)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, VecDeque};

    use nereid_proto::pb::cluster::StateDelta;

    use super::*;
    use crate::random::SplitMix64;
    use crate::table::tests::{model, node, replica, snapshot};

    /// Returns the given values in order, then zeros.
    struct Fixed(VecDeque<u64>);

    impl RandomSource for Fixed {
        fn next_u64(&mut self) -> u64 {
            self.0.pop_front().unwrap_or(0)
        }
    }

    fn fixed(values: &[u64]) -> Box<dyn RandomSource> {
        Box::new(Fixed(values.iter().copied().collect()))
    }

    fn table() -> RoutingTable {
        let mut t = RoutingTable::default();
        t.apply(&snapshot(
            1,
            vec![model("m", &[1, 2, 3]), model("cold", &[1])],
            vec![node("a", "a:1"), node("b", "b:1"), node("c", "c:1")],
            vec![
                replica(10, "m", 1, "a", true),
                replica(20, "m", 2, "a", true),
                replica(21, "m", 2, "b", true),
                replica(22, "m", 2, "c", true),
                replica(30, "m", 3, "c", false),
                replica(40, "cold", 1, "a", false),
            ],
        ));
        t
    }

    fn ask(model: &str) -> Ask<'_> {
        Ask {
            model,
            ..Default::default()
        }
    }

    fn idle(_: u64) -> usize {
        0
    }

    #[test]
    fn a_version_without_ready_replicas_is_unavailable() {
        let t = table();
        let mut c = Chooser::new(Duration::from_secs(1), fixed(&[]));
        let err = c
            .choose(
                &t,
                &Ask {
                    version: Some(3),
                    ..ask("m")
                },
                idle,
                &HashSet::new(),
                Instant::now(),
            )
            .unwrap_err();
        assert_eq!(
            err,
            RouterError::NoReadyReplica {
                model: "m".into(),
                version: Some(3)
            }
        );
        let service: nereid_proto::ServiceError = err.into();
        assert!(matches!(
            service,
            nereid_proto::ServiceError::Unavailable(_)
        ));
    }

    #[test]
    fn power_of_two_prefers_the_less_loaded_of_the_two_drawn() {
        let t = table();
        let candidates: Vec<&Endpoint> = t.ready("m", 2).iter().collect();
        let load: BTreeMap<u64, usize> = [(20, 5), (21, 1), (22, 3)].into();
        let out = |id: u64| load[&id];
        // Draws index 0 (20) and index 0 of the rest, i.e. 21: 21 is less loaded.
        let mut rng = Fixed([0, 0].into());
        assert_eq!(
            power_of_two(&candidates, out, &mut rng).unwrap().replica,
            21
        );
        // Draws 22 then 20 (j = 0 < i = 2): 22 wins with 3 < 5.
        let mut rng = Fixed([2, 0].into());
        assert_eq!(
            power_of_two(&candidates, out, &mut rng).unwrap().replica,
            22
        );
        // Never picks the most loaded replica while two others exist with fewer.
        let mut rng = SplitMix64::new(7);
        for _ in 0..200 {
            assert_ne!(
                power_of_two(&candidates, out, &mut rng).unwrap().replica,
                20
            );
        }
        // Ties go to the first drawn, and the two draws are distinct.
        let mut rng = Fixed([1, 1].into());
        assert_eq!(
            power_of_two(&candidates, idle, &mut rng).unwrap().replica,
            21
        );
        assert!(power_of_two(&[], idle, &mut rng).is_none());
        assert_eq!(
            power_of_two(&candidates[..1], out, &mut rng)
                .unwrap()
                .replica,
            20
        );
    }

    #[test]
    fn load_spreads_over_every_replica() {
        let t = table();
        let mut c = Chooser::new(Duration::from_secs(1), Box::new(SplitMix64::new(1)));
        let mut seen = BTreeMap::new();
        for _ in 0..300 {
            let e = c
                .choose(&t, &ask("m"), idle, &HashSet::new(), Instant::now())
                .unwrap();
            *seen.entry(e.replica).or_insert(0) += 1;
        }
        assert_eq!(seen.keys().copied().collect::<Vec<_>>(), vec![20, 21, 22]);
        assert!(seen.values().all(|&n| n > 50), "{seen:?}");
    }

    #[test]
    fn excluded_replicas_are_skipped_until_none_is_left() {
        let t = table();
        let mut c = Chooser::new(Duration::from_secs(1), Box::new(SplitMix64::new(3)));
        let exclude: HashSet<u64> = [20, 22].into();
        for _ in 0..20 {
            let e = c
                .choose(&t, &ask("m"), idle, &exclude, Instant::now())
                .unwrap();
            assert_eq!(e.replica, 21);
        }
        let all: HashSet<u64> = [20, 21, 22].into();
        assert_eq!(
            c.choose(&t, &ask("m"), idle, &all, Instant::now()),
            Err(RouterError::NoReadyReplica {
                model: "m".into(),
                version: Some(2)
            })
        );
    }

    #[test]
    fn ejected_replicas_are_avoided_until_their_time_or_when_nothing_else_is_left() {
        let t = table();
        let mut c = Chooser::new(Duration::from_secs(1), Box::new(SplitMix64::new(4)));
        let now = Instant::now();
        c.eject(20, now + Duration::from_secs(5));
        c.eject(21, now + Duration::from_secs(5));
        for _ in 0..20 {
            let e = c.choose(&t, &ask("m"), idle, &HashSet::new(), now).unwrap();
            assert_eq!(e.replica, 22);
        }
        // Every remaining candidate ejected: they are tried anyway.
        let only_ejected: HashSet<u64> = [22].into();
        let e = c.choose(&t, &ask("m"), idle, &only_ejected, now).unwrap();
        assert!(e.replica == 20 || e.replica == 21);
        // After the ejection time they take traffic again.
        let later = now + Duration::from_secs(6);
        let mut seen = HashSet::new();
        for _ in 0..50 {
            seen.insert(
                c.choose(&t, &ask("m"), idle, &HashSet::new(), later)
                    .unwrap()
                    .replica,
            );
        }
        assert_eq!(seen.len(), 3);
    }

    fn seq<'a>(id: &'a CorrelationId, start: bool, end: bool) -> Ask<'a> {
        Ask {
            model: "m",
            version: None,
            sequence: Some(id),
            start,
            end,
        }
    }

    #[test]
    fn a_sequence_sticks_to_the_replica_of_its_start_until_the_end() {
        let t = table();
        let mut c = Chooser::new(Duration::from_secs(10), Box::new(SplitMix64::new(5)));
        let id = CorrelationId::Uint(42);
        let now = Instant::now();
        let first = c
            .choose(&t, &seq(&id, true, false), idle, &HashSet::new(), now)
            .unwrap();
        // Load elsewhere is lower, but the sequence stays.
        let busy = |r: u64| if r == first.replica { 100 } else { 0 };
        for i in 1..20 {
            let e = c
                .choose(
                    &t,
                    &seq(&id, false, false),
                    busy,
                    &HashSet::new(),
                    now + Duration::from_secs(i),
                )
                .unwrap();
            assert_eq!(e.replica, first.replica);
        }
        let last = c
            .choose(
                &t,
                &seq(&id, false, true),
                busy,
                &HashSet::new(),
                now + Duration::from_secs(20),
            )
            .unwrap();
        assert_eq!(last.replica, first.replica);
        assert_eq!(c.sequences(), 0);
        assert_eq!(
            c.choose(&t, &seq(&id, false, false), idle, &HashSet::new(), now),
            Err(RouterError::SequenceNotStarted {
                model: "m".into(),
                sequence: id.clone()
            })
        );
    }

    #[test]
    fn an_idle_sequence_expires() {
        let t = table();
        let mut c = Chooser::new(Duration::from_secs(10), Box::new(SplitMix64::new(5)));
        let id = CorrelationId::String("s".into());
        let now = Instant::now();
        c.choose(&t, &seq(&id, true, false), idle, &HashSet::new(), now)
            .unwrap();
        // Within the timeout the sequence is kept alive by each request.
        c.choose(
            &t,
            &seq(&id, false, false),
            idle,
            &HashSet::new(),
            now + Duration::from_secs(9),
        )
        .unwrap();
        let err = c
            .choose(
                &t,
                &seq(&id, false, false),
                idle,
                &HashSet::new(),
                now + Duration::from_secs(20),
            )
            .unwrap_err();
        assert!(matches!(err, RouterError::SequenceNotStarted { .. }));
        // Sweeping drops idle entries of other sequences too.
        let other = CorrelationId::Uint(1);
        c.choose(&t, &seq(&other, true, false), idle, &HashSet::new(), now)
            .unwrap();
        c.expire(now + Duration::from_secs(11));
        assert_eq!(c.sequences(), 0);
    }

    #[test]
    fn a_vanished_replica_breaks_the_affinity_with_a_clear_error() {
        let mut t = table();
        let mut c = Chooser::new(Duration::from_secs(10), Box::new(SplitMix64::new(9)));
        let id = CorrelationId::Uint(7);
        let now = Instant::now();
        let first = c
            .choose(&t, &seq(&id, true, false), idle, &HashSet::new(), now)
            .unwrap();
        t.apply(&nereid_proto::pb::cluster::WatchEvent {
            revision: 2,
            event: Some(nereid_proto::pb::cluster::watch_event::Event::Delta(
                StateDelta {
                    deleted_replicas: vec![first.replica],
                    ..Default::default()
                },
            )),
        });
        let err = c
            .choose(&t, &seq(&id, false, false), idle, &HashSet::new(), now)
            .unwrap_err();
        assert_eq!(
            err,
            RouterError::SequenceReplicaGone {
                model: "m".into(),
                sequence: id.clone(),
                replica: first.replica
            }
        );
        assert!(err.to_string().contains("start the sequence again"));
        // A new start goes to a replica that is still there.
        let again = c
            .choose(&t, &seq(&id, true, false), idle, &HashSet::new(), now)
            .unwrap();
        assert_ne!(again.replica, first.replica);
    }

    #[test]
    fn sequences_of_different_models_do_not_collide() {
        let mut t = table();
        t.apply(&snapshot(
            2,
            vec![model("m", &[2]), model("n", &[1])],
            vec![node("a", "a:1"), node("b", "b:1")],
            vec![replica(1, "m", 2, "a", true), replica(2, "n", 1, "b", true)],
        ));
        let mut c = Chooser::new(Duration::from_secs(10), fixed(&[]));
        let id = CorrelationId::Uint(1);
        let now = Instant::now();
        c.choose(&t, &seq(&id, true, false), idle, &HashSet::new(), now)
            .unwrap();
        let other = Ask {
            model: "n",
            ..seq(&id, true, false)
        };
        assert_eq!(
            c.choose(&t, &other, idle, &HashSet::new(), now)
                .unwrap()
                .replica,
            2
        );
        assert_eq!(
            c.choose(&t, &seq(&id, false, false), idle, &HashSet::new(), now)
                .unwrap()
                .replica,
            1
        );
    }
}
