"""Several instances of one Python model in one stub process (model parameter
`SHARED_STUB_PROCESS`, a Nereid extension; docs/python-backend.md#shared-stub-process).

One explicit-mode server on a repository written here:
- `shared_echo`    2 KIND_CPU instances sharing a process: `initialize` records its args, pid and
                   thread in a file; `execute` answers its pid and instance name; x == 1 meets the
                   other instance at a barrier of a module both import (two executions overlap, or
                   the barrier times out and the requests fail); x == 2 waits inside `execute`;
                   x == 666 waits until another request is inside `execute`, then `os._exit(3)`.
- `shared_gpu`     the same code, 2 KIND_GPU instances on GPU 0 (the model never touches it).
- `shared_capped`  the same code, 3 instances, SHARED_STUB_PROCESS "2": processes of 2 and 1.
- `shared_stream`  decoupled, 2 instances: sends its responses from a thread it starts.
- `shared_bls`     2 instances calling `plain_add` (a stub of its own) through BLS.
No sleep synchronizes anything: the models wait on events and barriers with timeouts, the test
polls conditions.
"""

import json
import os
import queue
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import http_raw, managed_server, wait_until

SHARED = 'parameters { key: "SHARED_STUB_PROCESS" value: { string_value: "true" } }'

ECHO = textwrap.dedent("""
    import json, os, threading
    import numpy as np
    import triton_python_backend_utils as pb_utils
    import sync_point  # 1/sync_point.py: one module per process, shared by its instances

    class TritonPythonModel:
        def initialize(self, args):
            self.instance = args["model_instance_name"]
            self.dir = args["model_repository"]
            record = {k: args[k] for k in (
                "model_instance_name", "model_instance_kind", "model_instance_device_id")}
            record.update(pid=os.getpid(), thread=threading.get_ident(), model=id(self))
            path = os.path.join(self.dir, "init_" + self.instance)
            with open(path + ".tmp", "w") as f:
                json.dump(record, f)
            os.rename(path + ".tmp", path + ".json")
            pb_utils.Logger.log_info("initialized " + self.instance)
            self.calls = pb_utils.MetricFamily(
                name="shared_echo_calls", description="executions by instance",
                kind=pb_utils.MetricFamily.COUNTER).Metric(labels={"instance": self.instance})

        def execute(self, requests):
            out = []
            for r in requests:
                x = int(pb_utils.get_input_tensor_by_name(r, "x").as_numpy()[0])
                if x == 1:
                    sync_point.BARRIER.wait(timeout=60)
                elif x == 2:
                    sync_point.ENTERED.set()
                    sync_point.RELEASE.wait(timeout=120)
                elif x == 666 and sync_point.ENTERED.wait(timeout=60):
                    os._exit(3)
                self.calls.increment(1)
                out.append(pb_utils.InferenceResponse([
                    pb_utils.Tensor("pid", np.array([os.getpid()], np.int64)),
                    pb_utils.Tensor("instance", np.array([self.instance.encode()], np.object_))]))
            return out

        def finalize(self):
            open(os.path.join(self.dir, "finalized_" + self.instance), "w").close()
    """)

SYNC_POINT = textwrap.dedent("""
    import threading

    BARRIER = threading.Barrier(2)
    ENTERED = threading.Event()
    RELEASE = threading.Event()
    """)

STREAM = textwrap.dedent("""
    import threading
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.instance = args["model_instance_name"]

        def execute(self, requests):
            for r in requests:
                n = int(pb_utils.get_input_tensor_by_name(r, "n").as_numpy()[0])
                threading.Thread(target=self.stream, args=(r.get_response_sender(), n)).start()

        def stream(self, sender, n):
            for i in range(n):
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("i", np.array([i], np.int32)),
                    pb_utils.Tensor("instance", np.array([self.instance.encode()], np.object_))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    """)

BLS = textwrap.dedent("""
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            out = []
            for r in requests:
                x = pb_utils.get_input_tensor_by_name(r, "x")
                answer = pb_utils.InferenceRequest(
                    model_name="plain_add", inputs=[pb_utils.Tensor("x", x.as_numpy())],
                    requested_output_names=["y"]).exec()
                if answer.has_error():
                    raise pb_utils.TritonModelException(answer.error().message())
                y = pb_utils.get_output_tensor_by_name(answer, "y").as_numpy()
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y * 10)]))
            return out
    """)

