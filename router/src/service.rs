//! [`RouterService`]: the [`InferenceService`] of cluster mode. The HTTP and gRPC frontends of
//! `nereid_proto` call it exactly as they call a worker's data plane; the pass-through paths
//! (`passthrough`, `http_passthrough`) call its one inference path with bytes.
//!
//! ```text
//! infer (typed), ModelInfer bytes, HTTP infer bytes
//!   ─► route (service::route): admission, trace, with_retry (service::retry: choice, scale
//!      from zero, retry once, hedging, ejection), send the payload in its own form
//! infer_stream ─► the same choice ─► the worker's ModelStreamInfer (one request per stream),
//!      asking for the worker's load report, which choice then weighs (crate::load)
//! metadata, config, statistics ─► a ready replica of the model (same retry)
//! live, ready, model ready, repository index ─► the routing table
//! no ready replica of a min_replicas-0 model ─► activate::Activator (scale from zero), wait
//! repository load / unload ─► activate::Activator ─► the management API
//! ```
//!
//! A sampled request is traced: a server span `InferRequest` (child of the client's
//! `traceparent`) and a client span `forward` per attempt, whose id travels to the worker as
//! its `traceparent`, so the worker's spans nest under the attempt that reached it.
//!
//! Statistics name one model and come from one of its replicas; cluster-wide statistics are
//! not served yet. Without an [`Activator`] (tests with fake workers) scale from zero and
//! repository load/unload are refused as unsupported.

use std::collections::HashMap;
use std::collections::HashSet;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::StreamExt;
use nereid_proto::pb::inference::{
    ModelConfig, ModelConfigRequest, ModelMetadataRequest, ModelStatistics, ModelStatisticsRequest,
};
use nereid_proto::{
    InferRequest, InferResponse, InferenceService, LoadRequest, LogSettings, ModelIndexEntry,
    ModelLoadReport, ModelMetadata, ResponseStream, ServerMetadata, ServiceError, ServiceResult,
    TensorMetadata, TraceSettings, TraceSettingsUpdate, UnloadRequest,
};
use nereid_telemetry::Tracer;
use nereid_telemetry::logging::LogControl;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::activate::Activator;
use crate::choice::{Ask, Chooser};
use crate::error::{RouterError, RouterResult};
use crate::forward::{ForwardConfig, Workers};
use crate::http_forward::HttpWorkers;
use crate::load::{DEFAULT_REPORT_TTL, LoadBook};
use crate::metrics::{Classify, ModelCounters, Outcome, RouterMetrics};
use crate::random::{RandomSource, SplitMix64};
use crate::table::{Endpoint, SharedTable};
use crate::wire::encode_request;
use nereid_proto::codec::version_text;

mod retry;
mod route;

pub use retry::HedgeConfig;
pub(crate) use route::{Answer, Payload};

/// Server extensions the router serves.
pub const EXTENSIONS: &[&str] = &[
    "model_repository",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
];

/// Settings of the router's service.
#[derive(Clone, Debug)]
pub struct RouterServiceConfig {
    /// Server name reported in server metadata.
    pub server_name: String,
    /// Requests in flight through this router; beyond it requests get an overload error.
    pub max_in_flight: usize,
    /// How long a sequence keeps its replica without a request.
    pub sequence_idle_timeout: Duration,
    /// How long new requests avoid a replica that could not be reached (passive outlier
    /// ejection), until the control plane's view catches up.
    pub ejection: Duration,
    /// How long a request for a model scaled to zero (or a repository load) waits for a
    /// replica to become ready; a request's own deadline can shorten it.
    pub scale_from_zero_wait: Duration,
    /// When a unary request that is safe to repeat is sent again to another replica while
    /// the first attempt goes on (a hedge): when its replica leaves the routing table's ready
    /// set (its node was marked down), or when the attempt has taken longer than this bound.
    pub hedge: HedgeConfig,
    /// How long a worker's load report (asked for on every stream the router opens) counts in
    /// replica choice; after it the router weighs its own counts alone until the next report
    /// (see `crate::load`).
    pub load_report_ttl: Duration,
    /// How the router connects to workers (timeouts, message size, cluster TLS).
    pub forward: ForwardConfig,
}

