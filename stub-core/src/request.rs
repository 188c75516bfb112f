//! `pb_utils.InferenceRequest`: a request `execute` receives (built by the channel, with a
//! [`RequestState`]) or one a model builds for a BLS call (Triton's constructor). BLS calls and
//! response senders are Python (`triton_python_backend_utils`), reached through hooks.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nereid_stub_protocol::message::CorrelationValue;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyList, PyString, PyTuple};
use serde_json::{Map, Value};

use crate::convert::{parameters_from_py, parameters_json};
use crate::hooks::{self, model_error};
use crate::tensor::tensor_list;

const RELEASE_ALL: u32 = 1;
const RELEASE_RESCHEDULE: u32 = 2;

/// What a server request shares with its response sender and the stub: cancellation, the
/// response collected in default mode, whether it is closed.
#[pyclass(module = "nereid_stub_core")]
pub struct RequestState {
    #[pyo3(get)]
    pub key: u64,
    #[pyo3(get)]
    pub decoupled: bool,
    #[pyo3(get)]
    pub requested_output_names: Vec<String>,
    pub cancelled: Arc<AtomicBool>,
    #[pyo3(get, set)]
    pub closed: bool,
    #[pyo3(get, set)]
    pub sent: u32,
    #[pyo3(get, set)]
    pub collected: Option<Py<PyAny>>,
    #[pyo3(get, set)]
    pub release_flags: u32,
    #[pyo3(get, set)]
    pub sender: Option<Py<PyAny>>,
    /// A `threading.Lock`, made when first asked for (senders and the stub's close).
    lock: Option<Py<PyAny>>,
}

impl RequestState {
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    /// Whether the model rescheduled the request (`set_release_flags(RESCHEDULE)`).
    pub fn rescheduled(&self) -> bool {
        self.release_flags == RELEASE_RESCHEDULE
    }

    pub fn new(key: u64, decoupled: bool, requested_output_names: Vec<String>) -> Self {
        RequestState {
            key,
            decoupled,
            requested_output_names,
            cancelled: Arc::new(AtomicBool::new(false)),
            closed: false,
            sent: 0,
            collected: None,
            release_flags: RELEASE_ALL,
            sender: None,
            lock: None,
        }
    }
}

#[pymethods]
impl RequestState {
    #[getter]
    pub fn lock(&mut self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        if let Some(lock) = &self.lock {
            return Ok(lock.clone_ref(py));
        }
        let lock = py.import("threading")?.call_method0("Lock")?.unbind();
        self.lock = Some(lock.clone_ref(py));
        Ok(lock)
    }

    /// Whether a lock was ever handed out (only then can another thread be sending).
    #[getter]
    fn has_lock(&self) -> bool {
        self.lock.is_some()
    }

    #[getter]
    fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::Acquire)
    }

    #[setter]
    fn set_cancelled(&self, value: bool) {
        self.cancelled.store(value, Ordering::Release);
    }
}

/// `pb_utils.InferenceRequest`.
#[pyclass(module = "triton_python_backend_utils", name = "InferenceRequest")]
pub struct InferenceRequest {
    pub request_id: String,
    pub correlation_id: CorrelationValue,
    pub inputs: Py<PyList>,
    pub requested_output_names: Vec<String>,
    pub model_name: String,
    pub model_version: i64,
    pub flags: u32,
    pub timeout: u64,
    pub parameters: Map<String, Value>,
    pub state: Option<Py<RequestState>>,
    preferred_memory: Option<Py<PyAny>>,
    trace: Option<Py<PyAny>>,
}

impl InferenceRequest {
    /// A request the server sent to `execute`.
    #[allow(clippy::too_many_arguments)]
    pub fn from_server(
        request_id: String,
        correlation_id: CorrelationValue,
        inputs: Bound<'_, PyList>,
        model_name: String,
        model_version: i64,
        flags: u32,
        timeout: u64,
        parameters: Map<String, Value>,
        state: Bound<'_, RequestState>,
        trace: Option<String>,
    ) -> Self {
        let py = state.py();
        InferenceRequest {
            request_id,
            correlation_id,
            inputs: inputs.unbind(),
            requested_output_names: state.borrow().requested_output_names.clone(),
            model_name,
            model_version,
            flags,
            timeout,
            parameters,
            state: Some(state.unbind()),
            preferred_memory: None,
            // `request.trace()`: the trace's context, which a BLS call passes on with
            // `trace=request.trace()` to become a child of this request's trace.
            trace: trace.map(|t| PyString::new(py, &t).into_any().unbind()),
        }
    }

