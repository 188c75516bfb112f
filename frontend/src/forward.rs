//! Header forwarding, as Triton has it: `--http-header-forward-pattern REGEX` and
//! `--grpc-header-forward-pattern REGEX` copy the request headers (gRPC metadata) whose names
//! match into the inference request's parameters, as string parameters the model reads like any
//! custom parameter (a Python model in `request.parameters()`).
//!
//! ```text
//! flag ─► HeaderForward::new: "(?i)" + REGEX (Triton prefixes it so; "(?-i)" in REGEX turns
//!         case-sensitivity back on)
//! HTTP infer  (http::infer)   headers  ─┐
//! gRPC infer  (grpc::infer)   metadata ─┼─► HeaderForward::apply ─► InferRequest::parameters
//! gRPC stream (grpc::stream)  metadata ─┘   (unanchored match on the name, as RE2::PartialMatch)
//! ```
//!
//! A matching header named like a reserved parameter (`sequence_id`, `priority`, ...,
//! [`RESERVED_PARAMETER_KEYS`]) or starting with `triton_` fails the request with
//! INVALID_ARGUMENT, as current Triton refuses it. A forwarded header replaces a request
//! parameter of the same name (Triton 2.51 adds both, and its Python backend's JSON then keeps
//! the header's, the later one). Header names reach the pattern lower-cased: HTTP/2 and gRPC send
//! them so, and the HTTP/1.1 server lower-cases them too (Triton's HTTP/1.1 server keeps the
//! client's spelling). Binary (`-bin`) gRPC metadata is not forwarded.

use std::fmt;

use http::HeaderMap;
use nereid_proto::{ParamValue, Parameters, RESERVED_PARAMETER_KEYS, ServiceError, ServiceResult};
use regex::Regex;
use tonic::metadata::{KeyAndValueRef, MetadataMap};

/// The compiled `--*-header-forward-pattern`; [`HeaderForward::default`] forwards nothing.
#[derive(Clone, Default)]
pub struct HeaderForward {
    /// The operator's pattern as given (for messages and equality) and its compiled,
    /// case-insensitive form.
    pattern: Option<(String, Regex)>,
}

impl HeaderForward {
    /// Compiles `pattern` case-insensitively (Triton's `(?i)` prefix); an empty pattern, as in
    /// Triton, forwards nothing.
    pub fn new(pattern: &str) -> Result<HeaderForward, regex::Error> {
        if pattern.is_empty() {
            return Ok(HeaderForward::default());
        }
        let regex = Regex::new(&format!("(?i){pattern}"))?;
        Ok(HeaderForward {
            pattern: Some((pattern.to_string(), regex)),
        })
    }

    /// Whether any header is forwarded.
    pub fn is_enabled(&self) -> bool {
        self.pattern.is_some()
    }

    /// Adds `headers` whose names match to `parameters`.
    pub fn apply_http(
        &self,
        headers: &HeaderMap,
        parameters: &mut Parameters,
    ) -> ServiceResult<()> {
        let Some((_, regex)) = &self.pattern else {
            return Ok(());
        };
        let pairs = headers
            .iter()
            .map(|(name, value)| (name.as_str(), String::from_utf8_lossy(value.as_bytes())));
        forward(regex, pairs, parameters)
    }

    /// Adds the text `metadata` entries whose names match to `parameters`.
    pub fn apply_grpc(
        &self,
        metadata: &MetadataMap,
        parameters: &mut Parameters,
    ) -> ServiceResult<()> {
        let Some((_, regex)) = &self.pattern else {
            return Ok(());
        };
        let pairs = metadata.iter().filter_map(|entry| match entry {
            KeyAndValueRef::Ascii(key, value) => Some((
                key.as_str(),
                String::from_utf8_lossy(value.as_encoded_bytes()),
            )),
            KeyAndValueRef::Binary(..) => None,
        });
        forward(regex, pairs, parameters)
    }
}

/// The one rule both protocols follow: every matching name becomes a string parameter, unless it
/// names a parameter Triton reserves.
fn forward<'a>(
    regex: &Regex,
    pairs: impl Iterator<Item = (&'a str, std::borrow::Cow<'a, str>)>,
    parameters: &mut Parameters,
) -> ServiceResult<()> {
    for (name, value) in pairs {
        if !regex.is_match(name) {
            continue;
        }
        if RESERVED_PARAMETER_KEYS.contains(&name) || name.starts_with("triton_") {
            return Err(ServiceError::invalid(format!(
                "Header '{name}' is reserved for Triton usage and cannot be forwarded."
            )));
        }
        parameters.insert(name.to_string(), ParamValue::String(value.into_owned()));
    }
    Ok(())
}

