//! Timing samples per kind of round, and the table / JSON the simulator prints.

use std::time::Duration;

use serde_json::{Value, json};

use super::cluster::Packing;

/// Every timed `plan()` call of one kind of round.
#[derive(Debug, Clone, Default)]
pub struct RoundStats {
    pub name: String,
    pub times: Vec<Duration>,
    pub adds: Vec<usize>,
    pub removes: Vec<usize>,
    /// Replicas left unplaced (sum of `missing`) after the plan.
    pub unplaced: Vec<u64>,
}

impl RoundStats {
    pub fn new(name: &str) -> RoundStats {
        RoundStats {
            name: name.into(),
            ..Default::default()
        }
    }

    pub fn p50(&self) -> Duration {
        let mut t = self.times.clone();
        t.sort();
        t.get(t.len().saturating_sub(1) / 2)
            .copied()
            .unwrap_or_default()
    }

    pub fn max(&self) -> Duration {
        self.times.iter().max().copied().unwrap_or_default()
    }

    fn mean(values: impl Iterator<Item = u64>, n: usize) -> u64 {
        if n == 0 {
            0
        } else {
            values.sum::<u64>() / n as u64
        }
    }

    pub fn mean_adds(&self) -> u64 {
        Self::mean(self.adds.iter().map(|&a| a as u64), self.adds.len())
    }

    pub fn mean_removes(&self) -> u64 {
        Self::mean(self.removes.iter().map(|&r| r as u64), self.removes.len())
    }

    pub fn last_unplaced(&self) -> u64 {
        self.unplaced.last().copied().unwrap_or(0)
    }
}

/// Everything one simulation measured.
pub struct Report {
    pub settings: Value,
    pub rounds: Vec<RoundStats>,
    pub initial: Packing,
    pub last: Packing,
    pub target: Duration,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn packing_json(p: &Packing) -> Value {
    json!({
        "replicas_placed": p.replicas,
        "replicas_wanted": p.wanted,
        "memory_placed_bytes": p.used_bytes,
        "hosting_nodes": p.hosting_nodes,
        "hosting_capacity_bytes": p.hosting_capacity_bytes,
        "up_nodes": p.up_nodes,
        "capacity_bytes": p.capacity_bytes,
        "packing_efficiency": p.efficiency(),
        "utilization": p.utilization(),
    })
}

impl Report {
    /// The slowest round overall, and whether it is within the target.
    pub fn worst(&self) -> Duration {
        self.rounds
            .iter()
            .map(RoundStats::max)
            .max()
            .unwrap_or_default()
    }

    pub fn to_json(&self) -> Value {
        json!({
            "settings": self.settings,
            "rounds": self.rounds.iter().map(|r| json!({
                "round": r.name,
                "samples": r.times.len(),
                "p50_ms": ms(r.p50()),
                "max_ms": ms(r.max()),
                "mean_adds": r.mean_adds(),
                "mean_removes": r.mean_removes(),
                "unplaced": r.last_unplaced(),
            })).collect::<Vec<_>>(),
            "initial_packing": packing_json(&self.initial),
            "final_packing": packing_json(&self.last),
            "worst_ms": ms(self.worst()),
            "target_ms": ms(self.target),
            "within_target": self.worst() <= self.target,
        })
    }

    pub fn to_table(&self) -> String {
        let mut rows = vec![
            [
                "ROUND", "SAMPLES", "P50 MS", "MAX MS", "ADDS", "REMOVES", "UNPLACED",
            ]
            .map(String::from),
        ];
        for r in &self.rounds {
            rows.push([
                r.name.clone(),
                r.times.len().to_string(),
                format!("{:.2}", ms(r.p50())),
                format!("{:.2}", ms(r.max())),
                r.mean_adds().to_string(),
                r.mean_removes().to_string(),
                r.last_unplaced().to_string(),
            ]);
        }
        let mut widths = [0usize; 7];
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let mut out = String::new();
        for row in &rows {
            let line: Vec<String> = row
                .iter()
                .zip(widths)
                .enumerate()
                .map(|(i, (cell, w))| {
                    if i == 0 {
                        format!("{cell:<w$}")
                    } else {
                        format!("{cell:>w$}")
                    }
                })
                .collect();
            out.push_str(line.join("  ").trim_end());
            out.push('\n');
        }
        out.push('\n');
        for (label, p) in [("initial", &self.initial), ("final", &self.last)] {
            out.push_str(&format!(
                "{label:<8} placed {}/{} replicas, {:.1} GiB on {} of {} up nodes: packing \
                 efficiency {:.1}% (of hosting nodes' {:.1} GiB), utilization {:.1}% (of {:.1} GiB)\n",
                p.replicas,
                p.wanted,
                gib(p.used_bytes),
                p.hosting_nodes,
                p.up_nodes,
                p.efficiency() * 100.0,
                gib(p.hosting_capacity_bytes),
                p.utilization() * 100.0,
                gib(p.capacity_bytes),
            ));
        }
        out.push_str(&format!(
            "slowest round {:.2} ms; target {:.0} ms: {}\n",
            ms(self.worst()),
            ms(self.target),
            if self.worst() <= self.target {
                "met"
            } else {
                "MISSED"
            }
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_means() {
        let mut r = RoundStats::new("kill");
        for (t, a) in [(5, 10), (1, 20), (9, 30)] {
            r.times.push(Duration::from_millis(t));
            r.adds.push(a);
            r.removes.push(1);
            r.unplaced.push(t);
        }
        assert_eq!(r.p50(), Duration::from_millis(5));
        assert_eq!(r.max(), Duration::from_millis(9));
        assert_eq!(
            (r.mean_adds(), r.mean_removes(), r.last_unplaced()),
            (20, 1, 9)
        );
        assert_eq!(RoundStats::new("x").p50(), Duration::ZERO);
    }
}
