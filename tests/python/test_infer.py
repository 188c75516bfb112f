"""Inference on every datatype over HTTP (binary and JSON) and gRPC, sync and asyncio clients.
The point: what the server returns equals what onnxruntime computes in-process on the same
model file."""

import asyncio

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from nereid_util import (assert_same, bf16_bits_to_f32, f32_to_bf16_bits, gen_models, make_data,
                         ort_run)

ALL_DTYPES = list(gen_models.DTYPES)
JSON_DTYPES = [d for d in ALL_DTYPES if d not in ("FP16", "BF16")]


def reference(path, feeds, dtype=None):
    """onnxruntime's outputs for `feeds` (name -> numpy array as tritonclient takes it)."""
    if dtype == "BF16":
        out = ort_run(path, {k: f32_to_bf16_bits(v) for k, v in feeds.items()}, bf16=True)
        return {k: bf16_bits_to_f32(v) for k, v in out.items()}
    if dtype == "BYTES":
        # onnxruntime's Python binding takes and returns str: UTF-8 data only.
        strs = {k: np.vectorize(lambda b: b.decode(), otypes=[object])(v)
                for k, v in feeds.items()}
        out = ort_run(path, strs)
        return {k: np.vectorize(lambda s: s.encode(), otypes=[object])(v) for k, v in out.items()}
    return ort_run(path, feeds)


def infer_http(client, model, feeds, dtype_of, binary_in=True, binary_out=True, version="",
               outputs=None):
    inputs = []
    for name, arr in feeds.items():
        i = httpclient.InferInput(name, list(arr.shape), dtype_of[name])
        i.set_data_from_numpy(arr, binary_data=binary_in)
        inputs.append(i)
    req_out = [httpclient.InferRequestedOutput(o, binary_data=binary_out) for o in outputs or []]
    res = client.infer(model, inputs, model_version=version, outputs=req_out or None)
    return res


def infer_grpc(client, model, feeds, dtype_of, version="", outputs=None):
    inputs = []
    for name, arr in feeds.items():
        i = grpcclient.InferInput(name, list(arr.shape), dtype_of[name])
        i.set_data_from_numpy(arr)
        inputs.append(i)
    req_out = [grpcclient.InferRequestedOutput(o) for o in outputs or []]
    return client.infer(model, inputs, model_version=version, outputs=req_out or None)


def check_against_ort(res, path, feeds, dtype, outputs=("OUTPUT0",)):
    ref = reference(path, feeds, dtype)
    for o in outputs:
        assert_same(res.as_numpy(o), ref[o], f"{o} vs onnxruntime")


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_identity_http_binary(http_client, model_path, dtype):
    name = gen_models.identity_name(dtype)
    feeds = {"INPUT0": make_data(dtype, [3, 8], seed=1)}
    res = infer_http(http_client, name, feeds, {"INPUT0": dtype}, outputs=["OUTPUT0"])
    out = res.get_output("OUTPUT0")
    assert out["datatype"] == dtype and out["shape"] == [3, 8], out
    assert res.get_response()["model_name"] == name
    assert res.get_response()["model_version"] == "1"
    check_against_ort(res, model_path(name), feeds, dtype)


@pytest.mark.parametrize("dtype", JSON_DTYPES)
def test_identity_http_json(http_client, model_path, dtype):
    name = gen_models.identity_name(dtype)
    feeds = {"INPUT0": make_data(dtype, [2, 5], seed=2, json_safe=True)}
    res = infer_http(http_client, name, feeds, {"INPUT0": dtype}, binary_in=False,
                     binary_out=False, outputs=["OUTPUT0"])
    out = res.get_output("OUTPUT0")
    assert "data" in out and "binary_data_size" not in out.get("parameters", {}), out
    check_against_ort(res, model_path(name), feeds, dtype)


