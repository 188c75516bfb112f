//! Control-plane addresses as operators write them, checked and normalized once, before
//! anything connects.
//!
//! ```text
//! " cp-1:7000 "          ─► given "cp-1:7000",        uri "http://cp-1:7000"
//! "HTTP://CP-1:7000/"    ─► given "HTTP://CP-1:7000/", uri "http://cp-1:7000"
//! "https://cp-1"         ─► given "https://cp-1",      uri "http://cp-1:443"  (TLS: the dialer's)
//! "grpc://cp-1:7000"     ─► error: scheme not supported
//! ```
//!
//! The `given` form is what logs and error messages show (the operator recognizes it); the
//! `uri` form is what connects, and its authority (`host:port`, lower case) is how a leader
//! hint from the control plane (always `host:port`) is matched to a listed address.

use crate::error::ClientError;

/// One checked control-plane address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    given: String,
    uri: String,
    authority: String,
}

impl Address {
    /// Parses `host:port` or `http(s)://host:port[/]`; surrounding blanks are ignored.
    pub fn parse(text: &str) -> Result<Address, ClientError> {
        let given = text.trim();
        let invalid = |reason: String| ClientError::InvalidAddress {
            address: given.to_string(),
            reason,
        };
        if given.is_empty() {
            return Err(invalid("empty".into()));
        }
        let with_scheme = if given.contains("://") {
            given.to_string()
        } else {
            format!("http://{given}")
        };
        let uri: http::Uri = with_scheme
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(e.to_string()))?;
        let scheme = uri.scheme_str().unwrap_or_default().to_ascii_lowercase();
        if scheme != "http" && scheme != "https" {
            return Err(invalid(format!(
                "scheme '{scheme}' is not supported; write host:port or http://host:port"
            )));
        }
        let Some(authority) = uri.authority().filter(|a| !a.host().is_empty()) else {
            return Err(invalid("no host; write host:port".into()));
        };
        let has_port_text = authority.as_str().len() > authority.host().len();
        if has_port_text && authority.port_u16().is_none() {
            return Err(invalid("the port must be a number; write host:port".into()));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(invalid(
                "a control-plane address has no path; write host:port".into(),
            ));
        }
        let mut authority = authority.as_str().to_ascii_lowercase();
        if scheme == "https" && !has_port_text {
            authority.push_str(":443");
        }
        // Always `http`: TLS is the dialer's choice (`--cluster-tls-*`, `ClusterDial`), and
        // tonic refuses an `https` URI on a channel whose TLS it did not configure itself.
        Ok(Address {
            given: given.to_string(),
            uri: format!("http://{authority}"),
            authority,
        })
    }

    /// The address as the operator wrote it (trimmed).
    pub fn given(&self) -> &str {
        &self.given
    }

    /// The normalized URI a channel connects to.
    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Whether `self` and `other` name the same node (same `host:port`, any scheme).
    pub fn same_node(&self, other: &Address) -> bool {
        self.authority == other.authority
    }
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.given)
    }
}

/// Parses a list of addresses; blank entries (a trailing comma) are skipped, and an empty
/// list is an error.
pub fn parse_list<S: AsRef<str>>(texts: &[S]) -> Result<Vec<Address>, ClientError> {
    let addresses = texts
        .iter()
        .map(AsRef::as_ref)
        .filter(|t| !t.trim().is_empty())
        .map(Address::parse)
        .collect::<Result<Vec<_>, _>>()?;
    if addresses.is_empty() {
        return Err(ClientError::NoAddress);
    }
    Ok(addresses)
}

/// The position in `addresses` of the node a leader hint names; `None` when the hint does not
/// parse or names a node that is not listed (see [`crate`] on why unlisted ones are not used).
pub fn position_of(addresses: &[Address], hint: &str) -> Option<usize> {
    let hint = Address::parse(hint).ok()?;
    addresses.iter().position(|a| a.same_node(&hint))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_gets_a_scheme_and_uris_are_normalized() {
        let a = Address::parse(" 127.0.0.1:7000 ").unwrap();
        assert_eq!(
            (a.given(), a.uri()),
            ("127.0.0.1:7000", "http://127.0.0.1:7000")
        );
        let a = Address::parse("HTTP://CP-1.Example:7000/").unwrap();
        assert_eq!(a.given(), "HTTP://CP-1.Example:7000/");
        assert_eq!(a.uri(), "http://cp-1.example:7000");
        assert_eq!(a.to_string(), "HTTP://CP-1.Example:7000/");
        let a = Address::parse("https://cp:443").unwrap();
        assert_eq!(a.uri(), "http://cp:443");
        let a = Address::parse("[::1]:7000").unwrap();
        assert_eq!(a.uri(), "http://[::1]:7000");
    }

    #[test]
    fn bad_addresses_say_what_to_write() {
        for (text, needle) in [
            ("", "empty"),
            ("grpc://cp:7000", "scheme 'grpc' is not supported"),
            ("http://cp:7000/api", "has no path"),
            ("http://", "control-plane address 'http://'"),
            ("cp:notaport", "the port must be a number"),
        ] {
            let e = Address::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn lists_skip_blanks_and_must_not_be_empty() {
        let list = parse_list(&["a:1", " ", "http://b:2"]).unwrap();
        let given: Vec<_> = list.iter().map(Address::given).collect();
        assert_eq!(given, ["a:1", "http://b:2"]);
        assert!(matches!(
            parse_list::<&str>(&[]),
            Err(ClientError::NoAddress)
        ));
        assert!(matches!(
            parse_list(&["", " "]),
            Err(ClientError::NoAddress)
        ));
        assert!(parse_list(&["a:1", "ftp://b:2"]).is_err());
    }

    #[test]
    fn hints_match_listed_nodes_by_host_and_port() {
        let list = parse_list(&["cp-1:7000", "https://CP-2:7000/", "cp-3:7000"]).unwrap();
        assert_eq!(position_of(&list, "cp-2:7000"), Some(1));
        assert_eq!(position_of(&list, "cp-3:7000"), Some(2));
        assert_eq!(position_of(&list, "cp-2:7001"), None, "another port");
        assert_eq!(position_of(&list, "cp-9:7000"), None, "not listed");
        assert_eq!(position_of(&list, ""), None);
    }
}
