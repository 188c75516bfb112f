"""The Grafana dashboard, the Prometheus scrape config and the alert rules under deploy/ against
the metrics real processes export.

Every PromQL expression of deploy/grafana/nereid.json and deploy/prometheus/alerts.yml is
tokenized and its metric names extracted; then a `nereid serve` (with summary and histogram
latencies on) and a small cluster (control plane + worker + router) on 127.0.0.1 serve a few
inferences, every process's /metrics is scraped, and each name the dashboard or an alert uses
must be exported by at least one of them. The GPU families are only exported where a GPU is
seen: on a machine without one they must be absent (GPU_ONLY below).
"""

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
import yaml
from tritonclient.utils import InferenceServerException

from cluster_util import RouterProcess, WorkerProcess, leader_of, model_body, wait_replicas
from nereid_util import NEREID_BIN, ROOT, Server, free_port, gen_models, http_raw, wait_until
from test_cluster import start_control_plane, stop_all

DASHBOARD = ROOT / "deploy/grafana/nereid.json"
PROMETHEUS = ROOT / "deploy/prometheus/prometheus.yml"
ALERTS = ROOT / "deploy/prometheus/alerts.yml"
HELM_HELPERS = ROOT / "deploy/helm/nereid/templates/_helpers.tpl"

# Families whose samples are `<base>_bucket` / `_sum` / `_count` (histograms) or `<base>`,
# `_sum`, `_count` (summaries). Only these lose a suffix: nv_inference_count and
# nv_inference_exec_count are counters whose names happen to end in `_count`.
HISTOGRAMS = {"nereid_router_request_duration_seconds", "nv_inference_first_response_histogram_ms"}
SUMMARIES = {f"nv_inference_{p}_summary_us"
             for p in ("request", "queue", "compute_input", "compute_infer", "compute_output")}

# Exported only by a process that sees a GPU (NVML); absent on a machine without one.
GPU_ONLY = {"nv_gpu_utilization", "nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes",
            "nv_gpu_power_usage", "nv_gpu_power_limit", "nv_energy_consumption"}

# Series Prometheus itself makes for every target (not exported by Nereid).
SYNTHETIC = {"up"}

VARIABLE = "${datasource}"
DEADLINE_S = 60


# ---------------------------------------------------------------------------------------------
# PromQL metric names

FUNCTIONS_OR_KEYWORDS = {
    # aggregation modifiers and vector matching: a parenthesized label list follows
    "by", "without", "on", "ignoring", "group_left", "group_right",
}
WORD_OPERATORS = {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan"}
# Aggregation operators: may be followed by `by (...)` / `without (...)` instead of `(`.
AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
                "bottomk", "topk", "quantile", "limitk", "limit_ratio"}

_DURATION = re.compile(r"(\d+(ms|s|m|h|d|w|y))+")
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_IDENT = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _skip_string(expr, i):
    """Index after the string literal starting at expr[i] (", ' or `)."""
    quote = expr[i]
    i += 1
    while i < len(expr):
        if expr[i] == "\\" and quote != "`":
            i += 2
            continue
        if expr[i] == quote:
            return i + 1
        i += 1
    raise ValueError(f"unterminated string in {expr!r}")


def _skip_group(expr, i, open_, close):
    """Index after the group opened by expr[i] == open_, strings inside respected."""
    depth = 0
    while i < len(expr):
        c = expr[i]
        if c in "\"'`":
            i = _skip_string(expr, i)
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced {open_}{close} in {expr!r}")


def _next_non_space(expr, i):
    while i < len(expr) and expr[i].isspace():
        i += 1
    return i


