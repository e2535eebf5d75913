"""The strategy space: every legal assignment of the global integers.

A *global configuration* fixes everything but the per-stage decisions (the
layer split, the blocks each stage recomputes, the pool each stage runs on):
tp, pp, cp, ep (and for MoE models with tp > 1 whole experts, etp=1, folded
over the stage's ranks beside experts split over tp), dp, micro-batch size,
schedule and virtual stages, ZeRO stage and scope, offload.  `global_configs` lists them, with the divisibility rules
of `planner.validation` applied up front.  Options dominated under the cost
model are left out and say so where they are skipped:

* GPipe has 1F1B's time and more memory in flight;
* Megatron-style selective recompute only pays when attention scores are
  materialised (no flash attention); otherwise it costs time and saves
  nothing (a runtime's own per-op policy, torchtitan's, is tried always);
* every k-th block recomputed (recompute_every=k, where the runtime runs it) is a configuration family of
  its own; where every stage holds the same count of identical blocks (one stage, interleaved chunks, an even
  split) only the smallest k of each recomputed count (the others cost the same seconds and hold more);
* offload only adds time, so it is tried only when the configuration does
  not fit without it (the solver asks for it then);
* where state lives (offload, its device and ratio, and the FCDP host cache)
  is a per-stage decision: `placement_variants` lists what one stage of a
  configuration may choose, and the program picks per stage;
* on mixed clusters a stage's GPUs fill whole nodes or divide one node, so
  no node is shared by two stages (the job may leave GPUs idle).
"""

from __future__ import annotations

import itertools
from typing import Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.job import Job
from planner.cost.layout import split_blocks
from planner.profile import RecomputeCounts, RuntimeProfile, Space, recompute_counts_allowed
from planner.search.ilp.segments import block_segments
from planner.strategy import V_SCHEDULES, Dispatcher, Recompute, Schedule, Strategy

OffloadSearch = Literal["fallback", "always"]


