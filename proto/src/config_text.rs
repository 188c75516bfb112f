//! `config.pbtxt` text → [`ModelConfig`], with errors as `path:line:col: message`.
//!
//! The text is protobuf text format of Triton's `ModelConfig`, parsed by prost-reflect against the
//! descriptor pool from `nereid-proto`. prost-reflect refuses one legal form every Triton config
//! uses, a list of messages without a colon (`input [ { ... } ]`), so [`add_list_colons`] first
//! inserts the colon and remembers where, and error offsets are mapped back to the user's text.

use std::fmt;

use crate::json::descriptor;
use crate::pb::inference::ModelConfig;
use miette::Diagnostic;
use prost_reflect::DynamicMessage;

/// A config file that could not be parsed, with the position of the problem when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextError {
    /// 1-based line of the problem, when the parser knows it.
    pub line: Option<usize>,
    /// 1-based column of the problem, when the parser knows it.
    pub column: Option<usize>,
    /// What is wrong, without the position.
    pub message: String,
}

impl fmt::Display for TextError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(l), Some(c)) => write!(f, "{l}:{c}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

/// Parses protobuf text format into a `ModelConfig`. Unknown fields are errors, as in Triton.
pub fn parse_model_config(text: &str) -> Result<ModelConfig, TextError> {
    let (patched, inserted) = add_list_colons(text);
    let dynamic = DynamicMessage::parse_text_format(descriptor::<ModelConfig>(), &patched)
        .map_err(|e| {
            let offset = e
                .labels()
                .and_then(|mut labels| labels.next())
                .map(|label| original_offset(label.offset(), &inserted));
            let (line, column) = match offset {
                Some(o) => {
                    let (l, c) = line_col(text, o);
                    (Some(l), Some(c))
                }
                None => (None, None),
            };
            TextError {
                line,
                column,
                message: e.to_string(),
            }
        })?;
    dynamic
        .transcode_to::<ModelConfig>()
        .map_err(|e| TextError {
            line: None,
            column: None,
            message: e.to_string(),
        })
}

/// Inserts `:` between a field name and a `[` that follows it without one. Skips strings and
/// `#` comments. Returns the patched text and the original offsets where colons were inserted.
pub fn add_list_colons(text: &str) -> (String, Vec<usize>) {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 16);
    let mut inserted = Vec::new();
    // The last significant byte seen: an identifier character, ':' or something else.
    let mut last = Last::Other;
    let mut i = 0;
    let mut copied = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'#' => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
                continue;
            }
            b'"' | b'\'' => {
                let quote = b;
                i += 1;
                while i < bytes.len() && bytes[i] != quote {
                    if bytes[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                last = Last::Other;
            }
            b'[' if last == Last::Ident => {
                out.push_str(&text[copied..i]);
                out.push(':');
                copied = i;
                inserted.push(i);
                last = Last::Other;
            }
            b':' => last = Last::Colon,
            c if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' => {
                // An identifier directly after ':' is a value (an enum), not a field name.
                last = match last {
                    Last::Colon | Last::Value => Last::Value,
                    Last::Ident | Last::Other => Last::Ident,
                };
            }
            c if c.is_ascii_whitespace() || c == b',' || c == b';' => {
                if last == Last::Value {
                    last = Last::Other;
                }
            }
            _ => last = Last::Other,
        }
        i += 1;
    }
    out.push_str(&text[copied..]);
    (out, inserted)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Last {
    Ident,
    Colon,
    Value,
    Other,
}

fn original_offset(patched: usize, inserted: &[usize]) -> usize {
    // Each insertion at original offset `o` shifts everything from `o` on by one.
    let mut offset = patched;
    for (n, &o) in inserted.iter().enumerate() {
        if patched > o + n {
            offset -= 1;
        }
    }
    offset
}

/// 1-based line and column (in characters) of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |p| p + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIMPLE: &str = r#"
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8   # a comment with [ brackets ]
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  { name: "INPUT1", data_type: TYPE_INT32, dims: [ 16 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
version_policy: { latest: { num_versions: 2 } }
dynamic_batching { preferred_batch_size: [ 4, 8 ] max_queue_delay_microseconds: 100 }
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"#;

    #[test]
    fn parses_triton_style_config() {
        let c = parse_model_config(SIMPLE).unwrap();
        assert_eq!(c.name, "simple");
        assert_eq!(c.max_batch_size, 8);
        assert_eq!(c.input.len(), 2);
        assert_eq!(c.input[1].dims, vec![16]);
        assert_eq!(c.output[0].name, "OUTPUT0");
        assert_eq!(c.instance_group[0].count, 2);
        assert_eq!(c.parameters["intra_op_thread_count"].string_value, "1");
        assert!(c.scheduling_choice.is_some());
    }

    #[test]
    fn unknown_field_reports_line_and_column() {
        let err = parse_model_config("name: \"m\"\nmax_batch_sise: 4\n").unwrap_err();
        assert_eq!((err.line, err.column), (Some(2), Some(1)));
        assert!(err.message.contains("max_batch_sise"), "{err}");
    }

    #[test]
    fn positions_after_an_inserted_colon_map_back() {
        let err = parse_model_config("input [ { name: \"a\" data_type: TYPE_FP33 } ]").unwrap_err();
        assert_eq!((err.line, err.column), (Some(1), Some(32)), "{err}");
        assert!(err.message.contains("TYPE_FP33"));
    }

    #[test]
    fn bad_enum_and_range() {
        let err = parse_model_config("max_batch_size: 99999999999").unwrap_err();
        assert_eq!(err.line, Some(1));
        assert!(err.to_string().starts_with("1:17: "), "{err}");
    }

    #[test]
    fn colons_are_not_inserted_inside_strings_or_after_values() {
        let (patched, inserted) = add_list_colons("name: \"a [b]\"\nx: [1]\ny [2]\n");
        assert_eq!(patched, "name: \"a [b]\"\nx: [1]\ny :[2]\n");
        assert_eq!(inserted.len(), 1);
        let (patched, _) = add_list_colons("kind: KIND_CPU [");
        assert_eq!(patched, "kind: KIND_CPU [");
    }
}
