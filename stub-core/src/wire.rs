//! Between the compiled `pb_utils` objects and the protocol's messages: tensors from a parent
//! segment ([`decode_tensors`]), tensors into a stub segment ([`Outgoing`]), errors both ways.
#![allow(unsafe_code)]

use std::sync::Arc;

use nereid_stub_protocol::message::{ErrorCode, ErrorObject, ResponseObject, TensorRef};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::hooks;
use crate::response::InferenceResponse;
use crate::segments::{Lease, ParentSegments, StubSegments, align};
use crate::tensor::{SegmentSlice, Tensor, datatype};

/// A message the server sent that the protocol does not allow (its text is what the stub
/// reports).
pub type Invalid = String;

/// The tensors `refs` point to in `segment`, all over one lease.
pub fn decode_tensors<'py>(
    py: Python<'py>,
    parents: &mut ParentSegments,
    segment: Option<&str>,
    refs: &[&TensorRef],
) -> Result<Vec<Tensor>, Invalid> {
    let mut end = 0usize;
    let mut checked = Vec::with_capacity(refs.len());
    for r in refs {
        match check_ref(r) {
            Ok(c) => {
                if c.nbytes > 0 {
                    end = end.max(c.offset + c.nbytes);
                }
                checked.push(c);
            }
            Err(e) => {
                parents.release_unused(segment);
                return Err(e);
            }
        }
    }
    let lease = parents.lease(segment, end)?;
    checked
        .into_iter()
        .map(|c| tensor_from(py, c, lease.as_ref()))
        .collect()
}

struct Checked<'a> {
    tensor: &'a TensorRef,
    datatype: &'static str,
    offset: usize,
    nbytes: usize,
    count: usize,
}

fn check_ref(r: &TensorRef) -> Result<Checked<'_>, Invalid> {
    let Some((wire, _, _, size)) = datatype(&r.datatype) else {
        return Err(format!(
            "tensor '{}' has unknown datatype '{}'",
            r.name, r.datatype
        ));
    };
    let mut count = 1usize;
    for &dim in &r.shape {
        let dim = usize::try_from(dim)
            .map_err(|_| format!("tensor '{}' has invalid shape {:?}", r.name, r.shape))?;
        count = count
            .checked_mul(dim)
            .ok_or_else(|| format!("tensor '{}' has invalid shape {:?}", r.name, r.shape))?;
    }
    let (offset, nbytes) = (r.offset as usize, r.nbytes as usize);
    if offset.checked_add(nbytes).is_none() {
        return Err(format!(
            "tensor '{}' has invalid offset/nbytes {}/{}",
            r.name, r.offset, r.nbytes
        ));
    }
    if wire != "BYTES" && count.checked_mul(size) != Some(nbytes) {
        return Err(format!(
            "tensor '{}' ({} {:?}) needs {} bytes, the reference says {}",
            r.name,
            wire,
            r.shape,
            count.saturating_mul(size),
            nbytes
        ));
    }
    Ok(Checked {
        tensor: r,
        datatype: wire,
        offset,
        nbytes,
        count,
    })
}

fn tensor_from(
    py: Python<'_>,
    c: Checked<'_>,
    lease: Option<&Arc<Lease>>,
) -> Result<Tensor, Invalid> {
    let slice = match (lease, c.nbytes) {
        (Some(lease), n) if n > 0 => Some(SegmentSlice {
            lease: lease.clone(),
            offset: c.offset,
            nbytes: c.nbytes,
        }),
        _ => None,
    };
    let name = c.tensor.name.clone();
    let shape = c.tensor.shape.clone();
    if c.datatype != "BYTES" {
        return Ok(Tensor::from_segment(name, c.datatype, shape, slice, None));
    }
    let bytes = match &slice {
        Some(s) => {
            // SAFETY: the range was checked against the mapped size when the lease was taken;
            // the lease keeps the mapping alive for the copy.
            let data = unsafe {
                std::slice::from_raw_parts(s.lease.mapping.at(s.offset) as *const u8, s.nbytes)
            };
            PyBytes::new(py, data)
        }
        None => PyBytes::new(py, b""),
    };
    let decode = || -> PyResult<Bound<'_, PyAny>> {
        let array = hooks::call(py, "deserialize_bytes_tensor", (bytes,))?;
        let size: usize = array.getattr("size")?.extract()?;
        if size != c.count {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "BYTES tensor '{}' of shape {:?} holds {} elements",
                c.tensor.name, c.tensor.shape, size
            )));
        }
        array.call_method1("reshape", (c.tensor.shape.clone(),))
    };
    let array = decode().map_err(|e| e.value(py).to_string())?;
    Ok(Tensor::from_segment(
        name,
        "BYTES",
        shape,
        None,
        Some(array.unbind()),
    ))
}

