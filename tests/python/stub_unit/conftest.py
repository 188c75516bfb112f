"""The `parent` fixture of the stub unit tests: a FakeParent with a running stub, killed if it
is still running at the end, and no complaint of the stub's own in its log."""

import pytest

from fake_parent import FakeParent


@pytest.fixture
def parent(tmp_path):
    p = FakeParent(tmp_path)
    yield p
    if p.proc.poll() is None:
        p.proc.kill()
        p.proc.wait()
    p.close_connections()
    assert "nereid stub:" not in p.stub_log(), "the stub complained:\n" + p.stub_log()
