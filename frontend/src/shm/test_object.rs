//! Shared-memory objects for tests: unique names under `/dev/shm`, removed on drop.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A shared-memory object of `size` bytes under a name unique to this test run, removed on
/// drop.
pub(crate) struct TestObject {
    pub key: String,
    pub path: PathBuf,
}

impl TestObject {
    pub fn new(size: u64) -> TestObject {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let name = format!("nereid_test_{}_{n}", std::process::id());
        let path = PathBuf::from("/dev/shm").join(&name);
        let file = File::create(&path).unwrap();
        file.set_len(size).unwrap();
        TestObject {
            key: format!("/{name}"),
            path,
        }
    }

    pub fn fill(&self, offset: u64, data: &[u8]) {
        let file = OpenOptions::new().write(true).open(&self.path).unwrap();
        file.write_all_at(data, offset).unwrap();
    }

    pub fn contents(&self) -> Vec<u8> {
        std::fs::read(&self.path).unwrap()
    }
}

impl Drop for TestObject {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}
