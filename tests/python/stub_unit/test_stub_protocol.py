"""The real nereid_stub.py against a pure-Python parent (fake_parent.FakeParent).

Each test starts one stub process, plays the parent's side of
docs/internals/python-stub-protocol.md and checks what a Nereid user would notice: tensors
arriving intact through shared memory, errors carrying the model's traceback, decoupled and BLS
traffic, segment reuse and the stub's exit.
"""

import numpy as np

from fake_parent import PROTOCOL_VERSION

FINAL = 1


def release_stub_segment(parent, message):
    if "segment" in message:
        parent.send({"op": "release", "segment": message["segment"]})


ECHO = """
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                fp = pb_utils.get_input_tensor_by_name(request, "FP").as_numpy()
                ints = pb_utils.get_input_tensor_by_name(request, "INT").as_numpy()
                text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
                add = json.loads(request.parameters()).get("add", 0)
                reversed_text = np.array([t[::-1] for t in text.ravel()], dtype=object).reshape(text.shape)
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("FP_OUT", fp * 2), pb_utils.Tensor("INT_OUT", ints + add),
                     pb_utils.Tensor("TEXT_OUT", reversed_text)],
                    parameters={"seen": request.request_id()}))
            return responses
"""

SIMPLE = """
    import json
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.kept = None

        def execute(self, requests):
            out = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                self.kept = x if json.loads(request.parameters()).get("keep") else None
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
            return out
"""


def test_init_runs_initialize_logs_and_finalize(parent):
    done = parent.init("""
        import os
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                self.repo = args["model_repository"]
                pb_utils.Logger.log_info("initialized {} {}".format(args["model_instance_name"],
                                                                     args["model_instance_kind"]))

            def finalize(self):
                open(os.path.join(self.repo, "finalized"), "w").close()
    """)
    assert done["error"] is None
    assert ("INFO", "initialized m_0 CPU") in parent.logs
    parent.send({"op": "finalize"})
    assert parent.recv_op("finalize_done")["error"] is None
    assert parent.proc.wait(timeout=10) == 0
    assert (parent.workdir / "model" / "finalized").exists()


def test_init_syntax_error_carries_traceback(parent):
    done = parent.init("class TritonPythonModel:\n    def execute(self, requests:\n        pass\n")
    message = done["error"]["message"]
    assert "SyntaxError" in message
    assert "model.py" in message and "line 2" in message
    assert "nereid_stub.py" not in message


def test_initialize_exception_carries_traceback_and_blocks_execute(parent):
    done = parent.init("""
        class TritonPythonModel:
            def initialize(self, args):
                raise ValueError("bad config for " + args["model_name"])
    """)
    message = done["error"]["message"]
    assert message.startswith("Traceback (most recent call last):")
    assert "in initialize" in message and message.endswith("ValueError: bad config for m")
    parent.execute([{"inputs": [("X", np.zeros(2, np.float32))]}])
    reply = parent.recv_op("execute_done")
    assert "not initialized" in reply["error"]["message"] and reply.get("responses", []) == []


def test_missing_model_class_is_reported(parent):
    done = parent.init("class Model:\n    pass\n")
    assert "does not define class 'TritonPythonModel'" in done["error"]["message"]


