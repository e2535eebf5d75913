"""`planner simulate`: the discrete-event simulator against the analytic model, its schedules, engine,
memory curves, trace, plots and command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from hardware import load_catalog, load_cluster
from models import load_model
from planner.cli import cli
from planner.job import Job
from planner.profile import load_runtime
from planner.plan.assemble import build_plan
from planner.plan.schema import plan_json
from planner.simulate import simulate, summarize
from planner.simulate.engine import Task, run
from planner.simulate.memory import memory_curves
from planner.simulate.plan_input import plan_runs, simulate_plan
from planner.simulate.schedule import Op, interleaved, one_f_one_b
from planner.simulate.trace import trace_json
from planner.search.result import CompileOptions
from planner.search.space import SpaceOptions
from planner.strategy import parse_strategy

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def llama_job():
    return Job(model=load_model("llama3-8b"), cluster=load_cluster("dgx-h100:2"), global_batch=64, seq_len=4096)


# ---------------------------------------------------------------------------- agreement on homogeneous plans

GRID = [
    "tp=1,zero=0",
    "tp=1,zero=1,mbs=2",
    "tp=1,zero=2",
    "tp=1,zero=3",
    "tp=1,zero=3,recompute=selective,mbs=2",
    "tp=2,zero=1,recompute=full",
    "tp=2,cp=2,zero=1",
    "tp=8,dp=2,zero=0",
    "tp=1,pp=2,zero=2",
    "tp=2,pp=2,zero=1,schedule=gpipe",
    "tp=2,pp=4,zero=1",
    "tp=2,pp=4,zero=0,schedule=gpipe,recompute=full",
    "tp=2,pp=4,vpp=2,zero=1",
    "tp=1,pp=4,vpp=2,zero=2,recompute=selective",
    "tp=4,pp=2,vpp=2,zero=1,tp_overlap=on",
    "tp=2,pp=2,zero=3,offload=optimizer",
    "tp=1,zero=3,shard=node",
]


@pytest.mark.parametrize("spec", GRID)
def test_simulated_step_agrees_with_the_analytic_model_within_5_percent(llama_job, spec):
    result = summarize(simulate(llama_job, parse_strategy(spec)))
    assert result.agrees, (spec, result.difference, [t for t in result.terms if t.why])
    # the two models price the same work: only schedule and overlap can differ
    compute = next(t for t in result.terms if t.term == "compute")
    assert compute.simulated_s == pytest.approx(compute.analytic_s, rel=1e-9)
    # the terms add up to each model's step
    assert sum(t.simulated_s for t in result.terms) == pytest.approx(result.simulated_step_s, rel=1e-9)
    assert sum(t.analytic_s for t in result.terms) == pytest.approx(result.analytic_step_s, rel=1e-9)


def test_uneven_split_differs_and_the_report_says_why(llama_job):
    result = summarize(simulate(llama_job, parse_strategy("tp=2,pp=4,split=2/14/14/2")))
    bubble = next(t for t in result.terms if t.term == "bubble")
    # stages 0 and 3 are far faster than 1 and 2: the analytic fill/drain over-counts their share
    assert bubble.simulated_s < bubble.analytic_s * 0.9
    assert "uneven" in bubble.why
    assert result.simulated_step_s != result.analytic_step_s


def test_cross_node_ddp_sync_hides_only_behind_the_last_backward():
    # one micro-batch per replica over 8 nodes: the gradient all-reduce cannot hide behind the forward
    job = Job(model=load_model("llama3-8b"), cluster=load_cluster("dgx-h100:8"), global_batch=64, seq_len=4096)
    result = summarize(simulate(job, parse_strategy("tp=1,zero=0")))
    sync = next(t for t in result.terms if t.term == "step-end sync")
    assert sync.simulated_s > sync.analytic_s
    assert "last backward" in sync.why


def test_communication_bound_zero3_is_faster_than_the_analytic_windows_and_says_why():
    # 70B over 8 nodes with ZeRO-3: each micro-batch moves more data than its compute can hide
    job = Job(model=load_model("llama3-70b"), cluster=load_cluster("dgx-h100:8"), global_batch=128, seq_len=4096)
    result = summarize(simulate(job, parse_strategy("tp=8,zero=3,recompute=full")))
    assert not result.agrees and result.difference < 0
    wait = next(t for t in result.terms if t.term == "dp-wait")
    assert wait.simulated_s < wait.analytic_s and "communication-bound" in wait.why


# ---------------------------------------------------------------------------- sharded weights, as runtimes issue them

# arXiv 2104.04473 Table 2's ZeRO-3 run (published_runs.csv row 217): GPT-3 175B in fp16 on 384 A100s, micro-batch 4
SC21_ZERO3 = "dp=384,mbs=4,zero=3,recompute=full"


def _sc21_job(runtime) -> Job:
    return Job(model=load_model("gpt3-175b"), cluster=load_cluster("dgx-a100-80g:48"), global_batch=1536,
               seq_len=2048, precision="fp16", runtime=runtime)


def _with_calls(runtime: str, **update):
    """A runtime profile whose gather calls differ from the built-in one."""
    profile = load_runtime(runtime)
    calls = profile.gathering.calls.model_copy(update=update)
    return profile.model_copy(update={"gathering": profile.gathering.model_copy(update={"calls": calls})})


def _beside_compute(sim, kinds: tuple[str, ...]) -> float:
    """Seconds during which a task of `kinds` runs while its stage computes a forward or backward."""
    tl = sim.timeline
    passes = [(tl.start[i], tl.end[i], t.stage) for i, t in enumerate(tl.tasks) if t.kind in ("forward", "backward")]
    total = 0.0
    for i, task in enumerate(tl.tasks):
        if task.kind in kinds:
            total += sum(max(0.0, min(end, tl.end[i]) - max(start, tl.start[i]))
                         for start, end, stage in passes if stage == task.stage)
    return total


def test_deepspeed_2021_zero3_agrees_and_no_gather_runs_beside_compute():
    # DeepSpeed 0.3.x prefetches nothing (profile: prefetch 0); simulated with one prefetched gather per layer,
    # as before, this plan came out 21.6% faster than the analytic step
    sim = simulate(_sc21_job(load_runtime("deepspeed-2021")), parse_strategy(SC21_ZERO3))
    result = summarize(sim)
    assert result.agrees, (result.difference, [t for t in result.terms if t.why])
    assert _beside_compute(sim, ("gather", "regather")) == 0.0
    # the reduce-scatters still run beside the backward
    assert _beside_compute(sim, ("reduce",)) > 0.0
    wait = next(t for t in result.terms if t.term == "dp-wait")
    assert wait.simulated_s == pytest.approx(wait.analytic_s, rel=0.01)


def test_deepspeed_2021_each_gather_call_pays_its_ring_latency_and_host_copies():
    # two more all-gathers per attention layer: per block 2 more in the forward, 2 in the recomputed forward and
    # 2 in the backward, none hidden; each pays n - 1 fabric latencies, n per-rank copies (n = 384) and one launch
    base = simulate(_sc21_job(load_runtime("deepspeed-2021")), parse_strategy(SC21_ZERO3))
    gathers = load_runtime("deepspeed-2021").gathering.calls.gathers
    more = simulate(_sc21_job(_with_calls("deepspeed-2021", gathers={**gathers, "attention": 4})),
                    parse_strategy(SC21_ZERO3))
    catalog = load_catalog()
    per_call = (383 * load_cluster("dgx-a100-80g:48").fabric.latency
                + 384 * catalog.constant("collective_per_rank_copy_seconds")
                + catalog.constant("collective_launch_seconds"))
    assert more.step_time - base.step_time == pytest.approx(6 * 96 * per_call, rel=1e-6)


def test_torchtitan_fsdp_agrees_with_one_gather_per_block_prefetched():
    job = Job(model=load_model("llama3-8b"), cluster=load_cluster("dgx-h100:4"), global_batch=64, seq_len=4096,
              runtime=load_runtime("torchtitan"))
    sim = simulate(job, parse_strategy("tp=1,zero=3,recompute=full"))
    result = summarize(sim)
    assert result.micro_batches == 2 and result.agrees, (result.difference, [t for t in result.terms if t.why])
    # torchtitan's apply_fsdp wraps every block and the root (embeddings, final norm, output): one all-gather each
    forward_gathers = [t for t in sim.timeline.tasks if t.kind == "gather" and t.micro_batch == 0]
    assert len(forward_gathers) == job.model.num_blocks + 1
    # one block of prefetch: the next block's gather runs beside this one's compute
    assert _beside_compute(sim, ("gather",)) > 0.0


# ---------------------------------------------------------------------------- schedules and engine


def test_one_f_one_b_order_has_p_minus_stage_minus_1_warmup_forwards():
    ops = one_f_one_b(stage=1, stages=4, micro_batches=4)
    assert [(o.phase, o.micro_batch) for o in ops] == [
        ("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)]


def test_interleaved_order_follows_megatron():
    # p=2, v=2, m=4, stage 0: warm-up (2-0-1)*2 + (2-1)*2 = 4 forwards; groups of 2 micro-batches per chunk
    ops = interleaved(stage=0, stages=2, micro_batches=4, chunks=2)
    expected = [Op("F", 0, 0), Op("F", 1, 0), Op("F", 0, 1), Op("F", 1, 1),
                Op("F", 2, 0), Op("B", 0, 1), Op("F", 3, 0), Op("B", 1, 1),
                Op("F", 2, 1), Op("B", 0, 0), Op("F", 3, 1), Op("B", 1, 0),
                Op("B", 2, 1), Op("B", 3, 1), Op("B", 2, 0), Op("B", 3, 0)]
    assert ops == expected


def test_engine_slows_a_collective_while_compute_runs():
    tasks = [Task(0, "compute", "forward", "f", 10.0, computes=True),
             Task(0, "dp", "gather", "g", 10.0, shared=True),
             Task(0, "compute", "backward", "b", 1.0, after_end=[1])]
    timeline = run(tasks, overlap=0.5)
    # 5 s of the gather done at half speed under the forward, the other 5 s alone
    assert timeline.end[1] == pytest.approx(15.0)
    assert timeline.start[2] == pytest.approx(15.0) and timeline.end[2] == pytest.approx(16.0)


# ---------------------------------------------------------------------------- memory, trace, plots


@pytest.mark.parametrize("spec", ["tp=2,pp=4,zero=1", "tp=2,pp=4,schedule=gpipe,recompute=full"])
def test_simulated_memory_peak_matches_the_in_flight_count(llama_job, spec):
    sim = simulate(llama_job, parse_strategy(spec))
    curves = memory_curves(sim)
    assert len(curves) == 4
    for curve in curves:
        assert curve.peak == pytest.approx(curve.analytic_peak, rel=1e-9)
        # every micro-batch's activations are freed by the end of the step
        assert curve.bytes[-1] == pytest.approx(min(curve.bytes)) and curve.bytes[-1] < curve.peak


def test_trace_is_json_with_events_for_every_stage(llama_job):
    sim = simulate(llama_job, parse_strategy("tp=2,pp=4,vpp=2,zero=1"))
    text = trace_json([("", sim)])
    assert text == trace_json([("", sim)])
    events = json.loads(text)["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in complete if e["cat"] in ("forward", "backward")} == {0, 1, 2, 3}
    assert all(e["dur"] >= 0 and e["ts"] >= 0 for e in complete)
    forwards = [e for e in complete if e["cat"] == "forward" and e["pid"] == 0]
    assert len(forwards) == sim.micro_batches * 2  # one per micro-batch and chunk
    assert max(e["ts"] + e["dur"] for e in complete) == pytest.approx(sim.step_time * 1e6, rel=1e-6)


@pytest.mark.parametrize("spec", ["tp=2,pp=4,vpp=2,zero=1", "tp=1,pp=4,dp=4,zero=3,mbs=1",
                                  "tp=2,pp=4,schedule=gpipe,recompute=full,offload=optimizer"])
def test_trace_slices_are_whole_nanoseconds_and_properly_nested_per_thread(llama_job, spec):
    """What Perfetto checks: on one thread a slice that starts inside another must end inside it; the runtime's
    streams are serial, so no two slices of a thread may overlap at all (once 100-228 per thread did, by
    rounding ts and dur apart)."""
    events = json.loads(trace_json([("", simulate(llama_job, parse_strategy(spec)))]))["traceEvents"]
    lanes: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for e in (e for e in events if e["ph"] == "X"):
        start, dur = e["ts"] * 1000, e["dur"] * 1000
        assert start == pytest.approx(round(start), abs=1e-6) and dur == pytest.approx(round(dur), abs=1e-6)
        lanes.setdefault((e["pid"], e["tid"]), []).append((round(start), round(start) + round(dur)))
    assert lanes
    for slices in lanes.values():
        slices.sort()
        overlaps = sum(1 for (_, end), (start, _) in zip(slices, slices[1:]) if start < end)
        assert overlaps == 0


# ---------------------------------------------------------------------------- command line


@pytest.fixture(scope="module")
def plan_path(tmp_path_factory):
    out = tmp_path_factory.mktemp("plan")
    result = CliRunner().invoke(cli, ["compile", "tiny-llama", "dgx-h100:1", "-b", "16", "-s", "512", "-o",
                                      str(out / "p"), "--time-limit", "10", "--target", "torch"])
    assert result.exit_code == 0, result.output
    return out / "p" / "plan.json"


def _assert_png(path):
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 100 and image.shape[1] > 100


def test_cli_simulate_writes_trace_and_valid_pngs(plan_path, tmp_path):
    runner = CliRunner()
    args = ["simulate", str(plan_path), "--trace", str(tmp_path / "t.json"), "--plot", str(tmp_path / "tl.png"),
            "--memory-plot", str(tmp_path / "mem.png")]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "simulated" in result.output and "analytic" in result.output and "stage" in result.output
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    _assert_png(tmp_path / "tl.png")
    _assert_png(tmp_path / "mem.png")
    first = (tmp_path / "tl.png").read_bytes(), (tmp_path / "mem.png").read_bytes()
    assert runner.invoke(cli, args).exit_code == 0
    assert ((tmp_path / "tl.png").read_bytes(), (tmp_path / "mem.png").read_bytes()) == first  # deterministic


def test_cli_simulate_json(plan_path):
    result = CliRunner().invoke(cli, ["simulate", str(plan_path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    plan = json.loads(plan_path.read_text())
    assert data["analytic_step_s"] == plan["time"]["step_time_s"]
    assert data["groups"][0]["result"]["strategy_spec"] == plan["strategy_spec"]
    assert data["simulated_step_s"] > 0 and {t["term"] for t in data["groups"][0]["result"]["terms"]} >= {
        "compute", "bubble", "step-end sync"}


@pytest.mark.parametrize("content, message", [
    (None, "no such plan file"),
    ("{not json", "not valid JSON"),
    ('{"schema": "planner.embedding-plan/1"}', "recommendation-model plan"),
    ('{"schema_version": "2"}', "planner_version"),
])
def test_cli_simulate_bad_plan_exits_2_with_one_line(tmp_path, content, message):
    path = tmp_path / "plan.json"
    if content is not None:
        path.write_text(content)
    result = CliRunner().invoke(cli, ["simulate", str(path)])
    assert result.exit_code == 2
    assert message in result.output and str(path) in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_cli_simulate_needs_the_model_file_of_a_file_plan(tmp_path):
    spec = tmp_path / "my-model.yaml"  # a plan compiled from a model file names the model only
    spec.write_text(Path("examples/models/tiny-llama.yaml").read_text().replace("name: tiny-llama", "name: my-model"))
    compiled = CliRunner().invoke(cli, ["compile", str(spec), "dgx-h100:1", "-b", "16", "-s", "512", "-o",
                                        str(tmp_path / "p"), "--time-limit", "10", "--target", "deepspeed"])
    assert compiled.exit_code == 0, compiled.output
    path = tmp_path / "p" / "plan.json"
    assert json.loads(path.read_text())["job"]["model"] == "my-model"
    result = CliRunner().invoke(cli, ["simulate", str(path)])
    assert result.exit_code == 2 and "--model" in result.output and "job.model" in result.output
    ok = CliRunner().invoke(cli, ["simulate", str(path), "--model", str(spec)])
    assert ok.exit_code == 0, ok.output
    wrong = CliRunner().invoke(cli, ["simulate", str(path), "--model", "llama3-8b"])
    assert wrong.exit_code == 2 and "job.model_params" in wrong.output


def test_replica_group_plan_simulates_every_group_and_the_sync():
    from test_compile import SMALL
    from test_replica_groups import _groups

    job, compiled = _groups()
    plan = build_plan(job, compiled, CompileOptions(space=SpaceOptions(**SMALL, fixed={"cp": 1})))
    assert plan_json(plan)  # a real plan.json
    runs, sync = plan_runs(plan, job)
    summary = simulate_plan(plan, runs, sync)
    assert [g.pool for g in summary.groups] == [g.pool for g in plan.groups]
    assert summary.sync_s > 0
    assert summary.simulated_step_s == pytest.approx(max(g.result.simulated_step_s for g in summary.groups)
                                                     + summary.sync_s)
    assert summary.agrees
    pids = {e["pid"] for e in json.loads(trace_json([(p or "", r) for p, _, r in runs]))["traceEvents"]}
    assert {0, 1000} <= pids  # each group's stage 0


def test_simulate_refuses_a_plan_for_other_inputs_or_edited(plan_path, tmp_path):
    # An H100 plan simulated on A100s used to compare against the stored H100 step time (+175.8%).
    other = CliRunner().invoke(cli, ["simulate", str(plan_path), "--cluster", "dgx-a100-80g:1"])
    assert other.exit_code == 2 and "inputs_digest" in other.stderr and len(other.stderr.strip().splitlines()) == 1
    data = json.loads(plan_path.read_text())
    data["job"]["global_batch"] = 32  # edited by hand
    edited = tmp_path / "plan.json"
    edited.write_text(json.dumps(data))
    result = CliRunner().invoke(cli, ["simulate", str(edited)])
    assert result.exit_code == 2 and "inputs_digest" in result.stderr


def test_simulate_compares_with_the_strategy_re_evaluated_not_the_stored_time(plan_path, tmp_path):
    data = json.loads(plan_path.read_text())
    data["time"]["step_time_s"] *= 3  # a stored time that no longer matches the strategy
    edited = tmp_path / "plan.json"
    edited.write_text(json.dumps(data))
    fresh = json.loads(CliRunner().invoke(cli, ["simulate", str(plan_path), "--json"]).output)
    result = CliRunner().invoke(cli, ["simulate", str(edited), "--json"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.output)
    assert got["analytic_step_s"] == fresh["analytic_step_s"] and got["difference"] == fresh["difference"]
    assert got["recorded_step_s"] == pytest.approx(3 * fresh["recorded_step_s"])
    text = CliRunner().invoke(cli, ["simulate", str(edited)]).output
    assert "note: plan.json records" in text
