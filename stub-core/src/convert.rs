//! JSON values (the protocol's parameters and rare control messages) to and from Python objects.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Map, Number, Value};

use crate::hooks::model_error;

/// `value` as a Python object (object → dict, array → list).
pub fn to_py<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match value {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                i.into_pyobject(py)?.into_any()
            } else if let Some(u) = n.as_u64() {
                u.into_pyobject(py)?.into_any()
            } else {
                n.as_f64().unwrap_or(f64::NAN).into_pyobject(py)?.into_any()
            }
        }
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => map_to_py(py, map)?.into_any(),
    })
}

/// An object's fields as a dict.
pub fn map_to_py<'py>(py: Python<'py>, map: &Map<String, Value>) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    for (key, value) in map {
        dict.set_item(key, to_py(py, value)?)?;
    }
    Ok(dict)
}

/// A Python value made of None, bool, int, float, str, list/tuple and str-keyed dicts as JSON.
pub fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    if obj.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        if let Ok(i) = obj.extract::<i64>() {
            return Ok(Value::from(i));
        }
        return Ok(Value::from(obj.extract::<u64>()?));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Number::from_f64(f.value())
            .map(Value::Number)
            .ok_or_else(|| PyValueError::new_err("a non-finite float cannot be sent as JSON"));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::String(s.to_cow()?.into_owned()));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut map = Map::new();
        for (key, value) in d.iter() {
            let key = key
                .cast::<PyString>()
                .map_err(|_| PyValueError::new_err("JSON object keys must be str"))?;
            map.insert(key.to_cow()?.into_owned(), from_py(&value)?);
        }
        return Ok(Value::Object(map));
    }
    if obj.is_instance_of::<PyList>() || obj.is_instance_of::<PyTuple>() {
        return obj
            .try_iter()?
            .map(|item| from_py(&item?))
            .collect::<PyResult<Vec<_>>>()
            .map(Value::Array);
    }
    Err(PyValueError::new_err(format!(
        "{} cannot be sent as JSON",
        obj.get_type().name()?
    )))
}

/// Request or response parameters a model gives: None, a dict, or a JSON object string, whose
/// values are bool, int or str (`owner` names the object in errors).
pub fn parameters_from_py(
    py: Python<'_>,
    parameters: Option<&Bound<'_, PyAny>>,
    owner: &str,
) -> PyResult<Map<String, Value>> {
    let Some(parameters) = parameters.filter(|p| !p.is_none()) else {
        return Ok(Map::new());
    };
    let parameters = if let Ok(text) = parameters.cast::<PyString>() {
        let text = text.to_cow()?;
        if text.is_empty() {
            return Ok(Map::new());
        }
        py.import("json")?
            .call_method1("loads", (text,))
            .map_err(|e| model_error(py, format!("{owner} parameters are not valid JSON: {e}")))?
    } else {
        parameters.clone()
    };
    let Ok(dict) = parameters.cast::<PyDict>() else {
        return Err(model_error(
            py,
            format!(
                "{owner} parameters must be a dict or a JSON object string, got {}",
                parameters.get_type().name()?
            ),
        ));
    };
    let mut map = Map::new();
    for (key, value) in dict.iter() {
        let Ok(key) = key.cast::<PyString>() else {
            return Err(model_error(
                py,
                format!(
                    "{owner} parameter keys must be str, found {}",
                    key.get_type().name()?
                ),
            ));
        };
        let key = key.to_cow()?.into_owned();
        let allowed = value.is_instance_of::<PyBool>()
            || value.is_instance_of::<PyInt>()
            || value.is_instance_of::<PyString>();
        if !allowed {
            return Err(model_error(
                py,
                format!(
                    "{owner} parameter '{key}' must be bool, int or str, found {}",
                    value.get_type().name()?
                ),
            ));
        }
        map.insert(key, from_py(&value)?);
    }
    Ok(map)
}

/// Parameters as the JSON string `parameters()` returns (Python's `json.dumps` of the dict).
pub fn parameters_json(py: Python<'_>, map: &Map<String, Value>) -> PyResult<Py<PyAny>> {
    Ok(py
        .import("json")?
        .call_method1("dumps", (map_to_py(py, map)?,))?
        .unbind())
}
