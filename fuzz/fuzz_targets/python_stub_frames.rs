//! The parent's decoder of what a Python stub process writes to its socket: length-prefixed
//! JSON frames, each decoded into a stub message and dispatched as the reader thread does
//! (unknown ops, decoupled responses with tensors read from a real shared-memory segment,
//! BLS requests, answers such as `execute_done` whose outputs are copied out and checked),
//! through `nereid_data_plane::fuzzing::python_stub_frames`. The stub is user code's process,
//! so nothing it sends may crash the server.
//!
//! Input: the bytes on the socket (`<u32 LE length><JSON>` frames, in order).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nereid_data_plane::fuzzing::python_stub_frames(data);
});
