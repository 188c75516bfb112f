"""Ragged batching (`allow_ragged_batch`, `batch_input`, `batch_output`) through Triton's clients,
on an ONNX model run by ONNX Runtime (scripts/gen_models.py `ragged_sum`): requests whose ragged
INPUT lengths differ are batched together (the statistics count fewer executions than requests),
the model sees them concatenated with the server-generated INDEX (accumulated element counts)
and COUNT (element counts), and every request gets its own sum, count and its share of the
scattered DOUBLED output. Configs with a bad batch_input fail to load with a reason naming it."""

import concurrent.futures

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from nereid_util import Server, gen_models, http_json


@pytest.fixture(scope="module")
def ragged_server(tmp_path_factory):
    repo = gen_models.write_ragged_models(tmp_path_factory.mktemp("ragged_repo"))
    server = Server(repo, tmp_path_factory.mktemp("ragged_logs"), name="server_ragged").start()
    yield server
    server.stop()


def stats(client, model="ragged_sum"):
    [s] = client.get_inference_statistics(model)["model_stats"]
    return s["inference_stats"]["success"]["count"], s["execution_count"]


def infer_http(url, x):
    with httpclient.InferenceServerClient(url, network_timeout=60) as c:
        i = httpclient.InferInput("INPUT", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        r = c.infer("ragged_sum", [i])
        return {n: r.as_numpy(n) for n in ("SUM", "N", "DOUBLED")}


def infer_grpc(url, x):
    c = grpcclient.InferenceServerClient(url)
    try:
        i = grpcclient.InferInput("INPUT", list(x.shape), "FP32")
        i.set_data_from_numpy(x)
        r = c.infer("ragged_sum", [i], client_timeout=60)
        return {n: r.as_numpy(n) for n in ("SUM", "N", "DOUBLED")}
    finally:
        c.close()


def test_requests_of_different_lengths_share_one_execution(ragged_server):
    """Four requests (lengths 3, 1, 5, 2) fill the preferred batch of 4 while the 2 s queue
    delay holds them: one execution answers all of them, each with its own values."""
    lengths = [3, 1, 5, 2]
    xs = [np.arange(n, dtype=np.float32).reshape(1, n) + 10 * k for k, n in enumerate(lengths)]
    with httpclient.InferenceServerClient(ragged_server.http_url) as c:
        before = stats(c)
    senders = [infer_http, infer_grpc, infer_http, infer_grpc]
    urls = [ragged_server.http_url, ragged_server.grpc_url] * 2
    with concurrent.futures.ThreadPoolExecutor(len(xs)) as pool:
        results = list(pool.map(lambda a: a[0](a[1], a[2]), zip(senders, urls, xs)))
    for x, r in zip(xs, results):
        n = x.shape[1]
        np.testing.assert_allclose(r["SUM"], [[x.sum()]])
        np.testing.assert_array_equal(r["N"], [[n]])
        # The batch output comes back in the shape of the request's own INPUT.
        assert r["DOUBLED"].shape == (1, n)
        np.testing.assert_array_equal(r["DOUBLED"], x * 2)
    with httpclient.InferenceServerClient(ragged_server.http_url) as c:
        after = stats(c)
    requests, executions = after[0] - before[0], after[1] - before[1]
    assert requests == 4
    assert executions < requests, f"{executions} executions for {requests} ragged requests"


def test_a_request_alone_is_flattened_too(ragged_server):
    """A batch of one gets the same treatment: INPUT [1, 6] reaches the model as [6] (it runs
    alone once the queue delay has passed)."""
    with httpclient.InferenceServerClient(ragged_server.http_url) as c:
        i = httpclient.InferInput("INPUT", [1, 6], "FP32")
        x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(1, 6)
        i.set_data_from_numpy(x)
        r = c.infer("ragged_sum", [i])
    np.testing.assert_allclose(r.as_numpy("SUM"), [[x.sum()]], atol=1e-6)
    np.testing.assert_array_equal(r.as_numpy("N"), [[6]])
    np.testing.assert_array_equal(r.as_numpy("DOUBLED"), x * 2)


def test_bad_batch_inputs_fail_to_load_naming_the_field(ragged_server):
    status, index = http_json(ragged_server.http_url, "POST", "/v2/repository/index", {})
    assert status == 200
    reasons = {r["name"]: r.get("reason", "") for r in index}
    assert reasons.get("ragged_sum", "") == ""
    for name, (_, needle) in gen_models.BROKEN_RAGGED.items():
        assert needle in reasons[name], f"{name}: {reasons[name]!r}"
