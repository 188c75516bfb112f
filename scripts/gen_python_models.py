#!/usr/bin/env python3
"""Writes a model repository of Triton Python-backend models, servable unchanged by Nereid and by
the real Triton server: the differential tests (tests/python/test_triton_diff.py) and the
"versus Triton" benchmark (scripts/bench_triton.sh) run both servers on it.

Models:
- add_sub            INT32 [4] x2 -> OUTPUT0 = a + b, OUTPUT1 = a - b; no batching; one
                     instance group without a name (Triton names it `add_sub_0`).
- identity_fp32      FP32 [16], batching up to 8; no instance_group (the group takes the model's
                     name).
- identity_fp16 / identity_bytes / identity_bool: the same for FP16 [-1], BYTES [-1], BOOL [-1].
- identity_large     FP32 [-1], no batching: the 1 MiB tensor of the benchmark.
- sequence_acc       INT32 [1], sequence batching (direct, START/END control inputs, the running
                     sum kept per correlation id in the model): OUTPUT = running sum.
- repeat_decoupled   decoupled: IN INT32 [-1] -> one response per element, then the final flag.
- repeat_final_with_last: as repeat_decoupled, but the last response carries the final flag
                     (the flag alone for an empty IN).
- bls_decoupled_seen BLS: IN INT32 [-1] sent to repeat_decoupled (SEPARATE) and to
                     repeat_final_with_last (WITH_LAST) as decoupled calls; each output lists
                     what the caller's iterator gave: OUT's value, or -1 for a response
                     without outputs.
- classify_fp32 / classify_int32: identity FP32 [5] (batching up to 8) and INT32 [4] (no
                     batching) whose outputs name a label file (labels.txt), for the
                     classification extension.
- cfg_*              identity models whose configs use the features the Python backend accepts
                     (dynamic batching with preferred sizes, priorities and queue policies,
                     named instance groups, parameters, version policy, the oldest sequence
                     strategy, optional inputs, warm-up): the model-config answers are compared.
- ragged_sum_py      ragged batching: INPUT FP32 [-1] with allow_ragged_batch, a batch_input and
                     a batch_output, dynamic batching with a 1 s queue delay. Per request: SUM of
                     INPUT, NINPUTS (the inputs the model was given: the Python backend gets no
                     batch inputs) and BATCH (the requests of its execute call).
"""

import argparse
import sys
import textwrap
from pathlib import Path

HEADER = "import numpy as np\nimport triton_python_backend_utils as pb_utils\n\n"

ADD_SUB = HEADER + textwrap.dedent("""
    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for r in requests:
                a = pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy()
                b = pb_utils.get_input_tensor_by_name(r, "INPUT1").as_numpy()
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT0", (a + b).astype(np.int32)),
                    pb_utils.Tensor("OUTPUT1", (a - b).astype(np.int32)),
                ]))
            return responses
""")

def identity_source(input_name="INPUT0"):
    """A model.py answering OUTPUT0 = the input `input_name`, one response per request."""
    return HEADER + textwrap.dedent(f"""
        class TritonPythonModel:
            def execute(self, requests):
                return [
                    pb_utils.InferenceResponse([pb_utils.Tensor(
                        "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "{input_name}").as_numpy())])
                    for r in requests
                ]
    """)


IDENTITY = identity_source()

FINAL_WITH_LAST = HEADER + textwrap.dedent("""
    class TritonPythonModel:
        def execute(self, requests):
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            for r in requests:
                sender = r.get_response_sender()
                values = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                if len(values) == 0:
                    sender.send(flags=final)
                for n, v in enumerate(values):
                    sender.send(pb_utils.InferenceResponse([
                        pb_utils.Tensor("OUT", np.array([v], dtype=np.int32))]),
                        flags=final if n + 1 == len(values) else 0)
            return None
""")

