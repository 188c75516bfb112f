//! FP32 and INT32 tensors from values and back, as nearly every inference test builds them.

use bytes::Bytes;
use nereid_proto::{DataType, Tensor};

/// An FP32 tensor named `name` of `shape` holding `values` (little-endian, as on the wire).
/// Panics when `values` does not fill `shape`: the test itself is wrong.
pub fn fp32(name: &str, shape: Vec<i64>, values: &[f32]) -> Tensor {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    match Tensor::new(name, DataType::Fp32, shape, Bytes::from(data)) {
        Ok(t) => t,
        Err(e) => panic!("test tensor '{name}': {e}"),
    }
}

/// An FP32 tensor named `name` of `shape`, all zeros: for tests about shapes, not values.
pub fn fp32_zeros(name: &str, shape: Vec<i64>) -> Tensor {
    let n: i64 = shape.iter().product();
    fp32(name, shape, &vec![0.0; usize::try_from(n).unwrap_or(0)])
}

/// A 1-D FP32 tensor of `values`.
pub fn fp32_1d(name: &str, values: &[f32]) -> Tensor {
    fp32(name, vec![values.len() as i64], values)
}

/// The values of an FP32 tensor.
pub fn floats(t: &Tensor) -> Vec<f32> {
    assert_eq!(
        t.datatype(),
        DataType::Fp32,
        "tensor '{}' is not FP32",
        t.name()
    );
    t.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A 1-D INT32 tensor of `values` (little-endian, as on the wire).
pub fn int32_1d(name: &str, values: &[i32]) -> Tensor {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    match Tensor::new(
        name,
        DataType::Int32,
        vec![values.len() as i64],
        Bytes::from(data),
    ) {
        Ok(t) => t,
        Err(e) => panic!("test tensor '{name}': {e}"),
    }
}

/// The values of an INT32 tensor.
pub fn ints(t: &Tensor) -> Vec<i32> {
    assert_eq!(
        t.datatype(),
        DataType::Int32,
        "tensor '{}' is not INT32",
        t.name()
    );
    t.data()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let t = fp32("x", vec![2, 2], &[1.0, -2.5, 0.0, 7.25]);
        assert_eq!(t.shape(), &[2, 2]);
        assert_eq!(floats(&t), [1.0, -2.5, 0.0, 7.25]);
        assert_eq!(fp32_1d("y", &[3.0]).shape(), &[1]);
        let i = int32_1d("z", &[4, -5]);
        assert_eq!(i.shape(), &[2]);
        assert_eq!(ints(&i), [4, -5]);
    }
}