impl Default for RouterServiceConfig {
    fn default() -> Self {
        RouterServiceConfig {
            server_name: "nereid".into(),
            max_in_flight: 4096,
            sequence_idle_timeout: Duration::from_secs(60),
            ejection: Duration::from_secs(5),
            scale_from_zero_wait: Duration::from_secs(60),
            hedge: HedgeConfig::default(),
            load_report_ttl: DEFAULT_REPORT_TTL,
            forward: ForwardConfig::default(),
        }
    }
}

/// Replica choice and the load it weighs (outstanding requests, workers' reports), under one
/// short lock.
struct Routing {
    chooser: Chooser,
    outstanding: HashMap<u64, usize>,
    load: LoadBook,
}

/// Counts one request against its replica until dropped.
pub(crate) struct InFlight {
    routing: Arc<Mutex<Routing>>,
    replica: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut r = self.routing.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = r.outstanding.get_mut(&self.replica) {
            *n -= 1;
            if *n == 0 {
                r.outstanding.remove(&self.replica);
            }
        }
    }
}

/// What replica choice needs to know of an inference request.
fn ask_of(request: &InferRequest) -> Ask<'_> {
    Ask::of(&request.model_name, request.model_version, &request.options)
}

/// Routes every call to a worker replica chosen from the shared routing table.
pub struct RouterService {
    pub(crate) config: RouterServiceConfig,
    table: Arc<SharedTable>,
    pub(crate) workers: Arc<Workers>,
    /// The HTTP pass-through's client to the workers' HTTP ports.
    pub(crate) http_workers: HttpWorkers,
    routing: Arc<Mutex<Routing>>,
    pub(crate) admission: Arc<Semaphore>,
    activator: Option<Arc<Activator>>,
    pub(crate) tracer: Tracer,
    logs: Arc<LogControl>,
    metrics: RouterMetrics,
}