def promql_metric_names(expr):
    """The metric names an expression selects: identifiers that are not a function (followed by
    `(`), an aggregation operator, a keyword, a label list after by/without/on/ignoring/group_left/group_right, inside
    `{...}` matchers, `[...]` ranges, strings, numbers, durations or Grafana `$variables`.
    Histogram/summary suffixes are stripped for the families in HISTOGRAMS and SUMMARIES."""
    names = set()
    i = 0
    while i < len(expr):
        c = expr[i]
        if c.isspace():
            i += 1
        elif c in "\"'`":
            i = _skip_string(expr, i)
        elif c == "{":
            i = _skip_group(expr, i, "{", "}")
        elif c == "[":
            i = _skip_group(expr, i, "[", "]")
        elif c == "#":  # comment to end of line
            end = expr.find("\n", i)
            i = len(expr) if end < 0 else end
        elif c == "$":  # Grafana variable: $name, ${name}, $__rate_interval
            i += 1
            if i < len(expr) and expr[i] == "{":
                i = _skip_group(expr, i, "{", "}")
            else:
                m = _IDENT.match(expr, i)
                i = m.end() if m else i
        elif c.isdigit() or (c == "." and i + 1 < len(expr) and expr[i + 1].isdigit()):
            m = _DURATION.match(expr, i)
            if m is None or (m.end() < len(expr) and (expr[m.end()].isalnum() or expr[m.end()] == "_")):
                m = _NUMBER.match(expr, i)
            i = m.end()
        elif _IDENT.match(expr, i):
            m = _IDENT.match(expr, i)
            word = m.group(0)
            i = m.end()
            j = _next_non_space(expr, i)
            if word.lower() in WORD_OPERATORS or word in AGGREGATIONS:
                continue
            if word in FUNCTIONS_OR_KEYWORDS:
                if j < len(expr) and expr[j] == "(":
                    i = _skip_group(expr, j, "(", ")")
                continue
            if j < len(expr) and expr[j] == "(":
                continue  # a function call; its arguments are tokenized as usual
            names.add(base_name(word))
        else:
            i += 1  # operators, parentheses, commas, @
    return names


def base_name(name):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            base = name[: -len(suffix)]
            if base in HISTOGRAMS or (suffix != "_bucket" and base in SUMMARIES):
                return base
    return name


