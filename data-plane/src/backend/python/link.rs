//! [`Link`]: the parent's side of one stub connection, shared by the instance thread, the
//! reader thread and BLS tasks.
//!
//! ```text
//!  instance thread ──send(execute)──┐                 ┌── reader thread: replies, responses,
//!  BLS tasks ──send(bls_response)───┼─► Link ─► socket│   releases, logs, BLS requests
//!                                   │   parent segments (write, released by the stub)
//!                                   │   stub segments   (read, released right after copying)
//!                                   │   open streams    (decoupled requests: key → target)
//!                                   └── state           (dead reason, closing, death hook)
//! ```
//!
//! Every field is behind its own short-held lock; no lock is held across a wait.

use std::collections::HashMap;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use bytes::Bytes;
use nereid_proto::Tensor;
use parking_lot::{Condvar, Mutex};

use super::convert;
use super::shm::{Packer, ParentSegments, ShmError, StubSegments};
use crate::backend::{BackendError, ModelResponse, ResponseSink, ServerHandle, StreamEvent};
use crate::custom_metrics::Owner;
use nereid_stub_protocol::frame::{self, FrameError};
use nereid_stub_protocol::message::{TensorRef, ToStub};

/// Called once when a running stub dies (not when it is shut down on purpose).
pub type DeathHook = Box<dyn FnOnce(&str) + Send>;

/// Where a decoupled request's responses go.
pub enum StreamTarget {
    /// The client's stream.
    Sink(ResponseSink),
    /// The instance thread, for a request that has no stream (one response expected).
    Collect(crossbeam_channel::Sender<(u64, StreamEvent)>),
}

/// A decoupled request that has not seen its final response.
pub struct OpenStream {
    pub target: StreamTarget,
    /// The outputs the request asked for, in order.
    pub outputs: Vec<String>,
    /// `cancel` was sent (the client went away).
    pub cancelled: bool,
    /// Its request was rescheduled and waits in the scheduler to run again: kept for the
    /// responses its last run sent that are still on their way, replaced when it runs again.
    pub parked: bool,
}

#[derive(Default)]
struct LinkState {
    dead: Option<String>,
    closing: bool,
    on_death: Option<DeathHook>,
}

/// One stub connection.
pub struct Link {
    /// The model name, for messages.
    pub model: String,
    /// The instance name, for logs and health.
    pub instance: String,
    pub server: Arc<ServerHandle>,
    writer: Mutex<UnixStream>,
    parent_segments: Mutex<ParentSegments>,
    stub_segments: Mutex<StubSegments>,
    streams: Mutex<HashMap<u64, OpenStream>>,
    /// `response` messages delivered so far, and its waiters ([`Self::wait_delivered`]).
    delivered: Mutex<u64>,
    delivered_changed: Condvar,
    /// Encoded `release` frames for stub segments, written ahead of the next frame (see
    /// [`Self::take_bytes_deferred`]).
    deferred_releases: Mutex<Vec<u8>>,
    state: Mutex<LinkState>,
    /// The custom metric families and metrics the stub holds (`pb_utils.MetricFamily`).
    pub custom_metrics: Owner,
    /// The stub's decoupled BLS calls in flight, which `ResponseIterator.cancel()` can stop.
    pub bls_cancels: super::bls::BlsCancels,
}

impl Link {
    pub fn new(
        model: String,
        instance: String,
        server: Arc<ServerHandle>,
        writer: UnixStream,
        shm_prefix: &str,
    ) -> Self {
        let custom_metrics = Owner::new(server.custom_metrics().clone());
        Link {
            model,
            instance,
            server,
            writer: Mutex::new(writer),
            parent_segments: Mutex::new(ParentSegments::new(shm_prefix)),
            stub_segments: Mutex::new(StubSegments::new(shm_prefix)),
            streams: Mutex::new(HashMap::new()),
            delivered: Mutex::new(0),
            delivered_changed: Condvar::new(),
            deferred_releases: Mutex::new(Vec::new()),
            state: Mutex::new(LinkState::default()),
            custom_metrics,
            bls_cancels: Default::default(),
        }
    }

