//! A small deterministic generator (xorshift64), so a randomized test replays from its seed
//! and needs no extra crate.

/// xorshift64 (shifts 13, 7, 17). Not for anything but tests.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`; any seed (0 included) gives a well-mixed, non-zero state.
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// A generator whose state is exactly `state` (not 0), for tests whose fixed seeds predate
    /// this crate and must keep replaying the same sequence.
    pub fn from_state(state: u64) -> Self {
        assert_ne!(state, 0, "xorshift never leaves the state 0");
        Rng(state)
    }

    /// The next value of the xorshift64 sequence; every other draw derives from it.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `items`, which must not be empty.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    /// Shuffles `items` in place (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }

    /// A float in `0.0..1.0`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_and_values_stay_in_range() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..1000 {
            assert_eq!(a.next_u64(), b.next_u64());
            let below = a.below(10);
            assert!(below < 10);
            assert_eq!(b.below(10), below);
            let unit = a.unit();
            assert!((0.0..1.0).contains(&unit));
            assert_eq!(b.unit(), unit);
        }
        assert_eq!(Rng::new(0).below(0), 0);
        let mut items: Vec<u32> = (0..50).collect();
        Rng::new(3).shuffle(&mut items);
        let mut sorted = items.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..50).collect::<Vec<_>>());
        assert_ne!(items, sorted, "50 items shuffled into their own order");
    }

    #[test]
    fn from_state_is_plain_xorshift() {
        // The first xorshift64 (13, 7, 17) output from state 1.
        assert_eq!(Rng::from_state(1).next_u64(), 1_082_269_761);
    }
}
