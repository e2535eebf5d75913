"""Brute-force optimum over the compiler's strategy space: a test oracle for small instances.

docs/design.md principle 2 ("Exact, with a certificate"): on small spaces an exhaustive enumerator over
the same `evaluate` must find the optimum the CP-SAT compiler certifies.  This is that enumerator.
It shares only the space with the compiler (`global_configs` and planner/search/branch.py's offload fallback),
builds no tables and no program, and scores every complete strategy with `evaluate`:

* every global configuration of `global_configs(job, space)`;
* every split: each composition of the blocks into pp positive parts (only the even split with
  vpp > 1; none with pp = 1);
* with base recompute "none", every per-stage count of fully recomputed blocks (0..blocks per
  chunk of that stage; all zeros is recompute=none);
* on clusters of several pools, every capacity-respecting pool per stage;
* every per-stage placement (`placement_variants`: FCDP host cache, offload), or one for all stages
  when the space asks for a uniform placement.

Offload is tried as in `compile_job`: in every configuration (SpaceOptions.offload_search "always"), or
only when nothing fits without it ("fallback").  The work is exponential
in pp: `limit` guards against calling it on a job it cannot finish.
"""

from __future__ import annotations

import itertools
from functools import lru_cache
from math import comb
from typing import Iterator, Literal

from hardware import Catalog, load_catalog
from planner.cost import evaluate
from planner.cost.replica_groups import ReplicaGroup, group_job, sync_seconds
from planner.job import Job
from planner.search.replica_groups import share_grid
from planner.search.space import SpaceOptions, global_configs, narrow_to_runtime, placement_variants, shape_allowed
from planner.strategy import Strategy


