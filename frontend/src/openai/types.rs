//! The `/v1/` request bodies, read field by field into validated requests, so that every
//! refusal names its field (`param`) the way OpenAI's API does; unknown fields are ignored, as
//! OpenAI clients send ones a server may not know.
//!
//! ```text
//! body ─► Fields (a JSON object) ─► take::<T>(name): missing or null ─► None
//!                                                    wrong type     ─► 400, param = name
//!   ├─ CompletionRequest  model, prompt (string or strings), Sampling, StreamMode, echo
//!   ├─ ChatRequest        model, messages (content as text), tools, Sampling, StreamMode
//!   └─ EmbeddingRequest   model, input (string or strings), encoding_format
//! ```

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::errors::OpenAiError;

/// Largest `stop` list, as OpenAI allows.
const MAX_STOP: usize = 4;

/// A request body's fields, taken out one by one.
pub struct Fields(Map<String, Value>);

impl Fields {
    pub fn parse(body: &[u8]) -> Result<Fields, OpenAiError> {
        if body.is_empty() {
            return Err(OpenAiError::bad_body(
                "the request body is empty; send a JSON object",
            ));
        }
        match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(map)) => Ok(Fields(map)),
            Ok(_) => Err(OpenAiError::bad_body(
                "the request body must be a JSON object",
            )),
            Err(e) => Err(OpenAiError::bad_body(format!(
                "the request body is not valid JSON: {e}"
            ))),
        }
    }

    /// The field, typed; `None` when missing or null.
    pub fn take<T: DeserializeOwned>(&mut self, name: &str) -> Result<Option<T>, OpenAiError> {
        match self.0.remove(name) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => serde_json::from_value(value)
                .map(Some)
                .map_err(|e| OpenAiError::bad_field(name, format!("'{name}': {e}"))),
        }
    }

    /// The field, which must be there.
    pub fn require<T: DeserializeOwned>(&mut self, name: &str) -> Result<T, OpenAiError> {
        self.take(name)?
            .ok_or_else(|| OpenAiError::bad_field(name, format!("'{name}' is a required property")))
    }
}

/// A string or a list of strings (`prompt`, `input`, `stop`).
#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

fn strings(fields: &mut Fields, name: &str) -> Result<Option<Vec<String>>, OpenAiError> {
    let value: Option<Value> = fields.take(name)?;
    let Some(value) = value else {
        return Ok(None);
    };
    serde_json::from_value::<OneOrMany>(value)
        .map(|v| Some(v.into_vec()))
        .map_err(|_| {
            OpenAiError::bad_field(
                name,
                format!(
                    "'{name}' must be a string or a list of strings (token ids are not supported)"
                ),
            )
        })
}

/// The sampling fields, passed to the model as its `sampling_parameters` JSON (the vLLM
/// backend's `SamplingParams` names) and as typed inputs where it declares them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sampling {
    pub max_tokens: Option<u64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub stop: Vec<String>,
    pub seed: Option<i64>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
}

