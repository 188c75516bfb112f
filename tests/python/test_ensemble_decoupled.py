"""Ensembles with a decoupled step, end to end on Python-backend models
(scripts/gen_models.py `write_decoupled_ensemble_models`): `ens_dec` is dec_repeat (decoupled, one
response per element of IN) followed by dec_double. Over gRPC ModelStreamInfer every response of
dec_repeat runs dec_double once and goes out as it completes; the one that leaves nothing running
carries the final flag (a flag-only response when dec_repeat sends nothing); HTTP generate_stream streams the same; unary infer is refused over HTTP and gRPC; the
ensemble's config says decoupled (computed at load); a step that mixes decoupled origins fails to
load; a failing step ends the stream with its error; statistics count per step; a client that goes
away cancels the request; a Python model reaches the ensemble through BLS with decoupled=True.
(The same behaviour against the real Triton 2.51: test_triton_diff.py.)"""

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import gen_models, http_raw, managed_server, wait_until

# A Python model calling ens_dec through BLS (decoupled=True): OUT = every response's OUT, in
# order, and N = how many responses it got.
BLS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for r in requests:
            call = pb_utils.InferenceRequest(
                model_name="ens_dec", requested_output_names=["OUT"],
                inputs=[pb_utils.get_input_tensor_by_name(r, "IN")])
            values = []
            for response in call.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                out = pb_utils.get_output_tensor_by_name(response, "OUT")
                if out is not None:
                    values.extend(out.as_numpy().tolist())
            answers.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array(values, dtype=np.int32)),
                pb_utils.Tensor("N", np.array([len(values)], dtype=np.int32))]))
        return answers
"""

BLS_CONFIG = """name: "bls_ens_dec"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] },
         { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo_ens_dec")
    gen_models.write_decoupled_ensemble_models(repo)
    (repo / "bls_ens_dec" / "1").mkdir(parents=True)
    (repo / "bls_ens_dec" / "1" / "model.py").write_text(BLS_MODEL)
    (repo / "bls_ens_dec" / "config.pbtxt").write_text(BLS_CONFIG)
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), [], "server_ens_dec")


def int_input(module, values):
    i = module.InferInput("IN", [len(values)], "INT32")
    i.set_data_from_numpy(np.array(values, dtype=np.int32))
    return i


def stream(server, values, stop_after=None):
    """Sends one request for ens_dec on a gRPC stream (empty final responses asked for) and
    returns what came back, in order: ([OUT values] or {} for a flag-only response, final flag)
    or {"error": message}, up to the final flag or an error. `stop_after`: cancel the stream
    after that many responses instead."""
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    out = []
    try:
        client.async_stream_infer("ens_dec", [int_input(grpcclient, values)],
                                  enable_empty_final_response=True)
        while stop_after is None or len(out) < stop_after:
            result, error = got.get(timeout=30)
            if error is not None:
                out.append({"error": error.message()})
                break
            response = result.get_response(as_json=True)
            final = response["parameters"]["triton_final_response"]["bool_param"]
            values_out = (result.as_numpy("OUT").tolist()
                          if any(o["name"] == "OUT" for o in response.get("outputs", []))
                          else {})
            out.append((values_out, final))
            if final:
                break
        return out
    finally:
        client.stop_stream(cancel_requests=stop_after is not None)
        client.close()


def final_flag_merged(answers):
    """`answers` with a trailing flag-only final response folded into the response before it:
    the final flag rides on the response that leaves nothing running, so whether it comes with
    the last data response or alone depends on when dec_repeat's own final flag (sent alone,
    after its last response) reaches the ensemble."""
    if len(answers) >= 2 and answers[-1] == ({}, True) and not answers[-2][1]:
        return answers[:-2] + [(answers[-2][0], True)]
    return answers


def stats(server, model):
    status, _, body = http_raw(server.http_url, "GET", f"/v2/models/{model}/stats")
    assert status == 200, body
    entry = json.loads(body)["model_stats"][0]
    return {"success": entry["inference_stats"]["success"]["count"],
            "fail": entry["inference_stats"]["fail"]["count"],
            "inference_count": entry["inference_count"]}


def test_each_decoupled_response_runs_the_next_step_and_the_last_is_final(server):
    answers = final_flag_merged(stream(server, [1, 2, 3]))
    # dec_double runs each as it comes (one instance: in order, but the ensemble sends each
    # as it completes); the response that leaves nothing running carries the final flag.
    assert sorted(a[0] for a in answers) == [[2], [4], [6]], answers
    assert [a[1] for a in answers] == [False, False, True], answers
    assert final_flag_merged(stream(server, [5])) == [([10], True)]
    assert stream(server, []) == [({}, True)], "no response of dec_repeat: only the final flag"


