//! Mirror tests against object_store's in-memory store: layout, cache invalidation by
//! etag/size, deletions, scopes, and failed downloads that leave the local copy untouched.

use std::time::SystemTime;

use object_store::PutPayload;
use object_store::memory::InMemory;

use super::*;

struct Fixture {
    store: Arc<InMemory>,
    mirror: Mirror,
    _cache: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let store = Arc::new(InMemory::new());
    let cache = tempfile::tempdir().unwrap();
    let url = RepositoryUrl::parse("s3://bucket/repo").unwrap();
    let local = cache.path().join("mirror");
    let mirror = Mirror::with_store(store.clone(), url, local);
    Fixture {
        store,
        mirror,
        _cache: cache,
    }
}

impl Fixture {
    async fn put(&self, key: &str, body: &str) {
        let path = ObjectPath::from(format!("repo/{key}"));
        let payload = PutPayload::from(body.as_bytes().to_vec());
        self.store.put(&path, payload).await.unwrap();
    }

    async fn delete(&self, key: &str) {
        let path = ObjectPath::from(format!("repo/{key}"));
        self.store.delete(&path).await.unwrap();
    }

    fn read(&self, rel: &str) -> Option<String> {
        std::fs::read_to_string(self.mirror.local_dir().join(rel)).ok()
    }

    fn mtime(&self, rel: &str) -> SystemTime {
        let path = self.mirror.local_dir().join(rel);
        std::fs::metadata(path).unwrap().modified().unwrap()
    }
}

#[tokio::test]
async fn first_sync_lays_out_a_triton_repository() {
    let f = fixture();
    f.put("m/config.pbtxt", "name: \"m\"").await;
    f.put("m/1/model.onnx", "one").await;
    f.put("m/2/sub/weights.bin", "two").await;
    f.put("other/1/model.onnx", "x").await;
    f.put("loose-file", "ignored: not inside a model folder")
        .await;
    let report = f.mirror.sync(Scope::All).await.unwrap();
    assert_eq!(report.updated, ["m", "other"]);
    assert!(report.failed.is_empty() && report.removed.is_empty());
    assert_eq!(f.read("m/config.pbtxt").as_deref(), Some("name: \"m\""));
    assert_eq!(f.read("m/1/model.onnx").as_deref(), Some("one"));
    assert_eq!(f.read("m/2/sub/weights.bin").as_deref(), Some("two"));
    assert_eq!(f.read("other/1/model.onnx").as_deref(), Some("x"));
    assert!(f.read("loose-file").is_none());
    let staging = f.mirror.local_dir().join(STAGING_DIR);
    let leftovers = std::fs::read_dir(&staging).map(|d| d.count()).unwrap_or(0);
    assert_eq!(leftovers, 0, "no staging folder is left behind");
}

#[tokio::test]
async fn unchanged_objects_are_not_downloaded_again_and_changes_are() {
    let f = fixture();
    f.put("m/config.pbtxt", "a").await;
    f.put("m/1/model.onnx", "one").await;
    f.mirror.sync(Scope::All).await.unwrap();
    let before = f.mtime("m/1/model.onnx");
    let again = f.mirror.sync(Scope::All).await.unwrap();
    assert!(again.updated.is_empty(), "{again:?}");
    assert_eq!(f.mtime("m/1/model.onnx"), before);

    // Same size, new etag: the config is downloaded again, version 1 is not.
    f.put("m/config.pbtxt", "b").await;
    let report = f.mirror.sync(Scope::All).await.unwrap();
    assert_eq!(report.updated, ["m"]);
    assert_eq!(f.read("m/config.pbtxt").as_deref(), Some("b"));
    assert_eq!(f.mtime("m/1/model.onnx"), before);

    // A new version appears, an old one goes, a model-level file goes.
    f.put("m/labels.txt", "l").await;
    f.mirror.sync(Scope::All).await.unwrap();
    f.put("m/3/model.onnx", "three").await;
    f.delete("m/1/model.onnx").await;
    f.delete("m/labels.txt").await;
    f.mirror.sync(Scope::All).await.unwrap();
    assert_eq!(f.read("m/3/model.onnx").as_deref(), Some("three"));
    assert!(
        !f.mirror.local_dir().join("m/1").exists(),
        "deleted version removed"
    );
    assert!(f.read("m/labels.txt").is_none(), "deleted file removed");
    assert_eq!(f.read("m/config.pbtxt").as_deref(), Some("b"));
}

#[tokio::test]
async fn a_local_copy_that_went_missing_is_restored() {
    let f = fixture();
    f.put("m/1/model.onnx", "one").await;
    f.mirror.sync(Scope::All).await.unwrap();
    std::fs::remove_file(f.mirror.local_dir().join("m/1/model.onnx")).unwrap();
    std::fs::create_dir_all(f.mirror.local_dir().join("m/9")).unwrap();
    let report = f.mirror.sync(Scope::All).await.unwrap();
    assert_eq!(report.updated, ["m"]);
    assert_eq!(f.read("m/1/model.onnx").as_deref(), Some("one"));
    assert!(
        !f.mirror.local_dir().join("m/9").exists(),
        "stray version folder removed"
    );
}

