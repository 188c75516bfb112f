"""Echoes INPUT0, except: a negative value makes `execute` raise; a zero makes that one
request's response an INVALID_ARG error."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if (x < 0).any():
                raise ValueError("negative input is not allowed")
            if (x == 0).any():
                error = pb_utils.TritonError("zero is not a valid input", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
