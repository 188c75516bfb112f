//! Whole gRPC messages for tonic, buffered as their bytes arrive and charged to the
//! [`RequestBudget`].
//!
//! tonic's decoder reserves a message's *declared* length (the 5-byte prefix) as soon as it
//! reads the prefix, before the message's bytes arrive: one client declaring 2 GiB on hundreds of
//! streams made the server reserve gigabytes for a few kilobytes of traffic. This layer sits
//! between hyper and tonic on every gRPC port and hands tonic only complete messages, so what
//! tonic reserves is always already here, and a message still arriving holds only the bytes that
//! came, charged to the server-wide budget.
//!
//! ```text
//!  h2 DATA frames ─► BufferedMessages ─┬ whole message(s) in one frame ─► passed on, no copy
//!                                      ├ part of a message ─► kept (lease.grow); complete ─►
//!                                      │   its pieces to tonic, lease released
//!                                      ├ prefix over the max message size ─► passed on at once:
//!                                      │   tonic refuses it (OUT_OF_RANGE) without reserving
//!                                      └ over the budget ─► RESOURCE_EXHAUSTED naming the flag
//! ```

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http::HeaderMap;
use hyper::body::{Frame, SizeHint};
use tonic::Status;
use tonic::body::Body;

use crate::budget::{Lease, RequestBudget};

/// Length of the gRPC message prefix: compression flag (1 byte), length (4 bytes, big-endian).
const PREFIX: usize = 5;

/// A tower layer that wraps every request body in [`BufferedMessages`].
#[derive(Clone, Debug)]
pub struct BufferMessagesLayer {
    budget: RequestBudget,
    max_message_size: usize,
    /// The port serves the HTTP API too: bodies of [`HTTP_API_PREFIX`] paths are not gRPC.
    http_api: bool,
}

impl BufferMessagesLayer {
    /// `max_message_size`: the port's decoding limit; a longer prefix goes to tonic unbuffered so
    /// it refuses it with its usual status.
    pub fn new(budget: RequestBudget, max_message_size: usize) -> Self {
        BufferMessagesLayer {
            budget,
            max_message_size,
            http_api: false,
        }
    }

    /// For a port that serves the HTTP API beside gRPC: requests under [`HTTP_API_PREFIX`]
    /// (routed to the HTTP routes, never to tonic) keep their body as it comes, still charged
    /// to the budget.
    pub fn serving_http_api(self) -> Self {
        BufferMessagesLayer {
            http_api: true,
            ..self
        }
    }
}

impl<S> tower::Layer<S> for BufferMessagesLayer {
    type Service = BufferMessages<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BufferMessages {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`BufferMessagesLayer`] makes.
#[derive(Clone, Debug)]
pub struct BufferMessages<S> {
    inner: S,
    layer: BufferMessagesLayer,
}

impl<S> tower::Service<http::Request<Body>> for BufferMessages<S>
where
    S: tower::Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let layer = &self.layer;
        let http_api = layer.http_api && request.uri().path().starts_with(HTTP_API_PREFIX);
        let request = request.map(|body| {
            if http_api {
                Body::new(ChargedBody {
                    inner: body,
                    lease: layer.budget.lease(),
                })
            } else {
                Body::new(BufferedMessages::new(
                    body,
                    layer.budget.lease(),
                    layer.max_message_size,
                ))
            }
        });
        self.inner.call(request)
    }
}

/// Paths of the HTTP API where a gRPC port serves it too ([`BufferMessagesLayer::serving_http_api`]).
pub const HTTP_API_PREFIX: &str = "/v2/";

/// A request body of the HTTP API on a gRPC port: its bytes pass on as they come, charged to the
/// budget until the body is dropped (the HTTP routes read it whole, within their size limit).
struct ChargedBody {
    inner: Body,
    lease: Lease,
}

impl hyper::body::Body for ChargedBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(Ok(frame)) = &frame
            && let Some(data) = frame.data_ref()
            && let Err(e) = this.lease.grow(data.len())
        {
            return Poll::Ready(Some(Err(Status::resource_exhausted(e.to_string()))));
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        hyper::body::Body::is_end_stream(&self.inner)
    }

    fn size_hint(&self) -> SizeHint {
        hyper::body::Body::size_hint(&self.inner)
    }
}

/// A gRPC request body that yields only whole messages (see the module docs).
pub struct BufferedMessages {
    inner: Body,
    lease: Lease,
    max_message_size: usize,
    /// The message being received: its prefix so far, then its length once the prefix is in.
    prefix: [u8; PREFIX],
    prefix_got: usize,
    /// Received pieces of the message being received (prefix included) and their total.
    parts: Vec<Bytes>,
    received: usize,
    /// What is ready for tonic, in order.
    ready: VecDeque<Bytes>,
    trailers: Option<HeaderMap>,
    /// An oversized prefix went to tonic: from then on bytes pass through as they come.
    pass_through: bool,
    ended: bool,
}

