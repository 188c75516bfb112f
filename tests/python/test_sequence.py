"""The sequence batcher end to end through tritonclient, over HTTP and gRPC: ONNX accumulator
models from scripts/gen_sequence_models.py keep a running sum per sequence in implicit state
(`state_in`/`state_out`), reset by the server-fed START control. Covers uint64 and string
correlation ids, interleaved sequences, the direct and oldest strategies, the CORRID control,
the idle timeout and Triton's errors; an initial state from a data file, warm-up of a sequence
model, the direct strategy's slot padding (READY false) and its wait for slot utilization.
Runs its own server on its own repository."""

import concurrent.futures
import importlib.util
import json
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from nereid_util import ROOT, http_raw, managed_server

_spec = importlib.util.spec_from_file_location("gen_sequence_models", ROOT / "scripts/gen_sequence_models.py")
gen_sequence_models = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen_sequence_models)

MODULES = {"http": httpclient, "grpc": grpcclient}


@pytest.fixture(scope="module")
def seq_server(tmp_path_factory):
    repo = gen_sequence_models.write_repository(tmp_path_factory.mktemp("repo_sequence"))
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), [], "server_sequence")


@pytest.fixture(params=["http", "grpc"])
def client(request, seq_server):
    if request.param == "http":
        c = httpclient.InferenceServerClient(seq_server.http_url, network_timeout=60)
    else:
        c = grpcclient.InferenceServerClient(seq_server.grpc_url)
    c.proto = request.param
    yield c
    c.close()


def infer(client, model, value, batch=1, outputs=None, **seq):
    mod = MODULES[client.proto]
    inp = mod.InferInput("INPUT", [batch, 1], "INT32")
    inp.set_data_from_numpy(np.full((batch, 1), value, dtype=np.int32))
    requested = None if outputs is None else [mod.InferRequestedOutput(o) for o in outputs]
    return client.infer(model, [inp], outputs=requested, **seq)


def total(client, model, value, **seq):
    return int(infer(client, model, value, **seq).as_numpy("OUTPUT")[0, 0])


@pytest.mark.parametrize("model", ["seq_accum", "seq_accum_oldest"])
@pytest.mark.parametrize("ids", [(1001, 1002), ("alpha", "beta")], ids=["uint64", "string"])
def test_interleaved_sequences_keep_separate_sums(client, model, ids):
    a, b = (f"{i}-{client.proto}-{model}" if isinstance(i, str) else i + (0 if client.proto == "http" else 10) for i in ids)
    assert total(client, model, 1, sequence_id=a, sequence_start=True) == 1
    assert total(client, model, 10, sequence_id=b, sequence_start=True) == 10
    assert total(client, model, 2, sequence_id=a) == 3
    assert total(client, model, 20, sequence_id=b) == 30
    assert total(client, model, 3, sequence_id=a, sequence_end=True) == 6
    assert total(client, model, 1, sequence_id=b, sequence_end=True) == 31
    # A sequence that ended starts from zero again.
    assert total(client, model, 5, sequence_id=a, sequence_start=True, sequence_end=True) == 5


def test_state_output_only_when_requested(client):
    sid = 2001 if client.proto == "http" else 2002
    r = infer(client, "seq_accum", 4, sequence_id=sid, sequence_start=True)
    assert r.as_numpy("state_out") is None
    r = infer(client, "seq_accum", 3, outputs=["OUTPUT", "state_out"], sequence_id=sid, sequence_end=True)
    assert int(r.as_numpy("OUTPUT")[0, 0]) == 7
    assert int(r.as_numpy("state_out")[0, 0]) == 7


def test_corrid_control_carries_the_id(client):
    sid = 123456789012 if client.proto == "http" else 123456789013
    r = infer(client, "seq_corrid", 1, sequence_id=sid, sequence_start=True, sequence_end=True)
    assert r.as_numpy("CORRID_OUT").dtype == np.uint64
    assert int(r.as_numpy("CORRID_OUT")[0, 0]) == sid


def error_of(fn):
    with pytest.raises(InferenceServerException) as e:
        fn()
    return e.value


