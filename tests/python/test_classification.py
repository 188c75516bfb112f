"""The classification extension through Triton's clients: an output asked for with
`class_count=k` comes back as the top k classes per batch entry, `value:index[:label]` strings,
labels from the output's `label_filename`. Identity-backend models (outputs copy inputs), so the
expected classes follow from the inputs."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import Server, http_json

LABELS = "cat\ndog\n\nfish\nbird\n"


def identity_config(name, dtype, dims, max_batch, label=True):
    label_line = ' label_filename: "labels.txt"' if label else ""
    return (f'name: "{name}"\nbackend: "identity"\nmax_batch_size: {max_batch}\n'
            f'input [ {{ name: "INPUT0" data_type: {dtype} dims: [ {dims} ] }} ]\n'
            f'output [ {{ name: "OUTPUT0" data_type: {dtype} dims: [ {dims} ]{label_line} }} ]\n'
            "instance_group [ { kind: KIND_CPU, count: 1 } ]\n")


MODELS = {
    "cls_fp32": (identity_config("cls_fp32", "TYPE_FP32", "5", 8), True),
    "cls_int32_nobatch": (identity_config("cls_int32_nobatch", "TYPE_INT32", "5", 0), True),
    "cls_fp16": (identity_config("cls_fp16", "TYPE_FP16", "5", 8, label=False), False),
    "cls_missing_labels": (identity_config("cls_missing_labels", "TYPE_FP32", "5", 8), False),
}


@pytest.fixture(scope="module")
def cls_server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cls_repo")
    for name, (config, labels) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        if labels:
            (repo / name / "labels.txt").write_text(LABELS)
    server = Server(repo, tmp_path_factory.mktemp("cls_logs"), name="server_cls").start()
    yield server
    server.stop()


def decode(arr):
    return [[e.decode() for e in row] for row in np.atleast_2d(arr)]


X = np.array([[0.1, 0.7, 0.5, 0.25, 0.05],
              [3.0, -1.5, 2.125, 4.5, 1.0]], dtype=np.float32)
EXPECTED_X = [["0.700000:1:dog", "0.500000:2", "0.250000:3:fish"],
              ["4.500000:3:fish", "3.000000:0:cat", "2.125000:2"]]


@pytest.mark.parametrize("client_mod", [httpclient, grpcclient], ids=["http", "grpc"])
def test_batched_fp32_top_k_with_labels(cls_server, client_mod):
    url = cls_server.http_url if client_mod is httpclient else cls_server.grpc_url
    client = client_mod.InferenceServerClient(url)
    i = client_mod.InferInput("INPUT0", list(X.shape), "FP32")
    i.set_data_from_numpy(X)
    out = client_mod.InferRequestedOutput("OUTPUT0", class_count=3)
    result = client.infer("cls_fp32", [i], outputs=[out])
    arr = result.as_numpy("OUTPUT0")
    assert arr.shape == (2, 3)
    assert decode(arr) == EXPECTED_X
    # Without classification the same request answers the tensor itself.
    plain = client.infer("cls_fp32", [i]).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(plain, X)
    client.close()


@pytest.mark.parametrize("client_mod", [httpclient, grpcclient], ids=["http", "grpc"])
def test_unbatched_int32_and_k_clamped(cls_server, client_mod):
    url = cls_server.http_url if client_mod is httpclient else cls_server.grpc_url
    client = client_mod.InferenceServerClient(url)
    x = np.array([7, -3, 12, 0, 12], dtype=np.int32)
    i = client_mod.InferInput("INPUT0", [5], "INT32")
    i.set_data_from_numpy(x)
    out = client_mod.InferRequestedOutput("OUTPUT0", class_count=50)
    arr = client.infer("cls_int32_nobatch", [i], outputs=[out]).as_numpy("OUTPUT0")
    assert arr.shape == (5,), "k above the class count is clamped to it"
    # Ties keep index order; index 2 has an empty label line.
    assert decode(arr) == [["12:2", "12:4:bird", "7:0:cat", "0:3:fish", "-3:1:dog"]]
    client.close()


def test_classification_as_json(cls_server):
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 5],
                        "data": X[0].tolist()}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]}
    status, answer = http_json(cls_server.http_url, "POST", "/v2/models/cls_fp32/infer", body)
    assert status == 200, answer
    [out] = answer["outputs"]
    assert (out["datatype"], out["shape"]) == ("BYTES", [1, 2])
    assert out["data"] == ["0.700000:1:dog", "0.500000:2"]


def test_bad_parameters_and_types_are_refused(cls_server):
    client = grpcclient.InferenceServerClient(cls_server.grpc_url)
    i = grpcclient.InferInput("INPUT0", [1, 5], "FP16")
    i.set_data_from_numpy(np.ones((1, 5), np.float16))
    with pytest.raises(InferenceServerException) as e:
        client.infer("cls_fp16", [i],
                     outputs=[grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)])
    assert "class result not available for output due to unsupported type 'FP16'" in e.value.message()
    client.close()
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 5],
                        "data": X[0].tolist()}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"classification": "two"}}]}
    status, answer = http_json(cls_server.http_url, "POST", "/v2/models/cls_fp32/infer", body)
    assert status == 400
    assert "invalid value type for 'classification' parameter" in answer["error"]


def test_missing_label_file_fails_the_load_naming_it(cls_server):
    status, index = http_json(cls_server.http_url, "POST", "/v2/repository/index", {})
    assert status == 200
    [row] = [r for r in index if r["name"] == "cls_missing_labels"]
    assert row["state"] == "UNAVAILABLE"
    assert "failed to open text file for read" in row["reason"]
    assert "cls_missing_labels/labels.txt" in row["reason"]


def test_server_metadata_lists_classification(cls_server):
    status, md = http_json(cls_server.http_url, "GET", "/v2")
    assert status == 200
    assert md["extensions"][0] == "classification"
