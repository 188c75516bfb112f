"""Triton's client calls through the router as on `nereid serve`: each scenario makes the calls one
of Triton's Python client examples (triton-inference-server/client src/python/examples) makes,
with real `tritonclient` (http, grpc, http.aio, grpc.aio) or the raw gRPC stub, once against a
`nereid serve` and once against a router in front of two workers serving the same models, and
asserts the same observable outcome on both: output values, and for errors the status and the
exact message. The router's by-design differences are asserted explicitly: client shared memory
(501 / UNIMPLEMENTED, saying why) and repository load/unload (503 while `--repository-control` is
off). The examples themselves are not ours to ship; docs/router.md has the hand probe's counts.

    scenario(target) -> observable   run on serve, then on the router: equal, and as expected
"""

import asyncio
import importlib.util
import queue
import shutil
from functools import partial

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
import tritonclient.utils.shared_memory as shared_memory
from onnx import TensorProto, helper
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from cluster_util import RouterProcess, WorkerProcess, leader_of, model_body, wait_replicas
from nereid_util import ROOT, Server, gen_models, http_raw, wait_until
from test_cluster import start_control_plane, stop_all


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / f"scripts/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_sequence_models = _load("gen_sequence_models")
gen_python_models = _load("gen_python_models")

MODELS = ("simple", "simple_string", "simple_int8", "seq_accum", "repeat_decoupled")
UNKNOWN = "Request for unknown model: 'wrong_model_name' is not found"
A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.ones((1, 16), dtype=np.int32)


def write_repository(repo):
    """simple (INT32 add/sub), simple_string and simple_int8 (the same on strings holding integers
    and on INT8, as the examples' models), seq_accum (a running sum per sequence) and
    repeat_decoupled (Python, one response per element of IN)."""
    gen_models.write_example(repo)
    for other in ("mlp", "identity_fp32_autocomplete"):
        shutil.rmtree(repo / other)
    vi, shape = gen_models._vi, ["batch", 16]
    io16 = lambda dt: [("INPUT0", dt, [16]), ("INPUT1", dt, [16])]  # noqa: E731
    oo16 = lambda dt: [("OUTPUT0", dt, [16]), ("OUTPUT1", dt, [16])]  # noqa: E731
    add_sub = [helper.make_node("Add", ["a", "b"], ["s"]),
               helper.make_node("Sub", ["a", "b"], ["d"])]
    int8 = gen_models._model(
        [helper.make_node("Identity", ["INPUT0"], ["a"]),
         helper.make_node("Identity", ["INPUT1"], ["b"]), *add_sub,
         helper.make_node("Identity", ["s"], ["OUTPUT0"]),
         helper.make_node("Identity", ["d"], ["OUTPUT1"])],
        [vi("INPUT0", TensorProto.INT8, shape), vi("INPUT1", TensorProto.INT8, shape)],
        [vi("OUTPUT0", TensorProto.INT8, shape), vi("OUTPUT1", TensorProto.INT8, shape)])
    gen_models.write_model(repo, "simple_int8", {1: int8},
                           gen_models.config_text("simple_int8", 8, io16("INT8"), oo16("INT8")))
    string = gen_models._model(
        [helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32),
         helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32), *add_sub,
         helper.make_node("Cast", ["s"], ["OUTPUT0"], to=TensorProto.STRING),
         helper.make_node("Cast", ["d"], ["OUTPUT1"], to=TensorProto.STRING)],
        [vi("INPUT0", TensorProto.STRING, shape), vi("INPUT1", TensorProto.STRING, shape)],
        [vi("OUTPUT0", TensorProto.STRING, shape), vi("OUTPUT1", TensorProto.STRING, shape)])
    gen_models.write_model(repo, "simple_string", {1: string}, gen_models.config_text(
        "simple_string", 8, io16("STRING"), oo16("STRING")))
    gen_models.write_model(repo, "seq_accum", {1: gen_sequence_models.accum_onnx()},
                           gen_sequence_models.accum_config("seq_accum", "direct { }",
                                                            gen_sequence_models.ACCUM_IDLE_US))
    gen_python_models.write_repository(repo, names={"repeat_decoupled"})
    assert sorted(p.name for p in repo.iterdir()) == sorted(MODELS)
    return repo


