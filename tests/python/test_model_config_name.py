"""`--model-config-name NAME`: a model's config comes from `configs/NAME.pbtxt` where the model
has one, else from `config.pbtxt`, as in Triton. Checked against the real Triton 2.51 on the
same repository (Python models) through the config endpoint and inference."""

import textwrap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from nereid_util import PYTHON_IDENTITY_MODEL, http_json

IDENTITY = PYTHON_IDENTITY_MODEL


def config(name, which, dims):
    return textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "x" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
        output [ {{ name: "y" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        parameters {{ key: "which" value: {{ string_value: "{which}" }} }}
        """)


def write_repo(repo):
    # `tuned` has a config for the name the servers are started with; `plain` has none.
    for name in ("tuned", "plain"):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(IDENTITY)
        (repo / name / "config.pbtxt").write_text(config(name, "default", 4))
    (repo / "tuned" / "configs").mkdir()
    (repo / "tuned" / "configs" / "h100.pbtxt").write_text(config("tuned", "h100", 8))
    (repo / "tuned" / "configs" / "a100.pbtxt").write_text(config("tuned", "a100", 2))
    return repo


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from triton_util import TRITON_BIN, start_pair
    if not Path(TRITON_BIN).exists():
        pytest.skip(f"{TRITON_BIN} missing: run `make triton-ref`")
    work = tmp_path_factory.mktemp("config_name")
    servers = start_pair(write_repo(work / "repo"), work, ["--model-config-name", "h100"])
    yield servers
    for s in servers:
        s.stop()


def seen(server, model):
    """What the server took from the config: the `which` parameter and the input dims; and
    that an input of those dims runs."""
    code, body = http_json(server.http_url, "GET", f"/v2/models/{model}/config")
    assert code == 200, body
    which = body["parameters"]["which"]["string_value"]
    dims = body["input"][0]["dims"]
    client = httpclient.InferenceServerClient(server.http_url)
    x = np.arange(dims[0], dtype=np.float32)
    tensor = httpclient.InferInput("x", [dims[0]], "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_array_equal(client.infer(model, [tensor]).as_numpy("y"), x)
    return which, dims


def test_the_named_config_is_used_where_a_model_has_it(pair):
    nereid, triton = pair
    assert seen(nereid, "tuned") == ("h100", [8])
    assert seen(nereid, "plain") == ("default", [4])
    for model in ("tuned", "plain"):
        assert seen(nereid, model) == seen(triton, model), model


def test_a_config_name_that_is_a_path_is_refused(tmp_path):
    import subprocess

    from nereid_util import NEREID_BIN
    out = subprocess.run([NEREID_BIN, "serve", "--model-repository", str(tmp_path),
                          "--model-config-name", "../h100"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2, out
    assert "is not a config name" in out.stderr, out.stderr
