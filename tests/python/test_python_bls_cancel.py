"""Cancelling a decoupled BLS call: `ResponseIterator.cancel()` stops the responses.

`py_ticker` (decoupled) sends a response every 2 ms until its request is cancelled (at most
10 s), then writes how many it sent to a file beside it and closes the request. `py_canceller`
calls it with `exec(decoupled=True)`, takes two responses, cancels, drains the iterator and
answers how many responses it saw in all. Without cancellation the ticker would run 10 s and the
caller would see thousands of responses.
"""

import json
import textwrap

import numpy as np
import pytest
import tritonclient.http as httpclient

from nereid_util import managed_server, wait_until

TICKER = textwrap.dedent("""
    import os
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.report = os.path.join(args["model_repository"], "ticker_report")

        def execute(self, requests):
            for r in requests:
                sender = r.get_response_sender()
                sent, end = 0, time.monotonic() + 10
                while not r.is_cancelled() and time.monotonic() < end:
                    sender.send(pb_utils.InferenceResponse(
                        [pb_utils.Tensor("TICK", np.array([sent], dtype=np.int32))]))
                    sent += 1
                    time.sleep(0.002)
                with open(self.report, "w") as f:
                    f.write("cancelled after %d" % sent if r.is_cancelled() else "never cancelled")
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
    """)

CANCELLER = textwrap.dedent("""
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                call = pb_utils.InferenceRequest(
                    model_name="py_ticker", requested_output_names=["TICK"],
                    inputs=[pb_utils.Tensor("GO", np.array([1], dtype=np.int32))])
                responses = call.exec(decoupled=True)
                seen = [next(responses), next(responses)]
                responses.cancel()
                responses.cancel()  # a second cancel does nothing
                seen += list(responses)
                ticks = [int(x.as_numpy()[0]) for s in seen
                         for x in s.output_tensors() if x.name() == "TICK"]
                errors = [s.error().message() for s in seen if s.has_error()]
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                    "SEEN", np.array([json.dumps({"ticks": ticks, "errors": errors}).encode()],
                                     dtype=np.object_))]))
            return out
    """)

TICKER_CONFIG = """
name: "py_ticker"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "GO" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "TICK" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

CANCELLER_CONFIG = """
name: "py_canceller"
backend: "python"
max_batch_size: 0
input [ { name: "GO" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "SEEN" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("bls_cancel_repo")
    for name, code, config in (("py_ticker", TICKER, TICKER_CONFIG),
                               ("py_canceller", CANCELLER, CANCELLER_CONFIG)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(code)
        (repo / name / "config.pbtxt").write_text(config)
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), [], "server_bls_cancel")


def test_cancel_stops_a_decoupled_bls_call(server):
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    go = httpclient.InferInput("GO", [1], "INT32")
    go.set_data_from_numpy(np.array([1], dtype=np.int32))
    seen = json.loads(client.infer("py_canceller", [go]).as_numpy("SEEN")[0])
    assert seen["errors"] == [], seen
    ticks = seen["ticks"]
    # The first two, then at most what was already on its way when the call was cancelled.
    assert ticks[:2] == [0, 1], seen
    assert ticks == list(range(len(ticks))), seen
    assert len(ticks) < 1000, f"the call ran on after cancel(): {len(ticks)} responses"
    report = server.repo / "py_ticker" / "ticker_report"
    wait_until(report.exists, 30, "the ticker's report")
    assert report.read_text().startswith("cancelled after"), report.read_text()
    # Both models keep serving.
    again = json.loads(client.infer("py_canceller", [go]).as_numpy("SEEN")[0])
    assert again["ticks"][:2] == [0, 1], again
