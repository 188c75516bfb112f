"""BLS to a decoupled model: calls `decoupled` with `exec(decoupled=True)` and returns the sum
and the number of the responses it streamed back."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="decoupled",
                requested_output_names=["OUT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
            )
            total, count = 0, 0
            for response in call.exec(decoupled=True):
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
                out = pb_utils.get_output_tensor_by_name(response, "OUT")
                if out is not None:
                    total += int(out.as_numpy()[0])
                    count += 1
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SUM", np.array([total], dtype=np.int32)),
                pb_utils.Tensor("COUNT", np.array([count], dtype=np.int32)),
            ]))
        return responses
