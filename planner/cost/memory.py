"""Memory per stage: model states, activations in flight, buffers, host tiers.

* Model states as the job's runtime lays them out (`RuntimeProfile.states`,
  hardware/data/runtimes/*.yaml): each per-parameter term (16-bit weights,
  fp32 gradients, master weights, Adam moments...) with the ZeRO stage from
  which the framework shards it; offload moves the optimizer terms (and with
  ZeRO-3 the weights) to host DRAM or NVMe.
* Activations: per-layer saved bytes (Korthikanti et al. 2022) times the
  micro-batches a stage holds in flight: 1F1B stage i of p keeps min(p-i, m);
  interleaved keeps p + (p-1)/v stage-equivalents on the first stage
  (Megatron's warm-up count); GPipe keeps all m; zbv p and dualpipev p + 1/2 on every
  stage (their V keeps 2p and 2p + 1 chunk halves in flight, counted off torch's orders).  Full recompute keeps the
  layer inputs plus one layer's full working set.
* Sharded weights gathered for compute (`RuntimeProfile.gathering`): the
  running and prefetched layer, a whole micro-batch's worth, or the whole
  stage for the step (torchtitan's FSDP under pipeline parallelism); a fixed
  reserve (context, NCCL, workspaces) and fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware import Catalog, DeviceSpec
from models.graph import Layer, LayerKind, RecomputeMode
from planner.cost.layout import StageSite, group_ranks_per_node, microbatch_tokens, shard_degree, tp_divisor
from planner.cost.sums import StageSums
from planner.job import Job
from planner.profile import Activations, Autocast, Gather, GatherUnits, LossBytes, SavedTensor, SaveWidth
from planner.strategy import Strategy


WEIGHT_BYTES = 2.0  # 16-bit weights and activations on the wire (bf16/fp16; fp8 runs keep bf16 weights)
GRAD_BYTES = 2.0  # 16-bit gradients (embedding tables' dense gradients)
# layers whose weights feed matmuls (what native AMP casts)
MATMUL_KINDS = (LayerKind.ATTENTION, LayerKind.MLP, LayerKind.MOE, LayerKind.HEAD, LayerKind.DENSE)
ROUTER_LOGIT_BYTES = 4.0  # the model graph's MoE layer saves fp32 router logits per expert (models/transformer.py _moe)
GRAPH_LOGIT_BYTES = 4.0  # the model graph's head counts its logits as fp32 saved bytes (act_tp_split = 4 x vocab)


@dataclass(frozen=True)
class RankMemory:
    """Bytes one GPU of a stage holds, by kind, and what its node's host holds."""

    stage: int
    params: float  # parameters resident per rank (count, after tp/ep split)
    weights: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    reserve: float
    capacity: float  # HBM the rank may use: the device's less the job's memory margin
    host_offload: float  # bytes this rank parks in host DRAM
    nvme_offload: float  # bytes this rank parks on NVMe
    host_capacity: float  # usable host DRAM per rank (the node's, shared by its GPUs)
    nvme_capacity: float  # NVMe per rank
    grads_after_peak: float = 0.0  # of `grads`, the bytes the runtime allocates only after the step's peak

    @property
    def total(self) -> float:
        """HBM bytes in use at the peak."""
        return (self.weights + self.grads - self.grads_after_peak + self.optimizer + self.activations + self.buffers
                + self.reserve)

    @property
    def fits_hbm(self) -> bool:
        """Whether the peak fits the device's HBM."""
        return self.total <= self.capacity

    @property
    def fits_host(self) -> bool:
        """Whether the rank's share of host DRAM and NVMe holds what is placed there."""
        return self.host_offload <= self.host_capacity and self.nvme_offload <= self.nvme_capacity

    @property
    def fits(self) -> bool:
        """Whether HBM, and the rank's share of host DRAM and NVMe, all hold what is placed there."""
        return self.fits_hbm and self.fits_host


def routed_expert_params(layer: Layer) -> float:
    """Parameters of a MoE layer's routed experts (all of them; 0 for other layers)."""
    if layer.kind != LayerKind.MOE or layer.moe is None:
        return 0.0
    per_expert = (layer.params - layer.touched_params) / max(1, layer.moe.num_experts - layer.moe.top_k)
    return per_expert * layer.moe.num_experts