/// One tensor's bytes on the way into a stub segment, with what keeps them alive.
struct Payload<'py> {
    ptr: *const u8,
    len: usize,
    _keep: Keep<'py>,
}

#[allow(dead_code)] // the variants only hold what the pointer points into alive
enum Keep<'py> {
    Object(Bound<'py, PyAny>),
    Lease(Arc<Lease>),
}

fn payload<'py>(py: Python<'py>, tensor: &mut Tensor) -> PyResult<Payload<'py>> {
    if tensor.datatype == "BYTES" {
        let array = tensor.host_array(py)?;
        let bytes = hooks::call(py, "_serialize_bytes", (array,))?;
        let data = bytes.cast::<PyBytes>()?.as_bytes();
        let (ptr, len) = (data.as_ptr(), data.len());
        return Ok(Payload {
            ptr,
            len,
            _keep: Keep::Object(bytes),
        });
    }
    if let Some(slice) = tensor.untouched_slice() {
        return Ok(Payload {
            ptr: slice.lease.mapping.at(slice.offset),
            len: slice.nbytes,
            _keep: Keep::Lease(slice.lease.clone()),
        });
    }
    let mut array = tensor.host_array(py)?;
    let mut interface = array.getattr(pyo3::intern!(py, "__array_interface__"))?;
    let typestr: String = interface.get_item("typestr")?.extract()?;
    if !interface.get_item("strides")?.is_none() || typestr.starts_with('>') {
        let little = array
            .getattr("dtype")?
            .call_method1("newbyteorder", ("<",))?;
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("dtype", little)?;
        array = hooks::numpy(py)?.call_method("ascontiguousarray", (array,), Some(&kwargs))?;
        interface = array.getattr(pyo3::intern!(py, "__array_interface__"))?;
    }
    let (address, _readonly): (usize, bool) = interface.get_item("data")?.extract()?;
    let len: usize = array.getattr(pyo3::intern!(py, "nbytes"))?.extract()?;
    Ok(Payload {
        ptr: address as *const u8,
        len,
        _keep: Keep::Object(array),
    })
}

/// Tensors of one outgoing message, written into one stub segment.
#[derive(Default)]
pub struct Outgoing<'py> {
    refs: Vec<TensorRef>,
    payloads: Vec<Payload<'py>>,
    end: usize,
}

impl<'py> Outgoing<'py> {
    /// Adds `tensor`; returns its reference's index.
    pub fn add(&mut self, py: Python<'py>, tensor: &Bound<'py, Tensor>) -> PyResult<usize> {
        let mut t = tensor.borrow_mut();
        let payload = payload(py, &mut t)?;
        let offset = if payload.len > 0 { align(self.end) } else { 0 };
        if payload.len > 0 {
            self.end = offset + payload.len;
        }
        self.refs.push(TensorRef {
            name: t.name.clone(),
            datatype: t.datatype.to_owned(),
            shape: t.shape.clone(),
            offset: offset as u64,
            nbytes: payload.len as u64,
        });
        self.payloads.push(payload);
        Ok(self.refs.len() - 1)
    }

