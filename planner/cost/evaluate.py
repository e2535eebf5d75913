"""`evaluate(job, strategy)`: the single cost model.

The step is composed per pipeline stage from per-layer tables (compute.py,
comm.py, memory.py), so the integer program can be built from the same
functions (`stage_cost`) and every solved plan re-checked by `evaluate`.

Pipeline time (Narayanan et al. 2021): with per-micro-batch stage times t_i,
m micro-batches and v interleaved chunks,
    T = m * max_i t_i + (sum_i t_i - max_i t_i) / v
which is DESIGN.md's (m-1) max t + sum t for v = 1.  After the flush, the
data-parallel sync not hidden behind the last backward, the optimizer step
and offload transfers follow.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware import Catalog, load_catalog
from planner.cost.comm import data_parallel_comm, grad_reduce_bytes, layer_comm, p2p_per_microbatch
from planner.cost.compute import layer_time
from planner.cost.estimate import Breakdown, Estimate, HostMemory, MemoryReport, StageReport
from planner.cost.layout import StagePlacement, place_stages, stage_groups
from planner.cost.memory import WEIGHT_BYTES, StageMemory, stage_memory
from planner.job import Job
from planner.strategy import Strategy
from planner.validation import check_strategy


@dataclass(frozen=True)
class StageCost:
    """Seconds and bytes of one stage, the unit the cost tables are built from."""

    compute: float  # forward + backward per micro-batch
    recompute: float
    tp: float
    cp: float
    ep: float
    pp: float
    dp_exposed_microbatch: float  # ZeRO-2/3 traffic not hidden, per micro-batch
    dp_exposed_end: float  # step-end sync not hidden behind the last backward
    dp_total: float
    optimizer: float
    offload: float
    memory: StageMemory

    @property
    def microbatch(self) -> float:
        """Critical-path seconds of one micro-batch on this stage."""
        return self.compute + self.recompute + self.tp + self.cp + self.ep + self.pp + self.dp_exposed_microbatch


def micro_batches(job: Job, strategy: Strategy) -> int:
    """Micro-batches per step per data-parallel replica."""
    return job.global_batch // (strategy.dp * strategy.mbs)


def _offload_seconds(memory: StageMemory, params: float, job: Job, strategy: Strategy, stage: StagePlacement,
                     catalog: Catalog, shard: int) -> float:
    """Per-step seconds of optimizer offload (PCIe transfers, CPU Adam, NVMe swap)."""
    if not strategy.offloads_optimizer:
        return 0.0
    node = stage.node
    pcie = node.pcie_bandwidth * catalog.constant("pcie_efficiency")
    owned = params / (shard if strategy.zero >= 1 else 1)
    transfer = owned * (grad_reduce_bytes(job) + WEIGHT_BYTES) / pcie
    cpu_adam = owned * node.gpus_per_node / catalog.constant("cpu_adam_params_per_second")
    swap = 0.0
    if strategy.offload_device == "nvme":
        nvme_rate = node.nvme_bandwidth * catalog.constant("nvme_efficiency")
        swap = 2.0 * memory.nvme_offload * node.gpus_per_node / nvme_rate  # read and write back
    return transfer + cpu_adam + swap


def _param_fetch_seconds(memory: StageMemory, stage: StagePlacement, strategy: Strategy, catalog: Catalog) -> float:
    """Seconds per micro-batch to bring offloaded weight shards to the GPU (forward and backward)."""
    if not strategy.offloads_params:
        return 0.0
    shard_bytes = memory.params * WEIGHT_BYTES / max(1, strategy.dp)
    if strategy.offload_device == "cpu":
        rate = stage.node.pcie_bandwidth * catalog.constant("pcie_efficiency")
    else:
        rate = stage.node.nvme_bandwidth * catalog.constant("nvme_efficiency") / stage.node.gpus_per_node
    return 2.0 * shard_bytes / rate


def stage_cost(job: Job, strategy: Strategy, stage: StagePlacement, catalog: Catalog) -> StageCost:
    """Everything one stage costs under a resolved strategy."""
    device = stage.device
    groups = stage_groups(job, strategy, stage)
    m = micro_batches(job, strategy)
    overlap = catalog.constant("comm_overlap_efficiency")

    compute = recompute = forward = tp = cp = ep = 0.0
    for layer in stage.layers:
        mode = strategy.layer_recompute(layer.block, stage.blocks)
        time = layer_time(layer, job, strategy, device, catalog, mode)
        comm = layer_comm(layer, job, strategy, groups, time, catalog, mode)
        forward += time.forward
        compute += time.forward + time.backward
        recompute += time.recompute
        tp, cp, ep = tp + comm.tp, cp + comm.cp, ep + comm.ep
    backward = compute - forward + recompute

    memory = stage_memory(job, strategy, stage, m, catalog)
    dp = data_parallel_comm(memory.params, job, strategy, groups, m, catalog)
    fetch = _param_fetch_seconds(memory, stage, strategy, catalog)
    per_layer_gather = dp.per_microbatch_forward / max(1, len(stage.layers))
    dp_micro = (
        max(0.0, dp.per_microbatch_forward + fetch / 2 - overlap * forward)
        + max(0.0, dp.per_microbatch_backward + fetch / 2 - overlap * backward)
        + per_layer_gather  # the first layer's gather has nothing to hide behind
    )
    dp_end = max(0.0, dp.step_end - overlap * (forward + backward)) if dp.step_end else 0.0

    owned = memory.params / (groups.dp_shard.size if strategy.zero >= 1 else 1)
    optimizer = 0.0
    if not strategy.offloads_optimizer:
        hbm = device.hbm_bandwidth * catalog.constant("hbm_efficiency")
        optimizer = owned * catalog.constant("optimizer_traffic_per_param") / hbm
    offload = _offload_seconds(memory, memory.params, job, strategy, stage, catalog, groups.dp_shard.size)
    return StageCost(
        compute=compute, recompute=recompute, tp=tp, cp=cp, ep=ep,
        pp=p2p_per_microbatch(stage.layers, job, strategy, groups, catalog),
        dp_exposed_microbatch=dp_micro, dp_exposed_end=dp_end, dp_total=dp.total,
        optimizer=optimizer, offload=offload, memory=memory,
    )


def _stage_report(stage: StagePlacement, cost: StageCost) -> StageReport:
    mem = cost.memory
    return StageReport(
        stage=stage.index,
        blocks=[stage.blocks[0], stage.blocks[-1]] if stage.blocks else [],
        layers=len(stage.layers), device=stage.device.name, params=mem.params,
        weights_bytes=mem.weights, grads_bytes=mem.grads, optimizer_bytes=mem.optimizer,
        activations_bytes=mem.activations, buffers_bytes=mem.buffers, reserve_bytes=mem.reserve,
        peak_bytes=mem.total, capacity_bytes=mem.capacity, host_offload_bytes=mem.host_offload,
        nvme_offload_bytes=mem.nvme_offload, fits=mem.fits, microbatch_time_s=cost.microbatch,
    )


def _host_memory(stages: list[StagePlacement], costs: list[StageCost], catalog: Catalog) -> HostMemory:
    usable = catalog.constant("host_memory_usable_fraction")
    dram = nvme = 0.0
    dram_cap = nvme_cap = float("inf")
    for stage, cost in zip(stages, costs):
        node = stage.node
        dram = max(dram, cost.memory.host_offload * node.gpus_per_node)
        nvme = max(nvme, cost.memory.nvme_offload * node.gpus_per_node)
        dram_cap = min(dram_cap, node.host_dram_bytes * usable)
        nvme_cap = min(nvme_cap, node.nvme_bytes)
    return HostMemory(dram_bytes=dram, dram_capacity_bytes=dram_cap, nvme_bytes=nvme,
                      nvme_capacity_bytes=nvme_cap, fits=dram <= dram_cap and nvme <= nvme_cap)


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
        out.append(f"host DRAM needs {host.dram_bytes / gb:.1f} GB per node, {host.dram_capacity_bytes / gb:.1f} GB usable")
    if host.nvme_bytes > host.nvme_capacity_bytes:
        out.append(f"NVMe needs {host.nvme_bytes / gb:.1f} GB per node, has {host.nvme_capacity_bytes / gb:.1f} GB")
    return out


def evaluate(job: Job, strategy: Strategy, catalog: Catalog | None = None) -> Estimate:
    """Score `strategy` on `job`: step time, throughput, memory and breakdown."""
    catalog = catalog or load_catalog()
    s = check_strategy(job, strategy)
    stages = place_stages(job, s, catalog)
    costs = [stage_cost(job, s, stage, catalog) for stage in stages]
    m = micro_batches(job, s)
    times = [c.microbatch for c in costs]
    slowest = max(range(len(costs)), key=lambda i: times[i])
    bottleneck = costs[slowest]
    bubble = (sum(times) - times[slowest]) / s.vpp
    pipeline = m * times[slowest] + bubble
    dp_end = max(c.dp_exposed_end for c in costs)
    optimizer = max(c.optimizer for c in costs)
    offload = max(c.offload for c in costs)
    step = pipeline + dp_end + optimizer + offload

    n = job.cluster.num_gpus
    tokens = job.tokens_per_step
    # MFU against the dense 16-bit peak, also for fp8 runs (the convention of the published figures)
    peak_sum = sum(p.gpus * catalog.device(p.node.device).peak(job.compute_dtype) for p in job.cluster.pools)
    model_flops = job.model.model_flops_per_token(job.seq_len) * tokens
    # recompute adds forward work; its share of compute time approximates its share of FLOPs
    recompute_share = sum(c.recompute for c in costs) / max(1e-30, sum(c.compute for c in costs))
    reports = [_stage_report(stage, cost) for stage, cost in zip(stages, costs)]
    host = _host_memory(stages, costs, catalog)
    worst = max(reports, key=lambda r: r.peak_bytes / r.capacity_bytes)
    comm_micro = bottleneck.tp + bottleneck.cp + bottleneck.ep + bottleneck.pp + bottleneck.dp_exposed_microbatch
    breakdown = Breakdown(
        compute_s=m * bottleneck.compute, recompute_s=m * bottleneck.recompute,
        tp_comm_s=m * bottleneck.tp, cp_comm_s=m * bottleneck.cp, ep_comm_s=m * bottleneck.ep,
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
        strategy=s.resolved(), strategy_spec=s.spec(),
    )
