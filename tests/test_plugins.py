"""User strategies (planner/compare/plugins.py): a fixed SPEC or a recipe function, scored by compare and sweep
like the built-in baselines, and every mistake in them one error line."""

from __future__ import annotations

import csv
import io
import json
import textwrap

import pytest
from click.testing import CliRunner

from hardware import load_cluster
from models import load_model
from planner.cli import cli
from planner.compare.plugins import UserStrategy
from planner.compare.table import compare
from planner.cost import evaluate
from planner.job import Job
from planner.profile import load_runtime
from planner.strategy import Strategy
from planner.sweep.run import run_sweep

RECIPES = '''\
from planner.strategy import Strategy


def two_way_tp(job):
    return Strategy(tp=2, pp=1, mbs=1, zero=1, sp=True)


def nothing(job):
    return None


def broken(job):
    raise KeyError("no such field")


def not_a_strategy(job):
    return {"tp": 2}
'''


def _job(runtime: str = "planner") -> Job:
    return Job(model=load_model("tiny-llama"), cluster=load_cluster("cpu:1"), global_batch=8, seq_len=128,
               runtime=load_runtime(runtime))


def _write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_a_spec_strategy_is_costed_under_its_runtime_like_a_fixed_strategy():
    spec = "tp=2,pp=2,mbs=1,zero=1,sp=on"
    (row,) = compare(_job(), ("mine",), plugins=(UserStrategy(name="mine", spec=spec, runtime="megatron"),))
    expected = evaluate(_job("megatron"), Strategy(tp=2, pp=2, mbs=1, zero=1, sp=True))
    assert (row.strategy, row.runtime, row.fits) == ("mine", "megatron", True)
    assert row.step_time_s == pytest.approx(expected.step_time_s, rel=1e-12)
    assert row.peak_hbm_bytes == pytest.approx(expected.memory.peak_bytes, rel=1e-12)


