"""CUDA shared memory on this GPU-less host, against the real Triton 2.51 (built with GPU
support, like Nereid): both list the `cuda_shared_memory` extension, list no regions, refuse
every registration (no driver / no device can open an IPC handle) with the same code and words,
refuse malformed register bodies alike, share one namespace with system shared memory, and
unregister without error.

tritonclient's cuda_shared_memory module needs CUDA to make a handle, so the register requests
are written by hand: a 64-byte `cudaIpcMemHandle_t` (zeros; no driver here can open any), base64
in HTTP, raw bytes in gRPC. Registering a real handle, and inference reading from and writing to
device memory, need a GPU: scripts/gpu_check.sh runs tritonclient over CUDA shared memory there.
"""

import base64
import json
import uuid
from pathlib import Path

import grpc
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from nereid_util import http_raw
from triton_util import TRITON_BIN, start_pair

HANDLE = base64.b64encode(bytes(64)).decode()
REGISTER = "/v2/cudasharedmemory/region/r/register"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    assert Path(TRITON_BIN).exists(), f"{TRITON_BIN} missing: run `make triton-ref`"
    work = tmp_path_factory.mktemp("cuda_shm")
    (work / "repo").mkdir()
    servers = start_pair(work / "repo", work)
    yield servers
    for s in servers:
        s.stop()


def http_answer(server, method, path, body=None):
    status, _, data = http_raw(server.http_url, method, path, body)
    return status, (json.loads(data) if data else None)


def same_http(pair, method, path, body=None):
    nereid, triton = (http_answer(s, method, path, body) for s in pair)
    assert nereid == triton, f"{method} {path} {body}: Nereid {nereid} | Triton {triton}"
    return nereid


def grpc_answer(server, rpc, request):
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            response = getattr(stub, rpc)(request, timeout=20)
            return "OK", sorted(response.regions.keys()) if hasattr(response, "regions") else None
        except grpc.RpcError as e:
            return e.code().name, e.details()


def same_grpc(pair, rpc, request):
    nereid, triton = (grpc_answer(s, rpc, request) for s in pair)
    assert nereid == triton, f"{rpc}({request}): Nereid {nereid} | Triton {triton}"
    return nereid


def test_both_list_the_extension(pair):
    nereid, triton = (http_answer(s, "GET", "/v2")[1]["extensions"] for s in pair)
    assert "cuda_shared_memory" in triton
    assert nereid == triton


@pytest.mark.parametrize("body, expected", [
    ({"raw_handle": {"b64": HANDLE}, "device_id": 0, "byte_size": 64},
     (400, "failed to register shared memory region: invalid args")),
    ({"raw_handle": {"b64": HANDLE}, "device_id": 3, "byte_size": 64, "offset": 8},
     (400, "failed to register shared memory region: invalid args")),
    ({"device_id": 0, "byte_size": 64},
     (400, "Shared memory register request has no 'raw_handle' field")),
    ({"raw_handle": {"b64": HANDLE}, "byte_size": 64},
     (500, "attempt to access non-existing object member 'device_id'")),
    ({"raw_handle": {"b64": HANDLE}, "device_id": 0},
     (500, "attempt to access non-existing object member 'byte_size'")),
    ({"raw_handle": "x", "device_id": 0, "byte_size": 64},
     (500, "attempt to access non-existing object member 'b64'")),
    ({"raw_handle": {"b64": 5}, "device_id": 0, "byte_size": 64},
     (500, "attempt to access JSON non-string as string")),
    ({"raw_handle": {"b64": HANDLE}, "device_id": "0", "byte_size": 64},
     (500, "attempt to access JSON non-unsigned-integer as unsigned-integer")),
    ({"raw_handle": {"b64": HANDLE}, "device_id": -1, "byte_size": 64},
     (500, "attempt to access JSON non-unsigned-integer as unsigned-integer")),
    ({"raw_handle": {"b64": HANDLE}, "device_id": 0, "byte_size": -1},
     (500, "attempt to access JSON non-unsigned-integer as unsigned-integer")),
    ({"raw_handle": {"b64": "!!"}, "device_id": 0, "byte_size": 64},
     (400, "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")),
    ({"raw_handle": {"b64": base64.b64encode(bytes(10)).decode()}, "device_id": 0, "byte_size": 64},
     (400, "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t")),
], ids=["no-driver", "other-device", "no-handle", "no-device", "no-size", "handle-not-object",
        "b64-not-string", "device-string", "device-negative", "size-negative", "bad-base64",
        "short-handle"])
