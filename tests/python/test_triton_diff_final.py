"""Differential tests of a decoupled model's final flag, against the real Triton server (2.51.0):
every response goes out as the model sent it, final only when the model sent it with the final
flag; a flag sent alone is an empty final response on a gRPC stream only for a client that set
`triton_enable_empty_final_response`, nothing on /generate and /generate_stream, and one more
(empty) response for a BLS caller iterating the decoupled call.

The models (scripts/gen_python_models.py): repeat_decoupled sends the final flag alone after its
responses, repeat_final_with_last sends it with its last response (alone for an empty input),
bls_decoupled_seen lists what a BLS caller's iterator gives for each. (test_triton_diff.py holds
the other differential tests; this file keeps it under the line limit.)
"""

import importlib.util
import json
import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from nereid_util import ROOT, http_raw
from triton_util import TRITON_BIN, start_pair

_spec = importlib.util.spec_from_file_location("gen_python_models",
                                               ROOT / "scripts/gen_python_models.py")
gen_python_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_python_models)

MODELS = ["repeat_decoupled", "repeat_final_with_last", "bls_decoupled_seen"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    assert Path(TRITON_BIN).exists(), f"{TRITON_BIN} missing: run `make triton-ref`"
    work = tmp_path_factory.mktemp("triton_diff_final")
    repo = gen_python_models.write_repository(work / "repo", MODELS)
    nereid, triton = start_pair(repo, work,
                                ["--model-control-mode", "explicit", "--load-model", "*"])
    yield nereid, triton
    for s in (nereid, triton):
        s.stop()


def wire(server, model, values, empty_final):
    """One request on a gRPC stream: (number of outputs, triton_final_response) per response,
    in arrival order, up to the final flag. A client that did not ask for empty final responses
    may see none marked final: the stream is then read until the responses stop (Triton's
    server-side end is not on the wire), bounded by a short wait after the last one."""
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    out = []
    try:
        i = grpcclient.InferInput("IN", [len(values)], "INT32")
        i.set_data_from_numpy(np.array(values, dtype=np.int32))
        client.async_stream_infer(model, [i], enable_empty_final_response=empty_final)
        expected = len(values) + (1 if empty_final else 0)
        while True:
            # Every response this request will send is due; after them, a short wait shows
            # that nothing more comes.
            timeout = 30 if len(out) < expected else 1
            try:
                result, error = got.get(timeout=timeout)
            except queue.Empty:
                return out
            assert error is None, (server.name, error)
            response = result.get_response()
            out.append((len(response.outputs),
                        response.parameters["triton_final_response"].bool_param))
            if out[-1][1]:
                return out
    finally:
        client.stop_stream()
        client.close()


EXPECTED = {
    # (model, values, empty_final) -> Triton 2.51's answer.
    ("repeat_decoupled", (4, 5, 6), False): [(1, False), (1, False), (1, False)],
    ("repeat_decoupled", (4, 5, 6), True): [(1, False), (1, False), (1, False), (0, True)],
    ("repeat_decoupled", (), False): [],
    ("repeat_decoupled", (), True): [(0, True)],
    ("repeat_final_with_last", (4, 5, 6), False): [(1, False), (1, False), (1, True)],
    ("repeat_final_with_last", (4, 5, 6), True): [(1, False), (1, False), (1, True)],
    ("repeat_final_with_last", (), False): [],
    ("repeat_final_with_last", (), True): [(0, True)],
}


@pytest.mark.parametrize("key", list(EXPECTED), ids=lambda k: f"{k[0]}-{len(k[1])}-{k[2]}")
def test_final_flag_on_the_wire_like_triton(pair, key):
    model, values, empty_final = key
    answers = [wire(s, model, list(values), empty_final) for s in pair]
    assert answers[1] == EXPECTED[key], "Triton's own answer changed"
    assert answers[0] == answers[1], f"nereid {answers[0]} != triton {answers[1]}"


def test_generate_ignores_a_flag_only_final_like_triton(pair):
    """/generate counts responses, not the final flag: one response then the flag alone is
    exactly one response. /generate_stream sends one event per response and nothing for the
    flag alone (an empty input: an empty body)."""
    for model in ("repeat_decoupled", "repeat_final_with_last"):
        answers = []
        for server in pair:
            one = http_raw(server.http_url, "POST", f"/v2/models/{model}/generate",
                           json.dumps({"IN": [7]}).encode())
            streams = [http_raw(server.http_url, "POST", f"/v2/models/{model}/generate_stream",
                                json.dumps({"IN": values}).encode())
                       for values in ([4, 5, 6], [7], [])]
            answers.append(((one[0], json.loads(one[2])),
                            [(status, body) for status, _, body in streams]))
        assert answers[0] == answers[1], f"{model}: nereid {answers[0]} != triton {answers[1]}"
        assert answers[1][0] == (200, {"OUT": 7, "model_name": model, "model_version": "1"})
        assert answers[1][1][2] == (200, b""), "a flag-only final sends no event"


def test_bls_iterator_sees_a_flag_only_final_like_triton(pair):
    """A BLS caller iterating a decoupled call gets one more, empty, response for a final flag
    sent alone (-1 in the lists), none when the flag came with the last response."""
    answers = []
    for server in pair:
        seen = []
        for values in ([4, 5, 6], []):
            body = {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [len(values)],
                                "data": values}]}
            status, _, raw = http_raw(server.http_url, "POST",
                                      "/v2/models/bls_decoupled_seen/infer",
                                      json.dumps(body).encode())
            assert status == 200, (server.name, raw)
            outputs = {o["name"]: o["data"] for o in json.loads(raw)["outputs"]}
            seen.append((outputs["SEPARATE"], outputs["WITH_LAST"]))
        answers.append(seen)
    assert answers[1] == [([4, 5, 6, -1], [4, 5, 6]), ([-1], [-1])], answers[1]
    assert answers[0] == answers[1], f"nereid {answers[0]} != triton {answers[1]}"