BLS_DECOUPLED_SEEN = HEADER + textwrap.dedent("""
    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for r in requests:
                values = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                outputs = []
                for name, model in (("SEPARATE", "repeat_decoupled"),
                                    ("WITH_LAST", "repeat_final_with_last")):
                    call = pb_utils.InferenceRequest(
                        model_name=model, requested_output_names=["OUT"],
                        inputs=[pb_utils.Tensor("IN", values)])
                    seen = []
                    for response in call.exec(decoupled=True):
                        if response.has_error():
                            raise pb_utils.TritonModelException(response.error().message())
                        out = pb_utils.get_output_tensor_by_name(response, "OUT")
                        seen.append(-1 if out is None else int(out.as_numpy()[0]))
                    outputs.append(pb_utils.Tensor(name, np.array(seen, dtype=np.int32)))
                responses.append(pb_utils.InferenceResponse(outputs))
            return responses
""")

SEQUENCE = HEADER + textwrap.dedent("""
    class TritonPythonModel:
        def initialize(self, args):
            self.sums = {}

        def execute(self, requests):
            responses = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
                start = pb_utils.get_input_tensor_by_name(r, "START").as_numpy()
                end = pb_utils.get_input_tensor_by_name(r, "END").as_numpy()
                cid = r.correlation_id()
                total = (0 if start.any() else self.sums.get(cid, 0)) + int(x.sum())
                self.sums[cid] = total
                if end.any():
                    self.sums.pop(cid, None)
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUTPUT", np.full(x.shape, total, dtype=np.int32))]))
            return responses
""")

RAGGED_SUM = HEADER + textwrap.dedent("""
    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "INPUT").as_numpy()
                responses.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("SUM", np.array([[x.sum()]], dtype=np.float32)),
                    pb_utils.Tensor("NINPUTS", np.array([[len(r.inputs())]], dtype=np.int32)),
                    pb_utils.Tensor("BATCH", np.array([[len(requests)]], dtype=np.int32)),
                ]))
            return responses
""")

DECOUPLED = HEADER + textwrap.dedent("""
    class TritonPythonModel:
        def execute(self, requests):
            for r in requests:
                sender = r.get_response_sender()
                values = pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()
                for v in values:
                    sender.send(pb_utils.InferenceResponse([
                        pb_utils.Tensor("OUT", np.array([v], dtype=np.int32))]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            return None
""")


def io(kind, name, dtype, dims):
    return f'{kind} [ {{ name: "{name}" data_type: {dtype} dims: [ {dims} ] }} ]'


def identity(dtype, dims, max_batch):
    return "\n".join([
        'backend: "python"',
        f"max_batch_size: {max_batch}",
        io("input", "INPUT0", dtype, dims),
        io("output", "OUTPUT0", dtype, dims),
    ])


# A decoupled model that answers IN (INT32, any length) with one OUT per element.
REPEAT_CONFIG = "\n".join([
    'backend: "python"',
    "max_batch_size: 0",
    io("input", "IN", "TYPE_INT32", "-1"),
    io("output", "OUT", "TYPE_INT32", "1"),
    "model_transaction_policy { decoupled: true }",
])

