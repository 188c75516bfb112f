//! The scheduler of one model version: a queue, a scheduling thread and the instance threads.
//!
//! ```text
//! submit() ──bounded channel──► scheduler thread: owns RequestQueue
//!                                  expire timeouts, drop cancelled, form_batch (pure)
//!                                  ──Batch──► idle instance thread ─► concat ─► execute ─► split
//!                                  ◄──"free"──┘                                    │
//! caller ◄────────────────── oneshot reply per request ◄──────────────────────────┘
//! ```
//!
//! Batches form only when an instance is free, so under load they grow by themselves; the
//! queue delay is spent only while some instance is idle. A full queue or an expired timeout
//! is answered at once (`Overloaded`: HTTP 503 / gRPC UNAVAILABLE). A caller that goes away
//! drops its reply receiver; the request is skipped before it is batched. When the last handle
//! is dropped the scheduler thread stops and the instance threads finish and exit.

mod batch;
pub mod policy;
pub mod queue;

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use nereid_proto::ServiceError;
use nereid_proto::types::Tensor;
use tokio::sync::oneshot;

use self::policy::BatchPolicy;
use self::queue::{Decision, Pending, RequestQueue, ShapeKey};
use crate::backend::{BackendError, BackendInstance};
use crate::request_check::ValidRequest;
use crate::stats::VersionStats;

/// What a request gets back from its execution.
#[derive(Debug)]
pub struct JobResult {
    pub outputs: Result<Vec<Tensor>, BackendError>,
    pub timings: ExecTimings,
}

/// Where a request spent its time between submission and answer.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExecTimings {
    pub queue: Duration,
    pub compute_input: Duration,
    pub compute_infer: Duration,
    pub compute_output: Duration,
}

type Reply = oneshot::Sender<Result<JobResult, ServiceError>>;

struct Job {
    request: ValidRequest,
    reply: Reply,
}

type Batch = Vec<Pending<Job>>;

/// Handle to a model version's scheduler. Cheap to share behind the version's `Arc`.
pub struct Scheduler {
    model: String,
    submit: Sender<(Job, Instant)>,
    threads: Vec<JoinHandle<()>>,
}

impl Scheduler {
    /// Starts the scheduling thread and one thread per instance. `channel_capacity` bounds
    /// requests in flight between callers and the scheduling thread.
    pub fn start(
        model: &str,
        policy: BatchPolicy,
        instances: Vec<(String, Box<dyn BackendInstance>)>,
        stats: Arc<VersionStats>,
        channel_capacity: usize,
    ) -> Result<Scheduler, BackendError> {
        let spawn_err = |e: std::io::Error| BackendError::Load(format!("model '{model}': cannot start a thread: {e}"));
        let (submit, requests) = crossbeam_channel::bounded(channel_capacity.max(1));
        let (free_tx, free_rx) = crossbeam_channel::unbounded::<usize>();
        let mut workers = Vec::with_capacity(instances.len());
        let mut threads = Vec::with_capacity(instances.len() + 1);
        for (index, (name, instance)) in instances.into_iter().enumerate() {
            let (tx, rx) = crossbeam_channel::bounded::<Batch>(1);
            let free = free_tx.clone();
            let stats = stats.clone();
            let handle = std::thread::Builder::new()
                .name(format!("nereid-{name}"))
                .spawn(move || instance_loop(index, instance, rx, free, stats))
                .map_err(spawn_err)?;
            workers.push(tx);
            threads.push(handle);
        }
        let name = model.to_string();
        let handle = std::thread::Builder::new()
            .name(format!("nereid-sched-{model}"))
            .spawn(move || scheduler_loop(&name, policy, requests, workers, free_rx))
            .map_err(spawn_err)?;
        threads.push(handle);
        Ok(Scheduler { model: model.to_string(), submit, threads })
    }

    /// Queues a request and waits for its result. Dropping the future cancels the request if
    /// it has not been batched yet.
    pub async fn submit(&self, request: ValidRequest) -> Result<JobResult, ServiceError> {
        let (reply, result) = oneshot::channel();
        match self.submit.try_send((Job { request, reply }, Instant::now())) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(ServiceError::Overloaded(format!(
                    "Exceeds maximum queue size: model '{}' has too many requests in flight",
                    self.model
                )));
            }
            Err(TrySendError::Disconnected(_)) => {
                return Err(ServiceError::unavailable(format!("model '{}' is unloading", self.model)));
            }
        }
        result.await.map_err(|_| {
            ServiceError::internal(format!("model '{}': the scheduler stopped before answering", self.model))
        })?
    }

    /// Number of instance threads.
    pub fn instance_count(&self) -> usize {
        self.threads.len().saturating_sub(1)
    }
}

fn shape_key(inputs: &[Tensor], batching: bool) -> ShapeKey {
    inputs
        .iter()
        .map(|t| {
            let dims = if batching { t.shape().get(1..).unwrap_or(&[]) } else { t.shape() };
            (t.name().to_string(), t.datatype().as_wire(), dims.to_vec())
        })
        .collect()
}