def test_generate_stream_sends_each_response_as_an_event(server):
    status, headers, body = http_raw(server.http_url, "POST", "/v2/models/ens_dec/generate_stream",
                                     json.dumps({"IN": [1, 2, 3]}).encode())
    assert status == 200, body
    assert headers["content-type"].startswith("text/event-stream")
    events = [json.loads(chunk[len("data: "):]) for chunk in body.decode().split("\n\n") if chunk]
    assert [(e["model_name"], e["OUT"]) for e in events] == [("ens_dec", 2), ("ens_dec", 4),
                                                             ("ens_dec", 6)]


def test_unary_infer_is_refused_over_http_and_grpc(server):
    before = stats(server, "ens_dec")
    with httpclient.InferenceServerClient(server.http_url) as c:
        with pytest.raises(InferenceServerException) as e:
            c.infer("ens_dec", [int_input(httpclient, [1])])
    assert e.value.status() == "501"
    assert e.value.message() == (
        "HTTP end point doesn't support models with decoupled transaction policy")
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        with pytest.raises(InferenceServerException) as e:
            c.infer("ens_dec", [int_input(grpcclient, [1])])
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    assert e.value.message() == (
        "ModelInfer RPC doesn't support models with decoupled transaction policy")
    assert stats(server, "ens_dec") == before, "refused before the model: counted nowhere"


def test_config_says_decoupled_as_the_load_computed(server):
    with httpclient.InferenceServerClient(server.http_url) as c:
        assert c.get_model_config("ens_dec")["model_transaction_policy"] == {"decoupled": True}
        # Its file says decoupled, but no step is: the load decides.
        claims = c.get_model_config("ens_dec_claims")
        assert claims["model_transaction_policy"] == {"decoupled": False}
        answer = c.infer("ens_dec_claims", [int_input(httpclient, [21])])
        assert answer.as_numpy("OUT").tolist() == [42]
    with grpcclient.InferenceServerClient(server.grpc_url) as c:
        config = c.get_model_config("ens_dec", as_json=True)["config"]
        assert config["model_transaction_policy"] == {"decoupled": True}


def test_a_step_mixing_decoupled_origins_fails_to_load(server):
    status, _, body = http_raw(server.http_url, "POST", "/v2/repository/index", b"{}")
    assert status == 200
    entry = {e["name"]: e for e in json.loads(body)}["ens_dec_mixed"]
    assert entry["state"] == "UNAVAILABLE"
    assert entry["reason"] == gen_models.BROKEN_DECOUPLED_ENSEMBLES["ens_dec_mixed"]


def test_a_failing_step_ends_the_stream_with_its_error(server):
    before = stats(server, "ens_dec")
    answers = stream(server, [1, -1, 3])
    *data, last = answers
    assert "error" in last, answers
    assert "ensemble 'ens_dec' step 0 (model 'dec_repeat')" in last["error"], last
    assert "dec_repeat refuses -1" in last["error"], last
    assert all(d in (([2], False), ([6], False)) for d in data), answers
    after = stats(server, "ens_dec")
    assert (after["success"], after["fail"]) == (before["success"], before["fail"] + 1)


def test_statistics_count_the_ensemble_once_and_each_step_per_run(server):
    before = {m: stats(server, m) for m in ("ens_dec", "dec_repeat", "dec_double")}
    assert len(final_flag_merged(stream(server, [4, 5, 6, 7]))) == 4
    # dec_repeat counts its request when it has sent its final flag, which may come a moment
    # after the ensemble's stream ended.
    after = wait_until(
        lambda: (a := {m: stats(server, m) for m in before})["dec_repeat"]["success"]
        == before["dec_repeat"]["success"] + 1 and a, 30, "dec_repeat counted the request")
    gained = {m: after[m]["success"] - before[m]["success"] for m in before}
    assert gained == {"ens_dec": 1, "dec_repeat": 1, "dec_double": 4}
    assert after["ens_dec"]["inference_count"] - before["ens_dec"]["inference_count"] == 1


def test_a_client_going_away_cancels_the_request(server):
    before = stats(server, "ens_dec")
    # Each 1000 makes dec_repeat wait 0.5 s: the stream is cancelled after the first response,
    # long before the last.
    got = stream(server, [1] + [1000] * 20, stop_after=1)
    assert got == [([2], False)]
    wait_until(lambda: stats(server, "ens_dec")["fail"] == before["fail"] + 1, 30,
               "the cancelled request counted")
    assert stats(server, "ens_dec")["success"] == before["success"]


def test_bls_reaches_the_decoupled_ensemble(server):
    with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as c:
        answer = c.infer("bls_ens_dec", [int_input(httpclient, [3, 1, 2])])
    assert answer.as_numpy("OUT").tolist() == [6, 2, 4]
    assert answer.as_numpy("N").tolist() == [3]
