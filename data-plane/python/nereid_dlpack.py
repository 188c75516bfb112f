"""DLPack for Nereid's Python stub: reading capsules, device tensors, and copies off the GPU.

`triton_python_backend_utils.Tensor` keeps CPU tensors as NumPy arrays (NumPy's own
`from_dlpack`/`__dlpack__` share their memory). BF16, which NumPy has no type for, is kept as
uint16 bits: it goes out through `export` (DLPack code kDLBfloat) and comes in as a `HostMemory`
view, both without a copy. A tensor whose DLPack device is CUDA
(kDLCUDA = 2) cannot be a NumPy array, so it is kept here as a `DeviceMemory`: the producer's
DLManagedTensor, taken over from its capsule (renamed "used_dltensor", as consumers do) and
released through its deleter when the last Tensor using it goes. `export` hands the same device
memory out again in a fresh capsule; `copy_to_host` copies it once through the CUDA driver API
(libcuda.so.1, loaded on first use, so a stub without a GPU never touches CUDA) when the tensor
leaves the stub as an output.

    producer.__dlpack__(stream=1) -> capsule --take--> DeviceMemory --export--> capsule (same ptr)
                                                            |
                                                            +--copy_to_host--> numpy (output)

Only plain ctypes: the structs below are DLPack's ABI (dlpack.h, v0.8 unversioned and v1.x
versioned managed tensors).
"""

import ctypes

import numpy as np

KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3

_NAME = b"dltensor"
_NAME_VERSIONED = b"dltensor_versioned"
_USED = b"used_dltensor"
_USED_VERSIONED = b"used_dltensor_versioned"


