"""Baseline strategies scored on the same cost model as the compiler, for `planner compare`.

Each baseline is a named generator with its source:

* ddp: data parallel only, weights and optimizer replicated (PyTorch DDP);
  the best micro-batch, recompute and offload the compiler finds under tp = pp = cp = 1, zero = 0.
* zero1, zero2, zero3 (fsdp): the same with ZeRO stage 1/2/3 over the whole
  data-parallel group (Rajbhandari et al. 2020; PyTorch FSDP).
* hsdp: ZeRO-3 sharded inside a node, replicated across nodes (FSDP HYBRID_SHARD).
* megatron: Megatron-LM's recipe (Narayanan et al. 2021, arXiv 2104.04473):
  tp = GPUs per node, the smallest pp whose even layer split fits, dp for the
  rest, micro-batch 1, the distributed optimizer (ZeRO-1), selective then full
  recompute, interleaving (vpp) when it is faster.
* uniform-pp: the best strategy whose pipeline stages hold equal numbers of
  blocks (the even split of Megatron-LM and DeepSpeed's PipelineModule
  `partition_method="uniform"`), every block recomputing alike.
* metis (clusters of more than one pool; left out on others): a greedy after
  Metis (Um et al., USENIX ATC 2024): stages on the pools in proportion to
  their GPUs, layers split by each stage's speed, moved off stages over their
  HBM, within the time limit.
* torchrec-greedy (recommendation models): TorchRec's greedy sharding planner.
* planner: the compiler's certified plan over the whole space.

The dense recipes (megatron, uniform-pp, metis) live in `planner.compare.baselines`
with their details.  Every row is evaluated by `evaluate` (or the embedding
cost model), so the planner row is never slower than a baseline row that fits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from planner.compare.baselines import megatron_recipe, metis_greedy, uniform_pp
from planner.cost import evaluate
from planner.embedding.compile import compile_embedding
from planner.errors import InfeasibleError
from planner.job import Job
from planner.search.compile import compile_job
from planner.search.result import CompileOptions
from planner.search.space import SpaceOptions

GB = 1e9


@dataclass(frozen=True)
class CompareRow:
    """One strategy's score."""

    strategy: str  # baseline name
    spec: str  # what it chose (SPEC string, or a summary of the table sharding)
    fits: bool
    why: str  # why it does not fit, or ""
    step_time_s: float | None
    tokens_per_s_per_gpu: float | None
    mfu: float | None
    peak_hbm_bytes: float | None
    host_bytes: float | None  # per node
    nvme_bytes: float | None  # per node
    planning_s: float

    def as_dict(self) -> dict:
        """JSON/CSV-ready fields."""
        return dict(self.__dict__)


def _dense_fixed(name: str) -> dict:
    plain = {"tp": 1, "pp": 1, "cp": 1}
    return {"ddp": {**plain, "zero": 0}, "zero1": {**plain, "zero": 1}, "zero2": {**plain, "zero": 2},
            "zero3": {**plain, "zero": 3, "shard": "full", "regather": "network"},
            "hsdp": {**plain, "zero": 3, "shard": "node"}}[name]


def _row_from_estimate(name: str, estimate, planning_s: float) -> CompareRow:
    host = estimate.memory.host
    fits = estimate.memory.fits
    return CompareRow(name, estimate.strategy_spec, fits, "" if fits else "; ".join(estimate.memory.reasons)[:200],
                      estimate.step_time_s, estimate.tokens_per_s_per_gpu, estimate.mfu, estimate.memory.peak_bytes,
                      host.dram_bytes, host.nvme_bytes, planning_s)


def _failed(name: str, why: str, planning_s: float) -> CompareRow:
    return CompareRow(name, "-", False, why.splitlines()[0][:200], None, None, None, None, None, None, planning_s)