    /// The trace context a BLS request was given (`trace=request.trace()`), if any.
    pub fn trace_context(&self, py: Python<'_>) -> Option<String> {
        self.trace
            .as_ref()
            .and_then(|t| t.bind(py).extract::<String>().ok())
    }

    fn state<'py>(&self, py: Python<'py>, what: &str) -> PyResult<&Bound<'py, RequestState>> {
        match &self.state {
            Some(state) => Ok(state.bind(py)),
            None => Err(model_error(
                py,
                format!("{what} is available only on requests passed to execute()"),
            )),
        }
    }
}

#[pymethods]
impl InferenceRequest {
    /// Triton's constructor for BLS requests, its arguments in its order.
    #[new]
    #[pyo3(signature = (request_id=None, correlation_id=None, inputs=None,
        requested_output_names=None, model_name=None, model_version=None, flags=None,
        timeout=None, preferred_memory=None, trace=None, parameters=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        request_id: Option<&Bound<'_, PyAny>>,
        correlation_id: Option<&Bound<'_, PyAny>>,
        inputs: Option<&Bound<'_, PyAny>>,
        requested_output_names: Option<&Bound<'_, PyAny>>,
        model_name: Option<&Bound<'_, PyAny>>,
        model_version: Option<&Bound<'_, PyAny>>,
        flags: Option<&Bound<'_, PyAny>>,
        timeout: Option<&Bound<'_, PyAny>>,
        preferred_memory: Option<&Bound<'_, PyAny>>,
        trace: Option<&Bound<'_, PyAny>>,
        parameters: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let missing = |arg: &str| {
            PyTypeError::new_err(format!(
                "InferenceRequest() missing required argument '{arg}'"
            ))
        };
        let inputs = inputs.ok_or_else(|| missing("inputs"))?;
        let names = requested_output_names.ok_or_else(|| missing("requested_output_names"))?;
        let model_name = model_name.ok_or_else(|| missing("model_name"))?;
        let model_name = match model_name.cast::<PyString>() {
            Ok(name) if !name.to_cow()?.is_empty() => name.to_cow()?.into_owned(),
            _ => {
                return Err(model_error(
                    py,
                    "InferenceRequest model_name must be a non-empty str",
                ));
            }
        };
        let names_error = || {
            model_error(
                py,
                "InferenceRequest requested_output_names must be a list of str",
            )
        };
        if !(names.is_instance_of::<PyList>() || names.is_instance_of::<PyTuple>()) {
            return Err(names_error());
        }
        let requested_output_names = names
            .try_iter()?
            .map(|n| {
                n?.cast::<PyString>()
                    .map_err(|_| names_error())
                    .and_then(|s| Ok(s.to_cow()?.into_owned()))
            })
            .collect::<PyResult<Vec<_>>>()?;
        let request_id = match request_id {
            None => String::new(),
            Some(id) => match id.cast::<PyString>() {
                Ok(id) => id.to_cow()?.into_owned(),
                Err(_) => {
                    return Err(model_error(
                        py,
                        format!(
                            "InferenceRequest request_id must be a str, got {}",
                            id.repr()?
                        ),
                    ));
                }
            },
        };
        let model_version = match model_version {
            None => -1,
            Some(v) => check_int(py, "model_version", v, -(1i128 << 63), 1i128 << 63)? as i64,
        };
        let flags = match flags {
            None => 0,
            Some(v) => check_int(py, "flags", v, 0, 1i128 << 32)? as u32,
        };
        let timeout = match timeout {
            None => 0,
            Some(v) => check_int(py, "timeout", v, 0, 1i128 << 64)? as u64,
        };
        Ok(InferenceRequest {
            request_id,
            correlation_id: match correlation_id {
                None => CorrelationValue::Int(0),
                Some(c) => correlation(py, c)?,
            },
            inputs: tensor_list(inputs, "InferenceRequest inputs")?.unbind(),
            requested_output_names,
            model_name,
            model_version,
            flags,
            timeout,
            parameters: parameters_from_py(py, parameters, "InferenceRequest")?,
            state: None,
            preferred_memory: preferred_memory
                .filter(|p| !p.is_none())
                .map(|p| p.clone().unbind()),
            trace: trace.filter(|t| !t.is_none()).map(|t| t.clone().unbind()),
        })
    }

    fn inputs<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        self.inputs.bind(py).clone()
    }

    fn requested_output_names(&self) -> Vec<String> {
        self.requested_output_names.clone()
    }

    fn request_id(&self) -> &str {
        &self.request_id
    }

    fn correlation_id<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match &self.correlation_id {
            CorrelationValue::Int(i) => i.into_pyobject(py)?.into_any(),
            CorrelationValue::Str(s) => PyString::new(py, s).into_any(),
        })
    }

    fn flags(&self) -> u32 {
        self.flags
    }

    fn set_flags(&mut self, py: Python<'_>, flags: &Bound<'_, PyAny>) -> PyResult<()> {
        self.flags = check_int(py, "flags", flags, 0, 1i128 << 32)? as u32;
        Ok(())
    }

    fn timeout(&self) -> u64 {
        self.timeout
    }

    fn model_name(&self) -> &str {
        &self.model_name
    }

    fn model_version(&self) -> i64 {
        self.model_version
    }

    /// The parameters as a JSON object string.
    fn parameters(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        parameters_json(py, &self.parameters)
    }

    fn trace<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        self.trace.as_ref().map(|t| t.bind(py).clone())
    }

    #[getter(_preferred_memory)]
    fn preferred_memory<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        self.preferred_memory.as_ref().map(|p| p.bind(py).clone())
    }

    #[getter(_state)]
    fn private_state<'py>(&self, py: Python<'py>) -> Option<Bound<'py, RequestState>> {
        self.state.as_ref().map(|s| s.bind(py).clone())
    }

    fn get_response_sender<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let state = self.state(py, "get_response_sender()")?;
        hooks::call(py, "_response_sender", (state.clone(),))
    }

    fn is_cancelled(&self, py: Python<'_>) -> PyResult<bool> {
        hooks::call(py, "_need_reader", ())?;
        Ok(self
            .state
            .as_ref()
            .is_some_and(|s| s.borrow(py).cancelled.load(Ordering::Acquire)))
    }

    fn set_release_flags(&self, py: Python<'_>, flags: &Bound<'_, PyAny>) -> PyResult<()> {
        let value = flags.extract::<u32>().ok().filter(|f| {
            !flags.is_instance_of::<PyBool>() && matches!(*f, RELEASE_ALL | RELEASE_RESCHEDULE)
        });
        let Some(value) = value else {
            return Err(model_error(
                py,
                format!(
                    "release flags must be TRITONSERVER_REQUEST_RELEASE_ALL or TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, got {}",
                    flags.repr()?
                ),
            ));
        };
        self.state(py, "set_release_flags()")?
            .borrow_mut()
            .release_flags = value;
        Ok(())
    }

    /// Runs this request on another model and blocks for the result (`decoupled=True`: a
    /// ResponseIterator).
    #[pyo3(signature = (decoupled=false))]
    fn exec<'py>(slf: Bound<'py, Self>, decoupled: bool) -> PyResult<Bound<'py, PyAny>> {
        hooks::call(slf.py(), "_request_exec", (slf.clone(), decoupled))
    }

    /// The awaitable form of `exec()`.
    #[pyo3(signature = (decoupled=false))]
    fn async_exec<'py>(slf: Bound<'py, Self>, decoupled: bool) -> PyResult<Bound<'py, PyAny>> {
        hooks::call(slf.py(), "_request_async_exec", (slf.clone(), decoupled))
    }
}

