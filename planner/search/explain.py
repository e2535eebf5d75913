"""Why nothing fits, and the smallest change that would (docs/design.md principle 6).

When `compile_job` finds no strategy that fits, `explain_infeasible` scores
the most memory-friendly strategies with the cost model (`evaluate`): the
largest tensor-parallel degree a node allows, the most pipeline stages that
divide the GPUs (and the batch), context parallelism, ZeRO-3, full
recompute, micro-batch 1, and each offload choice.  It reports the one
closest to fitting, with its overage per tier, then looks for the smallest
change that fits:

* more nodes: the cluster with every pool's node count multiplied by 2, 4,
  ... 64 (same presets), the fewest that fit;
* a shorter sequence or a smaller global batch on the same cluster, when
  activations are what overflows.

The answer is a few lines; its first line says what does not fit where.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware import Catalog, Cluster, load_catalog
from planner.cost import Estimate, evaluate
from planner.cost.evaluate import has_shared_experts
from planner.errors import PlannerInputError
from planner.job import Job
from planner.search.space import powers_of_two
from planner.strategy import Offload, OffloadDevice, Strategy

GB = 1e9
_SCALES = (2, 4, 8, 16, 32, 64)
_OFFLOADS: tuple[tuple[Offload, OffloadDevice], ...] = (
    ("none", "cpu"), ("optimizer", "cpu"), ("optimizer", "nvme"), ("all", "cpu"), ("all", "nvme"))
_MAX_CP = 16
_HALVINGS = 6


@dataclass(frozen=True)
class _Scored:
    """A candidate strategy and how far it is from fitting: need/capacity per tier, largest first."""

    ratios: tuple[float, ...]
    spec: str
    estimate: Estimate


def _tp_choices(job: Job) -> list[int]:
    """Legal tensor-parallel degrees up to an NVLink domain's GPUs (a node's, a GB200 NVL72 rack's), largest
    first."""
    model = job.model
    if model.family == "recsys":
        return [1]
    gpn = min(pool.nvlink_domain_gpus for pool in job.cluster.pools)
    legal = [t for t in powers_of_two(gpn)
             if t == 1 or (model.heads % t == 0 and (model.kv_heads % t == 0 or t % model.kv_heads == 0))]
    return [t for t in reversed(legal) if job.cluster.num_gpus % t == 0]


def _shapes(job: Job) -> list[tuple[int, int, int]]:
    """(tp, pp, cp) of the memory-friendly candidates: every legal tp; most and fewest stages; least and most cp."""
    model, gpus = job.model, job.cluster.num_gpus
    blocks = model.num_blocks if model.family != "recsys" else 1
    shapes: list[tuple[int, int, int]] = []
    for tp in _tp_choices(job):
        cps = [c for c in powers_of_two(_MAX_CP)
               if c == 1 or (model.family != "recsys" and job.seq_len % (2 * c) == 0)]
        pps = [p for p in range(max(1, blocks), 0, -1) if (gpus // tp) % p == 0]
        # most stages; most stages that leave data parallelism to shard over; one stage
        sharded = [p for p in pps if gpus // (tp * p) >= 2]
        for pp in dict.fromkeys(pps[:1] + sharded[:1] + pps[-1:]):
            legal = [c for c in cps if (gpus // (tp * pp)) % c == 0
                     and job.global_batch % (gpus // (tp * pp * c)) == 0]
            for cp in sorted({legal[0], legal[-1]}) if legal else []:
                if (tp, pp, cp) not in shapes:
                    shapes.append((tp, pp, cp))
    return shapes


def _candidates(job: Job, devices: tuple[str, ...]) -> list[Strategy]:
    """The memory-friendly candidates the job's runtime can run: the most sharding it has, full recompute,
    micro-batch 1, each offload it offers."""
    out = []
    gpus, space = job.cluster.num_gpus, job.runtime.space
    experts = job.model.num_experts
    for tp, pp, cp in _shapes(job):
        dp = gpus // (tp * pp * cp)
        stages = space.zero_stages_pipelined if pp > 1 else space.zero_stages
        if experts and space.moe_zero_stages is not None:  # DeepSpeed's MoE layer: no ZeRO-3
            stages = tuple(z for z in stages if z in space.moe_zero_stages)
        if not stages:
            continue  # the runtime runs no ZeRO stage at this pipeline depth (pytorch-ddp's pipelines)
        zero = max(stages)
        ep = max((e for e in range(1, experts + 1) if experts % e == 0 and (dp * cp) % e == 0), default=1)
        for offload, device in _OFFLOADS:
            if offload == "all" and zero != 3 or offload != "none" and device not in devices:
                continue
            strategy = Strategy(tp=tp, pp=pp, cp=cp, dp=dp, ep=ep, mbs=1, zero=zero, recompute="full",
                                offload=offload, offload_device=device)
            if not job.runtime.cannot_express(strategy, bool(experts), job.flash,
                                                 shared_experts=has_shared_experts(job)):
                out.append(strategy)
    return out


def short_spec(strategy: dict) -> str:
    """A SPEC with only the keys that matter for memory (the others take their defaults)."""
    s = strategy
    parts = [f"tp={s['tp']}", f"pp={s['pp']}", f"dp={s['dp']}"]
    parts += [f"{key}={s[key]}" for key in ("cp", "ep") if s[key] > 1]
    parts += [f"mbs={s['mbs']}", f"zero={s['zero']}", f"recompute={s['recompute']}"]
    if s["offload"] != "none":
        parts += [f"offload={s['offload']}", f"offload_device={s['offload_device']}"]
    return ",".join(parts)


def _ratios(estimate: Estimate) -> tuple[float, ...]:
    """need/capacity of every tier in use (HBM of every stage, host DRAM, NVMe), largest first."""
    host = estimate.memory.host
    ratios = [r.peak_bytes / r.capacity_bytes for r in estimate.memory.per_stage]
    if host.dram_bytes:
        ratios.append(host.dram_bytes / host.dram_capacity_bytes if host.dram_capacity_bytes else float("inf"))
    if host.nvme_bytes:
        ratios.append(host.nvme_bytes / host.nvme_capacity_bytes if host.nvme_capacity_bytes else float("inf"))
    return tuple(sorted(ratios, reverse=True))


def _scored(job: Job, catalog: Catalog, devices: tuple[str, ...], offload: bool = True) -> list[_Scored]:
    """Candidates with their ratios, closest to fitting first (no-offload first among those that fit)."""
    out = []
    for strategy in _candidates(job, devices):
        if not offload and strategy.offload != "none":
            continue
        try:
            estimate = evaluate(job, strategy, catalog=catalog)
        except PlannerInputError:
            continue
        out.append(_Scored(ratios=_ratios(estimate), spec=short_spec(estimate.strategy), estimate=estimate))
    # fitting ones first (without offload, then fastest); then the closest: smallest worst tier, next worst, ...
    return sorted(out, key=lambda s: (not s.estimate.memory.fits, s.ratios if not s.estimate.memory.fits else (),
                                      s.estimate.strategy["offload"] != "none", s.estimate.step_time_s, s.spec))


def _first_fit(job: Job, catalog: Catalog, devices: tuple[str, ...]) -> _Scored | None:
    scored = _scored(job, catalog, devices)
    return scored[0] if scored and scored[0].estimate.memory.fits else None


def _scaled(cluster: Cluster, factor: int) -> Cluster:
    """The cluster with every pool's node count multiplied by `factor`."""
    preset, sep, count = cluster.name.rpartition(":")
    if sep and len(cluster.pools) == 1 and count.isdigit():
        name = f"{preset}:{int(count) * factor}"
    else:
        name = f"{cluster.name} x{factor}"
    pools = [pool.model_copy(update={"count": pool.count * factor}) for pool in cluster.pools]
    return cluster.model_copy(update={"name": name, "pools": pools})


