"""`evaluate(job, strategy, runtime)`: the single cost model.

The step is composed per pipeline stage from per-layer tables (compute.py,
comm.py, memory.py), so the integer program can be built from the same
functions (`stage_cost`) and every solved plan re-checked by `evaluate`.
Each stage is costed under its own placement (`Strategy.for_stage`).

Pipeline time (Narayanan et al. 2021): with per-micro-batch stage times t_i,
m micro-batches and v interleaved chunks,
    T = m * max_i t_i + (sum_i u_i - max_i u_i) / v
with u_i = t_i, which is docs/cost-model.md's (m-1) max t + sum t for v = 1; zero-bubble
schedules fill part of u_i with weight gradients (planner.cost.pipeline).  After the flush come
the data-parallel syncs not hidden behind the last backward, a barrier (the
global gradient norm of clipping), and each stage's own update: the
optimizer step and offload transfers of its placement; the slowest ends it.
"""

from __future__ import annotations

from dataclasses import replace

from hardware import Catalog, load_catalog
from planner.cost.confidence import assess
from planner.cost.interval import interval, regime
from planner.cost.estimate import Breakdown, Estimate, HostMemory, MemoryReport, StageReport
from planner.cost.layout import StagePlacement, place_stages, split_blocks, stage_comms
from planner.cost.pipeline import bubble_seconds, fill_seconds
from planner.cost.stage import StageCost, compose_stage, kept_before_last_recompute, sum_layers
from planner.job import Job
from planner.profile import RuntimeProfile
from planner.strategy import Strategy
from planner.validation import check_strategy


def micro_batches(job: Job, strategy: Strategy) -> int:
    """Micro-batches per step per data-parallel replica."""
    return job.global_batch // (strategy.data_parallel * strategy.mbs)


def refusals(job: Job, strategy: Strategy) -> list[str]:
    """Why the job's runtime cannot run a resolved strategy (empty when it can): its profile's space, with the
    blocks each stage holds and the micro-batches per replica."""
    blocks = tuple(len(b) for b in split_blocks(job.model.num_blocks, strategy.pp, strategy.split))
    return job.runtime.cannot_express(strategy, bool(job.model.num_experts), job.flash, blocks,
                                      micro_batches(job, strategy), shared_experts=has_shared_experts(job))


def has_shared_experts(job: Job) -> bool:
    """Whether the job's MoE layers have always-active shared experts (DeepSeek's)."""
    return any(layer.moe is not None and layer.moe.shared_experts for layer in job.model.layers)


def stage_cost(job: Job, strategy: Strategy, stage: StagePlacement, catalog: Catalog) -> StageCost:
    """Everything one stage costs under a resolved strategy (with the stage's own placement)."""
    strategy = strategy.for_stage(stage.index)
    groups = stage_comms(job, strategy, stage.site)
    modes = [(layer, strategy.layer_recompute(layer.block, stage.index, stage.blocks)) for layer in stage.layers]
    sums = sum_layers(modes, job, strategy, stage.site, groups, catalog)
    if strategy.recompute_every is not None:  # recomputed blocks spread over the stage, not first
        sums = replace(sums, kept_before_recompute=kept_before_last_recompute(modes, job, strategy))
    return compose_stage(job, strategy, stage.site, groups, sums, micro_batches(job, strategy), catalog)


def _stage_report(stage: StagePlacement, cost: StageCost) -> StageReport:
    mem = cost.memory
    return StageReport(
        stage=stage.index,
        blocks=[stage.blocks[0], stage.blocks[-1]] if stage.blocks else [],
        layers=cost.sums.layers, device=stage.device.name, params=mem.params,
        weights_bytes=mem.weights, grads_bytes=mem.grads, optimizer_bytes=mem.optimizer,
        activations_bytes=mem.activations, buffers_bytes=mem.buffers, reserve_bytes=mem.reserve,
        peak_bytes=mem.total, capacity_bytes=mem.capacity, host_offload_bytes=mem.host_offload,
        nvme_offload_bytes=mem.nvme_offload, fits=mem.fits_hbm, microbatch_time_s=cost.microbatch,
    )


def _host_memory(stages: list[StagePlacement], costs: list[StageCost]) -> HostMemory:
    """Host tiers of the busiest node (every GPU of a node parks as much as its stage's ranks)."""
    dram = nvme = 0.0
    dram_cap = nvme_cap = float("inf")
    for stage, cost in zip(stages, costs):
        gpn = stage.site.node.gpus_per_node
        mem = cost.memory
        dram, nvme = max(dram, mem.host_offload * gpn), max(nvme, mem.nvme_offload * gpn)
        dram_cap, nvme_cap = min(dram_cap, mem.host_capacity * gpn), min(nvme_cap, mem.nvme_capacity * gpn)
    fits = all(c.memory.host_offload <= c.memory.host_capacity and c.memory.nvme_offload <= c.memory.nvme_capacity
               for c in costs)
    return HostMemory(dram_bytes=dram, dram_capacity_bytes=dram_cap, nvme_bytes=nvme,
                      nvme_capacity_bytes=nvme_cap, fits=fits)


