//! The response cache (`--cache-config local,size=N`, per model `response_cache { enable:
//! true }`): answers of earlier requests, reused for identical requests without queueing or
//! executing anything.
//!
//! ```text
//! LoadedVersion::infer: check ─► CacheKey::of(version, request) ─► ResponseCache::lookup
//!   hit  ─► the stored outputs and response parameters (stats: success + cache_hit, no
//!           execution)
//!   miss ─► run ─► classification ─► ResponseCache::insert (stats: cache_miss)
//! ```
//!
//! One cache for the whole server, shared by every model that enables it, bounded in bytes
//! (the outputs' data and names and the response parameters, plus a fixed overhead per entry)
//! with least-recently-used eviction. The key is a 128-bit hash of the model name, version and
//! load generation, every input (name, datatype, shape, bytes, in name order), the requested
//! outputs in order with their classification counts, and the custom request parameters. The
//! load generation is new each time a version is (re)built, so an answer from before a reload
//! is never served again; its entries are dropped when the old version goes away
//! ([`ResponseCache::purge`]).
//!
//! Concurrency: a lookup and an insert each take a short lock; nothing waits on another
//! request. Identical requests that arrive while the first is still executing miss and execute
//! too (as in Triton); the last to finish leaves its answer in the cache.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use nereid_proto::{ParamValue, Tensor};
use parking_lot::Mutex;

use crate::backend::ModelResponse;
use crate::classification::Classify;
use crate::request_check::ValidRequest;

/// Bytes counted for an entry besides its outputs' data and names (key, bookkeeping).
pub(crate) const ENTRY_OVERHEAD: usize = 128;

/// A request's identity in the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct CacheKey {
    hash: [u64; 2],
    /// The load generation of the version the answer came from (see [`ResponseCache::purge`]).
    generation: u64,
}

impl CacheKey {
    /// The key of `request` to version `version` (load generation `generation`) of `model`.
    /// `classify` is the request's classification counts (taken out of the request before it
    /// runs).
    pub(crate) fn of(
        model: &str,
        version: i64,
        generation: u64,
        request: &ValidRequest,
        classify: &Classify,
    ) -> CacheKey {
        let hash = [0u64, 1].map(|seed| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            seed.hash(&mut h);
            model.hash(&mut h);
            version.hash(&mut h);
            generation.hash(&mut h);
            let mut inputs: Vec<&Tensor> = request.inputs.iter().collect();
            inputs.sort_by(|a, b| a.name().cmp(b.name()));
            inputs.len().hash(&mut h);
            for t in inputs {
                t.name().hash(&mut h);
                t.datatype().as_wire().hash(&mut h);
                t.shape().hash(&mut h);
                t.data().as_ref().hash(&mut h);
            }
            request.outputs.hash(&mut h);
            classify.hash(&mut h);
            request.parameters.len().hash(&mut h);
            for (k, v) in &request.parameters {
                k.hash(&mut h);
                hash_param(v, &mut h);
            }
            h.finish()
        });
        CacheKey { hash, generation }
    }
}

fn hash_param(v: &ParamValue, h: &mut impl Hasher) {
    match v {
        ParamValue::Bool(b) => (0u8, b).hash(h),
        ParamValue::Int(i) => (1u8, i).hash(h),
        ParamValue::Uint(u) => (2u8, u).hash(h),
        ParamValue::Double(d) => (3u8, d.to_bits()).hash(h),
        ParamValue::String(s) => (4u8, s).hash(h),
    }
}

/// What the cache has done since the server started (Triton's `nv_cache_*` gauges).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CacheCounters {
    pub entries: u64,
    pub lookups: u64,
    pub hits: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Bytes in use over the capacity, 0.0–1.0.
    pub utilization: f64,
    /// Total time spent in lookups and in insertions.
    pub lookup_time: Duration,
    pub insertion_time: Duration,
}

/// The server's response cache: a byte-bounded LRU map from [`CacheKey`] to outputs.
#[derive(Debug)]
pub struct ResponseCache {
    capacity: usize,
    inner: Mutex<Lru>,
}

#[derive(Debug, Default)]
struct Lru {
    used: usize,
    /// Increases with every use; an entry's last use orders eviction.
    tick: u64,
    entries: HashMap<CacheKey, Entry>,
    by_use: BTreeMap<u64, CacheKey>,
    counters: CacheCounters,
}

#[derive(Debug)]
struct Entry {
    response: Arc<ModelResponse>,
    size: usize,
    last_use: u64,
}