impl Sampling {
    /// Reads and checks the fields; `max_names` are the fields that may carry the token limit
    /// (chat also takes `max_completion_tokens`).
    fn take(fields: &mut Fields, max_names: &[&str]) -> Result<Sampling, OpenAiError> {
        let mut max_tokens = None;
        for name in max_names {
            if let Some(n) = fields.take::<u64>(name)? {
                if n == 0 {
                    return Err(OpenAiError::bad_field(
                        name,
                        format!("'{name}' must be at least 1"),
                    ));
                }
                max_tokens = Some(n);
            }
        }
        let temperature = fields.take::<f64>("temperature")?;
        if let Some(t) = temperature
            && !(0.0..=2.0).contains(&t)
        {
            return Err(OpenAiError::bad_field(
                "temperature",
                format!("'temperature' must be between 0 and 2, got {t}"),
            ));
        }
        let top_p = fields.take::<f64>("top_p")?;
        if let Some(p) = top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(OpenAiError::bad_field(
                "top_p",
                format!("'top_p' must be in (0, 1], got {p}"),
            ));
        }
        let stop = strings(fields, "stop")?.unwrap_or_default();
        if stop.len() > MAX_STOP {
            return Err(OpenAiError::bad_field(
                "stop",
                format!(
                    "'stop' takes at most {MAX_STOP} sequences, got {}",
                    stop.len()
                ),
            ));
        }
        let mut penalty = |name: &str| -> Result<Option<f64>, OpenAiError> {
            let value = fields.take::<f64>(name)?;
            if let Some(v) = value
                && !(-2.0..=2.0).contains(&v)
            {
                return Err(OpenAiError::bad_field(
                    name,
                    format!("'{name}' must be between -2 and 2, got {v}"),
                ));
            }
            Ok(value)
        };
        let frequency_penalty = penalty("frequency_penalty")?;
        let presence_penalty = penalty("presence_penalty")?;
        let seed = fields.take::<i64>("seed")?;
        refuse_unsupported(fields)?;
        Ok(Sampling {
            max_tokens,
            temperature,
            top_p,
            stop,
            seed,
            frequency_penalty,
            presence_penalty,
        })
    }

    /// The `sampling_parameters` JSON: only the fields the client gave.
    pub fn to_json(&self) -> Map<String, Value> {
        let mut map = Map::new();
        let mut put = |key: &str, value: Value| {
            map.insert(key.to_string(), value);
        };
        if let Some(v) = self.max_tokens {
            put("max_tokens", json!(v));
        }
        if let Some(v) = self.temperature {
            put("temperature", json!(v));
        }
        if let Some(v) = self.top_p {
            put("top_p", json!(v));
        }
        if !self.stop.is_empty() {
            put("stop", json!(self.stop));
        }
        if let Some(v) = self.seed {
            put("seed", json!(v));
        }
        if let Some(v) = self.frequency_penalty {
            put("frequency_penalty", json!(v));
        }
        if let Some(v) = self.presence_penalty {
            put("presence_penalty", json!(v));
        }
        map
    }
}

/// `n`, `best_of` and `logprobs` ask for what these routes do not do: refused by name rather
/// than silently ignored.
fn refuse_unsupported(fields: &mut Fields) -> Result<(), OpenAiError> {
    for name in ["n", "best_of"] {
        if let Some(n) = fields.take::<u64>(name)?
            && n != 1
        {
            return Err(OpenAiError::bad_field(
                name,
                format!("'{name}' must be 1: one choice per prompt is supported"),
            ));
        }
    }
    match fields.take::<Value>("logprobs")? {
        None | Some(Value::Bool(false)) => Ok(()),
        Some(_) => Err(OpenAiError::bad_field(
            "logprobs",
            "'logprobs' is not supported: the models' outputs carry no log probabilities",
        )),
    }
}

/// `stream` and `stream_options.include_usage`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StreamMode {
    pub stream: bool,
    pub include_usage: bool,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

impl StreamMode {
    fn take(fields: &mut Fields) -> Result<StreamMode, OpenAiError> {
        let stream = fields.take::<bool>("stream")?.unwrap_or(false);
        let options = fields.take::<StreamOptions>("stream_options")?;
        if options.is_some() && !stream {
            return Err(OpenAiError::bad_field(
                "stream_options",
                "'stream_options' is only allowed when 'stream' is true",
            ));
        }
        Ok(StreamMode {
            stream,
            include_usage: options.is_some_and(|o| o.include_usage),
        })
    }
}

/// `POST /v1/completions`.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionRequest {
    pub model: String,
    pub prompts: Vec<String>,
    pub sampling: Sampling,
    pub mode: StreamMode,
    /// Put the prompt in front of the completion.
    pub echo: bool,
}

