"""Object-store model repositories against a real S3-compatible server (moto, started here on a
free loopback port with IAM checks on): load from s3:// and infer, poll sees a new version and a
deleted one, bad credentials and a missing bucket fail naming the bucket, an unreachable
endpoint fails naming it, and a version whose object cannot be downloaded never half-loads
(the old version keeps serving until the object is fixed)."""

import json
import os
import subprocess
import sys
import time

import boto3  # installed with moto[server] by scripts/setup.sh
import pytest

from nereid_util import (
    NEREID_BIN, Server, free_port, gen_models, http_json, http_raw, loopback_listen_args,
    wait_until,
)

DEADLINE_S = 30
BUCKET = "models"
REGION = "us-east-1"


class Moto:
    """`python -m moto.server` on a free loopback port; IAM authentication is switched on once
    a user with an access key exists, so wrong keys are refused like on AWS."""

    def __init__(self, workdir):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = open(workdir / "moto.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_until(self._up, DEADLINE_S, "moto to listen")
        anon = {"aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
        iam = self.client("iam", **anon)
        iam.create_user(UserName="nereid")
        policy = iam.create_policy(PolicyName="all", PolicyDocument=json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        iam.attach_user_policy(UserName="nereid", PolicyArn=policy["Policy"]["Arn"])
        key = iam.create_access_key(UserName="nereid")["AccessKey"]
        self.key_id, self.secret = key["AccessKeyId"], key["SecretAccessKey"]
        status = http_raw(f"127.0.0.1:{self.port}", "POST", "/moto-api/reset-auth", b"0")[0]
        assert status == 200, "moto did not switch IAM authentication on"
        self.s3 = self.client("s3", aws_access_key_id=self.key_id,
                              aws_secret_access_key=self.secret)
        self.s3.create_bucket(Bucket=BUCKET)

    def _up(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"moto exited with {self.proc.returncode}")
        return http_raw(f"127.0.0.1:{self.port}", "GET", "/moto-api/", timeout=2)[0] == 200

    def client(self, service, **keys):
        return boto3.client(service, endpoint_url=self.endpoint, region_name=REGION, **keys)

    def env(self, key_id=None, secret=None):
        """What a server is started with: these credentials, no other AWS setting."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID=key_id or self.key_id,
                   AWS_SECRET_ACCESS_KEY=secret or self.secret, AWS_REGION=REGION)
        return env

    def url(self, prefix, bucket=BUCKET):
        return f"s3://127.0.0.1:{self.port}/{bucket}/{prefix}"

    def upload_tree(self, local_dir, prefix, storage_class=None):
        """Uploads every file under `local_dir` to `prefix/<relative path>`."""
        for path in sorted(p for p in local_dir.rglob("*") if p.is_file()):
            key = f"{prefix}/{path.relative_to(local_dir).as_posix()}"
            extra = {"StorageClass": storage_class} if storage_class else {}
            self.s3.put_object(Bucket=BUCKET, Key=key, Body=path.read_bytes(), **extra)

    def delete_prefix(self, prefix):
        listed = self.s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix + "/").get("Contents", [])
        for obj in listed:
            self.s3.delete_object(Bucket=BUCKET, Key=obj["Key"])
        return len(listed)

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()


class S3Server(Server):
    """`nereid serve --model-repository <s3 URL>` with the given environment."""

    def __init__(self, url, workdir, extra_args, name, env):
        super().__init__("/unused", workdir, ["--model-cache-dir", str(workdir / f"{name}-cache"),
                                              *extra_args], name=name)
        self.args[self.args.index("--model-repository") + 1] = url
        self.cache = workdir / f"{name}-cache"
        self._env = env

    def environment(self):
        env = super().environment()
        env.update(self._env)
        return env


@pytest.fixture(scope="module")
def moto(tmp_path_factory):
    server = Moto(tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


def versioned(tmp_path_factory, name, versions):
    """A local Triton model folder: version v adds v to its INT32 input."""
    root = tmp_path_factory.mktemp(f"src_{name}")
    return gen_models.write_versioned(root, name, versions=versions)


def infer(server, model):
    return http_json(server.http_url, "POST", f"/v2/models/{model}/infer", {
        "inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "INT32", "data": [5, 6]}]})


def running(server):
    try:
        return server.start()
    except BaseException:
        server.kill()
        raise


def stopped_cleanly(server):
    rc = server.stop()
    assert rc == 0, f"{server.name} exited with {rc}\n{server.log_tail()}"


def test_poll_loads_new_and_deleted_versions_and_never_half_loads(moto, tmp_path_factory):
    """Startup load and infer; version 2 uploaded -> served; version 2 deleted -> back to 1;
    version 3 whose object cannot be downloaded -> not loaded, 1 keeps serving; fixed -> 3."""
    model = versioned(tmp_path_factory, "s3_poll", (1, 2, 3))
    moto.upload_tree(model / "1", "repo_poll/s3_poll/1")
    moto.s3.put_object(Bucket=BUCKET, Key="repo_poll/s3_poll/config.pbtxt",
                       Body=(model / "config.pbtxt").read_bytes())
    workdir = tmp_path_factory.mktemp("poll")
    server = running(S3Server(moto.url("repo_poll"), workdir,
                              ["--model-control-mode", "poll", "--repository-poll-secs", "1"],
                              "s3_poll", moto.env()))
    try:
        status, body = infer(server, "s3_poll")
        assert status == 200 and body["outputs"][0]["data"] == [6, 7], body
        assert (server.cache.rglob("s3_poll/1/model.onnx")).__next__().is_file()

        moto.upload_tree(model / "2", "repo_poll/s3_poll/2")
        wait_until(lambda: infer(server, "s3_poll")[1].get("model_version") == "2",
                   DEADLINE_S, "version 2 to serve")
        assert infer(server, "s3_poll")[1]["outputs"][0]["data"] == [7, 8]

        assert moto.delete_prefix("repo_poll/s3_poll/2") == 1
        wait_until(lambda: infer(server, "s3_poll")[1].get("model_version") == "1",
                   DEADLINE_S, "version 2 to be unloaded")
        ready = http_raw(server.http_url, "GET", "/v2/models/s3_poll/versions/2/ready")[0]
        assert ready != 200

        # An archived object lists like any other but cannot be downloaded (InvalidObjectState).
        moto.upload_tree(model / "3", "repo_poll/s3_poll/3", storage_class="GLACIER")
        wait_until(lambda: "repo_poll/s3_poll/3/model.onnx" in server.log_tail(100_000),
                   DEADLINE_S, "the failed download to be logged")
        status, body = infer(server, "s3_poll")
        assert status == 200 and body["model_version"] == "1", body
        assert not list(server.cache.rglob("s3_poll/3")), "a half-downloaded version is visible"

        moto.upload_tree(model / "3", "repo_poll/s3_poll/3")
        wait_until(lambda: infer(server, "s3_poll")[1].get("model_version") == "3",
                   DEADLINE_S, "version 3 to serve once its object downloads")
        assert infer(server, "s3_poll")[1]["outputs"][0]["data"] == [8, 9]
    finally:
        stopped_cleanly(server)


def test_explicit_mode_downloads_on_load(moto, tmp_path_factory):
    model = versioned(tmp_path_factory, "s3_explicit", (1,))
    moto.upload_tree(model, "repo_explicit/s3_explicit")
    moto.upload_tree(versioned(tmp_path_factory, "s3_other", (1,)), "repo_explicit/s3_other")
    workdir = tmp_path_factory.mktemp("explicit")
    server = running(S3Server(moto.url("repo_explicit"), workdir,
                              ["--model-control-mode", "explicit"], "s3_explicit", moto.env()))
    try:
        assert not list(server.cache.rglob("s3_explicit")), "downloaded before any load"
        status, body = http_json(server.http_url, "POST",
                                 "/v2/repository/models/s3_explicit/load", {})
        assert status == 200, body
        status, body = infer(server, "s3_explicit")
        assert status == 200 and body["outputs"][0]["data"] == [6, 7], body
        assert not list(server.cache.rglob("s3_other")), "only the loaded model is downloaded"

        status, body = http_json(server.http_url, "POST", "/v2/repository/models/nope/load", {})
        assert status == 500 and "nope" in body["error"], (status, body)
    finally:
        stopped_cleanly(server)


@pytest.mark.parametrize("case", ["bad_credentials", "missing_bucket"])
def test_explicit_load_fails_naming_the_bucket_and_the_server_keeps_serving(
        moto, tmp_path_factory, case):
    moto.upload_tree(versioned(tmp_path_factory, "s3_err", (1,)), "repo_err/s3_err")
    workdir = tmp_path_factory.mktemp(case)
    if case == "bad_credentials":
        url, env, needles = moto.url("repo_err"), moto.env("AKIAWRONGWRONGWRONG1", "x"), \
            ["bucket 'models'", "credentials", "InvalidAccessKeyId"]
    else:
        url, env, needles = moto.url("repo_err", bucket="no-such-bucket"), moto.env(), \
            ["bucket 'no-such-bucket' does not exist"]
    server = running(S3Server(url, workdir, ["--model-control-mode", "explicit"], case, env))
    try:
        status, body = http_json(server.http_url, "POST", "/v2/repository/models/s3_err/load", {})
        assert status == 500, (status, body)
        for needle in needles:
            assert needle in body["error"], body
        assert http_raw(server.http_url, "GET", "/v2/health/live")[0] == 200
        index = http_json(server.http_url, "POST", "/v2/repository/index")[1]
        row = next(e for e in index if e["name"] == "s3_err")
        assert row["state"] == "UNAVAILABLE" and needles[0] in row["reason"], row
    finally:
        stopped_cleanly(server)


def run_to_exit(url, env, workdir):
    """`nereid serve` in none mode; returns (exit code, output) once it exits."""
    args = [NEREID_BIN, "serve", "--model-repository", url, "--model-cache-dir",
            str(workdir / "cache"),
            *loopback_listen_args(free_port(), free_port(), free_port())]
    started = time.monotonic()
    proc = subprocess.run(args, env=env, capture_output=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    return proc.returncode, (proc.stdout + proc.stderr).decode(), time.monotonic() - started


@pytest.mark.parametrize("case", ["bad_credentials", "missing_bucket", "unreachable"])
def test_startup_in_none_mode_fails_with_the_store_error(moto, tmp_path_factory, case):
    workdir = tmp_path_factory.mktemp(f"none_{case}")
    dead_port = free_port()
    url, env, needle = {
        "bad_credentials": (moto.url("r"), moto.env("AKIAWRONGWRONGWRONG1", "x"),
                            "access to bucket 'models' was refused"),
        "missing_bucket": (moto.url("r", bucket="absent"), moto.env(),
                           "bucket 'absent' does not exist"),
        "unreachable": (f"s3://127.0.0.1:{dead_port}/models/r", moto.env(),
                        f"endpoint http://127.0.0.1:{dead_port} is unreachable"),
    }[case]
    code, output, elapsed = run_to_exit(url, env, workdir)
    assert code != 0, output
    assert needle in output, output
    assert url in output, output
    assert elapsed < 60, f"took {elapsed:.0f}s to fail"
