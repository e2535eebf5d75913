"""Dense baseline recipes for `planner compare`: each a generator returning a Strategy (or None), scored by `evaluate`.

* megatron_recipe: Megatron-LM's recipe (Narayanan et al. 2021, arXiv
  2104.04473, Sec. 3.3: tensor parallelism within the node, only as wide as
  pays): for each tp (a power of two within a node) the smallest pp whose
  layer split fits, the fastest of these (ties: the narrower tp) (even, or
  Megatron's shorter first and last stages when pp does not divide the
  layers), dp for the rest, expert parallelism over the data-parallel ranks for
  mixture-of-experts models, micro-batch 1, the distributed optimizer
  (ZeRO-1), sequence parallelism with tp, selective then full recompute,
  interleaving (vpp) when it is faster; on a mixed cluster only the pool of
  the fastest GPUs (one stage shape for every rank).  "Fits" is as Megatron runs it: every candidate is costed under the
  megatron runtime profile (fp32 main gradients kept whole, 18 bytes per
  parameter without the distributed optimizer) and only candidates that
  profile can express are tried.
* uniform_pp: the best strategy whose pipeline stages hold equal numbers of
  blocks (the even split of Megatron-LM and DeepSpeed's PipelineModule
  `partition_method="uniform"`): the compiler itself on the space with
  `split_shape="even"` (pp divides the blocks, every stage blocks / pp of them), so
  the row is certified and deterministic like the planner's.  It names no
  framework, so it searches under the job's own runtime (the planner row's).
* metis_greedy (mixed clusters only): a greedy after Metis (Um et al., "Metis:
  Fast Automatic Distributed Training on Heterogeneous GPUs", USENIX ATC 2024),
  which assigns device groups to pipeline stages, balances the layer
  partition by each stage's compute speed and prunes by memory.  Here: for
  each global configuration of the compiler's space with pp > 1 (Megatron-style
  dp x tp x pp with the distributed optimizer, no cp or interleaving,
  micro-batches up to METIS_MAX_MBS), the stages go to the cluster's pools in
  pool order, as many per pool as its share of the GPUs (largest remainder,
  whole stages per pool); layouts on one pool are skipped (the point is to
  train on the different GPUs together).  Each stage's time per block and the
  time of its fixed layers (embedding, head) on its device are probed with the
  cost model (`stage_cost`), and blocks go one by one to the stage that is
  then least loaded: Metis's speed-proportional partition, embedding and head
  included.  Stages that do not fit their HBM hand blocks to the stage with
  the most headroom (Metis's memory pruning); no, selective (without flash
  attention) and full recompute are tried; the fastest fitting candidate is
  kept.  Metis also searches per-stage tp/dp and pool orders; this greedy
  keeps one strategy for every stage and the cluster's pool order, so it is a
  subset of the compiler's space.  Metis is a search, not a framework: it
  runs under the job's own runtime, on the part of its space that runtime
  expresses.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from hardware import Catalog, load_catalog
from hardware.topology import Pool
from models.graph import Layer, ModelGraph
from planner.cost import evaluate
from planner.cost.estimate import Estimate
from planner.cost.evaluate import has_shared_experts, micro_batches
from planner.cost.layout import place_stages, stage_comms
from planner.cost.stage import compose_stage, sum_layers
from planner.cost.sums import StageSums
from planner.errors import InfeasibleError, PlannerInputError
from planner.job import Job
from planner.profile import RuntimeProfile, load_runtime
from planner.search.compile import compile_job
from planner.search.result import CompileOptions
from planner.search.space import SpaceOptions, global_configs, narrow_to_runtime
from planner.strategy import Recompute, Strategy

METIS_MAX_MBS = 8  # micro-batch sizes the Metis greedy tries (search breadth, not a hardware constant)


def megatron_split(blocks: int, pp: int) -> tuple[int, ...] | None:
    """Blocks per stage as Megatron-LM splits them: even, or when pp does not divide the blocks, every
    middle stage ceil(blocks / pp) and the first and last stages the rest
    (--decoder-first/last-pipeline-num-layers; Llama 3 405B: 126 layers on 16 stages, 7 + 14 x 8 + 7)."""
    per = -(-blocks // pp)
    short = per * pp - blocks
    first, last = per - (short + 1) // 2, per - short // 2
    if pp == 1 or short == 0:
        return (blocks // pp,) * pp
    if pp < 3 or first < 1:
        return None
    return (first,) + (per,) * (pp - 2) + (last,)


class RecipeResult(BaseModel):
    """What Megatron's recipe chose under a runtime profile, or why nothing it tried fits."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    runtime: str = Field(description="The runtime profile every candidate was costed under.")
    strategy: Strategy | None = Field(description="The chosen strategy; None when no candidate fits.")
    estimate: Estimate | None = Field(description="The chosen strategy's estimate under `runtime`.")
    why: str = Field("", description="Why nothing fits (empty when a strategy was chosen).")


