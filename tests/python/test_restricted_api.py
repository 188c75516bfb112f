"""Restricted APIs (Triton's `--http-restricted-api` / `--grpc-restricted-protocol`): endpoint
categories behind a header. A server with model-repository and inference restricted refuses
them without the header (HTTP 403, gRPC UNAVAILABLE, Triton's messages), accepts them with it,
and leaves the other categories open; bad flag values stop the server before it listens. A
small differential test starts the real Triton 2.51 with the same flags when it is installed
(`make triton-ref`).
"""

import importlib.util
import queue
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import (NEREID_BIN, ROOT, Server, assert_http_error, http_json, http_raw,
                         managed_server)

HTTP_KEY, GRPC_KEY, SECRET = "admin-key", "infer-key", "s3cret"
GRPC_HEADER = f"triton-grpc-protocol-{GRPC_KEY}"
HTTP_REFUSAL = f"This API is restricted, expecting header '{HTTP_KEY}'"
GRPC_REFUSAL = f"This protocol is restricted, expecting header '{GRPC_HEADER}'"
# Triton's spelling; Nereid's own tests also use the alias --grpc-restricted-api.
TRITON_RESTRICTIONS = [
    "--http-restricted-api", f"model-repository,inference:{HTTP_KEY}={SECRET}",
    "--grpc-restricted-protocol", f"model-repository:{GRPC_KEY}={SECRET}",
    "--grpc-restricted-protocol", f"inference:{GRPC_KEY}={SECRET}",
]
RESTRICTIONS = TRITON_RESTRICTIONS[:2] + ["--grpc-restricted-api"] + TRITON_RESTRICTIONS[3:]
SIMPLE_BODY = {"inputs": [
    {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
    {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
]}


@pytest.fixture(scope="module")
def restricted(test_repo, tmp_path_factory):
    yield from managed_server(test_repo, tmp_path_factory.mktemp("logs"), RESTRICTIONS,
                              "server_restricted")


def simple_inputs(client_module):
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        i = client_module.InferInput(name, [1, 16], "INT32")
        i.set_data_from_numpy(np.ones((1, 16), np.int32))
        inputs.append(i)
    return inputs


def test_http_restricted_categories_need_the_header(restricted):
    url = restricted.http_url
    for method, path, body in [
        ("POST", "/v2/repository/index", {}),
        ("POST", "/v2/repository/models/simple/load", {}),
        ("POST", "/v2/models/simple/infer", SIMPLE_BODY),
        ("POST", "/v2/models/no_such_model/infer", SIMPLE_BODY),
        ("POST", "/v2/models/simple/generate", {}),
        # Like Triton, the restriction is checked before the method.
        ("GET", "/v2/repository/index", None),
    ]:
        answer = http_json(url, method, path, body)
        assert answer[1] == {"error": HTTP_REFUSAL}, (path, answer)
        assert_http_error(answer, 403, HTTP_REFUSAL)
        # The wrong value is refused the same way.
        answer = http_json(url, method, path, body, {HTTP_KEY: SECRET.upper()})
        assert_http_error(answer, 403, HTTP_REFUSAL)

    status, body = http_json(url, "POST", "/v2/repository/index", {}, {HTTP_KEY: SECRET})
    assert status == 200 and {"name": "simple", "version": "1", "state": "READY"} in body
    # Header names are case-insensitive, values are not.
    status, body = http_json(url, "POST", "/v2/models/simple/infer", SIMPLE_BODY,
                             {"Admin-Key": SECRET})
    assert status == 200 and body["outputs"][0]["data"] == [2] * 16
    # Unknown paths stay 404 whatever is restricted.
    assert http_raw(url, "POST", "/v2/models/simple/nope", b"{}")[0] == 404


def test_http_open_categories_are_untouched(restricted):
    url = restricted.http_url
    for path in ["/v2/health/live", "/v2/health/ready", "/v2", "/v2/models/simple",
                 "/v2/models/simple/ready", "/v2/models/simple/config", "/v2/models/stats",
                 "/v2/trace/setting", "/v2/logging", "/v2/systemsharedmemory/status"]:
        status, body = http_json(url, "GET", path)
        assert status == 200, (path, status, body)


def test_tritonclient_http(restricted):
    c = httpclient.InferenceServerClient(restricted.http_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            c.infer("simple", simple_inputs(httpclient))
        assert e.value.status() == "403" and e.value.message() == HTTP_REFUSAL
        with pytest.raises(InferenceServerException) as e:
            c.get_model_repository_index()
        assert e.value.status() == "403" and e.value.message() == HTTP_REFUSAL
        result = c.infer("simple", simple_inputs(httpclient), headers={HTTP_KEY: SECRET})
        assert (result.as_numpy("OUTPUT0") == 2).all()
        assert c.is_server_ready() and c.get_model_config("simple")["name"] == "simple"
    finally:
        c.close()


def test_tritonclient_grpc(restricted):
    c = grpcclient.InferenceServerClient(restricted.grpc_url)
    try:
        for call in (lambda h: c.infer("simple", simple_inputs(grpcclient), headers=h),
                     lambda h: c.get_model_repository_index(headers=h),
                     lambda h: c.unload_model("no_such_model", headers=h)):
            for headers in (None, {GRPC_KEY: SECRET}, {GRPC_HEADER: "wrong"}):
                with pytest.raises(InferenceServerException) as e:
                    call(headers)
                assert e.value.status() == "StatusCode.UNAVAILABLE", e.value
                assert e.value.message() == GRPC_REFUSAL
        ok = {GRPC_HEADER: SECRET}
        result = c.infer("simple", simple_inputs(grpcclient), headers=ok)
        assert (result.as_numpy("OUTPUT0") == 2).all()
        names = [m.name for m in c.get_model_repository_index(headers=ok).models]
        assert "simple" in names
        # Open categories: health, metadata, config, statistics.
        assert c.is_server_live() and c.is_model_ready("simple")
        assert c.get_model_metadata("simple").name == "simple"
        assert c.get_model_config("simple").config.name == "simple"
        c.get_inference_statistics("simple")
    finally:
        c.close()


def test_grpc_stream_is_refused_at_its_start(restricted):
    results = queue.Queue()
    c = grpcclient.InferenceServerClient(restricted.grpc_url)
    try:
        c.start_stream(callback=lambda result, error: results.put((result, error)))
        try:
            c.async_stream_infer("simple", simple_inputs(grpcclient))
        except InferenceServerException:
            pass  # the refusal ended the stream before the request went out
        _, error = results.get(timeout=30)
        assert error is not None and GRPC_REFUSAL in str(error), error
        c.stop_stream()
        # A queue of its own: the first stream may report its end after the refusal.
        answers = queue.Queue()
        c.start_stream(callback=lambda result, error: answers.put((result, error)),
                       headers={GRPC_HEADER: SECRET})
        c.async_stream_infer("simple", simple_inputs(grpcclient))
        result, error = answers.get(timeout=30)
        assert error is None and (result.as_numpy("OUTPUT0") == 2).all()
        c.stop_stream()
    finally:
        c.close()


@pytest.mark.parametrize("args,needles", [
    (["--http-restricted-api", "inference"], ["--http-restricted-api 'inference'", "malformed",
                                              "<api>[,<api>...]:<key>=<value>"]),
    (["--grpc-restricted-protocol", "inference:k"], ["--grpc-restricted-protocol", "no '='"]),
    (["--http-restricted-api", "inference,metrics:k=v"],
     ["unknown API 'metrics'", "health, metadata, inference, shared-memory, model-config, "
      "model-repository, statistics, trace, logging"]),
    (["--grpc-restricted-api", "health:a=1", "--grpc-restricted-api", "metadata,health:b=2"],
     ["API 'health' is restricted in more than one --grpc-restricted-protocol value"]),
    (["--http-restricted-api", "inference:bad key=v"], ["'bad key' is not a valid header name"]),
])
def test_bad_flags_stop_the_server_before_it_listens(test_repo, args, needles):
    proc = subprocess.run([NEREID_BIN, "serve", "--model-repository", str(test_repo),
                           "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
                           "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1",
                           "--metrics-address", "127.0.0.1", *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    for n in needles:
        assert n in output, (n, output[-2000:])
    assert "listening" not in output.lower(), output[-2000:]


def test_the_env_var_restricts_too(test_repo, tmp_path):
    server = Server(test_repo, tmp_path, name="server_restricted_env")
    env = server.environment()
    env["NEREID_HTTP_RESTRICTED_API"] = f"statistics:{HTTP_KEY}={SECRET};logging:other=1"
    server.environment = lambda: env
    server.start()
    try:
        assert_http_error(http_json(server.http_url, "GET", "/v2/models/stats"), 403,
                          HTTP_REFUSAL)
        assert_http_error(http_json(server.http_url, "GET", "/v2/logging"), 403,
                          "expecting header 'other'")
        assert http_json(server.http_url, "GET", "/v2/models/stats", None,
                         {HTTP_KEY: SECRET})[0] == 200
    finally:
        assert server.stop() == 0


# ---------------------------------------------------------------------------------------------
# Differential: the real Triton with the same flags.


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from triton_util import TRITON_BIN, start_pair
    if not Path(TRITON_BIN).exists():
        pytest.skip(f"{TRITON_BIN} missing: run `make triton-ref`")
    spec = importlib.util.spec_from_file_location("gen_python_models",
                                                  ROOT / "scripts/gen_python_models.py")
    gen_python_models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen_python_models)
    work = tmp_path_factory.mktemp("triton_restricted")
    repo = gen_python_models.write_repository(work / "repo", ["identity_fp32"])
    servers = start_pair(repo, work, TRITON_RESTRICTIONS)
    yield servers
    for s in servers:
        s.stop()


def test_same_answers_as_triton(pair):
    fp32 = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32",
                        "data": [1.0, 2.0]}]}
    cases = [
        ("POST", "/v2/repository/index", {}, None),
        ("GET", "/v2/repository/index", None, None),
        ("POST", "/v2/models/identity_fp32/infer", fp32, None),
        ("POST", "/v2/models/no_such_model/infer", fp32, None),
        ("POST", "/v2/models/identity_fp32/infer", fp32, {HTTP_KEY: "wrong"}),
        ("POST", "/v2/repository/index", {}, {"ADMIN-KEY": SECRET}),
        ("GET", "/v2/models/identity_fp32/ready", None, None),
    ]
    for method, path, body, headers in cases:
        answers = [http_json(s.http_url, method, path, body, headers) for s in pair]
        assert answers[0] == answers[1], (method, path, headers, answers)

    def grpc_answer(server, call):
        c = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            call(c)
            return "ok"
        except InferenceServerException as e:
            return (e.status(), e.message())
        finally:
            c.close()

    x = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    x.set_data_from_numpy(np.ones((1, 2), np.float32))
    calls = [
        lambda c: c.get_model_repository_index(),
        lambda c: c.get_model_repository_index(headers={GRPC_HEADER: SECRET}),
        lambda c: c.get_model_repository_index(headers={GRPC_KEY: SECRET}),
        lambda c: c.infer("no_such_model", [x]),
        lambda c: c.is_server_live(),
        lambda c: c.get_inference_statistics("identity_fp32"),
    ]
    for i, call in enumerate(calls):
        answers = [grpc_answer(s, call) for s in pair]
        assert answers[0] == answers[1], (i, answers)