impl CompletionRequest {
    pub fn parse(body: &[u8]) -> Result<CompletionRequest, OpenAiError> {
        let mut fields = Fields::parse(body)?;
        let model = fields.require::<String>("model")?;
        let prompts = strings(&mut fields, "prompt")?
            .ok_or_else(|| OpenAiError::bad_field("prompt", "'prompt' is a required property"))?;
        if prompts.is_empty() {
            return Err(OpenAiError::bad_field(
                "prompt",
                "'prompt' must not be an empty list",
            ));
        }
        let sampling = Sampling::take(&mut fields, &["max_tokens"])?;
        let mode = StreamMode::take(&mut fields)?;
        if mode.stream && prompts.len() > 1 {
            return Err(OpenAiError::bad_field(
                "prompt",
                "a streamed completion takes one prompt; send one request per prompt",
            ));
        }
        if fields.take::<String>("suffix")?.is_some() {
            return Err(OpenAiError::bad_field(
                "suffix",
                "'suffix' is not supported",
            ));
        }
        let echo = fields.take::<bool>("echo")?.unwrap_or(false);
        Ok(CompletionRequest {
            model,
            prompts,
            sampling,
            mode,
            echo,
        })
    }
}

/// `POST /v1/chat/completions`.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    pub model: String,
    /// Each message as the chat template sees it: `role`, `content` as text, other keys as sent.
    pub messages: Vec<Value>,
    /// `tools`, handed to the template as it came.
    pub tools: Option<Value>,
    pub sampling: Sampling,
    pub mode: StreamMode,
}

impl ChatRequest {
    pub fn parse(body: &[u8]) -> Result<ChatRequest, OpenAiError> {
        let mut fields = Fields::parse(body)?;
        let model = fields.require::<String>("model")?;
        let raw = fields.require::<Vec<Map<String, Value>>>("messages")?;
        if raw.is_empty() {
            return Err(OpenAiError::bad_field(
                "messages",
                "'messages' must not be empty",
            ));
        }
        let messages = raw
            .into_iter()
            .enumerate()
            .map(|(i, m)| normalize_message(i, m))
            .collect::<Result<Vec<_>, _>>()?;
        let tools = fields.take::<Value>("tools")?;
        let sampling = Sampling::take(&mut fields, &["max_tokens", "max_completion_tokens"])?;
        let mode = StreamMode::take(&mut fields)?;
        Ok(ChatRequest {
            model,
            messages,
            tools,
            sampling,
            mode,
        })
    }
}

/// A message with a string `role` and its `content` as one text (parts of type `text` joined).
fn normalize_message(index: usize, mut message: Map<String, Value>) -> Result<Value, OpenAiError> {
    let param = format!("messages[{index}]");
    match message.get("role") {
        Some(Value::String(_)) => {}
        _ => {
            return Err(OpenAiError::bad_field(
                &param,
                format!("'{param}.role' is a required string"),
            ));
        }
    }
    let content = match message.remove("content") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s,
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for part in parts {
                match (part.get("type"), part.get("text")) {
                    (Some(Value::String(t)), Some(Value::String(s))) if t == "text" => {
                        text.push_str(s)
                    }
                    _ => {
                        return Err(OpenAiError::bad_field(
                            &param,
                            format!("'{param}.content': only parts of type 'text' are supported"),
                        ));
                    }
                }
            }
            text
        }
        Some(_) => {
            return Err(OpenAiError::bad_field(
                &param,
                format!("'{param}.content' must be a string or a list of text parts"),
            ));
        }
    };
    message.insert("content".into(), Value::String(content));
    Ok(Value::Object(message))
}

/// `POST /v1/embeddings`.
#[derive(Clone, Debug, PartialEq)]
pub struct EmbeddingRequest {
    pub model: String,
    pub inputs: Vec<String>,
    /// `encoding_format: "base64"`: each vector as base64 of its little-endian f32s.
    pub base64: bool,
}

