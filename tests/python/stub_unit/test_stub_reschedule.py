"""The real nereid_stub.py reporting request rescheduling to a pure-Python parent: a request
whose release flags say RESCHEDULE when `execute` returns is listed in `execute_done`'s
`rescheduled` (decoupled: its sender stays open; default mode: no response for it), a response
returned for it fails the call with Triton's error, and an `execute` that raises reschedules
nothing."""

import numpy as np

FINAL = 1

# Reschedules the requests whose input R is 1; decoupled, it sends one response per request
# first, and answers a request whose R is 2 from a thread after `execute` returned.
DECOUPLED = """
    import threading
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            for request in requests:
                r = int(pb_utils.get_input_tensor_by_name(request, "R").as_numpy()[0])
                sender = request.get_response_sender()
                out = pb_utils.InferenceResponse([pb_utils.Tensor("O", np.array([r], np.int32))])
                if r == 1:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                    sender.send(out)
                elif r == 2:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                    self.later = threading.Thread(target=sender.send, args=(out,))
                else:
                    sender.send(out, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            if hasattr(self, "later"):
                self.later.start()
            return None
"""

DEFAULT = """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for request in requests:
                r = int(pb_utils.get_input_tensor_by_name(request, "R").as_numpy()[0])
                response = pb_utils.InferenceResponse([pb_utils.Tensor("O", np.array([r], np.int32))])
                if r >= 1:
                    request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                if r == 9:
                    raise ValueError("no")
                out.append(None if r == 1 else response)
            return out
"""


def requests(*values, key=10):
    return [{"inputs": [("R", np.array([v], np.int32))], "key": key + i}
            for i, v in enumerate(values)]


def test_a_decoupled_model_reschedules_with_its_sender_open(parent):
    assert parent.init(DECOUPLED, decoupled=True)["error"] is None
    parent.execute(requests(0, 1, 2))
    sent = [parent.recv_op("response") for _ in range(2)]
    assert [(m["key"], m["flags"]) for m in sent] == [(10, FINAL), (11, 0)]
    # The sender of a rescheduled request still sends (from the model's thread, before or
    # after the answer).
    late, done = None, None
    while late is None or done is None:
        message = parent.recv()
        if message["op"] == "response":
            late = message
        elif message["op"] == "execute_done":
            done = message
    # Counted: the responses written before the answer (the thread's may be one of them).
    sent = done.pop("responses_sent")
    assert done == {"op": "execute_done", "id": 1, "error": None, "rescheduled": [1, 2]}
    assert sent in (2, 3), sent
    assert (late["key"], late["flags"]) == (12, 0)
    assert parent.outputs(late["response"], late["segment"])["O"].tolist() == [2]


def test_a_default_mode_model_returns_none_for_a_rescheduled_request(parent):
    assert parent.init(DEFAULT)["error"] is None
    parent.execute(requests(0, 1))
    reply = parent.recv_op("execute_done")
    assert reply["error"] is None and reply["rescheduled"] == [1]
    assert reply["responses"][1] == {"outputs": [], "error": None, "parameters": {}}
    assert parent.outputs(reply["responses"][0], reply["segment"])["O"].tolist() == [0]


def test_a_response_for_a_rescheduled_request_fails_the_call(parent):
    assert parent.init(DEFAULT)["error"] is None
    parent.execute(requests(2))
    reply = parent.recv_op("execute_done")
    assert "rescheduled" not in reply
    assert reply["error"]["message"] == (
        "Failed to process the request(s) for model 'm_0', message: Expected a None "
        "object in the execute function return list for reschduled request, found type "
        "'<class 'triton_python_backend_utils.InferenceResponse'>'.")


def test_an_execute_that_raises_reschedules_nothing(parent):
    assert parent.init(DEFAULT)["error"] is None
    parent.execute(requests(9))
    reply = parent.recv_op("execute_done")
    assert "rescheduled" not in reply and "ValueError: no" in reply["error"]["message"]