class SpaceOptions(BaseModel):
    """Limits and fixed choices of the search space."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_mbs: int | None = Field(None, gt=0, description="Largest micro-batch size tried (default: any).")
    micro_batches_cover_stages: bool = Field(
        False, description="With pp > 1, only micro-batch sizes that leave at least pp micro-batches per replica "
        "(the runtime's 1F1B needs them: RuntimeProfile.space.one_f_one_b_needs_stages).")
    max_vpp: int | None = Field(None, gt=0, description="Most virtual pipeline chunks per stage tried (default: any).")
    max_cp: int | None = Field(None, gt=0, description="Largest context-parallel degree tried (default: any).")
    max_tp: int | None = Field(None, gt=0, description="Largest tensor-parallel degree tried (default: any, across "
                               "nodes too).")
    max_ep: int | None = Field(None, gt=0, description="Largest expert-parallel degree tried (default: any).")
    zero_stages: tuple[int, ...] = Field((0, 1, 2, 3), description="ZeRO stages tried.")
    zero_stages_pipelined: tuple[int, ...] = Field(
        (0, 1, 2, 3), description="ZeRO stages tried with pipeline parallelism (DeepSpeed's PipelineEngine: 0, 1)."
    )
    shard_scopes: tuple[Literal["full", "node"], ...] = Field(("full", "node"), description="Sharding scopes tried.")
    offloads: tuple[Literal["optimizer", "all"], ...] = Field(
        ("optimizer", "all"), description="Offload settings a stage may take when it offloads."
    )
    selective_recompute: bool = Field(
        True, description="Try recompute=selective where it pays (attention scores materialised)."
    )
    offload_devices: tuple[Literal["cpu", "nvme"], ...] = Field(
        ("cpu", "nvme"), description="Where offloaded optimizer states and parameters may go."
    )
    offload_ratios: tuple[float, ...] = Field(
        (0.25, 0.5, 0.75), description="Partial optimizer offload shares tried with ZeRO-3 to CPU, besides "
        "offloading all of it (DeepSpeed ZeRO-Offload++ ratio); () for whole offload only."
    )
    regathers: tuple[Literal["network", "host"], ...] = Field(
        ("network", "host"), description="ZeRO-3 re-gather sources tried (host: FCDP host-memory cache)."
    )
    offload_search: OffloadSearch = Field(
        "always", description="When stages may offload: in every program, where offload can buy fewer "
        "recomputed blocks or a better split (always: the certificate covers every placement the runtime "
        "has), or only where nothing fits without offload (fallback: faster, and the certificate then holds "
        "over the strategies without offload)."
    )
    split_shape: Literal["any", "ends", "even"] = Field(
        "any", description="Pipeline splits tried: any; ends (the middle stages equal, the first and last free: "
        "Megatron's --decoder-first/last-pipeline-num-layers); even (pp divides the blocks, the uniform-pp "
        "baseline)."
    )
    recompute_counts: RecomputeCounts = Field(
        "per_stage", description="Fully recomputed blocks: a count per stage; uniform, one count k for every stage "
        "(each recomputes min(k, its blocks per chunk): Megatron's --recompute-num-layers); all, every block of "
        "every stage or none (torchtitan's activation_checkpoint.mode)."
    )
    stage_placement: bool = Field(
        True, description="Let each pipeline stage choose its own placement (offload, device, ratio, regather); "
        "False: one placement for every stage (frameworks that take one offload setting for all ranks)."
    )
    replica_groups: bool = Field(
        True, description="On a mixed cluster, also search replica groups (a strategy and batch share per pool)."
    )
    batch_grain: int | None = Field(
        None, gt=0, description="Replica groups: dp x mbs must divide this many sequences (and for vpp > 1, "
        "grain / (dp x mbs) be a multiple of pp), so a strategy stays legal on any multiple of the grain."
    )
    v_schedules: tuple[Schedule, ...] = Field(
        V_SCHEDULES, description="Zero-bubble V schedules tried beside 1F1B and interleaving (two chunks per stage: "
        "torch.distributed.pipelining ScheduleZBVZeroBubble, ScheduleDualPipeV), where the runtime runs them.")
    recompute_every: bool = Field(
        True, description="Also try every k-th block of each stage fully recomputed (recompute_every=k, k from 2 to "
        "the most blocks a stage holds: an FSDP check_fn, torchtitan's layer SAC), each k a configuration family "
        "of its own, where the runtime runs it.")
    tp_overlap: bool = Field(False, description="Assume TP communication overlap (Megatron --tp-comm-overlap).")
    dispatchers: tuple[Dispatcher, ...] = Field(
        ("alltoall",), description="MoE token dispatchers tried where ep > 1 (Strategy.dispatcher), where the "
        "runtime runs them: the all-to-all alone unless the build has DeepEP (like tp_overlap, an assumption about "
        "the build; the certificate holds over the dispatchers given).")
    ep_overlap: bool = Field(True, description="Also try hiding the expert all-to-alls behind another micro-batch "
                             "(Strategy.ep_overlap: with ep > 1, no full recompute, and interleaving when pp > 1).")
    expert_folding: bool = Field(
        True, description="With tp > 1, also try whole experts (etp=1) folded over the stage's tp x cp x dp ranks "
        "(Megatron's MoE parallel folding) beside experts split over the tensor-parallel group (etp=tp).")
    fixed: dict[str, int | str] = Field(
        default_factory=dict, description="Global keys forced to a value (tp, pp, dp, cp, ep, mbs, vpp, zero, ...)."
    )


def powers_of_two(limit: int) -> list[int]:
    """1, 2, 4, ... up to `limit`."""
    out, value = [], 1
    while value <= limit:
        out.append(value)
        value *= 2
    return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _allowed(options: SpaceOptions, key: str, values: list) -> list:
    if key in options.fixed:
        forced = options.fixed[key]
        return [v for v in values if v == forced]
    return values


def stages_fit_pools(job: Job, ranks_per_stage: int, pp: int) -> bool:
    """Whether `pp` stages of `ranks_per_stage` GPUs fit the cluster's pools (whole stages per pool)."""
    return sum(pool.gpus // ranks_per_stage for pool in job.cluster.pools) >= pp


def global_configs(job: Job, options: SpaceOptions | None = None, families: bool = True) -> Iterator[Strategy]:
    """Every legal global configuration (split and per-stage choices left open).  `families=False` leaves out
    the every-k-th-block configurations (unless --fix names a k): the compiler expands them from their
    configuration without recomputation when it reaches it (`every_kth_ks`)."""
    options = options or SpaceOptions()
    if not families and "recompute_every" not in options.fixed:
        options = options.model_copy(update={"recompute_every": False})
    model, cluster = job.model, job.cluster
    homogeneous = len(cluster.pools) == 1
    gpus = cluster.num_gpus
    blocks = max(1, model.num_blocks)
    is_sequence = model.family != "recsys"

    # every degree the job's rules allow (validation.check_strategy), not only powers of two or one node
    tps = [t for t in _divisors(min(gpus, options.max_tp or gpus)) if model.family != "recsys" or t == 1]
    tps = [t for t in tps if t == 1 or (model.heads % t == 0 and (model.kv_heads % t == 0 or t % model.kv_heads == 0))]
    cps = [c for c in _divisors(min(gpus, options.max_cp or gpus))
           if c == 1 or (is_sequence and job.seq_len % (2 * c) == 0)]
    experts = model.num_experts
    identical = len(block_segments(model)) == 1  # once per job: comparing the blocks costs milliseconds
    for tp in _allowed(options, "tp", tps):
        for cp in _allowed(options, "cp", cps):
            pps = [p for p in range(1, blocks + 1) if (model.family != "recsys" or p == 1)
                   and not (options.split_shape == "even" and blocks % p)]
            for pp in _allowed(options, "pp", pps):
                if homogeneous:
                    if gpus % (tp * cp * pp):
                        continue
                    dps = [gpus // (tp * cp * pp)]
                else:
                    # a stage fills whole nodes or divides one, so no node is split between stages
                    node = _min_gpus_per_node(job)
                    dps = [d for d in _divisors(job.global_batch)
                           if (tp * cp * d) % node == 0 or node % (tp * cp * d) == 0
                           if stages_fit_pools(job, tp * cp * d, pp) and tp * cp * d * pp <= gpus]
                for dp in _allowed(options, "dp", dps):
                    yield from _inner(job, options, tp, cp, pp, dp, experts, blocks, identical)


def _inner(job: Job, options: SpaceOptions, tp: int, cp: int, pp: int, dp: int, experts: int,
           blocks: int, identical: bool) -> Iterator[Strategy]:
    # expert groups (etp x ep ranks) tile the stage's tp x cp x dp ranks; etp=None is etp=tp, and whole
    # experts (etp=1) are only worth trying when they are also spread (ep > 1)
    etps = [None, 1] if experts and tp > 1 and options.expert_folding else [None]
    etps = [etp for etp in etps if (etp or tp) == options.fixed.get("etp", etp or tp)]  # --fix etp=N, N = tp too
    layouts = [(etp, e) for etp in etps for e in (_divisors(experts) if experts else [1])
               if (tp * cp * dp) % ((etp or tp) * e) == 0 and e <= (options.max_ep or e) and (etp is None or e > 1)]
    # base recompute; the solver adds full recompute of chosen blocks on top of "none"; selective pays where
    # scores are materialised or the runtime's own policy keeps less than a block saves (torchtitan's op SAC)
    pays = not job.flash or job.runtime.selective is not None
    bases: list[Recompute] = ["none", "selective"] if options.selective_recompute and pays else ["none"]
    grain = options.batch_grain or job.global_batch
    mbss = [b for b in _divisors(job.global_batch // dp) if b <= (options.max_mbs or b)
            and job.global_batch % (dp * b) == 0 and grain % (dp * b) == 0]
    for etp, ep in layouts:
        if ep not in _allowed(options, "ep", [ep]):
            continue
        # a dispatcher other than the all-to-all routes over an expert-parallel group (Strategy's rule)
        dispatchers = _allowed(options, "dispatcher", list(options.dispatchers) if ep > 1 else ["alltoall"])
        for mbs in _allowed(options, "mbs", mbss):
            micro = job.global_batch // (dp * mbs)
            if options.micro_batches_cover_stages and pp > 1 and micro < pp:
                continue
            vpps = [1]
            if pp > 1 and micro % pp == 0 and (grain // (dp * mbs)) % pp == 0:
                vpps += [v for v in range(2, (options.max_vpp or blocks) + 1) if blocks % (pp * v) == 0]
            layouts_: list[tuple[int, Schedule]] = [(vpp, "interleaved" if vpp > 1 else "1f1b") for vpp in vpps]
            layouts_ += [(2, kind) for kind in _v_schedules(options, pp, micro, blocks)]
            for vpp, schedule in layouts_:
                if vpp not in _allowed(options, "vpp", [vpp]) or schedule not in _allowed(options, "schedule",
                                                                                          [schedule]):
                    continue
                recomputes = _recomputes(options, bases, pp, blocks, job.model.num_blocks > 0, identical,
                                         fixed_stage_blocks(pp, vpp, blocks, options.split_shape))
                for zero in _allowed(options, "zero", list(options.zero_stages)):
                    if pp > 1 and zero not in options.zero_stages_pipelined:
                        continue
                    # zero > 0 over one rank shards nothing but is not zero 0 everywhere: a runtime may wrap the
                    # model differently (planner's FSDP2 mixed precision against torch.autocast at zero 0)
                    scopes = list(options.shard_scopes) if zero > 0 else ["full"]
                    if dp <= max(1, _min_gpus_per_node(job) // (tp * cp)):
                        scopes = scopes[:1]  # the data-parallel group fits in a node: node == full
                    for shard in _allowed(options, "shard", scopes):
                        # the FCDP host cache is a per-stage choice (placement_variants); the configuration
                        # carries the plain re-gather unless the space forces the cache
                        regathers = _allowed(options, "regather", ["network"] + _fcdp(job, options, tp, cp, dp,
                                                                                      zero, shard))
                        for recompute, every in recomputes if regathers else []:
                            # full recompute leaves no all-to-all to hide (Strategy's ep_overlap rule)
                            overlaps = _ep_overlaps(options, ep, pp, vpp, schedule) if every is None else [False]
                            for overlap, dispatcher in itertools.product(overlaps, dispatchers):
                                yield Strategy(tp=tp, pp=pp, dp=dp, cp=cp, ep=ep, etp=etp, mbs=mbs, vpp=vpp,
                                               schedule=schedule if schedule in V_SCHEDULES else None,
                                               zero=zero, shard=shard, sp=tp > 1,
                                               tp_overlap=options.tp_overlap and tp > 1, recompute=recompute,
                                               recompute_every=every, regather=regathers[0], ep_overlap=overlap,
                                               dispatcher=dispatcher)


def _recomputes(options: SpaceOptions, bases: list[Recompute], pp: int, blocks: int, has_blocks: bool,
                identical: bool, length: int | None) -> list[tuple[Recompute, int | None]]:
    """(base recompute, recompute_every) of the configurations: the bases (the tables add full recompute of a
    stage's first blocks on top of none), then every k-th block recomputed (`_everies`; `length`:
    fixed_stage_blocks)."""
    # a k that --fix names is tried even where a smaller k dominates it
    fixed = "recompute_every" in options.fixed
    everies = _everies(pp, blocks, identical and not fixed, length) if options.recompute_every and has_blocks else []
    out: list[tuple[Recompute, int | None]] = [(base, None) for base in bases] + [("full", k) for k in everies]
    if fixed:
        out = [(base, every) for base, every in out if every == options.fixed["recompute_every"]]
    return out


def fixed_stage_blocks(pp: int, vpp: int, blocks: int, split_shape: str) -> int | None:
    """The blocks every stage holds where the configuration fixes them (one stage; interleaved or V chunks,
    which stay even; an even split: planner.search.ilp.build.build_tables), None where the tables choose."""
    if pp == 1:
        return blocks
    return blocks // pp if vpp > 1 or split_shape == "even" else None


def _everies(pp: int, blocks: int, identical: bool, length: int | None) -> list[int]:
    """The ks of every k-th block recomputed: from 2 to the most blocks a stage can hold (k = 1 is every block:
    the tables' full count; a larger k recomputes nothing).

    Where every stage holds `length` identical blocks (fixed_stage_blocks): the ks that recompute as many
    blocks (length // k) cost the same seconds on every stage, and the smallest holds the fewest kept blocks
    before its last recomputed one (StageSums.recompute_peak: the same sums otherwise), so only it is tried;
    a k past `length` recomputes nothing (the configuration without recomputation's plans)."""
    most = length if length is not None else blocks - pp + 1  # a stage leaves a block to each other stage
    everies = list(range(2, most + 1))
    if length is not None and identical:
        everies = [k for k in everies if length // k != length // (k - 1)]  # the smallest k of each count
    return everies


def every_kth_ks(job: Job, config: Strategy, options: SpaceOptions, identical: bool) -> list[int]:
    """The ks of the every-k-th-block configurations that agree with `config` (one without recomputation nor
    all-to-all overlap) in everything else, where the space has them and --fix leaves them out of
    `global_configs` (`identical`: the model's blocks are one segment, planner.search.ilp.segments).  The
    compiler expands these families when it reaches `config`: their lower bound is at least its (the same
    blocks, some recomputed), so one it prunes prunes them."""
    if (not options.recompute_every or "recompute_every" in options.fixed or config.recompute != "none"
            or config.recompute_every is not None or config.ep_overlap or not job.model.num_blocks):
        return []
    blocks = job.model.num_blocks
    return _everies(config.pp, blocks, identical, fixed_stage_blocks(config.pp, config.vpp, blocks,
                                                                        options.split_shape))


def families_bounded_by_base(config: Strategy, identical: bool) -> bool:
    """Whether every bound of `config` over its plans with any per-stage count of first blocks recomputed (the
    tables' choice: lower_bound, refined_bound) bounds its every-k-th-block families too, so that a bound
    of `config` that prunes it prunes them, and a bound that keeps it floors theirs.

    Where the blocks are one segment of identical blocks and each stage one chunk (vpp = 1), a family's plan
    (a split, every k-th block of each stage recomputed) has a plan of `config` at the same step time and no
    more HBM: the same split with each stage's first n // k blocks recomputed (n its blocks).  Both stages
    sum the same layers under the same modes, as many recomputed blocks, so every StageSums field agrees but
    `kept_before_recompute`: 0 with the recomputed blocks first, the saves of the plain blocks before the
    last recomputed one with every k-th (planner.cost.stage.kept_before_last_recompute).  No time term reads
    it, and HBM only grows with it (StageSums.recompute_peak, through backward_extra).  The Strategy fields
    that differ (recompute, recompute_every) reach the cost model only through the layers' modes.  With
    several segments the every-k-th blocks may be of another kind than the first ones, and with vpp > 1 they
    fall unevenly over a stage's chunks while the tables count per chunk: there the families keep their own
    bounds (tests/test_bound_oracle.py checks this one against evaluate)."""
    return identical and config.vpp == 1


def families_fit_only_where_base_fits(identical: bool) -> bool:
    """Whether a configuration none of whose plans fits (a memory-aware bound of inf) closes its every-k-th-block
    families, any vpp: where the blocks are one segment of identical blocks, a family's plan that fits gives a
    plan of the configuration that fits, each stage with all its blocks recomputed instead (the tables' count
    per chunk, every block).  A stage's sums with R of its n blocks recomputed are the same whichever R they
    are, but `kept_before_recompute` (>= 0, 0 with the recomputed blocks first), and HBM does not rise as more
    of a stage's blocks recompute (the premise of TableBuilder.fewest_recompute's bisection).  With several
    segments the family's recomputed blocks are of some kinds only (tests/test_bound_oracle.py checks it)."""
    return identical


def _v_schedules(options: SpaceOptions, pp: int, micro: int, blocks: int) -> list[Schedule]:
    """The zero-bubble V schedules a configuration may run: two even chunks per stage and one micro-batch per
    model chunk at least (validation.check_strategy)."""
    if pp == 1 or blocks % (2 * pp) or micro < 2 * pp:
        return []
    return [kind for kind in options.v_schedules if kind in V_SCHEDULES]


def _ep_overlaps(options: SpaceOptions, ep: int, pp: int, vpp: int, schedule: Schedule = "1f1b") -> list[bool]:
    """Whether the expert all-to-alls hide: tried where Strategy allows it (ep > 1, interleaved pipelines or
    DualPipeV's overlapped pairs; not zbv)."""
    return [False, True] if options.ep_overlap and ep > 1 and (pp == 1 or vpp > 1) and schedule != "zbv" else [False]


def _fcdp(job: Job, options: SpaceOptions, tp: int, cp: int, dp: int, zero: int, shard: str) -> list[str]:
    """["host"] where the FCDP host cache is legal and can pay: ZeRO-3 over a group that leaves the NVLink domain
    (inside one, a GB200 NVL72 rack, the re-gather already runs over NVLink)."""
    crosses = dp * cp * tp > min(pool.nvlink_domain_gpus for pool in job.cluster.pools)
    return ["host"] if "host" in options.regathers and zero == 3 and shard == "full" and crosses else []


Placement = dict  # a stage's placement keys (Strategy.PLACEMENT_KEYS) that differ from its configuration's


def placement_variants(job: Job, config: Strategy, options: SpaceOptions, offload: bool) -> tuple[Placement, ...]:
    """What one stage of `config` may choose for its state, the configuration's own placement ({}) first.

    Without offload: the FCDP host cache, where legal.  With offload (tried only when nothing fits
    without it): also optimizer states to each allowed device, with ZeRO-3 parameters too, and partial
    optimizer offload to CPU (ZeRO-Offload++ ratios).  The compiler and the exhaustive oracle both take
    their per-stage choices from here.
    """
    regathers: list[Placement] = [{}]
    if config.regather == "network" and _fcdp(job, options, config.tp, config.cp, config.data_parallel, config.zero,
                                              config.shard) and "regather" not in options.fixed:
        regathers.append({"regather": "host"})
    offloads: list[Placement] = [{}]
    if offload:
        devices = options.offload_devices
        if "optimizer" in options.offloads:
            offloads += [{"offload": "optimizer", "offload_device": d} for d in devices]
        if config.zero == 3 and "all" in options.offloads:
            offloads += [{"offload": "all", "offload_device": d} for d in devices]
        if config.zero == 3 and "optimizer" in options.offloads:
            if "cpu" in devices:
                # partial optimizer offload (ZeRO-Offload++): less CPU Adam and PCIe, more HBM
                offloads += [{"offload": "optimizer", "offload_device": "cpu", "offload_ratio": r}
                             for r in options.offload_ratios if r < 1.0]
    return tuple({**o, **r} for o in offloads for r in regathers)


def _min_gpus_per_node(job: Job) -> int:
    return min(pool.node.gpus_per_node for pool in job.cluster.pools)


def narrow_to_runtime(options: SpaceOptions, runtime: RuntimeProfile, job: Job) -> SpaceOptions:
    """`options` cut down to what `runtime` can express (its `Space`); applied once per runtime a plan must
    run on, it leaves their intersection."""
    space = runtime.space
    keep = lambda values, allowed: tuple(v for v in values if v in allowed)  # noqa: E731
    update: dict = {
        "zero_stages": keep(options.zero_stages, space.zero_stages),
        "zero_stages_pipelined": keep(options.zero_stages_pipelined, space.zero_stages_pipelined),
        "shard_scopes": keep(options.shard_scopes, space.shard_scopes),
        "offloads": keep(options.offloads, space.offloads),
        "offload_devices": keep(options.offload_devices, space.offload_devices),
        "offload_ratios": options.offload_ratios if space.partial_offload else (),
        "regathers": keep(options.regathers, ("network", "host") if space.host_regather else ("network",)),
        "stage_placement": options.stage_placement and space.per_stage_placement,
        "selective_recompute": options.selective_recompute and space.selective_recompute,
        "recompute_every": options.recompute_every and space.recompute_every,
        "tp_overlap": options.tp_overlap and space.tp_overlap,
        "dispatchers": keep(options.dispatchers, space.dispatchers),
        "micro_batches_cover_stages": options.micro_batches_cover_stages or space.one_f_one_b_needs_stages,
        "recompute_counts": _stricter(options.recompute_counts, space.recompute_layers,
                                      ("per_stage", "uniform", "all")),
    }
    if "interleaved" not in space.schedules:
        update["max_vpp"] = 1
    update["v_schedules"] = keep(options.v_schedules, space.schedules)
    if not space.tensor_parallel:
        update["max_tp"] = 1
    if not space.context_parallel or (space.context_parallel_needs_flash and not job.flash):
        update["max_cp"] = 1
    if not space.expert_parallel:
        update["max_ep"] = 1
        update["expert_folding"] = False
        update["ep_overlap"] = False
    if not space.expert_tensor_parallel:
        update["expert_folding"] = False
    if not space.ep_overlap:
        update["ep_overlap"] = False
    if job.model.num_experts:
        update.update(_moe_limits(update, space))
    update["split_shape"] = _stricter(options.split_shape, space.split, ("any", "ends", "even"))
    return options.model_copy(update=update)


def _moe_limits(update: dict, space: Space) -> dict:
    """The ZeRO stages a mixture-of-experts model runs with under `space` (DeepSpeed's MoE layer: no ZeRO-3, no
    pipeline parallelism, which leaves no stage with pp > 1)."""
    limits: dict = {}
    if space.moe_zero_stages is not None:
        for key in ("zero_stages", "zero_stages_pipelined"):
            limits[key] = tuple(z for z in update[key] if z in space.moe_zero_stages)
    if not space.moe_pipelined:
        limits["zero_stages_pipelined"] = ()
    return limits


def _stricter(a: str, b: str, order: tuple[str, ...]) -> str:
    """The narrower of two settings, `order` listing them from the widest."""
    return order[max(order.index(a), order.index(b))]


def shape_allowed(job: Job, strategy: Strategy, space: SpaceOptions) -> bool:
    """The split shape and recompute counts the space allows (the program's add_middle_stages_equal and
    add_uniform_recompute)."""
    blocks = [len(b) for b in split_blocks(job.model.num_blocks, strategy.pp, strategy.split)]
    if space.split_shape == "ends" and len(set(blocks[1:-1])) > 1:
        return False
    return not job.model.num_blocks or recompute_counts_allowed(strategy, tuple(blocks), space.recompute_counts)


def ties_recompute(space: SpaceOptions, config: Strategy) -> bool:
    """Whether the program ties the stages' recompute counts together, so its tables need every count."""
    return space.recompute_counts == "all" or (space.recompute_counts == "uniform" and config.pp > 1)


def limits_note(space: SpaceOptions) -> str:
    """What narrowed the space, for the no-legal-strategy message."""
    notes = [f"--fix {','.join(f'{k}={v}' for k, v in sorted(space.fixed.items()))}"] if space.fixed else []
    if not space.zero_stages_pipelined:
        notes.append("no pipeline parallelism")
    elif set(space.zero_stages_pipelined) != set(space.zero_stages):
        notes.append(f"ZeRO stages {'/'.join(map(str, space.zero_stages_pipelined))} with pipeline parallelism")
    if space.max_vpp == 1:
        notes.append("no interleaving")
    if space.max_tp == 1:
        notes.append("no tensor parallelism")
    fixed = space.fixed.get("dispatcher")
    if fixed is not None and fixed not in space.dispatchers:
        notes.append(f"no dispatcher={fixed} (the runtime does not run it)")
    return f" under {'; '.join(notes)}" if notes else ""
