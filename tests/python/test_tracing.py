"""Tracing (OpenTelemetry and Triton's trace files), the trace/log setting APIs and OTLP metric
export, end to end.

An OTLP receiver built on the `opentelemetry-proto` types (a grpcio `TraceService` /
`MetricsService`, and a plain HTTP endpoint for OTLP/HTTP protobuf) runs in the test; real
`nereid serve`, worker, router and control-plane processes export to it on 127.0.0.1. Checked:
the span tree of one request (root `InferRequest` under the client's W3C `traceparent`, phases
receive → queue → compute_input → compute_infer → compute_output → send), ensemble steps as
child spans, router → worker parent/child links across processes, Triton's trace settings
(global and per model, HTTP and gRPC, bad values named), the logging endpoint, and metric
families arriving over OTLP with the Prometheus names. Triton's mode (`triton,file=F`, the
repository and requests of trace_files.py): the JSON array written at shutdown, its objects and
timestamp names, stream requests and BLS calls as traces, `log-frequency` rotation."""

import http.server
import json
import queue
import threading
import time
from concurrent import futures

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from opentelemetry.proto.collector.metrics.v1 import (metrics_service_pb2,
                                                      metrics_service_pb2_grpc)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from tritonclient.utils import InferenceServerException

from cluster_util import RouterProcess, WorkerProcess, leader_of, model_body, wait_replicas
from nereid_util import (Server, assert_http_error, gen_models, http_json, managed_server,
                         wait_until)
from test_cluster import start_control_plane, stop_all

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
PHASES = ["receive", "queue", "compute_input", "compute_infer", "compute_output", "send"]


