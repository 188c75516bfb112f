//! W3C Trace Context (level 1) as a client sends it: the `traceparent` and `tracestate`
//! headers (HTTP) or metadata (gRPC), and the gRPC `grpc-timeout` that becomes a deadline.
//!
//! ```text
//! traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
//!              ver trace-id (32 lc hex, not 0)     parent-id (16)   flags
//! tracestate:  vendor1=value,vendor2=value        kept only beside a valid traceparent
//! ```
//!
//! Per the W3C rule an invalid `traceparent` is ignored, never an error: [`TraceContext::parse`]
//! answers `None` and the request goes on without a trace context. The server does not start
//! spans of its own yet; it carries the client's context unchanged (router → worker).

use std::time::Duration;

/// The header (and gRPC metadata key) carrying the trace parent.
pub const TRACEPARENT: &str = "traceparent";
/// The header (and gRPC metadata key) carrying vendor trace state.
pub const TRACESTATE: &str = "tracestate";
/// The gRPC metadata key carrying the client's timeout.
pub const GRPC_TIMEOUT: &str = "grpc-timeout";

/// Longest `tracestate` kept; a longer one is dropped (W3C asks vendors to pass at least 512).
pub const MAX_TRACESTATE_LEN: usize = 512;

/// Length of a version `00` traceparent, and the prefix every version shares.
const TRACEPARENT_LEN: usize = 55;

/// A validated W3C trace context, passed on unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceContext {
    traceparent: String,
    tracestate: Option<String>,
}

impl TraceContext {
    /// Validates `traceparent` (W3C Trace Context level 1); `None` when it is invalid.
    /// `tracestate` is kept only beside a valid traceparent and when at most
    /// [`MAX_TRACESTATE_LEN`] characters long and not empty.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<TraceContext> {
        if !valid_traceparent(traceparent) {
            return None;
        }
        let tracestate = tracestate
            .filter(|s| !s.trim().is_empty() && s.len() <= MAX_TRACESTATE_LEN)
            .map(str::to_string);
        Some(TraceContext {
            traceparent: traceparent.to_string(),
            tracestate,
        })
    }

    /// The context of a request from its header (or metadata) values, all of them: exactly one
    /// `traceparent`, and `tracestate` values joined with `,` (W3C lets a list span headers).
    /// Values that were not text are left out by the caller.
    pub fn from_values<'a>(
        traceparents: impl IntoIterator<Item = &'a str>,
        tracestates: impl IntoIterator<Item = &'a str>,
    ) -> Option<TraceContext> {
        let mut traceparents = traceparents.into_iter();
        let (Some(traceparent), None) = (traceparents.next(), traceparents.next()) else {
            return None;
        };
        let tracestate = tracestates.into_iter().collect::<Vec<_>>().join(",");
        TraceContext::parse(traceparent, Some(&tracestate))
    }

    /// The W3C `traceparent` header value, as validated.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The W3C `tracestate` header value (several joined with `,`), when given.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }
}

fn lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn valid_traceparent(value: &str) -> bool {
    if value.len() < TRACEPARENT_LEN || !value.is_ascii() {
        return false;
    }
    let (version, trace_id, parent_id, flags) =
        (&value[0..2], &value[3..35], &value[36..52], &value[53..55]);
    let dashes = [2, 35, 52].iter().all(|&i| value.as_bytes()[i] == b'-');
    if !dashes || !lower_hex(version) || version == "ff" {
        return false;
    }
    if !lower_hex(trace_id) || trace_id.bytes().all(|b| b == b'0') {
        return false;
    }
    if !lower_hex(parent_id) || parent_id.bytes().all(|b| b == b'0') || !lower_hex(flags) {
        return false;
    }
    match (version, value.len()) {
        (_, TRACEPARENT_LEN) => true,
        // Version 00 has exactly four fields; a later version may add fields after a '-'.
        ("00", _) => false,
        _ => value.as_bytes()[TRACEPARENT_LEN] == b'-',
    }
}

/// Parses a `grpc-timeout` value (gRPC over HTTP/2: 1 to 8 digits and a unit `H`, `M`, `S`,
/// `m`, `u` or `n`); `None` when malformed.
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if !value.is_ascii() || value.len() < 2 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALID: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_is_kept_with_its_tracestate() {
        let c =
            TraceContext::parse(VALID, Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")).unwrap();
        assert_eq!(c.traceparent(), VALID);
        assert_eq!(
            c.tracestate(),
            Some("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
        );
        let c = TraceContext::parse(VALID, None).unwrap();
        assert_eq!(c.tracestate(), None);
        let unsampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(TraceContext::parse(unsampled, None).is_some());
    }

    #[test]
    fn invalid_traceparents_are_ignored() {
        let invalid = [
            "",
            "00",
            // Uppercase hex.
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
            "0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // All-zero ids.
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            // Version ff is forbidden.
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            // Wrong lengths and separators.
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e47366-0f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            // Version 00 has nothing after the flags.
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ",
            // Non-hex and non-ASCII.
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-é1",
        ];
        for value in invalid {
            assert_eq!(TraceContext::parse(value, Some("a=b")), None, "{value:?}");
        }
    }

    #[test]
    fn a_future_version_may_carry_more_fields() {
        let future = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future";
        assert_eq!(
            TraceContext::parse(future, None).unwrap().traceparent(),
            future
        );
        let bare = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(TraceContext::parse(bare, None).is_some());
        let glued = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x";
        assert_eq!(TraceContext::parse(glued, None), None);
    }

    #[test]
    fn an_oversized_or_empty_tracestate_is_dropped() {
        let long = format!("k={}", "v".repeat(MAX_TRACESTATE_LEN));
        let c = TraceContext::parse(VALID, Some(&long)).unwrap();
        assert_eq!(c.tracestate(), None);
        let fits = format!("k={}", "v".repeat(MAX_TRACESTATE_LEN - 2));
        let c = TraceContext::parse(VALID, Some(&fits)).unwrap();
        assert_eq!(c.tracestate(), Some(fits.as_str()));
        assert_eq!(
            TraceContext::parse(VALID, Some("")).unwrap().tracestate(),
            None
        );
    }

    #[test]
    fn header_values_need_one_traceparent_and_join_tracestates() {
        let c = TraceContext::from_values([VALID], ["a=1", "b=2"]).unwrap();
        assert_eq!(c.tracestate(), Some("a=1,b=2"));
        assert_eq!(TraceContext::from_values([VALID, VALID], ["a=1"]), None);
        assert_eq!(TraceContext::from_values([], ["a=1"]), None);
        let c = TraceContext::from_values([VALID], []).unwrap();
        assert_eq!(c.tracestate(), None);
    }

    #[test]
    fn grpc_timeouts_parse_in_every_unit() {
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("3S"), Some(Duration::from_secs(3)));
        assert_eq!(
            parse_grpc_timeout("1500m"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_grpc_timeout("20u"), Some(Duration::from_micros(20)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        assert_eq!(parse_grpc_timeout("0S"), Some(Duration::ZERO));
    }

    #[test]
    fn malformed_grpc_timeouts_are_refused() {
        for value in [
            "",
            "S",
            "5",
            "123456789S",
            "5s",
            "-5S",
            "+5S",
            "5 S",
            "1.5S",
            "5SS",
            "٣S",
        ] {
            assert_eq!(parse_grpc_timeout(value), None, "{value:?}");
        }
    }
}
