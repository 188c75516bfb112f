//! The rate limiter's decision, without threads: which waiting instances may run now.
//!
//! Resources are counted per key: a `global` resource is one pool for the server, any other
//! is one pool per device. A pool's size is what `--rate-limit-resource` gives for the name
//! (for that device, else for every device), else the largest count any registered instance
//! needs, so at least one of them can always run.
//!
//! Waiters are granted in stride order: each instance has a pass that grows by its priority
//! (0 counts as 1) with every grant, and the waiter with the smallest pass among those whose
//! resources are free goes first (ties: the one that waited longest). An instance of priority
//! 2 thus runs half as often as one of priority 1 while both wait. An instance that comes back
//! after being idle starts from the pass of the last grant, so idleness saves no credit.

use std::collections::{BTreeMap, HashMap};

/// One resource pool: a name, and the device for per-device resources (`None`: global).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourceKey {
    pub name: String,
    pub device: Option<i32>,
}

impl std::fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.device {
            Some(d) => write!(f, "'{}' on device {d}", self.name),
            None => write!(f, "global '{}'", self.name),
        }
    }
}

/// Pool sizes the operator gave (`--rate-limit-resource name:count[:device]`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResourceLimits {
    /// `name:count`: every device's pool (and the global pool) of that name.
    pub all_devices: BTreeMap<String, u32>,
    /// `name:count:device`: that device's pool only.
    pub per_device: BTreeMap<(String, i32), u32>,
}

impl ResourceLimits {
    /// The size the operator gave for `key`, if any.
    pub fn size(&self, key: &ResourceKey) -> Option<u32> {
        key.device
            .and_then(|d| self.per_device.get(&(key.name.clone(), d)).copied())
            .or_else(|| self.all_devices.get(&key.name).copied())
    }
}

/// Identifies a registered instance.
pub type InstanceId = u64;

/// Identifies one wait for resources.
pub type Ticket = u64;

struct Registered {
    needs: Vec<(ResourceKey, u32)>,
    weight: u64,
    pass: u64,
}

struct Waiting {
    ticket: Ticket,
    instance: InstanceId,
}

/// Pools, registered instances and the queue of waiting instances.
#[derive(Default)]
pub struct Ledger {
    limits: ResourceLimits,
    instances: HashMap<InstanceId, Registered>,
    in_use: HashMap<ResourceKey, u32>,
    waiting: Vec<Waiting>,
    next_instance: InstanceId,
    next_ticket: Ticket,
    /// The pass of the last grant: where an instance coming back from idleness starts.
    clock: u64,
}

impl Ledger {
    pub fn new(limits: ResourceLimits) -> Ledger {
        Ledger {
            limits,
            ..Ledger::default()
        }
    }

    /// Registers an instance that needs `needs` to run, or says which resource the operator's
    /// pool sizes cannot ever satisfy.
    pub fn register(
        &mut self,
        needs: Vec<(ResourceKey, u32)>,
        priority: u32,
    ) -> Result<InstanceId, String> {
        for (key, count) in &needs {
            if let Some(size) = self.limits.size(key)
                && *count > size
            {
                return Err(format!(
                    "needs {count} of resource {key}, but --rate-limit-resource makes only {size} available"
                ));
            }
        }
        let id = self.next_instance;
        self.next_instance += 1;
        self.instances.insert(
            id,
            Registered {
                needs,
                weight: u64::from(priority.max(1)),
                pass: self.clock,
            },
        );
        Ok(id)
    }

    /// Forgets an instance (its model was unloaded). It must not be waiting or running.
    pub fn unregister(&mut self, instance: InstanceId) {
        self.instances.remove(&instance);
        self.waiting.retain(|w| w.instance != instance);
    }

    /// The size of `key`'s pool now.
    pub fn size(&self, key: &ResourceKey) -> u32 {
        self.limits.size(key).unwrap_or_else(|| {
            self.instances
                .values()
                .flat_map(|i| &i.needs)
                .filter(|(k, _)| k == key)
                .map(|(_, c)| *c)
                .max()
                .unwrap_or(0)
        })
    }

    /// Queues `instance` for its resources; [`Ledger::grant`] says when it may run.
    pub fn wait(&mut self, instance: InstanceId) -> Ticket {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        if let Some(i) = self.instances.get_mut(&instance) {
            i.pass = i.pass.max(self.clock);
        }
        self.waiting.push(Waiting { ticket, instance });
        ticket
    }

