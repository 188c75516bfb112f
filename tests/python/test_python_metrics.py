"""Custom metrics from Python models (`pb_utils.MetricFamily`) on the server's /metrics.

`py_metrics` (two instances) counts its requests in a counter family shared with `py_metrics_peer`
(same name and kind, another description), sets a gauge and observes a histogram; each request
answers with the counter's value as the server has it and with what its mistakes raised. The
series must read exactly what was sent, carry the model's labels and leave /metrics when the
model that made them is unloaded (a family shared with a model still loaded stays).
`py_metrics_crash` counts its starts: a stub that dies takes its series along, and the restarted
one counts from zero.
"""

import json
import re
import textwrap

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import http_json, http_raw, managed_server, wait_until

METRICS = textwrap.dedent("""
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    def attempt(f):
        try:
            f()
            return "no error"
        except pb_utils.TritonModelException as e:
            return e.message()

    class TritonPythonModel:
        def initialize(self, args):
            labels = {"model": args["model_name"], "version": args["model_version"]}
            self.requests = pb_utils.MetricFamily(
                name="requests_custom", description="Requests the model saw",
                kind=pb_utils.MetricFamily.COUNTER).Metric(labels=labels)
            self.last = pb_utils.MetricFamily(
                name="last_input_custom", description="The last input",
                kind=pb_utils.MetricFamily.GAUGE).Metric(labels=labels)
            self.latency_family = pb_utils.MetricFamily(
                name="input_histogram_custom", description="Inputs by size",
                kind=pb_utils.MetricFamily.HISTOGRAM)
            self.latency = self.latency_family.Metric(labels=labels, buckets=[0.1, 1.0, 10.0])

        def execute(self, requests):
            out = []
            for request in requests:
                x = float(pb_utils.get_input_tensor_by_name(request, "x").as_numpy()[0])
                self.requests.increment(1)
                self.last.set(x)
                self.latency.observe(x)
                errors = {
                    "negative": attempt(lambda: self.requests.increment(-1)),
                    "set_counter": attempt(lambda: self.requests.set(1)),
                    "observe_gauge": attempt(lambda: self.last.observe(1)),
                    "bad_name": attempt(lambda: pb_utils.MetricFamily(
                        "bad name", "d", pb_utils.MetricFamily.GAUGE)),
                    "other_kind": attempt(lambda: pb_utils.MetricFamily(
                        "requests_custom", "d", pb_utils.MetricFamily.GAUGE)),
                    "no_buckets": attempt(lambda: self.latency_family.Metric(labels={"a": "b"})),
                }
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("count", np.array([self.requests.value()], np.float32)),
                    pb_utils.Tensor("errors", np.array([json.dumps(errors).encode()], np.object_))]))
            return out
    """)

PEER = textwrap.dedent("""
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.family = pb_utils.MetricFamily(
                name="requests_custom", description="Another description",
                kind=pb_utils.MetricFamily.COUNTER)
            self.requests = self.family.Metric(labels={"model": args["model_name"]})
            self.requests.increment(7)

        def execute(self, requests):
            return [pb_utils.InferenceResponse([
                pb_utils.Tensor("count", np.array([self.requests.value()], np.float32)),
                pb_utils.Tensor("errors", np.array([b"{}"], np.object_))]) for _ in requests]
    """)

CRASH = textwrap.dedent("""
    import os
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.family = pb_utils.MetricFamily(
                name="starts_custom", description="Counts initialize and requests",
                kind=pb_utils.MetricFamily.COUNTER)
            self.count = self.family.Metric(labels={"instance": args["model_instance_name"]})
            self.count.increment(1)

        def execute(self, requests):
            if pb_utils.get_input_tensor_by_name(requests[0], "x").as_numpy()[0] < 0:
                os._exit(3)
            self.count.increment(1)
            return [pb_utils.InferenceResponse([
                pb_utils.Tensor("count", np.array([self.count.value()], np.float32)),
                pb_utils.Tensor("errors", np.array([b"{}"], np.object_))]) for _ in requests]
    """)


