//! `pb_utils.Tensor`: a named tensor over a NumPy array, over a parent segment (inputs, BLS
//! outputs: the array is made on first use, a view without a copy), or on a GPU (`from_dlpack`
//! of CUDA memory; `triton_python_backend_utils` keeps the DLPack side in Python).

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};

use crate::hooks::{self, model_error};
use crate::segments::Lease;

/// Wire datatypes: (wire name, TRITONSERVER_DataType code, NumPy array-interface type string,
/// element size; 0 for BYTES).
const DATATYPES: [(&str, u32, &str, usize); 14] = [
    ("BOOL", 1, "|b1", 1),
    ("UINT8", 2, "|u1", 1),
    ("UINT16", 3, "<u2", 2),
    ("UINT32", 4, "<u4", 4),
    ("UINT64", 5, "<u8", 8),
    ("INT8", 6, "|i1", 1),
    ("INT16", 7, "<i2", 2),
    ("INT32", 8, "<i4", 4),
    ("INT64", 9, "<i8", 8),
    ("FP16", 10, "<f2", 2),
    ("FP32", 11, "<f4", 4),
    ("FP64", 12, "<f8", 8),
    ("BYTES", 13, "|O", 0),
    // NumPy has no bfloat16: the data is kept as raw little-endian uint16.
    ("BF16", 14, "<u2", 2),
];

/// The static wire name, its code, type string and element size.
pub fn datatype(wire: &str) -> Option<(&'static str, u32, &'static str, usize)> {
    DATATYPES.iter().copied().find(|d| d.0 == wire)
}

/// The wire name of a NumPy dtype, `None` when Triton has no such datatype.
fn wire_from_dtype(dtype: &Bound<'_, PyAny>) -> PyResult<Option<&'static str>> {
    let kind: String = dtype
        .getattr(pyo3::intern!(dtype.py(), "kind"))?
        .extract()?;
    if matches!(kind.as_str(), "O" | "S" | "U") {
        return Ok(Some("BYTES"));
    }
    let size: usize = dtype
        .getattr(pyo3::intern!(dtype.py(), "itemsize"))?
        .extract()?;
    let wire = match (kind.as_str(), size) {
        ("b", 1) => "BOOL",
        ("u", 1) => "UINT8",
        ("u", 2) => "UINT16",
        ("u", 4) => "UINT32",
        ("u", 8) => "UINT64",
        ("i", 1) => "INT8",
        ("i", 2) => "INT16",
        ("i", 4) => "INT32",
        ("i", 8) => "INT64",
        ("f", 2) => "FP16",
        ("f", 4) => "FP32",
        ("f", 8) => "FP64",
        _ => return Ok(None),
    };
    Ok(Some(wire))
}

/// Where a tensor's bytes are in a parent segment.
#[derive(Clone)]
pub struct SegmentSlice {
    pub lease: Arc<Lease>,
    pub offset: usize,
    pub nbytes: usize,
}

/// What NumPy sees of a parent segment's range (`__array_interface__`); the arrays made from
/// it keep it, and through it the segment's lease, alive.
#[pyclass(module = "nereid_stub_core", frozen)]
pub struct SegmentView {
    slice: SegmentSlice,
    shape: Vec<i64>,
    typestr: &'static str,
}

#[pymethods]
impl SegmentView {
    #[getter]
    fn __array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = PyDict::new(py);
        dict.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        dict.set_item("typestr", self.typestr)?;
        let address = self.slice.lease.mapping.at(self.slice.offset) as usize;
        dict.set_item("data", (address, !self.slice.lease.mapping.writable()))?;
        dict.set_item("version", 3)?;
        Ok(dict)
    }
}

/// `pb_utils.Tensor(name, array)`.
#[pyclass(module = "triton_python_backend_utils", name = "Tensor")]
pub struct Tensor {
    pub name: String,
    pub datatype: &'static str,
    pub shape: Vec<i64>,
    /// The host array, once there is one.
    array: Option<Py<PyAny>>,
    /// Data in a parent segment not yet wrapped as an array.
    slice: Option<SegmentSlice>,
    /// GPU memory (`nereid_dlpack.DeviceMemory`) of a `from_dlpack` tensor.
    device: Option<Py<PyAny>>,
}

