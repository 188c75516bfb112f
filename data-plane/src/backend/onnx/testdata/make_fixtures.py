#!/usr/bin/env python3
"""Writes the tiny ONNX models the ONNX Runtime backend's tests load.

    /work/main/.venv/bin/python data-plane/src/backend/onnx/testdata/make_fixtures.py

Output (next to this script; deterministic, so re-running leaves git clean):
  add_sub.onnx            INPUT0, INPUT1 FP32 [batch, 4] -> OUTPUT0 = a + b, OUTPUT1 = a - b
  identity_types.onnx     one Identity per type: in_<T> -> out_<T>, shape [batch, n], for
                          BOOL INT8 INT16 INT32 INT64 UINT8 UINT16 UINT32 UINT64 FP16 BF16 FP32
                          FP64 STRING
  fixed_batch.onnx        x FP32 [1, 3] -> y = -x [1, 3] (a batch dimension fixed at 1)
  external/model.onnx     x FP32 [batch, 4] -> y = x + w, w = [1, 2, 3, 4] stored in
  external/weights.bin    (an external-data model shipped as a `model.onnx` directory)
Needs the `onnx` and `numpy` packages (in the workspace's .venv after `make setup`).
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import convert_model_to_external_data

OPSET = 17
IR_VERSION = 8
HERE = Path(__file__).resolve().parent

# Suffix used in tensor names -> ONNX element type.
TYPES = [
    ("BOOL", TensorProto.BOOL),
    ("INT8", TensorProto.INT8),
    ("INT16", TensorProto.INT16),
    ("INT32", TensorProto.INT32),
    ("INT64", TensorProto.INT64),
    ("UINT8", TensorProto.UINT8),
    ("UINT16", TensorProto.UINT16),
    ("UINT32", TensorProto.UINT32),
    ("UINT64", TensorProto.UINT64),
    ("FP16", TensorProto.FLOAT16),
    ("BF16", TensorProto.BFLOAT16),
    ("FP32", TensorProto.FLOAT),
    ("FP64", TensorProto.DOUBLE),
    ("STRING", TensorProto.STRING),
]


def make_model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(list(nodes), "nereid_fixture", list(inputs), list(outputs), list(initializers))
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name="nereid-onnx-fixtures",
        ir_version=IR_VERSION,
    )
    onnx.checker.check_model(model)
    return model


def vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def write(model, name):
    (HERE / name).write_bytes(model.SerializeToString(deterministic=True))


def add_sub():
    shape = ["batch", 4]
    return make_model(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        [vi("INPUT0", TensorProto.FLOAT, shape), vi("INPUT1", TensorProto.FLOAT, shape)],
        [vi("OUTPUT0", TensorProto.FLOAT, shape), vi("OUTPUT1", TensorProto.FLOAT, shape)],
    )


def identity_types():
    shape = ["batch", "n"]
    return make_model(
        [helper.make_node("Identity", [f"in_{t}"], [f"out_{t}"]) for t, _ in TYPES],
        [vi(f"in_{t}", e, shape) for t, e in TYPES],
        [vi(f"out_{t}", e, shape) for t, e in TYPES],
    )


def fixed_batch():
    return make_model(
        [helper.make_node("Neg", ["x"], ["y"])],
        [vi("x", TensorProto.FLOAT, [1, 3])],
        [vi("y", TensorProto.FLOAT, [1, 3])],
    )


def external():
    w = numpy_helper.from_array(np.array([1, 2, 3, 4], dtype=np.float32), "w")
    model = make_model(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        [vi("x", TensorProto.FLOAT, ["batch", 4])],
        [vi("y", TensorProto.FLOAT, ["batch", 4])],
        [w],
    )
    convert_model_to_external_data(model, all_tensors_to_one_file=True, location="weights.bin", size_threshold=0)
    out = HERE / "external"
    out.mkdir(exist_ok=True)
    # onnx.save appends to an existing data file, so start from scratch to stay deterministic.
    for name in ("model.onnx", "weights.bin"):
        (out / name).unlink(missing_ok=True)
    # onnx.save writes weights.bin beside model.onnx, resolving `location` relative to it.
    onnx.save_model(model, str(out / "model.onnx"))
    (out / "weights.bin").chmod(0o644)


def main():
    write(add_sub(), "add_sub.onnx")
    write(identity_types(), "identity_types.onnx")
    write(fixed_batch(), "fixed_batch.onnx")
    external()


if __name__ == "__main__":
    main()
