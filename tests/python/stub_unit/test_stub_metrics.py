"""Custom metrics (`pb_utils.MetricFamily`) in the real nereid_stub.py against the fake parent:
the `metric` messages the stub sends, the calls it waits for (`family_new`, `value`), the
mistakes it refuses at once with Triton's words, and deletions of garbage objects.
"""

import json

import numpy as np
import pytest

from fake_parent import PROTOCOL_VERSION, pb_utils


def serve(parent, until, values=None, refuse=None):
    """Plays the parent's custom-metric side until a frame with op `until`: answers `family_new`
    (with an error for names in `refuse`) and `value` (from `values`, by metric handle). Returns
    (that frame, the metric messages without `op` and `id`)."""
    values, refuse, seen = values or {}, refuse or {}, []
    while True:
        message = parent.recv()
        if message["op"] == until:
            return message, seen
        if parent._record(message):
            continue
        assert message["op"] == "metric", message
        fields = {k: v for k, v in message.items() if k not in ("op", "id")}
        seen.append(fields)
        if message["action"] == "family_new":
            error = refuse.get(message["name"])
            parent.send({"op": "metric_done", "id": message["id"], "value": None,
                         "error": None if error is None else {"message": error, "code": "INVALID_ARG"}})
        elif message["action"] == "value":
            parent.send({"op": "metric_done", "id": message["id"], "value": values.get(message["metric"]),
                         "error": None})


MODEL = """
    import gc
    import json
    import numpy as np
    import triton_python_backend_utils as pb_utils

    def attempt(f):
        try:
            return repr(f())
        except pb_utils.TritonModelException as e:
            return "raised: " + e.message()

    class TritonPythonModel:
        def initialize(self, args):
            self.family = pb_utils.MetricFamily(
                name="requests_custom", description="Requests", kind=pb_utils.MetricFamily.COUNTER)
            self.counter = self.family.Metric(labels={"model": "m", "version": "1"})
            self.gauge = pb_utils.MetricFamily("temp", "A gauge", pb_utils.MetricFamily.GAUGE).Metric()
            self.hist = pb_utils.MetricFamily(
                "lat", "A histogram", pb_utils.MetricFamily.HISTOGRAM).Metric(buckets=[0.1, 1, 10])

        def execute(self, requests):
            self.counter.increment(2)
            self.gauge.set(float("nan"))
            self.gauge.increment(-1.5)
            self.hist.observe(0.5)
            C, H = pb_utils.MetricFamily.COUNTER, pb_utils.MetricFamily.HISTOGRAM
            results = {
                "counter value": attempt(self.counter.value),
                "gauge value": attempt(self.gauge.value),
                "negative": attempt(lambda: self.counter.increment(-1)),
                "set counter": attempt(lambda: self.counter.set(1)),
                "observe gauge": attempt(lambda: self.gauge.observe(1)),
                "hist value": attempt(self.hist.value),
                "hist increment": attempt(lambda: self.hist.increment(1)),
                "not a number": attempt(lambda: self.counter.increment("1")),
                "bad kind": attempt(lambda: pb_utils.MetricFamily("k", "d", 7)),
                "bad name": attempt(lambda: pb_utils.MetricFamily("bad-name", "d", C)),
                "refused": attempt(lambda: pb_utils.MetricFamily("taken", "d", C)),
                "labels not a dict": attempt(lambda: self.family.Metric(labels=[("a", "b")])),
                "label value": attempt(lambda: self.family.Metric(labels={"a": 1})),
                "label name": attempt(lambda: self.family.Metric(labels={"__a": "b"})),
                "buckets on counter": attempt(lambda: self.family.Metric(buckets=[1.0])),
                "no buckets": attempt(lambda: pb_utils.MetricFamily("h2", "d", H).Metric()),
                "unsorted buckets": attempt(lambda: pb_utils.MetricFamily("h3", "d", H).Metric(buckets=[2, 1])),
                "le on histogram": attempt(
                    lambda: pb_utils.MetricFamily("h4", "d", H).Metric(labels={"le": "1"}, buckets=[1])),
            }
            gc.collect()
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", np.array([json.dumps(results).encode()], dtype=np.object_))]) for _ in requests]
"""