impl Tensor {
    /// A tensor over a parent segment's range; `array` is given for BYTES (decoded at once).
    pub fn from_segment(
        name: String,
        datatype: &'static str,
        shape: Vec<i64>,
        slice: Option<SegmentSlice>,
        array: Option<Py<PyAny>>,
    ) -> Tensor {
        Tensor {
            name,
            datatype,
            shape,
            array,
            slice,
            device: None,
        }
    }

    /// The segment range of an input never turned into an array (sent on without NumPy).
    pub fn untouched_slice(&self) -> Option<&SegmentSlice> {
        if self.array.is_none() {
            self.slice.as_ref()
        } else {
            None
        }
    }

    /// The host array, made from the segment range (or empty, for a tensor without data) on
    /// first use; None only for a GPU tensor without a host copy.
    pub fn array<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        if self.array.is_none() && self.device.is_none() {
            let typestr = datatype(self.datatype).map_or("|u1", |d| d.2);
            let array = match &self.slice {
                Some(slice) if slice.nbytes > 0 => {
                    let view = SegmentView {
                        slice: slice.clone(),
                        shape: self.shape.clone(),
                        typestr,
                    };
                    hooks::numpy(py)?.call_method1("asarray", (Bound::new(py, view)?,))?
                }
                // No data: an empty tensor.
                _ => hooks::numpy(py)?.call_method1("empty", (self.shape.clone(), typestr))?,
            };
            self.array = Some(array.unbind());
        }
        Ok(self.array.as_ref().map(|a| a.bind(py).clone()))
    }

    /// The data in host memory: the array, or for a GPU tensor its host copy (made once).
    pub fn host_array<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if let Some(array) = self.array(py)? {
            return Ok(array);
        }
        let Some(device) = &self.device else {
            return Err(model_error(
                py,
                format!("tensor '{}' has no data", self.name),
            ));
        };
        let array = hooks::call(
            py,
            "_copy_to_host",
            (self.name.clone(), device.clone_ref(py)),
        )?;
        self.array = Some(array.clone().unbind());
        Ok(array)
    }

    fn shape_of(array: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
        array.getattr(pyo3::intern!(array.py(), "shape"))?.extract()
    }
}

#[pymethods]
impl Tensor {
    #[new]
    fn new(py: Python<'_>, name: &Bound<'_, PyAny>, array: &Bound<'_, PyAny>) -> PyResult<Tensor> {
        let Ok(name) = name.cast::<PyString>() else {
            return Err(model_error(
                py,
                format!("Tensor name must be a str, got {}", name.get_type().name()?),
            ));
        };
        let name = name.to_cow()?.into_owned();
        let numpy = hooks::numpy(py)?;
        if !array.is_instance(&numpy.getattr(pyo3::intern!(py, "ndarray"))?)? {
            return Err(model_error(
                py,
                format!(
                    "Tensor '{name}' expects a numpy.ndarray, got {}",
                    array.get_type().name()?
                ),
            ));
        }
        let dtype = array.getattr(pyo3::intern!(py, "dtype"))?;
        let Some(datatype) = wire_from_dtype(&dtype)? else {
            return Err(model_error(
                py,
                format!("Tensor '{name}' has NumPy dtype {dtype}, which has no Triton datatype"),
            ));
        };
        let contiguous: bool = array
            .getattr(pyo3::intern!(py, "flags"))?
            .getattr(pyo3::intern!(py, "c_contiguous"))?
            .extract()?;
        let array = if contiguous {
            array.clone()
        } else {
            let kwargs = PyDict::new(py);
            kwargs.set_item("order", "C")?;
            numpy.call_method("array", (array,), Some(&kwargs))?
        };
        Ok(Tensor {
            name,
            datatype,
            shape: Tensor::shape_of(&array)?,
            array: Some(array.unbind()),
            slice: None,
            device: None,
        })
    }

    /// A tensor over `array` as decoded data of wire type `datatype` (BF16 as raw uint16).
    #[staticmethod]
    fn _from_wire(name: String, datatype: &str, array: &Bound<'_, PyAny>) -> PyResult<Tensor> {
        let datatype = datatype_or_error(array.py(), datatype)?;
        Ok(Tensor {
            name,
            datatype,
            shape: Tensor::shape_of(array)?,
            array: Some(array.clone().unbind()),
            slice: None,
            device: None,
        })
    }