class Receiver(trace_service_pb2_grpc.TraceServiceServicer,
               metrics_service_pb2_grpc.MetricsServiceServicer):
    """OTLP/gRPC collector on 127.0.0.1: every exported span and metric, in arrival order."""

    def __init__(self):
        self.spans = queue.Queue()
        self.metrics = queue.Queue()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def Export(self, request, context):  # noqa: N802 - the generated servicer's name
        if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
            for rs in request.resource_spans:
                service = attrs(rs.resource.attributes).get("service.name")
                for ss in rs.scope_spans:
                    for span in ss.spans:
                        self.spans.put((service, span))
            return trace_service_pb2.ExportTraceServiceResponse()
        self.metrics.put(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()

    def collect(self, predicate, what, deadline_s=20):
        """Spans received until `predicate(spans)` holds; fails after `deadline_s`."""
        got = []
        end = time.monotonic() + deadline_s
        while not predicate(got):
            left = end - time.monotonic()
            if left <= 0:
                names = [(s, sp.name) for s, sp in got]
                raise AssertionError(f"timed out waiting for {what}; got {names}")
            try:
                got.append(self.spans.get(timeout=min(left, 0.5)))
            except queue.Empty:
                pass
        return got

    def stop(self):
        self.server.stop(0)


def attrs(key_values):
    out = {}
    for kv in key_values:
        v = kv.value
        out[kv.key] = v.string_value if v.HasField("string_value") else v.int_value
    return out


def by_name(spans, name):
    return [sp for _, sp in spans if sp.name == name]


def traceparent(trace=CLIENT_TRACE, span=CLIENT_SPAN):
    return f"00-{trace}-{span}-01"


def trace_args(receiver, *extra):
    return ["--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
            "--trace-config", f"opentelemetry,url={receiver.url}",
            "--trace-config", "opentelemetry,protocol=grpc",
            "--trace-config", "opentelemetry,bsp_schedule_delay=50", *extra]


def requests_done(n):
    """Predicate: `n` root InferRequest spans arrived, each with its children."""
    def done(spans):
        roots = by_name(spans, "InferRequest")
        if len(roots) < n:
            return False
        ids = {r.span_id for r in roots}
        children = [sp for _, sp in spans if sp.parent_span_id in ids]
        return len(children) >= n * len(PHASES)
    return done


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def traced(receiver, tmp_path_factory):
    repo = gen_models.write_repository(tmp_path_factory.mktemp("repo_trace"), "ensemble")
    args = trace_args(receiver, "--otlp-metrics-endpoint", receiver.url,
                      "--otlp-metrics-protocol", "grpc", "--otlp-metrics-interval-ms", "200")
    yield from managed_server(repo, tmp_path_factory.mktemp("logs"), args, "server_traced")


def drain(receiver):
    while not receiver.spans.empty():
        receiver.spans.get_nowait()


def x_inputs(module, name="x"):
    """One [1, 4] FP32 input: `x` of ens_scale (ONNX, y = 2x), `IN` of the ensembles."""
    x = np.array([[1.0, -2.0, 3.5, 10.0]], dtype=np.float32)
    t = module.InferInput(name, [1, 4], "FP32")
    t.set_data_from_numpy(x)
    return [t]


@pytest.mark.parametrize("proto", ["http", "grpc"])
def test_one_request_is_a_span_tree_under_the_clients_traceparent(proto, receiver, traced):
    drain(receiver)
    if proto == "http":
        client = httpclient.InferenceServerClient(traced.http_url)
    else:
        client = grpcclient.InferenceServerClient(traced.grpc_url)
    client.infer("ens_scale", x_inputs(httpclient if proto == "http" else grpcclient),
                 headers={"traceparent": traceparent()})
    spans = receiver.collect(requests_done(1), "one traced request")
    (root,) = by_name(spans, "InferRequest")
    assert root.trace_id.hex() == CLIENT_TRACE
    assert root.parent_span_id.hex() == CLIENT_SPAN
    assert root.kind == 2  # SPAN_KIND_SERVER
    assert attrs(root.attributes)["model.name"] == "ens_scale"
    assert attrs(root.attributes)["model.version"] == "1"
    children = {sp.name: sp for _, sp in spans if sp.parent_span_id == root.span_id}
    assert sorted(children) == sorted(PHASES)
    # The phases follow one another inside the root span.
    ordered = [children[p] for p in PHASES]
    for before, after in zip(ordered, ordered[1:]):
        assert before.end_time_unix_nano <= after.start_time_unix_nano + 1_000, (before.name,
                                                                                after.name)
    assert root.start_time_unix_nano <= ordered[0].start_time_unix_nano
    assert ordered[-1].end_time_unix_nano <= root.end_time_unix_nano
    services = {service for service, _ in spans}
    assert services == {"nereid"}


def test_ensemble_steps_are_child_spans(receiver, traced):
    drain(receiver)
    client = httpclient.InferenceServerClient(traced.http_url)
    client.infer("ens_pipeline", x_inputs(httpclient, "IN"))

    def pipeline_done(spans):
        roots = by_name(spans, "InferRequest")
        return len(roots) >= 3 and len(by_name(spans, "send")) >= 1
    spans = receiver.collect(pipeline_done, "an ensemble with its two steps")
    roots = by_name(spans, "InferRequest")
    (top,) = [r for r in roots if attrs(r.attributes)["model.name"] == "ens_pipeline"]
    assert top.parent_span_id == b"", "no client context: a new trace"
    steps = [r for r in roots if r.parent_span_id == top.span_id]
    assert sorted(attrs(s.attributes)["model.name"] for s in steps) == ["ens_addsub",
                                                                       "ens_scale"]
    assert all(s.trace_id == top.trace_id for s in steps)


def test_trace_settings_api_over_http_and_grpc(receiver, traced):
    http = httpclient.InferenceServerClient(traced.http_url)
    grpc_client = grpcclient.InferenceServerClient(traced.grpc_url)
    settings = http.get_trace_settings()
    assert settings["trace_level"] == ["TIMESTAMPS"]
    assert settings["trace_rate"] == "1"
    assert settings["trace_mode"] == "opentelemetry"
    # A model's own rate; the global one is untouched; null clears it again.
    updated = http.update_trace_settings(model_name="ens_scale", settings={"trace_rate": "7"})
    assert updated["trace_rate"] == "7"
    assert http.get_trace_settings()["trace_rate"] == "1"
    g = grpc_client.get_trace_settings(model_name="ens_scale", as_json=True)
    assert g["settings"]["trace_rate"]["value"] == ["7"]
    cleared = http.update_trace_settings(model_name="ens_scale", settings={"trace_rate": None})
    assert cleared["trace_rate"] == "1"
    # Turning tracing off globally stops the spans.
    grpc_client.update_trace_settings(settings={"trace_level": ["OFF"]})
    try:
        drain(receiver)
        http.infer("ens_scale", x_inputs(httpclient))
        with pytest.raises(AssertionError):
            receiver.collect(requests_done(1), "nothing", deadline_s=1.5)
    finally:
        http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    # Bad values are 400s that name the key; unknown models 404; the server keeps serving.
    code, body = http_json(traced.http_url, "POST", "/v2/trace/setting", {"trace_rate": "0"})
    assert_http_error((code, body), 400, "trace_rate", "at least 1")
    code, body = http_json(traced.http_url, "POST", "/v2/trace/setting", {"trace_colour": "1"})
    assert_http_error((code, body), 400, "trace_colour")
    code, body = http_json(traced.http_url, "GET", "/v2/models/nope/trace/setting")
    assert code == 404, body
    with pytest.raises(InferenceServerException) as e:
        grpc_client.update_trace_settings(settings={"trace_count": "-5"})
    assert "trace_count" in str(e.value)
    assert http.is_server_ready()


def test_logging_api(traced):
    http = httpclient.InferenceServerClient(traced.http_url)
    grpc_client = grpcclient.InferenceServerClient(traced.grpc_url)
    settings = http.get_log_settings()
    assert settings["log_info"] is True and settings["log_format"] == "default"
    verbose = settings["log_verbose_level"]
    assert http.update_log_settings({"log_verbose_level": 2})["log_verbose_level"] == 2
    g = grpc_client.update_log_settings({"log_verbose_level": verbose}, as_json=True)
    value = g["settings"]["log_verbose_level"]
    assert int(value.get("uint32_param", value.get("uint32Param"))) == verbose, value
    code, body = http_json(traced.http_url, "POST", "/v2/logging", {"log_info": "yes"})
    assert_http_error((code, body), 400, "log_info", "boolean")
    code, body = http_json(traced.http_url, "POST", "/v2/logging", {"log_file": "/tmp/x"})
    assert code == 501, body


def test_metrics_arrive_over_otlp_with_the_prometheus_names(receiver, traced):
    httpclient.InferenceServerClient(traced.http_url).infer("ens_scale",
                                                            x_inputs(httpclient))

    def counted():
        try:
            request = receiver.metrics.get(timeout=0.5)
        except queue.Empty:
            return None
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == "nv_inference_count":
                        points = {attrs(p.attributes)["model"]: p.as_double
                                  for p in m.sum.data_points}
                        if points.get("ens_scale", 0) >= 1:
                            return m
        return None
    metric = wait_until(counted, 20, "nv_inference_count over OTLP")
    assert metric.sum.is_monotonic


def test_otlp_http_exporter(tmp_path_factory):
    """OTLP/HTTP protobuf (Triton's default wire) to a plain HTTP endpoint."""
    got = queue.Queue()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers["Content-Length"]))
            got.put((self.path, self.headers["Content-Type"], body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        repo = gen_models.write_repository(tmp_path_factory.mktemp("repo_trace_http"),
                                           "ensemble")
        url = f"http://127.0.0.1:{httpd.server_address[1]}/v1/traces"
        args = ["--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1",
                "--trace-config", f"opentelemetry,url={url}",
                "--trace-config", "opentelemetry,bsp_schedule_delay=50"]
        for server in managed_server(repo, tmp_path_factory.mktemp("logs"), args,
                                     "server_trace_http"):
            httpclient.InferenceServerClient(server.http_url).infer("ens_scale",
                                                                    x_inputs(httpclient))
            path, content_type, body = got.get(timeout=20)
            assert path == "/v1/traces"
            assert content_type == "application/x-protobuf"
            request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
            names = {sp.name for rs in request.resource_spans for ss in rs.scope_spans
                     for sp in ss.spans}
            assert names & {"InferRequest", *PHASES}
    finally:
        httpd.shutdown()


def test_router_to_worker_spans_link_across_processes(tmp_path, receiver):
    example = gen_models.write_repository(tmp_path / "repo", "example")
    token, cps = start_control_plane(tmp_path, n=1)
    cp = cps[0]
    worker = WorkerProcess("w1", tmp_path, token, [cp.grpc_addr])
    worker.args += trace_args(receiver)
    router = RouterProcess(tmp_path, token, [cp.grpc_addr])
    router.args += trace_args(receiver)
    try:
        leader_of(cps)
        for p in (worker, router):
            p.spawn()
        for p in (worker, router):
            p.wait_live()
        code, body = cp.api("POST", "/api/v1/models", model_body("simple", example / "simple"))
        assert code == 200, (code, body)
        wait_replicas(cp, "simple", lambda r: any(x["state"] == "REPLICA_STATE_READY"
                                                 for x in r), "a ready replica")
        client = grpcclient.InferenceServerClient(router.grpc_url)
        wait_until(lambda: client.is_model_ready("simple"), 30, "the router sees simple")
        drain(receiver)
        inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
                  grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
        for t in inputs:
            t.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        client.infer("simple", inputs, headers={"traceparent": traceparent()})

        def linked(spans):
            return (any(s == "nereid-router" and sp.name == "InferRequest" for s, sp in spans)
                    and any(s == "nereid-worker" and sp.name == "InferRequest"
                            for s, sp in spans))
        spans = receiver.collect(linked, "router and worker spans")
        (router_root,) = [sp for s, sp in spans
                          if s == "nereid-router" and sp.name == "InferRequest"]
        (forward,) = [sp for s, sp in spans if s == "nereid-router" and sp.name == "forward"]
        (worker_root,) = [sp for s, sp in spans
                          if s == "nereid-worker" and sp.name == "InferRequest"]
        assert router_root.trace_id.hex() == CLIENT_TRACE
        assert router_root.parent_span_id.hex() == CLIENT_SPAN
        assert forward.parent_span_id == router_root.span_id
        assert forward.kind == 3  # SPAN_KIND_CLIENT
        assert worker_root.trace_id == router_root.trace_id
        assert worker_root.parent_span_id == forward.span_id
        assert (forward.start_time_unix_nano <= worker_root.start_time_unix_nano
                and worker_root.end_time_unix_nano <= forward.end_time_unix_nano + 5_000_000)
    finally:
        stop_all([router, worker, *cps])


# --------------------------------------------------------------------------------------------
# Triton's trace mode: JSON trace files

HTTP_STAMPS = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START",
               "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END",
               "REQUEST_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START", "HTTP_SEND_END"]
GRPC_STAMPS = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
               "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END", "GRPC_WAITREAD_START",
               "GRPC_WAITREAD_END", "INFER_RESPONSE_COMPLETE", "GRPC_SEND_START", "GRPC_SEND_END"]
