#!/usr/bin/env python3
"""The model cache (more models than memory, docs/cluster.md) under a Zipf request mix.

usage: NEREID_BIN=target/release/nereid .venv/bin/python scripts/bench_model_cache.py \
           [--models 200] [--fit 20] [--requests 2000] [--concurrency 4] [--seed 1] \
           [--zipf-s 1.1] [--residency-ms 2000] [--out model-cache.json] \
           [--keep DIR]

Starts a cluster on 127.0.0.1 (one control plane, two workers, one router; the processes of
tests/python/cluster_util.py, as tests/python/test_model_cache.py does), deploys `--models`
identity models (no C heap measured, so placement charges the declared 64 MiB each) with
min_replicas 0 and max_replicas 1, and sends `--requests` tritonclient HTTP inferences through
the router from `--concurrency` threads, models drawn from a seeded Zipf law (rank k with
weight 1/k^s over a seeded shuffle of the names). Two phases on the same mix:

- `cache`: each worker's `--memory-capacity` holds `--fit`/2 replicas (plus 32 MiB slack), so
  the cluster holds `--fit` models; the leader evicts the least recently used idle replica to
  make room (`--evict-min-residency-ms 2000`, see below).
- `all fit`: the workers hold every model; after its first request a model stays loaded, so
  cold starts are first touches only.

Hit or cold start, per request: each client thread scrapes the router's
`nereid_router_scale_from_zero_total{model=...}` (docs/cluster-metrics.md: every request that
found no ready replica of its model and waited for an activation, whether it started the
activation or joined a running one) right before it sends a request and right after the answer.
A request whose model's counter moved in that window is a cold start: the router counted it (or
another request for the same model, in flight at the same time, that found no ready replica
either, so this one was sent while none was ready or while the one it used was going away). A
request whose window saw no such count was served by a replica that was ready when it was sent:
a hit. It is a count of events the router reports, not a guess from latency; over a run the
router's cold requests and the leader's cold starts agree to a few (requests joining a running
activation). The leader's own counters (`nereid_cache_cold_starts_total`,
`nereid_cache_evictions_total`, `nereid_cache_cold_start_seconds`) are read from its metrics
endpoint before and after each phase and reported beside.

Why `--evict-min-residency-ms 2000`: a replica may be evicted only this long after it was
placed. With ~20 places and a cold start every fraction of a second, the default (a minute)
would leave no replica old enough to evict for most of the run, so requests would wait on
young replicas rather than measure the cache; 2 s is still longer than a cold start of these
models plus the request it was loaded for, so a model just loaded is not evicted before it
served the requests that brought it in (the hysteresis the flag exists for). Measured
(docs/benchmarks.md): under this closed loop the cache turns over about once per residency,
whatever the residency (2 s or 300 ms gave the same hit rate); the residency sets the cold-start
p99 (a request that finds only young replicas waits for one to come of age).

Prints a Markdown table; writes the figures (both phases) as JSON to `--out`.
"""

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import tritonclient.http as httpclient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/python"))

from cluster_util import model_body  # noqa: E402
from nereid_util import gen_models, http_raw, wait_until  # noqa: E402
from test_cluster import stop_all  # noqa: E402
from test_model_cache import start_capped_cluster  # noqa: E402

MIB = 1 << 20
MODEL_MEMORY = 64 * MIB


def parse_metrics(text, family):
    """{label value or '': value} for one family's samples (`model` label or none)."""
    out = {}
    for line in text.splitlines():
        if not line.startswith(family) or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        if name_labels == family:
            out[""] = float(value)
        elif name_labels.startswith(family + "{"):
            labels = name_labels[len(family) + 1:-1]
            model = ""
            for part in labels.split(","):
                k, _, v = part.partition("=")
                if k == "model":
                    model = v.strip('"')
            out[model] = out.get(model, 0.0) + float(value)
    return out


def scrape(addr):
    status, _, text = http_raw(addr, "GET", "/metrics", timeout=10)
    if status != 200:
        raise SystemExit(f"metrics {addr}: HTTP {status}")
    return text.decode()


def zipf_mix(names, n, s, seed):
    rng = random.Random(seed)
    ranked = list(names)
    rng.shuffle(ranked)
    weights = [1.0 / (k ** s) for k in range(1, len(ranked) + 1)]
    return rng.choices(ranked, weights=weights, k=n)