#[tokio::test]
async fn models_gone_from_the_store_are_removed() {
    let f = fixture();
    f.put("a/1/m", "x").await;
    f.put("b/1/m", "y").await;
    f.mirror.sync(Scope::All).await.unwrap();
    f.delete("b/1/m").await;
    let report = f.mirror.sync(Scope::All).await.unwrap();
    assert_eq!(report.removed, ["b"]);
    assert!(!f.mirror.local_dir().join("b").exists());
    assert!(f.mirror.local_dir().join("a/1/m").exists());
}

#[tokio::test]
async fn model_scope_touches_one_model_only() {
    let f = fixture();
    f.put("a/1/m", "x").await;
    f.put("ab/1/m", "prefix sibling").await;
    f.put("b/1/m", "y").await;
    let report = f.mirror.sync(Scope::Model("a")).await.unwrap();
    assert_eq!(report.updated, ["a"]);
    assert!(f.mirror.local_dir().join("a/1/m").exists());
    assert!(!f.mirror.local_dir().join("ab").exists());
    assert!(!f.mirror.local_dir().join("b").exists());
    f.delete("a/1/m").await;
    let report = f.mirror.sync(Scope::Model("a")).await.unwrap();
    assert_eq!(report.removed, ["a"]);
    let report = f.mirror.sync(Scope::Model("nope")).await.unwrap();
    assert!(report.updated.is_empty() && report.removed.is_empty());
}

#[tokio::test]
async fn a_failed_download_leaves_the_model_as_it_was() {
    let f = fixture();
    f.put("m/config.pbtxt", "old config").await;
    f.put("m/1/model.onnx", "one").await;
    f.mirror.sync(Scope::All).await.unwrap();

    // The listing shows a new config and version 2, but one of version 2's objects vanished
    // before its download.
    let listing = vec![
        FileSig {
            path: "config.pbtxt".into(),
            size: 10,
            tag: "new".into(),
        },
        FileSig {
            path: "1/model.onnx".into(),
            size: 3,
            tag: "changed".into(),
        },
        FileSig {
            path: "2/model.onnx".into(),
            size: 3,
            tag: "gone".into(),
        },
    ];
    f.put("m/config.pbtxt", "new config").await;
    let err = f.mirror.sync_model("m", listing).await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("s3://bucket/repo/m/2/model.onnx"), "{text}");
    assert_eq!(f.read("m/config.pbtxt").as_deref(), Some("old config"));
    assert_eq!(f.read("m/1/model.onnx").as_deref(), Some("one"));
    assert!(
        !f.mirror.local_dir().join("m/2").exists(),
        "no half version"
    );
    let staging = f.mirror.local_dir().join(STAGING_DIR);
    assert_eq!(std::fs::read_dir(&staging).unwrap().count(), 0);
}

#[tokio::test]
async fn a_size_that_differs_from_the_listing_fails_the_download() {
    let f = fixture();
    f.put("m/1/model.onnx", "four").await;
    let listing = vec![FileSig {
        path: "1/model.onnx".into(),
        size: 99,
        tag: "t".into(),
    }];
    let err = f
        .mirror
        .sync_model("m", listing)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("got 4 bytes, the listing said 99"), "{err}");
    assert!(!f.mirror.local_dir().join("m/1").exists());
}

#[tokio::test]
async fn a_failing_model_is_reported_and_the_others_sync() {
    let f = fixture();
    f.put("good/1/m", "x").await;
    f.put("bad/1/m", "y").await;
    f.mirror.sync(Scope::All).await.unwrap();
    // Make "bad"'s local folder impossible to replace: a file where its model folder goes.
    let bad = f.mirror.local_dir().join("bad");
    std::fs::remove_dir_all(&bad).unwrap();
    std::fs::write(&bad, "in the way").unwrap();
    f.put("good/2/m", "z").await;
    f.put("bad/2/m", "w").await;
    let report = f.mirror.sync(Scope::All).await.unwrap();
    assert_eq!(report.updated, ["good"]);
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].0, "bad");
    assert!(f.mirror.local_dir().join("good/2/m").exists());
    let err = f.mirror.sync(Scope::Model("bad")).await.unwrap_err();
    assert!(err.to_string().contains("bad"), "{err}");
}

#[tokio::test]
async fn versions_are_the_numeric_folders_of_a_model() {
    let f = fixture();
    for key in [
        "m/config.pbtxt",
        "m/3/x",
        "m/1/x",
        "m/01/x",
        "m/0/x",
        "m/a/x",
        "other/7/x",
    ] {
        f.put(key, "x").await;
    }
    assert_eq!(f.mirror.versions("m").await.unwrap(), [1, 3]);
    assert!(f.mirror.versions("none").await.unwrap().is_empty());
}

#[test]
fn slugs_are_distinct_and_file_names() {
    let a = slug("s3://bucket/repo");
    let b = slug("s3://bucket/repo2");
    assert_ne!(a, b);
    assert!(a.starts_with("s3___bucket_repo-"), "{a}");
    assert!(!a.contains('/'));
}
