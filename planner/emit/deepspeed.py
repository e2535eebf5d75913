"""DeepSpeed launch files: ds_config.json, pipeline.json, hostfile, launch.sh, README.md.

`emit(plan, job)` turns a Plan into the files a DeepSpeed user hands to the
`deepspeed` launcher.  Where DeepSpeed cannot express what the plan chose
(ZeRO-2/3 under its PipelineEngine, NVMe optimizer offload below ZeRO-3,
interleaved schedules, fp8, tensor/context parallelism, uneven pipeline
splits) the nearest supported setting is written and the substitution is
explained in the folder's README.md: ds_config.json carries only keys that
DeepSpeedConfig accepts.  `written_strategy` reads ds_config.json and
pipeline.json back as the strategy DeepSpeed runs (planner.emit.check costs
it before anything is written).

Output is deterministic: JSON with sorted keys and indent 2, a trailing
newline, no timestamps, no absolute paths.
"""

from __future__ import annotations

import json
from collections import defaultdict

from planner.emit import one_placement
from planner.job import Job
from planner.plan.build import rank_location
from planner.plan.schema import Plan
from planner.strategy import Offload, Strategy
from planner.emit.inputs import LaunchInputs

NVME_PATH = "/local_nvme"
MASTER_PORT = 29500
STEPS_PER_PRINT = 10
DEFAULT_BUCKET = 500_000_000

OPTIMIZER = {
    "type": "AdamW",
    "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1},
}


def _json(data: dict) -> str:
    return json.dumps(data, sort_keys=True, indent=2, allow_nan=False) + "\n"


# ---------------------------------------------------------------- decisions

class _Decisions:
    """The DeepSpeed settings for a plan, and the notes on what was substituted."""

    def __init__(self, plan: Plan, job: Job) -> None:
        s = plan.strategy
        one_placement(plan, "deepspeed")  # one ds_config.json for every rank
        self.plan, self.job = plan, job
        self.tp, self.pp, self.dp, self.cp, self.ep = s.tp, s.pp, s.dp, s.cp, s.ep
        self.mbs = s.mbs
        self.notes: list[str] = []
        self.micro_batches = plan.job.global_batch // (self.dp * self.mbs)
        if self.micro_batches * self.dp * self.mbs != plan.job.global_batch:
            raise ValueError(f"global batch {plan.job.global_batch} is not a multiple of dp({self.dp}) * "
                             f"mbs({self.mbs})")
        self.zero = self._zero_stage(s.zero)
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


# ---------------------------------------------------------------- ds_config.json


def _hidden(job: Job) -> int | None:
    hidden = getattr(job.model, "hidden", None)
    return hidden if isinstance(hidden, int) and hidden > 0 else None


def _zero_section(d: _Decisions) -> dict:
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
        if d.plan.strategy.shard == "node":
            per_node = _dp_ranks_per_node(d)
            if per_node > 1:
                section["zero_hpz_partition_size"] = per_node
            d.notes.append(
                f"shard=node (HSDP) -> ZeRO++ hpZ: DeepSpeed has no hybrid-sharded ZeRO-3; "
                f"`zero_hpz_partition_size: {per_node}` keeps a secondary weight shard inside each node so "
                "forward/backward all-gathers stay intra-node, while gradients and optimizer states are sharded "
                "over the whole data-parallel group."
            )
    elif d.plan.strategy.shard == "node":
        d.notes.append(
            f"shard=node -> full: DeepSpeed ZeRO-{d.zero} shards over the whole data-parallel group "
            "(less memory than the plan assumed, more inter-node traffic)."
        )
    if d.offload_optimizer:
        opt = {"device": d.offload_optimizer, "pin_memory": True}
        ratio = d.plan.strategy.offload_ratio
        if ratio < 1.0 and d.zero == 3:
            opt["ratio"] = ratio  # ZeRO-Offload++: this share on CPU Adam, the rest on the GPU
        if d.offload_optimizer == "nvme":
            opt["nvme_path"] = NVME_PATH
        section["offload_optimizer"] = opt
    if d.offload_params:
        par = {"device": d.offload_params, "pin_memory": True}
        if d.offload_params == "nvme":
            par["nvme_path"] = NVME_PATH
        section["offload_param"] = par
    return section


def _dp_ranks_per_node(d: _Decisions) -> int:
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


def _recompute_per_stage(plan: Plan) -> list[int]:
    return [stage.recompute_blocks for stage in plan.stages]


