//! The pass-through path end to end: the router's gRPC routes (`nereid_router::grpc_routes`,
//! in-process on 127.0.0.1:0) in front of two echo workers. Responses through the router are
//! compared with the same call made to a worker directly.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test fails by panicking

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use nereid_frontend::{GrpcConfig, RestrictedApis};
use nereid_proto::pb::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use nereid_proto::pb::inference::infer_parameter::ParameterChoice;
use nereid_proto::pb::inference::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use nereid_proto::pb::inference::{
    InferParameter, InferTensorContents, ModelInferRequest, ModelInferResponse,
};
use nereid_router::{PassThroughConfig, RawCodec, RawMessage, RouterService, grpc_routes};
use nereid_test_support::serve_routes;
use tonic::Code;
use tonic::transport::Channel;

mod echo_cluster;

use echo_cluster::*;

fn config(restricted: &[&str]) -> PassThroughConfig {
    let values: Vec<String> = restricted.iter().map(|s| s.to_string()).collect();
    PassThroughConfig {
        grpc: GrpcConfig {
            restricted: RestrictedApis::parse_grpc(&values).unwrap(),
            ..Default::default()
        },
        shared_memory_off: "not on the router".into(),
    }
}

/// Serves the router's gRPC routes on a free port (until the test's runtime ends).
async fn serve_router(router: Arc<RouterService>, config: PassThroughConfig) -> SocketAddr {
    serve_routes(grpc_routes(router, config)).await
}

async fn client(addr: SocketAddr) -> GrpcInferenceServiceClient<Channel> {
    GrpcInferenceServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

/// Sends `message` as it is to `ModelInfer` at `addr`.
async fn raw_call(addr: SocketAddr, message: Vec<u8>) -> Result<Bytes, tonic::Status> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/inference.GRPCInferenceService/ModelInfer",
    );
    grpc.unary(
        tonic::Request::new(RawMessage::new(Bytes::from(message))),
        path,
        RawCodec,
    )
    .await
    .map(tonic::Response::into_inner)
}

fn raw_request() -> ModelInferRequest {
    ModelInferRequest {
        model_name: "echo".into(),
        id: "r1".into(),
        inputs: vec![InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![2, 3],
            ..Default::default()
        }],
        outputs: vec![InferRequestedOutputTensor {
            name: "x".into(),
            ..Default::default()
        }],
        raw_input_contents: vec![Bytes::from(
            (0..6u8)
                .flat_map(|i| f32::from(i).to_le_bytes())
                .collect::<Vec<_>>(),
        )],
        ..Default::default()
    }
}

