"""Strategy.dp_overlap: how much of the data-parallel sync a run overlaps with compute.

`on` hides what the runtime's profile hides (Megatron --overlap-grad-reduce and --overlap-param-gather); `grad`
leaves the distributed optimizer's parameter all-gather after the step; `off` leaves the gradient reduction after
the last backward too (Megatron-LM's defaults, whose flags are store_true).  Exposing a collective costs at most
the collective's own time and never changes memory; frameworks that always overlap refuse the setting.
"""

from __future__ import annotations

import pytest

from conftest import make_job  # the shared job factory
from planner.cost.evaluate import evaluate
from planner.profile import load_runtime
from planner.simulate import simulate, summarize
from planner.errors import PlannerInputError
from planner.strategy import parse_strategy

SPEC = "tp=2,zero=1,recompute=selective"


@pytest.fixture(scope="module")
def job():
    # 8B over 8 nodes: the gradient reduce-scatter and parameter all-gather cross the fabric
    return make_job("llama3-8b", "dgx-h100:8", batch=256, seq=8192).on(load_runtime("megatron"))


def _estimate(job, overlap: str):
    return evaluate(job, parse_strategy(f"{SPEC},dp_overlap={overlap}"))


def test_exposing_the_data_parallel_sync_costs_at_most_its_collectives(job):
    on, grad, off = (_estimate(job, o) for o in ("on", "grad", "off"))
    assert on.step_time_s < grad.step_time_s < off.step_time_s
    assert on.breakdown.dp_comm_s < grad.breakdown.dp_comm_s < off.breakdown.dp_comm_s
    # what becomes exposed is the collectives' own time, nothing more: their total is the same in all three
    total = on.breakdown.dp_comm_total_s
    assert grad.breakdown.dp_comm_total_s == off.breakdown.dp_comm_total_s == total
    assert off.breakdown.dp_comm_s <= total * (1 + 1e-9)
    assert off.step_time_s - on.step_time_s <= total * (1 + 1e-9)
    assert on.memory.peak_bytes == grad.memory.peak_bytes == off.memory.peak_bytes


def test_no_data_parallel_sync_no_difference():
    single = make_job("llama3-8b", "dgx-h100:1", batch=16, seq=4096).on(load_runtime("megatron"))
    times = {evaluate(single, parse_strategy(f"tp=8,zero=1,dp_overlap={o}")).step_time_s for o in ("on", "off")}
    assert len(times) == 1


def test_frameworks_that_always_overlap_refuse_it():
    torchtitan = load_runtime("torchtitan")
    reasons = torchtitan.cannot_express(parse_strategy("dp=8,zero=1,dp_overlap=off"))
    assert any("dp_overlap=off" in reason for reason in reasons)
    assert not load_runtime("megatron").cannot_express(parse_strategy("tp=2,zero=1,dp_overlap=grad"))


def test_the_spec_names_it_only_off_its_default():
    assert "dp_overlap" not in parse_strategy(SPEC).spec()
    spec = parse_strategy(f"{SPEC},dp_overlap=grad").spec()
    assert "dp_overlap=grad" in spec and parse_strategy(spec).dp_overlap == "grad"


def test_sharded_gradients_refuse_it():
    # ZeRO-2/3 reduce per micro-batch or per layer: not the step-end sync the setting exposes
    with pytest.raises(PlannerInputError, match="dp_overlap=off needs zero 0 or 1"):
        parse_strategy("dp=8,zero=3,dp_overlap=off")


def test_the_simulator_runs_the_exposed_sync_after_the_backward(job):
    # the simulated step exposes what the analytic one does: the two agree as closely as with the overlap on
    on = summarize(simulate(job, parse_strategy(SPEC)))
    off = summarize(simulate(job, parse_strategy(f"{SPEC},dp_overlap=off")))
    assert off.simulated_step_s > on.simulated_step_s
    assert off.agrees and abs(off.difference - on.difference) < 0.02
