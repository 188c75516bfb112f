//! The framing of one unary gRPC call made as bytes (the pass-through's `ModelInfer` to a
//! worker), without tonic's codec: the request body is the message's frames, the answer is
//! read straight off the response body.
//!
//! ```text
//! RawMessage { head, tail } ─► request_body
//!   small (≤ COPY_LIMIT): one DATA frame, prefix + head + tail in one buffer, END_STREAM on it
//!   large:                prefix, head, tail as their own frames (head not copied)
//! response ─► UnaryAnswer: grpc-status in the headers (trailers-only), else the HTTP status,
//!   then the DATA frames (the message split off the frame when it arrived in one, else
//!   gathered), then grpc-status in the trailers
//! ```
//!
//! Why not tonic's client codec: it copies every message into an 8 KiB-per-call buffer and
//! leaves the end of the request stream to an empty DATA frame of its own, which h2 writes with
//! a system call of its own after the message's frame (three `writev`s per request towards the
//! worker, where one suffices: HEADERS and the DATA frame carrying END_STREAM together).

use axum::http;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use tonic::{Code, Status};

use crate::raw_codec::RawMessage;

/// Length of the gRPC message prefix: compression flag (1 byte), length (4 bytes, big-endian).
pub(crate) const PREFIX: usize = 5;
/// Messages up to this size are sent as one DATA frame, copied once; larger ones as frames of
/// their own parts, not copied (a frame after one of more than 256 bytes costs h2 another
/// system call, which copying a small message is cheaper than).
pub(crate) const COPY_LIMIT: usize = 64 * 1024;

/// The gRPC frame prefix of an uncompressed message of `len` bytes.
fn prefix(len: usize) -> Result<[u8; PREFIX], Status> {
    let len = u32::try_from(len).map_err(|_| {
        Status::out_of_range(format!(
            "Error, encoded message length too large: found {len} bytes, the limit is: {} bytes",
            u32::MAX
        ))
    })?;
    let mut out = [0u8; PREFIX];
    out[1..].copy_from_slice(&len.to_be_bytes());
    Ok(out)
}

/// The DATA frames of `message` (a request to a worker, or an answer to a client): one buffer
/// when small, else the prefix, the head and the tail (when not empty) as they are.
pub(crate) fn message_frames(message: &RawMessage) -> Result<Vec<Bytes>, Status> {
    let len = message.head.len() + message.tail.len();
    let prefix = prefix(len)?;
    if len <= COPY_LIMIT {
        let mut out = BytesMut::with_capacity(PREFIX + len);
        out.put_slice(&prefix);
        out.put_slice(&message.head);
        out.put_slice(&message.tail);
        return Ok(vec![out.freeze()]);
    }
    let mut frames = vec![Bytes::copy_from_slice(&prefix), message.head.clone()];
    if !message.tail.is_empty() {
        frames.push(message.tail.clone());
    }
    Ok(frames)
}

/// The request body for `message` (see [`message_frames`]): the end of the stream is known
/// with its last frame, so it goes out on that frame.
pub(crate) fn request_body(message: &RawMessage) -> Result<tonic::body::Body, Status> {
    let mut frames = message_frames(message)?;
    let body = if frames.len() == 1 {
        axum::body::Body::from(frames.remove(0))
    } else {
        axum::body::Body::from_stream(futures::stream::iter(
            frames.into_iter().map(Ok::<_, std::convert::Infallible>),
        ))
    };
    Ok(tonic::body::Body::new(body))
}

/// The status a unary response's headers give before its body: a trailers-only answer's
/// grpc-status, else the HTTP status mapped as gRPC maps it; `None` when the body follows.
pub(crate) fn head_status(status: http::StatusCode, headers: &http::HeaderMap) -> Option<Status> {
    if let Some(s) = Status::from_header_map(headers) {
        return Some(s);
    }
    let code = match status {
        http::StatusCode::OK => return None,
        http::StatusCode::BAD_REQUEST => Code::Internal,
        http::StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        http::StatusCode::FORBIDDEN => Code::PermissionDenied,
        http::StatusCode::NOT_FOUND => Code::Unimplemented,
        http::StatusCode::TOO_MANY_REQUESTS
        | http::StatusCode::BAD_GATEWAY
        | http::StatusCode::SERVICE_UNAVAILABLE
        | http::StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        _ => Code::Unknown,
    };
    Some(Status::new(
        code,
        format!("grpc-status header missing, mapped from HTTP status code {status}"),
    ))
}

