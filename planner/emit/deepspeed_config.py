"""DeepSpeed target: what ds_config.json and pipeline.json say, and the substitutions behind them.

`Decisions` holds the DeepSpeed settings for a plan and notes what was substituted: ZeRO-2/3 under the
PipelineEngine, NVMe optimizer offload below ZeRO-3, parameter offload below ZeRO-3, and ZeRO-0 with
optimizer offload. `ds_config` writes only keys that DeepSpeedConfig accepts. Its batch arithmetic uses
the data-parallel size that DeepSpeed sees without a Megatron-style mpu: every rank without pipeline
parallelism, and world / pp under a PipelineModule, whose own mpu reports that.
"""

from __future__ import annotations

import json

from planner.emit import one_placement, optim
from planner.emit.deepspeed_moe import moe_problem, moe_section
from planner.emit.inputs import LaunchInputs
from planner.job import FP8_PRECISIONS, Job
from planner.plan.build import rank_location
from planner.plan.schema import Plan
from planner.strategy import Strategy

NVME_PATH = "/local_nvme"
STEPS_PER_PRINT = 10
DEFAULT_BUCKET = 500_000_000


class Decisions:
    """The DeepSpeed settings for a plan, and the notes on what was substituted."""

    def __init__(self, plan: Plan, job: Job) -> None:
        s = plan.single_strategy
        one_placement(plan, "deepspeed")  # one ds_config.json for every rank
        self.plan, self.job = plan, job
        self.tp, self.pp, self.dp, self.cp, self.ep = s.tp, s.pp, s.data_parallel, s.cp, s.ep
        self.mbs = s.mbs
        self.notes: list[str] = []
        self.micro_batches = plan.job.global_batch // (self.dp * self.mbs)
        if self.micro_batches * self.dp * self.mbs != plan.job.global_batch:
            raise ValueError(f"global batch {plan.job.global_batch} is not a multiple of dp({self.dp}) * "
                             f"mbs({self.mbs})")
        self.zero = self._zero_stage(s.zero)
        if job.model.num_experts and self.zero == 3:
            self.notes.append(
                "ZeRO stage 3 -> 2: DeepSpeed refuses its MoE layer under ZeRO-3 (runtime/engine.py: 'Native "
                "DeepSpeed MoE is not supported with ZeRO Stage 3'), so ds_config.json uses stage 2 (weights "
                "replicated over the data-parallel group). Per-GPU memory is higher than the plan's estimate; "
                "compile with `--target deepspeed` for a plan whose memory holds under DeepSpeed."
            )
            self.zero = 2
        self.offload_optimizer, self.offload_params = self._offload(s)
        if s.regather == "host":
            self.notes.append(
                "regather=host (FCDP host-memory parameter cache) dropped: DeepSpeed ZeRO-3 re-gathers weights "
                "over the data-parallel group, so step time is above the plan's estimate; compile with "
                "`--target deepspeed` for a plan without it."
            )

    def _zero_stage(self, planned: int) -> int:
        if self.pp > 1 and planned >= 2:
            self.notes.append(
                f"ZeRO stage {planned} -> 1: DeepSpeed's PipelineEngine (pp={self.pp}) refuses ZeRO-2/3, so "
                "ds_config.json uses stage 1 (optimizer states sharded; gradients and weights replicated over "
                "the data-parallel group). Per-GPU memory is higher than the plan's estimate; to get a plan "
                f"whose memory holds under DeepSpeed, compile with `--target deepspeed` (the search then skips "
                "ZeRO-2/3 with pipeline parallelism)."
            )
            return 1
        return planned

    def _offload(self, s: Strategy) -> tuple[str | None, str | None]:
        offload, device = s.offload, s.offload_device
        opt = device if offload in ("optimizer", "all") else None
        par = device if offload in ("params", "all") else None
        if par is not None and self.zero != 3:
            self.notes.append(
                f"Parameter offload ({par}) dropped: DeepSpeed offloads parameters only with ZeRO-3, and "
                f"ds_config.json uses ZeRO stage {self.zero}."
            )
            par = None
        if opt is not None and self.zero == 0:
            self.notes.append(
                "ZeRO stage 0 -> 1: DeepSpeed offloads the optimizer (ZeRO-Offload) only with ZeRO enabled; "
                "stage 1 is the nearest stage that does."
            )
            self.zero = 1
        if opt == "nvme" and self.zero < 3:
            self.notes.append(
                f"Optimizer offload nvme -> cpu: DeepSpeed offloads optimizer states to NVMe only with ZeRO-3 "
                f"(ZeRO-Infinity); with ZeRO stage {self.zero} they go to host DRAM (check the node has room)."
            )
            opt = "cpu"
        return opt, par

    def unsupported(self) -> str | None:
        """Why planner.runtime.deepspeed_train cannot run the plan, or None. It builds the torch runtime's model
        under the DeepSpeed engine: data parallelism and ZeRO, a PipelineModule for pp, DeepSpeed's MoE layer
        with expert parallelism for a mixture-of-experts model, and no tensor or context parallelism (the
        deepspeed runtime profile's space says the same)."""
        kinds = [f"{what} ({key}={value})" for what, key, value in (
            ("tensor parallelism", "tp", self.tp), ("context parallelism", "cp", self.cp)) if value > 1]
        if kinds:
            return (f"deepspeed: planner.runtime.deepspeed_train has no {' or '.join(kinds)}; compile with "
                    "`--target deepspeed` for a plan it can run")
        if self.ep > 1 and not self.job.model.num_experts:
            return f"deepspeed: ep={self.ep} on {self.job.model.name}, which has no experts"
        return moe_problem(self.job, self.plan.single_strategy)