def test_execute_round_trip_through_shared_memory(parent):
    assert parent.init(ECHO)["error"] is None
    fp = np.arange(6, dtype=np.float32).reshape(2, 3)
    ints = np.array([[1, -2**40]], dtype=np.int64)
    text = np.array([b"abc", b"", "h\u00e9".encode()], dtype=object)
    segment = parent.execute([
        {"inputs": [("FP", fp), ("INT", ints), ("TEXT", text)], "parameters": {"add": 5}},
        {"inputs": [("FP", fp[:1]), ("INT", ints), ("TEXT", text[:1])],
         "requested_output_names": ["FP_OUT", "TEXT_OUT"]},
    ])
    reply = parent.recv_op("execute_done")
    assert reply["id"] == 1 and reply["error"] is None and reply["segment"] == "s0"
    first, second = reply["responses"]
    out = parent.outputs(first, reply["segment"])
    np.testing.assert_array_equal(out["FP_OUT"], fp * 2)
    np.testing.assert_array_equal(out["INT_OUT"], ints + 5)
    assert out["TEXT_OUT"].tolist() == [b"cba", b"", "h\u00e9".encode()[::-1]]
    assert first["parameters"] == {"seen": "r0"} and first["error"] is None
    assert [r["name"] for r in second["outputs"]] == ["FP_OUT", "TEXT_OUT"]
    np.testing.assert_array_equal(parent.outputs(second, reply["segment"])["FP_OUT"], fp[:1] * 2)
    refs = first["outputs"] + second["outputs"]
    assert all(r["offset"] % 64 == 0 for r in refs)
    assert {(r["datatype"], tuple(r["shape"])) for r in first["outputs"]} == {
        ("FP32", (2, 3)), ("INT64", (1, 2)), ("BYTES", (3,))}
    parent.wait_released(segment)


def test_per_request_error_keeps_other_requests(parent):
    assert parent.init("""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for request in requests:
                    x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                    if x.sum() < 0:
                        out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                            "negative input", pb_utils.TritonError.INVALID_ARG)))
                    else:
                        out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
                return out
    """)["error"] is None
    parent.execute([{"inputs": [("X", np.ones(3, np.int32))]}, {"inputs": [("X", -np.ones(3, np.int32))]}])
    reply = parent.recv_op("execute_done")
    ok, bad = reply["responses"]
    assert reply["error"] is None and ok["error"] is None
    np.testing.assert_array_equal(parent.outputs(ok, reply["segment"])["Y"], np.ones(3, np.int32))
    assert bad == {"outputs": [], "error": {"message": "negative input", "code": "INVALID_ARG"},
                   "parameters": {}}


def test_execute_raising_or_returning_wrong_count_fails_batch(parent):
    assert parent.init("""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                if len(requests) == 1:
                    raise pb_utils.TritonModelException("boom")
                return [pb_utils.InferenceResponse()]
    """)["error"] is None
    parent.execute([{"inputs": [("X", np.zeros(1, np.float32))]}], execute_id=7)
    reply = parent.recv_op("execute_done")
    message = reply["error"]["message"]
    assert reply["id"] == 7 and reply.get("responses", []) == [] and reply["error"]["code"] == "INTERNAL"
    assert message.startswith(
        "Failed to process the request(s) for model 'm_0', message: TritonModelException: boom")
    assert "\n\nAt:\n" in message and "model.py(" in message and "): execute" in message
    assert "nereid_stub.py" not in message
    parent.execute([{"inputs": []}, {"inputs": []}], execute_id=8)
    reply = parent.recv_op("execute_done")
    assert "InferenceRequest(s) size is:2, and InferenceResponse(s) size is:1" in reply["error"]["message"]


def test_a_synchronous_model_does_not_load_asyncio(parent):
    """asyncio costs a stub about 3.5 MB: it is imported only for a model's awaitables."""
    assert parent.init("""
        import sys
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                loaded = np.array(["asyncio" in sys.modules], dtype=np.bool_)
                return [pb_utils.InferenceResponse([pb_utils.Tensor("LOADED", loaded)])
                        for _ in requests]
    """)["error"] is None
    parent.execute([{"inputs": []}])
    reply = parent.recv_op("execute_done")
    loaded = parent.outputs(reply["responses"][0], reply["segment"])["LOADED"]
    np.testing.assert_array_equal(loaded, [False])


def test_async_execute(parent):
    assert parent.init("""
        import asyncio
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            async def execute(self, requests):
                await asyncio.sleep(0)
                return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)]) for r in requests]
    """)["error"] is None
    parent.execute([{"inputs": [("X", np.arange(4, dtype=np.float64))]}])
    reply = parent.recv_op("execute_done")
    np.testing.assert_array_equal(parent.outputs(reply["responses"][0], reply["segment"])["Y"],
                                  np.arange(4) + 1.0)