def grafana_query_names(query):
    """Metric names of a template variable query: `label_values(<expr>, label)`,
    `label_values(label)`, `query_result(<expr>)` or plain PromQL."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query, re.S)
    if m:
        return promql_metric_names(m.group(1))
    if re.fullmatch(r"\s*label_values\(\s*\w+\s*\)\s*", query):
        return set()
    m = re.fullmatch(r"\s*(?:query_result|metrics)\((.*)\)\s*", query, re.S)
    return promql_metric_names(m.group(1) if m else query)


def test_tokenizer_extracts_only_metric_names():
    expr = ('histogram_quantile(0.99, sum by (le, model) (rate(nereid_router_request_duration_seconds_bucket'
            '{model=~"$model", x="a}b"}[5m]))) / ignoring(reason) group_left(version) '
            'sum without (instance) (rate(nv_inference_count[$__rate_interval] offset 1h)) '
            '+ on (model) nv_inference_exec_count * 1e3 and bool vector(0) or '
            'nv_inference_request_summary_us_count - nv_inference_request_summary_us_sum '
            '# nv_commented_out\n + label_replace(up, "dst", "$1", "src", "(.*)") > Inf')
    assert promql_metric_names(expr) == {
        "nereid_router_request_duration_seconds", "nv_inference_count", "nv_inference_exec_count",
        "nv_inference_request_summary_us", "up"}
    assert promql_metric_names("sum(x_bucket) + y_sum") == {"x_bucket", "y_sum"}
    assert grafana_query_names("label_values(nv_inference_count, model)") == {"nv_inference_count"}
    assert grafana_query_names("label_values(up{job=~\"nereid\"}, instance)") == {"up"}


# ---------------------------------------------------------------------------------------------
# The files themselves


def load_dashboard():
    return json.loads(DASHBOARD.read_text())


def all_panels(panels):
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


def dashboard_expressions(dash):
    """(where, expression, is_template_query) for every query of the dashboard."""
    out = []
    for p in all_panels(dash["panels"]):
        for t in p.get("targets", []):
            out.append((f"panel {p['id']} {p.get('title')!r} {t.get('refId')}", t["expr"], False))
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            out.append((f"variable {v['name']}", q, True))
    return out


def load_alerts():
    return yaml.safe_load(ALERTS.read_text())


def alert_expressions(rules):
    return [(f"alert {r.get('alert') or r.get('record')}", str(r["expr"]), False)
            for g in rules["groups"] for r in g["rules"]]


def used_metric_names():
    """name -> where it is used, over the dashboard and the alert rules."""
    used = {}
    for where, expr, template in (dashboard_expressions(load_dashboard())
                                  + alert_expressions(load_alerts())):
        names = grafana_query_names(expr) if template else promql_metric_names(expr)
        assert names or template, f"{where}: no metric name in {expr!r}"
        for n in names:
            used.setdefault(n, []).append(where)
    return used


def test_dashboard_structure():
    dash = load_dashboard()
    assert dash["schemaVersion"] >= 38
    assert dash["uid"] and dash["title"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus", ds
    for name, query in (("model", "label_values(nv_inference_count, model)"),
                        ("instance", None)):
        v = variables[name]
        assert v["type"] == "query" and v["datasource"]["uid"] == VARIABLE, v
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        assert query is None or q == query, q
        assert re.fullmatch(rf"label_values\(.*,\s*{name}\)", q), q

    ids, cells = set(), []
    panels = list(all_panels(dash["panels"]))
    assert len([p for p in panels if p["type"] != "row"]) >= 20
    for p in panels:
        where = f"panel {p.get('id')} {p.get('title')!r}"
        assert isinstance(p.get("id"), int) and p["id"] not in ids, f"{where}: id not unique"
        ids.add(p["id"])
        assert p.get("title"), where
        g = p.get("gridPos")
        assert g and all(isinstance(g.get(k), int) for k in "hwxy"), f"{where}: gridPos {g}"
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["x"] + g["w"] <= 24, where
        cells += [(x, y, where) for x in range(g["x"], g["x"] + g["w"])
                  for y in range(g["y"], g["y"] + g["h"])]
        if p["type"] == "row":
            assert "targets" not in p, where
            continue
        assert p.get("datasource") == {"type": "prometheus", "uid": VARIABLE}, where
        targets = p.get("targets")
        assert targets, f"{where}: no queries"
        assert len({t["refId"] for t in targets}) == len(targets), f"{where}: refIds"
        for t in targets:
            assert t.get("datasource", p["datasource"]) == p["datasource"], where
            assert t.get("expr", "").strip(), where
    seen = {}
    for x, y, where in cells:
        assert (x, y) not in seen, f"{where} overlaps {seen[(x, y)]}"
        seen[(x, y)] = where


def test_prometheus_config():
    cfg = yaml.safe_load(PROMETHEUS.read_text())
    assert {"global", "scrape_configs", "rule_files"} <= set(cfg), set(cfg)
    assert "scrape_interval" in cfg["global"]
    for f in cfg["rule_files"]:
        assert (PROMETHEUS.parent / f).is_file(), f
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert len(jobs) == len(cfg["scrape_configs"]), "job names not unique"

    static = [j for j in jobs.values() if "static_configs" in j]
    assert any("localhost:8002" in sc["targets"] for j in static for sc in j["static_configs"])

    k8s = [j for j in jobs.values() if "kubernetes_sd_configs" in j]
    assert len(k8s) == 1, list(jobs)
    job = k8s[0]
    assert [sd["role"] for sd in job["kubernetes_sd_configs"]] == ["pod"]
    relabel = job["relabel_configs"]
    ann = "__meta_kubernetes_pod_annotation_prometheus_io_"

    def rule(source, target=None, action="replace"):
        for r in relabel:
            if (any(s.startswith(ann + source) for s in r.get("source_labels", []))
                    and r.get("action", "replace") == action
                    and (target is None or r.get("target_label") == target)):
                return r
        raise AssertionError(f"no {action} relabeling from {ann}{source} to {target}: {relabel}")

    assert rule("scrape", action="keep")["regex"] == "true"
    assert rule("path", "__metrics_path__")
    port = rule("port", "__address__")
    # The address rewrite gives host:annotated-port for pod addresses with and without a port.
    sep = ";"
    regex, replacement = port["regex"], port["replacement"].replace("$", "\\")
    for address in ("10.1.2.3:8000", "10.1.2.3"):
        joined = sep.join([address, "8002"])
        assert re.fullmatch(regex, joined), (regex, joined)
        assert re.sub(f"^(?:{regex})$", replacement, joined) == "10.1.2.3:8002"

    # The annotations the chart sets are the ones this config reads.
    helpers = HELM_HELPERS.read_text()
    for key in ("scrape", "port", "path"):
        assert f"prometheus.io/{key}:" in helpers, key


def test_alert_rules_structure():
    rules = load_alerts()
    names = set()
    for g in rules["groups"]:
        assert g["name"] and g["rules"], g
        for r in g["rules"]:
            assert r["alert"] not in names, r["alert"]
            names.add(r["alert"])
            assert str(r["expr"]).strip() and re.fullmatch(r"\d+[smh]", str(r["for"])), r
            assert r["labels"]["severity"] in ("critical", "warning", "info"), r
            assert r["annotations"]["summary"], r
    assert {"NereidNoRaftLeader", "NereidHighFailureRatio", "NereidPendingRequestsHigh",
            "NereidReplicasNotReady"} <= names


# ---------------------------------------------------------------------------------------------
# Against real processes


def parse_exposition(text):
    """name -> type from `# TYPE` lines, plus every sample name (type None if untyped)."""
    families = {}
    for line in text.splitlines():
        m = re.match(r"#\s*TYPE\s+(\S+)\s+(\S+)", line)
        if m:
            families[m.group(1)] = m.group(2)
        elif line and not line.startswith("#"):
            families.setdefault(re.match(r"[^{\s]+", line).group(0), None)
    return families


def scrape(addr):
    try:
        status, _, body = http_raw(addr, "GET", "/metrics", timeout=5)
    except OSError:
        return None
    return body.decode("utf-8", "replace") if status == 200 else None


def metrics_config_args(subcommand):
    """Summaries and the first-response histogram on, so their families are exported."""
    del subcommand
    return ["--metrics-config", "summary_latencies=true",
            "--metrics-config", "histogram_latencies=true"]


def control_plane_metrics_args():
    """(args, port) for a control-plane metrics listener on 127.0.0.1 (off by default)."""
    port = free_port()
    return ["--allow-metrics", "true", "--metrics-port", str(port),
            "--metrics-address", "127.0.0.1"], port


def simple_inputs(a, b):
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"),
              httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def send_inferences(url, n=5):
    client = httpclient.InferenceServerClient(url, network_timeout=30)
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.full((1, 16), 2, dtype=np.int32)
        for _ in range(n):
            r = client.infer("simple", simple_inputs(a, b))
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
        # One failing request, so failure series exist too.
        bad = httpclient.InferInput("INPUT0", [1, 3], "INT32")
        bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.int32))
        with pytest.raises(InferenceServerException):
            client.infer("simple", [bad])
    finally:
        client.close()


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """Everything the processes export after a few inferences: {"families": {name: type},
    "sources": {name: [process, ...]}, "notes": [...]}. Polled until nothing the dashboard
    uses is missing or DEADLINE_S passes (gauges such as CPU utilization are sampled)."""
    workdir = tmp_path_factory.mktemp("dashboards")
    repo = gen_models.write_repository(workdir / "repo", "example")
    notes = []
    server = Server(repo, workdir, metrics_config_args("serve"), name="dash_serve")
    cp_args, cp_metrics_port = control_plane_metrics_args()
    token, cps = start_control_plane(workdir, n=1, extra=cp_args)
    worker = WorkerProcess("dash_w1", workdir, token, [cps[0].grpc_addr])
    worker.args += metrics_config_args("worker")
    router = RouterProcess(workdir, token, [cps[0].grpc_addr], name="dash_router")
    try:
        server.start()
        cp = leader_of(cps)
        for p in (worker, router):
            p.spawn()
        for p in (worker, router):
            p.wait_live()
        code, body = cp.api("POST", "/api/v1/models", model_body("simple", repo / "simple"))
        assert code == 200, (code, body)
        wait_replicas(cp, "simple", lambda r: any(x["state"] == "REPLICA_STATE_READY" for x in r),
                      "a ready replica")
        via_router = httpclient.InferenceServerClient(router.http_url)
        wait_until(lambda: via_router.is_model_ready("simple"), 30, "the router sees simple ready")
        via_router.close()
        send_inferences(server.http_url)
        send_inferences(router.http_url)

        endpoints = {
            "serve": [f"127.0.0.1:{server.metrics_port}"],
            "worker": [f"127.0.0.1:{worker.metrics_port}"],
            "router": [f"127.0.0.1:{router.metrics_port}"],
            "control-plane": [f"127.0.0.1:{cp_metrics_port}"],
        }
        wanted = set(used_metric_names()) - SYNTHETIC - GPU_ONLY
        result = {}

        def collect():
            families, sources, answered = {}, {}, set()
            for process, addrs in endpoints.items():
                for addr in addrs:
                    text = scrape(addr)
                    if text is None:
                        continue
                    answered.add(process)
                    for name, kind in parse_exposition(text).items():
                        families[name] = families.get(name) or kind
                        sources.setdefault(name, []).append(process)
            result.update(families=families, sources=sources, answered=answered)
            return not (wanted - set(families) - {base_name(n) for n in families})

        try:
            wait_until(collect, 15, "every metric the dashboard uses")
        except AssertionError:
            pass  # the test reports what is missing
        missing = set(endpoints) - result["answered"]
        if missing:
            notes.append(f"no /metrics answer from: {sorted(missing)}")
        result["notes"] = notes
        yield result
    finally:
        stop_all([router, worker, *cps])
        server.stop()


def test_every_used_metric_is_exported(exported):
    used = used_metric_names()
    families = exported["families"]
    # A histogram's samples are <base>_bucket/_sum/_count; its # TYPE line names <base>.
    have = set(families) | {base_name(n) for n in families}
    missing = sorted(n for n in set(used) - SYNTHETIC - GPU_ONLY if n not in have)
    assert not missing, (
        f"{len(missing)} metric names used by the dashboard/alerts are exported by no process:\n"
        + "\n".join(f"  {n}  (used by {used[n][0]}{' ...' if len(used[n]) > 1 else ''})"
                    for n in missing)
        + "".join(f"\nnote: {note}" for note in exported["notes"]))


def test_histograms_and_summaries_have_their_type(exported):
    families = exported["families"]
    for name in sorted(HISTOGRAMS | SUMMARIES):
        if name in families and families[name] is not None:
            want = "histogram" if name in HISTOGRAMS else "summary"
            assert families[name] == want, f"{name}: # TYPE {families[name]}, expected {want}"


def test_gpu_families_only_with_a_gpu(exported):
    used = set(used_metric_names())
    # The allow-list covers exactly the GPU families the dashboard shows.
    assert GPU_ONLY <= used, GPU_ONLY - used
    assert {n for n in used if n.startswith("nv_gpu_")} <= GPU_ONLY
    if any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/nvidia0")):
        pytest.skip("a GPU is present: the GPU families may be exported")
    present = sorted(n for n in exported["families"]
                     if n in GPU_ONLY or n.startswith("nv_gpu_"))
    assert not present, f"GPU families exported on a machine without a GPU: {present}"
