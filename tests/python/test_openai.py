"""The OpenAI-compatible routes under /v1/, driven by the official `openai` client (sync, async,
streaming) and by raw HTTP for the server-sent events' framing.

The models are written here, at test time, with no weights: `tiny_llm` is a decoupled Python
model with the vLLM backend's inputs and outputs over a whitespace tokenizer (the prompt's words
are its tokens). It "generates" by repeating the prompt's tokens in order, so every answer is
known in advance: max_tokens and stop are honoured, one response per token when streaming,
`num_*_tokens` and `finish_reason` returned when asked. A prompt holding the word `slow` waits
50 ms per token; `explode` makes it answer an error. On `is_cancelled()` it stops and writes
`cancel_report` beside itself. `tiny_chat` is the same model with a chat template in its
tokenizer_config.json; `tiny_embed` maps text to a 4-float vector; `plain` is neither.
"""

import asyncio
import base64
import http.client
import json
import struct
import textwrap
import threading

import openai
import pytest

from nereid_util import http_raw, managed_server, wait_until

LLM = textwrap.dedent("""
    import json
    import os
    import time
    import numpy as np
    import triton_python_backend_utils as pb_utils

    def scalar(request, name, default):
        t = pb_utils.get_input_tensor_by_name(request, name)
        if t is None:
            return default
        v = t.as_numpy().flatten()[0]
        return v.decode() if isinstance(v, bytes) else v

    class TritonPythonModel:
        def initialize(self, args):
            self.dir = os.path.join(args["model_repository"])
            self.batched = json.loads(args["model_config"]).get("max_batch_size", 0) > 0

        def tensor(self, name, value, dtype):
            a = np.array([value], dtype=dtype)
            return pb_utils.Tensor(name, a.reshape(1, 1) if self.batched else a)

        def execute(self, requests):
            for r in requests:
                self.generate(r)
            return None

        def generate(self, r):
            sender = r.get_response_sender()
            prompt = scalar(r, "text_input", "")
            stream = bool(scalar(r, "stream", False))
            params = json.loads(scalar(r, "sampling_parameters", "") or "{}")
            max_tokens = int(params.get("max_tokens", 16))
            stop = params.get("stop", [])
            stop = [stop] if isinstance(stop, str) else stop
            words = prompt.split()  # the tokenizer
            if "explode" in words:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("exploded")),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return

            def respond(text, tokens, reason=None, flags=0):
                out = [self.tensor("text_output", text.encode(), np.object_)]
                if scalar(r, "return_num_input_tokens", False):
                    out.append(self.tensor("num_input_tokens", len(words), np.uint32))
                if scalar(r, "return_num_output_tokens", False):
                    out.append(self.tensor("num_output_tokens", tokens, np.uint32))
                if scalar(r, "return_finish_reason", False):
                    # As the vLLM backend: "None" until the generation ends.
                    out.append(self.tensor("finish_reason", (reason or "None").encode(),
                                           np.object_))
                sender.send(pb_utils.InferenceResponse(out), flags=flags)

            out, count, reason = "", 0, "length"
            for i in range(max_tokens):
                if r.is_cancelled():
                    with open(os.path.join(self.dir, "cancel_report"), "w") as f:
                        f.write("cancelled after %d" % count)
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                    return
                token = words[i % len(words)] if words else "empty"
                piece = token if i == 0 else " " + token
                hit = [s for s in stop if s in out + piece]
                if hit:
                    piece = (out + piece)[:(out + piece).index(hit[0])][len(out):]
                    reason = "stop"
                if piece:
                    out, count = out + piece, count + 1
                    if stream:
                        respond(piece, 1)
                if hit:
                    break
                if "slow" in words:
                    time.sleep(0.05)
            if stream:
                respond("", 0, reason, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                respond(out, count, reason, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """)