/// `value` as an int in `[low, high)`: an int or NumPy integer, not a bool.
fn check_int(
    py: Python<'_>,
    what: &str,
    value: &Bound<'_, PyAny>,
    low: i128,
    high: i128,
) -> PyResult<i128> {
    let number = if value.is_instance_of::<PyBool>() {
        None
    } else {
        value
            .extract::<i128>()
            .ok()
            .filter(|v| (low..high).contains(v))
    };
    number.ok_or_else(|| {
        model_error(
            py,
            format!(
                "InferenceRequest {what} must be an int in [{low}, {high}), got {}",
                value.repr().map(|r| r.to_string()).unwrap_or_default()
            ),
        )
    })
}

fn correlation(py: Python<'_>, value: &Bound<'_, PyAny>) -> PyResult<CorrelationValue> {
    if let Ok(s) = value.cast::<PyString>() {
        return Ok(CorrelationValue::Str(s.to_cow()?.into_owned()));
    }
    if value.is_instance_of::<PyBool>() {
        return Err(model_error(py, "Correlation ID must be integer or string"));
    }
    let Ok(number) = value.extract::<i128>() else {
        return Err(model_error(py, "Correlation ID must be integer or string"));
    };
    u64::try_from(number)
        .map(CorrelationValue::Int)
        .map_err(|_| {
            model_error(
                py,
                format!("Correlation ID must be an unsigned 64-bit integer, got {number}"),
            )
        })
}
