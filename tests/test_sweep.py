"""`planner sweep`: grid expansion and validation, local processes vs Ray, CSV vs compare(), plots."""

from __future__ import annotations

import csv
import io
import sys
import textwrap

import pytest
from click.testing import CliRunner

from hardware import load_cluster
from models import load_model
from planner.cli import cli
from planner.compare.table import DENSE_BASELINES, compare
from planner.job import Job
from planner.profile import load_runtime
from planner.sweep.progress import ProgressBar
from planner.sweep.run import plan_sweep, run_sweep
from planner.sweep.scenarios import expand, load_sweep
from ports import MULTIPROCESS

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

SMALL = """\
models: [tiny-llama]
clusters: [cpu:1, cpu:2]
batches: [8]
seq_lens: 128
strategies: [zero3, megatron, planner]
time_limit: 20
simulate: true
"""


def write(tmp_path, text: str, name: str = "sweep.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_grid_expands_in_file_order_and_skips_repeats(tmp_path):
    path = write(tmp_path, """\
        models: [tiny-llama]
        clusters: [cpu:2, cpu:1]
        batches: [16, 8]
        seq_lens: [128]
        strategies: [planner, zero3]
        time_limit: 5
        scenarios:
          - {model: tiny-llama, cluster: cpu:1, batch: 8, seq_len: 128, strategies: [zero3, megatron]}
          - {model: tiny-dlrm, cluster: cpu:1, batch: 64, seq_len: 1, strategies: [greedy-torchrec-style]}
        """)
    tasks = expand(load_sweep(path), path)
    got = [(t.scenario, t.cluster, t.batch, t.strategy) for t in tasks]
    assert got == [
        (0, "cpu:2", 16, "planner"), (0, "cpu:2", 16, "zero3"),
        (1, "cpu:2", 8, "planner"), (1, "cpu:2", 8, "zero3"),
        (2, "cpu:1", 16, "planner"), (2, "cpu:1", 16, "zero3"),
        (3, "cpu:1", 8, "planner"), (3, "cpu:1", 8, "zero3"),
        (3, "cpu:1", 8, "megatron"),  # the extra scenario adds megatron; its zero3 is already there
        (4, "cpu:1", 64, "greedy-torchrec-style"),
    ]
    assert [t.index for t in tasks] == list(range(10))
    assert tasks[0].job.cluster.num_gpus == 8 and tasks[0].time_limit == 5


def test_default_strategies_are_the_applicable_ones_and_paths_resolve_beside_the_file(tmp_path):
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mine.yaml").write_text("builder: llama\nname: mine\nnum_layers: 2\nhidden: 64\n"
                                                  "heads: 4\nkv_heads: 2\nffn: 128\nvocab: 256\n")
    path = write(tmp_path, "models: [models/mine.yaml, tiny-dlrm]\nclusters: [cpu:1]\nbatches: [64]\n"
                           "seq_lens: [1]\n")
    tasks = expand(load_sweep(path), path)
    dense = [t.strategy for t in tasks if t.model == "models/mine.yaml"]
    recsys = [t.strategy for t in tasks if t.model == "tiny-dlrm"]
    assert dense == [s for s in DENSE_BASELINES if s != "metis"]  # metis runs on mixed clusters only
    assert recsys == ["torchrec", "greedy-torchrec-style", "planner"]
    assert tasks[0].job.model.name == "mine"


GRID = "models: [tiny-llama]\nclusters: [cpu:1]\n"


