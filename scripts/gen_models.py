#!/usr/bin/env python3
"""Writes Triton-style model repositories of small ONNX models for Nereid.

    gen_models.py OUT_DIR [--set example|test]

Set `example` (docs/examples/model_repository, served by `make run`):
  simple                      INPUT0, INPUT1 INT32 [16] -> OUTPUT0 = sum, OUTPUT1 = difference
  mlp                         x FP32 [4] -> y FP32 [3] (MatMul + Add + Relu, fixed weights)
  identity_fp32_autocomplete  FP32 identity with a dynamic batch dim and no config.pbtxt
Set `test` (superset of `example`, used by tests/python): one batching identity model per
datatype, a non-batching model, a three-version model under four version policies, and models
that must fail to load (unknown config field, corrupt model.onnx, KIND_GPU on a CPU-only host),
and scheduler models on Triton's `identity` backend (no model file; `execute_delay_ms` makes each
execution slow so requests queue): dynamic batching, the default scheduler, priority levels,
queue size limits, REJECT and DELAY queue timeouts, and warmup samples that load or must fail.
Set `ensemble` (tests/python/test_ensemble.py): ensembles (`platform: "ensemble"`) over small
ONNX and identity models, good ones (pipeline, diamond, batching) and one per load-time error
(see `write_ensemble_models`).
`write_decoupled_ensemble_models` (tests/python/test_ensemble_decoupled.py and the differential
suite, not in a set): Python-backend ensembles over a decoupled step, which Triton serves too.
`write_ragged_models` (tests/python/test_ragged_batching.py, not in a set): `ragged_sum`, ragged
batching with batch inputs and a batch output, and configs whose batch_input fails to load.

Output is deterministic and the script is idempotent: each model directory it writes is
replaced as a whole. Needs the `onnx` and `numpy` packages. Importable: tests call
`write_repository` and the helpers below.
"""

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # loadable by any onnxruntime >= 1.10, including 1.31

# wire datatype -> (config enum suffix, ONNX element type)
DTYPES = {
    "BOOL": ("BOOL", TensorProto.BOOL),
    "INT8": ("INT8", TensorProto.INT8),
    "INT16": ("INT16", TensorProto.INT16),
    "INT32": ("INT32", TensorProto.INT32),
    "INT64": ("INT64", TensorProto.INT64),
    "UINT8": ("UINT8", TensorProto.UINT8),
    "UINT16": ("UINT16", TensorProto.UINT16),
    "UINT32": ("UINT32", TensorProto.UINT32),
    "UINT64": ("UINT64", TensorProto.UINT64),
    "FP16": ("FP16", TensorProto.FLOAT16),
    "FP32": ("FP32", TensorProto.FLOAT),
    "FP64": ("FP64", TensorProto.DOUBLE),
    "BF16": ("BF16", TensorProto.BFLOAT16),
    "BYTES": ("STRING", TensorProto.STRING),
}

# Weights of the `mlp` example: fixed so results are reproducible across runs and machines.
MLP_W = np.array(
    [[0.5, -1.0, 0.25], [1.5, 0.5, -0.75], [-0.5, 2.0, 1.0], [0.125, -0.25, 0.5]],
    dtype=np.float32,
)
MLP_B = np.array([0.1, -0.2, 0.3], dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# ONNX graphs


def _model(nodes, inputs, outputs, initializers=(), name="nereid_test"):
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), list(initializers))
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="nereid-gen-models",
        ir_version=IR_VERSION,
    )
    onnx.checker.check_model(model)
    return model.SerializeToString(deterministic=True)


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def identity_onnx(elem, batched=True):
    """INPUT0 -> OUTPUT0 unchanged; shape [batch, n] (or [n] when not batched)."""
    shape = ["batch", "n"] if batched else ["n"]
    return _model(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        [_vi("INPUT0", elem, shape)],
        [_vi("OUTPUT0", elem, shape)],
    )


def add_const_onnx(value):
    """INT32 INPUT0 [batch, n] -> OUTPUT0 = INPUT0 + value (used for model versions)."""
    c = numpy_helper.from_array(np.array([value], dtype=np.int32), "addend")
    return _model(
        [helper.make_node("Add", ["INPUT0", "addend"], ["OUTPUT0"])],
        [_vi("INPUT0", TensorProto.INT32, ["batch", "n"])],
        [_vi("OUTPUT0", TensorProto.INT32, ["batch", "n"])],
        [c],
    )


def simple_onnx():
    shape = ["batch", 16]
    return _model(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        [_vi("INPUT0", TensorProto.INT32, shape), _vi("INPUT1", TensorProto.INT32, shape)],
        [_vi("OUTPUT0", TensorProto.INT32, shape), _vi("OUTPUT1", TensorProto.INT32, shape)],
    )