def expert_params_per_rank(layer: Layer, strategy: Strategy, job: Job) -> float:
    """Routed-expert parameters of `layer` one rank holds: the experts spread over ep ranks, each split etp ways,
    and the replicas of its redundant slots (routing statistics: weights, gradients and optimizer states alike)."""
    if layer.moe is None or not layer.tp_splittable:
        return 0.0
    return routed_expert_params(layer) / (strategy.expert_tp * strategy.ep) * job.expert_slots_factor(strategy.ep)


def replica_params_per_rank(layer: Layer, strategy: Strategy, job: Job) -> float:
    """Routed-expert parameters of `layer` one rank holds in slots of replicated experts (routing statistics'
    placement; 0 without): their gradients are all-reduced among the replicas each step."""
    if layer.moe is None or not layer.tp_splittable or strategy.ep == 1:
        return 0.0
    return routed_expert_params(layer) / layer.moe.num_experts / strategy.expert_tp * job.replicated_slots(strategy.ep)


def layer_params_per_rank(layer: Layer, strategy: Strategy, job: Job) -> float:
    """Parameters of `layer` one rank holds before ZeRO sharding: tensor parallelism splits all but
    the replicated ones (norms, row-parallel biases, routers); routed experts are split over etp x ep."""
    tp = tp_divisor(layer, strategy.tp)
    replicated = layer.tp_replicated_params if tp > 1 else 0
    if layer.kind == LayerKind.MOE and layer.moe is not None:
        routed = routed_expert_params(layer)
        dense = layer.params - routed - replicated
        return dense / tp + expert_params_per_rank(layer, strategy, job) + replicated
    return (layer.params - replicated) / tp + replicated


