"""The scheduler end to end through tritonclient: dynamic batching, the default scheduler,
priority levels, queue size limits, REJECT and DELAY queue timeouts, requests whose client went
away, and model warmup. The models (scripts/gen_models.py) use Triton's identity backend with
one instance whose executions sleep `execute_delay_ms`, so requests queue behind each other.

Ordering without fixed sleeps: `wait_busy` sends 1 ms queue-timeout probes at priority 1 until one
is rejected with "Request timeout expired", which proves the model's only instance is executing
(a probe that finds the instance idle, e.g. one that overtook the occupying request, simply runs
and is counted). Batching and rejections are
observed through statistics deltas (`execution_count`, `inference_count`, `batch_stats`)."""

import asyncio
import re
import time
from dataclasses import dataclass

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
import tritonclient.http.aio as httpaio
from tritonclient.utils import InferenceServerException

from nereid_util import assert_http_error, assert_same, gen_models, http_json, http_raw

DELAY_S = {name: ms / 1000 for name, ms in gen_models.SCHED_DELAY_MS.items()}
DEADLINE_S = 30  # every test's asyncio part
TIMEOUT_EXPIRED = "Request timeout expired"
QUEUE_FULL = "Exceeds maximum queue size"
PROBE = np.full((1, 4), -1.0, np.float32)


def run(coro, deadline_s=DEADLINE_S):
    return asyncio.run(asyncio.wait_for(coro, deadline_s))


def x_of(i, batch=1):
    """Distinct data per request, so a mixed-up batch split shows."""
    return (np.arange(batch * 4, dtype=np.float32).reshape(batch, 4) + 100 * i) / 4


@dataclass
class Outcome:
    proto: str
    sent: np.ndarray
    out: np.ndarray | None
    err: InferenceServerException | None
    start: float
    end: float

    @property
    def latency(self):
        return self.end - self.start

    def assert_identity(self, what=""):
        assert self.err is None, f"{what} ({self.proto}) failed: {self.err}"
        assert_same(self.out, self.sent, f"{what} ({self.proto}) OUTPUT0 vs INPUT0")

    def assert_rejected(self, needle, what=""):
        assert self.err is not None, f"{what} ({self.proto}) succeeded; expected {needle!r}"
        want = "503" if self.proto == "http" else "StatusCode.UNAVAILABLE"
        assert self.err.status() == want, f"{what} ({self.proto}): {self.err.status()} {self.err}"
        assert needle.lower() in self.err.message().lower(), f"{what}: {self.err.message()!r}"


class Clients:
    """One HTTP and one gRPC asyncio client."""

    def __init__(self, server):
        self.server = server

    async def __aenter__(self):
        self.h = httpaio.InferenceServerClient(self.server.http_url)
        self.g = grpcaio.InferenceServerClient(self.server.grpc_url)
        return self

    async def __aexit__(self, *exc):
        await self.h.close()
        await self.g.close()

    async def infer(self, proto, model, x, **kw):
        mod, cli = (httpaio, self.h) if proto == "http" else (grpcaio, self.g)
        inp = mod.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        return await cli.infer(model, [inp], **kw)

    async def timed(self, proto, model, x, **kw):
        start = time.monotonic()
        try:
            out, err = (await self.infer(proto, model, x, **kw)).as_numpy("OUTPUT0"), None
        except InferenceServerException as e:
            out, err = None, e
        return Outcome(proto, x, out, err, start, time.monotonic())

    def task(self, proto, model, x, **kw):
        return asyncio.ensure_future(self.timed(proto, model, x, **kw))


async def wait_busy(c, model, occupant, deadline_s=10):
    """Returns once the model's instance is executing `occupant` (a task sent just before; see
    the module docstring) with the number of probes that found the instance idle and ran, or
    None when `occupant` finished before a probe was refused."""
    for _ in range(10):
        await asyncio.sleep(0)  # give the occupant a head start
    ran, end = 0, time.monotonic() + deadline_s
    while time.monotonic() < end:
        o = await c.timed("grpc", model, PROBE, priority=1, timeout=1000)
        if o.err is not None:
            o.assert_rejected(TIMEOUT_EXPIRED, "probe")
            return ran
        ran += 1
        if occupant.done():
            return None
    raise AssertionError(f"{model}: no probe was rejected within {deadline_s}s")


