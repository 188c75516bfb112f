//! The Python stub protocol, defined once (docs/internals/python-stub-protocol.md).
//!
//! The server (`nereid-data-plane`, backend/python) and the stub's compiled core
//! (`nereid-stub-core`, the `nereid_stub_core` Python extension) both speak through these types:
//!
//! ```text
//!  server ── ToStub ──► frame::encode ──► socket ──► frame::read_frame ──► decode ──► stub core
//!  server ◄── decode ◄── frame::read_frame ◄── socket ◄── frame::encode ◄── FromStub ── stub core
//! ```
//!
//! [`message`] holds every message, [`frame`] the length-prefixed framing, [`segment`] the
//! rules for the shared-memory files tensors travel in. [`PROTOCOL_VERSION`]
//! is sent in `init`/`auto_complete`; a stub core built from another revision refuses it, so a
//! stale extension module is a load error rather than a misread frame.

#![warn(missing_docs)]

pub mod frame;
pub mod message;
pub mod segment;

/// Bumped whenever a message changes shape. The server and the stub core compare it at start.
pub const PROTOCOL_VERSION: u32 = 2;
