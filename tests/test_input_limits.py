"""Issue #26, defects 7-16: inputs at their limits get one line and exit 2 (or a correct result), never a
traceback: replan onto a size the old layout cannot use, absurd numbers, edited or nested plan.json, bf16
and fp8 where the GPUs have none, booleans and strings where numbers belong, repeated JSON keys, clock
limits, FIFOs and escape sequences.  (The trainer's and the data writer's are in tests/test_trainer.py and
tests/test_data.py.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from planner.cli import cli

TINY = ["-b", "8", "-s", "64", "--time-limit", "5"]


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def one_line(result, *fragments: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output)
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def old(tmp_path_factory) -> Path:
    """A plan of tiny-llama on cpu:2 (8 GPUs) with dp=8."""
    out = tmp_path_factory.mktemp("old") / "plan"
    result = run("compile", "tiny-llama", "cpu:2", *TINY, "--fix", "tp=1,pp=1,cp=1", "-o", out)
    assert result.exit_code == 0, result.output
    return out / "plan.json"


def _edited(old: Path, tmp_path: Path, edit) -> Path:
    data = json.loads(old.read_text())
    edit(data)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    return path


# ---------------------------------------------------------------- 7: a size the old layout cannot use


def test_replan_onto_nodes_the_search_fills_otherwise_keeps_a_plan_that_runs(old, tmp_path):
    # cpu:3 has 12 GPUs: the search's plans use all 12, the kept layout 8 of them; the plan written is the
    # chosen one, with only runners-up that run on its nodes
    result = run("replan", old, "cpu:3", "-o", tmp_path / "new", "--json")
    assert result.exit_code == 0, result.output
    plan = json.loads((tmp_path / "new" / "plan.json").read_text())
    gpus = plan["job"]["num_gpus"]
    for runner in plan["runners_up"]:
        spec = dict(item.split("=") for item in runner["strategy_spec"].split(","))
        assert int(spec["tp"]) * int(spec["pp"]) * int(spec["cp"]) * int(spec["dp"]) == gpus, runner


# ---------------------------------------------------------------- 8: tracebacks


@pytest.mark.parametrize("args, fragment", [
    (["--objective", "cost", "--max-step-time", "inf"], "--max-step-time"),
    (["--objective", "cost", "--max-step-time", "9.3e9"], "--max-step-time"),
    (["--objective", "cost", "--max-step-time", "nan"], "--max-step-time"),
    (["--time-limit", "nan"], "--time-limit"),
])
def test_compile_numbers_beyond_the_search_are_refused(args, fragment):
    one_line(run("compile", "tiny-llama", "cpu:1", *TINY, *args), fragment)


def test_a_batch_beyond_the_search_is_refused():
    one_line(run("compile", "tiny-llama", "cpu:1", "-b", "99999999999999999999", "-s", "64"), "--batch")
    one_line(run("estimate", "tiny-llama", "cpu:1", "-b", "8", "-s", str(2**31)), "--seq-len")


@pytest.mark.parametrize("value", ["inf", "nan", "1e-300", "1e300"])
def test_replan_checkpoint_bandwidth_is_a_finite_rate(old, value):
    one_line(run("replan", old, "cpu:1", "--checkpoint-bandwidth", value), "--checkpoint-bandwidth")


def test_a_plan_nested_too_deep_is_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    for command in (["simulate", deep], ["replan", deep, "cpu:1"]):
        one_line(run(*command), "deep.json: not valid JSON: nested too deeply")


# ---------------------------------------------------------------- 12: plans that contradict themselves


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d.update(stages=[]), "stages: 0 stages, the strategy has pp=1"),
    (lambda d: d["stages"][0].update(blocks=[0, 99]), "stages[0].blocks: [0, 99]"),
    (lambda d: d["job"].update(global_batch=16), "inputs_digest"),
    (lambda d: d.update(inputs_digest="0" * 64), "inputs_digest"),
])
def test_replan_and_simulate_refuse_an_edited_plan(old, tmp_path, edit, fragment):
    edited = _edited(old, tmp_path, edit)
    for command in (["simulate", edited], ["replan", edited, "cpu:1"]):
        one_line(run(*command), "edited.json", fragment)


# ---------------------------------------------------------------- 13: precisions the GPUs do not have


@pytest.mark.parametrize("cluster, device", [("dgx2-v100:1", "v100-32g"), ("pcie-t4:1", "t4")])
def test_bf16_and_fp8_need_the_hardware(cluster, device):
    line = one_line(run("compile", "tiny-llama", cluster, *TINY), f"--precision bf16 needs bf16 hardware: "
                    f"device {device}", "use --precision fp16")
    assert "bf16 hardware" in line
    one_line(run("compile", "tiny-llama", cluster, *TINY, "--precision", "fp8"), "use --precision fp16")
    assert run("estimate", "tiny-llama", cluster, "-b", "16", "-s", "64", "--precision", "fp16").exit_code == 0
    one_line(run("compile", "tiny-llama", "dgx-a100-80g:1", *TINY, "--precision", "fp8"), "use --precision bf16")


# ---------------------------------------------------------------- 14: booleans and strings as numbers


@pytest.mark.parametrize("override, fragment", [
    ({"gpus_per_node": True}, "overrides.gpus_per_node: Input should be a valid integer"),
    ({"gpu_power_limit": "750"}, "overrides.gpu_power_limit: Input should be a valid number"),
    ({"nic_bandwidth": float("inf")}, "overrides.nic_bandwidth: Input should be a finite number"),
])
def test_cluster_numbers_are_numbers(tmp_path, override, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"pools": [{"name": "a", "preset": "dgx-b200", "nodes": 1, "overrides": override}]}))
    one_line(run("show", path), "c.yaml: pools[0]", fragment)


@pytest.mark.parametrize("value", [True, "1"])
def test_plan_numbers_are_numbers(old, tmp_path, value):
    edited = _edited(old, tmp_path, lambda d: d["strategy"].update(tp=value))
    for command in (["simulate", edited], ["replan", edited, "cpu:1"]):
        one_line(run(*command), "edited.json: strategy.tp: expected a number")


def test_sweep_time_limit_and_simulate_are_typed(tmp_path):
    base = "models: [tiny-llama]\nclusters: [cpu:1]\nbatches: [8]\nseq_lens: [64]\n"
    for line, fragment in (("time_limit: true", "time_limit"), ("time_limit: .inf", "time_limit"),
                           ("simulate: 'yes'", "simulate")):
        path = tmp_path / "s.yaml"
        path.write_text(base + line + "\n")
        one_line(run("sweep", path, "-o", tmp_path / "out"), "s.yaml", fragment)


def test_sharding_ranks_are_integers(tmp_path):
    out = tmp_path / "dlrm"
    assert run("compile", "tiny-dlrm", "cpu:1", "-b", "64", "-s", "1", "--time-limit", "5", "-o", out).exit_code == 0
    data = json.loads((out / "sharding_plan.json").read_text())
    table = next(iter(data["tables"].values()))
    table["ranks"] = [True] * len(table["ranks"])
    edited = tmp_path / "sharding.json"
    edited.write_text(json.dumps(data))
    one_line(run("estimate", "tiny-dlrm", "cpu:1", "-b", "64", "-s", "1", "--sharding", edited), "ranks")


def test_repeated_keys_in_json_model_and_cluster_files(tmp_path):
    model = tmp_path / "m.json"
    model.write_text('{"builder": "llama", "name": "a", "name": "b", "num_layers": 2, "hidden": 64, "heads": 4, '
                     '"ffn": 128, "vocab": 256}')
    one_line(run("show", model), "m.json: not valid JSON: duplicate key 'name'")
    cluster = tmp_path / "c.json"
    cluster.write_text('{"pools": [{"name": "a", "preset": "cpu", "nodes": 1, "nodes": 2}]}')
    one_line(run("show", cluster), "c.json: not valid JSON: duplicate key 'nodes'")


# ---------------------------------------------------------------- 15: limits compile already had


@pytest.mark.parametrize("value, fragment", [(1, "greater than or equal to 200"), (1e9, "less than or equal to 3000"),
                                             (float("inf"), "finite number")])
def test_a_clock_limit_is_a_clock(tmp_path, value, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"pools": [{"name": "a", "preset": "dgx-h100", "nodes": 1,
                                               "overrides": {"gpu_clock_limit": value}}]}))
    one_line(run("show", path), "overrides.gpu_clock_limit", fragment)


def test_compare_time_limit_is_finite():
    one_line(run("compare", "tiny-llama", "cpu:1", "-b", "8", "-s", "64", "--time-limit", "inf"), "--time-limit")


# ---------------------------------------------------------------- 16: messages


def test_a_fifo_is_no_model_cluster_or_plan(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    one_line(run("show", fifo), "fifo: is not a regular file")
    one_line(run("estimate", fifo, "cpu:1", "-b", "8", "-s", "64"), "is not a regular file")
    one_line(run("estimate", "tiny-llama", fifo, "-b", "8", "-s", "64"), "is not a regular file")
    one_line(run("simulate", fifo), "is not a regular file")


def test_escape_sequences_in_names_never_reach_the_terminal(tmp_path):
    line = one_line(run("show", "llama\x1b]0;owned\x07"), "unknown model or cluster")
    assert "\x1b" not in line and "\x07" not in line and "\\x1b]0;owned\\x07" in line
    model = tmp_path / "m.yaml"
    model.write_text(yaml.safe_dump({"builder": "llama", "name": "x\x1b[2J", "num_layers": 2, "hidden": 64,
                                     "heads": 4, "ffn": 128, "vocab": 256}))
    line = one_line(run("show", model), "m.yaml: name:", "is not a name")
    assert "\x1b" not in line


def test_lost_nodes_with_a_plan_that_leaves_nodes_idle(tmp_path):
    # 4 nodes of 4 ranks lose node 1; the new plan (dp only) cannot divide batch 16 over the 3 survivors' 12
    # ranks and uses the first 2 nodes: the third survivor sits idle (it was refused as too many survivors)
    old = tmp_path / "old"
    result = run("compile", "tiny-llama", "cpu:4", "-b", "16", "-s", "64", "--time-limit", "5",
                 "--fix", "tp=1,pp=1,cp=1", "-o", old)
    assert result.exit_code == 0, result.output
    result = run("replan", old / "plan.json", "cpu:3", "--lost-nodes", "1", "--fix", "tp=1,pp=1,cp=1")
    assert result.exit_code == 0, result.output
    assert "so the plan uses the first 2 (1 idle)" in result.stdout
    # naming too few lost nodes is still refused, against the whole new cluster
    one_line(run("replan", old / "plan.json", "cpu:2", "--lost-nodes", "1"), "--lost-nodes: pool cpu keeps 3 of its 4",
             "the new cluster has 2 there")


@pytest.mark.parametrize("fix, expected", [("schedule=bogus", "schedule: Input should be '1f1b'"),
                                           ("shard=rack", "shard: Input should be 'full' or 'node'"),
                                           ("dispatcher=nccl", "dispatcher: Input should be 'alltoall'")])
def test_a_fixed_name_the_field_does_not_take_is_one_line(fix, expected):
    # before: a search over nothing, exit 1 "no legal strategy ... under --fix schedule=bogus"
    result = run("compile", "tiny-llama", "cpu:1", *TINY, "--fix", fix)
    assert result.exit_code == 2
    one_line(result, "--fix", expected, repr(fix.split("=")[1]))
