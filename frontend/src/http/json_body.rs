//! Parsing a request's JSON with a nesting limit checked before the parser runs.
//!
//! Triton refuses tensor `data` nested 100 levels or deeper. serde_json stops at 128 levels with
//! a generic "recursion limit exceeded", so a linear pre-scan of the bytes enforces our own
//! limit first and says what the limit is; serde's limit is then never reached.

use serde_json::Value;

use nereid_proto::{ServiceError, ServiceResult};

/// Triton's `HTTP_MAX_JSON_NESTING_DEPTH`: how deep tensor `data` arrays may nest.
pub const MAX_DATA_DEPTH: usize = 100;

/// Document depth allowed for an infer request: the data limit plus the request object, the
/// `inputs` array and the input object that hold a `data` array.
pub const MAX_REQUEST_DEPTH: usize = MAX_DATA_DEPTH + 3;

pub fn depth_error() -> ServiceError {
    ServiceError::invalid(format!(
        "JSON nesting depth exceeds maximum allowed limit ({MAX_DATA_DEPTH})"
    ))
}

/// Whether arrays and objects in `text` nest deeper than `max`; stops at the first level past it.
fn exceeds_depth(text: &[u8], max: usize) -> bool {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in text {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                if depth > max {
                    return true;
                }
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

/// Parses `text` as JSON no deeper than `max_depth`; `what` names the document in errors.
pub fn parse_json(text: &[u8], max_depth: usize, what: &str) -> ServiceResult<Value> {
    parse_with(text, max_depth, |e| {
        ServiceError::invalid(format!("failed to parse the {what} JSON: {e}"))
    })
}

/// [`parse_json`] for an inference request's JSON: a syntax error is Triton's 500 with its
/// prefix (too deep a document stays the 400 of [`depth_error`]).
pub fn parse_request_json(text: &[u8], max_depth: usize) -> ServiceResult<Value> {
    parse_with(text, max_depth, |e| {
        ServiceError::internal(format!("failed to parse the request JSON buffer: {e}"))
    })
}

fn parse_with(
    text: &[u8],
    max_depth: usize,
    syntax_error: impl FnOnce(serde_json::Error) -> ServiceError,
) -> ServiceResult<Value> {
    if exceeds_depth(text, max_depth) {
        return Err(depth_error());
    }
    serde_json::from_slice(text).map_err(syntax_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> String {
        format!("{}{}", "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn depth_is_counted_outside_strings_only() {
        assert!(!exceeds_depth(nested(5).as_bytes(), 5));
        assert!(exceeds_depth(nested(6).as_bytes(), 5));
        assert!(!exceeds_depth(br#"{"a":"[[[[[[[[\"[[[["}"#, 2));
        assert!(!exceeds_depth(br#"[{"a":1},{"b":[2]}]"#, 3));
    }

    #[test]
    fn deep_documents_are_refused_before_serde_sees_them() {
        // 200 levels would hit serde_json's own limit of 128; the message names ours.
        let err = parse_json(nested(200).as_bytes(), MAX_REQUEST_DEPTH, "request").unwrap_err();
        assert_eq!(
            err.message(),
            "JSON nesting depth exceeds maximum allowed limit (100)"
        );
        assert!(
            parse_json(
                nested(MAX_REQUEST_DEPTH).as_bytes(),
                MAX_REQUEST_DEPTH,
                "request"
            )
            .is_ok()
        );
    }

    #[test]
    fn syntax_errors_say_where() {
        let err = parse_request_json(br#"{"inputs": [}"#, 10).unwrap_err();
        assert!(
            err.message()
                .starts_with("failed to parse the request JSON buffer: "),
            "{}",
            err.message()
        );
        assert!(err.message().contains("line 1 column"), "{}", err.message());
    }
}
