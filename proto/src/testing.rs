//! [`FakeService`]: one configurable [`InferenceService`] for the tests of every crate that
//! serves or calls the KServe v2 API (frontends, router, load generator). Enabled by the
//! `testing` feature (and in this crate's own tests).
//!
//! ```text
//! FakeService::new("name")            models by name, each a FakeModel:
//!   .model("m", FakeModel::echo())      answer:  echo | fail | hang | delay | fixed outputs
//!   .fallback(FakeModel::echo())        stream:  steps (respond, empty final, fail, gate, ...)
//!   .unknown("missing")                 config and metadata as a client sees them
//!
//! infer / infer_stream ─► recorded (requests(), events()) ─► the model's answer or steps
//!                         a future or stream dropped before it finished ─► FakeEvent::Cancelled
//! ```
//!
//! Also [`fp32_tensor`] and [`int32_tensor`], the 1-D tensors tests build most.
//!
//! Unknown models are `NotFound` with Triton's message. Nothing sleeps except a model given a
//! [`FakeModel::delay`].

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::sync::{Notify, mpsc};

use crate::datatype::DataType;
use crate::error::{ServiceError, ServiceResult};
use crate::pb::inference::{ModelConfig, ModelInput, ModelStatistics, ModelTransactionPolicy};
use crate::service::{
    InferenceService, LoadRequest, ModelIndexEntry, ModelMetadata, ResponseStream, ServerMetadata,
    StreamedResponse, TensorMetadata, UnloadRequest,
};
use crate::types::{InferRequest, InferResponse, ParamValue, Tensor};

/// A 1-D `FP32` tensor of `values`.
pub fn fp32_tensor(name: &str, values: &[f32]) -> Tensor {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    shaped(name, DataType::Fp32, values.len(), data)
}

/// A 1-D `INT32` tensor of `values`.
pub fn int32_tensor(name: &str, values: &[i32]) -> Tensor {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    shaped(name, DataType::Int32, values.len(), data)
}

fn shaped(name: &str, datatype: DataType, count: usize, data: Vec<u8>) -> Tensor {
    match Tensor::new(name, datatype, vec![count as i64], bytes::Bytes::from(data)) {
        Ok(t) => t,
        Err(e) => panic!("test tensor '{name}': {e}"),
    }
}

/// What a model answers to `infer` (and what each response of its stream carries).
#[derive(Clone, Debug)]
pub enum Answer {
    /// The inputs back as outputs, renamed to the requested outputs when the request names
    /// them (input `i` to output `i`, cycling), else as [`FakeModel::output_names`] says.
    Echo,
    /// These outputs, whatever the request.
    Outputs(Vec<Tensor>),
    /// This error (for a stream: the call itself fails).
    Fail(ServiceError),
    /// Never answers.
    Hang,
    /// The echo, after this long on the wall clock: a model slower than a deadline, for the
    /// tests whose subject is wall time (deadlines, cancellation); the only sleeps of this fake.
    Delay(Duration),
}

/// One step of a model's response stream.
#[derive(Clone, Debug)]
pub enum Step {
    /// The model's answer; `index` adds the response parameter `index`; `last` marks it final.
    Respond {
        /// The response parameter `index`, when set.
        index: Option<i64>,
        /// The item is the stream's final one.
        last: bool,
    },
    /// An empty final item: no response, `last` set.
    EmptyFinal,
    /// An error item.
    Fail(ServiceError),
    /// Waits until [`FakeService::open_gate`] (a permit given earlier counts).
    Gate,
    /// Never yields again; the stream stays open until dropped.
    Pending,
    /// Answers forever, response parameter `index` counting from 0, none final.
    Endless,
}

impl Step {
    /// The answer without an index, final or not.
    pub fn respond(last: bool) -> Step {
        Step::Respond { index: None, last }
    }
}