def _reasons(reports: list[StageReport], host: HostMemory) -> list[str]:
    gb = 1e9
    out = [
        f"stage {r.stage} ({r.device}) needs {r.peak_bytes / gb:.1f} GB of HBM per GPU, has "
        f"{r.capacity_bytes / gb:.1f} GB (over by {(r.peak_bytes - r.capacity_bytes) / gb:.1f} GB: weights "
        f"{r.weights_bytes / gb:.1f}, grads {r.grads_bytes / gb:.1f}, optimizer {r.optimizer_bytes / gb:.1f}, "
        f"activations {r.activations_bytes / gb:.1f})"
        for r in reports if not r.fits
    ]
    if host.dram_bytes > host.dram_capacity_bytes:
        out.append(f"host DRAM needs {host.dram_bytes / gb:.1f} GB per node, "
                   f"{host.dram_capacity_bytes / gb:.1f} GB usable")
    if host.nvme_bytes > host.nvme_capacity_bytes:
        out.append(f"NVMe needs {host.nvme_bytes / gb:.1f} GB per node, has {host.nvme_capacity_bytes / gb:.1f} GB")
    return out


def evaluate(job: Job, strategy: Strategy, runtime: RuntimeProfile | None = None, *,
             catalog: Catalog | None = None) -> Estimate:
    """Score `strategy` on `job` as `runtime` runs it (default: the job's own runtime): step time,
    throughput, memory and breakdown."""
    catalog = catalog or load_catalog()
    job = job.on(runtime)
    s = check_strategy(job, strategy)
    stages = place_stages(job, s, catalog)
    costs = [stage_cost(job, s, stage, catalog) for stage in stages]
    m = micro_batches(job, s)
    times = [c.microbatch for c in costs]
    slowest = max(range(len(costs)), key=lambda i: times[i])
    bottleneck = costs[slowest]
    bubble = bubble_seconds(s, [fill_seconds(s, c) for c in costs])
    pipeline = m * times[slowest] + bubble
    # after the flush: the data-parallel syncs, then a barrier (the global gradient norm for clipping,
    # Megatron-LM and torchtitan), then every stage updates its own parameters; the last update ends the step
    dp_end = max(c.dp_exposed_end for c in costs)
    last = max(range(len(costs)), key=lambda i: costs[i].update)
    optimizer, offload = costs[last].optimizer, costs[last].offload
    step = pipeline + dp_end + costs[last].update

    n = s.tp * s.cp * s.data_parallel * s.pp
    tokens = job.tokens_per_step
    # MFU against the dense 16-bit peak of the GPUs used, also for fp8 runs (the published convention)
    ranks_per_stage = s.tp * s.cp * s.data_parallel
    peak_sum = sum(ranks_per_stage * stage.device.peak(job.compute_dtype) for stage in stages)
    model_flops = job.model.model_flops_per_token(job.attended) * tokens
    # recompute adds forward work; its share of compute time approximates its share of FLOPs
    recompute_share = sum(c.sums.recompute for c in costs) / max(1e-30, sum(c.sums.compute for c in costs))
    reports = [_stage_report(stage, cost) for stage, cost in zip(stages, costs)]
    devices = [stage.device.name for stage in stages]
    host = _host_memory(stages, costs)
    worst = max(reports, key=lambda r: r.peak_bytes / r.capacity_bytes)
    b = bottleneck.sums
    comm_micro = b.tp + b.cp + b.ep + bottleneck.pp + bottleneck.dp_exposed_microbatch
    breakdown = Breakdown(
        compute_s=m * b.compute, recompute_s=m * b.recompute,
        tp_comm_s=m * b.tp, cp_comm_s=m * b.cp, ep_comm_s=m * b.ep,
        pp_comm_s=m * bottleneck.pp, dp_comm_s=m * bottleneck.dp_exposed_microbatch + dp_end,
        bubble_s=bubble, optimizer_s=optimizer, offload_s=offload,
        exposed_comm_s=m * comm_micro + dp_end, dp_comm_total_s=max(c.dp_total for c in costs),
    )
    memory = MemoryReport(
        peak_bytes=worst.peak_bytes, capacity_bytes=worst.capacity_bytes,
        fits=all(r.fits for r in reports) and host.fits, per_stage=reports, host=host,
        reasons=_reasons(reports, host),
    )
    return Estimate(
        step_time_s=step, tokens_per_s=tokens / step, tokens_per_s_per_gpu=tokens / step / n,
        mfu=model_flops / step / peak_sum, hfu=model_flops * (1 + recompute_share) / step / peak_sum,
        micro_batches=m, num_gpus=n, memory=memory, breakdown=breakdown,
        strategy=s.resolved(), strategy_spec=s.spec(), runtime=job.runtime.name,
        confidence=assess(job, s, devices), interval=interval(step, regime(job, s, devices)),
    )
