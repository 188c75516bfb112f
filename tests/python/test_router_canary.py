"""Cluster features users reach through the router, over real processes on 127.0.0.1: a version
traffic split set through the management API (canary), scale from zero for a model with
min_replicas 0, and Triton's repository load/unload mapped to the control plane."""

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import tritonclient.grpc as grpcclient

from cluster_util import AUTH, RouterProcess, WorkerProcess, leader_of, model_body, wait_replicas
from nereid_util import gen_models, wait_until
from test_cluster import start_control_plane, stop_all

READY = "REPLICA_STATE_READY"


@pytest.fixture
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("canary_repo")
    gen_models.write_versioned(root, "canary", versions=(1, 2))
    gen_models.write_example(root)
    return root


def add_input(n=4, value=10):
    x = np.full((1, n), value, dtype=np.int32)
    inp = httpclient.InferInput("INPUT0", list(x.shape), "INT32")
    inp.set_data_from_numpy(x)
    return x, [inp]


def simple_inputs():
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"),
              httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    for i in inputs:
        i.set_data_from_numpy(a)
    return a, inputs


@pytest.mark.timeout(240)
def test_traffic_split_scale_from_zero_and_repository_control(tmp_path, repo):
    token, cps = start_control_plane(tmp_path, n=1)
    cp = cps[0]
    worker = WorkerProcess("w1", tmp_path, token, [cp.grpc_addr])
    router = RouterProcess(tmp_path, token, [cp.grpc_addr],
                           extra=["--repository-control", "caller-credential"])
    # A router as started by default: repository control off.
    closed = RouterProcess(tmp_path, token, [cp.grpc_addr], name="closed-router")
    try:
        leader_of(cps)
        for p in (worker, router, closed):
            p.spawn()
        for p in (worker, router, closed):
            p.wait_live()
        client = httpclient.InferenceServerClient(router.http_url)

        # --- canary: versions 1 and 2 both served, 80/20 split ---------------------------
        body = model_body("canary", repo / "canary")
        body["version_policy"] = {"all": {}}
        code, answer = cp.api("POST", "/api/v1/models", body)
        assert code == 200, (code, answer)
        wait_replicas(cp, "canary", lambda r: sum(x["state"] == READY for x in r) == 2,
                      "a ready replica of each version")
        code, answer = cp.api("PUT", "/api/v1/models/canary/traffic",
                              {"weights": {"1": 80, "2": 20}})
        assert code == 200, (code, answer)
        code, answer = cp.api("PUT", "/api/v1/models/canary/traffic", {"weights": {"7": 1}})
        assert code == 400 and "traffic" in answer["error"], (code, answer)

        x, inputs = add_input()

        def version_of_one():
            r = client.infer("canary", inputs)
            v = int(r.get_response()["model_version"])
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), x + v)  # version v adds v
            return v

        # The router learns the split from its watch; version 2 shows up once it has.
        wait_until(lambda: version_of_one() == 2, 30, "the split reaches the router")
        n = 2000
        served = [version_of_one() for _ in range(n)]
        share = served.count(2) / n
        assert abs(share - 0.20) <= 0.05, f"version 2 took {share:.1%} of {n}, weight 20%"
        assert set(served) == {1, 2}
        # A request that names its version is not split.
        assert all(int(client.infer("canary", inputs, model_version="1")
                       .get_response()["model_version"]) == 1 for _ in range(20))

        # --- scale from zero: min_replicas 0, the first request starts a replica ----------
        lazy = model_body("simple", repo / "simple")
        lazy["min_replicas"], lazy["max_replicas"] = 0, 1
        code, answer = cp.api("POST", "/api/v1/models", lazy)
        assert code == 200, (code, answer)
        wait_until(lambda: "simple" in [m["name"] for m in client.get_model_repository_index()],
                   30, "the router sees the lazy model")
        assert not client.is_model_ready("simple"), "nothing placed before a request"
        a, inputs_simple = simple_inputs()
        r = client.infer("simple", inputs_simple)  # waits for the replica the request started
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + a)
        assert client.is_model_ready("simple")

        # --- repository unload / load through the router ---------------------------------
        # By default the public port administers nothing, even for a caller with the admin
        # token: the router refuses naming the flag, and the model keeps serving.
        closed_http = httpclient.InferenceServerClient(closed.http_url)
        closed_grpc = grpcclient.InferenceServerClient(closed.grpc_url)
        for call in (lambda: closed_http.unload_model("simple", headers=AUTH),
                     lambda: closed_grpc.unload_model("simple", headers=AUTH),
                     lambda: closed_http.load_model("simple")):
            with pytest.raises(InferenceServerException) as off:
                call()
            assert "--repository-control" in str(off.value), off.value
            assert off.value.status() in ("503", "StatusCode.UNAVAILABLE"), off.value.status()
        assert client.is_model_ready("simple")
        # With caller-credential, the caller's own token is what the control plane checks:
        # none (the router has its own, but never lends it) is refused as unauthenticated.
        with pytest.raises(InferenceServerException) as anonymous:
            client.unload_model("simple")
        assert anonymous.value.status() == "401", anonymous.value
        with pytest.raises(InferenceServerException) as anonymous_grpc:
            grpcclient.InferenceServerClient(router.grpc_url).unload_model("simple")
        assert anonymous_grpc.value.status() == "StatusCode.UNAUTHENTICATED", anonymous_grpc.value
        with pytest.raises(InferenceServerException) as wrong:
            client.unload_model("simple", headers={"authorization": "Bearer not-the-token"})
        assert wrong.value.status() == "401", wrong.value
        assert client.is_model_ready("simple"), "refused unloads change nothing"
        client.unload_model("simple", headers=AUTH)
        assert not client.is_model_ready("simple")
        with pytest.raises(InferenceServerException) as unloaded:
            client.infer("simple", inputs_simple)
        assert "no ready replica" in str(unloaded.value), unloaded.value
        client.load_model("simple", headers=AUTH)
        assert client.is_model_ready("simple")
        np.testing.assert_array_equal(
            client.infer("simple", inputs_simple).as_numpy("OUTPUT0"), a + a)
        code, answer = cp.api("GET", "/api/v1/models/simple")
        assert answer["model"]["min_replicas"] == 1, answer

        with pytest.raises(InferenceServerException) as unknown:
            client.load_model("never_registered", headers=AUTH)
        assert "not found" in str(unknown.value), unknown.value
    finally:
        stop_all([closed, router, worker, *cps])