class Target:
    def __init__(self, name, http_url, grpc_url):
        self.name, self.http_url, self.grpc_url = name, http_url, grpc_url

    def http(self, **kw):
        return httpclient.InferenceServerClient(self.http_url, **kw)

    def grpc(self, **kw):
        return grpcclient.InferenceServerClient(self.grpc_url, **kw)


def all_ready(target):
    client = target.http()
    try:
        return all(client.is_model_ready(m) for m in MODELS)
    finally:
        client.close()


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """{"serve": a `nereid serve`, "router": a router before two workers}, on one repository;
    every model deployed with a replica on each worker."""
    repo = write_repository(tmp_path_factory.mktemp("clients_repo"))
    workdir = tmp_path_factory.mktemp("clients_cluster")
    serve = Server(repo, workdir, name="serve_clients").start()
    token, cps = start_control_plane(workdir, n=1)
    addrs = [cp.grpc_addr for cp in cps]
    workers = [WorkerProcess(f"w{i}", workdir, token, addrs) for i in (1, 2)]
    router = RouterProcess(workdir, token, addrs)
    try:
        cp = leader_of(cps)
        for p in [*workers, router]:
            p.spawn()
        for p in [*workers, router]:
            p.wait_live()
        for m in MODELS:
            code, body = cp.api("POST", "/api/v1/models", model_body(m, repo / m, replicas=2))
            assert code == 200, (m, code, body)
        nodes = sorted(w.node_id for w in workers)
        for m in MODELS:
            wait_replicas(cp, m, lambda r: sorted(x["node"] for x in r
                                                  if x["state"] == "REPLICA_STATE_READY") == nodes,
                          "a ready replica on each worker", deadline_s=90)
        found = {"serve": Target("serve", serve.http_url, serve.grpc_url),
                 "router": Target("router", router.http_url, router.grpc_url)}
        for t in found.values():
            wait_until(lambda t=t: all_ready(t), 30, f"{t.name}: every model ready")
        yield found
    finally:
        stop_all([router, *workers, *cps])
        rc = serve.stop()
        assert rc == 0, f"serve exited with {rc} after SIGTERM\n{serve.log_tail()}"


def error_of(call):
    """(status, message) of a call that must fail: tritonclient's exception or a raw gRPC error."""
    try:
        call()
    except InferenceServerException as e:
        return str(e.status()), e.message()
    except grpc.RpcError as e:
        return e.code().name, e.details()
    raise AssertionError("the call succeeded; expected an error")


def simple_inputs(module, a=A, b=B, json_first=False):
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"),
              module.InferInput("INPUT1", [1, 16], "INT32")]
    if json_first:  # HTTP: INPUT0 as JSON, INPUT1 binary, as simple_http_infer_client.py
        inputs[0].set_data_from_numpy(a, binary_data=False)
        inputs[1].set_data_from_numpy(b, binary_data=True)
    else:
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
    return inputs


def add_sub(result, a=A, b=B):
    """Both outputs of `simple` as lists, checked against a + b and a - b."""
    out0, out1 = result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")
    np.testing.assert_array_equal(out0, a + b)
    np.testing.assert_array_equal(out1, a - b)
    return out0.tolist(), out1.tolist()


# ---------------------------------------------------------------------------------------------
# Inference over HTTP and gRPC: sync, async, aio, custom arguments


def http_sync_infer(t):
    """simple_http_infer_client.py: mixed JSON/binary inputs and outputs, query parameters,
    headers, gzip both ways; with and without requested outputs; statistics."""
    c = t.http()
    b = np.full((1, 16), -1, dtype=np.int32)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    got = []
    for algo in (None, "gzip", "deflate"):
        r = c.infer("simple", simple_inputs(httpclient, b=b, json_first=True), outputs=outputs,
                    query_params={"test_1": 1, "test_2": 2}, headers={"test": "1"},
                    request_compression_algorithm=algo, response_compression_algorithm=algo)
        got.append(add_sub(r, b=b))
    r = c.infer("simple", simple_inputs(httpclient, b=b, json_first=True), request_id="req-7")
    got.append((r.get_response()["id"], add_sub(r, b=b)))
    stats = c.get_inference_statistics(model_name="simple")
    got.append([s["name"] for s in stats["model_stats"]])
    c.close()
    return got


