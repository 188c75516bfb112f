//! `ModelStreamInfer` over a real tonic server (final flags, empty finals, errors in band and as
//! statuses, concurrency, cancellation), plus back-pressure on [`serve_stream`] itself.
//! No sleeps: every network wait is bounded; the back-pressure test runs on tokio's paused
//! clock, where [`settle`] returns only once every task is idle.

use std::sync::Arc;
use std::time::Duration;

use futures::stream;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

use super::*;
use crate::grpc::GrpcConfig;
use crate::grpc::tests::{bounded, serve};
use nereid_proto::pb::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use nereid_proto::testing::{FakeEvent, FakeModel, FakeService, Step};
use nereid_proto::{InferRequest, ParamValue};

/// The `n` parameter of a request (default 1), and whether it asks to wait for the gate.
fn n_and_gate(request: &InferRequest) -> (i64, Vec<Step>) {
    let n = match request.parameters.get("n") {
        Some(ParamValue::Int(n)) => *n,
        _ => 1,
    };
    let gated = request.parameters.get("gated") == Some(&ParamValue::Bool(true));
    (n, if gated { vec![Step::Gate] } else { vec![] })
}

/// Streams per model name (each response carries its parameter `index`):
/// - `count`: parameter `n` (default 1) responses, the last marked last; `n = 0` sends only an
///   empty final item. With parameter `gated: true`, `count` and `decoupled` start answering
///   once the gate opens ([`FakeService::open_gate`]).
/// - `decoupled`: `n` responses none marked last, then an empty final item.
/// - `unterminated`: one response not marked last, then the stream ends.
/// - `refuse`: the call itself fails (INVALID_ARGUMENT).
/// - `fail_mid`: one response, then an INTERNAL error item.
/// - `gate`: one response once the gate opens.
/// - `hang`: never answers.
/// - `endless`: answers forever.
///
/// `decoupled`, `unterminated`, `gate`, `hang` and `endless` are decoupled; the others answer
/// in request order.
fn fake() -> FakeService {
    let indexed = |index, last| Step::Respond {
        index: Some(index),
        last,
    };
    FakeService::new("nereid")
        .model(
            "count",
            FakeModel::echo().stream_with(move |request| {
                let (n, mut steps) = n_and_gate(request);
                if n == 0 {
                    steps.push(Step::EmptyFinal);
                }
                steps.extend((0..n).map(|i| indexed(i, i == n - 1)));
                steps
            }),
        )
        .model(
            "decoupled",
            FakeModel::echo().decoupled().stream_with(move |request| {
                let (n, mut steps) = n_and_gate(request);
                steps.extend((0..n).map(|i| indexed(i, false)));
                steps.push(Step::EmptyFinal);
                steps
            }),
        )
        .model(
            "unterminated",
            FakeModel::echo()
                .decoupled()
                .stream(vec![indexed(0, false)]),
        )
        .model(
            "refuse",
            FakeModel::failing(ServiceError::invalid(
                "model 'refuse' refuses every request",
            )),
        )
        .model(
            "fail_mid",
            FakeModel::echo().stream(vec![
                indexed(0, false),
                Step::Fail(ServiceError::internal("boom after one response")),
            ]),
        )
        .model(
            "gate",
            FakeModel::echo()
                .decoupled()
                .stream(vec![Step::Gate, indexed(0, true)]),
        )
        .model(
            "hang",
            FakeModel::echo().decoupled().stream(vec![Step::Pending]),
        )
        .model(
            "endless",
            FakeModel::echo().decoupled().stream(vec![Step::Endless]),
        )
}

/// The next [`FakeEvent::Produced`] id, skipping other events.
async fn next_produced(events: &mut mpsc::UnboundedReceiver<FakeEvent>) -> String {
    loop {
        match bounded(events.recv()).await.expect("events keep coming") {
            FakeEvent::Produced { id } => return id,
            _ => continue,
        }
    }
}

fn request(model: &str, id: &str, params: &[(&str, ParameterChoice)]) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.into(),
        id: id.into(),
        parameters: params
            .iter()
            .map(|(k, v)| {
                let value = InferParameter {
                    parameter_choice: Some(v.clone()),
                };
                (k.to_string(), value)
            })
            .collect(),
        ..Default::default()
    }
}

fn n(count: i64) -> (&'static str, ParameterChoice) {
    ("n", ParameterChoice::Int64Param(count))
}

fn empty_final(enabled: bool) -> (&'static str, ParameterChoice) {
    (
        "triton_enable_empty_final_response",
        ParameterChoice::BoolParam(enabled),
    )
}

/// One open `ModelStreamInfer` rpc: requests go in through `requests`; dropping it half-closes.
struct Session {
    requests: Option<mpsc::Sender<ModelInferRequest>>,
    responses: tonic::Streaming<ModelStreamInferResponse>,
}

