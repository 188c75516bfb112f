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
