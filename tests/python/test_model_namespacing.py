"""`--model-namespacing`: models of the same name in two repositories both load, each in its
repository's namespace, as in Triton's qa/L0_model_namespacing (addsub_repo / subadd_repo): a
name found in both is refused as ambiguous (400 / INVALID_ARGUMENT), an ensemble runs the
composing model of its own repository, the index lists each model, and per-model metrics carry
a `namespace` label."""

import textwrap
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import http_json, managed_server

MODEL_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
            first, second = (a + b, a - b) if SIGN > 0 else (a - b, a + b)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", first),
                                                   pb_utils.Tensor("OUTPUT1", second)]))
        return out
"""

IO = """
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"""


def python_model(repo, name, sign):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(MODEL_PY.replace("SIGN", str(sign)))
    (repo / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{IO}\n'
        'instance_group [ { count: 1 kind: KIND_CPU } ]\n')


def ensemble(repo, name, composing):
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nplatform: "ensemble"\n'
                                              f'max_batch_size: 0\n{IO}\n' + textwrap.dedent(f"""
        ensemble_scheduling {{ step [ {{
          model_name: "{composing}" model_version: -1
          input_map {{ key: "INPUT0" value: "INPUT0" }}
          input_map {{ key: "INPUT1" value: "INPUT1" }}
          output_map {{ key: "OUTPUT0" value: "OUTPUT0" }}
          output_map {{ key: "OUTPUT1" value: "OUTPUT1" }}
        }} ] }}
        """))


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    """Triton's layout, both of its duplication cases at once: each repository has a
    `composing_model` (add/sub in one, sub/add in the other) used by its own ensemble, and a
    `simple_ensemble` over a composing model only its repository has."""
    work = tmp_path_factory.mktemp("namespacing")
    addsub, subadd = work / "addsub_repo", work / "subadd_repo"
    for repo, sign, tag in [(addsub, 1, "addsub"), (subadd, -1, "subadd")]:
        python_model(repo, "composing_model", sign)
        python_model(repo, f"composing_{tag}", sign)
        ensemble(repo, f"simple_{tag}", "composing_model")
        ensemble(repo, "simple_ensemble", f"composing_{tag}")
    return work, addsub, subadd


X = np.arange(16, dtype=np.int32)
ADD, SUB = X + X, X - X


def infer(url, model, module=httpclient):
    client = module.InferenceServerClient(url)
    inputs = [module.InferInput(n, [16], "INT32") for n in ("INPUT0", "INPUT1")]
    for i in inputs:
        i.set_data_from_numpy(X)
    result = client.infer(model, inputs)
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


def expect(url, model, first, second):
    out0, out1 = infer(url, model)
    np.testing.assert_array_equal(out0, first, err_msg=model)
    np.testing.assert_array_equal(out1, second, err_msg=model)


def test_namespaces_as_in_triton(repos):
    work, addsub, subadd = repos
    args = ["--model-namespacing", "--model-repository", str(subadd)]
    servers = managed_server(addsub, work, args, "namespacing")
    server = next(servers)
    try:
        code, rows = http_json(server.http_url, "POST", "/v2/repository/index", {})
        assert code == 200, rows
        names = sorted(r["name"] for r in rows)
        assert names == sorted(["composing_model", "composing_model", "composing_addsub",
                                "composing_subadd", "simple_addsub", "simple_subadd",
                                "simple_ensemble", "simple_ensemble"]), rows
        assert all(r["state"] == "READY" for r in rows), rows
        # Each ensemble runs its own repository's composing model.
        expect(server.http_url, "simple_addsub", ADD, SUB)
        expect(server.http_url, "simple_subadd", SUB, ADD)
        expect(server.http_url, "composing_addsub", ADD, SUB)
        expect(server.http_url, "composing_subadd", SUB, ADD)
        # A name in both namespaces is ambiguous: Triton's INVALID_ARG.
        for model in ("composing_model", "simple_ensemble"):
            with pytest.raises(InferenceServerException) as e:
                infer(server.http_url, model)
            assert "ambiguity" in e.value.message(), e.value
            assert e.value.status() == "400", e.value
            with pytest.raises(InferenceServerException) as e:
                infer(server.grpc_url, model, grpcclient)
            assert "ambiguity" in e.value.message(), e.value
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT", e.value
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                      timeout=10).read().decode()
        for repo in (addsub, subadd):
            line = (f'nv_inference_request_success{{model="composing_model",'
                    f'namespace="{repo}",version="1"}} 1')
            assert line in text, text
    finally:
        servers.close()


def test_explicit_load_of_a_name_loads_it_in_every_namespace(repos):
    work, addsub, subadd = repos
    args = ["--model-namespacing", "--model-repository", str(subadd),
            "--model-control-mode", "explicit"]
    servers = managed_server(addsub, work, args, "namespacing_explicit")
    server = next(servers)
    try:
        client = httpclient.InferenceServerClient(server.http_url)
        client.load_model("simple_ensemble")
        expect(server.http_url, "composing_addsub", ADD, SUB)
        expect(server.http_url, "composing_subadd", SUB, ADD)
        with pytest.raises(InferenceServerException, match="ambiguity"):
            infer(server.http_url, "simple_ensemble")
        client.unload_model("simple_ensemble")
        code, rows = http_json(server.http_url, "POST", "/v2/repository/index", {"ready": True})
        assert code == 200 and not any(r["name"] == "simple_ensemble" for r in rows), rows
    finally:
        servers.close()


def test_poll_follows_a_composing_model_between_namespaces(tmp_path):
    """Triton's test_dynamic_resolution: with `composing_model` gone from addsub_repo, both
    ensembles run subadd_repo's (the one model of that name); back, each runs its own again."""
    import shutil
    from nereid_util import wait_until
    addsub, subadd = tmp_path / "addsub_repo", tmp_path / "subadd_repo"
    for repo, sign, tag in [(addsub, 1, "addsub"), (subadd, -1, "subadd")]:
        python_model(repo, "composing_model", sign)
        ensemble(repo, f"simple_{tag}", "composing_model")
    args = ["--model-namespacing", "--model-repository", str(subadd),
            "--model-control-mode", "poll", "--repository-poll-secs", "1"]
    servers = managed_server(addsub, tmp_path, args, "namespacing_poll")
    server = next(servers)

    def runs(model, first):
        try:
            return np.array_equal(infer(server.http_url, model)[0], first)
        except InferenceServerException:
            return False

    try:
        expect(server.http_url, "simple_addsub", ADD, SUB)
        shutil.move(addsub / "composing_model", tmp_path / "composing_model")
        wait_until(lambda: runs("simple_addsub", SUB), 30, "simple_addsub on subadd_repo's model")
        expect(server.http_url, "composing_model", SUB, ADD)
        expect(server.http_url, "simple_subadd", SUB, ADD)
        shutil.move(tmp_path / "composing_model", addsub / "composing_model")
        wait_until(lambda: runs("simple_addsub", ADD), 30, "simple_addsub on its own model")
        expect(server.http_url, "simple_subadd", SUB, ADD)
        with pytest.raises(InferenceServerException, match="ambiguity"):
            infer(server.http_url, "composing_model")
    finally:
        servers.close()