    /// A tensor in GPU memory (`nereid_dlpack.DeviceMemory`, which has `shape`).
    #[staticmethod]
    fn _from_device(name: String, datatype: &str, memory: &Bound<'_, PyAny>) -> PyResult<Tensor> {
        let datatype = datatype_or_error(memory.py(), datatype)?;
        Ok(Tensor {
            name,
            datatype,
            shape: Tensor::shape_of(memory)?,
            array: None,
            slice: None,
            device: Some(memory.clone().unbind()),
        })
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn shape(&self) -> Vec<i64> {
        self.shape.clone()
    }

    /// The TRITONSERVER_DataType code (11 for FP32, 13 for BYTES).
    fn triton_dtype(&self) -> u32 {
        datatype(self.datatype).map_or(0, |d| d.1)
    }

    fn is_cpu(&self) -> bool {
        self.device.is_none()
    }

    fn as_numpy<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        if self.device.is_some() {
            return Err(model_error(
                py,
                "Tensor is stored in GPU and cannot be converted to NumPy.",
            ));
        }
        if self.datatype == "BF16" {
            return Err(model_error(
                py,
                format!(
                    "tensor '{}' has datatype BF16, which has no NumPy type; as_numpy() is not available for it",
                    self.name
                ),
            ));
        }
        match self.array(py)? {
            Some(array) => Ok(array),
            None => Err(model_error(
                py,
                format!("tensor '{}' has no data", self.name),
            )),
        }
    }

    fn _host_array<'py>(&mut self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.host_array(py)
    }

    #[getter(_name)]
    fn private_name(&self) -> &str {
        &self.name
    }

    #[getter(_datatype)]
    fn private_datatype(&self) -> &'static str {
        self.datatype
    }

    #[getter(_array)]
    fn private_array<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        self.array(py)
    }

    #[getter(_device)]
    fn private_device<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>> {
        self.device.as_ref().map(|d| d.bind(py).clone())
    }

    fn to_dlpack<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        hooks::call(
            slf.py(),
            "_tensor_dlpack",
            (slf.clone(), PyDict::new(slf.py())),
        )
    }

    #[pyo3(signature = (stream=None, **kwargs))]
    fn __dlpack__<'py>(
        slf: Bound<'py, Self>,
        stream: Option<Bound<'py, PyAny>>,
        kwargs: Option<Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let kwargs = kwargs.unwrap_or_else(|| PyDict::new(py));
        if let Some(stream) = stream {
            kwargs.set_item("stream", stream)?;
        }
        hooks::call(py, "_tensor_dlpack", (slf.clone(), kwargs))
    }

    fn __dlpack_device__<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        hooks::call(slf.py(), "_tensor_dlpack_device", (slf.clone(),))
    }

    #[staticmethod]
    fn from_dlpack<'py>(
        name: Bound<'py, PyAny>,
        dlpack_object: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        hooks::call(name.py(), "_tensor_from_dlpack", (name, dlpack_object))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let device = match &self.device {
            None => String::new(),
            Some(d) => {
                let id = d
                    .bind(py)
                    .getattr("device_id")
                    .map(|v| v.to_string())
                    .unwrap_or_default();
                format!(", device=GPU {id}")
            }
        };
        format!(
            "Tensor(name={}, datatype={}, shape={:?}{device})",
            PyString::new(py, &self.name)
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_default(),
            self.datatype,
            self.shape
        )
    }
}

fn datatype_or_error(py: Python<'_>, wire: &str) -> PyResult<&'static str> {
    datatype(wire)
        .map(|d| d.0)
        .ok_or_else(|| model_error(py, format!("unknown Triton datatype {wire:?}")))
}

/// A list of tensors from a list or tuple of `Tensor` (`what` names it in errors).
pub fn tensor_list<'py>(tensors: &Bound<'py, PyAny>, what: &str) -> PyResult<Bound<'py, PyList>> {
    let py = tensors.py();
    if !(tensors.is_instance_of::<PyList>() || tensors.is_instance_of::<PyTuple>()) {
        return Err(model_error(
            py,
            format!(
                "{what} must be a list of pb_utils.Tensor, got {}",
                tensors.get_type().name()?
            ),
        ));
    }
    let list = PyList::empty(py);
    for tensor in tensors.try_iter()? {
        let tensor = tensor?;
        if !tensor.is_instance_of::<Tensor>() {
            return Err(model_error(
                py,
                format!(
                    "{what} must contain pb_utils.Tensor objects, found {}",
                    tensor.get_type().name()?
                ),
            ));
        }
        list.append(tensor)?;
    }
    Ok(list)
}