impl EmbeddingRequest {
    pub fn parse(body: &[u8]) -> Result<EmbeddingRequest, OpenAiError> {
        let mut fields = Fields::parse(body)?;
        let model = fields.require::<String>("model")?;
        let inputs = strings(&mut fields, "input")?
            .ok_or_else(|| OpenAiError::bad_field("input", "'input' is a required property"))?;
        if inputs.is_empty() {
            return Err(OpenAiError::bad_field(
                "input",
                "'input' must not be an empty list",
            ));
        }
        let base64 = match fields.take::<String>("encoding_format")?.as_deref() {
            None | Some("float") => false,
            Some("base64") => true,
            Some(other) => {
                return Err(OpenAiError::bad_field(
                    "encoding_format",
                    format!("'encoding_format' must be 'float' or 'base64', got '{other}'"),
                ));
            }
        };
        if fields.take::<u64>("dimensions")?.is_some() {
            return Err(OpenAiError::bad_field(
                "dimensions",
                "'dimensions' is not supported: the model's output sets the vector's length",
            ));
        }
        Ok(EmbeddingRequest {
            model,
            inputs,
            base64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(err: OpenAiError) -> Option<String> {
        assert_eq!(err.status.as_u16(), 400, "{}", err.message);
        err.param
    }

    #[test]
    fn completion_fields_are_read_and_checked() {
        let r = CompletionRequest::parse(
            br#"{"model":"m","prompt":"hi","max_tokens":5,"stop":"x","stream":true,
                 "stream_options":{"include_usage":true},"user":"ignored"}"#,
        )
        .unwrap();
        assert_eq!(r.prompts, vec!["hi"]);
        assert_eq!(r.sampling.max_tokens, Some(5));
        assert_eq!(r.sampling.stop, vec!["x"]);
        assert!(r.mode.stream && r.mode.include_usage);
        assert_eq!(
            Value::Object(r.sampling.to_json()),
            json!({"max_tokens": 5, "stop": ["x"]})
        );
    }

    #[test]
    fn bad_fields_are_named() {
        let bad = |body: &str| param(CompletionRequest::parse(body.as_bytes()).unwrap_err());
        assert_eq!(bad(r#"{"prompt":"a"}"#).as_deref(), Some("model"));
        assert_eq!(bad(r#"{"model":"m"}"#).as_deref(), Some("prompt"));
        assert_eq!(
            bad(r#"{"model":"m","prompt":[1,2]}"#).as_deref(),
            Some("prompt")
        );
        assert_eq!(
            bad(r#"{"model":"m","prompt":"a","temperature":3}"#).as_deref(),
            Some("temperature")
        );
        assert_eq!(
            bad(r#"{"model":"m","prompt":"a","max_tokens":"x"}"#).as_deref(),
            Some("max_tokens")
        );
        assert_eq!(
            bad(r#"{"model":"m","prompt":"a","max_tokens":0}"#).as_deref(),
            Some("max_tokens")
        );
        assert_eq!(
            bad(r#"{"model":"m","prompt":"a","n":2}"#).as_deref(),
            Some("n")
        );
        assert_eq!(
            bad(r#"{"model":"m","prompt":"a","stream_options":{"include_usage":true}}"#).as_deref(),
            Some("stream_options")
        );
        assert_eq!(bad("[1]"), None);
        assert_eq!(bad("{"), None);
    }

    #[test]
    fn chat_content_parts_become_text() {
        let r = ChatRequest::parse(
            br#"{"model":"m","max_completion_tokens":3,"messages":[
                {"role":"system","content":"s"},
                {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#,
        )
        .unwrap();
        assert_eq!(r.messages[1], json!({"role": "user", "content": "ab"}));
        assert_eq!(r.sampling.max_tokens, Some(3));
        let err = ChatRequest::parse(br#"{"model":"m","messages":[{"content":"x"}]}"#).unwrap_err();
        assert_eq!(param(err).as_deref(), Some("messages[0]"));
    }

    #[test]
    fn embedding_inputs_and_format() {
        let r = EmbeddingRequest::parse(
            br#"{"model":"e","input":["a","b"],"encoding_format":"base64"}"#,
        )
        .unwrap();
        assert_eq!(r.inputs, vec!["a", "b"]);
        assert!(r.base64);
        let err = EmbeddingRequest::parse(br#"{"model":"e","input":"a","encoding_format":"x"}"#)
            .unwrap_err();
        assert_eq!(param(err).as_deref(), Some("encoding_format"));
    }
}