impl RouterService {
    /// A service routing by `table` (which the control-plane watch keeps current), with its
    /// random replica choice seeded from the clock.
    pub fn new(config: RouterServiceConfig, table: Arc<SharedTable>) -> RouterService {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5eed);
        Self::with_random(config, table, Box::new(SplitMix64::new(seed)))
    }

    /// [`RouterService::new`] with an injected random source (deterministic tests).
    pub fn with_random(
        config: RouterServiceConfig,
        table: Arc<SharedTable>,
        rng: Box<dyn RandomSource>,
    ) -> RouterService {
        let workers = Arc::new(Workers::new(config.forward.clone()));
        RouterService {
            workers: workers.clone(),
            http_workers: HttpWorkers::new(&config.forward, workers),
            routing: Arc::new(Mutex::new(Routing {
                chooser: Chooser::new(config.sequence_idle_timeout, rng),
                outstanding: HashMap::new(),
                load: LoadBook::new(config.load_report_ttl),
            })),
            admission: Arc::new(Semaphore::new(config.max_in_flight)),
            activator: None,
            tracer: Tracer::disabled(),
            logs: nereid_telemetry::logging::control(),
            metrics: RouterMetrics::default(),
            config,
            table,
        }
    }

    /// Traces requests with `tracer` and serves the logging API with `logs`.
    pub fn with_telemetry(mut self, tracer: Tracer, logs: Arc<LogControl>) -> RouterService {
        self.tracer = tracer;
        self.logs = logs;
        self
    }

    /// Scale from zero and repository load/unload through the control plane.
    pub fn with_activator(mut self, activator: Arc<Activator>) -> RouterService {
        self.activator = Some(activator);
        self
    }

    /// The activator, when `model` is one that requests may start (`min_replicas` 0,
    /// `max_replicas` above 0).
    fn activator_for(&self, model: &str) -> Option<&Arc<Activator>> {
        let activator = self.activator.as_ref()?;
        let table = self.table.load();
        let m = table.model(model)?;
        (m.min_replicas == 0 && m.max_replicas > 0).then_some(activator)
    }

    /// [`Self::pick`]; a model scaled to zero is activated and waited for first (bounded by
    /// `deadline`), and one that runs because of activations has them renewed.
    async fn pick_or_activate(
        &self,
        ask: &Ask<'_>,
        deadline: Option<Instant>,
    ) -> RouterResult<(Endpoint, InFlight)> {
        let activator = self.activator_for(ask.model);
        let first = self.pick(ask, &HashSet::new());
        let picked = match (&first, activator) {
            (Err(RouterError::NoReadyReplica { .. }), Some(activator))
                if ask.sequence.is_none() || ask.start =>
            {
                self.counters(ask.model)
                    .scale_from_zero
                    .fetch_add(1, Ordering::Relaxed);
                // Boxed: the rare path's large future stays out of every request's.
                Box::pin(activator.scale_from_zero(ask.model, deadline)).await?;
                self.pick(ask, &HashSet::new())
            }
            _ => first,
        };
        if picked.is_ok()
            && let Some(activator) = activator
        {
            activator.keep_alive(ask.model);
        }
        picked
    }

    /// The worker connection pool (the watch task prunes it).
    pub fn workers(&self) -> Arc<Workers> {
        self.workers.clone()
    }

    /// Requests in flight through this router.
    pub fn in_flight(&self) -> usize {
        self.config.max_in_flight - self.admission.available_permits()
    }

    /// The router's counters (`/metrics`).
    pub fn metrics(&self) -> &RouterMetrics {
        &self.metrics
    }

    /// Outstanding requests per replica id, as replica choice weighs them now.
    pub fn outstanding(&self) -> HashMap<u64, usize> {
        let r = self.routing.lock().unwrap_or_else(|p| p.into_inner());
        r.outstanding.clone()
    }

    /// Runs one inference of `model` under the admission limit (else `Overloaded`, without
    /// running it) and counts its outcome and time, whichever path (typed or pass-through)
    /// forwards it.
    pub(crate) async fn admitted<T: Classify>(
        &self,
        model: &str,
        inference: impl Future<Output = RouterResult<T>>,
    ) -> RouterResult<T> {
        self.counted(model, async {
            match self.admission.try_acquire() {
                Ok(_permit) => inference.await,
                Err(_) => Err(RouterError::Overloaded {
                    limit: self.config.max_in_flight,
                }),
            }
        })
        .await
    }

    /// Runs `request` for `model` and counts its outcome and time in the model's counters.
    pub(crate) async fn counted<T: Classify, E>(
        &self,
        model: &str,
        request: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let started = Instant::now();
        let counters = self.counters(model);
        let result = request.await;
        counters.finish_result(started.elapsed(), &result);
        result
    }

    pub(crate) fn counters(&self, model: &str) -> Arc<ModelCounters> {
        self.metrics
            .model(model, || self.table.load().model(model).is_some())
    }

    fn pick(&self, ask: &Ask<'_>, exclude: &HashSet<u64>) -> RouterResult<(Endpoint, InFlight)> {
        let table = self.table.load();
        let mut guard = self.routing.lock().unwrap_or_else(|p| p.into_inner());
        let Routing {
            chooser,
            outstanding,
            load,
        } = &mut *guard;
        let now = Instant::now();
        let endpoint = chooser.choose(
            &table,
            ask,
            |id| load.estimate(id, outstanding.get(&id).copied().unwrap_or(0), now),
            exclude,
            now,
        )?;
        *outstanding.entry(endpoint.replica).or_default() += 1;
        let replica = endpoint.replica;
        Ok((
            endpoint,
            InFlight {
                routing: self.routing.clone(),
                replica,
            },
        ))
    }

    /// Opens a stream (see `infer_stream`).
    async fn open_stream(&self, request: InferRequest) -> ServiceResult<ResponseStream> {
        let wire = encode_request(&request).map_err(ServiceError::from)?;
        let ask = ask_of(&request);
        let deadline = wire.context.deadline;
        let model: &str = &request.model_name;
        let (stream, permit) = self
            .open_admitted(&ask, deadline, |target, guard| {
                let mut wire = wire.clone();
                wire.message.model_version = target.version.to_string();
                async move {
                    let (responses, load) = self.workers.infer_stream(&target.addr, wire).await?;
                    if let Some(load) = load {
                        self.note_load(model, &target, load);
                    }
                    Ok(responses.map(move |item| {
                        let _held = &guard;
                        item.map_err(ServiceError::from)
                    }))
                }
            })
            .await?;
        let stream = stream.map(move |item| {
            let _held = &permit;
            item
        });
        Ok(Box::pin(stream))
    }

    /// Opens a worker stream for `ask` under the admission limit (else `Overloaded`): replica
    /// choice, scale from zero, and a retry while a stream outside a sequence cannot be opened
    /// (`with_retry_guarded`). `open` gets the replica and its in-flight guard, which its
    /// stream holds as long as it lasts; so must the permit returned with it.
    pub(crate) async fn open_admitted<T, F, Fut>(
        &self,
        ask: &Ask<'_>,
        deadline: Option<Instant>,
        open: F,
    ) -> RouterResult<(T, OwnedSemaphorePermit)>
    where
        F: Fn(Endpoint, InFlight) -> Fut,
        Fut: Future<Output = RouterResult<T>>,
    {
        let permit =
            self.admission
                .clone()
                .try_acquire_owned()
                .map_err(|_| RouterError::Overloaded {
                    limit: self.config.max_in_flight,
                })?;
        let retry = ask.sequence.is_none();
        let opened = self.with_retry_guarded(ask, retry, deadline, open).await?;
        Ok((opened, permit))
    }

    /// Notes `load`, reported by `target`'s worker as a stream this router counts against it
    /// opened.
    pub(crate) fn note_load(&self, model: &str, target: &Endpoint, load: ModelLoadReport) {
        let mut r = self.routing.lock().unwrap_or_else(|p| p.into_inner());
        let own = r.outstanding.get(&target.replica).copied().unwrap_or(0);
        r.load.report(
            model,
            target.replica,
            load,
            own.saturating_sub(1),
            Instant::now(),
        );
    }

    fn ask<'a>(model: &'a str, version: Option<i64>) -> Ask<'a> {
        Ask {
            model,
            version,
            ..Default::default()
        }
    }
}

