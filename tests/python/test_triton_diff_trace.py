"""Differential tests of Triton's trace mode (`triton,file=F`) against the real Triton server
(2.51.0): the trace files both servers write for the same requests (tests/python/trace_files.py:
its repository of Python models, its requests, its reader) must hold the same traces by
structure. (test_triton_diff.py holds the other differential tests and the comparison helpers;
this file keeps it under the line limit.)
"""

import pytest

import trace_files
from nereid_util import http_raw, wait_until
from test_triton_diff import check_same, http_answer
from triton_util import TritonServer, nereid_like_triton


@pytest.mark.parametrize("tensors", [False, True], ids=["timestamps", "tensors"])
def test_triton_trace_files_have_tritons_structure(tmp_path, tensors):
    """Triton's trace mode (`triton,file=F`, level TIMESTAMPS, rate 1) on Nereid and on Triton
    2.51, the same requests (trace_files.send_requests: HTTP, gRPC, a BLS call made with
    trace=request.trace(), an ensemble with a BLS step, two gRPC stream requests): the files
    written at shutdown must hold the same traces, by structure: header keys, timestamp names
    in file order (the model's and the frontend's), with level TENSORS too the tensors
    recorded, and parent/child links. Values (ids, nanoseconds, tensor text) are not compared.
    Decoupled responses are left out: Triton 2.51 records them differently over HTTP and
    gRPC."""
    repo = trace_files.write_repository(tmp_path / "repo")
    trees = {}
    for kind, make in (("nereid", nereid_like_triton), ("triton", TritonServer)):
        file = tmp_path / f"{kind}_trace.json"
        args = trace_files.trace_args(file, tensors=tensors)
        server = make(repo, tmp_path, args, name=f"{kind}_traced")
        server.start()
        try:
            wait_until(lambda s=server: http_raw(s.http_url, "GET", "/v2/health/ready")[0] == 200,
                       90, f"{kind} ready")
            answer = http_answer(server, "GET", "/v2/trace/setting")
            answer["body"]["trace_file"] = "F"
            trees[f"{kind}_settings"] = answer
            trace_files.send_requests(server, decoupled=False)
        finally:
            server.stop()
        trees[kind] = trace_files.tree(trace_files.read_traces([file]))
    check_same("trace_settings_triton_mode", trees["nereid_settings"], trees["triton_settings"])
    check_same("trace_file_structure", trees["nereid"], trees["triton"])
    assert len(trees["triton"]) == 6, trees["triton"]
    assert any(root["tensors"] for root in trees["triton"]) == tensors


@pytest.mark.parametrize("tensors", [False, True], ids=["timestamps", "tensors"])
def test_triton_trace_files_decoupled_ensemble(tmp_path, tensors):
    """Triton's trace mode on a decoupled ensemble (trace_files.send_decoupled_ensemble: a gRPC
    stream request and an HTTP generate_stream request, two responses each): Nereid writes the
    traces Triton 2.51 writes, by structure: the ensemble's trace (no compute stamps, the
    frontend's stamps and one send pair per response) with one child trace per composing-model
    execution (repeat_decoupled once, trace_double once per response), each with the model's
    stamps and the ensemble's request id. Triton's gRPC stream writes INFER_RESPONSE_COMPLETE
    for the first response only (Nereid: each response, as for a decoupled model), so the
    frontend's stamps are compared with the repeats of that one left out. With level TENSORS,
    the tensors each trace records too (the ensemble's: its input and each response's output)."""

    def first_completion_only(node):
        stamps, seen = [], False
        for s in node["frontend"]:
            if s == "INFER_RESPONSE_COMPLETE":
                if seen:
                    continue
                seen = True
            stamps.append(s)
        return {**node, "frontend": stamps,
                "children": [first_completion_only(c) for c in node["children"]]}

    repo = trace_files.write_repository(tmp_path / "repo")
    trees = {}
    for kind, make in (("nereid", nereid_like_triton), ("triton", TritonServer)):
        file = tmp_path / f"{kind}_trace.json"
        args = trace_files.trace_args(file, tensors=tensors)
        server = make(repo, tmp_path, args, name=f"{kind}_dec_traced")
        server.start()
        try:
            wait_until(lambda s=server: http_raw(s.http_url, "GET", "/v2/health/ready")[0] == 200,
                       90, f"{kind} ready")
            trace_files.send_decoupled_ensemble(server)
        finally:
            server.stop()
        trees[kind] = [first_completion_only(root) for root in
                       trace_files.tree(trace_files.read_traces([file]))]
    check_same("trace_file_decoupled_ensemble", trees["nereid"], trees["triton"])
    grpc, http = sorted(trees["triton"], key=lambda r: r["request_id"] is None)
    assert grpc["request_id"] == "de1" and http["request_id"] is None, trees["triton"]
    assert sorted(c["model"] for c in grpc["children"]) == [
        "repeat_decoupled", "trace_double", "trace_double"], grpc
    assert grpc["frontend"].count("GRPC_SEND_START") == 2, grpc
    assert http["frontend"].count("HTTP_SEND_START") == 2, http
    if tensors:
        assert grpc["tensors"] == [("TENSOR_BACKEND_OUTPUT", "OUT")] * 2 + [
            ("TENSOR_QUEUE_INPUT", "IN")], grpc