def _tensor_parallels(job: Job, node_gpus: int) -> list[int]:
    """Tensor-parallel sizes Megatron's rule tries, smallest first: powers of two within a node that divide the
    heads (and the KV heads, or they it)."""
    model, out, tp = job.model, [], 1
    while tp <= node_gpus:
        if not (model.heads % tp or (model.kv_heads % tp and tp % model.kv_heads)):
            out.append(tp)
        tp *= 2
    return out


def megatron_pool(job: Job) -> Pool | None:
    """On a mixed cluster, the one pool Megatron runs on: the fastest GPUs (bf16 peak), then the most of them.
    Megatron has one stage shape for every rank, so it does not put an L4 stage in a pipeline of H100s.
    None on a one-pool cluster."""
    if len(job.cluster.pools) < 2:
        return None
    def peak(pool: Pool) -> float:  # as the pool's power or clock limit lets its GPUs run
        device = pool.device_spec()
        return device.peak_flops.get("bf16", 0.0) * device.throughput_scale

    return max(job.cluster.pools, key=lambda p: (peak(p), p.gpus))


def _expert_parallel(job: Job, dp: int) -> int:
    """Megatron's expert parallelism for a mixture-of-experts model: the largest power of two dividing both the
    experts and the data-parallel ranks (NeMo's Mixtral 8x7B and DeepSeek recipes spread the experts over the
    data-parallel group); 1 for dense models."""
    ep = 1
    while job.model.num_experts and job.model.num_experts % (2 * ep) == 0 and dp % (2 * ep) == 0:
        ep *= 2
    return ep


def _depths(job: Job, runtime: RuntimeProfile, tp: int, gpus: int,
            pool: Pool | None) -> tuple[tuple[float, Strategy, Estimate] | None, Estimate | None]:
    """(the fastest fitting candidate of the smallest fitting pipeline depth, the least-over candidate) at
    tensor-parallel size `tp` on `gpus` GPUs (of `pool` when Megatron runs on one pool of a mixed cluster)."""
    blocks = max(1, job.model.num_blocks)
    closest: Estimate | None = None  # the candidate over its HBM by the least share: why nothing fits
    for pp in range(1, blocks + 1):
        split = megatron_split(blocks, pp)
        if split is None or gpus % (tp * pp):
            continue
        dp = gpus // (tp * pp)
        if job.global_batch % dp:
            continue
        micro = job.global_batch // dp
        best: tuple[float, Strategy, Estimate] | None = None
        even = blocks % pp == 0
        pools = (pool.name,) * pp if pool is not None else None
        for recompute in ("selective", "full"):
            vpps = [1] + [v for v in (2, 3, 4, 6, 8)
                          if even and pp > 1 and blocks % (pp * v) == 0 and micro % pp == 0]
            for vpp in vpps:
                strategy = Strategy(tp=tp, pp=pp, dp=dp, mbs=1, vpp=vpp, zero=1 if dp > 1 else 0,
                                    ep=_expert_parallel(job, dp), recompute=recompute, sp=tp > 1,
                                    split=None if even else split, stage_pools=pools)
                # only what the runtime can launch (e.g. no selective recompute where it has none)
                if runtime.cannot_express(strategy, bool(job.model.num_experts), job.flash, split,
                                          shared_experts=has_shared_experts(job)):
                    continue
                try:
                    estimate = evaluate(job, strategy)
                except PlannerInputError:  # e.g. an expert layout the job's shapes do not allow
                    continue
                if estimate.memory.fits:
                    if best is None or estimate.step_time_s < best[0]:
                        best = (estimate.step_time_s, strategy, estimate)
                elif closest is None or _over(estimate) < _over(closest):
                    closest = estimate
            if best is not None:  # selective first: full recompute only when selective does not fit
                return best, closest
    return None, closest


