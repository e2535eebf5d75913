"""Per-layer compute time of one micro-batch on one rank.

Three parts, each bounded by a different resource of the device:

* GEMMs: FLOPs / (peak x achieved efficiency for that GEMM size), the
  Calculon-style step curve of the device catalog; FP8 runs speed GEMMs up by
  the realised FP8/BF16 ratio, capped (`fp8_gemm_speedup_cap`), as measured on
  H100 and scaled by the device's `fp8_gemm_gain`.  A MoE
  layer's routed experts run as grouped GEMMs of one expert's tokens each
  (tokens x top_k x etp x ep / (experts x tp) rows), so their efficiency is
  the curve's at one expert's GEMM, and the busiest expert-parallel rank
  does `Job.moe_imbalance` times the mean work; the router and shared
  experts are ordinary GEMMs over all the rank's tokens.
* the attention core (QK^T, softmax, AV): under flash attention a fused kernel
  at its measured efficiency relative to the GEMMs (planner.cost.attention: per
  kernel and device), which for a causal
  model skips the masked blocks (`causal_time_ratio`: about half, plus a block
  row on short sequences, fitted to the kernels' published causal and
  non-causal throughput); without it batched GEMMs plus score traffic counted
  with the element-wise work (the mask saves nothing there).
* memory-bound element-wise kernels (norms, activations, dropout, residual,
  softmax): HBM traffic proportional to the activations the layer saves.

Backward is priced per kind of work (Korthikanti et al. 2022 Table 4 measure
the 22B layer's backward at 1.5-1.6x its forward, where one ratio of 2.3 on
everything overstated it by 16-32%): GEMMs `backward_gemm_ratio` (a data and a
weight gradient per forward GEMM), the flash attention core
`flash_attention_backward_ratio` (FlashAttention-2's backward FLOPs), the
unfused attention core as GEMMs, and element-wise kernels
`backward_elementwise_ratio` of their forward traffic.

Every kernel the layer launches adds a fixed overhead, forward and backward (planner.cost.launches: the
kernels counted per layer kind, eager or fused, times the seconds one costs, less under CUDA graphs); a
fully recomputed layer pays its forward's kernels again.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware import Catalog, DeviceSpec
from models.graph import Layer, RecomputeMode
from planner.cost.attention import attention_efficiency
from planner.cost.kernel_tables import load_kernel_table
from planner.cost.launches import launch_overhead
from planner.cost.layout import microbatch_tokens, tp_divisor
from planner.cost.memory import layer_width
from planner.job import Job
from planner.strategy import Strategy

# A transformer sub-block runs about three GEMMs (QKV/proj, or up/gate/down);
# the efficiency curve is indexed by the size of one of them.
GEMMS_PER_LAYER = 3.0


@dataclass(frozen=True)
class LayerTime:
    """Seconds one rank spends on one layer for one micro-batch."""

    forward: float
    backward: float
    recompute: float  # extra forward work redone in backward
    attention_forward: float  # attention-core share of `forward` (context parallel overlaps with it)
    attention_backward: float = 0.0  # attention-core share of `backward`
    weight_grad: float = 0.0  # weight-gradient GEMMs' share of `backward` (zero-bubble schedules defer it)


def gemm_rate(device: DeviceSpec, job: Job, flops: float, catalog: Catalog) -> float:
    """Achieved FLOP/s of a GEMM of `flops` FLOPs in the job's precision."""
    base = device.sustained_peak(job.compute_dtype) * device.efficiency(flops)
    if job.precision == "fp8" and "fp8" in device.peak_flops:
        ratio = device.peak("fp8") / device.peak(job.compute_dtype)
        realised = job.runtime.kernels.fp8_gemm_speedup or catalog.constant("fp8_gemm_speedup_cap")
        base *= min(ratio, realised * device.fp8_gemm_gain)  # the speed-ups were measured on H100
    elif job.precision == "mxfp8":  # Job admits it only where the tensor cores run MX blocks at the fp8 peak
        ratio = device.peak("fp8") / device.peak(job.compute_dtype)
        base *= min(ratio, catalog.constant("mxfp8_gemm_speedup"))
    return base


def causal_time_ratio(seq_len: float, catalog: Catalog) -> float:
    """Time of a causal flash-attention core over the unmasked one on sequences of `seq_len` tokens."""
    return min(1.0, catalog.constant("causal_attention_work")
               + catalog.constant("causal_attention_block_tokens") / seq_len)