    /// Grants as many waiters as the free resources allow, in stride order; returns their
    /// tickets. Their resources are in use until [`Ledger::release`].
    pub fn grant(&mut self) -> Vec<Ticket> {
        let mut granted = Vec::new();
        loop {
            let next = self
                .waiting
                .iter()
                .enumerate()
                .filter(|(_, w)| self.fits(w.instance))
                .min_by_key(|(_, w)| (self.pass(w.instance), w.ticket))
                .map(|(position, _)| position);
            let Some(position) = next else {
                return granted;
            };
            let w = self.waiting.remove(position);
            if let Some(i) = self.instances.get_mut(&w.instance) {
                self.clock = self.clock.max(i.pass);
                i.pass += i.weight;
                for (key, count) in &i.needs {
                    *self.in_use.entry(key.clone()).or_default() += count;
                }
            }
            granted.push(w.ticket);
        }
    }

    /// `instance` finished running: its resources are free again.
    pub fn release(&mut self, instance: InstanceId) {
        let Some(i) = self.instances.get(&instance) else {
            return;
        };
        for (key, count) in &i.needs {
            if let Some(used) = self.in_use.get_mut(key) {
                *used = used.saturating_sub(*count);
            }
        }
    }

    /// Gives up a wait that has not been granted.
    #[cfg(test)]
    pub fn cancel(&mut self, ticket: Ticket) {
        self.waiting.retain(|w| w.ticket != ticket);
    }

    fn pass(&self, instance: InstanceId) -> u64 {
        self.instances.get(&instance).map_or(0, |i| i.pass)
    }

