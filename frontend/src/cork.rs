//! Writes gathered over one pass of the connection's task: [`Corked`] holds what an HTTP/2
//! connection writes until the task that owns it has been polled once more, so the frames of
//! every request answered meanwhile leave in one system call.
//!
//! h2 writes a DATA frame of more than 256 bytes from the message's own buffer and flushes
//! before it buffers the next frame, so at concurrency each such frame (a 4 KiB tensor, say)
//! cost a `writev` of its own, both on the client's side of a proxy and on the worker's. Here:
//!
//! ```text
//! poll_write(_vectored) ─► appended to the buffer (a write of 64 KiB or more goes out at once,
//!                          after what is buffered)
//! poll_flush, first       ─► deferred: the task is woken, Ready returned; later frames of the
//!                          same pass append
//! poll_flush, after the task read again (its next pass) ─► one write of everything, then flush
//! poll_shutdown           ─► everything written, then shut down
//! ```
//!
//! The deferral relies on the owner polling its reads before it flushes on each pass, as h2's
//! connection task does (it reads until `Pending`, then flushes); the wake-up guarantees that
//! pass comes. It pays off on tokio's current-thread scheduler (the router's default), which
//! runs woken tasks in wake order on the one thread: the connection's next pass comes after the
//! tasks woken before it, whose frames it then carries too. On the multi-threaded scheduler a
//! task that wakes itself may be handed to another worker thread, which it would wake: measured
//! on `serve` (identity gRPC, concurrency 1) that cost 14 % more CPU per request and 40 µs of
//! p50. So [`Corked::for_this_runtime`] corks only on a current-thread runtime and otherwise
//! passes every call straight through.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Writes of at least this many bytes, and a buffer that would grow past it, go out at once.
const CORK_LIMIT: usize = 64 * 1024;

/// An I/O object whose writes wait for the owner's next pass (see the module docs).
#[derive(Debug)]
pub struct Corked<T> {
    inner: T,
    /// Writes are held (else every call passes straight through).
    corked: bool,
    pending: BytesMut,
    /// A flush was deferred and the task woken.
    deferred: bool,
    /// The owner read since the deferral: this is its next pass.
    read_since: bool,
}

impl<T> Corked<T> {
    /// Wraps `inner`, corked.
    pub fn new(inner: T) -> Corked<T> {
        Corked {
            inner,
            corked: true,
            pending: BytesMut::new(),
            deferred: false,
            read_since: false,
        }
    }

    /// Wraps `inner`, corked when the runtime this runs on is a current-thread one (see the
    /// module docs), else passing every call through.
    pub fn for_this_runtime(inner: T) -> Corked<T> {
        let current_thread = tokio::runtime::Handle::try_current().is_ok_and(|handle| {
            handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread
        });
        Corked {
            corked: current_thread,
            ..Corked::new(inner)
        }
    }

    /// Whether writes are held for the owner's next pass.
    pub fn is_corked(&self) -> bool {
        self.corked
    }

    /// The wrapped I/O object.
    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsyncWrite + Unpin> Corked<T> {
    /// Writes everything pending.
    fn drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.pending.is_empty() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.pending.advance(n);
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Corked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.read_since = true;
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Corked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if !self.corked {
            return Pin::new(&mut self.inner).poll_write(cx, buf);
        }
        if self.pending.len() + buf.len() > CORK_LIMIT {
            ready!(self.drain(cx))?;
        }
        if buf.len() >= CORK_LIMIT {
            return Pin::new(&mut self.inner).poll_write(cx, buf);
        }
        self.pending.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if !self.corked {
            return Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        }
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if self.pending.len() + len > CORK_LIMIT {
            ready!(self.drain(cx))?;
        }
        if len >= CORK_LIMIT {
            return Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        }
        self.pending.reserve(len);
        for b in bufs {
            self.pending.extend_from_slice(b);
        }
        Poll::Ready(Ok(len))
    }

