//! Finished spans as the exporter ships them, their W3C ids, and the clock that turns the
//! monotonic instants request paths measure into the wall-clock nanoseconds OTLP wants.

use std::sync::OnceLock;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use nereid_proto::TraceContext;

pub type TraceId = [u8; 16];
pub type SpanId = [u8; 8];

/// OTLP span kinds Nereid produces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    /// A request as a server received it.
    Server,
    /// A call to another process (the router's forward to a worker).
    Client,
    /// A phase inside one process (queue, compute, send).
    Internal,
}

/// An attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    /// A string attribute (OTLP `string_value`).
    Text(String),
    /// An integer attribute (OTLP `int_value`).
    Int(i64),
}

/// One finished span.
#[derive(Clone, Debug, PartialEq)]
pub struct SpanRecord {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub parent_span_id: Option<SpanId>,
    pub name: String,
    pub kind: SpanKind,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub attributes: Vec<(String, AttrValue)>,
    /// Set when the operation failed: the error message.
    pub error: Option<String>,
}

/// A random non-zero trace id.
pub fn new_trace_id() -> TraceId {
    loop {
        let id = fastrand::u128(..).to_be_bytes();
        if id != [0; 16] {
            return id;
        }
    }
}

/// A random non-zero span id.
pub fn new_span_id() -> SpanId {
    loop {
        let id = fastrand::u64(..).to_be_bytes();
        if id != [0; 8] {
            return id;
        }
    }
}

/// The trace id, parent span id and sampled flag of a W3C context.
pub fn parent_of(context: &TraceContext) -> Option<(TraceId, SpanId, bool)> {
    let mut parts = context.traceparent().split('-');
    let (_version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let trace = u128::from_str_radix(trace, 16).ok()?.to_be_bytes();
    let span = u64::from_str_radix(span, 16).ok()?.to_be_bytes();
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some((trace, span, flags & 1 == 1))
}

/// The W3C context naming `span` of `trace` as the parent, sampled, keeping `tracestate`.
pub fn context_for(trace: TraceId, span: SpanId, tracestate: Option<&str>) -> TraceContext {
    let traceparent = format!("00-{}-{}-01", hex(&trace), hex(&span));
    TraceContext::parse(&traceparent, tracestate).unwrap_or_else(|| {
        unreachable!("a traceparent built from non-zero ids is valid: {traceparent}")
    })
}

/// Lower-case hex, as W3C and log lines write ids.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Wall-clock nanoseconds since the Unix epoch of a monotonic instant, from one anchor taken
/// the first time it is needed (so spans of a request never reorder when the wall clock
/// steps).
pub fn unix_nanos(at: Instant) -> u64 {
    static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
    let (anchor, anchor_nanos) = *ANCHOR.get_or_init(|| {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        (Instant::now(), now)
    });
    if at >= anchor {
        anchor_nanos.saturating_add(at.duration_since(anchor).as_nanos() as u64)
    } else {
        anchor_nanos.saturating_sub(anchor.duration_since(at).as_nanos() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_round_trip_ids() {
        let (trace, span) = (new_trace_id(), new_span_id());
        let context = context_for(trace, span, Some("a=1"));
        assert_eq!(parent_of(&context), Some((trace, span, true)));
        assert_eq!(context.tracestate(), Some("a=1"));
        let unsampled = TraceContext::parse(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
            None,
        )
        .unwrap();
        assert!(!parent_of(&unsampled).unwrap().2);
    }

    #[test]
    fn the_clock_keeps_instants_ordered() {
        let a = Instant::now();
        let b = a + std::time::Duration::from_micros(5);
        assert_eq!(unix_nanos(b) - unix_nanos(a), 5_000);
        assert!(unix_nanos(a) > 1_600_000_000_000_000_000);
    }
}