def test_metrics_go_to_the_parent_and_mistakes_raise_at_once(parent):
    parent.send({"op": "init", "protocol_version": PROTOCOL_VERSION, "shm_prefix": parent.prefix, "model_file": parent.write_model(MODEL),
                 "decoupled": False, "args": {
                     "model_config": "{}", "model_instance_kind": "CPU", "model_instance_name": "m_0",
                     "model_instance_device_id": "0", "model_repository": "", "model_version": "1",
                     "model_name": "m"}})
    done, created = serve(parent, "init_done")
    assert done["error"] is None
    families = [m for m in created if m["action"] == "family_new"]
    metrics = [m for m in created if m["action"] == "new"]
    assert [(f["name"], f["description"], f["kind"]) for f in families] == [
        ("requests_custom", "Requests", "COUNTER"), ("temp", "A gauge", "GAUGE"),
        ("lat", "A histogram", "HISTOGRAM")]
    counter, gauge, hist = (m["metric"] for m in metrics)
    assert metrics[0]["labels"] == {"model": "m", "version": "1"}
    assert metrics[0]["family"] == families[0]["family"]
    assert "buckets" not in metrics[0]
    assert metrics[2]["buckets"] == [0.1, 1.0, 10.0]

    parent.execute([{"inputs": [("X", np.zeros(1, np.float32))]}])
    reply, seen = serve(parent, "execute_done", values={counter: 2.0, gauge: "NaN"},
                        refuse={"taken": "metric family 'taken' already exists with kind GAUGE"})
    results = json.loads(parent.outputs(reply["responses"][0], reply["segment"])["OUT"][0])
    assert seen[:4] == [
        {"action": "increment", "metric": counter, "value": 2.0},
        {"action": "set", "metric": gauge, "value": "NaN"},
        {"action": "increment", "metric": gauge, "value": -1.5},
        {"action": "observe", "metric": hist, "value": 0.5}]
    assert results["counter value"] == "2.0"
    assert results["gauge value"] == "nan"
    expected = {
        "negative": "Failed to increment metric value: TRITONSERVER_METRIC_KIND_COUNTER can only be "
                    "incremented monotonically by non-negative values.",
        "set counter": "Failed to set metric value: TRITONSERVER_METRIC_KIND_COUNTER does not support Set",
        "observe gauge": "Failed to observe metric value: TRITONSERVER_METRIC_KIND_GAUGE does not support "
                         "Observe",
        "hist value": "Failed to get metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value",
        "hist increment": "Failed to increment metric value: TRITONSERVER_METRIC_KIND_HISTOGRAM does not "
                          "support Increment",
        "not a number": "Failed to increment metric value: the value must be a number, got '1'",
        "bad kind": "Error when creating MetricFamily: kind must be MetricFamily.COUNTER, "
                    "MetricFamily.GAUGE or MetricFamily.HISTOGRAM, got 7",
        "bad name": "Error when creating MetricFamily: Invalid metric name 'bad-name'",
        "refused": "Error when creating MetricFamily: metric family 'taken' already exists with kind GAUGE",
        "labels not a dict": "Failed to create metric. Labels must be a dictionary.",
        "label value": "Error when creating Metric: label names and values must be str, got 'a': 1",
        "label name": "Error when creating Metric: Invalid label name '__a'",
        "buckets on counter": "Failed to create metric. Unexpected buckets found.",
        "no buckets": "Failed to create metric. Missing required buckets.",
        "unsorted buckets": "Error when creating Metric: Bucket boundaries must be finite and strictly sorted",
        "le on histogram": "Error when creating Metric: Invalid label name 'le'",
    }
    for case, text in expected.items():
        assert results[case].startswith("raised: " + text), (case, results[case])
    # Nothing the stub refused reached the parent, except the one family only the server could
    # refuse; the families of refused metrics (h2, h3, h4) were created, then deleted as garbage.
    names = [m["name"] for m in seen if m["action"] == "family_new"]
    assert names == ["taken", "h2", "h3", "h4"], seen
    assert not [m for m in seen if m["action"] == "new"]
    deleted = {m["family"] for m in seen if m["action"] == "family_delete"}
    created = {m["family"] for m in seen if m["action"] == "family_new" and m["name"] != "taken"}
    assert deleted == created, seen


def test_a_garbage_metric_is_deleted_and_its_family_outlives_it(parent):
    parent.send({"op": "init", "protocol_version": PROTOCOL_VERSION, "shm_prefix": parent.prefix, "decoupled": False,
                 "model_file": parent.write_model("""
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                metric = pb_utils.MetricFamily("g", "d", pb_utils.MetricFamily.GAUGE).Metric(labels={"a": "b"})
                metric.set(3)
                # Nothing names the family object; its metric keeps it alive.
                metric.set(4)
                del metric
        """), "args": {
            "model_config": "{}", "model_instance_kind": "CPU", "model_instance_name": "m_0",
            "model_instance_device_id": "0", "model_repository": "", "model_version": "1",
            "model_name": "m"}})
    done, seen = serve(parent, "init_done")
    assert done["error"] is None
    family = seen[0]["family"]
    metric = seen[1]["metric"]
    assert [m["action"] for m in seen] == ["family_new", "new", "set", "set", "delete", "family_delete"]
    assert seen[4] == {"action": "delete", "metric": metric}
    assert seen[5] == {"action": "family_delete", "family": family}


def test_outside_the_stub_metric_family_needs_the_server():
    with pytest.raises(pb_utils.TritonModelException, match="MetricFamily needs the Nereid Python stub"):
        pb_utils.MetricFamily("x", "d", pb_utils.MetricFamily.COUNTER)
    with pytest.raises(pb_utils.TritonModelException, match="Invalid metric name"):
        pb_utils.MetricFamily("x y", "d", pb_utils.MetricFamily.COUNTER)
    assert pb_utils.MetricFamily.GAUGE == pb_utils.MetricKind.GAUGE == 1

