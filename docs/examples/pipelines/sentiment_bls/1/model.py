"""Business-logic scripting (BLS): one request calls two other models of the same server.

text -> `tokenizer` (token ids) -> `text_classifier` (logits); the answer combines both: the
label with the highest logit, the logits, and how many words the tokenizer knew (ids > 1).
A failing call surfaces as that request's error.
"""

import numpy as np
import triton_python_backend_utils as pb_utils

LABELS = ["negative", "neutral", "positive"]


def call(model_name, inputs, outputs):
    """Runs one BLS request and returns its output tensors by name, or raises."""
    request = pb_utils.InferenceRequest(
        model_name=model_name, inputs=inputs, requested_output_names=outputs
    )
    response = request.exec()
    if response.has_error():
        raise pb_utils.TritonModelException(
            f"{model_name}: {response.error().message()}"
        )
    return {name: pb_utils.get_output_tensor_by_name(response, name) for name in outputs}


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                text = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()
                # Both composing models batch: add the batch dimension.
                batch = text.reshape(1, 1)
                ids = call("tokenizer", [pb_utils.Tensor("text", batch)], ["token_ids"])
                token_ids = ids["token_ids"].as_numpy()
                scores = call(
                    "text_classifier", [pb_utils.Tensor("token_ids", token_ids)], ["logits"]
                )
                logits = scores["logits"].as_numpy().reshape(3).astype(np.float32)
                label = np.array([LABELS[int(np.argmax(logits))].encode()], dtype=np.object_)
                known = np.array([int((token_ids > 1).sum())], dtype=np.int64)
                responses.append(
                    pb_utils.InferenceResponse(
                        [
                            pb_utils.Tensor("label", label),
                            pb_utils.Tensor("logits", logits),
                            pb_utils.Tensor("known_words", known),
                        ]
                    )
                )
            except pb_utils.TritonModelException as e:
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
                )
        return responses