impl ResponseCache {
    /// A cache holding at most `capacity` bytes of entries.
    pub fn new(capacity: usize) -> ResponseCache {
        ResponseCache {
            capacity,
            inner: Mutex::new(Lru::default()),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The answer stored under `key` (now the most recently used), if any.
    pub(crate) fn lookup(&self, key: &CacheKey) -> Option<Arc<ModelResponse>> {
        let mut lru = self.inner.lock();
        lru.counters.lookups += 1;
        lru.tick += 1;
        let tick = lru.tick;
        let Lru {
            entries, by_use, ..
        } = &mut *lru;
        let found = entries.get_mut(key).map(|e| {
            by_use.remove(&e.last_use);
            e.last_use = tick;
            by_use.insert(tick, *key);
            e.response.clone()
        });
        if found.is_some() {
            lru.counters.hits += 1;
        } else {
            lru.counters.misses += 1;
        }
        found
    }

    /// Adds the time a lookup took (hashing the request included) to the counters.
    pub(crate) fn record_lookup_time(&self, took: Duration) {
        self.inner.lock().counters.lookup_time += took;
    }

    /// Adds the time one [`ResponseCache::insert`] took (measured by the caller around it).
    pub(crate) fn record_insertion_time(&self, took: Duration) {
        self.inner.lock().counters.insertion_time += took;
    }

    /// Stores `response` (outputs and response parameters) under `key`, evicting the least
    /// recently used entries to make room. An answer larger than the whole cache is not
    /// stored. Returns whether it was stored.
    pub(crate) fn insert(&self, key: CacheKey, response: ModelResponse) -> bool {
        let size = entry_size(&response);
        let mut lru = self.inner.lock();
        if size > self.capacity {
            return false;
        }
        if let Some(old) = lru.entries.remove(&key) {
            lru.by_use.remove(&old.last_use);
            lru.used -= old.size;
        }
        while lru.used + size > self.capacity {
            let Some((_, oldest)) = lru.by_use.pop_first() else {
                break;
            };
            if let Some(e) = lru.entries.remove(&oldest) {
                lru.used -= e.size;
                lru.counters.evictions += 1;
            }
        }
        lru.tick += 1;
        let tick = lru.tick;
        lru.by_use.insert(tick, key);
        lru.entries.insert(
            key,
            Entry {
                response: Arc::new(response),
                size,
                last_use: tick,
            },
        );
        lru.used += size;
        true
    }

    /// Drops every entry of load generation `generation` (a version that was unloaded or
    /// replaced). Not counted as evictions.
    pub(crate) fn purge(&self, generation: u64) {
        let mut lru = self.inner.lock();
        let Lru {
            entries,
            by_use,
            used,
            ..
        } = &mut *lru;
        entries.retain(|key, e| {
            if key.generation == generation {
                by_use.remove(&e.last_use);
                *used -= e.size;
                false
            } else {
                true
            }
        });
    }

    /// The counters now, with the current entry count and utilization.
    pub fn counters(&self) -> CacheCounters {
        let lru = self.inner.lock();
        CacheCounters {
            entries: lru.entries.len() as u64,
            utilization: if self.capacity == 0 {
                0.0
            } else {
                lru.used as f64 / self.capacity as f64
            },
            ..lru.counters
        }
    }

    /// Bytes the entries take now.
    #[cfg(test)]
    fn used(&self) -> usize {
        self.inner.lock().used
    }
}

/// The bytes an entry counts for.
pub(crate) fn entry_size(response: &ModelResponse) -> usize {
    let parameters: usize = response
        .parameters
        .iter()
        .map(|(k, v)| {
            k.len()
                + match v {
                    ParamValue::String(s) => s.len(),
                    _ => 8,
                }
        })
        .sum();
    ENTRY_OVERHEAD
        + parameters
        + response
            .tensors
            .iter()
            .map(|t| t.data().len() + t.name().len() + 8 * t.shape().len())
            .sum::<usize>()
}

/// Why a `--cache-config` value is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CacheConfigError {
    #[error("--cache-config '{0}': expected <cache>,<key>=<value> (e.g. local,size=1048576)")]
    /// The value is not `<cache>,<key>=<value>`; holds the value.
    Form(String),
    #[error("--cache-config: the '{0}' cache is not supported; Nereid has the 'local' cache only")]
    /// A cache other than `local`; holds its name.
    UnknownCache(String),
    #[error("--cache-config local: unknown key '{0}' (the local cache takes 'size')")]
    /// A key the local cache does not take; holds the key.
    UnknownKey(String),
    #[error("--cache-config local,size={0}: expected a size in bytes, at least 1")]
    /// A `size` that is not a positive number of bytes; holds the value given.
    Size(String),
    #[error("--cache-config local: 'size' is required (e.g. local,size=1048576)")]
    /// The local cache was configured without a `size`.
    NoSize,
}

/// The response cache's size in bytes from Triton's `--cache-config <cache>,<key>=<value>`
/// flags (repeatable; keys of one cache accumulate). `None` without flags: no cache.
pub fn parse_cache_config(flags: &[String]) -> Result<Option<usize>, CacheConfigError> {
    let mut size = None;
    for flag in flags {
        let Some((cache, setting)) = flag.split_once(',') else {
            return Err(CacheConfigError::Form(flag.clone()));
        };
        let Some((key, value)) = setting.split_once('=') else {
            return Err(CacheConfigError::Form(flag.clone()));
        };
        if cache != "local" {
            return Err(CacheConfigError::UnknownCache(cache.to_string()));
        }
        if key != "size" {
            return Err(CacheConfigError::UnknownKey(key.to_string()));
        }
        let bytes: usize = value
            .trim()
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| CacheConfigError::Size(value.to_string()))?;
        size = Some(bytes);
    }
    if flags.is_empty() {
        return Ok(None);
    }
    size.map(Some).ok_or(CacheConfigError::NoSize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use nereid_proto::DataType;
    use nereid_proto::testing::fp32_tensor as fp32;

    fn request(inputs: Vec<Tensor>, outputs: &[&str]) -> ValidRequest {
        ValidRequest {
            inputs,
            outputs: outputs.iter().map(|s| s.to_string()).collect(),
            batch_size: 1,
            ..Default::default()
        }
    }

    fn key(model: &str, version: i64, generation: u64, r: &ValidRequest) -> CacheKey {
        CacheKey::of(model, version, generation, r, &Classify::new())
    }

    #[test]
    fn key_covers_model_version_generation_inputs_and_outputs() {
        let r = request(vec![fp32("a", &[1.0]), fp32("b", &[2.0])], &["y"]);
        let k = key("m", 1, 7, &r);
        // Input order does not matter; everything else does.
        let swapped = request(vec![fp32("b", &[2.0]), fp32("a", &[1.0])], &["y"]);
        assert_eq!(key("m", 1, 7, &swapped), k);
        assert_ne!(key("n", 1, 7, &r), k);
        assert_ne!(key("m", 2, 7, &r), k);
        assert_ne!(key("m", 1, 8, &r), k);
        let other_data = request(vec![fp32("a", &[1.5]), fp32("b", &[2.0])], &["y"]);
        assert_ne!(key("m", 1, 7, &other_data), k);
        let other_name = request(vec![fp32("a", &[1.0]), fp32("c", &[2.0])], &["y"]);
        assert_ne!(key("m", 1, 7, &other_name), k);
        let other_shape = request(
            vec![
                fp32("a", &[1.0]),
                Tensor::new(
                    "b",
                    DataType::Fp32,
                    vec![1, 1],
                    Bytes::from(2f32.to_le_bytes().to_vec()),
                )
                .unwrap(),
            ],
            &["y"],
        );
        assert_ne!(key("m", 1, 7, &other_shape), k);
        let other_type = request(
            vec![
                fp32("a", &[1.0]),
                Tensor::new(
                    "b",
                    DataType::Int32,
                    vec![1],
                    Bytes::from(2f32.to_le_bytes().to_vec()),
                )
                .unwrap(),
            ],
            &["y"],
        );
        assert_ne!(key("m", 1, 7, &other_type), k);
        let other_outputs = request(vec![fp32("a", &[1.0]), fp32("b", &[2.0])], &["y", "z"]);
        assert_ne!(key("m", 1, 7, &other_outputs), k);
        let classified = CacheKey::of("m", 1, 7, &r, &Classify::from([("y".to_string(), 2)]));
        assert_ne!(classified, k);
        let mut with_param = request(vec![fp32("a", &[1.0]), fp32("b", &[2.0])], &["y"]);
        with_param.parameters.insert("p".into(), ParamValue::Int(1));
        assert_ne!(key("m", 1, 7, &with_param), k);
    }

    fn k(n: u64) -> CacheKey {
        CacheKey {
            hash: [n, n],
            generation: 1,
        }
    }

    #[test]
    fn hits_misses_and_counters() {
        let cache = ResponseCache::new(10_000);
        assert!(cache.lookup(&k(1)).is_none());
        assert!(cache.insert(k(1), vec![fp32("y", &[1.0, 2.0])].into()));
        cache.record_insertion_time(Duration::from_micros(3));
        assert_eq!(
            cache.lookup(&k(1)).unwrap().tensors,
            vec![fp32("y", &[1.0, 2.0])]
        );
        cache.record_lookup_time(Duration::from_micros(5));
        let c = cache.counters();
        assert_eq!(
            (c.entries, c.lookups, c.hits, c.misses, c.evictions),
            (1, 2, 1, 1, 0)
        );
        assert_eq!(c.lookup_time, Duration::from_micros(5));
        assert_eq!(c.insertion_time, Duration::from_micros(3));
        let expected = entry_size(&vec![fp32("y", &[1.0, 2.0])].into());
        assert_eq!(cache.used(), expected);
        assert!((c.utilization - expected as f64 / 10_000.0).abs() < 1e-12);
    }

    #[test]
    fn evicts_least_recently_used_within_the_byte_bound() {
        let one = entry_size(&vec![fp32("y", &[0.0; 4])].into());
        let cache = ResponseCache::new(3 * one);
        for n in 1..=3 {
            cache.insert(k(n), vec![fp32("y", &[n as f32; 4])].into());
        }
        // Using 1 makes 2 the least recently used.
        assert!(cache.lookup(&k(1)).is_some());
        cache.insert(k(4), vec![fp32("y", &[4.0; 4])].into());
        assert!(cache.lookup(&k(2)).is_none(), "2 was least recently used");
        for n in [1, 3, 4] {
            assert!(cache.lookup(&k(n)).is_some(), "{n} stays");
        }
        assert_eq!(cache.counters().evictions, 1);
        assert!(cache.used() <= 3 * one);
        // A bigger entry evicts as many as it needs.
        let big: ModelResponse = vec![fp32("y", &[0.0; 40])].into();
        assert!(entry_size(&big) <= 3 * one);
        cache.insert(k(5), big);
        assert!(cache.used() <= 3 * one);
        assert!(cache.lookup(&k(5)).is_some());
    }

    #[test]
    fn an_answer_larger_than_the_cache_is_not_stored() {
        let cache = ResponseCache::new(ENTRY_OVERHEAD + 8);
        assert!(!cache.insert(k(1), vec![fp32("y", &[0.0; 64])].into()));
        assert_eq!(cache.counters().entries, 0);
        assert_eq!(cache.used(), 0);
    }

    #[test]
    fn reinserting_a_key_replaces_it() {
        let cache = ResponseCache::new(10_000);
        cache.insert(k(1), vec![fp32("y", &[1.0])].into());
        cache.insert(k(1), vec![fp32("y", &[2.0])].into());
        assert_eq!(cache.counters().entries, 1);
        assert_eq!(cache.used(), entry_size(&vec![fp32("y", &[2.0])].into()));
        assert_eq!(
            cache.lookup(&k(1)).unwrap().tensors,
            vec![fp32("y", &[2.0])]
        );
    }

    #[test]
    fn a_stored_answer_keeps_its_response_parameters() {
        let cache = ResponseCache::new(10_000);
        let plain: ModelResponse = vec![fp32("y", &[1.0])].into();
        let mut answer = plain.clone();
        answer
            .parameters
            .insert("note".into(), ParamValue::String("cached".into()));
        assert!(entry_size(&answer) > entry_size(&plain));
        cache.insert(k(1), answer.clone());
        assert_eq!(*cache.lookup(&k(1)).unwrap(), answer);
        assert_eq!(cache.used(), entry_size(&answer));
    }

    #[test]
    fn purge_drops_one_generation() {
        let cache = ResponseCache::new(10_000);
        let mut old = k(1);
        old.generation = 3;
        cache.insert(old, vec![fp32("y", &[1.0])].into());
        cache.insert(k(2), vec![fp32("y", &[2.0])].into());
        cache.purge(3);
        assert!(cache.lookup(&old).is_none());
        assert!(cache.lookup(&k(2)).is_some());
        assert_eq!(cache.used(), entry_size(&vec![fp32("y", &[2.0])].into()));
        assert_eq!(cache.counters().evictions, 0);
    }

    #[test]
    fn cache_config_flags() {
        let f =
            |v: &[&str]| parse_cache_config(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(f(&[]), Ok(None));
        assert_eq!(f(&["local,size=1048576"]), Ok(Some(1_048_576)));
        assert_eq!(
            f(&["redis,host=x"]),
            Err(CacheConfigError::UnknownCache("redis".into()))
        );
        assert_eq!(
            f(&["local,bytes=3"]),
            Err(CacheConfigError::UnknownKey("bytes".into()))
        );
        assert_eq!(
            f(&["local,size=0"]),
            Err(CacheConfigError::Size("0".into()))
        );
        assert_eq!(f(&["local"]), Err(CacheConfigError::Form("local".into())));
    }
}
