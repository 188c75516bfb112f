"""BLS: OUTPUT0 = 2 * add_one(INPUT0), calling the model `add_one` through the server. A
negative input calls a model that does not exist, and the error reaches the client."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            target = "missing_model" if (x < 0).any() else "add_one"
            call = pb_utils.InferenceRequest(
                model_name=target,
                requested_output_names=["OUTPUT0"],
                inputs=[pb_utils.Tensor("INPUT0", x)],
            )
            response = call.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            y = pb_utils.get_output_tensor_by_name(response, "OUTPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (2 * y).astype(np.float32))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