def _overage(best: _Scored) -> str:
    """What overflows: the worst stage (and how many are over), then the host tiers."""
    memory = best.estimate.memory
    over = [r for r in memory.per_stage if not r.fits]
    parts = []
    if over:
        worst = max(over, key=lambda r: (r.peak_bytes / r.capacity_bytes, -r.stage))
        parts.append(
            f"stage {worst.stage} ({worst.device}) needs {worst.peak_bytes / GB:.1f} GB of HBM per GPU, has "
            f"{worst.capacity_bytes / GB:.1f} GB (over by {(worst.peak_bytes - worst.capacity_bytes) / GB:.1f} GB: "
            f"weights {worst.weights_bytes / GB:.1f}, grads {worst.grads_bytes / GB:.1f}, optimizer "
            f"{worst.optimizer_bytes / GB:.1f}, activations {worst.activations_bytes / GB:.1f}, other "
            f"{(worst.buffers_bytes + worst.reserve_bytes) / GB:.1f})"
        )
        if len(over) > 1:
            parts[-1] += f", {len(over)} of {len(memory.per_stage)} stages over"
    host = memory.host
    if host.dram_bytes > host.dram_capacity_bytes:
        parts.append(f"host DRAM needs {host.dram_bytes / GB:.1f} GB per node, "
                     f"{host.dram_capacity_bytes / GB:.1f} GB usable")
    if host.nvme_bytes > host.nvme_capacity_bytes:
        parts.append(f"NVMe needs {host.nvme_bytes / GB:.1f} GB per node, has {host.nvme_capacity_bytes / GB:.1f} GB")
    return "; ".join(parts) or "memory exceeds capacity"