    /// Sends one message.
    pub fn send(&self, message: &ToStub) -> Result<(), FrameError> {
        self.write(&frame::encode(message)?)
    }

    /// Writes one encoded frame, after any deferred releases (in the same write); frames from
    /// several threads never interleave.
    fn write(&self, frame: &[u8]) -> Result<(), FrameError> {
        let mut writer = self.writer.lock();
        let deferred = std::mem::take(&mut *self.deferred_releases.lock());
        if deferred.is_empty() {
            std::io::Write::write_all(&mut *writer, frame)?;
        } else {
            let mut both = deferred;
            both.extend_from_slice(frame);
            std::io::Write::write_all(&mut *writer, &both)?;
        }
        Ok(())
    }

    /// Writes `packed` into a parent segment (none when it holds no tensor), then sends the
    /// message `build` makes with that segment's id. The segment is the stub's until released.
    pub fn send_with_tensors(
        &self,
        packed: &Packer<'_>,
        build: impl FnOnce(Option<String>) -> ToStub,
    ) -> Result<(), SendError> {
        if packed.is_empty() {
            return Ok(self.send(&build(None))?);
        }
        let segment = self.parent_segments.lock().checkout(packed.len())?;
        if let Err(e) = segment.write(packed) {
            self.parent_segments.lock().put_back(segment);
            return Err(e.into());
        }
        let bytes = match frame::encode(&build(Some(segment.id().to_string()))) {
            Ok(bytes) => bytes,
            Err(e) => {
                self.parent_segments.lock().put_back(segment);
                return Err(e.into());
            }
        };
        // In use before the stub can possibly release it.
        self.parent_segments.lock().mark_in_use(segment);
        Ok(self.write(&bytes)?)
    }

    /// The stub released parent segment `id`.
    pub fn release_parent(&self, id: &str) {
        if !self.parent_segments.lock().release(id) {
            tracing::debug!(instance = %self.instance, segment = id, "the Python stub released a segment that was not in use");
        }
    }

    /// Copies `refs` out of stub segment `segment`, then releases the segment (even when the
    /// copy failed: the stub may reuse it either way).
    pub fn take_bytes(
        &self,
        segment: Option<&str>,
        refs: &[&TensorRef],
    ) -> Result<Vec<Bytes>, String> {
        self.take(segment, refs, false)
    }

    /// [`Self::take_bytes`] for an `execute` reply: the segment's release goes out with the next
    /// frame to the stub (the next `execute`, usually) instead of on its own, so the stub's
    /// reader wakes once per request rather than twice. Replies come one per `execute`, so at
    /// most one segment per instance waits this way; the stub's other messages (decoupled
    /// responses, BLS requests) still release at once, since they may come many in a row.
    pub fn take_bytes_deferred(
        &self,
        segment: Option<&str>,
        refs: &[&TensorRef],
    ) -> Result<Vec<Bytes>, String> {
        self.take(segment, refs, true)
    }

    fn take(
        &self,
        segment: Option<&str>,
        refs: &[&TensorRef],
        defer_release: bool,
    ) -> Result<Vec<Bytes>, String> {
        let result = self.read_bytes(segment, refs);
        if let Some(id) = segment {
            let release = frame::encode(&ToStub::Release {
                segment: id.to_string(),
            })
            .and_then(|bytes| {
                if defer_release {
                    self.deferred_releases.lock().extend_from_slice(&bytes);
                    Ok(())
                } else {
                    self.write(&bytes)
                }
            });
            if let Err(e) = release {
                tracing::debug!(instance = %self.instance, error = %e, "cannot release a stub segment");
            }
        }
        result
    }