/// DATA frames gathered into one buffer: the first kept whole (usually the whole message
/// arrives in it), later ones appended to a copy of it once there are any.
#[derive(Debug, Default)]
pub(crate) struct Frames {
    first: Option<Bytes>,
    gathered: BytesMut,
}

impl Frames {
    /// One DATA frame's bytes.
    pub(crate) fn push(&mut self, data: Bytes) {
        match self.first.take() {
            None if self.gathered.is_empty() => self.first = Some(data),
            first => {
                if let Some(first) = first {
                    self.gathered.reserve(first.len() + data.len());
                    self.gathered.put(first);
                }
                self.gathered.put(data);
            }
        }
    }

    /// The bytes so far.
    pub(crate) fn bytes(&self) -> &[u8] {
        match &self.first {
            Some(first) => first,
            None => &self.gathered,
        }
    }

    /// The bytes so far, taken (the first frame itself when nothing followed it).
    pub(crate) fn take(&mut self) -> Bytes {
        match self.first.take() {
            Some(first) => first,
            None => std::mem::take(&mut self.gathered).freeze(),
        }
    }
}

/// The one message of a unary answer, gathered from its DATA frames.
#[derive(Debug)]
pub(crate) struct UnaryAnswer {
    max_message_size: usize,
    frames: Frames,
}

impl UnaryAnswer {
    /// An answer whose message may be at most `max_message_size` bytes.
    pub(crate) fn new(max_message_size: usize) -> UnaryAnswer {
        UnaryAnswer {
            max_message_size,
            frames: Frames::default(),
        }
    }

    /// One DATA frame's bytes.
    pub(crate) fn push(&mut self, data: Bytes) {
        self.frames.push(data);
    }

