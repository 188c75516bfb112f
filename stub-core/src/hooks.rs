//! What the compiled classes need from Python: `triton_python_backend_utils` (its exception
//! and error classes, and the helpers that stay in Python: DLPack, BLS calls, response senders,
//! BYTES serialization) and NumPy. `pb_utils` calls [`install`] with itself once it has defined
//! them; before that, only the plain accessors work.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;
use std::sync::Mutex;

/// The module the hooks live in; installing again (a test loading a second copy) replaces it.
static PB_UTILS: Mutex<Option<Py<PyModule>>> = Mutex::new(None);
static NUMPY: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// `nereid_stub_core.install(pb_utils)`: the module the compiled classes call back into.
#[pyfunction]
pub fn install(module: Bound<'_, PyModule>) {
    *PB_UTILS.lock().unwrap_or_else(|e| e.into_inner()) = Some(module.unbind());
}

/// The installed `triton_python_backend_utils`.
pub fn pb_utils(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    let installed = PB_UTILS.lock().unwrap_or_else(|e| e.into_inner());
    installed
        .as_ref()
        .map(|m| m.bind(py).clone())
        .ok_or_else(|| {
            PyRuntimeError::new_err(
                "nereid_stub_core is used before triton_python_backend_utils installed itself",
            )
        })
}

/// The `numpy` module, imported once.
pub fn numpy(py: Python<'_>) -> PyResult<&Bound<'_, PyModule>> {
    NUMPY
        .get_or_try_init(py, || Ok::<_, PyErr>(py.import("numpy")?.unbind()))
        .map(|m| m.bind(py))
}

/// Calls `pb_utils.<name>(*args)`.
pub fn call<'py>(
    py: Python<'py>,
    name: &str,
    args: impl pyo3::call::PyCallArgs<'py>,
) -> PyResult<Bound<'py, PyAny>> {
    pb_utils(py)?.getattr(name)?.call1(args)
}

/// A `pb_utils.TritonModelException` with `message`, what model code catches.
pub fn model_error(py: Python<'_>, message: impl Into<String>) -> PyErr {
    let message = message.into();
    match pb_utils(py).and_then(|m| m.getattr("TritonModelException")) {
        Ok(class) => PyErr::from_value(match class.call1((message.clone(),)) {
            Ok(exception) => exception,
            Err(e) => return e,
        }),
        Err(_) => PyRuntimeError::new_err(message),
    }
}
