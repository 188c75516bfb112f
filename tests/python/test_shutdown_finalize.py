"""Shutdown waits for the Python stubs: on SIGTERM every model is unloaded, each stub runs
`finalize()` and exits before the server does; a stub still running at `--exit-timeout-secs`
is killed and reaped, and the server then exits non-zero naming it. No stub process and no
`/dev/shm/nereid-py-<server pid>-*` directory outlives the server.
"""

import glob
import os
import textwrap
import time

from nereid_util import Server, wait_until

CONFIG = textwrap.dedent("""
    name: "{name}"
    backend: "python"
    max_batch_size: 0
    input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
    instance_group [ { count: 1 kind: KIND_CPU } ]
    """)

# `initialize` writes the stub's pid; `finalize` runs FINALIZE_BODY.
MODEL = textwrap.dedent("""
    import os, time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            self.dir = args["model_repository"]
            with open(os.path.join(self.dir, "pid.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.rename(os.path.join(self.dir, "pid.tmp"), os.path.join(self.dir, "pid"))

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.Tensor(
                "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]) for r in requests]

        def finalize(self):
    """)

SLOW_FINALIZE = """\
        time.sleep(2)
        with open(os.path.join(self.dir, "finalized"), "w") as f:
            f.write("done")
"""

HUNG_FINALIZE = """\
        while True:
            time.sleep(1)
"""


def write_model(repo, name, finalize_body):
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(MODEL + finalize_body)
    (model_dir / "config.pbtxt").write_text(CONFIG.replace("{name}", name))
    return model_dir


def start(repo, tmp_path, model_dir, extra_args=()):
    """A server of `repo`, once the stub of `model_dir` has written its pid: (server, pid)."""
    server = Server(repo, tmp_path, list(extra_args), name=f"server_{model_dir.name}").start()
    pid = int(wait_until(lambda: (model_dir / "pid").read_text(), 30, "the stub's pid file"))
    os.kill(pid, 0)  # the stub runs
    return server, pid


def assert_gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    raise AssertionError(f"stub process {pid} still exists after the server exited")


def segment_dirs(server_pid):
    return glob.glob(f"/dev/shm/nereid-py-{server_pid}-*")


def test_sigterm_waits_for_finalize(tmp_path):
    repo = tmp_path / "repo"
    model_dir = write_model(repo, "slow_finalize", SLOW_FINALIZE)
    server, pid = start(repo, tmp_path, model_dir)
    try:
        server_pid = server.proc.pid
        assert segment_dirs(server_pid), "the stub has a shared-memory directory while it runs"
        start_s = time.monotonic()
        rc = server.stop(deadline_s=30)
        elapsed = time.monotonic() - start_s
        # The marker is written at the end of the 2 s finalize: the server waited for it.
        assert (model_dir / "finalized").exists(), (
            f"server exited after {elapsed:.1f}s, before finalize finished\n{server.log_tail()}")
        assert rc == 0, f"exit code {rc}\n{server.log_tail()}"
        assert elapsed >= 1.5, elapsed
        assert_gone(pid)
        assert segment_dirs(server_pid) == []
    finally:
        server.kill()


def test_hung_finalize_is_killed_at_the_exit_timeout(tmp_path):
    repo = tmp_path / "repo"
    model_dir = write_model(repo, "hung_finalize", HUNG_FINALIZE)
    server, pid = start(repo, tmp_path, model_dir, ["--exit-timeout-secs", "2"])
    try:
        server_pid = server.proc.pid
        start_s = time.monotonic()
        rc = server.stop(deadline_s=30)
        elapsed = time.monotonic() - start_s
        log = server.log_tail(20000)
        assert rc != 0, f"exit code {rc} although a stub had to be killed\n{log}"
        assert 1.5 <= elapsed < 12, f"exited after {elapsed:.1f}s\n{log}"
        assert "hung_finalize" in log and "kill" in log, log
        assert_gone(pid)
        assert segment_dirs(server_pid) == []
    finally:
        server.kill()


def test_worker_sigterm_waits_for_finalize(tmp_path):
    """`nereid worker` shuts down the same way: the model the control plane placed on it is
    finalized before the worker exits."""
    from cluster_util import WorkerProcess, model_body, wait_replicas
    from test_cluster import start_control_plane, stop_all

    source = tmp_path / "models"
    model_dir = write_model(source, "worker_finalize", SLOW_FINALIZE)
    token, (cp,) = start_control_plane(tmp_path, n=1)
    worker = WorkerProcess("w1", tmp_path, token, [cp.grpc_addr])
    try:
        worker.spawn()
        worker.wait_live()
        code, body = cp.api("POST", "/api/v1/models", model_body("worker_finalize", model_dir))
        assert code == 200, (code, body)
        wait_replicas(cp, "worker_finalize", lambda r: any(x.get("state") == "REPLICA_STATE_READY" for x in r),
                      "a ready replica")
        pid = int(wait_until(lambda: (model_dir / "pid").read_text(), 30, "the stub's pid file"))
        worker_pid = worker.proc.pid
        rc = worker.stop(deadline_s=30)
        assert (model_dir / "finalized").exists(), (
            f"worker exited before finalize finished\n{worker.log_tail()}")
        assert rc == 0, f"exit code {rc}\n{worker.log_tail()}"
        assert_gone(pid)
        assert segment_dirs(worker_pid) == []
    finally:
        stop_all([worker, cp])