def test_decoupled_sends_responses_then_final(parent):
    assert parent.init("""
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                for request in requests:
                    n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
                    sender = request.get_response_sender()
                    for i in range(n):
                        sender.send(pb_utils.InferenceResponse(
                            [pb_utils.Tensor("I", np.array([i], dtype=np.int32))]))
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    try:
                        sender.send(pb_utils.InferenceResponse())
                    except pb_utils.TritonModelException as e:
                        pb_utils.Logger.log_warn("after final: " + str(e))
                return None
    """, decoupled=True)["error"] is None
    parent.execute([{"inputs": [("N", np.array([3], np.int64))], "key": 42}])
    for i in range(3):
        message = parent.recv_op("response")
        assert message["key"] == 42 and message["flags"] == 0
        assert parent.outputs(message["response"], message["segment"])["I"].tolist() == [i]
        release_stub_segment(parent, message)
    final = parent.recv_op("response")
    assert final == {"op": "response", "key": 42, "response": None, "flags": FINAL}
    reply = parent.recv_op("execute_done")
    assert reply == {"op": "execute_done", "id": 1, "error": None}
    closed = "after final: Unable to send response. Response sender has been closed."
    assert ("WARNING", closed) in parent.logs


def test_cancel_reaches_a_model_blocked_in_execute(parent):
    assert parent.init("""
        import time
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                request = requests[0]
                sender = request.get_response_sender()
                deadline = time.monotonic() + 5
                while not request.is_cancelled() and time.monotonic() < deadline:
                    time.sleep(0.002)
                code = pb_utils.TritonError.INTERNAL
                if sender.is_cancelled():
                    code = pb_utils.TritonError.CANCELLED
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("stopped", code)),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """, decoupled=True)["error"] is None
    parent.execute([{"inputs": [], "key": 7}])
    parent.send({"op": "cancel", "key": 7})
    message = parent.recv_op("response")
    assert message["key"] == 7 and message["flags"] == FINAL
    assert message["response"]["error"] == {"message": "stopped", "code": "CANCELLED"}
    assert parent.recv_op("execute_done")["error"] is None


BLS = """
    import json
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            x = pb_utils.get_input_tensor_by_name(requests[0], "X")
            bls = pb_utils.InferenceRequest(
                model_name="other", requested_output_names=["Y"], inputs=[x], request_id="bls-1",
                model_version=2, timeout=1000, parameters={"p": True})
            result = bls.exec()
            if result.has_error():
                raise pb_utils.TritonModelException("BLS failed: " + result.error().message())
            y = pb_utils.get_output_tensor_by_name(result, "Y").as_numpy()
            score = json.loads(result.parameters()).get("score")
            return [pb_utils.InferenceResponse([pb_utils.Tensor("Z", y * 10)],
                                               parameters={"score": str(score)})]
"""


def test_bls_exec_round_trip(parent):
    assert parent.init(BLS)["error"] is None
    x = np.array([1, 2, 3], dtype=np.int32)
    parent.execute([{"inputs": [("X", x)]}])
    call = parent.recv_op("bls_request")
    request = call["request"]
    assert call["decoupled"] is False
    assert {k: request[k] for k in ("model_name", "model_version", "timeout_us", "request_id",
                                    "requested_output_names", "parameters")} == {
        "model_name": "other", "model_version": 2, "timeout_us": 1000, "request_id": "bls-1",
        "requested_output_names": ["Y"], "parameters": {"p": True}}
    np.testing.assert_array_equal(parent.read_tensor(call["segment"], request["inputs"][0]), x)
    release_stub_segment(parent, call)
    segment, refs = parent.write_segment([("Y", x + 1)])
    parent.send({"op": "bls_response", "id": call["id"], "final": True, "segment": segment,
                 "response": {"outputs": refs, "error": None, "parameters": {"score": 0.5}}})
    reply = parent.recv_op("execute_done")
    np.testing.assert_array_equal(parent.outputs(reply["responses"][0], reply["segment"])["Z"], (x + 1) * 10)
    assert reply["responses"][0]["parameters"] == {"score": "0.5"}
    parent.wait_released(segment)

    parent.execute([{"inputs": [("X", x)]}], execute_id=2)
    call = parent.recv_op("bls_request")
    parent.send({"op": "bls_response", "id": call["id"], "final": True,
                 "response": {"outputs": [], "error": {"message": "no model 'other'", "code": "NOT_FOUND"}}})
    reply = parent.recv_op("execute_done")
    assert "BLS failed: no model 'other'" in reply["error"]["message"]


