#!/usr/bin/env python3
"""Time to first token and tokens/s through the OpenAI route vs /generate_stream, same model.

usage: NEREID_BIN=target/release/nereid .venv/bin/python scripts/bench_openai.py \
           [--requests 200] [--concurrency 8] [--tokens 64]

Starts `nereid serve` on the test models of tests/python/test_openai.py (`tiny_llm`: a decoupled
Python model sending one response per token, no weights), then streams the same prompts
through `POST /v1/completions` (stream: true) and `POST /v2/models/tiny_llm/generate_stream`
with one raw HTTP/1.1 client per worker thread, so the two endpoints differ only in the server's
work. Prints, per endpoint: requests/s, tokens/s, and time to first token (p50, p90, p99 ms).
"""

import argparse
import http.client
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))

from nereid_util import Server  # noqa: E402
from test_openai import write_repo  # noqa: E402


def stream_once(conn, path, body):
    """One streamed request: (seconds to the first event with text, events with text)."""
    t0 = time.perf_counter()
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit(f"{path}: HTTP {resp.status}: {resp.read()[:300]!r}")
    first, tokens = None, 0
    for line in resp:
        if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
            continue
        event = json.loads(line[6:])
        if "choices" in event:
            text = event["choices"][0]["text"] if event["choices"] else ""
        else:
            text = event.get("text_output", "")
        if text:
            tokens += 1
            if first is None:
                first = time.perf_counter() - t0
    return first or 0.0, tokens


def run(server, path, make_body, requests, concurrency):
    host, port = server.http_url.rsplit(":", 1)
    ttft, tokens, lock = [], [0], threading.Lock()
    todo = iter(range(requests))

    def worker():
        conn = http.client.HTTPConnection(host, int(port), timeout=120)
        while True:
            with lock:
                i = next(todo, None)
            if i is None:
                break
            first, n = stream_once(conn, path, make_body(i))
            with lock:
                ttft.append(first)
                tokens[0] += n
        conn.close()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - t0
    ttft.sort()
    pct = lambda q: ttft[min(len(ttft) - 1, int(q * len(ttft)))] * 1000  # noqa: E731
    return {"req_s": requests / elapsed, "tok_s": tokens[0] / elapsed,
            "ttft_p50": pct(0.5), "ttft_p90": pct(0.9), "ttft_p99": pct(0.99)}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repo(Path(tmp) / "repo")
        (Path(tmp) / "logs").mkdir()
        server = Server(repo, Path(tmp) / "logs", ["--log-verbose", "0"], name="bench_openai",
                        suite_defaults=False).start()
        try:
            prompt = lambda i: f"w{i} a b c d e f g"  # noqa: E731
            openai_body = lambda i: {"model": "tiny_llm", "prompt": prompt(i),  # noqa: E731
                                     "max_tokens": args.tokens, "stream": True}
            generate_body = lambda i: {  # noqa: E731
                "text_input": prompt(i), "stream": True,
                "sampling_parameters": json.dumps({"max_tokens": args.tokens}),
                # What the OpenAI route asks of the model too (all outputs on every response).
                "exclude_input_in_output": True, "return_num_input_tokens": True,
                "return_num_output_tokens": True, "return_finish_reason": True}
            cases = [("/v1/completions", "/v1/completions", openai_body),
                     ("/generate_stream", "/v2/models/tiny_llm/generate_stream", generate_body)]
            run(server, cases[0][1], cases[0][2], args.concurrency, args.concurrency)  # warm up
            print(f"{args.requests} requests, concurrency {args.concurrency}, "
                  f"{args.tokens} tokens each")
            print(f"{'endpoint':<18} {'req/s':>7} {'tokens/s':>9} {'TTFT p50':>9} "
                  f"{'p90':>7} {'p99':>7}  (ms)")
            for name, path, body in cases:
                r = run(server, path, body, args.requests, args.concurrency)
                print(f"{name:<18} {r['req_s']:7.1f} {r['tok_s']:9.0f} {r['ttft_p50']:9.2f} "
                      f"{r['ttft_p90']:7.2f} {r['ttft_p99']:7.2f}")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
