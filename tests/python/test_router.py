"""The router over real processes on 127.0.0.1: tritonclient (HTTP and gRPC) gets through the
router what it gets from a worker directly, and a SIGKILLed worker costs no failed request for a
model with a replica elsewhere."""

import subprocess

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from cluster_util import RouterProcess, WorkerProcess, leader_of, replicas
from nereid_util import NEREID_BIN, gen_models
from test_cluster import start_control_plane, stop_all


@pytest.fixture
def example_repo(tmp_path_factory):
    return gen_models.write_repository(tmp_path_factory.mktemp("router_repo"), "example")


def simple_inputs(module, a, b):
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"),
              module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_router_answers_like_a_worker_and_survives_a_worker_kill(tmp_path, example_repo):
    token, cps = start_control_plane(tmp_path, n=1)
    cp = cps[0]
    workers = [WorkerProcess(f"w{i}", tmp_path, token, [cp.grpc_addr]) for i in (1, 2)]
    router = RouterProcess(tmp_path, token, [cp.grpc_addr])
    try:
        leader_of(cps)
        for p in [*workers, router]:
            p.spawn()
        for p in [*workers, router]:
            p.wait_live()
        # `ctl models deploy --wait` returns once both replicas are ready.
        out = subprocess.run(
            [NEREID_BIN, "ctl", "--control-plane", cp.grpc_addr, "--token-file", str(token),
             "models", "deploy", "simple", "--source", f"file://{example_repo / 'simple'}",
             "--replicas", "2", "--memory", "64Mi", "--wait", "--timeout", "60"],
            capture_output=True, text=True, timeout=90)
        assert out.returncode == 0, (out.stdout, out.stderr)
        ready = [x for x in replicas(cp, "simple") if x["state"] == "REPLICA_STATE_READY"]
        assert len(ready) == 2, ready

        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.full((1, 16), 3, dtype=np.int32)
        direct = httpclient.InferenceServerClient(workers[0].http_url).infer(
            "simple", simple_inputs(httpclient, a, b))
        via_http = httpclient.InferenceServerClient(router.http_url)
        via_grpc = grpcclient.InferenceServerClient(router.grpc_url)

        def both_ways():
            h = via_http.infer("simple", simple_inputs(httpclient, a, b))
            g = via_grpc.infer("simple", simple_inputs(grpcclient, a, b))
            for r in (h, g):
                for out in ("OUTPUT0", "OUTPUT1"):
                    np.testing.assert_array_equal(r.as_numpy(out), direct.as_numpy(out))

        # The router learns the replicas from its watch; then every request succeeds.
        from nereid_util import wait_until
        wait_until(lambda: via_http.is_model_ready("simple"), 30, "the router sees simple ready")
        for _ in range(20):
            both_ways()
        assert via_grpc.get_model_metadata("simple").name == "simple"
        # Compressed gRPC requests pass through as Triton accepts them.
        for algo in ("gzip", "deflate"):
            g = via_grpc.infer("simple", simple_inputs(grpcclient, a, b),
                               compression_algorithm=algo)
            np.testing.assert_array_equal(g.as_numpy("OUTPUT0"), direct.as_numpy("OUTPUT0"))

        # Client shared memory cannot cross hosts: the router refuses it, saying why, and does
        # not claim the extension.
        for client in (via_http, via_grpc):
            with pytest.raises(InferenceServerException) as e:
                client.register_system_shared_memory("r", "/nereid_router_shm", 16)
            assert "the router forwards requests to workers" in e.value.message()
            assert str(e.value.status()) in ("501", "StatusCode.UNIMPLEMENTED")
        assert "system_shared_memory" not in via_http.get_server_metadata()["extensions"]

        workers[0].kill()
        for _ in range(50):
            both_ways()  # no failed request: the other replica answers
    finally:
        stop_all([router, *workers, *cps])