CHILD_STAMPS = ["REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
                "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END"]


def by_request(traces, model, request_id):
    (found,) = [(i, t) for i, t in traces.items() if t["header"]["model_name"] == model
                and t["header"].get("request_id") == request_id
                and "parent_id" not in t["header"]]
    return found


def children_of(traces, parent):
    return {t["header"]["model_name"]: (i, t) for i, t in traces.items()
            if t["header"].get("parent_id") == parent}


def test_triton_mode_writes_one_json_array_at_shutdown(tmp_path):
    """`triton,file=F` (log-frequency 0): nothing on disk while serving, one JSON array at
    SIGTERM with Triton's objects; HTTP and gRPC stamps, stream requests traced one by one,
    a decoupled request's two responses, ensemble steps and a BLS call as child traces, and a
    decoupled ensemble's request with each composing-model execution as a child trace."""
    import trace_files
    repo = trace_files.write_repository(tmp_path / "repo")
    file = tmp_path / "trace.json"
    server = Server(repo, tmp_path, trace_files.trace_args(file), name="server_trace_file")
    server.start()
    try:
        wait_until(lambda: http_json(server.http_url, "GET", "/v2/health/ready")[0] == 200, 60,
                   "ready")
        code, settings = http_json(server.http_url, "GET", "/v2/trace/setting")
        assert code == 200 and settings["trace_mode"] == "triton", settings
        assert settings["trace_file"] == str(file) and settings["log_frequency"] == "0"
        # Triton's answers: the file is not settable, a mode update is ignored.
        code, body = http_json(server.http_url, "POST", "/v2/trace/setting",
                               {"trace_file": "/tmp/elsewhere.json"})
        assert_http_error((code, body), 501,
                          "trace file location can not be updated through network protocol")
        code, body = http_json(server.http_url, "POST", "/v2/models/add_sub/trace/setting",
                               {"trace_mode": "opentelemetry"})
        assert code == 200 and body["trace_mode"] == "triton", body
        trace_files.send_requests(server)
        assert not file.exists(), "log-frequency 0 writes only at shutdown"
    finally:
        assert server.stop() == 0, server.log_tail()
    traces = trace_files.read_traces([file])
    _, h1 = by_request(traces, "add_sub", "h1")
    assert h1["stamps"] == HTTP_STAMPS
    assert h1["header"] == {"id": h1["header"]["id"], "model_name": "add_sub",
                            "model_version": 1, "request_id": "h1"}
    for rid in ("g1", "s1", "s2"):
        assert by_request(traces, "add_sub", rid)[1]["stamps"] == GRPC_STAMPS, rid
    _, d1 = by_request(traces, "repeat_decoupled", "d1")
    assert d1["stamps"].count("GRPC_SEND_START") == 2, d1["stamps"]
    b_id, _ = by_request(traces, "trace_bls", "b1")
    (call,) = children_of(traces, b_id).values()
    assert call[1]["header"]["model_name"] == "add_sub"
    assert "request_id" not in call[1]["header"], "a BLS request has no id of its own"
    assert call[1]["stamps"] == CHILD_STAMPS
    e_id, e1 = by_request(traces, "trace_ens", "e1")
    assert [s for s in e1["stamps"] if s.startswith("COMPUTE")] == []
    steps = children_of(traces, e_id)
    assert sorted(steps) == ["add_sub", "trace_bls"]
    assert all(t["header"]["request_id"] == "e1" for _, t in steps.values())
    bls_step_id = steps["trace_bls"][0]
    assert list(children_of(traces, bls_step_id)) == ["add_sub"], "the step's BLS call"
    # A trace and its children are written together, the children first.
    order = [o["id"] for o in json.loads(file.read_text())]
    assert order.index(e_id) > max(order.index(i) for i, _ in steps.values())
    # The decoupled ensemble: its own stamps (no compute: its steps computed), one response
    # stamp and send pair per response; repeat_decoupled ran once, trace_double once per
    # response of it, each a child trace with the model's stamps and the ensemble's id.
    de_id, de1 = by_request(traces, "trace_dec_ens", "de1")
    assert de1["header"]["model_version"] == 1, de1["header"]
    assert de1["stamps"] == ["REQUEST_START", "QUEUE_START", "REQUEST_END", "GRPC_WAITREAD_START",
                             "GRPC_WAITREAD_END"] + ["INFER_RESPONSE_COMPLETE", "GRPC_SEND_START",
                                                     "GRPC_SEND_END"] * 2, de1["stamps"]
    de_steps = [t for t in traces.values() if t["header"].get("parent_id") == de_id]
    assert sorted(t["header"]["model_name"] for t in de_steps) == [
        "repeat_decoupled", "trace_double", "trace_double"], de_steps
    for t in de_steps:
        assert t["header"]["request_id"] == "de1", t["header"]
        assert t["stamps"] == CHILD_STAMPS, t
    assert order.index(de_id) > max(order.index(t["header"]["id"]) for t in de_steps)


