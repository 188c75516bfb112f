"""A raw HTTP/2 client over one socket, for probes no well-behaved client library sends: streams
that declare a huge gRPC message and never finish it, streams reset as soon as they open, and a
read of the server's own SETTINGS.

Frames are written by hand (RFC 9113); request headers go out as HPACK literals without
indexing and without Huffman coding; the server's header blocks are decoded with the whole of
HPACK (RFC 7541: static and dynamic tables, Huffman), which is small enough to keep here.
Every read is bounded by a deadline.
"""

import socket
import struct
import time
import urllib.parse

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, \
    CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_MAX_CONCURRENT_STREAMS = 0x3
CANCEL = 0x8


def frame(kind, flags, stream_id, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + \
        struct.pack(">I", stream_id & 0x7FFFFFFF) + payload


def settings_frame(settings=(), ack=False):
    return frame(SETTINGS, ACK if ack else 0, 0,
                 b"".join(struct.pack(">HI", k, v) for k, v in settings))


def rst_stream(stream_id, code=CANCEL):
    return frame(RST_STREAM, 0, stream_id, struct.pack(">I", code))


def data_frame(stream_id, payload, end_stream=False):
    return frame(DATA, END_STREAM if end_stream else 0, stream_id, payload)


# ---------------------------------------------------------------------------------------------
# HPACK


def encode_int(value, prefix_bits, first=0):
    top = (1 << prefix_bits) - 1
    if value < top:
        return bytes([first | value])
    out = [first | top]
    value -= top
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_headers(pairs):
    """A header block of literals without indexing, new names, no Huffman."""
    out = b""
    for name, value in pairs:
        name, value = name.encode(), value.encode()
        out += b"\x00" + encode_int(len(name), 7) + name + encode_int(len(value), 7) + value
    return out


STATIC_TABLE = [
    (":authority", ""), (":method", "GET"), (":method", "POST"), (":path", "/"),
    (":path", "/index.html"), (":scheme", "http"), (":scheme", "https"), (":status", "200"),
    (":status", "204"), (":status", "206"), (":status", "304"), (":status", "400"),
    (":status", "404"), (":status", "500"), ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"), ("accept-language", ""), ("accept-ranges", ""),
    ("accept", ""), ("access-control-allow-origin", ""), ("age", ""), ("allow", ""),
    ("authorization", ""), ("cache-control", ""), ("content-disposition", ""),
    ("content-encoding", ""), ("content-language", ""), ("content-length", ""),
    ("content-location", ""), ("content-range", ""), ("content-type", ""), ("cookie", ""),
    ("date", ""), ("etag", ""), ("expect", ""), ("expires", ""), ("from", ""), ("host", ""),
    ("if-match", ""), ("if-modified-since", ""), ("if-none-match", ""), ("if-range", ""),
    ("if-unmodified-since", ""), ("last-modified", ""), ("link", ""), ("location", ""),
    ("max-forwards", ""), ("proxy-authenticate", ""), ("proxy-authorization", ""),
    ("range", ""), ("referer", ""), ("refresh", ""), ("retry-after", ""), ("server", ""),
    ("set-cookie", ""), ("strict-transport-security", ""), ("transfer-encoding", ""),
    ("user-agent", ""), ("vary", ""), ("via", ""), ("www-authenticate", ""),
]

# RFC 7541 Appendix B is a canonical Huffman code: the code length of each byte (here, length
# minus 5 as a letter, 'A' = 5 bits) determines every code. EOS (30 bits) is never decoded.
_HUFFMAN_LENGTHS = (
    "ISXXXXXXXTZXXZXXXXXXXXZXXXXXXXXXBFFHIBDGFFDGDBBBAAABBBBBBBCDKBHFIBCCCCCCCCCCCCCCCCCCCCCCDC"
    "DIOIJBKABABABBBACCBBBABCBAABCCCCCKGJIXPRPPRRRSRSSSSSTSTTRSTSSSSQRSRSSTRQPRRSSQSRRTQRSSQQRQS"
    "RSSPRRRSRRSVVPORSRUVVVWWVTUOQVWWVWTQQVVXWWWPTPQRQQSRRUUTTVSVWVVWWWWWXWWWWWV")


def _huffman_codes():
    lengths = [ord(c) - ord("A") + 5 for c in _HUFFMAN_LENGTHS]
    assert len(lengths) == 256
    codes, code, previous = {}, 0, min(lengths)
    for sym in sorted(range(256), key=lambda s: (lengths[s], s)):
        code <<= lengths[sym] - previous
        previous = lengths[sym]
        codes[(lengths[sym], code)] = sym
        code += 1
    return codes


_HUFFMAN = _huffman_codes()


def huffman_decode(data):
    out, acc, bits = bytearray(), 0, 0
    for byte in data:
        for shift in range(7, -1, -1):
            acc = (acc << 1) | ((byte >> shift) & 1)
            bits += 1
            sym = _HUFFMAN.get((bits, acc))
            if sym is not None:
                out.append(sym)
                acc, bits = 0, 0
    if bits > 7 or acc != (1 << bits) - 1:
        raise ValueError("bad Huffman padding")
    return bytes(out)


def _decode_int(block, i, prefix_bits):
    top = (1 << prefix_bits) - 1
    value = block[i] & top
    i += 1
    if value < top:
        return value, i
    shift = 0
    while True:
        b = block[i]
        i += 1
        value += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def _decode_str(block, i):
    huffman = block[i] & 0x80
    length, i = _decode_int(block, i, 7)
    raw = bytes(block[i:i + length])
    return (huffman_decode(raw) if huffman else raw).decode("latin-1"), i + length


class HpackDecoder:
    """One connection's decoding state (the dynamic table)."""

    def __init__(self):
        self.dynamic = []  # newest first
        self.max_size = 4096

    def _entry(self, index):
        if index <= len(STATIC_TABLE):
            return STATIC_TABLE[index - 1]
        return self.dynamic[index - len(STATIC_TABLE) - 1]

    def _evict(self):
        while self.dynamic and sum(len(n) + len(v) + 32 for n, v in self.dynamic) > self.max_size:
            self.dynamic.pop()

    def decode(self, block):
        out, i = [], 0
        while i < len(block):
            b = block[i]
            if b & 0x80:  # indexed field
                index, i = _decode_int(block, i, 7)
                out.append(self._entry(index))
                continue
            if b & 0xE0 == 0x20:  # dynamic table size update
                self.max_size, i = _decode_int(block, i, 5)
                self._evict()
                continue
            indexing = bool(b & 0x40)
            index, i = _decode_int(block, i, 6 if indexing else 4)
            if index:
                name = self._entry(index)[0]
            else:
                name, i = _decode_str(block, i)
            value, i = _decode_str(block, i)
            out.append((name, value))
            if indexing:
                self.dynamic.insert(0, (name, value))
                self._evict()
        return out


# ---------------------------------------------------------------------------------------------
# A connection


class H2Connection:
    """A cleartext HTTP/2 connection (prior knowledge) to 127.0.0.1:`port`: the preface and an
    empty SETTINGS go out at once. Frames read are recorded per stream: `headers[id]` (decoded
    blocks), `ended` (END_STREAM seen), `resets[id]` (RST_STREAM code); `goaway` holds the
    GOAWAY error code, `closed` is true once the server closed the socket; `send_window` is the
    connection-level flow-control window the server granted (DATA sent is not subtracted: the
    caller keeps its own count)."""

    def __init__(self, port, settings=(), timeout=10.0):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.timeout = timeout
        self.sock.sendall(PREFACE + settings_frame(settings))
        self.decoder = HpackDecoder()
        self.server_settings = None
        self.headers, self.resets, self.ended = {}, {}, set()
        self.goaway = None
        self.closed = False
        self._buf = b""
        self._block = None  # (stream, bytes) of a header block awaiting CONTINUATION
        self._pongs = set()
        self.send_window = 65535

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data):
        self.sock.sendall(data)

    def _recv_exact(self, n, deadline):
        while len(self._buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no frame from the server before the deadline")
            self.sock.settimeout(min(left, self.timeout))
            try:
                chunk = self.sock.recv(1 << 16)
            except socket.timeout:
                continue
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                self.closed = True
                return None
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def read_frame(self, deadline):
        """Reads and records one frame; None once the server closed the connection."""
        head = self._recv_exact(9, deadline)
        if head is None:
            return None
        length = int.from_bytes(head[:3], "big")
        kind, flags = head[3], head[4]
        stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
        payload = self._recv_exact(length, deadline) if length else b""
        if payload is None:
            return None
        self._record(kind, flags, stream, payload)
        return kind, flags, stream, payload

    def _record(self, kind, flags, stream, payload):
        if kind == SETTINGS and not flags & ACK:
            self.server_settings = {k: v for k, v in
                                    (struct.unpack(">HI", payload[i:i + 6])
                                     for i in range(0, len(payload), 6))}
            self.send(settings_frame(ack=True))
        elif kind == PING:
            if flags & ACK:
                self._pongs.add(payload)
            else:
                self.send(frame(PING, ACK, 0, payload))
        elif kind == GOAWAY:
            self.goaway = int.from_bytes(payload[4:8], "big")
        elif kind == WINDOW_UPDATE and stream == 0:
            self.send_window += int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
        elif kind == RST_STREAM:
            self.resets[stream] = int.from_bytes(payload[:4], "big")
        elif kind in (HEADERS, CONTINUATION):
            if kind == HEADERS:
                body = payload
                if flags & PADDED:
                    body = body[1:len(body) - body[0]]
                if flags & PRIORITY_FLAG:
                    body = body[5:]
                self._block = (stream, body)
                if flags & END_STREAM:
                    self.ended.add(stream)
            else:
                self._block = (self._block[0], self._block[1] + payload)
            if flags & END_HEADERS:
                sid, block = self._block
                self.headers.setdefault(sid, []).append(self.decoder.decode(block))
                self._block = None
        elif kind == DATA and flags & END_STREAM:
            self.ended.add(stream)

    def wait_for(self, predicate, deadline_s, what):
        """Reads frames until `predicate()` holds; raises if the server closes first or the
        deadline passes."""
        deadline = time.monotonic() + deadline_s
        while not predicate():
            if self.read_frame(deadline) is None:
                if predicate():
                    return
                raise AssertionError(f"connection closed (GOAWAY {self.goaway}) before {what}")

    def read_until_closed(self, deadline_s):
        """Reads everything until the server closes the connection; False at the deadline."""
        deadline = time.monotonic() + deadline_s
        try:
            while self.read_frame(deadline) is not None:
                pass
        except TimeoutError:
            return False
        return True

    def settings(self, deadline_s=10):
        self.wait_for(lambda: self.server_settings is not None, deadline_s, "the server's SETTINGS")
        return self.server_settings

    def ping(self, deadline_s=10):
        """A PING round trip: every frame sent before it has been read by the server."""
        opaque = struct.pack(">d", time.monotonic())
        self.send(frame(PING, 0, 0, opaque))
        self.wait_for(lambda: opaque in self._pongs, deadline_s, "the PING ACK")

    def fields(self, stream):
        """Every header field the server sent on `stream` (headers and trailers), last wins."""
        out = {}
        for block in self.headers.get(stream, []):
            out.update(block)
        return out

    def grpc_status(self, stream):
        """(grpc-status as int, grpc-message) of a finished stream, else None."""
        fields = self.fields(stream)
        if "grpc-status" not in fields:
            return None
        return int(fields["grpc-status"]), urllib.parse.unquote(fields.get("grpc-message", ""))


# ---------------------------------------------------------------------------------------------
# gRPC over raw frames

MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
SERVER_LIVE = "/inference.GRPCInferenceService/ServerLive"


def grpc_headers(stream_id, port, path=MODEL_INFER, end_stream=False):
    block = encode_headers([
        (":method", "POST"), (":scheme", "http"), (":path", path),
        (":authority", f"127.0.0.1:{port}"), ("content-type", "application/grpc"),
        ("te", "trailers"),
    ])
    return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream_id, block)


def grpc_prefix(length):
    """The 5-byte gRPC message prefix: not compressed, `length` bytes follow."""
    return struct.pack(">BI", 0, length)


def data_frames(stream_id, payload, frame_size=16384):
    """DATA frames carrying `payload`, none longer than `frame_size` (no END_STREAM)."""
    return b"".join(data_frame(stream_id, payload[i:i + frame_size])
                    for i in range(0, len(payload), frame_size))


def http_get_headers(stream_id, port, path, end_stream=True):
    block = encode_headers([(":method", "GET"), (":scheme", "http"), (":path", path),
                            (":authority", f"127.0.0.1:{port}")])
    return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), stream_id, block)
