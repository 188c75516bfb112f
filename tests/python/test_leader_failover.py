"""Control-plane leader failover, timed, over real processes on 127.0.0.1: three control-plane
nodes with the default Raft timings, a worker and a router under load. The leader is SIGKILLed
a few times (restarted in between); each time a management write is retried until one is
acknowledged, through the REST API of the survivors or through `nereid ctl` given every address
with the dead leader first, and the time from the kill to that acknowledgement is printed.
Inference through the router fails no request meanwhile. The bound asserted is a generous
correctness bound (no multi-second stall); the speed target itself (under 1 s on loopback) is
measured and recorded in docs/cluster.md."""

import json
import statistics
import subprocess
import time

import pytest

from cluster_util import (AUTH, LoadtestRun, RouterProcess, WorkerProcess, leader_of,
                          model_body, wait_replicas)
from nereid_util import NEREID_BIN, gen_models, http_json, wait_until
from test_cluster import model_names, start_control_plane, stop_all

# Alternately through REST and ctl.
KILLS = 4
# Correctness bound, not the target: the default timings fail over in well under a second on
# loopback (about 0.6 s), and the former 250 ms / 1000-2000 ms timings took 3.0-3.6 s.
FAILOVER_BOUND_S = 5.0
READY = "REPLICA_STATE_READY"


def rest_write(survivors, source, name, attempt):
    """One POST of a model to a survivor (in turn); None when acknowledged, else why not. The
    node itself waits for a leader (up to its leader wait) before it answers 503."""
    node = survivors[attempt % len(survivors)]
    try:
        code, body = http_json(node.http_addr, "POST", "/api/v1/models",
                               model_body(name, source), AUTH)
    except OSError as e:
        return e
    return None if code == 200 else (node.node_id, code, body)


def ctl_write(addresses, token, source, name):
    """One `nereid ctl models deploy` over every address in order (a refused or UNAVAILABLE
    node passes to the next); None when acknowledged, else why not."""
    out = subprocess.run(
        [NEREID_BIN, "ctl", "--control-plane", ",".join(addresses), "--token-file", str(token),
         "models", "deploy", name, "--source", f"file://{source}", "--replicas", "1",
         "--memory", str(64 << 20), "--config-override", json.dumps({"name": name})],
        capture_output=True, text=True, timeout=30)
    return None if out.returncode == 0 else (out.returncode, out.stderr.strip())


def until_acknowledged(write, what, deadline_s):
    """Retries `write(attempt)` until it is acknowledged, bounded; returns the attempts made."""
    end = time.monotonic() + deadline_s
    attempt = 0
    last = None
    while time.monotonic() < end:
        last = write(attempt)
        attempt += 1
        if last is None:
            return attempt
    raise AssertionError(f"{what} not acknowledged within {deadline_s}s; last: {last!r}")


@pytest.mark.timeout(240)
def test_a_sigkilled_leader_is_replaced_and_writes_resume_quickly(tmp_path):
    repo = gen_models.write_repository(tmp_path / "repo", "example")
    token, cps = start_control_plane(tmp_path)
    addrs = [cp.grpc_addr for cp in cps]
    worker = WorkerProcess("w1", tmp_path, token, addrs)
    router = RouterProcess(tmp_path, token, addrs)
    processes = [*cps, worker, router]
    try:
        leader = leader_of(cps)
        for p in (worker, router):
            p.spawn()
        for p in (worker, router):
            p.wait_live()
        code, body = leader.api("POST", "/api/v1/models", model_body("simple", repo / "simple"))
        assert code == 200, (code, body)
        wait_replicas(leader, "simple", lambda r: [x["state"] for x in r] == [READY],
                      "a ready replica")

        written = ["simple"]
        timings = []
        for kill in range(KILLS):
            leader = leader_of(cps)
            old_term = leader.status()["term"]
            survivors = [cp for cp in cps if cp is not leader]
            load = LoadtestRun(tmp_path, f"load_kill{kill}", router.grpc_url, "simple",
                               concurrency=2, duration_s=2.5).start()
            name = f"after_kill_{kill}"

            via = "rest" if kill % 2 == 0 else "ctl"
            if via == "rest":
                def write(attempt):
                    return rest_write(survivors, repo / "simple", name, attempt)
            else:
                dead_first = [leader.grpc_addr, *(cp.grpc_addr for cp in survivors)]

                def write(attempt):
                    return ctl_write(dead_first, token, repo / "simple", name)

            t0 = time.monotonic()
            leader.kill()
            attempts = until_acknowledged(write, f"write '{name}' ({via})",
                                          FAILOVER_BOUND_S * 4)
            elapsed = time.monotonic() - t0
            written.append(name)
            timings.append(elapsed)
            print(f"failover {kill + 1}/{KILLS}: SIGKILL of leader {leader.node_id} to the "
                  f"first acknowledged write through {via}: {elapsed * 1000:.0f} ms "
                  f"({attempts} attempt(s))")

            new_leader = leader_of(survivors)
            assert new_leader.status()["term"] > old_term
            level = load.result()
            assert level["errors_total"] == 0, (
                f"kill {kill + 1}: {level['errors_total']} failed inference(s) of "
                f"{level['requests_total']} through the router during the failover; first "
                f"errors: {level['first_errors']}\n{level['output']}")
            assert level["requests_total"] > 0, level

            # Back to three nodes before the next kill, the restarted one caught up.
            leader.spawn()
            wait_until(lambda n=leader: model_names(n, "local") == sorted(written), 30,
                       f"node {leader.node_id} restarted and caught up")

        median = statistics.median(timings)
        print(f"leader failover to the first acknowledged write: median {median * 1000:.0f} ms "
              f"of {KILLS} kills ({', '.join(f'{t * 1000:.0f}' for t in timings)} ms)")
        slow = [t for t in timings if t >= FAILOVER_BOUND_S]
        assert not slow, (f"failover took {slow} s, over the {FAILOVER_BOUND_S} s bound: a "
                          f"multi-second stall is back (all: {timings})")
    finally:
        stop_all(processes)