class DLPackError(Exception):
    """What went wrong, in Triton's words where Triton has some; the caller names the tensor."""


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _Device),
        ("ndim", ctypes.c_int32),
        ("dtype", _DataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class _Managed(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    _fields_ = [
        ("version", _Version),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", _DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", _DLTensor),
    ]


def _capi(name, restype, *argtypes):
    prototype = ctypes.PYFUNCTYPE(restype, *argtypes)
    return prototype((name, ctypes.pythonapi))


_is_valid = _capi("PyCapsule_IsValid", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_get_pointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
_set_name = _capi("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_new_capsule = _capi("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p,
                     _CAPSULE_DESTRUCTOR)
_raw_is_valid = _capi("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
_raw_get_pointer = _capi("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)

# (DLPack type code, bits) -> Triton datatype; lanes must be 1.
_DATATYPES = {
    (0, 8): "INT8", (0, 16): "INT16", (0, 32): "INT32", (0, 64): "INT64",
    (1, 8): "UINT8", (1, 16): "UINT16", (1, 32): "UINT32", (1, 64): "UINT64",
    (2, 16): "FP16", (2, 32): "FP32", (2, 64): "FP64",
    (4, 16): "BF16", (6, 8): "BOOL",
}
_CODES = {datatype: key for key, datatype in _DATATYPES.items()}
_NUMPY = {
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64,
    "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "FP16": np.float16, "FP32": np.float32, "FP64": np.float64, "BF16": np.uint16, "BOOL": np.bool_,
}


def is_capsule(value):
    return type(value).__name__ == "PyCapsule"


def _managed(capsule):
    """(struct, versioned) of an unconsumed DLPack capsule, or DLPackError."""
    if _is_valid(capsule, _NAME):
        return _Managed.from_address(_get_pointer(capsule, _NAME)), False
    if _is_valid(capsule, _NAME_VERSIONED):
        return _ManagedVersioned.from_address(_get_pointer(capsule, _NAME_VERSIONED)), True
    raise DLPackError("the DLPack capsule was already consumed or is not a DLPack tensor")


def capsule_device(capsule):
    """(device_type, device_id) of a capsule, without consuming it."""
    managed, _ = _managed(capsule)
    device = managed.dl_tensor.device
    return int(device.device_type), int(device.device_id)


class _TakenMemory:
    """A DLPack tensor taken over from its capsule (renamed "used_dltensor", as consumers do);
    the producer's deleter runs when this object goes. Subclasses say which devices they take."""

    _DEVICES = ()
    _WRONG_DEVICE = "DLDevice type {} is not supported here"

    def __init__(self, capsule):
        managed, versioned = _managed(capsule)
        t = managed.dl_tensor
        if t.device.device_type not in self._DEVICES:
            raise DLPackError(self._WRONG_DEVICE.format(t.device.device_type))
        key = (int(t.dtype.code), int(t.dtype.bits))
        if t.dtype.lanes != 1 or key not in _DATATYPES:
            raise DLPackError(
                "DLPack datatype (code {}, bits {}, lanes {}) has no Triton datatype".format(
                    key[0], key[1], t.dtype.lanes))
        shape = [int(t.shape[i]) for i in range(t.ndim)]
        if t.strides:
            expected = 1
            for i in reversed(range(t.ndim)):
                if shape[i] != 1 and int(t.strides[i]) != expected:
                    raise DLPackError(
                        "DLPack tensor is not contiguous. Only contiguous DLPack tensors that "
                        "are stored in C-Order are supported.")
                expected *= shape[i]
        self.datatype = _DATATYPES[key]
        self.shape = shape
        self.device_id = int(t.device.device_id)
        self.ptr = (t.data or 0) + int(t.byte_offset)
        self.nbytes = int(np.prod(shape, dtype=np.int64)) * ((key[1] + 7) // 8)
        self._managed = managed
        _set_name(capsule, _USED_VERSIONED if versioned else _USED)

    def __del__(self):
        managed = getattr(self, "_managed", None)
        if managed is not None and managed.deleter:
            self._managed = None
            managed.deleter(ctypes.addressof(managed))


class DeviceMemory(_TakenMemory):
    """A DLPack tensor on a CUDA device."""

    _DEVICES = (KDL_CUDA,)
    _WRONG_DEVICE = "DLDevice type {} is not a CUDA device"


class HostMemory(_TakenMemory):
    """A DLPack tensor in host memory whose datatype NumPy has no type for (BF16): `array()` is a
    zero-copy view of it as NumPy's stand-in type (uint16 for BF16), which keeps this object (and
    so the producer's memory) alive."""

    _DEVICES = (KDL_CPU, KDL_CUDA_HOST)
    _WRONG_DEVICE = "DLDevice type {} is not host memory"

    @property
    def __array_interface__(self):
        return {"shape": tuple(self.shape), "typestr": np.dtype(_NUMPY[self.datatype]).newbyteorder("<").str,
                "data": (self.ptr, False), "version": 3}

    def array(self):
        if self.nbytes == 0:
            return np.empty(self.shape, _NUMPY[self.datatype])
        return np.asarray(self)


def capsule_datatype(capsule):
    """The Triton datatype of a capsule's tensor (None when it has none), without consuming it."""
    managed, _ = _managed(capsule)
    dtype = managed.dl_tensor.dtype
    return _DATATYPES.get((int(dtype.code), int(dtype.bits))) if dtype.lanes == 1 else None


# Capsules handed out by `export`, kept alive until their consumer (or their capsule) lets go.
_EXPORTED = {}


@_DELETER
def _release_export(address):
    _EXPORTED.pop(address, None)


@_CAPSULE_DESTRUCTOR
def _destroy_capsule(capsule):
    # Still named "dltensor": nobody consumed it, so its deleter is ours to call.
    if _raw_is_valid(capsule, _NAME):
        _EXPORTED.pop(_raw_get_pointer(capsule, _NAME), None)


def export(owner, ptr, device, shape, datatype):
    """A new unversioned "dltensor" capsule over `ptr` (C-order `shape` of `datatype` on
    `device` = (type, id)); `owner` is kept alive until the consumer calls the deleter."""
    code, bits = _CODES[datatype]
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    managed = _Managed()
    managed.dl_tensor.data = ptr
    managed.dl_tensor.device = _Device(device[0], device[1])
    managed.dl_tensor.ndim = len(shape)
    managed.dl_tensor.dtype = _DataType(code, bits, 1)
    managed.dl_tensor.shape = dims
    managed.dl_tensor.strides = None
    managed.dl_tensor.byte_offset = 0
    managed.deleter = _release_export
    address = ctypes.addressof(managed)
    _EXPORTED[address] = (owner, managed, dims)
    return _new_capsule(address, _NAME, _destroy_capsule)


class _Cuda:
    """The CUDA driver API, loaded on first use."""

    _lib = None

    @classmethod
    def lib(cls):
        if cls._lib is None:
            try:
                lib = ctypes.CDLL("libcuda.so.1")
            except OSError as e:
                raise DLPackError(
                    "the CUDA driver (libcuda.so.1) cannot be loaded: {}".format(e)) from None
            cls._check(lib, lib.cuInit(0), "cuInit")
            cls._lib = lib
        return cls._lib

    @staticmethod
    def _check(lib, status, what):
        if status != 0:
            text = ctypes.c_char_p()
            lib.cuGetErrorString(status, ctypes.byref(text))
            reason = text.value.decode() if text.value else "error {}".format(status)
            raise DLPackError("{} failed: {}".format(what, reason))


def copy_to_host(memory):
    """A NumPy array holding a copy of `memory` (a DeviceMemory), made on its device's primary
    context; synchronous (the legacy default stream, the stream `__dlpack__(stream=1)` asked the
    producer to order its work before)."""
    lib = _Cuda.lib()
    host = np.empty(memory.shape, dtype=_NUMPY[memory.datatype])
    if memory.nbytes == 0:
        return host
    device = ctypes.c_int()
    context = ctypes.c_void_p()
    _Cuda._check(lib, lib.cuDeviceGet(ctypes.byref(device), memory.device_id), "cuDeviceGet")
    _Cuda._check(lib, lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
                 "cuDevicePrimaryCtxRetain")
    try:
        _Cuda._check(lib, lib.cuCtxPushCurrent_v2(context), "cuCtxPushCurrent")
        try:
            _Cuda._check(lib, lib.cuMemcpyDtoH_v2(
                ctypes.c_void_p(host.ctypes.data), ctypes.c_uint64(memory.ptr),
                ctypes.c_size_t(memory.nbytes)), "cuMemcpyDtoH")
        finally:
            lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    finally:
        lib.cuDevicePrimaryCtxRelease_v2(device)
    return host