fn scheduler_loop(
    model: &str,
    policy: BatchPolicy,
    requests: Receiver<(Job, Instant)>,
    workers: Vec<Sender<Batch>>,
    free: Receiver<usize>,
) {
    let mut queue: RequestQueue<Job> = RequestQueue::new(&policy);
    let mut idle: Vec<usize> = (0..workers.len()).rev().collect();
    let batching = policy.max_batch_size > 0;
    let mut open = true;
    while open || !queue.is_empty() {
        let now = Instant::now();
        queue.retain(|job| !job.reply.is_closed());
        for expired in queue.expire(now) {
            let _ = expired.payload.reply.send(Err(ServiceError::Overloaded(format!(
                "Request timeout expired: model '{model}' did not start the request within its queue timeout"
            ))));
        }
        let mut wake: Option<Instant> = queue.next_deadline();
        while let Some(&worker) = idle.last() {
            match queue.form_batch(now, &policy) {
                Decision::Dispatch(batch) => {
                    idle.pop();
                    if let Err(e) = workers[worker].send(batch) {
                        for p in e.into_inner() {
                            let _ = p.payload.reply.send(Err(ServiceError::internal(format!(
                                "model '{model}': an instance stopped unexpectedly"
                            ))));
                        }
                    }
                }
                Decision::WaitUntil(t) => {
                    wake = Some(wake.map_or(t, |w| w.min(t)));
                    break;
                }
                Decision::Empty => break,
            }
        }
        if !open && idle.len() == workers.len() && queue.is_empty() {
            break;
        }
        let timeout = wake.map_or(Duration::from_secs(3600), |w| w.saturating_duration_since(Instant::now()));
        crossbeam_channel::select! {
            recv(requests) -> msg => match msg {
                Ok((job, arrived)) => enqueue(model, &policy, &mut queue, job, arrived, batching),
                Err(_) => open = false,
            },
            recv(free) -> msg => {
                if let Ok(worker) = msg {
                    idle.push(worker);
                }
            },
            default(timeout) => {}
        }
    }
}

fn enqueue(model: &str, policy: &BatchPolicy, queue: &mut RequestQueue<Job>, job: Job, arrived: Instant, batching: bool) {
    let level = policy.level_index(job.request.priority);
    let queue_policy = &policy.queue_policies[level.min(policy.queue_policies.len() - 1)];
    let pending = Pending {
        batch_size: job.request.batch_size,
        shape: shape_key(&job.request.inputs, batching),
        arrived,
        deadline: queue_policy.timeout_for(job.request.timeout_us).map(|t| arrived + t),
        timeout_action: queue_policy.timeout_action,
        payload: job,
    };
    if let Err(rejected) = queue.push(level, pending) {
        let _ = rejected.payload.reply.send(Err(ServiceError::Overloaded(format!(
            "Exceeds maximum queue size: model '{model}' priority level {} already holds {} requests",
            level + 1,
            queue_policy.max_queue_size
        ))));
    }
}

fn instance_loop(
    index: usize,
    mut instance: Box<dyn BackendInstance>,
    batches: Receiver<Batch>,
    free: Sender<usize>,
    stats: Arc<VersionStats>,
) {
    while let Ok(batch) = batches.recv() {
        run_batch(instance.as_mut(), batch, &stats);
        if free.send(index).is_err() {
            break;
        }
    }
}

fn run_batch(instance: &mut dyn BackendInstance, batch: Batch, stats: &VersionStats) {
    let started = Instant::now();
    // Requests whose callers left while the batch was formed are dropped here.
    let batch: Vec<Pending<Job>> = batch.into_iter().filter(|p| !p.payload.reply.is_closed()).collect();
    if batch.is_empty() {
        return;
    }
    let sizes: Vec<usize> = batch.iter().map(|p| p.batch_size).collect();
    let mut names: Vec<String> = Vec::new();
    for p in &batch {
        for o in &p.payload.request.outputs {
            if !names.contains(o) {
                names.push(o.clone());
            }
        }
    }
    let inputs: Vec<&[Tensor]> = batch.iter().map(|p| p.payload.request.inputs.as_slice()).collect();
    let result = batch::concat_inputs(&inputs).and_then(|joined| {
        let input_done = Instant::now();
        let outputs = instance.execute(&joined, &names)?;
        Ok((input_done, Instant::now(), outputs))
    });
    let (input_done, infer_done, split) = match result {
        Ok((input_done, infer_done, outputs)) => {
            let split: Result<Vec<Vec<Tensor>>, BackendError> =
                outputs.iter().map(|o| batch::split_output(o, &sizes)).collect();
            (input_done, infer_done, split)
        }
        Err(e) => {
            let now = Instant::now();
            (now, now, Err(e))
        }
    };
    let done = Instant::now();
    let timings = |arrived: Instant| ExecTimings {
        queue: started.saturating_duration_since(arrived),
        compute_input: input_done - started,
        compute_infer: infer_done - input_done,
        compute_output: done - infer_done,
    };
    if split.is_ok() {
        stats.record_execution(sizes.iter().sum(), input_done - started, infer_done - input_done, done - infer_done);
    }
    for (i, p) in batch.into_iter().enumerate() {
        let outputs = match &split {
            Ok(per_output) => Ok(p
                .payload
                .request
                .outputs
                .iter()
                .filter_map(|want| names.iter().position(|n| n == want).map(|k| per_output[k][i].clone()))
                .collect()),
            Err(e) => Err(e.clone()),
        };
        let _ = p.payload.reply.send(Ok(JobResult { outputs, timings: timings(p.arrived) }));
    }
}
