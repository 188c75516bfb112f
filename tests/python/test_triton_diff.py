"""Differential tests: the same requests to the real Triton server (2.51.0) and to Nereid, on
copies of one repository of Python-backend models (scripts/gen_python_models.py), over HTTP and
gRPC; status codes, error messages and bodies must match.

A case listed in KNOWN_DIFFERENCES is a difference kept on purpose: its name must appear in
docs/compatibility.md (section "Differences from Triton 2.51"), with the reason. Everything else
must match. Timings (`ns`, `last_inference`) are masked; JSON objects compare without key order.
"""

import concurrent.futures
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import ROOT, http_raw, wait_until
from triton_util import TRITON_BIN, start_pair

_spec = importlib.util.spec_from_file_location("gen_python_models",
                                               ROOT / "scripts/gen_python_models.py")
gen_python_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_python_models)

# Case name -> why Nereid answers differently on purpose (also in docs/compatibility.md).
KNOWN_DIFFERENCES = {
    "server_metadata": "the version is Nereid's own (the extension lists are equal: "
                       "test_cuda_shared_memory.py checks them)",
    "grpc_server_metadata": "as server_metadata",
    "malformed_json": "the parser's own words after Triton's prefix: Nereid's JSON parser is not "
                      "RapidJSON",
    "index_during_unload": "Nereid takes a model out of service at once (requests in flight "
                           "finish on the old instances), so its index never shows UNLOADING",
    "custom_metrics_after_unload": "Triton 2.51 keeps a Python model's custom metrics on /metrics "
                                   "after the model is unloaded; Nereid removes them with the "
                                   "model instance",
}

MASKED = {"ns", "last_inference"}


def normalize(value):
    if isinstance(value, dict):
        return {k: normalize(v) for k, v in value.items() if k not in MASKED}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    return value


