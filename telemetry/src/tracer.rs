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
//!                    ├─ response(at)                a streamed response handed on
//!                    └─ end / drop ─► Output::Spans: SpanSink ─► OTLP exporter (bounded; full ⇒
//!                                     dropped, counted)
//!                                 └► Output::Triton: TritonSink ─► JSON trace file
//! ```
//!
//! In Triton's mode (`triton_trace`) the request's phases become Triton's timestamps:
//!
//! ```text
//! HTTP_RECV_START / GRPC_WAITREAD_START   the frontend began receiving (`received`)
//! HTTP_RECV_END / GRPC_WAITREAD_END       the service took the request (Tracer::start)
//!   = REQUEST_START; QUEUE_START          the checks passed (end of `receive`)
//! COMPUTE_START, COMPUTE_INPUT_END        `compute_input`
//! COMPUTE_OUTPUT_START, COMPUTE_END       `compute_output`
//! REQUEST_END = INFER_RESPONSE_COMPLETE   done (a stream: each response)
//! HTTP_SEND_START/END, GRPC_SEND_START/END `send` (a stream: each response's hand-over)
//! ```
//!
//! Only a request that came through a frontend has the frontend's stamps; an ensemble step or a
//! BLS call is a child trace (`parent_id`) with the model's stamps alone, as in Triton. There a
//! parent counts only when it is an open trace of this process: Triton ignores a client's W3C
//! context, so such a request is sampled by the rate like any other; and a request from no
//! frontend without such a parent (a BLS call made without `trace=request.trace()`) is not
//! traced.

use std::sync::Arc;
use std::time::Instant;

use nereid_proto::{Frontend, OpenSpan, RequestContext, Tensor, TraceContext};

use crate::span::{
    AttrValue, SpanId, SpanKind, SpanRecord, TraceId, context_for, hex, new_span_id, new_trace_id,
    parent_of, unix_nanos,
};
use crate::trace_config::TraceSettingsStore;
use crate::triton_trace::{Ids, TensorRecord, TritonSink, TritonTrace};

/// Where finished spans go (the OTLP exporter, or a test's collector).
pub trait SpanSink: Send + Sync + 'static {
    fn export(&self, spans: Vec<SpanRecord>);
}

/// Where a finished trace goes: the mode's sink.
#[derive(Clone)]
pub(crate) enum Output {
    Spans(Arc<dyn SpanSink>),
    Triton(Arc<TritonSink>),
}

/// Decides and records traces for one process.
#[derive(Clone)]
pub struct Tracer {
    settings: Arc<TraceSettingsStore>,
    output: Option<Output>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("exporting", &self.output.is_some())
            .finish()
    }
}

impl Tracer {
    /// A tracer that samples by `settings` and ships to `sink` (`None`: never traces, but the
    /// settings API still works).
    pub fn new(settings: Arc<TraceSettingsStore>, sink: Option<Arc<dyn SpanSink>>) -> Tracer {
        Tracer {
            settings,
            output: sink.map(Output::Spans),
        }
    }

    /// A tracer in Triton's mode, writing through `sink`.
    pub(crate) fn triton(settings: Arc<TraceSettingsStore>, sink: Arc<TritonSink>) -> Tracer {
        Tracer {
            settings,
            output: Some(Output::Triton(sink)),
        }
    }

    /// A tracer that never traces, with default settings.
    pub fn disabled() -> Tracer {
        Tracer::new(Arc::new(TraceSettingsStore::new(Default::default())), None)
    }