def ds_config(d: _Decisions) -> dict:
    plan = d.plan
    cfg: dict = {
        "train_batch_size": plan.job.global_batch,
        "train_micro_batch_size_per_gpu": d.mbs,
        "gradient_accumulation_steps": d.micro_batches,
        "gradient_clipping": 1.0,
        "optimizer": json.loads(json.dumps(OPTIMIZER)),
        "steps_per_print": STEPS_PER_PRINT,
        "wall_clock_breakdown": False,
        "zero_optimization": _zero_section(d),
    }
    precision = plan.job.precision
    if precision == "fp16":
        cfg["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                       "hysteresis": 2, "min_loss_scale": 1}
    else:
        cfg["bf16"] = {"enabled": True}
        if precision == "fp8":
            d.notes.append(
                "Precision fp8 -> bf16: DeepSpeed has no fp8 training switch in ds_config.json; the config "
                "enables bf16. For fp8 GEMMs wrap the model's linear layers with NVIDIA Transformer Engine "
                "(`te.fp8_autocast`) in the training script; the plan's step time assumed fp8."
            )
    if plan.strategy.recompute == "full":
        per_stage = _recompute_per_stage(plan)
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
    pre, post, seen = [], [], False
    for layer in job.model.layers:
        if layer.block is not None:
            seen = True
            continue
        (post if seen else pre).append(layer.name)
    return pre + [f"block.{b}" for b in range(job.model.num_blocks)] + post


def pipeline_parts(plan: Plan, job: Job) -> list[int]:
    specs = layer_specs(job)
    if plan.strategy.pp == 1:
        return [0, len(specs)]
    first_block = specs.index("block.0") if job.model.num_blocks else 0
    parts, edge = [0], first_block
    for stage in plan.stages[:-1]:
        edge += (stage.blocks[1] - stage.blocks[0] + 1) if stage.blocks else 0
        parts.append(edge)
    parts.append(len(specs))
    return parts


def pipeline_json(d: _Decisions) -> dict:
    plan, job = d.plan, d.job
    s = plan.strategy
    recompute = s.recompute
    per_stage = _recompute_per_stage(plan)
    blocks = [stage.blocks[1] - stage.blocks[0] + 1 if stage.blocks else 0 for stage in plan.stages]
    if s.vpp > 1 or s.pipeline_schedule != "1f1b":
        d.notes.append(
            f"Schedule {s.pipeline_schedule} (vpp={s.vpp}) -> 1F1B: DeepSpeed's PipelineEngine runs only "
            "1F1B with one model chunk per stage; expect a larger pipeline bubble than the plan predicted."
        )
    if recompute == "selective":
        d.notes.append(
            "recompute=selective: DeepSpeed has no selective recompute switch; the model code must provide it "
            "(Megatron-DeepSpeed `--recompute-granularity selective`, or flash attention, which recomputes the "
            "attention scores). No activation_checkpointing section is written."
        )
    partial = recompute == "full" and any(count != b for count, b in zip(per_stage, blocks))
    if partial:
        d.notes.append(
            f"recompute=full on part of the blocks ({'/'.join(map(str, per_stage))} per stage): DeepSpeed's "
            "activation_checkpoint_interval checkpoints every block; to recompute only the first blocks of each "
            "stage, call deepspeed.checkpointing.checkpoint in those blocks only "
            "(Megatron-DeepSpeed `--recompute-method block --recompute-num-layers N`)."
        )
    return {
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
        "rank_order": plan.layout.rank_formula,
    }


# ---------------------------------------------------------------- hostfile, launch.sh


def node_slots(plan: Plan) -> list[tuple[int, int]]:
    """(node, GPUs used) of every node the plan uses, in rank order (the launcher numbers ranks host by host)."""
    used: dict[int, int] = defaultdict(int)
    first: dict[int, int] = {}
    for stage in plan.stages:
        for span in stage.ranks.spans:
            for rank in range(span.first_rank, span.last_rank + 1):
                node, _ = rank_location(span, rank)
                used[node] += 1
                first.setdefault(node, rank)
                first[node] = min(first[node], rank)
    return [(node, used[node]) for node in sorted(used, key=lambda n: (first[n], n))]


def hostfile(plan: Plan) -> str:
    return "".join(f"node-{node} slots={slots}\n" for node, slots in node_slots(plan))


def launch_sh(plan: Plan) -> str:
    slots = node_slots(plan)
    counts = {count for _, count in slots}
    uniform = len(counts) == 1
    gpus = slots[0][1]
    lines = [
        "#!/usr/bin/env bash",
        f"# DeepSpeed launch for {plan.job.model} on {plan.job.cluster}: {plan.strategy_spec}",
        "# Generated by planner; see README.md. Extra arguments go to the training script.",
        "set -euo pipefail",
        "",
        'train_script="${TRAIN_SCRIPT:-train.py}"',
        'if [[ -e "$train_script" ]]; then  # resolve before changing directory',
        '  train_script="$(cd "$(dirname "$train_script")" && pwd)/$(basename "$train_script")"',
        "fi",
        'cd "$(dirname "${BASH_SOURCE[0]}")"',
        "",
    ]
    if len(slots) == 1:
        lines += [
            f'exec deepspeed --num_gpus {gpus} --master_port {MASTER_PORT} "$train_script" \\',
            '  --deepspeed --deepspeed_config ds_config.json "$@"',
        ]
    else:
        gpu_flag = f"--num_gpus {gpus} " if uniform else ""
        lines += [
            "host_file=hostfile",
            'if [[ -n "${SLURM_JOB_NODELIST:-}" ]]; then',
            "  # Inside a Slurm allocation: the allocation's hosts replace the placeholders, in order.",
            '  mapfile -t hosts < <(scontrol show hostnames "$SLURM_JOB_NODELIST")',
            "  mapfile -t slots < <(awk '{print $2}' hostfile)",
            '  if (( ${#hosts[@]} < ${#slots[@]} )); then',
            '    echo "launch.sh: the plan needs ${#slots[@]} nodes, the allocation has ${#hosts[@]}" >&2',
            "    exit 1",
            "  fi",
            "  : > hostfile.slurm",
            '  for i in "${!slots[@]}"; do echo "${hosts[$i]} ${slots[$i]}" >> hostfile.slurm; done',
            "  host_file=hostfile.slurm",
            "fi",
            "",
            f'exec deepspeed --hostfile "$host_file" --num_nodes {len(slots)} {gpu_flag}'
            f'--master_port {MASTER_PORT} "$train_script" \\',
            '  --deepspeed --deepspeed_config ds_config.json "$@"',
        ]
    return "\n".join(lines) + "\n"


def _command(plan: Plan) -> str:
    slots = node_slots(plan)
    gpus = slots[0][1]
    if len(slots) == 1:
        return (f"deepspeed --num_gpus {gpus} --master_port {MASTER_PORT} train.py "
                "--deepspeed --deepspeed_config ds_config.json")
    gpu_flag = f"--num_gpus {gpus} " if len({c for _, c in slots}) == 1 else ""
    return (f"deepspeed --hostfile hostfile --num_nodes {len(slots)} {gpu_flag}--master_port {MASTER_PORT} "
            "train.py --deepspeed --deepspeed_config ds_config.json")


# ---------------------------------------------------------------- README.md


def _parallel_notes(d: _Decisions) -> None:
    if d.tp > 1 or d.cp > 1:
        what = " and ".join(x for x in (f"Tensor parallel tp={d.tp}" if d.tp > 1 else "",
                                        f"context parallel cp={d.cp}" if d.cp > 1 else "") if x)
        d.notes.append(
            f"{what[0].upper()}{what[1:]}: DeepSpeed has no built-in tensor or context "
            "parallelism for training; the model code must provide them, e.g. Megatron-DeepSpeed "
            f"`--tensor-model-parallel-size {d.tp} --pipeline-model-parallel-size {d.pp}"
            + (" --sequence-parallel" if d.tp > 1 and d.plan.strategy.sequence_parallel else "")
            + (f" --ds-sequence-parallel-size {d.cp}" if d.cp > 1 else "")
            + "`, passing its `mpu` to `deepspeed.initialize(mpu=...)` so that DeepSpeed's data-parallel world "
            f"size is {d.dp}. pipeline.json lists the sizes that mpu must report."
        )
    if d.ep > 1:
        d.notes.append(
            f"Expert parallel ep={d.ep}: build the MoE layers with `deepspeed.moe.layer.MoE(..., ep_size={d.ep})`."
        )


def readme(d: _Decisions) -> str:
    plan = d.plan
    slots = node_slots(plan)
    nvme = d.offload_optimizer == "nvme" or d.offload_params == "nvme"
    lines = [
        f"# DeepSpeed launch files: {plan.job.model} on {plan.job.cluster}",
        "",
        f"Strategy: `{plan.strategy_spec}`",
        "",
        f"Global batch {plan.job.global_batch} = micro-batch {d.mbs} x {d.micro_batches} accumulation steps x "
        f"{d.dp} data-parallel replicas; {d.tp * d.cp * d.dp * d.pp} GPUs on {len(slots)} node(s).",
        "",
        "## Files",
        "",
        "- `ds_config.json`: the DeepSpeed config (`--deepspeed_config`): batch sizes, precision, ZeRO stage, "
        "offload, activation checkpointing, AdamW optimizer, gradient clipping.",
        "- `pipeline.json`: pipeline partition and parallel sizes for the model code (not read by DeepSpeed).",
        "- `hostfile`: one line per node, `HOST slots=GPUS`, in rank order. The hostnames `node-<i>` are "
        "placeholders (i is the cluster's node index): replace them with real hostnames, or run launch.sh "
        "inside a Slurm allocation, which writes `hostfile.slurm` from `$SLURM_JOB_NODELIST`.",
        "- `launch.sh`: runs the `deepspeed` launcher from this folder.",
        "",
        "## Run",
        "",
        "```",
        "TRAIN_SCRIPT=/path/to/train.py bash launch.sh [training script arguments]",
        "```",
        "",
        "which runs (from this folder):",
        "",
        "```",
        _command(plan),
        "```",
        "",
        "The training script must accept `--deepspeed --deepspeed_config FILE` (`deepspeed.add_config_arguments`) "
        "and pass the config to `deepspeed.initialize`.",
        "",
    ]
    if d.pp > 1:
        lines += [
            "## Pipeline partition",
            "",
            "`parts` indexes the `PipelineModule` LayerSpec list given in `layers`: layer 0 is the embedding, "
            "then one entry per transformer block, then the final norm and the head. Stage i owns layers "
            "`parts[i]` to `parts[i+1] - 1`. DeepSpeed's `partition_method` (uniform, parameters, type:REGEX) "
            "cannot express an arbitrary split, so set `parts` yourself:",
            "",
            "```python",
            "import json",
            "from deepspeed.pipe import PipelineModule",
            "",
            "PARTS = json.load(open('pipeline.json'))['parts']",
            "",
            "class PlannedPipelineModule(PipelineModule):",
            "    def _partition_layers(self, method='uniform'):",
            "        self.parts = PARTS",
            "        stage = self._topo.get_coord(self.global_rank).pipe",
            "        self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])",
            "```",
            "",
            f"Use `num_stages={d.pp}` and `activation_checkpoint_interval="
            f"{1 if plan.strategy.recompute == 'full' else 0}`.",
            "",
        ]
    if nvme:
        lines += [
            "## NVMe",
            "",
            f"`nvme_path` is `{NVME_PATH}`: edit it in ds_config.json to a fast local NVMe mount on every node.",
            "",
        ]
    if d.notes:
        lines += ["## Substitutions", "", "What the plan chose that DeepSpeed cannot express as is:", ""]
        lines += [f"- {note}" for note in d.notes]
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------- what the files ask for


def _offload_of(section: dict) -> tuple[Offload, str, float]:
    """(offload, device, ratio) of a zero_optimization section."""
    opt, par = section.get("offload_optimizer"), section.get("offload_param")
    kinds: dict[tuple[bool, bool], Offload] = {(False, False): "none", (True, False): "optimizer",
                                               (False, True): "params", (True, True): "all"}
    device = (opt or par or {"device": "cpu"})["device"]
    return kinds[(opt is not None, par is not None)], device, float((opt or {}).get("ratio", 1.0))


def written_strategy(plan: Plan, job: Job) -> Strategy:
    """The strategy ds_config.json and pipeline.json ask DeepSpeed to run, read off them: ZeRO stage and
    offload after the PipelineEngine's and ZeRO-Offload's substitutions, 1F1B with one chunk per stage, the
    plan's split (custom parts), one activation-checkpoint count."""
    d = _Decisions(plan, job)
    config, pipeline = ds_config(d), pipeline_json(d)
    section = config["zero_optimization"]
    offload, device, ratio = _offload_of(section)
    recompute, recompute_layers = "none", None
    checkpointing = config.get("activation_checkpointing")
    if pipeline["activation_checkpoint_interval"] and checkpointing is not None:
        recompute = "full"
        count = checkpointing["number_checkpoints"]  # the first `count` blocks of every stage
        if count < max(pipeline["blocks_per_stage"]):
            recompute_layers = (count,)
    return Strategy(
        tp=pipeline["tensor_model_parallel_size"], pp=pipeline["pipeline_model_parallel_size"],
        dp=pipeline["data_parallel_size"], cp=pipeline["context_parallel_size"],
        ep=pipeline["expert_parallel_size"], mbs=config["train_micro_batch_size_per_gpu"], vpp=1,
        sp=pipeline["sequence_parallel"] and pipeline["tensor_model_parallel_size"] > 1,
        zero=section["stage"], shard="node" if "zero_hpz_partition_size" in section else "full",
        recompute=recompute, recompute_layers=recompute_layers, offload=offload, offload_device=device,
        offload_ratio=ratio, schedule="1f1b",
        split=tuple(pipeline["blocks_per_stage"]) if pipeline["stages"] > 1 else None,
        stage_pools=plan.strategy.stage_pools)


# ---------------------------------------------------------------- entry point


def emit(plan: Plan, job: Job, inputs: LaunchInputs = LaunchInputs()) -> dict[str, str]:
    """DeepSpeed launch files of `plan`, keyed by path relative to the deepspeed/ folder."""
    d = _Decisions(plan, job)
    config = ds_config(d)
    pipeline = pipeline_json(d)
    _parallel_notes(d)
    return {
        "ds_config.json": _json(config),
        "pipeline.json": _json(pipeline),
        "hostfile": hostfile(plan),
        "launch.sh": launch_sh(plan),
        "README.md": readme(d),
    }
