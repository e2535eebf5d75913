"""A training job: what to train, where, and on how much data per step."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from hardware import Catalog, Cluster, load_catalog
from hardware.catalog import Dtype
from models.graph import ModelGraph
from planner.profile import RuntimeProfile, load_runtime
from planner.routing.stats import RoutingStats

if TYPE_CHECKING:
    from planner.routing.placement import PlacementSummary

Precision = Literal["bf16", "fp16", "fp8", "mxfp8"]
FP8_PRECISIONS = ("fp8", "mxfp8")  # the precisions whose GEMMs run in FP8 (Job.fp8)
MoeRouting = Literal["learned", "balanced"]
# batch and sequence length at most 2**31 - 1: the search scales times and counts to 64-bit integers, which
# a batch of 1e20 sequences overflows
MAX_COUNT = 2**31 - 1


class Job(BaseModel):
    """Model x cluster x batch: the fixed inputs every strategy is scored on."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model: ModelGraph = Field(description="The model graph.")
    cluster: Cluster = Field(description="The hardware topology.")
    global_batch: int = Field(gt=0, le=MAX_COUNT, strict=True,
                              description="Sequences (samples for recsys) per optimizer step.")
    seq_len: int = Field(gt=0, le=MAX_COUNT, strict=True, description="Tokens per sequence (1 for recsys models).")
    attention_span: float | None = Field(
        None, gt=0,
        description="Keys each token attends over on average, as the attention term counts them: for a row of "
        "seq_len tokens packed from documents of lengths L_i under a document mask (variable-length flash "
        "kernels), sum(L_i^2) / seq_len (planner.data).  None: seq_len (the row is one sequence).",
    )
    precision: Precision = Field(
        "bf16", description="Compute precision: bf16/fp16 mixed precision, fp8 GEMMs with bf16 elsewhere, or mxfp8: "
        "block-scaled FP8 GEMMs (OCP MX, 32-element blocks with E8M0 scales) on devices whose tensor cores run them "
        "(DeviceSpec.scaled_formats: Blackwell)."
    )
    fp8_params: bool = Field(
        False, description="FP8 primary weights (Megatron --fp8-param-gather, Transformer Engine fp8_model_init, "
        "NeMo's fp8_param_gather / MLPerf's FP8_PARAMS): the parameters are FP8 tensors, so the runtime keeps no "
        "separate FP8 weight copies (Kernels.fp8_weight_copy_bytes).  Only with --precision fp8 or mxfp8.")
    optimizer: Literal["adam"] = Field("adam", description="Optimizer (Adam, mixed-precision states).")
    flash_attention: bool = Field(
        True, description="Fused flash attention (no s^2 score tensors); False for 2021-22 era kernels."
    )
    fused_kernels: bool = Field(
        True,
        description="Element-wise work may run in fused kernels (Megatron/Transformer Engine fusions or "
        "torch.compile) where the runtime has them; False forces eager PyTorch's unfused kernels.",
    )
    moe_routing: MoeRouting = Field(
        "learned",
        description="How MoE tokens spread over the expert-parallel ranks: learned (the router's own choice, "
        "the busiest rank getting constants.yaml's moe_routing_imbalance times the mean) or balanced (evenly: "
        "Megatron --moe-router-force-load-balancing, NeMo AutoModel's fake balanced gate, or tokens padded "
        "and dropped to a capacity factor of 1, as published MoE benchmarks run).",
    )
    routing: RoutingStats | None = Field(
        None,
        description="Measured or synthetic per-layer expert loads (`--routing FILE`): the expert placement with "
        "replicas is solved per expert-parallel degree and its busiest rank replaces moe_routing_imbalance.",
    )
    expert_placement_policy: Literal["planner", "eplb", "contiguous"] = Field(
        "planner",
        description="Whose expert placement the routing statistics are costed under: planner's program, DeepSeek's "
        "EPLB on the same redundant slots, or Megatron's contiguous order without replicas (the baselines).",
    )
    memory_margin: float = Field(
        0.0, ge=0.0, lt=1.0,
        description="Share of every GPU's HBM a plan must leave free: the cost model's memory error (the command "
        "line's compile default is the bench's measured median error, docs/cost-model.md).",
    )
    runtime: RuntimeProfile = Field(
        default_factory=load_runtime,
        description="The framework that runs the job (planner/profile/): its memory layout, overlap, kernels "
        "and the strategies it can express.  Default: the reference runtime (every strategy expressible; the "
        "command line defaults to planner's own torch runtime).",
    )

    @field_validator("seq_len")
    @classmethod
    def _one_sample_per_sequence(cls, seq_len: int, info: ValidationInfo) -> int:
        # a recommendation model's "token" is a sample: seq_len > 1 would silently scale its dense layers
        model = info.data.get("model")
        if model is not None and model.family == "recsys" and seq_len != 1:
            raise ValueError(f"{model.name} is a recommendation model: --seq-len must be 1, got {seq_len} "
                             "(a sample is one token; --batch counts samples)")
        return seq_len

    @field_validator("routing")
    @classmethod
    def _routing_fits_model(cls, routing: RoutingStats | None, info: ValidationInfo) -> RoutingStats | None:
        if routing is None:
            return routing
        if info.data.get("moe_routing") == "balanced":
            raise ValueError("routing statistics with moe_routing balanced: forced balanced routing ignores them; "
                             "give one or the other")
        model = info.data.get("model")
        problem = routing.problem_with(model) if model is not None else None
        if problem is not None:
            raise ValueError(problem)
        return routing
    @field_validator("attention_span")
    @classmethod
    def _span_within_row(cls, span: float | None, info: ValidationInfo) -> float | None:
        # a packed row's documents are at most the row long, so sum(L^2)/sum(L) <= seq_len
        seq_len = info.data.get("seq_len")
        if span is not None and seq_len is not None and span > seq_len * (1 + 1e-9):
            raise ValueError(f"attention_span {span:g} exceeds seq_len {seq_len}: a document is at most a row long")
        return span

    @field_validator("fp8_params")
    @classmethod
    def _fp8_params_need_fp8(cls, fp8_params: bool, info: ValidationInfo) -> bool:
        precision = info.data.get("precision")
        if fp8_params and precision not in FP8_PRECISIONS:
            raise ValueError(f"--fp8-params keeps the weights in FP8 and needs --precision fp8 or mxfp8, "
                             f"not {precision}")
        return fp8_params

    @field_validator("precision")
    @classmethod
    def _precision_needs_hardware(cls, precision: str, info: ValidationInfo) -> str:
        # the cost model would score fp8 GEMMs at the bf16 rate, and bf16 at V100's and T4's fp16 rate, while the
        # plan and its launch files (ds_config.json's bf16 section) say a datatype the GPUs do not have
        cluster = info.data.get("cluster")
        if precision == "fp16" or cluster is None:
            return precision
        if precision == "mxfp8":
            return _block_scaled_hardware(precision, cluster)
        for pool in cluster.pools:
            have = pool.device_spec().peak_flops
            if precision not in have:
                instead = "bf16" if precision == "fp8" and "bf16" in have else "fp16"
                raise ValueError(f"--precision {precision} needs {precision} hardware: device {pool.node.device} "
                                 f"(pool {pool.name}) has none in the hardware catalog; use --precision {instead}")
        return precision

    def on(self, runtime: RuntimeProfile | None) -> "Job":
        """This job as `runtime` runs it (itself when `runtime` is None or already its runtime)."""
        if runtime is None or runtime == self.runtime:
            return self
        return self.model_copy(update={"runtime": runtime})

    @property
    def flash(self) -> bool:
        """Fused flash attention in effect: the job allows it and the runtime has it."""
        return self.flash_attention and self.runtime.kernels.flash_attention

    @property
    def fused(self) -> bool:
        """Fused element-wise kernels in effect: the job allows them and the runtime has them."""
        return self.fused_kernels and self.runtime.kernels.fused_elementwise

    @property
    def attended(self) -> float:
        """Keys each token attends over in the attention term: attention_span, else seq_len."""
        return self.seq_len if self.attention_span is None else self.attention_span

    @property
    def tokens_per_step(self) -> int:
        """Tokens (or samples) processed per optimizer step."""
        return self.global_batch * self.seq_len

    def moe_imbalance(self, catalog: Catalog, ep: int) -> float:
        """Tokens of the busiest of `ep` expert-parallel ranks over the mean: 1 when routing is balanced, the
        placement's ratio under routing statistics, else constants.yaml's moe_routing_imbalance."""
        if self.moe_routing == "balanced":
            return 1.0
        placed = self.expert_placement(ep)
        if placed is None:
            return catalog.constant("moe_routing_imbalance")
        return {"planner": placed.max_load_ratio, "eplb": placed.eplb_max_load_ratio,
                "contiguous": placed.contiguous_max_load_ratio}[self.expert_placement_policy]

    def expert_placement(self, ep: int) -> "PlacementSummary | None":
        """The experts' placement on `ep` ranks from the routing statistics (None without them).  EPLB's
        hierarchical policy sees the NVLink domains an expert-parallel group spans (ep // GPUs per domain, when
        whole: a node, or a GB200 NVL72 rack)."""
        if self.routing is None or not self.model.num_experts:
            return None
        from planner.routing.placement import placement_summary  # CP-SAT loads only for routed jobs

        gpn = min(pool.nvlink_domain_gpus for pool in self.cluster.pools)
        nodes = ep // gpn if ep > gpn and ep % gpn == 0 else 1
        return placement_summary(self.routing, self.model.num_experts, ep, nodes)

    def expert_slots_factor(self, ep: int) -> float:
        """Expert slots a rank holds over its share of the model's experts (1 without redundant slots)."""
        placed = self.expert_placement(ep) if ep > 1 else None
        if placed is None or self.expert_placement_policy == "contiguous":
            return 1.0
        return placed.slots_per_rank * ep / self.model.num_experts

    def replicated_slots(self, ep: int) -> int:
        """Most slots of one of `ep` ranks holding experts with several replicas, under the policy's placement."""
        placed = self.expert_placement(ep) if ep > 1 else None
        if placed is None or self.expert_placement_policy == "contiguous":
            return 0
        if self.expert_placement_policy == "eplb":
            return placed.eplb_replicated_slots_per_rank
        return placed.replicated_slots_per_rank

    @property
    def fp8(self) -> bool:
        """Whether the job's GEMMs run in FP8 (precision fp8 or mxfp8)."""
        return self.precision in FP8_PRECISIONS

    @property
    def compute_dtype(self) -> Dtype:
        """Datatype of non-GEMM work and of attention (fp8 and mxfp8 runs keep bf16 there)."""
        if self.precision == "fp16":
            return "fp16"
        return "bf16"  # bf16, and fp8 / mxfp8 runs outside their GEMMs


def _block_scaled_hardware(precision: str, cluster: Cluster) -> str:
    """`precision` (a block-scaled format) when every pool's GPU runs it natively, else ValueError naming the devices
    that do (the cost model would price MX GEMMs the hardware emulates, and the launch files ask for a recipe
    Transformer Engine refuses below compute capability 10.0)."""
    for pool in cluster.pools:
        if precision not in pool.device_spec().scaled_formats:
            able = sorted(name for name, d in load_catalog().devices.items() if precision in d.scaled_formats)
            raise ValueError(f"--precision {precision} needs block-scaled FP8 tensor cores: device {pool.node.device} "
                             f"(pool {pool.name}) has none; devices that run it: {', '.join(able)} "
                             "(use --precision fp8 elsewhere)")
    return precision