def differences(a, b, path=""):
    """Human-readable paths where `a` (Nereid) and `b` (Triton) differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a:
                out.append(f"{path}.{k}: only Triton has {json.dumps(b[k])[:300]}")
            elif k not in b:
                out.append(f"{path}.{k}: only Nereid has {json.dumps(a[k])[:300]}")
            else:
                out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{i}]")]
    if a == b:
        return []
    return [f"{path or 'value'}: Nereid {json.dumps(a)[:400]} | Triton {json.dumps(b)[:400]}"]


def check_same(name, nereid, triton):
    diff = differences(normalize(nereid), normalize(triton))
    if name in KNOWN_DIFFERENCES:
        return
    assert not diff, f"case {name}: Nereid differs from Triton:\n  " + "\n  ".join(diff)


# --------------------------------------------------------------------------------------------
# The servers


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    assert Path(TRITON_BIN).exists(), f"{TRITON_BIN} missing: run `make triton-ref`"
    work = tmp_path_factory.mktemp("triton_diff")
    repo = gen_python_models.write_repository(work / "repo")
    nereid, triton = start_pair(repo, work,
                                ["--model-control-mode", "explicit", "--load-model", "*"])
    yield nereid, triton
    for s in (nereid, triton):
        s.stop()


def http_answer(server, method, path, body=None, headers=None):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    status, _, data = http_raw(server.http_url, method, path, body, headers)
    try:
        parsed = json.loads(data) if data else None
    except ValueError:
        parsed = data.decode("utf-8", "replace")
    return {"status": status, "body": parsed}


def grpc_answer(server, call):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = call(client)
        if hasattr(result, "get_response"):
            result = result.get_response(as_json=True)
        return {"ok": result}
    except InferenceServerException as e:
        return {"status": str(e.status()), "message": e.message()}
    finally:
        client.close()


def both_http(pair, name, method, path, body=None, headers=None):
    nereid, triton = pair
    answers = [http_answer(s, method, path, body, headers) for s in (nereid, triton)]
    check_same(name, *answers)
    return answers


def both_grpc(pair, name, call):
    answers = [grpc_answer(s, call) for s in pair]
    check_same(name, *answers)
    return answers


# --------------------------------------------------------------------------------------------
# The cases

def t(name, dtype, shape, data, **extra):
    return {"name": name, "datatype": dtype, "shape": shape, "data": data, **extra}


ADD_SUB_OK = {"inputs": [t("INPUT0", "INT32", [4], [1, 2, 3, 4]),
                         t("INPUT1", "INT32", [4], [1, 1, 1, 1])]}

INFER = {
    "infer_int32": ("add_sub", ADD_SUB_OK),
    "infer_output_subset": ("add_sub", {**ADD_SUB_OK, "outputs": [{"name": "OUTPUT1"}]}),
    "infer_fp32": ("identity_fp32", {"inputs": [t("INPUT0", "FP32", [2, 16],
                                                  [i / 4 for i in range(32)])]}),
    "infer_bool": ("identity_bool", {"inputs": [t("INPUT0", "BOOL", [1, 3], [True, False, True])]}),
    "infer_bytes": ("identity_bytes", {"inputs": [t("INPUT0", "BYTES", [1, 2], ["ab", "ü"])]}),
    "infer_request_id": ("add_sub", {**ADD_SUB_OK, "id": "r-42"}),
    "infer_optional_left_out": ("cfg_optional", {"inputs": [t("A", "FP32", [2], [1, 2])]}),
    "infer_priority": ("cfg_priority", {"inputs": [t("INPUT0", "FP32", [1, 2], [1, 2])],
                                        "parameters": {"priority": 1}}),
    "bad_datatype": ("add_sub", {"inputs": [t("INPUT0", "FP32", [4], [1, 2, 3, 4]),
                                            t("INPUT1", "INT32", [4], [1, 1, 1, 1])]}),
    "bad_shape": ("add_sub", {"inputs": [t("INPUT0", "INT32", [5], [1, 2, 3, 4, 5]),
                                         t("INPUT1", "INT32", [4], [1, 1, 1, 1])]}),
    "bad_shape_batched": ("identity_fp32", {"inputs": [t("INPUT0", "FP32", [1, 15], [0.0] * 15)]}),
    "data_shape_mismatch": ("add_sub", {"inputs": [t("INPUT0", "INT32", [4], [1, 2, 3]),
                                                   t("INPUT1", "INT32", [4], [1, 1, 1, 1])]}),
    "missing_input": ("add_sub", {"inputs": [t("INPUT0", "INT32", [4], [1, 2, 3, 4])]}),
    "extra_input": ("add_sub", {"inputs": ADD_SUB_OK["inputs"] + [t("X", "INT32", [4], [1] * 4)]}),
    "unknown_output": ("add_sub", {**ADD_SUB_OK, "outputs": [{"name": "NOPE"}]}),
    "batch_too_large": ("identity_fp32", {"inputs": [t("INPUT0", "FP32", [9, 16], [0.0] * 144)]}),
    "fp16_in_json": ("identity_fp16", {"inputs": [t("INPUT0", "FP16", [1, 2], [1, 2])]}),
    "malformed_json": ("identity_fp32", "{not json"),
    "classification_fp32_batched": ("classify_fp32", {
        "inputs": [t("INPUT0", "FP32", [2, 5], [0.1, 0.7, 0.5, 0.25, 0.05,
                                                -1.5, 2.125, 3.0, -0.75, 1.0])],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 3}}]}),
    "classification_clamped": ("classify_fp32", {
        "inputs": [t("INPUT0", "FP32", [1, 5], [0.5, 0.25, 0.125, 1.0, 2.0])],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 9}}]}),
    "classification_int32": ("classify_int32", {
        "inputs": [t("INPUT0", "INT32", [4], [7, -3, 12, 0])],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]}),
    "classification_binary": ("classify_int32", {
        "inputs": [t("INPUT0", "INT32", [4], [7, -3, 12, 0])],
        "outputs": [{"name": "OUTPUT0",
                     "parameters": {"classification": 4, "binary_data": False}}]}),
    "unknown_model_infer": ("nope", ADD_SUB_OK),
    "unknown_version_infer": ("add_sub/versions/3", ADD_SUB_OK),
}


@pytest.mark.parametrize("name", sorted(INFER))
def test_infer_http(pair, name):
    model, body = INFER[name]
    both_http(pair, name, "POST", f"/v2/models/{model}/infer", body)


ROUTES = {
    "server_metadata": "/v2",
    "health_live": "/v2/health/live",
    "health_ready": "/v2/health/ready",
    "model_metadata": "/v2/models/add_sub",
    "model_metadata_version": "/v2/models/add_sub/versions/1",
    "model_ready": "/v2/models/add_sub/ready",
    "unknown_model_metadata": "/v2/models/nope",
    "unknown_model_ready": "/v2/models/nope/ready",
    "unknown_model_config": "/v2/models/nope/config",
    "unknown_model_stats": "/v2/models/nope/stats",
    "unknown_version_metadata": "/v2/models/add_sub/versions/7",
    "unknown_version_ready": "/v2/models/add_sub/versions/7/ready",
    "unknown_version_config": "/v2/models/add_sub/versions/7/config",
    "unknown_version_stats": "/v2/models/add_sub/versions/7/stats",
}
ROUTES.update({f"config_{m}": f"/v2/models/{m}/config" for m in gen_python_models.MODELS})
ROUTES.update({f"metadata_{m}": f"/v2/models/{m}" for m in gen_python_models.MODELS})


@pytest.mark.parametrize("name", sorted(ROUTES))
def test_routes_http(pair, name):
    both_http(pair, name, "GET", ROUTES[name])


def grpc_infer(model, inputs, outputs=None, **kwargs):
    def call(c):
        ins = []
        for name, dtype, arr in inputs:
            i = grpcclient.InferInput(name, list(arr.shape), dtype)
            i.set_data_from_numpy(arr)
            ins.append(i)
        outs = ([grpcclient.InferRequestedOutput(o) if isinstance(o, str)
                 else grpcclient.InferRequestedOutput(o[0], class_count=o[1]) for o in outputs]
                if outputs else None)
        return c.infer(model, ins, outputs=outs, **kwargs)
    return call


A = np.array([1, 2, 3, 4], dtype=np.int32)
B = np.ones(4, dtype=np.int32)
GRPC = {
    "grpc_server_metadata": lambda c: c.get_server_metadata(as_json=True),
    "grpc_model_metadata": lambda c: c.get_model_metadata("add_sub", as_json=True),
    "grpc_model_config": lambda c: c.get_model_config("identity_fp32", as_json=True),
    "grpc_unknown_model_metadata": lambda c: c.get_model_metadata("nope", as_json=True),
    "grpc_unknown_model_ready": lambda c: c.is_model_ready("nope"),
    "grpc_unknown_version_ready": lambda c: c.is_model_ready("add_sub", "7"),
    "grpc_unknown_model_config": lambda c: c.get_model_config("nope", as_json=True),
    "grpc_unknown_model_stats": lambda c: c.get_inference_statistics("nope", as_json=True),
    "grpc_infer_int32": grpc_infer("add_sub", [("INPUT0", "INT32", A), ("INPUT1", "INT32", B)]),
    "grpc_infer_subset": grpc_infer("add_sub", [("INPUT0", "INT32", A), ("INPUT1", "INT32", B)],
                                    ["OUTPUT0"]),
    "grpc_infer_fp16": grpc_infer("identity_fp16",
                                  [("INPUT0", "FP16", np.array([[1.5, -2]], dtype=np.float16))]),
    "grpc_infer_bytes": grpc_infer("identity_bytes",
                                   [("INPUT0", "BYTES", np.array([[b"x", b"yz"]], dtype=object))]),
    "grpc_bad_datatype": grpc_infer("add_sub", [("INPUT0", "INT64", A.astype(np.int64)),
                                                ("INPUT1", "INT32", B)]),
    "grpc_bad_shape": grpc_infer("add_sub", [("INPUT0", "INT32", np.arange(5, dtype=np.int32)),
                                             ("INPUT1", "INT32", B)]),
    "grpc_missing_input": grpc_infer("add_sub", [("INPUT0", "INT32", A)]),
    "grpc_unknown_output": grpc_infer("add_sub", [("INPUT0", "INT32", A), ("INPUT1", "INT32", B)],
                                      ["NOPE"]),
    "grpc_batch_too_large": grpc_infer("identity_fp32",
                                       [("INPUT0", "FP32", np.zeros((9, 16), np.float32))]),
    "grpc_unknown_model_infer": grpc_infer("nope", [("INPUT0", "INT32", A)]),
    "grpc_classification_batched": grpc_infer(
        "classify_fp32",
        [("INPUT0", "FP32", np.array([[0.1, 0.7, 0.5, 0.25, 0.05],
                                      [3.0, -1.5, 2.125, 0.0, 1.0]], np.float32))],
        [("OUTPUT0", 2)]),
    "grpc_classification_int32": grpc_infer(
        "classify_int32", [("INPUT0", "INT32", np.array([7, -3, 12, 0], np.int32))],
        [("OUTPUT0", 6)]),
}


@pytest.mark.parametrize("name", sorted(GRPC))
def test_grpc(pair, name):
    both_grpc(pair, name, GRPC[name])


def test_statistics_after_rejected_requests(pair):
    """Requests refused before execution leave `fail` at 0; successes are counted."""
    for name in ("bad_shape", "missing_input", "infer_int32", "infer_int32"):
        model, body = INFER[name]
        for s in pair:
            http_answer(s, "POST", f"/v2/models/{model}/infer", body)
    answers = both_http(pair, "stats_add_sub", "GET", "/v2/models/add_sub/stats")
    stats = answers[0]["body"]["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] >= 2


def stream_results(server, model, requests):
    """Sends `requests` (list of (inputs, kwargs)) on one stream; returns the responses as
    JSON (or error strings) in arrival order, after the last one."""
    import queue

    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    expected = 0
    try:
        for inputs, kwargs, n in requests:
            ins = []
            for name, dtype, arr in inputs:
                i = grpcclient.InferInput(name, list(arr.shape), dtype)
                i.set_data_from_numpy(arr)
                ins.append(i)
            client.async_stream_infer(model, ins, **kwargs)
            expected += n
        out = []
        for _ in range(expected):
            result, error = got.get(timeout=30)
            if error is not None:
                out.append({"error": error.message()})
            else:
                r = result.get_response(as_json=True)
                out.append({o["name"]: result.as_numpy(o["name"]).tolist() for o in r["outputs"]})
        return out
    finally:
        client.stop_stream()
        client.close()


def seq(value, cid, start=False, end=False):
    ins = [("INPUT", "INT32", np.array([[value]], np.int32))]
    return ins, {"sequence_id": cid, "sequence_start": start, "sequence_end": end}, 1


def test_sequence_over_stream(pair):
    """START/END come from the sequence batcher's control inputs, not from the client."""
    requests = [seq(1, 7, start=True), seq(2, 7), seq(3, 7, end=True),
                seq(5, 8)]  # 8 never started: an error
    answers = [stream_results(s, "sequence_acc", requests) for s in pair]
    check_same("sequence_stream", *answers)
    assert answers[1][:3] == [{"OUTPUT": [[1]]}, {"OUTPUT": [[3]]}, {"OUTPUT": [[6]]}]


