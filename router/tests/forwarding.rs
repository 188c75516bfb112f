//! The router against two in-process fake workers (tonic servers on 127.0.0.1:0 serving
//! `nereid_frontend::routes` over an echo service), with the routing table fed directly.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use nereid_proto::{
    CorrelationId, InferenceService, RequestOptions, ServiceError, StreamedResponse,
};
use nereid_router::RouterService;

mod echo_cluster;

use echo_cluster::*;

#[tokio::test]
async fn requests_spread_over_both_workers_and_echo_their_inputs() {
    bounded(async {
        let (_workers, router, _) = cluster(64).await;
        let mut seen = BTreeMap::new();
        for _ in 0..40 {
            let r = router.infer(request(Default::default())).await.unwrap();
            assert_eq!(r.outputs[0].data().as_ref(), &[7, 0, 0, 0]);
            *seen.entry(worker_of(&r)).or_insert(0) += 1;
        }
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen.values().all(|&n| n >= 5), "{seen:?}");
    })
    .await;
}

#[tokio::test]
async fn a_killed_worker_is_retried_around() {
    bounded(async {
        let (mut workers, router, _) = cluster(64).await;
        // Warm both connections, then kill one worker.
        for _ in 0..10 {
            router.infer(request(Default::default())).await.unwrap();
        }
        workers[0].kill().await;
        // A call to the dead worker is classified as unreachable (retried and ejected), not
        // as the worker's own answer.
        let dead = workers[0].addr.to_string();
        let wire = nereid_router::encode_request(&request(Default::default())).unwrap();
        let err = router.workers().infer(&dead, wire).await.unwrap_err();
        assert!(
            matches!(err, nereid_router::RouterError::Unreachable { .. }),
            "{err:?}"
        );
        for _ in 0..30 {
            let r = router.infer(request(Default::default())).await.unwrap();
            assert_eq!(worker_of(&r), "w2");
        }
    })
    .await;
}

#[tokio::test]
async fn a_sequence_sticks_to_one_worker() {
    bounded(async {
        let (_workers, router, _) = cluster(64).await;
        for id in 1..=4u64 {
            let seq = |start, end| RequestOptions {
                sequence_id: Some(CorrelationId::Uint(id)),
                sequence_start: start,
                sequence_end: end,
                ..Default::default()
            };
            let first = worker_of(&router.infer(request(seq(true, false))).await.unwrap());
            for _ in 0..10 {
                let r = router.infer(request(seq(false, false))).await.unwrap();
                assert_eq!(worker_of(&r), first);
            }
            let last = router.infer(request(seq(false, true))).await.unwrap();
            assert_eq!(worker_of(&last), first);
            let after = router.infer(request(seq(false, false))).await.unwrap_err();
            assert!(
                matches!(after, ServiceError::InvalidArgument(_)),
                "{after:?}"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn a_sequence_on_a_killed_worker_fails_clearly_and_is_not_retried() {
    bounded(async {
        let (mut workers, router, _) = cluster(64).await;
        let seq = |start| RequestOptions {
            sequence_id: Some(CorrelationId::String("s".into())),
            sequence_start: start,
            ..Default::default()
        };
        let first = worker_of(&router.infer(request(seq(true))).await.unwrap());
        let index = if first == "w1" { 0 } else { 1 };
        workers[index].kill().await;
        let err = router.infer(request(seq(false))).await.unwrap_err();
        assert!(matches!(err, ServiceError::Unavailable(_)), "{err:?}");
    })
    .await;
}

#[tokio::test]
async fn worker_errors_pass_through_and_admission_is_bounded() {
    bounded(async {
        let (_workers, router, _) = cluster(64).await;
        let mut r = request(Default::default());
        r.model_name = "nope".into();
        let err = router.infer(r).await.unwrap_err();
        assert_eq!(
            err,
            ServiceError::NotFound("Request for unknown model: 'nope' is not found".into())
        );
        let meta = router.model_metadata("echo", None).await.unwrap();
        assert!(meta.platform == "w1" || meta.platform == "w2");
        assert!(router.model_ready("echo", None).await.unwrap());
        // Unknown models and versions are not ready, without an error (as on a worker).
        assert!(!router.model_ready("nope", None).await.unwrap());
        assert!(!router.model_ready("echo", Some(99)).await.unwrap());
        assert!(router.server_ready().await);

        let (_workers, full, _) = cluster(0).await;
        let err = full.infer(request(Default::default())).await.unwrap_err();
        assert!(matches!(err, ServiceError::Overloaded(_)), "{err:?}");
    })
    .await;
}

#[tokio::test]
async fn decoupled_answers_stream_through_the_router() {
    bounded(async {
        let (_workers, router, _) = cluster(64).await;
        let stream = router
            .infer_stream(request(Default::default()))
            .await
            .unwrap();
        let items: Vec<StreamedResponse> = stream.map(|i| i.unwrap()).collect().await;
        assert_eq!(items.len(), 3, "{items:?}");
        let first = items[0].response.as_ref().unwrap();
        let second = items[1].response.as_ref().unwrap();
        assert_eq!(first.outputs[0].data().as_ref(), &[7, 0, 0, 0]);
        assert_eq!(worker_of(first), worker_of(second));
        assert!(!items[0].last && !items[1].last);
        assert!(items[2].last && items[2].response.is_none());
        assert!(!first.parameters.contains_key("triton_final_response"));
        assert_eq!(router.in_flight(), 0);

        let mut bad = request(Default::default());
        bad.model_name = "nope".into();
        assert!(matches!(
            router.infer_stream(bad).await.err().unwrap(),
            ServiceError::NotFound(_)
        ));
    })
    .await;
}

#[tokio::test]
async fn the_grpc_frontend_serves_through_the_router() {
    use nereid_proto::pb::inference::ModelInferRequest;
    use nereid_proto::pb::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
    use nereid_proto::pb::inference::model_infer_request::InferInputTensor;
    bounded(async {
        let (_workers, router, _) = cluster(64).await;
        let front = FakeWorker::start_over(router).await;
        let mut client = GrpcInferenceServiceClient::connect(format!("http://{}", front.addr))
            .await
            .unwrap();
        let response = client
            .model_infer(ModelInferRequest {
                model_name: "echo".into(),
                inputs: vec![InferInputTensor {
                    name: "x".into(),
                    datatype: "INT32".into(),
                    shape: vec![1],
                    ..Default::default()
                }],
                raw_input_contents: vec![Bytes::from_static(&[9, 0, 0, 0])],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(response.raw_output_contents[0].as_ref(), &[9, 0, 0, 0]);
        assert!(response.parameters.contains_key("worker"));
    })
    .await;
}

impl FakeWorker {
    /// A gRPC server over any service (here: the router).
    async fn start_over(service: Arc<RouterService>) -> FakeWorker {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let routes = nereid_frontend::routes(service, Default::default());
        let task = tokio::spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            let _ = tonic::transport::Server::builder()
                .add_routes(routes)
                .serve_with_incoming(incoming)
                .await;
        });
        FakeWorker {
            addr,
            stop: None,
            task: Some(task),
        }
    }
}
