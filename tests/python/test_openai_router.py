"""The OpenAI-compatible routes through `nereid router`: the body's `model` picks a worker serving
it, as for any inference; streaming, usage, embeddings and cancellation on disconnect work as on
`serve` (tests/python/test_openai.py, whose test models this reuses). Chat gets the default
template here: the router has no model files."""

import http.client
import json
import subprocess

import openai
import pytest

from cluster_util import RouterProcess, WorkerProcess, leader_of
from nereid_util import NEREID_BIN, wait_until
from test_cluster import start_control_plane, stop_all
from test_openai import client, expected_vector, write_repo


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("openai_router")
    repo = write_repo(tmp / "repo")
    token, cps = start_control_plane(tmp, n=1)
    worker = WorkerProcess("w1", tmp, token, [cps[0].grpc_addr])
    router = RouterProcess(tmp, token, [cps[0].grpc_addr])
    try:
        leader_of(cps)
        for p in (worker, router):
            p.spawn()
        for p in (worker, router):
            p.wait_live()
        for model in ("tiny_llm", "tiny_embed"):
            out = subprocess.run(
                [NEREID_BIN, "ctl", "--control-plane", cps[0].grpc_addr, "--token-file",
                 str(token), "models", "deploy", model, "--source", f"file://{repo / model}",
                 "--replicas", "1", "--memory", "64Mi", "--wait", "--timeout", "60"],
                capture_output=True, text=True, timeout=90)
            assert out.returncode == 0, (out.stdout, out.stderr)
        via = client(router)

        def ready():
            try:
                return {m.id for m in via.models.list()} >= {"tiny_llm", "tiny_embed"}
            except openai.APIError:
                return False

        wait_until(ready, 30, "the router lists both models")
        yield tmp, router
    finally:
        stop_all([router, worker, *cps])


def test_completion_and_stream_through_router(cluster):
    _, router = cluster
    c = client(router)
    r = c.completions.create(model="tiny_llm", prompt="a b c", max_tokens=4)
    assert r.choices[0].text == "a b c a"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (3, 4)
    chunks = list(c.chat.completions.create(
        model="tiny_llm", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == "<|im_start|>user hi<|im_end|> <|im_start|>assistant"
    assert chunks[-1].usage.completion_tokens == 3
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="not_deployed", prompt="a")


def test_embeddings_through_router(cluster):
    _, router = cluster
    r = client(router).embeddings.create(model="tiny_embed", input=["x y"])
    assert r.data[0].embedding == expected_vector("x y")


def test_disconnect_through_router_cancels_on_the_worker(cluster):
    tmp, router = cluster
    host, port = router.http_url.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request("POST", "/v1/completions",
                     json.dumps({"model": "tiny_llm", "prompt": "slow z", "stream": True,
                                 "max_tokens": 2000}),
                     {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        line = b""
        while not line.startswith(b"data: "):
            line = resp.fp.readline()
            assert line, "the stream ended before its first event"
    finally:
        conn.close()
    reports = lambda: list(tmp.rglob("cancel_report"))  # noqa: E731
    wait_until(reports, 30, "the worker's model reports the cancellation")
    sent = int(reports()[0].read_text().split()[-1])
    assert 1 <= sent < 2000