def megatron_plan(job: Job, runtime: RuntimeProfile | None = None) -> RecipeResult:
    """Megatron-LM's hand recipe (module docstring), each candidate costed under `runtime` (default: the megatron
    profile, so the row says what Megatron itself would hold and run; another profile gives what the recipe
    would pick under that cost model, e.g. the reference one it used to be costed under)."""
    runtime = runtime or load_runtime("megatron")
    job = job.on(runtime)
    pool = megatron_pool(job)
    gpus = pool.gpus if pool is not None else job.cluster.num_gpus
    node = pool.node.gpus_per_node if pool is not None else min(p.node.gpus_per_node for p in job.cluster.pools)
    closest: Estimate | None = None
    chosen: tuple[float, Strategy, Estimate] | None = None
    tps = _tensor_parallels(job, node)
    # tensor parallelism within a node, only as wide as pays: each width with its smallest fitting depth, the
    # fastest of them (ties: the narrower), not always a whole node (Narayanan et al. 2021, Sec. 3.3)
    for tp in tps:
        best, near = _depths(job, runtime, tp, gpus, pool)
        if best is not None and (chosen is None or best[0] < chosen[0]):
            chosen = best
        if near is not None and (closest is None or _over(near) < _over(closest)):
            closest = near
    if chosen is not None:
        return RecipeResult(runtime=runtime.name, strategy=chosen[1], estimate=chosen[2])
    if closest is None:
        why = (f"no pipeline depth divides {gpus} GPUs and batch {job.global_batch} with tp in "
               f"{'/'.join(map(str, tps))} and Megatron's split")
    else:
        s = closest.strategy
        reason = closest.memory.reasons[0] if closest.memory.reasons else "over capacity"
        why = f"no depth fits; least over: tp={s['tp']},pp={s['pp']},recompute={s['recompute']}: {reason}"
    return RecipeResult(runtime=runtime.name, strategy=None, estimate=None, why=why)


def _over(estimate: Estimate) -> float:
    return estimate.memory.peak_bytes / estimate.memory.capacity_bytes


def megatron_recipe(job: Job, runtime: RuntimeProfile | None = None) -> Strategy | None:
    """The strategy of `megatron_plan` (None when no pipeline depth fits)."""
    return megatron_plan(job, runtime).strategy


def uniform_pp(job: Job, time_limit: float) -> Strategy | None:
    """The fastest fitting strategy with an even layer split: the compiler on the even-split space."""
    options = CompileOptions(time_limit=time_limit, runners_up=0,
                             space=SpaceOptions(split_shape="even", replica_groups=False))
    try:
        return compile_job(job, options).strategy
    except InfeasibleError:
        return None


# ---------------------------------------------------------------- Metis-style greedy


