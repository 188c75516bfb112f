"""`EXECUTION_ENV_PATH` naming a packed environment (`.tar.gz`, what conda-pack makes), as in
Triton: the server unpacks it once into its private cache and runs the model's stub on the
environment's interpreter; two models naming the same archive share one unpacked copy.

The archive is a small virtual environment made here (its `bin/python3` links to this test's
base interpreter; a `.pth` file adds this test venv's packages, for NumPy), packed with tarfile.
"""

import os
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import textwrap

import numpy as np
import pytest
import tritonclient.http as httpclient

from nereid_util import http_json, managed_server

MODEL = textwrap.dedent("""
    import sys
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "PREFIX", np.array([sys.prefix.encode()], dtype=np.object_))]) for _ in requests]
    """)


def config(name, env):
    return textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "PREFIX" data_type: TYPE_STRING dims: [ 1 ] }} ]
        parameters {{ key: "EXECUTION_ENV_PATH" value: {{ string_value: "{env}" }} }}
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        """)


def packed_env(work):
    """A .tar.gz of a virtual environment that can import this test venv's packages."""
    env = work / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    site = env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "suite_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    archive = work / "env.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(env, arcname=".")
    return archive


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    work = tmp_path_factory.mktemp("env_archive")
    archive = packed_env(work)
    repo = work / "repo"
    for name, env in (("py_packed", "$$TRITON_MODEL_DIRECTORY/env.tar.gz"),
                      ("py_packed_too", "$$TRITON_MODEL_DIRECTORY/../py_packed/env.tar.gz")):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(MODEL)
        (repo / name / "config.pbtxt").write_text(config(name, env))
    (repo / "py_packed" / "env.tar.gz").write_bytes(archive.read_bytes())
    (repo / "py_broken").mkdir()
    (repo / "py_broken" / "1").mkdir()
    (repo / "py_broken" / "1" / "model.py").write_text(MODEL)
    (repo / "py_broken" / "not_gzip.tgz").write_bytes(b"this is not an archive")
    (repo / "py_broken" / "config.pbtxt").write_text(
        config("py_broken", "$$TRITON_MODEL_DIRECTORY/not_gzip.tgz"))
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), [], "server_env_archive")


def prefix(server, model):
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    x = httpclient.InferInput("X", [1], "INT32")
    x.set_data_from_numpy(np.array([1], dtype=np.int32))
    return client.infer(model, [x]).as_numpy("PREFIX")[0].decode()


def test_models_run_on_the_unpacked_environment(server):
    cache = os.path.join(os.path.realpath(tempfile.gettempdir()), f"nereid-python-envs-{os.geteuid()}")
    first = prefix(server, "py_packed")
    assert os.path.realpath(first).startswith(cache + os.sep), first
    assert os.path.isfile(os.path.join(first, ".nereid-unpacked")), first
    assert os.stat(cache).st_mode & 0o777 == 0o700
    # The other model names the same archive (through another path): the same unpacked copy.
    assert prefix(server, "py_packed_too") == first


def test_a_broken_archive_fails_the_load_naming_it(server):
    status, rows = http_json(server.http_url, "POST", "/v2/repository/index", {})
    assert status == 200
    row = next(r for r in rows if r["name"] == "py_broken")
    assert row["state"] == "UNAVAILABLE", row
    assert "not_gzip.tgz" in row["reason"] and "is not a gzip tar archive" in row["reason"], row