# ---------------------------------------------------------------- ds_config.json


def _hidden(job: Job) -> int | None:
    hidden = getattr(job.model, "hidden", None)
    return hidden if isinstance(hidden, int) and hidden > 0 else None


def _zero_section(d: Decisions) -> dict:
    hidden = _hidden(d.job)
    bucket = hidden * hidden if hidden else DEFAULT_BUCKET  # what HF's "auto" resolves to
    section: dict = {"stage": d.zero}
    if d.zero == 0:
        return section
    section.update(overlap_comm=True, contiguous_gradients=True, reduce_bucket_size=bucket)
    if d.zero in (1, 2):
        section["allgather_bucket_size"] = bucket
    if d.zero == 3:
        section["stage3_prefetch_bucket_size"] = int(0.9 * bucket)
        section["stage3_param_persistence_threshold"] = 10 * hidden if hidden else 100_000
        if d.plan.single_strategy.shard == "node":
            per_node = _dp_ranks_per_node(d)
            if per_node > 1:
                section["zero_hpz_partition_size"] = per_node
            d.notes.append(
                f"shard=node (HSDP) -> ZeRO++ hpZ: DeepSpeed has no hybrid-sharded ZeRO-3; "
                f"`zero_hpz_partition_size: {per_node}` keeps a secondary weight shard inside each node so "
                "forward/backward all-gathers stay intra-node, while gradients and optimizer states are sharded "
                "over the whole data-parallel group."
            )
    elif d.plan.single_strategy.shard == "node":
        d.notes.append(
            f"shard=node -> full: DeepSpeed ZeRO-{d.zero} shards over the whole data-parallel group "
            "(less memory than the plan assumed, more inter-node traffic)."
        )
    section.update(_offload_sections(d))
    return section


def _offload_sections(d: Decisions) -> dict:
    """offload_optimizer and offload_param of the zero_optimization section."""
    out: dict = {}
    if d.offload_optimizer:
        opt = {"device": d.offload_optimizer, "pin_memory": True}
        ratio = d.plan.single_strategy.offload_ratio
        if ratio < 1.0 and d.zero == 3:
            opt["ratio"] = ratio  # ZeRO-Offload++: this share on CPU Adam, the rest on the GPU
        if d.offload_optimizer == "nvme":
            opt["nvme_path"] = NVME_PATH
        out["offload_optimizer"] = opt
    if d.offload_params:
        par = {"device": d.offload_params, "pin_memory": True}
        if d.offload_params == "nvme":
            par["nvme_path"] = NVME_PATH
        out["offload_param"] = par
    return out


def _dp_ranks_per_node(d: Decisions) -> int:
    """Data-parallel ranks of one (tp, cp, pp) coordinate that share the first node of stage 0."""
    stage = d.plan.stages[0]
    span = stage.ranks.spans[0]
    stride = d.tp * d.cp
    node0 = rank_location(span, span.first_rank)[0]
    count = 0
    for replica in range(d.dp):
        rank = span.first_rank + replica * stride
        if rank > span.last_rank or rank_location(span, rank)[0] != node0:
            break
        count += 1
    return max(1, count)


def recompute_per_stage(plan: Plan) -> list[int]:
    return [stage.recompute_blocks for stage in plan.stages]


def scheduler(inputs: LaunchInputs) -> dict:
    """DeepSpeed's WarmupCosineLR: a linear warmup from 0, then cosine decay to MIN_LR_RATIO of the peak. The
    step counts are written when train_steps is given; otherwise launch.sh writes them in at launch."""
    params: dict = {"warmup_min_ratio": 0.0, "warmup_type": "linear", "cos_min_ratio": optim.MIN_LR_RATIO}
    if inputs.train_steps is not None:
        params.update(total_num_steps=inputs.train_steps, warmup_num_steps=optim.warmup_steps(inputs.train_steps))
    return {"type": "WarmupCosineLR", "params": params}