def layer_time(layer: Layer, job: Job, strategy: Strategy, device: DeviceSpec, catalog: Catalog,
               recompute: RecomputeMode) -> LayerTime:
    """Forward, backward and recompute seconds of `layer` for one micro-batch on one rank,
    when the layer's recompute mode is `recompute`."""
    tokens = microbatch_tokens(job, strategy)
    tp = tp_divisor(layer, strategy.tp)
    gemm_flops = tokens * layer.flops_per_token / tp
    attn_flops = tokens * layer.flops_per_token_per_seq * job.attended / tp
    if layer.moe is not None:
        gemm_s = moe_gemm_seconds(layer, job, strategy, device, catalog)
    else:
        gemm_s = gemm_flops / gemm_rate(device, job, gemm_flops / GEMMS_PER_LAYER, catalog) if gemm_flops else 0.0

    attn_s = 0.0
    if attn_flops:
        # under context parallelism the core runs as cp ring steps, one block of the local queries against one
        # rank's keys each: the efficiency is that of a block, so short chunks fall down the device's curve
        plain_rate = device.sustained_peak(job.compute_dtype) * device.efficiency(attn_flops / 2 / strategy.cp)
        if job.flash:
            head_dim = layer.attention.head_dim if layer.attention is not None else None
            plain_rate *= attention_efficiency(device.name, job.runtime.kernels.attention_kernel, catalog, head_dim)
        if strategy.cp > 1:
            plain_rate *= catalog.constant("context_parallel_attention_efficiency")
        attn_s = attn_flops / plain_rate
        if job.flash and layer.attention is not None and layer.attention.causal:
            attn_s *= causal_time_ratio(job.attended, catalog)  # packed documents: their length

    hbm_rate = device.hbm_bandwidth * catalog.constant("hbm_efficiency")
    traffic = catalog.constant("elementwise_traffic_per_saved_byte")
    if not job.fused:
        traffic *= catalog.constant("eager_elementwise_traffic_factor")
    saved = layer.saved_activation_bytes(
        strategy.mbs, job.seq_len, tp=strategy.tp if layer.tp_splittable else 1,
        sequence_parallel=strategy.sequence_parallel and layer.tp_splittable,
        recompute="none", flash_attention=job.flash,
    ) / strategy.cp
    elementwise_s = traffic * saved / hbm_rate
    # The score tensors (non-flash) are the part selective recompute redoes.
    scores = 0.0
    if not job.flash and layer.act_attn_scores:
        scores = traffic * tokens * layer.act_attn_scores * job.attended / tp / hbm_rate

    launch_forward, launch_backward = launch_overhead(layer, job, catalog)
    forward = gemm_s + attn_s + elementwise_s + launch_forward
    if recompute == "full":
        recompute_s = forward
    elif recompute == "selective" and job.runtime.selective is not None:
        recompute_s = policy_recompute_seconds(layer, job, strategy, device, catalog, attn_s,
                                               elementwise_s + launch_forward)
    elif recompute == "selective":
        recompute_s = attn_s + scores
    else:
        recompute_s = 0.0
    backward = backward_seconds(gemm_s, attn_s, elementwise_s, job.flash, catalog) + launch_backward
    return LayerTime(forward=forward, backward=backward,
                     recompute=recompute_s, attention_forward=attn_s,
                     attention_backward=backward_seconds(0.0, attn_s, 0.0, job.flash, catalog),
                     weight_grad=weight_grad_seconds(gemm_s, catalog))


def policy_recompute_seconds(layer: Layer, job: Job, strategy: Strategy, device: DeviceSpec, catalog: Catalog,
                             attn_s: float, elementwise_s: float) -> float:
    """Seconds the runtime's own selective recompute (`RuntimeProfile.selective`: torchtitan's per-op SAC) redoes
    of `layer` per micro-batch: the GEMMs its policy does not save (hidden x width each, per token), the
    attention core if it is not saved, and the element-wise kernels with their launches (`elementwise_s`)."""
    rule = job.runtime.selective
    if rule is None:  # the runtime has no policy of its own: Megatron's selective (the attention core)
        return attn_s
    widths = rule.recomputed_gemms.get(layer.kind, ())
    tp = tp_divisor(layer, strategy.tp)
    per_token = sum(2.0 * layer.hidden * layer_width(layer, w, job.seq_len) for w in widths)
    flops = microbatch_tokens(job, strategy) * per_token / tp
    seconds = flops / gemm_rate(device, job, flops / len(widths), catalog) if flops else 0.0
    return seconds + (attn_s if rule.attention_core else 0.0) + (elementwise_s if rule.elementwise else 0.0)


def expert_flops_per_token(layer: Layer) -> float:
    """Forward FLOPs per token of one expert of a MoE layer (its flops_per_token is 2 x (the top_k routed and
    the shared experts' weights + the router's hidden x experts))."""
    moe = layer.moe_shape
    router = 2.0 * layer.hidden * moe.num_experts
    return (layer.flops_per_token - router) / (moe.top_k + moe.shared_experts)