PLAIN_ADD = textwrap.dedent("""
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy() + 1)]) for r in requests]
    """)

ECHO_IO = """
    input [ { name: "x" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "pid" data_type: TYPE_INT64 dims: [ 1 ] },
             { name: "instance" data_type: TYPE_STRING dims: [ 1 ] } ]"""
ADD_IO = """
    input [ { name: "x" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "y" data_type: TYPE_INT32 dims: [ 1 ] } ]"""


def config(name, io, group, extra=""):
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n{io}\n'
            f"instance_group [ {group} ]\n{extra}\n")


MODELS = {
    "shared_echo": (ECHO, config("shared_echo", ECHO_IO, "{ count: 2 kind: KIND_CPU }", SHARED)),
    "shared_gpu": (ECHO, config("shared_gpu", ECHO_IO, "{ count: 2 kind: KIND_GPU gpus: [ 0 ] }",
                                SHARED)),
    "shared_capped": (ECHO, config("shared_capped", ECHO_IO, "{ count: 3 kind: KIND_CPU }",
                                   SHARED.replace('"true"', '"2"'))),
    "shared_stream": (STREAM, config("shared_stream", """
        input [ { name: "n" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "i" data_type: TYPE_INT32 dims: [ 1 ] },
                 { name: "instance" data_type: TYPE_STRING dims: [ 1 ] } ]""",
                                     "{ count: 2 kind: KIND_CPU }",
                                     SHARED + "\nmodel_transaction_policy { decoupled: true }")),
    "shared_bls": (BLS, config("shared_bls", ADD_IO, "{ count: 2 kind: KIND_CPU }", SHARED)),
    "plain_add": (PLAIN_ADD, config("plain_add", ADD_IO, "{ count: 1 kind: KIND_CPU }")),
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("shared_repo")
    for name, (code, cfg) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(code)
        (repo / name / "1" / "sync_point.py").write_text(SYNC_POINT)
        (repo / name / "config.pbtxt").write_text(cfg)
    return repo


@pytest.fixture(scope="module")
def server(repo, tmp_path_factory):
    args = ["--model-control-mode", "explicit", "--load-model", "*"]
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), args, "server_shared_stub")


def init_records(repo, model, not_pid=None, count=2):
    """The instances' `initialize` records, once all `count` exist (and show another pid than
    `not_pid`)."""
    def ready():
        records = {}
        for path in Path(repo / model).glob("init_*.json"):
            record = json.loads(path.read_text())
            records[record["model_instance_name"]] = record
        if len(records) == count and all(r["pid"] != not_pid for r in records.values()):
            return records
        return None
    return wait_until(ready, 60, f"{model}'s {count} initialize records")


def echo(server, x):
    client = httpclient.InferenceServerClient(server.http_url, network_timeout=300)
    inp = httpclient.InferInput("x", [1], "INT32")
    inp.set_data_from_numpy(np.array([x], np.int32))
    result = client.infer("shared_echo", [inp])
    return int(result.as_numpy("pid")[0]), result.as_numpy("instance")[0].decode()


def concurrently(*calls):
    """Runs the calls on threads; their results or exceptions, in order."""
    results = [None] * len(calls)

    def run(i, call):
        try:
            results[i] = call()
        except Exception as e:  # the caller asserts on it
            results[i] = e

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    return results


def stub_command_line(pid):
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]


def parent_pid(pid):
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))


def test_instances_share_one_process_each_with_its_own_initialize(server, repo):
    for model, kind in (("shared_echo", "CPU"), ("shared_gpu", "GPU")):
        records = init_records(repo, model)
        names = sorted(records)
        assert names == [f"{model}_0_0", f"{model}_0_1"]
        assert {r["model_instance_kind"] for r in records.values()} == {kind}
        assert {r["model_instance_device_id"] for r in records.values()} == {"0"}
        pids = {r["pid"] for r in records.values()}
        assert len(pids) == 1, records
        assert len({r["thread"] for r in records.values()}) == 2, "each instance has its thread"
        assert len({r["model"] for r in records.values()}) == 2, "each its TritonPythonModel"
        (pid,) = pids
        assert parent_pid(pid) == server.proc.pid
        line = stub_command_line(pid)
        assert line[-3].endswith(b"nereid_stub.py") and line[-1] == b"2", line
    log = server.log_tail(200000)
    for instance in ("shared_echo_0_0", "shared_echo_0_1"):
        assert f"initialized {instance}" in log, "each instance logs as itself"


