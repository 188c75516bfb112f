#!/usr/bin/env python3
"""Checks deploy/: the Helm chart, the plain manifests rendered from it, and the image recipe.

Run by `make test-deploy` (part of `make test`). Every failure names the file and the field:

  1. Chart.yaml: apiVersion v2, the chart's directory name, a semver version, and an appVersion
     equal to the nereid crate's version (Cargo.toml).
  2. values.yaml validates against values.schema.json (jsonschema), and every `.Values.x.y` a
     template reads (directly or through a `$v := .Values.x` alias) exists in values.yaml.
  3. `helm lint --strict`, then `helm template` with the default values and with a few variants
     (GPU DaemonSet workers, a mounted model repository, a grown control plane); every rendered
     object validates against the Kubernetes JSON schemas (kubernetes-validate, offline).
  4. deploy/manifests/nereid.yaml equals `helm template` of the chart with its default values
     (and auth.existingSecret, so no token is committed); `--write` regenerates it.
  5. Every `nereid` command line in the rendered pods uses only flags that `$NEREID_BIN
     <subcommand> --help` lists; every `$(VAR)` in args is defined in the container's env; the
     control-plane wrapper script, run with a stub `nereid` for several pod ordinals, gives
     `--node-id` = ordinal + 1 and `--peers` (bootstrapping pods, listing itself at its advertised
     address) or `--join` (later pods); with cluster TLS the worker's wrapper advertises its pod
     DNS name (`<IP with dashes>.<namespace>.pod`).
  6. Router and worker pods have the KServe health probes, and they and control-plane pods the
     prometheus.io annotations that
     point at their metrics port; deploy/Dockerfile pins the ORT_VERSION and TORCH_VERSION of scripts/setup.sh.

Usage: NEREID_BIN=target/release/nereid python scripts/check_deploy.py [--write]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "nereid"
MANIFESTS = ROOT / "deploy" / "manifests" / "nereid.yaml"
# The plain manifests: default values, but the token Secret is left to the operator.
RELEASE = "nereid"
MANIFEST_SETS = ["auth.existingSecret=nereid-token"]
# Kubernetes version whose schemas the rendered objects must satisfy.
KUBE_VERSION = "1.30"
# Value sets rendered besides the defaults, each validated like them.
VARIANTS = {
    "defaults": [],
    "gpu DaemonSet workers": ["worker.kind=DaemonSet", "worker.gpus=2"],
    "model repository mounted": [
        "modelRepository.volume.persistentVolumeClaim.claimName=models",
        "controlPlane.extraArgs={--snapshot-threshold=5000}",
        "worker.extraArgs={--model-queue-size=256}",
        "router.extraArgs={--sequence-idle-timeout-secs=120}",
    ],
    "control plane grown to 5": ["controlPlane.replicas=5"],
    "tokens file": ["auth.tokensSecret=nereid-tokens"],
    "router TLS": ["router.tls.secretName=nereid-router-tls"],
    "cluster mutual TLS": ["cluster.tls.secretName=nereid-cluster-tls"],
    "etcd store": [
        "controlPlane.etcd.endpoints={http://etcd-0.etcd:2379,http://etcd-1.etcd:2379}",
        "controlPlane.etcd.user=nereid",
        "controlPlane.etcd.passwordSecret=nereid-etcd",
    ],
    "etcd store over TLS": [
        "controlPlane.etcd.endpoints={https://etcd-0.etcd:2379,https://etcd-1.etcd:2379}",
        "controlPlane.etcd.tls.secretName=nereid-etcd-tls",
    ],
}
KSERVE_PROBES = {"livenessProbe": "/v2/health/live", "readinessProbe": "/v2/health/ready"}


class Failures:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, message: str) -> None:
        self.items.append(f"{where}: {message}")


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def find_helm() -> str:
    helm = os.environ.get("HELM") or str(ROOT / ".venv" / "bin" / "helm")
    if not (os.path.isfile(helm) and os.access(helm, os.X_OK)):
        found = shutil.which("helm")
        if not found:
            sys.exit(f"check_deploy: no helm at {helm} (run `make setup`) and none on PATH")
        helm = found
    return helm


def helm_template(helm: str, sets: list[str]) -> str:
    cmd = [helm, "template", RELEASE, str(CHART)]
    for s in sets:
        cmd += ["--set", s]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed:\n{out.stderr.strip()}")
    return out.stdout


def manifest_header() -> str:
    sets = " ".join(f"--set {s}" for s in MANIFEST_SETS)
    return (
        "# Generated from deploy/helm/nereid with its default values; do not edit by hand.\n"
        f"# Regenerate: helm template {RELEASE} deploy/helm/nereid {sets}\n"
        "#   (or: .venv/bin/python scripts/check_deploy.py --write)\n"
        "# Create the admin token Secret first:\n"
        "#   kubectl create secret generic nereid-token --from-literal=token=\"$(head -c 32 /dev/urandom | base64)\"\n"
    )


# 1. Chart.yaml


def check_chart_yaml(f: Failures) -> None:
    path = CHART / "Chart.yaml"
    chart = yaml.safe_load(path.read_text())
    where = rel(path)
    if chart.get("apiVersion") != "v2":
        f.add(where, f"apiVersion: expected v2, got {chart.get('apiVersion')!r}")
    if chart.get("name") != CHART.name:
        f.add(where, f"name: expected {CHART.name!r} (the chart's directory), got {chart.get('name')!r}")
    if not re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", str(chart.get("version", ""))):
        f.add(where, f"version: {chart.get('version')!r} is not semver")
    cargo = (ROOT / "Cargo.toml").read_text()
    m = re.search(r'^\[package\][^\[]*?^version\s*=\s*"([^"]+)"', cargo, re.M | re.S)
    if m and str(chart.get("appVersion")) != m.group(1):
        f.add(where, f"appVersion: {chart.get('appVersion')!r} differs from the nereid crate's version {m.group(1)!r} (Cargo.toml)")
    for field in ("description", "type"):
        if not chart.get(field):
            f.add(where, f"{field}: missing")


# 2. values


def check_values(f: Failures) -> dict:
    values_path, schema_path = CHART / "values.yaml", CHART / "values.schema.json"
    values = yaml.safe_load(values_path.read_text())
    schema = json.loads(schema_path.read_text())
    validator = jsonschema.Draft7Validator(schema)
    for err in sorted(validator.iter_errors(values), key=lambda e: list(e.path)):
        field = ".".join(str(p) for p in err.path) or "(top level)"
        f.add(rel(values_path), f"{field}: {err.message} (per {rel(schema_path)})")
    refs = set()
    for tpl in sorted((CHART / "templates").glob("*")):
        text = tpl.read_text()
        aliases = dict(re.findall(r"\$(\w+)\s*:?=\s*\.Values((?:\.\w+)+)", text))
        for m in re.finditer(r"\.Values((?:\.\w+)+)", text):
            refs.add((tpl, m.group(1)))
        for m in re.finditer(r"\$(\w+)((?:\.\w+)+)", text):
            if m.group(1) in aliases:
                refs.add((tpl, aliases[m.group(1)] + m.group(2)))
    for tpl, ref in sorted(refs, key=lambda r: (r[0].name, r[1])):
        node = values
        for key in ref.strip(".").split("."):
            if not isinstance(node, dict) or key not in node:
                f.add(rel(tpl), f".Values{ref}: not in {rel(values_path)}")
                break
            node = node[key]
    return values


# 3. render and validate


def check_render(f: Failures, helm: str) -> dict[str, list[dict]]:
    lint = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True)
    if lint.returncode != 0:
        f.add(rel(CHART), f"helm lint --strict failed:\n{lint.stdout}{lint.stderr}")
    rendered = {}
    for name, sets in VARIANTS.items():
        try:
            docs = [d for d in yaml.safe_load_all(helm_template(helm, sets)) if d]
        except (RuntimeError, yaml.YAMLError) as e:
            f.add(rel(CHART), f"values '{name}': {e}")
            continue
        for doc in docs:
            kind, obj = doc.get("kind"), doc.get("metadata", {}).get("name")
            try:
                kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                path = ".".join(str(p) for p in e.path) or "(object)"
                f.add(rel(CHART), f"values '{name}': {kind}/{obj}: {path}: {e.message}")
        rendered[name] = docs
    return rendered


# 4. plain manifests


def check_manifests(f: Failures, helm: str, write: bool) -> None:
    expected = manifest_header() + helm_template(helm, MANIFEST_SETS)
    if write:
        MANIFESTS.write_text(expected)
        print(f"check_deploy: wrote {rel(MANIFESTS)}")
        return
    actual = MANIFESTS.read_text() if MANIFESTS.exists() else ""
    if actual != expected:
        a, e = actual.splitlines(), expected.splitlines()
        line = next((i for i, (x, y) in enumerate(zip(a, e)) if x != y), min(len(a), len(e)))
        got = a[line] if line < len(a) else "(end of file)"
        want = e[line] if line < len(e) else "(end of file)"
        f.add(
            rel(MANIFESTS),
            f"line {line + 1}: differs from the chart's rendering (has {got!r}, the chart gives "
            f"{want!r}); regenerate with `.venv/bin/python scripts/check_deploy.py --write`",
        )


# 5. command lines


def help_flags(nereid: str, sub: str, cache: dict) -> set[str]:
    if sub not in cache:
        out = subprocess.run([nereid, sub, "--help"], capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(f"`{nereid} {sub} --help` failed: {out.stderr.strip()}")
        cache[sub] = set(re.findall(r"^\s+(?:-\w, )?(--[a-z0-9-]+)", out.stdout, re.M))
    return cache[sub]


def wrapper_argv(container: dict, pod: str, env: dict[str, str] | None = None) -> list[str]:
    """Runs a `sh -c` container command with a stub `nereid` that prints its arguments."""
    with tempfile.TemporaryDirectory() as tmp:
        stub = Path(tmp) / "nereid"
        stub.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
        stub.chmod(0o755)
        out = subprocess.run(
            container["command"] + container.get("args", []),
            env={"PATH": f"{tmp}:/usr/bin:/bin", "POD_NAME": pod, **(env or {})},
            capture_output=True,
            text=True,
        )
    if out.returncode != 0:
        raise RuntimeError(f"the container script failed for pod {pod}: {out.stderr.strip()}")
    return out.stdout.splitlines()


def flag_value(argv: list[str], flag: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def check_argv(f: Failures, where: str, argv: list[str], container: dict, nereid: str, cache: dict) -> None:
    if not argv:
        f.add(where, "no nereid command line")
        return
    sub = argv[0]
    try:
        known = help_flags(nereid, sub, cache)
    except RuntimeError as e:
        f.add(where, str(e))
        return
    for i, arg in enumerate(argv[1:], start=1):
        if not isinstance(arg, str) or not arg:
            f.add(where, f"argument {i} (after {argv[i - 1]!r}) is empty: a value the template reads is missing")
            continue
        if arg.startswith("--"):
            flag = arg.split("=", 1)[0]
            if flag not in known:
                f.add(where, f"`nereid {sub}` has no flag {flag} (see `nereid {sub} --help`)")
    env = {e["name"] for e in container.get("env", [])}
    for arg in container.get("args", []):
        for var in re.findall(r"\$\((\w+)\)", str(arg)):
            if var not in env:
                f.add(where, f"args use $({var}) but env defines no {var}")


def check_control_plane(f: Failures, where: str, sts: dict, container: dict, nereid: str, cache: dict) -> None:
    replicas = sts["spec"]["replicas"]
    sts_name = sts["metadata"]["name"]
    peers_seen = None
    for ordinal in sorted({0, replicas - 1, replicas}):
        pod = f"{sts_name}-{ordinal}"
        try:
            argv = wrapper_argv(container, pod)
        except RuntimeError as e:
            f.add(where, str(e))
            return
        check_argv(f, f"{where} (pod {pod})", argv, {}, nereid, cache)
        node_id = flag_value(argv, "--node-id")
        if node_id != str(ordinal + 1):
            f.add(where, f"pod {pod}: --node-id is {node_id!r}, expected {ordinal + 1} (ordinal + 1)")
        advertise = flag_value(argv, "--advertise-address")
        peers, join = flag_value(argv, "--peers"), flag_value(argv, "--join")
        if flag_value(argv, "--store") == "etcd":
            # Stateless pods sharing an etcd: no Raft membership flags (the binary refuses them).
            if peers is not None or join is not None or not flag_value(argv, "--etcd-endpoints"):
                f.add(where, f"pod {pod}: --store etcd needs --etcd-endpoints and no --peers/--join")
        elif (peers is None) == (join is None):
            f.add(where, f"pod {pod}: needs exactly one of --peers and --join")
        elif peers is not None:
            if peers_seen is not None and peers != peers_seen:
                f.add(where, f"pod {pod}: --peers differs between bootstrapping pods")
            peers_seen = peers
            if f"{ordinal + 1}={advertise}" not in peers.split(","):
                f.add(where, f"pod {pod}: --peers {peers} does not list itself as {ordinal + 1}={advertise}")
        elif ordinal == 0:
            f.add(where, f"pod {pod}: the first pod must bootstrap with --peers, not --join")


def check_worker_wrapper(f: Failures, where: str, container: dict, nereid: str, cache: dict) -> None:
    """With cluster TLS a worker's wrapper advertises its pod DNS name (dashed IP.namespace.pod)."""
    env = {"POD_IP": "10.1.2.3", "POD_NAMESPACE": "serving"}
    try:
        argv = wrapper_argv(container, "nereid-worker-abc", env)
    except RuntimeError as e:
        f.add(where, str(e))
        return
    check_argv(f, where, argv, container, nereid, cache)
    advertise = flag_value(argv, "--advertise-host")
    if advertise != "10-1-2-3.serving.pod":
        f.add(where, f"--advertise-host is {advertise!r} for pod IP 10.1.2.3 in namespace serving, expected '10-1-2-3.serving.pod'")
    if "--cluster-tls-cert" not in argv:
        f.add(where, "a worker wrapper script without --cluster-tls-cert")