impl Session {
    async fn open(channel: &Channel, grpc_error: bool) -> Session {
        let (tx, rx) = mpsc::channel(16);
        let mut call = tonic::Request::new(ReceiverStream::new(rx));
        if grpc_error {
            call.metadata_mut()
                .insert(GRPC_ERROR_KEY, MetadataValue::from_static("true"));
        }
        let mut client = GrpcInferenceServiceClient::new(channel.clone());
        let responses = bounded(client.model_stream_infer(call))
            .await
            .expect("the stream opens")
            .into_inner();
        Session {
            requests: Some(tx),
            responses,
        }
    }

    async fn send(&self, request: ModelInferRequest) {
        let requests = self.requests.as_ref().expect("not half-closed");
        bounded(requests.send(request))
            .await
            .expect("the request stream is open");
    }

    async fn next(&mut self) -> Result<Option<ModelStreamInferResponse>, Status> {
        bounded(self.responses.message()).await
    }

    async fn expect_response(&mut self) -> ModelStreamInferResponse {
        self.next()
            .await
            .expect("no error status")
            .expect("a response before the stream ends")
    }

    /// Half-closes and reads every remaining response; the stream must then end with OK.
    async fn finish(mut self) -> Vec<ModelStreamInferResponse> {
        self.requests = None;
        let mut all = Vec::new();
        while let Some(response) = self.next().await.expect("the stream ends with OK") {
            all.push(response);
        }
        all
    }
}

async fn start() -> (Channel, Arc<FakeService>, oneshot::Sender<()>) {
    let fake = Arc::new(fake());
    let (channel, shutdown) = serve(fake.clone(), GrpcConfig::default()).await;
    (channel, fake, shutdown)
}

fn infer_response(message: &ModelStreamInferResponse) -> &ModelInferResponse {
    message
        .infer_response
        .as_ref()
        .expect("every message carries an infer_response")
}

fn final_flag(message: &ModelStreamInferResponse) -> bool {
    match infer_response(message).parameters[FINAL_RESPONSE_KEY].parameter_choice {
        Some(ParameterChoice::BoolParam(last)) => last,
        ref other => panic!("{FINAL_RESPONSE_KEY} is not a bool: {other:?}"),
    }
}

fn index(message: &ModelStreamInferResponse) -> Option<i64> {
    match infer_response(message)
        .parameters
        .get("index")?
        .parameter_choice
    {
        Some(ParameterChoice::Int64Param(i)) => Some(i),
        _ => None,
    }
}

/// The messages answering request `id`, in arrival order.
fn for_id<'a>(all: &'a [ModelStreamInferResponse], id: &str) -> Vec<&'a ModelStreamInferResponse> {
    all.iter().filter(|m| infer_response(m).id == id).collect()
}

#[tokio::test]
async fn every_response_carries_the_final_flag_and_half_close_ends_the_stream() {
    let (channel, _mock, _server) = start().await;
    let session = Session::open(&channel, false).await;
    session.send(request("count", "a", &[n(3)])).await;
    let all = session.finish().await;
    assert_eq!(all.len(), 3);
    for (i, message) in all.iter().enumerate() {
        assert_eq!(message.error_message, "");
        let response = infer_response(message);
        assert_eq!(
            (response.id.as_str(), response.model_name.as_str()),
            ("a", "count")
        );
        assert_eq!(index(message), Some(i as i64));
        assert_eq!(final_flag(message), i == 2);
    }
}

#[tokio::test]
async fn empty_final_response_is_sent_only_when_asked_for() {
    let (channel, _mock, _server) = start().await;
    let session = Session::open(&channel, false).await;
    session.send(request("decoupled", "quiet", &[n(2)])).await;
    let mut loud = request("decoupled", "loud", &[n(2), empty_final(true)]);
    loud.model_version = "1".into();
    session.send(loud).await;
    session
        .send(request("count", "real_last", &[n(2), empty_final(true)]))
        .await;
    session
        .send(request("count", "none", &[n(0), empty_final(false)]))
        .await;
    session
        .send(request("count", "only_final", &[n(0), empty_final(true)]))
        .await;
    session
        .send(request("unterminated", "cut", &[empty_final(true)]))
        .await;
    let all = session.finish().await;

    let quiet = for_id(&all, "quiet");
    assert_eq!(
        quiet.iter().map(|m| final_flag(m)).collect::<Vec<_>>(),
        [false, false]
    );

    let loud = for_id(&all, "loud");
    assert_eq!(
        loud.iter().map(|m| final_flag(m)).collect::<Vec<_>>(),
        [false, false, true]
    );
    let marker = infer_response(loud[2]);
    assert_eq!(
        (marker.model_name.as_str(), marker.model_version.as_str()),
        ("decoupled", "1")
    );
    assert!(marker.outputs.is_empty() && marker.raw_output_contents.is_empty());
    assert_eq!(
        marker.parameters.len(),
        1,
        "only the final flag: {marker:?}"
    );

    // The last real response is itself final: no extra empty response.
    let real_last = for_id(&all, "real_last");
    assert_eq!(
        real_last.iter().map(|m| final_flag(m)).collect::<Vec<_>>(),
        [false, true]
    );
    assert!(real_last.iter().all(|m| index(m).is_some()));

    assert!(for_id(&all, "none").is_empty());
    let only_final = for_id(&all, "only_final");
    assert_eq!(only_final.len(), 1);
    assert!(final_flag(only_final[0]) && index(only_final[0]).is_none());

    // A stream that ends without a last item still closes the request for the client.
    let cut = for_id(&all, "cut");
    assert_eq!(
        cut.iter().map(|m| final_flag(m)).collect::<Vec<_>>(),
        [false, true]
    );
    assert_eq!(all.len(), 2 + 3 + 2 + 1 + 2);
}

