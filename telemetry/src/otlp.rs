//! OTLP export of spans and metrics, over gRPC or HTTP/protobuf.
//!
//! ```text
//! RequestTrace ─ export(spans) ─► SpanQueue (bounded, try_send; full ⇒ dropped + counted)
//!                                     │ batch task: up to `max_batch` spans or every `delay`
//!                                     ▼
//!                                Transport::send_spans ─► collector (grpc: TraceService/Export,
//!                                                                     http: POST <url>)
//! Collect (metric families) ─ every `interval` ─► encode_metrics ─► Transport::send_metrics
//! ```
//!
//! Export never blocks a request: spans wait in a bounded queue, a failed export is logged
//! (first failure, then every 100th) and dropped. On shutdown ([`SpanExporter::shutdown`]) the
//! queue is flushed in one export, which the caller bounds with its deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_client::MetricsServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1 as pm;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1 as pt;
use prost::Message;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::metrics::{Collect, Family, Kind, Value};
use crate::span::{AttrValue, SpanKind, SpanRecord};
use crate::tracer::SpanSink;

/// The wire an OTLP endpoint speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Grpc,
    HttpProtobuf,
}

impl Protocol {
    /// `grpc` or `http/protobuf` (OTel's `OTEL_EXPORTER_OTLP_PROTOCOL` spellings).
    pub fn parse(text: &str) -> Option<Protocol> {
        match text {
            "grpc" => Some(Protocol::Grpc),
            "http/protobuf" | "http" => Some(Protocol::HttpProtobuf),
            _ => None,
        }
    }
}

/// Where and how to export.
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    /// For HTTP the full URL (`http://host:4318/v1/traces`); for gRPC the server
    /// (`http://host:4317`).
    pub url: String,
    pub protocol: Protocol,
}

/// The resource every exported span and metric carries (`service.name` first).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResourceAttributes(pub Vec<(String, String)>);

impl ResourceAttributes {
    fn to_proto(&self) -> Resource {
        Resource {
            attributes: self
                .0
                .iter()
                .map(|(k, v)| key_value(k, AttrValue::Text(v.clone())))
                .collect(),
            ..Default::default()
        }
    }
}

/// Batching of the span exporter (Triton's `bsp_*` keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batching {
    pub max_queue: usize,
    pub max_batch: usize,
    pub delay: Duration,
}

impl Default for Batching {
    /// OpenTelemetry's batch span processor defaults.
    fn default() -> Batching {
        Batching {
            max_queue: 2048,
            max_batch: 512,
            delay: Duration::from_millis(5000),
        }
    }
}

/// The client of one collector endpoint.
#[derive(Clone)]
enum Transport {
    Grpc(tonic::transport::Channel),
    Http {
        client: Box<Client<HttpConnector, Full<Bytes>>>,
        url: http::Uri,
    },
}

impl Transport {
    fn new(endpoint: &Endpoint) -> Result<Transport, String> {
        match endpoint.protocol {
            Protocol::Grpc => {
                let channel = tonic::transport::Endpoint::from_shared(endpoint.url.clone())
                    .map_err(|e| format!("invalid OTLP gRPC endpoint '{}': {e}", endpoint.url))?
                    .connect_timeout(Duration::from_secs(5))
                    .timeout(Duration::from_secs(10))
                    .connect_lazy();
                Ok(Transport::Grpc(channel))
            }
            Protocol::HttpProtobuf => {
                let url: http::Uri = endpoint
                    .url
                    .parse()
                    .map_err(|e| format!("invalid OTLP HTTP endpoint '{}': {e}", endpoint.url))?;
                if url.scheme_str() != Some("http") {
                    return Err(format!(
                        "OTLP HTTP endpoint '{}' must be an http:// URL",
                        endpoint.url
                    ));
                }
                let client = Box::new(Client::builder(TokioExecutor::new()).build_http());
                Ok(Transport::Http { client, url })
            }
        }
    }

