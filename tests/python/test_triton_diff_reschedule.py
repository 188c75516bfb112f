"""Differential tests of request rescheduling against the real Triton server (2.51.0): Python
models on `sequence_batching { iterative_sequence: true }` that call
`request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)` give the same responses on
both servers: one per run of a decoupled request over a gRPC stream and over generate_stream,
with the same flags and correlation ids; what a BLS caller's iterator gives; a default-mode
model's answer from its last run; the errors for a missing START and for a response returned
for a rescheduled request.

The models are test_python_reschedule.py's (the ones Triton answers: there, rescheduling on a
model without `iterative_sequence` leaves the request unanswered, where Nereid answers Triton's
error).
"""

import json
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from nereid_util import http_raw
from test_python_reschedule import Stream, in_tensor, stream_once, write_repository
from triton_util import TRITON_BIN, start_pair

MODELS = ["iterate", "iterate_default", "iterate_bad", "bls_iterate"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    assert Path(TRITON_BIN).exists(), f"{TRITON_BIN} missing: run `make triton-ref`"
    work = tmp_path_factory.mktemp("triton_diff_reschedule")
    repo = write_repository(work / "repo", MODELS)
    nereid, triton = start_pair(repo, work,
                                ["--model-control-mode", "explicit", "--load-model", "*"])
    yield nereid, triton
    for s in (nereid, triton):
        s.stop()


def normalized(items):
    """Stream items with each server-given correlation id replaced by its order of appearance
    (ids count per server), errors by their message."""
    ids = {}
    out = []
    for item in items:
        if isinstance(item, InferenceServerException):
            out.append(("error", item.message()))
            continue
        (left, flags, cid), final = item
        out.append((left, flags, ids.setdefault(cid, len(ids)) if cid < 1000 else cid, final))
    return out


def both(pair, run):
    """`run(server)` on each server: (Nereid's answer, Triton's)."""
    return tuple(run(server) for server in pair)


def test_a_stream_gets_one_response_per_run_like_triton(pair):
    nereid, triton = both(pair, lambda s: normalized(stream_once(s, "iterate", 4)))
    assert nereid == triton
    assert [item[:2] for item in triton] == [(3, 1), (2, 0), (1, 0), (0, 0)]


def test_requests_on_one_stream_like_triton(pair):
    def run(server):
        s = Stream(server)
        try:
            for value in (2, 3):
                s.send("iterate", value)
            got = [s.next() for _ in range(5)]
        finally:
            s.close()
        # Per sequence, its responses in order (which request starts first is the server's).
        by_id = {}
        for (left, flags, cid), final in got:
            by_id.setdefault(cid, []).append((left, flags, final))
        return sorted(by_id.values())

    nereid, triton = both(pair, run)
    assert nereid == triton
    assert triton == [[(1, 1, False), (0, 0, True)], [(2, 1, False), (1, 0, False), (0, 0, True)]]


def test_an_own_correlation_id_and_a_missing_start_like_triton(pair):
    def run(server):
        got = normalized(stream_once(server, "iterate", 3, sequence_id=4242, sequence_start=True))
        return got + normalized(stream_once(server, "iterate", 1, sequence_id=4243))

    nereid, triton = both(pair, run)
    assert nereid == triton
    assert triton[-1][0] == "error", triton


def test_generate_stream_like_triton(pair):
    def run(server):
        status, _, body = http_raw(server.http_url, "POST", "/v2/models/iterate/generate_stream",
                                   json.dumps({"IN": 3}).encode())
        assert status == 200, (server.name, body)
        events = [json.loads(c[len("data: "):]) for c in body.decode().split("\n\n") if c]
        return [(e["model_name"], e["OUT"][:2]) for e in events]

    nereid, triton = both(pair, run)
    assert nereid == triton == [("iterate", [2, 1]), ("iterate", [1, 0]), ("iterate", [0, 0])]


def test_a_default_mode_model_and_its_error_like_triton(pair):
    def run(server):
        with grpcclient.InferenceServerClient(server.grpc_url) as c:
            answer = c.infer("iterate_default", [in_tensor(3)]).as_numpy("OUT").tolist()[:2]
            try:
                c.infer("iterate_bad", [in_tensor(2)])
                return answer, None
            except InferenceServerException as e:
                # The type's module differs (Triton's pybind module, Nereid's pb_utils).
                return answer, (e.status(), e.message().split("found type")[0])

    nereid, triton = both(pair, run)
    assert triton[1] is not None and "reschduled request" in triton[1][1], triton
    assert nereid[0] == triton[0] == [3, 0]
    assert nereid[1][0] == triton[1][0]
    # Triton's text, after Nereid's "[request id: ...] model '...' failed to execute: " prefix.
    assert nereid[1][1].endswith(triton[1][1]), (nereid, triton)
    assert triton[1][1].startswith("Failed to process the request(s) for model 'iterate_bad_0_0'")


def test_a_bls_caller_like_triton(pair):
    def run(server):
        with grpcclient.InferenceServerClient(server.grpc_url) as c:
            return c.infer("bls_iterate", [in_tensor(3)]).as_numpy("OUT").tolist()

    nereid, triton = both(pair, run)
    assert nereid == triton == [2, 1, 0]
