"""The certificate oracle's enumeration skips nothing the runtime can run.

`planner.search.oracle.runtime_strategies` stops a candidate's recompute settings at the first, no
recompute, when that one is rejected (by the field rules, `check_strategy` or the runtime's refusals):
about nine in ten candidates are never built.  That is sound only while no rule rejects "no recompute"
and allows some recompute setting of the same strategy.  Here every candidate of small dense and MoE jobs
is tried, one by one, under every built-in runtime, and the oracle must yield exactly the runnable ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hardware import Cluster, Pool, load_catalog
from hardware.catalog import NodeSpec
from models import MoEConfig, build_transformer
from models.transformer import llama
from planner.job import Job
from planner.profile import load_runtime
from planner.search.oracle import _degrees, _experts, _pipeline, _recomputes, _runnable, _states, runtime_strategies

RUNTIMES = sorted(p.stem for p in (Path(__file__).parents[1] / "hardware" / "data" / "runtimes").glob("*.yaml"))
# the rules read a runtime's space alone (and the job): one runtime of each distinct space (of those that share one,
# MAIN's, sorted last, wins); MAIN's in the default run, the others under -m long
MAIN = ("planner", "megatron", "deepspeed", "torchtitan", "pytorch-fsdp", "pytorch-ddp", "reference")
SPACES = {load_runtime(name).space.model_dump_json(): name for name in sorted(RUNTIMES, key=lambda n: n in MAIN)}
DISTINCT = [pytest.param(name, marks=() if name in MAIN else pytest.mark.long) for name in sorted(SPACES.values())]


def _job(runtime: str, moe: bool) -> Job:
    """Three blocks on two GPUs (tp, cp, pp, dp; uneven splits, per-stage recompute counts, every-k-th
    recompute), or one block with experts."""
    node = NodeSpec.model_validate({**load_catalog().nodes["dgx-a100-40g"].model_dump(), "gpus_per_node": 2})
    model = build_transformer(llama(
        name="small", num_layers=1 if moe else 3, hidden=256, heads=4, kv_heads=2, ffn=768, vocab=512,
        moe=MoEConfig(num_experts=2, top_k=1, expert_ffn=256) if moe else None))
    cluster = Cluster(name="a100-2", pools=[Pool(name="pool", count=1, node=node)])
    return Job(model=model, cluster=cluster, global_batch=4, seq_len=512, runtime=load_runtime(runtime))


def _every_candidate(job: Job) -> set[str]:
    """The specs of every runnable candidate, each built and checked on its own."""
    specs = set()
    for degrees in _degrees(job):
        for experts in _experts(job, degrees["tp"]):
            for pipeline in _pipeline(job, degrees["pp"], degrees["dp"]):
                for states in _states(degrees["tp"]):
                    for recompute in _recomputes(job, degrees["pp"], pipeline.get("vpp", 1), pipeline.get("split")):
                        strategy = _runnable(job, {**degrees, **experts, **pipeline, **states, **recompute})
                        if strategy is not None:
                            specs.add(strategy.spec())
    return specs


@pytest.mark.parametrize("runtime", DISTINCT)
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_the_oracle_yields_every_runnable_candidate_once(runtime, moe):
    job = _job(runtime, moe)
    if moe and not job.runtime.space.moe:
        pytest.skip(f"{runtime} runs no mixture-of-experts model")
    yielded = [s.spec() for s in runtime_strategies(job)]
    expected = _every_candidate(job)
    assert len(yielded) == len(set(yielded))
    assert set(yielded) == expected
    assert any("recompute=full" in spec for spec in expected)  # the skip has something to skip
