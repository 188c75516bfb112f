//! BLS (business logic scripting): a Python model's `InferenceRequest.exec()` /
//! `async_exec()` runs through the server's own [`nereid_proto::InferenceService`].
//!
//! ```text
//!  reader thread: bls_request ─► inputs copied out of the stub segment (released)
//!                             ─► InferRequest ─► spawn on the server's runtime
//!  tokio:         decoupled=False: service.infer(request)        ─► one final response
//!                 decoupled=True:  service.infer_stream(request) ─► a response per item, the
//!                                                                   last one final
//!  blocking pool: outputs ─► parent segment ─► bls_response {id, response, final}
//! ```
//!
//! The reader never waits for a call, so a model blocked in `exec()` keeps receiving messages.
//! The responses of one call are sent in order (each send completes before the next starts).
//!
//! A decoupled call can be cancelled (`ResponseIterator.cancel()` sends `bls_cancel {id}`): the
//! call drops its response stream, which cancels the request in the server (a Python model being
//! called sees `is_cancelled()` turn true when it next sends), and the stub gets a final, empty
//! `bls_response` so its iterator ends.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use nereid_proto::{InferRequest, InferResponse, InferenceService};
use parking_lot::Mutex;
use tokio::sync::oneshot;

use super::convert;
use super::link::Link;
use super::shm::Packer;
use nereid_stub_protocol::message::{
    ErrorCode, ErrorObject, RequestObject, ResponseObject, ToStub,
};

/// One response of a call: outputs, an error, or nothing (a decoupled model's bare final flag).
type Answer = Option<Result<InferResponse, ErrorObject>>;

/// The decoupled calls of one stub in flight, by id, each with the sender that cancels it.
#[derive(Debug, Default)]
pub struct BlsCancels(Mutex<HashMap<u64, oneshot::Sender<()>>>);

impl BlsCancels {
    fn register(&self, id: u64) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.0.lock().insert(id, tx);
        rx
    }

    fn forget(&self, id: u64) {
        self.0.lock().remove(&id);
    }
}

/// `bls_cancel {id}`: stops the decoupled call `id` if it is still running (a call that already
/// ended, or an unknown id, is ignored: the stub may cancel after the final response).
pub fn cancel(link: &Link, id: u64) {
    if let Some(cancel) = link.bls_cancels.0.lock().remove(&id) {
        let _ = cancel.send(());
    }
}

/// Starts the BLS call `id`; its responses are sent as they come.
pub fn call(
    link: &Arc<Link>,
    id: u64,
    request: RequestObject,
    decoupled: bool,
    segment: Option<&str>,
) {
    let request = match prepare(link, request, segment) {
        Ok(r) => r,
        Err(error) => {
            respond(link, id, Some(Err(error)), true);
            return;
        }
    };
    let Some((service, runtime)) = link.server.get() else {
        let error = ErrorObject::new(
            ErrorCode::Unavailable,
            format!(
                "BLS request to model '{}': the server is not accepting requests",
                request.model_name
            ),
        );
        respond(link, id, Some(Err(error)), true);
        return;
    };
    let link = link.clone();
    let cancelled = decoupled.then(|| link.bls_cancels.register(id));
    runtime.spawn(async move {
        if let Some(cancelled) = cancelled {
            stream_call(&link, id, service.as_ref(), request, cancelled).await;
            link.bls_cancels.forget(id);
        } else {
            let result = service
                .infer(request)
                .await
                .map_err(convert::service_error_object);
            send(&link, id, Some(result), true).await;
        }
    });
}

/// A `decoupled=True` call: every streamed item becomes a `bls_response`, until the last one
/// or until `cancelled` fires.
async fn stream_call(
    link: &Arc<Link>,
    id: u64,
    service: &dyn InferenceService,
    request: InferRequest,
    mut cancelled: oneshot::Receiver<()>,
) {
    let mut stream = match service.infer_stream(request).await {
        Ok(stream) => stream,
        Err(e) => {
            send(link, id, Some(Err(convert::service_error_object(e))), true).await;
            return;
        }
    };
    loop {
        let item = tokio::select! {
            item = stream.next() => item,
            Ok(()) = &mut cancelled => {
                // Dropping the stream cancels the request; the iterator ends here.
                drop(stream);
                send(link, id, None, true).await;
                return;
            }
        };
        let (answer, is_final) = match item {
            Some(Ok(item)) => (item.response.map(Ok), item.last),
            Some(Err(e)) => (Some(Err(convert::service_error_object(e))), true),
            None => (None, true),
        };
        // Stop (dropping the stream cancels the call) once the stub cannot hear any more.
        if !send(link, id, answer, is_final).await || is_final {
            return;
        }
    }
}

/// Sends one response off the async workers (writing tensors and the socket blocks).
async fn send(link: &Arc<Link>, id: u64, answer: Answer, is_final: bool) -> bool {
    let link = link.clone();
    match tokio::task::spawn_blocking(move || respond(&link, id, answer, is_final)).await {
        Ok(sent) => sent,
        Err(e) => {
            tracing::warn!(error = %e, "a BLS response could not be sent");
            false
        }
    }
}

/// The stub's request as the server's, inputs copied out of its segment.
fn prepare(
    link: &Link,
    request: RequestObject,
    segment: Option<&str>,
) -> Result<InferRequest, ErrorObject> {
    let model = request.model_name.clone();
    let invalid = |e: String| {
        ErrorObject::new(
            ErrorCode::InvalidArg,
            format!("BLS request to model '{model}': {e}"),
        )
    };
    let inputs = link
        .take_tensors(segment, &request.inputs)
        .map_err(invalid)?;
    convert::bls_request(request, inputs).map_err(invalid)
}

/// Sends one `bls_response`; `false` when the stub is gone.
fn respond(link: &Link, id: u64, answer: Answer, is_final: bool) -> bool {
    let sent = match answer {
        Some(Ok(response)) => {
            let mut packer = Packer::default();
            let outputs = response
                .outputs
                .iter()
                .map(|t| convert::tensor_ref(t, &mut packer))
                .collect();
            let object = ResponseObject {
                outputs,
                error: None,
                parameters: convert::response_parameters(&response),
            };
            link.send_with_tensors(&packer, |segment| ToStub::BlsResponse {
                id,
                response: Some(object),
                is_final,
                segment,
            })
        }
        Some(Err(error)) => {
            let object = ResponseObject {
                error: Some(error),
                ..Default::default()
            };
            let message = ToStub::BlsResponse {
                id,
                response: Some(object),
                is_final,
                segment: None,
            };
            link.send(&message).map_err(Into::into)
        }
        None => link
            .send(&ToStub::BlsResponse {
                id,
                response: None,
                is_final,
                segment: None,
            })
            .map_err(Into::into),
    };
    match sent {
        Ok(()) => true,
        Err(e) => {
            // The stub died meanwhile; its death is handled by the reader.
            tracing::debug!(instance = %link.instance, error = %e, "cannot send a BLS response");
            false
        }
    }
}