def expert_load_ratio(layer: Layer, job: Job, strategy: Strategy, catalog: Catalog) -> float:
    """Expert tokens the busiest rank computes and receives over the mean routed ones, per MoE layer.

    Dropless runtimes (Megatron-Core, torch's grouped GEMMs) compute every routed token, so the busiest of
    the ep ranks sets the pace (`Job.moe_imbalance`).  A runtime that pads each expert to a capacity and
    drops the overflow (DeepSpeed-MoE: `RuntimeProfile.expert_capacity`) computes and moves the padded
    buffer on every rank, whatever the routing: capacity x experts over the rank's routed tokens."""
    capacity = job.runtime.expert_capacity
    if capacity is None:
        return job.moe_imbalance(catalog, strategy.ep)
    moe = layer.moe_shape
    return capacity.load_ratio(microbatch_tokens(job, strategy), moe.top_k, moe.num_experts)


def grouped_gemm_efficiency(device: DeviceSpec, job: Job) -> float:
    """The routed experts' GEMM rate over the device's GEMM curve at the same size: the runtime's grouped-GEMM kernel
    as measured on that device (hardware/data/grouped_gemm.yaml), 1 where it is not.  The measurements are bf16
    (torch._grouped_mm); scaled fp8 / mxfp8 grouped GEMMs are other kernels (torchao's _scaled_grouped_mm, TE's
    fp8 GroupedLinear), unmeasured here, so they keep the curve."""
    if job.precision != "bf16":
        return 1.0
    value = load_kernel_table("grouped_gemm").lookup(device.name, (job.runtime.kernels.grouped_gemm,))
    return 1.0 if value is None else value


def moe_gemm_seconds(layer: Layer, job: Job, strategy: Strategy, device: DeviceSpec, catalog: Catalog) -> float:
    """Forward GEMM seconds of a MoE layer on the busiest rank for one micro-batch.

    Routed experts: a rank computes top_k expert passes for each of its tokens (its sequence shard under
    tensor parallelism; the same FLOPs when each expert is instead split over etp ranks), as grouped GEMMs
    whose rows are one expert's tokens: tokens x top_k x etp x ep / (experts x tp), the same for any etp, at the
    grouped-GEMM kernel's rate (`grouped_gemm_efficiency`).  The router and the shared experts run over all the
    rank's tokens, as dense GEMMs."""
    moe, tokens, tp = layer.moe_shape, microbatch_tokens(job, strategy), tp_divisor(layer, strategy.tp)
    per_expert = expert_flops_per_token(layer)
    routed_flops = tokens * moe.top_k * per_expert / tp * expert_load_ratio(layer, job, strategy, catalog)
    expert_tokens = tokens * moe.top_k * strategy.expert_tp * strategy.ep / (moe.num_experts * tp)
    one_gemm = expert_tokens * per_expert / strategy.expert_tp / GEMMS_PER_LAYER
    seconds = routed_flops / (gemm_rate(device, job, one_gemm, catalog) * grouped_gemm_efficiency(device, job))
    dense_flops = tokens * (layer.flops_per_token - moe.top_k * per_expert) / tp
    if dense_flops:
        seconds += dense_flops / gemm_rate(device, job, dense_flops / GEMMS_PER_LAYER, catalog)
    return seconds


def weight_grad_seconds(gemm_s: float, catalog: Catalog) -> float:
    """The weight-gradient GEMMs' seconds of a layer whose forward GEMMs take `gemm_s`: the part of its backward
    a zero-bubble schedule runs as a W pass of its own (Qi et al. 2023, arXiv 2401.10241).  Of
    `backward_gemm_ratio` (a data- and a weight-gradient GEMM per forward GEMM), the data gradient runs at the
    forward's speed (1) and the weight gradient takes the rest, the constant's own account of why it exceeds 2
    (hardware/data/constants.yaml); the attention core and the element-wise kernels hold no weights."""
    return (catalog.constant("backward_gemm_ratio") - 1.0) * gemm_s


def backward_seconds(gemm_s: float, attn_s: float, elementwise_s: float, flash: bool, catalog: Catalog) -> float:
    """Backward seconds of a layer whose forward spends these seconds on GEMMs, the attention core and
    element-wise kernels."""
    gemm = catalog.constant("backward_gemm_ratio")
    attention = catalog.constant("flash_attention_backward_ratio") if flash else gemm
    return gemm * gemm_s + attention * attn_s + catalog.constant("backward_elementwise_ratio") * elementwise_s
