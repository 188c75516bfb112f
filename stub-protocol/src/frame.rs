//! Length-prefixed JSON frames, the unit of the stub socket in both directions.
//!
//! ```text
//!  ┌──────────────────────┬──────────────────────────────┐
//!  │ N: u32 little-endian │ N bytes of UTF-8 JSON object │
//!  └──────────────────────┴──────────────────────────────┘
//! ```
//!
//! A frame never carries tensor data (that lives in shared-memory segments, see `segment.rs`),
//! so frames are small; [`MAX_FRAME_BYTES`] guards against a corrupt length prefix.

use std::io::{self, Read};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// The largest frame either side accepts. Frames hold only metadata, so this is far above what
/// a real message needs and exists only to refuse a corrupt length before allocating it.
pub const MAX_FRAME_BYTES: usize = 64 << 20;

/// A frame that could not be written, read or decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Reading or writing the socket failed (including a frame cut short by EOF).
    #[error("socket I/O failed: {0}")]
    Io(#[from] io::Error),
    /// A frame body of this many bytes, encoded or announced by a read length prefix,
    /// exceeds [`MAX_FRAME_BYTES`].
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME_BYTES} bytes")]
    TooLarge(usize),
    /// The message could not be serialized, or a body is not valid JSON of the expected type.
    #[error("malformed message: {0}")]
    Json(#[from] serde_json::Error),
}

/// Serializes `message` into one frame (prefix included), ready for a single `write_all`.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, FrameError> {
    let mut buf = vec![0u8; 4];
    serde_json::to_writer(&mut buf, message)?;
    let len = buf.len() - 4;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    let prefix = u32::try_from(len).map_err(|_| FrameError::TooLarge(len))?;
    buf[..4].copy_from_slice(&prefix.to_le_bytes());
    Ok(buf)
}

/// Reads one frame's JSON bytes. `Ok(None)` is a clean end of stream at a frame boundary; a
/// stream that ends inside a frame is an error.
pub fn read_frame<R: Read>(reader: &mut R) -> Result<Option<Vec<u8>>, FrameError> {
    let mut prefix = [0u8; 4];
    if !read_exact_or_eof(reader, &mut prefix)? {
        return Ok(None);
    }
    let len = u32::from_le_bytes(prefix) as usize;
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body)?;
    Ok(Some(body))
}

/// Decodes a frame's JSON bytes.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, FrameError> {
    Ok(serde_json::from_slice(body)?)
}

/// Fills `buf`; `Ok(false)` when the stream ended before its first byte.
fn read_exact_or_eof<R: Read>(reader: &mut R, buf: &mut [u8]) -> io::Result<bool> {
    let mut filled = 0;
    while filled < buf.len() {
        match reader.read(&mut buf[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the stream ended inside a frame's length prefix",
                ));
            }
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn frames_round_trip_in_order() {
        let mut wire = encode(&json!({"op": "release", "segment": "s0"})).unwrap();
        wire.extend(encode(&json!({"op": "finalize"})).unwrap());
        let mut reader = wire.as_slice();
        let first: Value = decode(&read_frame(&mut reader).unwrap().unwrap()).unwrap();
        let second: Value = decode(&read_frame(&mut reader).unwrap().unwrap()).unwrap();
        assert_eq!(first["segment"], "s0");
        assert_eq!(second["op"], "finalize");
        assert!(read_frame(&mut reader).unwrap().is_none(), "clean EOF");
    }

    #[test]
    fn prefix_is_little_endian_byte_count() {
        let frame = encode(&json!({"op": "x"})).unwrap();
        let body = br#"{"op":"x"}"#;
        assert_eq!(&frame[..4], &(body.len() as u32).to_le_bytes());
        assert_eq!(&frame[4..], body);
    }

    #[test]
    fn truncated_frames_are_errors_not_eof() {
        let frame = encode(&json!({"op": "finalize"})).unwrap();
        let mut cut_body = &frame[..frame.len() - 1];
        assert!(matches!(read_frame(&mut cut_body), Err(FrameError::Io(_))));
        let mut cut_prefix = &frame[..2];
        assert!(matches!(
            read_frame(&mut cut_prefix),
            Err(FrameError::Io(_))
        ));
    }

    #[test]
    fn oversized_length_is_refused_before_allocating() {
        let wire = u32::MAX.to_le_bytes();
        let mut reader = &wire[..];
        assert!(matches!(
            read_frame(&mut reader),
            Err(FrameError::TooLarge(n)) if n == u32::MAX as usize
        ));
    }
}
