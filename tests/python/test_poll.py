"""Poll control mode: a new model, a new version and a removed model are each picked up within a
bounded time while another model keeps serving requests without a single error."""

import os
import shutil
import threading

import pytest
from onnx import TensorProto

from nereid_util import gen_models, http_json, http_raw, managed_server, wait_until

DEADLINE_S = 30


@pytest.fixture(scope="module")
def poll_env(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo_poll")
    staging = tmp_path_factory.mktemp("staging")
    gen_models.write_model(repo, "steady", {1: gen_models.identity_onnx(TensorProto.FLOAT)},
                           gen_models.config_text("steady", 8, [("INPUT0", "FP32", [-1])],
                                                  [("OUTPUT0", "FP32", [-1])]))
    gen_models.write_versioned(repo, "poll_versioned", versions=(1,), served=(1,))
    args = ["--model-control-mode", "poll", "--repository-poll-secs", "1"]
    for server in managed_server(repo, tmp_path_factory.mktemp("logs"), args, "server_poll"):
        yield server, repo, staging


def infer_add(server, model):
    status, body = http_json(server.http_url, "POST", f"/v2/models/{model}/infer", {
        "inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "INT32", "data": [5, 6]}]})
    return status, body


class SteadyTraffic:
    """Sends requests to `steady` in a thread; records every failure."""

    def __init__(self, server):
        self.server, self.stop, self.errors, self.count = server, threading.Event(), [], 0
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32",
                            "data": [1.5, 2.5, 3.5]}]}
        while not self.stop.is_set():
            try:
                status, resp = http_json(self.server.http_url, "POST",
                                         "/v2/models/steady/infer", body)
                if status != 200 or resp["outputs"][0]["data"] != [1.5, 2.5, 3.5]:
                    self.errors.append((status, resp))
            except Exception as e:  # noqa: BLE001
                self.errors.append(repr(e))
            self.count += 1
            self.stop.wait(0.01)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=30)


def stage_then_move(staging, make, dest):
    """Builds a directory outside the repository, then renames it in (atomic for the poller)."""
    tmp = make(staging)
    os.rename(tmp, dest)


def test_poll_add_version_remove(poll_env):
    server, repo, staging = poll_env
    with SteadyTraffic(server) as traffic:
        assert infer_add(server, "poll_versioned")[1]["outputs"][0]["data"] == [6, 7]

        # 1. A new model directory appears.
        stage_then_move(staging, lambda d: gen_models.write_versioned(d, "poll_added",
                                                                      versions=(1,)),
                        repo / "poll_added")
        wait_until(lambda: http_raw(server.http_url, "GET", "/v2/models/poll_added/ready")[0]
                   == 200, DEADLINE_S, "poll_added to become ready")
        status, body = infer_add(server, "poll_added")
        assert status == 200 and body["outputs"][0]["data"] == [6, 7], body

        # 2. A new version of an existing model appears; latest policy moves to it.
        def make_v2(d):
            gen_models.write_versioned(d, "tmp_v", versions=(2,))
            return d / "tmp_v" / "2"
        stage_then_move(staging, make_v2, repo / "poll_versioned" / "2")
        wait_until(lambda: infer_add(server, "poll_versioned")[1]["model_version"] == "2",
                   DEADLINE_S, "poll_versioned version 2 to serve")
        status, body = infer_add(server, "poll_versioned")
        assert status == 200 and body["outputs"][0]["data"] == [7, 8], body

        # 3. A model directory disappears.
        os.rename(repo / "poll_added", staging / "removed")
        shutil.rmtree(staging / "removed")
        wait_until(lambda: http_raw(server.http_url, "GET", "/v2/models/poll_added/ready")[0]
                   != 200, DEADLINE_S, "poll_added to be unloaded")
        status, body = infer_add(server, "poll_added")
        assert status in (400, 404, 503) and "poll_added" in body["error"], (status, body)
        index = http_json(server.http_url, "POST", "/v2/repository/index")[1]
        assert not any(e["name"] == "poll_added" and e.get("state") == "READY" for e in index)

    assert traffic.count > 10, "steady traffic did not run"
    assert not traffic.errors, f"{len(traffic.errors)} failed requests, first: {traffic.errors[:3]}"


def test_poll_mode_refuses_explicit_load(poll_env):
    server = poll_env[0]
    status, body = http_json(server.http_url, "POST", "/v2/repository/models/steady/load", {})
    assert status == 503 and "error" in body, (status, body)
    assert infer_add(server, "poll_versioned")[0] == 200
