"""Nereid's implementation of Triton's `triton_python_backend_utils` (`pb_utils`).

A Triton Python-backend model does `import triton_python_backend_utils as pb_utils` and builds
its requests, responses and tensors with the classes below. This module is Nereid's own code with
Triton's public API; it needs the standard library, NumPy (1.x or 2.x) and the stub's compiled
core `nereid_stub_core`, which is `Tensor`, `InferenceRequest`, `InferenceResponse` and
`InferenceResponseSender` and calls back into this module for DLPack, BLS calls and BYTES.

Role and flow
-------------
The stub (`nereid_stub.py`) imports this module, installs itself as the private module attribute
`_channel` and hands the model `InferenceRequest` objects built from the server's shared memory.
Everything that has to reach the server goes through `_channel`:

    model code                       this module                     _channel (the stub)
    ----------                       -----------                     -------------------
    Logger.log_info(msg)        ->   Logger.log              ->      log(level, msg)
    sender.send(resp, flags)    ->   InferenceResponseSender  ->     send_response(state, resp, flags)
    request.exec()/async_exec() ->   InferenceRequest         ->     submit_bls(request, decoupled, sink)
                                                              <-     sink.deliver(response, final)
    MetricFamily(...)           ->   MetricFamily             ->     metric_call(fields), answered
    family.Metric(...)          ->   Metric                   ->     metric_send(fields)
    metric.increment/set/...    ->   Metric                   ->     metric_send(fields)
    metric.value()              ->   Metric                   ->     metric_call(fields), answered
    (garbage family or metric)  ->   __del__                  ->     metric_release(fields)

Outside the stub (`_channel is None`, e.g. in unit tests) `Logger` writes to stderr and every
call that needs the server raises `TritonModelException`.

Differences from Triton worth knowing
-------------------------------------
* Request inputs live in CPU memory; a GPU tensor exists only when the model makes one with
  `Tensor.from_dlpack` of CUDA memory (it stays on its GPU). CPU DLPack hand-off uses NumPy's
  DLPack support (NumPy >= 1.22).
* `Tensor.triton_dtype()` returns the TRITONSERVER_DataType code (an int, e.g. 11 for FP32), as
  Triton does; `triton_to_numpy_type` accepts that code, the wire name ("FP32") or the config
  name ("TYPE_FP32"). BF16 tensors have no NumPy view (`as_numpy()` raises, as NumPy has no
  bfloat16); they go through DLPack both ways (`to_dlpack`, `from_dlpack`, e.g. with torch),
  without a copy.
* Request rescheduling (`set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)`) runs the
  request again on models with `sequence_batching { iterative_sequence: true }`; elsewhere the
  request fails with Triton's error where Triton leaves it unanswered.
"""

import base64
import enum
import itertools
import json
import math
import numbers
import queue
import re
import struct
import sys

import numpy as np

import nereid_stub_core as _core

# The stub sets this to its channel object; see the module docstring for what it provides. In a
# shared stub process it is a router to the stub of the instance the calling thread belongs to.
_channel = None

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_GPU = 2

_NOT_SUPPORTED = "is not supported by Nereid yet"


class TritonModelException(Exception):
    """Raised by pb_utils calls that fail; raising it from `execute` fails the whole batch."""

    def message(self):
        return str(self)