fn typed_request() -> ModelInferRequest {
    ModelInferRequest {
        model_name: "echo".into(),
        inputs: vec![InferInputTensor {
            name: "x".into(),
            datatype: "INT32".into(),
            shape: vec![4],
            contents: Some(InferTensorContents {
                int_contents: vec![1, -2, 3, i32::MAX],
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The response without the parameter naming the worker that answered.
fn without_worker(mut r: ModelInferResponse) -> ModelInferResponse {
    assert!(r.parameters.remove("worker").is_some(), "{r:?}");
    r
}

#[tokio::test]
async fn outputs_through_the_router_are_the_workers_bytes() {
    bounded(async {
        let (workers, router, _) = cluster(64).await;
        let addr = serve_router(router, config(&[])).await;
        let mut via_router = client(addr).await;
        let mut direct = client(workers[0].addr).await;
        for request in [raw_request(), typed_request()] {
            let expected = direct
                .model_infer(request.clone())
                .await
                .unwrap()
                .into_inner();
            let got = via_router.model_infer(request).await.unwrap().into_inner();
            assert!(!expected.raw_output_contents.is_empty());
            assert_eq!(got.raw_output_contents, expected.raw_output_contents);
            assert_eq!(without_worker(got), without_worker(expected));
        }
    })
    .await;
}

#[tokio::test]
async fn malformed_bytes_are_invalid_argument_and_the_router_serves_on() {
    bounded(async {
        let (_workers, router, _) = cluster(64).await;
        let addr = serve_router(router, config(&[])).await;
        // model_name, then a raw_input_contents entry longer than what follows.
        let status = raw_call(addr, vec![0x0a, 4, b'e', b'c', b'h', b'o', 0x3a, 90, 1])
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains("field 7 declares 90 bytes"),
            "{status:?}"
        );
        let status = raw_call(addr, vec![0x12, 1, b'1']).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains("model_name"), "{status:?}");
        // Fields the router does not know travel to the worker (which skips them too).
        let mut with_unknown = prost::Message::encode_to_vec(&raw_request());
        with_unknown.extend([(15 << 3) | 2, 2, 0xde, 0xad]);
        let answer = raw_call(addr, with_unknown).await.unwrap();
        let answer: ModelInferResponse = prost::Message::decode(answer).unwrap();
        assert_eq!(answer.raw_output_contents, raw_request().raw_input_contents);
    })
    .await;
}

/// `ModelInfer` on `grpc` (a ready client of the router) with `messages` as its request
/// stream, sent as they are, compressed or not as `grpc` is set up.
async fn raw_calls(
    grpc: &mut tonic::client::Grpc<Channel>,
    messages: Vec<Vec<u8>>,
) -> Result<Bytes, tonic::Status> {
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/inference.GRPCInferenceService/ModelInfer",
    );
    let stream = futures::stream::iter(
        messages
            .into_iter()
            .map(|m| RawMessage::new(Bytes::from(m))),
    );
    grpc.client_streaming(tonic::Request::new(stream), path, RawCodec)
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn unary_calls_framed_by_the_router_answer_as_tonics_server() {
    bounded(async {
        let (_workers, router, _) = cluster(64).await;
        let mut small = config(&[]);
        small.grpc.max_message_size = 200;
        let addr = serve_router(router, small).await;
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let request = prost::Message::encode_to_vec(&raw_request());
        let expected = raw_call(addr, request.clone()).await.unwrap();
        let expected: ModelInferResponse = prost::Message::decode(expected).unwrap();
        assert_eq!(
            expected.raw_output_contents,
            raw_request().raw_input_contents
        );

        // A compressed call goes through tonic's server, which inflates it: the same answer.
        let mut gzip = tonic::client::Grpc::new(channel.clone())
            .send_compressed(tonic::codec::CompressionEncoding::Gzip);
        let answer = raw_calls(&mut gzip, vec![request.clone()]).await.unwrap();
        let answer: ModelInferResponse = prost::Message::decode(answer).unwrap();
        assert_eq!(answer.raw_output_contents, expected.raw_output_contents);

        // The framing's errors are tonic's, word for word.
        let mut plain = tonic::client::Grpc::new(channel.clone());
        let status = raw_calls(&mut plain, vec![]).await.unwrap_err();
        assert_eq!(
            (status.code(), status.message()),
            (Code::Internal, "Missing request message.")
        );
        let status = raw_calls(&mut plain, vec![vec![0; 201]]).await.unwrap_err();
        assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
        assert_eq!(
            status.message(),
            "Error, decoded message length too large: found 201 bytes, the limit is: 200 bytes"
        );
        // A second message in a unary call is not read, as tonic's server does not.
        let answer = raw_calls(&mut plain, vec![request.clone(), vec![0xff; 3]])
            .await
            .unwrap();
        let answer: ModelInferResponse = prost::Message::decode(answer).unwrap();
        assert_eq!(answer.raw_output_contents, expected.raw_output_contents);
        // And the router serves on.
        assert!(raw_call(addr, request).await.is_ok());
    })
    .await;
}

#[tokio::test]
async fn a_killed_worker_is_retried_around_and_sequences_stick() {
    bounded(async {
        let (mut workers, router, _) = cluster(64).await;
        let addr = serve_router(router, config(&[])).await;
        let mut grpc = client(addr).await;
        let worker = |r: &ModelInferResponse| match &r.parameters["worker"].parameter_choice {
            Some(ParameterChoice::StringParam(s)) => s.clone(),
            other => panic!("worker parameter {other:?}"),
        };
        let mut seen = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let r = grpc.model_infer(raw_request()).await.unwrap().into_inner();
            seen.insert(worker(&r));
        }
        assert_eq!(seen.len(), 2, "{seen:?}");

        let sequence = |start: bool| {
            let mut r = raw_request();
            let p = |c| InferParameter {
                parameter_choice: Some(c),
            };
            r.parameters.insert(
                "sequence_id".into(),
                p(ParameterChoice::StringParam("s".into())),
            );
            r.parameters.insert(
                "sequence_start".into(),
                p(ParameterChoice::BoolParam(start)),
            );
            r
        };
        let first = worker(&grpc.model_infer(sequence(true)).await.unwrap().into_inner());
        for _ in 0..8 {
            let r = grpc
                .model_infer(sequence(false))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(worker(&r), first);
        }

        workers[0].kill().await;
        for _ in 0..20 {
            let r = grpc.model_infer(raw_request()).await.unwrap().into_inner();
            assert_eq!(worker(&r), "w2");
        }
    })
    .await;
}

#[tokio::test]
async fn router_checks_run_before_forwarding() {
    bounded(async {
        let (_workers, router, _) = cluster(64).await;
        let addr = serve_router(router.clone(), config(&["inference:k=v"])).await;
        let mut grpc = client(addr).await;
        let refused = grpc.model_infer(raw_request()).await.unwrap_err();
        assert_eq!(refused.code(), Code::Unavailable);
        assert!(
            refused.message().contains("triton-grpc-protocol-k"),
            "{refused:?}"
        );
        let mut allowed = tonic::Request::new(raw_request());
        allowed
            .metadata_mut()
            .insert("triton-grpc-protocol-k", "v".parse().unwrap());
        grpc.model_infer(allowed).await.unwrap();

        let addr = serve_router(router.clone(), config(&[])).await;
        let mut grpc = client(addr).await;
        let mut shm = raw_request();
        shm.inputs[0].parameters.insert(
            "shared_memory_region".into(),
            InferParameter {
                parameter_choice: Some(ParameterChoice::StringParam("r".into())),
            },
        );
        let refused = grpc.model_infer(shm).await.unwrap_err();
        assert!(
            refused.message().contains("not on the router"),
            "{refused:?}"
        );
        let mut unknown = raw_request();
        unknown.model_name = "nope".into();
        let refused = grpc.model_infer(unknown).await.unwrap_err();
        assert_eq!(refused.code(), Code::NotFound, "{refused:?}");
        let mut bad_version = raw_request();
        bad_version.model_version = "x".into();
        let refused = grpc.model_infer(bad_version).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    })
    .await;
}