    /// The live trace settings this tracer samples by, which the trace setting API reads and
    /// changes.
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
        let output = self.output.as_ref()?;
        if self.settings.all_off() {
            return None;
        }
        let begun = Instant::now();
        let mut parent = context.trace.as_ref().and_then(parent_of);
        if let Output::Triton(sink) = output {
            parent = parent.filter(|(_, span, _)| sink.is_open(span));
            // As in Triton, an internal call (a BLS call without `trace=request.trace()`, a
            // warm-up) is traced only as a child.
            if parent.is_none() && context.frontend.is_none() {
                return None;
            }
        }
        if !self.settings.sample(model, parent.map(|p| p.2)) {
            return None;
        }
        let (trace_id, parent_span_id) = match parent {
            Some((trace, span, _)) => (trace, Some(span)),
            None => (new_trace_id(), None),
        };
        let span_id = new_span_id();
        let triton = match output {
            Output::Triton(sink) => Some(sink.begin(span_id, parent_span_id)),
            Output::Spans(_) => None,
        };
        let tensors = triton.is_some() && self.settings.tensors(model);
        Some(RequestTrace {
            output: output.clone(),
            triton,
            begun,
            frontend: context.frontend,
            responses: Vec::new(),
            tensors: tensors.then(Vec::new),
            trace_id,
            span_id,
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
    output: Output,
    /// Its ids in Triton's mode.
    triton: Option<Ids>,
    /// When the service took the request (Tracer::start).
    begun: Instant,
    frontend: Option<Frontend>,
    /// When each streamed response was handed on (empty: a unary answer).
    responses: Vec<Instant>,
    /// The tensors recorded, when the level asks for them (Triton's mode, TENSORS).
    tensors: Option<Vec<TensorRecord>>,
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

    /// When the request was received (the frontend's `received` time when it passed one,
    /// else when [`Tracer::start`] ran): the start of the root span.
    pub fn start_instant(&self) -> Instant {
        self.start
    }

    /// Adds `key = value` to the root span's attributes (e.g. `model.version`), written out
    /// with the trace when it ends.
    pub fn attribute(&mut self, key: &str, value: AttrValue) {
        self.attributes.push((key.to_string(), value));
    }

    /// Whether the trace records tensors (Triton's mode with level TENSORS): only then is
    /// [`RequestTrace::tensor`] worth its formatting.
    pub fn wants_tensors(&self) -> bool {
        self.tensors.is_some()
    }

    /// Records `tensor` when the trace wants tensors: an input (Triton's
    /// `TENSOR_QUEUE_INPUT`) or an output (`TENSOR_BACKEND_OUTPUT`).
    pub fn tensor(&mut self, input: bool, tensor: &Tensor) {
        if let Some(tensors) = &mut self.tensors {
            tensors.push(TensorRecord::of(input, tensor));
        }
    }

    /// A streamed response was handed on at `at`.
    pub fn response(&mut self, at: Instant) {
        self.responses.push(at);
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
        if let Output::Triton(sink) = &self.output {
            let sink = sink.clone();
            let trace = self.triton_trace(&spans, at);
            sink.finish(self.span_id, trace);
            return;
        }
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
        if let Output::Spans(sink) = &self.output {
            sink.export(spans);
        }
    }

    /// The trace in Triton's terms (see the module docs for the timestamps).
    fn triton_trace(&mut self, phases: &[SpanRecord], at: Instant) -> TritonTrace {
        let ids = self.triton.unwrap_or(Ids {
            id: 0,
            parent: None,
            root: 0,
        });
        let phase = |name: &str| phases.iter().find(|s| s.name == name);
        let begun = unix_nanos(self.begun.max(self.start));
        let received = unix_nanos(self.start);
        let done = unix_nanos(self.done.unwrap_or(at));
        let mut stamps: Vec<(&'static str, u64)> = Vec::with_capacity(16);
        let frontend = self.frontend.filter(|_| ids.parent.is_none());
        if frontend == Some(Frontend::Http) {
            stamps.push(("HTTP_RECV_START", received));
            stamps.push(("HTTP_RECV_END", begun));
        }
        stamps.push(("REQUEST_START", begun));
        let queued = phase("receive").map_or(begun, |p| p.end_unix_nanos.max(begun));
        stamps.push(("QUEUE_START", queued));
        if let Some(p) = phase("compute_input") {
            stamps.push(("COMPUTE_START", p.start_unix_nanos));
            stamps.push(("COMPUTE_INPUT_END", p.end_unix_nanos));
        }
        if let Some(p) = phase("compute_output") {
            stamps.push(("COMPUTE_OUTPUT_START", p.start_unix_nanos));
            stamps.push(("COMPUTE_END", p.end_unix_nanos));
        }
        stamps.push(("REQUEST_END", done));
        if let Some(frontend) = frontend {
            let (send_start, send_end) = match frontend {
                Frontend::Http => ("HTTP_SEND_START", "HTTP_SEND_END"),
                Frontend::Grpc => {
                    stamps.push(("GRPC_WAITREAD_START", received));
                    stamps.push(("GRPC_WAITREAD_END", begun));
                    ("GRPC_SEND_START", "GRPC_SEND_END")
                }
            };
            if self.responses.is_empty() {
                let (start, end) = phase("send").map_or((done, unix_nanos(at)), |p| {
                    (p.start_unix_nanos, p.end_unix_nanos)
                });
                stamps.push(("INFER_RESPONSE_COMPLETE", done));
                stamps.push((send_start, start));
                stamps.push((send_end, end));
            }
            for r in &self.responses {
                let ns = unix_nanos(*r);
                stamps.push(("INFER_RESPONSE_COMPLETE", ns));
                stamps.push((send_start, ns));
                stamps.push((send_end, ns));
            }
        }
        let text = |key: &str| {
            self.attributes.iter().find_map(|(k, v)| match v {
                AttrValue::Text(t) if k == key => Some(t.clone()),
                _ => None,
            })
        };
        TritonTrace {
            ids,
            model: text("model.name").unwrap_or_default(),
            version: text("model.version").and_then(|v| v.parse().ok()),
            request_id: text("request.id").unwrap_or_default(),
            stamps,
            tensors: self.tensors.take().unwrap_or_default(),
        }
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

    fn triton_tracer() -> (Tracer, Arc<TritonSink>) {
        let settings = Arc::new(TraceSettingsStore::new(Settings {
            level: vec![TraceLevel::Timestamps],
            rate: 1,
            ..Settings::default()
        }));
        let sink = Arc::new(TritonSink::new(settings.clone(), None));
        (Tracer::triton(settings, sink.clone()), sink)
    }

    fn names(trace: &TritonTrace) -> Vec<&'static str> {
        trace.stamps.iter().map(|(n, _)| *n).collect()
    }

    #[test]
    fn tritons_mode_names_the_phases_as_tritons_timestamps() {
        let (tracer, _sink) = triton_tracer();
        let t0 = Instant::now();
        let us = |n| t0 + Duration::from_micros(n);
        let http = RequestContext {
            received: Some(t0),
            frontend: Some(Frontend::Http),
            ..Default::default()
        };
        let mut trace = tracer
            .start("InferRequest", SpanKind::Server, "m", &http)
            .unwrap();
        trace.attribute("model.version", AttrValue::Text("3".into()));
        trace.attribute("request.id", AttrValue::Text("r".into()));
        for (name, a, b) in [
            ("receive", 0, 10),
            ("queue", 10, 20),
            ("compute_input", 20, 30),
            ("compute_infer", 30, 40),
            ("compute_output", 40, 50),
        ] {
            trace.phase(name, us(a), us(b));
        }
        trace.done(us(60));
        trace.phase("send", us(60), us(70));
        let phases = trace.children.clone();
        let out = trace.triton_trace(&phases, us(70));
        assert_eq!(
            names(&out),
            [
                "HTTP_RECV_START",
                "HTTP_RECV_END",
                "REQUEST_START",
                "QUEUE_START",
                "COMPUTE_START",
                "COMPUTE_INPUT_END",
                "COMPUTE_OUTPUT_START",
                "COMPUTE_END",
                "REQUEST_END",
                "INFER_RESPONSE_COMPLETE",
                "HTTP_SEND_START",
                "HTTP_SEND_END"
            ]
        );
        let ns = |name| out.stamps.iter().find(|(n, _)| *n == name).unwrap().1;
        assert_eq!(ns("COMPUTE_END") - ns("COMPUTE_START"), 30_000);
        assert_eq!(ns("HTTP_SEND_END") - ns("HTTP_SEND_START"), 10_000);
        assert_eq!((out.version, out.request_id.as_str()), (Some(3), "r"));
        let parent = trace.context();

        // A call under the open request: a child with the model's stamps alone.
        let call = RequestContext {
            trace: Some(parent),
            ..Default::default()
        };
        let mut child = tracer
            .start("InferRequest", SpanKind::Server, "m", &call)
            .unwrap();
        assert_eq!(child.triton.unwrap().parent, trace.triton.map(|t| t.id));
        let out = child.triton_trace(&[], Instant::now());
        assert_eq!(names(&out), ["REQUEST_START", "QUEUE_START", "REQUEST_END"]);

        // A gRPC stream request with two responses.
        let grpc = RequestContext {
            received: Some(t0),
            frontend: Some(Frontend::Grpc),
            ..Default::default()
        };
        let mut streamed = tracer
            .start("InferRequest", SpanKind::Server, "m", &grpc)
            .unwrap();
        streamed.response(us(80));
        streamed.response(us(90));
        let out = streamed.triton_trace(&[], us(90));
        assert_eq!(
            names(&out),
            [
                "REQUEST_START",
                "QUEUE_START",
                "REQUEST_END",
                "GRPC_WAITREAD_START",
                "GRPC_WAITREAD_END",
                "INFER_RESPONSE_COMPLETE",
                "GRPC_SEND_START",
                "GRPC_SEND_END",
                "INFER_RESPONSE_COMPLETE",
                "GRPC_SEND_START",
                "GRPC_SEND_END"
            ]
        );
    }

    #[test]
    fn tritons_mode_ignores_foreign_parents_and_untraced_internal_calls() {
        let (tracer, _sink) = triton_tracer();
        let client = RequestContext {
            trace: TraceContext::parse(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                None,
            ),
            frontend: Some(Frontend::Grpc),
            ..Default::default()
        };
        let trace = tracer
            .start("InferRequest", SpanKind::Server, "m", &client)
            .unwrap();
        assert_eq!(
            trace.triton.unwrap().parent,
            None,
            "a client's context is no parent"
        );
        let internal = RequestContext::default();
        assert!(
            tracer
                .start("InferRequest", SpanKind::Server, "m", &internal)
                .is_none(),
            "a BLS call without trace=request.trace() is not traced"
        );
    }
}