class TritonError:
    """An error attached to one `InferenceResponse` (fails only that request)."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message, code=INTERNAL):
        if code not in _ERROR_CODE_NAMES:
            raise TritonModelException(
                "TritonError code must be one of TritonError.UNKNOWN ... TritonError.CANCELLED, "
                "got {!r}".format(code)
            )
        self._message = "" if message is None else str(message)
        self._code = code

    def code(self):
        return self._code

    def message(self):
        return self._message

    def __str__(self):
        return self._message

    def __repr__(self):
        return "TritonError({!r}, code={})".format(self._message, _ERROR_CODE_NAMES[self._code])


# Wire names of the error codes, as used in the stub protocol's error objects.
_ERROR_CODE_NAMES = {
    TritonError.UNKNOWN: "UNKNOWN",
    TritonError.INTERNAL: "INTERNAL",
    TritonError.NOT_FOUND: "NOT_FOUND",
    TritonError.INVALID_ARG: "INVALID_ARG",
    TritonError.UNAVAILABLE: "UNAVAILABLE",
    TritonError.UNSUPPORTED: "UNSUPPORTED",
    TritonError.ALREADY_EXISTS: "ALREADY_EXISTS",
    TritonError.CANCELLED: "CANCELLED",
}
_ERROR_CODES_BY_NAME = {name: code for code, name in _ERROR_CODE_NAMES.items()}


# ---------------------------------------------------------------------------------------------
# Datatypes: wire names (KServe v2), TRITONSERVER_DataType codes, config names, NumPy types.
# ---------------------------------------------------------------------------------------------

_TYPE_CODES = {
    "BOOL": 1, "UINT8": 2, "UINT16": 3, "UINT32": 4, "UINT64": 5, "INT8": 6, "INT16": 7,
    "INT32": 8, "INT64": 9, "FP16": 10, "FP32": 11, "FP64": 12, "BYTES": 13, "BF16": 14,
}
_WIRE_BY_CODE = {code: wire for wire, code in _TYPE_CODES.items()}
_NUMPY_BY_WIRE = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32,
    "UINT64": np.uint64, "INT8": np.int8, "INT16": np.int16, "INT32": np.int32,
    "INT64": np.int64, "FP16": np.float16, "FP32": np.float32, "FP64": np.float64,
    "BYTES": np.object_,
}
# (dtype.kind, dtype.itemsize) -> wire name, for fixed-size NumPy dtypes.
_WIRE_BY_KIND_SIZE = {
    ("b", 1): "BOOL", ("u", 1): "UINT8", ("u", 2): "UINT16", ("u", 4): "UINT32",
    ("u", 8): "UINT64", ("i", 1): "INT8", ("i", 2): "INT16", ("i", 4): "INT32",
    ("i", 8): "INT64", ("f", 2): "FP16", ("f", 4): "FP32", ("f", 8): "FP64",
}


def _wire_from_any(data_type):
    """Wire name for a TRITONSERVER_DataType code, a wire name or a config name, or None."""
    if isinstance(data_type, (int, np.integer)) and not isinstance(data_type, bool):
        return _WIRE_BY_CODE.get(int(data_type))
    if isinstance(data_type, str):
        name = data_type[len("TYPE_"):] if data_type.startswith("TYPE_") else data_type
        name = "BYTES" if name == "STRING" else name
        return name if name in _TYPE_CODES else None
    return None


def _wire_from_dtype(dtype):
    """Wire name for a NumPy dtype, or None when Triton has no such datatype."""
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    return _WIRE_BY_KIND_SIZE.get((dtype.kind, dtype.itemsize))


def triton_to_numpy_type(data_type):
    """NumPy type for a Triton datatype: a TRITONSERVER_DataType code (11), "FP32" or "TYPE_FP32"."""
    wire = _wire_from_any(data_type)
    if wire == "BF16":
        raise TritonModelException("datatype BF16 has no NumPy type")
    if wire is None:
        raise TritonModelException("unknown Triton datatype {!r}".format(data_type))
    return _NUMPY_BY_WIRE[wire]


def numpy_to_triton_type(data_type):
    """TRITONSERVER_DataType code (int) for a NumPy type or dtype; bytes/str/object map to BYTES."""
    try:
        dtype = np.dtype(data_type)
    except TypeError as e:
        raise TritonModelException("not a NumPy type: {!r} ({})".format(data_type, e)) from None
    wire = _wire_from_dtype(dtype)
    if wire is None:
        raise TritonModelException("NumPy type {} has no Triton datatype".format(dtype))
    return _TYPE_CODES[wire]


def triton_string_to_numpy(triton_type_string):
    """NumPy type for a config datatype name such as "TYPE_FP32" ("TYPE_STRING" -> np.object_)."""
    if not isinstance(triton_type_string, str) or not triton_type_string.startswith("TYPE_"):
        raise TritonModelException(
            "expected a config datatype name like 'TYPE_FP32', got {!r}".format(triton_type_string)
        )
    return triton_to_numpy_type(triton_type_string)


# ---------------------------------------------------------------------------------------------
# BYTES serialization: each element is a 4-byte little-endian length, then its bytes.
# ---------------------------------------------------------------------------------------------

_U32 = struct.Struct("<I")


def _element_bytes(value):
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8")


def _serialize_bytes(array):
    """Serialized bytes of a BYTES array (object, bytes_ or str_ dtype), in C order."""
    parts = []
    for value in array.ravel(order="C").tolist():
        data = _element_bytes(value)
        parts.append(_U32.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def serialize_byte_tensor(input_tensor):
    """Serializes a BYTES NumPy array; returns a 0-d object array holding the serialized bytes
    (an empty float array for an empty input), like Triton's helper."""
    if not isinstance(input_tensor, np.ndarray) or input_tensor.dtype.kind not in ("O", "S", "U"):
        raise TritonModelException(
            "serialize_byte_tensor expects a NumPy array of dtype object, bytes_ or str_, got {}".format(
                getattr(input_tensor, "dtype", type(input_tensor).__name__)
            )
        )
    if input_tensor.size == 0:
        return np.empty([0])
    result = np.empty((), dtype=np.object_)
    result[()] = _serialize_bytes(input_tensor)
    return result