MODELS = {
    "add_sub": ("\n".join([
        'backend: "python"',
        "max_batch_size: 0",
        'input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 4 ] },'
        ' { name: "INPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]',
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] },'
        ' { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 4 ] } ]',
        "instance_group [ { count: 1 kind: KIND_CPU } ]",
    ]), ADD_SUB),
    "identity_fp32": (identity("TYPE_FP32", "16", 8), IDENTITY),
    "identity_fp16": (identity("TYPE_FP16", "-1", 8), IDENTITY),
    "identity_bytes": (identity("TYPE_STRING", "-1", 8), IDENTITY),
    "identity_bool": (identity("TYPE_BOOL", "-1", 8), IDENTITY),
    "identity_large": (identity("TYPE_FP32", "-1", 0), IDENTITY),
    "sequence_acc": ("\n".join([
        'backend: "python"',
        "max_batch_size: 8",
        io("input", "INPUT", "TYPE_INT32", "1"),
        io("output", "OUTPUT", "TYPE_INT32", "1"),
        "sequence_batching {",
        "  max_sequence_idle_microseconds: 5000000",
        "  control_input [",
        '    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },',
        '    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] }',
        "  ]",
        "}",
    ]), SEQUENCE),
    "repeat_decoupled": (REPEAT_CONFIG, DECOUPLED),
    "repeat_final_with_last": (REPEAT_CONFIG, FINAL_WITH_LAST),
    "bls_decoupled_seen": ("\n".join([
        'backend: "python"',
        "max_batch_size: 0",
        io("input", "IN", "TYPE_INT32", "-1"),
        'output [ { name: "SEPARATE" data_type: TYPE_INT32 dims: [ -1 ] },'
        ' { name: "WITH_LAST" data_type: TYPE_INT32 dims: [ -1 ] } ]',
    ]), BLS_DECOUPLED_SEEN),
    "classify_fp32": ("\n".join([
        'backend: "python"',
        "max_batch_size: 8",
        io("input", "INPUT0", "TYPE_FP32", "5"),
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 5 ] label_filename: "labels.txt" } ]',
    ]), IDENTITY),
    "classify_int32": ("\n".join([
        'backend: "python"',
        "max_batch_size: 0",
        io("input", "INPUT0", "TYPE_INT32", "4"),
        'output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 4 ] label_filename: "labels.txt" } ]',
    ]), IDENTITY),
    "cfg_dynamic": ("\n".join([
        identity("TYPE_FP32", "-1", 4),
        'instance_group [ { name: "pool" count: 2 kind: KIND_CPU } ]',
        "dynamic_batching { preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 100 }",
        'parameters { key: "note" value: { string_value: "x" } }',
        "version_policy { all { } }",
    ]), IDENTITY),
    "cfg_priority": ("\n".join([
        identity("TYPE_FP32", "2", 4),
        "dynamic_batching { priority_levels: 2 default_priority_level: 1 default_queue_policy {"
        " timeout_action: REJECT default_timeout_microseconds: 1000 max_queue_size: 8 } }",
    ]), IDENTITY),
    "cfg_seq_oldest": ("\n".join([
        identity("TYPE_INT32", "1", 2),
        "sequence_batching { oldest { max_candidate_sequences: 4 }",
        "  max_sequence_idle_microseconds: 1000000 control_input [",
        '    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },',
        '    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }',
        "  ] }",
    ]), IDENTITY),
    "cfg_optional": ("\n".join([
        'backend: "python"',
        "max_batch_size: 0",
        'input [ { name: "A" data_type: TYPE_FP32 dims: [ 2 ] },'
        ' { name: "B" data_type: TYPE_FP32 dims: [ 2 ] optional: true } ]',
        io("output", "OUTPUT0", "TYPE_FP32", "2"),
        'model_warmup [ { name: "w" batch_size: 1 inputs { key: "A" value: {'
        " data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } } ]",
    ]), identity_source("A")),
    "ragged_sum_py": ("\n".join([
        'backend: "python"',
        "max_batch_size: 8",
        'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]',
        'output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] },'
        ' { name: "NINPUTS" data_type: TYPE_INT32 dims: [ 1 ] },'
        ' { name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] } ]',
        'batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "INDEX"'
        ' data_type: TYPE_INT32 source_input: "INPUT" } ]',
        'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "SUM"'
        ' source_input: "INPUT" } ]',
        "dynamic_batching { max_queue_delay_microseconds: 1000000 }",
    ]), RAGGED_SUM),
}


# Files a model directory holds besides config.pbtxt and its version folder.
MODEL_FILES = {
    "classify_fp32": {"labels.txt": "cat\ndog\n\nfish\nbird\n"},
    "classify_int32": {"labels.txt": "zero\none\n"},
}


def write_repository(out_dir, names=None):
    out = Path(out_dir)
    for name, (config, source) in MODELS.items():
        if names is not None and name not in names:
            continue
        (out / name / "1").mkdir(parents=True, exist_ok=True)
        (out / name / "config.pbtxt").write_text(config + "\n")
        (out / name / "1" / "model.py").write_text(source)
        for file, text in MODEL_FILES.get(name, {}).items():
            (out / name / file).write_text(text)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("out_dir")
    p.add_argument("models", nargs="*", help="only these models (default: all)")
    args = p.parse_args(argv)
    write_repository(args.out_dir, args.models or None)
    print(f"wrote {args.models or sorted(MODELS)} to {args.out_dir}", file=sys.stderr)


if __name__ == "__main__":
    main()
