"""Version selection under each version_policy: explicit version, latest, unknown versions."""

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import gen_models, ort_run

X = np.array([[10, 20, 30]], dtype=np.int32)


def add_http(client, model, version=""):
    i = httpclient.InferInput("INPUT0", [1, 3], "INT32")
    i.set_data_from_numpy(X)
    res = client.infer(model, [i], model_version=version)
    return res.as_numpy("OUTPUT0"), res.get_response()["model_version"]


def add_grpc(client, model, version=""):
    i = grpcclient.InferInput("INPUT0", [1, 3], "INT32")
    i.set_data_from_numpy(X)
    res = client.infer(model, [i], model_version=version)
    return res.as_numpy("OUTPUT0"), res.get_response().model_version


@pytest.mark.parametrize("model", list(gen_models.VERSION_POLICIES))
def test_version_policy(http_client, grpc_client, model_path, model):
    served = gen_models.VERSION_POLICIES[model][1]
    for v in served:
        ref = ort_run(model_path(model, v), {"INPUT0": X})["OUTPUT0"]
        np.testing.assert_array_equal(ref, X + v)
        for call in (add_http, add_grpc):
            out, got_v = call(http_client if call is add_http else grpc_client, model, str(v))
            np.testing.assert_array_equal(out, ref, err_msg=f"{model} v{v} {call.__name__}")
            assert got_v == str(v)
    # No version: the highest served version answers.
    latest = max(served)
    for call, cli in ((add_http, http_client), (add_grpc, grpc_client)):
        out, got_v = call(cli, model, "")
        np.testing.assert_array_equal(out, X + latest)
        assert got_v == str(latest), (model, call.__name__)


@pytest.mark.parametrize("model,version", [("versioned", "1"), ("versioned_latest2", "1"),
                                           ("versioned_specific1", "2"), ("versioned_all", "4")])
def test_unserved_version_not_found(http_client, grpc_client, model, version):
    with pytest.raises(InferenceServerException) as e:
        add_http(http_client, model, version)
    assert e.value.status() == "404", e.value
    assert model in e.value.message() and version in e.value.message(), e.value.message()
    with pytest.raises(InferenceServerException) as e:
        add_grpc(grpc_client, model, version)
    assert e.value.status() == "StatusCode.NOT_FOUND", e.value
    assert model in e.value.message(), e.value.message()


def test_version_specific_metadata_and_config(http_client):
    md = http_client.get_model_metadata("versioned_all", "2")
    assert md["name"] == "versioned_all"
    cfg = http_client.get_model_config("versioned_specific1", "1")
    assert cfg["version_policy"] == {"specific": {"versions": [1]}}, cfg["version_policy"]
    cfg = http_client.get_model_config("versioned_latest2")
    assert cfg["version_policy"] == {"latest": {"num_versions": 2}}, cfg["version_policy"]
    with pytest.raises(InferenceServerException) as e:
        http_client.get_model_metadata("versioned_specific1", "3")
    assert e.value.status() == "404"
