"""OUTPUT0 = INPUT0 + 1. `initialize` checks the arguments a Triton model receives."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        assert config["name"] == "add_one", config["name"]
        assert config["input"][0]["name"] == "INPUT0", config["input"]
        assert config["input"][0]["data_type"] == "TYPE_FP32", config["input"]
        assert args["model_name"] == "add_one", args
        assert args["model_version"] == "1", args
        assert args["model_instance_kind"] == "CPU", args
        assert args["model_repository"].endswith("add_one"), args

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            out = pb_utils.Tensor("OUTPUT0", (x + 1).astype(np.float32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
