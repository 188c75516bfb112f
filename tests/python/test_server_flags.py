"""Triton's repository and server flags (issue 36): header forwarding, gRPC infer response
compression, gRPC keepalive and connection age, and `--exit-on-error` (on by default).

- Header forwarding: `py_params` answers with the parameters its request carried (as JSON in
  OUT), so what `--http-header-forward-pattern` / `--grpc-header-forward-pattern` forwarded is
  what the model saw. The same repository and flags run on Nereid and on the real Triton 2.51
  (`make triton-ref`); what each model saw must be equal, through tritonclient's HTTP and gRPC
  clients and a gRPC stream.
- Compression: with `--grpc-infer-response-compression-level high`, a ModelInfer answer to a
  client that accepts gzip is gzip-compressed (read off the wire with the raw HTTP/2 client: the
  message's compressed flag and `grpc-encoding`), other rpcs are not, and tritonclient reads it.
- Keepalive: the gRPC port pings every `--grpc-keepalive-time` ms and closes a connection that
  does not answer within `--grpc-keepalive-timeout`; `--grpc-max-connection-age` sends GOAWAY
  (`--grpc-max-connection-age-grace` and the ping-policing flags are accepted only).
- `--exit-on-error`: a repository with one broken model stops `serve` (as it stops Triton) unless
  `--exit-on-error=false`.
"""

import gzip
import json
import shutil
import struct
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.service_pb2 as pb
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import h2_raw
from nereid_util import NEREID_BIN, free_port, loopback_listen_args
from test_python_parameters import PARAMS, config
from triton_util import nereid_like_triton

HTTP_PATTERN = "my_header.*|dup|triton_"
# Case-sensitive: the lower-case `my_header_*` metadata gRPC sends does not match MY_HEADER.
GRPC_PATTERN = "(?-i)MY_HEADER.*|my_grpc_.*|dup|triton_"
FORWARD_FLAGS = ["--http-header-forward-pattern", HTTP_PATTERN,
                 "--grpc-header-forward-pattern", GRPC_PATTERN]
HEADERS = {"my_header_1": "one", "my_header_2": "two words, \"quoted\"", "my_grpc_a": "ga",
           "unrelated": "no"}


def write_repo(path, broken=False):
    """`py_params` (and with `broken`, `py_broken`, whose config names an unknown field)."""
    models = [("py_params", PARAMS, "")]
    if broken:
        models.append(("py_broken", PARAMS, "not_a_config_field: 1\n"))
    for name, code, extra in models:
        (path / name / "1").mkdir(parents=True)
        (path / name / "1" / "model.py").write_text(code)
        (path / name / "config.pbtxt").write_text(config(name) + extra)
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from triton_util import TRITON_BIN, start_pair
    if not Path(TRITON_BIN).exists():
        pytest.skip(f"{TRITON_BIN} missing: run `make triton-ref`")
    work = tmp_path_factory.mktemp("forward_diff")
    servers = start_pair(write_repo(work / "repo"), work, FORWARD_FLAGS)
    yield servers
    for s in servers:
        s.stop()


def inputs(module):
    tensor = module.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    return [tensor]


def seen(result):
    return json.loads(result.as_numpy("OUT")[0])


def http_seen(server, headers, parameters=None):
    # Copies of `headers`: tritonclient's HTTP client adds its own to the dict it is given.
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    try:
        return seen(client.infer("py_params", inputs(httpclient), headers=dict(headers),
                                 parameters=parameters))
    finally:
        client.close()


def grpc_seen(server, headers, parameters=None):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        return seen(client.infer("py_params", inputs(grpcclient), headers=dict(headers),
                                 parameters=parameters))
    finally:
        client.close()


def stream_seen(server, headers):
    answers = []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(callback=lambda result, error: answers.append((result, error)),
                            headers=dict(headers))
        client.async_stream_infer("py_params", inputs(grpcclient), parameters={"n": 3})
        client.stop_stream()
    finally:
        client.close()
    assert len(answers) == 1, answers
    result, error = answers[0]
    assert error is None, error
    return seen(result)


def test_http_headers_reach_the_model_as_in_triton(pair):
    nereid, triton = pair
    ours, theirs = (http_seen(s, HEADERS, {"client": "yes"}) for s in pair)
    assert ours == theirs, (ours, theirs)
    assert ours == {"client": "yes", "my_header_1": "one",
                    "my_header_2": "two words, \"quoted\""}, ours


def test_grpc_metadata_reaches_the_model_as_in_triton(pair):
    ours, theirs = (grpc_seen(s, HEADERS, {"client": "yes"}) for s in pair)
    assert ours == theirs, (ours, theirs)
    # The gRPC pattern is case-sensitive: my_header_* are not MY_HEADER*.
    assert ours == {"client": "yes", "my_grpc_a": "ga"}, ours