    /// [`Self::take_bytes`] for one list of references, as checked tensors.
    pub fn take_tensors(
        &self,
        segment: Option<&str>,
        refs: &[TensorRef],
    ) -> Result<Vec<Tensor>, String> {
        let borrowed: Vec<&TensorRef> = refs.iter().collect();
        let data = self.take_bytes(segment, &borrowed)?;
        convert::tensors_from_refs(refs, data)
    }

    fn read_bytes(&self, segment: Option<&str>, refs: &[&TensorRef]) -> Result<Vec<Bytes>, String> {
        let wanted: Vec<(&str, u64, u64)> = refs
            .iter()
            .filter(|r| r.nbytes > 0)
            .map(|r| (r.name.as_str(), r.offset, r.nbytes))
            .collect();
        let mut read = if wanted.is_empty() {
            Vec::new()
        } else {
            let Some(id) = segment else {
                return Err("the stub sent tensor data without naming a segment".into());
            };
            self.stub_segments
                .lock()
                .read_many(id, &wanted)
                .map_err(|e| e.to_string())?
        }
        .into_iter()
        .map(Bytes::from);
        Ok(refs
            .iter()
            .map(|r| {
                if r.nbytes > 0 {
                    read.next().unwrap_or_default()
                } else {
                    Bytes::new()
                }
            })
            .collect())
    }

    /// Registers a decoupled request's destination before its `execute` is sent (again, for
    /// a rescheduled request: its parked stream is replaced). Drops the parked streams whose
    /// client is gone: their requests will not run again.
    pub fn open_stream(&self, key: u64, target: StreamTarget, outputs: Vec<String>) {
        let mut streams = self.streams.lock();
        streams.retain(|_, s| !(s.parked && s.target.is_closed()));
        streams.insert(
            key,
            OpenStream {
                target,
                outputs,
                cancelled: false,
                parked: false,
            },
        );
    }

    /// The request of `key` was rescheduled: its stream stays registered, without an end,
    /// until it runs again (see [`Self::open_stream`]).
    pub fn park_stream(&self, key: u64) {
        if let Some(stream) = self.streams.lock().get_mut(&key) {
            stream.parked = true;
        }
    }

    /// Removes a stream (its request failed as a whole).
    pub fn close_stream(&self, key: u64) -> Option<OpenStream> {
        self.streams.lock().remove(&key)
    }

    /// Delivers one decoupled stub message to its request's target: a response with the final
    /// flag becomes one [`StreamEvent::LastResponse`], the flag alone [`StreamEvent::Final`], as
    /// Triton keeps them apart. `is_final` closes the stream. Counts it for
    /// [`Self::wait_delivered`].
    pub fn deliver(
        &self,
        key: u64,
        response: Option<Result<ModelResponse, BackendError>>,
        is_final: bool,
    ) {
        self.deliver_to_stream(key, response, is_final);
        *self.delivered.lock() += 1;
        self.delivered_changed.notify_all();
    }

    /// Waits until `count` `response` messages of the stub have been delivered, or the stub
    /// died: a rescheduled request runs again only after its earlier responses went out, in
    /// order, their segments released.
    pub fn wait_delivered(&self, count: u64) {
        let mut delivered = self.delivered.lock();
        while *delivered < count && self.death_reason().is_none() {
            self.delivered_changed.wait(&mut delivered);
        }
    }