def llm_config(name, batched=False):
    dims = "[ 1 ]"
    inputs = [("text_input", "TYPE_STRING", False), ("stream", "TYPE_BOOL", True),
              ("sampling_parameters", "TYPE_STRING", True),
              ("exclude_input_in_output", "TYPE_BOOL", True),
              ("return_num_input_tokens", "TYPE_BOOL", True),
              ("return_num_output_tokens", "TYPE_BOOL", True),
              ("return_finish_reason", "TYPE_BOOL", True)]
    outputs = [("text_output", "TYPE_STRING"), ("num_input_tokens", "TYPE_UINT32"),
               ("num_output_tokens", "TYPE_UINT32"), ("finish_reason", "TYPE_STRING")]
    return "\n".join([
        f'name: "{name}"', 'backend: "python"',
        f"max_batch_size: {1 if batched else 0}",
        "model_transaction_policy { decoupled: true }",
        "input [ " + ", ".join(
            f'{{ name: "{n}" data_type: {t} dims: {dims}{" optional: true" if o else ""} }}'
            for n, t, o in inputs) + " ]",
        "output [ " + ", ".join(
            f'{{ name: "{n}" data_type: {t} dims: {dims} }}' for n, t in outputs) + " ]",
        "instance_group [ { count: 1 kind: KIND_CPU } ]",
        *(["dynamic_batching { default_queue_policy { max_queue_size: 1 } }"] if batched else []),
    ]) + "\n"


EMBED = textwrap.dedent("""
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                text = pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy()[0].decode()
                vec = [len(text), len(text.split()), sum(map(ord, text)) % 97, 0.5]
                out.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("embedding", np.array(vec, dtype=np.float32))]))
            return out
    """)

EMBED_CONFIG = """
name: "tiny_embed"
backend: "python"
max_batch_size: 0
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "embedding" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""

PLAIN = textwrap.dedent("""
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]) for r in requests]
    """)

PLAIN_CONFIG = """
name: "plain"
backend: "python"
max_batch_size: 0
input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""

CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content.strip() }} "
                 "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}")

KEY = "sk-nereid-test"


def write_repo(repo):
    models = {
        "tiny_llm": (LLM, llm_config("tiny_llm")),
        "tiny_chat": (LLM, llm_config("tiny_chat")),
        "tiny_busy": (LLM, llm_config("tiny_busy", batched=True)),
        "tiny_embed": (EMBED, EMBED_CONFIG),
        "plain": (PLAIN, PLAIN_CONFIG),
    }
    for name, (code, config) in models.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(code)
        (repo / name / "config.pbtxt").write_text(config)
    (repo / "tiny_chat" / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": CHAT_TEMPLATE, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}))
    return repo


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = write_repo(tmp_path_factory.mktemp("openai_repo"))
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), [], "server_openai")


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory):
    repo = write_repo(tmp_path_factory.mktemp("openai_keyed_repo"))
    # The key for /v1/, and Triton's `inference` category, which covers /v1/'s inference too.
    args = ["--http-restricted-api", f"openai:authorization=Bearer {KEY}",
            "--http-restricted-api", "inference:x-infer=ok"]
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), args, "server_openai_key")


def client(server, key="unused", headers=None):
    return openai.OpenAI(base_url=f"http://{server.http_url}/v1", api_key=key, max_retries=0,
                         timeout=60, default_headers=headers)


def test_models_lists_generation_and_embedding_models(server):
    c = client(server)
    assert sorted(m.id for m in c.models.list()) == ["tiny_busy", "tiny_chat", "tiny_embed",
                                                     "tiny_llm"]
    assert c.models.retrieve("tiny_llm").id == "tiny_llm"
    for missing in ("nope", "plain"):
        with pytest.raises(openai.NotFoundError):
            c.models.retrieve(missing)


def test_completion_honours_max_tokens_and_counts_usage(server):
    r = client(server).completions.create(model="tiny_llm", prompt="a b c", max_tokens=5)
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert [(ch.index, ch.text, ch.finish_reason) for ch in r.choices] == [(0, "a b c a b",
                                                                            "length")]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (3, 5, 8)


def test_completion_stop_and_several_prompts(server):
    r = client(server).completions.create(model="tiny_llm", prompt=["a b c d", "x y"],
                                          max_tokens=6, stop=["c"], echo=False)
    assert [(ch.index, ch.text, ch.finish_reason) for ch in r.choices] == [
        (0, "a b ", "stop"), (1, "x y x y x y", "length")]
    assert r.usage.prompt_tokens == 6 and r.usage.completion_tokens == 3 + 6


def test_completion_stream_with_usage(server):
    chunks = list(client(server).completions.create(
        model="tiny_llm", prompt="one two", max_tokens=3, stream=True,
        stream_options={"include_usage": True}))
    texts = [ch.choices[0].text for ch in chunks if ch.choices]
    assert texts == ["one", " two", " one", ""]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert len({ch.id for ch in chunks}) == 1
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert (usage.prompt_tokens, usage.completion_tokens, usage.total_tokens) == (2, 3, 5)


