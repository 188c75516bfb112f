#!/usr/bin/env python3
"""Generates the TorchScript test models under tests/models/pytorch/ with PyTorch itself.

Each model directory is a Triton model repository entry (config.pbtxt, 1/model.pt) plus
expected.json: the inputs the tests send and the outputs PyTorch computed for them, so the
server's results are compared with PyTorch's own.

Needs a full `torch` install (`import torch` does not work in the project's serving-only venv):

    python3 -m venv /tmp/torchgen && /tmp/torchgen/bin/pip install torch==2.13.0 "numpy<2"
    /tmp/torchgen/bin/python scripts/gen_torch_models.py tests/models/pytorch

The outputs are committed (a few KB each); rerun only to change the models.
"""

import json
import os
import sys
from typing import Dict, List, Tuple

import torch

torch.manual_seed(7)

DTYPES = {
    torch.bool: "BOOL",
    torch.uint8: "UINT8",
    torch.int8: "INT8",
    torch.int16: "INT16",
    torch.int32: "INT32",
    torch.int64: "INT64",
    torch.float16: "FP16",
    torch.float32: "FP32",
    torch.float64: "FP64",
    torch.bfloat16: "BF16",
}


def encode(t) -> dict:
    """A tensor as JSON: datatype, shape and row-major values (FP16/BF16 as float values); a
    list of strings (Triton's BYTES convention) as a 1-D BYTES tensor."""
    if isinstance(t, list):
        return {"datatype": "BYTES", "shape": [len(t)], "data": t}
    values = t.detach().to(torch.float64 if t.is_floating_point() else t.dtype).flatten().tolist()
    return {"datatype": DTYPES[t.dtype], "shape": list(t.shape), "data": values}


def write(root: str, name: str, module, config: str, inputs: Dict[str, torch.Tensor], call):
    directory = os.path.join(root, name)
    os.makedirs(os.path.join(directory, "1"), exist_ok=True)
    torch.jit.save(module, os.path.join(directory, "1", "model.pt"))
    with open(os.path.join(directory, "config.pbtxt"), "w") as f:
        f.write(config.strip() + "\n")
    loaded = torch.jit.load(os.path.join(directory, "1", "model.pt"))
    with torch.no_grad():
        outputs = call(loaded, inputs)
    expected = {
        "inputs": {k: encode(v) for k, v in inputs.items()},
        "outputs": {k: encode(v) for k, v in outputs.items()},
    }
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
        f.write("\n")
    print(f"{name}: {os.path.getsize(os.path.join(directory, '1', 'model.pt'))} bytes")


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 16)
        self.fc2 = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class SmallConv(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, kernel_size=3, padding=1)
        self.fc = torch.nn.Linear(4 * 4 * 4, 2)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.max_pool2d(torch.relu(self.conv(image)), 2)
        return torch.softmax(self.fc(h.flatten(1)), dim=1)


