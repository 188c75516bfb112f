"""Processes of a local cluster for the end-to-end suite: control-plane nodes, workers, and the
management REST API they serve. Everything binds 127.0.0.1 on free ports and logs to a file."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from nereid_util import (NEREID_BIN, SERVERS, _die_with_parent, free_port, http_json, http_raw,
                         loopback_listen_args, wait_until)

TOKEN = "cluster-test-token"
AUTH = {"authorization": f"Bearer {TOKEN}"}
# Short timeouts keep failure tests quick; every wait below is bounded.
HEARTBEAT_MS = 200
HEARTBEAT_TIMEOUT_MS = 1500


class Process:
    """A nereid subcommand process logging to `<workdir>/<name>.log` (restartable)."""

    def __init__(self, name, workdir, args):
        self.name = name
        self.args = [NEREID_BIN, *args]
        self.log_path = Path(workdir) / f"{name}.log"
        self.proc = None
        self._log = None
        # Set once the test stops or kills it, or once a failure report has shown its death.
        self.stopped = False

    def spawn(self):
        if not os.access(NEREID_BIN, os.X_OK):
            raise AssertionError(f"binary {NEREID_BIN} missing (set NEREID_BIN or build it)")
        self._log = open(self.log_path, "ab")
        self.stopped = False
        env = dict(os.environ)
        env.setdefault("NEREID_PYTHON", sys.executable)
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                                     env=env)
        if self not in SERVERS:
            SERVERS.append(self)
        return self

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self):
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}\n"
                                 f"{self.log_tail()}")

    def kill(self):
        """SIGKILL: no chance to clean up, like a crashed machine."""
        self.stopped = True
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._close()

    def stop(self, deadline_s=30):
        """SIGTERM and wait; returns the exit code."""
        self.stopped = True
        if not self.alive():
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=deadline_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not exit within {deadline_s}s of SIGTERM\n"
                                 f"{self.log_tail()}")
        finally:
            self._close()

    def _close(self):
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, limit=6000):
        try:
            return self.log_path.read_bytes()[-limit:].decode("utf-8", "replace")
        except OSError:
            return "(no log)"


class KServeProcess(Process):
    """A process serving KServe v2 on `http_port` / `grpc_port` (a worker or a router)."""

    @property
    def http_url(self):
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self):
        return f"127.0.0.1:{self.grpc_port}"

    def wait_live(self, deadline_s=60):
        def live():
            self.check_alive()
            return http_raw(self.http_url, "GET", "/v2/health/live", timeout=2)[0] == 200
        wait_until(live, deadline_s, f"{self.name} live")


class ControlPlaneNode(Process):
    def __init__(self, node_id, workdir, token_file, peers=None, extra=()):
        self.node_id = node_id
        self.grpc_port = peers[node_id] if peers else free_port()
        self.http_port = free_port()
        self.data_dir = Path(workdir) / f"cp{node_id}-data"
        args = ["control-plane",
                "--node-id", str(node_id),
                "--listen", f"127.0.0.1:{self.grpc_port}",
                "--http-listen", f"127.0.0.1:{self.http_port}",
                "--data-dir", str(self.data_dir),
                "--auth-token-file", str(token_file),
                "--heartbeat-interval-ms", str(HEARTBEAT_MS),
                "--heartbeat-timeout-ms", str(HEARTBEAT_TIMEOUT_MS),
                "--log-verbose", "1",
                *extra]
        if peers:
            args += ["--peers", ",".join(f"{i}=127.0.0.1:{p}" for i, p in sorted(peers.items()))]
        super().__init__(f"cp{node_id}", workdir, args)

    @property
    def grpc_addr(self):
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_addr(self):
        return f"127.0.0.1:{self.http_port}"

    def api(self, method, path, body=None, auth=True):
        self.check_alive()
        return http_json(self.http_addr, method, path, body, AUTH if auth else None)

    def status(self):
        code, body = self.api("GET", "/api/v1/cluster")
        assert code == 200, (code, body)
        return body


class WorkerProcess(KServeProcess):
    def __init__(self, node_id, workdir, token_file, control_planes):
        self.node_id = node_id
        self.http_port, self.grpc_port, self.metrics_port = free_port(), free_port(), free_port()
        args = ["worker",
                "--control-plane", ",".join(control_planes),
                "--node-id", node_id,
                "--auth-token-file", str(token_file),
                "--heartbeat-interval-ms", str(HEARTBEAT_MS),
                "--work-dir", str(Path(workdir) / f"{node_id}-work"),
                *loopback_listen_args(self.http_port, self.grpc_port, self.metrics_port),
                "--log-verbose", "1"]
        super().__init__(node_id, workdir, args)



def write_token(workdir):
    path = Path(workdir) / "token"
    path.write_text(TOKEN + "\n")
    return path


def leader_of(nodes, deadline_s=30):
    """The node that all live nodes agree leads; waits for an election."""
    live = [n for n in nodes if n.alive()]

    def agreed():
        ids = set()
        for n in live:
            code, body = http_json(n.http_addr, "GET", "/api/v1/cluster", None, AUTH)
            if code != 200 or not body.get("leader_id"):
                return None
            ids.add(body["leader_id"])
        if len(ids) != 1:
            return None
        leader_id = ids.pop()
        return next((n for n in live if n.node_id == leader_id), None)

    return wait_until(agreed, deadline_s, "an agreed control-plane leader")


def model_body(name, source_dir, replicas=1, memory=64 << 20):
    """A DeployModel body; a model served under another name than its directory's (whose
    config.pbtxt names the directory) is renamed consistently with a config override, as the
    control plane refuses a config that names another model."""
    body = {
        "name": name,
        "source": f"file://{source_dir}",
        "version_policy": {"latest": {"num_versions": 1}},
        "min_replicas": replicas,
        "max_replicas": replicas,
        "resources": {"memory_bytes": memory},
    }
    if Path(source_dir).name != name:
        body["config_override"] = json.dumps({"name": name})
    return body


def replicas(node, model):
    code, body = node.api("GET", f"/api/v1/models/{model}?consistency=linearizable")
    assert code == 200, (code, body)
    return body.get("replicas", [])


def wait_replicas(node, model, predicate, what, deadline_s=60):
    return wait_until(lambda: (lambda r: r if predicate(r) else None)(replicas(node, model)),
                      deadline_s, f"{model}: {what}")


def since(t0):
    return f"{time.monotonic() - t0:.1f}s"


class RouterProcess(KServeProcess):
    """`ports`: (http, grpc, metrics) to listen on, e.g. another router's with --reuse-port;
    free ports when not given."""

    def __init__(self, workdir, token_file, control_planes, name="router", extra=(), ports=None):
        self.http_port, self.grpc_port, self.metrics_port = (
            ports or (free_port(), free_port(), free_port()))
        args = ["router",
                "--control-plane", ",".join(control_planes),
                "--auth-token-file", str(token_file),
                *loopback_listen_args(self.http_port, self.grpc_port, self.metrics_port),
                "--log-verbose", "1", *extra]
        super().__init__(name, workdir, args)



# ---------------------------------------------------------------------------------------------
# Load through the router (nereid-loadtest) and what each worker served



LOADTEST_BIN = os.environ.get("NEREID_LOADTEST_BIN",
                              str(Path(NEREID_BIN).with_name("nereid-loadtest")))


class LoadtestRun:
    """`nereid-loadtest` in the background: a closed loop at `concurrency` against `url` for
    `duration_s` seconds (`--duration-secs`, no warm-up).

    Its JSON's `requests_total` / `errors_total` / `first_errors` count every request of the
    run, including those in flight when it ends (awaited, see docs/loadtest.md), so a fault
    test reads them rather than the windows' `requests` / `errors`."""

    def __init__(self, workdir, name, url, model, protocol="grpc", concurrency=4,
                 duration_s=3.0):
        self.name = name
        self.json_path = Path(workdir) / f"{name}.json"
        self.out_path = Path(workdir) / f"{name}.out"
        self.duration_s = duration_s
        self.args = [LOADTEST_BIN, "-m", model, "-i", protocol, "-u", url,
                     "--concurrency-range", str(concurrency), "-p", "1000",
                     "--duration-secs", str(duration_s), "--warmup-secs", "0",
                     "--request-timeout-secs", "10", "--json", str(self.json_path), "-q"]
        self.proc = None

    def start(self):
        if not os.access(LOADTEST_BIN, os.X_OK):
            raise AssertionError(f"{LOADTEST_BIN} missing (set NEREID_LOADTEST_BIN or build it)")
        self._out = open(self.out_path, "wb")
        self.proc = subprocess.Popen(self.args, stdout=self._out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        return self

    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def result(self, slack_s=30):
        """Waits for the run to end; returns its one level object (`requests_total` sent,
        `errors_total` of them failed, `first_errors` the first distinct failures)."""
        try:
            rc = self.proc.wait(timeout=self.duration_s + slack_s)
        finally:
            self.stop()
        output = self.out_path.read_text(errors="replace")
        assert rc == 0, f"{self.name}: nereid-loadtest exited with {rc}\n{output}"
        levels = json.loads(self.json_path.read_text())
        assert len(levels) == 1, levels
        level = levels[0]
        level["output"] = output
        return level

    def stop(self):
        if self.running():
            self.proc.kill()
            self.proc.wait(timeout=10)
        if getattr(self, "_out", None) is not None:
            self._out.close()
            self._out = None


def inference_count(server, model):
    """The model's `inference_count` in `server`'s own statistics (0 when it has none)."""
    code, body = http_json(server.http_url, "GET", f"/v2/models/{model}/stats")
    if code != 200:
        return 0
    return sum(s.get("inference_count", 0) for s in body.get("model_stats", []))


def node_status(cp, node_id):
    code, body = cp.api("GET", f"/api/v1/nodes/{node_id}")
    assert code == 200, (code, body)
    return body["node"]["status"]