def http_async_infer(t):
    """simple_http_async_infer_client.py: several async_infer in flight, then every result."""
    c = t.http(concurrency=4)
    pending = [c.async_infer("simple", simple_inputs(httpclient, a=A + i), request_id=str(i))
               for i in range(8)]
    results = [p.get_result() for p in pending]
    got = [(r.get_response()["id"], add_sub(r, a=A + i)) for i, r in enumerate(results)]
    c.close()
    return got


def http_aio_infer(t):
    """simple_http_aio_infer_client.py: the asyncio client, concurrent requests and statistics."""
    async def run():
        c = httpaio.InferenceServerClient(t.http_url)
        try:
            results = await asyncio.gather(*(
                c.infer("simple", simple_inputs(httpaio, a=A * i), headers={"test": "1"})
                for i in range(4)))
            stats = await c.get_inference_statistics(model_name="simple")
            live = await c.is_server_live()
            return ([add_sub(r, a=A * i) for i, r in enumerate(results)],
                    [s["name"] for s in stats["model_stats"]], live)
        finally:
            await c.close()
    return asyncio.run(run())


def grpc_sync_infer(t):
    """simple_grpc_infer_client.py: requested outputs, client timeout, headers, compression,
    request id; statistics."""
    c = t.grpc()
    outputs = [grpcclient.InferRequestedOutput(name) for name in ("OUTPUT0", "OUTPUT1")]
    got = []
    for algo in (None, "gzip", "deflate"):
        r = c.infer("simple", simple_inputs(grpcclient), outputs=outputs, client_timeout=10,
                    headers={"test": "1"}, compression_algorithm=algo, request_id="g-1")
        got.append((r.get_response().id, add_sub(r)))
    got.append(add_sub(c.infer("simple", simple_inputs(grpcclient))))
    stats = c.get_inference_statistics(model_name="simple")
    got.append([s.name for s in stats.model_stats])
    c.close()
    return got


def grpc_async_infer(t):
    """simple_grpc_async_infer_client.py: async_infer with a callback and a client timeout."""
    c = t.grpc()
    done = queue.Queue()
    for i in range(8):
        c.async_infer("simple", simple_inputs(grpcclient, a=A + i),
                      partial(lambda i, result, error: done.put((i, result, error)), i),
                      client_timeout=10, request_id=str(i))
    got = {}
    for _ in range(8):
        i, result, error = done.get(timeout=30)
        assert error is None, error
        got[i] = (result.get_response().id, add_sub(result, a=A + i))
    c.close()
    return sorted(got.items())


def grpc_aio_infer(t):
    """simple_grpc_aio_infer_client.py: the asyncio gRPC client."""
    async def run():
        c = grpcaio.InferenceServerClient(t.grpc_url)
        try:
            results = await asyncio.gather(*(
                c.infer("simple", simple_inputs(grpcaio, a=A - i), client_timeout=10,
                        headers={"test": "1"}) for i in range(4)))
            stats = await c.get_inference_statistics(model_name="simple")
            return ([add_sub(r, a=A - i) for i, r in enumerate(results)],
                    [s.name for s in stats.model_stats])
        finally:
            await c.close()
    return asyncio.run(run())


def grpc_channel_options(t):
    """simple_grpc_custom_args_client.py and simple_grpc_keepalive_client.py: custom channel
    arguments, then keepalive options."""
    channel_args = [("grpc.max_send_message_length", 1024 * 1024),
                    ("grpc.max_receive_message_length", 1024 * 1024),
                    ("grpc.keepalive_time_ms", 2**31 - 1),
                    ("grpc.keepalive_timeout_ms", 20000),
                    ("grpc.keepalive_permit_without_calls", False),
                    ("grpc.http2.max_pings_without_data", 2)]
    keepalive = grpcclient.KeepAliveOptions(keepalive_time_ms=2**31 - 1, keepalive_timeout_ms=20000,
                                            keepalive_permit_without_calls=False,
                                            http2_max_pings_without_data=2)
    got = []
    for kw in ({"channel_args": channel_args}, {"keepalive_options": keepalive}):
        c = t.grpc(**kw)
        got.append(add_sub(c.infer("simple", simple_inputs(grpcclient), headers={"test": "1"})))
        c.close()
    return got