def test_http_register_is_refused_as_triton_refuses(pair, body, expected):
    status, answer = same_http(pair, "POST", REGISTER, body)
    assert (status, answer["error"]) == expected


def test_http_status_and_unregister(pair):
    assert same_http(pair, "GET", "/v2/cudasharedmemory/status") == (200, [])
    status, answer = same_http(pair, "GET", "/v2/cudasharedmemory/region/r/status")
    assert (status, answer["error"]) == (404, "Unable to find cuda shared memory region: 'r'")
    status, answer = same_http(pair, "POST", "/v2/cudasharedmemory/register",
                               {"raw_handle": {"b64": HANDLE}, "device_id": 0, "byte_size": 64})
    assert status == 400 and "'region name' is necessary" in answer["error"]
    assert same_http(pair, "POST", "/v2/cudasharedmemory/region/r/unregister") == (200, None)
    assert same_http(pair, "POST", "/v2/cudasharedmemory/unregister") == (200, None)


def test_grpc_answers(pair):
    handle = bytes(64)
    Register = service_pb2.CudaSharedMemoryRegisterRequest
    assert same_grpc(pair, "CudaSharedMemoryStatus",
                     service_pb2.CudaSharedMemoryStatusRequest()) == ("OK", [])
    assert same_grpc(pair, "CudaSharedMemoryStatus",
                     service_pb2.CudaSharedMemoryStatusRequest(name="r")) == (
        "NOT_FOUND", "Unable to find cuda shared memory region: 'r'")
    for request in [Register(name="r", raw_handle=handle, device_id=0, byte_size=64),
                    Register(name="r", raw_handle=handle[:3], device_id=0, byte_size=64),
                    Register(name="r", raw_handle=handle, device_id=-1, byte_size=64),
                    Register(name="", raw_handle=handle, device_id=0, byte_size=64)]:
        assert same_grpc(pair, "CudaSharedMemoryRegister", request) == (
            "INVALID_ARGUMENT", "failed to register shared memory region: invalid args")
    for name in ("r", ""):
        assert same_grpc(pair, "CudaSharedMemoryUnregister",
                         service_pb2.CudaSharedMemoryUnregisterRequest(name=name)) == ("OK", None)


def test_one_namespace_with_system_shared_memory(pair):
    import tritonclient.utils.shared_memory as shm
    key = f"/nereid_cuda_ns_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region("dup", key, 64)
    try:
        assert same_http(pair, "POST", "/v2/systemsharedmemory/region/dup/register",
                         {"key": key, "byte_size": 64}) == (200, None)
        status, answer = same_http(pair, "POST", "/v2/cudasharedmemory/region/dup/register",
                                   {"raw_handle": {"b64": HANDLE}, "device_id": 0, "byte_size": 64})
        assert (status, answer["error"]) == (400, "shared memory region 'dup' already in manager")
        status, answer = same_http(pair, "GET", "/v2/cudasharedmemory/region/dup/status")
        assert (status, answer["error"]) == (
            404, "The region named 'dup' is registered as system shared memory, not CUDA shared memory")
        assert same_grpc(pair, "CudaSharedMemoryStatus",
                         service_pb2.CudaSharedMemoryStatusRequest(name="dup"))[0] == "NOT_FOUND"
        # CUDA unregister (one, all) leaves the system region registered.
        same_http(pair, "POST", "/v2/cudasharedmemory/region/dup/unregister")
        same_http(pair, "POST", "/v2/cudasharedmemory/unregister")
        status, regions = same_http(pair, "GET", "/v2/systemsharedmemory/status")
        assert [r["name"] for r in regions] == ["dup"]
    finally:
        for server in pair:
            http_raw(server.http_url, "POST", "/v2/systemsharedmemory/unregister")
        shm.destroy_shared_memory_region(handle)
