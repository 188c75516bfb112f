//! Borrowed input buffers → libtorch tensors, and libtorch results → the server's output
//! buffers, by the element types of the ABI.
//!
//! ```text
//!  input bytes (LE, borrowed) ──length check──► tch::Tensor::f_from_data_size (copies) ──► .to(device)
//!  tch::Tensor ──f_copy_data_u8 (to CPU, contiguous)──► the server's buffer (sink.buffer)
//!  BYTES ◄──► List[str]   (Triton's convention: a flat list of UTF-8 strings, no NUL bytes)
//! ```
//! libtorch keeps elements in native byte order, which is the wire's little-endian on every
//! target this builds for (checked at compile time below).

use nereid_torch_abi::{ElementType, Status, bytes_elements, bytes_len, put_bytes_element};
use tch::{Device, Kind};

use crate::Fail;

#[cfg(target_endian = "big")]
compile_error!("the PyTorch backend copies tensors byte for byte and needs a little-endian target");

/// Where a requested output's bytes go: a buffer of exactly `len` bytes for output `slot`.
pub(crate) trait OutputSink {
    fn buffer(
        &mut self,
        slot: usize,
        dtype: ElementType,
        shape: &[i64],
        len: usize,
    ) -> Option<&mut [u8]>;
}

/// The libtorch element type of an ABI element type; `None` for `BYTES`, which travels as a
/// `List[str]` instead.
pub(crate) fn kind_of(t: ElementType) -> Option<Kind> {
    Some(match t {
        ElementType::Bool => Kind::Bool,
        ElementType::Uint8 => Kind::Uint8,
        ElementType::Int8 => Kind::Int8,
        ElementType::Int16 => Kind::Int16,
        ElementType::Int32 => Kind::Int,
        ElementType::Int64 => Kind::Int64,
        ElementType::Fp16 => Kind::Half,
        ElementType::Fp32 => Kind::Float,
        ElementType::Fp64 => Kind::Double,
        ElementType::Bf16 => Kind::BFloat16,
        ElementType::Bytes => return None,
    })
}

/// The ABI element type of a libtorch element type, if there is one.
pub(crate) fn element_of(kind: Kind) -> Option<ElementType> {
    ElementType::ALL
        .into_iter()
        .find(|&t| kind_of(t) == Some(kind))
}

/// Copies an input's bytes into a libtorch tensor on `device`, shaped `shape`.
pub(crate) fn to_torch(
    name: &str,
    dtype: ElementType,
    shape: &[i64],
    data: &[u8],
    device: Device,
) -> Result<tch::Tensor, Fail> {
    let kind = kind_of(dtype).ok_or_else(|| {
        Fail::new(
            Status::Unsupported,
            format!(
                "input '{name}': datatype {} has no libtorch equivalent",
                dtype.name()
            ),
        )
    })?;
    let elements: usize = shape
        .iter()
        .map(|&d| usize::try_from(d).ok())
        .product::<Option<usize>>()
        .ok_or_else(|| Fail::invalid(format!("input '{name}': negative dimension")))?;
    // f_from_data_size reads elements × size bytes without checking; never let it over-read.
    if Some(data.len()) != elements.checked_mul(kind.elt_size_in_bytes()) {
        return Err(Fail::invalid(format!(
            "input '{name}': {} bytes of data do not match shape {shape:?} of {}",
            data.len(),
            dtype.name()
        )));
    }
    let cpu = tch::Tensor::f_from_data_size(data, shape, kind)
        .map_err(|e| Fail::invalid(format!("input '{name}': {e}")))?;
    if device == Device::Cpu {
        return Ok(cpu);
    }
    cpu.f_to_device(device).map_err(|e| {
        Fail::new(
            Status::Execution,
            format!("input '{name}': copy to {device:?}: {e}"),
        )
    })
}

/// A `BYTES` input as the `List[str]` libtorch takes: its elements in row-major order, each
/// UTF-8 text without NUL bytes (libtorch copies them as C strings).
pub(crate) fn to_strings(name: &str, data: &[u8]) -> Result<Vec<String>, Fail> {
    let elements = bytes_elements(data).ok_or_else(|| {
        Fail::invalid(format!(
            "input '{name}': BYTES data is truncated (each element is a 4-byte length, then the bytes)"
        ))
    })?;
    elements
        .into_iter()
        .enumerate()
        .map(|(i, element)| match std::str::from_utf8(element) {
            Ok(text) if !text.contains('\0') => Ok(text.to_string()),
            _ => Err(Fail::invalid(format!(
                "input '{name}': element {i} is not UTF-8 text without NUL bytes, which a TorchScript List[str] needs"
            ))),
        })
        .collect()
}

fn no_buffer(name: &str) -> Fail {
    Fail::new(
        Status::Execution,
        format!("output '{name}': the server could not provide a buffer"),
    )
}

