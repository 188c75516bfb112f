"""A decoupled model: streams n responses for one request whose input IN is [n].

Each response carries OUT = [i]; the last `send` carries the final flag, so clients see the
request end right after its last response. A negative n is answered with one error response.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().reshape(-1)[0])
            if n < 0:
                error = pb_utils.TritonError(f"IN must be zero or more, got {n}")
                sender.send(
                    pb_utils.InferenceResponse(error=error),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                )
                continue
            for i in range(n):
                out = pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == n - 1 else 0
                sender.send(pb_utils.InferenceResponse([out]), flags=flags)
            if n == 0:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
