//! The rate limiter (`--rate-limit execution_count`): one per server, across every model.
//!
//! ```text
//! load: each instance registers what its group's `rate_limiter { resources priority }`
//!       needs on its device ──► InstanceLimit (unregisters when the version is dropped)
//! run:  instance thread, batch formed ─► InstanceLimit::acquire ─► blocks until the ledger
//!       grants its resources ─► executes ─► next batch already formed? Grant::renew (give
//!       back and queue again in one step) : Grant dropped (resources back, waiters woken)
//! ```
//!
//! The decision (pool sizes, who goes next by priority) is the pure [`ledger`]; this module
//! only puts it behind a lock and a condition variable. With `--rate-limit off` (the default)
//! nothing registers and instances never wait. A formed batch waits with its instance, so
//! time spent waiting for resources counts as queue time, as in Triton.
//!
//! CPU instances count against device 0's per-device pools. A model that calls another model
//! (Python BLS) while holding a resource that model also needs waits forever if the pool has
//! no room for both: size the pools for that, as with Triton.

mod ledger;

use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

use self::ledger::{InstanceId, Ledger, Ticket};
pub use self::ledger::{ResourceKey, ResourceLimits};

/// `--rate-limit` and `--rate-limit-resource`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RateLimitConfig {
    /// `execution_count`: instances run only when their resources are free.
    pub enabled: bool,
    /// `--rate-limit-resource`: the amount of each resource available, overriding what the
    /// instance groups ask for.
    pub limits: ResourceLimits,
}

impl RateLimitConfig {
    /// Adds one `--rate-limit-resource <name>:<count>[:<device>]`.
    pub fn add_resource(&mut self, spec: &str) -> Result<(), String> {
        let bad = |what: &str| {
            format!("--rate-limit-resource '{spec}': {what}; expected <name>:<count>[:<device>]")
        };
        let parts: Vec<&str> = spec.split(':').collect();
        let (name, count, device) = match parts.as_slice() {
            [name, count] => (*name, *count, None),
            [name, count, device] => (*name, *count, Some(*device)),
            _ => return Err(bad("wrong number of ':'-separated fields")),
        };
        if name.is_empty() {
            return Err(bad("the resource name is empty"));
        }
        let count: u32 = count
            .parse()
            .map_err(|_| bad("the count is not a non-negative integer"))?;
        match device {
            None => {
                self.limits.all_devices.insert(name.to_string(), count);
            }
            Some(d) => {
                let device: i32 = d
                    .parse()
                    .ok()
                    .filter(|d| *d >= 0)
                    .ok_or_else(|| bad("the device is not a non-negative integer"))?;
                self.limits
                    .per_device
                    .insert((name.to_string(), device), count);
            }
        }
        Ok(())
    }
}

/// What an instance needs to run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstanceNeeds {
    pub resources: Vec<(ResourceKey, u32)>,
    /// Weight among waiting instances: 2 runs half as often as 1 (0 counts as 1).
    pub priority: u32,
}

struct Inner {
    ledger: Ledger,
    /// Granted tickets whose thread has not picked the grant up yet.
    granted: Vec<Ticket>,
}

/// The server's rate limiter.
pub struct RateLimiter {
    enabled: bool,
    inner: Mutex<Inner>,
    changed: Condvar,
}

impl std::fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

impl RateLimiter {
    pub fn new(config: &RateLimitConfig) -> Arc<RateLimiter> {
        Arc::new(RateLimiter {
            enabled: config.enabled,
            inner: Mutex::new(Inner {
                ledger: Ledger::new(config.limits.clone()),
                granted: Vec::new(),
            }),
            changed: Condvar::new(),
        })
    }

    /// Registers an instance; `None` when rate limiting is off. The error says which resource
    /// the operator's pool sizes can never satisfy.
    pub fn register(
        self: &Arc<Self>,
        needs: InstanceNeeds,
    ) -> Result<Option<InstanceLimit>, String> {
        if !self.enabled {
            return Ok(None);
        }
        let id = self
            .inner
            .lock()
            .ledger
            .register(needs.resources, needs.priority)?;
        Ok(Some(InstanceLimit {
            limiter: self.clone(),
            id,
        }))
    }

    /// Grants what fits and wakes the waiters (called with the lock held).
    fn grant(&self, inner: &mut Inner) {
        let granted = inner.ledger.grant();
        if !granted.is_empty() {
            inner.granted.extend(granted);
            self.changed.notify_all();
        }
    }
}

/// A registered instance.
pub struct InstanceLimit {
    limiter: Arc<RateLimiter>,
    id: InstanceId,
}