async def occupy(c, model, proto="grpc"):
    """Sends a request to `model` and returns (its task, probes that ran) once it executes."""
    first = c.task(proto, model, x_of(0))
    ran = await wait_busy(c, model, first)
    assert ran is not None, f"{model}: the occupying request finished before it was seen running"
    return first, ran


def stats(client, model):
    [s] = client.get_inference_statistics(model)["model_stats"]
    i = s["inference_stats"]
    return {"inference": s["inference_count"], "execution": s["execution_count"],
            "success": i["success"]["count"], "fail": i["fail"]["count"],
            "batches": {b["batch_size"]: b["compute_infer"]["count"] for b in s["batch_stats"]}}


def stats_delta(before, after):
    d = {k: after[k] - before[k] for k in ("inference", "execution", "success", "fail")}
    d["batches"] = {size: n - before["batches"].get(size, 0)
                    for size, n in after["batches"].items()
                    if n != before["batches"].get(size, 0)}
    return d


def failure_metric(server, model, reason):
    """nv_inference_request_failure for model version 1 and `reason`; None when absent."""
    status, _, body = http_raw(f"127.0.0.1:{server.metrics_port}", "GET", "/metrics")
    assert status == 200
    want = {"model": model, "version": "1", "reason": reason}
    for line in body.decode().splitlines():
        m = re.match(r"^nv_inference_request_failure\{(.*)\} (\S+)$", line)
        if m and dict(re.findall(r'(\w+)="([^"]*)"', m.group(1))) == want:
            return float(m.group(2))
    return None


# ---------------------------------------------------------------------------------------------
# Batching


def test_dynamic_batching_batches_queued_requests(server, http_client):
    """Requests that arrive while the instance is busy run together, each getting its own
    slice back; batches never exceed max_batch_size."""
    model = "identity_delay_batch"
    sizes = [1, 2, 1, 1, 2, 1, 1, 1, 2, 1, 1, 1]  # 15 inferences in 12 requests
    before = stats(http_client, model)

    async def go():
        async with Clients(server) as c:
            return await asyncio.gather(*(
                c.timed("http" if i % 2 else "grpc", model, x_of(i, b))
                for i, b in enumerate(sizes)))

    for i, o in enumerate(run(go())):
        o.assert_identity(f"request {i}")
    d = stats_delta(before, stats(http_client, model))
    assert d["inference"] == sum(sizes) and d["success"] == len(sizes), d
    assert sum(size * n for size, n in d["batches"].items()) == sum(sizes), d
    assert sum(d["batches"].values()) == d["execution"], d
    assert d["execution"] < len(sizes), f"no request was batched: {d}"
    assert max(d["batches"]) > 1 and max(d["batches"]) <= 8, d
    # All 12 arrive within the first execution (20 ms delay + 200 ms), so the rest fill at
    # most two more batches of up to 8.
    assert d["execution"] <= 3, d


def test_default_scheduler_never_batches(server, http_client):
    model = "identity_nobatcher"
    n = 8
    before = stats(http_client, model)

    async def go():
        async with Clients(server) as c:
            return await asyncio.gather(*(
                c.timed("http" if i % 2 else "grpc", model, x_of(i)) for i in range(n)))

    outcomes = run(go())
    for i, o in enumerate(outcomes):
        o.assert_identity(f"request {i}")
    d = stats_delta(before, stats(http_client, model))
    assert d["execution"] == n and d["inference"] == n, d
    assert d["batches"] == {1: n}, d
    # They really were concurrent: one instance ran them back to back.
    assert max(o.latency for o in outcomes) >= (n - 1) * DELAY_S[model], outcomes


def test_default_scheduler_keeps_request_batch(server, http_client):
    """A request with batch dimension 3 runs as one execution of batch size 3."""
    model = "identity_nobatcher"
    before = stats(http_client, model)
    x = x_of(7, batch=3)
    i = httpclient.InferInput("INPUT0", [3, 4], "FP32")
    i.set_data_from_numpy(x)
    assert_same(http_client.infer(model, [i]).as_numpy("OUTPUT0"), x)
    d = stats_delta(before, stats(http_client, model))
    assert (d["execution"], d["inference"], d["batches"]) == (1, 3, {3: 1}), d


# ---------------------------------------------------------------------------------------------
# Priorities


