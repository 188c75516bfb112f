"""Cluster deploys from an object store, end to end: a real S3-compatible server (moto, with IAM
checks on, as in test_object_store.py), a one-node control plane and a worker that both read
credentials from their environment, and `nereid ctl models deploy NAME --source s3://...`.

Covered: a deploy waits until the worker mirrored and loaded the model and inference computes
the model's arithmetic; a new version uploaded and deployed again is what serves; a source with
no version folders and a missing bucket are refused naming the source / the bucket; an ensemble
whose composing models are registered from s3:// too is mirrored on the worker and infers, and
one whose composing model's bucket is missing fails naming that model and bucket."""

import os
import subprocess

import numpy as np
import pytest
import tritonclient.http as httpclient

from cluster_util import ControlPlaneNode, WorkerProcess, leader_of, replicas, write_token
from nereid_util import NEREID_BIN, gen_models, wait_until
from test_object_store import BUCKET, REGION, Moto

CTL_TIMEOUT_S = 90
WAIT_S = "60"


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    server = Moto(tmp_path_factory.mktemp("moto_deploy"))
    yield server
    server.stop()


class Cluster:
    """One control-plane node and one worker, started with moto's credentials and no other AWS
    setting (the endpoint is in each source URL)."""

    def __init__(self, workdir, moto):
        self.workdir = workdir
        self.token = write_token(workdir)
        self.cp = ControlPlaneNode(1, workdir, self.token)
        self.worker = WorkerProcess("w1", workdir, self.token, [self.cp.grpc_addr])
        with pytest.MonkeyPatch.context() as env:
            for key in [k for k in os.environ if k.startswith("AWS_")]:
                env.delenv(key)
            env.setenv("AWS_ACCESS_KEY_ID", moto.key_id)
            env.setenv("AWS_SECRET_ACCESS_KEY", moto.secret)
            env.setenv("AWS_REGION", REGION)
            self.cp.spawn()
            leader_of([self.cp])
            self.worker.spawn()
        self.worker.wait_live()

    def ctl(self, *args):
        command = [NEREID_BIN, "ctl", "--control-plane", self.cp.grpc_addr,
                   "--token-file", str(self.token), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=CTL_TIMEOUT_S)

    def deploy(self, name, source, *extra, versions="latest:1"):
        return self.ctl("models", "deploy", name, "--source", source, "--versions", versions,
                        "--memory", "64Mi", *extra)

    def deployed(self, name, source, replicas=1):
        extra = ["--replicas", str(replicas)]
        if replicas:
            extra += ["--wait", "--timeout", WAIT_S]
        out = self.deploy(name, source, *extra)
        assert out.returncode == 0, (f"deploy {name}: {out.stdout}\n{out.stderr}\n"
                                     f"{self.worker.log_tail()}")
        return out

    def names(self):
        code, body = self.cp.api("GET", "/api/v1/models?consistency=linearizable")
        assert code == 200, (code, body)
        return sorted(m["model"]["name"] for m in body.get("models", []))

    def stop(self):
        for process in (self.worker, self.cp):
            process.kill()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, moto):
    c = Cluster(tmp_path_factory.mktemp("s3_cluster"), moto)
    try:
        yield c
    finally:
        c.stop()


def upload_model(moto, local_model_dir, prefix):
    """Uploads a Triton model folder; a version folder with no files (an ensemble's) gets an
    empty `.keep` object, since an object store has no empty folders."""
    moto.upload_tree(local_model_dir, prefix)
    for sub in local_model_dir.iterdir():
        if sub.is_dir() and not any(p.is_file() for p in sub.rglob("*")):
            moto.s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{sub.name}/.keep", Body=b"")


def add_const(worker, model, values):
    client = httpclient.InferenceServerClient(worker.http_url)
    x = np.array([values], dtype=np.int32)
    inp = httpclient.InferInput("INPUT0", list(x.shape), "INT32")
    inp.set_data_from_numpy(x)
    return client.infer(model, [inp]).as_numpy("OUTPUT0")


