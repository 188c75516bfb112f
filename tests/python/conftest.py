"""Session fixtures: a generated test model repository and `nereid serve` processes on it.

NEREID_BIN selects the server binary (default target/release/nereid). Each server logs to a file
under pytest's tmp dir; the tail of every server log is attached to failing test reports.
"""

import os

# Before grpc is imported: the suite forks servers (subprocess with preexec_fn) while grpcio
# channels and servers are live, and grpcio's fork handlers (1.81+) can abort the child before
# it execs ("epoll_wait error: Bad file descriptor", exit -6). Fork-then-exec needs none of them.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import pytest  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402

from nereid_util import SERVERS, gen_models, managed_server  # noqa: E402


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        # Running servers, and those that died on their own (not stopped by the suite), whose
        # log tail usually says why the test failed.
        for s in [s for s in SERVERS if s.proc is not None and not s.stopped]:
            state = "running" if s.proc.poll() is None else f"exited with {s.proc.returncode}"
            report.sections.append((f"server log: {s.name}, {state} ({s.log_path})",
                                    s.log_tail()))
            s.stopped = s.proc.poll() is not None


@pytest.fixture(scope="session")
def test_repo(tmp_path_factory):
    return gen_models.write_repository(tmp_path_factory.mktemp("repo_none"), "test")


@pytest.fixture(scope="session")
def server(test_repo, tmp_path_factory):
    """Default (`none` control mode) server on the full test repository."""
    yield from managed_server(test_repo, tmp_path_factory.mktemp("logs"), [], "server_none")


@pytest.fixture(scope="session")
def explicit_server(tmp_path_factory):
    """Explicit control mode, everything loaded at start, on its own copy of the repository."""
    repo = gen_models.write_repository(tmp_path_factory.mktemp("repo_explicit"), "test")
    args = ["--model-control-mode", "explicit", "--load-model", "*"]
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), args, "server_explicit")


@pytest.fixture
def http_client(server):
    c = httpclient.InferenceServerClient(server.http_url, network_timeout=60)
    yield c
    c.close()


@pytest.fixture
def grpc_client(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    yield c
    c.close()


@pytest.fixture
def model_path(test_repo):
    """model_path(name, version=1) -> path of that model's model.onnx."""
    return lambda name, version=1: test_repo / name / str(version) / "model.onnx"