def reuse_infer_objects(t):
    """reuse_infer_objects_client.py (its in-band half): the same InferInput and
    InferRequestedOutput objects for several requests, new data set between them."""
    got = []
    for module, client in ((httpclient, t.http()), (grpcclient, t.grpc())):
        inputs = simple_inputs(module)
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        for i in range(3):
            a = A * (i + 2)
            inputs[0].set_data_from_numpy(a)
            got.append(add_sub(client.infer("simple", inputs, outputs=outputs), a=a))
        client.close()
    return got


def repeated_infer(t):
    """memory_growth_test.py's loop, short: the same request again and again on one client."""
    got = []
    for module, client in ((httpclient, t.http()), (grpcclient, t.grpc())):
        inputs = simple_inputs(module)
        sums = [int(client.infer("simple", inputs).as_numpy("OUTPUT0").sum()) for _ in range(100)]
        assert sums == [int((A + B).sum())] * 100
        got.append(sums)
        client.close()
    return got


# ---------------------------------------------------------------------------------------------
# BYTES and explicit (typed) contents


def string_infer(t):
    """simple_{http,grpc}_string_infer_client.py: BYTES tensors of integers' decimal strings."""
    a, b = A.astype(np.bytes_).astype(np.object_), B.astype(np.bytes_).astype(np.object_)
    got = []
    for module, client in ((httpclient, t.http()), (grpcclient, t.grpc())):
        inputs = [module.InferInput("INPUT0", [1, 16], "BYTES"),
                  module.InferInput("INPUT1", [1, 16], "BYTES")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        r = client.infer("simple_string", inputs)
        out0 = [int(x) for x in r.as_numpy("OUTPUT0").reshape(-1)]
        out1 = [int(x) for x in r.as_numpy("OUTPUT1").reshape(-1)]
        assert out0 == (A + B).reshape(-1).tolist() and out1 == (A - B).reshape(-1).tolist()
        got.append((out0, out1))
        client.close()
    return got


def typed_request(model, datatype, field, data0, data1, version=""):
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name, data in (("INPUT0", data0), ("INPUT1", data1)):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1, 16])
        getattr(tensor.contents, field)[:] = data
    for name in ("OUTPUT0", "OUTPUT1"):
        request.outputs.add(name=name)
    return request