def test_log_frequency_rotates_into_numbered_files(tmp_path):
    """`triton,log-frequency=2`: F.0, F.1, ... each a JSON array of two traces (a trace counted
    with its children), written while serving; the rest goes to the next one at shutdown."""
    import trace_files
    repo = trace_files.write_repository(tmp_path / "repo")
    file = tmp_path / "trace.json"
    args = trace_files.trace_args(file, "--trace-config", "triton,log-frequency=2")
    server = Server(repo, tmp_path, args, name="server_trace_rotate")
    server.start()
    try:
        wait_until(lambda: http_json(server.http_url, "GET", "/v2/health/ready")[0] == 200, 60,
                   "ready")
        trace_files.send_requests(server, decoupled=False)  # 6 top-level traces
        wait_until(lambda: (tmp_path / "trace.json.2").exists(), 20, "three files while serving")
        client = httpclient.InferenceServerClient(server.http_url)
        client.update_trace_settings(settings={"log_frequency": "0"})
        client.infer("add_sub", trace_files._inputs(httpclient), request_id="last")
    finally:
        assert server.stop() == 0, server.log_tail()
    numbered = sorted(tmp_path.glob("trace.json.*"))
    assert [p.name for p in numbered] == ["trace.json.0", "trace.json.1", "trace.json.2"]
    for p in numbered:
        traces = trace_files.read_traces([p])
        roots = [t for t in traces.values() if "parent_id" not in t["header"]]
        assert len(roots) == 2, (p.name, roots)
    # After the frequency went back to 0, the last trace waited for shutdown, in F itself.
    last = trace_files.read_traces([file])
    assert [t["header"].get("request_id") for t in last.values()] == ["last"]