    fn is_write_vectored(&self) -> bool {
        self.corked || self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if !self.pending.is_empty() {
            if !self.deferred {
                self.deferred = true;
                self.read_since = false;
                cx.waker().wake_by_ref();
                return Poll::Ready(Ok(()));
            }
            if !self.read_since {
                // Still the same pass (h2 flushes between frames): keep gathering. Woken again
                // so that a pass which ends without reading cannot leave the bytes waiting.
                cx.waker().wake_by_ref();
                return Poll::Ready(Ok(()));
            }
            ready!(self.drain(cx))?;
        }
        self.deferred = false;
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.drain(cx))?;
        self.deferred = false;
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Corked<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;

    /// An in-memory sink that counts its writes.
    #[derive(Default)]
    struct Sink {
        written: Vec<u8>,
        writes: usize,
    }

    impl AsyncWrite for Sink {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.written.extend_from_slice(buf);
            self.writes += 1;
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncRead for Sink {
        fn poll_read(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            _: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Pending
        }
    }

    struct Counter(AtomicUsize);
    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn write(io: &mut Corked<Sink>, cx: &mut Context<'_>, data: &[u8]) {
        assert!(matches!(Pin::new(io).poll_write(cx, data), Poll::Ready(Ok(n)) if n == data.len()));
    }

    fn flush(io: &mut Corked<Sink>, cx: &mut Context<'_>) {
        assert!(matches!(Pin::new(io).poll_flush(cx), Poll::Ready(Ok(()))));
    }

    fn read(io: &mut Corked<Sink>, cx: &mut Context<'_>) {
        let mut space = [0u8; 8];
        let mut buf = ReadBuf::new(&mut space);
        assert!(Pin::new(io).poll_read(cx, &mut buf).is_pending());
    }

    #[test]
    fn writes_of_one_pass_leave_together_on_the_next() {
        let wakes = Arc::new(Counter(AtomicUsize::new(0)));
        let waker = wakes.clone().into();
        let mut cx = Context::from_waker(&waker);
        let mut io = Corked::new(Sink::default());
        // First pass: two frames and two flushes (h2 flushes before a large frame's successor).
        write(&mut io, &mut cx, b"headers");
        flush(&mut io, &mut cx);
        write(&mut io, &mut cx, b"data");
        flush(&mut io, &mut cx);
        assert_eq!(io.get_ref().writes, 0);
        assert!(
            wakes.0.load(Ordering::SeqCst) >= 1,
            "woken for the next pass"
        );
        // Next pass: it reads, then flushes: one write of both.
        read(&mut io, &mut cx);
        write(&mut io, &mut cx, b"more");
        flush(&mut io, &mut cx);
        assert_eq!(io.get_ref().writes, 1);
        assert_eq!(io.get_ref().written, b"headersdatamore");
        // Nothing pending: a flush passes straight through.
        flush(&mut io, &mut cx);
        assert_eq!(io.get_ref().writes, 1);
    }

    #[test]
    fn uncorked_writes_pass_straight_through() {
        let waker = Arc::new(Counter(AtomicUsize::new(0))).into();
        let mut cx = Context::from_waker(&waker);
        // Not on any runtime: nothing to gather for.
        let mut io = Corked::for_this_runtime(Sink::default());
        assert!(!io.is_corked());
        write(&mut io, &mut cx, b"at once");
        assert_eq!(io.get_ref().writes, 1);
        let current = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        assert!(current.block_on(async { Corked::for_this_runtime(()).is_corked() }));
        let multi = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        assert!(!multi.block_on(async { Corked::for_this_runtime(()).is_corked() }));
    }

    #[test]
    fn large_writes_and_shutdown_do_not_wait() {
        let wakes = Arc::new(Counter(AtomicUsize::new(0)));
        let waker = wakes.into();
        let mut cx = Context::from_waker(&waker);
        let mut io = Corked::new(Sink::default());
        write(&mut io, &mut cx, b"small");
        let large = vec![7u8; CORK_LIMIT];
        write(&mut io, &mut cx, &large);
        assert_eq!(
            io.get_ref().writes,
            2,
            "what was pending first, then the large write"
        );
        assert_eq!(&io.get_ref().written[..5], b"small");
        write(&mut io, &mut cx, b"tail");
        assert!(Pin::new(&mut io).poll_shutdown(&mut cx).is_ready());
        assert!(io.get_ref().written.ends_with(b"tail"));
    }
}