impl BufferedMessages {
    pub fn new(inner: Body, lease: Lease, max_message_size: usize) -> Self {
        BufferedMessages {
            inner,
            lease,
            max_message_size,
            prefix: [0; PREFIX],
            prefix_got: 0,
            parts: Vec::new(),
            received: 0,
            ready: VecDeque::new(),
            trailers: None,
            pass_through: false,
            ended: false,
        }
    }

    /// The declared length of the message being received, once its prefix is in.
    fn declared(&self) -> Option<usize> {
        (self.prefix_got == PREFIX).then(|| {
            u32::from_be_bytes([
                self.prefix[1],
                self.prefix[2],
                self.prefix[3],
                self.prefix[4],
            ]) as usize
        })
    }

    /// Takes one DATA frame's bytes.
    fn take(&mut self, mut data: Bytes) -> Result<(), Status> {
        while !data.is_empty() {
            if self.pass_through {
                self.ready.push_back(data);
                return Ok(());
            }
            if self.received == 0 && data.len() >= PREFIX {
                // At a message boundary: a message wholly inside this frame goes on as is.
                let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
                if len > self.max_message_size {
                    self.pass_through = true;
                    continue;
                }
                if data.len() - PREFIX >= len {
                    self.ready.push_back(data.split_to(PREFIX + len));
                    continue;
                }
            }
            let want = match self.declared() {
                Some(len) => PREFIX + len - self.received,
                None => PREFIX - self.prefix_got,
            };
            let piece = data.split_to(want.min(data.len()));
            self.lease
                .grow(piece.len())
                .map_err(|e| Status::resource_exhausted(e.to_string()))?;
            if self.prefix_got < PREFIX {
                let n = (PREFIX - self.prefix_got).min(piece.len());
                self.prefix[self.prefix_got..self.prefix_got + n].copy_from_slice(&piece[..n]);
                self.prefix_got += n;
            }
            self.received += piece.len();
            self.parts.push(piece);
            match self.declared() {
                Some(len) if len > self.max_message_size => {
                    self.hand_on();
                    self.pass_through = true;
                }
                Some(len) if self.received == PREFIX + len => self.hand_on(),
                _ => {}
            }
        }
        Ok(())
    }

    /// Hands what was received of the current message to tonic and gives the lease back. A whole
    /// message: tonic copies its pieces into the one buffer it decodes from, reserved now that
    /// every byte is here. An unfinished one (the stream ended, or its length is over the limit):
    /// tonic reports it.
    fn hand_on(&mut self) {
        self.ready.extend(self.parts.drain(..));
        self.reset();
    }

    fn reset(&mut self) {
        self.parts.clear();
        self.received = 0;
        self.prefix_got = 0;
        self.lease.release();
    }
}

impl hyper::body::Body for BufferedMessages {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = &mut *self;
        loop {
            if let Some(data) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            if let Some(trailers) = this.trailers.take() {
                return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                None => {
                    this.ended = true;
                    this.hand_on();
                }
                Some(Err(status)) => {
                    this.ended = true;
                    this.reset();
                    return Poll::Ready(Some(Err(status)));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        if let Err(status) = this.take(data) {
                            this.ended = true;
                            this.reset();
                            this.ready.clear();
                            return Poll::Ready(Some(Err(status)));
                        }
                    }
                    Err(frame) => {
                        if let Ok(trailers) = frame.into_trailers() {
                            this.hand_on();
                            this.trailers = Some(trailers);
                        }
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ready.is_empty()
            && self.trailers.is_none()
            && (self.ended || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let buffered: usize = self.ready.iter().map(Buf::remaining).sum();
        let mut hint = self.inner.size_hint();
        let lower = hint.lower().saturating_add(buffered as u64);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper.saturating_add(buffered as u64 + self.received as u64));
        }
        hint.set_lower(lower);
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn message(len: usize, fill: u8) -> Vec<u8> {
        let mut m = vec![0u8];
        m.extend_from_slice(&(len as u32).to_be_bytes());
        m.extend(std::iter::repeat_n(fill, len));
        m
    }

    fn body_of(chunks: Vec<Vec<u8>>) -> Body {
        body_of_bytes(chunks.into_iter().map(Bytes::from).collect())
    }

    fn body_of_bytes(chunks: Vec<Bytes>) -> Body {
        let stream =
            futures::stream::iter(chunks.into_iter().map(|c| Ok::<_, Status>(Frame::data(c))));
        Body::new(http_body_util::StreamBody::new(stream))
    }

    async fn frames(body: BufferedMessages) -> Result<Vec<Bytes>, Status> {
        let mut body = std::pin::pin!(body);
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame?.into_data() {
                out.push(data);
            }
        }
        Ok(out)
    }

    #[tokio::test]
    async fn messages_split_across_frames_come_out_whole() {
        let budget = RequestBudget::new(1 << 20);
        let a = message(10, 1);
        let b = message(300, 2);
        let mut stream = a.clone();
        stream.extend_from_slice(&b);
        // Cut everywhere: inside the first prefix, at the boundary, inside the second body.
        let chunks = vec![
            stream[..3].to_vec(),
            stream[3..15].to_vec(),
            stream[15..17].to_vec(),
            stream[17..100].to_vec(),
            stream[100..].to_vec(),
        ];
        let body = BufferedMessages::new(body_of(chunks), budget.lease(), 1024);
        let out = frames(body).await.unwrap();
        assert_eq!(out.concat(), stream, "every byte, in order");
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn whole_messages_in_one_frame_are_not_copied() {
        let budget = RequestBudget::new(16);
        let mut both = message(100, 7);
        both.extend(message(0, 0));
        let frame = Bytes::from(both);
        let body = BufferedMessages::new(body_of_bytes(vec![frame.clone()]), budget.lease(), 1024);
        let out = frames(body).await.unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].len(), 105);
        assert_eq!(out[1].len(), 5);
        assert_eq!(
            out[0].as_ptr(),
            frame.as_ptr(),
            "the first message shares the frame"
        );
        assert_eq!(
            budget.used(),
            0,
            "nothing was buffered, so nothing was charged"
        );
    }

