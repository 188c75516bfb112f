//! In-process round trips: a real tonic server on 127.0.0.1:0 serving [`routes`] over a
//! [`FakeService`], called with the generated clients. No sleeps; every wait is bounded.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Code;
use tonic::transport::Channel;

use super::{GrpcConfig, routes};
use nereid_proto::InferenceService;
use nereid_proto::pb::health::HealthCheckRequest;
use nereid_proto::pb::health::health_check_response::ServingStatus;
use nereid_proto::pb::health::health_client::HealthClient;
use nereid_proto::pb::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use nereid_proto::pb::inference::model_infer_request::InferInputTensor;
use nereid_proto::pb::inference::*;
use nereid_proto::testing::{Answer, FakeEvent, FakeModel, FakeService};

const LIMIT: Duration = Duration::from_secs(10);

/// Echoes inputs back as outputs. Model `missing` is unknown, `loading` is not ready, `hang`
/// never answers.
fn fake() -> FakeService {
    FakeService::new("nereid")
        .fallback(FakeModel::echo())
        .unknown("missing")
        .model("loading", FakeModel::echo().not_ready())
        .model("hang", FakeModel::echo().answer(Answer::Hang))
}

/// A running server and a channel to it; the server stops when the harness is dropped.
struct Harness {
    channel: Channel,
    fake: Arc<FakeService>,
    events: mpsc::UnboundedReceiver<FakeEvent>,
    _shutdown: oneshot::Sender<()>,
}

impl Harness {
    async fn start(config: GrpcConfig) -> Harness {
        let fake = Arc::new(fake());
        let events = fake.events();
        let (channel, shutdown) = serve(fake.clone(), config).await;
        Harness {
            channel,
            fake,
            events,
            _shutdown: shutdown,
        }
    }

    fn client(&self) -> GrpcInferenceServiceClient<Channel> {
        GrpcInferenceServiceClient::new(self.channel.clone())
    }
}

/// Serves [`routes`] over `service` on 127.0.0.1:0 and connects to it; the server stops when the
/// returned sender is dropped.
pub(super) async fn serve(
    service: Arc<dyn InferenceService>,
    config: GrpcConfig,
) -> (Channel, oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (shutdown, stop) = oneshot::channel::<()>();
    let routes = routes(service, config);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stop.await;
            })
            .await
    });
    // The listener is already bound, so the connection is accepted as soon as the server task
    // polls it: no readiness wait needed.
    let channel = bounded(
        Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_timeout(LIMIT)
            .connect(),
    )
    .await
    .unwrap();
    (channel, shutdown)
}

/// Awaits `future`, failing the test if it takes longer than [`LIMIT`].
pub(super) async fn bounded<F: Future>(future: F) -> F::Output {
    tokio::time::timeout(LIMIT, future)
        .await
        .expect("the call finished within the time limit")
}

fn raw_input(name: &str, datatype: &str, shape: Vec<i64>) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape,
        ..Default::default()
    }
}

