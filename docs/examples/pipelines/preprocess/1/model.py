"""Standardizes raw measurements: (raw - MEAN) / STD, per column (step 1 of `classify_pipeline`)."""

import numpy as np
import triton_python_backend_utils as pb_utils

MEAN = np.array([5.8, 3.0, 3.8, 1.2], dtype=np.float32)
STD = np.array([0.8, 0.4, 1.8, 0.8], dtype=np.float32)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "raw").as_numpy()
            features = ((raw - MEAN) / STD).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("features", features)]))
        return responses
