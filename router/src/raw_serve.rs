//! The server side of unary `ModelInfer` framed by the router itself (the client ─► router half
//! of the pass-through; `raw_call` frames the router ─► worker half): the request's message is
//! read straight off the body's DATA frames and the worker's answer goes back as one DATA frame
//! and the `grpc-status: 0` trailers, without tonic's server codec, which gathered each message
//! into a receive buffer of its own and encoded each answer into an 8 KiB send buffer.
//!
//! ```text
//! request ─► grpc-encoding other than identity ─► tonic's server (it inflates; rare)
//!         └► DATA frames ─► RequestMessage: prefix checked as soon as it is here (flag,
//!            length against the limit), the message split off its frame when it came in one
//!            (else gathered once), anything after it dropped; trailers merged into the metadata
//!         ─► ModelInferRoute::answer ─► Ok: 200, content-type, one DATA frame, grpc-status 0
//!                                    └► Err: trailers-only status (Status::into_http)
//! ```
//!
//! The statuses and messages of a malformed request are tonic's, word for word, so a client
//! sees the same answer either way.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::http;
use bytes::{Buf, Bytes};
use hyper::body::{Body, Frame, SizeHint};
use tonic::metadata::MetadataMap;
use tonic::{Code, Status};

use crate::passthrough::ModelInferRoute;
use crate::raw_call::{Frames, PREFIX, message_frames};
use crate::raw_codec::RawMessage;

/// The header naming a request's compression.
const GRPC_ENCODING: &str = "grpc-encoding";

/// Whether the router frames this call itself: its messages are not compressed (no
/// `grpc-encoding`, or `identity`). A compressed call goes to tonic's server, which inflates it.
pub(crate) fn frames_itself(headers: &http::HeaderMap) -> bool {
    headers
        .get(GRPC_ENCODING)
        .is_none_or(|encoding| encoding.as_bytes() == b"identity")
}

/// Serves one unary `ModelInfer` call (see the module docs).
pub(crate) async fn serve_unary(
    route: ModelInferRoute,
    call: http::Request<axum::body::Body>,
) -> http::Response<tonic::body::Body> {
    let (parts, body) = call.into_parts();
    let max = route.config().grpc.max_message_size;
    let (message, trailers) = match read_message(body, max).await {
        Ok(read) => read,
        Err(status) => return status.into_http(),
    };
    let mut headers = parts.headers;
    if let Some(trailers) = trailers {
        headers.extend(trailers);
    }
    let metadata = MetadataMap::from_headers(headers);
    let answered = route.answer(message, &metadata).await;
    match answered.and_then(|answer| respond(answer, max)) {
        Ok(response) => response,
        Err(status) => status.into_http(),
    }
}

/// The successful answer: 200, `application/grpc`, the message's DATA frame(s), then
/// `grpc-status: 0`. An answer over `max` bytes is OUT_OF_RANGE, as tonic's encoder says it.
fn respond(answer: Bytes, max: usize) -> Result<http::Response<tonic::body::Body>, Status> {
    if answer.len() > max {
        return Err(Status::out_of_range(format!(
            "Error, encoded message length too large: found {} bytes, the limit is: {max} bytes",
            answer.len()
        )));
    }
    let frames = message_frames(&RawMessage::new(answer))?;
    let mut trailers = http::HeaderMap::with_capacity(1);
    trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
    let body = Answer {
        frames: frames.into(),
        trailers: Some(trailers),
    };
    let mut response = http::Response::new(tonic::body::Body::new(body));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/grpc"),
    );
    Ok(response)
}

/// Reads the call's one message and its trailers (if the client sent any).
async fn read_message(
    mut body: axum::body::Body,
    max: usize,
) -> Result<(Bytes, Option<http::HeaderMap>), Status> {
    let mut message = RequestMessage::new(max);
    let mut trailers: Option<http::HeaderMap> = None;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => {
                let status = Status::from_error(error.into());
                // A client that reset its stream ends it, as tonic reads it.
                if status.code() == Code::Cancelled {
                    message.cancelled();
                    break;
                }
                return Err(status);
            }
        };
        match frame.into_data() {
            Ok(data) => message.push(data)?,
            Err(frame) => {
                if let Ok(more) = frame.into_trailers() {
                    trailers.get_or_insert_default().extend(more);
                }
            }
        }
    }
    Ok((message.finish()?, trailers))
}

/// One request message gathered from its DATA frames (pure: tested without a body).
#[derive(Debug)]
struct RequestMessage {
    max_message_size: usize,
    /// The frames so far, until the message is complete.
    frames: Frames,
    /// The message's length, once its prefix is here.
    len: Option<usize>,
    /// The message, once complete; later bytes are dropped.
    done: Option<Bytes>,
    /// The client reset the stream before the message was complete.
    reset: bool,
}

impl RequestMessage {
    fn new(max_message_size: usize) -> RequestMessage {
        RequestMessage {
            max_message_size,
            frames: Frames::default(),
            len: None,
            done: None,
            reset: false,
        }
    }

    /// One DATA frame's bytes; an error as soon as the prefix is wrong.
    fn push(&mut self, data: Bytes) -> Result<(), Status> {
        if self.done.is_some() || data.is_empty() {
            return Ok(());
        }
        self.frames.push(data);
        let have = self.frames.bytes().len();
        if self.len.is_none() && have >= PREFIX {
            let mut prefix = [0u8; PREFIX];
            prefix.copy_from_slice(&self.frames.bytes()[..PREFIX]);
            self.len = Some(self.checked_prefix(&prefix)?);
        }
        if let Some(len) = self.len
            && have >= PREFIX + len
        {
            let mut all = self.frames.take();
            all.advance(PREFIX);
            self.done = Some(all.split_to(len));
        }
        Ok(())
    }