/// The steps of one streamed request, chosen from the request.
pub type StreamScript = Arc<dyn Fn(&InferRequest) -> Vec<Step> + Send + Sync>;

/// One model of a [`FakeService`].
#[derive(Clone)]
pub struct FakeModel {
    ready: bool,
    answer: Answer,
    /// `None`: one final response, the answer of `infer`.
    stream: Option<StreamScript>,
    config: ModelConfig,
    platform: String,
    inputs: Vec<TensorMetadata>,
    outputs: Vec<TensorMetadata>,
    output_names: Vec<String>,
    /// Refuse requests whose inputs do not match `inputs` (names, datatypes, fixed dims).
    check_inputs: bool,
    /// Added to every response.
    parameters: BTreeMap<String, ParamValue>,
}

impl FakeModel {
    /// A ready model that echoes its inputs.
    pub fn echo() -> FakeModel {
        FakeModel {
            ready: true,
            answer: Answer::Echo,
            stream: None,
            config: ModelConfig::default(),
            platform: "fake".into(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            output_names: Vec::new(),
            check_inputs: false,
            parameters: BTreeMap::new(),
        }
    }

    /// A model whose every request fails with `error`.
    pub fn failing(error: ServiceError) -> FakeModel {
        FakeModel::echo().answer(Answer::Fail(error))
    }

    /// The model answers every request with `answer` instead of the echo.
    pub fn answer(mut self, answer: Answer) -> FakeModel {
        self.answer = answer;
        self
    }

    /// Loaded but not ready (`model_ready` is false).
    pub fn not_ready(mut self) -> FakeModel {
        self.ready = false;
        self
    }

    /// The same steps for every streamed request.
    pub fn stream(self, steps: Vec<Step>) -> FakeModel {
        self.stream_with(move |_| steps.clone())
    }

    /// Steps chosen per streamed request.
    pub fn stream_with(
        mut self,
        script: impl Fn(&InferRequest) -> Vec<Step> + Send + Sync + 'static,
    ) -> FakeModel {
        self.stream = Some(Arc::new(script));
        self
    }

    /// Marks the model decoupled in its config.
    pub fn decoupled(mut self) -> FakeModel {
        self.config.model_transaction_policy = Some(ModelTransactionPolicy { decoupled: true });
        self
    }

    /// Sets the config's `max_batch_size`.
    pub fn max_batch_size(mut self, max_batch_size: i32) -> FakeModel {
        self.config.max_batch_size = max_batch_size;
        self
    }

    /// A config input (`data_type` is the `DataType` enum's number, e.g. 11 for FP32).
    pub fn config_input(mut self, name: &str, data_type: i32, dims: Vec<i64>) -> FakeModel {
        self.config.input.push(ModelInput {
            name: name.into(),
            data_type,
            dims,
            ..Default::default()
        });
        self
    }

    /// The platform metadata and config report.
    pub fn platform(mut self, platform: &str) -> FakeModel {
        self.platform = platform.into();
        self
    }

    /// The inputs model metadata reports.
    pub fn inputs(mut self, inputs: Vec<TensorMetadata>) -> FakeModel {
        self.inputs = inputs;
        self
    }

    /// The outputs model metadata reports.
    pub fn outputs(mut self, outputs: Vec<TensorMetadata>) -> FakeModel {
        self.outputs = outputs;
        self
    }

    /// The echo names output `i` `names[i]` when the request names no outputs.
    pub fn output_names(mut self, names: &[&str]) -> FakeModel {
        self.output_names = names.iter().map(|n| n.to_string()).collect();
        self
    }

    /// Refuse (`InvalidArgument`) requests whose inputs differ from the metadata inputs in
    /// number, name, datatype, rank or a fixed dimension.
    pub fn check_inputs(mut self) -> FakeModel {
        self.check_inputs = true;
        self
    }

    /// A parameter added to every response.
    pub fn response_parameter(mut self, key: &str, value: ParamValue) -> FakeModel {
        self.parameters.insert(key.into(), value);
        self
    }

    fn check(&self, request: &InferRequest) -> ServiceResult<()> {
        if !self.check_inputs {
            return Ok(());
        }
        if request.inputs.len() != self.inputs.len() {
            return Err(ServiceError::invalid(format!(
                "expected {} inputs, got {}",
                self.inputs.len(),
                request.inputs.len()
            )));
        }
        for (x, want) in request.inputs.iter().zip(&self.inputs) {
            let dims_fit = x.shape().len() == want.shape.len()
                && x.shape()
                    .iter()
                    .zip(&want.shape)
                    .all(|(got, want)| *want < 0 || got == want);
            if x.name() != want.name || x.datatype().as_wire() != want.datatype || !dims_fit {
                return Err(ServiceError::invalid(format!("unexpected input {x:?}")));
            }
        }
        Ok(())
    }

    /// The answer to `request`, without delay or hang.
    fn respond(&self, request: &InferRequest) -> ServiceResult<InferResponse> {
        self.check(request)?;
        let outputs = match &self.answer {
            Answer::Fail(e) => return Err(e.clone()),
            Answer::Outputs(outputs) => outputs.clone(),
            Answer::Echo | Answer::Hang | Answer::Delay(_) if !request.outputs.is_empty() => {
                request
                    .outputs
                    .iter()
                    .zip(request.inputs.iter().cycle())
                    .map(|(o, t)| t.clone().renamed(o.name.clone()))
                    .collect()
            }
            Answer::Echo | Answer::Hang | Answer::Delay(_) => request
                .inputs
                .iter()
                .enumerate()
                .map(|(i, t)| match self.output_names.get(i) {
                    Some(name) => t.clone().renamed(name.clone()),
                    None => t.clone(),
                })
                .collect(),
        };
        let mut parameters = request.parameters.clone();
        parameters.extend(self.parameters.clone());
        Ok(InferResponse {
            model_name: request.model_name.clone(),
            model_version: request.model_version.unwrap_or(1).to_string(),
            id: request.id.clone(),
            parameters,
            outputs,
        })
    }
}

/// What happened inside a [`FakeService`], in order ([`FakeService::events`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FakeEvent {
    /// An `infer` or `infer_stream` call arrived.
    Received {
        /// The model asked for.
        model: String,
        /// The request's id.
        id: String,
    },
    /// A stream produced an item (a response, an empty final item or an error).
    Produced {
        /// The request's id.
        id: String,
    },
    /// An `infer` future or a response stream was dropped before it finished.
    Cancelled {
        /// The model asked for.
        model: String,
        /// The request's id.
        id: String,
    },
}