    fn deliver_to_stream(
        &self,
        key: u64,
        response: Option<Result<ModelResponse, BackendError>>,
        is_final: bool,
    ) {
        let mut streams = self.streams.lock();
        let Some(stream) = streams.get_mut(&key) else {
            tracing::warn!(instance = %self.instance, key, "the Python model sent a response for a request that is already complete; dropped");
            return;
        };
        let mut delivered = true;
        if let Some(result) = response {
            let result = result.and_then(|response| {
                Ok(ModelResponse {
                    tensors: convert::select_outputs(
                        response.tensors,
                        &stream.outputs,
                        &self.model,
                    )?,
                    parameters: response.parameters,
                })
            });
            let event = if is_final {
                StreamEvent::LastResponse(result)
            } else {
                StreamEvent::Response(result)
            };
            delivered = send_event(&stream.target, key, event);
        } else if is_final {
            send_event(&stream.target, key, StreamEvent::Final);
        }
        if is_final {
            streams.remove(&key);
        } else if !delivered && !stream.cancelled {
            // The client went away: tell the model (`is_cancelled()` becomes true).
            stream.cancelled = true;
            drop(streams);
            if let Err(e) = self.send(&ToStub::Cancel { key }) {
                tracing::debug!(instance = %self.instance, error = %e, "cannot send cancel");
            }
        }
    }

    /// Ends every open stream with `reason` (the stub died): an error, then the end. Parked
    /// streams are only dropped: their requests wait in the scheduler and run again on the
    /// next stub.
    pub fn fail_streams(&self, reason: &str) {
        let streams: Vec<(u64, OpenStream)> = self.streams.lock().drain().collect();
        for (key, stream) in streams.into_iter().filter(|(_, s)| !s.parked) {
            let error = BackendError::Execution(reason.to_string());
            send_event(&stream.target, key, StreamEvent::LastResponse(Err(error)));
        }
    }

    /// Marks the stub dead; returns the death hook to run unless the stub was being shut down.
    pub fn mark_dead(&self, reason: &str) -> Option<DeathHook> {
        let hook = {
            let mut state = self.state.lock();
            state.dead = Some(reason.to_string());
            if state.closing {
                None
            } else {
                state.on_death.take()
            }
        };
        // Under the lock its waiters check the death under: none misses it.
        let _delivered = self.delivered.lock();
        self.delivered_changed.notify_all();
        hook
    }

    /// Why the stub is dead, if it is.
    pub fn death_reason(&self) -> Option<String> {
        self.state.lock().dead.clone()
    }

    /// Installs the hook run when the stub dies; runs it now if it already has.
    pub fn on_death(&self, hook: DeathHook) {
        let mut state = self.state.lock();
        match (&state.dead, state.closing) {
            (Some(reason), false) => {
                let reason = reason.clone();
                drop(state);
                hook(&reason);
            }
            (Some(_), true) => {}
            (None, _) => state.on_death = Some(hook),
        }
    }

    /// The stub is being shut down on purpose: its end is not a death.
    pub fn set_closing(&self) {
        self.state.lock().closing = true;
    }

    /// Whether [`Self::set_closing`] was called.
    pub fn is_closing(&self) -> bool {
        self.state.lock().closing
    }

    /// Shuts the socket down both ways, so the reader sees end of stream.
    pub fn shutdown(&self) {
        let _ = self.writer.lock().shutdown(Shutdown::Both);
    }
}

impl StreamTarget {
    /// Whether the client went away (a collected stream is never parked: always `false`).
    fn is_closed(&self) -> bool {
        match self {
            StreamTarget::Sink(sink) => sink.is_closed(),
            StreamTarget::Collect(_) => false,
        }
    }
}

/// `false` when the receiver is gone.
fn send_event(target: &StreamTarget, key: u64, event: StreamEvent) -> bool {
    match target {
        StreamTarget::Sink(sink) => sink.send(event).is_ok(),
        StreamTarget::Collect(tx) => tx.send((key, event)).is_ok(),
    }
}

/// A message with tensors that could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error(transparent)]
    Shm(#[from] ShmError),
}

impl SendError {
    /// The socket is broken: the stub is gone or going.
    pub fn is_disconnect(&self) -> bool {
        matches!(self, SendError::Frame(FrameError::Io(_)))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use nereid_stub_protocol::frame::{decode, read_frame};
    use serde_json::Value;

    /// A link whose other end (the "stub") the test holds.
    fn link() -> (Link, UnixStream, tempfile::TempDir) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let prefix = format!("{}/seg-", dir.path().display());
        let link = Link::new(
            "m".into(),
            "m_0".into(),
            Arc::new(ServerHandle::default()),
            ours,
            &prefix,
        );
        (link, theirs, dir)
    }