def _splits(blocks: int, pp: int, vpp: int, even: bool = False) -> Iterator[tuple[int, ...] | None]:
    if pp == 1:
        yield None
    elif vpp > 1 or even:
        yield (blocks // pp,) * pp
    else:  # compositions of `blocks` into pp positive parts: choose pp - 1 cut points
        for cuts in itertools.combinations(range(1, blocks), pp - 1):
            bounds = (0, *cuts, blocks)
            yield tuple(bounds[i + 1] - bounds[i] for i in range(pp))


def _recomputes(config: Strategy, per_stage: tuple[int, ...]) -> Iterator[tuple[int, ...] | None]:
    counts = [range(n // config.vpp + 1) if config.blocks_recomputable else [0] for n in per_stage]
    for vector in itertools.product(*counts):  # base selective: nothing per stage to choose
        yield vector if any(vector) else None


def _pool_assignments(job: Job, config: Strategy) -> list[tuple[str, ...] | None]:
    if len(job.cluster.pools) == 1:
        return [None]
    ranks = config.tp * config.cp * config.data_parallel
    names = [pool.name for pool in job.cluster.pools]
    cap = {pool.name: pool.gpus // ranks for pool in job.cluster.pools}
    return [a for a in itertools.product(names, repeat=config.pp) if all(a.count(n) <= cap[n] for n in names)]


@lru_cache(maxsize=None)
def _split_count(blocks: int, pp: int, vpp: int, per_stage_recompute: bool, even: bool = False) -> int:
    """(split, recompute vector) pairs: compositions weighted by each part's recompute choices."""
    weight = (lambda n: n // vpp + 1) if per_stage_recompute else (lambda n: 1)
    if pp == 1 or vpp > 1 or even:
        return weight(blocks // pp) ** pp
    ways = [1] + [0] * blocks  # ways[n]: weighted compositions of n blocks into the stages so far
    for _ in range(pp):
        ways = [sum(ways[n - k] * weight(k) for k in range(1, n + 1)) for n in range(blocks + 1)]
    return ways[blocks]


def _placements(config: Strategy, variants: tuple[dict, ...], uniform: bool) -> list[tuple[dict, ...]]:
    if uniform:
        return [(v,) * config.pp for v in variants]
    return list(itertools.product(variants, repeat=config.pp))


def _count(job: Job, config: Strategy, placements: int, even: bool = False) -> int:
    """Candidates of one configuration, without listing them."""
    pp, pools = config.pp, job.cluster.pools
    splits = _split_count(max(1, job.model.num_blocks), pp, config.vpp, config.blocks_recomputable, even) * placements
    if len(pools) == 1:
        return splits
    ranks = config.tp * config.cp * config.data_parallel
    ways = [1] + [0] * pp  # ways[n]: pool sequences of n stages over the pools so far
    for pool in pools:
        cap = pool.gpus // ranks
        ways = [sum(ways[n - c] * comb(n, c) for c in range(min(cap, n) + 1)) for n in range(pp + 1)]
    return splits * ways[pp]


def _candidates(job: Job, config: Strategy, placements: list[tuple[dict, ...]], even: bool = False
                ) -> Iterator[Strategy]:
    blocks = max(1, job.model.num_blocks)
    pools = _pool_assignments(job, config)
    for split in _splits(blocks, config.pp, config.vpp, even):
        for layers in _recomputes(config, split or (blocks,)):
            update: dict = {"split": split}
            if layers is not None:
                update.update(recompute="full", recompute_layers=layers)
            for stage_pools in pools:
                for placement in placements:
                    yield config.with_stage_placements(placement, **update, stage_pools=stage_pools)


def configuration_strategies(job: Job, config: Strategy, space: SpaceOptions, offload: bool) -> Iterator[Strategy]:
    """Every complete strategy of one configuration that the space allows (split, recomputed blocks, pool per
    stage, placement per stage), as the brute force scores them: the set a configuration's bounds must hold for."""
    placements = _placements(config, placement_variants(job, config, space, offload), not space.stage_placement)
    for strategy in _candidates(job, config, placements, space.split_shape == "even"):
        if shape_allowed(job, strategy, space):
            yield strategy


def _price_per_second(job: Job, strategy: Strategy, catalog: Catalog) -> float:
    ranks = strategy.tp * strategy.cp * strategy.data_parallel
    names = strategy.stage_pools or (job.cluster.pools[0].name,) * strategy.pp
    return sum(ranks * catalog.device(job.cluster.pool(n).node.device).price_per_hour for n in names) / 3600.0


def _best(job: Job, configs: list[Strategy], objective: str, catalog: Catalog, limit: int, space: SpaceOptions,
          offload: bool) -> tuple[Strategy, float] | None:
    uniform = not space.stage_placement
    variants = {id(c): placement_variants(job, c, space, offload) for c in configs}
    total = 0
    for config in configs:  # the guard first (placements counted, not listed): nothing is scored over the limit
        count = len(variants[id(config)]) ** (1 if uniform else config.pp)
        total += _count(job, config, count, space.split_shape == "even")
        if total > limit:
            raise ValueError(f"exhaustive search would score more than limit={limit} candidates")
    best: tuple[float, str, Strategy] | None = None
    for config in configs:
        placements = _placements(config, variants[id(config)], uniform)
        for strategy in _candidates(job, config, placements, space.split_shape == "even"):
            if not shape_allowed(job, strategy, space):
                continue
            estimate = evaluate(job, strategy, catalog=catalog)
            if not estimate.memory.fits:
                continue
            value = estimate.step_time_s
            if objective == "cost":
                value *= _price_per_second(job, strategy, catalog)
            if best is None or (value, strategy.spec()) < best[:2]:
                best = (value, strategy.spec(), strategy)
    return None if best is None else (best[2], best[0])


def exhaustive_optimum(job: Job, space: SpaceOptions | None = None, objective: Literal["time", "cost"] = "time",
                       limit: int = 200_000, catalog: Catalog | None = None,
                       offload_fallback: bool = True) -> tuple[Strategy, float] | None:
    """The best fitting strategy of the compiler's space and its objective (seconds per step, or USD per
    step with objective="cost"), by scoring every candidate with `evaluate`; None if nothing fits.

    Ties go to the smaller `Strategy.spec()`.  Raises ValueError when more than `limit` candidates
    would be scored.
    """
    if objective not in ("time", "cost"):
        raise ValueError(f"objective must be 'time' or 'cost', not {objective!r}")
    catalog = catalog or load_catalog()
    space = narrow_to_runtime(space or SpaceOptions(), job.runtime, job)
    configs = list(global_configs(job, space))
    always = space.offload_search == "always"
    found = _best(job, configs, objective, catalog, limit, space, offload=always)
    if found is None and offload_fallback and not always:  # nothing fits: offload trades time for memory
        found = _best(job, configs, objective, catalog, limit, space, offload=True)
    return found


def batch_splits(pools: int, shares: int) -> Iterator[tuple[int, ...]]:
    """Every way to give `shares` batch shares to `pools` pools (n_p >= 0, sum = shares)."""
    for cuts in itertools.combinations(range(shares + pools - 1), pools - 1):
        edges = (-1,) + cuts + (shares + pools - 1,)
        yield tuple(edges[i + 1] - edges[i] - 1 for i in range(pools))


def exhaustive_groups(job: Job, space: SpaceOptions | None = None, limit: int = 200_000,
                      catalog: Catalog | None = None) -> tuple[list[ReplicaGroup], float] | None:
    """The best replica-group plan (planner.search.replica_groups' space) by brute force: every split of the batch
    into shares over the pools, each active pool scored by `exhaustive_optimum` of its sub-job under
    the grain rule, step = slowest group + sync.  None if no split fits."""
    catalog = catalog or load_catalog()
    space = space or SpaceOptions()
    shares = share_grid(job.global_batch)
    grain = job.global_batch // shares
    sub_space = space.model_copy(update={"batch_grain": grain})
    pools = [p.name for p in job.cluster.pools]
    per_share: dict[tuple[str, int], tuple[Strategy, float] | None] = {}
    best: tuple[float, list[ReplicaGroup]] | None = None
    for split in batch_splits(len(pools), shares):
        groups, worst = [], 0.0
        for pool, n in zip(pools, split):
            if n == 0:
                continue
            if (pool, n) not in per_share:
                per_share[pool, n] = exhaustive_optimum(group_job(job, pool, n * grain), sub_space, limit=limit,
                                                        catalog=catalog)
            found = per_share[pool, n]
            if found is None:
                break
            groups.append(ReplicaGroup(pool=pool, batch=n * grain, strategy=found[0]))
            worst = max(worst, found[1])
        else:
            step = worst + sync_seconds(job, [g.pool for g in groups], catalog)
            if best is None or step < best[0]:
                best = (step, groups)
    return None if best is None else (best[1], best[0])
