//! A streamed answer as server-sent events, OpenAI's framing:
//!
//! ```text
//! data: {chunk}\n\n            chat: the role chunk first; then one chunk per piece with text
//! data: {finish chunk}\n\n     finish_reason set
//! data: {usage chunk}\n\n      only with stream_options.include_usage
//! data: [DONE]\n\n
//! ```
//!
//! The status line goes out with the first event, so the caller awaits the first piece before
//! building the response: an error before it is an ordinary error response. An error after it
//! is a last `data: {"error": {...}}` event, then `[DONE]`. The body owns the pieces' stream: a
//! client that disconnects drops it, which cancels the request in the model.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::body::Body;
use axum::http::HeaderValue;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::response::Response;
use bytes::Bytes;
use futures::{StreamExt, stream};

use super::errors::OpenAiError;
use super::generation::{Piece, Pieces, Tally};
use super::response::{Envelope, Kind};
use crate::http::sse_event;

/// The last event of every stream.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

/// What the body's stream holds between events.
struct Run {
    envelope: Envelope,
    pieces: Pieces,
    tally: Tally,
    include_usage: bool,
    pending: VecDeque<Bytes>,
    done: bool,
}

impl Run {
    fn push_piece(&mut self, piece: &Piece) {
        self.tally.add(piece);
        if !piece.text.is_empty() {
            self.pending
                .push_back(sse_event(&self.envelope.text_chunk(&piece.text)));
        }
    }

    fn push_end(&mut self) {
        let finish = self.envelope.finish_chunk(self.tally.finish_reason());
        self.pending.push_back(sse_event(&finish));
        if self.include_usage {
            let usage = self.envelope.usage_chunk(self.tally.usage());
            self.pending.push_back(sse_event(&usage));
        }
        self.pending.push_back(Bytes::from_static(DONE));
        self.done = true;
    }

    fn push_error(&mut self, err: OpenAiError) {
        self.pending.push_back(sse_event(&err.body()));
        self.pending.push_back(Bytes::from_static(DONE));
        self.done = true;
    }

    /// The next event to send, reading pieces until one makes an event.
    async fn next(mut self) -> Option<(Bytes, Run)> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some((event, self));
            }
            if self.done {
                return None;
            }
            match self.pieces.next().await {
                Some(Ok(piece)) => self.push_piece(&piece),
                Some(Err(err)) => self.push_error(err.into()),
                None => self.push_end(),
            }
        }
    }
}

/// What a streamed answer starts with.
pub struct StreamStart {
    pub envelope: Envelope,
    /// Text sent before the model's (the prompt, with `echo`).
    pub echo: Option<String>,
    pub tally: Tally,
    pub include_usage: bool,
}

/// The event-stream response for `pieces`; awaits the first piece (see the module docs).
pub async fn respond(start: StreamStart, mut pieces: Pieces) -> Result<Response, OpenAiError> {
    let first = pieces.next().await.transpose()?;
    let mut run = Run {
        envelope: start.envelope,
        pieces,
        tally: start.tally,
        include_usage: start.include_usage,
        pending: VecDeque::new(),
        done: false,
    };
    if run.envelope.kind == Kind::Chat {
        let role = run.envelope.role_chunk();
        run.pending.push_back(sse_event(&role));
    }
    if let Some(echo) = start.echo.filter(|e| !e.is_empty()) {
        let chunk = run.envelope.text_chunk(&echo);
        run.pending.push_back(sse_event(&chunk));
    }
    match first {
        Some(piece) => run.push_piece(&piece),
        None => run.push_end(),
    }
    let events = stream::unfold(run, Run::next).map(Ok::<_, Infallible>);
    let mut response = Response::new(Body::from_stream(events));
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use nereid_proto::ServiceError;

    fn piece(text: &str) -> Piece {
        Piece {
            text: text.into(),
            ..Piece::default()
        }
    }

    async fn events(start: StreamStart, items: Vec<Result<Piece, ServiceError>>) -> Vec<String> {
        let pieces: Pieces = stream::iter(items).boxed();
        let response = respond(start, pieces).await.unwrap();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let text = String::from_utf8(body.to_vec()).unwrap();
        assert!(text.ends_with("\n\n"));
        text.trim_end().split("\n\n").map(str::to_string).collect()
    }

    fn start(kind: Kind, include_usage: bool) -> StreamStart {
        StreamStart {
            envelope: Envelope::new(kind, "m", include_usage),
            echo: None,
            tally: Tally::new("a b", None),
            include_usage,
        }
    }

    #[tokio::test]
    async fn chat_stream_frames_role_pieces_finish_usage_done() {
        let got = events(
            start(Kind::Chat, true),
            vec![Ok(piece("x")), Ok(piece("")), Ok(piece("y"))],
        )
        .await;
        assert_eq!(got.len(), 6, "{got:?}");
        assert!(got[0].contains(r#""role":"assistant""#));
        assert!(got[1].contains(r#""content":"x""#));
        assert!(got[2].contains(r#""content":"y""#));
        assert!(got[3].contains(r#""finish_reason":"stop""#));
        assert!(got[4].contains(r#""completion_tokens":2"#) && got[4].contains(r#""choices":[]"#));
        assert_eq!(got[5], "data: [DONE]");
        assert!(got.iter().all(|e| e.starts_with("data: ")));
    }

    #[tokio::test]
    async fn error_after_first_piece_is_an_event() {
        let got = events(
            start(Kind::Text, false),
            vec![Ok(piece("x")), Err(ServiceError::internal("boom"))],
        )
        .await;
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(got[1].contains(r#""message":"boom""#));
        assert_eq!(got[2], "data: [DONE]");
    }

    #[tokio::test]
    async fn error_before_first_piece_is_the_status() {
        let pieces: Pieces =
            stream::iter(vec![Err(ServiceError::Overloaded("full".into()))]).boxed();
        let err = respond(start(Kind::Text, false), pieces).await.unwrap_err();
        assert_eq!(err.status.as_u16(), 429);
    }
}
