"""Triton's trace mode in the tests: a repository of Python models that shows every kind of trace
(a plain model, a BLS caller passing `trace=request.trace()`, an ensemble with a BLS step, a
decoupled model, a decoupled ensemble), the requests that exercise it over HTTP, gRPC and a gRPC
stream, and a reader that turns trace files into one record per trace.

Used by test_tracing.py (Nereid alone) and test_triton_diff_trace.py (Nereid against Triton
2.51)."""

import importlib.util
import json
import queue
import textwrap

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from nereid_util import ROOT, http_raw

_spec = importlib.util.spec_from_file_location("gen_python_models",
                                               ROOT / "scripts/gen_python_models.py")
gen_python_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_python_models)

BLS = textwrap.dedent("""
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                call = pb_utils.InferenceRequest(
                    model_name="add_sub", requested_output_names=["OUTPUT0"],
                    inputs=[pb_utils.get_input_tensor_by_name(r, "INPUT0"),
                            pb_utils.get_input_tensor_by_name(r, "INPUT1")],
                    trace=r.trace())
                response = call.exec()
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                o = pb_utils.get_output_tensor_by_name(response, "OUTPUT0")
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", o.as_numpy())]))
            return out
    """)

BLS_CONFIG = textwrap.dedent("""
    backend: "python"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] },
            { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] } ]
    """)

ENSEMBLE_CONFIG = textwrap.dedent("""
    platform: "ensemble"
    max_batch_size: 0
    input [ { name: "A" data_type: TYPE_INT32 dims: [ 4 ] },
            { name: "B" data_type: TYPE_INT32 dims: [ 4 ] } ]
    output [ { name: "S" data_type: TYPE_INT32 dims: [ 4 ] } ]
    ensemble_scheduling { step [
      { model_name: "add_sub" model_version: -1
        input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
        output_map { key: "OUTPUT0" value: "t" } },
      { model_name: "trace_bls" model_version: -1
        input_map { key: "INPUT0" value: "t" } input_map { key: "INPUT1" value: "B" }
        output_map { key: "OUTPUT0" value: "S" } } ] }
    """)


DOUBLE = textwrap.dedent("""
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", 2 * pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                for r in requests]
    """)

DOUBLE_CONFIG = textwrap.dedent("""
    backend: "python"
    max_batch_size: 0
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """)

# Decoupled: repeat_decoupled answers once per element of IN (then its final flag alone), and
# trace_double runs once per answer.
DECOUPLED_ENSEMBLE_CONFIG = textwrap.dedent("""
    platform: "ensemble"
    max_batch_size: 0
    input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    ensemble_scheduling { step [
      { model_name: "repeat_decoupled" model_version: -1
        input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "R" } },
      { model_name: "trace_double" model_version: -1
        input_map { key: "IN" value: "R" } output_map { key: "OUT" value: "OUT" } } ] }
    """)