#[tokio::test]
async fn errors_come_back_in_band_and_the_stream_stays_open() {
    let (channel, _mock, _server) = start().await;
    let mut session = Session::open(&channel, false).await;
    session.send(request("refuse", "r1", &[])).await;
    let message = session.expect_response().await;
    assert_eq!(
        message.error_message,
        "model 'refuse' refuses every request"
    );
    let named = infer_response(&message);
    assert_eq!(
        (named.id.as_str(), named.model_name.as_str()),
        ("r1", "refuse")
    );
    assert!(final_flag(&message));

    let mut bad_version = request("count", "r2", &[]);
    bad_version.model_version = "x".into();
    session.send(bad_version).await;
    session
        .send(request(
            "count",
            "r3",
            &[(
                "triton_enable_empty_final_response",
                ParameterChoice::Int64Param(1),
            )],
        ))
        .await;
    session.send(request("fail_mid", "r4", &[])).await;
    session.send(request("count", "ok", &[])).await;
    let all = session.finish().await;

    let r2 = for_id(&all, "r2");
    assert_eq!(r2.len(), 1);
    assert_eq!(
        r2[0].error_message,
        "failed to get model version from specified version string 'x' (details: stol), version should be an integral value > 0"
    );
    assert_eq!(infer_response(r2[0]).model_version, "x");
    let r3 = for_id(&all, "r3");
    assert_eq!(
        r3[0].error_message,
        "invalid value type for 'triton_enable_empty_final_response' parameter, expected bool_param."
    );
    let r4 = for_id(&all, "r4");
    assert_eq!(r4.len(), 2);
    assert_eq!(
        (r4[0].error_message.as_str(), final_flag(r4[0])),
        ("", false)
    );
    assert_eq!(r4[1].error_message, "boom after one response");
    assert!(final_flag(r4[1]));
    let ok = for_id(&all, "ok");
    assert_eq!(ok.len(), 1);
    assert_eq!(ok[0].error_message, "");
}

#[tokio::test]
async fn triton_grpc_error_metadata_ends_the_stream_with_the_status() {
    let (channel, _mock, _server) = start().await;

    let mut session = Session::open(&channel, true).await;
    session.send(request("count", "first", &[])).await;
    assert_eq!(infer_response(&session.expect_response().await).id, "first");
    session.send(request("refuse", "second", &[])).await;
    let status = session.next().await.expect_err("the error ends the rpc");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(status.message(), "model 'refuse' refuses every request");

    let mut session = Session::open(&channel, true).await;
    let mut bad_version = request("count", "v", &[]);
    bad_version.model_version = "x".into();
    session.send(bad_version).await;
    let status = session
        .next()
        .await
        .expect_err("a decode error ends the rpc");
    assert_eq!(status.code(), Code::InvalidArgument);

    let mut session = Session::open(&channel, true).await;
    session.send(request("fail_mid", "m", &[])).await;
    assert!(!final_flag(&session.expect_response().await));
    let status = session
        .next()
        .await
        .expect_err("an error item ends the rpc");
    assert_eq!(status.code(), Code::Internal);
    assert_eq!(status.message(), "boom after one response");
}

#[tokio::test]
async fn requests_on_one_stream_run_concurrently() {
    let (channel, mock, _server) = start().await;
    let mut session = Session::open(&channel, false).await;
    session.send(request("gate", "slow", &[])).await;
    session.send(request("count", "fast", &[])).await;
    // `slow` cannot answer before the gate opens, so `fast` overtaking it shows the two ran
    // side by side; run one after the other, this read would time out.
    assert_eq!(infer_response(&session.expect_response().await).id, "fast");
    mock.open_gate();
    let slow = session.expect_response().await;
    assert_eq!(infer_response(&slow).id, "slow");
    assert!(final_flag(&slow));
    assert!(session.finish().await.is_empty());
}