def test_async_and_decoupled_bls(parent):
    assert parent.init("""
        import asyncio
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            async def execute(self, requests):
                x = pb_utils.get_input_tensor_by_name(requests[0], "X")

                def call(name):
                    return pb_utils.InferenceRequest(
                        model_name=name, requested_output_names=["Y"], inputs=[x])

                a, b = await asyncio.gather(call("a").async_exec(), call("b").async_exec())
                values = [int(pb_utils.get_output_tensor_by_name(r, "Y").as_numpy()[0]) for r in (a, b)]
                counts = [len(r.output_tensors()) for r in call("s").exec(decoupled=True)]
                return [pb_utils.InferenceResponse([
                    pb_utils.Tensor("AB", np.array(values, dtype=np.int64)),
                    pb_utils.Tensor("COUNTS", np.array(counts, dtype=np.int64))])]
    """)["error"] is None
    parent.execute([{"inputs": [("X", np.array([5], np.int64))]}])
    calls = {}
    for _ in range(2):
        call = parent.recv_op("bls_request")
        calls[call["request"]["model_name"]] = call
    for name, value in (("b", 200), ("a", 100)):  # answered out of order on purpose
        segment, refs = parent.write_segment([("Y", np.array([value], np.int64))])
        parent.send({"op": "bls_response", "id": calls[name]["id"], "final": True, "segment": segment,
                     "response": {"outputs": refs, "error": None, "parameters": {}}})
    stream = parent.recv_op("bls_request")
    assert stream["decoupled"] is True and stream["request"]["model_name"] == "s"
    for _ in range(2):
        segment, refs = parent.write_segment([("Y", np.array([1], np.int64))])
        parent.send({"op": "bls_response", "id": stream["id"], "final": False, "segment": segment,
                     "response": {"outputs": refs, "error": None, "parameters": {}}})
    parent.send({"op": "bls_response", "id": stream["id"], "final": True, "response": None})
    reply = parent.recv_op("execute_done")
    out = parent.outputs(reply["responses"][0], reply["segment"])
    assert out["AB"].tolist() == [100, 200]
    assert out["COUNTS"].tolist() == [1, 1, 0]  # the final, empty response is yielded as in Triton


AUTO_COMPLETE = """
    class TritonPythonModel:
        @staticmethod
        def auto_complete_config(config):
            config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [4]})
            config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [4]})
            config.set_max_batch_size(8)
            config.set_dynamic_batching()
            config.set_model_transaction_policy({"decoupled": False})
            return config
"""


def auto_complete(parent, config):
    parent.send({"op": "auto_complete", "protocol_version": PROTOCOL_VERSION, "shm_prefix": parent.prefix,
                 "model_file": parent.write_model(AUTO_COMPLETE), "config": config})
    done = parent.recv_op("auto_complete_done")
    assert parent.proc.wait(timeout=10) == 0
    return done


def test_auto_complete_fills_config_and_exits(parent):
    done = auto_complete(parent, {"name": "m", "input": [{"name": "X", "data_type": "TYPE_FP32"}]})
    assert done["error"] is None
    assert done["config"] == {
        "name": "m", "max_batch_size": 8, "dynamic_batching": {},
        "model_transaction_policy": {"decoupled": False},
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4]}]}


def test_auto_complete_conflict_is_an_error(parent):
    done = auto_complete(parent, {"name": "m", "max_batch_size": 4})
    assert "max_batch_size 4" in done["error"]["message"] and "'m'" in done["error"]["message"]
    assert done["config"] == {"name": "m", "max_batch_size": 4}