def test_opentelemetry_traces_stream_requests_and_bls_calls(receiver, tmp_path):
    """OpenTelemetry mode: each request of a gRPC stream is its own InferRequest span tree,
    and a BLS call made with trace=request.trace() is a child span of the calling request."""
    import trace_files
    repo = trace_files.write_repository(tmp_path / "repo")
    server = Server(repo, tmp_path, trace_args(receiver), name="server_trace_otel_py")
    server.start()
    try:
        wait_until(lambda: http_json(server.http_url, "GET", "/v2/health/ready")[0] == 200, 60,
                   "ready")
        drain(receiver)
        trace_files.send_requests(server)

        def everything(spans):
            return len(by_name(spans, "InferRequest")) >= 15  # 8 roots, 7 children
        spans = receiver.collect(everything, "every request's span")
    finally:
        assert server.stop() == 0, server.log_tail()
    roots = by_name(spans, "InferRequest")
    ids = {attrs(r.attributes).get("request.id"): r for r in roots
           if r.parent_span_id == b""}
    assert {"s1", "s2", "d1", "de1"} <= set(ids), sorted(i for i in ids if i)
    assert len({ids[k].trace_id for k in ("s1", "s2", "d1", "de1")}) == 4, \
        "one trace per request"
    # The decoupled ensemble: its receive phase (and send, from its last response to the end of
    # its stream, as a decoupled model's), and each composing-model execution a child
    # InferRequest span of its span, in its trace.
    de1 = ids["de1"]
    assert attrs(de1.attributes)["model.name"] == "trace_dec_ens"
    assert attrs(de1.attributes)["model.version"] == "1"
    under = [sp for _, sp in spans if sp.parent_span_id == de1.span_id]
    phases = sorted(sp.name for sp in under if sp.name != "InferRequest")
    assert phases == ["receive", "send"], under
    steps = [sp for sp in under if sp.name == "InferRequest"]
    assert sorted(attrs(sp.attributes)["model.name"] for sp in steps) == [
        "repeat_decoupled", "trace_double", "trace_double"], steps
    assert all(sp.trace_id == de1.trace_id for sp in steps)
    assert all(de1.start_time_unix_nano <= sp.start_time_unix_nano for sp in steps)
    bls = ids["b1"]
    (call,) = [r for r in roots if r.parent_span_id == bls.span_id]
    assert attrs(call.attributes)["model.name"] == "add_sub"
    assert call.trace_id == bls.trace_id