#[tokio::test]
async fn requests_of_one_sequence_run_in_the_order_sent() {
    let (channel, mock, _server) = start().await;
    let mut session = Session::open(&channel, false).await;
    let seq = |id: i64| ("sequence_id", ParameterChoice::Int64Param(id));
    let gated = ("gated", ParameterChoice::BoolParam(true));
    // Decoupled, so the send order holds nothing back; only the start order acts.
    session
        .send(request("decoupled", "seq7_first", &[seq(7), n(1), gated]))
        .await;
    session
        .send(request("decoupled", "seq7_second", &[seq(7), n(1)]))
        .await;
    session
        .send(request("decoupled", "seq8", &[seq(8), n(1)]))
        .await;
    // `seq7_second` could answer at once, but must wait for `seq7_first`, held at the gate;
    // another sequence does not wait.
    assert_eq!(infer_response(&session.expect_response().await).id, "seq8");
    mock.open_gate();
    assert_eq!(
        infer_response(&session.expect_response().await).id,
        "seq7_first"
    );
    assert_eq!(
        infer_response(&session.expect_response().await).id,
        "seq7_second"
    );
    assert!(session.finish().await.is_empty());
}

#[tokio::test]
async fn non_decoupled_answers_keep_request_order() {
    let (channel, mock, _server) = start().await;
    let mut produced = mock.events();
    let mut session = Session::open(&channel, false).await;
    let gated = ("gated", ParameterChoice::BoolParam(true));
    session.send(request("count", "first", &[gated])).await;
    session.send(request("count", "second", &[])).await;
    session.send(request("decoupled", "free", &[n(1)])).await;
    // `second` is ready before `first`, yet waits for it; a decoupled model's answer does not.
    let mut ready = vec![
        next_produced(&mut produced).await,
        next_produced(&mut produced).await,
    ];
    ready.sort();
    assert_eq!(ready, ["free", "second"]);
    assert_eq!(infer_response(&session.expect_response().await).id, "free");
    mock.open_gate();
    assert_eq!(infer_response(&session.expect_response().await).id, "first");
    assert_eq!(
        infer_response(&session.expect_response().await).id,
        "second"
    );
    assert!(session.finish().await.is_empty());
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_its_requests() {
    let (channel, mock, _server) = start().await;
    let mut events = mock.events();
    let session = Session::open(&channel, false).await;
    session.send(request("hang", "h", &[])).await;
    let received = bounded(events.recv())
        .await
        .expect("the request reached the service");
    assert!(
        matches!(received, FakeEvent::Received { .. }),
        "{received:?}"
    );
    drop(session);
    let cancelled = bounded(events.recv())
        .await
        .expect("the service's stream was dropped, not leaked");
    assert!(
        matches!(cancelled, FakeEvent::Cancelled { .. }),
        "{cancelled:?}"
    );
}

/// Returns once every task is idle: on the paused clock, time only advances then.
async fn settle() {
    tokio::time::sleep(Duration::from_secs(3600)).await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_reader_holds_back_the_model_and_dropping_it_cancels() {
    let mock = Arc::new(fake());
    let requests = stream::iter([Ok(request("endless", "e", &[]))]).chain(stream::pending());
    let buffer = 2;
    let mut responses = serve_stream(
        mock.clone(),
        requests,
        ErrorMode::InBand,
        Default::default(),
        Ok(Default::default()),
        buffer,
        Default::default(),
    );
    settle().await;
    // `buffer` responses wait in the channel and one more in the blocked send; no more are
    // pulled from the model's stream.
    assert_eq!(mock.produced(), buffer + 1);
    let first = responses
        .next()
        .await
        .expect("a response")
        .expect("not an error");
    assert_eq!(index(&first), Some(0));
    settle().await;
    assert_eq!(mock.produced(), buffer + 2);

    assert_eq!(mock.requests().len(), 1, "the request reached the service");
    assert_eq!(mock.cancelled(), 0, "still running");
    drop(responses);
    settle().await;
    assert_eq!(mock.cancelled(), 1, "the model's stream was dropped");
}

#[test]
fn grpc_error_mode_needs_exactly_true() {
    let mode = |value: Option<&'static str>| {
        let mut metadata = MetadataMap::new();
        if let Some(v) = value {
            metadata.insert(GRPC_ERROR_KEY, MetadataValue::from_static(v));
        }
        ErrorMode::from_metadata(&metadata)
    };
    assert_eq!(mode(None), ErrorMode::InBand);
    assert_eq!(mode(Some("false")), ErrorMode::InBand);
    assert_eq!(mode(Some("1")), ErrorMode::InBand);
    assert_eq!(mode(Some("true")), ErrorMode::Status);
}
