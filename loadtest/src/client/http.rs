//! KServe v2 HTTP/REST client over a hyper-util HTTP/1.1 keep-alive connection pool.
//!
//! Each worker's request reuses an idle pooled connection (one per in-flight request), with
//! `TCP_NODELAY` on. Request bodies are either Triton's binary tensor extension (JSON header,
//! then the raw input bytes, outputs asked back binary) or, with `--http-json`, plain JSON.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use super::{Client, EXPLICIT_MODE_HINT, Prepared, Target};
use crate::elements::bytes_to_json;
use crate::error::{LoadtestError, chain};
use crate::inputs::{ModelInfo, Step, TensorSpec};

const INFERENCE_HEADER: &str = "inference-header-content-length";

/// An HTTP client for one model on one server.
pub struct HttpClient {
    pool: HyperClient<HttpConnector, Full<Bytes>>,
    /// `http://host:port`
    base: String,
    target: Target,
    /// `/v2/models/{m}[/versions/{v}]`
    model_path: String,
    infer_uri: Uri,
    json: bool,
}

impl HttpClient {
    pub fn new(base: String, target: Target, json: bool) -> Result<HttpClient, LoadtestError> {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        let pool = HyperClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(usize::MAX)
            .build(connector);
        let model_path = if target.version.is_empty() {
            format!("/v2/models/{}", target.model)
        } else {
            format!("/v2/models/{}/versions/{}", target.model, target.version)
        };
        let infer_uri = format!("{base}{model_path}/infer").parse().map_err(|_| {
            LoadtestError::InvalidArgument(format!(
                "model '{}' / version '{}' cannot be used in a URL path",
                target.model, target.version
            ))
        })?;
        Ok(HttpClient {
            pool,
            base,
            target,
            model_path,
            infer_uri,
            json,
        })
    }

    /// Sends one control-plane request, returning status and whole body.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<(StatusCode, Bytes), LoadtestError> {
        let uri: Uri = format!("{}{path}", self.base).parse().map_err(|e| {
            LoadtestError::InvalidArgument(format!("cannot form a URL for '{path}': {e}"))
        })?;
        let mut request = Request::builder().method(method).uri(uri);
        if body.is_some() {
            request = request.header(CONTENT_TYPE, "application/json");
        }
        let request = request
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| LoadtestError::InvalidArgument(e.to_string()))?;
        let response =
            self.pool
                .request(request)
                .await
                .map_err(|e| LoadtestError::Unreachable {
                    url: self.base.clone(),
                    protocol: "HTTP",
                    detail: chain(&e),
                })?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| LoadtestError::Server {
                url: self.base.clone(),
                detail: chain(&e),
            })?
            .to_bytes();
        Ok((status, body))
    }

    fn server_error(&self, what: &str, status: StatusCode, body: &[u8]) -> LoadtestError {
        LoadtestError::Server {
            url: self.base.clone(),
            detail: format!("{what}: HTTP {status}: {}", error_message(body)),
        }
    }
}

/// The `error` of a KServe error body, or the body itself.
fn error_message(body: &[u8]) -> String {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(o)) => match o.get("error") {
            Some(Value::String(s)) => s.clone(),
            _ => Value::Object(o).to_string(),
        },
        _ => String::from_utf8_lossy(body).chars().take(300).collect(),
    }
}

/// The binary-extension body: JSON header then each input's bytes in order.
pub fn binary_body(step: &Step) -> (Bytes, usize) {
    let inputs: Vec<Value> = step
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "shape": t.shape,
                "datatype": t.datatype.as_wire(),
                "parameters": {"binary_data_size": t.data.len()},
            })
        })
        .collect();
    let header = json!({"inputs": inputs, "parameters": {"binary_data_output": true}}).to_string();
    let mut body =
        Vec::with_capacity(header.len() + step.iter().map(|t| t.data.len()).sum::<usize>());
    body.extend_from_slice(header.as_bytes());
    for t in step {
        body.extend_from_slice(&t.data);
    }
    (Bytes::from(body), header.len())
}