def test_stream_metadata_reaches_every_request_as_in_triton(pair):
    ours, theirs = (stream_seen(s, HEADERS) for s in pair)
    assert ours == theirs, (ours, theirs)
    assert ours == {"n": 3, "my_grpc_a": "ga"}, ours


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_header_replaces_the_request_parameter_of_its_name_as_in_triton(pair, protocol):
    call = http_seen if protocol == "http" else grpc_seen
    ours, theirs = (call(s, {"dup": "from-header"}, {"dup": "from-body"}) for s in pair)
    assert ours == theirs, (ours, theirs)
    assert ours == {"dup": "from-header"}, ours


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_reserved_header_names_are_refused(pair, protocol):
    """Current Triton refuses a matching header named like a reserved parameter or starting
    with triton_ ("Header '...' is reserved for Triton usage and cannot be forwarded.");
    Triton 2.51 predates that check (docs/compatibility.md says so)."""
    nereid, _ = pair
    call = http_seen if protocol == "http" else grpc_seen
    with pytest.raises(InferenceServerException) as refused:
        call(nereid, {"triton_x": "1", "my_header_1": "one"})
    message = str(refused.value)
    assert "Header 'triton_x' is reserved for Triton usage and cannot be forwarded." in message
    expected = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    assert expected in message or refused.value.status() == expected, message


# ---------------------------------------------------------------------------------------------
# --grpc-infer-response-compression-level


@pytest.fixture(scope="module")
def compressing(tmp_path_factory):
    work = tmp_path_factory.mktemp("compress")
    server = nereid_like_triton(write_repo(work / "repo"), work,
                                ["--grpc-infer-response-compression-level", "high"],
                                name="compressing").start()
    yield server
    assert server.stop() == 0


def raw_call(port, path, message, accept="gzip"):
    """One unary gRPC call over a raw HTTP/2 connection, announcing `accept` as the encodings
    the client takes; returns (response header fields, [(compressed flag, message bytes)])."""
    body = message.SerializeToString()
    with h2_raw.H2Connection(port) as h2:
        block = h2_raw.encode_headers([
            (":method", "POST"), (":scheme", "http"), (":path", path),
            (":authority", f"127.0.0.1:{port}"), ("content-type", "application/grpc"),
            ("te", "trailers"), ("grpc-accept-encoding", accept),
        ])
        h2.send(h2_raw.frame(h2_raw.HEADERS, h2_raw.END_HEADERS, 1, block))
        h2.send(h2_raw.data_frame(1, h2_raw.grpc_prefix(len(body)) + body, end_stream=True))
        data = b""
        deadline = time.monotonic() + 30
        while 1 not in h2.ended:
            got = h2.read_frame(deadline)
            assert got is not None, "connection closed before the answer"
            kind, _, stream, payload = got
            if kind == h2_raw.DATA and stream == 1:
                data += payload
        fields = h2.fields(1)
    messages = []
    while data:
        flag, length = struct.unpack(">BI", data[:5])
        messages.append((flag, data[5:5 + length]))
        data = data[5 + length:]
    return fields, messages


def infer_message():
    return pb.ModelInferRequest(
        model_name="py_params",
        inputs=[pb.ModelInferRequest.InferInputTensor(name="IN", datatype="INT32", shape=[1])],
        raw_input_contents=[np.array([1], dtype=np.int32).tobytes()])


def test_infer_responses_are_gzip_compressed_for_clients_that_accept_it(compressing):
    port = compressing.grpc_port
    fields, messages = raw_call(port, h2_raw.MODEL_INFER, infer_message())
    assert fields.get("grpc-status") == "0", fields
    assert fields.get("grpc-encoding") == "gzip", fields
    [(flag, payload)] = messages
    assert flag == 1, "the message is not marked compressed"
    response = pb.ModelInferResponse.FromString(gzip.decompress(payload))
    assert response.model_name == "py_params"
    assert json.loads(response.raw_output_contents[0][4:]) == {}

    # A client that takes only identity gets it uncompressed.
    fields, [(flag, payload)] = raw_call(port, h2_raw.MODEL_INFER, infer_message(), "identity")
    assert flag == 0 and "grpc-encoding" not in fields, fields
    assert pb.ModelInferResponse.FromString(payload).model_name == "py_params"

    # Other rpcs are never compressed, as in Triton.
    fields, [(flag, payload)] = raw_call(
        port, "/inference.GRPCInferenceService/ServerMetadata", pb.ServerMetadataRequest())
    assert flag == 0 and "grpc-encoding" not in fields, fields
    assert pb.ServerMetadataResponse.FromString(payload).name == "triton"


def test_tritonclient_reads_compressed_answers(compressing):
    client = grpcclient.InferenceServerClient(compressing.grpc_url)
    try:
        for algorithm in (None, "gzip", "deflate"):
            result = client.infer("py_params", inputs(grpcclient), parameters={"k": "v"},
                                  compression_algorithm=algorithm)
            assert seen(result) == {"k": "v"}, algorithm
        assert client.get_server_metadata().name == "triton"
    finally:
        client.close()


def test_infer_responses_are_not_compressed_by_default(pair):
    nereid, _ = pair
    fields, [(flag, _)] = raw_call(nereid.grpc_port, h2_raw.MODEL_INFER, infer_message())
    assert flag == 0 and "grpc-encoding" not in fields, fields