def test_priority_overtakes_queued_requests(server, http_client):
    """With the instance busy and low-priority requests queued, a high-priority request runs
    next. Priority 0 and out-of-range priorities mean the default level (2)."""
    model = "identity_priority"

    async def go():
        async with Clients(server) as c:
            first, _ = await occupy(c, model, "http")  # default level
            lows = [c.task("http", model, x_of(1), priority=2),
                    c.task("grpc", model, x_of(2), priority=0),
                    c.task("grpc", model, x_of(3), priority=7)]
            for _ in range(5):
                await asyncio.sleep(0)  # let the low ones go out first
            high = c.task("grpc", model, x_of(4), priority=1)
            return await first, await asyncio.gather(*lows), await high

    first, lows, high = run(go())
    first.assert_identity("occupying request")
    high.assert_identity("high-priority request")
    for i, o in enumerate(lows):
        o.assert_identity(f"low-priority request {i}")
    assert first.end < high.end, "the running request must finish first"
    late = [i for i, o in enumerate(lows) if o.end <= high.end]
    assert not late, (f"low-priority requests {late} finished before the high-priority one: "
                      f"low ends {[o.end - first.start for o in lows]}, "
                      f"high end {high.end - first.start}")


# ---------------------------------------------------------------------------------------------
# Queue policies


def test_max_queue_size_rejects(server, http_client):
    """One request running and max_queue_size (2) queued: more are refused at once, HTTP 503 /
    gRPC UNAVAILABLE "Exceeds maximum queue size"; the queued ones still run."""
    model = "identity_queue_limit"
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                        "data": [1, 2, 3, 4]}]}
    before = stats(http_client, model)
    rejected_before = failure_metric(server, model, "REJECTED") or 0

    async def go():
        async with Clients(server) as c:
            first, ran = await occupy(c, model)
            timed_out = 1
            queued = [c.task("grpc", model, x_of(1)), c.task("grpc", model, x_of(2))]
            for _ in range(5):
                await asyncio.sleep(0)  # let them go out before the first probe
            # Probe until the queue reports full: both queued requests are in. A probe that
            # overtakes one of them holds its place for 1 ms and gets it refused; resend it.
            end, overtaken = time.monotonic() + 10, 0
            while True:
                assert time.monotonic() < end, "the queue never became full"
                for k, q in enumerate(queued):
                    if q.done() and q.result().err is not None:
                        q.result().assert_rejected(QUEUE_FULL, "request overtaken by a probe")
                        queued[k] = c.task("grpc", model, q.result().sent)
                        overtaken += 1
                        await asyncio.sleep(0)
                probe = await c.timed("grpc", model, PROBE, timeout=1000)
                assert probe.err is not None, "probe ran: the first request already finished"
                if QUEUE_FULL.lower() in probe.err.message().lower():
                    probe.assert_rejected(QUEUE_FULL, "probe")
                    break
                probe.assert_rejected(TIMEOUT_EXPIRED, "probe")
                timed_out += 1
            extras = [await c.timed("http", model, x_of(5)), await c.timed("grpc", model, x_of(6))]
            raw = await asyncio.to_thread(http_json, server.http_url, "POST",
                                          f"/v2/models/{model}/infer", body)
            still_running = not first.done()
            return (await first, await asyncio.gather(*queued), extras, raw, still_running,
                    ran, timed_out + overtaken)

    first, queued, extras, raw, still_running, ran, timed_out = run(go())
    assert still_running, "the refusals must come while the first request still runs"
    for o in extras:
        o.assert_rejected(QUEUE_FULL, "request over the limit")
    assert_http_error(raw, 503, QUEUE_FULL)
    first.assert_identity("running request")
    for i, o in enumerate(queued):
        o.assert_identity(f"queued request {i}")
    d = stats_delta(before, stats(http_client, model))
    refused = len(extras) + 1 + 1  # + raw request + the probe that found the queue full
    assert d["success"] == 3 + ran and d["execution"] == 3 + ran, d
    assert d["fail"] == refused + timed_out, d  # timed_out: probes and overtaken requests
    assert failure_metric(server, model, "REJECTED") - rejected_before == refused + timed_out


