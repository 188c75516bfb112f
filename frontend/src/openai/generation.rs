//! One prompt through a generation model: the request built as the generate endpoints build
//! theirs, run with `InferenceService::infer_stream`, its responses read back as text pieces.
//!
//! ```text
//! prompt + Sampling + streaming
//!   ─► keys the model declares: text_input, stream, sampling_parameters (JSON),
//!      exclude_input_in_output = true, return_num_*_tokens / return_finish_reason = true,
//!      typed sampling inputs (max_tokens, temperature, ...)
//!   ─► http::request_from_keys (shapes and types from the metadata) ─► infer_stream
//!   ─► Piece per response: text_output (a delta), num_*_tokens, finish_reason
//!   ─► Tally: usage and finish reason
//! ```
//!
//! Every response's `text_output` is taken as the next piece of the completion (the vLLM and
//! TensorRT-LLM backends stream deltas), so a non-streamed completion is the concatenation of
//! what came. Usage: the model's `num_input_tokens` / `num_output_tokens` when it returns them
//! (summed over responses); else an estimate: the prompt's whitespace-separated words, and one
//! token per response that carried text. Dropping the stream cancels the request.

use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Map, Value, json};

use super::convention::{
    EXCLUDE_INPUT, FINISH_REASON, GenerationModel, NUM_INPUT_TOKENS, NUM_OUTPUT_TOKENS,
    RETURN_FINISH_REASON, RETURN_NUM_INPUT_TOKENS, RETURN_NUM_OUTPUT_TOKENS, SAMPLING_PARAMETERS,
    STREAM, TEXT_INPUT, TEXT_OUTPUT,
};
use super::types::Sampling;
use crate::http::{HttpState, request_from_keys};
use nereid_proto::{
    DataType, InferResponse, RequestContext, RequestedOutput, ServiceError, ServiceResult,
    StreamedResponse, Tensor, bytes_elements,
};

/// One response's share of the completion.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Piece {
    pub text: String,
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
    pub finish_reason: Option<String>,
}

/// The pieces of one generation, in order.
pub type Pieces = BoxStream<'static, ServiceResult<Piece>>;

/// What one generation is asked to do.
pub struct Generate<'a> {
    pub model_name: &'a str,
    pub model: &'a GenerationModel,
    pub prompt: &'a str,
    pub sampling: &'a Sampling,
    pub streaming: bool,
    pub context: RequestContext,
}

/// Starts the generation; an error before the model ran (validation, unknown model, a full
/// queue) is the outer error.
pub async fn start(state: &HttpState, ask: Generate<'_>) -> ServiceResult<Pieces> {
    let request = request_from_keys(
        ask.model_name,
        None,
        keys(ask.model, ask.prompt, ask.sampling, ask.streaming),
        &ask.model.inputs,
        state.config.max_input_size,
    )?;
    let outputs = ask
        .model
        .requested_outputs()
        .into_iter()
        .map(|name| RequestedOutput {
            name: name.to_string(),
            ..RequestedOutput::default()
        })
        .collect();
    let request = nereid_proto::InferRequest {
        context: ask.context,
        outputs,
        ..request
    };
    let responses = state.service.infer_stream(request).await?;
    Ok(responses
        .filter_map(|item| async move {
            match item {
                Ok(StreamedResponse {
                    response: Some(response),
                    ..
                }) => Some(piece(response)),
                Ok(StreamedResponse { response: None, .. }) => None,
                Err(e) => Some(Err(e)),
            }
        })
        .boxed())
}

/// The keys of the request: only inputs the model declares.
fn keys(
    model: &GenerationModel,
    prompt: &str,
    sampling: &Sampling,
    streaming: bool,
) -> Vec<(String, Value)> {
    let mut keys = vec![(TEXT_INPUT.to_string(), json!(prompt))];
    let mut put = |name: &str, value: Value| {
        if model.has_input(name) {
            keys.push((name.to_string(), value));
        }
    };
    put(STREAM, json!(streaming));
    put(EXCLUDE_INPUT, json!(true));
    put(RETURN_NUM_INPUT_TOKENS, json!(true));
    put(RETURN_NUM_OUTPUT_TOKENS, json!(true));
    put(RETURN_FINISH_REASON, json!(true));
    let sampling_json = sampling.to_json();
    put(
        SAMPLING_PARAMETERS,
        json!(Value::Object(sampling_json.clone()).to_string()),
    );
    typed_sampling(model, sampling_json, &mut keys);
    keys
}