def explicit_contents(t):
    """grpc_explicit_{int,int8,byte}_content_client.py: inputs in the typed `contents` fields
    instead of raw bytes; outputs come back raw."""
    channel = grpc.insecure_channel(t.grpc_url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    a, b = list(range(16)), [1] * 16
    got = []
    for model, datatype, field, dtype in (("simple", "INT32", "int_contents", np.int32),
                                          ("simple_int8", "INT8", "int_contents", np.int8)):
        response = stub.ModelInfer(typed_request(model, datatype, field, a, b), timeout=30)
        outs = [np.frombuffer(raw, dtype=dtype).tolist() for raw in response.raw_output_contents]
        assert outs == [[x + y for x, y in zip(a, b)], [x - y for x, y in zip(a, b)]], outs
        got.append((model, [o.name for o in response.outputs], outs))
    strings = [str(x).encode() for x in a], [str(x).encode() for x in b]
    response = stub.ModelInfer(typed_request("simple_string", "BYTES", "bytes_contents", *strings),
                               timeout=30)
    outs = [[int(s) for s in httpclient_deserialize_bytes(raw)]
            for raw in response.raw_output_contents]
    assert outs == [[x + y for x, y in zip(a, b)], [x - y for x, y in zip(a, b)]], outs
    got.append(("simple_string", outs))
    channel.close()
    return got


def httpclient_deserialize_bytes(raw):
    """BYTES raw contents: each element a 4-byte little-endian length, then its bytes."""
    out, i = [], 0
    while i < len(raw):
        n = int.from_bytes(raw[i:i + 4], "little")
        out.append(raw[i + 4:i + 4 + n])
        i += 4 + n
    return out


# ---------------------------------------------------------------------------------------------
# Health, metadata, configuration, and the errors the examples check


def health_metadata(t):
    """simple_{http,grpc}_health_metadata.py: liveness and readiness with headers and query
    parameters, server and model metadata, model configuration."""
    h, g = t.http(), t.grpc()
    got = [h.is_server_live(query_params={"test_1": 1, "test_2": 2}), h.is_server_ready(),
           h.is_model_ready("simple"), g.is_server_live(headers={"test": "1", "dummy": "2"}),
           g.is_server_ready(), g.is_model_ready("simple")]
    assert all(got), got
    assert h.get_server_metadata()["name"] == "triton" == g.get_server_metadata().name
    meta = h.get_model_metadata("simple", query_params={"test_1": 1, "test_2": 2})
    gmeta = g.get_model_metadata("simple", headers={"test": "1", "dummy": "2"}, as_json=True)
    config = g.get_model_config("simple", as_json=True)["config"]
    hconfig = h.get_model_config("simple")
    assert meta["name"] == "simple" == config["name"] == hconfig["name"]
    got += [meta, gmeta, {k: config[k] for k in ("name", "max_batch_size", "input", "output")},
            {k: hconfig[k] for k in ("name", "max_batch_size", "input", "output")}]
    h.close()
    g.close()
    return got


def unknown_model(t):
    """The examples' `wrong_model_name`: Triton's words and status on each route."""
    h, g = t.http(), t.grpc()
    # Not ready, without an error (Triton's ModelIsReady): gRPC `ready: false`, HTTP 400.
    got = [g.is_model_ready("wrong_model_name"), g.is_model_ready("simple", "7")]
    assert got == [False, False]
    for path in ("/v2/models/wrong_model_name/ready", "/v2/models/simple/versions/7/ready"):
        status, _, body = http_raw(t.http_url, "GET", path)
        got.append((status, body))
    assert got[2:] == [(400, b'{"error":"Model version not ready"}')] * 2, got
    for call in (lambda: h.get_model_metadata("wrong_model_name"),
                 lambda: h.get_model_config("wrong_model_name"),
                 lambda: h.infer("wrong_model_name", simple_inputs(httpclient)),
                 lambda: g.get_model_metadata("wrong_model_name"),
                 lambda: g.get_model_config("wrong_model_name"),
                 lambda: g.infer("wrong_model_name", simple_inputs(grpcclient))):
        status, message = error_of(call)
        assert message == UNKNOWN, (status, message)
        got.append((status, message))
    assert [s for s, _ in got[4:]] == ["404"] * 3 + ["StatusCode.NOT_FOUND"] * 3, got
    # Over a stream the error comes back in the stream's response, which stays open.
    done = queue.Queue()
    g.start_stream(callback=lambda result, error: done.put((result, error)))
    g.async_stream_infer("wrong_model_name", simple_inputs(grpcclient), request_id="s-1")
    g.async_stream_infer("simple", simple_inputs(grpcclient), request_id="s-2")
    answers = [done.get(timeout=30) for _ in range(2)]
    g.stop_stream()
    assert answers[0][0] is None and answers[0][1].message() == UNKNOWN, answers
    got += [answers[0][1].message(), add_sub(answers[1][0])]
    h.close()
    g.close()
    return got


def bad_version(t):
    """grpc_explicit_*_content_client.py's last step: a version string that is not an integer
    (Triton's words), and a version the model does not have."""
    channel = grpc.insecure_channel(t.grpc_url)
    stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
    request = typed_request("simple", "INT32", "int_contents", list(range(16)), [1] * 16,
                            version="wrong_specification")
    got = [error_of(lambda: stub.ModelInfer(request, timeout=30))]
    assert ("failed to get model version from specified version string 'wrong_specification'"
            in got[0][1]), got
    h, g = t.http(), t.grpc()
    got.append(error_of(lambda: h.infer("simple", simple_inputs(httpclient),
                                        model_version="wrong_specification")))
    for call in (lambda: h.infer("simple", simple_inputs(httpclient), model_version="7"),
                 lambda: g.infer("simple", simple_inputs(grpcclient), model_version="7")):
        got.append(error_of(call))
        assert got[-1][1] == "Request for unknown model: 'simple' version 7 is not found", got
    channel.close()
    h.close()
    g.close()
    return got


# ---------------------------------------------------------------------------------------------
# Sequences (uint64 and string ids) and a decoupled model over a stream

VALUES = [11, 7, 5, 3, 2, 0, 1]
SEQUENCE_IDS = (1000, 1001, "seq-string-1002")


def expected_sums(sid):
    scale = SEQUENCE_IDS.index(sid) + 1
    return np.cumsum([v * scale for v in VALUES]).tolist()


def seq_input(module, sid, value):
    """INPUT of one step: `value` scaled by the sequence's place, so the sequences' sums differ."""
    inp = module.InferInput("INPUT", [1, 1], "INT32")
    inp.set_data_from_numpy(np.full((1, 1), value * (SEQUENCE_IDS.index(sid) + 1), dtype=np.int32))
    return inp


def flags(step):
    return {"sequence_start": step == 0, "sequence_end": step == len(VALUES) - 1}


def sequence_sync(t):
    """simple_{http,grpc}_sequence_sync_infer_client.py: the steps of three sequences (two uint64
    ids, one string id) interleaved, each step a separate request with start/end flags."""
    got = []
    for module, client in ((httpclient, t.http()), (grpcclient, t.grpc())):
        sums = {sid: [] for sid in SEQUENCE_IDS}
        for step, value in enumerate(VALUES):
            for sid in SEQUENCE_IDS:
                r = client.infer("seq_accum", [seq_input(module, sid, value)], sequence_id=sid,
                                 **flags(step))
                sums[sid].append(int(r.as_numpy("OUTPUT")[0, 0]))
        assert sums == {sid: expected_sums(sid) for sid in SEQUENCE_IDS}, sums
        got.append(sums)
        client.close()
    return got


def sequence_stream(t):
    """simple_grpc_sequence_stream_infer_client.py: the same sequences over one gRPC stream, the
    responses matched to their requests by request id."""
    c = t.grpc()
    done = queue.Queue()
    c.start_stream(callback=lambda result, error: done.put((result, error)))
    for step, value in enumerate(VALUES):
        for sid in SEQUENCE_IDS:
            c.async_stream_infer("seq_accum", [seq_input(grpcclient, sid, value)],
                                 request_id=f"{sid}_{step}", sequence_id=sid, **flags(step))
    by_id = {}
    for _ in range(len(VALUES) * len(SEQUENCE_IDS)):
        result, error = done.get(timeout=30)
        assert error is None, error
        by_id[result.get_response().id] = int(result.as_numpy("OUTPUT")[0, 0])
    c.stop_stream()
    c.close()
    sums = {sid: [by_id[f"{sid}_{step}"] for step in range(len(VALUES))] for sid in SEQUENCE_IDS}
    assert sums == {sid: expected_sums(sid) for sid in SEQUENCE_IDS}, sums
    return sums


def sequence_aio_stream(t):
    """simple_grpc_aio_sequence_stream_infer_client.py: the asyncio client's stream_infer."""
    async def requests():
        for step, value in enumerate(VALUES):
            for sid in SEQUENCE_IDS:
                yield {"model_name": "seq_accum", "request_id": f"{sid}_{step}", "sequence_id": sid,
                       "inputs": [seq_input(grpcaio, sid, value)], **flags(step)}

    async def run():
        c = grpcaio.InferenceServerClient(t.grpc_url)
        by_id = {}
        try:
            async for result, error in c.stream_infer(requests()):
                assert error is None, error
                by_id[result.get_response().id] = int(result.as_numpy("OUTPUT")[0, 0])
                if len(by_id) == len(VALUES) * len(SEQUENCE_IDS):
                    break
        finally:
            await c.close()
        return by_id
    by_id = asyncio.run(asyncio.wait_for(run(), 30))
    sums = {sid: [by_id[f"{sid}_{step}"] for step in range(len(VALUES))] for sid in SEQUENCE_IDS}
    assert sums == {sid: expected_sums(sid) for sid in SEQUENCE_IDS}, sums
    return sums


def decoupled_stream(t):
    """simple_grpc_custom_repeat.py: a decoupled model answers one request with one response per
    element over the stream, the last marked final; a request with no element gets only the
    empty final response it asked for."""
    c = t.grpc()
    done = queue.Queue()
    c.start_stream(callback=lambda result, error: done.put((result, error)))
    got = {}
    for request_id, values in (("repeat-4", [4, 2, 0, 1]), ("repeat-0", [])):
        inp = grpcclient.InferInput("IN", [len(values)], "INT32")
        inp.set_data_from_numpy(np.array(values, dtype=np.int32))
        c.async_stream_infer("repeat_decoupled", [inp], request_id=request_id,
                             enable_empty_final_response=True)
        responses = []
        while not responses or not responses[-1][1]:
            result, error = done.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            assert response.id == request_id, response
            responses.append(([int(x) for x in result.as_numpy("OUT")] if response.outputs else [],
                              response.parameters["triton_final_response"].bool_param))
        assert sum((r for r, _ in responses), []) == values, responses
        assert [final for _, final in responses] == [False] * (len(responses) - 1) + [True]
        got[request_id] = responses
    assert got["repeat-0"] == [([], True)], got
    c.stop_stream()
    c.close()
    return got


SCENARIOS = [http_sync_infer, http_async_infer, http_aio_infer, grpc_sync_infer, grpc_async_infer,
             grpc_aio_infer, grpc_channel_options, reuse_infer_objects, repeated_infer,
             string_infer, explicit_contents, health_metadata, unknown_model, bad_version,
             sequence_sync, sequence_stream, sequence_aio_stream, decoupled_stream]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.__name__ for s in SCENARIOS])