    async fn send_spans(&self, request: ExportTraceServiceRequest) -> Result<(), String> {
        match self {
            Transport::Grpc(channel) => TraceServiceClient::new(channel.clone())
                .export(request)
                .await
                .map(|_| ())
                .map_err(|s| format!("{}: {}", s.code(), s.message())),
            Transport::Http { client, url } => post(client, url, request.encode_to_vec()).await,
        }
    }

    async fn send_metrics(&self, request: ExportMetricsServiceRequest) -> Result<(), String> {
        match self {
            Transport::Grpc(channel) => MetricsServiceClient::new(channel.clone())
                .export(request)
                .await
                .map(|_| ())
                .map_err(|s| format!("{}: {}", s.code(), s.message())),
            Transport::Http { client, url } => post(client, url, request.encode_to_vec()).await,
        }
    }
}

async fn post(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &http::Uri,
    body: Vec<u8>,
) -> Result<(), String> {
    let request = http::Request::post(url.clone())
        .header(http::header::CONTENT_TYPE, "application/x-protobuf")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(Duration::from_secs(10), client.request(request))
        .await
        .map_err(|_| "timed out after 10 s".to_string())?
        .map_err(|e| e.to_string())?;
    if response.status().is_success() {
        Ok(())
    } else {
        Err(format!("HTTP {}", response.status()))
    }
}

/// Logs the first failure and then every 100th, so a missing collector does not flood logs.
#[derive(Default)]
struct FailureLog(AtomicU64);

impl FailureLog {
    fn failed(&self, what: &str, url: &str, error: &str) {
        let n = self.0.fetch_add(1, Ordering::Relaxed);
        if n.is_multiple_of(100) {
            tracing::warn!(%url, %error, failures = n + 1, "OTLP {what} export failed");
        }
    }
}

/// The span exporter: the [`SpanSink`] request paths hand spans to, and its batch task.
pub struct SpanExporter {
    queue: mpsc::Sender<SpanRecord>,
    dropped: AtomicU64,
    stop: Arc<tokio::sync::Notify>,
}

impl SpanSink for SpanExporter {
    fn export(&self, spans: Vec<SpanRecord>) {
        for span in spans {
            if self.queue.try_send(span).is_err() {
                let n = self.dropped.fetch_add(1, Ordering::Relaxed);
                if n.is_multiple_of(1000) {
                    tracing::warn!(dropped = n + 1, "OTLP span queue full; spans dropped");
                }
            }
        }
    }
}

impl SpanExporter {
    /// Starts the batch task (on the current tokio runtime). It runs until every
    /// `Arc<SpanExporter>` is dropped, then flushes what is queued and ends.
    pub fn start(
        endpoint: &Endpoint,
        resource: &ResourceAttributes,
        batching: Batching,
    ) -> Result<(Arc<SpanExporter>, JoinHandle<()>), String> {
        let transport = Transport::new(endpoint)?;
        let (tx, rx) = mpsc::channel(batching.max_queue.max(1));
        let stop = Arc::new(tokio::sync::Notify::new());
        let exporter = Arc::new(SpanExporter {
            queue: tx,
            dropped: AtomicU64::new(0),
            stop: stop.clone(),
        });
        let task = tokio::spawn(batch_spans(
            rx,
            stop,
            transport,
            endpoint.url.clone(),
            resource.to_proto(),
            batching,
        ));
        Ok((exporter, task))
    }

    /// Asks the batch task to export what is queued now and end (spans exported after this
    /// are dropped).
    pub fn shutdown(&self) {
        self.stop.notify_one();
    }
}

