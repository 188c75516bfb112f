"""Triton's system shared memory extension end to end, driven the way a Triton user does it:
tritonclient's `shared_memory` utilities create and fill POSIX shared memory, the region is
registered over HTTP or gRPC, inputs are read from it and outputs written into it.

Every region a test creates has a unique key and is destroyed (and unregistered) when the test
ends, whatever happened.
"""

import os
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from nereid_util import (assert_same, bf16_bits_to_f32, f32_to_bf16_bits, gen_models, http_json,
                         make_data)

ALL_DTYPES = list(gen_models.DTYPES)
PROTOCOLS = ["http", "grpc"]


class Regions:
    """Shared memory objects of one test: created here, destroyed at teardown."""

    def __init__(self):
        self.handles = {}

    def create(self, size):
        name = f"nereid_{uuid.uuid4().hex[:12]}"
        key = "/" + name
        handle = shm.create_shared_memory_region(name, key, size)
        self.handles[name] = (handle, key)
        return name, key, handle

    def close(self):
        for handle, _ in self.handles.values():
            try:
                shm.destroy_shared_memory_region(handle)
            except shm.SharedMemoryException:
                pass  # a test unlinked it already
        self.handles.clear()


def make_client(protocol, server):
    if protocol == "http":
        return httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    return grpcclient.InferenceServerClient(server.grpc_url)


@pytest.fixture
def regions(server):
    r = Regions()
    yield r
    # Unregister everything this test left, then free the memory.
    c = httpclient.InferenceServerClient(server.http_url)
    c.unregister_system_shared_memory()
    c.close()
    r.close()


@pytest.fixture(params=PROTOCOLS)
def client(request, server):
    c = make_client(request.param, server)
    c.protocol = request.param
    yield c
    c.close()


def mod(client):
    return httpclient if client.protocol == "http" else grpcclient


def wire_bytes(dtype, arr):
    """What goes into shared memory for `arr`: Triton's layout (BYTES length-prefixed, BF16 as
    its 16-bit patterns)."""
    if dtype == "BYTES":
        return serialize_byte_tensor(arr)
    if dtype == "BF16":
        return f32_to_bf16_bits(arr)
    return np.ascontiguousarray(arr)


def nbytes(data):
    return data.item().__len__() if data.dtype == np.object_ else data.nbytes


def read_back(handle, dtype, shape, offset):
    if dtype == "BYTES":
        return shm.get_contents_as_numpy(handle, np.object_, shape, offset=offset)
    if dtype == "BF16":
        return bf16_bits_to_f32(shm.get_contents_as_numpy(handle, np.uint16, shape, offset=offset))
    return shm.get_contents_as_numpy(handle, make_data(dtype, [1]).dtype, shape, offset=offset)


def shm_input(client, name, shape, dtype, region, size, offset=0):
    i = mod(client).InferInput(name, shape, dtype)
    i.set_shared_memory(region, size, offset=offset)
    return i


def shm_output(client, name, region, size, offset=0):
    o = mod(client).InferRequestedOutput(name)
    o.set_shared_memory(region, size, offset=offset)
    return o


def assert_no_data(client, result, name):
    """An output written to shared memory comes back without data, as Triton sends it."""
    if client.protocol == "http":
        out = result.get_output(name)
        assert set(out) == {"name", "datatype", "shape"}, out
    else:
        response = result.get_response()
        index = [o.name for o in response.outputs].index(name)
        assert response.raw_output_contents[index] == b""


def expect_error(call, status, *needles):
    with pytest.raises(InferenceServerException) as e:
        call()
    message = e.value.message()
    for n in needles:
        assert n in message, message
    if status is not None:
        assert str(e.value.status()) in status, (e.value.status(), message)
    return message


# --------------------------------------------------------------------------------------------
# Data in and out