def _compiled(name: str, job: Job, space: SpaceOptions, time_limit: float) -> CompareRow:
    start = time.perf_counter()
    try:
        result = compile_job(job, CompileOptions(time_limit=time_limit, space=space, runners_up=0))
    except InfeasibleError as err:
        return _failed(name, str(err), time.perf_counter() - start)
    elapsed = time.perf_counter() - start
    if result.estimate is None:  # replica groups on a mixed cluster
        g = result.groups
        spec = "; ".join(f"{r.group.pool}[batch={r.group.batch}]: {r.estimate.strategy_spec}" for r in g.groups)
        return CompareRow(name, spec, g.fits, "", g.step_time_s, g.tokens_per_s_per_gpu, g.mfu,
                          max(r.estimate.memory.peak_bytes for r in g.groups), None, None, elapsed)
    return _row_from_estimate(name, result.estimate, elapsed)


def _megatron(job: Job) -> CompareRow:
    start = time.perf_counter()
    strategy = megatron_recipe(job)
    if strategy is None:
        return _failed("megatron", "no pipeline depth with an even layer split fits", time.perf_counter() - start)
    return _row_from_estimate("megatron", evaluate(job, strategy), time.perf_counter() - start)


def _uniform(job: Job, time_limit: float) -> CompareRow:
    start = time.perf_counter()
    strategy = uniform_pp(job, time_limit)
    if strategy is None:
        return _failed("uniform-pp", "no strategy with an even layer split fits", time.perf_counter() - start)
    return _row_from_estimate("uniform-pp", evaluate(job, strategy), time.perf_counter() - start)


def _metis(job: Job, time_limit: float) -> CompareRow:
    start = time.perf_counter()
    strategy = metis_greedy(job, time_limit)
    if strategy is None:
        why = ("needs a cluster with more than one pool" if len(job.cluster.pools) < 2 else
               "no pipeline over more than one pool fits")
        return _failed("metis", why, time.perf_counter() - start)
    return _row_from_estimate("metis", evaluate(job, strategy), time.perf_counter() - start)


def _embedding(name: str, job: Job, time_limit: float) -> CompareRow:
    start = time.perf_counter()
    strategy = "torchrec-greedy" if name == "torchrec-greedy" else "planner"
    try:
        result = compile_embedding(job, strategy=strategy, time_limit=time_limit)
    except InfeasibleError as err:
        return _failed(name, str(err), time.perf_counter() - start)
    e = result.estimate
    kinds: dict[str, int] = {}
    for t in result.tables:
        key = t.sharding_type.value + ("" if t.cache_fraction >= 1.0 else f"@{t.cache_fraction:g}")
        kinds[key] = kinds.get(key, 0) + 1
    spec = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda kv: (-kv[1], kv[0])))
    return CompareRow(name, spec, e.fits, "", e.step_time_s, e.samples_per_s_per_gpu, None, e.peak_hbm_bytes,
                      e.peak_host_bytes, 0.0, time.perf_counter() - start)


DENSE_BASELINES = ("ddp", "zero1", "zero2", "zero3", "hsdp", "megatron", "uniform-pp", "metis", "planner")
MIXED_CLUSTER_ONLY = ("metis",)  # left out on one-pool clusters, where they have nothing to decide
EMBEDDING_BASELINES = ("torchrec-greedy", "planner")


def baselines_for(job: Job) -> tuple[str, ...]:
    """The strategies that apply to the job's model and cluster."""
    if job.model.family == "recsys":
        return EMBEDDING_BASELINES
    if len(job.cluster.pools) < 2:
        return tuple(name for name in DENSE_BASELINES if name not in MIXED_CLUSTER_ONLY)
    return DENSE_BASELINES


def compare(job: Job, strategies: tuple[str, ...] | None = None, time_limit: float = 60.0,
            progress: Callable[[str], None] | None = None) -> list[CompareRow]:
    """Score every applicable strategy (or `strategies`) on `job`."""
    rows = []
    for name in strategies or baselines_for(job):
        if progress:
            progress(f"compare: {name}")
        if job.model.family == "recsys":
            rows.append(_embedding(name, job, time_limit))
        elif name == "megatron":
            rows.append(_megatron(job))
        elif name == "uniform-pp":
            rows.append(_uniform(job, time_limit))
        elif name == "metis":
            rows.append(_metis(job, time_limit))
        elif name == "planner":
            rows.append(_compiled(name, job, SpaceOptions(), time_limit))
        else:
            rows.append(_compiled(name, job, SpaceOptions(fixed=_dense_fixed(name)), time_limit))
    return rows
