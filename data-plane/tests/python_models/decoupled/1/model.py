"""Decoupled: for IN = n, sends `count` responses (request parameter, default 3) with OUT =
n * 1, n * 2, ..., then the final flag."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            count = int(json.loads(request.parameters()).get("count", 3))
            sender = request.get_response_sender()
            for i in range(1, count + 1):
                out = pb_utils.Tensor("OUT", np.array([n * i], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
