//! The model repository on disk: Triton's layout, several repositories, version folders.
//!
//! ```text
//! <repository>/<model>/config.pbtxt
//! <repository>/<model>/<version>/model.onnx      version = positive integer, no leading zero
//! ```
//!
//! Scanning is pure file-system reading with no side effects, so poll mode can rescan at will
//! and compare [`Fingerprint`]s to see what changed. Object-store repositories are mirrored
//! into local directories first ([`remote`]), so the scan only ever reads a disk. With
//! `--model-namespacing` ([`scan_namespaced`]) a model is known by its [`namespace`] key, so
//! the same name in two repositories is two models.

use std::collections::BTreeMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use nereid_proto::pb::inference::ModelVersionPolicy;
use nereid_proto::pb::inference::model_version_policy::PolicyChoice;

pub mod namespace;
pub mod remote;

/// A model directory found in a repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelDir {
    pub name: String,
    pub path: PathBuf,
}

/// [`scan`], or with namespacing every model keyed by `<repository>/<name>`
/// ([`namespace::qualified`]): no duplicates.
pub fn scan_namespaced(repositories: &[PathBuf], namespacing: bool) -> std::io::Result<ScanResult> {
    if !namespacing {
        return scan(repositories);
    }
    let mut out = ScanResult::default();
    for repo in repositories {
        let found = scan(std::slice::from_ref(repo))?;
        let namespace = repo.display().to_string();
        for (name, dir) in found.models {
            out.models
                .insert(namespace::qualified(&namespace, &name), dir);
        }
    }
    Ok(out)
}

/// Lists the model directories of all repositories. A name found in two repositories is
/// reported in `duplicates` and served from neither (Triton refuses ambiguous names).
pub fn scan(repositories: &[PathBuf]) -> std::io::Result<ScanResult> {
    let mut models: BTreeMap<String, ModelDir> = BTreeMap::new();
    let mut duplicates = BTreeMap::new();
    for repo in repositories {
        for entry in std::fs::read_dir(repo)? {
            let entry = entry?;
            if !entry.file_type()?.is_dir() && !entry.path().is_dir() {
                continue;
            }
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if name.starts_with('.') {
                continue;
            }
            let dir = ModelDir {
                name: name.clone(),
                path: entry.path(),
            };
            if let Some(first) = models.remove(&name) {
                duplicates.insert(name, vec![first.path, dir.path]);
            } else if let Some(paths) = duplicates.get_mut(&name) {
                paths.push(dir.path);
            } else {
                models.insert(name, dir);
            }
        }
    }
    Ok(ScanResult { models, duplicates })
}

/// What [`scan`] found.
#[derive(Clone, Debug, Default)]
pub struct ScanResult {
    pub models: BTreeMap<String, ModelDir>,
    /// Names present in more than one repository, with every path.
    pub duplicates: BTreeMap<String, Vec<PathBuf>>,
}

/// The numeric version directories of a model (Triton ignores other names, and names with a
/// leading zero).
pub fn version_dirs(model_dir: &Path) -> BTreeMap<i64, PathBuf> {
    let mut versions = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(model_dir) else {
        return versions;
    };
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if name.starts_with('0') || !entry.path().is_dir() {
            continue;
        }
        if let Ok(v) = name.parse::<i64>()
            && v > 0
            && name.bytes().all(|b| b.is_ascii_digit())
        {
            versions.insert(v, entry.path());
        }
    }
    versions
}

/// The versions a policy serves out of those available, ascending. `latest` keeps the N
/// highest; `specific` keeps the listed ones that exist; `all` keeps everything.
pub fn select_versions(policy: Option<&ModelVersionPolicy>, available: &[i64]) -> Vec<i64> {
    let mut sorted = available.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    match policy.and_then(|p| p.policy_choice.as_ref()) {
        Some(PolicyChoice::All(_)) => sorted,
        Some(PolicyChoice::Specific(s)) => sorted
            .into_iter()
            .filter(|v| s.versions.contains(v))
            .collect(),
        Some(PolicyChoice::Latest(l)) => {
            let n = (l.num_versions.max(1)) as usize;
            let skip = sorted.len().saturating_sub(n);
            sorted.into_iter().skip(skip).collect()
        }
        None => sorted.into_iter().last().into_iter().collect(),
    }
}

