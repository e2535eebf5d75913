"""Result types of the cost model: what `evaluate` returns and `estimate --json` prints."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from planner.cost.confidence import Confidence
from planner.cost.interval import Interval

_FIELD = ConfigDict(extra="forbid", frozen=True)


class Breakdown(BaseModel):
    """Where a step's time goes (seconds, critical path of the slowest stage)."""

    model_config = _FIELD
    compute_s: float = Field(description="Forward + backward compute over all micro-batches.")
    recompute_s: float = Field(description="Forward work recomputed in backward.")
    tp_comm_s: float = Field(description="Exposed tensor-parallel collectives.")
    cp_comm_s: float = Field(description="Exposed context-parallel KV exchange.")
    ep_comm_s: float = Field(description="Expert-parallel all-to-all.")
    pp_comm_s: float = Field(description="Pipeline point-to-point transfers.")
    dp_comm_s: float = Field(description="Exposed data-parallel (gradient/ZeRO) communication.")
    bubble_s: float = Field(description="Pipeline fill and drain.")
    optimizer_s: float = Field(description="Optimizer step on the GPU.")
    offload_s: float = Field(description="Offload transfers and CPU optimizer not hidden by compute.")
    exposed_comm_s: float = Field(description="All communication on the critical path.")
    dp_comm_total_s: float = Field(description="Data-parallel communication including the hidden part.")


class HbmBreakdown(BaseModel):
    """HBM per GPU of a stage at its peak (bytes); also the plan's per-stage HBM record."""

    model_config = _FIELD
    weights_bytes: float = Field(description="Weights in HBM.")
    grads_bytes: float = Field(description="Gradients in HBM.")
    optimizer_bytes: float = Field(description="Optimizer states in HBM.")
    activations_bytes: float = Field(description="Saved activations at the peak.")
    buffers_bytes: float = Field(description="Gathered-weight and communication buffers.")
    reserve_bytes: float = Field(description="Framework reserve and fragmentation.")
    peak_bytes: float = Field(description="Total HBM at the peak.")
    capacity_bytes: float = Field(description="HBM of the device a plan may use (less the job's memory margin).")
    fits: bool = Field(description="peak_bytes <= capacity_bytes.")


class StageReport(HbmBreakdown):
    """Memory and time of one pipeline stage (per GPU)."""

    stage: int = Field(description="Stage index.")
    blocks: list[int] = Field(description="First and last transformer block of the stage ([] if none).")
    layers: int = Field(description="Layers on the stage.")
    device: str = Field(description="Device type of the stage's GPUs.")
    params: float = Field(description="Parameters per GPU before ZeRO sharding.")
    host_offload_bytes: float = Field(description="Bytes parked in host DRAM.")
    nvme_offload_bytes: float = Field(description="Bytes parked on NVMe.")
    microbatch_time_s: float = Field(description="One micro-batch forward+backward on this stage.")


class HostMemory(BaseModel):
    """Host DRAM and NVMe use of the busiest node."""

    model_config = _FIELD
    dram_bytes: float = Field(description="Offloaded bytes in host DRAM per node.")
    dram_capacity_bytes: float = Field(description="Usable host DRAM per node.")
    nvme_bytes: float = Field(description="Offloaded bytes on NVMe per node.")
    nvme_capacity_bytes: float = Field(description="NVMe capacity per node.")
    fits: bool = Field(description="Both fit.")


class MemoryReport(BaseModel):
    """Peak memory against capacity, per stage and per node."""

    model_config = _FIELD
    peak_bytes: float = Field(description="Largest per-GPU HBM peak over stages.")
    capacity_bytes: float = Field(description="HBM capacity of that GPU a plan may use (less the memory margin).")
    fits: bool = Field(description="Every stage fits its HBM and every node its host tiers.")
    per_stage: list[StageReport] = Field(description="Per-stage detail.")
    host: HostMemory = Field(description="Host tiers.")
    reasons: list[str] = Field(description="Why it does not fit (empty when it fits).")


class Estimate(BaseModel):
    """Predicted step time, throughput, utilisation, memory and breakdown."""

    model_config = _FIELD
    step_time_s: float = Field(description="Seconds per optimizer step.")
    tokens_per_s: float = Field(description="Tokens (samples for recsys) per second, whole job.")
    tokens_per_s_per_gpu: float = Field(description="tokens_per_s / GPUs.")
    mfu: float = Field(description="Model FLOPs utilisation (6N + attention, no recompute) vs dense peak.")
    hfu: float = Field(description="Hardware FLOPs utilisation (with recompute).")
    micro_batches: int = Field(description="Micro-batches per step per data-parallel replica.")
    num_gpus: int = Field(description="GPUs used.")
    memory: MemoryReport = Field(description="Memory report.")
    breakdown: Breakdown = Field(description="Time breakdown.")
    strategy: dict = Field(description="The resolved strategy.")
    strategy_spec: str = Field(description="The resolved strategy as a SPEC string.")
    runtime: str = Field(description="The runtime profile it was costed under (hardware/data/runtimes).")
    confidence: Confidence = Field(description="Whether a term leans on a regime no validated published run "
                                   "covers (planner.cost.confidence), with the reasons.")
    interval: Interval = Field(description="The step time's prediction interval from the published runs of the "
                               "nearest regime (planner.cost.interval).")
