//! A model version's instances, each on its own OS thread, fed from one bounded queue.
//!
//! ```text
//!  async caller ──try_send──► [bounded job queue] ──► instance thread 0 ─► BackendInstance::execute
//!        ▲                                        └─► instance thread 1 ─► ...
//!        └──────────────── oneshot reply (outputs + timings) ◄──────────┘
//! ```
//!
//! A full queue is an immediate `Overloaded` error, never a wait. A caller that goes away drops
//! its reply receiver; the instance sees the closed channel and skips the job. Dropping the pool
//! closes the queue: threads finish the jobs already queued and exit.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use nereid_proto::ServiceError;
use nereid_proto::types::Tensor;
use tokio::sync::oneshot;

use crate::backend::{Backend, BackendError, BackendInstance, InstanceContext};
use crate::request_check::ValidRequest;

/// What an instance sends back for one job.
#[derive(Debug)]
pub struct JobResult {
    pub outputs: Result<Vec<Tensor>, BackendError>,
    pub queue: Duration,
    pub compute_infer: Duration,
}

struct Job {
    request: ValidRequest,
    enqueued: Instant,
    reply: oneshot::Sender<JobResult>,
}

/// The running instances of one model version.
pub struct InstancePool {
    model: String,
    queue: Sender<Job>,
    capacity: usize,
    threads: Vec<JoinHandle<()>>,
}

impl InstancePool {
    /// Loads one backend instance per context (blocking: call from a blocking thread) and
    /// starts their threads. Fails with the first instance's load error.
    pub fn start(
        backend: &Arc<dyn Backend>,
        contexts: &[InstanceContext],
        queue_capacity: usize,
    ) -> Result<InstancePool, BackendError> {
        let mut instances = Vec::with_capacity(contexts.len());
        for ctx in contexts {
            instances.push((ctx.instance_name.clone(), backend.load_instance(ctx)?));
        }
        let (queue, jobs) = crossbeam_channel::bounded::<Job>(queue_capacity);
        let mut threads = Vec::with_capacity(instances.len());
        for (name, instance) in instances {
            let jobs = jobs.clone();
            let handle = std::thread::Builder::new()
                .name(format!("nereid-{name}"))
                .spawn(move || instance_loop(instance, jobs))
                .map_err(|e| BackendError::Load(format!("cannot start a thread for instance '{name}': {e}")))?;
            threads.push(handle);
        }
        let model = contexts.first().map(|c| c.model_name.clone()).unwrap_or_default();
        Ok(InstancePool { model, queue, capacity: queue_capacity, threads })
    }

    /// Queues a request and waits for its result. Dropping the returned future cancels the job
    /// if it has not started.
    pub async fn submit(&self, request: ValidRequest) -> Result<JobResult, ServiceError> {
        let (reply, result) = oneshot::channel();
        let job = Job { request, enqueued: Instant::now(), reply };
        match self.queue.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(ServiceError::Overloaded(format!(
                    "Exceeds maximum queue size: model '{}' already has {} requests waiting",
                    self.model, self.capacity
                )));
            }
            Err(TrySendError::Disconnected(_)) => {
                return Err(ServiceError::unavailable(format!("model '{}' is unloading", self.model)));
            }
        }
        result.await.map_err(|_| {
            ServiceError::internal(format!("model '{}': the instance stopped before answering", self.model))
        })
    }

    /// Number of instance threads.
    pub fn instance_count(&self) -> usize {
        self.threads.len()
    }
}

fn instance_loop(mut instance: Box<dyn BackendInstance>, jobs: Receiver<Job>) {
    while let Ok(job) = jobs.recv() {
        if job.reply.is_closed() {
            continue; // the caller went away: cancelled before execution
        }
        let queue = job.enqueued.elapsed();
        let started = Instant::now();
        let outputs = instance.execute(&job.request.inputs, &job.request.outputs);
        let result = JobResult { outputs, queue, compute_infer: started.elapsed() };
        let _ = job.reply.send(result);
    }
}