/// A request as the service received it.
#[derive(Clone, Debug)]
pub struct Received {
    /// The request as it arrived.
    pub request: InferRequest,
    /// When it arrived.
    pub at: Instant,
}

/// The fake service; see the module docs.
pub struct FakeService {
    metadata: ServerMetadata,
    live: AtomicBool,
    ready: AtomicBool,
    /// `None`: listed as unknown even with a fallback.
    models: BTreeMap<String, Option<FakeModel>>,
    fallback: Option<FakeModel>,
    index: Vec<ModelIndexEntry>,
    /// `Some(n)`: statistics per model with inference count `n`; `None`: always empty.
    statistics: Option<u64>,
    shared: Arc<Shared>,
}

/// What the service's futures and streams update after the call returned.
#[derive(Default)]
struct Shared {
    gate: Notify,
    requests: Mutex<Vec<Received>>,
    loads: Mutex<Vec<(String, LoadRequest)>>,
    unloads: Mutex<Vec<(String, bool)>>,
    produced: AtomicUsize,
    cancelled: AtomicUsize,
    events: Mutex<Option<mpsc::UnboundedSender<FakeEvent>>>,
}

impl Shared {
    fn event(&self, event: FakeEvent) {
        if let Some(tx) = &*lock(&self.events) {
            let _ = tx.send(event);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reports [`FakeEvent::Cancelled`] when dropped before `finished` is set.
struct CancelGuard {
    shared: Arc<Shared>,
    model: String,
    id: String,
    finished: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.finished {
            self.shared.cancelled.fetch_add(1, Ordering::SeqCst);
            self.shared.event(FakeEvent::Cancelled {
                model: std::mem::take(&mut self.model),
                id: std::mem::take(&mut self.id),
            });
        }
    }
}

impl FakeService {
    /// A live, ready service named `name` (server metadata version "0", no extensions) that
    /// knows no models yet.
    pub fn new(name: &str) -> FakeService {
        FakeService {
            metadata: ServerMetadata {
                name: name.into(),
                version: "0".into(),
                extensions: Vec::new(),
            },
            live: AtomicBool::new(true),
            ready: AtomicBool::new(true),
            models: BTreeMap::new(),
            fallback: None,
            index: Vec::new(),
            statistics: None,
            shared: Arc::default(),
        }
    }

    /// The version `server_metadata` reports.
    pub fn version(mut self, version: &str) -> FakeService {
        self.metadata.version = version.into();
        self
    }

    /// The extensions `server_metadata` reports.
    pub fn extensions(mut self, extensions: &[&str]) -> FakeService {
        self.metadata.extensions = extensions.iter().map(|e| e.to_string()).collect();
        self
    }

    /// Serves `model` under `name`.
    pub fn model(mut self, name: &str, model: FakeModel) -> FakeService {
        self.models.insert(name.into(), Some(model));
        self
    }

    /// The model serving every name not given to [`Self::model`] or [`Self::unknown`].
    pub fn fallback(mut self, model: FakeModel) -> FakeService {
        self.fallback = Some(model);
        self
    }

    /// A name that stays unknown (`NotFound`) even with a fallback.
    pub fn unknown(mut self, name: &str) -> FakeService {
        self.models.insert(name.into(), None);
        self
    }

    /// What `repository_index` lists (`ready_only` keeps the `READY` entries).
    pub fn index(mut self, index: Vec<ModelIndexEntry>) -> FakeService {
        self.index = index;
        self
    }

    /// Statistics of known models, each with this inference count; for every model (empty
    /// name), one entry per [`Self::index`] entry.
    pub fn statistics(mut self, inference_count: u64) -> FakeService {
        self.statistics = Some(inference_count);
        self
    }

    /// What `server_live` answers from now on.
    pub fn set_live(&self, live: bool) {
        self.live.store(live, Ordering::SeqCst);
    }

    /// What `server_ready` answers from now on.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Lets one [`Step::Gate`] pass (now, or the next one to wait).
    pub fn open_gate(&self) {
        self.shared.gate.notify_one();
    }

    /// Every inference request received (unary and streamed), in order.
    pub fn requests(&self) -> Vec<Received> {
        lock(&self.shared.requests).clone()
    }

    /// The last inference request received.
    pub fn last_request(&self) -> Option<InferRequest> {
        lock(&self.shared.requests)
            .last()
            .map(|r| r.request.clone())
    }

    /// The inference requests received since the last call, in order; forgets them.
    pub fn take_requests(&self) -> Vec<InferRequest> {
        std::mem::take(&mut *lock(&self.shared.requests))
            .into_iter()
            .map(|r| r.request)
            .collect()
    }

    /// Repository loads received: model name and request.
    pub fn loads(&self) -> Vec<(String, LoadRequest)> {
        lock(&self.shared.loads).clone()
    }

    /// The repository loads received since the last call; forgets them.
    pub fn take_loads(&self) -> Vec<(String, LoadRequest)> {
        std::mem::take(&mut *lock(&self.shared.loads))
    }

    /// The repository unloads received since the last call (model name and
    /// `unload_dependents`); forgets them.
    pub fn take_unloads(&self) -> Vec<(String, bool)> {
        std::mem::take(&mut *lock(&self.shared.unloads))
    }

    /// Stream items produced so far, by every stream.
    pub fn produced(&self) -> usize {
        self.shared.produced.load(Ordering::SeqCst)
    }

    /// Requests whose future or stream was dropped before it finished.
    pub fn cancelled(&self) -> usize {
        self.shared.cancelled.load(Ordering::SeqCst)
    }

    /// What happens from now on; a second call replaces the first receiver.
    pub fn events(&self) -> mpsc::UnboundedReceiver<FakeEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        *lock(&self.shared.events) = Some(tx);
        rx
    }

    fn find(&self, name: &str) -> ServiceResult<&FakeModel> {
        match self.models.get(name) {
            Some(Some(model)) => Ok(model),
            Some(None) => Err(unknown(name)),
            None => self.fallback.as_ref().ok_or_else(|| unknown(name)),
        }
    }

    /// Records `request` and reports it; the guard reports a cancellation unless finished.
    fn receive(&self, request: &InferRequest) -> CancelGuard {
        lock(&self.shared.requests).push(Received {
            request: request.clone(),
            at: Instant::now(),
        });
        self.shared.event(FakeEvent::Received {
            model: request.model_name.clone(),
            id: request.id.clone(),
        });
        CancelGuard {
            shared: self.shared.clone(),
            model: request.model_name.clone(),
            id: request.id.clone(),
            finished: false,
        }
    }
}

/// Triton's answer for a model it does not know.
pub fn unknown(name: &str) -> ServiceError {
    ServiceError::not_found(format!("Request for unknown model: '{name}' is not found"))
}

/// Tensor metadata, for [`FakeModel::inputs`] and [`FakeModel::outputs`].
pub fn tensor(name: &str, datatype: &str, shape: Vec<i64>) -> TensorMetadata {
    TensorMetadata {
        name: name.into(),
        datatype: datatype.into(),
        shape,
    }
}

/// The stream of `steps` answering `request` with `model`; the guard is finished once the
/// last step has produced its item.
fn script_stream(
    model: FakeModel,
    request: InferRequest,
    steps: Vec<Step>,
    shared: Arc<Shared>,
    guard: CancelGuard,
) -> ResponseStream {
    struct State {
        model: FakeModel,
        request: InferRequest,
        steps: VecDeque<Step>,
        shared: Arc<Shared>,
        guard: CancelGuard,
        endless: i64,
    }
    let state = State {
        model,
        request,
        steps: steps.into(),
        shared,
        guard,
        endless: 0,
    };
    let stream = futures::stream::unfold(state, |mut s| async move {
        loop {
            let step = s.steps.front().cloned()?;
            let item = match step {
                Step::Gate => {
                    s.shared.gate.notified().await;
                    s.steps.pop_front();
                    continue;
                }
                Step::Pending => std::future::pending().await,
                Step::Respond { index, last } => {
                    s.steps.pop_front();
                    s.model.respond(&s.request).map(|mut response| {
                        if let Some(i) = index {
                            response
                                .parameters
                                .insert("index".into(), ParamValue::Int(i));
                        }
                        StreamedResponse {
                            response: Some(response),
                            last,
                        }
                    })
                }
                Step::EmptyFinal => {
                    s.steps.pop_front();
                    Ok(StreamedResponse {
                        response: None,
                        last: true,
                    })
                }
                Step::Fail(e) => {
                    s.steps.pop_front();
                    Err(e)
                }
                Step::Endless => {
                    let i = s.endless;
                    s.endless += 1;
                    s.model.respond(&s.request).map(|mut response| {
                        response
                            .parameters
                            .insert("index".into(), ParamValue::Int(i));
                        StreamedResponse {
                            response: Some(response),
                            last: false,
                        }
                    })
                }
            };
            if s.steps.is_empty() {
                s.guard.finished = true;
            }
            s.shared.produced.fetch_add(1, Ordering::SeqCst);
            s.shared.event(FakeEvent::Produced {
                id: s.request.id.clone(),
            });
            return Some((item, s));
        }
    });
    Box::pin(stream)
}

#[async_trait]
impl InferenceService for FakeService {
    async fn server_live(&self) -> bool {
        self.live.load(Ordering::SeqCst)
    }