def test_bad_compression_level_stops_the_server(tmp_path):
    out = subprocess.run([NEREID_BIN, "serve", "--model-repository", str(tmp_path),
                          *loopback_listen_args(0, 0, 0),
                          "--grpc-infer-response-compression-level", "max"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "expected none, low, medium or high, got 'max'" in out.stderr, out.stderr


# ---------------------------------------------------------------------------------------------
# gRPC keepalive and connection age


class SilentH2(h2_raw.H2Connection):
    """Counts the server's PINGs; answers them only when `answer` is set."""

    def __init__(self, port, answer):
        self.pings, self.answer = 0, answer
        super().__init__(port)

    def _record(self, kind, flags, stream, payload):
        if kind == h2_raw.PING and not flags & h2_raw.ACK:
            self.pings += 1
            if not self.answer:
                return
        super()._record(kind, flags, stream, payload)


@pytest.fixture(scope="module")
def keepalive_server(tmp_path_factory):
    work = tmp_path_factory.mktemp("keepalive")
    flags = ["--grpc-keepalive-time", "300", "--grpc-keepalive-timeout", "1000",
             # Accepted for compatibility only.
             "--grpc-keepalive-permit-without-calls", "1",
             "--grpc-http2-max-pings-without-data", "0",
             "--grpc-http2-min-recv-ping-interval-without-data", "100",
             "--grpc-http2-max-ping-strikes", "0"]
    server = nereid_like_triton(write_repo(work / "repo"), work, flags, name="keepalive").start()
    yield server
    assert server.stop() == 0


def test_the_grpc_port_pings_and_drops_silent_clients(keepalive_server):
    port = keepalive_server.grpc_port
    with SilentH2(port, answer=True) as h2:
        h2.settings()
        h2.wait_for(lambda: h2.pings >= 3, 10, "three keepalive pings")
        assert not h2.closed
    with SilentH2(port, answer=False) as h2:
        h2.settings()
        started = time.monotonic()
        assert h2.read_until_closed(15), "a client that never answers pings is kept"
        assert h2.pings >= 1
        # One interval, then the timeout.
        assert time.monotonic() - started < 10


def test_max_connection_age_sends_goaway(tmp_path):
    server = nereid_like_triton(write_repo(tmp_path / "repo"), tmp_path,
                                ["--grpc-max-connection-age", "500",
                                 "--grpc-max-connection-age-grace", "500"],
                                name="aged").start()
    try:
        with h2_raw.H2Connection(server.grpc_port) as h2:
            # A stream left open keeps the connection after GOAWAY (the grace is not enforced:
            # tonic has no such setting), so the GOAWAY can be read before the close.
            h2.send(h2_raw.grpc_headers(
                1, server.grpc_port, path="/inference.GRPCInferenceService/ModelStreamInfer"))
            h2.settings()
            h2.wait_for(lambda: h2.goaway is not None, 10, "GOAWAY at the connection's age")
            assert h2.goaway == 0, h2.goaway
            # Ending the stream lets the connection close.
            h2.send(h2_raw.data_frame(1, b"", end_stream=True))
            assert h2.read_until_closed(10), "the connection stays open after its calls"
        # New connections are served.
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert client.is_server_live()
        client.close()
    finally:
        assert server.stop() == 0


# ---------------------------------------------------------------------------------------------
# --exit-on-error


def start_and_wait(args, deadline_s=90):
    """Runs a server until it exits or serves; (exit code or None if still running, output)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        proc.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None, proc.stdout.read().decode(errors="replace")
    return proc.returncode, proc.stdout.read().decode(errors="replace")


def test_a_broken_model_stops_serve_by_default(tmp_path):
    repo = write_repo(tmp_path / "repo", broken=True)
    code, output = start_and_wait([NEREID_BIN, "serve", "--model-repository", str(repo),
                                   *loopback_listen_args(free_port(), free_port(), free_port())])
    assert code == 1, output[-3000:]
    assert "--exit-on-error" in output and "py_broken" in output, output[-3000:]


def test_exit_on_error_false_serves_the_models_that_loaded(tmp_path):
    server = nereid_like_triton(write_repo(tmp_path / "repo", broken=True), tmp_path,
                                ["--exit-on-error=false", "--strict-readiness=false"],
                                name="lenient").start()
    try:
        assert grpc_seen(server, {}, {"ok": True}) == {"ok": True}
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert not client.is_model_ready("py_broken")
        client.close()
    finally:
        assert server.stop() == 0


def test_triton_also_stops_on_a_broken_model(tmp_path):
    from triton_util import TRITON_BIN, TritonServer
    if not Path(TRITON_BIN).exists():
        pytest.skip(f"{TRITON_BIN} missing: run `make triton-ref`")
    repo = write_repo(tmp_path / "repo", broken=True)
    triton = TritonServer(repo, tmp_path)
    code, output = start_and_wait(triton.args, deadline_s=120)
    assert code not in (None, 0), output[-3000:]
    shutil.rmtree(repo)