def _as_byte_buffer(encoded):
    if isinstance(encoded, np.ndarray):
        if encoded.dtype == np.object_ and encoded.size == 1:
            encoded = encoded.item()  # what serialize_byte_tensor returns
        elif encoded.dtype != np.object_:
            return memoryview(np.ascontiguousarray(encoded)).cast("B")
    if isinstance(encoded, (bytes, bytearray, memoryview)):
        return memoryview(encoded).cast("B")
    raise TritonModelException(
        "deserialize_bytes_tensor expects serialized bytes (bytes, a uint8 array or what "
        "serialize_byte_tensor returns), got {}".format(type(encoded).__name__)
    )


def deserialize_bytes_tensor(encoded_tensor):
    """Parses serialized BYTES data into a 1-D NumPy object array of `bytes`."""
    buf = _as_byte_buffer(encoded_tensor)
    total = len(buf)
    items = []
    offset = 0
    while offset < total:
        if offset + 4 > total:
            raise TritonModelException(
                "malformed BYTES data: truncated length prefix at byte {} of {}".format(offset, total)
            )
        (length,) = _U32.unpack_from(buf, offset)
        start = offset + 4
        if start + length > total:
            raise TritonModelException(
                "malformed BYTES data: element at byte {} declares {} bytes, only {} remain".format(
                    offset, length, total - start
                )
            )
        items.append(bytes(buf[start:start + length]))
        offset = start + length
    result = np.empty(len(items), dtype=np.object_)
    result[:] = items
    return result


# ---------------------------------------------------------------------------------------------
# Tensor
# ---------------------------------------------------------------------------------------------


class _CapsuleSource:
    """Adapts a bare CPU DLPack capsule to the `__dlpack__` protocol that `np.from_dlpack` expects."""

    def __init__(self, capsule, device):
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, *args, **kwargs):
        return self._capsule

    def __dlpack_device__(self):
        return self._device


# The class is compiled (nereid_stub_core.Tensor): `Tensor(name, array)` takes a NumPy array
# (BYTES: dtype object holding `bytes`; bytes_/str_ arrays are accepted too; non C-contiguous
# arrays are copied into C order). Inputs from the server are views on its shared memory, made
# when first asked for. A tensor from `from_dlpack` of GPU memory stays on its GPU (`_device`,
# a nereid_dlpack.DeviceMemory; `_array` is its host copy once one was needed). The DLPack side
# is here, called by the compiled methods; nereid_dlpack is imported by the first of them a model
# calls (0.3 MiB per stub that most models never use).
Tensor = _core.Tensor


def _copy_to_host(name, device):
    """Host copy of GPU tensor `name` (made when it first leaves the stub, kept by the tensor)."""
    import nereid_dlpack
    try:
        return nereid_dlpack.copy_to_host(device)
    except nereid_dlpack.DLPackError as e:
        raise TritonModelException("cannot copy GPU tensor '{}' to the host: {}".format(name, e)) from None


def _tensor_dlpack(tensor, kwargs):
    """`Tensor.__dlpack__` / `to_dlpack`: a capsule sharing the tensor's memory."""
    import nereid_dlpack
    if tensor._datatype == "BYTES":
        raise TritonModelException("DLPack does not have support for string tensors.")
    memory = tensor._device
    if memory is not None:
        # As Triton: no work is pending on the memory of a tensor the stub holds.
        return nereid_dlpack.export(
            tensor, memory.ptr, (nereid_dlpack.KDL_CUDA, memory.device_id), memory.shape,
            memory.datatype)
    if tensor._datatype == "BF16":
        # NumPy cannot say BF16; the capsule is made here over the same memory.
        array = np.ascontiguousarray(tensor._array)
        return nereid_dlpack.export(
            (tensor, array), array.ctypes.data, (nereid_dlpack.KDL_CPU, 0), list(array.shape),
            "BF16")
    array = tensor._array
    if not hasattr(array, "__dlpack__"):
        raise TritonModelException(_dlpack_missing_message())
    try:
        return array.__dlpack__(**kwargs)
    except TypeError:
        return array.__dlpack__()
    except BufferError as e:
        raise TritonModelException(
            "cannot export tensor '{}' through DLPack: {}".format(tensor._name, e)
        ) from None


