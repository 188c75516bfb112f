"""Prometheus metrics on the metrics port agree exactly with what was sent, and with the
statistics extension."""

import re

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import http_raw

MODEL = "nobatch_fp32"


def scrape(server):
    status, _, body = http_raw(f"127.0.0.1:{server.metrics_port}", "GET", "/metrics")
    assert status == 200
    return body.decode()


def value(text, name, **labels):
    want = {"model": MODEL, "version": "1", **labels}
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{(.*)\} (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if got == want:
            return float(m.group(3))
    raise AssertionError(f"{name}{want} not in metrics:\n{text}")


def test_counters_match_what_was_sent(server, http_client):
    before = scrape(server)
    good, bad = 5, 3
    x = np.ones((2, 3), np.float32)
    for _ in range(good):
        i = httpclient.InferInput("INPUT0", [2, 3], "FP32")
        i.set_data_from_numpy(x)
        http_client.infer(MODEL, [i])
    for _ in range(bad):
        i = httpclient.InferInput("INPUT0", [3, 2], "FP32")
        i.set_data_from_numpy(np.ones((3, 2), np.float32))
        with pytest.raises(InferenceServerException):
            http_client.infer(MODEL, [i])
    after = scrape(server)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("nv_inference_request_success") == good
    assert delta("nv_inference_request_failure", reason="OTHER") == bad
    assert delta("nv_inference_request_failure", reason="BACKEND") == 0
    assert delta("nv_inference_request_failure", reason="REJECTED") == 0
    assert delta("nv_inference_count") == good
    assert delta("nv_inference_exec_count") == good
    assert delta("nv_inference_request_duration_us") > 0

    stats = http_client.get_inference_statistics(MODEL)["model_stats"][0]["inference_stats"]
    assert stats["success"]["count"] == value(after, "nv_inference_request_success")
    failures = sum(value(after, "nv_inference_request_failure", reason=r)
                   for r in ("REJECTED", "CANCELED", "BACKEND", "OTHER"))
    assert stats["fail"]["count"] == failures


def test_metrics_content_type_and_method(server):
    status, headers, _ = http_raw(f"127.0.0.1:{server.metrics_port}", "GET", "/metrics")
    assert status == 200
    assert headers.get("content-type", "").startswith("text/plain")
    status, _, _ = http_raw(f"127.0.0.1:{server.metrics_port}", "POST", "/metrics", body=b"")
    assert status == 405
