//! A tonic codec that moves gRPC messages as bytes: the pass-through path's server side
//! (client ─► router) and client side (router ─► worker) use it for `ModelInfer`, so neither
//! direction runs prost over tensors.
//!
//! ```text
//! decode: frame payload ─► Bytes (split off tonic's buffer, no copy)
//! encode: RawMessage { head, tail } ─► frame payload (one copy into tonic's frame buffer)
//! ```

use bytes::{Buf, BufMut, Bytes};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// A message to send: `head` then `tail` (the pass-through path's version field, often empty).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RawMessage {
    /// The bulk of the message: usually the client's encoded request, sent uncopied.
    pub head: Bytes,
    /// Encoded protobuf fields appended after `head` (such as a resolved `model_version`);
    /// empty when nothing is added. A later field overrides the same field in `head`.
    pub tail: Bytes,
}

impl RawMessage {
    /// A message of `head` alone, with an empty `tail`.
    pub fn new(head: Bytes) -> RawMessage {
        RawMessage {
            head,
            tail: Bytes::new(),
        }
    }
}

/// Sends [`RawMessage`]s and receives [`Bytes`].
#[derive(Clone, Copy, Debug, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = RawMessage;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = RawMessage;
    type Error = Status;

    fn encode(&mut self, item: RawMessage, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.reserve(item.head.len() + item.tail.len());
        dst.put_slice(&item.head);
        dst.put_slice(&item.tail);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}
