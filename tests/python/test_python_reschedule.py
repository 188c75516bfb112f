"""Request rescheduling end to end: Python models that call
`request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)` run the same request again
(`sequence_batching { iterative_sequence: true }`), through tritonclient gRPC streaming, HTTP
generate_stream and unary infer. Covers one response per run on the request's response sender,
the request's id and flags across runs (START once, then neither START nor END), a default-mode
model answering from its last run, Triton's errors (a response returned for a rescheduled
request; rescheduling on a model without `iterative_sequence`), a client that cancels its stream
stopping the loop and freeing the model's one sequence slot, a stub crash in the middle of a
loop, a BLS caller iterating the runs' responses, and that the loop reuses the instance's
shared-memory segments instead of piling them up.

The models are written by this file into its own repository (`write_repository`, shared with
test_triton_diff_reschedule.py). Runs its own server.
"""

import json
import os
import queue
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from nereid_util import http_json, http_raw, managed_server, wait_until

# Reschedules each request until it has run IN times (IN <= 0: until the client cancels),
# sending OUT = [runs left, request.flags(), correlation id] on each run, the last one final.
# IN == -1 makes the stub exit on the request's second run.
ITERATE = '''
import os
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.runs = {}

    def execute(self, requests):
        for request in requests:
            wanted = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            cid = request.correlation_id()
            runs = self.runs.get(cid, 0) + 1
            if wanted == -1 and runs == 2:
                os._exit(3)
            sender = request.get_response_sender()
            left = wanted - runs if wanted > 0 else 1
            out = pb_utils.Tensor("OUT", np.array([left, request.flags(), cid], np.int64))
            response = pb_utils.InferenceResponse([out])
            if left > 0 and not request.is_cancelled():
                self.runs[cid] = runs
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                sender.send(response)
            else:
                self.runs.pop(cid, None)
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

# Default mode: returns None for a rescheduled request, then answers from its last run with
# OUT = [runs, request.flags(), correlation id]. BAD: returns a response for it instead.
ITERATE_DEFAULT = '''
import numpy as np
import triton_python_backend_utils as pb_utils

BAD = {bad}


class TritonPythonModel:
    def initialize(self, args):
        self.runs = {{}}

    def execute(self, requests):
        responses = []
        for request in requests:
            wanted = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            cid = request.correlation_id()
            runs = self.runs.get(cid, 0) + 1
            out = pb_utils.Tensor("OUT", np.array([runs, request.flags(), cid], np.int64))
            response = pb_utils.InferenceResponse([out])
            if runs < wanted:
                self.runs[cid] = runs
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(response if BAD else None)
            else:
                self.runs.pop(cid, None)
                responses.append(response)
        return responses
'''

# Calls `iterate` through BLS (decoupled) with its own IN, returning OUT = [the `left` value of
# each response, then -1 for an empty final one].
BLS_ITERATE = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="iterate", requested_output_names=["OUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")])
            seen = []
            for r in call.exec(decoupled=True):
                if r.has_error():
                    raise pb_utils.TritonModelException(r.error().message())
                out = pb_utils.get_output_tensor_by_name(r, "OUT")
                seen.append(-1 if out is None else int(out.as_numpy()[0]))
            seen = (seen + [-2, -2, -2])[:3]
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUT", np.array(seen, np.int64))]))
        return responses
'''

CONFIG = '''name: "{name}"
backend: "python"
max_batch_size: 0
input [{{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }}]
output [{{ name: "OUT" data_type: TYPE_INT64 dims: [ 3 ] }}]
{extra}
instance_group [{{ kind: KIND_CPU count: 1 }}]
'''

DECOUPLED = "model_transaction_policy { decoupled: true }"
ITERATIVE = "sequence_batching { iterative_sequence: true }"

MODELS = {
    # name: (model.py, config lines)
    "iterate": (ITERATE, f"{DECOUPLED}\n{ITERATIVE}"),
    "iterate_default": (ITERATE_DEFAULT.format(bad=False), ITERATIVE),
    "iterate_bad": (ITERATE_DEFAULT.format(bad=True), ITERATIVE),
    "iterate_plain": (ITERATE, DECOUPLED),
    "iterate_plain_default": (ITERATE_DEFAULT.format(bad=False), ""),
    "iterate_sequence": (ITERATE, f"{DECOUPLED}\nsequence_batching {{ direct {{ }} }}"),
    "bls_iterate": (BLS_ITERATE, ""),
}

RESCHEDULE_UNSUPPORTED = ("Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, "
                          "while the model is not configured to handle such a flag.")


def write_repository(root, names=None):
    """Writes the models `names` (all by default) under `root`; returns `root`."""
    root = Path(root)
    for name in names or MODELS:
        source, extra = MODELS[name]
        version = root / name / "1"
        version.mkdir(parents=True, exist_ok=True)
        (version / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = write_repository(tmp_path_factory.mktemp("repo_reschedule"))
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), [], "server_reschedule")


def in_tensor(value):
    i = grpcclient.InferInput("IN", [1], "INT32")
    i.set_data_from_numpy(np.array([value], dtype=np.int32))
    return i


class Stream:
    """One gRPC stream: requests go out, (OUT as a list, final) or an error come back."""

    def __init__(self, server):
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.got = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.got.put((result, error)))

    def send(self, model, value, **seq):
        self.client.async_stream_infer(model, [in_tensor(value)], **seq)

    def next(self, timeout=30):
        result, error = self.got.get(timeout=timeout)
        if error is not None:
            return error
        final = result.get_response().parameters["triton_final_response"].bool_param
        return result.as_numpy("OUT").tolist(), final

    def until_final(self, timeout=30):
        out = []
        while not out or (not isinstance(out[-1], InferenceServerException) and not out[-1][1]):
            out.append(self.next(timeout))
        return out

    def close(self, cancel=False):
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def stream_once(server, model, value, **seq):
    s = Stream(server)
    try:
        s.send(model, value, **seq)
        return s.until_final()
    finally:
        s.close()


