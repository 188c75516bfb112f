#!/usr/bin/env python3
"""Installs the pipeline examples of docs/examples/pipelines into a model repository.

    gen_pipeline_examples.py OUT_DIR

Copies every model directory of docs/examples/pipelines (config.pbtxt and Python model.py
files, kept in git so users can read them), creates the empty version directory ensembles
need, and generates the one binary file: text_classifier/1/model.onnx (token ids -> embedding
-> mean over tokens -> ReLU layer -> 3 logits: negative, neutral, positive), whose fixed
weights make the tokenizer's positive words raise the positive logit and its negative words
the negative one. Deterministic and idempotent; needs `onnx` and `numpy`. The `classify_pipeline`
ensemble also needs the `mlp` model of gen_models.py's example set.
"""

import shutil
import sys
import types
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_models import _model, _vi  # noqa: E402

SOURCES = Path(__file__).resolve().parent.parent / "docs" / "examples" / "pipelines"
EMBEDDING = 16
POSITIVE = ["good", "great", "excellent", "love", "loved", "wonderful", "happy", "best", "fine"]
NEGATIVE = ["bad", "terrible", "awful", "hate", "hated", "boring", "worst", "sad", "poor", "not"]


def vocabulary():
    """The tokenizer's word -> id table, read from its model.py (one source of truth)."""
    sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    namespace = {}
    code = (SOURCES / "tokenizer" / "1" / "model.py").read_text()
    exec(compile(code, "tokenizer/1/model.py", "exec"), namespace)
    return namespace["VOCABULARY"]


def text_classifier_onnx():
    vocab = vocabulary()
    size = max(vocab.values()) + 1
    rng = np.random.default_rng(7)
    table = rng.normal(0.0, 0.05, size=(size, EMBEDDING)).astype(np.float32)
    table[0] = 0.0  # padding contributes nothing to the mean
    for word in POSITIVE:
        table[vocab[word], 0] += 1.0
    for word in NEGATIVE:
        table[vocab[word], 1] += 1.0
    w1 = np.eye(EMBEDDING, dtype=np.float32)
    b1 = np.zeros(EMBEDDING, dtype=np.float32)
    w2 = np.zeros((EMBEDDING, 3), dtype=np.float32)
    w2[1, 0] = 120.0  # negative words -> "negative"
    w2[0, 2] = 120.0  # positive words -> "positive"
    b2 = np.array([0.0, 0.5, 0.0], dtype=np.float32)  # nothing known -> "neutral"
    return _model(
        [
            helper.make_node("Gather", ["embedding", "token_ids"], ["vectors"], axis=0),
            helper.make_node("ReduceMean", ["vectors"], ["mean"], axes=[1], keepdims=0),
            helper.make_node("MatMul", ["mean", "w1"], ["h0"]),
            helper.make_node("Add", ["h0", "b1"], ["h1"]),
            helper.make_node("Relu", ["h1"], ["h"]),
            helper.make_node("MatMul", ["h", "w2"], ["z"]),
            helper.make_node("Add", ["z", "b2"], ["logits"]),
        ],
        [_vi("token_ids", TensorProto.INT64, ["batch", 128])],
        [_vi("logits", TensorProto.FLOAT, ["batch", 3])],
        [
            numpy_helper.from_array(table, "embedding"),
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(b1, "b1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(b2, "b2"),
        ],
        name="text_classifier",
    )


def install(out_dir):
    """Copies the pipeline models into `out_dir` (replacing each as a whole); returns names."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for source in sorted(p for p in SOURCES.iterdir() if p.is_dir()):
        target = out / source.name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        (target / "1").mkdir(exist_ok=True)
        names.append(source.name)
    (out / "text_classifier" / "1" / "model.onnx").write_bytes(text_classifier_onnx())
    return names


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    names = install(argv[1])
    print(f"wrote {len(names)} pipeline models to {argv[1]}: {', '.join(names)}", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv)