    async fn server_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    fn server_metadata(&self) -> ServerMetadata {
        self.metadata.clone()
    }

    async fn model_ready(&self, name: &str, _: Option<i64>) -> ServiceResult<bool> {
        Ok(self.find(name)?.ready)
    }

    async fn model_metadata(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> ServiceResult<ModelMetadata> {
        let model = self.find(name)?;
        Ok(ModelMetadata {
            name: name.into(),
            versions: vec![version.unwrap_or(1).to_string()],
            platform: model.platform.clone(),
            inputs: model.inputs.clone(),
            outputs: model.outputs.clone(),
        })
    }

    async fn model_config(&self, name: &str, _: Option<i64>) -> ServiceResult<ModelConfig> {
        let mut config = self.find(name)?.config.clone();
        config.name = name.into();
        Ok(config)
    }

    async fn model_statistics(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> ServiceResult<Vec<ModelStatistics>> {
        let Some(inference_count) = self.statistics else {
            return Ok(Vec::new());
        };
        let names: Vec<String> = if name.is_empty() {
            self.index.iter().map(|e| e.name.clone()).collect()
        } else {
            self.find(name)?;
            vec![name.to_string()]
        };
        Ok(names
            .into_iter()
            .map(|name| ModelStatistics {
                name,
                version: version.unwrap_or(1).to_string(),
                inference_count,
                ..Default::default()
            })
            .collect())
    }

    async fn infer(&self, request: InferRequest) -> ServiceResult<InferResponse> {
        let mut guard = self.receive(&request);
        let model = self
            .find(&request.model_name)
            .inspect_err(|_| guard.finished = true)?;
        match model.answer {
            Answer::Hang => std::future::pending().await,
            Answer::Delay(delay) => tokio::time::sleep(delay).await,
            _ => {}
        }
        guard.finished = true;
        model.respond(&request)
    }

    async fn infer_stream(&self, request: InferRequest) -> ServiceResult<ResponseStream> {
        let mut guard = self.receive(&request);
        let model = match self.find(&request.model_name) {
            Ok(model) => model.clone(),
            Err(e) => {
                guard.finished = true;
                return Err(e);
            }
        };
        if let Answer::Fail(e) = &model.answer {
            guard.finished = true;
            return Err(e.clone());
        }
        let steps = match &model.stream {
            Some(script) => script(&request),
            // Like the trait's default: the answer of `infer`, its errors failing the call.
            None => {
                match model.answer {
                    Answer::Hang => std::future::pending().await,
                    Answer::Delay(delay) => tokio::time::sleep(delay).await,
                    _ => {}
                }
                if let Err(e) = model.check(&request) {
                    guard.finished = true;
                    return Err(e);
                }
                vec![Step::respond(true)]
            }
        };
        let shared = self.shared.clone();
        Ok(script_stream(model, request, steps, shared, guard))
    }

    async fn repository_index(&self, ready_only: bool) -> ServiceResult<Vec<ModelIndexEntry>> {
        Ok(self
            .index
            .iter()
            .filter(|e| !ready_only || e.state == "READY")
            .cloned()
            .collect())
    }

    async fn load_model(&self, name: &str, request: LoadRequest) -> ServiceResult<()> {
        lock(&self.shared.loads).push((name.into(), request));
        self.find(name).map(|_| ())
    }

    async fn unload_model(&self, name: &str, request: UnloadRequest) -> ServiceResult<()> {
        lock(&self.shared.unloads).push((name.into(), request.unload_dependents));
        Ok(())
    }
}