def expert_shard_degree(strategy: Strategy, shard: int) -> int:
    """Ranks the routed experts' ZeRO-sharded states spread over: the expert data-parallel ranks inside the
    sharding group (Megatron's distributed optimizer shards expert parameters over the expert-data-parallel
    group, tp x cp x dp / (etp x ep) ranks)."""
    return max(1, shard * strategy.tp // (strategy.expert_tp * strategy.ep))


def in_flight_microbatches(strategy: Strategy, stage: int, micro_batches: int) -> float:
    """Stage-equivalents of activations a stage holds at its peak."""
    p, m = strategy.pp, micro_batches
    schedule = strategy.pipeline_schedule
    if schedule == "gpipe":
        return float(m)
    if schedule == "zbv":  # 2p chunk halves from warm-up until their W (torch ScheduleZBVZeroBubble's order)
        return float(min(p, m))
    if schedule == "dualpipev":  # 2p + 1 chunk halves (torch ScheduleDualPipeV; DualPipe's README: PP + 1)
        return p + 0.5
    if schedule == "interleaved":
        v = strategy.vpp
        warmup_chunks = (p - stage - 1) * 2 + (v - 1) * p + 1
        return min(warmup_chunks, m * v) / v
    return float(min(p - stage, m))


def logits_per_microbatch(layer: Layer, job: Job, strategy: Strategy) -> float:
    """Logits (token x vocabulary entry) one rank of the head computes per micro-batch: the vocabulary split by
    tensor parallelism (vocab-parallel head and loss), the tokens by context parallelism.  The graph's head
    declares its logits as fp32 saved bytes (`act_tp_split`, models/transformer.py `_head`)."""
    tp = strategy.tp if layer.tp_splittable and not job.runtime.loss.gathers_vocab else 1
    return microbatch_tokens(job, strategy) * layer.act_tp_split / GRAPH_LOGIT_BYTES / tp


def loss_bytes(layer: Layer, job: Job, strategy: Strategy) -> LossBytes:
    """Bytes per logit of the runtime's loss on the head `layer`: vocab-parallel when tensor parallelism splits it."""
    return job.runtime.loss.bytes(strategy.tp if layer.tp_splittable else 1, microbatch_tokens(job, strategy))


def head_in_flight(strategy: Strategy, micro_batches: int) -> float:
    """Micro-batches whose loss (on the last stage's head) holds its saved bytes at once: the last stage runs
    each micro-batch's backward right after its forward under 1F1B and interleaved schedules (the last virtual
    stage starts the backward), so one; GPipe runs every forward first, so all m."""
    return float(micro_batches) if strategy.pipeline_schedule == "gpipe" else float(min(1, micro_batches))


def saved_bytes(layer: Layer, job: Job, strategy: Strategy, recompute: RecomputeMode) -> float:
    """Activation bytes one rank saves for `layer` per micro-batch under `recompute`; the head keeps its input
    and what the runtime's loss keeps of the logits (`RuntimeProfile.loss`)."""
    tp = strategy.tp if layer.tp_splittable else 1
    sp = strategy.sequence_parallel and layer.tp_splittable
    extra = 0.0
    if layer.kind == LayerKind.HEAD:
        # the graph's head saves its input and fp32 logits (act_tp_split); the runtime says what its loss keeps
        extra = logits_per_microbatch(layer, job, strategy) * loss_bytes(layer, job, strategy).saved
        layer = layer.model_copy(update={"act_tp_split": 0.0})
    if recompute != "full":  # a recomputed layer's forward saves nothing, its copies come back with the recompute
        extra += autocast_copy_bytes(layer, job, strategy) + padded_expert_bytes(layer, job, strategy)
    selective = job.runtime.selective
    if recompute == "selective" and selective is not None and layer.kind in selective.saved:
        return sum(saved_tensor_bytes(t, layer, job, strategy, compute_bytes(job))
                   for t in selective.saved[layer.kind]) + extra
    activations = job.runtime.activations
    if activations is not None and layer.kind in activations.layers:
        return sum(saved_tensor_bytes(t, layer, job, strategy, activations.compute_bytes)
                   for t in profile_saves(layer, job, strategy, recompute, activations)) + extra
    return layer.saved_activation_bytes(
        strategy.mbs, job.seq_len, tp=tp, sequence_parallel=sp,
        recompute=recompute, flash_attention=job.flash, fp8_inputs=fp8_saved_inputs(job),
    ) / strategy.cp + extra


def fp8_saved_inputs(job: Job) -> bool:
    """Whether the job's GEMM inputs are kept in FP8 for the backward (an FP8 run under a runtime that does so)."""
    return job.fp8 and job.runtime.kernels.fp8_saved_inputs


# the widths a MoE layer's saves are counted in (`SavedTensor.width`: per routed token or per expert)
MOE_WIDTHS = ("experts", "routed", "routed_hidden", "routed_expert_ffn", "shared_ffn")

# the transposed half of a cached FP8 weight copy (Kernels.fp8_weight_copy_bytes counts data and transpose)
FP8_TRANSPOSE_BYTES = 1.0


def fp8_weight_copy_bytes(job: Job, strategy: Strategy, device: DeviceSpec) -> float:
    """Bytes per parameter of the FP8 weight copies kept between micro-batches: an FP8 run of 16-bit parameters
    under a runtime that caches them (Kernels.fp8_weight_copy_bytes).  FP8 parameters are those copies; Megatron
    takes them (--fp8-param-gather) only with its distributed optimizer or FSDP (zero >= 1), so a zero-0 plan
    keeps 16-bit weights and their copies.  Per-tensor FP8 on a device whose FP8 GEMMs take any layout keeps no
    transpose (Transformer Engine creates it only where nvte_is_non_tn_fp8_gemm_supported is false); MXFP8 keeps
    both, its row- and column-wise blocks being scaled apart."""
    if not job.fp8 or (job.fp8_params and strategy.zero >= 1):
        return 0.0
    copies = job.runtime.kernels.fp8_weight_copy_bytes
    if copies and job.precision == "fp8" and device.fp8_gemm_any_layout:
        return copies - FP8_TRANSPOSE_BYTES
    return copies


def padded_expert_bytes(layer: Layer, job: Job, strategy: Strategy) -> float:
    """What a capacity-padded MoE layer (DeepSpeed-MoE: `RuntimeProfile.expert_capacity`) saves beyond the model
    graph's routed tokens: its experts keep their activations for every slot of the padded buffer, capacity x
    experts rows where the graph counts tokens x top_k (the graph's MoE saves are the visited experts' MLP
    activations plus the fp32 router logits)."""
    capacity = job.runtime.expert_capacity
    if capacity is None or layer.moe is None:
        return 0.0
    moe = layer.moe
    tokens = microbatch_tokens(job, strategy)
    ratio = capacity.load_ratio(tokens, moe.top_k, moe.num_experts)
    experts = layer.act_tp_split - ROUTER_LOGIT_BYTES * moe.num_experts
    routed = experts * moe.top_k / (moe.top_k + moe.shared_experts)
    return tokens * (ratio - 1.0) * routed / (strategy.tp if layer.tp_splittable else 1)


def compute_bytes(job: Job) -> float:
    """Bytes of a `compute` save (`SavedTensor.dtype`): the runtime's activations section's, else 16-bit."""
    activations = job.runtime.activations
    return activations.compute_bytes if activations is not None else WEIGHT_BYTES


def selective_rematerialised_bytes(layer: Layer, job: Job, strategy: Strategy) -> float:
    """What a block layer's backward re-materialises under the runtime's own selective recompute
    (`RuntimeProfile.selective`, torchtitan's per-op SAC): the saves it would keep without recompute less those
    the policy kept (they are handed back, not recomputed); 0 under Megatron's selective recompute."""
    if job.runtime.selective is None or layer.kind not in job.runtime.selective.saved:
        return 0.0
    return max(0.0, saved_bytes(layer, job, strategy, "none") - saved_bytes(layer, job, strategy, "selective"))


def autocast(job: Job, strategy: Strategy) -> Autocast | None:
    """The runtime's torch.autocast saves where they apply: a 16-bit run at a ZeRO stage it runs under autocast."""
    activations = job.runtime.activations
    if activations is None or activations.autocast is None:
        return None
    rule = activations.autocast
    if activations.compute_bytes >= 4.0 or strategy.zero >= rule.below_zero:
        return None
    return rule


def profile_saves(layer: Layer, job: Job, strategy: Strategy, recompute: RecomputeMode,
                  activations: Activations) -> tuple[SavedTensor, ...]:
    """The tensors the runtime's activations section (`activations`) lists for `layer` under `recompute` (and
    autocast)."""
    saves = activations.layers[layer.kind]
    rule = autocast(job, strategy)
    if recompute == "full":
        return rule.checkpointed.get(layer.kind, saves.checkpointed) if rule else saves.checkpointed
    return saves.saved + (rule.saved.get(layer.kind, ()) if rule else ())


def layer_width(layer: Layer, width: SaveWidth, seq_len: int) -> float:
    """The size `width` names, read off `layer` (`SavedTensor.width`)."""
    if width == "one":
        return 1.0
    if width == "hidden":
        return float(layer.hidden)
    if width == "seq_len":
        return float(seq_len)
    if width == "gated_ffn":  # w1, w3 (hidden x ffn) and w2 (ffn x hidden), no biases: the norm is replicated
        return (layer.params - layer.tp_replicated_params) / (3.0 * layer.hidden)
    if width in MOE_WIDTHS:
        moe = layer.moe_shape
        return float({"experts": moe.num_experts, "routed": moe.top_k, "routed_hidden": moe.top_k * layer.hidden,
                      "routed_expert_ffn": moe.top_k * moe.expert_ffn,
                      "shared_ffn": moe.shared_experts * moe.expert_ffn}[width])
    shape = layer.attention
    if shape is None:
        raise ValueError(f"{layer.name}: a saved tensor of width {width} needs an attention layer")
    return float({"heads": shape.heads, "head_dim": shape.head_dim, "q_width": shape.heads * shape.head_dim,
                  "kv_width": shape.kv_heads * shape.head_dim}[width])


def saved_tensor_bytes(tensor: SavedTensor, layer: Layer, job: Job, strategy: Strategy,
                       compute_bytes: float) -> float:
    """Bytes one rank keeps of `tensor` for `layer` per micro-batch (`RuntimeProfile.activations`)."""
    cp = strategy.cp
    if (tensor.cp_only and cp == 1) or (tensor.sp_only and not strategy.sequence_parallel):
        return 0.0
    # the split is the runtime's (the final norm runs on sequence shards though the graph calls it unsplittable)
    tp = strategy.tp
    divisor = {"none": 1, "tp": tp, "sp": tp if strategy.sequence_parallel else 1}[tensor.split]
    count = job.seq_len / cp * (strategy.mbs if tensor.per == "token" else 1)
    dtype = compute_bytes if tensor.dtype == "compute" else 4.0
    gathered = cp if tensor.cp_gathered else 1
    return count * tensor.elements * layer_width(layer, tensor.width, job.seq_len) * dtype * gathered / divisor


def autocast_copy_bytes(layer: Layer, job: Job, strategy: Strategy) -> float:
    """The 16-bit weight copies native AMP casts for `layer`'s matmuls and autograd saves for its backward, per
    micro-batch on one rank (`Kernels.autocast_weight_copy_bytes`): the projections of attention and MLP blocks
    and the head's (tied or own) output matrix; embeddings are looked up and norms run in fp32 uncast."""
    rule = autocast(job, strategy)
    per_param = rule.weight_copy_bytes if rule else job.runtime.kernels.autocast_weight_copy_bytes
    if not per_param or layer.kind not in MATMUL_KINDS:
        return 0.0
    tied = layer.tied_params / (strategy.tp if layer.tp_splittable else 1)
    return (layer_params_per_rank(layer, strategy, job) + tied) * per_param


def transient_bytes(layer: Layer, job: Job, strategy: Strategy) -> float:
    """Bytes the loss's backward (on the head `layer`) holds on top of what is kept, per micro-batch on one rank:
    the copies and gradients of the logits it allocates (`RuntimeProfile.loss`); 0 for other layers (a
    recomputed block's working set is `StageSums.backward_extra`'s)."""
    if layer.kind == LayerKind.HEAD:
        return logits_per_microbatch(layer, job, strategy) * loss_bytes(layer, job, strategy).transient
    return 0.0


def backward_transient_bytes(layer: Layer, job: Job, strategy: Strategy) -> float:
    """The activation gradients `layer`'s backward holds at once on top of what is saved, per micro-batch on one
    rank (`LayerSaves.backward`; 0 where the runtime's activations section does not list them)."""
    activations = job.runtime.activations
    if activations is None or layer.kind not in activations.layers:
        return 0.0
    return sum(saved_tensor_bytes(t, layer, job, strategy, activations.compute_bytes)
               for t in activations.layers[layer.kind].backward)


def resaved_checkpoint_bytes(layer: Layer, job: Job, strategy: Strategy) -> float:
    """Of the checkpoint `layer` keeps under full recompute, the bytes its block's recomputed forward saves as
    the very same storage (`SavedTensor.resaved`): counted once in the block's working set.  The model graph's
    count keeps the block's 16-bit input, which the recomputed norm saves as it is."""
    activations = job.runtime.activations
    if activations is None or layer.kind not in activations.layers:
        return saved_bytes(layer, job, strategy, "full")
    same = activations.compute_bytes == 4.0  # an fp32 upcast of an fp32 tensor is the tensor itself
    return sum(saved_tensor_bytes(t, layer, job, strategy, activations.compute_bytes)
               for t in profile_saves(layer, job, strategy, "full", activations) if t.resaved == "same" or same)


def pipeline_output_bytes(layer: Layer, job: Job, strategy: Strategy) -> float:
    """Bytes of one micro-batch's logits the last stage keeps for the step when a pipeline schedule returns its
    outputs (`Loss.pipeline_outputs`); 0 without pipeline parallelism or for layers other than the head."""
    if layer.kind != LayerKind.HEAD or not strategy.pipelined:
        return 0.0
    return logits_per_microbatch(layer, job, strategy) * job.runtime.loss.pipeline_outputs


def receive_buffer_bytes(job: Job, strategy: Strategy, stage: int, micro_batches: int, hidden: float) -> float:
    """Receive buffers a stage's rank holds for the step where the runtime allocates one per micro-batch
    (`Pipelining.receive_buffers`): the boundary activation (split by sequence and context parallelism) per
    micro-batch, for each model chunk's incoming activations and incoming gradients; the first virtual stage
    receives no activations and the last no gradients."""
    if job.runtime.pipelining.receive_buffers != "per_microbatch" or not strategy.pipelined:
        return 0.0
    p, v = strategy.pp, strategy.vpp if strategy.pipeline_schedule == "interleaved" else 1
    directions = 2 * v - (stage == 0) - (stage == p - 1)
    activations = job.runtime.activations
    width = activations.compute_bytes if activations is not None else WEIGHT_BYTES
    boundary = microbatch_tokens(job, strategy) * hidden * width
    if strategy.sequence_parallel:
        boundary /= strategy.tp
    return directions * micro_batches * boundary


def gathered_bytes(job: Job, strategy: Strategy, sums: StageSums, shard: int) -> float:
    """HBM of sharded weights gathered for compute (and their unsharded gradients), under the runtime's policy."""
    gathering = job.runtime.gathering
    policy = gathering.policy(strategy.zero, strategy.pipelined) if shard > 1 else None
    if gathering.units is not None and policy in ("layers", "microbatch"):
        return unit_gathered_bytes(job, sums, policy, strategy.tp, gathering.units)
    per_param = gathering.bytes_per_param + gathering.grad_bytes_per_param
    if policy == "layers":  # the running and the prefetched layer
        return 2.0 * sums.largest_layer_params * per_param
    if policy == "microbatch":  # the stage's weights through a micro-batch, one layer's gradients at a time
        return sums.params * gathering.bytes_per_param + sums.largest_layer_params * gathering.grad_bytes_per_param
    if policy == "step":  # the stage's weights and accumulated unsharded gradients for the whole step
        held = sums.params * (gathering.bytes_per_param + gathering.accumulated_grad_bytes)
        if gathering.accumulated_grad_bytes != gathering.grad_bytes_per_param:
            # each backward makes a unit's gradient in the compute dtype before adding it to the accumulator: a
            # block's with the root unit's (head and final norm; measured: memory_fidelity.py --precision bf16)
            running = sums.largest_block_params + sums.root_params - sums.embedding_params
            held += running * gathering.grad_bytes_per_param
        return held
    return 0.0


def sharded_grads_after_peak(job: Job, strategy: Strategy, shard: int) -> bool:
    """Whether the sharded gradients at rest come into being only after the step's peak: a runtime that holds
    the stage's unsharded gradients for the whole step (`Gathering` policy step: torch.distributed.pipelining
    defers FSDP2's reduce-scatter to the last micro-batch) reduce-scatters them once, at its end, and the
    optimizer's zero_grad frees them before the next step's forward.  Measured: tests/bench/memory_fidelity.py
    (pp=2 zero 1/3: no sharded gradient alive at the peak)."""
    return shard > 1 and job.runtime.gathering.policy(strategy.zero, strategy.pipelined) == "step"


def unit_gathered_bytes(job: Job, sums: StageSums, policy: Gather, tp: int, units: GatherUnits) -> float:
    """Gathered weights and unsharded gradients at their joint peak under block and root FSDP units
    (`Gathering.units`).  The root unit stays gathered for the step, with the stage's weights (microbatch) or
    besides it; its gradients wait for one reduce-scatter after the whole backward, so the head's and the final
    norm's are held throughout.  On top: during a block's backward, its gathered weights (layers: a block is
    gathered for its backward) and unsharded gradients; at the end, the embedding's gradient (the whole table
    on every tensor-parallel rank where the runtime says so), after every block's were reduce-scattered."""
    gathering = job.runtime.gathering
    w, g = gathering.bytes_per_param, gathering.grad_bytes_per_param
    block = sums.largest_block_params
    embedding_grad = sums.embedding_params * (tp if units.whole_embedding_grad_under_tp else 1)
    if policy == "microbatch":
        held, running = sums.params * w, block * g
    else:
        held, running = sums.root_params * w, block * (units.blocks_gathered * w + g)
    return held + (sums.root_params - sums.embedding_params) * g + max(running, embedding_grad * g)


def stage_memory(
    job: Job,
    strategy: Strategy,
    site: StageSite,
    sums: StageSums,
    micro_batches: int,
    catalog: Catalog,
) -> RankMemory:
    """Peak HBM and offloaded bytes of one rank of the stage at `site` holding `sums`."""
    s, runtime = strategy, job.runtime
    params = sums.params
    gpn = site.node.gpus_per_node
    shard = shard_degree(s, gpn)
    opt_shard = shard if s.zero >= 1 else 1
    terms = runtime.states
    dense, expert, expert_shard = params - sums.expert_params, sums.expert_params, expert_shard_degree(s, shard)

    def term_bytes(term) -> float:
        """One state term of the stage: dense parameters sharded over the group, routed experts over theirs (and
        an embedding the runtime keeps whole on every tensor-parallel rank)."""
        return (term.bytes(dense, s.zero, shard) + (term.bytes(expert, s.zero, expert_shard) if expert else 0.0)
                + term.whole_embedding_extra(sums.embedding_params, s.zero, s.tp))

    # each term's bytes once (the search prices a stage's memory hundreds of thousands of times)
    held = [(t, term_bytes(t)) for t in terms]
    by_kind = {"weights": 0.0, "grads": 0.0, "optimizer": 0.0}
    for t, b in held:
        by_kind[t.kind] += b
    weights, grads, optimizer = by_kind["weights"], by_kind["grads"], by_kind["optimizer"]

    host = nvme = 0.0
    if s.offloads_optimizer:
        # the offloaded share of the optimizer states and of the terms that live with them; without such a
        # term the CPU optimizer reads an fp32 gradient copy of its own
        share = s.offload_ratio
        with_optimizer = sum(b for t, b in held if t.moves_with == "optimizer")
        fp32_grads = share * (with_optimizer or params * 4.0 / opt_shard)
        grads -= share * with_optimizer
        moved = share * optimizer
        host, nvme = (moved + fp32_grads, 0.0) if s.offload_device == "cpu" else (fp32_grads, moved)
        optimizer -= moved
    if s.offloads_params:
        # the weights at rest, and the gradient shards that FSDP offloads with them
        with_params = sum(b for t, b in held if t.moves_with == "params")
        parked = weights + with_params
        if s.offload_device == "cpu":
            host += parked
        else:
            nvme += parked
        weights, grads = 0.0, grads - with_params

    if s.regather == "host" and shard > 1:
        # FCDP: the node keeps one gathered copy of the stage's weights, split over its members of the group
        host += params * WEIGHT_BYTES / group_ranks_per_node(shard, s.tp, gpn)

    in_flight = in_flight_microbatches(s, site.index, micro_batches)
    # the oldest micro-batch's backward holds the loss's gradients or a recomputed block on top of what is kept
    activations = (sums.kept_activations * in_flight + sums.head_activations * head_in_flight(s, micro_batches)
                   + sums.pipeline_outputs * micro_batches + sums.backward_extra
                   + receive_buffer_bytes(job, s, site.index, micro_batches, sums.max_hidden))

    buffers = gathered_bytes(job, s, sums, shard)
    if job.precision == "mxfp8":
        # the block scales of the MXFP8 weight copies; the FP8 data itself is costed as for fp8 runs
        buffers += params * catalog.constant("mxfp8_scale_bytes_per_param")
    buffers += params * fp8_weight_copy_bytes(job, s, site.device)
    late_grads = grads if sharded_grads_after_peak(job, s, shard) else 0.0
    allocated = weights + grads - late_grads + optimizer + activations + buffers
    reserve = catalog.constant("memory_reserve_bytes") + catalog.constant("memory_fragmentation") * allocated
    return RankMemory(
        stage=site.index, params=params, weights=weights, grads=grads, optimizer=optimizer,
        activations=activations, buffers=buffers, reserve=reserve,
        capacity=site.hbm_bytes * (1.0 - job.memory_margin),  # what a plan may use: HBM less the margin
        host_offload=host, nvme_offload=nvme,
        host_capacity=site.node.host_dram_bytes * catalog.constant("host_memory_usable_fraction") / gpn,
        nvme_capacity=site.node.nvme_bytes / gpn, grads_after_peak=late_grads,
    )