def test_a_strategies_file_mixes_builtins_specs_and_recipe_functions(tmp_path):
    _write(tmp_path, "recipes.py", RECIPES)
    path = _write(tmp_path, "strategies.yaml", """\
        strategies:
          - zero3
          - {name: fixed-pp2, spec: "tp=1,pp=2,mbs=1"}
          - {name: recipe-tp2, module: "recipes:two_way_tp"}
          - {name: empty, module: "recipes:nothing"}
          - {name: crashes, module: "recipes:broken"}
        """)
    result = CliRunner().invoke(cli, ["compare", "tiny-llama", "cpu:1", "-b", "8", "-s", "128", "--time-limit", "10",
                                      "--strategies", str(path), "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["strategy"]: r for r in json.loads(result.output)}
    assert list(rows) == ["zero3", "fixed-pp2", "recipe-tp2", "empty", "crashes"]
    assert rows["recipe-tp2"]["spec"].startswith("tp=2,pp=1,dp=2,")
    assert rows["fixed-pp2"]["spec"].startswith("tp=1,pp=2,dp=2,")  # cpu:1 is 4 ranks
    assert rows["recipe-tp2"]["runtime"] == "planner"
    assert not rows["empty"]["applicable"] and "returned no strategy" in rows["empty"]["why"]
    assert not rows["crashes"]["applicable"] and "raised KeyError" in rows["crashes"]["why"]


@pytest.mark.parametrize("entry, message", [
    ('{name: zero3, spec: "tp=2"}', "strategies[0].name: 'zero3' is a built-in strategy"),
    ('{name: a, spec: "tp=2", module: "recipes:two_way_tp"}', "give exactly one of `spec` and `module`"),
    ('{name: a, spec: "tp=two"}', "tp: expected an integer"),
    ('{name: a, module: "no_such_module:f"}', "module 'no_such_module' cannot be imported"),
    ('{name: a, module: "recipes:missing"}', "recipes has no function 'missing'"),
    ('{name: a, module: "recipes"}', "expected 'package.module:function'"),
    ('{name: a, spec: "tp=2", runtime: nemo}', "unknown runtime 'nemo'"),
    ("not-a-strategy", "unknown strategy 'not-a-strategy'"),
])
def test_a_bad_strategies_file_is_one_line_naming_the_file_exit_2(tmp_path, entry, message):
    _write(tmp_path, "recipes.py", RECIPES)
    path = _write(tmp_path, "strategies.yaml", f"strategies:\n  - {entry}\n")
    result = CliRunner().invoke(cli, ["compare", "tiny-llama", "cpu:1", "-b", "8", "-s", "128",
                                      "--strategies", str(path)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert str(path) in result.output and message in result.output, result.output


def test_a_recipe_returning_something_else_is_an_error_naming_it(tmp_path):
    _write(tmp_path, "recipes.py", RECIPES)
    path = _write(tmp_path, "strategies.yaml", 'strategies:\n  - {name: odd, module: "recipes:not_a_strategy"}\n')
    result = CliRunner().invoke(cli, ["compare", "tiny-llama", "cpu:1", "-b", "8", "-s", "128",
                                      "--strategies", str(path)])
    assert result.exit_code == 2
    assert "odd: recipes:not_a_strategy returned dict, not a Strategy" in result.output


def test_a_sweep_scores_user_strategies_in_every_scenario_and_extras_may_name_them(tmp_path):
    _write(tmp_path, "recipes.py", RECIPES)
    path = _write(tmp_path, "sweep.yaml", """\
        models: [tiny-llama]
        clusters: [cpu:1]
        batches: [8, 16]
        seq_lens: 128
        time_limit: 10
        strategies: [zero1, {name: recipe-tp2, module: "recipes:two_way_tp"}, {name: pp2, spec: "pp=2,mbs=1"}]
        scenarios:
          - {model: tiny-llama, cluster: cpu:2, batch: 8, seq_len: 128, strategies: [recipe-tp2]}
        """)
    out = run_sweep(path, progress=io.StringIO())
    rows = list(csv.DictReader(io.StringIO(out.files["results.csv"])))
    got = [(r["cluster"], r["batch"], r["strategy"]) for r in rows]
    assert got == [("cpu:1", "8", "zero1"), ("cpu:1", "8", "recipe-tp2"), ("cpu:1", "8", "pp2"),
                   ("cpu:1", "16", "zero1"), ("cpu:1", "16", "recipe-tp2"), ("cpu:1", "16", "pp2"),
                   ("cpu:2", "8", "recipe-tp2")]
    tp2 = [r for r in rows if r["strategy"] == "recipe-tp2"]
    assert all(r["spec"].startswith("tp=2,pp=1,") for r in tp2)
    assert all(r["solver_status"] == "evaluated" and r["gpus_used"] == "4" for r in tp2 if r["cluster"] == "cpu:1")
    assert "| planner vs best baseline |" in out.files["summary.md"]


def test_a_sweep_extra_scenario_naming_an_unknown_strategy_is_refused(tmp_path):
    path = _write(tmp_path, "sweep.yaml", """\
        scenarios:
          - {model: tiny-llama, cluster: cpu:1, batch: 8, seq_len: 128, strategies: [mine]}
        """)
    result = CliRunner().invoke(cli, ["sweep", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "scenarios[0].strategies: 'mine' is neither a built-in strategy" in result.output


def test_the_example_strategies_file_loads_and_its_recipe_returns_a_strategy():
    from pathlib import Path

    from planner.compare.plugins import load_strategies, plugin_strategy

    path = Path(__file__).resolve().parents[1] / "examples" / "strategies" / "strategies.yaml"
    names, plugins = load_strategies(path, ("planner", "megatron"))
    assert names == ("planner", "megatron", "tp2-zero1", "smallest-tp")
    recipe = next(p for p in plugins if p.module)
    strategy, why = plugin_strategy(recipe, _job())
    assert why == "" and isinstance(strategy, Strategy) and evaluate(_job(), strategy).memory.fits


def test_compare_rows_say_why_job_columns_breakdown_solver_and_confidence(tmp_path):
    out = tmp_path / "rows.csv"
    result = CliRunner().invoke(cli, ["compare", "tiny-llama", "cpu:1", "-b", "8", "-s", "128", "--time-limit", "10",
                                      "--only", "zero1", "--only", "planner", "--csv", str(out)])
    assert result.exit_code == 0, result.output
    assert "step time by term (s):" in result.output
    assert "than the best baseline, zero1" in result.output
    rows = {r["strategy"]: r for r in csv.DictReader(out.open())}
    for row in rows.values():
        assert (row["model"], row["cluster"], row["batch"], row["seq_len"], row["precision"]) == \
            ("tiny-llama", "cpu:1", "8", "128", "bf16")
        assert row["gpus_used"] == "4" and row["unit"] == "tokens"
        assert float(row["compute_s"]) > 0 and row["extrapolated"] in ("True", "False")
        parts = sum(float(row[t]) for t in ("compute_s", "recompute_s", "bubble_s", "optimizer_s"))
        assert parts <= float(row["step_time_s"]) * (1 + 1e-9)  # exposed terms never exceed the step
    assert rows["planner"]["solver_status"] in ("OPTIMAL", "FEASIBLE") and rows["planner"]["gap"] != ""


def test_recommendation_rows_count_samples_and_long_reasons_stay_whole():
    job = Job(model=load_model("tiny-dlrm"), cluster=load_cluster("cpu:1"), global_batch=64, seq_len=1)
    rows = compare(job, ("planner",), 10)
    assert rows[0].unit == "samples" and rows[0].solver_status in ("OPTIMAL", "FEASIBLE")
    # 70B on four 16 GB CPU ranks in two stages: both stages are over, and the reason names each (once cut at 200)
    big = Job(model=load_model("llama3-70b"), cluster=load_cluster("cpu:1"), global_batch=8, seq_len=128)
    (row,) = compare(big, ("mine",), plugins=(UserStrategy(name="mine", spec="tp=1,pp=2,dp=2,mbs=2"),))
    assert not row.fits and len(row.why) > 200
    assert "stage 0 (cpu) needs" in row.why and "stage 1 (cpu) needs" in row.why


def test_plots_switch_to_a_log_axis_for_outliers_and_skip_single_size_scaling_charts():
    from planner.compare.plots import needs_log_axis
    from planner.sweep.plots import plot_groups

    assert needs_log_axis([1.0, 1.02, 1.03, 5.0]) and not needs_log_axis([1.0, 1.02, 1.03, 2.9])
    assert not needs_log_axis([0.0, 0.0])
    rows = [{"model": "m", "batch": 8, "seq_len": 128, "precision": "bf16", "gpus": g, "strategy": s}
            for g in (8, 16) for s in ("a", "b")]
    single = [{**r, "model": "n"} for r in rows if r["gpus"] == 8]
    assert list(plot_groups(rows + single)) == [("m", 8, 128, "bf16")]


def test_a_sweep_without_a_runtime_scores_experts_under_a_runtime_that_can_run_them(tmp_path):
    path = _write(tmp_path, "sweep.yaml", """\
        time_limit: 10
        scenarios:
          - {model: mixtral-8x7b, cluster: dgx-h100:4, batch: 64, seq_len: 4096, strategies: [planner]}
        """)
    out = run_sweep(path, progress=io.StringIO())
    (row,) = list(csv.DictReader(io.StringIO(out.files["results.csv"])))
    assert row["runtime"] == "megatron" and row["applicable"] == "True" and row["fits"] == "True"
    named = _write(tmp_path, "named.yaml", """\
        time_limit: 10
        runtime: planner
        scenarios:
          - {model: mixtral-8x7b, cluster: dgx-h100:4, batch: 64, seq_len: 4096, strategies: [planner]}
        """)
    (row,) = list(csv.DictReader(io.StringIO(run_sweep(named, progress=io.StringIO()).files["results.csv"])))
    assert row["runtime"] == "planner" and row["applicable"] == "False"
