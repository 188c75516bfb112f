//! Chat messages → one prompt, through the model's chat template.
//!
//! ```text
//! <repository>/<model>/tokenizer_config.json   the first repository holding the model's folder
//!   "chat_template": "<jinja>"  or  [{"name": "default", "template": "<jinja>"}, ...]
//!   "bos_token" / "eos_token":   a string or {"content": "..."}
//! none of that ─► DEFAULT_TEMPLATE (ChatML)
//! render(messages, tools, add_generation_prompt = true, bos_token, eos_token) with minijinja,
//! Python string methods (`.strip()`, `.startswith()`, ...) and `raise_exception(msg)`
//! ```
//!
//! The file is read on each request, so a model's template may change without a restart. A
//! template that does not compile is the operator's mistake (500, naming the file); one that
//! fails while rendering these messages (`raise_exception("roles must alternate")`) is the
//! client's (400 on `messages`).

use std::path::{Path, PathBuf};

use minijinja::{Environment, Error, ErrorKind};
use serde_json::Value;

use super::errors::OpenAiError;
use nereid_proto::ServiceError;

/// The template of a model without one: ChatML, one block per message, then the assistant's
/// opening when a reply is wanted.
pub const DEFAULT_TEMPLATE: &str = "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// The file, in the model's folder, that holds its template.
pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";

/// A model's chat template and the special tokens templates refer to.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatTemplate {
    pub source: String,
    /// Where it came from, for messages; `None` for the default.
    pub origin: Option<PathBuf>,
    pub bos_token: String,
    pub eos_token: String,
}

impl ChatTemplate {
    pub fn default_template() -> ChatTemplate {
        ChatTemplate {
            source: DEFAULT_TEMPLATE.to_string(),
            origin: None,
            bos_token: String::new(),
            eos_token: String::new(),
        }
    }
}

/// The template of `model`: its `tokenizer_config.json` in the first of `repositories` that
/// has the model's folder, else the default. A file that is there but unreadable or without a
/// usable `chat_template` is a 500 naming it.
pub async fn load(repositories: &[PathBuf], model: &str) -> Result<ChatTemplate, OpenAiError> {
    // The name comes from the client: never let it walk out of a repository.
    if model.is_empty() || model.contains(['/', '\\']) || model == "." || model == ".." {
        return Ok(ChatTemplate::default_template());
    }
    for repository in repositories {
        let folder = repository.join(model);
        if !tokio::fs::metadata(&folder).await.is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let path = folder.join(TOKENIZER_CONFIG);
        return match tokio::fs::read(&path).await {
            Ok(bytes) => parse(&path, &bytes).map_err(|e| ServiceError::internal(e).into()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Ok(ChatTemplate::default_template())
            }
            Err(e) => Err(ServiceError::internal(format!(
                "model '{model}': cannot read {}: {e}",
                path.display()
            ))
            .into()),
        };
    }
    Ok(ChatTemplate::default_template())
}

/// A `tokenizer_config.json`'s template; a file without `chat_template` gives the default.
pub fn parse(path: &Path, bytes: &[u8]) -> Result<ChatTemplate, String> {
    let doc: Value = serde_json::from_slice(bytes)
        .map_err(|e| format!("{}: not valid JSON: {e}", path.display()))?;
    let source = match doc.get("chat_template") {
        None | Some(Value::Null) => return Ok(ChatTemplate::default_template()),
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(named)) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| {
                format!(
                    "{}: 'chat_template' is a list without a template named 'default'",
                    path.display()
                )
            })?,
        Some(_) => {
            return Err(format!(
                "{}: 'chat_template' must be a string or a list of named templates",
                path.display()
            ));
        }
    };
    let token = |key: &str| match doc.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    };
    Ok(ChatTemplate {
        source,
        origin: Some(path.to_path_buf()),
        bos_token: token("bos_token"),
        eos_token: token("eos_token"),
    })
}

fn raise_exception(message: String) -> Result<String, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// The prompt for `messages` (normalized by `types`), asking for the assistant's reply.
pub fn render(
    template: &ChatTemplate,
    messages: &[Value],
    tools: Option<&Value>,
) -> Result<String, OpenAiError> {
    let mut env = Environment::new();
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    let origin = template.origin.as_ref().map_or_else(
        || "the default chat template".to_string(),
        |p| p.display().to_string(),
    );
    let compiled = env.template_from_str(&template.source).map_err(|e| {
        OpenAiError::from(ServiceError::internal(format!(
            "the chat template of {origin} does not compile: {e}"
        )))
    })?;
    let context = minijinja::context! {
        messages => messages,
        tools => tools,
        add_generation_prompt => true,
        bos_token => template.bos_token,
        eos_token => template.eos_token,
    };
    compiled.render(context).map_err(|e| {
        let why = e.detail().map_or_else(|| e.to_string(), str::to_string);
        OpenAiError::bad_field(
            "messages",
            format!("the chat template ({origin}) refused these messages: {why}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn default_template_is_chatml() {
        let messages = [
            json!({"role": "system", "content": "be brief"}),
            json!({"role": "user", "content": "hi"}),
        ];
        let prompt = render(&ChatTemplate::default_template(), &messages, None).unwrap();
        assert_eq!(
            prompt,
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn tokenizer_config_template_with_tokens_and_python_methods() {
        let config = json!({
            "bos_token": {"content": "<s>"},
            "eos_token": "</s>",
            "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m.role | upper }}] {{ m.content.strip() }}{% if not loop.last %} {% endif %}{% endfor %}{{ eos_token }}"
        });
        let t = parse(Path::new("tc.json"), config.to_string().as_bytes()).unwrap();
        let prompt = render(&t, &[json!({"role": "user", "content": "  hello "})], None).unwrap();
        assert_eq!(prompt, "<s>[USER] hello</s>");
    }

    #[test]
    fn named_templates_and_missing_template() {
        let config = json!({"chat_template": [{"name": "tool_use", "template": "T"},
                                              {"name": "default", "template": "D"}]});
        let t = parse(Path::new("x"), config.to_string().as_bytes()).unwrap();
        assert_eq!(t.source, "D");
        let none = parse(Path::new("x"), b"{\"eos_token\": \"e\"}").unwrap();
        assert_eq!(none, ChatTemplate::default_template());
        assert!(parse(Path::new("x"), b"{").is_err());
    }

    #[test]
    fn raise_exception_is_the_clients_error() {
        let t = ChatTemplate {
            source: "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok".into(),
            ..ChatTemplate::default_template()
        };
        let err = render(&t, &[json!({"role": "system", "content": ""})], None).unwrap_err();
        assert_eq!(err.status.as_u16(), 400);
        assert!(
            err.message.contains("first must be user"),
            "{}",
            err.message
        );
        let broken = ChatTemplate {
            source: "{% for %}".into(),
            ..ChatTemplate::default_template()
        };
        assert_eq!(render(&broken, &[], None).unwrap_err().status.as_u16(), 500);
    }

    #[tokio::test]
    async fn loads_from_the_model_folder_only() {
        let dir =
            std::env::temp_dir().join(format!("nereid-openai-template-{}", std::process::id()));
        let model = dir.join("chat");
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join(TOKENIZER_CONFIG), br#"{"chat_template": "X"}"#).unwrap();
        let repos = [dir.clone()];
        assert_eq!(load(&repos, "chat").await.unwrap().source, "X");
        assert_eq!(
            load(&repos, "other").await.unwrap(),
            ChatTemplate::default_template()
        );
        assert_eq!(
            load(&repos, "../chat").await.unwrap(),
            ChatTemplate::default_template()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