def mlp_onnx():
    return _model(
        [
            helper.make_node("MatMul", ["x", "W"], ["h"]),
            helper.make_node("Add", ["h", "b"], ["z"]),
            helper.make_node("Relu", ["z"], ["y"]),
        ],
        [_vi("x", TensorProto.FLOAT, ["batch", 4])],
        [_vi("y", TensorProto.FLOAT, ["batch", 3])],
        [numpy_helper.from_array(MLP_W, "W"), numpy_helper.from_array(MLP_B, "b")],
    )


def scale_onnx(factor):
    """FP32 x [batch, 4] -> y = x * factor."""
    c = numpy_helper.from_array(np.array(factor, dtype=np.float32), "factor")
    return _model(
        [helper.make_node("Mul", ["x", "factor"], ["y"])],
        [_vi("x", TensorProto.FLOAT, ["batch", 4])],
        [_vi("y", TensorProto.FLOAT, ["batch", 4])],
        [c],
    )


def add_sub_fp32_onnx():
    """FP32 INPUT0, INPUT1 [batch, 4] -> OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    shape = ["batch", 4]
    return _model(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        [_vi("INPUT0", TensorProto.FLOAT, shape), _vi("INPUT1", TensorProto.FLOAT, shape)],
        [_vi("OUTPUT0", TensorProto.FLOAT, shape), _vi("OUTPUT1", TensorProto.FLOAT, shape)],
    )


def nobatch_onnx():
    """FP32 INPUT0 [2, 3] -> OUTPUT0 = INPUT0 * 2 + 1; no batch dimension."""
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    one = numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one")
    return _model(
        [
            helper.make_node("Mul", ["INPUT0", "two"], ["t"]),
            helper.make_node("Add", ["t", "one"], ["OUTPUT0"]),
        ],
        [_vi("INPUT0", TensorProto.FLOAT, [2, 3])],
        [_vi("OUTPUT0", TensorProto.FLOAT, [2, 3])],
        [two, one],
    )


# ---------------------------------------------------------------------------------------------
# config.pbtxt text


def _tensors(kind, specs):
    """specs: [(name, config dtype suffix, dims)] -> Triton-style `input [ {...}, {...} ]`."""
    items = []
    for name, dtype, dims in specs:
        items.append(
            "  {\n"
            f'    name: "{name}"\n'
            f"    data_type: TYPE_{dtype}\n"
            f"    dims: [ {', '.join(str(d) for d in dims)} ]\n"
            "  }"
        )
    return f"{kind} [\n" + ",\n".join(items) + "\n]\n"


def config_text(name, max_batch_size, inputs, outputs, extra="", comment=""):
    head = "".join(f"# {line}\n" for line in comment.splitlines()) if comment else ""
    return (
        head
        + f'name: "{name}"\n'
        + 'platform: "onnxruntime_onnx"\n'
        + f"max_batch_size: {max_batch_size}\n"
        + _tensors("input", inputs)
        + _tensors("output", outputs)
        + extra
    )


def write_model(repo, name, versions, config=None):
    """Writes repo/name/{config.pbtxt, <v>/model.onnx}; versions maps version -> bytes."""
    d = Path(repo) / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    if config is not None:
        (d / "config.pbtxt").write_text(config)
    for v, data in versions.items():
        (d / str(v)).mkdir()
        (d / str(v) / "model.onnx").write_bytes(data)
    return d


# ---------------------------------------------------------------------------------------------
# Model sets


def write_example(repo):
    io16 = [("INPUT0", "INT32", [16]), ("INPUT1", "INT32", [16])]
    write_model(repo, "simple", {1: simple_onnx()}, config_text(
        "simple", 8, io16, [("OUTPUT0", "INT32", [16]), ("OUTPUT1", "INT32", [16])],
        comment="OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (like Triton's `simple`)."))
    write_model(repo, "mlp", {1: mlp_onnx()}, config_text(
        "mlp", 8, [("x", "FP32", [4])], [("y", "FP32", [3])],
        comment="y = relu(x @ W + b) with fixed weights (see scripts/gen_models.py)."))
    # No config.pbtxt: the server must auto-complete it from the ONNX model
    # (expected like Triton: backend onnxruntime, max_batch_size 4, INPUT0/OUTPUT0 FP32 dims [-1]).
    write_model(repo, "identity_fp32_autocomplete", {1: identity_onnx(TensorProto.FLOAT)})


def identity_name(wire_dtype):
    return "identity_" + wire_dtype.lower()


VERSION_POLICIES = {
    # model name -> (version_policy text or "", versions expected to be served)
    "versioned": ("", [3]),
    "versioned_latest2": ("version_policy: { latest: { num_versions: 2 } }\n", [2, 3]),
    "versioned_all": ("version_policy: { all: {} }\n", [1, 2, 3]),
    "versioned_specific1": ("version_policy: { specific: { versions: [ 1 ] } }\n", [1]),
}


def write_versioned(repo, name, policy="", served=(1, 2, 3), versions=(1, 2, 3)):
    cfg = config_text(
        name, 8, [("INPUT0", "INT32", [-1])], [("OUTPUT0", "INT32", [-1])], extra=policy,
        comment=f"Version v computes OUTPUT0 = INPUT0 + v. Expected served versions: {list(served)}.")
    return write_model(repo, name, {v: add_const_onnx(v) for v in versions}, cfg)


def write_test(repo):
    write_example(repo)
    for wire, (cfg_dtype, elem) in DTYPES.items():
        name = identity_name(wire)
        write_model(repo, name, {1: identity_onnx(elem)}, config_text(
            name, 8, [("INPUT0", cfg_dtype, [-1])], [("OUTPUT0", cfg_dtype, [-1])],
            comment=f"Identity on {wire}; batching (max_batch_size 8)."))
    write_model(repo, "nobatch_fp32", {1: nobatch_onnx()}, config_text(
        "nobatch_fp32", 0, [("INPUT0", "FP32", [2, 3])], [("OUTPUT0", "FP32", [2, 3])],
        comment="No batch dimension: OUTPUT0 = INPUT0 * 2 + 1, shape exactly [2, 3]."))
    for name, (policy, served) in VERSION_POLICIES.items():
        write_versioned(repo, name, policy, served)

    fp32_io = ([("INPUT0", "FP32", [-1])], [("OUTPUT0", "FP32", [-1])])
    good = {1: identity_onnx(TensorProto.FLOAT)}
    write_model(repo, "broken_config", good, config_text(
        "broken_config", 8, *fp32_io, extra="not_a_config_field: 42\n",
        comment="Expected: UNAVAILABLE, reason names the unknown field `not_a_config_field`."))
    write_model(repo, "broken_model", {1: b"this is not an ONNX model\x00\xff"}, config_text(
        "broken_model", 8, *fp32_io,
        comment="Expected: UNAVAILABLE, model.onnx is not a valid ONNX protobuf."))
    write_model(repo, "gpu_model", good, config_text(
        "gpu_model", 8, *fp32_io, extra="instance_group [ { kind: KIND_GPU, count: 1 } ]\n",
        comment="Expected on a CPU-only host: UNAVAILABLE, reason mentions GPU."))
    write_scheduler_models(repo)


# ---------------------------------------------------------------------------------------------
# Scheduler models (identity backend)


def identity_backend_config(name, max_batch_size, delay_ms=0, extra="", comment="", io=None):
    """config.pbtxt of an identity-backend model: FP32 INPUT0 [4] -> OUTPUT0 (a copy) unless
    `io` = (inputs, outputs) says otherwise; `delay_ms` sleeps in every execution."""
    inputs, outputs = io or ([("INPUT0", "FP32", [4])], [("OUTPUT0", "FP32", [4])])
    head = "".join(f"# {line}\n" for line in comment.splitlines()) if comment else ""
    params = (f'parameters {{ key: "execute_delay_ms" value: {{ string_value: "{delay_ms}" }} }}\n'
              if delay_ms else "")
    return (
        head
        + f'name: "{name}"\n'
        + 'backend: "identity"\n'
        + f"max_batch_size: {max_batch_size}\n"
        + _tensors("input", inputs)
        + _tensors("output", outputs)
        + "instance_group [ { kind: KIND_CPU, count: 1 } ]\n"
        + params
        + extra
    )


def write_identity(repo, name, config, files=None):
    """Writes repo/name/{config.pbtxt, 1/ (empty)} plus `files` (relative path -> bytes)."""
    d = write_model(repo, name, {}, config)
    (d / "1").mkdir()
    for rel, data in (files or {}).items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    return d


# Execution delays of the scheduler models (ms); tests derive their timing from these.
SCHED_DELAY_MS = {
    "identity_delay_batch": 200,
    "identity_nobatcher": 100,
    "identity_priority": 300,
    "identity_queue_limit": 300,
    "identity_timeout": 300,
    "identity_timeout_delay": 200,
}
# Default queue timeouts (us) of identity_timeout (REJECT) and identity_timeout_delay (DELAY).
SCHED_TIMEOUT_US = 100000
SCHED_DELAY_TIMEOUT_US = 1000000
# Warmup data file of identity_warmup_ok: one batch item of INPUT0 (FP32 [4]).
WARMUP_FILE_DATA = np.array([1.5, -2.0, 0.25, 8.0], dtype=np.float32).tobytes()


def write_scheduler_models(repo):
    d = SCHED_DELAY_MS
    write_identity(repo, "identity_delay_batch", identity_backend_config(
        "identity_delay_batch", 8, d["identity_delay_batch"],
        "dynamic_batching { max_queue_delay_microseconds: 20000 }\n",
        comment="One slow instance with dynamic batching: requests queued while it is busy "
                "run together."))
    write_identity(repo, "identity_nobatcher", identity_backend_config(
        "identity_nobatcher", 8, d["identity_nobatcher"],
        comment="No dynamic_batching: Triton's default scheduler runs every request alone."))
    write_identity(repo, "identity_priority", identity_backend_config(
        "identity_priority", 1, d["identity_priority"],
        "dynamic_batching {\n"
        "  priority_levels: 2\n"
        "  default_priority_level: 2\n"
        "  default_queue_policy { allow_timeout_override: true }\n"
        "}\n",
        comment="Two priority levels (1 = high); no default queue timeout, but a request may set "
                "one\n(tests use a 1 ms timeout as a probe: rejected iff the instance is busy)."))
    write_identity(repo, "identity_queue_limit", identity_backend_config(
        "identity_queue_limit", 1, d["identity_queue_limit"],
        "dynamic_batching {\n"
        "  default_queue_policy { max_queue_size: 2 allow_timeout_override: true }\n"
        "}\n",
        comment="At most 2 queued requests: with one running and 2 queued, more are refused "
                "(503 / UNAVAILABLE).\nNo default queue timeout; tests send 1 ms ones as "
                "probes."))
    write_identity(repo, "identity_timeout", identity_backend_config(
        "identity_timeout", 1, d["identity_timeout"],
        "dynamic_batching {\n"
        "  default_queue_policy {\n"
        f"    default_timeout_microseconds: {SCHED_TIMEOUT_US}\n"
        "    timeout_action: REJECT\n"
        "    allow_timeout_override: true\n"
        "  }\n"
        "}\n",
        comment=f"Queue timeout {SCHED_TIMEOUT_US} us, REJECT: a request still queued then "
                "fails with 503 /\nUNAVAILABLE \"Request timeout expired\"; requests may "
                "shorten (not extend) it."))
    write_identity(repo, "identity_timeout_delay", identity_backend_config(
        "identity_timeout_delay", 1, d["identity_timeout_delay"],
        "dynamic_batching {\n"
        "  priority_levels: 2\n"
        "  default_priority_level: 2\n"
        "  default_queue_policy {\n"
        f"    default_timeout_microseconds: {SCHED_DELAY_TIMEOUT_US}\n"
        "    timeout_action: DELAY\n"
        "    allow_timeout_override: true\n"
        "  }\n"
        "  priority_queue_policy {\n"
        "    key: 1\n"
        "    value: { timeout_action: REJECT allow_timeout_override: true }\n"
        "  }\n"
        "}\n",
        comment="Level 2 (default): queue timeout DELAY, a timed-out request is served after "
                "the others.\nLevel 1: REJECT, no default timeout (tests' 1 ms probes)."))

    two_io = ([("INPUT0", "FP32", [4]), ("INPUT1", "INT32", [3])],
              [("OUTPUT0", "FP32", [4]), ("OUTPUT1", "INT32", [3])])
    write_identity(repo, "identity_warmup_ok", identity_backend_config(
        "identity_warmup_ok", 8, io=two_io, extra="""model_warmup [
  {
    name: "zeros"
    batch_size: 8
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }
    inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 3 ] zero_data: true } }
  },
  {
    name: "random"
    batch_size: 2
    count: 3
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 4 ] random_data: true } }
    inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 3 ] random_data: true } }
  },
  {
    name: "from_file"
    batch_size: 1
    inputs {
      key: "INPUT0"
      value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "input0.bin" }
    }
    inputs { key: "INPUT1" value: { data_type: TYPE_INT32 dims: [ 3 ] random_data: true } }
  }
]
""", comment="Warmup samples of every data source; must load READY."),
        files={"warmup/input0.bin": WARMUP_FILE_DATA})
    write_identity(repo, "identity_warmup_bad", identity_backend_config(
        "identity_warmup_bad", 8, extra="""model_warmup [
  {
    name: "bad_sample"
    batch_size: 1
    inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }
    inputs { key: "NOT_AN_INPUT" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }
  }
]
""", comment="Expected: UNAVAILABLE, reason names the sample and the unknown input."))
    write_identity(repo, "identity_warmup_nofile", identity_backend_config(
        "identity_warmup_nofile", 8, extra="""model_warmup [
  {
    name: "missing_file"
    batch_size: 1
    inputs {
      key: "INPUT0"
      value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "absent.bin" }
    }
  }
]
""", comment="Expected: UNAVAILABLE, the warmup data file does not exist."))


# Warmup models of the `test` set that must fail to load, and what their reason must mention
# (kept apart from BROKEN_MODELS, which older tests check one by one).
WARMUP_BROKEN_MODELS = {
    "identity_warmup_bad": ["bad_sample", "NOT_AN_INPUT"],
    "identity_warmup_nofile": ["missing_file", "absent.bin"],
}


# Models of the `test` set that must fail to load, and what their reason must mention.
BROKEN_MODELS = {"broken_config": "not_a_config_field", "broken_model": "", "gpu_model": "GPU"}


# ---------------------------------------------------------------------------------------------
# Ensembles


def ensemble_config(name, max_batch_size, inputs, outputs, steps, extra="", comment=""):
    """config.pbtxt of an ensemble. steps: [(model, {model input: ensemble tensor},
    {model output: ensemble tensor})] or with a fourth item, the step's model_version."""
    head = "".join(f"# {line}\n" for line in comment.splitlines()) if comment else ""
    items = []
    for step in steps:
        model, inputs_map, outputs_map = step[:3]
        version = step[3] if len(step) > 3 else -1
        maps = "".join(f'      input_map {{ key: "{k}" value: "{v}" }}\n'
                       for k, v in inputs_map.items())
        maps += "".join(f'      output_map {{ key: "{k}" value: "{v}" }}\n'
                        for k, v in outputs_map.items())
        items.append(f'    {{\n      model_name: "{model}"\n'
                     f"      model_version: {version}\n{maps}    }}")
    return (
        head
        + f'name: "{name}"\n'
        + 'platform: "ensemble"\n'
        + f"max_batch_size: {max_batch_size}\n"
        + _tensors("input", inputs)
        + _tensors("output", outputs)
        + "ensemble_scheduling {\n  step [\n" + ",\n".join(items) + "\n  ]\n}\n"
        + extra
    )


