"""The command line: every command documented, outputs parse, errors are one line with docs/design.md's exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from planner.cli import cli

ROOT = Path(__file__).resolve().parents[1]
CLI_DOC = ROOT / "docs" / "cli.md"
EXAMPLES = ROOT / "examples"

# The README's quick-start example: it must fit and run.
FITTING = ["estimate", "llama3-8b", "dgx-h100:1", "--batch", "8", "--seq-len", "8192",
           "--strategy", "tp=1,zero=3,mbs=1,recompute=full"]


def run(*args: str):
    return CliRunner().invoke(cli, [str(a) for a in args])


def assert_ok(result) -> None:
    assert result.exit_code == 0, result.output
    assert result.exception is None, result.exception


def assert_one_line_error(result, exit_code: int, *fragments: str) -> str:
    """Exit code as given, one `Error: ...` line on stderr, no traceback anywhere."""
    assert result.exit_code == exit_code, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    err = result.stderr.strip()
    assert err.startswith("Error: "), err
    assert "\n" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def all_commands(group: click.Group, prefix: str = "planner"):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):  # the top group loads its commands when asked (planner/cli/app.py)
        command = group.get_command(ctx, name)
        yield f"{prefix} {name}", command
        if isinstance(command, click.Group):
            yield from all_commands(command, f"{prefix} {name}")


# ---------------------------------------------------------------- documentation


def test_every_command_has_help_with_example_and_is_in_cli_doc():
    doc = CLI_DOC.read_text(encoding="utf-8")
    commands = list(all_commands(cli))
    assert {path for path, _ in commands} >= {"planner list", "planner show", "planner estimate"}
    for path, command in commands:
        assert command.help and command.help.strip(), f"{path} has no help text"
        assert "Example" in command.help, f"{path} help has no example invocation"
        assert path in doc, f"{path} is not documented in docs/cli.md"
        assert f"\n## {path}\n" in doc, f"docs/cli.md has no section '## {path}'"
        result = run(*path.split()[1:], "--help")
        assert_ok(result)
        assert "Usage:" in result.output


def test_python_dash_m_planner_help():
    proc = subprocess.run([sys.executable, "-m", "planner", "--help"], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "estimate" in proc.stdout and "Usage:" in proc.stdout


def test_version():
    result = run("--version")
    assert_ok(result)
    assert "0.1.0" in result.output


# ---------------------------------------------------------------- list


def test_list_models_text_and_json():
    result = run("list", "models")
    assert_ok(result)
    assert "llama3-70b" in result.output and "70.6B" in result.output
    result = run("list", "models", "--json")
    assert_ok(result)
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert {"llama3-8b", "llama3-70b", "gpt3-175b", "mixtral-8x7b"} <= set(rows)
    assert rows["llama3-70b"]["params"] == pytest.approx(70.55e9, rel=0.01)
    assert rows["mixtral-8x7b"]["active_params"] < rows["mixtral-8x7b"]["params"]
    assert all(row["source"] for row in rows.values())


def test_list_hardware_text_and_json():
    result = run("list", "hardware")
    assert_ok(result)
    assert "h100-sxm" in result.output and "dgx-h100" in result.output and "989" in result.output
    result = run("list", "hardware", "--json")
    assert_ok(result)
    data = json.loads(result.stdout)
    assert "h100-sxm" in {d["name"] for d in data["devices"]}
    assert "dgx-h100" in {n["name"] for n in data["nodes"]}


def test_list_unknown_kind_is_usage_error():
    assert_one_line_error(run("list", "gpus"), 2, "gpus")


# ---------------------------------------------------------------- show


def test_show_zoo_model():
    result = run("show", "llama3-70b")
    assert_ok(result)
    out = result.output
    assert "70.6B" in out and "8192" in out and "64/8" in out and "128256" in out
    assert "attention" in out and "mlp" in out and "FLOPs/token" in out
    data = json.loads(run("show", "llama3-70b", "--json").stdout)
    assert data["name"] == "llama3-70b" and data["num_blocks"] == 80


def test_show_model_file_and_seq_len():
    result = run("show", EXAMPLES / "models" / "tiny-llama.yaml", "--seq-len", "256")
    assert_ok(result)
    assert "tiny-llama" in result.output and "at seq 256" in result.output


def test_show_cluster_shorthand():
    result = run("show", "dgx-h100:4")
    assert_ok(result)
    assert "32 GPUs" in result.output and "h100-sxm" in result.output and "nvswitch" in result.output
    data = json.loads(run("show", "dgx-h100:4", "--json").stdout)
    assert data["pools"][0]["count"] == 4


def test_show_cluster_file():
    result = run("show", EXAMPLES / "clusters" / "hetero-3pool.yaml")
    assert_ok(result)
    out = result.output
    assert "256 GPUs" in out and "a100" in out and "h100" in out and "l4" in out
    data = json.loads(run("show", EXAMPLES / "clusters" / "hetero-3pool.yaml", "--json").stdout)
    assert [p["name"] for p in data["pools"]] == ["a100", "h100", "l4"]


def test_show_bare_node_preset():
    result = run("show", "dgx-h100")
    assert_ok(result)
    assert "dgx-h100:NODES" in result.output


def test_show_unknown():
    assert_one_line_error(run("show", "llama3-8"), 2, "unknown model or cluster 'llama3-8'", "llama3-8b")


# ---------------------------------------------------------------- estimate

BREAKDOWN_KEYS = {"compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "pp_comm_s", "dp_comm_s", "bubble_s",
                  "optimizer_s", "offload_s", "exposed_comm_s"}


def test_estimate_fitting_text():
    result = run(*FITTING)
    assert_ok(result)
    out = result.output
    assert "tokens/s" in out and "MFU" in out and "step time" in out
    assert "weights" in out and "optimizer" in out and "activations" in out and "capacity" in out
    assert "fits: yes" in out


def test_estimate_fitting_json_has_design_keys():
    result = run(*FITTING, "--json")
    assert_ok(result)
    data = json.loads(result.stdout)
    for key in ("step_time_s", "tokens_per_s", "tokens_per_s_per_gpu", "mfu", "memory", "breakdown", "strategy"):
        assert key in data
    assert {"peak_bytes", "capacity_bytes", "fits", "per_stage"} <= set(data["memory"])
    assert BREAKDOWN_KEYS <= set(data["breakdown"])
    assert data["memory"]["fits"] is True
    assert data["memory"]["peak_bytes"] <= data["memory"]["capacity_bytes"]
    assert data["strategy"]["dp"] == 8 and data["strategy"]["zero"] == 3
    assert data["tokens_per_s"] == pytest.approx(data["tokens_per_s_per_gpu"] * 8)
    assert 0 < data["mfu"] < 1


def test_estimate_default_strategy_derives_dp():
    data = json.loads(run("estimate", "tiny-llama", "cpu:1", "--batch", "8", "--seq-len", "128", "--json").stdout)
    assert data["strategy"]["dp"] == 4


NOT_FITTING = ["estimate", "gpt3-175b", "dgx-a100-80g:16", "--batch", "1536", "--seq-len", "2048",
               "--strategy", "tp=1,pp=1,zero=0"]


def test_estimate_not_fitting_exits_1_with_reason():
    result = run(*NOT_FITTING)
    err = assert_one_line_error(result, 1, "does not fit")
    assert "GB" in err
    assert "fits: no" in result.stdout


def test_estimate_not_fitting_json_still_on_stdout():
    result = run(*NOT_FITTING, "--json")
    assert_one_line_error(result, 1, "does not fit")
    data = json.loads(result.stdout)
    assert data["memory"]["fits"] is False and data["memory"]["reasons"]


# ---------------------------------------------------------------- bad input: exit 2, one line


def estimate(model: str = "llama3-8b", cluster: str = "dgx-h100:1", *extra: str, batch: str = "8",
             seq_len: str = "8192"):
    return run("estimate", model, cluster, "--batch", batch, "--seq-len", seq_len, *extra)


def test_malformed_yaml_model_file(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("builder: llama\nname: x\n  hidden: [1,\n")
    assert_one_line_error(estimate(str(path)), 2, "broken.yaml")
    assert_one_line_error(run("show", path), 2, "broken.yaml")


def test_negative_hidden_in_spec_file(tmp_path):
    path = tmp_path / "neg.yaml"
    path.write_text("builder: llama\nname: neg\nnum_layers: 2\nhidden: -64\nheads: 4\nffn: 128\nvocab: 256\n")
    assert_one_line_error(estimate(str(path)), 2, "neg.yaml", "hidden")


def test_unknown_preset():
    assert_one_line_error(estimate("llama3-8b", "dgx-h1000:4"), 2, "dgx-h1000")


def test_zero_nodes():
    assert_one_line_error(estimate("llama3-8b", "dgx-h100:0"), 2, "dgx-h100:0")


def test_unknown_model():
    assert_one_line_error(estimate("llama9-1t"), 2, "llama9-1t")


def test_unknown_strategy_key():
    assert_one_line_error(estimate("llama3-8b", "dgx-h100:1", "--strategy", "foo=1"), 2, "foo")


def test_tp_not_dividing_heads():
    # 24 GPUs: tp=3 divides the world size, so the heads rule is what fails.
    assert_one_line_error(estimate("llama3-8b", "dgx-h100:3", "--strategy", "tp=3"), 2, "heads(32) % tp(3)")
    # 8 GPUs: tp=3 does not even divide the world size.
    assert_one_line_error(estimate("llama3-8b", "dgx-h100:1", "--strategy", "tp=3"), 2, "tp(3)")


def test_world_size_mismatch():
    assert_one_line_error(estimate("llama3-8b", "dgx-h100:1", "--strategy", "dp=3"), 2, "dp(3)", "world_size(8)")


@pytest.mark.parametrize("option", ["--batch", "--seq-len"])
def test_non_positive_batch_and_seq_len(option):
    args = ["estimate", "llama3-8b", "dgx-h100:1", "--batch", "8", "--seq-len", "8192"]
    args[args.index(option) + 1] = "0"
    assert_one_line_error(run(*args), 2, option)


def test_bad_precision():
    assert_one_line_error(estimate("llama3-8b", "dgx-h100:1", "--precision", "int4"), 2, "int4")


def test_missing_argument():
    assert_one_line_error(run("estimate", "llama3-8b"), 2, "CLUSTER")


def test_the_command_list_summaries_are_the_commands_own():
    # `planner --help` lists the commands from planner.cli.app.COMMANDS without importing them; each summary
    # is the first sentence of the command's docstring, as click would shorten it at any width
    from planner.cli.app import COMMANDS, load_command, summary_at

    for name in COMMANDS:
        command = load_command(name)
        assert command.name == name
        for width in (20, 45, 60, 80, 200):
            assert summary_at(name, width) == command.get_short_help_str(width), (name, width)


def test_help_and_show_load_neither_the_solver_nor_the_cost_model():
    # the start-up budget (issue #30: under 0.4 s beyond the interpreter; tests/bench/startup.py times it)
    code = ("import sys; from planner.cli import main\n"
            "try:\n    main(sys.argv[1:], prog_name='planner')\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('ortools', 'matplotlib', 'numpy', "
            "'networkx', 'torch') or m in ('planner.cost', 'planner.search'))\n"
            "print('HEAVY', heavy)")
    for args in (["--help"], ["show", "llama3-70b"], ["show", "dgx-h100:4"]):
        run = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60)
        assert run.stdout.strip().splitlines()[-1] == "HEAVY []", (args, run.stdout[-500:], run.stderr[-500:])


def test_every_help_example_parses_with_its_commands_options():
    # each example's arguments are the command's own (tests/bench/help_examples.py runs them all): a renamed or
    # removed option, or a value of the wrong type, fails here
    import shlex

    from benches import load_bench

    bench = load_bench("help_examples")
    examples = bench.all_examples()
    assert len(examples) > 30
    for example in examples:
        words = shlex.split(example.split(">")[0])[1:]
        command = cli.get_command(click.Context(cli), words[0])
        assert command is not None, example
        command.make_context(words[0], words[1:], resilient_parsing=False)