@pytest.mark.parametrize("dtype", ["FP16", "BF16", "INT64", "BYTES"])
def test_identity_http_mixed_binary_json(http_client, model_path, dtype):
    """JSON input, binary output and the reverse (outputs not listed: all outputs returned)."""
    name = gen_models.identity_name(dtype)
    feeds = {"INPUT0": make_data(dtype, [1, 6], seed=3, json_safe=True)}
    if dtype not in ("FP16", "BF16"):
        res = infer_http(http_client, name, feeds, {"INPUT0": dtype}, binary_in=False,
                         outputs=["OUTPUT0"])
        check_against_ort(res, model_path(name), feeds, dtype)
        res = infer_http(http_client, name, feeds, {"INPUT0": dtype}, binary_out=False,
                         outputs=["OUTPUT0"])
        check_against_ort(res, model_path(name), feeds, dtype)
    res = infer_http(http_client, name, feeds, {"INPUT0": dtype})  # no outputs listed
    check_against_ort(res, model_path(name), feeds, dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_identity_grpc(grpc_client, model_path, dtype):
    name = gen_models.identity_name(dtype)
    feeds = {"INPUT0": make_data(dtype, [4, 7], seed=4)}
    res = infer_grpc(grpc_client, name, feeds, {"INPUT0": dtype})
    resp = res.get_response()
    assert resp.model_name == name and resp.model_version == "1"
    assert resp.outputs[0].datatype == dtype and list(resp.outputs[0].shape) == [4, 7]
    check_against_ort(res, model_path(name), feeds, dtype)


def test_bytes_edge_cases(http_client, grpc_client, model_path):
    """Empty strings, non-ASCII, an all-empty tensor; binary and JSON."""
    cases = [
        np.array([[b"", b"", b""]], dtype=np.object_),
        np.array([["é".encode(), "日本".encode(), b"", "😀".encode()]], dtype=np.object_),
        np.array([[b""]], dtype=np.object_),
    ]
    for arr in cases:
        ref = reference(model_path("identity_bytes"), {"INPUT0": arr}, "BYTES")["OUTPUT0"]
        assert_same(ref, arr, "onnxruntime")
        res = infer_http(http_client, "identity_bytes", {"INPUT0": arr}, {"INPUT0": "BYTES"})
        assert_same(res.as_numpy("OUTPUT0"), ref, "http binary")
        res = infer_grpc(grpc_client, "identity_bytes", {"INPUT0": arr}, {"INPUT0": "BYTES"})
        assert_same(res.as_numpy("OUTPUT0"), ref, "grpc")
    arr = np.array([["", "ü", "naïve café", "😀"]], dtype=np.object_)
    res = infer_http(http_client, "identity_bytes", {"INPUT0": arr}, {"INPUT0": "BYTES"},
                     binary_in=False, binary_out=False)
    assert_same(res.as_numpy("OUTPUT0"), arr, "http json")


def test_bytes_non_utf8(http_client, grpc_client):
    """Triton's ONNX Runtime backend hands BYTES to ORT as raw bytes. Nereid's ORT binding only
    builds string tensors from UTF-8, so non-UTF-8 BYTES for an ONNX model are refused with a
    400 / INVALID_ARGUMENT that names the input (a documented difference, docs/compatibility.md)."""
    arr = np.array([[b"\xff\xfe", b"ok", b"\x80abc"]], dtype=np.object_)
    with pytest.raises(InferenceServerException) as e:
        infer_http(http_client, "identity_bytes", {"INPUT0": arr}, {"INPUT0": "BYTES"})
    assert e.value.status() == "400" and "INPUT0" in e.value.message(), e.value
    with pytest.raises(InferenceServerException) as e:
        infer_grpc(grpc_client, "identity_bytes", {"INPUT0": arr}, {"INPUT0": "BYTES"})
    assert "INVALID_ARGUMENT" in str(e.value.status()) and "INPUT0" in e.value.message(), e.value


def test_bytes_embedded_nul(http_client):
    """ORT string tensors are C strings: Triton silently truncates at NUL. Accepted here: that,
    an exact round trip, or a 400 naming the input."""
    arr = np.array([[b"a\x00b", b"c"]], dtype=np.object_)
    try:
        out = infer_http(http_client, "identity_bytes", {"INPUT0": arr},
                         {"INPUT0": "BYTES"}).as_numpy("OUTPUT0")
    except InferenceServerException as e:
        assert e.status() == "400" and "INPUT0" in e.message(), e
        return
    assert [bytes(x) for x in out.flatten()] in ([b"a\x00b", b"c"], [b"a", b"c"]), out


def test_simple_add_sub_all_transports(http_client, grpc_client, model_path):
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    b[0, 0] = -2**31 + 5  # wraps like onnxruntime does
    feeds = {"INPUT0": a, "INPUT1": b}
    dt = {"INPUT0": "INT32", "INPUT1": "INT32"}
    ref = reference(model_path("simple"), feeds)
    for binary in (True, False):
        res = infer_http(http_client, "simple", feeds, dt, binary_in=binary, binary_out=binary)
        assert_same(res.as_numpy("OUTPUT0"), ref["OUTPUT0"], f"sum binary={binary}")
        assert_same(res.as_numpy("OUTPUT1"), ref["OUTPUT1"], f"diff binary={binary}")
    res = infer_grpc(grpc_client, "simple", feeds, dt)
    assert_same(res.as_numpy("OUTPUT0"), ref["OUTPUT0"])
    assert_same(res.as_numpy("OUTPUT1"), ref["OUTPUT1"])
    np.testing.assert_array_equal(ref["OUTPUT0"][0, 1:], a[0, 1:] + 3)


def test_output_selection(http_client, grpc_client):
    feeds = {"INPUT0": np.ones((1, 16), np.int32), "INPUT1": np.ones((1, 16), np.int32)}
    dt = {"INPUT0": "INT32", "INPUT1": "INT32"}
    res = infer_http(http_client, "simple", feeds, dt, outputs=["OUTPUT1"])
    outs = res.get_response()["outputs"]
    assert [o["name"] for o in outs] == ["OUTPUT1"]
    assert_same(res.as_numpy("OUTPUT1"), np.zeros((1, 16), np.int32))
    res = infer_grpc(grpc_client, "simple", feeds, dt, outputs=["OUTPUT0"])
    assert [o.name for o in res.get_response().outputs] == ["OUTPUT0"]
    assert_same(res.as_numpy("OUTPUT0"), np.full((1, 16), 2, np.int32))


@pytest.mark.parametrize("batch", [1, 2, 8])
def test_mlp_batches(http_client, grpc_client, model_path, batch):
    x = make_data("FP32", [batch, 4], seed=batch, json_safe=True) / 100
    ref = reference(model_path("mlp"), {"x": x})["y"]
    assert ref.shape == (batch, 3)
    for binary in (True, False):
        res = infer_http(http_client, "mlp", {"x": x}, {"x": "FP32"}, binary, binary)
        assert_same(res.as_numpy("y"), ref, f"http binary={binary}")
    assert_same(infer_grpc(grpc_client, "mlp", {"x": x}, {"x": "FP32"}).as_numpy("y"), ref)


def test_batched_equals_unbatched(http_client):
    """Each row of a batch gives what that row alone gives."""
    x = make_data("FP32", [8, 4], seed=9, json_safe=True) / 100
    whole = infer_http(http_client, "mlp", {"x": x}, {"x": "FP32"}).as_numpy("y")
    for i in range(8):
        row = infer_http(http_client, "mlp", {"x": x[i:i + 1]}, {"x": "FP32"}).as_numpy("y")
        assert_same(row, whole[i:i + 1], f"row {i}")


def test_batch_over_max_rejected(http_client, grpc_client):
    x = np.zeros((9, 4), np.float32)
    with pytest.raises(InferenceServerException) as e:
        infer_http(http_client, "mlp", {"x": x}, {"x": "FP32"})
    assert e.value.status() == "400" and "mlp" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        infer_grpc(grpc_client, "mlp", {"x": x}, {"x": "FP32"})
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_nobatch_model(http_client, grpc_client, model_path):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ref = reference(model_path("nobatch_fp32"), {"INPUT0": x})["OUTPUT0"]
    np.testing.assert_array_equal(ref, x * 2 + 1)
    res = infer_http(http_client, "nobatch_fp32", {"INPUT0": x}, {"INPUT0": "FP32"})
    assert_same(res.as_numpy("OUTPUT0"), ref)
    assert_same(infer_grpc(grpc_client, "nobatch_fp32", {"INPUT0": x},
                           {"INPUT0": "FP32"}).as_numpy("OUTPUT0"), ref)
    with pytest.raises(InferenceServerException) as e:  # a batch dim is a wrong shape here
        infer_http(http_client, "nobatch_fp32", {"INPUT0": x[None]}, {"INPUT0": "FP32"})
    assert e.value.status() == "400" and "INPUT0" in e.value.message()


def test_autocomplete_model_infers(http_client, grpc_client, model_path):
    x = make_data("FP32", [2, 5], seed=5)
    name = "identity_fp32_autocomplete"
    ref = reference(model_path(name), {"INPUT0": x})
    res = infer_http(http_client, name, {"INPUT0": x}, {"INPUT0": "FP32"})
    assert_same(res.as_numpy("OUTPUT0"), ref["OUTPUT0"])
    assert_same(infer_grpc(grpc_client, name, {"INPUT0": x}, {"INPUT0": "FP32"})
                .as_numpy("OUTPUT0"), ref["OUTPUT0"])


def test_request_id_echoed(http_client, grpc_client):
    x = np.zeros((1, 4), np.float32)
    i = httpclient.InferInput("x", [1, 4], "FP32")
    i.set_data_from_numpy(x)
    assert http_client.infer("mlp", [i], request_id="req-42").get_response()["id"] == "req-42"
    assert "id" not in http_client.infer("mlp", [i]).get_response()
    g = grpcclient.InferInput("x", [1, 4], "FP32")
    g.set_data_from_numpy(x)
    assert grpc_client.infer("mlp", [g], request_id="req-43").get_response().id == "req-43"


def test_grpc_typed_contents(server, model_path):
    """ModelInfer with typed `contents` instead of raw_input_contents; reply is raw bytes."""
    import grpc

    with grpc.insecure_channel(server.grpc_url) as ch:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
        req = service_pb2.ModelInferRequest(model_name="simple")
        for n, vals in (("INPUT0", list(range(16))), ("INPUT1", [5] * 16)):
            t = req.inputs.add(name=n, datatype="INT32", shape=[1, 16])
            t.contents.int_contents.extend(vals)
        resp = stub.ModelInfer(req, timeout=30)
        assert [o.name for o in resp.outputs] == ["OUTPUT0", "OUTPUT1"]
        out0 = np.frombuffer(resp.raw_output_contents[0], np.int32)
        np.testing.assert_array_equal(out0, np.arange(16) + 5)

        req = service_pb2.ModelInferRequest(model_name="identity_bytes")
        t = req.inputs.add(name="INPUT0", datatype="BYTES", shape=[1, 3])
        t.contents.bytes_contents.extend([b"", "ñ".encode(), b"z"])
        resp = stub.ModelInfer(req, timeout=30)
        raw = resp.raw_output_contents[0]
        assert raw == b"\x00\x00\x00\x00" + b"\x02\x00\x00\x00" + "ñ".encode() + b"\x01\x00\x00\x00z"

        req = service_pb2.ModelInferRequest(model_name="identity_fp64")
        t = req.inputs.add(name="INPUT0", datatype="FP64", shape=[1, 2])
        t.contents.fp64_contents.extend([1.5, -2.25])
        resp = stub.ModelInfer(req, timeout=30)
        np.testing.assert_array_equal(np.frombuffer(resp.raw_output_contents[0], np.float64),
                                      [1.5, -2.25])


@pytest.mark.parametrize("dtype", ["INT32", "FP16", "BF16", "BYTES", "BOOL"])
def test_aio_clients_infer(server, model_path, dtype):
    name = gen_models.identity_name(dtype)
    feeds = {"INPUT0": make_data(dtype, [2, 3], seed=6)}
    ref = reference(model_path(name), feeds, dtype)["OUTPUT0"]

    async def run():
        h = httpaio.InferenceServerClient(server.http_url)
        g = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            hi = httpaio.InferInput("INPUT0", [2, 3], dtype)
            hi.set_data_from_numpy(feeds["INPUT0"])
            gi = grpcaio.InferInput("INPUT0", [2, 3], dtype)
            gi.set_data_from_numpy(feeds["INPUT0"])
            rh, rg = await asyncio.gather(h.infer(name, [hi]), g.infer(name, [gi]))
            return rh.as_numpy("OUTPUT0"), rg.as_numpy("OUTPUT0")
        finally:
            await h.close()
            await g.close()

    out_h, out_g = asyncio.run(asyncio.wait_for(run(), 60))
    assert_same(out_h, ref, "http aio")
    assert_same(out_g, ref, "grpc aio")


def test_concurrent_requests(server, model_path):
    """Many concurrent asyncio requests on two transports; each gets its own answer."""
    xs = [make_data("FP32", [1, 4], seed=100 + i, json_safe=True) / 10 for i in range(32)]
    refs = [reference(model_path("mlp"), {"x": x})["y"] for x in xs]

    async def run():
        h = httpaio.InferenceServerClient(server.http_url)
        g = grpcaio.InferenceServerClient(server.grpc_url)
        try:
            async def one(i):
                cls, cli = (httpaio, h) if i % 2 else (grpcaio, g)
                inp = cls.InferInput("x", [1, 4], "FP32")
                inp.set_data_from_numpy(xs[i])
                return (await cli.infer("mlp", [inp])).as_numpy("y")
            return await asyncio.gather(*(one(i) for i in range(len(xs))))
        finally:
            await h.close()
            await g.close()

    for i, out in enumerate(asyncio.run(asyncio.wait_for(run(), 90))):
        assert_same(out, refs[i], f"request {i}")