    fn next_message(stub: &mut UnixStream) -> Value {
        decode(&read_frame(stub).unwrap().unwrap()).unwrap()
    }

    fn int32(name: &str, v: i32) -> Tensor {
        nereid_test_support::int32_1d(name, &[v])
    }

    #[test]
    fn responses_reach_the_sink_until_final() {
        let (link, _stub, _dir) = link();
        let (sink, mut rx) = tokio::sync::mpsc::unbounded_channel();
        link.open_stream(5, StreamTarget::Sink(sink), vec!["B".into()]);
        link.deliver(
            5,
            Some(Ok(vec![int32("A", 1), int32("B", 2)].into())),
            false,
        );
        link.deliver(5, None, true);
        link.deliver(5, Some(Ok(Vec::new().into())), true);
        let Ok(StreamEvent::Response(Ok(tensors))) = rx.try_recv() else {
            panic!("expected a response");
        };
        let names: Vec<&str> = tensors.tensors.iter().map(Tensor::name).collect();
        assert_eq!(names, vec!["B"], "only the requested outputs");
        assert!(
            matches!(rx.try_recv(), Ok(StreamEvent::Final)),
            "the flag alone is its own event"
        );
        assert!(rx.try_recv().is_err(), "nothing is delivered after final");
    }

    #[test]
    fn a_response_sent_with_the_final_flag_is_one_last_response() {
        let (link, _stub, _dir) = link();
        let (sink, mut rx) = tokio::sync::mpsc::unbounded_channel();
        link.open_stream(6, StreamTarget::Sink(sink), vec!["A".into()]);
        link.deliver(6, Some(Ok(vec![int32("A", 1)].into())), false);
        link.deliver(6, Some(Ok(vec![int32("A", 2)].into())), true);
        assert!(matches!(rx.try_recv(), Ok(StreamEvent::Response(Ok(_)))));
        let Ok(StreamEvent::LastResponse(Ok(last))) = rx.try_recv() else {
            panic!("expected the last response");
        };
        assert_eq!(last.tensors[0].data().as_ref(), &2i32.to_le_bytes());
        assert!(rx.try_recv().is_err(), "no separate Final follows");
    }

    #[test]
    fn a_gone_client_cancels_once() {
        let (link, mut stub, _dir) = link();
        let (sink, rx) = tokio::sync::mpsc::unbounded_channel();
        drop(rx);
        link.open_stream(9, StreamTarget::Sink(sink), vec![]);
        link.deliver(9, Some(Ok(Vec::new().into())), false);
        link.deliver(9, Some(Ok(Vec::new().into())), false);
        link.send(&ToStub::Finalize).unwrap();
        assert_eq!(
            next_message(&mut stub),
            serde_json::json!({"op": "cancel", "key": 9})
        );
        assert_eq!(next_message(&mut stub)["op"], "finalize", "one cancel only");
    }

    #[test]
    fn waiting_for_delivered_responses_ends_with_them_or_with_the_stub() {
        let (link, _stub, _dir) = link();
        let link = Arc::new(link);
        // Every response counts, also one for a request already complete.
        link.deliver(1, None, true);
        link.wait_delivered(1);
        let wait = |count: u64| {
            let (done, finished) = crossbeam_channel::bounded(1);
            let link = link.clone();
            std::thread::spawn(move || {
                link.wait_delivered(count);
                let _ = done.send(());
            });
            finished
        };
        let finished = wait(3);
        link.deliver(2, None, false);
        assert!(
            finished.try_recv().is_err(),
            "one response is still missing"
        );
        link.deliver(2, None, false);
        finished
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the third response ends the wait");
        let finished = wait(10);
        link.mark_dead("gone");
        finished
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the stub's death ends the wait");
    }

