"""The real nereid_stub.py as a shared stub process (`nereid_stub.py SOCK 2`, model parameter
SHARED_STUB_PROCESS) against the pure-Python parent: each member is a FakeParent over its own
three connections. Checks what the server relies on: one process, a Stub per member with its own
`initialize` args, threads and log channel; executions of two members overlapping; a member's
`finalize` ending only that member and the last member's end ending the process; `sys.exit` in
one member ending every member.
"""

import json
import os
import socket
import subprocess

import numpy as np
import pytest

from fake_parent import PROTOCOL_VERSION, PYTHON, READ_TIMEOUT_S, STUB, STUB_CORE_DIR, STUB_DIR, FakeParent

MEMBERS = 2

MODEL = """
    import os, sys, threading
    import numpy as np
    import triton_python_backend_utils as pb_utils
    import sync_point  # one module per process: both members meet here

    class TritonPythonModel:
        def initialize(self, args):
            self.name = args["model_instance_name"]
            pb_utils.Logger.log_info("init {} {} {}".format(self.name, os.getpid(), threading.get_ident()))
            started = threading.Thread(target=pb_utils.Logger.log_info, args=("thread of " + self.name,))
            started.start()
            started.join()

        def execute(self, requests):
            out = []
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                if x[0] == 1:
                    sync_point.BARRIER.wait(timeout=30)
                elif x[0] == 3:
                    sys.exit(3)
                out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
            return out

        def finalize(self):
            pb_utils.Logger.log_info("finalize " + self.name)
"""

SYNC_POINT = "import threading\nBARRIER = threading.Barrier(2)\n"


@pytest.fixture
def members(tmp_path):
    """Two members of one shared stub process, each a FakeParent over its connections."""
    sock_path = str(tmp_path / "stub.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(3 * MEMBERS)
    listener.settimeout(READ_TIMEOUT_S)
    stderr_path = tmp_path / "stub.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(STUB_DIR), STUB_CORE_DIR]))
    with open(stderr_path, "wb") as log:
        proc = subprocess.Popen([PYTHON, "-u", str(STUB), sock_path, str(MEMBERS)], cwd=str(tmp_path),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
    parents = []
    try:
        for index in range(MEMBERS):
            p = FakeParent.__new__(FakeParent)
            p.workdir, p.prefix = tmp_path, str(tmp_path / "shm{}-".format(index))
            p.logs, p.released, p._free_segments, p._bls_queue = [], [], [], []
            p._segment_counter = 0
            p.stderr_path, p.proc = stderr_path, proc
            p.commands, p.conn, p.events = (listener.accept()[0] for _ in range(3))
            for sock in (p.commands, p.conn, p.events):
                sock.settimeout(READ_TIMEOUT_S)
            parents.append(p)
    finally:
        listener.close()
    model_file = parents[0].write_model(MODEL)
    (tmp_path / "model" / "1" / "sync_point.py").write_text(SYNC_POINT)
    for index, p in enumerate(parents):
        p.send({"op": "init", "protocol_version": PROTOCOL_VERSION, "shm_prefix": p.prefix,
                "model_file": model_file, "decoupled": False, "args": {
                    "model_config": json.dumps({"name": "m"}), "model_instance_kind": "CPU",
                    "model_instance_name": "m_{}".format(index), "model_instance_device_id": "0",
                    "model_repository": str(tmp_path / "model"), "model_version": "1",
                    "model_name": "m"}})
        assert p.recv_op("init_done")["error"] is None, p.stub_log()
    yield parents
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for p in parents:
        p.close_connections()
    assert "nereid stub:" not in parents[0].stub_log(), parents[0].stub_log()


def execute(parent, value):
    parent.execute([{"inputs": [("X", np.array([value], np.int32))]}])


def answer(parent):
    done = parent.recv_op("execute_done")
    assert "error" not in done or done["error"] is None, done
    outputs = parent.outputs(done["responses"][0], done["segment"])
    parent.send({"op": "release", "segment": done["segment"]})
    return int(outputs["Y"][0])


def test_each_member_initializes_itself_in_one_process(members):
    seen = []
    for index, p in enumerate(members):
        (line,) = [m for level, m in p.logs if m.startswith("init ")]
        name, pid, thread = line.split()[1:]
        assert name == "m_{}".format(index), "each member's log goes on its own connection"
        seen.append((int(pid), thread))
        assert ("INFO", "thread of m_{}".format(index)) in p.logs, "a thread it starts is its own"
    assert {pid for pid, _ in seen} == {members[0].proc.pid}
    assert len({thread for _, thread in seen}) == 2, "a thread per member"


def test_executions_of_two_members_overlap(members):
    # Each waits at a barrier for the other: both answer only if they run at once.
    for p in members:
        execute(p, 1)
    assert [answer(p) for p in members] == [2, 2]


def test_finalize_ends_one_member_and_the_last_ends_the_process(members):
    first, second = members
    first.send({"op": "finalize"})
    assert first.recv_op("finalize_done")["error"] is None
    assert ("INFO", "finalize m_0") in first.logs
    execute(second, 5)
    assert answer(second) == 6, "the other member keeps serving"
    assert second.proc.poll() is None
    second.close_connections()  # EOF: the last member ends, and the process with it
    assert second.proc.wait(timeout=READ_TIMEOUT_S) == 0
    assert not [f for f in os.listdir(second.workdir) if f.startswith("shm")], "segments removed"


def test_sys_exit_in_one_member_ends_every_member(members):
    execute(members[0], 3)
    assert members[0].proc.wait(timeout=READ_TIMEOUT_S) == 3
    assert members[1].events.recv(1) == b"", "the other member's connections end too"