def test_a_count_caps_the_instances_per_process(server, repo):
    records = init_records(repo, "shared_capped", count=3)
    pid = {name: r["pid"] for name, r in records.items()}
    assert pid["shared_capped_0_0"] == pid["shared_capped_0_1"] != pid["shared_capped_0_2"]
    assert stub_command_line(pid["shared_capped_0_0"])[-1] == b"2"
    assert stub_command_line(pid["shared_capped_0_2"])[-1] == b"1"


def test_executions_of_two_instances_overlap(server, repo):
    # Each request waits at a barrier for the other: both finish only if they run at once.
    first, second = concurrently(lambda: echo(server, 1), lambda: echo(server, 1))
    assert not isinstance(first, Exception), first
    assert not isinstance(second, Exception), second
    assert first[0] == second[0], "one process"
    assert {first[1], second[1]} == {"shared_echo_0_0", "shared_echo_0_1"}
    status, _, body = http_raw(f"127.0.0.1:{server.metrics_port}", "GET", "/metrics")
    assert status == 200
    text = body.decode()
    for instance in ("shared_echo_0_0", "shared_echo_0_1"):
        assert f'shared_echo_calls{{instance="{instance}"}} 1' in text, "metrics per instance"


def test_a_crash_fails_every_instance_in_flight_and_restarts_them_together(server, repo):
    old_pid = next(iter(init_records(repo, "shared_echo").values()))["pid"]
    # 666 crashes the process once the request 2 is inside execute on the other instance.
    waiting, crashing = concurrently(lambda: echo(server, 2), lambda: echo(server, 666))
    for failed in (waiting, crashing):
        assert isinstance(failed, InferenceServerException), failed
        assert "is not healthy" in str(failed) and "exited with status 3" in str(failed), failed
    assert {n for n in ("shared_echo_0_0", "shared_echo_0_1")
            if any(f"Stub process '{n}'" in str(f) for f in (waiting, crashing))} == {
        "shared_echo_0_0", "shared_echo_0_1"}, "each request names its own instance"
    client = httpclient.InferenceServerClient(server.http_url)
    wait_until(lambda: client.is_model_ready("shared_echo"), 60, "shared_echo ready again")
    records = init_records(repo, "shared_echo", not_pid=old_pid)
    new_pids = {r["pid"] for r in records.values()}
    assert len(new_pids) == 1, records
    first, second = concurrently(lambda: echo(server, 1), lambda: echo(server, 1))
    assert {first[0], second[0]} == new_pids, (first, second)
    log = server.log_tail(400000)
    assert "the shared Python stub process died; restarting it with its instances" in log
    assert "shared Python stub process restarted" in log


def test_a_decoupled_model_streams_from_threads_it_starts(server):
    client = grpcclient.InferenceServerClient(server.grpc_url)
    results = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for request_id in ("a", "b"):
            inp = grpcclient.InferInput("n", [1], "INT32")
            inp.set_data_from_numpy(np.array([3], np.int32))
            client.async_stream_infer("shared_stream", [inp], request_id=request_id)
        got = {}
        for _ in range(6):
            result, error = results.get(timeout=60)
            assert error is None, error
            response = result.get_response()
            got.setdefault(response.id, []).append(int(result.as_numpy("i")[0]))
            assert result.as_numpy("instance")[0].decode().startswith("shared_stream_0_")
    finally:
        client.stop_stream()
    assert got == {"a": [0, 1, 2], "b": [0, 1, 2]}


def test_bls_from_shared_instances(server):
    def call(x):
        client = httpclient.InferenceServerClient(server.http_url)  # one per thread
        inp = httpclient.InferInput("x", [1], "INT32")
        inp.set_data_from_numpy(np.array([x], np.int32))
        return int(client.infer("shared_bls", [inp]).as_numpy("y")[0])

    assert concurrently(lambda: call(4), lambda: call(5)) == [50, 60]


def test_unload_finalizes_every_instance_and_the_process_exits(server, repo):
    pid = next(iter(init_records(repo, "shared_echo").values()))["pid"]
    httpclient.InferenceServerClient(server.http_url).unload_model("shared_echo")
    for instance in ("shared_echo_0_0", "shared_echo_0_1"):
        wait_until(lambda: (repo / "shared_echo" / f"finalized_{instance}").exists(), 60,
                   f"{instance} finalized")
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 60, "the shared process gone")
