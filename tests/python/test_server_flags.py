"""Triton's repository and server flags (issue 36): `--exit-on-error` (on by default).

`py_params` answers with the parameters its request carried (as JSON in OUT).

- `--exit-on-error`: a repository with one broken model stops `serve` (as it stops Triton) unless
  `--exit-on-error=false`.
"""

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from nereid_util import NEREID_BIN, free_port, loopback_listen_args
from test_python_parameters import PARAMS, config
from triton_util import nereid_like_triton


def write_repo(path, broken=False):
    """`py_params` (and with `broken`, `py_broken`, whose config names an unknown field)."""
    models = [("py_params", PARAMS, "")]
    if broken:
        models.append(("py_broken", PARAMS, "not_a_config_field: 1\n"))
    for name, code, extra in models:
        (path / name / "1").mkdir(parents=True)
        (path / name / "1" / "model.py").write_text(code)
        (path / name / "config.pbtxt").write_text(config(name) + extra)
    return path


def inputs(module):
    tensor = module.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], dtype=np.int32))
    return [tensor]


def seen(result):
    return json.loads(result.as_numpy("OUT")[0])


def grpc_seen(server, headers, parameters=None):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        return seen(client.infer("py_params", inputs(grpcclient), headers=dict(headers),
                                 parameters=parameters))
    finally:
        client.close()


# ---------------------------------------------------------------------------------------------
# --exit-on-error


def start_and_wait(args, deadline_s=90):
    """Runs a server until it exits or serves; (exit code or None if still running, output)."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        proc.wait(timeout=deadline_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None, proc.stdout.read().decode(errors="replace")
    return proc.returncode, proc.stdout.read().decode(errors="replace")


def test_a_broken_model_stops_serve_by_default(tmp_path):
    repo = write_repo(tmp_path / "repo", broken=True)
    code, output = start_and_wait([NEREID_BIN, "serve", "--model-repository", str(repo),
                                   *loopback_listen_args(free_port(), free_port(), free_port())])
    assert code == 1, output[-3000:]
    assert "--exit-on-error" in output and "py_broken" in output, output[-3000:]


def test_exit_on_error_false_serves_the_models_that_loaded(tmp_path):
    server = nereid_like_triton(write_repo(tmp_path / "repo", broken=True), tmp_path,
                                ["--exit-on-error=false", "--strict-readiness=false"],
                                name="lenient").start()
    try:
        assert grpc_seen(server, {}, {"ok": True}) == {"ok": True}
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert not client.is_model_ready("py_broken")
        client.close()
    finally:
        assert server.stop() == 0


def test_triton_also_stops_on_a_broken_model(tmp_path):
    from triton_util import TRITON_BIN, TritonServer
    if not Path(TRITON_BIN).exists():
        pytest.skip(f"{TRITON_BIN} missing: run `make triton-ref`")
    repo = write_repo(tmp_path / "repo", broken=True)
    triton = TritonServer(repo, tmp_path)
    code, output = start_and_wait(triton.args, deadline_s=120)
    assert code not in (None, 0), output[-3000:]
    shutil.rmtree(repo)