def test_decoupled_over_stream(pair):
    requests = [([("IN", "INT32", np.array([4, 5, 6], np.int32))], {}, 3)]
    answers = [stream_results(s, "repeat_decoupled", requests) for s in pair]
    check_same("decoupled_stream", *answers)
    assert answers[1] == [{"OUT": [4]}, {"OUT": [5]}, {"OUT": [6]}]


def index_settled(server):
    """The repository index once no model is LOADING/UNLOADING."""
    def settled():
        rows = http_answer(server, "POST", "/v2/repository/index", {})["body"]
        return rows if all(r.get("state") not in ("LOADING", "UNLOADING") for r in rows) else None
    return wait_until(settled, 60, f"{server.name} index settled")


def test_repository_control(pair):
    both_http(pair, "load_unknown_model", "POST", "/v2/repository/models/nope/load", {})
    both_grpc(pair, "grpc_load_unknown_model", lambda c: c.load_model("nope"))
    both_http(pair, "unload_unknown_model", "POST", "/v2/repository/models/nope/unload", {})
    both_http(pair, "unload", "POST", "/v2/repository/models/identity_bool/unload", {})
    both_http(pair, "index_during_unload", "POST", "/v2/repository/index", {})
    check_same("index_after_unload", *[index_settled(s) for s in pair])
    both_http(pair, "unload_again", "POST", "/v2/repository/models/identity_bool/unload", {})
    both_grpc(pair, "grpc_unload_again", lambda c: c.unload_model("identity_bool"))
    both_http(pair, "infer_unloaded", "POST", "/v2/models/identity_bool/infer",
              INFER["infer_bool"][1])
    both_http(pair, "infer_unloaded_bad_input", "POST", "/v2/models/identity_bool/infer",
              {"inputs": []})
    both_http(pair, "ready_unloaded", "GET", "/v2/models/identity_bool/ready")
    both_http(pair, "stats_unloaded", "GET", "/v2/models/identity_bool/stats")
    both_http(pair, "reload", "POST", "/v2/repository/models/identity_bool/load", {})
    both_http(pair, "infer_reloaded", "POST", "/v2/models/identity_bool/infer",
              INFER["infer_bool"][1])


