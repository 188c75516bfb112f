"""Whitespace tokenizer with a small fixed vocabulary (the `tokenizer` step of `nlp_pipeline`).

Lower-cases the text, keeps letters, digits and apostrophes, splits on everything else and maps
each word to its id in VOCABULARY (1 for unknown words). Ids are padded with 0 or cut to
MAX_TOKENS. Runs unchanged on Triton's Python backend and on Nereid's.
"""

import json
import re

import numpy as np
import triton_python_backend_utils as pb_utils

MAX_TOKENS = 128

# id 0 is padding, id 1 is "unknown"; words start at 2.
WORDS = [
    "the", "a", "is", "was", "and", "but", "not", "very", "really", "movie", "film", "food",
    "service", "good", "great", "excellent", "love", "loved", "wonderful", "happy", "best",
    "bad", "terrible", "awful", "hate", "hated", "boring", "worst", "sad", "poor", "okay",
    "fine", "average", "it", "this", "i",
]
VOCABULARY = {word: index + 2 for index, word in enumerate(WORDS)}
WORD = re.compile(r"[a-z0-9']+")


def tokenize(text):
    """Token ids of one string, padded/cut to MAX_TOKENS."""
    ids = [VOCABULARY.get(w, 1) for w in WORD.findall(text.lower())][:MAX_TOKENS]
    return ids + [0] * (MAX_TOKENS - len(ids))


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        output = pb_utils.get_output_config_by_name(config, "token_ids")
        self.output_dtype = pb_utils.triton_string_to_numpy(output["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            texts = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()
            rows = [tokenize(t.decode("utf-8", errors="replace")) for t in texts.reshape(-1)]
            ids = np.array(rows, dtype=self.output_dtype).reshape(len(rows), MAX_TOKENS)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("token_ids", ids)]))
        return responses
