#!/usr/bin/env python3
"""Writes a model repository of small ONNX sequence models (`sequence_batching`) for Nereid.

    gen_sequence_models.py OUT_DIR

  seq_accum          INPUT INT32 [1] -> OUTPUT INT32 [1]: a running sum per sequence, reset on
                     START. The START control (int32) and the implicit state
                     `state_in`/`state_out` (INT32 [1]) are fed by the server:
                     OUTPUT = state_out = state_in * (1 - START) + INPUT. Direct strategy,
                     max_batch_size 4.
  seq_accum_oldest   the same graph with the `oldest` strategy and a 500 ms idle timeout.
  seq_corrid         INPUT INT32 [1] -> CORRID_OUT UINT64 [1]: echoes the CORRID control (UINT64).
  seq_sum_init       INPUT INT32 [1] -> OUTPUT INT32 [1] = state_in + INPUT, no controls; the
                     state starts from `initial_state { data_file: "init.bin" }` (INT32 100,
                     under the model's initial_state/ folder).
  seq_accum_warm     seq_accum with a `model_warmup` sample that sets INPUT only: the server
                     feeds the START control and the state.
  seq_init_missing   seq_sum_init without its data file, seq_init_short with a 2-byte one: both
                     fail to load, with Triton's messages.
  seq_slots          INPUT INT32 [1] with a READY control (int32) -> ROWS, READY_SUM INT32 [1]:
                     every row gets the batch's row count and its number of READY rows, so a
                     client sees the slot padding of the direct strategy. max_batch_size 4.
  seq_slots_wait     seq_slots with max_batch_size 2 and direct { max_queue_delay_microseconds:
                     WAIT_DELAY_US minimum_slot_utilization: 1.0 }: a batch waits for both slots.

`write_python_repository` writes Python-backend sequence models for the differential tests
against Triton 2.51 (tests/python/test_triton_diff.py), which has only that backend:

  seq_slots_py       direct, max_batch_size 4, START/READY (INT32) and CORRID (UINT64) controls;
                     per request: ROWS (requests in its execute call), READY_ROWS (READY true
                     among them), MY_READY, MY_START. A warm-up sample sets INPUT and the
                     controls by name, as a Triton user must.
  seq_init_py        max_batch_size 0, state `state_in` (INT32 [1]) whose initial_state comes from
                     `data_file: "init.bin"` (INT32 100): OUTPUT = INPUT + state_in.

Deterministic and idempotent (each model directory is replaced). Needs `onnx` and `numpy`.
Importable: tests/python/test_sequence.py calls `write_repository`.
"""

import importlib.util
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

_spec = importlib.util.spec_from_file_location("gen_models", Path(__file__).with_name("gen_models.py"))
gen_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_models)

ACCUM_IDLE_US = 1_000_000
OLDEST_IDLE_US = 500_000
INITIAL_STATE = 100
WAIT_DELAY_US = 20_000_000


def accum_onnx():
    i32 = TensorProto.INT32
    one = numpy_helper.from_array(np.array([[1]], dtype=np.int32), "one")
    return gen_models._model(
        [
            helper.make_node("Sub", ["one", "START"], ["keep"]),
            helper.make_node("Mul", ["state_in", "keep"], ["carried"]),
            helper.make_node("Add", ["carried", "INPUT"], ["OUTPUT"]),
            helper.make_node("Identity", ["OUTPUT"], ["state_out"]),
        ],
        [gen_models._vi(n, i32, ["batch", 1]) for n in ("INPUT", "START", "state_in")],
        [gen_models._vi(n, i32, ["batch", 1]) for n in ("OUTPUT", "state_out")],
        [one],
        name="seq_accum",
    )


def corrid_onnx():
    return gen_models._model(
        [
            helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]),
            helper.make_node("Identity", ["INPUT"], ["INPUT_OUT"]),
        ],
        [gen_models._vi("INPUT", TensorProto.INT32, ["batch", 1]), gen_models._vi("CORRID", TensorProto.UINT64, ["batch", 1])],
        [gen_models._vi("CORRID_OUT", TensorProto.UINT64, ["batch", 1]), gen_models._vi("INPUT_OUT", TensorProto.INT32, ["batch", 1])],
        name="seq_corrid",
    )