def test_the_router_answers_as_serve(targets, scenario):
    on_serve = scenario(targets["serve"])
    through_router = scenario(targets["router"])
    assert through_router == on_serve


# ---------------------------------------------------------------------------------------------
# By design: what the router refuses, and why

SHM_OFF = ("system shared memory is not available: the router forwards requests to workers on "
           "other hosts, which cannot read a client's memory; send the tensors in the request "
           "instead")


@pytest.mark.timeout(60)
def test_client_shared_memory_is_refused_by_the_router_only(targets):
    """simple_{http,grpc}_shm_client.py: serve registers the region; the router cannot (its
    workers are on other hosts), saying why, 501 over HTTP and UNIMPLEMENTED over gRPC."""
    serve, router = targets["serve"], targets["router"]
    region = shared_memory.create_shared_memory_region("input_data", "/nereid_clients_shm", 64)
    try:
        for client, regions in ((serve.http(), lambda s: s),
                                (serve.grpc(), lambda s: list(s.regions))):
            client.register_system_shared_memory("input_data", "/nereid_clients_shm", 64)
            assert len(regions(client.get_system_shared_memory_status())) == 1
            client.unregister_system_shared_memory("input_data")
            client.close()
    finally:
        shared_memory.destroy_shared_memory_region(region)
    got = []
    for client in (router.http(), router.grpc()):
        got.append(error_of(lambda: client.register_system_shared_memory(
            "input_data", "/nereid_clients_shm", 64)))
        client.close()
    assert got == [("501", SHM_OFF), ("StatusCode.UNIMPLEMENTED", SHM_OFF)], got
    # Nothing registered, and the router does not claim the extension.
    assert router.http().get_system_shared_memory_status() == []
    assert not router.grpc().get_system_shared_memory_status().regions
    assert "system_shared_memory" not in router.http().get_server_metadata()["extensions"]


@pytest.mark.timeout(60)
def test_repository_load_and_unload_are_off_through_the_router(targets):
    """simple_{http,grpc}_model_control.py: with `--repository-control off` (the default) the
    router answers load and unload with 503 / UNAVAILABLE naming the management API; the model
    keeps serving."""
    router = targets["router"]
    got = []
    for client in (router.http(), router.grpc()):
        for call in (lambda: client.load_model("simple"), lambda: client.unload_model("simple")):
            got.append(error_of(call))
        assert client.is_model_ready("simple")
        client.close()
    for (status, message), (want_status, op) in zip(got, [("503", "load"), ("503", "unload"),
                                                          ("StatusCode.UNAVAILABLE", "load"),
                                                          ("StatusCode.UNAVAILABLE", "unload")]):
        assert status == want_status, got
        assert message.startswith(f"repository {op} of model 'simple' through the router is off"), (
            got)
        assert "--repository-control" in message, got