class AddSub(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return a + b, a - b


class Types(torch.nn.Module):
    """One input and one output per shared dtype: numbers + 1, booleans negated; a list out."""

    def forward(
        self,
        b: torch.Tensor,
        u8: torch.Tensor,
        i8: torch.Tensor,
        i16: torch.Tensor,
        i32: torch.Tensor,
        i64: torch.Tensor,
        f16: torch.Tensor,
        f32: torch.Tensor,
        f64: torch.Tensor,
        bf16: torch.Tensor,
    ) -> List[torch.Tensor]:
        return [
            torch.logical_not(b),
            u8 + 1,
            i8 + 1,
            i16 + 1,
            i32 + 1,
            i64 + 1,
            f16 + 1,
            f32 + 1,
            f64 + 1,
            bf16 + 1,
        ]


class Strings(torch.nn.Module):
    """BYTES through Triton's list-of-strings convention: words in, upper-cased words and
    their lengths out."""

    def forward(self, words: List[str]) -> Tuple[List[str], torch.Tensor]:
        upper = [w.upper() for w in words]
        lengths = torch.tensor([len(w) for w in words], dtype=torch.int64)
        return upper, lengths


class DictInput(torch.nn.Module):
    def forward(self, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
        return inputs["x"] * inputs["scale"]


def main(root: str):
    os.makedirs(root, exist_ok=True)

    mlp = torch.jit.script(Mlp().eval())
    write(root, "mlp_script", mlp, """
name: "mlp_script"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [ { kind: KIND_CPU count: 1 } ]
""", {"INPUT__0": torch.randn(3, 4)}, lambda m, i: {"OUTPUT__0": m(i["INPUT__0"])})

    conv = SmallConv().eval()
    traced = torch.jit.trace(conv, torch.randn(2, 1, 8, 8))
    write(root, "conv_trace", traced, """
name: "conv_trace"
backend: "pytorch"
max_batch_size: 4
input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 1, 8, 8 ] } ]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
""", {"INPUT__0": torch.randn(2, 1, 8, 8)}, lambda m, i: {"OUTPUT__0": m(i["INPUT__0"])})

    add_sub = torch.jit.script(AddSub())
    write(root, "add_sub_script", add_sub, """
name: "add_sub_script"
platform: "pytorch_libtorch"
max_batch_size: 0
input [
  { name: "a" data_type: TYPE_INT32 dims: [ 4 ] },
  { name: "b" data_type: TYPE_INT32 dims: [ 4 ] }
]
output [
  { name: "SUM__0" data_type: TYPE_INT32 dims: [ 4 ] },
  { name: "DIFF__1" data_type: TYPE_INT32 dims: [ 4 ] }
]
""", {
        "a": torch.tensor([1, 2, 3, 4], dtype=torch.int32),
        "b": torch.tensor([10, 20, 30, -40], dtype=torch.int32),
    }, lambda m, i: dict(zip(["SUM__0", "DIFF__1"], m(i["a"], i["b"]))))

    types = torch.jit.script(Types())
    dtypes = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
              torch.float16, torch.float32, torch.float64, torch.bfloat16]
    triton = {"BOOL": "TYPE_BOOL", "UINT8": "TYPE_UINT8", "INT8": "TYPE_INT8",
              "INT16": "TYPE_INT16", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64",
              "FP16": "TYPE_FP16", "FP32": "TYPE_FP32", "FP64": "TYPE_FP64", "BF16": "TYPE_BF16"}
    ins = ",\n".join(f'  {{ name: "INPUT__{k}" data_type: {triton[DTYPES[d]]} dims: [ 3 ] }}'
                     for k, d in enumerate(dtypes))
    outs = ",\n".join(f'  {{ name: "OUTPUT__{k}" data_type: {triton[DTYPES[d]]} dims: [ 3 ] }}'
                      for k, d in enumerate(dtypes))
    values = {}
    for k, d in enumerate(dtypes):
        if d == torch.bool:
            values[f"INPUT__{k}"] = torch.tensor([[True, False, True], [False, False, True]])
        elif d.is_floating_point:
            values[f"INPUT__{k}"] = torch.tensor([[0.5, -1.25, 3.0], [8.0, 0.0, -0.5]], dtype=d)
        else:
            values[f"INPUT__{k}"] = torch.tensor([[0, 5, 100], [7, 1, 2]], dtype=d)
    write(root, "types_script", types, f"""
name: "types_script"
platform: "pytorch_libtorch"
max_batch_size: 4
input [
{ins}
]
output [
{outs}
]
""", values, lambda m, i: {f"OUTPUT__{k}": t for k, t in enumerate(
        m(*[i[f"INPUT__{j}"] for j in range(len(dtypes))]))})

    dict_model = torch.jit.script(DictInput())
    write(root, "dict_script", dict_model, """
name: "dict_script"
platform: "pytorch_libtorch"
max_batch_size: 0
input [
  { name: "x" data_type: TYPE_FP32 dims: [ 3 ] },
  { name: "scale" data_type: TYPE_FP32 dims: [ 3 ] }
]
output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]
""", {
        "x": torch.tensor([1.0, 2.0, 3.0]),
        "scale": torch.tensor([0.5, -2.0, 4.0]),
    }, lambda m, i: {"OUTPUT__0": m({"x": i["x"], "scale": i["scale"]})})

    strings = torch.jit.script(Strings())
    write(root, "strings_script", strings, """
name: "strings_script"
platform: "pytorch_libtorch"
max_batch_size: 0
input [ { name: "INPUT__0" data_type: TYPE_STRING dims: [ -1 ] } ]
output [
  { name: "OUTPUT__0" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "OUTPUT__1" data_type: TYPE_INT64 dims: [ -1 ] }
]
""", {"INPUT__0": ["nereid", "Triton", "ünïcode"]},
        lambda m, i: dict(zip(["OUTPUT__0", "OUTPUT__1"], m(i["INPUT__0"]))))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/models/pytorch")
