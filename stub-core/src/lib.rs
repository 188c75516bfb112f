//! `nereid_stub_core`: the compiled half of the Python stub, imported by `nereid_stub.py` and
//! `triton_python_backend_utils.py` (docs/internals/python-stub-protocol.md).
//!
//! ```text
//!  server ══ frames (nereid_stub_protocol) ══ Channel ── recv() ─► ("execute", id, [InferenceRequest]) ─► model.py
//!                                              │  ▲                 inputs: Tensor over a parent segment
//!                                              │  └── send_execute_done(id, states, [InferenceResponse])
//!                                              │        outputs copied into a stub segment
//!                                              └─ release thread: parent segments whose last
//!                                                 array died, when no other frame carries them
//! ```
//!
//! What a request costs per message in interpreted Python before (JSON frames, tensor
//! references, segment bookkeeping, `pb_utils` objects) is done here: `channel.rs` reads
//! frames with the GIL released and decodes them with the protocol crate's own types (the
//! server uses the same ones), `segments.rs` maps and writes the shared-memory files, and
//! `tensor.rs`, `request.rs`, `response.rs` and `sender.rs` are the `pb_utils` classes a model
//! sees. What needs Python machinery (DLPack, BLS calls, asyncio) stays in
//! `triton_python_backend_utils.py`, reached through `hooks.rs`.
//!
//! Unsafe code is confined to `segments.rs` (mmap, copies between a NumPy array's memory and a
//! mapping) and `channel.rs` (taking ownership of the socket descriptor).

mod channel;
mod convert;
mod hooks;
mod request;
mod response;
mod segments;
mod sender;
mod tensor;
mod wire;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn nereid_stub_core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("PROTOCOL_VERSION", nereid_stub_protocol::PROTOCOL_VERSION)?;
    m.add_function(wrap_pyfunction!(hooks::install, m)?)?;
    m.add_class::<channel::Channel>()?;
    m.add_class::<tensor::Tensor>()?;
    m.add_class::<tensor::SegmentView>()?;
    m.add_class::<request::InferenceRequest>()?;
    m.add_class::<request::RequestState>()?;
    m.add_class::<response::InferenceResponse>()?;
    m.add_class::<sender::ResponseSender>()?;
    Ok(())
}