/// The all-JSON body (`data` as flat arrays; outputs come back as JSON too).
pub fn json_body(step: &Step) -> Result<Bytes, String> {
    let inputs = step
        .iter()
        .map(|t| {
            let data = bytes_to_json(t.datatype, &t.data).map_err(|e| format!("input '{}': {e}", t.name))?;
            Ok(json!({"name": t.name, "shape": t.shape, "datatype": t.datatype.as_wire(), "data": data}))
        })
        .collect::<Result<Vec<Value>, String>>()?;
    Ok(Bytes::from(json!({"inputs": inputs}).to_string()))
}

fn tensor_specs(value: Option<&Value>) -> Result<Vec<TensorSpec>, String> {
    let Some(Value::Array(items)) = value else {
        return Ok(Vec::new());
    };
    items
        .iter()
        .map(|t| {
            let name = t
                .get("name")
                .and_then(Value::as_str)
                .ok_or("tensor without a 'name'")?;
            let datatype = t
                .get("datatype")
                .and_then(Value::as_str)
                .ok_or("tensor without a 'datatype'")?;
            let shape = t
                .get("shape")
                .and_then(Value::as_array)
                .and_then(|a| a.iter().map(Value::as_i64).collect::<Option<Vec<i64>>>())
                .ok_or("tensor without an integer 'shape'")?;
            Ok(TensorSpec {
                name: name.into(),
                datatype: datatype.into(),
                shape,
            })
        })
        .collect()
}

#[async_trait]
impl Client for HttpClient {
    fn prepare(&self, step: &Step) -> Result<Prepared, String> {
        if self.json {
            Ok(Prepared::Http {
                body: json_body(step)?,
                header_length: None,
            })
        } else {
            let (body, header_length) = binary_body(step);
            Ok(Prepared::Http {
                body,
                header_length: Some(header_length),
            })
        }
    }