def _tensor_dlpack_device(tensor):
    import nereid_dlpack
    memory = tensor._device
    if memory is not None:
        return (nereid_dlpack.KDL_CUDA, memory.device_id)
    return (nereid_dlpack.KDL_CPU, 0)


def _tensor_from_dlpack(name, dlpack_object):
    """`Tensor.from_dlpack`: a tensor sharing the memory of a DLPack producer (an object with
    `__dlpack__` and `__dlpack_device__`: torch tensors, CuPy and NumPy arrays) or of a DLPack
    capsule. CPU memory becomes a NumPy view; CUDA memory stays on its GPU (`is_cpu()` is False)."""
    import nereid_dlpack
    if not isinstance(name, str) or name == "":
        raise TritonModelException("Tensor name cannot be an empty string.")
    try:
        if nereid_dlpack.is_capsule(dlpack_object):
            capsule = dlpack_object
            device = nereid_dlpack.capsule_device(capsule)
        elif hasattr(dlpack_object, "__dlpack__") and hasattr(dlpack_object, "__dlpack_device__"):
            capsule = None
            device = tuple(int(d) for d in dlpack_object.__dlpack_device__())
        else:
            raise TritonModelException(
                "Provided tensor is not supported. Tensor must be a DLPack capsule or have "
                "`__dlpack__` and `__dlpack_device__` attributes"
            )
        if device[0] == nereid_dlpack.KDL_CUDA:
            if capsule is None:
                # stream=1: the producer orders its pending work before the legacy default
                # stream, which the copy to the host runs on (Array API semantics).
                capsule = dlpack_object.__dlpack__(stream=1)
            memory = nereid_dlpack.DeviceMemory(capsule)
            return Tensor._from_device(name, memory.datatype, memory)
        if device[0] not in (nereid_dlpack.KDL_CPU, nereid_dlpack.KDL_CUDA_HOST):
            raise TritonModelException(
                "DLDevice type {} is not support by Python backend.".format(device[0])
            )
        if capsule is None:
            capsule = dlpack_object.__dlpack__()
        if nereid_dlpack.capsule_datatype(capsule) == "BF16":
            # NumPy has no BF16: a zero-copy uint16 view that keeps the producer's memory.
            return Tensor._from_wire(name, "BF16", nereid_dlpack.HostMemory(capsule).array())
    except nereid_dlpack.DLPackError as e:
        raise TritonModelException("cannot import DLPack tensor '{}': {}".format(name, e)) from None
    if not hasattr(np, "from_dlpack"):
        raise TritonModelException(_dlpack_missing_message())
    try:
        array = np.from_dlpack(_CapsuleSource(capsule, device))
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        raise TritonModelException(
            "cannot import DLPack tensor '{}' (Nereid supports CPU tensors of NumPy "
            "datatypes only): {}".format(name, e)
        ) from None
    if not array.flags.c_contiguous:
        raise TritonModelException(
            "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored "
            "in C-Order are supported."
        )
    return Tensor(name, array)


def _dlpack_missing_message():
    return "DLPack needs NumPy >= 1.22; this stub runs NumPy {}".format(np.__version__)


# ---------------------------------------------------------------------------------------------
# Responses. InferenceResponse(output_tensors=[], error=None, parameters=None) is compiled
# (nereid_stub_core.InferenceResponse), as is the state a server request shares with its
# response sender and the stub (nereid_stub_core.RequestState: key, decoupled, lock, cancelled,
# closed, sent, collected, release_flags, sender). Parameters are a dict of str -> bool | int |
# str, or a JSON object string; `parameters()` gives them as a JSON string.
# ---------------------------------------------------------------------------------------------

InferenceResponse = _core.InferenceResponse


# Compiled (nereid_stub_core.InferenceResponseSender): `send(response=None, flags=0)` and
# `is_cancelled()`, Triton's checks and messages; decoupled sends go to `_channel.send_response`.
InferenceResponseSender = _core.InferenceResponseSender


def _need_reader():
    """A `cancel` may be on its way: make sure the stub reads while model code runs."""
    if _channel is not None:
        _channel.need_reader()


class _QueueSink:
    """Receives BLS responses for a blocking `exec()` or a `ResponseIterator`."""

    def __init__(self):
        self._queue = queue.SimpleQueue()

    def deliver(self, response, final):
        self._queue.put((response, final))

    def get(self):
        return self._queue.get()


class _FutureSink:
    """Receives the one response of an `async_exec()` and resolves its asyncio future."""

    def __init__(self, loop):
        self._loop = loop
        self.future = loop.create_future()

    def deliver(self, response, final):
        if not final:
            return
        try:
            self._loop.call_soon_threadsafe(_resolve_future, self.future, response)
        except RuntimeError:
            pass  # the event loop is closed: nobody awaits this call any more