    #[tokio::test]
    async fn a_large_declared_length_holds_only_what_arrived() {
        let budget = RequestBudget::new(1 << 20);
        let declared = message(500_000, 0);
        let (tx, rx) = futures::channel::mpsc::unbounded::<Result<Frame<Bytes>, Status>>();
        let body = Body::new(http_body_util::StreamBody::new(rx));
        let mut body = Box::pin(BufferedMessages::new(body, budget.lease(), 1 << 20));
        tx.unbounded_send(Ok(Frame::data(Bytes::copy_from_slice(&declared[..14]))))
            .unwrap();
        let poll = futures::poll!(body.frame());
        assert!(
            poll.is_pending(),
            "nothing is handed on before the message is whole"
        );
        assert_eq!(budget.used(), 14, "only the bytes that arrived are charged");
        drop(body);
        assert_eq!(budget.used(), 0, "a dropped body gives its bytes back");
    }

    #[tokio::test]
    async fn over_the_budget_is_resource_exhausted() {
        let budget = RequestBudget::new(100);
        let m = message(200, 3);
        let body = BufferedMessages::new(
            body_of(vec![m[..60].to_vec(), m[60..].to_vec()]),
            budget.lease(),
            1024,
        );
        let err = frames(body).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(
            err.message().contains("--max-buffered-request-bytes"),
            "{err}"
        );
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn an_http_api_body_passes_as_it_comes_within_the_budget() {
        let budget = RequestBudget::new(100);
        let chunks = vec![b"{\"inputs\"".to_vec(), b":[]}".to_vec()];
        let body = ChargedBody {
            inner: body_of(chunks),
            lease: budget.lease(),
        };
        let all = body.collect().await.unwrap().to_bytes();
        assert_eq!(&all[..], b"{\"inputs\":[]}");
        assert_eq!(budget.used(), 0);

        let body = ChargedBody {
            inner: body_of(vec![vec![b' '; 60], vec![b' '; 60]]),
            lease: budget.lease(),
        };
        let err = body.collect().await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn an_oversized_prefix_goes_to_tonic_unbuffered() {
        let budget = RequestBudget::new(100);
        let mut prefix = vec![0u8];
        prefix.extend_from_slice(&(u32::MAX).to_be_bytes());
        let body = BufferedMessages::new(
            body_of(vec![
                prefix[..2].to_vec(),
                prefix[2..].to_vec(),
                vec![9; 50],
            ]),
            budget.lease(),
            1024,
        );
        let out = frames(body).await.unwrap();
        let joined: Vec<u8> = out.iter().flat_map(|b| b.to_vec()).collect();
        assert_eq!(&joined[..5], &prefix[..]);
        assert_eq!(joined.len(), 55);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn an_unfinished_message_at_the_end_is_handed_on() {
        let budget = RequestBudget::new(1000);
        let m = message(100, 4);
        let body = BufferedMessages::new(body_of(vec![m[..50].to_vec()]), budget.lease(), 1024);
        let out = frames(body).await.unwrap();
        assert_eq!(out.iter().map(|b| b.len()).sum::<usize>(), 50);
        assert_eq!(budget.used(), 0);
    }
}
