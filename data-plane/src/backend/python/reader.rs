//! The reader thread of one stub: reads every frame the stub sends on its *event* connection
//! and dispatches it. The stub's answers (`init_done`, `auto_complete_done`, `execute_done`,
//! `finalize_done`) come on the other connection, read by the thread waiting for them
//! ([`super::stub::Stub::wait_reply`]), which hands other frames it finds there to [`handle`].
//!
//! ```text
//!  events socket ─► read_frame ─► handle:
//!                        ─► response     ─► read tensors, release ─► the request's stream
//!                                           (with the response parameters the model set)
//!                        ─► bls_request  ─► read inputs, release ─► bls::call (tokio)
//!                        ─► log          ─► tracing, with the instance name
//!                        ─► metric       ─► custom_metrics (the server's registry)
//!                        ─► release      ─► parent segment free again
//!                        ─► an answer    ─► protocol error (answers belong on the other socket)
//!  end of stream / error ─► exit status ─► death reason ─► hook (health, supervisor),
//!                           open streams fail, custom metrics go, the waiting thread gets it
//! ```

use std::io::BufReader;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::Sender;

use super::bls;
use super::convert;
use super::custom_metrics;
use super::link::Link;
use super::model_control;
use super::process::{StubProcess, describe_exit};
use crate::backend::{BackendError, ModelResponse};
use nereid_stub_protocol::frame::{self, FrameError};
use nereid_stub_protocol::message::{FromStub, KNOWN_STUB_OPS, RESPONSE_FINAL, ResponseObject};

/// How long a stub whose socket closed gets to finish exiting before it is killed.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// Starts the reader thread; when the stub is gone it sends the death reason on `deaths`.
/// `shared`: the stub is a member of a shared stub process, whose connections can end on
/// purpose (the member was shut down) while the process lives on.
pub fn spawn(
    link: Arc<Link>,
    events: UnixStream,
    deaths: Sender<String>,
    process: Arc<StubProcess>,
    shared: bool,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("python-reader-{}", link.instance))
        .spawn(move || reader_task(&link, events, &deaths, &process, shared))
}

fn reader_task(
    link: &Arc<Link>,
    stream: UnixStream,
    deaths: &Sender<String>,
    process: &StubProcess,
    shared: bool,
) {
    let mut input = BufReader::new(stream);
    let cause = loop {
        match frame::read_frame(&mut input) {
            Ok(Some(body)) => {
                if let Err(e) = dispatch(link, &body) {
                    process.kill();
                    break format!("it broke the stub protocol ({e}) and was stopped");
                }
            }
            Ok(None) => break "it closed its connection".to_string(),
            Err(FrameError::Io(e)) => break format!("reading from it failed: {e}"),
            Err(e) => {
                process.kill();
                break format!("it broke the stub protocol ({e}) and was stopped");
            }
        }
    };
    let detail = match process.wait_exit(Duration::ZERO) {
        Some(status) => format!("The stub process {}.", describe_exit(status)),
        // A member shut down on purpose: the other members still use the process.
        None if shared && link.is_closing() => format!("The member was shut down ({cause})."),
        None => match process.stop(EXIT_GRACE) {
            Some(status) => format!("The stub process {}.", describe_exit(status)),
            None => format!("The stub process did not exit after {cause}."),
        },
    };
    let reason = unhealthy_reason(&link.instance, &detail);
    if let Some(hook) = link.mark_dead(&reason) {
        tracing::error!(model = %link.model, instance = %link.instance, cause = %cause,
            stderr = %process.stderr_tail(Duration::from_millis(200)), "{reason}");
        hook(&reason);
    }
    link.fail_streams(&reason);
    link.custom_metrics.clear();
    // Full only if nobody took an earlier notice; the waiting thread then reads the reason
    // from the link.
    let _ = deaths.try_send(reason);
}

/// Triton's message for a dead stub, and what happened to it.
pub fn unhealthy_reason(instance: &str, detail: &str) -> String {
    format!("Stub process '{instance}' is not healthy. {detail}")
}