def _resolve_future(future, response):
    if not future.done():
        future.set_result(_non_decoupled_result(response))


def _non_decoupled_result(response):
    if response is None:
        return InferenceResponse(error=TritonError("the server sent no response for a BLS request"))
    return response


class ResponseIterator:
    """Responses of a decoupled BLS call, ending after the final one (which may be empty)."""

    def __init__(self, sink, cancel=None):
        self._sink = sink
        self._done = False
        self._cancel = cancel

    def __iter__(self):
        return self

    def __next__(self):
        if self._done:
            raise StopIteration
        response, final = self._sink.get()
        if final:
            self._done = True
        return InferenceResponse() if response is None else response

    def cancel(self):
        """Cancels the call: the server stops the request (a Python model being called sees
        `is_cancelled()` turn true) and this iterator ends with a final response after the
        responses already on their way. Later calls do nothing."""
        if self._cancel is not None and not self._done:
            cancel, self._cancel = self._cancel, None
            cancel()


# ---------------------------------------------------------------------------------------------
# Requests
# ---------------------------------------------------------------------------------------------

class PreferredMemory:
    """Where BLS outputs should live; Nereid always returns CPU tensors."""

    def __init__(self, preferred_memory_type=TRITONSERVER_MEMORY_CPU, preferred_device_id=0):
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


_REQUIRED = object()


# The class is compiled (nereid_stub_core.InferenceRequest); its BLS constructor takes Triton's
# arguments in Triton's order (all usable as keywords): `InferenceRequest(request_id="",
# correlation_id=0, inputs, requested_output_names, model_name, model_version=-1, flags=0,
# timeout=0 (microseconds), preferred_memory=..., trace=..., parameters=None)`. The methods that
# need the stub are here.
InferenceRequest = _core.InferenceRequest


def _response_sender(state):
    """`get_response_sender()`: one sender per request."""
    with state.lock:
        if state.sender is None:
            state.sender = InferenceResponseSender(state)
        return state.sender


def _request_exec(request, decoupled):
    """`exec()`: runs `request` on another model and blocks for the result, an
    InferenceResponse, or for `decoupled=True` a ResponseIterator."""
    channel = _require_channel("InferenceRequest.exec()")
    sink = _QueueSink()
    call_id = channel.submit_bls(request, bool(decoupled), sink)
    if decoupled:
        return ResponseIterator(sink, lambda: channel.cancel_bls(call_id))
    response, _final = sink.get()
    return _non_decoupled_result(response)


async def _request_async_exec(request, decoupled):
    """`async_exec()`: the awaitable form of `exec()`."""
    if decoupled:
        return _request_exec(request, True)
    channel = _require_channel("InferenceRequest.async_exec()")
    import asyncio  # already loaded: this coroutine runs on an asyncio loop

    sink = _FutureSink(asyncio.get_running_loop())
    channel.submit_bls(request, False, sink)
    return await sink.future


def _require_channel(what):
    """The calling model instance's stub (in a shared stub process, the one this thread belongs
    to: what a metric family or a BLS call keeps talking to)."""
    channel = _channel
    if channel is None:
        raise TritonModelException("{} needs the Nereid Python stub; it is not running".format(what))
    return channel.current()


# ---------------------------------------------------------------------------------------------
# Logger
# ---------------------------------------------------------------------------------------------

class LogLevel:
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"
    VERBOSE = "VERBOSE"


class Logger:
    """Writes to the server's log (tagged with the model instance) through the stub."""

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message, level=LogLevel.INFO):
        if level not in (LogLevel.INFO, LogLevel.WARNING, LogLevel.ERROR, LogLevel.VERBOSE):
            raise TritonModelException(
                "log level must be Logger.INFO, WARNING, ERROR or VERBOSE, got {!r}".format(level)
            )
        channel = _channel
        if channel is None:
            sys.stderr.write("[{}] {}\n".format(level, message))
        else:
            channel.log(level, str(message))

    @staticmethod
    def log_info(message):
        Logger.log(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message):
        Logger.log(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message):
        Logger.log(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message):
        Logger.log(message, LogLevel.VERBOSE)


# ---------------------------------------------------------------------------------------------
# Model configuration (auto_complete_config) and config helpers
# ---------------------------------------------------------------------------------------------

def _config_dict(model_config):
    return model_config.as_dict() if isinstance(model_config, ModelConfig) else model_config


def _dims(value):
    return [int(d) for d in value or []]