    /// Writes the data; returns the segment (None when there is no data) and the references.
    pub fn write(
        self,
        py: Python<'_>,
        segments: &StubSegments,
    ) -> PyResult<(Option<String>, Vec<TensorRef>)> {
        if self.end == 0 {
            return Ok((None, self.refs));
        }
        let segment = segments
            .acquire(self.end)
            .map_err(|e| hooks::model_error(py, e))?;
        for (payload, r) in self.payloads.iter().zip(&self.refs) {
            if payload.len > 0 {
                // SAFETY: `payload` keeps the object (array, bytes, lease) whose memory `ptr`
                // points to alive, and the GIL is held, so it is neither freed nor resized.
                unsafe { segment.write(r.offset as usize, payload.ptr, payload.len) };
            }
        }
        Ok((Some(segment.id), self.refs))
    }
}

/// `pb_utils.TritonError` → the protocol's error.
pub fn error_object(error: &Bound<'_, PyAny>) -> PyResult<ErrorObject> {
    let py = error.py();
    let message: String = error.call_method0("message")?.extract()?;
    let code = error.call_method0("code")?;
    let name = hooks::pb_utils(py)?
        .getattr("_ERROR_CODE_NAMES")?
        .call_method1("get", (code, "UNKNOWN"))?
        .extract::<String>()?;
    let code: ErrorCode =
        serde_json::from_value(serde_json::Value::String(name)).unwrap_or(ErrorCode::Unknown);
    Ok(ErrorObject { message, code })
}

/// The protocol's error → `pb_utils.TritonError`.
pub fn triton_error<'py>(py: Python<'py>, error: &ErrorObject) -> PyResult<Bound<'py, PyAny>> {
    let pb = hooks::pb_utils(py)?;
    let name = serde_json::to_value(error.code)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "UNKNOWN".into());
    let code = pb.getattr("_ERROR_CODES_BY_NAME")?.call_method1(
        "get",
        (name, pb.getattr("TritonError")?.getattr("UNKNOWN")?),
    )?;
    pb.getattr("TritonError")?
        .call1((error.message.clone(), code))
}

/// A response from the server (BLS) as an `InferenceResponse`.
pub fn decode_response<'py>(
    py: Python<'py>,
    parents: &mut ParentSegments,
    response: &ResponseObject,
    segment: Option<&str>,
) -> Result<InferenceResponse, Invalid> {
    let refs: Vec<&TensorRef> = response.outputs.iter().collect();
    let tensors = decode_tensors(py, parents, segment, &refs)?;
    let build = || -> PyResult<InferenceResponse> {
        let list = PyList::empty(py);
        for t in tensors {
            list.append(Bound::new(py, t)?)?;
        }
        let error = match &response.error {
            Some(e) => Some(triton_error(py, e)?.unbind()),
            None => None,
        };
        Ok(InferenceResponse::from_wire(
            list,
            error,
            response.parameters.clone(),
        ))
    };
    build().map_err(|e| e.value(py).to_string())
}

/// The wire form of `response` for a request that asked for `requested` outputs (all when
/// empty); its outputs are added to `out`. A response with an error carries no outputs.
pub fn encode_response<'py>(
    py: Python<'py>,
    response: &Bound<'py, InferenceResponse>,
    requested: &[String],
    out: &mut Outgoing<'py>,
) -> PyResult<(ResponseObject, Vec<usize>)> {
    let r = response.borrow();
    let error = match &r.error {
        Some(e) => Some(error_object(e.bind(py))?),
        None => None,
    };
    let mut indexes = Vec::new();
    if error.is_none() {
        for tensor in r.outputs.bind(py).iter() {
            let tensor = tensor.cast_into::<Tensor>().map_err(|e| {
                hooks::model_error(
                    py,
                    format!(
                        "InferenceResponse output_tensors must contain pb_utils.Tensor objects, found {}",
                        e.into_inner().get_type().name().map(|n| n.to_string()).unwrap_or_default()
                    ),
                )
            })?;
            if !requested.is_empty() && !requested.iter().any(|n| *n == tensor.borrow().name) {
                continue;
            }
            indexes.push(out.add(py, &tensor)?);
        }
    }
    Ok((
        ResponseObject {
            outputs: Vec::new(),
            error,
            parameters: r.parameters.clone(),
        },
        indexes,
    ))
}