impl InstanceLimit {
    /// Blocks until the instance's resources are granted; they are held until the returned
    /// [`Grant`] is dropped.
    pub fn acquire(&self) -> Grant<'_> {
        self.wait_for_grant(false)
    }

    /// Queues for a grant (first giving back the one held, under the same lock) and blocks
    /// until it comes.
    fn wait_for_grant(&self, give_back: bool) -> Grant<'_> {
        let limiter = &*self.limiter;
        let mut inner = limiter.inner.lock();
        if give_back {
            inner.ledger.release(self.id);
        }
        let ticket = inner.ledger.wait(self.id);
        limiter.grant(&mut inner);
        loop {
            if let Some(position) = inner.granted.iter().position(|t| *t == ticket) {
                inner.granted.swap_remove(position);
                return Grant { limit: self };
            }
            limiter.changed.wait(&mut inner);
        }
    }
}

impl Drop for InstanceLimit {
    fn drop(&mut self) {
        let limiter = &*self.limiter;
        let mut inner = limiter.inner.lock();
        inner.ledger.unregister(self.id);
        // Default pool sizes may have shrunk or grown: someone may fit now.
        limiter.grant(&mut inner);
    }
}

/// Resources held while an instance executes.
pub struct Grant<'a> {
    limit: &'a InstanceLimit,
}

impl<'a> Grant<'a> {
    /// For an instance that has its next batch already: gives the resources back and queues
    /// for them again in one step, so the instance competes with the other waiters by
    /// priority. (Released first and requested after, the resources would always go to
    /// whoever was waiting, whatever the priorities.)
    pub fn renew(self) -> Grant<'a> {
        let limit = self.limit;
        // The release happens inside `wait_for_grant`, not in `drop`.
        std::mem::forget(self);
        limit.wait_for_grant(true)
    }
}

impl Drop for Grant<'_> {
    fn drop(&mut self) {
        let limiter = &*self.limit.limiter;
        let mut inner = limiter.inner.lock();
        inner.ledger.release(self.limit.id);
        limiter.grant(&mut inner);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    fn enabled(specs: &[&str]) -> RateLimitConfig {
        let mut c = RateLimitConfig {
            enabled: true,
            ..Default::default()
        };
        for s in specs {
            c.add_resource(s).unwrap();
        }
        c
    }

    fn one(name: &str, count: u32) -> InstanceNeeds {
        InstanceNeeds {
            resources: vec![(
                ResourceKey {
                    name: name.into(),
                    device: Some(0),
                },
                count,
            )],
            priority: 1,
        }
    }

    #[test]
    fn resource_flags_parse_and_bad_ones_name_what_is_wrong() {
        let c = enabled(&["R1:10", "R2:5:0", "R2:8:1"]);
        assert_eq!(c.limits.all_devices["R1"], 10);
        assert_eq!(c.limits.per_device[&("R2".to_string(), 1)], 8);
        let mut c = RateLimitConfig::default();
        for (spec, what) in [
            ("R1", "wrong number"),
            (":3", "name is empty"),
            ("R:x", "count"),
            ("R:-1", "count"),
            ("R:1:-2", "device"),
            ("R:1:0:0", "wrong number"),
        ] {
            let e = c.add_resource(spec).unwrap_err();
            assert!(e.contains(what) && e.contains(spec), "{spec}: {e}");
        }
    }

    #[test]
    fn off_registers_nothing() {
        let limiter = RateLimiter::new(&RateLimitConfig::default());
        assert!(limiter.register(one("R", 5)).unwrap().is_none());
    }

    #[test]
    fn threads_sharing_a_pool_of_one_never_execute_at_once() {
        let limiter = RateLimiter::new(&enabled(&["R:1"]));
        let limits: Vec<_> = (0..4)
            .map(|_| limiter.register(one("R", 1)).unwrap().unwrap())
            .collect();
        let running = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let start = Barrier::new(limits.len());
        std::thread::scope(|s| {
            for limit in &limits {
                let (running, most, start) = (&running, &most, &start);
                s.spawn(move || {
                    start.wait();
                    for _ in 0..200 {
                        let _grant = limit.acquire();
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::yield_now();
                        running.fetch_sub(1, Ordering::SeqCst);
                    }
                });
            }
        });
        assert_eq!(most.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_need_beyond_the_flags_fails_registration() {
        let limiter = RateLimiter::new(&enabled(&["R:1"]));
        let e = limiter.register(one("R", 2)).err().unwrap();
        assert!(e.contains("resource 'R' on device 0"), "{e}");
    }
}
