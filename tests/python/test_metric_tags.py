"""`metric_tags` in a model's config: each entry becomes a `_<key>` label on the model's
Prometheus series, as in Triton. Checked against the real Triton 2.51 on the same repository."""

import re
import textwrap
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from nereid_util import PYTHON_IDENTITY_MODEL, http_json

IDENTITY = PYTHON_IDENTITY_MODEL

CONFIG = textwrap.dedent("""
    name: "tagged"
    backend: "python"
    max_batch_size: 0
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
    instance_group [ { count: 1 kind: KIND_CPU } ]
    metric_tags { key: "team" value: "vision" }
    metric_tags { key: "tier" value: "gold" }
    """)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from triton_util import TRITON_BIN, start_pair
    if not Path(TRITON_BIN).exists():
        pytest.skip(f"{TRITON_BIN} missing: run `make triton-ref`")
    work = tmp_path_factory.mktemp("metric_tags")
    repo = work / "repo"
    (repo / "tagged" / "1").mkdir(parents=True)
    (repo / "tagged" / "1" / "model.py").write_text(IDENTITY)
    (repo / "tagged" / "config.pbtxt").write_text(CONFIG)
    servers = start_pair(repo, work)
    yield servers
    for s in servers:
        s.stop()


def labels_of(server, family):
    """The label sets of `family`'s series for model `tagged`, after one inference."""
    client = httpclient.InferenceServerClient(server.http_url)
    x = httpclient.InferInput("x", [4], "FP32")
    x.set_data_from_numpy(np.zeros(4, dtype=np.float32))
    client.infer("tagged", [x])
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                  timeout=10).read().decode()
    found = []
    for line in text.splitlines():
        m = re.match(rf"{family}\{{([^}}]*)\}} ", line)
        if m and 'model="tagged"' in m.group(1):
            found.append(dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))))
    return found


def test_metric_tags_are_labels_as_in_triton(pair):
    nereid, triton = pair
    for family in ("nv_inference_request_success", "nv_inference_pending_request_count"):
        ours, theirs = labels_of(nereid, family), labels_of(triton, family)
        assert ours == theirs, (family, ours, theirs)
        assert ours == [{"_team": "vision", "_tier": "gold", "model": "tagged", "version": "1"}]


def test_a_tag_that_is_not_a_label_name_fails_the_load(tmp_path):
    from nereid_util import managed_server
    (tmp_path / "repo" / "tagged" / "1").mkdir(parents=True)
    (tmp_path / "repo" / "tagged" / "1" / "model.py").write_text(IDENTITY)
    (tmp_path / "repo" / "tagged" / "config.pbtxt").write_text(
        CONFIG.replace('key: "tier"', 'key: "tier-1"'))
    servers = managed_server(tmp_path / "repo", tmp_path, [], "bad_tag")
    server = next(servers)
    try:
        code, rows = http_json(server.http_url, "POST", "/v2/repository/index", {})
        assert code == 200, rows
        row = next(r for r in rows if r["name"] == "tagged")
        assert row["state"] == "UNAVAILABLE", row
        assert "metric_tags key 'tier-1' of model 'tagged'" in row["reason"], row
    finally:
        servers.close()


BUCKETED = re.sub(r"(?m)^metric_tags .*\n", "", CONFIG.replace('"tagged"', '"bucketed"'))


def model_metrics(family, buckets):
    return textwrap.dedent(f"""
        model_metrics {{
          metric_control: [
            {{
              metric_identifier: {{ family: "{family}" }}
              histogram_options: {{ buckets: {buckets} }}
            }}
          ]
        }}
        """)


def test_model_metrics_set_histogram_buckets(tmp_path):
    """`model_metrics` (newer Triton; 2.51 refuses the field, so no differential run): the
    model's first-response histogram has its buckets; other models keep the defaults; a family
    that is not customizable is ignored; bounds that do not increase fail the load."""
    from nereid_util import managed_server, wait_until
    h = "nv_inference_first_response_histogram_ms"
    repo = tmp_path / "repo"
    configs = {
        "bucketed": BUCKETED + model_metrics(h, "[ -1, 0.0, 1, 2.5 ]"),
        "plain": BUCKETED.replace('"bucketed"', '"plain"')
        + model_metrics("nv_inference_request_success", "[ 1, 2 ]"),
        "unordered": BUCKETED.replace('"bucketed"', '"unordered"')
        + model_metrics(h, "[ 10, 1 ]"),
    }
    for name, config in configs.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(IDENTITY)
        (repo / name / "config.pbtxt").write_text(config)
    servers = managed_server(repo, tmp_path, ["--metrics-config", "histogram_latencies=true"],
                             "model_metrics")
    server = next(servers)
    try:
        code, rows = http_json(server.http_url, "POST", "/v2/repository/index", {})
        assert code == 200, rows
        states = {r["name"]: r for r in rows}
        assert states["bucketed"]["state"] == states["plain"]["state"] == "READY", rows
        bad = states["unordered"]
        assert bad["state"] == "UNAVAILABLE", bad
        assert ("histogram options 'buckets' must be finite and strictly increasing, "
                "got [10.0, 1.0] (model_metrics.metric_control[0] of model 'unordered')"
                in bad["reason"]), bad
        client = httpclient.InferenceServerClient(server.http_url)
        for model in ("bucketed", "plain"):
            x = httpclient.InferInput("x", [4], "FP32")
            x.set_data_from_numpy(np.zeros(4, dtype=np.float32))
            client.infer(model, [x])
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics",
                                      timeout=10).read().decode()

        def bounds(model):
            return [m.group(1) for m in re.finditer(
                rf'^{h}_bucket\{{model="{model}",version="1",le="([^"]+)"\}} \S+$', text,
                re.MULTILINE)]

        assert bounds("bucketed") == ["-1", "0", "1", "2.5", "+Inf"], text
        assert bounds("plain") == ["100", "500", "2000", "5000", "+Inf"], text
        assert re.search(rf'^{h}_bucket\{{model="bucketed",version="1",le="0"\}} 0$', text,
                         re.MULTILINE), text
        assert re.search(rf'^{h}_count\{{model="bucketed",version="1"\}} 1$', text,
                         re.MULTILINE), text
        wait_until(lambda: "nv_inference_request_success' in 'metric_identifier' is not a "
                   "customizable metric" in server.log_tail(), 10, "the ignored family's warning")
    finally:
        servers.close()
