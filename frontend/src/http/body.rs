//! Request bodies in, under `--http-max-input-size`; response bodies out, as chunks.
//!
//! The limit is applied three times: to a declared `Content-Length` before anything is read, to
//! the bytes actually streamed (so a chunked upload never buffers past the limit), and to the
//! decompressed size. Memory follows the bytes that arrived, never the declared length: a client
//! declaring 64 MiB and sending 3 bytes makes the server hold 3 bytes (the bytes themselves are
//! charged to the server's request budget by `listener_http`; over it, 503 naming the flag).
//! A body that arrives in one frame is returned as that frame's `Bytes`, so
//! binary tensors sliced from it share the connection's buffer. Responses are a list of `Bytes`
//! chunks (JSON header, then each binary output) sent without concatenation, with an exact
//! size hint so hyper still sets `Content-Length`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::http::HeaderMap;
use axum::http::header::CONTENT_LENGTH;
use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Frame, SizeHint};

use super::compression::{self, Encoding};
use super::error::HttpError;
use crate::budget::BudgetExceeded;
use nereid_proto::ServiceError;

/// The size-limit message (Triton's wording, with the flag to raise it).
pub fn too_large_message(limit: usize) -> String {
    format!(
        "request body size exceeds the maximum allowed input size of {limit} bytes. Use --http-max-input-size to increase the limit."
    )
}

fn too_large(limit: usize) -> HttpError {
    ServiceError::invalid(too_large_message(limit)).into()
}

/// Reads a whole request body, decompressing it per `Content-Encoding`, never holding more than
/// `limit` bytes of either form.
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, HttpError> {
    let encoding = compression::request_encoding(headers)?;
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large(limit));
    }
    let raw = read_limited(body, limit).await?;
    if encoding == Encoding::Identity || raw.is_empty() {
        return Ok(raw);
    }
    // Inflating up to the limit is CPU work; keep it off the async workers.
    tokio::task::spawn_blocking(move || compression::decompress(encoding, &raw, limit))
        .await
        .map_err(|e| ServiceError::internal(format!("request decompression task failed: {e}")))?
        .map_err(HttpError::from)
}

/// Why a body could not be read: over the server's request budget is 503 (try again later),
/// anything else (a deadline, a broken connection) 400.
fn body_error(e: axum::Error) -> HttpError {
    let inner = e.into_inner();
    if let Some(over) = inner.downcast_ref::<BudgetExceeded>() {
        return ServiceError::Overloaded(over.to_string()).into();
    }
    ServiceError::invalid(format!("failed to read the request body: {inner}")).into()
}

async fn read_limited(mut body: Body, limit: usize) -> Result<Bytes, HttpError> {
    let mut parts: Vec<Bytes> = Vec::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(body_error)?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers carry no body bytes
        };
        if data.is_empty() {
            continue;
        }
        total = total.saturating_add(data.len());
        if total > limit {
            return Err(too_large(limit));
        }
        parts.push(data);
    }
    if parts.len() <= 1 {
        return Ok(parts.pop().unwrap_or_default());
    }
    // Every byte is here: one buffer of exactly their size, one copy.
    let mut joined = BytesMut::with_capacity(total);
    for part in parts {
        joined.extend_from_slice(&part);
    }
    Ok(joined.freeze())
}

/// A response body sent as a sequence of shared chunks.
pub struct ChunkBody {
    chunks: VecDeque<Bytes>,
    remaining: u64,
}

impl ChunkBody {
    pub fn new(chunks: Vec<Bytes>) -> ChunkBody {
        let chunks: VecDeque<Bytes> = chunks.into_iter().filter(|c| !c.is_empty()).collect();
        let remaining = chunks.iter().map(|c| c.len() as u64).sum();
        ChunkBody { chunks, remaining }
    }
}

impl hyper::body::Body for ChunkBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        Poll::Ready(this.chunks.pop_front().map(|chunk| {
            this.remaining -= chunk.len() as u64;
            Ok(Frame::data(chunk))
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn stream_body(chunks: Vec<&'static [u8]>) -> Body {
        let stream = futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, Infallible>(Bytes::from_static(c))),
        );
        Body::from_stream(stream)
    }

    #[tokio::test]
    async fn single_frame_body_is_not_copied() {
        let data = Bytes::from(vec![1u8; 100]);
        let read = read_body(&HeaderMap::new(), Body::from(data.clone()), 100)
            .await
            .unwrap();
        assert_eq!(read.as_ptr(), data.as_ptr());
    }

    #[tokio::test]
    async fn streamed_body_is_joined_and_limited() {
        let read = read_body(&HeaderMap::new(), stream_body(vec![b"ab", b"", b"cd"]), 4)
            .await
            .unwrap();
        assert_eq!(&read[..], b"abcd");
        let err = read_body(&HeaderMap::new(), stream_body(vec![b"ab", b"cd", b"e"]), 4)
            .await
            .unwrap_err();
        assert_eq!(err.message(), too_large_message(4));
    }

    #[tokio::test]
    async fn declared_length_is_checked_before_reading() {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_LENGTH, HeaderValue::from_static("5"));
        // The body itself is never polled: an empty body with a large declared length fails.
        let err = read_body(&headers, Body::empty(), 4).await.unwrap_err();
        assert_eq!(err.status().as_u16(), 400);
    }

    #[tokio::test]
    async fn chunk_body_reports_exact_size() {
        let body = ChunkBody::new(vec![
            Bytes::from_static(b"abc"),
            Bytes::new(),
            Bytes::from_static(b"de"),
        ]);
        assert_eq!(hyper::body::Body::size_hint(&body).exact(), Some(5));
        let collected = Body::new(body).collect().await.unwrap().to_bytes();
        assert_eq!(&collected[..], b"abcde");
    }
}
