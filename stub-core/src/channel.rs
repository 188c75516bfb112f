//! `Channel`: the stub's end of its three one-way connections to the server. *Commands* carry
//! everything the server sends; *answers* the stub's answers (`init_done`,
//! `auto_complete_done`, `execute_done`, `finalize_done`), which the server's waiting thread
//! reads itself; *events* the rest (logs, decoupled responses, BLS calls, metrics, model
//! control), read by the server's reader thread. One way each, because a thread blocked reading
//! a Unix socket is woken whenever the peer consumes what was written on that same socket.
//!
//! Reads frames with the GIL released and decodes them with the protocol's types, answers what
//! needs no model code itself (`cancel`, `release`), and writes frames with every queued
//! release in front, in one write. A release thread sends queued releases when no other frame
//! is on its way.
//!
//! `recv()` gives `(op, payload)`:
//! * `("execute", (id, [InferenceRequest], error))`: `error` is the text of a malformed message
//!   (no requests then);
//! * `("bls_response", (id, final, InferenceResponse | None, error))`;
//! * `("init" | "auto_complete" | "finalize" | "model_control_done" | "metric_done", dict)`;
//! * `None` at the end of the stream.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use nereid_stub_protocol::frame::{self, FrameError};
use nereid_stub_protocol::message::{
    ErrorCode, ErrorObject, FromStub, KNOWN_PARENT_OPS, RequestObject, ResponseObject, TensorRef,
    ToStub,
};
use pyo3::exceptions::{PyConnectionError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::MutexExt;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::convert::{from_py, to_py};
use crate::request::{InferenceRequest, RequestState};
use crate::response::InferenceResponse;
use crate::segments::{ParentSegments, Releases, StubSegments};
use crate::wire::{Outgoing, decode_response, decode_tensors, encode_response};

struct Reader {
    stream: BufReader<UnixStream>,
    parents: Option<ParentSegments>,
}

/// `nereid_stub_core.Channel(commands_fd, answers_fd, events_fd)`: takes ownership of the
/// three connected sockets.
#[pyclass(module = "nereid_stub_core", frozen)]
pub struct Channel {
    reader: Mutex<Reader>,
    answers: Mutex<UnixStream>,
    events: Arc<Mutex<UnixStream>>,
    releases: Arc<Releases>,
    stub: OnceLock<Arc<StubSegments>>,
    /// Cancellation flags of the requests still alive, by key.
    cancels: Mutex<HashMap<u64, Weak<AtomicBool>>>,
    decoupled: AtomicBool,
    /// `response` messages written so far (see `execute_done`'s `responses_sent`).
    responses_sent: AtomicU64,
}

#[pymethods]
impl Channel {
    #[new]
    fn new(commands_fd: i32, answers_fd: i32, events_fd: i32) -> PyResult<Self> {
        let fds = [commands_fd, answers_fd, events_fd];
        if fds.iter().any(|fd| *fd < 0) || fds[0] == fds[1] || fds[1] == fds[2] || fds[0] == fds[2]
        {
            return Err(PyValueError::new_err(
                "Channel needs three distinct open socket descriptors",
            ));
        }
        // SAFETY: the caller hands the descriptors over (`socket.detach()`); nothing else
        // closes them.
        let (commands, answers, events) = unsafe {
            (
                UnixStream::from_raw_fd(commands_fd),
                UnixStream::from_raw_fd(answers_fd),
                UnixStream::from_raw_fd(events_fd),
            )
        };
        let events = Arc::new(Mutex::new(events));
        let releases = Arc::new(Releases::default());
        spawn_release_thread(events.clone(), releases.clone())?;
        Ok(Channel {
            answers: Mutex::new(answers),
            reader: Mutex::new(Reader {
                stream: BufReader::with_capacity(64 << 10, commands),
                parents: None,
            }),
            events,
            releases,
            stub: OnceLock::new(),
            cancels: Mutex::new(HashMap::new()),
            decoupled: AtomicBool::new(false),
            responses_sent: AtomicU64::new(0),
        })
    }

    /// Whether `init` said the model is decoupled.
    #[getter]
    fn decoupled(&self) -> bool {
        self.decoupled.load(Ordering::Acquire)
    }

    /// The next message for Python (see the module docs); None at the end of the stream.
    /// Raises ValueError on a protocol error.
    fn recv<'py>(&self, py: Python<'py>) -> PyResult<Option<(String, Bound<'py, PyAny>)>> {
        let mut reader = self
            .reader
            .lock_py_attached(py)
            .unwrap_or_else(|e| e.into_inner());
        loop {
            let stream = &mut reader.stream;
            let body = match py.detach(|| frame::read_frame(stream)) {
                Ok(Some(body)) => body,
                Ok(None) | Err(FrameError::Io(_)) => return Ok(None),
                Err(e) => return Err(PyValueError::new_err(e.to_string())),
            };
            let message: ToStub = match frame::decode(&body) {
                Ok(m) => m,
                Err(e) => {
                    if unknown_op(&body) {
                        warn(&format!("ignoring a message with an unknown op ({e})"));
                        continue;
                    }
                    return Err(PyValueError::new_err(format!("malformed message: {e}")));
                }
            };
            if let Some(out) = self.handle(py, &mut reader, message, &body)? {
                return Ok(Some(out));
            }
        }
    }

    /// Sends a message given as a dict (init_done, log, model_control, metric, ...), checked
    /// against the protocol first.
    fn send(&self, py: Python<'_>, message: &Bound<'_, PyDict>) -> PyResult<()> {
        let (frame, answer) = checked_frame(message)?;
        self.write(py, frame, answer)
    }

    /// Queues a message (a dict) to go out ahead of the next frame; safe in `__del__`.
    fn queue(&self, message: &Bound<'_, PyDict>) -> PyResult<()> {
        let value = from_py(message.as_any())?;
        let message: FromStub = serde_json::from_value(value)
            .map_err(|e| PyValueError::new_err(format!("not a stub message: {e}")))?;
        self.releases.push(&message);
        Ok(())
    }

    /// `execute_done` for a default-mode execute: one response per request state, outputs
    /// filtered by what each request asked for, all in one segment; a rescheduled request's
    /// response is `None`, sent empty, and its index listed. Empties `responses` once their data
    /// is copied.
    fn send_execute_done(
        &self,
        py: Python<'_>,
        id: u64,
        states: &Bound<'_, PyList>,
        responses: &Bound<'_, PyList>,
    ) -> PyResult<()> {
        let mut out = Outgoing::default();
        let mut wire = Vec::with_capacity(responses.len());
        let mut rescheduled = Vec::new();
        for (index, (state, response)) in states.iter().zip(responses.iter()).enumerate() {
            let state = state.cast_into::<RequestState>()?;
            if state.borrow().rescheduled() {
                rescheduled.push(index);
                wire.push((ResponseObject::default(), Vec::new()));
                continue;
            }
            let response = response.cast_into::<InferenceResponse>()?;
            let names = state.borrow().requested_output_names.clone();
            wire.push(encode_response(py, &response, &names, &mut out)?);
        }
        let (segment, refs) = out.write(py, self.stub_segments()?)?;
        // The data is copied: drop the responses now, so the inputs their tensors may hold are
        // released in this same write (the caller's `set_replying` keeps the release thread
        // asleep meanwhile).
        responses.call_method0("clear")?;
        let responses = wire
            .into_iter()
            .map(|(mut r, indexes)| {
                r.outputs = indexes.into_iter().map(|i| refs[i].clone()).collect();
                r
            })
            .collect();
        self.write_message(
            py,
            &FromStub::ExecuteDone {
                id,
                responses,
                error: None,
                segment,
                rescheduled,
                responses_sent: None,
            },
        )
    }

    /// `execute_done` of an execute that failed as a whole (decoupled or not: nothing is
    /// rescheduled), or of a decoupled execute that returned (`message` None), listing the
    /// requests of `states` the model rescheduled.
    #[pyo3(signature = (id, message=None, states=None))]
    fn send_execute_end(
        &self,
        py: Python<'_>,
        id: u64,
        message: Option<String>,
        states: Option<&Bound<'_, PyList>>,
    ) -> PyResult<()> {
        let mut rescheduled = Vec::new();
        if message.is_none()
            && let Some(states) = states
        {
            for (index, state) in states.iter().enumerate() {
                if state.cast_into::<RequestState>()?.borrow().rescheduled() {
                    rescheduled.push(index);
                }
            }
        }
        // Read before this answer is written: every response counted went out ahead of it.
        let responses_sent =
            (!rescheduled.is_empty()).then(|| self.responses_sent.load(Ordering::Acquire));
        self.write_message(
            py,
            &FromStub::ExecuteDone {
                id,
                responses: Vec::new(),
                error: message.map(|m| ErrorObject::new(ErrorCode::Internal, m)),
                segment: None,
                rescheduled,
                responses_sent,
            },
        )
    }

    /// A decoupled sender's `send(response, flags)` for the request of `state`.
    fn send_response(
        &self,
        py: Python<'_>,
        state: &Bound<'_, RequestState>,
        response: Option<&Bound<'_, InferenceResponse>>,
        flags: u32,
    ) -> PyResult<()> {
        let (key, names) = {
            let s = state.borrow();
            (s.key, s.requested_output_names.clone())
        };
        let (response, segment) = match response {
            None => (None, None),
            Some(response) => {
                let mut out = Outgoing::default();
                let (mut wire, indexes) = encode_response(py, response, &names, &mut out)?;
                let (segment, refs) = out.write(py, self.stub_segments()?)?;
                wire.outputs = indexes.into_iter().map(|i| refs[i].clone()).collect();
                (Some(wire), segment)
            }
        };
        self.write_message(
            py,
            &FromStub::Response {
                key,
                response,
                flags,
                segment,
            },
        )?;
        self.responses_sent.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// Sends `request` as BLS call `id`.
    fn send_bls_request(
        &self,
        py: Python<'_>,
        id: u64,
        request: &Bound<'_, InferenceRequest>,
        decoupled: bool,
    ) -> PyResult<()> {
        let r = request.borrow();
        let mut out = Outgoing::default();
        for tensor in r.inputs.bind(py).iter() {
            out.add(py, &tensor.cast_into()?)?;
        }
        let (segment, inputs) = out.write(py, self.stub_segments()?)?;
        let request = RequestObject {
            request_id: r.request_id.clone(),
            correlation_id: r.correlation_id.clone(),
            flags: r.flags,
            parameters: r.parameters.clone(),
            inputs,
            requested_output_names: r.requested_output_names.clone(),
            key: None,
            model_name: r.model_name.clone(),
            model_version: r.model_version,
            timeout_us: r.timeout,
            trace: r.trace_context(py),
        };
        drop(r);
        self.write_message(
            py,
            &FromStub::BlsRequest {
                id,
                request,
                decoupled,
                segment,
            },
        )
    }

    /// While true, queued releases wake no one: the reply being sent carries them.
    fn set_replying(&self, replying: bool) {
        self.releases.set_replying(replying);
    }

    /// Removes every file under the segment prefix (the stub is exiting).
    fn unlink_prefix(&self) {
        if let Some(stub) = self.stub.get() {
            stub.unlink_prefix();
        }
    }
}

impl Channel {
    fn stub_segments(&self) -> PyResult<&StubSegments> {
        self.stub.get().map(|s| &**s).ok_or_else(|| {
            PyValueError::new_err(
                "no shared-memory prefix: no init message with a valid 'shm_prefix' was received",
            )
        })
    }

    fn write_message(&self, py: Python<'_>, message: &FromStub) -> PyResult<()> {
        let frame = frame::encode(message).map_err(|e| PyValueError::new_err(e.to_string()))?;
        self.write(py, frame, is_answer(message))
    }

    /// Writes `frame` after every queued frame, in one write, with the GIL released: on the
    /// answers connection for an answer, else on the events connection.
    fn write(&self, py: Python<'_>, frame: Vec<u8>, answer: bool) -> PyResult<()> {
        let writer = if answer { &self.answers } else { &*self.events };
        let releases = &self.releases;
        py.detach(|| {
            let mut stream = writer.lock().unwrap_or_else(|e| e.into_inner());
            let mut bytes = releases.take();
            let all = if bytes.is_empty() {
                frame
            } else {
                bytes.extend_from_slice(&frame);
                bytes
            };
            stream.write_all(&all)
        })
        .map_err(|e| PyConnectionError::new_err(e.to_string()))
    }

    /// Acts on one message; `Some` when Python must see it.
    fn handle<'py>(
        &self,
        py: Python<'py>,
        reader: &mut Reader,
        message: ToStub,
        body: &[u8],
    ) -> PyResult<Option<(String, Bound<'py, PyAny>)>> {
        let as_dict = |op: &str| -> PyResult<Option<(String, Bound<'py, PyAny>)>> {
            let value: serde_json::Value =
                serde_json::from_slice(body).map_err(|e| PyValueError::new_err(e.to_string()))?;
            Ok(Some((op.to_owned(), to_py(py, &value)?)))
        };
        match message {
            ToStub::Init {
                shm_prefix,
                decoupled,
                ..
            } => {
                self.decoupled.store(decoupled, Ordering::Release);
                self.configure(reader, shm_prefix);
                as_dict("init")
            }
            ToStub::AutoComplete { shm_prefix, .. } => {
                self.configure(reader, shm_prefix);
                as_dict("auto_complete")
            }
            ToStub::Finalize => as_dict("finalize"),
            ToStub::ModelControlDone { .. } => as_dict("model_control_done"),
            ToStub::MetricDone { .. } => as_dict("metric_done"),
            ToStub::Cancel { key } => {
                let flag = self
                    .cancels
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .get(&key)
                    .and_then(Weak::upgrade);
                if let Some(flag) = flag {
                    flag.store(true, Ordering::Release);
                }
                Ok(None)
            }
            ToStub::Release { segment } => {
                let released = self.stub.get().is_some_and(|s| s.release(&segment));
                if !released {
                    warn(&format!(
                        "ignoring release of unknown or free segment {segment:?}"
                    ));
                }
                Ok(None)
            }
            ToStub::Execute {
                id,
                requests,
                segment,
            } => {
                let (list, error) = match self.execute_requests(py, reader, requests, segment) {
                    Ok(list) => (list, None),
                    Err(e) => (
                        PyList::empty(py),
                        Some(format!("invalid execute message from the server: {e}")),
                    ),
                };
                let payload = PyTuple::new(
                    py,
                    [
                        id.into_pyobject(py)?.into_any(),
                        list.into_any(),
                        error.into_pyobject(py)?.into_any(),
                    ],
                )?;
                Ok(Some(("execute".into(), payload.into_any())))
            }
            ToStub::BlsResponse {
                id,
                response,
                is_final,
                segment,
            } => {
                let (response, error) = match (&response, reader.parents.as_mut()) {
                    (None, parents) => {
                        if let Some(parents) = parents {
                            parents.release_unused(segment.as_deref());
                        }
                        (None, None)
                    }
                    (Some(_), None) => (None, Some("BLS response before init".to_owned())),
                    (Some(r), Some(parents)) => {
                        match decode_response(py, parents, r, segment.as_deref()) {
                            Ok(r) => (Some(Bound::new(py, r)?.into_any()), None),
                            Err(e) => (
                                None,
                                Some(format!("invalid BLS response from the server: {e}")),
                            ),
                        }
                    }
                };
                let payload = PyTuple::new(
                    py,
                    [
                        id.into_pyobject(py)?.into_any(),
                        pyo3::types::PyBool::new(py, is_final).to_owned().into_any(),
                        response.into_pyobject(py)?.into_any(),
                        error.into_pyobject(py)?.into_any(),
                    ],
                )?;
                Ok(Some(("bls_response".into(), payload.into_any())))
            }
        }
    }

    fn configure(&self, reader: &mut Reader, prefix: String) {
        if prefix.is_empty() || self.stub.get().is_some() {
            return;
        }
        reader.parents = Some(ParentSegments::new(prefix.clone(), self.releases.clone()));
        let _ = self.stub.set(Arc::new(StubSegments::new(prefix)));
    }

    fn execute_requests<'py>(
        &self,
        py: Python<'py>,
        reader: &mut Reader,
        requests: Vec<RequestObject>,
        segment: Option<String>,
    ) -> Result<Bound<'py, PyList>, String> {
        let Some(parents) = reader.parents.as_mut() else {
            return Err("execute received before init".into());
        };
        let refs: Vec<&TensorRef> = requests.iter().flat_map(|r| r.inputs.iter()).collect();
        let mut tensors = decode_tensors(py, parents, segment.as_deref(), &refs)?.into_iter();
        let decoupled = self.decoupled.load(Ordering::Acquire);
        let py_err = |e: PyErr| e.value(py).to_string();
        let list = PyList::empty(py);
        let mut cancels = self.cancels.lock().unwrap_or_else(|e| e.into_inner());
        if cancels.len() > 1024 {
            cancels.retain(|_, flag| flag.strong_count() > 0);
        }
        for request in requests {
            let Some(key) = request.key else {
                return Err("a request lacks its 'key'".into());
            };
            let inputs = PyList::empty(py);
            for tensor in tensors.by_ref().take(request.inputs.len()) {
                inputs
                    .append(Bound::new(py, tensor).map_err(py_err)?)
                    .map_err(py_err)?;
            }
            let state = RequestState::new(key, decoupled, request.requested_output_names);
            cancels.insert(key, Arc::downgrade(&state.cancelled));
            let state = Bound::new(py, state).map_err(py_err)?;
            let request = InferenceRequest::from_server(
                request.request_id,
                request.correlation_id,
                inputs,
                request.model_name,
                request.model_version,
                request.flags,
                request.timeout_us,
                request.parameters,
                state,
                request.trace,
            );
            list.append(Bound::new(py, request).map_err(py_err)?)
                .map_err(py_err)?;
        }
        Ok(list)
    }
}