    fn fits(&self, instance: InstanceId) -> bool {
        self.instances.get(&instance).is_none_or(|i| {
            i.needs.iter().all(|(key, count)| {
                self.in_use.get(key).copied().unwrap_or(0) + count <= self.size(key)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, device: Option<i32>) -> ResourceKey {
        ResourceKey {
            name: name.into(),
            device,
        }
    }

    fn needs(name: &str, count: u32) -> Vec<(ResourceKey, u32)> {
        vec![(key(name, Some(0)), count)]
    }

    #[test]
    fn default_pool_is_the_largest_need_so_one_instance_runs_at_a_time() {
        let mut l = Ledger::default();
        let a = l.register(needs("R", 2), 1).unwrap();
        let b = l.register(needs("R", 1), 1).unwrap();
        assert_eq!(l.size(&key("R", Some(0))), 2);
        let ta = l.wait(a);
        let tb = l.wait(b);
        assert_eq!(l.grant(), vec![ta]);
        l.release(a);
        assert_eq!(l.grant(), vec![tb]);
    }

    #[test]
    fn instances_sharing_a_pool_of_one_never_run_together() {
        let mut l = Ledger::new(ResourceLimits {
            all_devices: [("R".to_string(), 1)].into(),
            ..Default::default()
        });
        let a = l.register(needs("R", 1), 1).unwrap();
        let b = l.register(needs("R", 1), 1).unwrap();
        let ta = l.wait(a);
        let tb = l.wait(b);
        assert_eq!(l.grant(), vec![ta]);
        assert!(l.grant().is_empty(), "b must wait while a runs");
        l.release(a);
        assert_eq!(l.grant(), vec![tb]);
    }

    #[test]
    fn a_larger_pool_lets_several_run() {
        let mut l = Ledger::new(ResourceLimits {
            all_devices: [("R".to_string(), 2)].into(),
            ..Default::default()
        });
        let a = l.register(needs("R", 1), 1).unwrap();
        let b = l.register(needs("R", 1), 1).unwrap();
        let c = l.register(needs("R", 1), 1).unwrap();
        let (ta, tb, _tc) = (l.wait(a), l.wait(b), l.wait(c));
        assert_eq!(l.grant(), vec![ta, tb]);
    }

    #[test]
    fn per_device_size_wins_over_the_all_devices_size() {
        let limits = ResourceLimits {
            all_devices: [("R".to_string(), 4)].into(),
            per_device: [(("R".to_string(), 1), 2)].into(),
        };
        assert_eq!(limits.size(&key("R", Some(0))), Some(4));
        assert_eq!(limits.size(&key("R", Some(1))), Some(2));
        assert_eq!(limits.size(&key("R", None)), Some(4));
        assert_eq!(limits.size(&key("S", None)), None);
    }

    #[test]
    fn a_need_beyond_the_operators_size_is_refused_by_name() {
        let mut l = Ledger::new(ResourceLimits {
            all_devices: [("R".to_string(), 1)].into(),
            ..Default::default()
        });
        let e = l.register(needs("R", 3), 1).unwrap_err();
        assert!(e.contains("needs 3 of resource 'R' on device 0"), "{e}");
        assert!(e.contains("only 1"), "{e}");
    }

    /// Keeps `instances` waiting all the time (each waits again as soon as it ran) and
    /// returns who ran, in order, over `rounds` grants of a pool that fits one at a time.
    fn contend(l: &mut Ledger, instances: &[InstanceId], rounds: usize) -> Vec<InstanceId> {
        let mut tickets: HashMap<Ticket, InstanceId> =
            instances.iter().map(|&i| (l.wait(i), i)).collect();
        let mut order = Vec::new();
        for _ in 0..rounds {
            let granted = l.grant();
            assert_eq!(granted.len(), 1, "one at a time: {granted:?}");
            let who = tickets.remove(&granted[0]).unwrap();
            order.push(who);
            l.release(who);
            tickets.insert(l.wait(who), who);
        }
        for ticket in tickets.keys() {
            l.cancel(*ticket);
        }
        order
    }

    fn pool_of_one() -> Ledger {
        Ledger::new(ResourceLimits {
            all_devices: [("R".to_string(), 1)].into(),
            ..Default::default()
        })
    }

    #[test]
    fn priority_two_runs_half_as_often_as_priority_one_while_both_wait() {
        let mut l = pool_of_one();
        let fast = l.register(needs("R", 1), 1).unwrap();
        let slow = l.register(needs("R", 1), 2).unwrap();
        let order = contend(&mut l, &[fast, slow], 30);
        let fast_runs = order.iter().filter(|&&i| i == fast).count();
        assert_eq!(fast_runs, 20, "{order:?}");
    }

    #[test]
    fn priority_zero_counts_as_one() {
        let mut l = pool_of_one();
        let a = l.register(needs("R", 1), 0).unwrap();
        let b = l.register(needs("R", 1), 1).unwrap();
        let order = contend(&mut l, &[a, b], 10);
        assert_eq!(order.iter().filter(|&&i| i == a).count(), 5, "{order:?}");
    }

    #[test]
    fn a_waiter_that_does_not_fit_does_not_block_one_that_does() {
        let mut l = Ledger::new(ResourceLimits {
            all_devices: [("R".to_string(), 2)].into(),
            ..Default::default()
        });
        let big = l.register(needs("R", 2), 1).unwrap();
        let small1 = l.register(needs("R", 1), 1).unwrap();
        let small2 = l.register(needs("R", 1), 1).unwrap();
        let first = l.wait(small1);
        assert_eq!(l.grant(), vec![first]);
        let big_ticket = l.wait(big);
        assert!(l.grant().is_empty(), "one unit free, big needs two");
        let second = l.wait(small2);
        assert_eq!(l.grant(), vec![second], "small2 fits the free unit");
        l.release(small1);
        l.release(small2);
        assert_eq!(l.grant(), vec![big_ticket]);
    }

    #[test]
    fn global_and_per_device_pools_are_separate() {
        let mut l = Ledger::default();
        let a = l
            .register(vec![(key("G", None), 1), (key("R", Some(0)), 1)], 1)
            .unwrap();
        let b = l.register(vec![(key("R", Some(1)), 1)], 1).unwrap();
        let c = l.register(vec![(key("G", None), 1)], 1).unwrap();
        let (ta, tb, tc) = (l.wait(a), l.wait(b), l.wait(c));
        // b's device pool is its own; c shares the global pool with a.
        assert_eq!(l.grant(), vec![ta, tb]);
        l.release(a);
        assert_eq!(l.grant(), vec![tc]);
    }

    #[test]
    fn an_instance_without_needs_is_never_held_back() {
        let mut l = pool_of_one();
        let busy = l.register(needs("R", 1), 1).unwrap();
        let free = l.register(Vec::new(), 1).unwrap();
        let t = l.wait(busy);
        assert_eq!(l.grant(), vec![t]);
        let t = l.wait(free);
        assert_eq!(l.grant(), vec![t]);
    }

    #[test]
    fn idleness_saves_no_credit() {
        let mut l = pool_of_one();
        let a = l.register(needs("R", 1), 1).unwrap();
        let b = l.register(needs("R", 1), 1).unwrap();
        assert_eq!(contend(&mut l, &[a], 5), vec![a; 5]);
        // b was idle while a ran five times: they alternate, b does not get five turns.
        let order = contend(&mut l, &[a, b], 4);
        assert_eq!(order, vec![b, a, b, a]);
    }

    #[test]
    fn unregister_drops_the_instance_and_its_waits() {
        let mut l = Ledger::default();
        let a = l.register(needs("R", 3), 1).unwrap();
        let _ = l.wait(a);
        l.unregister(a);
        assert!(l.grant().is_empty());
        assert_eq!(l.size(&key("R", Some(0))), 0);
    }
}