/// A returned `List[str]` as `BYTES` output `slot`, shaped `[n]`.
pub(crate) fn write_strings(
    sink: &mut dyn OutputSink,
    slot: usize,
    name: &str,
    strings: &[String],
) -> Result<(), Fail> {
    let len = bytes_len(strings.iter().map(|s| s.as_bytes()));
    let shape = [strings.len() as i64];
    let buffer = sink
        .buffer(slot, ElementType::Bytes, &shape, len)
        .ok_or_else(|| no_buffer(name))?;
    let mut at = 0;
    for s in strings {
        at = put_bytes_element(buffer, at, s.as_bytes());
    }
    Ok(())
}

/// Copies a libtorch tensor (any device, any layout) into output `slot`: one copy, straight
/// into the server's buffer.
pub(crate) fn write_tensor(
    sink: &mut dyn OutputSink,
    slot: usize,
    name: &str,
    value: &tch::Tensor,
) -> Result<(), Fail> {
    let execution = |message: String| Fail::new(Status::Execution, message);
    let kind = value
        .f_kind()
        .map_err(|e| execution(format!("output '{name}': {e}")))?;
    let dtype = element_of(kind).ok_or_else(|| {
        execution(format!(
            "output '{name}': the model returned a {kind:?} tensor, which has no Triton datatype"
        ))
    })?;
    let shape = value.size();
    let numel = value.numel();
    let buffer = sink
        .buffer(slot, dtype, &shape, numel * kind.elt_size_in_bytes())
        .ok_or_else(|| no_buffer(name))?;
    value
        .f_copy_data_u8(buffer, numel)
        .map_err(|e| execution(format!("output '{name}': {e}")))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Buffers kept by slot, as the server keeps them.
    #[derive(Default)]
    pub(crate) struct Collected(pub Vec<(usize, ElementType, Vec<i64>, Vec<u8>)>);

    impl OutputSink for Collected {
        fn buffer(
            &mut self,
            slot: usize,
            dtype: ElementType,
            shape: &[i64],
            len: usize,
        ) -> Option<&mut [u8]> {
            self.0.push((slot, dtype, shape.to_vec(), vec![0; len]));
            self.0.last_mut().map(|o| o.3.as_mut_slice())
        }
    }

    #[test]
    fn every_shared_datatype_round_trips() {
        for dtype in ElementType::ALL {
            let Some(kind) = kind_of(dtype) else {
                assert_eq!(dtype, ElementType::Bytes);
                continue;
            };
            assert_eq!(element_of(kind), Some(dtype));
            let size = kind.elt_size_in_bytes();
            let data: Vec<u8> = (0..(size * 6) as u8).map(|b| b % 2).collect();
            let torch = to_torch("x", dtype, &[2, 3], &data, Device::Cpu).unwrap();
            assert_eq!(torch.size(), [2, 3]);
            let mut sink = Collected::default();
            write_tensor(&mut sink, 0, "y", &torch).unwrap();
            let (_, back, shape, bytes) = &sink.0[0];
            assert_eq!((*back, shape.as_slice()), (dtype, &[2i64, 3][..]));
            assert_eq!(bytes, &data, "{dtype:?}");
        }
    }

    #[test]
    fn data_that_does_not_fill_the_shape_is_refused() {
        let e = to_torch("x", ElementType::Fp32, &[3], &[0u8; 8], Device::Cpu).unwrap_err();
        assert_eq!(
            e.message,
            "input 'x': 8 bytes of data do not match shape [3] of FP32"
        );
        assert_eq!(e.status, Status::InvalidInput);
    }

    #[test]
    fn bytes_travel_as_strings() {
        let items = ["a", "ünï", ""];
        let mut data = vec![0u8; bytes_len(items.iter().map(|s| s.as_bytes()))];
        let mut at = 0;
        for s in items {
            at = put_bytes_element(&mut data, at, s.as_bytes());
        }
        let strings = to_strings("w", &data).unwrap();
        assert_eq!(strings, items);
        let mut sink = Collected::default();
        write_strings(&mut sink, 0, "w", &strings).unwrap();
        assert_eq!(sink.0[0].3, data);
        assert_eq!(sink.0[0].2, [3]);

        let mut bad = vec![0u8; 4 + 2 + 4 + 10];
        let at = put_bytes_element(&mut bad, 0, b"ok");
        put_bytes_element(&mut bad, at, b"nul\0inside");
        assert_eq!(
            to_strings("w", &bad).unwrap_err().message,
            "input 'w': element 1 is not UTF-8 text without NUL bytes, which a TorchScript List[str] needs"
        );
    }

    #[test]
    fn non_contiguous_outputs_are_copied_in_row_major_order() {
        let t = tch::Tensor::from_slice(&[1f32, 2., 3., 4., 5., 6.])
            .reshape([2, 3])
            .transpose(0, 1);
        let mut sink = Collected::default();
        write_tensor(&mut sink, 0, "t", &t).unwrap();
        let (_, _, shape, bytes) = &sink.0[0];
        assert_eq!(shape, &[3, 2]);
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(values, [1., 4., 2., 5., 3., 6.]);
    }
}