def config(name, count):
    return textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        output [ {{ name: "count" data_type: TYPE_FP32 dims: [ 1 ] }},
                 {{ name: "errors" data_type: TYPE_STRING dims: [ 1 ] }} ]
        instance_group [ {{ count: {count} kind: KIND_CPU }} ]
        """)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("metrics_repo")
    for name, code, count in (("py_metrics", METRICS, 2), ("py_metrics_peer", PEER, 1),
                              ("py_metrics_crash", CRASH, 1)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(code)
        (repo / name / "config.pbtxt").write_text(config(name, count))
    args = ["--model-control-mode", "explicit", "--load-model", "*"]
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), args, "server_py_metrics")


def scrape(server):
    status, _, body = http_raw(f"127.0.0.1:{server.metrics_port}", "GET", "/metrics")
    assert status == 200
    return body.decode()


# The families of py_metrics and py_metrics_peer.
SHARED = ("requests_custom", "last_input_custom", "input_histogram_custom")


def custom_lines(text, families=SHARED):
    """The lines of `families`, HELP and TYPE included."""
    names = "|".join(families)
    return [line for line in text.splitlines()
            if re.match(rf"(# (HELP|TYPE) )?({names})(_bucket|_sum|_count)?[{{ ]", line)]


def infer(server, model, x):
    client = httpclient.InferenceServerClient(server.http_url)
    inp = httpclient.InferInput("x", [1], "FP32")
    inp.set_data_from_numpy(np.array([x], np.float32))
    result = client.infer(model, [inp])
    return float(result.as_numpy("count")[0]), json.loads(result.as_numpy("errors")[0])


def test_families_and_values_on_metrics_errors_raise_and_unload_removes_them(server):
    counts = [infer(server, "py_metrics", x)[0] for x in (0.5, 5.0, 50.0)]
    # Both instances share one series (same labels); value() sees every increment before it.
    assert counts == [1.0, 2.0, 3.0]
    _, errors = infer(server, "py_metrics", 0.0625)
    assert errors == {
        "negative": "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can only be "
                    "incremented monotonically by non-negative values.",
        "set_counter": "Failed to set metric value: TRITONSERVER_METRIC_KIND_COUNTER does not support Set",
        "observe_gauge": "Failed to observe metric value: TRITONSERVER_METRIC_KIND_GAUGE does not "
                         "support Observe",
        "bad_name": "Error when creating MetricFamily: Invalid metric name 'bad name': a name must "
                    "match [a-zA-Z_:][a-zA-Z0-9_:]* and must not start with '__'",
        "other_kind": "Error when creating MetricFamily: metric family 'requests_custom' already "
                      "exists with kind COUNTER; it cannot also have kind GAUGE",
        "no_buckets": "Failed to create metric. Missing required buckets.",
    }
    assert infer(server, "py_metrics_peer", 0.0)[0] == 7.0

    lines = custom_lines(scrape(server))
    first_help = next(line for line in lines if line.startswith("# HELP requests_custom"))
    assert first_help in ("# HELP requests_custom Requests the model saw",
                          "# HELP requests_custom Another description"), lines
    m = '{model="py_metrics",version="1"'
    for line in [
        "# TYPE requests_custom counter",
        f"requests_custom{m}}} 4",
        'requests_custom{model="py_metrics_peer"} 7',
        "# HELP last_input_custom The last input",
        "# TYPE last_input_custom gauge",
        f"last_input_custom{m}}} 0.0625",
        "# HELP input_histogram_custom Inputs by size",
        "# TYPE input_histogram_custom histogram",
        f'input_histogram_custom_bucket{m},le="0.1"}} 1',
        f'input_histogram_custom_bucket{m},le="1"}} 2',
        f'input_histogram_custom_bucket{m},le="10"}} 3',
        f'input_histogram_custom_bucket{m},le="+Inf"}} 4',
        f"input_histogram_custom_sum{m}}} 55.5625",
        f"input_histogram_custom_count{m}}} 4",
    ]:
        assert line in lines, f"{line!r} not in\n" + "\n".join(lines)
    assert sum(line.startswith("# HELP requests_custom") for line in lines) == 1
    assert sum(line.startswith("# TYPE") for line in lines) == 3, lines

    status, _ = http_json(server.http_url, "POST", "/v2/repository/models/py_metrics/unload", {})
    assert status == 200

    def only_the_peer_left():
        lines = custom_lines(scrape(server))
        return lines if not any("py_metrics\"" in line or "input" in line for line in lines) else None

    lines = wait_until(only_the_peer_left, 30, "py_metrics' series gone from /metrics")
    assert 'requests_custom{model="py_metrics_peer"} 7' in lines

    status, _ = http_json(server.http_url, "POST", "/v2/repository/models/py_metrics_peer/unload", {})
    assert status == 200
    wait_until(lambda: not custom_lines(scrape(server)), 30, "every custom family gone")

    # Loaded again, the model starts from zero.
    status, _ = http_json(server.http_url, "POST", "/v2/repository/models/py_metrics/load", {})
    assert status == 200
    assert infer(server, "py_metrics", 2.0)[0] == 1.0
    assert f"requests_custom{m}}} 1" in custom_lines(scrape(server))


def test_a_stub_that_dies_takes_its_metrics_along_and_its_restart_starts_again(server):
    series = 'starts_custom{instance="py_metrics_crash_0_0"}'
    assert infer(server, "py_metrics_crash", 1.0)[0] == 2.0
    assert f"{series} 2" in custom_lines(scrape(server), ["starts_custom"])
    with pytest.raises(InferenceServerException, match="is not healthy"):
        infer(server, "py_metrics_crash", -1.0)
    # The dead stub's series went with it; the restarted stub's initialize counts 1 again.
    wait_until(lambda: f"{series} 1" in custom_lines(scrape(server), ["starts_custom"]), 60,
               "the restarted stub's series")