def proportional_layout(job: Job, pp: int, ranks_per_stage: int) -> tuple[str, ...] | None:
    """The pool of each stage, in cluster pool order: stage counts proportional to the pools' GPUs
    (largest remainder, ties to the earlier pool), whole stages per pool; None when they do not fit."""
    pools = job.cluster.pools
    total = sum(p.gpus for p in pools)
    room = [p.gpus // ranks_per_stage for p in pools]
    share = [pp * p.gpus / total for p in pools]
    counts = [min(r, int(s)) for r, s in zip(room, share)]
    order = sorted(range(len(pools)), key=lambda k: (-(share[k] - int(share[k])), k))
    while sum(counts) < pp:
        open_pools = [k for k in order if counts[k] < room[k]]
        if not open_pools:
            return None
        for k in open_pools[:pp - sum(counts)]:
            counts[k] += 1
    return tuple(p.name for p, n in zip(pools, counts) for _ in range(n))


def _fixed_layers(model: ModelGraph) -> tuple[tuple[Layer, ...], tuple[Layer, ...]]:
    """(layers before the first block, layers after the last block): embedding on the first stage, head on
    the last (as `planner.cost.layout.stage_layers` places them)."""
    blocks = [i for i, layer in enumerate(model.layers) if layer.block is not None]
    return tuple(model.layers[:blocks[0]]), tuple(model.layers[blocks[-1] + 1:])


def _typical_block(model: ModelGraph) -> tuple[Layer, ...]:
    """The layers of the model's most common kind of block (ties: the first)."""
    kinds: dict[tuple, list] = {}
    for _, layers in sorted(model.blocks().items()):
        key = tuple(layer.model_dump_json(exclude={"name", "block"}) for layer in layers)
        kinds.setdefault(key, []).append(layers)
    return tuple(max(kinds.values(), key=len)[0])


@dataclass(frozen=True)
class StageLine:
    """A stage's micro-batch seconds and HBM as lines in its block count n (`compose_stage` at n = 1 and 2)."""

    seconds_at_one: float
    seconds_per_block: float
    max_blocks: int  # the most blocks that fit the stage's HBM (0: not even one)

    def seconds(self, n: int) -> float:
        return self.seconds_at_one + (n - 1) * self.seconds_per_block


class _Probe:
    """One candidate's per-pool block sums (layer sums on the pool's device and groups), computed once."""

    def __init__(self, job: Job, strategy: Strategy, catalog: Catalog, block: tuple[Layer, ...]):
        self.job, self.strategy, self.catalog = job, strategy, catalog
        self.stages = place_stages(job, strategy, catalog)
        self.per_pool: dict[str, tuple] = {}
        for stage in self.stages:
            pool = stage.site.pools[0].name
            if pool not in self.per_pool:
                groups = stage_comms(job, strategy, stage.site)
                self.per_pool[pool] = (groups, sum_layers([(layer, strategy.recompute) for layer in block], job,
                                                          strategy, stage.site, groups, catalog))

    def pipeline_floor(self) -> float:
        """m micro-batches of the blocks spread ideally over the stages' speeds: seconds no split beats
        (for a model of identical blocks; an estimate otherwise)."""
        speed = sum(1.0 / _busy(self.per_pool[s.site.pools[0].name][1]) for s in self.stages)
        return micro_batches(self.job, self.strategy) * self.job.model.num_blocks / speed

    def lines(self, fixed: tuple[tuple[Layer, ...], tuple[Layer, ...]]) -> list[StageLine]:
        """Per stage: its fixed layers plus n typical blocks on its pool's device, costed by `compose_stage`
        as `evaluate` composes a stage.  Time and memory are affine in n under ZeRO 0/1 (sums scale, the
        rest is per stage), so two points give the line; `evaluate` scores the split exactly afterwards."""
        job, strategy, catalog = self.job, self.strategy, self.catalog
        m = micro_batches(job, strategy)
        head, tail = fixed
        out = []
        for stage in self.stages:
            site = stage.site
            groups, per_block = self.per_pool[site.pools[0].name]
            base = StageSums()
            for layers, holds in ((head, stage.index == 0), (tail, stage.index == strategy.pp - 1)):
                if holds and layers:
                    base = base + sum_layers([(layer, "none") for layer in layers], job, strategy, site, groups,
                                             catalog)
            one, two = (compose_stage(job, strategy, site, groups, base + per_block.times(n), m, catalog)
                        for n in (1, 2))
            grow = two.memory.total - one.memory.total
            room = one.memory.capacity - one.memory.total
            fit = 0 if room < 0 else 1 + (int(room // grow) if grow > 0 else job.model.num_blocks)
            out.append(StageLine(one.microbatch, two.microbatch - one.microbatch, fit))
        return out


def _busy(sums: StageSums) -> float:
    """Seconds a set of layers computes and communicates per micro-batch (a stage's time without p2p)."""
    return sums.compute + sums.recompute + sums.tp + sums.cp + sums.ep


def balanced_split(lines: list[StageLine], blocks: int) -> tuple[int, ...] | None:
    """Blocks per stage, each next block to the stage that is then fastest among those it still fits
    (Metis's speed-proportional partition with memory pruning); None when the blocks do not fit."""
    if any(line.max_blocks < 1 for line in lines) or sum(min(blocks, line.max_blocks) for line in lines) < blocks:
        return None
    counts = [1] * len(lines)
    for _ in range(blocks - len(lines)):
        room = [i for i, line in enumerate(lines) if counts[i] < line.max_blocks]
        k = min(room, key=lambda i: (lines[i].seconds(counts[i] + 1), i))
        counts[k] += 1
    return tuple(counts)


def _fit_memory(job: Job, strategy: Strategy, catalog: Catalog) -> tuple[Strategy, Estimate] | None:
    """Move blocks off stages over their HBM onto the stage with the most headroom until all fit:
    (strategy, estimate), or None when a stage cannot give up more."""
    if strategy.split is None:
        raise ValueError("_fit_memory moves blocks of a strategy with a split")
    split = list(strategy.split)
    for _ in range(sum(split)):
        estimate = evaluate(job, strategy, catalog=catalog)
        if estimate.memory.fits:
            return strategy, estimate
        reports = estimate.memory.per_stage
        over = [r.stage for r in reports if not r.fits]
        if not over or not estimate.memory.host.fits:
            return None
        worst = max(over, key=lambda i: reports[i].peak_bytes / reports[i].capacity_bytes)
        spare = [r.stage for r in reports if r.fits]
        if split[worst] <= 1 or not spare:
            return None
        roomiest = min(spare, key=lambda i: reports[i].peak_bytes / reports[i].capacity_bytes)
        split[worst] -= 1
        split[roomiest] += 1
        strategy = strategy.model_copy(update={"split": tuple(split)})
    return None


def metis_greedy(job: Job, time_limit: float) -> Strategy | None:
    """The Metis-style greedy of the module docstring; None on a one-pool cluster or when nothing fits."""
    if len(job.cluster.pools) < 2 or job.model.num_blocks < 2:
        return None
    start = time.perf_counter()
    catalog = load_catalog()
    blocks = job.model.num_blocks
    fixed, block = _fixed_layers(job.model), _typical_block(job.model)
    runtime = job.runtime
    space = narrow_to_runtime(SpaceOptions(max_cp=1, max_vpp=1, max_mbs=METIS_MAX_MBS, zero_stages=(0, 1),
                                           shard_scopes=("full",), regathers=("network",), replica_groups=False),
                              runtime, job)
    selective = not job.flash and runtime.space.selective_recompute
    modes: tuple[Recompute, ...] = ("none", "selective", "full") if selective else ("none", "full")
    best: tuple[float, str, Strategy] | None = None
    for config in global_configs(job, space):
        if config.pp < 2 or config.zero != (1 if config.data_parallel > 1 else 0) or config.recompute != "none":
            continue  # Megatron's distributed optimizer over dp; recompute modes are tried below
        layout = proportional_layout(job, config.pp, config.tp * config.data_parallel)
        if layout is None or len(set(layout)) < 2:
            continue
        for mode in modes:
            strategy = config.model_copy(update={"stage_pools": layout, "recompute": mode})
            probe = _Probe(job, strategy, catalog, block)
            if best is not None and probe.pipeline_floor() >= best[0]:
                continue  # no split of this candidate beats the best one
            lines = probe.lines(fixed)
            split = balanced_split(lines, blocks)
            if split is None:
                continue
            slowest = max(line.seconds(n) for line, n in zip(lines, split))
            if best is not None and micro_batches(job, strategy) * slowest >= best[0]:
                continue  # the pipeline alone is slower than the best candidate's step
            fitted = _fit_memory(job, strategy.model_copy(update={"split": split}), catalog)
            if fitted is None:
                continue
            strategy, estimate = fitted
            if runtime.cannot_express(strategy, bool(job.model.num_experts), job.flash, strategy.split,
                                      shared_experts=has_shared_experts(job)):
                continue  # e.g. an uneven split where the runtime takes only even ones
            if best is None or (estimate.step_time_s, strategy.spec()) < best[:2]:
                best = (estimate.step_time_s, strategy.spec(), strategy)
        if time.perf_counter() - start > time_limit:
            break
    return best[2] if best else None