#[tokio::test]
async fn model_infer_round_trips_raw_and_typed_inputs() {
    let h = Harness::start(GrpcConfig::default()).await;
    let a: Vec<u8> = [7i32, -3].iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut request = ModelInferRequest {
        model_name: "echo".into(),
        id: "r1".into(),
        inputs: vec![raw_input("a", "INT32", vec![1, 2])],
        raw_input_contents: vec![Bytes::from(a.clone())],
        ..Default::default()
    };
    request.parameters.insert(
        "note".into(),
        InferParameter {
            parameter_choice: Some(infer_parameter::ParameterChoice::StringParam("x".into())),
        },
    );
    let response = bounded(h.client().model_infer(request))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (response.model_name.as_str(), response.id.as_str()),
        ("echo", "r1")
    );
    assert_eq!(response.outputs.len(), 1);
    assert_eq!(response.outputs[0].name, "a");
    assert_eq!(response.outputs[0].datatype, "INT32");
    assert_eq!(response.outputs[0].shape, vec![1, 2]);
    assert_eq!(response.raw_output_contents, vec![Bytes::from(a)]);
    assert_eq!(
        response.parameters["note"].parameter_choice,
        Some(infer_parameter::ParameterChoice::StringParam("x".into()))
    );

    // Typed contents come back raw, like Triton.
    let mut typed = raw_input("b", "FP32", vec![2]);
    typed.contents = Some(InferTensorContents {
        fp32_contents: vec![1.5, 2.5],
        ..Default::default()
    });
    let request = ModelInferRequest {
        model_name: "echo".into(),
        inputs: vec![typed],
        ..Default::default()
    };
    let response = bounded(h.client().model_infer(request))
        .await
        .unwrap()
        .into_inner();
    let expected: Vec<u8> = [1.5f32, 2.5].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(response.raw_output_contents, vec![Bytes::from(expected)]);
    assert!(response.outputs[0].contents.is_none());

    // A decode error arrives as INVALID_ARGUMENT with its message.
    let mut mixed = raw_input("b", "FP32", vec![1]);
    mixed.contents = Some(InferTensorContents {
        fp32_contents: vec![1.0],
        ..Default::default()
    });
    let request = ModelInferRequest {
        model_name: "echo".into(),
        inputs: vec![mixed],
        raw_input_contents: vec![Bytes::from(vec![0u8; 4])],
        ..Default::default()
    };
    let status = bounded(h.client().model_infer(request)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "contents field must not be specified when using raw_input_contents for 'b' for model 'echo'"
    );
}