def pct(values, p):
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def run_phase(label, workdir, names, capacity, mix, concurrency, residency_ms):
    repo = workdir / "repo"
    repo.mkdir(parents=True)
    sources = {name: gen_models.write_identity(repo, name,
                                               gen_models.identity_backend_config(name, 0))
               for name in names}
    cps, workers, router, cp_metrics = start_capped_cluster(workdir, residency_ms, capacity)
    cp = cps[0]
    procs = [*cps, *workers, router]
    try:
        for name in names:
            body = model_body(name, sources[name], replicas=0, memory=MODEL_MEMORY)
            body["max_replicas"] = 1
            code, answer = cp.api("POST", "/api/v1/models", body)
            if code != 200:
                raise SystemExit(f"deploy {name}: {code} {answer}")
        probe = httpclient.InferenceServerClient(router.http_url, network_timeout=120)
        wait_until(lambda: set(names) <= {m["name"] for m in probe.get_model_repository_index()},
                   60, "the router sees every model")

        router_metrics = f"127.0.0.1:{router.metrics_port}"
        cp_addr = f"127.0.0.1:{cp_metrics}"
        cp_before = scrape(cp_addr)
        results = []  # (model, hit, seconds, error)
        lock = threading.Lock()
        next_index = [0]

        def client_thread():
            client = httpclient.InferenceServerClient(router.http_url, network_timeout=120)
            before = parse_metrics(scrape(router_metrics), "nereid_router_scale_from_zero_total")
            while True:
                with lock:
                    i = next_index[0]
                    if i >= len(mix):
                        return
                    next_index[0] += 1
                model = mix[i]
                x = np.arange(4, dtype=np.float32) + i
                inp = httpclient.InferInput("INPUT0", [4], "FP32")
                inp.set_data_from_numpy(x)
                error = None
                t0 = time.perf_counter()
                try:
                    out = client.infer(model, [inp]).as_numpy("OUTPUT0")
                    if not np.array_equal(out, x):
                        error = f"wrong output {out} for {x}"
                except Exception as e:  # noqa: BLE001 (every failure is counted)
                    error = f"{type(e).__name__}: {e}"
                elapsed = time.perf_counter() - t0
                after = parse_metrics(scrape(router_metrics),
                                      "nereid_router_scale_from_zero_total")
                hit = after.get(model, 0.0) == before.get(model, 0.0)
                before = after
                with lock:
                    results.append((model, hit, elapsed, error))

        t0 = time.perf_counter()
        threads = [threading.Thread(target=client_thread) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        cp_after = scrape(cp_addr)

        def delta(family):
            a, b = parse_metrics(cp_after, family), parse_metrics(cp_before, family)
            return sum(a.values()) - sum(b.values())

        ok = [r for r in results if r[3] is None]
        hits = [r[2] for r in ok if r[1]]
        colds = [r[2] for r in ok if not r[1]]
        failures = [r for r in results if r[3] is not None]
        cold_starts_leader = delta("nereid_cache_cold_starts_total")
        cs_sum = delta("nereid_cache_cold_start_seconds_sum")
        cs_count = delta("nereid_cache_cold_start_seconds_count")
        ms = lambda v: None if v is None else round(v * 1000, 2)  # noqa: E731
        return {
            "phase": label,
            "models": len(names),
            "memory_capacity_bytes_per_worker": capacity,
            "requests": len(results),
            "concurrency": concurrency,
            "wall_s": round(wall, 2),
            "requests_per_s": round(len(results) / wall, 2),
            "hits": len(hits),
            "cold_requests": len(colds),
            "hit_rate": round(len(hits) / len(ok), 4) if ok else None,
            "hit_p50_ms": ms(pct(hits, 50)),
            "hit_p99_ms": ms(pct(hits, 99)),
            "cold_p50_ms": ms(pct(colds, 50)),
            "cold_p99_ms": ms(pct(colds, 99)),
            "cold_starts_leader": cold_starts_leader,
            "cold_starts_per_min": round(cold_starts_leader / wall * 60, 1),
            "leader_cold_start_mean_ms": round(cs_sum / cs_count * 1000, 1) if cs_count else None,
            "evictions": delta("nereid_cache_evictions_total"),
            "failures": len(failures),
            "first_failures": [f"{r[0]}: {r[3]}"[:300] for r in failures[:5]],
        }
    finally:
        stop_all(procs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=int, default=200)
    ap.add_argument("--fit", type=int, default=20, help="models the capped cluster holds")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--zipf-s", type=float, default=1.1)
    ap.add_argument("--residency-ms", type=int, default=2000,
                    help="the control plane's --evict-min-residency-ms")
    ap.add_argument("--out", default="model-cache.json")
    ap.add_argument("--keep", metavar="DIR",
                    help="run each phase in DIR/<phase> and keep its logs (default: a "
                         "temporary directory, removed)")
    args = ap.parse_args()

    names = [f"m{i:03}" for i in range(args.models)]
    mix = zipf_mix(names, args.requests, args.zipf_s, args.seed)
    per_worker = (args.fit + 1) // 2
    phases = [("cache", per_worker * MODEL_MEMORY + 32 * MIB),
              ("all fit", args.models * MODEL_MEMORY + 32 * MIB)]
    rows = []
    for label, capacity in phases:
        with tempfile.TemporaryDirectory(prefix="nereid-bench-cache-") as tmp:
            if args.keep:
                tmp = Path(args.keep) / label.replace(" ", "-")
                tmp.mkdir(parents=True, exist_ok=False)
            print(f"phase {label}: {args.requests} requests over {args.models} models, "
                  f"{capacity // MIB} MiB per worker ...", file=sys.stderr, flush=True)
            rows.append(run_phase(label, Path(tmp), names, capacity, mix, args.concurrency,
                                 args.residency_ms))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)

    print(f"\n{args.requests} requests, Zipf s={args.zipf_s} seed {args.seed} over "
          f"{args.models} models, {args.concurrency} client threads; cache holds {args.fit}\n")
    print("| phase | hit rate | hit p50 (ms) | hit p99 | cold p50 (ms) | cold p99 | "
          "cold starts/min | cold starts | evictions | req/s | failures |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['phase']} | {r['hit_rate']:.1%} | {r['hit_p50_ms']} | {r['hit_p99_ms']} | "
              f"{r['cold_p50_ms']} | {r['cold_p99_ms']} | {r['cold_starts_per_min']} | "
              f"{r['cold_starts_leader']:.0f} | {r['evictions']:.0f} | {r['requests_per_s']} | "
              f"{r['failures']} |")
    Path(args.out).write_text(json.dumps({"args": vars(args), "phases": rows}, indent=2) + "\n")
    if any(r["failures"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