@pytest.mark.timeout(120)
@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_every_datatype_in_and_out_of_shared_memory(client, regions, dtype):
    data = make_data(dtype, [2, 3], seed=7)
    raw = wire_bytes(dtype, data)
    size = nbytes(raw)
    in_name, in_key, in_handle = regions.create(size + 24)
    out_name, out_key, out_handle = regions.create(size + 40)
    shm.set_shared_memory_region(in_handle, [raw], offset=24)
    client.register_system_shared_memory(in_name, in_key, size + 24)
    # The output region starts 8 bytes into its object; the output 16 bytes into the region.
    client.register_system_shared_memory(out_name, out_key, size + 32, offset=8)

    result = client.infer(
        gen_models.identity_name(dtype),
        [shm_input(client, "INPUT0", [2, 3], dtype, in_name, size, offset=24)],
        outputs=[shm_output(client, "OUTPUT0", out_name, size + 16, offset=16)])
    assert_no_data(client, result, "OUTPUT0")
    assert_same(read_back(out_handle, dtype, [2, 3], 8 + 16), data, dtype)


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_shm_and_ordinary_tensors_mix(server, regions, protocol):
    """`simple`: INPUT0 from shared memory, INPUT1 in the request; OUTPUT0 into shared memory,
    OUTPUT1 in the response."""
    client = make_client(protocol, server)
    client.protocol = protocol
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    name, key, handle = regions.create(128)
    shm.set_shared_memory_region(handle, [a])
    client.register_system_shared_memory(name, key, 128)
    i1 = mod(client).InferInput("INPUT1", [1, 16], "INT32")
    i1.set_data_from_numpy(b)
    result = client.infer("simple", [shm_input(client, "INPUT0", [1, 16], "INT32", name, 64), i1],
                          outputs=[shm_output(client, "OUTPUT0", name, 64, offset=64),
                                   mod(client).InferRequestedOutput("OUTPUT1")])
    assert_no_data(client, result, "OUTPUT0")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=64), a + b)
    client.close()


def test_region_registered_over_http_serves_grpc(server, regions):
    http = make_client("http", server)
    grpc = make_client("grpc", server)
    grpc.protocol = "grpc"
    data = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)
    name, key, handle = regions.create(24)
    shm.set_shared_memory_region(handle, [data])
    http.register_system_shared_memory(name, key, 24)
    status = grpc.get_system_shared_memory_status(name, as_json=True)
    assert status["regions"][name]["key"] == key
    result = grpc.infer("identity_fp32", [shm_input(grpc, "INPUT0", [1, 3], "FP32", name, 12)],
                        outputs=[shm_output(grpc, "OUTPUT0", name, 12, offset=12)])
    assert_no_data(grpc, result, "OUTPUT0")
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(handle, np.float32, [1, 3], offset=12), data)
    http.close()
    grpc.close()


# --------------------------------------------------------------------------------------------
# Register, status, unregister


def test_status_register_unregister(client, regions):
    a, key_a, _ = regions.create(64)
    b, key_b, _ = regions.create(32)
    client.register_system_shared_memory(a, key_a, 64)
    client.register_system_shared_memory(b, key_b, 16, offset=8)
    if client.protocol == "http":
        status = {r["name"]: r for r in client.get_system_shared_memory_status()}
        assert status[b] == {"name": b, "key": key_b, "offset": 8, "byte_size": 16}
        assert [r["name"] for r in client.get_system_shared_memory_status(a)] == [a]
    else:
        status = client.get_system_shared_memory_status(as_json=True)["regions"]
        assert status[b] == {"name": b, "key": key_b, "offset": "8", "byte_size": "16"}
        one = client.get_system_shared_memory_status(a, as_json=True)["regions"]
        assert list(one) == [a]
    assert set(status) == {a, b}

    client.unregister_system_shared_memory(a)
    client.unregister_system_shared_memory(a)  # unknown: not an error, as in Triton
    expect_error(lambda: client.get_system_shared_memory_status(a), None,
                 f"Unable to find system shared memory region: '{a}'")
    client.unregister_system_shared_memory()
    if client.protocol == "http":
        assert client.get_system_shared_memory_status() == []
    else:
        assert client.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}


def test_http_status_codes(server, regions):
    name, key, _ = regions.create(16)
    body = {"key": key, "offset": 0, "byte_size": 16}
    path = f"/v2/systemsharedmemory/region/{name}/register"
    assert http_json(server.http_url, "POST", path, body)[0] == 200
    status, again = http_json(server.http_url, "POST", path, body)
    assert (status, again) == (400, {"error": f"shared memory region '{name}' already in manager"})
    status, missing = http_json(server.http_url, "GET",
                                "/v2/systemsharedmemory/region/nope/status")
    assert (status, missing) == (404, {"error": "Unable to find system shared memory region: 'nope'"})


# --------------------------------------------------------------------------------------------
# Errors: clear, per field, and the server keeps serving


