"""HTTP inference through the router's pass-through path (docs/router.md) against a real worker:
the worker's answer reaches the client byte for byte, as a direct call gets it, for JSON and
binary tensors, and for the worker's own refusals."""

import json
import subprocess
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from cluster_util import RouterProcess, WorkerProcess, leader_of
from nereid_util import NEREID_BIN, gen_models, wait_until
from test_cluster import start_control_plane, stop_all


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("http_passthrough")
    repo = gen_models.write_repository(tmp / "repo", "example")
    token, cps = start_control_plane(tmp, n=1)
    worker = WorkerProcess("w1", tmp, token, [cps[0].grpc_addr])
    router = RouterProcess(tmp, token, [cps[0].grpc_addr])
    try:
        leader_of(cps)
        for p in (worker, router):
            p.spawn()
        for p in (worker, router):
            p.wait_live()
        out = subprocess.run(
            [NEREID_BIN, "ctl", "--control-plane", cps[0].grpc_addr, "--token-file", str(token),
             "models", "deploy", "simple", "--source", f"file://{repo / 'simple'}",
             "--replicas", "1", "--memory", "64Mi", "--wait", "--timeout", "60"],
            capture_output=True, text=True, timeout=90)
        assert out.returncode == 0, (out.stdout, out.stderr)
        via = httpclient.InferenceServerClient(router.http_url)
        wait_until(lambda: via.is_model_ready("simple"), 30, "the router sees simple ready")
        yield worker, router
    finally:
        stop_all([router, worker, *cps])


def post(url, path, body, headers=None):
    """POST `body`: (status, the headers that matter, body bytes)."""
    request = urllib.request.Request(f"http://{url}{path}", data=body, method="POST",
                                     headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            status, hdrs, data = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, data = e.code, e.headers, e.read()
    keep = {k.lower(): v for k, v in hdrs.items()
            if k.lower() in ("content-type", "inference-header-content-length")}
    return status, keep, data


def json_request(shape=(1, 16)):
    n = int(np.prod(shape))
    return json.dumps({
        "id": "7",
        "inputs": [{"name": "INPUT0", "shape": list(shape), "datatype": "INT32",
                    "data": list(range(n))},
                   {"name": "INPUT1", "shape": list(shape), "datatype": "INT32",
                    "data": [3] * n}],
    }).encode()


def test_json_and_binary_answers_are_the_workers_bytes(cluster):
    worker, router = cluster
    direct = post(worker.http_url, "/v2/models/simple/infer", json_request())
    routed = post(router.http_url, "/v2/models/simple/infer", json_request())
    assert direct[0] == 200, direct
    assert routed == direct

    # Binary tensors both ways (tritonclient's encoding), through the router and direct.
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"),
              httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(b, binary_data=True)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    body, header_len = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=outputs, request_id="b1")
    headers = {"Inference-Header-Content-Length": str(header_len)}
    direct = post(worker.http_url, "/v2/models/simple/versions/1/infer", body, headers)
    routed = post(router.http_url, "/v2/models/simple/versions/1/infer", body, headers)
    assert direct[0] == 200, direct
    assert routed == direct
    result = httpclient.InferenceServerClient.parse_response_body(
        routed[2], header_length=int(routed[1]["inference-header-content-length"]))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def router_requests(router, outcome):
    """The router's `nereid_router_requests_total` for model `simple` and `outcome`."""
    url = "http://127.0.0.1:{}/metrics".format(router.metrics_port)
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    series = 'nereid_router_requests_total{{model="simple",outcome="{}"}} '.format(outcome)
    return sum(float(line[len(series):]) for line in text.splitlines() if line.startswith(series))


def test_the_workers_refusals_pass_through_and_the_routers_own_are_json(cluster):
    worker, router = cluster
    failures = router_requests(router, "failure")
    # The worker refuses a wrong shape; the client gets its status and body unchanged, and the
    # router counts it as a failure, as it counts the same refusal over gRPC.
    direct = post(worker.http_url, "/v2/models/simple/infer", json_request((1, 15)))
    routed = post(router.http_url, "/v2/models/simple/infer", json_request((1, 15)))
    assert direct[0] == 400, direct
    assert routed == direct
    assert router_requests(router, "failure") == failures + 1
    # What the router refuses itself: an unknown model (Triton's words), a malformed body.
    status, headers, body = post(router.http_url, "/v2/models/nope/infer", json_request())
    assert status == 404 and headers["content-type"] == "application/json"
    assert json.loads(body)["error"] == "Request for unknown model: 'nope' is not found"
    status, _, body = post(router.http_url, "/v2/models/simple/infer", b'{"inputs": [')
    assert status == 400 and "JSON" in json.loads(body)["error"]
    # The router keeps serving.
    assert post(router.http_url, "/v2/models/simple/infer", json_request())[0] == 200