def check_pods(f: Failures, rendered: dict[str, list[dict]], nereid: str) -> None:
    cache: dict = {}
    for variant, docs in rendered.items():
        for doc in docs:
            spec = doc.get("spec", {}).get("template", {}).get("spec")
            if not spec:
                continue
            component = doc["metadata"].get("labels", {}).get("app.kubernetes.io/component")
            where = f"{rel(CHART)} (values '{variant}') {doc['kind']}/{doc['metadata']['name']}"
            annotations = doc["spec"]["template"]["metadata"].get("annotations", {})
            for c in spec["containers"]:
                cwhere = f"{where} container {c['name']}"
                if c.get("command"):
                    if doc["kind"] == "StatefulSet":
                        check_control_plane(f, cwhere, doc, c, nereid, cache)
                    elif component == "worker":
                        check_worker_wrapper(f, cwhere, c, nereid, cache)
                    else:
                        f.add(cwhere, "only the control plane and (with cluster TLS) workers run a wrapper script")
                else:
                    check_argv(f, cwhere, c.get("args", []), c, nereid, cache)
                if component in ("router", "worker"):
                    for probe, path in KSERVE_PROBES.items():
                        got = c.get(probe, {}).get("httpGet", {}).get("path")
                        if got != path:
                            f.add(cwhere, f"{probe}.httpGet.path is {got!r}, expected {path}")
                if component in ("router", "worker", "control-plane"):
                    metrics = {p["containerPort"] for p in c.get("ports", []) if p.get("name") == "metrics"}
                    if annotations.get("prometheus.io/scrape") != "true":
                        f.add(where, "pod annotation prometheus.io/scrape is not \"true\"")
                    elif {int(annotations.get("prometheus.io/port", 0))} != metrics:
                        f.add(where, f"prometheus.io/port {annotations.get('prometheus.io/port')!r} is not the metrics port {sorted(metrics)}")
                    if annotations.get("prometheus.io/path") != "/metrics":
                        f.add(where, "pod annotation prometheus.io/path is not /metrics")
                if component == "worker" and variant == "gpu DaemonSet workers":
                    gpus = c.get("resources", {}).get("requests", {}).get("nvidia.com/gpu")
                    if gpus != 2:
                        f.add(cwhere, f"resources.requests['nvidia.com/gpu'] is {gpus!r} with worker.gpus=2")


