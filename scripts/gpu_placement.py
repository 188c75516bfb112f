"""The GPU check's cluster section: a control plane and one worker on this machine.

  cluster    the worker's GPU report (NVML) as the control plane shows it, the Python model
             deployed with `resources.gpus: 1` placed on a GPU, the GPU memory the worker
             measured for the replica, and an inference through the worker (issue 19)
  placement  GPU memory filling up (issue 39): a second model on the same one-GPU node whose
             declared GPU memory fits the GPU alone but not beside the first one's measured use
             (GPU total - half of what the first measured) must be refused (left unplaced,
             rule NoGpuCapacity) or placed on another GPU; the control plane's explanation is
             recorded

On --dry-run-cpu the worker has no GPU: both models stay unplaced and the records say why
(the same API calls and waits as on the GPU machine).
"""

import shutil

import numpy as np

from gpu_lib import S, grpc_client, infer, step

GIB = 1 << 30


def gpus_of(node):
    return node.get("node", {}).get("capacity", {}).get("gpus", [])


def placed_or_pending(cp, model):
    """The model's placement once a replica is READY (or FAILED) or a replica is pending with a
    reason; None while neither."""
    placement = cp.api("GET", f"/api/v1/models/{model}/placement")[1]
    replicas = placement.get("replicas", [])
    if any(r["state"] in ("REPLICA_STATE_READY", "REPLICA_STATE_FAILED") for r in replicas):
        return placement
    if placement.get("pending"):
        return placement
    return None


def deploy(cp, name, source, gpu_memory):
    from cluster_util import model_body
    body = model_body(name, source, replicas=1, memory=2 << 30)
    body["resources"].update({"gpus": 1, "gpu_memory_bytes": int(gpu_memory)})
    code, answer = cp.api("POST", "/api/v1/models", body)
    if code != 200:
        raise RuntimeError(f"deploy {name}: {code} {answer}")


@step("cluster")
def first_model(cp, worker, source, reference):
    from nereid_util import wait_until
    wait_until(lambda: cp.api("GET", "/api/v1/nodes")[1].get("nodes"), 60, "worker registered")
    node = cp.api("GET", "/api/v1/nodes/gpu-worker")[1]
    deploy(cp, "py_gpu", source, 8 * GIB)
    placement = wait_until(lambda: placed_or_pending(cp, "py_gpu"), 120,
                           "py_gpu ready, failed or pending")
    result = {"node": node, "placement": placement}
    if not gpus_of(node):
        if S.dry:
            return {**result, "dry_run": "the node has no GPU: py_gpu is left unplaced"}
        raise RuntimeError("the worker reported no GPU")
    ready = [r for r in placement["replicas"] if r["state"] == "REPLICA_STATE_READY"]
    if not ready:
        raise RuntimeError(f"py_gpu not ready: {placement}")
    # The measured GPU memory arrives with the next heartbeat after the load.
    measured = wait_until(
        lambda: [r for r in cp.api("GET", "/api/v1/models/py_gpu")[1].get("replicas", [])
                 if int(r.get("measured_gpu_memory_bytes", 0))], 30, "measured GPU memory")
    x = np.random.default_rng(4).standard_normal((2, S.width), dtype=np.float32)
    y = infer(grpc_client(worker.grpc_port), "py_gpu", x)
    np.testing.assert_allclose(y, reference(x), rtol=1e-3, atol=1e-3)
    return {**result, "measured": measured}


@step("placement")
def second_model(cp, source):
    """A second model that fits the GPU alone but not beside the first: refused or elsewhere."""
    from nereid_util import wait_until
    node = cp.api("GET", "/api/v1/nodes/gpu-worker")[1]
    gpus = gpus_of(node)
    first = cp.api("GET", "/api/v1/models/py_gpu")[1].get("replicas", [])
    measured = max([int(r.get("measured_gpu_memory_bytes", 0)) for r in first] or [0])
    total = int(gpus[0]["memory_bytes"]) if gpus else 80 * GIB
    # Fits an empty GPU; beside the first model's measured use, it does not.
    declared = total - max(measured, 2 * GIB) // 2
    deploy(cp, "py_gpu_b", source, declared)
    placement = wait_until(lambda: placed_or_pending(cp, "py_gpu_b"), 60,
                           "py_gpu_b placed or pending")
    pending = placement.get("pending", [])
    placed = [r for r in placement.get("replicas", []) if r.get("gpus")]
    result = {"gpu_total_bytes": total, "first_measured_bytes": measured,
              "declared_bytes": declared, "placement": placement,
              "explanation": [p.get("explanation") or p for p in pending]}
    if not gpus:
        if S.dry:
            return {**result, "dry_run": "the node has no GPU: the second model is unplaced too"}
        raise RuntimeError("the worker reported no GPU")
    first_gpus = {g for r in first for g in r.get("gpus", [])}
    elsewhere = [r for r in placed if r["node"] != "gpu-worker" or not first_gpus & set(r["gpus"])]
    if pending and not placed:
        return {**result, "outcome": "refused: left unplaced"}
    if elsewhere and len(elsewhere) == len(placed):
        return {**result, "outcome": f"placed elsewhere: {[(r['node'], r['gpus']) for r in elsewhere]}"}
    raise RuntimeError(f"the second model was placed beside the first: {placement}")


def run(nereid, repo, source, reference):
    """Both steps in one cluster. `source`: the model directory deployed (twice)."""
    from cluster_util import ControlPlaneNode, WorkerProcess, write_token
    work = S.work / "cluster"
    shutil.rmtree(work, ignore_errors=True)  # a fresh control plane each run (no old state)
    work.mkdir(parents=True)
    token = write_token(work)
    cp = ControlPlaneNode(1, work, token).spawn()
    worker = WorkerProcess("gpu-worker", work, token, [cp.grpc_addr]).spawn()
    try:
        if first_model(cp, worker, source, reference)["ok"]:
            second_model(cp, source)
    finally:
        for p in (worker, cp):
            p.stop()
            shutil.copy(p.log_path, S.logs)
