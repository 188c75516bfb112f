"""The rate limiter (`--rate-limit execution_count`) end to end, observed through the models'
own clocks: every Python model here appends `<model> <start_ns> <end_ns>` (CLOCK_MONOTONIC,
one clock for every process) to a log file per execution, and its execution lasts a few
milliseconds so that executions that may overlap do.

- two models whose instances need the one copy of resource `R` never execute at once, while
  the same models without `--rate-limit` do overlap (so the check can fail);
- with both models always waiting for `R`, priority 2 executes half as often as priority 1;
- a need the operator's `--rate-limit-resource` cannot satisfy fails that model's load, by
  name, and the server keeps serving the others; a bad flag stops the server at startup.
"""

import concurrent.futures
import subprocess
import textwrap

import numpy as np
import pytest
import tritonclient.http as httpclient

from nereid_util import NEREID_BIN, Server, http_json, http_raw, wait_until

WORK_MS = 15
REQUESTS_PER_MODEL = 12

MODEL_PY = textwrap.dedent('''
    import json
    import os
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def initialize(self, args):
            config = json.loads(args["model_config"])
            self.name = config["name"]
            self.log = config["parameters"]["log"]["string_value"]
            self.work_s = float(config["parameters"]["work_ms"]["string_value"]) / 1000

        def execute(self, requests):
            start = time.monotonic_ns()
            # Busy for work_s: long enough for executions that may overlap to overlap.
            end = time.monotonic() + self.work_s
            while time.monotonic() < end:
                pass
            stop = time.monotonic_ns()
            fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, "{} {} {}\\n".format(self.name, start, stop).encode())
            finally:
                os.close(fd)
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())]) for r in requests]
''')


def write_model(repo, name, log, groups):
    """A Python model `name` with the instance groups `groups` (pbtxt text)."""
    d = repo / name
    (d / "1").mkdir(parents=True)
    (d / "1" / "model.py").write_text(MODEL_PY)
    (d / "config.pbtxt").write_text(textwrap.dedent(f'''
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        instance_group [ {groups} ]
        parameters [ {{ key: "log" value {{ string_value: "{log}" }} }},
                     {{ key: "work_ms" value {{ string_value: "{WORK_MS}" }} }} ]
    '''))


def resource_group(count=1, need=1, priority=None):
    prio = f" priority: {priority}" if priority is not None else ""
    return (f'{{ count: {count} kind: KIND_CPU rate_limiter {{ resources [ {{ name: "R" '
            f'count: {need} }} ]{prio} }} }}')


def executions(log):
    rows = [line.split() for line in log.read_text().splitlines()]
    return sorted((int(start), int(end), name) for name, start, end in rows)


def overlaps(rows):
    """Pairs of executions that ran at the same time."""
    found, latest = [], None
    for row in rows:
        if latest is not None and row[0] < latest[1]:
            found.append((latest, row))
        if latest is None or row[1] > latest[1]:
            latest = row
    return found


def flood(server, models, per_model):
    """Sends `per_model` requests to each model at once; every one must succeed."""
    client = httpclient.InferenceServerClient(server.http_url, concurrency=len(models) * per_model)
    try:
        def one(model, i):
            x = np.array([i], np.int32)
            inp = httpclient.InferInput("IN", [1], "INT32")
            inp.set_data_from_numpy(x)
            return client.async_infer(model, [inp])

        pending = [one(m, i) for i in range(per_model) for m in models]
        for p in pending:
            p.get_result()
    finally:
        client.close()


def start(repo, tmp_path, name, *flags):
    """A server whose startup loads have finished (the suite's lenient readiness: ready then)."""
    server = Server(repo, tmp_path, ["--rate-limit", *flags] if flags else [], name=name).start()
    wait_until(lambda: http_raw(server.http_url, "GET", "/v2/health/ready")[0] == 200, 60,
               f"{name}: startup loads finished")
    return server


@pytest.fixture
def shared_resource_repo(tmp_path):
    repo, log = tmp_path / "repo", tmp_path / "executions.log"
    for name in ("rl_a", "rl_b"):
        write_model(repo, name, log, resource_group(count=2))
    return repo, log


