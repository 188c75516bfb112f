#!/usr/bin/env python3
"""Writes the benchmark model repository (`make bench`), deterministic:

  mlp_large           FP32 x[-1,256] -> y[-1,256]: 256->1024->1024->256 MLP, ReLU, dynamic batching
  mlp_large_nobatch   the same model, default scheduler (no dynamic batching)
  mlp_large_fss       mlp_large with `session.force_spinning_stop: "1"` (ONNX Runtime's intra-op
                      threads stop spinning when a run ends instead of burning the shared cores)
  resnet50            the onnx package's light_resnet50 made batchable, dynamic batching
  identity            identity backend, FP32 INPUT0[-1,16] -> OUTPUT0, dynamic batching
  identity_large      identity backend, FP32 INPUT0[-1] -> OUTPUT0, no batching: large tensors
                      (4 MiB in the shared-memory vs network comparison)

The `.onnx` files of mlp_large are also written to OUT/_files/ for the in-process benchmark.
usage: gen_bench_models.py OUT_DIR
"""

import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
BATCHER = "dynamic_batching { max_queue_delay_microseconds: 0 }\n"


def mlp_large():
    rng = np.random.default_rng(7)
    sizes = [256, 1024, 1024, 256]
    nodes, inits, prev = [], [], "x"
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        w = (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32)
        bias = (rng.standard_normal(b) * 0.01).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(bias, f"b{i}")]
        out = "y" if i == len(sizes) - 2 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]))
        if out == "y":
            nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], ["y"]))
        else:
            nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"]))
            nodes.append(helper.make_node("Relu", [f"a{i}"], [out]))
        prev = out
    graph = helper.make_graph(
        nodes, "mlp_large",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 256])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                              producer_name="nereid-bench")
    onnx.checker.check_model(model)
    return model.SerializeToString(deterministic=True)


def resnet50():
    """light_resnet50 with a symbolic batch: input renamed `data`, output `prob`, initializers
    no longer listed as graph inputs, and the flattening Reshape made batch-agnostic."""
    src = Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"
    m = onnx.load(str(src))
    m.ir_version = max(m.ir_version, 4)  # IR 4+: initializers need not be graph inputs
    init_names = {i.name for i in m.graph.initializer}
    keep = [i for i in m.graph.input if i.name not in init_names]
    del m.graph.input[:]
    m.graph.input.extend(keep)
    old_in, old_out = m.graph.input[0].name, m.graph.output[0].name
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    m.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "N"
    for init in m.graph.initializer:
        if init.name == "OC2_DUMMY_1":
            init.CopyFrom(numpy_helper.from_array(np.array([-1, 2048], dtype=np.int64), init.name))
    for node in m.graph.node:
        node.input[:] = ["data" if n == old_in else n for n in node.input]
        node.output[:] = ["prob" if n == old_out else n for n in node.output]
    m.graph.input[0].name = "data"
    m.graph.output[0].name = "prob"
    del m.graph.value_info[:]
    onnx.checker.check_model(m)
    return m.SerializeToString(deterministic=True)


def write(repo, name, config, model=None):
    d = repo / name
    if d.exists():
        shutil.rmtree(d)
    (d / "1").mkdir(parents=True)
    (d / "config.pbtxt").write_text(config)
    if model is not None:
        (d / "1" / "model.onnx").write_bytes(model)


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    repo = Path(argv[1])
    repo.mkdir(parents=True, exist_ok=True)
    mlp = mlp_large()
    io = ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 256 ] } ]\n'
          'output [ { name: "y" data_type: TYPE_FP32 dims: [ 256 ] } ]\n'
          'instance_group [ { count: 1 kind: KIND_CPU } ]\n')
    write(repo, "mlp_large", f'platform: "onnxruntime_onnx"\nmax_batch_size: 32\n{io}{BATCHER}', mlp)
    write(repo, "mlp_large_nobatch", f'platform: "onnxruntime_onnx"\nmax_batch_size: 32\n{io}', mlp)
    write(repo, "mlp_large_fss",
          f'platform: "onnxruntime_onnx"\nmax_batch_size: 32\n{io}{BATCHER}'
          'parameters { key: "session.force_spinning_stop" value: { string_value: "1" } }\n', mlp)
    write(repo, "resnet50",
          'platform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
          'input [ { name: "data" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]\n'
          'output [ { name: "prob" data_type: TYPE_FP32 dims: [ 1000 ] } ]\n'
          'instance_group [ { count: 1 kind: KIND_CPU } ]\n'
          'parameters { key: "intra_op_thread_count" value: { string_value: "2" } }\n' + BATCHER,
          resnet50())
    write(repo, "identity",
          'backend: "identity"\nmax_batch_size: 32\n'
          'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
          'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
          'instance_group [ { count: 1 kind: KIND_CPU } ]\n' + BATCHER)
    write(repo, "identity_large",
          'backend: "identity"\nmax_batch_size: 0\n'
          'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
          'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
          'instance_group [ { count: 1 kind: KIND_CPU } ]\n')
    print(f"wrote benchmark models to {repo}")


if __name__ == "__main__":
    main(sys.argv)
