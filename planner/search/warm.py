"""A first incumbent before branch and bound: a few memory-friendly strategies, each scored by `evaluate`.

Branch and bound prunes against its incumbent; before it has one it builds the tables of every
configuration it visits, which on a large model costs seconds each.  A handful of strategies of the
search's own space, chosen to fit (the least training state per GPU, one sequence per micro-batch,
with and without full recomputation, without and with the offload that frees the most HBM), is
scored directly: the best that fits becomes the first incumbent, so the refined bounds prune from the
first configuration on and a search stopped by its time limit has a plan at once.  It only ever
starts the search from a real plan of the space (the certificate's bound is unchanged).
"""

from __future__ import annotations

from hardware import Catalog
from planner.cost import evaluate
from planner.cost.layout import split_blocks
from planner.job import Job
from planner.search.space import SpaceOptions, placement_variants, shape_allowed
from planner.strategy import Strategy

CONFIGS = 12  # configurations tried, the least state per GPU first


def routed_share(job: Job) -> float:
    """The share of the model's parameters a token does not touch (the routed experts')."""
    params = job.model.params
    return 1 - job.model.active_params / params if params else 0.0


def state_share(config: Strategy, routed: float) -> float:
    """Bytes of training state one GPU of `config` holds per model parameter, roughly: 2 of weights, 2 of
    gradients and 12 of optimizer state, ZeRO sharding them over dp x cp by stage, tp x pp splitting all and
    ep the routed experts (`routed`: their share of the parameters, routed_share)."""
    shard = config.data_parallel * config.cp
    per_param = (2 / (shard if config.zero >= 3 else 1) + 2 / (shard if config.zero >= 2 else 1)
                 + 12 / (shard if config.zero >= 1 else 1))
    return per_param / (config.tp * config.pp) * ((1 - routed) + routed / config.ep)


def _candidates(job: Job, config: Strategy, space: SpaceOptions):
    """The configuration with nothing and with every block recomputed, under its own placement and under the
    offload variant that frees the most HBM, each as an even split the space allows."""
    variants = placement_variants(job, config, space, offload=space.offload_search == "always")
    lightest = max(variants,
                   key=lambda v: ({"none": 0, "optimizer": 1, "params": 1, "all": 2}[v.get("offload", "none")],
                                  -v.get("offload_ratio", 1.0)))
    # as the programs write a plan: the split, and each stage's recomputed blocks per chunk
    blocks = job.model.num_blocks
    split = (job.runtime.space.default_split(blocks, config.pp, config.vpp)  # the runtime's own layout (Megatron)
             or tuple(len(b) for b in split_blocks(blocks, config.pp, None))) if config.pp > 1 else None
    every = {"recompute": "full", "recompute_layers": tuple(n // config.vpp for n in split or (blocks,))}
    recomputes = [{}, every] if config.blocks_recomputable and blocks else [{}]
    for placement in dict.fromkeys(tuple(sorted(v.items())) for v in ({}, lightest)):
        for recompute in recomputes:
            strategy = config.model_copy(update={**dict(placement), **recompute, "split": split})
            if shape_allowed(job, strategy, space):
                yield strategy


def warm_start(job: Job, configs: list[Strategy], space: SpaceOptions, catalog: Catalog
               ) -> tuple[Strategy, float, float] | None:
    """(strategy, step seconds, peak HBM bytes) of the fastest fitting candidate, or None."""
    single = [c for c in configs if c.mbs == 1]
    routed = routed_share(job)
    chosen = sorted(single, key=lambda c: (state_share(c, routed), c.tp, c.pp))[:CONFIGS]
    best: tuple[float, float, Strategy] | None = None
    for config in chosen:
        for strategy in _candidates(job, config, space):
            estimate = evaluate(job, strategy, catalog=catalog)
            if not estimate.memory.fits:
                continue
            key = (estimate.step_time_s, max(r.peak_bytes for r in estimate.memory.per_stage))
            if best is None or key < best[:2]:
                best = (*key, strategy)
    return None if best is None else (best[2], best[0], best[1])
