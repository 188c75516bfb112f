//! The C heap of this process: bytes the C allocator (glibc malloc) has handed out and not
//! had back, the measure of what an in-process load (ONNX Runtime, libtorch) keeps.
//!
//! ```text
//! measure(load) ─ lock LOADS ─ in_use() ─ load() ─ in_use() ─ unlock ─► (result, growth)
//! in_use()      ─ mallinfo2(): uordblks (in use in every arena) + hblkhd (mmapped chunks)
//! ```
//!
//! Unlike the resident set, the figure does not depend on what the allocator held before the
//! load, on which pages happen to be touched, or on freed memory kept in the arenas: the same
//! model measures the same on every worker. Loads measured here run one at a time (`LOADS`),
//! so two loads never mix their deltas. What it does not see: allocations that are not
//! glibc's (the server binary's own Rust allocations go to mimalloc), thread stacks, and files
//! a runtime maps instead of reading (ONNX external data mapped by ONNX Runtime). Memory that
//! other threads allocate or free during the load (requests to other models) shifts the
//! figure by what they hold at that moment.
//!
//! Why `unsafe` is allowed in this module (as in `backend/pytorch/cuda.rs`): `mallinfo2` is a
//! C function of glibc, called through FFI that Rust cannot check. It takes no arguments,
//! returns a plain struct by value and only reads the allocator's own counters (under its
//! arena locks), so no pointer or memory of ours is involved. Other C libraries (musl) or
//! systems report `None`.
#![allow(unsafe_code)]

use parking_lot::Mutex;

/// Held around every measured load: one in-process load at a time.
static LOADS: Mutex<()> = Mutex::new(());

/// Bytes of the C heap in use now: in the allocator's arenas plus its mmapped chunks.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn in_use() -> Option<u64> {
    // SAFETY: mallinfo2 (glibc >= 2.33) takes nothing and returns counters by value.
    let info = unsafe { libc::mallinfo2() };
    Some((info.uordblks as u64).saturating_add(info.hblkhd as u64))
}

/// Bytes of the C heap in use now: unknown without glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn in_use() -> Option<u64> {
    None
}

/// Runs `load` alone among measured loads and returns its result with the C heap's growth
/// across it (`None` where the heap cannot be read). Memory freed by the load and memory it
/// allocated cancel out, so a transient buffer does not count; memory the load freed that
/// others held before counts as no growth, never as a negative one.
pub fn measure<T>(load: impl FnOnce() -> T) -> (T, Option<u64>) {
    let _alone = LOADS.lock();
    let before = in_use();
    let result = load();
    let after = in_use();
    (result, growth(before, after))
}

/// The growth between two readings; a shrink is no growth.
fn growth(before: Option<u64>, after: Option<u64>) -> Option<u64> {
    before
        .zip(after)
        .map(|(before, after)| after.saturating_sub(before))
}

#[cfg(test)]
mod tests {
    use super::*;

    // The heap is the whole process's and unit tests run side by side, so the figures of a
    // real load are checked in tests/replica_memory.rs, a test binary of its own.
    #[test]
    fn growth_is_the_difference_and_never_negative() {
        assert_eq!(growth(Some(10), Some(25)), Some(15));
        assert_eq!(growth(Some(25), Some(10)), Some(0));
        assert_eq!(growth(None, Some(10)), None);
        assert_eq!(growth(Some(10), None), None);
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert!(in_use().is_some_and(|bytes| bytes > 0));
        }
    }
}
