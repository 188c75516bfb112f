//! Rules for the names operators type: model names, node ids and source URIs.
//!
//! Names are DNS-label-ish so they fit in URLs, metric labels and Kubernetes objects, but
//! also accept `_` and `.` because Triton model repositories commonly use them
//! (`densenet_onnx`): 1 to 63 ASCII letters, digits, `-`, `_` or `.`, starting and ending
//! with a letter or digit.

use super::error::StateError;

/// Longest accepted model name or node id (a DNS label's limit).
pub const MAX_NAME_LEN: usize = 63;

/// Checks a model name or node id; `subject` names the object in the error.
pub(crate) fn validate_name(subject: &str, field: &str, name: &str) -> Result<(), StateError> {
    if name.is_empty() {
        return Err(StateError::invalid(subject, field, "must not be empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(StateError::invalid(
            subject,
            field,
            format!(
                "is {} characters long, the limit is {MAX_NAME_LEN}",
                name.len()
            ),
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(StateError::invalid(
            subject,
            field,
            format!("contains {c:?}; use ASCII letters, digits, '-', '_' or '.'"),
        ));
    }
    let edge_ok = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !edge_ok(name.chars().next()) || !edge_ok(name.chars().last()) {
        return Err(StateError::invalid(
            subject,
            field,
            "must start and end with a letter or digit",
        ));
    }
    Ok(())
}

/// Checks that a source URI has a scheme (`file://`, `s3://`, `gs://`, ...) and a location
/// after it. Which schemes a worker can fetch is the worker's concern, not the registry's.
pub(crate) fn validate_source_uri(subject: &str, uri: &str) -> Result<(), StateError> {
    let field = "source";
    let Some((scheme, rest)) = uri.split_once("://") else {
        return Err(StateError::invalid(
            subject,
            field,
            format!("'{uri}' has no scheme; expected e.g. file:///models/NAME or s3://bucket/NAME"),
        ));
    };
    let scheme_ok = scheme
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !scheme_ok {
        return Err(StateError::invalid(
            subject,
            field,
            format!("'{uri}' has an invalid scheme '{scheme}'"),
        ));
    }
    if rest.is_empty() {
        return Err(StateError::invalid(
            subject,
            field,
            format!("'{uri}' has no location after the scheme"),
        ));
    }
    Ok(())
}