def write_repository(path):
    """add_sub, repeat_decoupled, trace_bls (BLS to add_sub), trace_ens (add_sub, then
    trace_bls), trace_double (OUT = 2 IN) and trace_dec_ens (repeat_decoupled, then
    trace_double on each of its responses: a decoupled ensemble)."""
    repo = gen_python_models.write_repository(path, ["add_sub", "repeat_decoupled"])
    for name, config, source in (("trace_bls", BLS_CONFIG, BLS),
                                 ("trace_ens", ENSEMBLE_CONFIG, None),
                                 ("trace_double", DOUBLE_CONFIG, DOUBLE),
                                 ("trace_dec_ens", DECOUPLED_ENSEMBLE_CONFIG, None)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        if source:
            (repo / name / "1" / "model.py").write_text(source)
    return repo


def trace_args(file, *extra, tensors=False):
    levels = ["--trace-config", "level=TENSORS"] if tensors else []
    return ["--trace-config", f"triton,file={file}", "--trace-config", "level=TIMESTAMPS",
            *levels, "--trace-config", "rate=1", *extra]


def _inputs(module, names=("INPUT0", "INPUT1")):
    out = []
    for n in names:
        t = module.InferInput(n, [4], "INT32")
        t.set_data_from_numpy(np.arange(4, dtype=np.int32))
        out.append(t)
    return out


def _dec_ens_input(module):
    t = module.InferInput("IN", [2], "INT32")
    t.set_data_from_numpy(np.array([4, 5], np.int32))
    return [t]


def send_requests(server, decoupled=True):
    """One trace of each kind, in order: add_sub over HTTP (`h1`) and gRPC (`g1`), the BLS
    caller (`b1`), the ensemble (`e1`), two add_sub requests on one gRPC stream (`s1`, `s2`)
    and, with `decoupled`, a decoupled request with two responses on it (`d1`) and a decoupled
    ensemble request with two responses (`de1`: trace_double ran twice)."""
    h = httpclient.InferenceServerClient(server.http_url)
    g = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        h.infer("add_sub", _inputs(httpclient), request_id="h1")
        g.infer("add_sub", _inputs(grpcclient), request_id="g1")
        h.infer("trace_bls", _inputs(httpclient), request_id="b1")
        h.infer("trace_ens", _inputs(httpclient, ("A", "B")), request_id="e1")
        got = queue.Queue()
        g.start_stream(callback=lambda result, error: got.put((result, error)))
        g.async_stream_infer("add_sub", _inputs(grpcclient), request_id="s1")
        g.async_stream_infer("add_sub", _inputs(grpcclient), request_id="s2")
        expected = 2
        if decoupled:
            t = grpcclient.InferInput("IN", [2], "INT32")
            t.set_data_from_numpy(np.array([4, 5], np.int32))
            g.async_stream_infer("repeat_decoupled", [t], request_id="d1")
            g.async_stream_infer("trace_dec_ens", _dec_ens_input(grpcclient), request_id="de1")
            expected += 4
        for _ in range(expected):
            _, error = got.get(timeout=30)
            assert error is None, error
        g.stop_stream()
    finally:
        h.close()
        g.close()


def send_decoupled_ensemble(server):
    """The decoupled ensemble (IN [4, 5]: two responses) on a gRPC stream (`de1`) and through
    HTTP generate_stream (no request id)."""
    g = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        got = queue.Queue()
        g.start_stream(callback=lambda result, error: got.put((result, error)))
        g.async_stream_infer("trace_dec_ens", _dec_ens_input(grpcclient), request_id="de1")
        answers = []
        for _ in range(2):
            result, error = got.get(timeout=30)
            assert error is None, error
            answers.append(result.as_numpy("OUT").tolist())
        assert sorted(answers) == [[8], [10]], answers
        g.stop_stream()
    finally:
        g.close()
    status, _, body = http_raw(server.http_url, "POST", "/v2/models/trace_dec_ens/generate_stream",
                               json.dumps({"IN": [4, 5]}).encode())
    events = [json.loads(c[len("data: "):]) for c in body.decode().split("\n\n") if c]
    assert status == 200 and sorted(e["OUT"] for e in events) == [8, 10], (status, body)


def read_traces(paths):
    """The traces in trace files, by id: {"header": the object with model_name, "stamps":
    timestamp names in file order, "tensors": (activity, tensor name) pairs, "file": which}.
    Every file must be one JSON array of objects that each carry an integer `id`."""
    traces = {}
    for path in paths:
        objects = json.loads(path.read_text())
        assert isinstance(objects, list), f"{path}: not a JSON array"
        for o in objects:
            assert isinstance(o.get("id"), int), f"{path}: object without an integer id: {o}"
            t = traces.setdefault(o["id"], {"header": None, "stamps": [], "tensors": [],
                                            "file": path.name})
            assert t["file"] == path.name, f"trace {o['id']} is split across files"
            if "model_name" in o:
                assert t["header"] is None, f"trace {o['id']} has two headers"
                t["header"] = o
            elif "timestamps" in o:
                (stamp,) = o["timestamps"]
                assert set(stamp) == {"name", "ns"} and isinstance(stamp["ns"], int), stamp
                t["stamps"].append(stamp["name"])
            elif "activity" in o:
                t["tensors"].append((o["activity"], o["tensor"]["name"]))
            else:
                raise AssertionError(f"{path}: unexpected trace object {o}")
    for i, t in traces.items():
        assert t["header"] is not None, f"trace {i} has no header"
    return traces


CORE = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
        "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]


def tree(traces):
    """A trace forest without ids or times: for each root (sorted by model and request id), its
    header keys, its timestamp names split into the model's (CORE, in file order) and the
    frontend's (in file order), its tensors (activity and name, sorted: Triton's input order
    varies), and its children's trees (sorted), recursively."""
    def node(i):
        t = traces[i]
        children = sorted((node(c) for c, ct in traces.items()
                           if ct["header"].get("parent_id") == i), key=repr)
        return {
            "model": t["header"]["model_name"],
            "request_id": t["header"].get("request_id"),
            "keys": sorted(t["header"]),
            "core": [s for s in t["stamps"] if s in CORE],
            "frontend": [s for s in t["stamps"] if s not in CORE],
            "tensors": sorted(t["tensors"]),
            "children": children,
        }
    roots = [node(i) for i, t in traces.items() if "parent_id" not in t["header"]]
    return sorted(roots, key=lambda n: (n["model"], n["request_id"] or ""))
