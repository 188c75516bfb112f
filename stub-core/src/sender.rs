//! `pb_utils.InferenceResponseSender`: one request's responses, any number in decoupled mode
//! (each sent at once through the stub), one in default mode (kept for `execute_done`), then
//! the final flag. Sends of one request are ordered by the request state's lock.

use pyo3::prelude::*;

use crate::hooks::{self, model_error};
use crate::request::RequestState;
use crate::response::InferenceResponse;

/// `TRITONSERVER_RESPONSE_COMPLETE_FINAL`.
const FINAL: u32 = 1;

#[pyclass(
    module = "triton_python_backend_utils",
    name = "InferenceResponseSender"
)]
pub struct ResponseSender {
    state: Py<RequestState>,
}

#[pymethods]
impl ResponseSender {
    #[new]
    fn new(state: Py<RequestState>) -> Self {
        ResponseSender { state }
    }

    #[pyo3(signature = (response=None, flags=0))]
    fn send(&self, py: Python<'_>, response: Option<Bound<'_, PyAny>>, flags: u32) -> PyResult<()> {
        if flags != 0 && flags != FINAL {
            return Err(model_error(
                py,
                "Unable to send response. Unsupported flag provided.",
            ));
        }
        let response = response.filter(|r| !r.is_none());
        if response.is_none() && flags == 0 {
            return Err(model_error(
                py,
                "Inference Response object must be provided when the response flags is set to zero.",
            ));
        }
        if let Some(r) = &response
            && !r.is_instance_of::<InferenceResponse>()
        {
            return Err(model_error(
                py,
                format!(
                    "send() expects a pb_utils.InferenceResponse, got {}",
                    r.get_type().name()?
                ),
            ));
        }
        let state = self.state.bind(py);
        let lock = state.borrow_mut().lock(py)?;
        let lock = lock.bind(py);
        lock.call_method0("acquire")?;
        let sent = self.send_locked(py, state, response, flags);
        lock.call_method0("release")?;
        sent
    }

    fn is_cancelled(&self, py: Python<'_>) -> PyResult<bool> {
        hooks::call(py, "_need_reader", ())?;
        Ok(self.state.borrow(py).is_cancelled())
    }
}

impl ResponseSender {
    /// The send itself, with the state's lock held.
    fn send_locked(
        &self,
        py: Python<'_>,
        state: &Bound<'_, RequestState>,
        response: Option<Bound<'_, PyAny>>,
        flags: u32,
    ) -> PyResult<()> {
        let decoupled = {
            let s = state.borrow();
            if !s.decoupled {
                if response.is_some() && s.sent > 0 {
                    return Err(model_error(
                        py,
                        "Unable to send response. Non-decoupled model cannot send more than one response.",
                    ));
                }
                if response.is_none() && flags == FINAL && s.sent == 0 {
                    return Err(model_error(
                        py,
                        "Unable to send response. Non-decoupled model cannot send complete final before sending a response.",
                    ));
                }
            }
            if s.closed {
                return Err(model_error(
                    py,
                    "Unable to send response. Response sender has been closed.",
                ));
            }
            s.decoupled
        };
        if decoupled {
            // No borrow of the state is held here: the send reads it.
            let channel = hooks::call(py, "_require_channel", ("InferenceResponseSender.send()",))?;
            channel.call_method1("send_response", (state, response, flags))?;
        } else if let Some(response) = response {
            state.borrow_mut().collected = Some(response.unbind());
        }
        let mut s = state.borrow_mut();
        s.sent += 1;
        if flags == FINAL {
            s.closed = true;
        }
        Ok(())
    }
}