fn tensor_metadata(
    t: nereid_proto::pb::inference::model_metadata_response::TensorMetadata,
) -> TensorMetadata {
    TensorMetadata {
        name: t.name,
        datatype: t.datatype,
        shape: t.shape,
    }
}

#[async_trait]
impl InferenceService for RouterService {
    async fn server_live(&self) -> bool {
        true
    }

    /// Ready once the routing table holds the control plane's state.
    async fn server_ready(&self) -> bool {
        self.table.load().synced()
    }

    fn server_metadata(&self) -> ServerMetadata {
        ServerMetadata {
            name: self.config.server_name.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            extensions: EXTENSIONS.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// An unknown model or version is not ready (no error), as on a worker and in Triton:
    /// gRPC `ready: false`, HTTP 400 "Model version not ready". Before the first snapshot the
    /// table cannot tell, which is the 503 of `missing_model`.
    async fn model_ready(&self, name: &str, version: Option<i64>) -> ServiceResult<bool> {
        let table = self.table.load();
        if !table.synced() {
            return Err(table.missing_model(name).into());
        }
        if table.model(name).is_none() {
            return Ok(false);
        }
        Ok(match version {
            Some(v) => table.has_version(name, v) && !table.ready(name, v).is_empty(),
            None => !table.ready_versions(name).is_empty(),
        })
    }

    async fn model_metadata(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> ServiceResult<ModelMetadata> {
        let request = ModelMetadataRequest {
            name: name.to_string(),
            version: version_text(version),
        };
        let m = self
            .with_retry(&Self::ask(name, version), true, None, |target| {
                let mut request = request.clone();
                request.version = target.version.to_string();
                async move { self.workers.model_metadata(&target.addr, request).await }
            })
            .await?;
        Ok(ModelMetadata {
            name: m.name,
            versions: m.versions,
            platform: m.platform,
            inputs: m.inputs.into_iter().map(tensor_metadata).collect(),
            outputs: m.outputs.into_iter().map(tensor_metadata).collect(),
        })
    }

    async fn model_config(&self, name: &str, version: Option<i64>) -> ServiceResult<ModelConfig> {
        let request = ModelConfigRequest {
            name: name.to_string(),
            version: version_text(version),
        };
        Ok(self
            .with_retry(&Self::ask(name, version), true, None, |target| {
                let mut request = request.clone();
                request.version = target.version.to_string();
                async move { self.workers.model_config(&target.addr, request).await }
            })
            .await?)
    }

    async fn model_statistics(
        &self,
        name: &str,
        version: Option<i64>,
    ) -> ServiceResult<Vec<ModelStatistics>> {
        if name.is_empty() {
            return Err(RouterError::Unsupported(
                "the router serves statistics of one model at a time (from one of its replicas); name the model".into(),
            )
            .into());
        }
        let request = ModelStatisticsRequest {
            name: name.to_string(),
            version: version_text(version),
        };
        Ok(self
            .with_retry(&Self::ask(name, version), true, None, |target| {
                let request = request.clone();
                async move { self.workers.model_statistics(&target.addr, request).await }
            })
            .await?)
    }

    async fn trace_settings(
        &self,
        model: Option<&str>,
        update: Option<TraceSettingsUpdate>,
    ) -> ServiceResult<TraceSettings> {
        if let Some(name) = model
            && self.table.load().model(name).is_none()
        {
            return Err(ServiceError::not_found(format!(
                "Request for unknown model: '{name}' is not found"
            )));
        }
        self.tracer.settings().apply(model, update)
    }

    /// The last fresh load report a worker gave for `name` (the worker this router last opened
    /// a stream to for it), so the router's ORCA header passes a worker's figures through.
    async fn model_load(&self, name: &str) -> Option<ModelLoadReport> {
        let r = self.routing.lock().unwrap_or_else(|p| p.into_inner());
        r.load.latest(name, Instant::now())
    }

    async fn log_settings(&self, update: Option<LogSettings>) -> ServiceResult<LogSettings> {
        self.logs.apply(update)
    }

    async fn infer(&self, request: InferRequest) -> ServiceResult<InferResponse> {
        let wire = encode_request(&request)?;
        let answer = self
            .route(
                ask_of(&request),
                wire.context,
                Payload::Typed(&wire.message),
            )
            .await?;
        match answer {
            Answer::Typed(response) => Ok(response),
            _ => unreachable!("a typed payload is answered in kind"),
        }
    }

    /// Forwards over the worker's `ModelStreamInfer`, so decoupled models stream through the
    /// router. Retried like `infer` only when the stream cannot be opened.
    async fn infer_stream(&self, request: InferRequest) -> ServiceResult<ResponseStream> {
        let model = request.model_name.clone();
        self.counted(&model, self.open_stream(request)).await
    }

    async fn repository_index(&self, ready_only: bool) -> ServiceResult<Vec<ModelIndexEntry>> {
        let table = self.table.load();
        let mut entries = Vec::new();
        for model in table.models() {
            let mut versions = model.available_versions.clone();
            versions.extend(table.ready_versions(&model.name));
            versions.sort_unstable();
            versions.dedup();
            if versions.is_empty() && !ready_only {
                entries.push(ModelIndexEntry {
                    name: model.name.clone(),
                    version: String::new(),
                    state: String::new(),
                    reason: String::new(),
                });
            }
            for v in versions {
                let ready = !table.ready(&model.name, v).is_empty();
                if ready_only && !ready {
                    continue;
                }
                entries.push(ModelIndexEntry {
                    name: model.name.clone(),
                    version: v.to_string(),
                    state: if ready { "READY" } else { "UNAVAILABLE" }.to_string(),
                    reason: if ready {
                        String::new()
                    } else {
                        "no ready replica in the cluster".to_string()
                    },
                });
            }
        }
        Ok(entries)
    }

    /// Maps to the management API: the model serves at least one replica; returns once one is
    /// ready.
    async fn load_model(&self, name: &str, request: LoadRequest) -> ServiceResult<()> {
        match &self.activator {
            Some(a) => Ok(a.load(name, request).await?),
            None => Err(RouterError::Unsupported(format!(
                "cannot load model '{name}': this router has no control plane to ask"
            ))
            .into()),
        }
    }

    /// Maps to the management API: the model keeps no replica until loaded again. Dependents
    /// are not unloaded (each model is scaled on its own).
    async fn unload_model(&self, name: &str, request: UnloadRequest) -> ServiceResult<()> {
        match &self.activator {
            Some(a) => Ok(a.unload(name, request).await?),
            None => Err(RouterError::Unsupported(format!(
                "cannot unload model '{name}': this router has no control plane to ask"
            ))
            .into()),
        }
    }
}

impl Classify for ResponseStream {
    /// An opened stream; its later errors reach the client in the stream.
    fn outcome(&self) -> Outcome {
        Outcome::Success
    }
}