def test_reject_timeout(server, http_client):
    """REJECT: a request still queued when its queue timeout expires fails with 503 /
    UNAVAILABLE "Request timeout expired" at that time; a request may shorten the timeout but
    not extend it; the running request is not affected by the timeout."""
    model = "identity_timeout"
    default_s = gen_models.SCHED_TIMEOUT_US / 1e6
    assert DELAY_S[model] > 2 * default_s

    async def go():
        async with Clients(server) as c:
            # Under load a probe can reach the server before `first` does: a few more tries.
            for _ in range(8):
                first = c.task("grpc", model, x_of(0))
                if await wait_busy(c, model, first) == 0:
                    break  # the first probe was refused: `first` is running
                # A probe overtook `first` and ran; `first`, queued behind it, may have timed
                # out. Start over.
                await first
            else:
                raise AssertionError("probes kept overtaking the first request")
            queued = await asyncio.gather(
                c.timed("http", model, x_of(1)),
                c.timed("grpc", model, x_of(2)),
                c.timed("grpc", model, x_of(3), timeout=20000),  # shortened to 20 ms
                c.timed("http", model, x_of(4), timeout=10_000_000))  # 10 s: not allowed
            still_running = not first.done()
            return await first, queued, still_running

    first, (h_default, g_default, short, long_), still_running = run(go())
    first.assert_identity("running request")
    assert first.latency >= DELAY_S[model] > default_s
    for what, o in (("default timeout", h_default), ("default timeout", g_default),
                    ("shortened timeout", short), ("extended timeout", long_)):
        o.assert_rejected(TIMEOUT_EXPIRED, what)
    assert still_running, "timed-out requests must be answered at their deadline"
    for o in (h_default, g_default, long_):
        assert o.latency >= default_s, f"rejected after {o.latency:.3f}s, before its timeout"
    assert short.latency < min(h_default.latency, g_default.latency), (
        short.latency, h_default.latency, g_default.latency)


def test_reject_timeout_not_applied_when_not_queued(http_client):
    """An idle instance starts the request at once: a 300 ms execution outlives the 100 ms
    queue timeout and still succeeds."""
    x = x_of(9)
    i = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    i.set_data_from_numpy(x)
    assert_same(http_client.infer("identity_timeout", [i]).as_numpy("OUTPUT0"), x)


def test_delay_timeout_serves_late(server, http_client):
    """DELAY: requests whose queue timeout expired are still served, after the requests that
    did not time out, even ones that arrived later."""
    model = "identity_timeout_delay"
    before = stats(http_client, model)

    async def go():
        async with Clients(server) as c:
            first, ran = await occupy(c, model)
            expired = [c.task("grpc", model, x_of(1), timeout=1000),
                       c.task("http", model, x_of(2), timeout=1000)]
            for _ in range(5):
                await asyncio.sleep(0)  # let the expiring ones go out first
            on_time = c.task("grpc", model, x_of(3))  # default timeout 1 s: does not expire
            return await first, await asyncio.gather(*expired), await on_time, ran

    first, expired, on_time, ran = run(go())
    first.assert_identity("running request")
    on_time.assert_identity("request within its timeout")
    for i, o in enumerate(expired):
        o.assert_identity(f"timed-out request {i}")
        assert o.end > on_time.end, "a timed-out request must run after those that did not"
        assert o.latency >= 2 * DELAY_S[model], "it waited well beyond its 1 ms timeout"
    d = stats_delta(before, stats(http_client, model))
    assert d["success"] == 4 + ran and d["fail"] == 1, d  # the one rejected probe


# ---------------------------------------------------------------------------------------------
# Cancellation


@pytest.mark.parametrize("proto", ["grpc", "http"])
def test_client_gone_while_queued_is_not_executed(server, http_client, proto):
    """A client that gives up (gRPC deadline; HTTP connection closed) while its request waits
    behind a running one: the request is dropped, never executed, and counted as CANCELED."""
    model = "identity_priority"
    before = stats(http_client, model)
    canceled_before = failure_metric(server, model, "CANCELED") or 0

    async def go():
        async with Clients(server) as c:
            first, ran = await occupy(c, model)
            if proto == "grpc":
                gone = await c.timed("grpc", model, x_of(1), client_timeout=0.05)
                assert gone.err is not None, "the request must not complete within 50 ms"
                # DEADLINE_EXCEEDED from the client's own deadline; the server's enforcement
                # of grpc-timeout (tonic) may answer CANCELLED first.
                assert gone.err.status() in ("StatusCode.DEADLINE_EXCEEDED",
                                             "StatusCode.CANCELLED"), gone.err
            else:
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(c.infer("http", model, x_of(1)), 0.05)
            still_running = not first.done()
            first = await first
            # Had the dropped request stayed queued, it would run before this one.
            after = await c.timed("grpc", model, x_of(2))
            return first, after, still_running, ran

    first, after, still_running, ran = run(go())
    assert still_running, "the client must leave while its request is queued"
    first.assert_identity("running request")
    after.assert_identity("request after the canceled one")
    d = stats_delta(before, stats(http_client, model))
    assert d["execution"] == 2 + ran and d["inference"] == 2 + ran, \
        f"the canceled request was executed: {d}"
    assert d["fail"] == 2, d  # the rejected probe and the canceled request
    assert failure_metric(server, model, "CANCELED") - canceled_before == 1