class ModelConfig:
    """The model configuration handed to `auto_complete_config`; edits apply to `as_dict()`.

    Conflicts with what `config.pbtxt` already says raise ValueError naming the model.
    """

    def __init__(self, model_config):
        config = json.loads(model_config) if isinstance(model_config, str) else model_config
        if not isinstance(config, dict):
            raise TritonModelException("ModelConfig expects a dict or a JSON object string")
        self._config = json.loads(json.dumps(config))

    def as_dict(self):
        return self._config

    def _model(self):
        return "'{}'".format(self._config.get("name", ""))

    def set_max_batch_size(self, max_batch_size):
        if not isinstance(max_batch_size, int) or isinstance(max_batch_size, bool) or max_batch_size < 0:
            raise ValueError("max_batch_size must be a non-negative int, got {!r}".format(max_batch_size))
        current = int(self._config.get("max_batch_size", 0) or 0)
        if current not in (0, max_batch_size):
            raise ValueError(
                "configuration specified max_batch_size {}, but auto-complete-config function for "
                "model {} specified max_batch_size {}".format(current, self._model(), max_batch_size)
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self):
        if "sequence_batching" in self._config:
            raise ValueError(
                "configuration specified scheduling_choice as 'sequence_batching', but "
                "auto-complete-config function for model {} tries to set scheduling_choice as "
                "'dynamic_batching'".format(self._model())
            )
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input):
        self._add_io("input", input)

    def add_output(self, output):
        self._add_io("output", output)

    def _add_io(self, kind, entry):
        if not isinstance(entry, dict):
            raise ValueError("{} passed to add_{} for model {} must be a dict".format(
                kind, kind, self._model()))
        for field in ("name", "data_type", "dims"):
            if field not in entry:
                raise ValueError("{} '{}' in auto-complete-config function for model {} is missing "
                                 "'{}' property".format(kind, entry.get("name", ""), self._model(), field))
        entries = self._config.setdefault(kind, [])
        existing = next((e for e in entries if e.get("name") == entry["name"]), None)
        if existing is None:
            entries.append(dict(entry))
            return
        self._merge_io(kind, existing, entry)

    def _merge_io(self, kind, existing, entry):
        current_type = existing.get("data_type", "TYPE_INVALID")
        if current_type not in ("TYPE_INVALID", "", entry["data_type"]):
            raise ValueError(
                "unable to override data_type '{}' to '{}' for {} '{}' of model {}".format(
                    current_type, entry["data_type"], kind, entry["name"], self._model()))
        current_dims = _dims(existing.get("dims"))
        if current_dims and current_dims != _dims(entry["dims"]):
            raise ValueError(
                "unable to override dims {} to {} for {} '{}' of model {}".format(
                    current_dims, _dims(entry["dims"]), kind, entry["name"], self._model()))
        for field, value in entry.items():
            existing.setdefault(field, value)
        existing["data_type"] = entry["data_type"]
        existing["dims"] = list(entry["dims"])

    def set_model_transaction_policy(self, transaction_policy_dict):
        if not isinstance(transaction_policy_dict, dict) or set(transaction_policy_dict) - {"decoupled"}:
            raise ValueError(
                "model transaction policy for model {} accepts only the key 'decoupled', got "
                "{!r}".format(self._model(), transaction_policy_dict))
        policy = self._config.setdefault("model_transaction_policy", {})
        policy.update(transaction_policy_dict)

    def add_batch_input(self, batch_input):
        self._config.setdefault("batch_input", []).append(dict(batch_input))

    def add_batch_output(self, batch_output):
        self._config.setdefault("batch_output", []).append(dict(batch_output))


def _find_by_name(entries, name):
    for entry in entries or []:
        if entry.get("name") == name:
            return entry
    return None