/// The reader thread's dispatch of an event frame.
pub(super) fn dispatch(link: &Arc<Link>, body: &[u8]) -> Result<(), String> {
    match handle(link, body)? {
        None => Ok(()),
        Some(answer) => Err(format!(
            "it sent an answer ({}) on its event connection",
            answer_op(&answer)
        )),
    }
}

/// Acts on one frame from the stub; an answer (`init_done`, `auto_complete_done`,
/// `execute_done`, `finalize_done`) is returned for the thread waiting for it.
pub(super) fn handle(link: &Arc<Link>, body: &[u8]) -> Result<Option<FromStub>, String> {
    let message = match frame::decode::<FromStub>(body) {
        Ok(m) => m,
        Err(e) => return unknown_op(link, body, &e).map(|()| None),
    };
    match message {
        FromStub::Log { level, message } => log(link, &level, &message),
        FromStub::Release { segment } => link.release_parent(&segment),
        FromStub::Response {
            key,
            response,
            flags,
            segment,
        } => deliver_response(link, key, response, flags, segment.as_deref()),
        FromStub::BlsRequest {
            id,
            request,
            decoupled,
            segment,
        } => bls::call(link, id, request, decoupled, segment.as_deref()),
        FromStub::BlsCancel { id } => bls::cancel(link, id),
        FromStub::ModelControl { id, action } => model_control::call(link, id, action),
        FromStub::Metric { fields } => custom_metrics::handle(link, fields),
        answer @ (FromStub::InitDone { .. }
        | FromStub::AutoCompleteDone { .. }
        | FromStub::ExecuteDone { .. }
        | FromStub::FinalizeDone { .. }) => return Ok(Some(answer)),
    }
    Ok(None)
}

fn answer_op(answer: &FromStub) -> &'static str {
    match answer {
        FromStub::InitDone { .. } => "init_done",
        FromStub::AutoCompleteDone { .. } => "auto_complete_done",
        FromStub::ExecuteDone { .. } => "execute_done",
        _ => "finalize_done",
    }
}

/// A frame that does not decode: an op this parent does not know is skipped (a newer stub), a
/// known op with bad fields is a protocol error.
fn unknown_op(link: &Link, body: &[u8], error: &FrameError) -> Result<(), String> {
    let op = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("op").and_then(|op| op.as_str()).map(str::to_string));
    match op {
        Some(op) if !KNOWN_STUB_OPS.contains(&op.as_str()) => {
            tracing::warn!(instance = %link.instance, op = %op, "the Python stub sent an unknown message; ignored");
            Ok(())
        }
        Some(op) => Err(format!("malformed '{op}' message: {error}")),
        None => Err(format!("a message without an 'op': {error}")),
    }
}

fn log(link: &Link, level: &str, message: &str) {
    let (model, instance) = (&link.model, &link.instance);
    match level {
        "ERROR" => {
            tracing::error!(target: "nereid::python", model = %model, instance = %instance, "{message}")
        }
        "WARNING" | "WARN" => {
            tracing::warn!(target: "nereid::python", model = %model, instance = %instance, "{message}")
        }
        "VERBOSE" => {
            tracing::debug!(target: "nereid::python", model = %model, instance = %instance, "{message}")
        }
        _ => {
            tracing::info!(target: "nereid::python", model = %model, instance = %instance, "{message}")
        }
    }
}

