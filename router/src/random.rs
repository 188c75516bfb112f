//! Where replica choice and traffic splits get their randomness: a small seeded generator, and
//! the trait tests use to inject a fixed sequence.

/// Where randomness comes from; tests inject a fixed sequence.
pub trait RandomSource: Send {
    fn next_u64(&mut self) -> u64;

    /// A value in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// SplitMix64: small, fast and good enough to spread load.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator started at `seed`: the same seed gives the same sequence (tests pass fixed
    /// seeds; the router seeds from the clock).
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }
}

impl RandomSource for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
