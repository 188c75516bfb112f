"""`nereid check-config`: lints config files and model directories with the server's own parser
and validation; prints normalized JSON or `file:line:col: message` errors; exit 1 on error."""

import json
import subprocess

from nereid_util import NEREID_BIN


def run(*args):
    p = subprocess.run([NEREID_BIN, "check-config", *map(str, args)], capture_output=True,
                       text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


def test_good_model_directory_prints_normalized_json(test_repo):
    rc, out, err = run(test_repo / "simple")
    assert rc == 0, err
    config = json.loads(out)
    assert config["name"] == "simple"
    assert config["backend"] == "onnxruntime"
    assert config["max_batch_size"] == 8
    assert config["input"][0]["dims"] == [16]
    assert config["instance_group"][0]["kind"] == "KIND_CPU"


def test_errors_carry_file_line_and_column(tmp_path):
    bad = tmp_path / "m" / "config.pbtxt"
    bad.parent.mkdir()
    bad.write_text('name: "m"\nmax_batch_sise: 4\n')
    rc, out, err = run(bad)
    assert rc == 1
    assert f"{bad}:2:1:" in err and "max_batch_sise" in err, err


def test_validation_errors_name_the_field(tmp_path):
    cfg = tmp_path / "config.pbtxt"
    cfg.write_text('name: "m"\nbackend: "onnxruntime"\nmax_batch_size: 4\n'
                   'input [ { name: "x" dims: [ 0 ] } ]\n'
                   'dynamic_batching { preferred_batch_size: [ 8 ] }\n')
    rc, _, err = run(cfg)
    assert rc == 1
    assert "model input 'x' must specify 'data_type'" in err, err
    assert "dimension must be integer >= 1" in err, err
    assert "preferred size must be <= max batch size" in err, err


def test_one_bad_path_fails_the_run_but_all_are_checked(test_repo, tmp_path):
    bad = tmp_path / "config.pbtxt"
    bad.write_text("bogus: 1\n")
    rc, out, err = run(test_repo / "simple", bad, test_repo / "mlp")
    assert rc == 1
    assert out.count('"name"') >= 2, out


def test_auto_complete_fills_from_the_model(test_repo):
    rc, out, err = run("--auto-complete", test_repo / "simple")
    assert rc == 0, err
    assert json.loads(out)["output"][1]["name"] == "OUTPUT1"


def test_model_files_are_checked_against_the_config_as_loading_does(test_repo, tmp_path):
    """A config whose dims disagree with model.onnx passes the text checks but fails the load
    check, with the loader's message; --no-load skips the model file."""
    import shutil

    model = tmp_path / "simple"
    shutil.copytree(test_repo / "simple", model)
    config = model / "config.pbtxt"
    config.write_text(config.read_text().replace("dims: [ 16 ]", "dims: [ 17 ]", 1))
    rc, out, err = run(model)
    assert rc == 1, out
    assert f"{model}: failed to load 'simple' version 1:" in err, err
    assert "INPUT0" in err, err
    rc, out, err = run("--no-load", model)
    assert rc == 0, err


def test_a_repository_is_checked_with_its_ensembles(tmp_path):
    """A repository path expands to its models; an ensemble whose step names a model that is
    not there fails, the other models pass."""
    repo = tmp_path / "repo"
    (repo / "copy" / "1").mkdir(parents=True)
    (repo / "copy" / "config.pbtxt").write_text(
        'backend: "identity"\nmax_batch_size: 4\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]\n')
    (repo / "ens" / "1").mkdir(parents=True)
    (repo / "ens" / "config.pbtxt").write_text(
        'platform: "ensemble"\nmax_batch_size: 4\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'ensemble_scheduling { step [ { model_name: "gone" model_version: -1 '
        'input_map { key: "INPUT0" value: "IN" } output_map { key: "OUTPUT0" value: "OUT" } } ] }\n')
    rc, out, err = run(repo)
    assert rc == 1
    assert '"name": "copy"' in out, out
    assert "composing model 'gone' is not available: it is not in the model repository" in err, err
