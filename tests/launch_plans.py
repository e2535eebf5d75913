"""Plans of hand-written strategies for the launch-file tests: scored by evaluate and certified as themselves,
no search, so each test reads the layout it names (a solver's choice drifts with the cost model)."""

from __future__ import annotations

from hardware import load_cluster
from models import load_model
from planner.cost import evaluate
from planner.job import Job
from planner.plan.assemble import build_plan
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


# one case per zoo family for the Megatron target: family -> (model, cluster, global batch, sequence length,
# strategy); tests/test_emit_megatron.py and tests/test_megatron_lm_parser.py read them
MEGATRON_FAMILIES = {
    "tiny-llama": ("tiny-llama", "cpu:2", 8, 128, "tp=2,pp=2"),
    "llama3": ("llama3-70b", "dgx-h100:8", 512, 4096, "tp=8,pp=4,zero=1"),
    "llama3.1": ("llama3-405b", "dgx-h100:32", 512, 8192, "tp=8,pp=16,zero=1"),
    "llama2": ("llama2-7b", "dgx-h100:1", 64, 4096, "tp=2,zero=1"),
    "mistral": ("mistral-7b", "dgx-h100:1", 64, 8192, "tp=2,zero=1"),
    "qwen2": ("qwen2-7b", "dgx-h100:1", 64, 4096, "tp=2,zero=1"),
    "gpt2": ("gpt2-xl", "dgx-h100:1", 64, 1024, "tp=1,zero=1"),
    "gpt3": ("gpt3-175b", "dgx-h100:16", 512, 2048, "tp=8,pp=8,zero=1"),
    "gpt-neox": ("gpt-neox-20b", "dgx-h100:2", 64, 2048, "tp=4,pp=2,zero=1"),
    "nemotron": ("nemotron-4-340b", "dgx-h100:32", 512, 4096, "tp=8,pp=8,zero=1"),
    "mixtral": ("mixtral-8x7b", "dgx-h100:4", 256, 4096, "tp=2,pp=4,ep=4,zero=1"),
    "mixtral-8x22b": ("mixtral-8x22b", "dgx-h100:8", 256, 4096, "tp=4,pp=4,ep=4,zero=1"),
    "deepseek": ("deepseek-v3", "dgx-h100:32", 1024, 4096, "tp=2,pp=8,ep=16,zero=1"),
}


def big_plan():
    """llama3-70b on 8 DGX H100 nodes (issue #16's example, smaller): tp=8 pp=4 dp=2."""
    return plan_of("llama3-70b", "dgx-h100:8", "tp=8,pp=4,dp=2,mbs=1,zero=1")


def tiny_plan():
    """tiny-llama on two CPU nodes: tp=2 pp=2 dp=2."""
    return plan_of("tiny-llama", "cpu:2", "tp=2,pp=2,dp=2,mbs=2,zero=2", batch=8, seq=128)