/// TensorRT-LLM-style models take sampling fields as inputs of their own names.
fn typed_sampling(
    model: &GenerationModel,
    sampling: Map<String, Value>,
    keys: &mut Vec<(String, Value)>,
) {
    for (name, value) in sampling {
        let name = if name == "stop" {
            "stop_words".to_string()
        } else {
            name
        };
        if model.has_input(&name) && !keys.iter().any(|(k, _)| *k == name) {
            keys.push((name, value));
        }
    }
}

/// A response's text and counts.
fn piece(response: InferResponse) -> ServiceResult<Piece> {
    let mut piece = Piece::default();
    for output in &response.outputs {
        match output.name() {
            TEXT_OUTPUT => piece.text = text_of(output)?,
            NUM_INPUT_TOKENS => piece.input_tokens = count_of(output),
            NUM_OUTPUT_TOKENS => piece.output_tokens = count_of(output),
            FINISH_REASON => {
                let reason = text_of(output)?;
                // The vLLM backend writes Python's `None` while the generation goes on.
                if !reason.is_empty() && reason != "None" {
                    piece.finish_reason = Some(reason);
                }
            }
            _ => {}
        }
    }
    Ok(piece)
}

/// The BYTES elements of an output, joined, as UTF-8.
fn text_of(output: &Tensor) -> ServiceResult<String> {
    let name = output.name();
    if output.datatype() != DataType::Bytes {
        return Err(ServiceError::internal(format!(
            "output '{name}' is {:?}, the convention wants BYTES",
            output.datatype()
        )));
    }
    let mut text = String::new();
    for element in bytes_elements(output.data()) {
        let s = std::str::from_utf8(element).map_err(|_| {
            ServiceError::internal(format!("output '{name}' holds text that is not UTF-8"))
        })?;
        text.push_str(s);
    }
    Ok(text)
}

/// The first element of an integer output.
fn count_of(output: &Tensor) -> Option<u64> {
    let data = output.data();
    let le = |n: usize| data.get(..n);
    match output.datatype() {
        DataType::Uint32 => le(4).map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        DataType::Int32 => {
            le(4).and_then(|b| u64::try_from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])).ok())
        }
        DataType::Uint64 => le(8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes),
        DataType::Int64 => le(8)
            .and_then(|b| b.try_into().ok())
            .and_then(|b| u64::try_from(i64::from_le_bytes(b)).ok()),
        _ => None,
    }
}

/// Usage and finish reason, gathered as pieces go by.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Tally {
    estimated_prompt: u64,
    reported_prompt: Option<u64>,
    reported_completion: Option<u64>,
    pieces_with_text: u64,
    finish_reason: Option<String>,
    max_tokens: Option<u64>,
}

impl Tally {
    pub fn new(prompt: &str, max_tokens: Option<u64>) -> Tally {
        Tally {
            estimated_prompt: prompt.split_whitespace().count() as u64,
            max_tokens,
            ..Tally::default()
        }
    }

    pub fn add(&mut self, piece: &Piece) {
        if !piece.text.is_empty() {
            self.pieces_with_text += 1;
        }
        if let Some(n) = piece.input_tokens {
            self.reported_prompt = Some(n);
        }
        if let Some(n) = piece.output_tokens {
            self.reported_completion = Some(self.reported_completion.unwrap_or(0) + n);
        }
        if piece.finish_reason.is_some() {
            self.finish_reason.clone_from(&piece.finish_reason);
        }
    }

    pub fn prompt_tokens(&self) -> u64 {
        self.reported_prompt.unwrap_or(self.estimated_prompt)
    }