def test_stub_segments_are_reused_after_release(parent):
    assert parent.init(SIMPLE)["error"] is None
    x = np.arange(100, dtype=np.float32)
    parent.execute([{"inputs": [("X", x)]}], execute_id=1)
    first = parent.recv_op("execute_done")
    release_stub_segment(parent, first)
    parent.execute([{"inputs": [("X", np.arange(100000, dtype=np.float32))]}], execute_id=2)
    second = parent.recv_op("execute_done")
    assert first["segment"] == second["segment"] == "s0"
    np.testing.assert_array_equal(parent.outputs(second["responses"][0], "s0")["Y"], np.arange(100000) + 1.0)
    parent.execute([{"inputs": [("X", x)]}], execute_id=3)
    assert parent.recv_op("execute_done")["segment"] == "s1"  # s0 was not released this time


def test_parent_segment_is_released_only_when_arrays_are_garbage(parent):
    assert parent.init(SIMPLE)["error"] is None
    x = np.ones(8, np.float32)
    assert parent.execute([{"inputs": [("X", x)], "parameters": {"keep": True}}], execute_id=1) == "p0"
    parent.recv_op("execute_done")
    assert parent.execute([{"inputs": [("X", x)], "parameters": {"keep": True}}], execute_id=2) == "p1"
    parent.recv_op("execute_done")
    parent.wait_released("p0")  # the model dropped its first array during the second execute
    assert "p1" not in parent.released
    assert parent.execute([{"inputs": [("X", x)]}], execute_id=3) == "p0"
    parent.recv_op("execute_done")
    parent.wait_released("p1")
    parent.wait_released("p0", times=2)


def test_stub_exits_and_unlinks_segments_on_eof(parent):
    assert parent.init(SIMPLE)["error"] is None
    parent.execute([{"inputs": [("X", np.ones(4, np.int8))]}])
    assert parent.recv_op("execute_done")["segment"] == "s0"
    assert parent.stub_files() == ["shm-s0"]
    assert parent.close() == 0
    assert parent.stub_files() == []


def test_sys_exit_in_execute_ends_the_stub(parent):
    assert parent.init("""
        import sys

        class TritonPythonModel:
            def execute(self, requests):
                sys.exit(3)
    """)["error"] is None
    parent.execute([{"inputs": []}])
    assert parent.proc.wait(timeout=10) == 3


def test_undecodable_execute_fails_the_batch_and_frees_the_segment(parent):
    assert parent.init(SIMPLE)["error"] is None
    segment, refs = parent.write_segment([("X", np.ones(4, np.float32))])
    refs[0]["datatype"] = "FP8"
    parent.send({"op": "execute", "id": 5, "segment": segment, "requests": [
        {"request_id": "", "correlation_id": 0, "flags": 0, "parameters": {}, "inputs": refs,
         "requested_output_names": [], "key": 1}]})
    reply = parent.recv_op("execute_done")
    assert reply["id"] == 5 and reply.get("responses", []) == []
    assert ("invalid execute message from the server: tensor 'X' has unknown datatype 'FP8'"
            in reply["error"]["message"])
    parent.wait_released(segment)


def test_default_mode_model_may_answer_through_its_response_sender(parent):
    assert parent.init("""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                for request in requests:
                    x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                    request.get_response_sender().send(
                        pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 3)]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return None
    """)["error"] is None
    parent.execute([{"inputs": [("X", np.array([1, 2], np.int16))]},
                    {"inputs": [("X", np.array([5], np.int16))]}])
    reply = parent.recv_op("execute_done")
    assert reply["error"] is None
    assert [parent.outputs(r, reply["segment"])["Y"].tolist() for r in reply["responses"]] == [[3, 6], [15]]