def _precision(d: Decisions) -> dict:
    """The fp16 or bf16 section for the plan's precision."""
    precision = d.plan.job.precision
    if precision == "fp16":
        return {"fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                         "hysteresis": 2, "min_loss_scale": 1}}
    if precision in FP8_PRECISIONS:
        recipe = " with recipe=MXFP8BlockScaling()" if precision == "mxfp8" else ""
        d.notes.append(
            f"Precision {precision} -> bf16: DeepSpeed has no fp8 training switch in ds_config.json; the config "
            "enables bf16. For fp8 GEMMs wrap the model's linear layers with NVIDIA Transformer Engine "
            f"(`te.fp8_autocast`{recipe}) in the training script; the plan's step time assumed {precision}."
        )
    return {"bf16": {"enabled": True}}


def ds_config(d: Decisions, inputs: LaunchInputs = LaunchInputs()) -> dict:
    plan = d.plan
    cfg: dict = {
        # DeepSpeed checks train_batch_size == micro-batch x accumulation x its data-parallel size: the plan's
        # dp, which is every rank without pipeline parallelism and world / pp under a PipelineModule
        "train_batch_size": plan.job.global_batch,
        "train_micro_batch_size_per_gpu": d.mbs,
        "gradient_accumulation_steps": d.micro_batches,
        "gradient_clipping": optim.GRAD_CLIP,
        "optimizer": {"type": "AdamW", "params": {"lr": optim.LR, "betas": list(optim.BETAS), "eps": optim.EPS,
                                                  "weight_decay": optim.WEIGHT_DECAY}},
        "scheduler": scheduler(inputs),
        "steps_per_print": STEPS_PER_PRINT,
        "wall_clock_breakdown": False,
        "zero_optimization": _zero_section(d),
        **_precision(d),
    }
    if plan.single_strategy.recompute == "full":
        per_stage = recompute_per_stage(plan)
        cfg["activation_checkpointing"] = {
            "partition_activations": d.tp > 1,
            "contiguous_memory_optimization": d.tp > 1,  # DeepSpeed allows it only with partitioned activations
            "cpu_checkpointing": False,
            "number_checkpoints": max(per_stage) if per_stage else 0,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    return cfg


# ---------------------------------------------------------------- pipeline.json


def layer_specs(job: Job) -> list[str]:
    """The PipelineModule LayerSpec list the `parts` index: pre-block layers (the embedding), one entry per
    transformer block, then the post-block layers (final norm, head)."""
    pre: list[str] = []
    post: list[str] = []
    seen = False
    for layer in job.model.layers:
        if layer.block is not None:
            seen = True
            continue
        (post if seen else pre).append(layer.name)
    return pre + [f"block.{b}" for b in range(job.model.num_blocks)] + post


def pipeline_parts(plan: Plan, job: Job) -> list[int]:
    specs = layer_specs(job)
    if plan.single_strategy.pp == 1:
        return [0, len(specs)]
    first_block = specs.index("block.0") if job.model.num_blocks else 0
    parts, edge = [0], first_block
    for stage in plan.stages[:-1]:
        edge += (stage.blocks[1] - stage.blocks[0] + 1) if stage.blocks else 0
        parts.append(edge)
    parts.append(len(specs))
    return parts


def pipeline_json(d: Decisions) -> dict:
    plan, job = d.plan, d.job
    s = plan.single_strategy
    recompute = s.recompute
    per_stage = recompute_per_stage(plan)
    blocks = [stage.blocks[1] - stage.blocks[0] + 1 if stage.blocks else 0 for stage in plan.stages]
    if s.vpp > 1 or s.pipeline_schedule != "1f1b":
        d.notes.append(
            f"Schedule {s.pipeline_schedule} (vpp={s.vpp}) -> 1F1B: DeepSpeed's PipelineEngine runs only "
            "1F1B with one model chunk per stage; expect a larger pipeline bubble than the plan predicted."
        )
    if recompute == "selective":
        d.notes.append(
            "recompute=selective: DeepSpeed has no selective recompute switch, so no activation_checkpointing "
            "section is written and nothing is recomputed (more activation memory than the plan assumed)."
        )
    partial = recompute == "full" and any(count != b for count, b in zip(per_stage, blocks))
    if partial:
        d.notes.append(
            f"recompute=full on part of the blocks ({'/'.join(map(str, per_stage))} per stage): DeepSpeed applies "
            f"one activation-checkpoint count to every stage, the largest ({max(per_stage)}), so stages planned "
            "with fewer recompute more."
        )
    out = {
        "stages": d.pp,
        "parts": pipeline_parts(plan, job),
        "layers": layer_specs(job),
        "blocks_per_stage": blocks,
        "recompute_blocks_per_stage": per_stage,
        "schedule": "1F1B",
        "activation_checkpoint_interval": 1 if recompute == "full" else 0,
        "micro_batches": d.micro_batches,
        "tensor_model_parallel_size": d.tp,
        "pipeline_model_parallel_size": d.pp,
        "data_parallel_size": d.dp,
        "context_parallel_size": d.cp,
        "expert_parallel_size": d.ep,
        "sequence_parallel": s.sequence_parallel,
        "world_size": d.tp * d.cp * d.dp * d.pp,
        "rank_order": plan.rank_layout.rank_formula,
    }
    moe = moe_section(job, s)
    if moe is not None:  # a dense model's pipeline.json has no `moe`
        out["moe"] = moe
    return out


def to_json(data: dict) -> str:
    """Deterministic JSON: sorted keys, indent 2, a trailing newline."""
    return json.dumps(data, sort_keys=True, indent=2, allow_nan=False) + "\n"
