//! The exporter against real collectors on loopback: a tonic `TraceService`/`MetricsService`
//! server and an HTTP endpoint, both built on the `opentelemetry-proto` types.

use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceResponse;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use tokio::sync::mpsc;

use super::*;
use crate::metrics::Labels;
use crate::span::{new_span_id, new_trace_id};

#[derive(Clone)]
struct Receiver {
    spans: mpsc::UnboundedSender<ExportTraceServiceRequest>,
    metrics: mpsc::UnboundedSender<ExportMetricsServiceRequest>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let _ = self.spans.send(request.into_inner());
        Ok(tonic::Response::new(Default::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let _ = self.metrics.send(request.into_inner());
        Ok(tonic::Response::new(Default::default()))
    }
}

fn span(name: &str) -> SpanRecord {
    SpanRecord {
        trace_id: new_trace_id(),
        span_id: new_span_id(),
        parent_span_id: Some(new_span_id()),
        name: name.into(),
        kind: SpanKind::Server,
        start_unix_nanos: 1,
        end_unix_nanos: 2,
        attributes: vec![("model.name".into(), AttrValue::Text("m".into()))],
        error: Some("boom".into()),
    }
}

fn resource() -> ResourceAttributes {
    ResourceAttributes(vec![("service.name".into(), "nereid-test".into())])
}

fn fast() -> Batching {
    Batching {
        max_queue: 16,
        max_batch: 4,
        delay: Duration::from_millis(20),
    }
}

async fn recv<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the collector got nothing within 10 s")
        .expect("channel open")
}

#[tokio::test]
async fn grpc_export_delivers_spans_and_metrics() {
    let (spans_tx, mut spans_rx) = mpsc::unbounded_channel();
    let (metrics_tx, mut metrics_rx) = mpsc::unbounded_channel();
    let receiver = Receiver {
        spans: spans_tx,
        metrics: metrics_tx,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(receiver.clone()))
            .add_service(MetricsServiceServer::new(receiver))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let endpoint = Endpoint {
        url: format!("http://{addr}"),
        protocol: Protocol::Grpc,
    };
    let (exporter, task) = SpanExporter::start(&endpoint, &resource(), fast()).unwrap();
    exporter.export(vec![span("a"), span("b")]);
    let got = recv(&mut spans_rx).await;
    let resource_spans = &got.resource_spans[0];
    let service = &resource_spans.resource.as_ref().unwrap().attributes[0];
    assert_eq!(service.key, "service.name");
    let spans = &resource_spans.scope_spans[0].spans;
    assert_eq!(
        spans.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(spans[0].trace_id.len(), 16);
    assert_eq!(spans[0].status.as_ref().unwrap().message, "boom");
    // Dropping the last handle flushes and ends the task.
    exporter.export(vec![span("last")]);
    drop(exporter);
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
    let got = recv(&mut spans_rx).await;
    assert_eq!(got.resource_spans[0].scope_spans[0].spans[0].name, "last");

    let source: Arc<dyn Collect> = Arc::new(|| {
        vec![
            Family::counter("nv_inference_count", "Inferences.")
                .with(Labels::of([("model", "m"), ("version", "1")]), 7.0),
        ]
    });
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = start_metrics_exporter(
        &endpoint,
        &resource(),
        source,
        Duration::from_millis(20),
        async {
            let _ = stop_rx.await;
        },
    )
    .unwrap();
    let got = recv(&mut metrics_rx).await;
    let metric = &got.resource_metrics[0].scope_metrics[0].metrics[0];
    assert_eq!(metric.name, "nv_inference_count");
    match metric.data.as_ref().unwrap() {
        pm::metric::Data::Sum(sum) => {
            assert!(sum.is_monotonic);
            assert_eq!(
                sum.data_points[0].value,
                Some(pm::number_data_point::Value::AsDouble(7.0))
            );
            assert_eq!(sum.data_points[0].attributes.len(), 2);
        }
        other => panic!("not a sum: {other:?}"),
    }
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn http_export_posts_protobuf() {
    let (tx, mut rx) = mpsc::unbounded_channel::<(String, String, Bytes)>();
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let tx = tx.clone();
        async move {
            let path = request.uri().path().to_string();
            let content_type = request
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_string();
            let body = axum::body::to_bytes(request.into_body(), 1 << 20)
                .await
                .unwrap();
            let _ = tx.send((path, content_type, body));
            ""
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    let endpoint = Endpoint {
        url: format!("http://{addr}/v1/traces"),
        protocol: Protocol::HttpProtobuf,
    };
    let (exporter, _task) = SpanExporter::start(&endpoint, &resource(), fast()).unwrap();
    exporter.export(vec![span("h")]);
    let (path, content_type, body) = recv(&mut rx).await;
    assert_eq!(path, "/v1/traces");
    assert_eq!(content_type, "application/x-protobuf");
    let decoded = ExportTraceServiceRequest::decode(body).unwrap();
    assert_eq!(decoded.resource_spans[0].scope_spans[0].spans[0].name, "h");
}

#[test]
fn histograms_become_per_bucket_counts() {
    let mut family = Family::new("latency", "Latency.", Kind::Histogram);
    family.sample(
        Labels::none(),
        Value::Histogram {
            buckets: vec![(1.0, 2), (5.0, 5)],
            sum: 9.0,
            count: 6,
        },
    );
    let request = encode_metrics(&Resource::default(), &[family], 1, 2);
    let metric = &request.resource_metrics[0].scope_metrics[0].metrics[0];
    let Some(pm::metric::Data::Histogram(h)) = &metric.data else {
        panic!("not a histogram");
    };
    assert_eq!(h.data_points[0].bucket_counts, [2, 3, 1]);
    assert_eq!(h.data_points[0].explicit_bounds, [1.0, 5.0]);
}

#[test]
fn bad_endpoints_are_refused_with_the_url() {
    let err = Transport::new(&Endpoint {
        url: "https://collector/v1/traces".into(),
        protocol: Protocol::HttpProtobuf,
    })
    .err()
    .unwrap();
    assert!(err.contains("https://collector/v1/traces"), "{err}");
}