/// Whether `body` is a JSON object whose `op` this protocol revision does not know (a newer
/// server's message: ignored, as the protocol says).
fn unknown_op(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("op").and_then(|op| op.as_str().map(str::to_owned)))
        .is_some_and(|op| !KNOWN_PARENT_OPS.contains(&op.as_str()))
}

/// Whether `message` answers a server command (and so goes on the answers connection).
fn is_answer(message: &FromStub) -> bool {
    matches!(
        message,
        FromStub::InitDone { .. }
            | FromStub::AutoCompleteDone { .. }
            | FromStub::ExecuteDone { .. }
            | FromStub::FinalizeDone { .. }
    )
}

/// The frame of a message given as a dict, checked against the protocol, and whether it is an
/// answer.
fn checked_frame(message: &Bound<'_, PyDict>) -> PyResult<(Vec<u8>, bool)> {
    let value = from_py(message.as_any())?;
    let message: FromStub = serde_json::from_value(value).map_err(|e| {
        let op = message
            .get_item("op")
            .ok()
            .flatten()
            .and_then(|o| o.cast_into::<PyString>().ok().map(|s| s.to_string()))
            .unwrap_or_default();
        PyValueError::new_err(format!("not a valid '{op}' message: {e}"))
    })?;
    let frame = frame::encode(&message).map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok((frame, is_answer(&message)))
}

fn spawn_release_thread(writer: Arc<Mutex<UnixStream>>, releases: Arc<Releases>) -> PyResult<()> {
    std::thread::Builder::new()
        .name("nereid-release".into())
        .spawn(move || {
            loop {
                releases.wait();
                let mut stream = writer.lock().unwrap_or_else(|e| e.into_inner());
                let bytes = releases.take();
                if !bytes.is_empty() && stream.write_all(&bytes).is_err() {
                    return; // the server is gone; the main thread finds out on its next read
                }
            }
        })?;
    Ok(())
}

fn warn(text: &str) {
    eprintln!("nereid stub: {text}");
}