def _activations_bound(best: _Scored) -> bool:
    """Whether dropping activations alone would make the worst stage fit its HBM."""
    memory = best.estimate.memory
    if not memory.host.fits:
        return False
    return all(r.peak_bytes - r.activations_bytes <= r.capacity_bytes for r in memory.per_stage)


def _more_nodes(job: Job, catalog: Catalog, devices: tuple[str, ...]) -> str | None:
    for factor in _SCALES:
        cluster = _scaled(job.cluster, factor)
        fit = _first_fit(job.model_copy(update={"cluster": cluster}), catalog, devices)
        if fit is not None:
            nodes = cluster.num_nodes
            return (f"would fit on {nodes} node{'s' if nodes != 1 else ''} ({cluster.name}, {cluster.num_gpus} GPUs), "
                    f"e.g. with {fit.spec}")
    return None


def _smaller_job(job: Job, catalog: Catalog, devices: tuple[str, ...]) -> str | None:
    """A smaller global batch, else a shorter sequence, that fits on this cluster."""
    sizes = [("global_batch", "--batch")] + ([] if job.model.family == "recsys" else [("seq_len", "--seq-len")])
    for field, flag in sizes:
        for step in range(1, _HALVINGS + 1):
            value = getattr(job, field) >> step
            if value < 1:
                break
            fit = _first_fit(job.model_copy(update={field: value}), catalog, devices)
            if fit is not None:
                return f"fits with {flag} {value} (e.g. {fit.spec})"
    return None


def explain_infeasible(job: Job, catalog: Catalog | None = None,
                       offload_devices: tuple[str, ...] = ("cpu", "nvme")) -> str:
    """A few lines: what does not fit where and by how much, and the smallest change that would fit.

    offload_devices: where the search could offload (the named launch targets may exclude NVMe)."""
    catalog = catalog or load_catalog()
    devices = tuple(offload_devices)
    where = "" if set(devices) >= {"cpu", "nvme"} else f" to {' or '.join(devices) or 'nowhere'} (the --target's limit)"
    head = (f"does not fit: no strategy for {job.model.name} (batch {job.global_batch} x {job.seq_len} tokens, "
            f"{job.precision}) fits {job.cluster.describe()}, even with full recompute and offload{where}.")
    scored = _scored(job, catalog, devices)
    if not scored:
        return head + " No memory-friendly strategy has legal degrees on this cluster."
    best = scored[0]
    if best.estimate.memory.fits:
        return (f"{head} Yet {best.spec} fits under the cost model: the search stopped at its limits "
                "(raise --time-limit, or relax --max-step-time).")
    lines = [head, f"Closest: {best.spec}: {_overage(best)}."]
    changes = [c for c in (_more_nodes(job, catalog, devices),) if c]
    if _activations_bound(best):
        smaller = _smaller_job(job, catalog, devices)
        if smaller:
            changes.append(smaller)
    if changes:
        lines.append("Smallest change: " + "; or ".join(changes) + ".")
    else:
        lines.append(f"No change tried fits: not {max(_SCALES)}x the nodes, nor a smaller batch or sequence.")
    return "\n".join(lines)
