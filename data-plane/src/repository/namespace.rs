//! Model namespaces (`--model-namespacing`, as Triton's flag): models of the same name in
//! different repositories all load, each in the namespace of its repository.
//!
//! ```text
//! off: key = name                          (a name in two repositories: served from neither)
//! on:  key = <repository>/<name>           (every model; the repository is its namespace)
//!      a request's bare name ─► resolve: the one key with that name, or Triton's ambiguity
//!      error; an ensemble's step ─► the key in the ensemble's own namespace, else the one key
//!      with that name anywhere ([`resolve_from`])
//! ```
//!
//! A model name is a directory name and never holds `/`, so a key with a `/` is always
//! qualified and a bare name never is.

/// The key of model `name` in the repository `namespace`.
pub fn qualified(namespace: &str, name: &str) -> String {
    format!("{}/{name}", namespace.trim_end_matches('/'))
}

/// Whether `key` names its namespace (`<repository>/<name>`).
pub fn is_qualified(key: &str) -> bool {
    key.contains('/')
}

/// The model name of a key.
pub fn name_of(key: &str) -> &str {
    key.rsplit('/').next().unwrap_or(key)
}

/// The namespace of a key; `None` for a bare name.
pub fn namespace_of(key: &str) -> Option<&str> {
    key.rsplit_once('/').map(|(namespace, _)| namespace)
}

/// The keys among `keys` that `name` may mean: itself when qualified or present, else every
/// qualified key with that name.
pub fn matching<'a>(name: &str, keys: impl Iterator<Item = &'a String>) -> Vec<String> {
    let keys: Vec<&String> = keys.collect();
    if is_qualified(name) || keys.iter().any(|k| *k == name) {
        return vec![name.to_string()];
    }
    keys.into_iter()
        .filter(|k| is_qualified(k) && name_of(k) == name)
        .cloned()
        .collect()
}

/// Triton's error for a name found in several namespaces.
pub fn ambiguity(name: &str, count: usize) -> String {
    format!(
        "There are {count} identifiers of model '{name}' in global map, model namespace must be provided to resolve ambiguity."
    )
}

/// The key a model of namespace `from` (an ensemble) means by `name` among `keys`: the model
/// of that name in its own namespace, else the only model of that name; else `name` itself
/// (what then fails says why: not found, or ambiguous).
pub fn resolve_from<'a>(
    from: Option<&str>,
    name: &str,
    keys: impl Iterator<Item = &'a String>,
) -> String {
    let keys: Vec<&String> = keys.collect();
    if let Some(namespace) = from {
        let own = qualified(namespace, name);
        if keys.iter().any(|k| **k == own) {
            return own;
        }
    }
    match matching(name, keys.into_iter()).as_slice() {
        [one] => one.clone(),
        _ => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn keys_split_into_namespace_and_name() {
        let k = qualified("/r/addsub_repo/", "m");
        assert_eq!(k, "/r/addsub_repo/m");
        assert!(is_qualified(&k) && !is_qualified("m"));
        assert_eq!(
            (name_of(&k), namespace_of(&k)),
            ("m", Some("/r/addsub_repo"))
        );
        assert_eq!((name_of("m"), namespace_of("m")), ("m", None));
    }

    #[test]
    fn names_resolve_to_one_key_or_several() {
        let all = keys(&["/a/dup", "/b/dup", "/a/only", "bare"]);
        assert_eq!(matching("only", all.iter()), ["/a/only"]);
        assert_eq!(matching("dup", all.iter()), ["/a/dup", "/b/dup"]);
        assert_eq!(matching("/b/dup", all.iter()), ["/b/dup"]);
        assert_eq!(matching("bare", all.iter()), ["bare"]);
        assert!(matching("ghost", all.iter()).is_empty());
        assert_eq!(
            ambiguity("dup", 2),
            "There are 2 identifiers of model 'dup' in global map, model namespace must be provided to resolve ambiguity."
        );
    }

    #[test]
    fn an_ensemble_prefers_its_own_namespace() {
        let all = keys(&["/a/dup", "/b/dup", "/b/only"]);
        assert_eq!(resolve_from(Some("/a"), "dup", all.iter()), "/a/dup");
        assert_eq!(resolve_from(Some("/b"), "dup", all.iter()), "/b/dup");
        // Not in its own namespace: the only model of that name anywhere.
        assert_eq!(resolve_from(Some("/a"), "only", all.iter()), "/b/only");
        // Ambiguous from elsewhere, or missing: the name itself (the lookup says why).
        assert_eq!(resolve_from(Some("/c"), "dup", all.iter()), "dup");
        assert_eq!(resolve_from(None, "ghost", all.iter()), "ghost");
    }
}