def shared_load(repo_and_log, tmp_path, name, *flags):
    """Floods both models of the shared-resource repository; their executions, in time order."""
    repo, log = repo_and_log
    server = start(repo, tmp_path, name, *flags)
    try:
        flood(server, ["rl_a", "rl_b"], REQUESTS_PER_MODEL)
    finally:
        assert server.stop() == 0
    rows = executions(log)
    assert len(rows) == 2 * REQUESTS_PER_MODEL
    return rows


def test_instances_sharing_one_resource_never_execute_at_once(shared_resource_repo, tmp_path):
    rows = shared_load(shared_resource_repo, tmp_path, "limited", "execution_count")
    assert overlaps(rows) == [], "executions overlapped under the rate limiter"


def test_without_the_rate_limiter_the_same_load_overlaps(shared_resource_repo, tmp_path):
    rows = shared_load(shared_resource_repo, tmp_path, "unlimited")  # --rate-limit off
    assert overlaps(rows), "four instances under load never overlapped: the check above proves nothing"


def test_priority_two_executes_half_as_often_while_both_wait(tmp_path):
    repo, log = tmp_path / "repo", tmp_path / "executions.log"
    write_model(repo, "rl_first", log, resource_group(priority=1))
    write_model(repo, "rl_second", log, resource_group(priority=2))
    server = start(repo, tmp_path, "priority", "execution_count", "--rate-limit-resource", "R:1")
    per_model = 30
    try:
        flood(server, ["rl_first", "rl_second"], per_model)
    finally:
        assert server.stop() == 0
    order = [name for _, _, name in executions(log)]
    assert len(order) == 2 * per_model
    # The first 30 executions: both models still have requests waiting throughout (each has 30).
    window = order[:30]
    first = window.count("rl_first")
    assert 18 <= first <= 22, f"priority 1 ran {first} of 30 (expected about 20): {window}"


def test_a_need_beyond_the_resource_flag_fails_that_load_only(tmp_path):
    repo, log = tmp_path / "repo", tmp_path / "executions.log"
    write_model(repo, "rl_greedy", log, resource_group(need=2))
    write_model(repo, "rl_fits", log, resource_group(need=1))
    server = start(repo, tmp_path, "greedy", "execution_count", "--rate-limit-resource", "R:1")
    try:
        status, body = http_json(server.http_url, "POST", "/v2/repository/index", {})
        state = {row["name"]: row for row in body}
        assert state["rl_fits"]["state"] == "READY"
        assert state["rl_greedy"]["state"] == "UNAVAILABLE"
        reason = state["rl_greedy"]["reason"]
        assert "needs 2 of resource 'R' on device 0" in reason, reason
        assert "--rate-limit-resource makes only 1 available" in reason, reason
        flood(server, ["rl_fits"], 2)
    finally:
        assert server.stop() == 0


def test_a_resource_without_a_name_is_a_config_error(tmp_path):
    repo, log = tmp_path / "repo", tmp_path / "executions.log"
    write_model(repo, "rl_nameless", log,
                '{ count: 1 kind: KIND_CPU rate_limiter { resources [ { count: 1 } ] } }')
    server = start(repo, tmp_path, "nameless", "execution_count")
    try:
        _, body = http_json(server.http_url, "POST", "/v2/repository/index", {})
        reason = {row["name"]: row for row in body}["rl_nameless"]["reason"]
        assert "rate_limiter resource without a name" in reason, reason
    finally:
        assert server.stop() == 0


@pytest.mark.parametrize("flags, message", [
    (["--rate-limit-resource", "R"], "--rate-limit-resource 'R': wrong number"),
    (["--rate-limit-resource", "R:many"], "the count is not a non-negative integer"),
    (["--rate-limit", "sometimes"], "invalid value 'sometimes'"),
])
def test_bad_rate_limit_flags_stop_the_server_at_startup(tmp_path, flags, message):
    (tmp_path / "repo").mkdir()
    result = subprocess.run([NEREID_BIN, "serve", "--model-repository", str(tmp_path / "repo"),
                             "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *flags],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result
    assert message in result.stderr, result.stderr