def test_a_decoupled_model_sends_one_response_per_run_of_the_same_request(server):
    got = stream_once(server, "iterate", 4)
    assert [(out[0], out[1], final) for out, final in got] == [
        (3, 1, False), (2, 0, False), (1, 0, False), (0, 0, True)], got
    ids = {out[2] for out, _ in got}
    assert len(ids) == 1 and ids != {0}, f"one id, given by the server: {got}"
    # The next request is a sequence of its own.
    again = stream_once(server, "iterate", 1)
    assert again[0][0][:2] == [0, 1] and again[0][0][2] not in ids, again


def test_requests_on_one_stream_each_loop_in_their_own_sequence(server):
    s = Stream(server)
    try:
        for _ in range(3):
            s.send("iterate", 2)
        got = [s.next() for _ in range(6)]
    finally:
        s.close()
    by_id = {}
    for out, final in got:
        by_id.setdefault(out[2], []).append((out[0], out[1], final))
    assert sorted(by_id.values()) == [[(1, 1, False), (0, 0, True)]] * 3, got


def test_a_request_with_its_own_correlation_id_keeps_it(server):
    got = stream_once(server, "iterate", 3, sequence_id=4242, sequence_start=True)
    assert [out for out, _ in got] == [[2, 1, 4242], [1, 0, 4242], [0, 0, 4242]]
    e = stream_once(server, "iterate", 1, sequence_id=4243)[0]
    assert isinstance(e, InferenceServerException)
    assert "must specify the START flag on the first request of the sequence" in e.message()


def test_generate_stream_sends_an_event_per_run(server):
    status, headers, body = http_raw(server.http_url, "POST", "/v2/models/iterate/generate_stream",
                                     json.dumps({"IN": 3}).encode())
    assert status == 200, body
    events = [json.loads(chunk[len("data: "):]) for chunk in body.decode().split("\n\n") if chunk]
    assert [e["OUT"][:2] for e in events] == [[2, 1], [1, 0], [0, 0]], events


def test_a_bls_caller_iterates_the_responses_of_every_run(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        out = c.infer("bls_iterate", [in_tensor(3)]).as_numpy("OUT").tolist()
    assert out == [2, 1, 0], "one response per run, the last one final"


def test_a_default_mode_model_answers_from_the_last_run(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        out = c.infer("iterate_default", [in_tensor(3)]).as_numpy("OUT").tolist()
        assert out[:2] == [3, 0], "three runs; the last is neither START nor END"
        with pytest.raises(InferenceServerException) as e:
            c.infer("iterate_bad", [in_tensor(2)])
    assert e.value.status() == "StatusCode.INTERNAL"
    assert ("Failed to process the request(s) for model 'iterate_bad_0_0', message: "
            "Expected a None object in the execute function return list for reschduled request, "
            "found type '<class ") in e.value.message(), e.value.message()


@pytest.mark.parametrize("model,seq", [("iterate_plain", {}),
                                       ("iterate_sequence", {"sequence_id": 9, "sequence_start": True})])
def test_rescheduling_without_iterative_sequence_answers_tritons_error(server, model, seq):
    got = stream_once(server, model, 3, **seq)
    assert got[0] == ([2, 1 if seq else 0, 9 if seq else 0], False), got
    assert isinstance(got[1], InferenceServerException), got
    assert got[1].message().endswith(RESCHEDULE_UNSUPPORTED), got[1].message()


def test_rescheduling_a_unary_request_without_iterative_sequence_answers_tritons_error(server):
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        with pytest.raises(InferenceServerException) as e:
            c.infer("iterate_plain_default", [in_tensor(2)])
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert e.value.message().endswith(RESCHEDULE_UNSUPPORTED), e.value.message()


def segment_files(server):
    """The files in this server's Python stubs' shared-memory directories."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(os.environ.get("TMPDIR", "/tmp"))
    return [f for d in base.glob(f"nereid-py-{server.proc.pid}-iterate_0_0-*") for f in d.iterdir()]


def test_a_cancelled_stream_stops_the_loop_and_frees_the_slot(server):
    s = Stream(server)
    s.send("iterate", 0)  # runs until cancelled
    got = [s.next() for _ in range(40)]
    assert all(out[0] == 1 and not final for out, final in got), got[:3]
    # Forty runs reuse a few segments: each run's inputs are released.
    assert len(segment_files(server)) <= 4, segment_files(server)
    s.close(cancel=True)
    # The model has one sequence slot: it runs another request only once the loop has ended.
    assert stream_once(server, "iterate", 2)[-1][1] is True


def test_a_stub_crash_in_the_loop_fails_the_request_and_frees_the_slot(server):
    got = stream_once(server, "iterate", -1)
    assert got[0][1] is False, got
    assert isinstance(got[-1], InferenceServerException), got
    assert "is not healthy" in got[-1].message(), got[-1].message()
    wait_until(lambda: http_raw(server.http_url, "GET", "/v2/models/iterate/ready")[0] == 200,
               60, "iterate ready again")
    assert [out[0] for out, _ in stream_once(server, "iterate", 2)] == [1, 0]
    stats = http_json(server.http_url, "GET", "/v2/models/iterate/stats")
    assert stats[0] == 200, stats