impl PartialEq for HeaderForward {
    fn eq(&self, other: &Self) -> bool {
        let pattern = |f: &HeaderForward| f.pattern.as_ref().map(|(p, _)| p.clone());
        pattern(self) == pattern(other)
    }
}

impl Eq for HeaderForward {}

impl fmt::Debug for HeaderForward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.pattern {
            Some((pattern, _)) => write!(f, "HeaderForward({pattern:?})"),
            None => f.write_str("HeaderForward(off)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                http::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    fn string(s: &str) -> ParamValue {
        ParamValue::String(s.into())
    }

    #[test]
    fn matching_headers_become_string_parameters_case_insensitively() {
        let forward = HeaderForward::new("MY_HEADER.*").unwrap();
        let mut params = Parameters::new();
        params.insert("client".into(), ParamValue::Int(7));
        let sent = headers(&[
            ("my_header_1", "one"),
            ("x-my_header_2", "two"),
            ("other", "no"),
            ("content-type", "application/json"),
        ]);
        forward.apply_http(&sent, &mut params).unwrap();
        assert_eq!(params.len(), 3, "{params:?}");
        assert_eq!(params["client"], ParamValue::Int(7));
        assert_eq!(params["my_header_1"], string("one"));
        // Unanchored, as RE2::PartialMatch.
        assert_eq!(params["x-my_header_2"], string("two"));
    }

    #[test]
    fn a_case_sensitive_pattern_needs_the_exact_case() {
        let forward = HeaderForward::new("(?-i)MY_HEADER.*").unwrap();
        let mut params = Parameters::new();
        forward
            .apply_http(&headers(&[("my_header_1", "one")]), &mut params)
            .unwrap();
        assert!(params.is_empty(), "{params:?}");
        let forward = HeaderForward::new("(?-i)my_header.*").unwrap();
        forward
            .apply_http(&headers(&[("my_header_1", "one")]), &mut params)
            .unwrap();
        assert_eq!(params["my_header_1"], string("one"));
    }

    #[test]
    fn no_pattern_forwards_nothing() {
        for forward in [HeaderForward::default(), HeaderForward::new("").unwrap()] {
            assert!(!forward.is_enabled());
            let mut params = Parameters::new();
            forward
                .apply_http(&headers(&[("my_header_1", "one")]), &mut params)
                .unwrap();
            assert!(params.is_empty());
        }
    }

    #[test]
    fn a_header_replaces_the_request_parameter_of_its_name() {
        let forward = HeaderForward::new("^dup$").unwrap();
        let mut params = Parameters::new();
        params.insert("dup".into(), ParamValue::Int(1));
        forward
            .apply_http(&headers(&[("dup", "from-header")]), &mut params)
            .unwrap();
        assert_eq!(params["dup"], string("from-header"));
    }

    #[test]
    fn reserved_names_and_triton_prefixes_are_refused() {
        let forward = HeaderForward::new(".*").unwrap();
        for name in ["sequence_id", "priority", "timeout", "headers", "triton_x"] {
            let mut params = Parameters::new();
            let err = forward
                .apply_http(&headers(&[(name, "1")]), &mut params)
                .unwrap_err();
            assert!(matches!(err, ServiceError::InvalidArgument(_)), "{err:?}");
            assert_eq!(
                err.to_string(),
                format!("Header '{name}' is reserved for Triton usage and cannot be forwarded.")
            );
        }
        // Not matched: not refused.
        let forward = HeaderForward::new("^my_").unwrap();
        let mut params = Parameters::new();
        forward
            .apply_http(&headers(&[("triton_x", "1"), ("my_a", "2")]), &mut params)
            .unwrap();
        assert_eq!(params.len(), 1);
    }

    #[test]
    fn grpc_metadata_is_forwarded_except_binary_entries() {
        let forward = HeaderForward::new("my_").unwrap();
        let mut metadata = MetadataMap::new();
        metadata.insert("my_text", "value".parse().unwrap());
        metadata.insert_bin(
            "my_blob-bin",
            tonic::metadata::MetadataValue::from_bytes(b"\x00\x01"),
        );
        let mut params = Parameters::new();
        forward.apply_grpc(&metadata, &mut params).unwrap();
        assert_eq!(params.len(), 1, "{params:?}");
        assert_eq!(params["my_text"], string("value"));
    }

    #[test]
    fn a_bad_pattern_is_an_error() {
        assert!(HeaderForward::new("(unclosed").is_err());
    }
}
