"""The real Triton server (2.51.0, CPU, Python backend) as a test oracle.

`make triton-ref` (scripts/triton_ref.sh) installs it under .venv-triton/; NEREID_TRITON selects
another wrapper. A `TritonServer` is managed like a Nereid `Server` (free loopback ports, a log
file, SIGTERM on stop); `pair` starts both servers on copies of one repository with the same flags.
"""

import os
import shutil
from pathlib import Path

from nereid_util import ROOT, Server, http_raw, loopback_listen_args, wait_until

TRITON_BIN = os.environ.get("NEREID_TRITON", str(ROOT / ".venv-triton/tritonserver"))
READY_DEADLINE_S = 90.0


class TritonServer(Server):
    """One `tritonserver` process on free 127.0.0.1 ports."""

    def __init__(self, repo, workdir, extra_args=(), name="triton"):
        super().__init__(repo, workdir, (), name=name)
        self.args = [
            TRITON_BIN,
            "--model-repository", str(self.repo),
            *loopback_listen_args(self.http_port, self.grpc_port, self.metrics_port),
            "--exit-timeout-secs", "10",
            *extra_args,
        ]

    def environment(self):
        return dict(os.environ)


def nereid_like_triton(repo, workdir, extra_args=(), name="nereid"):
    """A Nereid server started with exactly the flags given (no test-suite defaults), as a
    Triton user would start it."""
    return Server(repo, workdir, extra_args, name=name, suite_defaults=False)


def start_pair(repo, workdir, extra_args=()):
    """Nereid and Triton on two copies of `repo` (each may load and unload on its own), both
    ready. Returns (nereid, triton)."""
    workdir = Path(workdir)
    servers = []
    # Triton 2.51 always serves client shared memory; Nereid, like newer Triton, only with
    # --allow-client-shm.
    flags = {"nereid": [*extra_args, "--allow-client-shm=true"], "triton": list(extra_args)}
    for kind, make in (("nereid", nereid_like_triton), ("triton", TritonServer)):
        copy = workdir / f"repo_{kind}"
        shutil.copytree(repo, copy)
        servers.append(make(copy, workdir, flags[kind], name=kind).start())
    for s in servers:
        wait_until(lambda s=s: http_raw(s.http_url, "GET", "/v2/health/ready")[0] == 200,
                   READY_DEADLINE_S, f"{s.name} ready")
    return tuple(servers)