def test_triton_errors(client):
    e = error_of(lambda: infer(client, "seq_accum", 1))
    assert "inference request to model 'seq_accum' must specify a non-zero or non-empty correlation ID" in str(e)
    sid = 3001 if client.proto == "http" else 3002
    e = error_of(lambda: infer(client, "seq_accum", 1, sequence_id=sid))
    assert (
        f"inference request for sequence {sid} to model 'seq_accum' must specify the START flag on the first "
        "request of the sequence" in str(e)
    )
    e = error_of(lambda: infer(client, "seq_accum", 1, batch=2, sequence_id=sid, sequence_start=True))
    assert "must specify batch-size 1 due to requirements of sequence batcher" in str(e)
    e = error_of(lambda: infer(client, "seq_corrid", 1, sequence_id="text", sequence_start=True))
    assert "integer correlation ID" in str(e)
    if client.proto == "http":
        assert e.status() == "400"
    else:
        assert e.status() == "StatusCode.INVALID_ARGUMENT"


def test_idle_sequence_is_released(client):
    sid = 4001 if client.proto == "http" else 4002
    assert total(client, "seq_accum_oldest", 2, sequence_id=sid, sequence_start=True) == 2
    time.sleep(gen_sequence_models.OLDEST_IDLE_US / 1e6 + 1.0)
    e = error_of(lambda: infer(client, "seq_accum_oldest", 1, sequence_id=sid))
    assert "must specify the START flag" in str(e)


def test_initial_state_comes_from_the_data_file(client):
    sid = 5001 if client.proto == "http" else 5002
    init = gen_sequence_models.INITIAL_STATE
    assert total(client, "seq_sum_init", 1, sequence_id=sid, sequence_start=True) == init + 1
    assert total(client, "seq_sum_init", 2, sequence_id=sid) == init + 3
    # A new START begins again from the file's value.
    assert total(client, "seq_sum_init", 5, sequence_id=sid, sequence_start=True, sequence_end=True) == init + 5


def test_a_missing_or_short_initial_state_file_fails_the_load(seq_server):
    status, _, body = http_raw(seq_server.http_url, "POST", "/v2/repository/index", b"{}")
    assert status == 200
    index = {m["name"]: m for m in json.loads(body)}
    missing = index["seq_init_missing"]
    assert missing["state"] == "UNAVAILABLE"
    path = seq_server.repo / "seq_init_missing" / "initial_state" / "init.bin"
    assert f"failed to open text file for read {path}: No such file or directory" in missing["reason"]
    short = index["seq_init_short"]
    assert short["state"] == "UNAVAILABLE"
    assert "initial_state setting expects 4 bytes, but the data provided from init.bin only has 2 bytes." in short["reason"]


def test_a_sequence_model_warms_up_with_controls_and_state(client):
    # Its warm-up sample sets INPUT only; the server fed START and the state, so it loaded.
    assert client.is_model_ready("seq_accum_warm")
    sid = 6001 if client.proto == "http" else 6002
    assert total(client, "seq_accum_warm", 4, sequence_id=sid, sequence_start=True) == 4
    assert total(client, "seq_accum_warm", 3, sequence_id=sid, sequence_end=True) == 7


def rows_and_ready(client, model, value, **seq):
    r = infer(client, model, value, **seq)
    return int(r.as_numpy("ROWS")[0, 0]), int(r.as_numpy("READY_SUM")[0, 0])


def test_direct_pads_idle_slots_with_not_ready_requests(seq_server):
    # One client at a time, so the slots are known: sequences a, b, c hold slots 0, 1, 2.
    c = httpclient.InferenceServerClient(seq_server.http_url, network_timeout=60)
    c.proto = "http"
    a, b, d = 7001, 7002, 7003
    assert rows_and_ready(c, "seq_slots", 1, sequence_id=a, sequence_start=True) == (1, 1)
    assert rows_and_ready(c, "seq_slots", 1, sequence_id=b, sequence_start=True) == (2, 1)
    assert rows_and_ready(c, "seq_slots", 1, sequence_id=d, sequence_start=True) == (3, 1)
    # Only the sequence in slot 2 has work: the batch still has 3 rows, 2 of them not READY.
    assert rows_and_ready(c, "seq_slots", 1, sequence_id=d) == (3, 1)
    for sid in (a, b, d):
        rows_and_ready(c, "seq_slots", 1, sequence_id=sid, sequence_end=True)
    c.close()


def test_direct_waits_for_slot_utilization(seq_server):
    # Both slots must have work (the delay is far longer than the test): two sequences that
    # start together run as one batch of 2 READY rows.
    def start(sid):
        with httpclient.InferenceServerClient(seq_server.http_url, network_timeout=60) as c:
            c.proto = "http"
            return rows_and_ready(c, "seq_slots_wait", 1, sequence_id=sid, sequence_start=True, sequence_end=True)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(start, [8001, 8002]))
    assert answers == [(2, 2), (2, 2)]
