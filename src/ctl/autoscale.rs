//! `nereid ctl models autoscale`: set or clear a model's autoscale policy.
//!
//! ```text
//! nereid ctl models autoscale NAME --min 1 --max 4 --target-inflight 2 [--up-window 30s ...]
//! nereid ctl models autoscale NAME --off
//! ```
//!
//! `--min`/`--max` not given keep the model's current range (read with `GetModel` first);
//! window and step flags not given take the control plane's defaults. The answer is the
//! model's `AutoscaleStatus` (table or proto-JSON).

use clap::Args;
use nereid_proto::pb::cluster::{
    AutoscalePolicy, AutoscaleStatus, ModelRef, PlacementExplanation, SetAutoscaleRequest,
};

use super::client::{Connection, CtlError};
use super::table::fields;

#[derive(Args, Debug)]
pub struct AutoscaleArgs {
    pub name: String,
    /// Fewest replicas per served version (default: the model's current min_replicas).
    #[arg(long)]
    pub min: Option<u32>,
    /// Most replicas per served version (default: the model's current max_replicas).
    #[arg(long)]
    pub max: Option<u32>,
    /// Requests in flight (queued or executing) per ready replica to aim for, e.g. 2 or 0.5.
    /// Lower it for a model whose latency grows quickly with concurrency.
    #[arg(long = "target-inflight", required_unless_present = "off")]
    pub target_in_flight: Option<f64>,
    /// Load within this percentage of the target changes nothing (default 10).
    #[arg(long)]
    pub tolerance_percent: Option<u32>,
    /// How long load must stay above the band before adding replicas: `500ms`, `30s`, `2m`
    /// (default 30s).
    #[arg(long, value_parser = parse_duration_ms)]
    pub up_window: Option<u64>,
    /// How long load must stay below the band before removing replicas (default 5m).
    #[arg(long, value_parser = parse_duration_ms)]
    pub down_window: Option<u64>,
    /// Time after a change during which nothing changes again (default 30s).
    #[arg(long, value_parser = parse_duration_ms)]
    pub cooldown: Option<u64>,
    /// Most replicas one decision adds or removes (default 4).
    #[arg(long)]
    pub max_step: Option<u32>,
    /// Turn autoscaling off: the model goes back to min_replicas.
    #[arg(long, conflicts_with_all = [
        "target_in_flight", "tolerance_percent", "up_window", "down_window", "cooldown", "max_step"
    ])]
    pub off: bool,
}

/// `500ms`, `30s`, `2m` or a bare number of milliseconds.
pub fn parse_duration_ms(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, factor) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60_000)
    } else {
        (t, 1)
    };
    digits
        .trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| format!("'{text}' is not a duration; write e.g. 500ms, 30s or 2m"))
}

/// The request for `args`, the model's current range filling `--min`/`--max` left out.
pub fn autoscale_request(
    args: &AutoscaleArgs,
    current: (u32, u32),
) -> Result<SetAutoscaleRequest, String> {
    let min = args.min.unwrap_or(current.0);
    let max = args.max.unwrap_or(current.1);
    if max < min {
        return Err(format!("--max {max} is below --min {min}"));
    }
    let policy = match (args.off, args.target_in_flight) {
        (true, _) => None,
        (false, None) => return Err("--target-inflight is required (or --off)".into()),
        (false, Some(target)) => {
            if !target.is_finite() || target <= 0.0 {
                return Err(format!(
                    "--target-inflight {target} must be a number above 0"
                ));
            }
            Some(AutoscalePolicy {
                target_in_flight: target,
                tolerance_percent: args.tolerance_percent.unwrap_or(0),
                up_window_ms: args.up_window.unwrap_or(0),
                down_window_ms: args.down_window.unwrap_or(0),
                cooldown_ms: args.cooldown.unwrap_or(0),
                max_step: args.max_step.unwrap_or(0),
            })
        }
    };
    Ok(SetAutoscaleRequest {
        name: args.name.clone(),
        min_replicas: min,
        max_replicas: max,
        policy,
    })
}

/// Reads the model's range when a flag leaves it out, then writes the policy.
pub async fn set(
    connection: &Connection,
    args: &AutoscaleArgs,
    consistency: i32,
) -> Result<AutoscaleStatus, CtlError> {
    let current = if args.min.is_some() && args.max.is_some() {
        (0, 0)
    } else {
        let message = ModelRef {
            name: args.name.clone(),
            consistency,
        };
        let status = connection
            .call(message, |mut c, r| async move { c.get_model(r).await })
            .await?;
        status
            .model
            .map_or((0, 0), |m| (m.min_replicas, m.max_replicas))
    };
    let message = autoscale_request(args, current).map_err(CtlError::Usage)?;
    connection
        .call(message, |mut c, r| async move { c.set_autoscale(r).await })
        .await
}