# ---------------------------------------------------------------------------------------------
# Identity backend and warmup


def test_identity_outputs_equal_inputs(http_client, grpc_client):
    """Two inputs of different types; HTTP binary and JSON, gRPC; all or some outputs."""
    model = "identity_warmup_ok"
    x0 = np.array([[1.5, -2.0, 0.0, 3.25], [7.0, 8.5, -9.0, 1e6]], np.float32)
    x1 = np.array([[1, -2, 2**31 - 1], [-(2**31), 0, 5]], np.int32)
    for binary in (True, False):
        ins = [httpclient.InferInput("INPUT0", [2, 4], "FP32"),
               httpclient.InferInput("INPUT1", [2, 3], "INT32")]
        ins[0].set_data_from_numpy(x0, binary_data=binary)
        ins[1].set_data_from_numpy(x1, binary_data=binary)
        res = http_client.infer(model, ins, outputs=[
            httpclient.InferRequestedOutput(o, binary_data=binary) for o in ("OUTPUT0", "OUTPUT1")])
        assert_same(res.as_numpy("OUTPUT0"), x0, f"http binary={binary}")
        assert_same(res.as_numpy("OUTPUT1"), x1, f"http binary={binary}")
        only = http_client.infer(model, ins, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
        assert [o["name"] for o in only.get_response()["outputs"]] == ["OUTPUT1"]
        assert_same(only.as_numpy("OUTPUT1"), x1)
    gins = [grpcclient.InferInput("INPUT0", [2, 4], "FP32"),
            grpcclient.InferInput("INPUT1", [2, 3], "INT32")]
    gins[0].set_data_from_numpy(x0)
    gins[1].set_data_from_numpy(x1)
    res = grpc_client.infer(model, gins)
    assert sorted(o.name for o in res.get_response().outputs) == ["OUTPUT0", "OUTPUT1"]
    assert_same(res.as_numpy("OUTPUT0"), x0, "grpc")
    assert_same(res.as_numpy("OUTPUT1"), x1, "grpc")


def test_warmup_success(http_client, grpc_client):
    model = "identity_warmup_ok"
    assert http_client.is_model_ready(model) and grpc_client.is_model_ready(model)
    cfg = http_client.get_model_config(model)
    assert [w["name"] for w in cfg.get("model_warmup", [])] == ["zeros", "random", "from_file"]
    assert cfg["backend"] == "identity"


@pytest.mark.parametrize("model", sorted(gen_models.WARMUP_BROKEN_MODELS))
def test_warmup_failure_fails_load(server, http_client, grpc_client, model):
    """A warmup sample that cannot be built fails the load: UNAVAILABLE, the reason names the
    sample and the problem; requests are refused."""
    entries = [e for e in http_client.get_model_repository_index() if e["name"] == model]
    assert entries and {e["state"] for e in entries} == {"UNAVAILABLE"}, entries
    reason = " ".join(e.get("reason", "") for e in entries)
    for needle in gen_models.WARMUP_BROKEN_MODELS[model]:
        assert needle in reason, (needle, reason)
    g = [m for m in grpc_client.get_model_repository_index(as_json=True)["models"]
         if m["name"] == model]
    assert g and g[0]["state"] == "UNAVAILABLE" and g[0].get("reason") == entries[0]["reason"], g
    assert not http_client.is_model_ready(model)
    i = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    i.set_data_from_numpy(x_of(0))
    with pytest.raises(InferenceServerException) as e:
        http_client.infer(model, [i])
    assert model in e.value.message()
    assert http_client.is_server_live()
