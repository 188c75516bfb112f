//! [`InferResponse`] → HTTP response: a JSON header, then the binary outputs.
//!
//! ```text
//! {"id"?, "model_name", "model_version", "parameters"?, "outputs":[{name, datatype, shape,
//!    data: [...flat...]  |  parameters: {binary_data_size: N}  |  nothing}]}
//!  [output bytes, in order]
//! ```
//! An output written to client shared memory is listed with neither data nor parameters, as
//! Triton 2.51 sends it (Triton's C++ client, perf_analyzer's, reads any output `parameters` as
//! binary data).
//! With any binary output the body is `application/octet-stream`, the JSON length goes in
//! `Inference-Header-Content-Length`, and the body is sent as chunks (JSON, then each output's
//! own `Bytes`) without concatenating. Otherwise it is `application/json`. If the client's
//! `Accept-Encoding` picks gzip or deflate the whole body is compressed and `Content-Encoding`
//! set; should compression fail the body goes out uncompressed, as in Triton.

use axum::body::Body;
use axum::http::HeaderValue;
use axum::http::header::{CONTENT_ENCODING, CONTENT_TYPE};
use axum::response::Response;
use bytes::Bytes;
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Serialize, Serializer};

use super::body::ChunkBody;
use super::compression::{Encoding, compress};
use super::infer_request::{INFER_HEADER_CONTENT_LENGTH, OutputFormat};
use super::tensor_json::{JsonData, bytes_are_utf8};
use crate::shm::Written;
use nereid_proto::{
    DataType, InferResponse, ParamValue, Parameters, ServiceError, ServiceResult, Tensor,
};

/// Builds the HTTP response for a successful inference.
pub fn build_response(
    response: &InferResponse,
    format: &OutputFormat,
    written: &Written,
    encoding: Encoding,
) -> ServiceResult<Response> {
    // A BYTES output that is not UTF-8 cannot be a JSON string; sending it binary keeps it intact
    // and clients read either form (`tritonclient` checks for `binary_data_size`).
    let forms: Vec<Form> = response
        .outputs
        .iter()
        .map(|t| match written.contains_key(t.name()) {
            true => Form::Shm,
            false
                if format.is_binary(t.name())
                    || (t.datatype() == DataType::Bytes && !bytes_are_utf8(t.data())) =>
            {
                Form::Binary
            }
            false => Form::Json,
        })
        .collect();
    let binary: Vec<bool> = forms.iter().map(|f| matches!(f, Form::Binary)).collect();
    let header = serde_json::to_vec(&ResponseJson {
        response,
        forms: &forms,
    })
    .map_err(|e| {
        ServiceError::internal(format!("failed to serialize the inference response: {e}"))
    })?;
    let header_len = header.len();
    let any_binary = binary.iter().any(|b| *b);
    let mut chunks = vec![Bytes::from(header)];
    chunks.extend(
        response
            .outputs
            .iter()
            .zip(&binary)
            .filter(|(_, binary)| **binary)
            .map(|(t, _)| t.data().clone()),
    );

    let (body, content_encoding) = match encoding.header_value() {
        None => (Body::new(ChunkBody::new(chunks)), None),
        Some(name) => match compress(encoding, &chunks) {
            Ok(packed) => (Body::from(packed), Some(name)),
            Err(e) => {
                tracing::debug!("unable to compress the inference response: {e}");
                (Body::new(ChunkBody::new(chunks)), None)
            }
        },
    };
    let mut http = Response::new(body);
    let headers = http.headers_mut();
    if any_binary {
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        headers.insert(INFER_HEADER_CONTENT_LENGTH, HeaderValue::from(header_len));
    } else {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    if let Some(name) = content_encoding {
        headers.insert(CONTENT_ENCODING, HeaderValue::from_static(name));
    }
    Ok(http)
}

/// How one output goes back.
enum Form {
    /// `data` in the JSON.
    Json,
    /// In the binary section after the JSON.
    Binary,
    /// Already written to client shared memory: name, datatype and shape only.
    Shm,
}

/// The response JSON header; `forms[i]` says how output `i` is sent.
struct ResponseJson<'a> {
    response: &'a InferResponse,
    forms: &'a [Form],
}

impl Serialize for ResponseJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let r = self.response;
        let mut map = serializer.serialize_map(None)?;
        if !r.id.is_empty() {
            map.serialize_entry("id", &r.id)?;
        }
        map.serialize_entry("model_name", &r.model_name)?;
        map.serialize_entry("model_version", &r.model_version)?;
        if !r.parameters.is_empty() {
            map.serialize_entry("parameters", &ParametersJson(&r.parameters))?;
        }
        map.serialize_entry(
            "outputs",
            &OutputsJson {
                outputs: &r.outputs,
                forms: self.forms,
            },
        )?;
        map.end()
    }
}

