"""Every strategy a runtime can run on a small job, each scored by `evaluate`: the certificate's oracle.

docs/design.md principle 10.  `planner.search.exhaustive` enumerates the compiler's own space (its
configurations, its dominance rules, its narrowing to the runtime), so it can only confirm that the
search solves that space.  This enumerator shares none of it: it spells out every value of every
Strategy field over the job's GPUs, keeps what `check_strategy` accepts and the runtime can run
(`planner.cost.refusals`: its profile's space), and scores each with `evaluate`.  A certificate is true
when nothing it finds fits and is faster.  One shortcut, itself tested against the candidates tried one by one
(tests/test_oracle.py): a candidate whose "no recompute" is rejected has its other recompute settings skipped.

What it leaves out, each an input rather than a choice: `tp_overlap` (the assumption that the build
overlaps TP collectives with GEMMs, SpaceOptions.tp_overlap; off unless asked for), the MoE token
dispatchers other than those given (`dispatchers`, SpaceOptions.dispatchers: the build's), `stage_pools`
(single-pool clusters only) and per-stage placements (one offload setting and one re-gather source for
every stage).  The work is exponential in pp: `limit` guards against a job it cannot finish.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterator

from hardware import Catalog, load_catalog
from planner.cost import evaluate, refusals
from planner.errors import PlannerInputError
from planner.job import Job
from planner.strategy import Dispatcher, Strategy
from planner.validation import check_strategy

OFFLOAD_RATIOS = (0.25, 0.5, 0.75)  # partial optimizer offload shares tried (SpaceOptions.offload_ratios)


@dataclass(frozen=True)
class OracleResult:
    """The best fitting strategy of the runtime's space, and how much was enumerated."""

    best: Strategy | None
    step_time_s: float  # inf when nothing fits
    runnable: int  # strategies the runtime can run (scored)
    fitting: int  # of those, the ones that fit


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _degrees(job: Job) -> Iterator[dict]:
    """tp, cp, pp, dp over the job's GPUs (every divisor; dp takes the rest)."""
    gpus, blocks = job.cluster.num_gpus, max(1, job.model.num_blocks)
    for tp in divisors(gpus):
        for cp in divisors(gpus // tp):
            for pp in (p for p in divisors(gpus // (tp * cp)) if p <= blocks):
                yield {"tp": tp, "cp": cp, "pp": pp, "dp": gpus // (tp * cp * pp)}


def _experts(job: Job, tp: int, dispatchers: tuple[Dispatcher, ...] = ("alltoall",)) -> Iterator[dict]:
    """ep, etp, ep_overlap and the dispatcher (MoE models only)."""
    experts = job.model.num_experts
    if not experts:
        yield {}
        return
    for ep in divisors(experts):
        for etp in [None] + [d for d in divisors(tp) if d != tp]:
            for overlap in (False, True) if ep > 1 else (False,):
                for dispatcher in dispatchers if ep > 1 else ("alltoall",):
                    yield {"ep": ep, "etp": etp, "ep_overlap": overlap, "dispatcher": dispatcher}


def _pipeline(job: Job, pp: int, dp: int) -> Iterator[dict]:
    """mbs, vpp, schedule and split."""
    blocks = max(1, job.model.num_blocks)
    for mbs in divisors(job.global_batch // dp):
        if pp == 1:
            yield {"mbs": mbs}
            continue
        # interleaved chunks need blocks that fill pp x vpp evenly; one chunk per stage takes any split
        for vpp in (v for v in divisors(blocks // pp) if v == 1 or blocks % (pp * v) == 0):
            if vpp > 1:
                yield {"mbs": mbs, "vpp": vpp, "schedule": "interleaved"}
                if vpp == 2:  # the zero-bubble V schedules: two chunks per stage
                    yield from ({"mbs": mbs, "vpp": 2, "schedule": kind} for kind in ("zbv", "dualpipev"))
                continue
            for schedule in ("1f1b", "gpipe"):
                for cuts in itertools.combinations(range(1, blocks), pp - 1):
                    bounds = (0, *cuts, blocks)
                    yield {"mbs": mbs, "schedule": schedule, "split": tuple(b - a for a, b in zip(bounds, bounds[1:]))}


def _states(tp: int) -> Iterator[dict]:
    """sp, zero, shard, regather and one offload setting for every stage."""
    for sp in (True, False) if tp > 1 else (None,):
        for zero in range(4):
            for shard in ("full", "node") if zero else ("full",):
                for regather in ("network", "host") if zero == 3 and shard == "full" else ("network",):
                    for offload in _offloads(zero):
                        yield {"sp": sp, "zero": zero, "shard": shard, "regather": regather, **offload}


def _offloads(zero: int) -> Iterator[dict]:
    yield {}
    for device in ("cpu", "nvme"):
        for offload in ("optimizer", "params", "all") if zero == 3 else ("optimizer",):
            yield {"offload": offload, "offload_device": device}
            if zero == 3 and device == "cpu" and offload in ("optimizer", "all"):
                for ratio in OFFLOAD_RATIOS:
                    yield {"offload": offload, "offload_device": device, "offload_ratio": ratio}


def _recomputes(job: Job, pp: int, vpp: int, split: tuple[int, ...] | None) -> Iterator[dict]:
    """none, selective, full recompute of the first k blocks of each stage's chunks (per stage), or of every k-th
    block of each stage (k from 2 to the most blocks a stage holds: k = 1 is every block, a larger k none)."""
    yield {"recompute": "none"}
    yield {"recompute": "selective"}
    blocks = max(1, job.model.num_blocks)
    per_stage = split or ((blocks // pp,) * pp if pp > 1 else (blocks,))
    for counts in itertools.product(*(range(n // vpp + 1) for n in per_stage)):
        if any(counts):
            yield {"recompute": "full", "recompute_layers": counts}
    if job.model.num_blocks:
        for every in range(2, max(per_stage) + 1):
            yield {"recompute": "full", "recompute_every": every}


def runtime_strategies(job: Job, dispatchers: tuple[Dispatcher, ...] = ("alltoall",)) -> Iterator[Strategy]:
    """Every resolved strategy the job's runtime can run (planner.cost.refusals), once each; MoE token
    dispatchers among `dispatchers`."""
    seen: set[str] = set()
    for degrees in _degrees(job):
        for experts in _experts(job, degrees["tp"], dispatchers):
            for pipeline in _pipeline(job, degrees["pp"], degrees["dp"]):
                for states in _states(degrees["tp"]):
                    fields = {**degrees, **experts, **pipeline, **states}
                    for recompute in _recomputes(job, degrees["pp"], pipeline.get("vpp", 1), pipeline.get("split")):
                        strategy = _runnable(job, {**fields, **recompute})
                        if strategy is None and recompute["recompute"] == "none":
                            # no recompute (`_recomputes` yields it first) is the setting every rule allows most
                            # (the field rules, check_strategy and the refusals only forbid recomputing:
                            # tests/test_oracle.py), so what rejects it rejects every other: about nine in ten
                            # of the candidates skipped unbuilt
                            break
                        if strategy is None:
                            continue
                        spec = strategy.spec()
                        if spec not in seen:
                            seen.add(spec)
                            yield strategy


def _runnable(job: Job, fields: dict) -> Strategy | None:
    """The resolved strategy of `fields` if it is one (the field rules, the job's divisibility) that the job's
    runtime can run; None otherwise."""
    try:
        strategy = check_strategy(job, Strategy(**fields))
    except (PlannerInputError, ValueError):
        return None  # not a strategy
    return None if refusals(job, strategy) else strategy


def oracle_optimum(job: Job, limit: int = 100_000, catalog: Catalog | None = None,
                   dispatchers: tuple[Dispatcher, ...] = ("alltoall",)) -> OracleResult:
    """The fastest fitting strategy the job's runtime can run (MoE token dispatchers among `dispatchers`), by
    scoring every one with `evaluate` (ties: the smaller spec).  Raises ValueError past `limit` runnable
    strategies."""
    catalog = catalog or load_catalog()
    best: tuple[float, str, Strategy] | None = None
    runnable = fitting = 0
    for strategy in runtime_strategies(job, dispatchers):
        runnable += 1
        if runnable > limit:
            raise ValueError(f"the oracle would score more than limit={limit} strategies")
        estimate = evaluate(job, strategy, catalog=catalog)
        if not estimate.memory.fits:
            continue
        fitting += 1
        key = (estimate.step_time_s, strategy.spec())
        if best is None or key < best[:2]:
            best = (*key, strategy)
    if best is None:
        return OracleResult(best=None, step_time_s=float("inf"), runnable=runnable, fitting=fitting)
    return OracleResult(best=best[2], step_time_s=best[0], runnable=runnable, fitting=fitting)