def test_deploy_from_s3_serves_and_a_new_version_replaces_the_old(cluster, moto,
                                                                  tmp_path_factory):
    src = tmp_path_factory.mktemp("s3_src")
    gen_models.write_versioned(src, "adder", versions=(1,))
    upload_model(moto, src / "adder", "deploy/adder")
    source = moto.url("deploy/adder")

    cluster.deployed("adder", source)
    np.testing.assert_array_equal(add_const(cluster.worker, "adder", [5, 6]), [[6, 7]])
    [replica] = replicas(cluster.cp, "adder")
    assert replica["state"] == "REPLICA_STATE_READY", replica
    cache = cluster.workdir / "w1-work" / "model-cache"
    assert any(cache.rglob("adder/1/model.onnx")), "the worker mirrored the source"

    # Version 2 uploaded; deploying again lists the source anew and serves the newest.
    version2 = tmp_path_factory.mktemp("s3_src_v2")
    gen_models.write_versioned(version2, "adder", versions=(2,))
    moto.upload_tree(version2 / "adder" / "2", "deploy/adder/2")
    cluster.deployed("adder", source)
    np.testing.assert_array_equal(add_const(cluster.worker, "adder", [5, 6]), [[7, 8]])
    client = httpclient.InferenceServerClient(cluster.worker.http_url)
    assert client.is_model_ready("adder", "2")
    wait_until(lambda: {str(r["version"]) for r in replicas(cluster.cp, "adder")} == {"2"},
               30, "only version 2 placed")


def test_unusable_s3_sources_are_refused_naming_them(cluster, moto, tmp_path_factory):
    src = tmp_path_factory.mktemp("s3_empty")
    gen_models.write_versioned(src, "empty", versions=(1,))
    moto.s3.put_object(Bucket=BUCKET, Key="refused/empty/config.pbtxt",
                       Body=(src / "empty" / "config.pbtxt").read_bytes())
    source = moto.url("refused/empty")
    out = cluster.deploy("empty", source, "--replicas", "1")
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert f"'{source}' has no numeric version folders" in out.stderr, out.stderr
    assert "source" in out.stderr, out.stderr

    missing = moto.url("repo/empty", bucket="no-such-bucket")
    out = cluster.deploy("empty", missing, "--replicas", "1")
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "bucket 'no-such-bucket' does not exist" in out.stderr, out.stderr
    assert "empty" not in cluster.names()


def test_an_ensemble_and_its_composing_models_deploy_from_s3(cluster, moto, tmp_path_factory):
    repo = gen_models.write_repository(tmp_path_factory.mktemp("s3_ens"), "ensemble")
    for name in ("ens_scale", "ens_addsub", "ens_pipeline"):
        upload_model(moto, repo / name, f"ens/{name}")
    # The composing models are registered (their sources known) but not placed on their own.
    # First ens_scale from a bucket that does not exist (a specific version is not listed by
    # the control plane): the worker cannot fetch it, and the ensemble's failure says why.
    out = cluster.deploy("ens_scale", moto.url("ens/ens_scale", bucket="no-such-bucket"),
                         "--replicas", "0", versions="1")
    assert out.returncode == 0, out.stderr
    cluster.deployed("ens_addsub", moto.url("ens/ens_addsub"), replicas=0)
    out = cluster.deploy("ens_early", moto.url("ens/ens_pipeline"), "--replicas", "1", "--wait",
                         "--timeout", WAIT_S, "--config-override", '{"name": "ens_early"}')
    assert out.returncode == 1, (out.stdout, out.stderr)
    assert "composing model 'ens_scale'" in out.stderr, out.stderr
    assert "bucket 'no-such-bucket' does not exist" in out.stderr, out.stderr
    out = cluster.ctl("models", "delete", "ens_early")
    assert out.returncode == 0, out.stderr

    cluster.deployed("ens_scale", moto.url("ens/ens_scale"), replicas=0)
    cluster.deployed("ens_pipeline", moto.url("ens/ens_pipeline"))

    client = httpclient.InferenceServerClient(cluster.worker.http_url)
    x = np.array([[1, 2, 3, 4]], dtype=np.float32)
    inp = httpclient.InferInput("IN", [1, 4], "FP32")
    inp.set_data_from_numpy(x)
    result = client.infer("ens_pipeline", [inp])
    np.testing.assert_allclose(result.as_numpy("SUM"), 3 * x)
    np.testing.assert_allclose(result.as_numpy("DIFF"), x)
    assert replicas(cluster.cp, "ens_scale") == [], "composing models get no replica of their own"
    cache = cluster.workdir / "w1-work" / "model-cache"
    for name in ("ens_scale", "ens_addsub"):
        assert any(cache.rglob(f"{name}/1/model.onnx")), f"{name} mirrored from the store"