    async fn infer(&self, request: &Prepared) -> Result<(), String> {
        let Prepared::Http {
            body,
            header_length,
        } = request
        else {
            return Err("internal: a gRPC request was given to the HTTP client".into());
        };
        let mut builder = Request::builder()
            .method(Method::POST)
            .uri(self.infer_uri.clone());
        match header_length {
            Some(n) => {
                builder = builder
                    .header(
                        CONTENT_TYPE,
                        HeaderValue::from_static("application/octet-stream"),
                    )
                    .header(INFERENCE_HEADER, *n);
            }
            None => {
                builder = builder.header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            }
        }
        let request = builder
            .body(Full::new(body.clone()))
            .map_err(|e| e.to_string())?;
        let response = self.pool.request(request).await.map_err(|e| chain(&e))?;
        let status = response.status();
        // The body is always read to the end so the connection goes back to the pool.
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| chain(&e))?
            .to_bytes();
        if status == StatusCode::OK {
            Ok(())
        } else {
            Err(format!(
                "HTTP {}: {}",
                status.as_u16(),
                error_message(&body)
            ))
        }
    }

    async fn server_live(&self) -> Result<(), LoadtestError> {
        let (status, body) = self.call(Method::GET, "/v2/health/live", None).await?;
        if status.is_success() {
            Ok(())
        } else {
            Err(self.server_error("not live (GET /v2/health/live)", status, &body))
        }
    }

    async fn model_info(&self) -> Result<ModelInfo, LoadtestError> {
        let (status, body) = self.call(Method::GET, &self.model_path, None).await?;
        if status == StatusCode::NOT_FOUND || status == StatusCode::BAD_REQUEST {
            return Err(LoadtestError::ModelNotFound {
                model: self.target.model.clone(),
                url: self.base.clone(),
                detail: error_message(&body),
            });
        }
        if !status.is_success() {
            return Err(self.server_error("model metadata", status, &body));
        }
        let bad = |detail: String| LoadtestError::Server {
            url: self.base.clone(),
            detail: format!("model metadata of '{}': {detail}", self.target.model),
        };
        let meta: Value = serde_json::from_slice(&body).map_err(|e| bad(e.to_string()))?;
        let inputs = tensor_specs(meta.get("inputs")).map_err(&bad)?;
        let outputs = tensor_specs(meta.get("outputs")).map_err(&bad)?;
        // Servers without the model configuration extension (MLServer) answer an error here;
        // batching is then guessed from the metadata shapes.
        let max_batch_size = match self.model_config().await {
            Ok(config) => config.get("max_batch_size").and_then(Value::as_i64),
            Err(_) => None,
        };
        Ok(ModelInfo {
            name: self.target.model.clone(),
            inputs,
            outputs,
            max_batch_size,
        })
    }

    async fn model_config(&self) -> Result<Value, LoadtestError> {
        let path = format!("{}/config", self.model_path);
        let (status, body) = self.call(Method::GET, &path, None).await?;
        if !status.is_success() {
            return Err(self.server_error(&format!("GET {path}"), status, &body));
        }
        serde_json::from_slice(&body).map_err(|e| LoadtestError::Server {
            url: self.base.clone(),
            detail: format!("GET {path}: not JSON: {e}"),
        })
    }

    async fn load_model(&self, config: Option<&Value>) -> Result<(), LoadtestError> {
        let path = format!("/v2/repository/models/{}/load", self.target.model);
        let body = config
            .map(|c| Bytes::from(json!({"parameters": {"config": c.to_string()}}).to_string()));
        let (status, response) = self.call(Method::POST, &path, body).await?;
        if status.is_success() {
            return Ok(());
        }
        let mut error = self.server_error(&format!("POST {path}"), status, &response);
        if status == StatusCode::SERVICE_UNAVAILABLE
            && let LoadtestError::Server { detail, .. } = &mut error
        {
            detail.push_str(&format!(" ({EXPLICIT_MODE_HINT})"));
        }
        Err(error)
    }

    fn describe(&self) -> String {
        format!(
            "{} (HTTP{})",
            self.base,
            if self.json {
                ", JSON"
            } else {
                ", binary tensors"
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use nereid_proto::DataType;

    use super::*;
    use crate::inputs::InputTensor;

    fn step() -> Step {
        vec![
            InputTensor {
                name: "A".into(),
                datatype: DataType::Int32,
                shape: vec![1, 2],
                data: Bytes::from_static(&[1, 0, 0, 0, 2, 0, 0, 0]),
            },
            InputTensor {
                name: "B".into(),
                datatype: DataType::Uint8,
                shape: vec![1, 1],
                data: Bytes::from_static(&[7]),
            },
        ]
    }

    #[test]
    fn binary_body_is_header_then_raw_inputs() {
        let (body, n) = binary_body(&step());
        let header: Value = serde_json::from_slice(&body[..n]).unwrap();
        assert_eq!(header["inputs"][0]["parameters"]["binary_data_size"], 8);
        assert_eq!(header["inputs"][1]["datatype"], "UINT8");
        assert_eq!(header["parameters"]["binary_data_output"], true);
        assert_eq!(&body[n..], &[1, 0, 0, 0, 2, 0, 0, 0, 7]);
    }

    #[test]
    fn json_body_has_flat_data() {
        let body: Value = serde_json::from_slice(&json_body(&step()).unwrap()).unwrap();
        assert_eq!(body["inputs"][0]["data"], json!([1, 2]));
        assert_eq!(body["inputs"][0]["shape"], json!([1, 2]));
    }

    #[test]
    fn error_bodies() {
        assert_eq!(
            error_message(br#"{"error":"no such model"}"#),
            "no such model"
        );
        assert_eq!(error_message(b"plain"), "plain");
    }
}
