"""Plans of hand-written strategies for the launch-file tests: scored by evaluate and certified as themselves,
no search, so each test reads the layout it names (a solver's choice drifts with the cost model)."""

from __future__ import annotations

from hardware import load_cluster
from models import load_model
from planner.cost import evaluate
from planner.job import Job
from planner.plan.groups import build_plan
from planner.search.result import Certificate, CompileOptions, CompileResult
from planner.plan.schema import Plan
from planner.strategy import Strategy, parse_strategy


def certified_plan(job: Job, strategy: Strategy) -> Plan:
    """The plan of `strategy` on `job`, scored by evaluate and certified as itself (no search)."""
    estimate = evaluate(job, strategy)
    cert = Certificate(status="OPTIMAL", objective=estimate.step_time_s, bound=estimate.step_time_s, gap=0.0,
                       wall_s=0.0, configurations=1, solved=1, pruned=0)
    result = CompileResult(strategy=strategy, estimate=estimate, certificate=cert, runners_up=[])
    return build_plan(job, result, CompileOptions())


def plan_of(model: str, cluster: str, spec: str, batch: int = 512, seq: int = 4096) -> tuple[Plan, Job]:
    """(plan, job) of a hand-written strategy SPEC on a zoo model and cluster."""
    job = Job(model=load_model(model), cluster=load_cluster(cluster), global_batch=batch, seq_len=seq)
    return certified_plan(job, parse_strategy(spec)), job


def big_plan():
    """llama3-70b on 8 DGX H100 nodes (issue #16's example, smaller): tp=8 pp=4 dp=2."""
    return plan_of("llama3-70b", "dgx-h100:8", "tp=8,pp=4,dp=2,mbs=1,zero=1")


def tiny_plan():
    """tiny-llama on two CPU nodes: tp=2 pp=2 dp=2."""
    return plan_of("tiny-llama", "cpu:2", "tp=2,pp=2,dp=2,mbs=2,zero=2", batch=8, seq=128)
