//! Recent observations for the latency summaries: a ring of the last [`WINDOW`] values per
//! series, from which quantiles are computed exactly at scrape time. Memory is bounded by the
//! ring (8 bytes × [`WINDOW`] per series); sums and counts come from the cumulative counters
//! instead, so they never forget.

use std::collections::VecDeque;

/// How many recent observations a summary's quantiles are computed over.
pub const WINDOW: usize = 1024;

/// The last [`WINDOW`] observations of one series.
#[derive(Clone, Debug, Default)]
pub struct Window {
    values: VecDeque<u64>,
}

impl Window {
    /// Adds an observation, forgetting the oldest once full.
    pub fn observe(&mut self, value: u64) {
        if self.values.len() == WINDOW {
            self.values.pop_front();
        }
        self.values.push_back(value);
    }

    /// The observations, oldest first.
    pub fn values(&self) -> Vec<u64> {
        self.values.iter().copied().collect()
    }
}

/// Quantiles of `values` by the nearest-rank method: for `q`, the smallest value with at least
/// `q` of the observations at or below it. No observations: every quantile is NaN, as the
/// Prometheus client libraries report it.
pub fn quantiles(mut values: Vec<u64>, qs: &[f64]) -> Vec<(f64, f64)> {
    values.sort_unstable();
    qs.iter()
        .map(|&q| {
            if values.is_empty() {
                return (q, f64::NAN);
            }
            let rank = (q * values.len() as f64).ceil() as usize;
            let index = rank.clamp(1, values.len()) - 1;
            (q, values[index] as f64)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let values: Vec<u64> = (1..=100).rev().collect();
        let q = quantiles(values, &[0.5, 0.9, 0.99, 0.999, 0.0, 1.0]);
        assert_eq!(
            q,
            vec![
                (0.5, 50.0),
                (0.9, 90.0),
                (0.99, 99.0),
                (0.999, 100.0),
                (0.0, 1.0),
                (1.0, 100.0)
            ]
        );
        assert_eq!(quantiles(vec![7], &[0.5]), vec![(0.5, 7.0)]);
        assert!(quantiles(Vec::new(), &[0.5])[0].1.is_nan());
    }

    #[test]
    fn window_keeps_only_the_most_recent() {
        let mut w = Window::default();
        for v in 0..(WINDOW as u64 + 10) {
            w.observe(v);
        }
        let values = w.values();
        assert_eq!(values.len(), WINDOW);
        assert_eq!(values[0], 10);
        assert_eq!(quantiles(values, &[1.0]), vec![(1.0, (WINDOW + 9) as f64)]);
    }
}