# Execution delay (ms) of ens_slow, the composing model whose batching ensemble traffic shows.
ENS_SLOW_DELAY_MS = 200

# Ensembles of the `ensemble` set that must fail to load, and what their reason must mention
# (the repository index of a `none`-mode server, and the load API's error in explicit mode).
BROKEN_ENSEMBLES = {
    "ens_bad_unknown_model": ["ensemble 'ens_bad_unknown_model' step 0", "'no_such_model'",
                              "not in the model repository"],
    "ens_bad_cycle": ["its steps form a cycle", "step 0 (model 'ens_addsub')",
                      "step 1 (model 'ens_scale')"],
    "ens_bad_loop_a": ["circular dependency between ensembles", "ens_bad_loop_a", "ens_bad_loop_b"],
    "ens_bad_loop_b": ["circular dependency between ensembles", "ens_bad_loop_a", "ens_bad_loop_b"],
    "ens_bad_unused_input": ["ensemble input 'EXTRA' is not read by any step"],
    "ens_bad_unmapped": ["input 'x' reads tensor 'NOWHERE'",
                         "neither an ensemble input nor produced by any step"],
    "ens_bad_doubly_produced": ["tensor 'OUT' is produced twice", "step 0 (model 'ens_scale')",
                                "step 1 (model 'ens_identity')"],
    "ens_bad_unwritten_output": ["ensemble output 'OUT2' is not produced by any step"],
    "ens_bad_dtype": ["tensor 'IN': data type mismatch", "expects TYPE_FP32",
                      "ensemble input 'IN' is TYPE_INT32"],
    "ens_bad_shape": ["tensor 'IN': shape mismatch", "expects [-1,4]",
                      "ensemble input 'IN' has [-1,3]"],
    "ens_bad_batch": ["allows max_batch_size 16", "step 0 (model 'ens_scale') allows only 8"],
    "ens_bad_step_input": ["input 'INPUT1' of model 'ens_addsub' is not mapped"],
    "ens_bad_instance_group": ["instance group should not be specified for ensemble"],
    "ens_bad_warmup": ["model_warmup can not be specified for ensemble"],
    "ens_bad_decoupled": ["in ensemble ens_bad_decoupled, step of model 'ens_bad_decoupled' "
                          "receives inputs originated from different decoupled models",
                          "step 1 (model 'ens_addsub') reads 'MID' from the responses of step 0 "
                          "(model 'ens_decoupled'), 'IN' from the request"],
}


