"""Top-k labels: turns class scores into "name:score" strings (step 3 of `classify_pipeline`).

The class names and k are read from the model config's `parameters` in `initialize`.
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.names = parameters["class_names"]["string_value"].split(",")
        self.top_k = int(parameters["top_k"]["string_value"])

    def execute(self, requests):
        responses = []
        for request in requests:
            scores = pb_utils.get_input_tensor_by_name(request, "scores").as_numpy()
            # Highest score first; ties keep the class order.
            order = np.argsort(-scores, axis=1, kind="stable")[:, : self.top_k]
            labels = np.array(
                [
                    [f"{self.names[c]}:{row[c]:.4f}".encode() for c in classes]
                    for row, classes in zip(scores, order)
                ],
                dtype=np.object_,
            )
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("labels", labels)]))
        return responses