    pub fn completion_tokens(&self) -> u64 {
        self.reported_completion.unwrap_or(self.pieces_with_text)
    }

    /// `length` when the model said so or the limit was reached, else `stop`.
    pub fn finish_reason(&self) -> &'static str {
        match self.finish_reason.as_deref() {
            Some("length") => "length",
            Some(_) => "stop",
            None if self
                .max_tokens
                .is_some_and(|max| self.completion_tokens() >= max) =>
            {
                "length"
            }
            None => "stop",
        }
    }

    pub fn usage(&self) -> Value {
        let (prompt, completion) = (self.prompt_tokens(), self.completion_tokens());
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_proto::{TensorMetadata, push_bytes_element};

    fn model(inputs: &[&str]) -> GenerationModel {
        GenerationModel {
            inputs: inputs
                .iter()
                .map(|n| TensorMetadata {
                    name: n.to_string(),
                    datatype: "BYTES".into(),
                    shape: vec![1],
                })
                .collect(),
            outputs: vec!["text_output".into()],
        }
    }

    #[test]
    fn only_declared_inputs_are_sent() {
        let sampling = Sampling {
            max_tokens: Some(4),
            stop: vec!["x".into()],
            ..Sampling::default()
        };
        let bare = keys(&model(&["text_input"]), "hi", &sampling, true);
        assert_eq!(bare, vec![("text_input".to_string(), json!("hi"))]);
        let vllm = keys(
            &model(&[
                "text_input",
                "stream",
                "sampling_parameters",
                "exclude_input_in_output",
            ]),
            "hi",
            &sampling,
            false,
        );
        let names: Vec<&str> = vllm.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "text_input",
                "stream",
                "exclude_input_in_output",
                "sampling_parameters"
            ]
        );
        assert_eq!(vllm[1].1, json!(false));
        assert_eq!(vllm[3].1, json!(r#"{"max_tokens":4,"stop":["x"]}"#));
        let trt = keys(
            &model(&["text_input", "max_tokens", "stop_words"]),
            "hi",
            &sampling,
            true,
        );
        assert_eq!(trt[1], ("max_tokens".to_string(), json!(4)));
        assert_eq!(trt[2], ("stop_words".to_string(), json!(["x"])));
    }

    #[test]
    fn pieces_read_text_and_counts() {
        let mut text = Vec::new();
        push_bytes_element(&mut text, b"he");
        push_bytes_element(&mut text, b"llo");
        let response = InferResponse {
            outputs: vec![
                Tensor::new("text_output", DataType::Bytes, vec![2], text.into()).unwrap(),
                Tensor::new(
                    "num_output_tokens",
                    DataType::Uint32,
                    vec![1],
                    2u32.to_le_bytes().to_vec().into(),
                )
                .unwrap(),
            ],
            ..InferResponse::default()
        };
        let p = piece(response).unwrap();
        assert_eq!(p.text, "hello");
        assert_eq!(p.output_tokens, Some(2));
    }

    #[test]
    fn tally_prefers_reported_counts() {
        let mut estimated = Tally::new("a b  c", Some(2));
        estimated.add(&Piece {
            text: "x".into(),
            ..Piece::default()
        });
        estimated.add(&Piece {
            text: String::new(),
            ..Piece::default()
        });
        assert_eq!(
            (estimated.prompt_tokens(), estimated.completion_tokens()),
            (3, 1)
        );
        assert_eq!(estimated.finish_reason(), "stop");
        estimated.add(&Piece {
            text: "y".into(),
            ..Piece::default()
        });
        assert_eq!(estimated.finish_reason(), "length");

        let mut reported = Tally::new("a b c", None);
        reported.add(&Piece {
            input_tokens: Some(7),
            output_tokens: Some(2),
            ..Piece::default()
        });
        reported.add(&Piece {
            output_tokens: Some(3),
            finish_reason: Some("length".into()),
            ..Piece::default()
        });
        assert_eq!(
            reported.usage(),
            json!({"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12})
        );
        assert_eq!(reported.finish_reason(), "length");
    }
}