def test_system_shared_memory(pair):
    """One region (a POSIX shared memory object on this host) registered with both servers under
    the same name: registration answers, status, and inference reading from and writing to it."""
    import uuid
    import tritonclient.utils.shared_memory as shm
    key = f"/nereid_diff_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("diff", key, 256)
    try:
        x = np.arange(16, dtype=np.float32).reshape(1, 16)
        shm.set_shared_memory_region(handle, [x])
        region = "/v2/systemsharedmemory/region/diff"
        both_http(pair, "shm_register", "POST", f"{region}/register",
                  {"key": key, "offset": 0, "byte_size": 256})
        both_http(pair, "shm_register_again", "POST", f"{region}/register",
                  {"key": key, "offset": 0, "byte_size": 256})
        both_http(pair, "shm_register_no_key", "POST", "/v2/systemsharedmemory/region/x/register",
                  {"byte_size": 16})
        both_http(pair, "shm_status", "GET", "/v2/systemsharedmemory/status")
        both_http(pair, "shm_status_unknown", "GET", "/v2/systemsharedmemory/region/nope/status")

        def infer(name, in_params, out_params=None):
            body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                                "parameters": in_params}]}
            if out_params is not None:
                body["outputs"] = [{"name": "OUTPUT0", "parameters": out_params}]
            both_http(pair, name, "POST", "/v2/models/identity_fp32/infer", body)

        at = {"shared_memory_region": "diff", "shared_memory_byte_size": 64}
        infer("shm_infer", at, {"shared_memory_region": "diff", "shared_memory_byte_size": 64,
                                "shared_memory_offset": 128})
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(handle, np.float32, [1, 16], offset=128), x)
        infer("shm_infer_unknown_region", {**at, "shared_memory_region": "nope"})
        infer("shm_infer_offset_past_end", {**at, "shared_memory_offset": 224})
        infer("shm_infer_byte_size_mismatch", {**at, "shared_memory_byte_size": 60})
        both_http(pair, "shm_unregister", "POST", "/v2/systemsharedmemory/unregister")
        both_http(pair, "shm_status_after_unregister", "GET", "/v2/systemsharedmemory/status")
    finally:
        for server in pair:
            http_raw(server.http_url, "POST", "/v2/systemsharedmemory/unregister")
        shm.destroy_shared_memory_region(handle)