# 6. Dockerfile


def check_dockerfile(f: Failures) -> None:
    docker = ROOT / "deploy" / "Dockerfile"
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    for pin in ("ORT_VERSION", "TORCH_VERSION"):
        want = re.search(rf"^{pin}=(\S+)", setup, re.M)
        got = re.search(rf"^ARG {pin}=(\S+)", docker.read_text(), re.M)
        if not (want and got) or want.group(1) != got.group(1):
            f.add(rel(docker), f"ARG {pin}={got and got.group(1)} differs from scripts/setup.sh {pin}={want and want.group(1)}")
    # The server finds the Python stub's compiled core next to its executable only.
    copies = [line for line in docker.read_text().splitlines() if line.startswith("COPY")]
    if not any("/out/nereid " in c and "libnereid_stub_core.so" in c for c in copies):
        f.add(rel(docker), "the runtime image must copy libnereid_stub_core.so next to the nereid binary "
                           "(the Python backend's compiled stub core)")
    # Likewise the PyTorch backend library, opened on the first PyTorch model load.
    if not any("/out/nereid " in c and "libnereid_torch_backend.so" in c for c in copies):
        f.add(rel(docker), "the runtime image must copy libnereid_torch_backend.so next to the nereid binary "
                           "(the PyTorch backend library)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"regenerate {rel(MANIFESTS)}")
    args = parser.parse_args()
    nereid = os.environ.get("NEREID_BIN")
    if not nereid or not os.access(nereid, os.X_OK):
        sys.exit("check_deploy: set NEREID_BIN to the nereid binary (make build)")
    helm = find_helm()
    f = Failures()
    check_chart_yaml(f)
    check_values(f)
    rendered = check_render(f, helm)
    try:
        check_manifests(f, helm, args.write)
    except RuntimeError as e:
        f.add(rel(MANIFESTS), str(e))
    check_pods(f, rendered, nereid)
    check_dockerfile(f)
    if f.items:
        print(f"check_deploy: FAILED, {len(f.items)} problem(s):", file=sys.stderr)
        for item in f.items:
            print(f"  - {item}", file=sys.stderr)
        return 1
    objects = sum(len(d) for d in rendered.values())
    print(f"check_deploy: ok ({len(rendered)} value sets, {objects} objects valid for Kubernetes {KUBE_VERSION}, "
          f"{rel(MANIFESTS)} up to date, nereid flags checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