    #[test]
    fn a_dead_stub_ends_every_stream_with_the_reason() {
        let (link, _stub, _dir) = link();
        let (sink, mut rx) = tokio::sync::mpsc::unbounded_channel();
        link.open_stream(1, StreamTarget::Sink(sink), vec![]);
        link.fail_streams("Stub process 'm_0' is not healthy.");
        let Ok(StreamEvent::LastResponse(Err(BackendError::Execution(reason)))) = rx.try_recv()
        else {
            panic!("expected the death reason");
        };
        assert!(reason.contains("not healthy"));
        assert!(rx.try_recv().is_err(), "the error ends the stream");
        assert!(link.close_stream(1).is_none());
    }

    #[test]
    fn the_death_hook_runs_once_and_never_for_a_closing_stub() {
        let runs = Arc::new(AtomicUsize::new(0));
        let hook = || {
            let runs = runs.clone();
            Box::new(move |_: &str| {
                runs.fetch_add(1, Ordering::SeqCst);
            }) as DeathHook
        };
        let (early, _s1, _d1) = link();
        early.on_death(hook());
        early.mark_dead("gone").expect("the installed hook")("gone");
        assert!(early.mark_dead("again").is_none());
        // Installed after the death: runs at once.
        let (late, _s2, _d2) = link();
        assert!(late.mark_dead("gone").is_none());
        late.on_death(hook());
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        // Shut down on purpose: not a death.
        let (closing, _s3, _d3) = link();
        closing.on_death(hook());
        closing.set_closing();
        assert!(closing.mark_dead("finalized").is_none());
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert_eq!(closing.death_reason().as_deref(), Some("finalized"));
    }

    #[test]
    fn tensors_travel_in_segments_that_the_stub_releases() {
        let (link, mut stub, dir) = link();
        let tensor = int32("X", 42);
        let mut packer = Packer::default();
        packer.add(tensor.data());
        link.send_with_tensors(&packer, |segment| ToStub::Release {
            segment: segment.unwrap(),
        })
        .unwrap();
        let sent = next_message(&mut stub);
        let id = sent["segment"].as_str().unwrap().to_string();
        let written = std::fs::read(dir.path().join(format!("seg-{id}"))).unwrap();
        assert_eq!(&written[..4], &42i32.to_le_bytes());
        // Not released yet: the next message gets another segment; after release, the same.
        let mut again = || {
            link.send_with_tensors(&packer, |segment| ToStub::Release {
                segment: segment.unwrap(),
            })
            .unwrap();
            next_message(&mut stub)["segment"]
                .as_str()
                .unwrap()
                .to_string()
        };
        let second = again();
        assert_ne!(second, id);
        link.release_parent(&id);
        assert_eq!(again(), id);

        // Reading a stub segment releases it.
        std::fs::write(dir.path().join("seg-s0"), 7i32.to_le_bytes()).unwrap();
        let refs = vec![nereid_stub_protocol::message::TensorRef {
            name: "Y".into(),
            datatype: "INT32".into(),
            shape: vec![1],
            offset: 0,
            nbytes: 4,
        }];
        let tensors = link.take_tensors(Some("s0"), &refs).unwrap();
        assert_eq!(tensors[0].data().as_ref(), &7i32.to_le_bytes());
        assert_eq!(
            next_message(&mut stub),
            serde_json::json!({"op": "release", "segment": "s0"})
        );

        // An execute reply's segment is released with the next frame, ahead of it.
        let refs: Vec<_> = refs.iter().collect();
        let data = link.take_bytes_deferred(Some("s0"), &refs).unwrap();
        assert_eq!(data[0].as_ref(), &7i32.to_le_bytes());
        link.send(&ToStub::Finalize).unwrap();
        assert_eq!(
            next_message(&mut stub),
            serde_json::json!({"op": "release", "segment": "s0"})
        );
        assert_eq!(next_message(&mut stub)["op"], "finalize");
    }
}