def test_chat_default_template_is_chatml(server):
    r = client(server).chat.completions.create(
        model="tiny_llm", messages=[{"role": "user", "content": "hi there"}], max_tokens=4)
    # The prompt's tokens, echoed: the default (ChatML) template's rendering.
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == \
        "<|im_start|>user hi there<|im_end|> <|im_start|>assistant"
    assert r.usage.prompt_tokens == 4
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")


def test_chat_template_from_tokenizer_config(server):
    r = client(server).chat.completions.create(
        model="tiny_chat", max_tokens=6,
        messages=[{"role": "system", "content": " be brief "},
                  {"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert r.choices[0].message.content == "<s>system: be brief user: hi assistant:"
    assert r.choices[0].finish_reason == "length"


def test_chat_stream_async(server):
    async def go():
        c = openai.AsyncOpenAI(base_url=f"http://{server.http_url}/v1", api_key="x",
                               max_retries=0, timeout=60)
        try:
            stream = await c.chat.completions.create(
                model="tiny_chat", messages=[{"role": "user", "content": "a b"}],
                max_tokens=50, stop=["assistant"], stream=True)
            return [ch async for ch in stream]
        finally:
            await c.close()

    chunks = asyncio.run(go())
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].object == "chat.completion.chunk"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert text == "<s>user: a b "
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_async_completion(server):
    async def go():
        c = openai.AsyncOpenAI(base_url=f"http://{server.http_url}/v1", api_key="x",
                               max_retries=0, timeout=60)
        try:
            return await asyncio.gather(*[
                c.completions.create(model="tiny_llm", prompt=f"p{i}", max_tokens=2)
                for i in range(4)])
        finally:
            await c.close()

    assert [r.choices[0].text for r in asyncio.run(go())] == [f"p{i} p{i}" for i in range(4)]


def expected_vector(text):
    return [float(len(text)), float(len(text.split())), float(sum(map(ord, text)) % 97), 0.5]


def test_embeddings(server):
    texts = ["hello world", "x"]
    # The client asks for base64 by default and decodes it.
    r = client(server).embeddings.create(model="tiny_embed", input=texts)
    assert [d.index for d in r.data] == [0, 1]
    assert [d.embedding for d in r.data] == [expected_vector(t) for t in texts]
    assert r.usage.prompt_tokens == 3 and r.model == "tiny_embed"
    floats = client(server).embeddings.create(model="tiny_embed", input="a b c",
                                              encoding_format="float")
    assert floats.data[0].embedding == expected_vector("a b c")
    status, _, body = http_raw(server.http_url, "POST", "/v1/embeddings",
                               {"model": "tiny_embed", "input": "ab",
                                "encoding_format": "base64"},
                               {"Content-Type": "application/json"})
    raw = base64.b64decode(json.loads(body)["data"][0]["embedding"])
    assert status == 200 and list(struct.unpack("<4f", raw)) == expected_vector("ab")


def error_of(exc_info):
    return exc_info.value.body if isinstance(exc_info.value.body, dict) else {}


def test_error_classes(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny_llm", prompt="a", temperature=5)
    assert error_of(e)["param"] == "temperature"
    assert e.value.status_code == 400
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="tiny_llm", messages=[])
    assert error_of(e)["param"] == "messages"
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="no_such_model", prompt="a")
    assert error_of(e)["code"] == "model_not_found"
    with pytest.raises(openai.UnprocessableEntityError):
        c.embeddings.create(model="tiny_llm", input="a")
    with pytest.raises(openai.UnprocessableEntityError):
        c.completions.create(model="plain", prompt="a")
    with pytest.raises(openai.InternalServerError) as e:
        c.completions.create(model="tiny_llm", prompt="explode", max_tokens=2)
    assert "exploded" in str(e.value)
    with pytest.raises(openai.InternalServerError):
        c.completions.create(model="tiny_llm", prompt="explode", max_tokens=2, stream=True)


def test_overloaded_model_is_rate_limited(server):
    """`tiny_busy` runs one request and queues one: a third while both are in is a 429."""
    c = client(server)
    first = c.completions.create(model="tiny_busy", prompt="slow go", max_tokens=2000,
                                 stream=True)
    next(iter(first))  # running
    results = []

    def second_and_third():
        try:
            results.append(c.completions.create(model="tiny_busy", prompt="q", max_tokens=1))
        except openai.APIStatusError as err:
            results.append(err)

    threads = [threading.Thread(target=second_and_third) for _ in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: any(isinstance(r, openai.RateLimitError) for r in results), 30,
               "a 429 for a request beyond the queue")
    first.close()  # cancels the first; the queued one runs
    for t in threads:
        t.join(60)
    assert sorted(type(r).__name__ for r in results) == ["Completion", "RateLimitError"], results


def test_api_key_required_and_accepted(keyed_server):
    with pytest.raises(openai.AuthenticationError) as e:
        client(keyed_server, "wrong").models.list()
    assert error_of(e)["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        client(keyed_server, "wrong").completions.create(model="tiny_llm", prompt="a")
    assert "tiny_llm" in [m.id for m in client(keyed_server, KEY).models.list()]
    # The right key, but not the `inference` category's header: 403.
    with pytest.raises(openai.PermissionDeniedError) as e:
        client(keyed_server, KEY).completions.create(model="tiny_llm", prompt="a")
    assert "x-infer" in error_of(e)["message"]
    r = client(keyed_server, KEY, {"x-infer": "ok"}).completions.create(
        model="tiny_llm", prompt="a", max_tokens=1)
    assert r.choices[0].text == "a"
    # The KServe routes are not in the category.
    assert http_raw(keyed_server.http_url, "GET", "/v2/models/tiny_llm")[0] == 200


def sse_request(server, body):
    host, port = server.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    return conn, conn.getresponse()


def test_sse_framing_raw(server):
    conn, resp = sse_request(server, {"model": "tiny_llm", "prompt": "u v", "max_tokens": 2,
                                      "stream": True, "stream_options": {"include_usage": True}})
    try:
        assert resp.status == 200
        assert resp.getheader("Content-Type").startswith("text/event-stream")
        raw = resp.read().decode()
    finally:
        conn.close()
    assert raw.endswith("data: [DONE]\n\n"), raw
    events = raw[:-2].split("\n\n")
    assert all(e.startswith("data: ") for e in events), events
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert [ch["choices"][0]["text"] for ch in chunks[:-1]] == ["u", " v", ""]
    assert chunks[-1]["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}


def test_disconnect_mid_stream_cancels(server):
    report = server.repo / "tiny_llm" / "cancel_report"
    conn, resp = sse_request(server, {"model": "tiny_llm", "prompt": "slow x", "stream": True,
                                      "max_tokens": 2000})
    try:
        assert resp.status == 200
        # The chunked body's first event (chunk-size lines come between).
        line = b""
        while not line.startswith(b"data: "):
            line = resp.fp.readline()
            assert line, "the stream ended before its first event"
    finally:
        conn.close()
        resp.close()
    wait_until(report.exists, 30, "the model's cancel report")
    sent = int(report.read_text().split()[-1])
    assert 1 <= sent < 2000, report.read_text()


def test_orca_load_metrics_header(server):
    """`endpoint-load-metrics-format: json|text` asks for the model's load on the answer, on the
    OpenAI routes and on /generate (Triton's ORCA header); no header without the ask."""
    body = {"model": "tiny_llm", "prompt": "a", "max_tokens": 1}
    _, hdrs, _ = http_raw(server.http_url, "POST", "/v1/completions", body,
                          {"Content-Type": "application/json",
                           "endpoint-load-metrics-format": "json"})
    kind, _, report = hdrs["endpoint-load-metrics"].partition(" ")
    assert kind == "JSON"
    assert set(json.loads(report)["named_metrics"]) == {"pending_requests", "in_flight_requests"}
    status, hdrs, _ = http_raw(server.http_url, "POST", "/v2/models/plain/generate",
                               {"x": [1, 2]}, {"endpoint-load-metrics-format": "text"})
    assert status == 200
    assert hdrs["endpoint-load-metrics"].startswith("TEXT named_metrics.pending_requests="), hdrs
    _, hdrs, _ = http_raw(server.http_url, "POST", "/v1/completions", body,
                          {"Content-Type": "application/json"})
    assert "endpoint-load-metrics" not in hdrs
