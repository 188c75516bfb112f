"""OUT = every element of IN reversed (so the test sees the model touched the bytes)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            reversed_ = np.array([bytes(v)[::-1] for v in values], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", reversed_)]))
        return responses
