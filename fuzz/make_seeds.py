#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/: a few small valid inputs per target
(and a few near misses), in each target's input format (see fuzz/fuzz_targets/*.rs). Standard
library only; rerun after changing an input format: python3 fuzz/make_seeds.py"""

import json
import shutil
import struct
from pathlib import Path

FUZZ = Path(__file__).resolve().parent
ROOT = FUZZ.parent
CORPUS = FUZZ / "corpus"


def write(target, name, data):
    path = CORPUS / target / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def compact(obj):
    return json.dumps(obj, separators=(",", ":"))


# ----- http_infer_body: "<header>[|<TYPE_x> <max_batch> <dims>]\n<body>" -----------------------
def http_seeds():
    t = "http_infer_body"
    write(t, "json_fp32", "\n" + compact({
        "id": "r1",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [[1.0, 2.5]]}],
        "outputs": [{"name": "OUTPUT0"}],
    }))
    header = compact({
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [2],
                    "parameters": {"binary_data_size": 8}},
                   {"name": "INPUT1", "datatype": "BYTES", "shape": [1],
                    "parameters": {"binary_data_size": 7}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        "parameters": {"binary_data_output": False},
    })
    binary = struct.pack("<ii", 7, -1) + struct.pack("<I", 3) + b"abc"
    write(t, "json_binary", f"{len(header)}\n{header}".encode() + binary)
    write(t, "json_options", "\n" + compact({
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": ["hi", "there"]},
                   {"name": "FLAGS", "datatype": "BOOL", "shape": [2], "data": [True, False]},
                   {"name": "BIG", "datatype": "UINT64", "shape": [1], "data": [18446744073709551615]}],
        "parameters": {"priority": 1, "timeout": 1000, "sequence_id": "s", "sequence_start": True,
                       "custom": 1.5, "n": -3},
        "outputs": [{"name": "OUT", "parameters": {"binary_data": False, "class": 1}}],
    }))
    write(t, "json_shm", "\n" + compact({
        "inputs": [{"name": "X", "datatype": "INT8", "shape": [4],
                    "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4,
                                   "shared_memory_offset": 0}}],
        "outputs": [{"name": "Y", "parameters": {"shared_memory_region": "r",
                                                 "shared_memory_byte_size": 4}}],
    }))
    write(t, "raw_fp32", b"0|TYPE_FP32 8 -1 2\n" + struct.pack("<4f", 1, 2, 3, 4))
    write(t, "raw_bytes", b"0|TYPE_STRING 0 1\nhello")
    write(t, "bad_header", "12x\n{}")


# ----- grpc_infer_request: a ModelInferRequest in protobuf ------------------------------------
def varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(number, wire, payload):
    key = varint(number << 3 | wire)
    if wire == 0:
        return key + varint(payload)
    if wire == 1:
        return key + payload
    return key + varint(len(payload)) + payload


def string(number, text):
    return field(number, 2, text.encode() if isinstance(text, str) else text)


def packed(number, values, fmt=None):
    body = b"".join(varint(v) for v in values) if fmt is None else b"".join(
        struct.pack(fmt, v) for v in values)
    return field(number, 2, body)


def param(kind, value):
    if kind == "bool":
        return field(1, 0, int(value))
    if kind == "int64":
        return field(2, 0, value)
    if kind == "string":
        return string(3, value)
    if kind == "double":
        return field(4, 1, struct.pack("<d", value))
    return field(5, 0, value)  # uint64


def param_map(number, params):
    return b"".join(field(number, 2, string(1, k) + field(2, 2, param(*v)))
                    for k, v in params.items())


def tensor(name, datatype, shape, params=None, contents=b""):
    body = string(1, name) + string(2, datatype) + packed(3, shape)
    body += param_map(4, params or {})
    if contents:
        body += field(5, 2, contents)
    return body


def grpc_seeds():
    t = "grpc_infer_request"
    raw = (string(1, "m") + string(2, "1") + string(3, "req")
           + field(5, 2, tensor("INPUT0", "FP32", [1, 2]))
           + field(6, 2, string(1, "OUTPUT0"))
           + string(7, struct.pack("<2f", 1.0, 2.0)))
    write(t, "raw_fp32", raw)
    typed = (string(1, "m")
             + param_map(4, {"priority": ("uint64", 2), "sequence_id": ("string", "seq"),
                             "sequence_start": ("bool", True), "custom": ("double", 0.5),
                             "n": ("int64", -4)})
             + field(5, 2, tensor("I", "INT32", [3], contents=packed(2, [1, 2, 3])))
             + field(5, 2, tensor("S", "BYTES", [2], contents=string(8, "a") + string(8, "bc")))
             + field(5, 2, tensor("F", "FP64", [1], contents=packed(7, [2.5], "<d")))
             + field(6, 2, string(1, "O") + param_map(2, {"classification": ("int64", 2)})))
    write(t, "typed_contents", typed)
    shm = (string(1, "m")
           + field(5, 2, tensor("X", "UINT8", [4], {"shared_memory_region": ("string", "r"),
                                                     "shared_memory_byte_size": ("int64", 4)})))
    write(t, "shared_memory", shm)
    stream = string(1, "m") + param_map(4, {"triton_enable_empty_final_response": ("bool", True)})
    write(t, "stream_flag", stream)


# ----- router_wire_scan: a ModelInferRequest in protobuf, as the router's scanner reads it ------
def router_wire_seeds():
    t = "router_wire_scan"
    shm = {"shared_memory_region": ("string", "r"), "shared_memory_byte_size": ("int64", 4)}
    routed = (string(1, "m") + string(2, "2") + string(3, "req")
              + param_map(4, {"sequence_id": ("uint64", 7), "sequence_start": ("bool", True),
                              "sequence_end": ("bool", False), "priority": ("uint64", 1)})
              + field(5, 2, tensor("a", "INT32", [1, 16]))
              + field(5, 2, tensor("b", "FP32", [2], contents=packed(1, [1.0, 2.0], "<f")))
              + field(6, 2, string(1, "y"))
              + string(7, struct.pack("<16i", *range(16))))
    write(t, "sequence", routed)
    write(t, "string_sequence", string(1, "m")
          + param_map(4, {"sequence_id": ("string", "s-1"), "sequence_end": ("bool", True)}))
    write(t, "shared_memory", string(1, "m")
          + field(6, 2, string(1, "y") + param_map(2, shm))
          + field(5, 2, tensor("x", "UINT8", [4], shm)))
    # Unpacked dims, unknown fields of every wire type and a nested group.
    unpacked = string(1, "x") + field(3, 0, 4) + field(3, 0, (1 << 64) - 1)
    write(t, "unknown_fields", string(1, "m") + field(5, 2, unpacked)
          + field(8, 0, 150) + field(9, 1, b"12345678") + field(11, 5, b"1234")
          + varint(12 << 3 | 3) + field(1, 0, 5) + varint(2 << 3 | 3) + varint(2 << 3 | 4)
          + varint(12 << 3 | 4))
    write(t, "no_model_name", string(2, "1") + field(6, 2, string(1, "y")))
    # At prost's nesting limit: 100 groups at the top level, 99 inside an input (one more each
    # is refused).
    def groups(n):
        return varint(9 << 3 | 3) * n + varint(9 << 3 | 4) * n
    write(t, "nested_groups", string(1, "m") + groups(100)
          + field(5, 2, string(1, "x") + groups(99)))


# ----- router_http_scan: "[<Inference-Header-Content-Length>\n]<body>" ------------------------
def router_http_seeds():
    t = "router_http_scan"
    write(t, "json", compact({
        "id": "r1",
        "parameters": {"sequence_id": 7, "sequence_start": True, "priority": 2},
        "inputs": [{"name": "a", "shape": [2, 3], "datatype": "FP32",
                    "data": [[1, 2, 3], [4.5, 5, 6]]},
                   {"name": "b", "shape": [1], "datatype": "BYTES", "data": ["x"],
                    "extra": {"k": [1, None]}}],
        "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
        "unknown": {"deep": [1, 2, {"x": None}]},
    }))
    header = compact({
        "id": "bin",
        "parameters": {"sequence_id": "s", "sequence_end": True},
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [2],
                    "parameters": {"binary_data_size": 8}}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    })
    write(t, "binary", f"{len(header)}\n{header}".encode() + struct.pack("<ii", 7, -1))
    write(t, "shared_memory", compact({
        "inputs": [{"name": "x", "datatype": "INT8", "shape": [4],
                    "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4}}],
        "outputs": [{"name": "y", "parameters": {"shared_memory_region": "r"}}],
    }))
    write(t, "raw", b"0\n" + struct.pack("<4f", 1, 2, 3, 4))
    # Near misses: what the typed decoder refuses (null keys, an array for a tensor), and the
    # two intended differences (a repeated key; what only decoding the skipped data refuses).
    write(t, "null_keys", '{"id":null,"parameters":null,"inputs":[{"name":"a","shape":[1],'
          '"parameters":null}],"outputs":null}')
    write(t, "array_tensor", '{"inputs":[["a",[1],{"shared_memory_region":"r"}]],'
          '"outputs":[["y"]]}')
    write(t, "repeated_key", '{"id":"a","parameters":{"sequence_id":1},"id":"b",'
          '"inputs":[{"name":"a","shape":[1],"data":[1],"data":[2]}]}')
    write(t, "undecodable_data", '{"inputs":[{"name":"a","shape":[2],'
          '"data":["\\ud800",1e400]}]}')
    write(t, "escapes", '{"id":"\\u00e9\\ud83d\\ude00","inputs":[{"name":"\\"q\\"",'
          '"shape":[0],"data":[],"parameters":{}}],"outputs":[]}')


# ----- model_config: config.pbtxt text --------------------------------------------------------
CONFIGS = [
    "tests/models/pytorch/types_script/config.pbtxt",
    "tests/models/pytorch/mlp_script/config.pbtxt",
    "docs/examples/pipelines/classify_pipeline/config.pbtxt",
    "docs/examples/pipelines/tokenizer/config.pbtxt",
    "data-plane/tests/python_models/decoupled/config.pbtxt",
]


def config_seeds():
    for t in ("model_config", "model_config_text"):
        config_seeds_for(t)


def config_seeds_for(t):
    for rel in CONFIGS:
        src = ROOT / rel
        write(t, src.parent.name, src.read_bytes())
    write(t, "sequence_onnx", """name: "seq"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ -1 ] } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 4 }
  control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
  state [ { input_name: "IN_STATE" output_name: "OUT_STATE" data_type: TYPE_FP32 dims: [ 2 ] } ]
}
instance_group [ { count: 2 kind: KIND_CPU } ]
""")
    write(t, "dynamic_python", """backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] optional: true } ]