@pytest.mark.parametrize("text, expected", [
    (GRID + "batches: [0]\nseq_lens: [128]\n", "batches[0]: Input should be greater than 0"),
    (GRID + "batches: ['8']\nseq_lens: [128]\n", "batches[0]: Input should be a valid integer"),
    (GRID + "batches: [8]\nseq_lens: [128]\nstrategy: [zero3]\n", "strategy: unknown key"),
    (GRID + "batches: [8]\nseq_lens: [128]\nstrategies: [zero3, fsdp9]\n", "strategies[1]: Input should be"),
    (GRID + "batches: [8]\n", "missing or empty: seq_lens"),
    ("models: [tiny-llama, lama3-8b]\nclusters: [cpu:1]\nbatches: [8]\nseq_lens: [128]\n",
     "models[1]: unknown model 'lama3-8b'"),
    ("models: [tiny-llama]\nclusters: [cpu:1, dgx-h1000:2]\nbatches: [8]\nseq_lens: [128]\n",
     "clusters[1]: dgx-h1000:2: unknown node preset"),
    ("scenarios:\n  - {model: tiny-llama, cluster: cpu:1, batch: 8, seq: 128}\n",
     "scenarios[0].seq_len: Field required"),
    (GRID + "batches: [8]\nseq_lens: [128]\nstrategies: [greedy-torchrec-style]\n",
     "strategies[0]: 'greedy-torchrec-style' applies to none of the models"),
    ("models: [tiny-llama\nclusters: [cpu:1]\n", "not valid YAML"),
    ("- tiny-llama\n", "expected a mapping at the top level"),
    ("time_limit: 5\n", "no scenarios"),
])
def test_bad_sweep_files_exit_2_naming_the_file_and_field(tmp_path, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["sweep", str(path), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert f"Error: {path}: " in result.output and expected in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()


def test_bad_options_exit_2_before_any_solve(tmp_path, monkeypatch):
    path = write(tmp_path, SMALL)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("x")
    runner = CliRunner()
    taken = runner.invoke(cli, ["sweep", str(path), "-o", str(tmp_path / "taken")])
    assert taken.exit_code == 2 and "use --force" in taken.output
    assert (tmp_path / "taken" / "keep.txt").exists()
    local = runner.invoke(cli, ["sweep", str(path), "-o", str(tmp_path / "o1"), "--address", "auto"])
    assert local.exit_code == 2 and "--address applies to --executor ray only" in local.output
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    no_ray = runner.invoke(cli, ["sweep", str(path), "-o", str(tmp_path / "o2"), "--executor", "ray"])
    assert no_ray.exit_code == 2 and "pip install -e '.[ray]'" in no_ray.output, no_ray.output
    assert "Traceback" not in no_ray.output and not (tmp_path / "o2").exists()


@pytest.fixture(scope="module")
def local_sweep(tmp_path_factory):
    """The SMALL sweep through the CLI: two worker processes (so its tests are MULTIPROCESS, which also
    computes this fixture once, on one xdist worker)."""
    root = tmp_path_factory.mktemp("sweep")
    path = write(root, SMALL)
    result = CliRunner().invoke(cli, ["sweep", str(path), "-o", str(root / "out"), "--workers", "2"])
    assert result.exit_code == 0, result.output
    return path, root / "out", result.output


@MULTIPROCESS
def test_cli_writes_every_file_and_prints_the_best_strategy(local_sweep):
    _, out, output = local_sweep
    names = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert names == ["planner-manifest.json", "plots/compare-0.png", "plots/compare-1.png", "plots/timeline-0.png",
                     "plots/timeline-1.png", "plots/tiny-llama-b8-s128-bf16.png", "report.md", "results.csv",
                     "summary.md", "timings.csv"]
    assert "6/6" in output  # the progress bar (CliRunner mixes stderr in)
    summary = (out / "summary.md").read_text()
    assert summary.count("| tiny-llama | cpu:") == 2 and "plots/tiny-llama-b8-s128-bf16.png" in summary
    with (out / "timings.csv").open() as handle:
        timings = list(csv.DictReader(handle))
    assert [t["strategy"] for t in timings] == ["zero3", "megatron", "planner"] * 2
    assert all(float(t["task_s"]) >= float(t["planning_s"]) >= 0 for t in timings)


@MULTIPROCESS
def test_csv_rows_match_compare_called_directly(local_sweep):
    _, out, _ = local_sweep
    with (out / "results.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["cluster"] == "cpu:2"]
    job = Job(model=load_model("tiny-llama"), cluster=load_cluster("cpu:2"), global_batch=8, seq_len=128,
              runtime=load_runtime("planner"))  # a sweep's default runtime, the command line's
    direct = compare(job, ("zero3", "megatron", "planner"), time_limit=20)
    assert [r["strategy"] for r in rows] == [d.strategy for d in direct]
    for row, want in zip(rows, direct):
        assert row["spec"] == want.spec and row["fits"] == str(want.fits) and row["gpus"] == "8"
        for field in ("step_time_s", "tokens_per_s_per_gpu", "mfu", "peak_hbm_bytes"):
            assert float(row[field]) == pytest.approx(getattr(want, field), rel=1e-8), field
    best = min((d for d in direct if d.fits), key=lambda d: d.step_time_s)
    summary_row = next(line for line in (out / "summary.md").read_text().splitlines() if "| cpu:2 |" in line)
    assert f"| {best.strategy} |" in summary_row


@MULTIPROCESS
def test_plots_are_valid_pngs(local_sweep):
    import matplotlib.image

    _, out, _ = local_sweep
    png = out / "plots" / "tiny-llama-b8-s128-bf16.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    pixels = matplotlib.image.imread(png)
    assert pixels.ndim == 3 and pixels.shape[0] > 200 and pixels.shape[1] > 400
    assert pixels.std() > 0.01  # not a blank canvas


@MULTIPROCESS
def test_local_ray_gives_byte_identical_outputs(local_sweep):
    import ray  # in the test extra: this test must run, not skip
    path, out, _ = local_sweep
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")  # never a stray cluster
    try:
        result = run_sweep(path, executor="ray", workers=2, progress=io.StringIO(), tasks=plan_sweep(path))
    finally:
        ray.shutdown()
    assert result.files["results.csv"] == (out / "results.csv").read_text()
    assert result.files["summary.md"] == (out / "summary.md").read_text()
    assert result.files["report.md"] == (out / "report.md").read_text()
    assert result.files["plots/tiny-llama-b8-s128-bf16.png"] == (out / "plots/tiny-llama-b8-s128-bf16.png").read_bytes()
    workers = {line.rsplit(",", 1)[1] for line in result.files["timings.csv"].splitlines()[1:]}
    assert workers and all(":" in w for w in workers)


@MULTIPROCESS
def test_report_compares_every_strategy_and_checks_the_planner_plan_by_simulation(local_sweep):
    import matplotlib.image

    _, out, _ = local_sweep
    report = (out / "report.md").read_text()
    sections = report.split("\n## ")[1:]
    assert [s.splitlines()[0] for s in sections] == ["1. tiny-llama on cpu:1 (4 GPUs), batch 8 x 128",
                                                   "2. tiny-llama on cpu:2 (8 GPUs), batch 8 x 128"]
    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    for index, section in enumerate(sections):
        mine = [r for r in rows if r["scenario"] == str(index)]
        assert all(f"| {r['strategy']} | " in section for r in mine)
        planner = next(r for r in mine if r["strategy"] == "planner")
        # the simulated step is the one simulate() gives for the planner row's strategy
        from planner.simulate import simulate
        from planner.strategy import parse_strategy
        job = Job(model=load_model("tiny-llama"), cluster=load_cluster(planner["cluster"]), global_batch=8,
                  seq_len=128, runtime=load_runtime(planner["runtime"]))
        run = simulate(job, parse_strategy(planner["spec"]))
        assert f"Simulated (`planner simulate`, {len(run.timeline.end):,} events): {run.step_time:.4g} s" in section
        for name in (f"plots/compare-{index}.png", f"plots/timeline-{index}.png"):
            assert f"]({name})" in section
            pixels = matplotlib.image.imread(out / name)
            assert (out / name).read_bytes()[:8] == PNG_SIGNATURE and pixels.std() > 0.01


def test_progress_bar_counts_and_estimates():
    stream = io.StringIO()
    bar = ProgressBar(4, stream, width=8)
    assert "0/4" in bar.line() and "ETA ?" in bar.line()
    bar.advance("first")
    bar.advance("second")
    lines = stream.getvalue().splitlines()
    assert lines[0].startswith("sweep [##------] 1/4") and lines[0].endswith("first")
    assert lines[1].startswith("sweep [####----] 2/4") and "ETA 0:00:00" in lines[1]