CUSTOM_METRICS_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.counter_family = pb_utils.MetricFamily(
            name="diff_requests", description="Requests seen", kind=pb_utils.MetricFamily.COUNTER)
        self.counter = self.counter_family.Metric(labels=labels)
        self.gauge_family = pb_utils.MetricFamily(
            name="diff_last_input", description="The last input", kind=pb_utils.MetricFamily.GAUGE)
        self.gauge = self.gauge_family.Metric(labels={"kind": "last", **labels})
        self.histogram_family = pb_utils.MetricFamily(
            name="diff_inputs", description="Inputs by size", kind=pb_utils.MetricFamily.HISTOGRAM)
        self.histogram = self.histogram_family.Metric(labels=labels, buckets=[0.25, 1.0, 10.0])

    def execute(self, requests):
        out = []
        for request in requests:
            x = float(pb_utils.get_input_tensor_by_name(request, "x").as_numpy()[0])
            self.counter.increment(x)
            self.gauge.set(x)
            self.gauge.increment(-0.5)
            self.histogram.observe(x)
            out.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("count", np.array([self.counter.value()], np.float32))]))
        return out
"""

CUSTOM_METRICS_CONFIG = """
name: "py_custom_metrics"
backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "count" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""


def custom_metric_lines(server):
    """The `diff_*` lines of /metrics (HELP, TYPE and series), in a canonical order: Triton writes
    a histogram's `_count` and `_sum` before its buckets, Nereid after."""
    status, _, body = http_raw(f"127.0.0.1:{server.metrics_port}", "GET", "/metrics")
    assert status == 200
    return sorted(line for line in body.decode().splitlines()
                  if line.startswith(("diff_", "# HELP diff_", "# TYPE diff_")))


def test_custom_metrics(pair):
    """A Python model's counter, gauge and histogram (`pb_utils.MetricFamily`), shared by its two
    instances, read the same on both servers' /metrics."""
    for server in pair:
        model = server.repo / "py_custom_metrics"
        (model / "1").mkdir(parents=True)
        (model / "1" / "model.py").write_text(CUSTOM_METRICS_MODEL)
        (model / "config.pbtxt").write_text(CUSTOM_METRICS_CONFIG)
    both_http(pair, "custom_metrics_load", "POST", "/v2/repository/models/py_custom_metrics/load", {})
    for i, x in enumerate([0.125, 2, 4.5, 30]):
        both_http(pair, f"custom_metrics_infer_{i}", "POST", "/v2/models/py_custom_metrics/infer",
                  {"inputs": [t("x", "FP32", [1], [x])]})
    lines = [custom_metric_lines(s) for s in pair]
    assert 'diff_requests{model="py_custom_metrics",version="1"} 36.625' in lines[0], lines[0]
    check_same("custom_metrics", *lines)
    both_http(pair, "custom_metrics_unload", "POST", "/v2/repository/models/py_custom_metrics/unload",
              {})
    nereid, triton = pair
    wait_until(lambda: not custom_metric_lines(nereid), 30, "Nereid's custom metrics gone")
    check_same("custom_metrics_after_unload", [], custom_metric_lines(triton))  # Triton keeps them


