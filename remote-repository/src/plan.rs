//! The pure part of a sync: a model's listing split into units, and what to download and
//! delete given what the last sync recorded and what is on disk.
//!
//! A unit is `"<n>"` for a version folder (all digits) or [`FILES`] for every other file of
//! the model. A unit is downloaded again when any of its files' size, etag or last-modified
//! time changed, a file came or went, or its local copy is missing.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The unit of a model's files outside its version folders (`config.pbtxt`, ...).
pub const FILES: &str = ".";

/// One object as the listing shows it, relative to the model's folder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileSig {
    /// `/`-separated path under the model's folder.
    pub path: String,
    pub size: u64,
    /// The store's etag and last-modified time (ms): either changing means new content.
    pub tag: String,
}

/// Every unit of one model: unit name -> its files, sorted by path.
pub type Units = BTreeMap<String, Vec<FileSig>>;

/// What a sync does to one model.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ModelPlan {
    pub download: Vec<String>,
    pub delete: Vec<String>,
}

impl ModelPlan {
    pub fn is_empty(&self) -> bool {
        self.download.is_empty() && self.delete.is_empty()
    }
}

/// The unit a file of the model belongs to.
pub fn unit_of(path: &str) -> &str {
    match path.split_once('/') {
        Some((first, _)) if !first.is_empty() && first.bytes().all(|b| b.is_ascii_digit()) => first,
        _ => FILES,
    }
}

/// Groups a model's files into units. A zero-byte object whose path is a folder of another
/// object (a "directory marker" some tools create) is dropped.
pub fn units(files: Vec<FileSig>) -> Units {
    let folders: BTreeSet<String> = files
        .iter()
        .flat_map(|f| {
            let parts: Vec<&str> = f.path.split('/').collect();
            (1..parts.len())
                .map(move |n| parts[..n].join("/"))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut units = Units::new();
    for file in files {
        if file.size == 0 && folders.contains(&file.path) {
            continue;
        }
        units
            .entry(unit_of(&file.path).to_string())
            .or_default()
            .push(file);
    }
    for files in units.values_mut() {
        files.sort_by(|a, b| a.path.cmp(&b.path));
    }
    units
}

/// Compares the listing (`remote`) with the last sync's record (`recorded`) and the version
/// folders on disk (`local_versions`); `present(unit)` says whether a unit's local copy is
/// complete.
pub fn plan(
    remote: &Units,
    recorded: &Units,
    local_versions: &BTreeSet<String>,
    present: impl Fn(&str) -> bool,
) -> ModelPlan {
    let download = remote
        .iter()
        .filter(|(unit, files)| recorded.get(*unit) != Some(*files) || !present(unit))
        .map(|(unit, _)| unit.clone())
        .collect();
    let mut delete: BTreeSet<String> = recorded
        .keys()
        .filter(|unit| !remote.contains_key(*unit))
        .cloned()
        .collect();
    delete.extend(
        local_versions
            .iter()
            .filter(|v| !remote.contains_key(*v))
            .cloned(),
    );
    ModelPlan {
        download,
        delete: delete.into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(path: &str, size: u64, tag: &str) -> FileSig {
        FileSig {
            path: path.into(),
            size,
            tag: tag.into(),
        }
    }

    #[test]
    fn files_group_into_versions_and_model_files() {
        let u = units(vec![
            sig("config.pbtxt", 10, "a"),
            sig("1/model.onnx", 5, "b"),
            sig("1", 0, "marker"),
            sig("10/sub/x", 1, "c"),
            sig("01x/y", 1, "d"),
            sig("labels/l.txt", 1, "e"),
        ]);
        assert_eq!(u.keys().collect::<Vec<_>>(), [".", "1", "10"]);
        assert_eq!(u["1"], [sig("1/model.onnx", 5, "b")]);
        let files: Vec<&str> = u["."].iter().map(|f| f.path.as_str()).collect();
        assert_eq!(files, ["01x/y", "config.pbtxt", "labels/l.txt"]);
    }

    #[test]
    fn unchanged_units_are_left_alone() {
        let remote = units(vec![sig("config.pbtxt", 1, "a"), sig("1/m", 2, "b")]);
        let p = plan(&remote, &remote, &["1".into()].into(), |_| true);
        assert!(p.is_empty(), "{p:?}");
    }

    #[test]
    fn changed_new_missing_and_deleted_units() {
        let recorded = units(vec![
            sig("config.pbtxt", 1, "a"),
            sig("1/m", 2, "b"),
            sig("2/m", 2, "c"),
        ]);
        // config changed (etag), version 3 is new, version 2 was deleted, version 1 unchanged
        // but its local copy is gone, and a stray local folder 7 is not in the store.
        let remote = units(vec![
            sig("config.pbtxt", 1, "a2"),
            sig("1/m", 2, "b"),
            sig("3/m", 9, "d"),
        ]);
        let local: BTreeSet<String> = ["2".into(), "7".into()].into();
        let p = plan(&remote, &recorded, &local, |unit| unit != "1");
        assert_eq!(p.download, [".", "1", "3"]);
        assert_eq!(p.delete, ["2", "7"]);
        // A size change alone is a change too.
        let bigger = units(vec![
            sig("config.pbtxt", 2, "a"),
            sig("1/m", 2, "b"),
            sig("2/m", 2, "c"),
        ]);
        assert_eq!(plan(&bigger, &recorded, &local, |_| true).download, ["."]);
    }
}
