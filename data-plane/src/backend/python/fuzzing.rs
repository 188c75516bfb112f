//! The fuzz target's way into the stub protocol's decoder (see the crate's `fuzzing` module;
//! not an API).
//!
//! ```text
//!  bytes ─► frame::read_frame (one frame at a time, as either connection is read)
//!        ─► reader::handle (the decoder and dispatcher both readers use) over a real Link:
//!           unknown ops, decoupled responses (tensors read from a real stub segment,
//!           released, delivered to open streams), BLS requests, logs, releases
//!        ─► answers (init_done, execute_done, ...) as the waiting instance thread reads them:
//!           execute_done's outputs copied out of the segment and checked as tensors
//! ```
//!
//! The stub side of the socket is drained after every frame, so the frames the parent writes
//! back (releases, BLS answers, cancels) never fill it.

use std::io::{ErrorKind, Read};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use super::convert;
use super::link::{Link, StreamTarget};
use super::reader::handle;
use crate::backend::ServerHandle;
use nereid_stub_protocol::frame;
use nereid_stub_protocol::message::{FromStub, TensorRef};

/// Bytes in the stub segment `s0` the frames may point into; `s1` exists and is empty.
pub const SEGMENT_BYTES: usize = 4096;

/// Decodes and dispatches every whole frame in `wire`, stopping where the reader thread would
/// stop (a protocol error, a truncated frame, the end).
pub fn stub_frames(wire: &[u8]) {
    let Some(prefix) = segment_prefix() else {
        return;
    };
    let Ok((ours, mut theirs)) = UnixStream::pair() else {
        return;
    };
    if theirs.set_nonblocking(true).is_err() {
        return;
    }
    let link = Arc::new(Link::new(
        "m".into(),
        "m_0".into(),
        Arc::new(ServerHandle::default()),
        ours,
        prefix,
    ));
    // Decoupled request 1 asked for OUT0; request 2 for everything.
    let (events, _received) = crossbeam_channel::unbounded();
    link.open_stream(
        1,
        StreamTarget::Collect(events.clone()),
        vec!["OUT0".into()],
    );
    link.open_stream(2, StreamTarget::Collect(events), Vec::new());
    let mut input = wire;
    while let Ok(Some(body)) = frame::read_frame(&mut input) {
        let handled = handle(&link, &body);
        if let Ok(Some(answer)) = &handled {
            read_answer(&link, answer.clone());
        }
        drain(&mut theirs);
        if handled.is_err() {
            break;
        }
    }
}

/// What the instance thread does with an answer: for `execute_done`, copy every output out of
/// the segment and check each response's outputs as tensors (`execute::finish_default`).
fn read_answer(link: &Link, answer: FromStub) {
    let FromStub::ExecuteDone {
        responses, segment, ..
    } = answer
    else {
        return;
    };
    let refs: Vec<&TensorRef> = responses.iter().flat_map(|r| &r.outputs).collect();
    let Ok(data) = link.take_bytes_deferred(segment.as_deref(), &refs) else {
        return;
    };
    let mut data = data.into_iter();
    for response in responses {
        let bytes: Vec<Bytes> = data.by_ref().take(response.outputs.len()).collect();
        if let Ok(tensors) = convert::tensors_from_refs(&response.outputs, bytes) {
            let _ = convert::select_outputs(tensors, &[], &link.model);
        }
    }
}

fn drain(stub_side: &mut UnixStream) {
    let mut buf = [0u8; 4096];
    loop {
        match stub_side.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// The segment path prefix (`<dir>/seg-`), its files made once per process: `s0` holds
/// [`SEGMENT_BYTES`] bytes counting up, `s1` is empty.
fn segment_prefix() -> Option<&'static str> {
    static PREFIX: OnceLock<Option<(tempfile::TempDir, String)>> = OnceLock::new();
    PREFIX
        .get_or_init(|| {
            let dir = tempfile::tempdir().ok()?;
            let prefix = dir.path().join("seg-").to_str()?.to_string();
            let data: Vec<u8> = (0..SEGMENT_BYTES).map(|i| i as u8).collect();
            std::fs::write(PathBuf::from(format!("{prefix}s0")), data).ok()?;
            std::fs::write(PathBuf::from(format!("{prefix}s1")), b"").ok()?;
            Some((dir, prefix))
        })
        .as_ref()
        .map(|(_, prefix)| prefix.as_str())
}
