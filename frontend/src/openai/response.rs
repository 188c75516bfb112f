//! The JSON of completion and chat answers, whole and as stream chunks, from one
//! [`Envelope`] per request (its id, creation time, model and kind), so that every chunk of a
//! stream carries the same `id` and `created` as OpenAI's do.
//!
//! ```text
//! text:  {"id":"cmpl-…","object":"text_completion","created","model",
//!         "choices":[{"index","text","logprobs":null,"finish_reason"}],"usage"}
//! chat:  {"id":"chatcmpl-…","object":"chat.completion","created","model",
//!         "choices":[{"index","message":{"role":"assistant","content"},"logprobs":null,
//!                     "finish_reason"}],"usage"}
//! chunk: the same envelope, object "text_completion" / "chat.completion.chunk", one choice
//!        with `text` / `delta` and finish_reason null until the last; with include_usage
//!        every chunk has "usage": null and a last one has "choices": [] and the usage
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

/// Which answer shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Text,
    Chat,
}

/// What every chunk of one answer shares.
#[derive(Clone, Debug, PartialEq)]
pub struct Envelope {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub kind: Kind,
    /// Chunks carry `"usage": null` (the client asked for a usage chunk).
    pub usage_field: bool,
}

/// Seconds since the epoch.
pub fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A new id, unique in this process and unlikely to repeat across restarts.
fn new_id(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{prefix}-{:x}{nanos:08x}{n:06x}", now())
}

impl Envelope {
    pub fn new(kind: Kind, model: &str, usage_field: bool) -> Envelope {
        let prefix = match kind {
            Kind::Text => "cmpl",
            Kind::Chat => "chatcmpl",
        };
        Envelope {
            id: new_id(prefix),
            created: now(),
            model: model.to_string(),
            kind,
            usage_field,
        }
    }

    fn wrap(&self, object: &str, choices: Vec<Value>, usage: Option<Value>) -> Value {
        let mut map = Map::new();
        map.insert("id".into(), json!(self.id));
        map.insert("object".into(), json!(object));
        map.insert("created".into(), json!(self.created));
        map.insert("model".into(), json!(self.model));
        map.insert("choices".into(), Value::Array(choices));
        if usage.is_some() || self.usage_field {
            map.insert("usage".into(), usage.unwrap_or(Value::Null));
        }
        Value::Object(map)
    }

    fn chunk_object(&self) -> &'static str {
        match self.kind {
            Kind::Text => "text_completion",
            Kind::Chat => "chat.completion.chunk",
        }
    }

    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Value {
        let mut choice = match self.kind {
            Kind::Text => json!({"index": 0, "text": delta}),
            Kind::Chat => json!({"index": 0, "delta": delta}),
        };
        choice["logprobs"] = Value::Null;
        choice["finish_reason"] = json!(finish_reason);
        self.wrap(self.chunk_object(), vec![choice], None)
    }

    /// The chat stream's first chunk: the assistant's role, no text yet.
    pub fn role_chunk(&self) -> Value {
        self.chunk(json!({"role": "assistant", "content": ""}), None)
    }

    /// A piece of text.
    pub fn text_chunk(&self, text: &str) -> Value {
        match self.kind {
            Kind::Text => self.chunk(json!(text), None),
            Kind::Chat => self.chunk(json!({"content": text}), None),
        }
    }

    /// The last chunk of the choice: no text, the finish reason.
    pub fn finish_chunk(&self, finish_reason: &str) -> Value {
        match self.kind {
            Kind::Text => self.chunk(json!(""), Some(finish_reason)),
            Kind::Chat => self.chunk(json!({}), Some(finish_reason)),
        }
    }

    /// `stream_options.include_usage`'s chunk: no choices, the usage.
    pub fn usage_chunk(&self, usage: Value) -> Value {
        self.wrap(self.chunk_object(), Vec::new(), Some(usage))
    }

    /// The whole answer: one choice per (text, finish reason), in order.
    pub fn complete(&self, choices: Vec<(String, &str)>, usage: Value) -> Value {
        let choices = choices
            .into_iter()
            .enumerate()
            .map(|(index, (text, finish_reason))| {
                let mut choice = match self.kind {
                    Kind::Text => json!({"index": index, "text": text}),
                    Kind::Chat => json!({
                        "index": index,
                        "message": {"role": "assistant", "content": text},
                    }),
                };
                choice["logprobs"] = Value::Null;
                choice["finish_reason"] = json!(finish_reason);
                choice
            })
            .collect();
        let object = match self.kind {
            Kind::Text => "text_completion",
            Kind::Chat => "chat.completion",
        };
        self.wrap(object, choices, Some(usage))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_share_id_and_shape() {
        let e = Envelope::new(Kind::Chat, "m", true);
        let role = e.role_chunk();
        let text = e.text_chunk("hi");
        assert_eq!(role["id"], text["id"]);
        assert!(e.id.starts_with("chatcmpl-"));
        assert_eq!(text["object"], "chat.completion.chunk");
        assert_eq!(text["choices"][0]["delta"], json!({"content": "hi"}));
        assert_eq!(text["usage"], Value::Null);
        assert_eq!(
            e.finish_chunk("stop")["choices"][0]["finish_reason"],
            "stop"
        );
        let usage = e.usage_chunk(json!({"total_tokens": 1}));
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["total_tokens"], 1);
    }

    #[test]
    fn text_completion_whole() {
        let e = Envelope::new(Kind::Text, "m", false);
        let c = e.complete(vec![("a b".into(), "length")], json!({"total_tokens": 2}));
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["choices"][0]["text"], "a b");
        assert_eq!(c["choices"][0]["finish_reason"], "length");
        assert!(e.text_chunk("x").get("usage").is_none());
    }
}