def test_empty_inputs_are_empty_arrays_and_pass_through(parent):
    """Tensors without data (a zero in the shape) travel without a segment and reach the model
    as empty arrays of their shape and dtype, numeric and BYTES alike; a tensor the model sends
    on untouched is copied from the server's segment directly."""
    assert parent.init("""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for request in requests:
                    tensors = request.inputs()
                    a = tensors[0].as_numpy()
                    pb_utils.Logger.log_info("{} {} {}".format(a.shape, a.dtype, tensors[1].as_numpy().shape))
                    out.append(pb_utils.InferenceResponse(
                        [pb_utils.Tensor("A", a), pb_utils.Tensor("B", tensors[1].as_numpy()), tensors[2]]))
                return out
    """)["error"] is None
    segment = parent.execute([{"inputs": [("A", np.zeros((2, 0), np.float32)),
                                          ("B", np.array([], dtype=object)),
                                          ("C", np.arange(3, dtype=np.int16))]}])
    reply = parent.recv_op("execute_done")
    assert reply["error"] is None, reply
    response = reply["responses"][0]
    a, b, c = response["outputs"]
    assert (a["datatype"], a["shape"], a["nbytes"]) == ("FP32", [2, 0], 0)
    assert (b["datatype"], b["shape"], b["nbytes"]) == ("BYTES", [0], 0)
    assert (c["name"], c["datatype"], c["shape"]) == ("C", "INT16", [3])
    np.testing.assert_array_equal(parent.outputs(response, reply["segment"])["C"], np.arange(3))
    assert ("INFO", "(2, 0) float32 (0,)") in parent.logs
    parent.wait_released(segment)


def test_a_core_from_another_build_is_refused_naming_it(parent):
    """The server says which protocol revision it speaks; a compiled core of another revision
    fails initialize with an error naming the module file and both versions."""
    parent.send({"op": "init", "protocol_version": PROTOCOL_VERSION + 1000, "shm_prefix": parent.prefix,
                 "model_file": parent.write_model(SIMPLE), "decoupled": False, "args": {
                     "model_config": "{}", "model_instance_kind": "CPU", "model_instance_name": "m_0",
                     "model_instance_device_id": "0", "model_repository": "", "model_version": "1",
                     "model_name": "m"}})
    error = parent.recv_op("init_done")["error"]["message"]
    assert "nereid_stub_core" in error and ".so" in error, error
    assert "speaks stub protocol version {}".format(PROTOCOL_VERSION) in error, error
    assert "the server {}".format(PROTOCOL_VERSION + 1000) in error, error


def test_a_default_mode_sender_sends_one_response_with_tritons_checks(parent):
    """In default mode the sender's one response becomes the request's answer; what Triton
    refuses is refused with its words."""
    assert parent.init("""
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                for request in requests:
                    sender = request.get_response_sender()
                    assert sender is request.get_response_sender()
                    for call in (lambda: sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL),
                                 lambda: sender.send(pb_utils.InferenceResponse(), flags=7),
                                 lambda: sender.send(),
                                 lambda: sender.send("not a response")):
                        try:
                            call()
                        except pb_utils.TritonModelException as e:
                            pb_utils.Logger.log_warn(e.message())
                    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array([3], np.int32))]))
                    try:
                        sender.send(pb_utils.InferenceResponse())
                    except pb_utils.TritonModelException as e:
                        pb_utils.Logger.log_warn(e.message())
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    pb_utils.Logger.log_info("cancelled: {}".format(sender.is_cancelled()))
                return None
    """)["error"] is None
    parent.execute([{"inputs": [("X", np.ones(1, np.int32))]}])
    reply = parent.recv_op("execute_done")
    assert reply["error"] is None, reply
    assert parent.outputs(reply["responses"][0], reply["segment"])["Y"].tolist() == [3]
    warnings = [text for level, text in parent.logs if level == "WARNING"]
    assert warnings == [
        "Unable to send response. Non-decoupled model cannot send complete final before sending a response.",
        "Unable to send response. Unsupported flag provided.",
        "Inference Response object must be provided when the response flags is set to zero.",
        "send() expects a pb_utils.InferenceResponse, got str",
        "Unable to send response. Non-decoupled model cannot send more than one response.",
    ], parent.logs
    assert ("INFO", "cancelled: False") in parent.logs
