//! `pb_utils.InferenceResponse(output_tensors=None, error=None, parameters=None)`.

use pyo3::prelude::*;
use pyo3::types::PyList;
use serde_json::{Map, Value};

use crate::convert::{parameters_from_py, parameters_json};
use crate::hooks::{self, model_error};
use crate::tensor::tensor_list;

#[pyclass(module = "triton_python_backend_utils", name = "InferenceResponse")]
pub struct InferenceResponse {
    pub outputs: Py<PyList>,
    /// A `pb_utils.TritonError`, or None.
    pub error: Option<Py<PyAny>>,
    pub parameters: Map<String, Value>,
}

impl InferenceResponse {
    /// A response decoded from the server (a BLS response).
    pub fn from_wire(
        outputs: Bound<'_, PyList>,
        error: Option<Py<PyAny>>,
        parameters: Map<String, Value>,
    ) -> Self {
        InferenceResponse {
            outputs: outputs.unbind(),
            error,
            parameters,
        }
    }
}

#[pymethods]
impl InferenceResponse {
    #[new]
    #[pyo3(signature = (output_tensors=None, error=None, parameters=None))]
    fn new(
        py: Python<'_>,
        output_tensors: Option<&Bound<'_, PyAny>>,
        error: Option<&Bound<'_, PyAny>>,
        parameters: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let error = match error.filter(|e| !e.is_none()) {
            None => None,
            Some(error) => {
                let class = hooks::pb_utils(py)?.getattr("TritonError")?;
                if !error.is_instance(&class)? {
                    return Err(model_error(
                        py,
                        format!(
                            "InferenceResponse error must be a pb_utils.TritonError or None, got {}",
                            error.get_type().name()?
                        ),
                    ));
                }
                Some(error.clone().unbind())
            }
        };
        let outputs = match output_tensors.filter(|o| !o.is_none()) {
            None => PyList::empty(py),
            Some(tensors) => tensor_list(tensors, "InferenceResponse output_tensors")?,
        };
        Ok(InferenceResponse {
            outputs: outputs.unbind(),
            error,
            parameters: parameters_from_py(py, parameters, "InferenceResponse")?,
        })
    }

    fn output_tensors<'py>(&self, py: Python<'py>) -> Bound<'py, PyList> {
        self.outputs.bind(py).clone()
    }

    fn has_error(&self) -> bool {
        self.error.is_some()
    }

    fn error<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        self.error.as_ref().map(|e| e.bind(py).clone())
    }

    /// The parameters as a JSON object string.
    fn parameters(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        parameters_json(py, &self.parameters)
    }
}
