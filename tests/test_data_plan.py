"""Planning for the data (issue #31): the profile and its one-line errors, the per-sequence attention term,
packing and balancing against brute force, the static layouts against `evaluate`, the Done-when compile
on every example profile, and the trainer running the plan's sampler under torchrun (gloo, CPU)."""

from __future__ import annotations

import functools
import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from hardware import load_catalog
from planner import api
from planner.cli.app import cli
from planner.cost import evaluate
from planner.cost.compute import layer_time
from planner.data.balance import lower_bound, min_degree, pack, schedule
from planner.data.cost import MicroCoster
from planner.data.plan import Layouts, plan_data, static_layouts
from planner.data.profile import DataProfile, LengthBin, quantile_lengths, step_lengths
from planner.strategy import parse_strategy
from planner.validation import check_strategy

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples" / "data").glob("*.yaml"))


def _profile(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "profile.yaml"
    path.write_text(text, encoding="utf-8")
    return path


GOOD = "name: p\nsource: test\nbins:\n  - {min_tokens: 16, max_tokens: 64, count: 3}\n"


@pytest.mark.parametrize("body, field", [
    ("name: p\nsource: t\nbins:\n  - {min_tokens: -5, max_tokens: 64, count: 1}\n", "bins[0].min_tokens"),
    ("name: p\nsource: t\nbins: []\n", "bins"),
    ("name: p\nsource: t\nbins:\n  - {min_tokens: 16, max_tokens: 4096, count: 1}\n", "bins[0].max_tokens"),
    (GOOD + "modalities:\n  - {kind: smell, sample_share: 1, items_per_sample: 1, tokens_per_item: 4}\n",
     "modalities[0].kind"),
    ("name: p\nsource: t\nbins:\n  - {min_tokens: 16, max_tokens: 8, count: 1}\n", "bins[0]"),
    ("name: p\nsource: t\nbins:\n  - {min_tokens: 16, max_tokens: 32, count: 0}\n", "bins[0].count"),
])
def test_bad_profiles_give_one_line_naming_file_and_field(tmp_path, body, field):
    path = _profile(tmp_path, body)
    result = CliRunner().invoke(cli, ["compile", "tiny-llama", "cpu:1", "-b", "8", "-s", "128",
                                      "--data-profile", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert str(path) in lines[0] and field in lines[0], lines[0]


def test_schema_lists_the_data_profile():
    result = CliRunner().invoke(cli, ["schema", "data-profile"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert {"bins", "modalities", "source"} <= set(schema["properties"])


def test_example_profiles_name_a_public_source():
    from planner.data.profile import load_data_profile

    assert len(EXAMPLES) >= 3
    for path in EXAMPLES:
        profile = load_data_profile(path)
        assert "arXiv" in profile.source and "http" in profile.source and profile.derivation


def test_quantiles_by_hand():
    # two bins of equal weight holding single lengths: the quantiles split half and half
    profile = DataProfile(name="p", source="t", bins=[LengthBin(min_tokens=3, max_tokens=3, count=1),
                                                      LengthBin(min_tokens=1, max_tokens=1, count=1)])
    assert quantile_lengths(profile, 4).tolist() == [1, 1, 3, 3]
    # one bin [10, 19] of 10 samples: its quantiles are each integer once
    wide = DataProfile(name="p", source="t", bins=[LengthBin(min_tokens=10, max_tokens=19, count=5)])
    assert quantile_lengths(wide, 10).tolist() == list(range(10, 20))
    # a step of 100 tokens from lengths 10..19 (mean 14.5) takes 6 samples: 6 x 14.5 = 87 <= 100 < 7 x 14.5
    assert len(step_lengths(wide, 100)) == 6 and sum(step_lengths(wide, 100)) <= 100


def test_attention_term_follows_the_squared_document_lengths():
    # two documents of 2048 in a 4096-token row attend over 2 x 2048^2 = 4096^2 / 2 pairs: half a single
    # sequence's attention FLOPs, the same linear work
    job = api.load_job("llama3-8b", "dgx-h100:1", batch=8, seq_len=4096)
    s = check_strategy(job, parse_strategy("tp=1,dp=8,zero=3"))
    layer = next(x for x in job.model.layers if x.flops_per_token_per_seq)
    device, catalog = job.cluster.pools[0].device_spec(), load_catalog()
    whole = layer_time(layer, job, s, device, catalog, "none")
    packed = layer_time(layer, job.model_copy(update={"attention_span": 2 * 2048**2 / 4096}), s, device, catalog,
                        "none")
    flops_whole = 4096 * layer.flops_per_token_per_seq * 4096
    rate = flops_whole / whole.attention_forward
    # same device curve point up to its step: the packed row's attention costs half the FLOPs
    assert packed.attention_forward * rate == pytest.approx(flops_whole / 2, rel=0.2)
    assert packed.forward - packed.attention_forward == pytest.approx(whole.forward - whole.attention_forward)


def _brute_force_makespan(seconds: list[float], ranks: int) -> float:
    best = float("inf")
    for assignment in itertools.product(range(ranks), repeat=len(seconds)):
        loads = [0.0] * ranks
        for t, r in zip(seconds, assignment):
            loads[r] += t
        best = min(best, max(loads))
    return best


@pytest.mark.parametrize("seconds", [[5, 4, 3, 3, 3], [7, 1, 1, 1, 1, 1, 1, 1], [2, 2, 2, 3, 3], [9, 8, 2, 2, 1, 1]])
def test_balance_is_within_lpt_bound_of_brute_force(seconds):
    ranks = 2
    optimum = _brute_force_makespan(seconds, ranks)
    made = max(schedule([1] * len(seconds), seconds, ranks).loads)
    assert lower_bound([1] * len(seconds), seconds, ranks) <= optimum + 1e-12
    assert optimum <= made <= (4 / 3 - 1 / (3 * ranks)) * optimum + 1e-12  # Graham's LPT bound


def test_context_parallel_groups_never_wait():
    # a 4-rank group, two 2-rank ones and singles: every group's ranks end a phase equally loaded, so each
    # rank's load is the sum of what it runs
    degrees, seconds = [4, 2, 2, 2, 1, 1, 1, 1, 1], [4.0, 3.0, 2.0, 2.0, 1.0, 1.0, 1.0, 0.5, 0.5]
    plan = schedule(degrees, seconds, 4)
    loads = [0.0] * 4
    for c, t, first in zip(degrees, seconds, plan.groups):
        assert first % c == 0  # aligned groups
        for r in range(first, first + c):
            loads[r] += t
    assert list(plan.loads) == pytest.approx(loads)
    assert sum(loads) == pytest.approx(sum(c * t for c, t in zip(degrees, seconds)))


def test_packing_keeps_every_sequence_once_within_the_budget():
    lengths = [100, 700, 30, 1000, 250, 999, 1, 64, 3000, 5000, 512, 512]
    budget = 1024
    packed = pack(lengths, budget, lambda n: min_degree(n, budget))
    members = sorted(i for p in packed for i in p.members)
    assert members == list(range(len(lengths)))
    for p in packed:
        tokens = sum(lengths[i] for i in p.members)
        assert tokens <= p.cp * budget
        assert p.cp == 1 or len(p.members) == 1
    assert {p.cp for p in packed if len(p.members) == 1 and lengths[p.members[0]] > budget} == {4, 8}


def test_unmasked_static_layout_is_evaluates_estimate():
    # rows of seq_len attending across documents are what `evaluate` assumes for the strategy: the two paths
    # (the micro-batch coster and evaluate's own composition) must agree
    job = api.load_job("llama3-8b", "dgx-h100:2", batch=32, seq_len=16384)
    catalog = load_catalog()
    s = check_strategy(job, parse_strategy("tp=2,cp=2,zero=1,recompute=full"))
    coster = MicroCoster(job, s, catalog)
    ctx = Layouts(coster=coster, lengths=[16384] * 32, end=coster.step_end(), encoders=None)
    layouts = {x.layout: x for x in static_layouts(ctx)}
    expected = evaluate(job, s, catalog=catalog).step_time_s
    assert layouts["pack-unmasked"].step_time_s == pytest.approx(expected, rel=1e-9)
    # every sequence seq_len long: padding and document-masked packing are the same rows
    assert layouts["pad"].step_time_s == pytest.approx(expected, rel=1e-9)
    assert layouts["pack"].step_time_s == pytest.approx(expected, rel=1e-9)


def test_plan_never_loses_when_every_sequence_is_full_length():
    job = api.load_job("llama3-8b", "dgx-h100:2", batch=32, seq_len=16384)
    s = check_strategy(job, parse_strategy("tp=2,cp=2,zero=1,recompute=full"))
    profile = DataProfile(name="full", source="t", bins=[LengthBin(min_tokens=16384, max_tokens=16384, count=1)])
    data, chosen = plan_data(job, profile, [s], load_catalog())
    assert chosen == 0 and data.speedup >= 1.0
    assert data.step_time_s <= data.baseline_step_time_s
    assert data.bound_s <= data.step_time_s + 1e-12


# each example profile at the longest sample it holds, on one DGX H100 node (the Done-when run, 64 x 131072
# tokens on 4 nodes, is `python tests/bench/data_profiles.py`: minutes per profile; docs/benchmarks.md quotes it)
SEQ_LENS = {"long-context-sft-mix": 131072, "code-corpus": 131072, "image-text-mix": 32768}


def _compile_json(profile: Path) -> dict:
    # in-process: the command's code path without an interpreter's start and imports (about 1 CPU-s each)
    run = CliRunner().invoke(cli, ["compile", "llama3-8b", "dgx-h100:1", "-b", "8", "-s", str(SEQ_LENS[profile.stem]),
                                   "--data-profile", str(profile), "--work-limit", "5", "--json"])
    assert run.exit_code == 0, run.output[-2000:]
    return json.loads(run.stdout)


def test_every_example_profile_never_loses_and_one_wins_by_five_percent():
    assert {path.stem for path in EXAMPLES} == set(SEQ_LENS)
    results = {path.stem: _compile_json(path) for path in EXAMPLES}
    for name, out in results.items():
        data = out["data"]
        assert out["step_time_s"] == data["step_time_s"] <= data["baseline_step_time_s"], name
        assert out["solver"]["status"] in ("OPTIMAL", "FEASIBLE")
        # the baseline is the fastest static layout that fits, over every strategy priced
        fitting = [x["step_time_s"] for x in data["static"] if x["fits"]]
        assert data["baseline_step_time_s"] == min(fitting)
        assert out["plan"]["strategy_spec"] == data["strategy"]
    assert max(r["data"]["baseline_step_time_s"] / r["step_time_s"] for r in results.values()) > 1.05


# ---------------------------------------------------------------- the trainer under the plan's sampler


@pytest.fixture(scope="module")
def sampler_runs(tmp_path_factory):
    """tiny-llama compiled data-parallel on cpu:1's 4 ranks with a skewed profile, trained 3 steps in fp32 on
    documents of 2 to 65 tokens, balanced (the plan's sampler) and in order: (balanced, in order, stdout)."""
    pytest.importorskip("torch")
    from ports import one_launch_at_a_time
    from trainer_runs import compile_tiny, launch

    root = tmp_path_factory.mktemp("data-plan-run")
    lengths = [2 + (37 * d) % 13 if d % 5 else 40 + (11 * d) % 26 for d in range(300)]  # mostly short
    lines = [json.dumps({"text": "".join("abcdefgh"[(d + i) % 8] for i in range(n))}) for d, n in enumerate(lengths)]
    (root / "docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    subprocess.run([sys.executable, "-m", "planner.runtime.data", "write", "--tokenizer", "bytes", "--input",
                    str(root / "docs.jsonl"), "--output", str(root / "train")], check=True, timeout=60,
                   capture_output=True, cwd=ROOT)
    profile = _profile(root, "name: skewed\nsource: test\nbins:\n  - {min_tokens: 2, max_tokens: 14, count: 4}\n"
                             "  - {min_tokens: 40, max_tokens: 64, count: 1}\n")
    plan = compile_tiny(root / "plan", "tp=1,pp=1,cp=1,dp=4,mbs=1", "--data-profile", str(profile),
                        "--data", str(root / "train"), "--tokenizer", "bytes", "--train-steps", "3")
    with one_launch_at_a_time(tmp_path_factory):
        balanced, run = launch(plan, root / "balanced.json", "--precision", "fp32",
                               env={"PLANNER_CHECKPOINTS": str(root / "ck1")})
        in_order, run2 = launch(plan, root / "in-order.json", "--precision", "fp32", "--unbalanced",
                                env={"PLANNER_CHECKPOINTS": str(root / "ck2")})
    return balanced, in_order, run.stdout, run2.stdout, json.loads((plan / "plan.json").read_text())


@pytest.mark.multiprocess
def test_trainer_runs_the_plans_sampler_with_the_unbalanced_runs_loss(sampler_runs):
    balanced, in_order, out, out_in_order, plan = sampler_runs
    assert plan["data"]["layout"] == "hybrid" and plan["strategy_spec"] == plan["data"]["strategy"]
    assert "data plan: balanced packed micro-batches of at most" in out
    assert "data plan: in order" in out_in_order
    assert len(balanced["losses"]) == 3
    # the same documents each step, only dealt out differently: the same mean token loss (float summation order
    # differs across ranks)
    assert balanced["losses"] == pytest.approx(in_order["losses"], rel=1e-5)
    # dealt out differently: the busiest rank's planned seconds never above the in-order run's, below in a step
    def busiest(text: str) -> list[float]:
        return [float(line.split("planned_busiest_s ")[1].split()[0]) for line in text.splitlines()
                if line.startswith("step ")]

    ours, theirs = busiest(out), busiest(out_in_order)
    assert len(ours) == len(theirs) == 3
    assert all(a <= b + 1e-12 for a, b in zip(ours, theirs)) and any(a < b for a, b in zip(ours, theirs))


def test_profile_counted_from_token_shards(tmp_path):
    from planner.data.profile import load_data_profile
    from planner.runtime.data_profile import histogram

    # by hand: 1 | 2 3 | 5 7 | 8
    assert histogram([3, 1, 7, 2, 8, 5, 0]) == [
        {"min_tokens": 1, "max_tokens": 1, "count": 1}, {"min_tokens": 2, "max_tokens": 3, "count": 2},
        {"min_tokens": 5, "max_tokens": 7, "count": 2}, {"min_tokens": 8, "max_tokens": 8, "count": 1}]
    docs = ["a" * n for n in (1, 4, 9, 30)]  # bytes tokenizer: n + 1 tokens with the end-of-document id
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    for args in (["write", "--tokenizer", "bytes", "--input", str(tmp_path / "docs.jsonl"), "--output",
                  str(tmp_path / "train")],
                 ["profile", "--data", str(tmp_path / "train"), "--output", str(tmp_path / "p.yaml")]):
        subprocess.run([sys.executable, "-m", "planner.runtime.data", *args], check=True, timeout=60, cwd=ROOT,
                       capture_output=True)
    profile = load_data_profile(tmp_path / "p.yaml")
    assert [(b.min_tokens, b.max_tokens, b.count) for b in profile.bins] == [(2, 2, 1), (5, 5, 1), (10, 10, 1),
                                                                            (31, 31, 1)]
    assert "4 documents" in profile.source


def test_an_encoder_adds_at_least_its_forward_flops(tmp_path):
    # one 576-token image on every sample, encoded by CLIP ViT-L/14 (frozen: forward only): wherever it runs, the
    # step grows by at least the encoder's forward FLOPs (2 x parameters x tokens, Kaplan et al. 2020) spread
    # evenly over the data ranks at the GPUs' dense bf16 peak
    from models import load_model

    encoder = ROOT / "examples" / "models" / "clip-vit-l-14-336.yaml"
    text = "name: mm\nsource: t\nbins:\n  - {min_tokens: 600, max_tokens: 1200, count: 1}\n"
    job = api.load_job("llama3-8b", "dgx-h100:1", batch=16, seq_len=8192)
    s = check_strategy(job, parse_strategy("tp=1,cp=1,zero=3"))
    plain = load_data_profile_text(tmp_path / "plain.yaml", text)
    with_images = load_data_profile_text(tmp_path / "mm.yaml", text + "modalities:\n  - {kind: image, sample_share: 1, "
                                         f"items_per_sample: 1, tokens_per_item: 576, encoder: {encoder}}}\n")
    catalog = load_catalog()
    base, _ = plan_data(job, plain, [s], catalog)
    mm, _ = plan_data(job, with_images, [s], catalog)
    images = base.sequences  # every sample is at least 600 tokens long: each carries one image
    params = load_model(str(encoder)).params
    peak = job.cluster.pools[0].device_spec().peak("bf16")
    floor = 2 * params * 576 * images / 8 / peak  # 8 data ranks
    assert mm.encoder_placement in ("co-located", "spread")
    assert mm.step_time_s - base.step_time_s >= floor
    assert mm.step_time_s - base.step_time_s < 20 * floor  # and not absurdly more (a frozen encoder's forward)


def load_data_profile_text(path: Path, text: str):
    from planner.data.profile import load_data_profile

    path.write_text(text, encoding="utf-8")
    return load_data_profile(path)


def test_compare_with_a_data_profile_lists_every_layout_and_the_plan(tmp_path):
    path = _profile(tmp_path, "name: p\nsource: t\nbins:\n  - {min_tokens: 2, max_tokens: 8, count: 5}\n"
                              "  - {min_tokens: 40, max_tokens: 64, count: 1}\n")
    csv_path, png = tmp_path / "c.csv", tmp_path / "c.png"
    result = CliRunner().invoke(cli, ["compare", "tiny-llama", "cpu:1", "-b", "8", "-s", "64", "--data-profile",
                                      str(path), "--csv", str(csv_path), "--plot", str(png), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    plan = rows[-1]
    assert plan["layout"].startswith("plan: ") and plan["plan_speedup"] == 1.0
    static = rows[:-1]
    # three static layouts per context-parallel degree that fits on 4 ranks (1, 2, 4), none faster than the plan
    assert {(r["layout"], r["cp"]) for r in static} == {(x, c) for x in ("pad", "pack", "pack-unmasked")
                                                         for c in ("1", "2", "4")}
    assert all(r["step_time_s"] >= plan["step_time_s"] for r in static if r["fits"])
    assert csv_path.read_text().count("\n") == len(rows) + 1 and png.read_bytes()[:4] == b"\x89PNG"


def test_estimate_with_a_data_profile_scores_the_strategy_on_the_data(tmp_path):
    path = _profile(tmp_path, "name: p\nsource: t\nbins:\n  - {min_tokens: 100, max_tokens: 2000, count: 8}\n"
                              "  - {min_tokens: 8000, max_tokens: 16384, count: 1}\n")
    result = CliRunner().invoke(cli, ["estimate", "llama3-8b", "dgx-h100:2", "-b", "32", "-s", "16384",
                                      "--strategy", "tp=2,cp=2,zero=1,recompute=full", "--data-profile",
                                      str(path), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    data = out["data"]
    layouts = {x["layout"]: x["step_time_s"] for x in data["static"]}
    # one strategy: its unmasked packing is the uniform estimate, computed by evaluate's own composition
    assert layouts["pack-unmasked"] == pytest.approx(out["uniform_step_time_s"], rel=1e-9)
    assert out["step_time_s"] == data["step_time_s"] <= min(layouts.values())
    assert data["strategy"].startswith("tp=2,pp=1,dp=4,cp=2")


def test_sweep_over_profiles_and_context_lengths(tmp_path):
    _profile(tmp_path, "name: skewed\nsource: t\nbins:\n  - {min_tokens: 2, max_tokens: 16, count: 5}\n"
                       "  - {min_tokens: 100, max_tokens: 128, count: 1}\n")
    flat = "name: flat\nsource: t\nbins:\n  - {min_tokens: 30, max_tokens: 40, count: 1}\n"
    (tmp_path / "flat.yaml").write_text(flat, encoding="utf-8")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("models: [tiny-llama]\nclusters: ['cpu:1']\nbatches: [8]\nseq_lens: [64, 128]\n"
                     "strategies: [planner]\ntime_limit: 20\ndata_profiles: [profile.yaml, flat.yaml]\n")
    result = CliRunner().invoke(cli, ["sweep", str(sweep), "-o", str(tmp_path / "out")], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    import csv

    rows = list(csv.DictReader((tmp_path / "out" / "data.csv").open()))
    # two context lengths x two profiles; the skewed profile is clipped at 64 tokens for the first
    assert [(r["seq_len"], r["profile"]) for r in rows] == [("64", "skewed"), ("64", "flat"), ("128", "skewed"),
                                                            ("128", "flat")]
    assert all(float(r["plan_step_s"]) <= float(r["static_step_s"]) for r in rows)
    assert (tmp_path / "out" / "data.png").read_bytes()[:4] == b"\x89PNG"
    assert "cost model" in (tmp_path / "out" / "data.md").read_text()


def test_sweep_names_a_bad_profile_by_its_field(tmp_path):
    _profile(tmp_path, "name: p\nsource: t\nbins: []\n")
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("models: [tiny-llama]\nclusters: ['cpu:1']\nbatches: [8]\nseq_lens: [64]\n"
                     "data_profiles: [profile.yaml]\n")
    result = CliRunner().invoke(cli, ["sweep", str(sweep), "-o", str(tmp_path / "out")])
    assert result.exit_code == 2
    line = result.output.strip()
    assert "\n" not in line and "data_profiles[0]" in line and "bins" in line, line


def test_plan_files_are_byte_identical_and_digest_the_profile(tmp_path):
    path = _profile(tmp_path, "name: p\nsource: t\nbins:\n  - {min_tokens: 2, max_tokens: 30, count: 5}\n"
                              "  - {min_tokens: 40, max_tokens: 64, count: 1}\n")
    other = tmp_path / "other.yaml"
    other.write_text("name: p\nsource: t\nbins:\n  - {min_tokens: 2, max_tokens: 30, count: 1}\n", encoding="utf-8")
    outs = []
    for k, profile in enumerate((path, path, other)):
        out = tmp_path / f"out{k}"
        result = CliRunner().invoke(cli, ["compile", "tiny-llama", "cpu:1", "-b", "8", "-s", "64", "--data-profile",
                                          str(profile), "--work-limit", "2", "-o", str(out), "--target", "torch"])
        assert result.exit_code == 0, result.output
        outs.append(out)
    first, again, changed = ((o / "plan.json").read_bytes() for o in outs)
    assert first == again and (outs[0] / "report.md").read_bytes() == (outs[1] / "report.md").read_bytes()
    digest = [json.loads(x)["inputs_digest"] for x in (first, changed)]
    assert digest[0] != digest[1]
    # `planner simulate` recomputes the digest from the recorded options, the profile among them
    result = CliRunner().invoke(cli, ["simulate", str(outs[0] / "plan.json"), "--json"])
    assert result.exit_code == 0, result.output


def test_trainer_refuses_a_data_plan_it_cannot_run_in_one_line(tmp_path):
    path = _profile(tmp_path, "name: p\nsource: t\nbins:\n  - {min_tokens: 2, max_tokens: 64, count: 1}\n")
    out = tmp_path / "plan"
    result = CliRunner().invoke(cli, ["compile", "tiny-llama", "cpu:1", "-b", "8", "-s", "64", "--fix",
                                      "pp=2,dp=2,cp=1,tp=1", "--data-profile", str(path), "-o", str(out)])
    assert result.exit_code == 0, result.output
    run = subprocess.run([sys.executable, "-m", "planner.runtime.train", "--plan", str(out / "plan.json")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and "data-parallel strategies (tp=cp=pp=1)" in run.stderr, run.stderr


def test_sampler_deals_every_micro_batch_once_and_balances_no_worse():
    from planner.data.result import CostFit, DataPlan
    from planner.runtime.sampler import PlanSampler, synthetic_document

    fit = CostFit(cp=1, fixed_s=1e-3, per_token_s=1e-5, per_token_squared_s=1e-7)
    plan = DataPlan.model_construct(token_budget=64, cost_fit=[fit])
    doc = functools.partial(synthetic_document, seq_len=64, vocab=50, seed=3)
    lengths = [len(doc(i)) - 1 for i in range(400)][:200]
    balanced = PlanSampler(doc, None, plan, seq_len=64, global_batch=16, dp_rank=0, dp_size=4)
    in_order = PlanSampler(doc, None, plan, seq_len=64, global_batch=16, dp_rank=0, dp_size=4, balance=False)
    packed, ranks, loads = balanced.assign(lengths)
    assert sorted(i for p in packed for i in p.members) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in p.members) <= 64 for p in packed) and set(ranks) <= {0, 1, 2, 3}
    _, _, loads_in_order = in_order.assign(lengths)
    assert sum(loads) == pytest.approx(sum(loads_in_order))
    assert max(loads) <= max(loads_in_order)
    # a step takes whole documents up to batch x seq_len tokens, and every rank sees the same step
    step = [PlanSampler(doc, None, plan, seq_len=64, global_batch=16, dp_rank=r, dp_size=4).next_step()
            for r in range(4)]
    assert len({s.label_tokens for s in step}) == 1 and step[0].label_tokens <= 16 * 64
    assert sum(m.tokens.shape[1] for s in step for m in s.micro) == step[0].label_tokens