def test_known_differences_are_documented():
    doc = (ROOT / "docs/compatibility.md").read_text()
    section = doc.split("## Differences from Triton 2.51", 1)
    assert len(section) == 2, "docs/compatibility.md lacks 'Differences from Triton 2.51'"
    missing = [n for n in KNOWN_DIFFERENCES if f"`{n}`" not in section[1]]
    assert not missing, f"known differences not in docs/compatibility.md: {missing}"


def test_decoupled_response_statistics(pair):
    """A decoupled model's statistics after streamed requests (one answered by the final flag
    alone, two with one response per element) match Triton's, `response_stats` included: Triton
    2.51's Python backend reports no per-response statistics, so the map stays empty there and in
    Nereid (docs/compatibility.md, Statistics)."""
    requests = [([("IN", "INT32", np.array([], np.int32))], {}, 0),
                ([("IN", "INT32", np.array([4, 5, 6], np.int32))], {}, 3),
                ([("IN", "INT32", np.array([7], np.int32))], {}, 1)]

    def counted(server):
        body = http_answer(server, "GET", "/v2/models/repeat_decoupled/stats")["body"]
        return body["model_stats"][0]["inference_count"]

    # Other cases stream to this model too, and Triton counts a decoupled request a moment after
    # its last response: wait for Nereid's 3 more, then for Triton to count as many.
    nereid, triton = pair
    before = wait_until(lambda: counted(nereid) == counted(triton) and [counted(nereid)], 30,
                        "both servers counted the earlier requests")[0]
    for s in pair:
        stream_results(s, "repeat_decoupled", requests)
    wait_until(lambda: counted(nereid) == before + 3, 30, "Nereid counted 3 more requests")
    wait_until(lambda: counted(triton) == before + 3, 30, "Triton counted as many requests")
    answers = both_http(pair, "stats_repeat_decoupled", "GET",
                        "/v2/models/repeat_decoupled/stats")
    reported = answers[1]["body"]["model_stats"][0]
    assert reported["response_stats"] == {}, "Triton now reports response_stats: count them too"
    both_grpc(pair, "grpc_stats_repeat_decoupled",
              lambda c: c.get_inference_statistics("repeat_decoupled", as_json=True))


def test_ragged_requests_batch_into_one_python_execution(pair):
    """Ragged batching on the Python backend: three concurrent requests whose ragged INPUT
    lengths differ (2, 3, 5) wait out the 1 s queue delay and reach the model in one execute
    call (BATCH 3, one execution); the model gets each request's own INPUT and no batch input
    (NINPUTS 1); every answer and the execution count match Triton's."""
    def run(server):
        def one(n):
            with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as c:
                i = httpclient.InferInput("INPUT", [1, n], "FP32")
                i.set_data_from_numpy(np.arange(n, dtype=np.float32).reshape(1, n))
                r = c.infer("ragged_sum_py", [i])
                return [r.as_numpy(o).tolist() for o in ("SUM", "NINPUTS", "BATCH")]

        def executions():
            body = http_answer(server, "GET", "/v2/models/ragged_sum_py/stats")["body"]
            return body["model_stats"][0]["execution_count"]

        before = executions()
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            answers = list(pool.map(one, [2, 3, 5]))
        return answers, executions() - before

    nereid, triton = (run(s) for s in pair)
    assert triton == ([[[[1.0]], [[1]], [[3]]], [[[3.0]], [[1]], [[3]]],
                       [[[10.0]], [[1]], [[3]]]], 1), f"Triton answered {triton}"
    assert nereid == triton


# --------------------------------------------------------------------------------------------
# Ensembles with a decoupled step (scripts/gen_models.py write_decoupled_ensemble_models): written
# into both repositories and loaded explicitly (ens_dec_mixed must fail, and `--load-model *`
# would stop Triton at start).

@pytest.fixture(scope="module")
def decoupled_ensembles(pair):
    from nereid_util import gen_models
    for server in pair:
        gen_models.write_decoupled_ensemble_models(server.repo)
    for name in ("ens_dec", "ens_dec_claims"):
        both_http(pair, f"load_{name}", "POST", f"/v2/repository/models/{name}/load", {})
    return pair