#[tokio::test]
async fn health_readiness_and_unimplemented_rpcs() {
    let h = Harness::start(GrpcConfig::default()).await;
    let mut health = HealthClient::new(h.channel.clone());
    let check = || HealthCheckRequest {
        service: String::new(),
    };
    let status = bounded(health.check(check()))
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, i32::from(ServingStatus::Serving));
    h.fake.set_live(false);
    let status = bounded(health.check(check()))
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, i32::from(ServingStatus::NotServing));

    let mut client = h.client();
    let ready = |name: &str| ModelReadyRequest {
        name: name.into(),
        version: String::new(),
    };
    assert!(
        bounded(client.model_ready(ready("m")))
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    assert!(
        !bounded(client.model_ready(ready("loading")))
            .await
            .unwrap()
            .into_inner()
            .ready
    );
    let status = bounded(client.model_ready(ready("missing")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert_eq!(
        status.message(),
        "Request for unknown model: 'missing' is not found"
    );

    // This harness has no shared-memory registry: nothing is listed, and naming a region says
    // why there is none.
    let cuda = bounded(client.cuda_shared_memory_status(CudaSharedMemoryStatusRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert!(cuda.regions.is_empty());
    let status = bounded(
        client.cuda_shared_memory_status(CudaSharedMemoryStatusRequest { name: "r".into() }),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented);
    assert!(
        status
            .message()
            .starts_with("CUDA shared memory is not available: "),
        "{}",
        status.message()
    );
    let index = RepositoryIndexRequest {
        repository_name: "other".into(),
        ready: false,
    };
    let status = bounded(client.repository_index(index)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented);
    assert_eq!(
        status.message(),
        "'repository_name' specification is not supported"
    );
}

#[tokio::test]
async fn cancelled_call_drops_the_infer_future() {
    let mut h = Harness::start(GrpcConfig::default()).await;
    let mut client = h.client();
    let call = tokio::spawn(async move {
        client
            .model_infer(ModelInferRequest {
                model_name: "hang".into(),
                ..Default::default()
            })
            .await
    });
    let received = bounded(h.events.recv())
        .await
        .expect("the hang request reached the service");
    assert!(
        matches!(received, FakeEvent::Received { .. }),
        "{received:?}"
    );
    call.abort();
    let cancelled = bounded(h.events.recv())
        .await
        .expect("the infer future was dropped, not leaked");
    assert!(
        matches!(cancelled, FakeEvent::Cancelled { .. }),
        "{cancelled:?}"
    );
}

#[tokio::test]
async fn message_size_limit_applies() {
    let h = Harness::start(GrpcConfig {
        max_message_size: 1024,
        ..GrpcConfig::default()
    })
    .await;
    let request = ModelInferRequest {
        model_name: "echo".into(),
        inputs: vec![raw_input("a", "UINT8", vec![4096])],
        raw_input_contents: vec![Bytes::from(vec![0u8; 4096])],
        ..Default::default()
    };
    let status = bounded(h.client().model_infer(request)).await.unwrap_err();
    // tonic reports an oversized message as OUT_OF_RANGE (gRPC C++ says RESOURCE_EXHAUSTED).
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
}

/// A shm-typed gRPC input: region, offset and byte size as tritonclient sends them (int64).
fn shm_params(
    region: &str,
    offset: i64,
    byte_size: i64,
) -> std::collections::HashMap<String, InferParameter> {
    use infer_parameter::ParameterChoice::{Int64Param, StringParam};
    let param = |choice| InferParameter {
        parameter_choice: Some(choice),
    };
    [
        ("shared_memory_region", param(StringParam(region.into()))),
        ("shared_memory_offset", param(Int64Param(offset))),
        ("shared_memory_byte_size", param(Int64Param(byte_size))),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

#[tokio::test]
async fn a_region_registered_over_http_serves_grpc() {
    use crate::shm::SharedMemory;
    use crate::shm::test_object::TestObject;
    use axum::body::Body;
    use tower::ServiceExt;

    let obj = TestObject::new(64);
    let a: Vec<u8> = [7i32, -3].iter().flat_map(|v| v.to_le_bytes()).collect();
    obj.fill(4, &a);
    let shm = SharedMemory::enabled();
    let fake = Arc::new(fake());
    let http = crate::router(
        fake.clone(),
        crate::http::HttpConfig {
            shared_memory: shm.clone(),
            ..Default::default()
        },
    );
    let register = serde_json::json!({"key": obj.key, "byte_size": 64}).to_string();
    let reply = http
        .oneshot(
            axum::http::Request::post("/v2/systemsharedmemory/region/r/register")
                .body(Body::from(register))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);

    let config = GrpcConfig {
        shared_memory: shm,
        ..Default::default()
    };
    let (channel, _shutdown) = serve(fake, config).await;
    let mut client = GrpcInferenceServiceClient::new(channel);
    let status = bounded(
        client.system_shared_memory_status(SystemSharedMemoryStatusRequest { name: "r".into() }),
    )
    .await
    .unwrap()
    .into_inner();
    assert_eq!(status.regions["r"].key, obj.key);
    assert_eq!(status.regions["r"].byte_size, 64);

    // Input "a" from the region, plain input "b" from raw contents; "a" echoed into the region.
    let mut input = raw_input("a", "INT32", vec![1, 2]);
    input.parameters = shm_params("r", 4, 8);
    let b = Bytes::from(vec![1, 0, 0, 0]);
    let request = ModelInferRequest {
        model_name: "echo".into(),
        inputs: vec![input, raw_input("b", "INT32", vec![1])],
        outputs: vec![
            model_infer_request::InferRequestedOutputTensor {
                name: "a".into(),
                parameters: shm_params("r", 32, 32),
            },
            model_infer_request::InferRequestedOutputTensor {
                name: "b".into(),
                ..Default::default()
            },
        ],
        raw_input_contents: vec![b.clone()],
        ..Default::default()
    };
    let response = bounded(client.model_infer(request))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.outputs[0].name, "a");
    assert_eq!(response.outputs[0].shape, vec![1, 2]);
    assert_eq!(response.raw_output_contents, vec![Bytes::new(), b]);
    assert_eq!(&obj.contents()[32..40], &a[..]);

    let too_far = ModelInferRequest {
        model_name: "echo".into(),
        inputs: vec![InferInputTensor {
            parameters: shm_params("r", 60, 8),
            ..raw_input("a", "INT32", vec![1, 2])
        }],
        ..Default::default()
    };
    let status = bounded(client.model_infer(too_far)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "Invalid offset + byte size for shared memory region: 'r'"
    );
    bounded(
        client.system_shared_memory_unregister(SystemSharedMemoryUnregisterRequest {
            name: String::new(),
        }),
    )
    .await
    .unwrap();
    let status = bounded(
        client.system_shared_memory_status(SystemSharedMemoryStatusRequest {
            name: String::new(),
        }),
    )
    .await
    .unwrap()
    .into_inner();
    assert!(status.regions.is_empty());
}

#[tokio::test]
async fn restricted_rpcs_need_the_metadata_and_limits_apply() {
    let values = |v: &str| vec![v.to_string()];
    let h = Harness::start(GrpcConfig {
        restricted: crate::restrict::RestrictedApis::parse_grpc(&values("health:k=v")).unwrap(),
        limits: nereid_proto::codec::RequestLimits {
            max_inputs: 1,
            ..Default::default()
        },
        ..Default::default()
    })
    .await;
    let refusal = "This protocol is restricted, expecting header 'triton-grpc-protocol-k'";
    let with = |value: Option<&str>| {
        let mut request = tonic::Request::new(ServerLiveRequest {});
        if let Some(value) = value {
            request
                .metadata_mut()
                .insert("triton-grpc-protocol-k", value.parse().unwrap());
        }
        request
    };
    for value in [None, Some("V")] {
        let status = bounded(h.client().server_live(with(value)))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), refusal);
    }
    assert!(
        bounded(h.client().server_live(with(Some("v"))))
            .await
            .unwrap()
            .into_inner()
            .live
    );
    // The standard health service is `health` too.
    let mut health = HealthClient::new(h.channel.clone());
    let status = bounded(health.check(HealthCheckRequest::default()))
        .await
        .unwrap_err();
    assert_eq!(
        (status.code(), status.message()),
        (Code::Unavailable, refusal)
    );
    // Open categories pass; an infer request beyond the limits is refused before the service.
    let request = ModelInferRequest {
        model_name: "echo".into(),
        inputs: vec![
            raw_input("a", "FP32", vec![1]),
            raw_input("b", "FP32", vec![1]),
        ],
        raw_input_contents: vec![Bytes::from(vec![0; 4]), Bytes::from(vec![0; 4])],
        ..Default::default()
    };
    let status = bounded(h.client().model_infer(request)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "request has 2 inputs; the server accepts at most 1 (--max-request-inputs)"
    );
    assert!(h.fake.requests().is_empty());
}

#[tokio::test]
async fn forwarded_metadata_becomes_string_parameters() {
    let h = Harness::start(GrpcConfig {
        header_forward: crate::forward::HeaderForward::new("^x-fwd-|triton_").unwrap(),
        ..Default::default()
    })
    .await;
    let call = |metadata: &[(&'static str, &str)]| {
        let mut request = tonic::Request::new(ModelInferRequest {
            model_name: "echo".into(),
            inputs: vec![raw_input("a", "UINT8", vec![1])],
            raw_input_contents: vec![Bytes::from(vec![1u8])],
            ..Default::default()
        });
        for (key, value) in metadata {
            request.metadata_mut().insert(*key, value.parse().unwrap());
        }
        request
    };
    bounded(
        h.client()
            .model_infer(call(&[("x-fwd-a", "a"), ("x-other", "no")])),
    )
    .await
    .unwrap();
    let seen = h.fake.last_request().unwrap().parameters;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(
        seen["x-fwd-a"],
        nereid_proto::ParamValue::String("a".into())
    );

    let status = bounded(h.client().model_infer(call(&[("triton_x", "1")])))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        status.message(),
        "Header 'triton_x' is reserved for Triton usage and cannot be forwarded."
    );
}