async fn batch_spans(
    mut rx: mpsc::Receiver<SpanRecord>,
    stop: Arc<tokio::sync::Notify>,
    transport: Transport,
    url: String,
    resource: Resource,
    batching: Batching,
) {
    let failures = FailureLog::default();
    let mut batch = Vec::with_capacity(batching.max_batch);
    loop {
        let deadline = tokio::time::Instant::now() + batching.delay;
        let mut closed = false;
        while batch.len() < batching.max_batch {
            tokio::select! {
                received = tokio::time::timeout_at(deadline, rx.recv()) => match received {
                    Ok(Some(span)) => batch.push(span),
                    Ok(None) => {
                        closed = true;
                        break;
                    }
                    Err(_) => break,
                },
                _ = stop.notified() => {
                    rx.close();
                    while let Ok(span) = rx.try_recv() {
                        batch.push(span);
                    }
                    closed = true;
                    break;
                }
            }
        }
        if !batch.is_empty() {
            let request = encode_spans(&resource, std::mem::take(&mut batch));
            if let Err(e) = transport.send_spans(request).await {
                failures.failed("span", &url, &e);
            }
        }
        if closed {
            return;
        }
    }
}

/// Spans as one OTLP export request.
pub fn encode_spans(resource: &Resource, spans: Vec<SpanRecord>) -> ExportTraceServiceRequest {
    let spans = spans.into_iter().map(span_proto).collect();
    ExportTraceServiceRequest {
        resource_spans: vec![pt::ResourceSpans {
            resource: Some(resource.clone()),
            scope_spans: vec![pt::ScopeSpans {
                scope: Some(scope()),
                spans,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "nereid".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        ..Default::default()
    }
}

fn span_proto(s: SpanRecord) -> pt::Span {
    let kind = match s.kind {
        SpanKind::Server => pt::span::SpanKind::Server,
        SpanKind::Client => pt::span::SpanKind::Client,
        SpanKind::Internal => pt::span::SpanKind::Internal,
    };
    let status = match s.error {
        Some(message) => pt::Status {
            message,
            code: pt::status::StatusCode::Error as i32,
        },
        None => pt::Status {
            message: String::new(),
            code: pt::status::StatusCode::Unset as i32,
        },
    };
    pt::Span {
        trace_id: s.trace_id.to_vec(),
        span_id: s.span_id.to_vec(),
        parent_span_id: s.parent_span_id.map(|p| p.to_vec()).unwrap_or_default(),
        name: s.name,
        kind: kind as i32,
        start_time_unix_nano: s.start_unix_nanos,
        end_time_unix_nano: s.end_unix_nanos,
        attributes: s
            .attributes
            .into_iter()
            .map(|(k, v)| key_value(&k, v))
            .collect(),
        status: Some(status),
        ..Default::default()
    }
}

fn key_value(key: &str, value: AttrValue) -> KeyValue {
    let value = match value {
        AttrValue::Text(s) => any_value::Value::StringValue(s),
        AttrValue::Int(n) => any_value::Value::IntValue(n),
    };
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

/// Starts pushing `source`'s families to `endpoint` every `interval` (on the current tokio
/// runtime) until `stop` resolves; a last export runs then.
pub fn start_metrics_exporter(
    endpoint: &Endpoint,
    resource: &ResourceAttributes,
    source: Arc<dyn Collect>,
    interval: Duration,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<JoinHandle<()>, String> {
    let transport = Transport::new(endpoint)?;
    let url = endpoint.url.clone();
    let resource = resource.to_proto();
    let started = crate::span::unix_nanos(Instant::now());
    Ok(tokio::spawn(async move {
        let failures = FailureLog::default();
        let mut ticks = tokio::time::interval(interval.max(Duration::from_millis(10)));
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            let last = tokio::select! {
                _ = ticks.tick() => false,
                _ = &mut stop => true,
            };
            let now = crate::span::unix_nanos(Instant::now());
            let request = encode_metrics(&resource, &source.collect(), started, now);
            if let Err(e) = transport.send_metrics(request).await {
                failures.failed("metric", &url, &e);
            }
            if last {
                return;
            }
        }
    }))
}

/// Metric families as one OTLP export request: counters become cumulative monotonic sums,
/// gauges gauges, histograms explicit-bucket histograms, summaries summaries. Names and labels
/// are the Prometheus ones, so the same queries work on either path.
pub fn encode_metrics(
    resource: &Resource,
    families: &[Family],
    start_unix_nanos: u64,
    now_unix_nanos: u64,
) -> ExportMetricsServiceRequest {
    let cumulative = pm::AggregationTemporality::Cumulative as i32;
    let metrics = families
        .iter()
        .filter(|f| !f.samples.is_empty())
        .map(|family| {
            let attrs = |labels: &[(String, String)]| -> Vec<KeyValue> {
                labels
                    .iter()
                    .map(|(k, v)| key_value(k, AttrValue::Text(v.clone())))
                    .collect()
            };
            let numbers = || -> Vec<pm::NumberDataPoint> {
                family
                    .samples
                    .iter()
                    .filter_map(|s| match s.value {
                        Value::Number(v) => Some(pm::NumberDataPoint {
                            attributes: attrs(&s.labels),
                            start_time_unix_nano: start_unix_nanos,
                            time_unix_nano: now_unix_nanos,
                            value: Some(pm::number_data_point::Value::AsDouble(v)),
                            ..Default::default()
                        }),
                        _ => None,
                    })
                    .collect()
            };
            let data = match family.kind {
                Kind::Counter => pm::metric::Data::Sum(pm::Sum {
                    data_points: numbers(),
                    aggregation_temporality: cumulative,
                    is_monotonic: true,
                }),
                Kind::Gauge => pm::metric::Data::Gauge(pm::Gauge {
                    data_points: numbers(),
                }),
                Kind::Histogram => pm::metric::Data::Histogram(pm::Histogram {
                    aggregation_temporality: cumulative,
                    data_points: family
                        .samples
                        .iter()
                        .filter_map(|s| match &s.value {
                            Value::Histogram {
                                buckets,
                                sum,
                                count,
                            } => {
                                // Prometheus buckets are cumulative; OTLP counts per bucket.
                                let mut previous = 0;
                                let mut bucket_counts: Vec<u64> = buckets
                                    .iter()
                                    .map(|(_, c)| {
                                        let n = c.saturating_sub(previous);
                                        previous = *c;
                                        n
                                    })
                                    .collect();
                                bucket_counts.push(count.saturating_sub(previous));
                                Some(pm::HistogramDataPoint {
                                    attributes: attrs(&s.labels),
                                    start_time_unix_nano: start_unix_nanos,
                                    time_unix_nano: now_unix_nanos,
                                    count: *count,
                                    sum: Some(*sum),
                                    bucket_counts,
                                    explicit_bounds: buckets.iter().map(|(b, _)| *b).collect(),
                                    ..Default::default()
                                })
                            }
                            _ => None,
                        })
                        .collect(),
                }),
                Kind::Summary => pm::metric::Data::Summary(pm::Summary {
                    data_points: family
                        .samples
                        .iter()
                        .filter_map(|s| match &s.value {
                            Value::Summary {
                                quantiles,
                                sum,
                                count,
                            } => Some(pm::SummaryDataPoint {
                                attributes: attrs(&s.labels),
                                start_time_unix_nano: start_unix_nanos,
                                time_unix_nano: now_unix_nanos,
                                count: *count,
                                sum: *sum,
                                quantile_values: quantiles
                                    .iter()
                                    .map(|(q, v)| pm::summary_data_point::ValueAtQuantile {
                                        quantile: *q,
                                        value: *v,
                                    })
                                    .collect(),
                                ..Default::default()
                            }),
                            _ => None,
                        })
                        .collect(),
                }),
            };
            pm::Metric {
                name: family.name.clone(),
                description: family.help.clone(),
                data: Some(data),
                ..Default::default()
            }
        })
        .collect();
    ExportMetricsServiceRequest {
        resource_metrics: vec![pm::ResourceMetrics {
            resource: Some(resource.clone()),
            scope_metrics: vec![pm::ScopeMetrics {
                scope: Some(scope()),
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

#[cfg(test)]
mod tests;