struct ParametersJson<'a>(&'a Parameters);

impl Serialize for ParametersJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (key, value) in self.0 {
            match value {
                ParamValue::Bool(b) => map.serialize_entry(key, b)?,
                ParamValue::Int(i) => map.serialize_entry(key, i)?,
                ParamValue::Uint(u) => map.serialize_entry(key, u)?,
                // NaN / ±Inf print as null (see tensor_json).
                ParamValue::Double(d) => map.serialize_entry(key, d)?,
                ParamValue::String(s) => map.serialize_entry(key, s)?,
            }
        }
        map.end()
    }
}

struct OutputsJson<'a> {
    outputs: &'a [Tensor],
    forms: &'a [Form],
}

impl Serialize for OutputsJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.outputs.len()))?;
        for (tensor, form) in self.outputs.iter().zip(self.forms) {
            seq.serialize_element(&OutputJson { tensor, form })?;
        }
        seq.end()
    }
}

struct OutputJson<'a> {
    tensor: &'a Tensor,
    form: &'a Form,
}

#[derive(Serialize)]
struct BinaryParameters {
    binary_data_size: usize,
}

impl Serialize for OutputJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let t = self.tensor;
        let mut map = serializer.serialize_map(Some(4))?;
        map.serialize_entry("name", t.name())?;
        map.serialize_entry("datatype", t.datatype().as_wire())?;
        map.serialize_entry("shape", t.shape())?;
        match self.form {
            Form::Binary => map.serialize_entry(
                "parameters",
                &BinaryParameters {
                    binary_data_size: t.data().len(),
                },
            )?,
            Form::Json => map.serialize_entry(
                "data",
                &JsonData {
                    datatype: t.datatype(),
                    data: t.data(),
                },
            )?,
            Form::Shm => {}
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use nereid_proto::testing::fp32_tensor as fp32;
    use serde_json::{Value, json};

    fn response(outputs: Vec<Tensor>) -> InferResponse {
        InferResponse {
            model_name: "m".into(),
            model_version: "1".into(),
            outputs,
            ..InferResponse::default()
        }
    }

    async fn body_of(http: Response) -> Bytes {
        http.into_body().collect().await.unwrap().to_bytes()
    }

    #[tokio::test]
    async fn json_only_response() {
        let mut r = response(vec![fp32("y", &[1.0, 2.5])]);
        r.parameters.insert("p".into(), ParamValue::Uint(u64::MAX));
        let http = build_response(
            &r,
            &OutputFormat::default(),
            &Written::new(),
            Encoding::Identity,
        )
        .unwrap();
        assert_eq!(http.headers()[CONTENT_TYPE], "application/json");
        assert!(http.headers().get(INFER_HEADER_CONTENT_LENGTH).is_none());
        let body: Value = serde_json::from_slice(&body_of(http).await).unwrap();
        assert_eq!(
            body,
            json!({"model_name":"m","model_version":"1","parameters":{"p":u64::MAX},
                   "outputs":[{"name":"y","datatype":"FP32","shape":[2],"data":[1.0,2.5]}]})
        );
    }

    #[tokio::test]
    async fn binary_outputs_follow_the_header_in_order() {
        let r = response(vec![
            fp32("a", &[1.0]),
            fp32("b", &[]),
            fp32("c", &[3.0, 4.0]),
        ]);
        let format = OutputFormat {
            default_binary: true,
            per_output: [("c".to_string(), false)].into(),
        };
        let http = build_response(&r, &format, &Written::new(), Encoding::Identity).unwrap();
        assert_eq!(http.headers()[CONTENT_TYPE], "application/octet-stream");
        let header_len: usize = http.headers()[INFER_HEADER_CONTENT_LENGTH]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let body = body_of(http).await;
        let header: Value = serde_json::from_slice(&body[..header_len]).unwrap();
        assert_eq!(header["outputs"][0]["parameters"]["binary_data_size"], 4);
        assert_eq!(header["outputs"][1]["parameters"]["binary_data_size"], 0);
        assert_eq!(header["outputs"][2]["data"], json!([3.0, 4.0]));
        assert!(header.get("id").is_none());
        assert_eq!(&body[header_len..], &1.0f32.to_le_bytes());
    }

    #[tokio::test]
    async fn non_utf8_bytes_output_is_sent_binary() {
        let mut data = Vec::new();
        nereid_proto::push_bytes_element(&mut data, &[0xff]);
        let t = Tensor::new("s", DataType::Bytes, vec![1], Bytes::from(data.clone())).unwrap();
        let http = build_response(
            &response(vec![t]),
            &OutputFormat::default(),
            &Written::new(),
            Encoding::Identity,
        )
        .unwrap();
        let header_len: usize = http.headers()[INFER_HEADER_CONTENT_LENGTH]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(&body_of(http).await[header_len..], &data[..]);
    }
}