def sum_onnx():
    i32 = TensorProto.INT32
    return gen_models._model(
        [
            helper.make_node("Add", ["state_in", "INPUT"], ["OUTPUT"]),
            helper.make_node("Identity", ["OUTPUT"], ["state_out"]),
        ],
        [gen_models._vi(n, i32, ["batch", 1]) for n in ("INPUT", "state_in")],
        [gen_models._vi(n, i32, ["batch", 1]) for n in ("OUTPUT", "state_out")],
        name="seq_sum_init",
    )


def slots_onnx():
    i32 = TensorProto.INT32
    zero = numpy_helper.from_array(np.array([[0]], dtype=np.int32), "zero")
    one = numpy_helper.from_array(np.array([[1]], dtype=np.int32), "one")
    return gen_models._model(
        [
            # zeros [batch, 1], then per row: the sum over the batch of ones, and of READY.
            helper.make_node("Mul", ["INPUT", "zero"], ["zeros"]),
            helper.make_node("Add", ["zeros", "one"], ["ones"]),
            helper.make_node("ReduceSum", ["ones"], ["rows"], keepdims=1),
            helper.make_node("ReduceSum", ["READY"], ["ready"], keepdims=1),
            helper.make_node("Add", ["zeros", "rows"], ["ROWS"]),
            helper.make_node("Add", ["zeros", "ready"], ["READY_SUM"]),
        ],
        [gen_models._vi(n, i32, ["batch", 1]) for n in ("INPUT", "READY")],
        [gen_models._vi(n, i32, ["batch", 1]) for n in ("ROWS", "READY_SUM")],
        [zero, one],
        name="seq_slots",
    )


def sum_init_config(name="seq_sum_init"):
    extra = """sequence_batching {
  state [
    { input_name: "state_in" output_name: "state_out" data_type: TYPE_INT32 dims: [ 1 ]
      initial_state: { name: "hundred" data_type: TYPE_INT32 dims: [ 1 ] data_file: "init.bin" } }
  ]
}
"""
    return gen_models.config_text(name, 4, [("INPUT", "INT32", [1])], [("OUTPUT", "INT32", [1])], extra)


def slots_config(name, max_batch_size, strategy):
    extra = f"""sequence_batching {{
  {strategy}
  control_input [
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
  ]
}}
"""
    outputs = [("ROWS", "INT32", [1]), ("READY_SUM", "INT32", [1])]
    return gen_models.config_text(name, max_batch_size, [("INPUT", "INT32", [1])], outputs, extra)


WARMUP = """model_warmup [ { name: "sequence" batch_size: 2 count: 2
  inputs { key: "INPUT" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } } ]
"""


def accum_config(name, strategy, idle_us):
    extra = f"""sequence_batching {{
  max_sequence_idle_microseconds: {idle_us}
  {strategy}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }}
  ]
  state [
    {{ input_name: "state_in" output_name: "state_out" data_type: TYPE_INT32 dims: [ 1 ]
       initial_state: {{ name: "zeros" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }} }}
  ]
}}
"""
    return gen_models.config_text(name, 4, [("INPUT", "INT32", [1])], [("OUTPUT", "INT32", [1])], extra)


def corrid_config():
    extra = """sequence_batching {
  control_input [
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
"""
    return gen_models.config_text(
        "seq_corrid", 4, [("INPUT", "INT32", [1])], [("CORRID_OUT", "UINT64", [1]), ("INPUT_OUT", "INT32", [1])], extra
    )


SLOTS_PY = """import numpy as np
import triton_python_backend_utils as pb_utils


def value(request, name):
    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def execute(self, requests):
        ready = [value(r, "READY") for r in requests]
        out = []
        for r, mine in zip(requests, ready):
            row = lambda v: np.array([[v]], dtype=np.int32)
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("ROWS", row(len(requests))),
                pb_utils.Tensor("READY_ROWS", row(sum(ready))),
                pb_utils.Tensor("MY_READY", row(mine)),
                pb_utils.Tensor("MY_START", row(value(r, "START"))),
            ]))
        return out
"""