def stream_with_flags(server, model, values):
    """One request for `model` (IN = `values`) on a gRPC stream that asks for empty final
    responses: ([OUT values] or {} for a flag-only response, final flag) per response, or
    {"error": message}; up to the final flag or an error."""
    import queue
    got = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    out = []
    try:
        i = grpcclient.InferInput("IN", [len(values)], "INT32")
        i.set_data_from_numpy(np.array(values, dtype=np.int32))
        client.async_stream_infer(model, [i], enable_empty_final_response=True)
        while True:
            result, error = got.get(timeout=30)
            if error is not None:
                out.append({"error": error.message()})
                return out
            response = result.get_response(as_json=True)
            final = response["parameters"]["triton_final_response"]["bool_param"]
            outputs = {o["name"] for o in response.get("outputs", [])}
            out.append((result.as_numpy("OUT").tolist() if "OUT" in outputs else {}, final))
            if final:
                return out
    finally:
        client.stop_stream()
        client.close()


def final_flag_merged(answers):
    """A stream's answers with a trailing flag-only final response folded into the response
    before it. Triton 2.51 puts the final flag on the response that leaves nothing in flight, so
    whether it rides on the last data response or comes alone depends on when the decoupled
    step's own final flag arrives (both happen on the same input); clients that do not ask for
    empty final responses see the same either way."""
    if len(answers) >= 2 and answers[-1] == ({}, True) and isinstance(answers[-2], tuple) \
            and not answers[-2][1]:
        return answers[:-2] + [(answers[-2][0], True)]
    return answers


def test_decoupled_ensemble_streams_like_triton(decoupled_ensembles):
    """Every response of the decoupled step runs the next step once and goes out as it
    completes, the last with the final flag (a flag-only final response when the decoupled step
    sends nothing)."""
    pair = decoupled_ensembles
    for values in ([1, 2, 3], [5], []):
        answers = [final_flag_merged(stream_with_flags(s, "ens_dec", values)) for s in pair]
        check_same(f"ensemble_decoupled_stream_{len(values)}", *answers)
    assert answers[1] == [({}, True)]
    assert final_flag_merged(stream_with_flags(pair[1], "ens_dec", [1, 2, 3])) == [
        ([2], False), ([4], False), ([6], True)]


def test_decoupled_ensemble_step_error_like_triton(decoupled_ensembles):
    """dec_repeat answers an error for -1: the stream ends with the error and no final flag; a
    response completed before it may go out first ([2]: on Triton it depends on timing, on
    Nereid it always does), none after it. The model's own text is in both messages; the
    prefixes are each server's."""
    for server in decoupled_ensembles:
        *before, error = stream_with_flags(server, "ens_dec", [1, -1, 3])
        assert "dec_repeat refuses -1" in error["error"], (server.name, error)
        assert before in ([], [([2], False)]), (server.name, before)


def test_decoupled_ensemble_config_and_generate_stream_like_triton(decoupled_ensembles):
    """The config's decoupled field is the load's (ens_dec_claims' file says decoupled over a
    plain step: false); generate_stream sends one event per response (compared by outputs:
    Triton's events of an ensemble also carry sequence parameters)."""
    pair = decoupled_ensembles
    for model in ("ens_dec", "ens_dec_claims"):
        policies = [http_answer(s, "GET", f"/v2/models/{model}/config")["body"]
                    ["model_transaction_policy"] for s in pair]
        check_same(f"ensemble_decoupled_config_{model}", *policies)
        grpc_policies = [grpc_answer(s, lambda c: c.get_model_config(model, as_json=True))
                         ["ok"]["config"]["model_transaction_policy"] for s in pair]
        check_same(f"grpc_ensemble_decoupled_config_{model}", *grpc_policies)
    assert policies == [{"decoupled": False}] * 2
    events = []
    for server in pair:
        status, _, body = http_raw(server.http_url, "POST", "/v2/models/ens_dec/generate_stream",
                                   json.dumps({"IN": [1, 2, 3]}).encode())
        chunks = [json.loads(c[len("data: "):]) for c in body.decode().split("\n\n") if c]
        events.append((status, [(c["model_name"], c["OUT"]) for c in chunks]))
    check_same("ensemble_decoupled_generate_stream", *events)
    assert events[1] == (200, [("ens_dec", 2), ("ens_dec", 4), ("ens_dec", 6)])