fn secs(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{} ms", ms)
    }
}

/// The policy in one line.
pub fn policy_line(p: &AutoscalePolicy) -> String {
    format!(
        "target {} in flight per replica ±{}%, up after {}, down after {}, cooldown {}, max step {}",
        p.target_in_flight,
        p.tolerance_percent,
        secs(p.up_window_ms),
        secs(p.down_window_ms),
        secs(p.cooldown_ms),
        p.max_step
    )
}

fn status_fields(s: &AutoscaleStatus) -> Vec<(&'static str, String)> {
    let or_none = |v: &str| {
        if v.is_empty() {
            "none".to_string()
        } else {
            v.to_string()
        }
    };
    vec![
        (
            "replicas",
            format!(
                "{} (min {}, max {})",
                s.replicas, s.min_replicas, s.max_replicas
            ),
        ),
        (
            "autoscale",
            s.policy
                .as_ref()
                .map_or_else(|| "off".to_string(), policy_line),
        ),
        ("last change", or_none(&s.last_change)),
        ("latest", or_none(&s.latest)),
    ]
}

pub fn render(s: &AutoscaleStatus) -> String {
    let mut pairs = vec![("model", s.model.clone())];
    pairs.extend(status_fields(s));
    pairs.push(("revision", s.revision.to_string()));
    fields(&pairs)
}

/// The autoscale section of `ctl models placement`; empty for a model that does not autoscale.
pub fn placement_section(explanation: &PlacementExplanation) -> String {
    match &explanation.autoscale {
        Some(s) => format!("\nAutoscaling:\n{}", fields(&status_fields(s))),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &[&str]) -> AutoscaleArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct Cmd {
            #[command(flatten)]
            a: AutoscaleArgs,
        }
        let mut argv = vec!["autoscale"];
        argv.extend_from_slice(line);
        Cmd::try_parse_from(argv).map(|c| c.a).unwrap()
    }

    #[test]
    fn flags_become_the_policy_and_missing_range_comes_from_the_model() {
        let a = args(&[
            "m",
            "--max",
            "4",
            "--target-inflight",
            "1.5",
            "--up-window",
            "2s",
            "--cooldown",
            "500ms",
        ]);
        let r = autoscale_request(&a, (1, 1)).unwrap();
        assert_eq!((r.min_replicas, r.max_replicas), (1, 4));
        let p = r.policy.unwrap();
        assert_eq!(p.target_in_flight, 1.5);
        assert_eq!(
            (p.up_window_ms, p.cooldown_ms, p.down_window_ms),
            (2000, 500, 0)
        );
    }

    #[test]
    fn off_sends_no_policy_and_bad_values_are_usage_errors() {
        let r = autoscale_request(&args(&["m", "--off"]), (2, 3)).unwrap();
        assert!(r.policy.is_none());
        assert_eq!((r.min_replicas, r.max_replicas), (2, 3));
        let e = autoscale_request(
            &args(&["m", "--min", "3", "--max", "2", "--target-inflight", "1"]),
            (0, 0),
        );
        assert!(e.unwrap_err().contains("--max 2 is below --min 3"));
        let e = autoscale_request(&args(&["m", "--target-inflight=-1"]), (1, 2));
        assert!(e.unwrap_err().contains("--target-inflight -1"));
        assert!(
            parse_duration_ms("3h")
                .unwrap_err()
                .contains("'3h' is not a duration")
        );
        assert_eq!(parse_duration_ms("2m"), Ok(120_000));
    }

    #[test]
    fn the_status_shows_the_policy_and_both_reasons() {
        let s = AutoscaleStatus {
            model: "m".into(),
            min_replicas: 1,
            max_replicas: 2,
            policy: Some(AutoscalePolicy {
                target_in_flight: 2.0,
                tolerance_percent: 10,
                up_window_ms: 2000,
                down_window_ms: 4000,
                cooldown_ms: 1500,
                max_step: 1,
            }),
            replicas: 2,
            last_change: "scale up 1 -> 2: load stayed above 2.20".into(),
            latest: "cooling down".into(),
            revision: 7,
        };
        let text = render(&s);
        assert!(text.contains("2 (min 1, max 2)"), "{text}");
        assert!(text.contains("target 2 in flight per replica ±10%, up after 2 s, down after 4 s, cooldown 1500 ms, max step 1"), "{text}");
        assert!(text.contains("scale up 1 -> 2"), "{text}");
    }
}