/// A digest of a directory tree's file names, sizes and modification times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fingerprint(u64);

impl Fingerprint {
    /// Fingerprints a file or a directory tree (recursively). Unreadable entries count as
    /// their names only, so a permission change shows up as a change too.
    pub fn of(path: &Path) -> Fingerprint {
        let mut hasher = DefaultHasher::new();
        hash_tree(path, Path::new(""), &mut hasher);
        Fingerprint(hasher.finish())
    }
}

fn hash_tree(path: &Path, relative: &Path, hasher: &mut DefaultHasher) {
    relative.hash(hasher);
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    if meta.is_dir() {
        let Ok(entries) = std::fs::read_dir(path) else {
            return;
        };
        let mut names: Vec<_> = entries.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for name in names {
            hash_tree(&path.join(&name), &relative.join(&name), hasher);
        }
    } else {
        meta.len().hash(hasher);
        meta.modified()
            .unwrap_or(SystemTime::UNIX_EPOCH)
            .hash(hasher);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_proto::pb::inference::model_version_policy::{All, Latest, Specific};

    fn policy(choice: PolicyChoice) -> ModelVersionPolicy {
        ModelVersionPolicy {
            policy_choice: Some(choice),
        }
    }

    #[test]
    fn version_policies() {
        let v = [3, 1, 2, 10];
        assert_eq!(select_versions(None, &v), vec![10]);
        assert_eq!(
            select_versions(
                Some(&policy(PolicyChoice::Latest(Latest { num_versions: 2 }))),
                &v
            ),
            vec![3, 10]
        );
        assert_eq!(
            select_versions(Some(&policy(PolicyChoice::All(All {}))), &v),
            vec![1, 2, 3, 10]
        );
        let specific = policy(PolicyChoice::Specific(Specific {
            versions: vec![2, 7],
        }));
        assert_eq!(select_versions(Some(&specific), &v), vec![2]);
        assert!(select_versions(None, &[]).is_empty());
    }

    #[test]
    fn scan_finds_models_versions_and_duplicates() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        for (repo, model) in [(&a, "m1"), (&a, "dup"), (&b, "dup"), (&b, "m2")] {
            std::fs::create_dir_all(repo.path().join(model).join("1")).unwrap();
        }
        for odd in ["01", "x", "0", "2"] {
            std::fs::create_dir_all(a.path().join("m1").join(odd)).unwrap();
        }
        std::fs::write(a.path().join("file.txt"), b"").unwrap();
        let scan = scan(&[a.path().to_path_buf(), b.path().to_path_buf()]).unwrap();
        assert_eq!(scan.models.keys().collect::<Vec<_>>(), vec!["m1", "m2"]);
        assert_eq!(scan.duplicates["dup"].len(), 2);
        let versions = version_dirs(&scan.models["m1"].path);
        assert_eq!(versions.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
        // With namespacing each repository's models are keyed by it: no duplicates.
        let repos = [a.path().to_path_buf(), b.path().to_path_buf()];
        let spaced = scan_namespaced(&repos, true).unwrap();
        let key = |repo: &tempfile::TempDir, m: &str| {
            namespace::qualified(&repo.path().display().to_string(), m)
        };
        assert!(spaced.duplicates.is_empty());
        assert_eq!(spaced.models.len(), 4);
        assert_eq!(spaced.models[&key(&b, "dup")].path, b.path().join("dup"));
        assert_eq!(spaced.models[&key(&a, "dup")].name, "dup");
    }

    #[test]
    fn fingerprint_changes_with_content() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), b"1").unwrap();
        let f1 = Fingerprint::of(d.path());
        assert_eq!(f1, Fingerprint::of(d.path()));
        std::fs::write(d.path().join("b"), b"2").unwrap();
        assert_ne!(f1, Fingerprint::of(d.path()));
    }
}