/// A decoupled response: copy its tensors out, release the segment, hand it to the stream.
fn deliver_response(
    link: &Link,
    key: u64,
    response: Option<ResponseObject>,
    flags: u32,
    segment: Option<&str>,
) {
    let refs = response.as_ref().map_or(&[][..], |r| r.outputs.as_slice());
    // Read (and release the segment) first, whatever the response says.
    let tensors = link.take_tensors(segment, refs);
    let result = response.map(|r| match r.error {
        Some(error) => Err(convert::backend_error(error)),
        None => Ok(ModelResponse {
            tensors: tensors.map_err(|e| {
                BackendError::Execution(format!(
                    "model '{}': cannot read a response of the Python model: {e}",
                    link.model
                ))
            })?,
            parameters: convert::response_parameters_from_json(r.parameters, &link.model)?,
        }),
    });
    link.deliver(key, result, flags & RESPONSE_FINAL != 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::ServerHandle;

    fn link() -> (Arc<Link>, UnixStream) {
        let (ours, theirs) = UnixStream::pair().unwrap();
        let link = Arc::new(Link::new(
            "m".into(),
            "m_0".into(),
            Arc::new(ServerHandle::default()),
            ours,
            "/nonexistent/seg-",
        ));
        (link, theirs)
    }

    #[test]
    fn answers_go_to_the_waiting_thread_and_the_rest_is_handled_here() {
        let (link, _stub) = link();
        let log = br#"{"op": "log", "level": "INFO", "message": "hi"}"#;
        assert_eq!(handle(&link, log), Ok(None));
        assert_eq!(
            handle(&link, br#"{"op": "release", "segment": "p7"}"#),
            Ok(None)
        );
        assert_eq!(
            handle(&link, br#"{"op": "init_done", "error": null}"#),
            Ok(Some(FromStub::InitDone { error: None }))
        );
        assert!(dispatch(&link, log).is_ok());
    }

    #[test]
    fn unknown_ops_are_skipped_and_malformed_known_ops_are_errors() {
        let (link, _stub) = link();
        assert!(dispatch(&link, br#"{"op": "metric_family_new", "x": 1}"#).is_ok());
        let err = dispatch(&link, br#"{"op": "execute_done", "id": "seven"}"#).unwrap_err();
        assert!(err.contains("malformed 'execute_done'"), "{err}");
        assert!(dispatch(&link, br#"[1, 2]"#).is_err());
    }

    #[test]
    fn answers_on_the_event_connection_are_a_protocol_error() {
        let (link, _stub) = link();
        let err = dispatch(&link, br#"{"op": "finalize_done"}"#).unwrap_err();
        assert!(
            err.contains("finalize_done") && err.contains("event connection"),
            "{err}"
        );
    }

    #[test]
    fn decoupled_responses_carry_the_parameters_the_model_set() {
        use super::super::link::StreamTarget;
        use crate::backend::StreamEvent;
        use nereid_proto::ParamValue;

        let (link, _stub) = link();
        let (sink, mut rx) = tokio::sync::mpsc::unbounded_channel();
        link.open_stream(4, StreamTarget::Sink(sink), Vec::new());
        let response = br#"{"op": "response", "key": 4, "flags": 0,
            "response": {"outputs": [], "parameters": {"note": "hi", "n": 3, "ok": true}}}"#;
        assert_eq!(dispatch(&link, response), Ok(()));
        let Ok(StreamEvent::Response(Ok(answer))) = rx.try_recv() else {
            panic!("expected a response");
        };
        assert_eq!(
            answer.parameters,
            [
                ("n".to_string(), ParamValue::Int(3)),
                ("note".to_string(), ParamValue::String("hi".into())),
                ("ok".to_string(), ParamValue::Bool(true)),
            ]
            .into()
        );
        // A value no response parameter can hold fails that response, not the stream.
        let bad = br#"{"op": "response", "key": 4, "flags": 1,
            "response": {"outputs": [], "parameters": {"list": [1]}}}"#;
        assert_eq!(dispatch(&link, bad), Ok(()));
        let Ok(StreamEvent::LastResponse(Err(BackendError::Execution(reason)))) = rx.try_recv()
        else {
            panic!("expected the invalid parameter as the last response's error");
        };
        assert!(reason.contains("'list'"), "{reason}");
        assert!(
            rx.try_recv().is_err(),
            "sent with the final flag: one event"
        );
    }

    #[test]
    fn the_unhealthy_reason_is_tritons() {
        assert_eq!(
            unhealthy_reason("m_0_0", "The stub process exited with status 3."),
            "Stub process 'm_0_0' is not healthy. The stub process exited with status 3."
        );
    }
}
