"""Prometheus metrics on the metrics port agree exactly with what was sent, and with the
statistics extension (HTTP and gRPC), which perf_analyzer also reads.

Most tests run on a server of their own (`metrics_server`, latency summaries and the
first-response histogram on, the cumulative latency counters off) so the counts are absolute:
nothing else sends to it."""

import re

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import http_raw, managed_server
from test_scheduler import Clients, occupy, run

MODEL = "nobatch_fp32"
SLOW = "identity_priority"  # one instance, 300 ms executions, request timeouts allowed
REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
QUANTILES = ("0.5", "0.9", "0.95", "0.99", "0.999")


@pytest.fixture(scope="module")
def metrics_server(test_repo, tmp_path_factory):
    args = ["--metrics-config", "summary_latencies=true",
            "--metrics-config", "histogram_latencies=true",
            "--metrics-config", "counter_latencies=false",
            "--metrics-interval-ms", "100"]
    yield from managed_server(test_repo, tmp_path_factory.mktemp("logs"), args, "server_metrics")


def scrape(server):
    status, _, body = http_raw(f"127.0.0.1:{server.metrics_port}", "GET", "/metrics")
    assert status == 200
    return body.decode()


def series(text):
    """{(name, frozenset(labels)): value} of every sample line."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if m:
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def value(text, name, model=MODEL, **labels):
    want = {"model": model, "version": "1", **labels} if model else labels
    key = (name, frozenset(want.items()))
    got = series(text)
    assert key in got, f"{name}{want} not in metrics:\n{text}"
    return got[key]


def infer_ok(client):
    i = httpclient.InferInput("INPUT0", [2, 3], "FP32")
    i.set_data_from_numpy(np.ones((2, 3), np.float32))
    client.infer(MODEL, [i])


def infer_bad_shape(client):
    i = httpclient.InferInput("INPUT0", [3, 2], "FP32")
    i.set_data_from_numpy(np.ones((3, 2), np.float32))
    with pytest.raises(InferenceServerException):
        client.infer(MODEL, [i])


def test_counters_match_what_was_sent(server, http_client):
    """On the shared server (default config): deltas of the counters equal what was sent."""
    before = scrape(server)
    good, bad = 5, 3
    for _ in range(good):
        infer_ok(http_client)
    for _ in range(bad):
        infer_bad_shape(http_client)
    after = scrape(server)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("nv_inference_request_success") == good
    # Refused by the input checks: counted nowhere, as Triton 2.51 (test_triton_diff.py).
    assert delta("nv_inference_request_failure", reason="OTHER") == 0
    assert delta("nv_inference_request_failure", reason="BACKEND") == 0
    assert delta("nv_inference_request_failure", reason="REJECTED") == 0
    assert delta("nv_inference_count") == good
    assert delta("nv_inference_exec_count") == good
    assert delta("nv_inference_request_duration_us") > 0
    assert delta("nv_inference_compute_infer_duration_us") >= 0
    # Summaries and the histogram are off by default.
    assert "nv_inference_request_summary_us" not in after
    assert "nv_inference_first_response_histogram_ms" not in after

    stats = http_client.get_inference_statistics(MODEL)["model_stats"][0]["inference_stats"]
    assert stats["success"]["count"] == value(after, "nv_inference_request_success")
    failures = sum(value(after, "nv_inference_request_failure", reason=r) for r in REASONS)
    assert stats["fail"]["count"] == failures


def test_exact_counts_by_reason_agree_with_statistics(metrics_server):
    """N successes, M bad requests (refused by the input checks: counted nowhere, as Triton)
    and one queue-timeout refusal (REJECTED) on a server nobody else uses: the counters read
    exactly that, HTTP and gRPC statistics the same."""
    http = httpclient.InferenceServerClient(metrics_server.http_url, network_timeout=60)
    grpc = grpcclient.InferenceServerClient(metrics_server.grpc_url)
    good, bad = 7, 4
    for _ in range(good):
        infer_ok(http)
    for _ in range(bad):
        infer_bad_shape(http)

    async def refuse_one():
        async with Clients(metrics_server) as c:
            # Returns once one 1 ms-timeout probe was REJECTED behind the occupying request;
            # `ran` probes found the instance idle and ran.
            first, ran = await occupy(c, SLOW)
            assert (await first).err is None
            return ran + 1

    slow_ok = run(refuse_one())
    text = scrape(metrics_server)

    assert value(text, "nv_inference_request_success") == good
    assert value(text, "nv_inference_request_failure", reason="OTHER") == 0
    for reason in ("REJECTED", "CANCELED", "BACKEND"):
        assert value(text, "nv_inference_request_failure", reason=reason) == 0
    assert value(text, "nv_inference_count") == good
    assert value(text, "nv_inference_exec_count") == good
    assert value(text, "nv_inference_request_success", model=SLOW) == slow_ok
    assert value(text, "nv_inference_request_failure", model=SLOW, reason="REJECTED") == 1
    assert value(text, "nv_inference_request_failure", model=SLOW, reason="OTHER") == 0
    for m in (MODEL, SLOW):
        # Every request has been answered: none is pending.
        assert value(text, "nv_inference_pending_request_count", model=m) == 0

        [h] = http.get_inference_statistics(m)["model_stats"]
        [g] = grpc.get_inference_statistics(m, as_json=True)["model_stats"]
        assert int(h["inference_count"]) == int(g["inference_count"]) == \
            value(text, "nv_inference_count", model=m)
        assert int(h["execution_count"]) == int(g["execution_count"]) == \
            value(text, "nv_inference_exec_count", model=m)
        hi, gi = h["inference_stats"], g["inference_stats"]
        assert int(hi["success"]["count"]) == int(gi["success"]["count"]) == \
            value(text, "nv_inference_request_success", model=m)
        failures = sum(value(text, "nv_inference_request_failure", model=m, reason=r)
                       for r in REASONS)
        # gRPC's JSON form leaves out a zero count.
        assert int(hi["fail"]["count"]) == int(gi["fail"].get("count", 0)) == failures
    http.close()
    grpc.close()


def test_summaries_histogram_and_config(metrics_server):
    """summary_latencies: one summary per latency with Triton's default quantiles, whose count
    and sum equal the statistics; histogram_latencies: the first-response histogram;
    counter_latencies=false: no *_duration_us counters."""
    http = httpclient.InferenceServerClient(metrics_server.http_url, network_timeout=60)
    infer_ok(http)
    text = scrape(metrics_server)
    [s] = http.get_inference_statistics(MODEL)["model_stats"]
    http.close()
    success = s["inference_stats"]["success"]
    assert "_duration_us" not in text
    assert "# TYPE nv_inference_request_summary_us summary" in text
    for name, stat in [("request", "success"), ("queue", "queue"),
                       ("compute_input", "compute_input"), ("compute_infer", "compute_infer"),
                       ("compute_output", "compute_output")]:
        family = f"nv_inference_{name}_summary_us"
        d = s["inference_stats"][stat]
        assert value(text, family + "_count") == int(d["count"]) == int(success["count"])
        assert value(text, family + "_sum") == int(d["ns"]) // 1000
        qs = [value(text, family, quantile=q) for q in QUANTILES]
        assert qs == sorted(qs) and qs[0] >= 0, f"{family}: {qs}"
    h = "nv_inference_first_response_histogram_ms"
    assert f"# TYPE {h} histogram" in text
    count = int(success["count"])
    assert value(text, h + "_count") == count
    buckets = [value(text, h + "_bucket", le=le) for le in ("100", "500", "2000", "5000", "+Inf")]
    assert buckets == sorted(buckets) and buckets[-1] == count, buckets
    assert 0 < value(text, h + "_sum")


def test_system_and_load_metrics(metrics_server):
    text = scrape(metrics_server)
    assert 0.0 <= value(text, "nv_cpu_utilization", model=None) <= 1.0
    total = value(text, "nv_cpu_memory_total_bytes", model=None)
    used = value(text, "nv_cpu_memory_used_bytes", model=None)
    assert 0 < used < total
    # This host has no GPU: the GPU families are absent, not zero.
    assert "nv_gpu_" not in text and "nv_energy_consumption" not in text
    assert value(text, "nv_model_load_duration_secs") > 0
    assert value(text, "nereid_model_memory_bytes") >= 0


def test_metrics_content_type_and_method(server):
    status, headers, _ = http_raw(f"127.0.0.1:{server.metrics_port}", "GET", "/metrics")
    assert status == 200
    assert headers.get("content-type", "").startswith("text/plain")
    status, _, _ = http_raw(f"127.0.0.1:{server.metrics_port}", "POST", "/metrics", body=b"")
    assert status == 405


def test_bad_metrics_config_is_a_startup_error(test_repo, tmp_path):
    from nereid_util import Server
    s = Server(test_repo, tmp_path, ["--metrics-config", "summary_latencies=perhaps"],
               name="bad_metrics_config")
    with pytest.raises(AssertionError, match="summary_latencies: expected true or false"):
        s.start()


@pytest.mark.timeout(150)
def test_perf_analyzer_reads_server_statistics(metrics_server):
    """perf_analyzer's server-side section comes from the statistics extension; after it the
    metrics still agree with the statistics."""
    from test_perf_analyzer import run_perf
    out = run_perf(["-u", metrics_server.http_url])
    assert "Server:" in out, out
    assert re.search(r"Inference count: [1-9]", out), out
    assert re.search(r"Execution count: [1-9]", out), out
    assert re.search(r"queue [0-9]+ usec", out), out
    assert re.search(r"compute infer [0-9]+ usec", out), out
    text = scrape(metrics_server)
    http = httpclient.InferenceServerClient(metrics_server.http_url)
    [s] = http.get_inference_statistics("simple")["model_stats"]
    http.close()
    assert value(text, "nv_inference_count", model="simple") == int(s["inference_count"])
    assert value(text, "nv_inference_pending_request_count", model="simple") == 0