def test_decoupled_ensemble_refusals_like_triton(decoupled_ensembles):
    """A step mixing decoupled origins fails to load with Triton's sentence (Nereid's reason
    then says which step reads what); unary calls answer Triton's status codes."""
    pair = decoupled_ensembles
    nereid, triton = [http_answer(s, "POST", "/v2/repository/models/ens_dec_mixed/load", {})
                      for s in pair]
    assert nereid["status"] == triton["status"] == 400
    reason = triton["body"]["error"].split(": ", 1)[1].strip()
    assert reason == ("in ensemble ens_dec_mixed, step of model 'ens_dec_mixed' receives inputs "
                      "originated from different decoupled models"), triton
    assert reason in nereid["body"]["error"], nereid
    body = {"inputs": [t("IN", "INT32", [2], [1, 2])]}
    answers = [http_answer(s, "POST", "/v2/models/ens_dec/infer", body) for s in pair]
    assert answers[0]["status"] == answers[1]["status"] == 501, answers
    grpc = [grpc_answer(s, grpc_infer("ens_dec", [("IN", "INT32", np.array([1], np.int32))]))
            for s in pair]
    assert grpc[0]["status"] == grpc[1]["status"] == "StatusCode.UNIMPLEMENTED", grpc
    # Each frontend's own words, as Triton's.
    assert answers[0]["body"]["error"] == answers[1]["body"]["error"] == (
        "HTTP end point doesn't support models with decoupled transaction policy"), answers
    assert grpc[0]["message"] == grpc[1]["message"] == (
        "ModelInfer RPC doesn't support models with decoupled transaction policy"), grpc


_seq_spec = importlib.util.spec_from_file_location("gen_sequence_models",
                                                   ROOT / "scripts/gen_sequence_models.py")
gen_sequence_models = importlib.util.module_from_spec(_seq_spec)
_seq_spec.loader.exec_module(gen_sequence_models)


@pytest.fixture(scope="module")
def sequence_pair(tmp_path_factory):
    """Triton and Nereid on Python-backend sequence models (scripts/gen_sequence_models.py)."""
    assert Path(TRITON_BIN).exists(), f"{TRITON_BIN} missing: run `make triton-ref`"
    work = tmp_path_factory.mktemp("triton_diff_sequence")
    repo = gen_sequence_models.write_python_repository(work / "repo")
    nereid, triton = start_pair(repo, work, [])
    yield nereid, triton
    for s in (nereid, triton):
        s.stop()


def test_direct_slot_padding_as_the_model_sees_it(sequence_pair):
    """Direct strategy, one instance of 4 slots, one client at a time: sequences a, b, c take
    slots 0, 1, 2 (a warm-up sample that sets the controls by name loaded the model). When only
    c (slot 2) or only b (slot 1) has a request, the model's execute gets that many rows, the
    slots below as requests whose READY (and START) is 0; every answer matches Triton's."""
    def run(server):
        with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as c:
            def one(sid, **flags):
                i = httpclient.InferInput("INPUT", [1, 1], "INT32")
                i.set_data_from_numpy(np.array([[1]], dtype=np.int32))
                r = c.infer("seq_slots_py", [i], sequence_id=sid, **flags)
                return [int(r.as_numpy(o)[0, 0]) for o in ("ROWS", "READY_ROWS", "MY_READY", "MY_START")]
            steps = [(11, {"sequence_start": True}), (12, {"sequence_start": True}),
                     (13, {"sequence_start": True}), (13, {}), (12, {}),
                     (11, {"sequence_end": True}), (13, {}), (12, {"sequence_end": True}),
                     (13, {"sequence_end": True})]
            return [one(sid, **flags) for sid, flags in steps]

    nereid, triton = (run(s) for s in sequence_pair)
    assert triton[3] == [3, 1, 1, 0], f"Triton padded slots 0 and 1: {triton}"
    assert nereid == triton


def test_initial_state_from_a_data_file(sequence_pair):
    """A state whose initial_state names a data file under the model's initial_state/ folder
    (INT32 100) reaches a Python model as its state input; Triton 2.51's Python backend never
    updates implicit state, so every request of the sequence sees it, on Nereid as on Triton."""
    def run(server):
        with httpclient.InferenceServerClient(server.http_url, network_timeout=60) as c:
            out = []
            for flags in ({"sequence_start": True}, {}, {"sequence_end": True}):
                i = httpclient.InferInput("INPUT", [1], "INT32")
                i.set_data_from_numpy(np.array([5], dtype=np.int32))
                r = c.infer("seq_init_py", [i], sequence_id=21, **flags)
                out += r.as_numpy("OUTPUT").tolist()
            return out

    nereid, triton = (run(s) for s in sequence_pair)
    assert triton == [gen_sequence_models.INITIAL_STATE + 5] * 3, f"Triton answered {triton}"
    assert nereid == triton
