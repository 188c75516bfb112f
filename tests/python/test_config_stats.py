"""Model configuration endpoint (Triton's JSON shape, auto-complete) and statistics."""

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from nereid_util import http_json


def test_config_json_shape(server, http_client):
    status, cfg = http_json(server.http_url, "GET", "/v2/models/simple/config")
    assert status == 200
    assert cfg["name"] == "simple"
    assert cfg["platform"] == "onnxruntime_onnx"
    assert cfg["backend"] == "onnxruntime"
    assert cfg["max_batch_size"] == 8 and isinstance(cfg["max_batch_size"], int)
    assert [i["name"] for i in cfg["input"]] == ["INPUT0", "INPUT1"]
    assert cfg["input"][0]["data_type"] == "TYPE_INT32"
    assert cfg["input"][0]["dims"] == [16], "dims must be JSON numbers like Triton's"
    assert [o["name"] for o in cfg["output"]] == ["OUTPUT0", "OUTPUT1"]
    assert cfg["output"][1]["dims"] == [16]
    assert cfg["version_policy"] == {"latest": {"num_versions": 1}}
    assert isinstance(cfg.get("instance_group"), list) and cfg["instance_group"], cfg
    assert http_client.get_model_config("simple") == cfg
    assert http_json(server.http_url, "GET", "/v2/models/simple/versions/1/config") == (200, cfg)


def test_config_nobatch(http_client):
    cfg = http_client.get_model_config("nobatch_fp32")
    assert cfg["max_batch_size"] == 0
    assert cfg["input"][0]["dims"] == [2, 3]


def test_config_grpc(grpc_client):
    cfg = grpc_client.get_model_config("mlp").config
    assert cfg.name == "mlp" and cfg.max_batch_size == 8
    assert list(cfg.input[0].dims) == [4] and list(cfg.output[0].dims) == [3]
    d = grpc_client.get_model_config("mlp", as_json=True)["config"]
    assert d["max_batch_size"] == 8


def test_autocompleted_config(http_client):
    """No config.pbtxt: completed from the ONNX model like Triton's ORT backend does."""
    cfg = http_client.get_model_config("identity_fp32_autocomplete")
    assert cfg["name"] == "identity_fp32_autocomplete"
    assert cfg["backend"] == "onnxruntime"
    assert cfg["max_batch_size"] == 4, "Triton's default-max-batch-size for a dynamic batch dim"
    assert [(i["name"], i["data_type"], i["dims"]) for i in cfg["input"]] == [
        ("INPUT0", "TYPE_FP32", [-1])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in cfg["output"]] == [
        ("OUTPUT0", "TYPE_FP32", [-1])]
    md = http_client.get_model_metadata("identity_fp32_autocomplete")
    assert md["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}]


def _success_count(stats, name):
    [entry] = [s for s in stats["model_stats"] if s["name"] == name]
    return entry["inference_stats"]["success"]["count"]


def test_statistics(server, http_client, grpc_client):
    status, stats = http_json(server.http_url, "GET", "/v2/models/mlp/stats")
    assert status == 200 and isinstance(stats["model_stats"], list)
    entry = stats["model_stats"][0]
    assert entry["name"] == "mlp" and entry["version"] == "1"
    for k in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
        assert set(entry["inference_stats"][k]) >= {"count", "ns"}, k
    before = _success_count(stats, "mlp")
    x = np.zeros((2, 4), np.float32)
    i = httpclient.InferInput("x", [2, 4], "FP32")
    i.set_data_from_numpy(x)
    http_client.infer("mlp", [i])
    g = grpcclient.InferInput("x", [2, 4], "FP32")
    g.set_data_from_numpy(x)
    grpc_client.infer("mlp", [g])
    after = _success_count(http_client.get_inference_statistics("mlp"), "mlp")
    assert after >= before + 2, (before, after)

    all_stats = http_json(server.http_url, "GET", "/v2/models/stats")[1]["model_stats"]
    names = {s["name"] for s in all_stats}
    assert {"mlp", "simple", "identity_fp32"} <= names
    assert http_json(server.http_url, "GET", "/v2/models/mlp/versions/1/stats")[0] == 200

    gs = grpc_client.get_inference_statistics("mlp")
    assert gs.model_stats[0].name == "mlp"
    assert gs.model_stats[0].inference_stats.success.count >= after
