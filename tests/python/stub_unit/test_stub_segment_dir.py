"""The stub with a segment directory as its `shm_prefix` (`<dir>/`), as the Rust server sends it:
segments go inside, are never opened through a planted path, and a stub whose server went away
removes the directory with everything in it.
"""

import os

import numpy as np
import pytest

from fake_parent import FakeParent

PLUS_ONE = """
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            return [pb_utils.InferenceResponse(
                        [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() + 1)])
                    for r in requests]
"""


@pytest.fixture
def parent(tmp_path):
    segments = tmp_path / "segments"
    segments.mkdir(mode=0o700)
    p = FakeParent(tmp_path)
    p.prefix = str(segments) + "/"
    yield p
    if p.proc.poll() is None:
        p.proc.kill()
        p.proc.wait()
    p.close_connections()


def test_segments_live_in_the_directory_which_the_stub_removes_on_eof(parent):
    directory = parent.prefix.rstrip("/")
    assert parent.init(PLUS_ONE)["error"] is None
    parent.execute([{"inputs": [("X", np.arange(4, dtype=np.int32))]}])
    done = parent.recv_op("execute_done")
    assert done["segment"] == "s0"
    np.testing.assert_array_equal(parent.outputs(done["responses"][0], "s0")["Y"], [1, 2, 3, 4])
    assert sorted(os.listdir(directory)) == ["p0", "s0"]
    mode = os.stat(os.path.join(directory, "s0")).st_mode & 0o777
    assert mode == 0o600
    assert parent.close() == 0
    assert not os.path.exists(directory), "the parent is gone: the stub removes the directory"


def test_the_stub_never_writes_through_a_planted_symlink(parent, tmp_path):
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    os.symlink(target, parent.prefix + "s0")
    assert parent.init(PLUS_ONE)["error"] is None
    parent.execute([{"inputs": [("X", np.arange(4, dtype=np.int32))]}])
    done = parent.recv_op("execute_done")
    assert "cannot create shared-memory segment" in done["error"]["message"], done
    assert target.read_bytes() == b"keep"
