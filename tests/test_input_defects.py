"""Issue #12: bad input files get one `Error:` line naming the file and field, exit code 2, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from hardware import load_catalog
from models.graph import MAX_VOCAB, MAX_WIDTH
from models.yamlio import MAX_INPUT_BYTES, UniqueKeyLoader
from planner.cli import cli

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SPEC = "builder: llama\nname: tiny\nnum_layers: 2\nhidden: 64\nheads: 4\nffn: 128\nvocab: 256\n"
HF = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
      "intermediate_size": 128, "vocab_size": 256}
CLUSTER = "name: lab\npools:\n  - name: a\n    preset: dgx-h100\n    nodes: 2\n"
SWEEP = "models: [tiny-llama]\nclusters: [cpu:1]\nbatches: [8]\nseq_lens: [64]\n"


def run(*args) -> object:
    return CliRunner().invoke(cli, [str(a) for a in args])


def estimate(model, cluster="cpu:1", *extra) -> object:
    return run("estimate", model, cluster, "--batch", "8", "--seq-len", "64", *extra)


def sweep(path, tmp_path: Path) -> object:
    return run("sweep", path, "-o", tmp_path / "out")


def one_line_error(result, *fragments: str, exit_code: int = 2) -> str:
    """Exit code as given, exactly one `Error: ...` line on stderr, no traceback anywhere."""
    assert result.exit_code == exit_code, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    err = result.stderr.strip()
    assert err.startswith("Error: ") and "\n" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    return path


# ---------------------------------------------------------------- 1. unreadable input


def test_non_utf8_model_spec_is_one_line_exit_2_in_a_real_process(tmp_path):
    path = write(tmp_path, "utf16.yaml", b"\xff\xfe" + SPEC.encode("utf-16-le"))
    proc = subprocess.run([sys.executable, "-m", "planner", "show", str(path)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith(f"Error: {path}: not UTF-8"), lines


@pytest.mark.parametrize("how", ["show", "estimate"])
def test_latin1_hf_config_is_refused(tmp_path, how):
    text = json.dumps({**HF, "_name_or_path": "café"}, ensure_ascii=False)
    path = write(tmp_path, "config.json", text.encode("latin-1"))
    result = run("show", path) if how == "show" else estimate(path)
    one_line_error(result, str(path), "not UTF-8")


def test_latin1_model_spec_given_to_estimate(tmp_path):
    path = write(tmp_path, "spec.yaml", (SPEC + "source: café\n").encode("latin-1"))
    one_line_error(estimate(path), str(path), "not UTF-8", "byte 0xe9")


def test_non_utf8_cluster_file(tmp_path):
    path = write(tmp_path, "lab.yaml", b"\xff\xfe" + CLUSTER.encode("utf-16-le"))
    one_line_error(estimate("tiny-llama", path), str(path), "not UTF-8")


def test_non_utf8_sweep_file(tmp_path):
    path = write(tmp_path, "sweep.yaml", (SWEEP + "# café\n").encode("latin-1"))
    one_line_error(sweep(path, tmp_path), str(path), "not UTF-8")


def test_utf8_byte_order_mark_is_accepted(tmp_path):
    path = write(tmp_path, "bom.json", b"\xef\xbb\xbf" + json.dumps(HF).encode())
    assert run("show", path).exit_code == 0


def test_directory_given_as_model_cluster_or_sweep(tmp_path):
    folder = tmp_path / "weights"
    folder.mkdir()
    one_line_error(run("show", folder), str(folder), "is a directory")
    one_line_error(estimate(folder), str(folder), "is a directory")
    one_line_error(estimate("tiny-llama", folder), str(folder), "is a directory")
    one_line_error(sweep(folder, tmp_path), str(folder), "is a directory")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_permission_denied(tmp_path):
    path = write(tmp_path, "secret.yaml", SPEC)
    path.chmod(0)
    one_line_error(estimate(path), str(path), "cannot read")
    one_line_error(estimate("tiny-llama", path), str(path), "cannot read")


def test_permission_denied_simulated(tmp_path, monkeypatch):
    # the same as above where the tests run as root, which may read any file
    secret = {write(tmp_path, "model.yaml", SPEC), write(tmp_path, "lab.yaml", CLUSTER),
              write(tmp_path, "sweep.yaml", SWEEP)}
    real_open = Path.open

    def denied(self, *args, **kwargs):
        if self in secret:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", denied)
    one_line_error(estimate(tmp_path / "model.yaml"), "model.yaml", "cannot read", "Permission denied")
    one_line_error(estimate("tiny-llama", tmp_path / "lab.yaml"), "lab.yaml", "cannot read", "Permission denied")
    one_line_error(sweep(tmp_path / "sweep.yaml", tmp_path), "sweep.yaml", "cannot read", "Permission denied")


# ---------------------------------------------------------------- 2, 3. sizes: bounded, strict integers


@pytest.mark.parametrize("line, fragments", [
    ("hidden: 1" + "0" * 160, ("hidden", f"{MAX_WIDTH}")),
    ("hidden: 1.0e+160", ("hidden", "valid integer", "float")),
    ("vocab: 1" + "0" * 320, ("vocab", f"{MAX_VOCAB}")),
    ("vocab: 1.0e+320", ("vocab", "valid integer")),
    ("num_layers: 1000000", ("num_layers", "100000")),
    ("num_layers: 2.0", ("num_layers", "valid integer", "float")),
    ("num_layers: true", ("num_layers", "valid integer", "bool")),
    ("ffn: '128'", ("ffn", "valid integer", "str")),
])
def test_model_spec_sizes_are_bounded_strict_integers(tmp_path, line, fragments):
    key = line.split(":")[0]
    text = "".join(row + "\n" for row in SPEC.splitlines() if not row.startswith(f"{key}:")) + line + "\n"
    path = write(tmp_path, "absurd.yaml", text)
    one_line_error(run("show", path), str(path), *fragments)
    one_line_error(estimate(path), str(path), *fragments)


@pytest.mark.parametrize("key, value, fragments", [
    ("hidden_size", "1e160", ("hidden_size", "valid integer")),
    ("hidden_size", "1" + "0" * 160, ("hidden_size", f"{MAX_WIDTH}")),
    ("vocab_size", "1e320", ("vocab_size", "valid integer")),
    ("vocab_size", "1" + "0" * 320, ("vocab_size", f"{MAX_VOCAB}")),
    ("vocab_size", "1" + "0" * 5000, ("not valid JSON",)),
    ("num_hidden_layers", "true", ("num_hidden_layers", "valid integer", "bool")),
])
def test_hf_config_sizes_are_bounded_strict_integers(tmp_path, key, value, fragments):
    text = json.dumps({**HF, key: "VALUE"}).replace('"VALUE"', value)
    path = write(tmp_path, "config.json", text)
    one_line_error(run("show", path), str(path), *fragments)
    one_line_error(estimate(path), str(path), *fragments)


def test_hf_model_type_of_the_wrong_type(tmp_path):
    path = write(tmp_path, "config.json", json.dumps({**HF, "model_type": []}))
    one_line_error(run("show", path), str(path), "model_type")


def test_raw_graph_and_dlrm_sizes_are_bounded(tmp_path):
    huge = "1" + "0" * 320
    raw = write(tmp_path, "raw.yaml", "name: raw\nfamily: decoder\nhidden: 64\nnum_blocks: 1\nlayers:\n"
                f"  - {{name: embedding, kind: embedding, params: {huge}, hidden: 64, flops_per_token: 0}}\n")
    one_line_error(run("show", raw), str(raw), "layers.0.params")
    dlrm = write(tmp_path, "dlrm.yaml", "builder: dlrm\nname: d\nbottom_mlp: [64]\ntop_mlp: [1]\n"
                 f"tables: [{{rows: {huge}, dim: 64}}]\n")
    one_line_error(run("show", dlrm), str(dlrm), "tables.0.rows")


# ---------------------------------------------------------------- 4. repeated YAML keys


def test_repeated_key_in_cluster_pool(tmp_path):
    path = write(tmp_path, "lab.yaml", CLUSTER + "    nodes: 4\n")
    for result in (estimate("tiny-llama", path), run("show", path)):
        one_line_error(result, str(path), "duplicate key 'nodes'", "line 6", "first at line 5")


def test_repeated_key_in_model_spec_and_sweep(tmp_path):
    spec = write(tmp_path, "spec.yaml", SPEC + "hidden: 128\n")
    one_line_error(estimate(spec), str(spec), "duplicate key 'hidden'", "line 8", "first at line 4")
    plan = write(tmp_path, "sweep.yaml", SWEEP + "batches: [16]\n")
    one_line_error(sweep(plan, tmp_path), str(plan), "duplicate key 'batches'", "line 5", "first at line 3")


def test_unique_key_loader_keeps_merge_keys_and_nested_scopes():
    loader = UniqueKeyLoader
    text = "base: &b {x: 1, y: 2}\nuse: {<<: *b, y: 3}\nother: {x: 5}\n"
    assert yaml.load(text, Loader=loader) == {"base": {"x": 1, "y": 2}, "use": {"x": 1, "y": 3}, "other": {"x": 5}}
    with pytest.raises(yaml.YAMLError, match="duplicate key 'x'"):
        yaml.load("a:\n  x: 1\n  x: 2\n", Loader=loader)


def test_catalog_data_files_have_no_repeated_keys():
    assert load_catalog().devices  # hardware/data/*.yaml load through the same loader


# ---------------------------------------------------------------- 5. input size cap


def _oversized(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    with path.open("wb") as handle:  # sparse: the size is checked before anything is read
        handle.truncate(MAX_INPUT_BYTES + 1)
    return path


@pytest.mark.parametrize("name", ["spec.yaml", "config.json"])
def test_oversized_model_file(tmp_path, name):
    path = _oversized(tmp_path, name)
    one_line_error(estimate(path), str(path), "too large", "8 MiB")
    one_line_error(run("show", path), str(path), "too large")


def test_oversized_hf_folder_config(tmp_path):
    _oversized(tmp_path, "config.json")
    one_line_error(estimate(tmp_path), "config.json", "too large")


def test_oversized_cluster_and_sweep_files(tmp_path):
    cluster = _oversized(tmp_path, "lab.yaml")
    one_line_error(estimate("tiny-llama", cluster), str(cluster), "too large")
    plan = _oversized(tmp_path, "sweep.yaml")
    one_line_error(sweep(plan, tmp_path), str(plan), "too large")


# ---------------------------------------------------------------- 6. messages that name the real problem


def test_directory_without_config_json_says_directory(tmp_path):
    err = one_line_error(estimate(tmp_path), str(tmp_path), "is a directory", "config.json")
    assert "no such file" not in err and "not a zoo name" not in err


def test_cluster_file_without_pools(tmp_path):
    path = write(tmp_path, "lab.yaml", "name: lab\nfabric: {latency: 1.0e-6}\nnodes: 2\n")
    for result in (run("show", path), estimate("tiny-llama", path)):
        err = one_line_error(result, str(path), "pools: Field required", "node pools")
        assert "builder" not in err


def test_show_file_that_is_neither_model_nor_cluster(tmp_path):
    path = write(tmp_path, "what.yaml", "name: what\n")
    one_line_error(run("show", path), str(path), "'builder'", "'pools'")


def test_recsys_seq_len_must_be_one():
    result = run("estimate", "tiny-dlrm", "cpu:1", "--batch", "64", "--seq-len", "8")
    one_line_error(result, "--seq-len", "tiny-dlrm", "recommendation")
    assert run("estimate", "tiny-dlrm", "cpu:1", "--batch", "64", "--seq-len", "1").exit_code in (0, 1)


# ---------------------------------------------------------------- 7. fp8 needs FP8 hardware


def test_fp8_on_a100_is_refused():
    one_line_error(estimate("tiny-llama", "dgx-a100-40g:1", "--precision", "fp8"), "a100-40g", "--precision")


def test_fp8_on_mixed_cluster_with_a100_pool_is_refused():
    cluster = EXAMPLES / "clusters" / "hetero-3pool.yaml"
    one_line_error(estimate("tiny-llama", cluster, "--precision", "fp8"), "a100-80g", "--precision")


def test_fp8_on_h100_still_runs():
    result = estimate("tiny-llama", "dgx-h100:1", "--precision", "fp8")
    assert result.exit_code == 0, result.output


# ---------------------------------------------------------------- 8. show --json totals


def test_show_json_cluster_totals():
    data = json.loads(run("show", EXAMPLES / "clusters" / "hetero-3pool.yaml", "--json").stdout)
    assert data["total_nodes"] == 32 and data["total_gpus"] == 256
    assert data["total_gpus"] == sum(p["count"] * p["node"]["gpus_per_node"] for p in data["pools"])
    data = json.loads(run("show", "dgx-h100:4", "--json").stdout)
    assert (data["total_nodes"], data["total_gpus"]) == (4, 32)


def test_show_json_model_totals():
    data = json.loads(run("show", "mixtral-8x7b", "--json").stdout)
    assert data["params"] == sum(layer["params"] for layer in data["layers"])
    assert 0 < data["active_params"] < data["params"]
