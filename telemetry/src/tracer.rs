//! The per-process tracer: decides whether a request is traced and collects its spans.
//!
//! ```text
//! request path ── Tracer::start(name, model, context) ── not sampled ─► None (one atomic load
//!                         │ sampled                                    when tracing is off)
//!                         ▼
//!                  RequestTrace (root span: parent = caller's traceparent, if any)
//!                    ├─ phase(name, start, end)     queue, compute_input, compute_infer, ...
//!                    ├─ child_context()             traceparent for a step / a forwarded call
//!                    ├─ done(at) + ResponseHook     the frontend closes it after encoding:
//!                    │                              `send` = [done, sent]
//!                    └─ end / drop ─► SpanSink ─► exporter (bounded; full ⇒ dropped, counted)
//! ```

use std::sync::Arc;
use std::time::Instant;

use nereid_proto::{OpenSpan, RequestContext, TraceContext};

use crate::span::{
    AttrValue, SpanId, SpanKind, SpanRecord, TraceId, context_for, hex, new_span_id, new_trace_id,
    parent_of, unix_nanos,
};
use crate::trace_config::TraceSettingsStore;

/// Where finished spans go (the OTLP exporter, or a test's collector).
pub trait SpanSink: Send + Sync + 'static {
    fn export(&self, spans: Vec<SpanRecord>);
}

/// Decides and records traces for one process.
#[derive(Clone)]
pub struct Tracer {
    settings: Arc<TraceSettingsStore>,
    sink: Option<Arc<dyn SpanSink>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("exporting", &self.sink.is_some())
            .finish()
    }
}

impl Tracer {
    /// A tracer that samples by `settings` and ships to `sink` (`None`: never traces, but the
    /// settings API still works).
    pub fn new(settings: Arc<TraceSettingsStore>, sink: Option<Arc<dyn SpanSink>>) -> Tracer {
        Tracer { settings, sink }
    }

    /// A tracer that never traces, with default settings.
    pub fn disabled() -> Tracer {
        Tracer::new(Arc::new(TraceSettingsStore::new(Default::default())), None)
    }

    pub fn settings(&self) -> &Arc<TraceSettingsStore> {
        &self.settings
    }

    /// Starts the root span of a request for `model`, when it is sampled. The span starts when
    /// the frontend received the request (`context.received`), or now.
    pub fn start(
        &self,
        name: &str,
        kind: SpanKind,
        model: &str,
        context: &RequestContext,
    ) -> Option<RequestTrace> {
        let sink = self.sink.as_ref()?;
        if self.settings.all_off() {
            return None;
        }
        let parent = context.trace.as_ref().and_then(parent_of);
        if !self.settings.sample(model, parent.map(|p| p.2)) {
            return None;
        }
        let (trace_id, parent_span_id) = match parent {
            Some((trace, span, _)) => (trace, Some(span)),
            None => (new_trace_id(), None),
        };
        Some(RequestTrace {
            sink: sink.clone(),
            trace_id,
            span_id: new_span_id(),
            parent_span_id,
            tracestate: context
                .trace
                .as_ref()
                .and_then(|t| t.tracestate().map(str::to_string)),
            name: name.to_string(),
            kind,
            start: context.received.unwrap_or_else(Instant::now),
            done: None,
            attributes: vec![("model.name".into(), AttrValue::Text(model.to_string()))],
            error: None,
            children: Vec::new(),
            ended: false,
        })
    }
}

/// The open root span of one traced request and its finished children.
pub struct RequestTrace {
    sink: Arc<dyn SpanSink>,
    trace_id: TraceId,
    span_id: SpanId,
    parent_span_id: Option<SpanId>,
    tracestate: Option<String>,
    name: String,
    kind: SpanKind,
    start: Instant,
    /// When the service finished; the `send` phase runs from here to the frontend's hook.
    done: Option<Instant>,
    attributes: Vec<(String, AttrValue)>,
    error: Option<String>,
    children: Vec<SpanRecord>,
    ended: bool,
}

impl RequestTrace {
    /// The trace id in hex, for log lines.
    pub fn trace_id(&self) -> String {
        hex(&self.trace_id)
    }

    pub fn start_instant(&self) -> Instant {
        self.start
    }

    pub fn attribute(&mut self, key: &str, value: AttrValue) {
        self.attributes.push((key.to_string(), value));
    }

    /// Marks the request failed with `message`.
    pub fn fail(&mut self, message: impl Into<String>) {
        self.error = Some(message.into());
    }

    /// Records a finished phase of the request as a child span.
    pub fn phase(&mut self, name: &str, start: Instant, end: Instant) {
        self.children.push(self.record(
            new_span_id(),
            name,
            SpanKind::Internal,
            start,
            end,
            Vec::new(),
            None,
        ));
    }

    /// A new child span id and the W3C context that names it as the parent: for a call this
    /// request makes (an ensemble step, a forward to a worker). Record the call itself with
    /// [`RequestTrace::call`].
    pub fn child_context(&self) -> (SpanId, TraceContext) {
        let span = new_span_id();
        (
            span,
            context_for(self.trace_id, span, self.tracestate.as_deref()),
        )
    }

    /// Records a call made under `span` (from [`RequestTrace::child_context`]).
    pub fn call(
        &mut self,
        span: SpanId,
        name: &str,
        start: Instant,
        end: Instant,
        attributes: Vec<(String, AttrValue)>,
        error: Option<String>,
    ) {
        let record = self.record(span, name, SpanKind::Client, start, end, attributes, error);
        self.children.push(record);
    }