def write_ensemble_models(repo):
    """Composing models (FP32 [4], max_batch_size 8): ens_scale (ONNX, y = 2x), ens_addsub (ONNX,
    sum and difference), ens_identity (identity backend), ens_slow (identity, ENS_SLOW_DELAY_MS
    per execution, dynamic batching), ens_decoupled (identity, decoupled). Ensembles:
      ens_pipeline   IN -> ens_scale -> SCALED; ens_addsub(SCALED, IN) -> SUM = 3 IN, DIFF = IN
      ens_diamond    IN -> ens_scale -> A and IN -> ens_identity -> B (in parallel);
                     ens_addsub(A, B) -> SUM = 3 IN, DIFF = IN
      ens_batched    IN -> ens_slow -> OUT
      ens_loose      IN FP32 [-1] -> ens_identity (dims [4]) -> OUT: the request's shape decides
    and one ensemble per load-time error of BROKEN_ENSEMBLES."""
    f4 = [("IN", "FP32", [4])]
    write_model(repo, "ens_scale", {1: scale_onnx(2.0)}, config_text(
        "ens_scale", 8, [("x", "FP32", [4])], [("y", "FP32", [4])],
        extra="dynamic_batching { }\n", comment="y = 2 * x."))
    write_model(repo, "ens_addsub", {1: add_sub_fp32_onnx()}, config_text(
        "ens_addsub", 8, [("INPUT0", "FP32", [4]), ("INPUT1", "FP32", [4])],
        [("OUTPUT0", "FP32", [4]), ("OUTPUT1", "FP32", [4])],
        extra="dynamic_batching { }\n",
        comment="OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."))
    write_identity(repo, "ens_identity", identity_backend_config(
        "ens_identity", 8, comment="A copy of INPUT0."))
    write_identity(repo, "ens_slow", identity_backend_config(
        "ens_slow", 8, ENS_SLOW_DELAY_MS,
        "dynamic_batching { max_queue_delay_microseconds: 100000 }\n",
        comment="Slow copy with dynamic batching: concurrent ensemble requests share executions."))
    write_identity(repo, "ens_decoupled", identity_backend_config(
        "ens_decoupled", 8, extra="model_transaction_policy { decoupled: true }\n",
        comment="Decoupled: an ensemble step may not read its output beside an ensemble input."))

    sum_diff = [("SUM", "FP32", [4]), ("DIFF", "FP32", [4])]
    out = [("OUT", "FP32", [4])]
    addsub = ("ens_addsub", {"INPUT0": "A", "INPUT1": "B"}, {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"})
    good = {
        "ens_pipeline": ensemble_config("ens_pipeline", 8, f4, sum_diff, [
            ("ens_scale", {"x": "IN"}, {"y": "SCALED"}),
            ("ens_addsub", {"INPUT0": "SCALED", "INPUT1": "IN"},
             {"OUTPUT0": "SUM", "OUTPUT1": "DIFF"}),
        ], comment="IN -> ens_scale -> ens_addsub(2 IN, IN): SUM = 3 IN, DIFF = IN."),
        "ens_diamond": ensemble_config("ens_diamond", 8, f4, sum_diff, [
            addsub,
            ("ens_scale", {"x": "IN"}, {"y": "A"}),
            ("ens_identity", {"INPUT0": "IN"}, {"OUTPUT0": "B"}),
        ], comment="ens_scale and ens_identity run in parallel; ens_addsub joins them."),
        "ens_batched": ensemble_config("ens_batched", 8, f4, out, [
            ("ens_slow", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
        ], comment="One slow step: ens_slow batches the ensemble's requests."),
        "ens_loose": ensemble_config("ens_loose", 8, [("IN", "FP32", [-1])], out, [
            ("ens_identity", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"}),
        ], comment="IN has a variable size, ens_identity takes 4 values: a request decides."),
    }
    scale = ("ens_scale", {"x": "IN"}, {"y": "OUT"})
    bad = {
        "ens_bad_unknown_model": ensemble_config("ens_bad_unknown_model", 8, f4, out, [
            ("no_such_model", {"x": "IN"}, {"y": "OUT"})]),
        "ens_bad_cycle": ensemble_config("ens_bad_cycle", 8, f4, out, [
            ("ens_addsub", {"INPUT0": "IN", "INPUT1": "T2"}, {"OUTPUT0": "T1", "OUTPUT1": "OUT"}),
            ("ens_scale", {"x": "T1"}, {"y": "T2"})]),
        "ens_bad_loop_a": ensemble_config("ens_bad_loop_a", 8, f4, out, [
            ("ens_bad_loop_b", {"IN": "IN"}, {"OUT": "OUT"})]),
        "ens_bad_loop_b": ensemble_config("ens_bad_loop_b", 8, f4, out, [
            ("ens_bad_loop_a", {"IN": "IN"}, {"OUT": "OUT"})]),
        "ens_bad_unused_input": ensemble_config(
            "ens_bad_unused_input", 8, f4 + [("EXTRA", "FP32", [4])], out, [scale]),
        "ens_bad_unmapped": ensemble_config("ens_bad_unmapped", 8, f4, out, [
            ("ens_identity", {"INPUT0": "IN"}, {"OUTPUT0": "MID"}),
            ("ens_addsub", {"INPUT0": "MID", "INPUT1": "IN"}, {"OUTPUT0": "OUT"}),
            ("ens_scale", {"x": "NOWHERE"}, {"y": "UNUSED"})]),
        "ens_bad_doubly_produced": ensemble_config("ens_bad_doubly_produced", 8, f4, out, [
            scale, ("ens_identity", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})]),
        "ens_bad_unwritten_output": ensemble_config(
            "ens_bad_unwritten_output", 8, f4, out + [("OUT2", "FP32", [4])], [scale]),
        "ens_bad_dtype": ensemble_config("ens_bad_dtype", 8, [("IN", "INT32", [4])], out, [scale]),
        "ens_bad_shape": ensemble_config("ens_bad_shape", 8, [("IN", "FP32", [3])], out, [scale]),
        "ens_bad_batch": ensemble_config("ens_bad_batch", 16, f4, out, [scale]),
        "ens_bad_step_input": ensemble_config("ens_bad_step_input", 8, f4, out, [
            ("ens_addsub", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})]),
        "ens_bad_instance_group": ensemble_config(
            "ens_bad_instance_group", 8, f4, out, [scale],
            extra="instance_group [ { kind: KIND_CPU, count: 1 } ]\n"),
        "ens_bad_warmup": ensemble_config(
            "ens_bad_warmup", 8, f4, out, [scale], extra="""model_warmup [
  {
    name: "zeros"
    batch_size: 1
    inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 4 ] zero_data: true } }
  }
]
"""),
        "ens_bad_decoupled": ensemble_config("ens_bad_decoupled", 8, f4, out, [
            ("ens_decoupled", {"INPUT0": "IN"}, {"OUTPUT0": "MID"}),
            ("ens_addsub", {"INPUT0": "MID", "INPUT1": "IN"}, {"OUTPUT0": "OUT"})]),
    }
    assert set(bad) == set(BROKEN_ENSEMBLES)
    for name, config in {**good, **bad}.items():
        needles = BROKEN_ENSEMBLES.get(name)
        comment = f"Expected: UNAVAILABLE, reason mentions {needles}.\n" if needles else ""
        head = "".join(f"# {line}\n" for line in comment.splitlines())
        write_identity(repo, name, head + config)


# ---------------------------------------------------------------------------------------------
# Ensembles with a decoupled step (tests/python/test_ensemble_decoupled.py, test_triton_diff.py)

_PY = "import time\n\nimport numpy as np\nimport triton_python_backend_utils as pb_utils\n\n\n"
_PY_EXECUTE = _PY + "class TritonPythonModel:\n    def execute(self, requests):\n"
DEC_REPEAT_MODEL = _PY_EXECUTE + """        for r in requests:
            sender = r.get_response_sender()
            for v in pb_utils.get_input_tensor_by_name(r, "IN").as_numpy():
                if v == -1:
                    sender.send(pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("dec_repeat refuses -1")))
                    continue
                if v >= 1000:
                    time.sleep(0.5)
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([v], dtype=np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
_IN = 'pb_utils.get_input_tensor_by_name(r, "{}").as_numpy()'
DEC_DOUBLE_MODEL = _PY_EXECUTE + f"""        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", 2 * {_IN.format("IN")})]) for r in requests]
"""
DEC_ADD_MODEL = _PY_EXECUTE + f"""        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUT", {_IN.format("A")} + {_IN.format("B")}[:1])]) for r in requests]
"""

# Ensembles of write_decoupled_ensemble_models that must fail to load, and their reason.
BROKEN_DECOUPLED_ENSEMBLES = {
    "ens_dec_mixed": "in ensemble ens_dec_mixed, step of model 'ens_dec_mixed' receives inputs "
                     "originated from different decoupled models (step 1 (model 'dec_add') reads "
                     "'R' from the responses of step 0 (model 'dec_repeat'), 'IN' from the "
                     "request)",
}


def write_decoupled_ensemble_models(repo):
    """Python-backend models (no batching, INT32) and ensembles over them:
      dec_repeat      decoupled: IN [-1] -> one OUT [1] per element, then the final flag alone;
                      -1 answers an error response, an element >= 1000 waits 0.5 s first
      dec_double      OUT = 2 IN ([1]);  dec_add: OUT = A + B[0] (A [1], B [-1])
      ens_dec         IN -> dec_repeat -> R -> dec_double -> OUT: decoupled itself
      ens_dec_claims  IN [1] -> dec_double -> OUT, its file says decoupled: the load decides not
      ens_dec_mixed   dec_add reads dec_repeat's R beside the ensemble input IN: refused"""
    def model(name, config, source=None):
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(config)
        if source:
            (repo / name / "1" / "model.py").write_text(source)

    def python(name, source, inputs, extra=""):
        specs = ", ".join(f'{{ name: "{n}" data_type: TYPE_INT32 dims: [ {d} ] }}'
                          for n, d in inputs)
        model(name, f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\ninput [ {specs} ]\n'
              'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n' + extra, source)

    def ensemble(name, dims, steps, extra=""):
        model(name, ensemble_config(name, 0, [("IN", "INT32", [dims])], [("OUT", "INT32", [1])],
                                    steps, extra=extra))

    python("dec_repeat", DEC_REPEAT_MODEL, [("IN", "-1")],
           "model_transaction_policy { decoupled: true }\n")
    python("dec_double", DEC_DOUBLE_MODEL, [("IN", "1")])
    python("dec_add", DEC_ADD_MODEL, [("A", "1"), ("B", "-1")])
    repeat = ("dec_repeat", {"IN": "IN"}, {"OUT": "R"})
    ensemble("ens_dec", -1, [repeat, ("dec_double", {"IN": "R"}, {"OUT": "OUT"})])
    ensemble("ens_dec_claims", 1, [("dec_double", {"IN": "IN"}, {"OUT": "OUT"})],
             extra="model_transaction_policy { decoupled: true }\n")
    ensemble("ens_dec_mixed", -1, [repeat, ("dec_add", {"A": "R", "B": "IN"}, {"OUT": "OUT"})])


# ---------------------------------------------------------------------------------------------
# Ragged batching (tests/python/test_ragged_batching.py)


def ragged_sum_onnx():
    """Ragged batching as Triton's ONNX Runtime backend feeds it: INPUT FP32 [n] is every
    request's values concatenated; INDEX INT32 [requests] where each request's values end
    (BATCH_ACCUMULATED_ELEMENT_COUNT); COUNT FP32 [requests] each request's element count
    (BATCH_ELEMENT_COUNT). SUM [requests, 1] = each request's sum, N [requests, 1] = COUNT,
    DOUBLED [n] = INPUT * 2 (a batch output, scattered back by INPUT's shapes)."""
    def const(name, values, dtype):
        return numpy_helper.from_array(np.array(values, dtype=dtype), name)

    return _model(
        [
            # C0 = [0, cumsum(INPUT)]; sum_i = C0[end_i] - C0[end_{i-1}] (end_{-1} = 0).
            helper.make_node("CumSum", ["INPUT", "axis0"], ["csum"]),
            helper.make_node("Concat", ["zero_f", "csum"], ["c0"], axis=0),
            helper.make_node("Gather", ["c0", "INDEX"], ["at_end"], axis=0),
            helper.make_node("Slice", ["at_end", "start0", "minus1", "axis0"], ["prev_ends"]),
            helper.make_node("Concat", ["zero_f", "prev_ends"], ["at_start"], axis=0),
            helper.make_node("Sub", ["at_end", "at_start"], ["sums"]),
            helper.make_node("Unsqueeze", ["sums", "axis1"], ["SUM"]),
            helper.make_node("Unsqueeze", ["COUNT", "axis1"], ["N"]),
            helper.make_node("Mul", ["INPUT", "two"], ["DOUBLED"]),
        ],
        [
            _vi("INPUT", TensorProto.FLOAT, ["n"]),
            _vi("INDEX", TensorProto.INT32, ["requests"]),
            _vi("COUNT", TensorProto.FLOAT, ["requests"]),
        ],
        [
            _vi("SUM", TensorProto.FLOAT, ["requests", 1]),
            _vi("N", TensorProto.FLOAT, ["requests", 1]),
            _vi("DOUBLED", TensorProto.FLOAT, ["n"]),
        ],
        [
            const("axis0", [0], np.int64),
            const("axis1", [1], np.int64),
            const("start0", [0], np.int64),
            const("minus1", [-1], np.int64),
            const("zero_f", [0.0], np.float32),
            const("two", [2.0], np.float32),
        ],
    )


RAGGED_BATCH_IO = """batch_input [
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_FP32 source_input: "INPUT" }
]
batch_output [
  { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "DOUBLED" source_input: "INPUT" }
]
"""

# model name -> (what replaces RAGGED_BATCH_IO, a needle of its load error)
BROKEN_RAGGED = {
    "ragged_unknown_source": (RAGGED_BATCH_IO.replace('source_input: "INPUT" },\n  { kind: BATCH_ELEMENT',
                                                      'source_input: "NOPE" },\n  { kind: BATCH_ELEMENT'),
                              "batch_input[0]: unknown source input name 'NOPE'"),
    "ragged_int64": (RAGGED_BATCH_IO.replace("TYPE_INT32", "TYPE_INT64"),
                     "batch_input[0]: batch input data type must be TYPE_INT32 or TYPE_FP32 for ragged_int64 "
                     "(data_type is TYPE_INT64)"),
}


def write_ragged_models(repo, queue_delay_us=2_000_000):
    """`ragged_sum` (see ragged_sum_onnx) with dynamic batching that waits up to
    `queue_delay_us` for a full batch of 4, and one model per load-time error of BROKEN_RAGGED."""
    def config(name, batch_io):
        return config_text(
            name, 8, [("INPUT", "FP32", [-1])],
            [("SUM", "FP32", [1]), ("N", "FP32", [1]), ("DOUBLED", "FP32", [-1])],
            extra=batch_io
            + f"dynamic_batching {{ preferred_batch_size: [ 4 ] max_queue_delay_microseconds: {queue_delay_us} }}\n"
            + "instance_group [ { kind: KIND_CPU, count: 1 } ]\n"
            + 'model_warmup [ { name: "ragged" batch_size: 1 inputs { key: "INPUT" value: '
            + "{ data_type: TYPE_FP32 dims: [ 3 ] zero_data: true } } } ]\n",
            comment="Ragged batching: per-request sums of a ragged INPUT (see scripts/gen_models.py).",
        ).replace('dims: [ -1 ]\n  }\n]\noutput', 'dims: [ -1 ]\n    allow_ragged_batch: true\n  }\n]\noutput', 1)
    write_model(repo, "ragged_sum", {1: ragged_sum_onnx()}, config("ragged_sum", RAGGED_BATCH_IO))
    for name, (batch_io, _) in BROKEN_RAGGED.items():
        write_model(repo, name, {1: ragged_sum_onnx()}, config(name, batch_io))
    return repo


def write_repository(out_dir, which="test"):
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    {"test": write_test, "example": write_example, "ensemble": write_ensemble_models}[which](out)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--set", choices=["example", "test", "ensemble"], default="example",
                   dest="which")
    args = p.parse_args(argv)
    out = write_repository(args.out_dir, args.which)
    names = sorted(d.name for d in out.iterdir() if d.is_dir())
    print(f"wrote {len(names)} models to {out}: {', '.join(names)}", file=sys.stderr)


if __name__ == "__main__":
    main()