    /// The message length a prefix declares, checked as tonic's decoder checks it.
    fn checked_prefix(&self, prefix: &[u8]) -> Result<usize, Status> {
        let mut prefix = prefix;
        match prefix.get_u8() {
            0 => {}
            1 => {
                return Err(Status::internal(
                    "protocol error: received message with compressed-flag but no grpc-encoding was specified",
                ));
            }
            flag => {
                return Err(Status::internal(format!(
                    "protocol error: received message with invalid compression flag: {flag} (valid flags are 0 and 1), while sending request"
                )));
            }
        }
        let len = prefix.get_u32() as usize;
        if len > self.max_message_size {
            return Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                self.max_message_size
            )));
        }
        Ok(len)
    }

    /// The client reset the stream.
    fn cancelled(&mut self) {
        self.reset = true;
    }

    /// The message, once the body ended.
    fn finish(self) -> Result<Bytes, Status> {
        match self.done {
            Some(message) => Ok(message),
            None if self.reset || self.frames.bytes().is_empty() => {
                Err(Status::internal("Missing request message."))
            }
            None => Err(Status::internal("Unexpected EOF decoding stream.")),
        }
    }
}

/// The response body of a successful call: its DATA frames, then its trailers.
struct Answer {
    frames: VecDeque<Bytes>,
    trailers: Option<http::HeaderMap>,
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if let Some(data) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let len: usize = self.frames.iter().map(Bytes::len).sum();
        SizeHint::with_exact(len as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    fn read(frames: &[&[u8]], max: usize) -> Result<Bytes, Status> {
        let mut message = RequestMessage::new(max);
        for frame in frames {
            message.push(Bytes::copy_from_slice(frame))?;
        }
        message.finish()
    }

    #[test]
    fn a_message_in_one_frame_is_split_off_it() {
        let frame = Bytes::from(framed(0, b"request"));
        let mut message = RequestMessage::new(100);
        message.push(frame.clone()).unwrap();
        let out = message.finish().unwrap();
        assert_eq!(out, Bytes::from_static(b"request"));
        assert_eq!(out.as_ptr(), frame[PREFIX..].as_ptr());
    }

    #[test]
    fn a_message_over_frames_is_gathered_and_later_bytes_dropped() {
        let mut all = framed(0, b"a longer request");
        all.extend_from_slice(&framed(0, b"second"));
        let parts: Vec<&[u8]> = all.chunks(3).collect();
        assert_eq!(
            read(&parts, 100).unwrap(),
            Bytes::from_static(b"a longer request")
        );
        let empty = framed(0, b"");
        assert_eq!(read(&[&empty], 100).unwrap(), Bytes::new());
    }

    #[test]
    fn bad_requests_get_tonics_statuses() {
        let err = |frames: &[&[u8]], max| read(frames, max).unwrap_err();
        let e = err(&[], 10);
        assert_eq!(
            (e.code(), e.message()),
            (Code::Internal, "Missing request message.")
        );
        let e = err(&[&[0, 0, 0]], 10);
        assert_eq!(
            (e.code(), e.message()),
            (Code::Internal, "Unexpected EOF decoding stream.")
        );
        let e = err(&[&[0, 0, 0, 0, 4, 1]], 10);
        assert_eq!(e.message(), "Unexpected EOF decoding stream.");
        let e = err(&[&framed(1, b"x")], 10);
        assert_eq!(e.code(), Code::Internal);
        assert!(
            e.message().contains("compressed-flag but no grpc-encoding"),
            "{e:?}"
        );
        let e = err(&[&framed(7, b"x")], 10);
        assert!(e.message().contains("invalid compression flag: 7"), "{e:?}");
        // Refused on its prefix alone, before the rest arrives.
        let mut message = RequestMessage::new(10);
        let e = message
            .push(Bytes::from_static(&[0, 0, 0, 0, 11]))
            .unwrap_err();
        assert_eq!(e.code(), Code::OutOfRange);
        assert_eq!(
            e.message(),
            "Error, decoded message length too large: found 11 bytes, the limit is: 10 bytes"
        );
        let mut reset = RequestMessage::new(10);
        reset.push(Bytes::from_static(&[0, 0])).unwrap();
        reset.cancelled();
        assert_eq!(
            reset.finish().unwrap_err().message(),
            "Missing request message."
        );
    }

    #[test]
    fn only_uncompressed_calls_are_framed_here() {
        let mut headers = http::HeaderMap::new();
        assert!(frames_itself(&headers));
        headers.insert(GRPC_ENCODING, http::HeaderValue::from_static("identity"));
        assert!(frames_itself(&headers));
        headers.insert(GRPC_ENCODING, http::HeaderValue::from_static("gzip"));
        assert!(!frames_itself(&headers));
    }

    #[tokio::test]
    async fn an_answer_is_one_frame_then_grpc_status_ok() {
        let response = respond(Bytes::from_static(b"answer"), 100).unwrap();
        assert_eq!(response.headers()["content-type"], "application/grpc");
        let mut body = response.into_body();
        let mut frames = Vec::new();
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            frames.push(frame.unwrap());
        }
        assert_eq!(frames.len(), 2);
        assert_eq!(
            frames[0].data_ref().unwrap(),
            &Bytes::from(framed(0, b"answer"))
        );
        assert_eq!(frames[1].trailers_ref().unwrap()["grpc-status"], "0");
        let e = respond(Bytes::from_static(b"answer"), 5).unwrap_err();
        assert_eq!(e.code(), Code::OutOfRange);
    }
}