    /// The message, once the body ended with `trailers`: their grpc-status when it is not OK
    /// (or missing), else the one message (its prefix checked: not compressed, within the
    /// size limit, complete).
    pub(crate) fn finish(mut self, trailers: Option<&http::HeaderMap>) -> Result<Bytes, Status> {
        match trailers.and_then(Status::from_header_map) {
            Some(status) if status.code() != Code::Ok => return Err(status),
            Some(_) => {}
            None => {
                return Err(Status::unknown(
                    "protocol error: missing grpc-status trailer, stream was terminated without a final status",
                ));
            }
        }
        let mut data = self.frames.take();
        if data.is_empty() {
            return Err(Status::internal("Missing response message."));
        }
        if data.len() < PREFIX {
            return Err(Status::internal(
                "the worker's answer ended inside a message prefix",
            ));
        }
        let compressed = data.get_u8();
        let len = data.get_u32() as usize;
        if compressed != 0 {
            return Err(Status::internal(
                "the worker sent a compressed message, which the router did not ask for",
            ));
        }
        if len > self.max_message_size {
            return Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                self.max_message_size
            )));
        }
        if data.len() < len {
            return Err(Status::internal(format!(
                "the worker's answer ended inside a message: {} of {len} bytes",
                data.len()
            )));
        }
        // Anything after the first message is ignored, as a unary client does.
        Ok(data.split_to(len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok_trailers() -> http::HeaderMap {
        let mut t = http::HeaderMap::new();
        t.insert("grpc-status", http::HeaderValue::from_static("0"));
        t
    }

    fn framed(message: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    #[test]
    fn a_small_message_is_one_frame_of_prefix_and_payload() {
        let message = RawMessage {
            head: Bytes::from_static(b"client bytes"),
            tail: Bytes::from_static(b"\x12\x011"),
        };
        let frames = message_frames(&message).unwrap();
        assert_eq!(frames, vec![Bytes::from(framed(b"client bytes\x12\x011"))]);
        let bare = message_frames(&RawMessage::new(Bytes::from_static(b"x"))).unwrap();
        assert_eq!(bare, vec![Bytes::from(framed(b"x"))]);
    }

    #[test]
    fn a_large_message_goes_out_uncopied_after_its_prefix() {
        let head = Bytes::from(vec![7u8; COPY_LIMIT + 1]);
        let tail = Bytes::from_static(b"\x12\x011");
        let message = RawMessage {
            head: head.clone(),
            tail: tail.clone(),
        };
        let frames = message_frames(&message).unwrap();
        assert_eq!(frames.len(), 3);
        assert_eq!(frames.concat(), framed(&[&head[..], &tail[..]].concat()));
        // The head is the client's buffer itself, not a copy.
        assert_eq!(frames[1].as_ptr(), head.as_ptr());
        let without_tail = message_frames(&RawMessage::new(head.clone())).unwrap();
        assert_eq!(without_tail.len(), 2);
        assert_eq!(without_tail.concat(), framed(&head));
    }

    #[test]
    fn a_message_in_one_frame_is_split_off_it() {
        let frame = Bytes::from(framed(b"answer"));
        let mut answer = UnaryAnswer::new(100);
        answer.push(frame.clone());
        let message = answer.finish(Some(&ok_trailers())).unwrap();
        assert_eq!(message, Bytes::from_static(b"answer"));
        assert_eq!(message.as_ptr(), frame[PREFIX..].as_ptr());
    }

    #[test]
    fn a_message_over_several_frames_is_gathered() {
        let all = framed(b"a longer answer");
        let mut answer = UnaryAnswer::new(100);
        for part in all.chunks(4) {
            answer.push(Bytes::copy_from_slice(part));
        }
        assert_eq!(
            answer.finish(Some(&ok_trailers())).unwrap(),
            Bytes::from_static(b"a longer answer")
        );
    }

    #[test]
    fn bad_answers_are_statuses() {
        let finish = |frames: &[&[u8]], trailers: Option<&http::HeaderMap>| {
            let mut answer = UnaryAnswer::new(8);
            for f in frames {
                answer.push(Bytes::copy_from_slice(f));
            }
            answer.finish(trailers).unwrap_err()
        };
        let ok = ok_trailers();
        let mut failed = http::HeaderMap::new();
        failed.insert("grpc-status", http::HeaderValue::from_static("14"));
        failed.insert("grpc-message", http::HeaderValue::from_static("gone"));
        let e = finish(&[], Some(&failed));
        assert_eq!((e.code(), e.message()), (Code::Unavailable, "gone"));
        assert_eq!(finish(&[&framed(b"x")], None).code(), Code::Unknown);
        assert_eq!(finish(&[], Some(&ok)).code(), Code::Internal);
        assert_eq!(finish(&[&[0, 0]], Some(&ok)).code(), Code::Internal);
        assert_eq!(
            finish(&[&[1, 0, 0, 0, 1, 9]], Some(&ok)).code(),
            Code::Internal
        );
        assert_eq!(
            finish(&[&framed(b"too long!")], Some(&ok)).code(),
            Code::OutOfRange
        );
        assert_eq!(
            finish(&[&[0, 0, 0, 0, 4, 1]], Some(&ok)).code(),
            Code::Internal
        );
    }

    #[test]
    fn the_head_of_an_answer_may_end_it() {
        let headers = http::HeaderMap::new();
        assert!(head_status(http::StatusCode::OK, &headers).is_none());
        let s = head_status(http::StatusCode::SERVICE_UNAVAILABLE, &headers).unwrap();
        assert_eq!(s.code(), Code::Unavailable);
        let mut trailers_only = http::HeaderMap::new();
        trailers_only.insert("grpc-status", http::HeaderValue::from_static("5"));
        let s = head_status(http::StatusCode::OK, &trailers_only).unwrap();
        assert_eq!(s.code(), Code::NotFound);
    }
}