output [ { name: "Y" data_type: TYPE_STRING dims: [ 1 ] } ]
dynamic_batching { preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 100
  default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 10 allow_timeout_override: true max_queue_size: 3 }
  priority_levels: 2 default_priority_level: 1 }
parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }
model_warmup [ { name: "w" batch_size: 1 inputs { key: "X" value: { data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } } ]
response_cache { enable: true }
""")


# ----- python_stub_frames: "<u32 LE length><JSON>" frames -------------------------------------
def frame(obj):
    body = compact(obj).encode()
    return struct.pack("<I", len(body)) + body


def stub_seeds():
    t = "python_stub_frames"
    out0 = {"name": "OUT0", "datatype": "INT32", "shape": [2], "offset": 0, "nbytes": 8}
    text = {"name": "TEXT", "datatype": "BYTES", "shape": [1], "offset": 64, "nbytes": 4}
    write(t, "execute_done", frame({"op": "execute_done", "id": 1, "segment": "s0", "error": None,
                                    "responses": [{"outputs": [out0], "error": None,
                                                   "parameters": {"p": 1}}]}))
    write(t, "decoupled", frame({"op": "response", "key": 1, "flags": 0, "segment": "s0",
                                 "response": {"outputs": [out0]}})
          + frame({"op": "response", "key": 2, "flags": 1, "segment": "s0",
                   "response": {"outputs": [text], "error": None}})
          + frame({"op": "response", "key": 1, "flags": 1, "response": None}))
    write(t, "bls_request", frame({"op": "bls_request", "id": 9, "decoupled": False, "segment": "s0",
                                   "request": {"model_name": "add", "model_version": -1,
                                               "request_id": "r", "correlation_id": "c",
                                               "flags": 3, "timeout_us": 10,
                                               "parameters": {"x": True, "priority": 1},
                                               "requested_output_names": ["OUT"],
                                               "inputs": [out0]}}))
    write(t, "answers_and_logs", frame({"op": "log", "level": "WARNING", "message": "hi"})
          + frame({"op": "release", "segment": "p0"})
          + frame({"op": "init_done", "error": {"message": "bad", "code": "INVALID_ARG"}})
          + frame({"op": "auto_complete_done", "config": {"max_batch_size": 2}})
          + frame({"op": "finalize_done"})
          + frame({"op": "metric_family_new", "name": "x"}))
    write(t, "out_of_range", frame({"op": "response", "key": 2, "flags": 1, "segment": "s0",
                                    "response": {"outputs": [dict(out0, offset=4094)]}}))


# ----- management_rest: "<route>[ <path name>]\n<body>" ----------------------------------------
def rest_seeds():
    t = "management_rest"
    model = {"name": "m2", "source": "file:///models/m2",
             "version_policy": {"latest": {"num_versions": 1}}, "min_replicas": 1,
             "max_replicas": 2, "resources": {"memory_bytes": 1048576, "gpus": 0},
             "labels": {"team": "a"}, "available_versions": [3, 1, 3],
             "traffic": {"1": 90, "3": 10}, "config_override": "{\"max_batch_size\": 4}"}
    write(t, "deploy", "model\n" + compact(model))
    write(t, "replace", "model m2\n" + compact(dict(model, name="", version_policy={"all": {}})))
    write(t, "specific", "model\n" + compact(dict(model, version_policy={"specific": {"versions": [1, 2]}})))
    write(t, "scale", "scale m\n" + compact({"min_replicas": 2, "max_replicas": 3}))
    write(t, "traffic", "traffic m\n" + compact({"weights": {"1": 90, "2": 10}}))
    write(t, "member", "member\n" + compact({"id": 4, "address": "10.0.0.4:9000"}))
    write(t, "query", "query\nconsistency=linearizable")


def main():
    if CORPUS.exists():
        shutil.rmtree(CORPUS)
    http_seeds()
    grpc_seeds()
    router_wire_seeds()
    router_http_seeds()
    config_seeds()
    stub_seeds()
    rest_seeds()
    for target in sorted(CORPUS.iterdir()):
        print(f"{target.name}: {len(list(target.iterdir()))} seeds")


if __name__ == "__main__":
    main()
