"""Echoes INPUT0 and reports the stub's pid, unless INPUT0 is 1 (the process exits with
status 3) or 2 (the process kills itself with SIGKILL). `finalize` leaves a marker file."""

import os
import signal

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.marker = os.path.join(args["model_repository"], "finalized")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x[0] == 1:
                os._exit(3)
            if x[0] == 2:
                os.kill(os.getpid(), signal.SIGKILL)
            pid = pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x), pid]))
        return responses

    def finalize(self):
        with open(self.marker, "w") as f:
            f.write("done")