INIT_PY = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(r, "state_in").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", (x + state).astype(np.int32))]))
        return out
"""

SLOTS_PY_CONFIG = """backend: "python"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "READY_ROWS" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "MY_READY" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "MY_START" data_type: TYPE_INT32 dims: [ 1 ] }
]
sequence_batching {
  direct { }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
instance_group [ { count: 1 kind: KIND_CPU } ]
model_warmup [ { name: "sequence" batch_size: 1
  inputs { key: "INPUT" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }
  inputs { key: "START" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }
  inputs { key: "READY" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }
  inputs { key: "CORRID" value: { data_type: TYPE_UINT64 dims: [ 1 ] zero_data: true } } } ]
"""

INIT_PY_CONFIG = """backend: "python"
max_batch_size: 0
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching {
  state [
    { input_name: "state_in" output_name: "state_out" data_type: TYPE_INT32 dims: [ 1 ]
      initial_state: { name: "hundred" data_type: TYPE_INT32 dims: [ 1 ] data_file: "init.bin" } }
  ]
}
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def write_python_repository(repo):
    """Python-backend sequence models, loadable by Triton 2.51 and Nereid alike."""
    repo = Path(repo)
    for name, config, source in (("seq_slots_py", SLOTS_PY_CONFIG, SLOTS_PY), ("seq_init_py", INIT_PY_CONFIG, INIT_PY)):
        d = repo / name
        (d / "1").mkdir(parents=True, exist_ok=True)
        (d / "config.pbtxt").write_text(config)
        (d / "1" / "model.py").write_text(source)
    (repo / "seq_init_py" / "initial_state").mkdir(exist_ok=True)
    (repo / "seq_init_py" / "initial_state" / "init.bin").write_bytes(np.array([INITIAL_STATE], dtype="<i4").tobytes())
    return repo


def write_repository(repo):
    repo = Path(repo)
    repo.mkdir(parents=True, exist_ok=True)
    gen_models.write_model(repo, "seq_accum", {1: accum_onnx()}, accum_config("seq_accum", "direct { }", ACCUM_IDLE_US))
    gen_models.write_model(
        repo,
        "seq_accum_oldest",
        {1: accum_onnx()},
        accum_config("seq_accum_oldest", "oldest { max_candidate_sequences: 4 }", OLDEST_IDLE_US),
    )
    gen_models.write_model(repo, "seq_corrid", {1: corrid_onnx()}, corrid_config())
    d = gen_models.write_model(repo, "seq_sum_init", {1: sum_onnx()}, sum_init_config())
    (d / "initial_state").mkdir()
    (d / "initial_state" / "init.bin").write_bytes(np.array([INITIAL_STATE], dtype="<i4").tobytes())
    gen_models.write_model(repo, "seq_init_missing", {1: sum_onnx()}, sum_init_config("seq_init_missing"))
    d = gen_models.write_model(repo, "seq_init_short", {1: sum_onnx()}, sum_init_config("seq_init_short"))
    (d / "initial_state").mkdir()
    (d / "initial_state" / "init.bin").write_bytes(b"\x01\x02")
    gen_models.write_model(
        repo, "seq_accum_warm", {1: accum_onnx()}, accum_config("seq_accum_warm", "direct { }", ACCUM_IDLE_US) + WARMUP
    )
    gen_models.write_model(repo, "seq_slots", {1: slots_onnx()}, slots_config("seq_slots", 4, "direct { }"))
    wait = f"direct {{ max_queue_delay_microseconds: {WAIT_DELAY_US} minimum_slot_utilization: 1.0 }}"
    gen_models.write_model(repo, "seq_slots_wait", {1: slots_onnx()}, slots_config("seq_slots_wait", 2, wait))
    return repo


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(write_repository(sys.argv[1]))