def get_input_tensor_by_name(inference_request, name):
    """The input Tensor called `name`, or None."""
    return next((t for t in inference_request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(inference_response, name):
    """The output Tensor called `name`, or None."""
    return next((t for t in inference_response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config, name):
    """The config dict of input `name` (model_config: dict or ModelConfig), or None."""
    return _find_by_name(_config_dict(model_config).get("input"), name)


def get_output_config_by_name(model_config, name):
    """The config dict of output `name` (model_config: dict or ModelConfig), or None."""
    return _find_by_name(_config_dict(model_config).get("output"), name)


def using_decoupled_model_transaction_policy(model_config):
    """True when the config sets model_transaction_policy.decoupled."""
    policy = _config_dict(model_config).get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False))


# ---------------------------------------------------------------------------------------------
# Not supported by Nereid yet
# ---------------------------------------------------------------------------------------------

def load_model(model_name, config="", files=None):
    """Loads (or reloads) `model_name` in the server, as the repository API's load does: with
    `config` (a ModelConfig as a JSON string) replacing its config.pbtxt, and `files`
    ({"file:<version>/<path>": bytes}) as its model directory. Blocks until the load finished;
    raises TritonModelException with the server's error (the server must run in
    `--model-control-mode explicit`)."""
    if not isinstance(model_name, str) or not model_name:
        raise TritonModelException("load_model: model_name must be a non-empty str, got {!r}".format(model_name))
    if not isinstance(config, str):
        raise TritonModelException("load_model: config must be a JSON str, got {!r}".format(type(config).__name__))
    encoded = {}
    for name, data in (files or {}).items():
        if not isinstance(name, str) or not name.startswith("file:"):
            raise TritonModelException(
                "load_model: file names must be strings of the form 'file:<version>/<path>', got {!r}".format(name))
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TritonModelException("load_model: file '{}' must be bytes, got {}".format(name, type(data).__name__))
        encoded[name] = base64.b64encode(bytes(data)).decode("ascii")
    channel = _require_channel("load_model()")
    channel.model_control("load", {"model_name": model_name, "config": config, "files": encoded})


def unload_model(model_name, unload_dependents=False):
    """Unloads `model_name` from the server (with `unload_dependents`, also the models only its
    ensemble used); blocks until it is unloaded."""
    if not isinstance(model_name, str) or not model_name:
        raise TritonModelException("unload_model: model_name must be a non-empty str, got {!r}".format(model_name))
    channel = _require_channel("unload_model()")
    channel.model_control("unload", {"model_name": model_name, "unload_dependents": bool(unload_dependents)})


def is_model_ready(model_name, model_version=""):
    """True when `model_name` (`model_version`, a number as a str; "" for the latest) is loaded
    and ready; False for a model the server does not have."""
    if not isinstance(model_name, str) or not model_name:
        raise TritonModelException("is_model_ready: model_name must be a non-empty str, got {!r}".format(model_name))
    if not isinstance(model_version, str):
        raise TritonModelException("is_model_ready: model_version must be a str, got {!r}".format(model_version))
    channel = _require_channel("is_model_ready()")
    return channel.model_control("ready", {"model_name": model_name, "model_version": model_version})


# ---------------------------------------------------------------------------------------------
# Custom metrics
# ---------------------------------------------------------------------------------------------

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
# Names families and metrics in the server's registry; unique within the stub.
_metric_handles = itertools.count(1)


class MetricKind(enum.IntEnum):
    """The kind of a MetricFamily (also `MetricFamily.COUNTER`, `GAUGE`, `HISTOGRAM`)."""

    COUNTER = 0
    GAUGE = 1
    HISTOGRAM = 2


def _metric_kind(kind, failure):
    if not isinstance(kind, bool):
        try:
            return MetricKind(kind)
        except (ValueError, TypeError):
            pass
    raise TritonModelException("{}: kind must be MetricFamily.COUNTER, MetricFamily.GAUGE or "
                               "MetricFamily.HISTOGRAM, got {!r}".format(failure, kind))


def _metric_number(value, failure):
    if not isinstance(value, numbers.Real):
        raise TritonModelException("{}: the value must be a number, got {!r}".format(failure, value))
    return float(value)


def _wire_float(value):
    """A float as the stub protocol carries it: JSON has no spelling for NaN and infinities."""
    if math.isfinite(value):
        return value
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


def _metric_call(channel, fields, failure):
    """A custom-metric call the server answers; its value, or TritonModelException."""
    answer = channel.metric_call(fields)
    error = answer.get("error")
    if error is not None:
        raise TritonModelException("{}: {}".format(failure, error.get("message", "")))
    value = answer.get("value")
    return None if value is None else float(value)


class MetricFamily:
    """A custom metric family (Prometheus counter, gauge or histogram) on the server's /metrics.

    Families are shared by name across the server: another MetricFamily with the same name and
    kind (in this model or another) is the same family, and the first description is kept; the
    same name with another kind raises. The family stays on the server while this object or one
    of its metrics is alive, and never longer than the model instance.
    """

    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM
    _handle = None  # set once the server has the family

    def __init__(self, name, description, kind):
        failure = "Error when creating MetricFamily"
        if not isinstance(name, str) or not isinstance(description, str):
            raise TritonModelException("{}: name and description must be str, got {!r} and {!r}".format(
                failure, name, description))
        self._kind = _metric_kind(kind, failure)
        if not _METRIC_NAME.match(name) or name.startswith("__"):
            raise TritonModelException(
                "{}: Invalid metric name '{}': a name must match [a-zA-Z_:][a-zA-Z0-9_:]* and must "
                "not start with '__'".format(failure, name))
        self._channel = _require_channel("MetricFamily")
        handle = next(_metric_handles)
        _metric_call(self._channel, {"action": "family_new", "family": handle, "name": name,
                                     "description": description, "kind": self._kind.name}, failure)
        self._name = name
        self._handle = handle

    def Metric(self, labels=None, buckets=None):
        """A metric of this family with `labels` ({name: value}, all str); histograms need
        `buckets`, the upper bounds of their buckets in increasing order (+Inf is implicit). The
        same labels give the same metric."""
        return Metric(self, labels, buckets)

    def __del__(self):
        if self._handle is not None:
            self._channel.metric_release({"action": "family_delete", "family": self._handle})


class Metric:
    """One labelled metric of a MetricFamily; made by `MetricFamily.Metric(labels, buckets)`.
    Changes go to the server without waiting; `value()` asks the server."""

    _handle = None  # set once the creation is sent

    def __init__(self, family, labels=None, buckets=None):
        if not isinstance(family, MetricFamily) or family._handle is None:
            raise TritonModelException("a Metric is made by MetricFamily.Metric(labels, buckets)")
        labels = {} if labels is None else labels
        if not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        failure = "Error when creating Metric"
        for key, value in labels.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TritonModelException("{}: label names and values must be str, got {!r}: {!r}".format(
                    failure, key, value))
            if (not _LABEL_NAME.match(key) or key.startswith("__")
                    or (key == "le" and family._kind == MetricKind.HISTOGRAM)):
                raise TritonModelException(
                    "{}: Invalid label name '{}': a label name must match [a-zA-Z_][a-zA-Z0-9_]* and "
                    "must not start with '__' ('le' is reserved in histograms)".format(failure, key))
        fields = {"action": "new", "family": family._handle, "labels": dict(labels)}
        if family._kind == MetricKind.HISTOGRAM:
            if buckets is None:
                raise TritonModelException("Failed to create metric. Missing required buckets.")
            if not isinstance(buckets, (list, tuple)):
                raise TritonModelException("Failed to create metric. Buckets must be a list.")
            bounds = [_metric_number(b, failure) for b in buckets]
            if not all(math.isfinite(b) for b in bounds) or any(a >= b for a, b in zip(bounds, bounds[1:])):
                raise TritonModelException(
                    "{}: Bucket boundaries must be finite and strictly sorted, got {!r}".format(failure, bounds))
            fields["buckets"] = bounds
        elif buckets is not None:
            raise TritonModelException("Failed to create metric. Unexpected buckets found.")
        # The family lives on the server at least as long as its metrics.
        self._family = family
        self._kind = family._kind
        handle = next(_metric_handles)
        family._channel.metric_send(dict(fields, metric=handle))
        self._handle = handle

    def _refuse(self, failure, op):
        raise TritonModelException("{}: TRITONSERVER_METRIC_KIND_{} does not support {}".format(
            failure, self._kind.name, op))

    def _send(self, action, value):
        self._family._channel.metric_send(
            {"action": action, "metric": self._handle, "value": _wire_float(value)})

    def increment(self, value):
        """Adds `value` (counters: never negative)."""
        failure = "Failed to increment metric value"
        value = _metric_number(value, failure)
        if self._kind == MetricKind.HISTOGRAM:
            self._refuse(failure, "Increment")
        if self._kind == MetricKind.COUNTER and value < 0:
            raise TritonModelException(
                "{}: TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by "
                "non-negative values.".format(failure))
        self._send("increment", value)

    def set(self, value):
        """Sets a gauge to `value`."""
        failure = "Failed to set metric value"
        value = _metric_number(value, failure)
        if self._kind != MetricKind.GAUGE:
            self._refuse(failure, "Set")
        self._send("set", value)

    def observe(self, value):
        """Records one observation of a histogram."""
        failure = "Failed to observe metric value"
        value = _metric_number(value, failure)
        if self._kind != MetricKind.HISTOGRAM:
            self._refuse(failure, "Observe")
        self._send("observe", value)

    def value(self):
        """A counter's or gauge's value, as the server has it."""
        failure = "Failed to get metric value"
        if self._kind == MetricKind.HISTOGRAM:
            self._refuse(failure, "Value")
        return _metric_call(self._family._channel, {"action": "value", "metric": self._handle}, failure)

    def __del__(self):
        if self._handle is not None:
            self._family._channel.metric_release({"action": "delete", "metric": self._handle})


# The compiled classes call back into this module (DLPack, BLS, senders, BYTES, errors).
_core.install(sys.modules[__name__])