    /// The W3C context naming this request's root span as the parent.
    pub fn context(&self) -> TraceContext {
        context_for(self.trace_id, self.span_id, self.tracestate.as_deref())
    }

    /// The service has its answer at `at`; what follows until the frontend's hook is `send`.
    pub fn done(&mut self, at: Instant) {
        self.done = Some(at);
    }

    /// Hands the trace to the frontend's hook to close after encoding, or closes it now when
    /// the request came without one.
    pub fn close_after_send(mut self, context: &RequestContext) {
        let now = Instant::now();
        if self.done.is_none() {
            self.done = Some(now);
        }
        if let Err(unhooked) = context.response_hook.attach(Box::new(self)) {
            unhooked.finish(now);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn record(
        &self,
        span_id: SpanId,
        name: &str,
        kind: SpanKind,
        start: Instant,
        end: Instant,
        attributes: Vec<(String, AttrValue)>,
        error: Option<String>,
    ) -> SpanRecord {
        SpanRecord {
            trace_id: self.trace_id,
            span_id,
            parent_span_id: Some(self.span_id),
            name: name.to_string(),
            kind,
            start_unix_nanos: unix_nanos(start),
            end_unix_nanos: unix_nanos(end.max(start)),
            attributes,
            error,
        }
    }

    /// Ends the root span at `at` and ships it with its children.
    pub fn end(mut self, at: Instant) {
        self.ship(at);
    }

    fn ship(&mut self, at: Instant) {
        if self.ended {
            return;
        }
        self.ended = true;
        let mut spans = std::mem::take(&mut self.children);
        spans.push(SpanRecord {
            trace_id: self.trace_id,
            span_id: self.span_id,
            parent_span_id: self.parent_span_id,
            name: std::mem::take(&mut self.name),
            kind: self.kind,
            start_unix_nanos: unix_nanos(self.start),
            end_unix_nanos: unix_nanos(at.max(self.start)),
            attributes: std::mem::take(&mut self.attributes),
            error: self.error.take(),
        });
        self.sink.export(spans);
    }
}

impl OpenSpan for RequestTrace {
    fn finish(mut self: Box<Self>, sent: Instant) {
        if let Some(done) = self.done {
            self.phase("send", done, sent);
        }
        self.ship(sent);
    }
}

impl Drop for RequestTrace {
    fn drop(&mut self) {
        if !self.ended {
            let now = Instant::now();
            if let Some(done) = self.done {
                self.phase("send", done, now);
            }
            self.ship(now);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::trace_config::{Settings, TraceLevel};
    use parking_lot::Mutex;
    use std::time::Duration;

    #[derive(Default)]
    pub(crate) struct Collected(pub Mutex<Vec<SpanRecord>>);

    impl SpanSink for Collected {
        fn export(&self, spans: Vec<SpanRecord>) {
            self.0.lock().extend(spans);
        }
    }

    fn tracer(rate: u64) -> (Tracer, Arc<Collected>) {
        let sink = Arc::new(Collected::default());
        let settings = Settings {
            level: vec![TraceLevel::Timestamps],
            rate,
            ..Settings::default()
        };
        let tracer = Tracer::new(
            Arc::new(TraceSettingsStore::new(settings)),
            Some(sink.clone()),
        );
        (tracer, sink)
    }

    #[test]
    fn a_traced_request_ships_its_root_and_phases_with_the_callers_parent() {
        let (tracer, sink) = tracer(1);
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let t0 = Instant::now();
        let context = RequestContext {
            trace: TraceContext::parse(parent, None),
            received: Some(t0),
            response_hook: nereid_proto::ResponseHook::new(),
            ..Default::default()
        };
        let mut trace = tracer
            .start("InferRequest", SpanKind::Server, "m", &context)
            .unwrap();
        trace.phase("queue", t0, t0 + Duration::from_micros(10));
        trace.done(t0 + Duration::from_micros(30));
        trace.close_after_send(&context);
        assert!(sink.0.lock().is_empty(), "open until the frontend sends");
        context.response_hook.finish(t0 + Duration::from_micros(50));
        let spans = sink.0.lock().clone();
        let names: Vec<_> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["queue", "send", "InferRequest"]);
        let root = &spans[2];
        assert_eq!(hex(&root.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&root.parent_span_id.unwrap()), "00f067aa0ba902b7");
        assert_eq!(root.end_unix_nanos - root.start_unix_nanos, 50_000);
        assert!(
            spans[..2]
                .iter()
                .all(|s| s.parent_span_id == Some(root.span_id))
        );
        assert_eq!(spans[1].end_unix_nanos - spans[1].start_unix_nanos, 20_000);
    }

    #[test]
    fn without_a_hook_or_when_dropped_the_trace_still_ships() {
        let (tracer, sink) = tracer(1);
        let context = RequestContext::default();
        let trace = tracer.start("r", SpanKind::Server, "m", &context).unwrap();
        trace.close_after_send(&context);
        assert_eq!(sink.0.lock().len(), 2, "send + root");
        let trace = tracer.start("r", SpanKind::Server, "m", &context).unwrap();
        drop(trace);
        assert_eq!(sink.0.lock().len(), 3);
    }

    #[test]
    fn unsampled_requests_and_disabled_tracers_cost_nothing() {
        let (tracer, sink) = tracer(2);
        let context = RequestContext::default();
        assert!(tracer.start("r", SpanKind::Server, "m", &context).is_some());
        assert!(tracer.start("r", SpanKind::Server, "m", &context).is_none());
        assert!(
            Tracer::disabled()
                .start("r", SpanKind::Server, "m", &context)
                .is_none()
        );
        assert!(sink.0.lock().len() <= 1);
    }
}
