"""The pipeline examples of docs/examples/pipelines, end to end through tritonclient.

One server on the example repository (`make examples`: the ONNX examples plus the pipelines):
- `nlp_pipeline` (ensemble: Python tokenizer -> ONNX text_classifier) gives the same logits as
  running the two steps by hand (tokenize in this process, onnxruntime on the ONNX file);
- `classify_pipeline` (Python preprocess -> ONNX mlp -> Python postprocess) gives the top-2
  labels computed by hand;
- `sentiment_bls` (Python BLS calling tokenizer and text_classifier) agrees with both;
- `repeat_int32` (decoupled Python) streams n responses over gRPC streaming and over SSE.
"""

import json
import queue
import sys
import types

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from nereid_util import ROOT, gen_models, http_raw, managed_server, ort_run

sys.path.insert(0, str(ROOT / "scripts"))
import gen_pipeline_examples  # noqa: E402

TEXTS = [
    "I loved this movie, it was great",
    "the food was terrible and the service awful",
    "it is a film",
    "Not bad at all... really GOOD",
]
RAW = np.array(
    [[5.1, 3.5, 1.4, 0.2], [6.7, 3.0, 5.2, 2.3], [5.9, 3.0, 4.2, 1.5]], dtype=np.float32
)


@pytest.fixture(scope="module")
def example_repo(tmp_path_factory):
    repo = gen_models.write_repository(tmp_path_factory.mktemp("examples"), "example")
    gen_pipeline_examples.install(repo)
    return repo


@pytest.fixture(scope="module")
def pipeline_server(example_repo, tmp_path_factory):
    yield from managed_server(example_repo, tmp_path_factory.mktemp("logs"), [], "server_pipelines")


def tokenizer_module():
    """The tokenizer's model.py, imported here to tokenize by hand."""
    sys.modules.setdefault("triton_python_backend_utils", types.ModuleType("pb_utils_placeholder"))
    namespace = {}
    path = gen_pipeline_examples.SOURCES / "tokenizer" / "1" / "model.py"
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    return namespace


def logits_by_hand(repo, texts):
    tokenize = tokenizer_module()["tokenize"]
    ids = np.array([tokenize(t) for t in texts], dtype=np.int64)
    return ids, ort_run(repo / "text_classifier" / "1" / "model.onnx", {"token_ids": ids})["logits"]


def text_batch(texts):
    return np.array([[t.encode()] for t in texts], dtype=np.object_)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_nlp_pipeline_matches_steps_run_by_hand(pipeline_server, example_repo, protocol):
    client_mod = httpclient if protocol == "http" else grpcclient
    url = pipeline_server.http_url if protocol == "http" else pipeline_server.grpc_url
    client = client_mod.InferenceServerClient(url)
    batch = text_batch(TEXTS)
    inp = client_mod.InferInput("raw_text", list(batch.shape), "BYTES")
    inp.set_data_from_numpy(batch)
    result = client.infer("nlp_pipeline", [inp])
    _, expected = logits_by_hand(example_repo, TEXTS)
    np.testing.assert_allclose(result.as_numpy("sentiment"), expected, rtol=1e-5, atol=1e-6)
    # The example is meant to make sense: positive text -> positive logit wins, and so on.
    assert list(np.argmax(expected, axis=1)[:3]) == [2, 0, 1]


def test_classify_pipeline_top2_labels(pipeline_server):
    client = httpclient.InferenceServerClient(pipeline_server.http_url)
    inp = httpclient.InferInput("raw", list(RAW.shape), "FP32")
    inp.set_data_from_numpy(RAW)
    labels = client.infer("classify_pipeline", [inp]).as_numpy("labels")
    assert labels.shape == (3, 2)
    preprocess = (RAW - np.array([5.8, 3.0, 3.8, 1.2], np.float32)) / np.array(
        [0.8, 0.4, 1.8, 0.8], np.float32)
    scores = np.maximum(preprocess @ gen_models.MLP_W + gen_models.MLP_B, 0).astype(np.float32)
    names = ["setosa", "versicolor", "virginica"]
    for row, got in zip(scores, labels):
        order = np.argsort(-row, kind="stable")[:2]
        want = [f"{names[c]}:{row[c]:.4f}" for c in order]
        assert [g.decode() for g in got] == want


def test_bls_model_combines_two_models(pipeline_server, example_repo):
    client = grpcclient.InferenceServerClient(pipeline_server.grpc_url)
    ids, expected = logits_by_hand(example_repo, TEXTS)
    for i, text in enumerate(TEXTS):
        inp = grpcclient.InferInput("text", [1], "BYTES")
        inp.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
        r = client.infer("sentiment_bls", [inp])
        np.testing.assert_allclose(r.as_numpy("logits"), expected[i], rtol=1e-5, atol=1e-6)
        label = ["negative", "neutral", "positive"][int(np.argmax(expected[i]))]
        assert r.as_numpy("label")[0].decode() == label
        assert int(r.as_numpy("known_words")[0]) == int((ids[i] > 1).sum())


def test_decoupled_model_streams_over_grpc(pipeline_server):
    client = grpcclient.InferenceServerClient(pipeline_server.grpc_url)
    results = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for n in (4, 2):
            inp = grpcclient.InferInput("IN", [1], "INT32")
            inp.set_data_from_numpy(np.array([n], dtype=np.int32))
            client.async_stream_infer("repeat_int32", [inp], request_id=f"r{n}")
        got = {}
        for _ in range(6):
            result, error = results.get(timeout=30)
            assert error is None, error
            rid = result.get_response().id
            got.setdefault(rid, []).append(int(result.as_numpy("OUT")[0]))
        assert got == {"r4": [0, 1, 2, 3], "r2": [0, 1]}
    finally:
        client.stop_stream()


def test_decoupled_model_streams_over_sse(pipeline_server):
    status, headers, body = http_raw(
        pipeline_server.http_url, "POST", "/v2/models/repeat_int32/generate_stream",
        body=json.dumps({"IN": 3}).encode(), headers={"Content-Type": "application/json"})
    assert status == 200, body
    events = [json.loads(line[len(b"data: "):]) for line in body.split(b"\n\n") if line.startswith(b"data: ")]
    assert [e["OUT"] for e in events] == [0, 1, 2]


def test_decoupled_model_refused_on_plain_infer(pipeline_server):
    client = httpclient.InferenceServerClient(pipeline_server.http_url)
    inp = httpclient.InferInput("IN", [1], "INT32")
    inp.set_data_from_numpy(np.array([1], dtype=np.int32))
    with pytest.raises(Exception, match="decoupled"):
        client.infer("repeat_int32", [inp])