def test_registration_errors(client, regions):
    name, key, _ = regions.create(16)
    expect_error(lambda: client.register_system_shared_memory("r", "/nereid_no_such_key", 8),
                 "400 StatusCode.INVALID_ARGUMENT",
                 "Unable to open shared memory region: '/nereid_no_such_key'")
    expect_error(lambda: client.register_system_shared_memory("r", key, 16, offset=8),
                 "400 StatusCode.INVALID_ARGUMENT",
                 "failed to register shared memory region 'r': invalid args")
    client.register_system_shared_memory(name, key, 16)
    expect_error(lambda: client.register_system_shared_memory(name, key, 16),
                 "400 StatusCode.ALREADY_EXISTS",
                 f"shared memory region '{name}' already in manager")


def test_infer_errors_name_region_and_field(client, regions):
    name, key, _ = regions.create(16)
    client.register_system_shared_memory(name, key, 16)

    def infer_in(region, size, offset=0, shape=(1, 2)):
        return lambda: client.infer("identity_fp32", [
            shm_input(client, "INPUT0", list(shape), "FP32", region, size, offset=offset)])

    expect_error(infer_in("nope", 8), "404 StatusCode.NOT_FOUND",
                 "Unable to find shared memory region: 'nope'")
    expect_error(infer_in(name, 8, offset=16), "400 StatusCode.INVALID_ARGUMENT",
                 f"Invalid offset for shared memory region: '{name}'")
    expect_error(infer_in(name, 8, offset=12), "400 StatusCode.INVALID_ARGUMENT",
                 f"Invalid offset + byte size for shared memory region: '{name}'")
    expect_error(infer_in(name, 4), "400 StatusCode.INVALID_ARGUMENT",
                 "input byte size mismatch for input 'INPUT0' for model 'identity_fp32'. "
                 "Expected 8, got 4")

    # An output bigger than the room given for it.
    i = mod(client).InferInput("INPUT0", [1, 4], "FP32")
    i.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    expect_error(lambda: client.infer("identity_fp32", [i],
                                      outputs=[shm_output(client, "OUTPUT0", name, 8)]),
                 "400 StatusCode.INVALID_ARGUMENT",
                 "output 'OUTPUT0' (8 bytes) should be at least 16 bytes")
    # Still serving.
    assert client.infer("identity_fp32", [i]).as_numpy("OUTPUT0").shape == (1, 4)


def test_region_shrunk_or_removed_behind_the_servers_back(client, regions):
    name, key, handle = regions.create(64)
    data = np.arange(8, dtype=np.float32).reshape(1, 8)
    shm.set_shared_memory_region(handle, [data])
    client.register_system_shared_memory(name, key, 64)
    infer = lambda: client.infer(  # noqa: E731
        "identity_fp32", [shm_input(client, "INPUT0", [1, 8], "FP32", name, 32)],
        outputs=[shm_output(client, "OUTPUT0", name, 32, offset=32)])
    infer()

    # Shrunk: the next request that touches the region is refused; nothing crashes.
    os.truncate(f"/dev/shm/{key.lstrip('/')}", 16)
    expect_error(infer, "400 StatusCode.INVALID_ARGUMENT", f"'{name}'", "is now 16 bytes")

    # Removed (unlinked): the server still holds the object open; it answers either way.
    os.unlink(f"/dev/shm/{key.lstrip('/')}")
    try:
        infer()
    except InferenceServerException as e:
        assert name in e.message(), e.message()
    client.unregister_system_shared_memory(name)

    # The server keeps serving, shared memory included.
    other, other_key, other_handle = regions.create(64)
    shm.set_shared_memory_region(other_handle, [data])
    client.register_system_shared_memory(other, other_key, 64)
    client.infer("identity_fp32", [shm_input(client, "INPUT0", [1, 8], "FP32", other, 32)],
                 outputs=[shm_output(client, "OUTPUT0", other, 32, offset=32)])
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(other_handle, np.float32, [1, 8], offset=32), data)


def test_unregister_all_then_use_is_an_error(client, regions):
    name, key, _ = regions.create(16)
    client.register_system_shared_memory(name, key, 16)
    client.unregister_system_shared_memory()
    expect_error(lambda: client.infer("identity_fp32", [
        shm_input(client, "INPUT0", [1, 2], "FP32", name, 8)]),
        "404 StatusCode.NOT_FOUND", f"Unable to find shared memory region: '{name}'")


def test_server_metadata_lists_the_extension(client):
    meta = client.get_server_metadata()
    extensions = meta["extensions"] if client.protocol == "http" else list(meta.extensions)
    assert "system_shared_memory" in extensions
    assert "cuda_shared_memory" in extensions  # as Triton 2.51 lists it, GPU or not
