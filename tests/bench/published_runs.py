"""Accuracy of the cost model against published training runs.

Reads tests/data/published_runs.csv (shared/data/published_runs.csv plus a
`runtime` column), rebuilds each row's model, cluster and published strategy,
runs `evaluate` under the row's runtime profile, and prints predicted vs
published tokens/s per GPU, predicted vs published peak HBM where the row
publishes it (the predicted peak counted as the published figure is: nvidia-smi's
whole use, PyTorch's reserved or its allocated bytes, `PEAK_KINDS`), and the errors per
runtime, separately for the rows with ids < 200 (the in-sample set the cost model was developed against) and the rows
above 200 added since (201-232 with the runtime profiles, 301-308 the context-parallel runs, 431-439 more
torchtitan runs that publish their peak memory).

    python tests/bench/published_runs.py            # tier-A table
    python tests/bench/published_runs.py --tier all # every row (tier B too)
    python tests/bench/published_runs.py --csv F    # also write the rows
    python tests/bench/published_runs.py --compile  # also compile every row (up to 60 s each)
    python tests/bench/published_runs.py --compile --ids 63,72   # only these rows
    python tests/bench/published_runs.py --groups   # also errors per source, device, parallel family, sequence, size
    python tests/bench/published_runs.py --constants backward_gemm_ratio=2.2   # trial constant values
    python tests/bench/published_runs.py --runs tests/data/holdout_runs.csv --check   # build every row, print no error

--runs reads another file of the same columns (default tests/data/published_runs.csv).  A frozen holdout
(tests/data/holdout_runs.csv, holdout2_runs.csv and holdout3_runs.csv, docs/benchmarks.md "Frozen holdout",
"Second holdout" and "Third holdout") is scored once, at its end; until then `--check` is the only way to read it:
it builds every row into a job and a strategy and lists the rows that do not build, without a prediction, an
error or a memory verdict.

How a row becomes a job (one rule for every row, never a per-row constant):

* the framework that ran it is the row's `runtime` column, a profile of
  hardware/data/runtimes (`load_runtime`): memory layout, FSDP gathering,
  gradient reduce dtype, overlap and kernels (flash attention, fused
  element-wise work) all come from it; the job itself allows both kernels;
* architecture from the row (layers, hidden, heads, kv_heads, ffn, vocab);
  family from the model name (case-insensitive): GPT (Megatron: learned
  positions, GeLU 4h, biases, tied), Llama (SwiGLU, RMSNorm, RoPE), Nemotron
  (squared-ReLU), MPT (GeLU, no biases, ALiBi so no position table, tied);
* mixture-of-experts rows (`moe_config`, `MOE_FORMAT`): "E<experts> top<k>" plus optional "shared<n>"
  (always-active experts), "ffn<width>" (one expert's width; default the row's ffn), "dense<n>" (leading
  dense blocks of width ffn) and "mtp<n>" (DeepSeek-V3 multi-token-prediction modules); Qwen3 heads are
  128 wide whatever hidden / heads is; DeepSeek-V3 and Kimi K2 rows use DeepSeek-V3's multi-head latent
  attention (the zoo's deepseek-v3 MLA sizes), DeepSeek-V3 rows its node-limited routing (4 of 8 expert
  groups, NeMo's DeepSeekV3Config moe_router_num_groups / moe_router_group_topk); Grok-1 is the Llama layout
  with experts;
* MoE details a row's notes state: "ETP=<n>" (expert tensor parallelism, folded over tp x dp), "A2A overlap
  on" (Megatron's expert all-to-all overlap), "Token dispatcher <alltoall|DeepEP|HybridEP>" (Strategy.dispatcher:
  Megatron's flex dispatcher with that backend; unnamed: alltoall, NeMo's MoE default, MixtralConfig and
  DeepSeekConfig moe_token_dispatcher_type "alltoall"), "balanced routing" (force-balanced or capacity-padded
  tokens: Job.moe_routing balanced; otherwise learned, with constants.yaml's moe_routing_imbalance) and "Decoder
  first/last stage blocks <f>/<l>" (Megatron --decoder-first/last-pipeline-num-layers; the other stages
  share the rest evenly);
* dropout as the model code trains by default, per runtime (`DROPOUT`):
  Megatron-LM's GPT of 2021-22 (megatron-2021 and its torch-DDP variant,
  and deepspeed-2021, which runs the same model code) keeps
  --hidden-dropout/--attention-dropout 0.1, flash-attention's GPT
  (pytorch-ddp) keeps transformers.GPT2Config's 0.1; the Megatron-Core/NeMo,
  torchtitan, llm-foundry and lit-gpt rows train without (the Megatron-Core
  README rows 20-28 publish no config; they are costed as the NeMo rows);
* "HSDP" / "HYBRID_SHARD" in zero_fsdp: FSDP sharded within a node, replicated across nodes (shard=node);
* a zero_fsdp that states nothing (empty, "not stated ...") takes the default of the framework that ran the
  row (`framework`, `UNPUBLISHED_ZERO`): NeMo and Megatron-Bridge recipes, named in the row's model title or
  source, run the distributed optimizer (zero 1); Megatron-LM's scripts and every other framework shard nothing;
* the published strategy; unpublished fields take the documented defaults:
  mbs 1, vpp 1, cp 1, sp on with tp > 1, and for recompute the default of the framework that ran the row
  (`unpublished_recompute`: NeMo 2.0 and Megatron-Bridge recipes recompute nothing, NeMo 1.x launcher
  configs recompute selectively, used whether or not the model says it fits, as a stated setting is),
  otherwise the cheapest setting that fits memory, as a user tunes a script: none, selective, then full
  recompute of 1, 2, ... blocks per stage (Megatron --recompute-num-layers);
* torchtitan's "selective (SAC)" rows run its per-op SAC (selective_ac_option
  "op", every row's notes or its config say so): recompute=selective, which
  the torchtitan profiles cost with their `selective` section (the op outputs
  the policy saves and the GEMMs it redoes), not Megatron's attention-core
  recompute;
* a Megatron-LM row whose notes quote its launch flags without --overlap-grad-reduce runs dp_overlap=off
  (with it but without --overlap-param-gather: grad), Megatron-LM's defaults (`dp_overlap`);
* "comm overlap on" / AsyncTP in a row's notes turns tp_overlap on, "no TP comm overlap" off; a NeMo or
  Megatron-Bridge row that says neither takes its recipe's setting (`tp_overlap`: on, but for the recipes
  read that turn it off);
* the attention kernel is the one the row ran (`attention_kernel`): Megatron-DeepSpeed's --use-flash-attn-triton runs
  flash_triton, a row naming FlashAttention-3 runs flash3, FlashAttention-2 flash2,
  FlashAttention-4 cuDNN's figures; a torchtitan row dated before October 2025 runs PyTorch's flash-first order
  off Blackwell (torchtitan put cuDNN first on B200 in May 2025 and everywhere in v0.2.0); otherwise the
  profile's kernel;
* a row whose notes say its model code has "no flash attention" runs without it, and one running HuggingFace's
  "eager attention" runs unfused element-wise kernels too (`model_kernels`);
* an FP8 row keeps FP8 parameters (`Job.fp8_params`) where its configuration says so or it ran NeMo 2.x's recipe
  API or Megatron-Bridge, whose FP8 precision configs set them (`fp8_params`);
* a row whose notes name torchtitan's chunked loss (ChunkedCELoss, "loss chunks", "N-token chunks") runs its
  profile's loss in those chunks (`loss_chunking`: Loss.chunks / chunk_tokens);
* the node preset is the row's gpu_type's (`_GPU_PRESETS`): a gpu_type naming Jean Zay (BLOOM's cluster) runs
  jean-zay-a100 (4 NVLink links per GPU, 4 Omni-Path links per node), other A100s a DGX A100;
* a run on fewer GPUs than a node has (1 GPU) is costed on a node of that
  many GPUs;
* a gpu_type saying "power limited to N W" runs the preset's GPUs under that
  board power limit (NodeSpec.gpu_power_limit: the device's power curve
  derates its tensor throughput).

--constants NAME=VALUE,... costs every row with those constants in place of
constants.yaml's (`with_constants`); the cases, and so the recompute setting
picked by memory, stay those of constants.yaml, so the flag moves step times
only.  tests/bench/fit_constants.py fits the calibrated constants this way and
validates them leaving one source out; `source_key`, `device_family` and
`parallel_family` are the groupings it and --groups print.

With --compile (tests/bench/published_compile.py), every row's job (same model, cluster, batch, seq_len,
precision and runtime profile) is also given to `compile_job`, whose space
the runtime narrows to what the framework can express
(CompileOptions(time_limit=60, space=SpaceOptions(tp_overlap=<the published
strategy's tp_overlap>))) and a second table compares the compiled plan with
the published strategy.  The comparison lives inside the cost model: the
reference is the *estimate* of the published strategy (`evaluate`), not the
published throughput, so "ratio" = compiled tokens/s/GPU / published
strategy's predicted tokens/s/GPU says how much better the compiler thinks it
can do, not how much faster the run would really be.  The compiler
minimises the same `evaluate`, so a ratio below 1 means the published
strategy lies outside the compiler's space (an mbs that is not a power of two
or above max_mbs, vpp above max_vpp, a recompute pattern it does not
generate, ...) or the search stopped early (status FEASIBLE, see the gap).
Rows whose compiled strategy differs in tp, pp, dp, cp, mbs, vpp, zero or
recompute are listed with the two breakdown terms that changed most.
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hardware import Catalog, Cluster, NodeSpec, Pool, load_catalog, load_cluster  # noqa: E402
from models.transformer import MoEConfig, build_transformer  # noqa: E402
from models.transformer import gpt, llama  # noqa: E402
from models.yamlio import as_name  # noqa: E402
from models.zoo import get_entry  # noqa: E402
from planner.cost import Estimate, evaluate  # noqa: E402
from planner.cost.interval import PARALLEL_FAMILIES, parallel_family, seq_range  # noqa: E402,F401 (the regimes intervals use)
from planner.job import FP8_PRECISIONS, Job  # noqa: E402
from planner.profile import load_runtime  # noqa: E402
from planner.strategy import Strategy  # noqa: E402

CSV_PATH = ROOT / "tests" / "data" / "published_runs.csv"
NEW_ROWS = 200  # ids above this were added after the model was developed (201-232, 301-308, 431-439): out of sample
GIB = 2.0**30

_GPU_PRESETS = [  # (substring of gpu_type, node preset), first match wins
    ("96GB HBM2e", "h100-96g-8"),
    ("A100-SXM4-40GB", "dgx-a100-40g"),
    ("Jean Zay", "jean-zay-a100"),  # BLOOM's cluster: 4 NVLink links per GPU, 4 Omni-Path links per node
    ("A100", "dgx-a100-80g"),
    ("B200", "dgx-b200"),
    ("H200", "hgx-h200"),
    ("H100", "dgx-h100"),
    ("MI300X", "mi300x-8"),
]
# "power limited to 750 W" in a row's gpu_type: the GPUs ran under that board power limit (NodeSpec.gpu_power_limit)
_POWER_LIMIT = re.compile(r"power[- ]limit(?:ed)?(?: to)? (\d+(?:\.\d+)?) ?W", re.IGNORECASE)

# Dropout as the model code a runtime's rows ran trains by default (GPT family only; the Llama, Nemotron and
# MPT recipes train without):
#   megatron-2021 (and its --DDP-impl torch variant): Megatron-LM megatron/arguments.py --hidden-dropout and
#     --attention-dropout default 0.1, which the SC21 scripts (examples/academic_paper_scripts/sc21/CONFIG.sh)
#     and Korthikanti et al. keep;
#   deepspeed-2021: the same Megatron GPT code (DeepSpeedExamples Megatron-LM-v1.1.5-ZeRO3);
#   pytorch-ddp: flash-attention's GPTLMHeadModel on transformers.GPT2Config (resid/embd/attn_pdrop 0.1).
DROPOUT = {"megatron-2021": True, "megatron-2021-torchddp": True, "deepspeed-2021": True, "pytorch-ddp": True}


# What a published peak memory counts, and what of the model's per-GPU peak (weights, gradients, optimizer,
# activations, buffers, and the reserve: memory_reserve_bytes outside PyTorch, CUDA context and NCCL, plus
# memory_fragmentation of the allocated bytes inside its caching allocator) is compared with it:
#   device     nvidia-smi's memory in use: the whole peak
#   reserved   torch.cuda.max_memory_reserved (torchtitan's max_reserved_gib): the peak less memory_reserve_bytes
#   allocated  torch.cuda.max_memory_allocated (Megatron's "peak allocated", torchtitan's "active"): the peak less
#              the whole reserve
PEAK_KINDS = ("device", "reserved", "allocated")
_ALLOCATED = re.compile(r"peak allocated|max_memory_allocated|max allocated|allocated memory|peak active")


@dataclass(frozen=True)
class Case:
    """One published run turned into a job and a strategy."""

    row: dict
    job: Job
    strategy: Strategy

    @property
    def published(self) -> float | None:
        """Published tokens/s per GPU (None where the row has none)."""
        value = (self.row.get("tokens_per_s_per_gpu") or "").strip()
        return float(value) if value else None

    @property
    def published_peak_gib(self) -> float | None:
        """Published peak HBM per GPU in GiB (None where the row has none)."""
        value = (self.row.get("peak_mem_gib") or "").strip()
        return float(value) if value else None

    @property
    def published_peak_kind(self) -> str:
        """What the published peak counts (`PEAK_KINDS`), read in the row's notes: a PyTorch allocated figure, the
        device's whole use (nvidia-smi) or, as torchtitan and torch.cuda.max_memory_reserved report, reserved."""
        notes = self.row["notes"].lower()
        if _ALLOCATED.search(notes):
            return "allocated"
        return "device" if "nvidia-smi" in notes else "reserved"

    @property
    def runtime(self) -> str:
        return self.job.runtime.name

    @property
    def new(self) -> bool:
        """A row added after the model was developed (ids > 200), not one it was developed against."""
        return int(self.row["id"]) > NEW_ROWS


def _int(value: str, default: int) -> int:
    value = (value or "").strip()
    return int(float(value)) if value else default


# moe_config: "E<experts> top<k>" then any of "shared<n>", "ffn<width>", "dense<n>", "mtp<n>", space separated
MOE_FORMAT = re.compile(r"E(?P<experts>\d+) top(?P<top_k>\d+)((?: (?:shared|ffn|dense|mtp)\d+)*)$")
# the MoE token dispatcher a row's notes name ("Token dispatcher DeepEP"); unnamed: alltoall
DISPATCHER = re.compile(r"\btoken dispatcher (alltoall|deepep|hybridep)\b", re.IGNORECASE)


def _moe(row: dict) -> tuple[MoEConfig | None, int]:
    """(the experts of a row's moe_config, its MTP module count); (None, 0) for a dense row."""
    text = (row.get("moe_config") or "").strip()
    if not text:
        return None, 0
    match = MOE_FORMAT.match(text)
    if match is None:
        raise ValueError(f"row {row['id']}: moe_config {text!r} does not read as {MOE_FORMAT.pattern}")
    extra = {key: int(value) for key, value in re.findall(r"(shared|ffn|dense|mtp)(\d+)", match.group(3))}
    moe = MoEConfig(num_experts=int(match["experts"]), top_k=int(match["top_k"]),
                    shared_experts=extra.get("shared", 0), expert_ffn=extra.get("ffn", _int(row["ffn"], 0)),
                    first_dense_layers=extra.get("dense", 0))
    return moe, extra.get("mtp", 0)


def _model(row: dict, runtime: str):
    name = row["model"]
    lower = name.lower()
    layers, hidden, heads = int(row["layers"]), int(row["hidden"]), int(row["heads"])
    # the row's model is a title ('GPT 1.7B (Megatron-LM SC21 weak scaling)'); a model's name is a name
    sizes = dict(name=as_name(name, "model"), num_layers=layers, hidden=hidden, heads=heads,
                 kv_heads=_int(row["kv_heads"], heads), ffn=_int(row["ffn"], 4 * hidden),
                 vocab=int(row["vocab"]), max_positions=int(row["seq_len"]))
    moe, mtp = _moe(row)
    if moe is not None:
        sizes.update(moe=moe, mtp_layers=mtp)
        if "qwen3" in lower:  # Qwen3 heads are 128 wide (config.json head_dim), not hidden / heads
            sizes["head_dim"] = 128
        if "deepseek" in lower or "kimi" in lower:  # DeepSeek-V3's multi-head latent attention
            sizes["mla"] = get_entry("deepseek-v3").config.mla
        if "deepseek" in lower:  # and its node-limited routing (n_group 8, topk_group 4; Kimi K2 has none)
            zoo = get_entry("deepseek-v3").config.moe
            assert zoo is not None
            sizes["moe"] = moe.model_copy(update={"router_groups": zoo.router_groups,
                                                  "router_group_topk": zoo.router_group_topk})
        return build_transformer(llama(**sizes))
    if "llama" in lower:
        return build_transformer(llama(**sizes))
    if "nemotron" in lower:
        return build_transformer(llama(activation="squared_relu", norm="layernorm", **sizes))
    if "mpt" in lower:
        return build_transformer(gpt(bias=False, position="rope", dropout=False, **sizes))
    return build_transformer(gpt(dropout=DROPOUT.get(runtime, False), **sizes))


def _precision(row: dict) -> str:
    text = row["precision"].lower()
    if "float8" in text or "fp8" in text:
        return "fp8"
    if "fp16" in text or "precision=16" in text:
        return "fp16"
    return "bf16"


def _cluster(row: dict) -> Cluster:
    preset = next(p for key, p in _GPU_PRESETS if key in row["gpu_type"])
    node = load_catalog().nodes[preset]
    limit = _POWER_LIMIT.search(row["gpu_type"])
    if limit:
        node = node.model_copy(update={"gpu_power_limit": float(limit.group(1))})
    gpus, per_node = int(row["num_gpus"]), _int(row["gpus_per_node"], node.gpus_per_node)
    if gpus >= node.gpus_per_node and not limit:
        return load_cluster(f"{preset}:{max(1, gpus // per_node)}")
    # fewer GPUs than the preset's node has (a 1-GPU run): nodes of the row's size, one NIC per GPU at most
    size = min(per_node, gpus)
    fields = node.model_dump()
    fields.update(gpus_per_node=size, nic_count=min(node.nic_count, size))
    name = f"{preset}:{gpus}gpu" + (f"@{limit.group(1)}W" if limit else "")
    return Cluster(name=name, pools=[Pool(name=preset, node=NodeSpec.model_validate(fields), count=gpus // size)])


# NeMo (its 1.x launcher and its 2.0 recipes) and Megatron-Bridge run Megatron-Core, costed under the same runtime
# profiles as Megatron-LM's own scripts, but with their own defaults: the row's model title or source names them, or
# its notes quote a document saying its configuration follows NeMo's performance scripts (Megatron-LM
# examples/llama/README.md's FP8 table: "This configuration follows those defined in NeMo Framework's performance
# scripts"; its train_llama3_8b_h100_fp8.sh passes --use-distributed-optimizer, --grad-reduce-in-bf16 and no
# recompute flag, as NeMo 2.x's scripts/performance recipes set them)
_NEMO = re.compile(r"(?<![a-z])nemo(?![a-z])|megatron-bridge")
_NEMO_PERFORMANCE_CONFIG = re.compile(r"nemo framework's performance scripts")

# ZeRO stage of a row whose zero_fsdp publishes none, by the framework that ran it (its documented default):
#   nemo: the distributed optimizer.  NeMo 2.0 nemo/collections/llm/recipes/optim/adam.py
#     distributed_fused_adam_with_cosine_annealing builds OptimizerConfig(use_distributed_optimizer=True), the
#     optimizer every pre-training recipe uses; Megatron-Bridge's recipes set use_distributed_optimizer = True
#     (hardware/data/runtimes/megatron-bridge.yaml); the NeMo 1.x launcher configs read for holdout row 1024
#     (dgxc-benchmarking grok1/grok1_314b.yaml) use optim mcore_distributed_optim
#   any other framework: none.  Megatron-LM megatron/training/arguments.py --use-distributed-optimizer is
#     action='store_true' (off unless passed); DeepSpeed's zero_optimization.stage defaults to 0
UNPUBLISHED_ZERO = {"nemo": 1}


def framework(row: dict) -> str:
    """The framework that ran a row where it differs from its runtime profile: 'nemo' for a Megatron-Core row a
    NeMo or Megatron-Bridge recipe ran (named in its model title or source; 'Nemotron' is a model, not NeMo),
    otherwise the row's runtime."""
    text = (row["model"] + " " + row["source"]).lower()
    named = _NEMO.search(text) or _NEMO_PERFORMANCE_CONFIG.search(row["notes"].lower())
    return "nemo" if row["runtime"].startswith("megatron") and named else row["runtime"]


def _zero_published(row: dict) -> bool:
    """Whether a row's zero_fsdp says anything about its sharding: empty or 'not stated ...' says nothing
    (a stated scheme is read first by `_zero`, so 'FSDP (strategy not stated)' is still FSDP)."""
    text = row["zero_fsdp"].strip().lower()
    return bool(text) and "not stated" not in text


def _zero(row: dict) -> int:
    text = row["zero_fsdp"].lower()
    if "fsdp" in text or "zero-3" in text or _hybrid_shard(row):
        return 3
    if "zero-2" in text:
        return 2
    if "dist. optimizer" in text or "distributed optimizer" in text or "zero-1" in text:
        return 1
    if _zero_published(row):  # 'none', 'torch DDP', ...: no sharding, as stated
        return 0
    return UNPUBLISHED_ZERO.get(framework(row), 0)


def _hybrid_shard(row: dict) -> bool:
    """HSDP (FSDP HYBRID_SHARD): weights sharded within a node and replicated across nodes (Strategy.shard 'node')."""
    text = row["zero_fsdp"].lower()
    return "hsdp" in text or "hybrid_shard" in text


def _base_strategy(row: dict) -> dict:
    tp = _int(row["tp"], 1)
    sp_text = row["seq_parallel"].strip().lower()
    schedule_text = row["pp_schedule"].lower()
    vpp = _int(row["vpp_chunks"], 1)
    notes = (row["notes"] + " " + row["zero_fsdp"] + " " + row["precision"]).lower()
    sp = sp_text.split()[0] if sp_text else ""  # "yes (assumed, ...)" is yes
    pp = _int(row["pp"], 1)
    vpp = vpp if "interleaved" in schedule_text and pp > 1 else 1
    etp = re.search(r"\bETP=(\d+)", row["notes"])
    dispatcher = DISPATCHER.search(row["notes"])
    return dict(
        tp=tp, pp=pp, dp=_int(row["dp"], 1), cp=_int(row["cp"], 1), ep=_int(row["ep"], 1),
        etp=int(etp.group(1)) if etp and int(etp.group(1)) != tp else None, ep_overlap="a2a overlap on" in notes,
        dispatcher=dispatcher.group(1).lower() if dispatcher else "alltoall",
        mbs=_int(row["micro_batch"], 1), vpp=vpp,
        schedule="gpipe" if pp > 1 and vpp == 1 and "gpipe" in schedule_text else None,
        sp=(sp == "yes") if sp in ("yes", "no") else None if tp > 1 else False,
        zero=_zero(row), shard="node" if _hybrid_shard(row) else "full",
        tp_overlap=tp_overlap(row, tp), dp_overlap=dp_overlap(row),
    )


def _interleaved_split(blocks: int, pp: int, vpp: int) -> tuple[int, ...] | None:
    """Blocks per stage when `blocks` does not divide into pp * vpp equal chunks (e.g. Llama 3.1 405B's 126
    blocks over 8 x 2 chunks): torchtitan's split points spread the blocks over the pp * vpp chunks as evenly
    as possible (the first ones one larger) and stage i runs chunks i, i + pp, ...; None when they divide."""
    chunks = pp * vpp
    if blocks % chunks == 0 or blocks < chunks:
        return None
    sizes = [blocks // chunks + (1 if c < blocks % chunks else 0) for c in range(chunks)]
    return tuple(sum(sizes[stage + v * pp] for v in range(vpp)) for stage in range(pp))


def _megatron_split(row: dict, blocks: int, pp: int) -> tuple[int, ...] | None:
    """Blocks per stage of a row whose notes give Megatron's first/last-stage block counts, None otherwise."""
    match = re.search(r"first/last stage blocks (\d+)/(\d+)", row["notes"])
    if match is None or pp < 3:
        return None
    first, last = int(match.group(1)), int(match.group(2))
    middle = (blocks - first - last) // (pp - 2)
    return (first, *([middle] * (pp - 2)), last)


# Activation recompute of a row whose act_recompute publishes none, by the framework that ran it (its documented
# default), used whether or not the model says it fits (a stated setting is used so too):
#   NeMo 2.0 (a NeMo 25.xx container named in the row) and Megatron-Bridge: none.  Megatron-Core
#     TransformerConfig.recompute_granularity defaults to None; NeMo 2.0's pre-training recipes set none
#     (nemo/collections/llm/recipes/llama31_405b.py: no recompute field in model() or
#     pretrain_performance_optimizations; NVIDIA/dgxc-benchmarking llama3.1/pretrain_llama31.py @ 741c886, the
#     NeMo 25.02 benchmark, runs those recipes and sets none either), and the performance scripts' configs for
#     every H100 pre-training run (scripts/performance/recommended_model_configs/model_configs_h100.csv,
#     NVIDIA/NeMo commit 000e8c17: recompute_layers 0 and activation_offload_layers 0 on every row,
#     recompute_modules only for DeepSeek-V3,
#     including Llama 3.1 405B tp8 pp8 cp2 vp8 and Nemotron-4 340B tp8 pp8 vp12)
#   NeMo 1.x (the earlier dgxc-benchmarking READMEs ran megatron_gpt_pretraining.py on a launcher-style yaml,
#     llama3.1/configure.sh @ 143b90dd): selective (NVIDIA/dgxc-benchmarking nemotron/nemotron4-340b-synth.yaml
#     @ 8f5cbb37: activations_checkpoint_granularity selective, method null; the NeMo 24.07 performance rows'
#     launcher yamls likewise, published_runs 229-232)
#   NeMo 2.x's recipe API in an earlier container (the row's notes name a "NeMo 2.0 recipe" or "NeMo 2.0
#     performance" script): none as well.  NeMo v2.1.0 (the 24.12 container) llama3_8b.finetune_recipe,
#     default_finetune_recipe, finetune_performance_optimizations, Llama3Config8B and GPTConfig set no
#     recompute field (NVIDIA/NeMo tag v2.1.0, nemo/collections/llm/recipes/llama3_8b.py, finetune_default.py,
#     gpt/model/llama.py, gpt/model/base.py), which the dgxc 24.12 fine-tuning script runs
#     (NVIDIA/dgxc-benchmarking llama3/finetuning/llama3_finetune.py @ 8f5cbb3: finetune_recipe(...,
#     performance_mode=True), no recompute set)
#   any other framework: the cheapest setting that fits memory, as a user tunes a script (`_recompute_options`)
_NEMO2 = re.compile(r"(?<![a-z])nemo 2[5-9]\.|megatron-bridge")
_NEMO2_NOTES = re.compile(r"(?<![a-z])nemo ?2\.\d+ (?:recipe|performance)")


def unpublished_recompute(row: dict) -> str | None:
    """The recompute a row's framework runs when its act_recompute states none: 'none' for NeMo 2.x and
    Megatron-Bridge, 'selective' for NeMo 1.x, None (no default: the cheapest that fits) otherwise."""
    if framework(row) != "nemo":
        return None
    return "none" if _nemo2(row) else "selective"


def _nemo2(row: dict) -> bool:
    """Whether a NeMo row ran NeMo 2.x's recipe API or Megatron-Bridge (a 25.xx container or Bridge named in its
    title or source, or its notes naming a NeMo 2.0 recipe or performance script)."""
    notes = row["notes"].lower()
    return bool(_NEMO2.search((row["model"] + " " + row["source"]).lower())
                or _NEMO2_NOTES.search(notes) or _NEMO_PERFORMANCE_CONFIG.search(notes))


# Gradient buffers of a NeMo or Megatron-Bridge row, read in the script that ran it: bf16 (the megatron-bridge
# profile, hardware/data/runtimes/megatron-bridge.yaml: grad_reduce_in_fp32 = False) or fp32 (the megatron profile):
#   Megatron-Bridge: bf16 (its scripts/performance configs; megatron-bridge.yaml cites them)
#   NeMo 2.x: bf16.  pretrain_performance_optimizations / finetune_performance_optimizations, which every
#     performance script and dgxc benchmark runs (performance_mode=True), set trainer.plugins.grad_reduce_in_fp32
#     = False (NVIDIA/NeMo d2b21556 (25.02) llama3_8b.py, llama3_70b.py, llama31_405b.py; b4148d21 (r2.3.0, 25.04)
#     nemotron4_15b.py, nemotron4_340b.py, llama4_e128.py; the grok1 script at 6f2c6fda); the FP8 scripts set it
#     again after bf16_with_fp8_mixed(); from v2.4.0 (25.07) scripts/performance/helpers.py set_precision_configs
#     sets it for every compute dtype; the 24.12 fine-tuning script sets it (dgxc llama3/finetuning @ 8f5cbb3).
#     Except DeepSeek-V3 before v2.4.0: its recipe sets none (NeMo 7a8f1cc7, the dgxc 25.04 benchmark's commit,
#     deepseek_v3.py; pretrain_deepseek_v3.py rejects FP8), so its BF16 runs keep fp32
#   NeMo 1.x: what the yaml's optim.grad_sync_dtype says (megatron_gpt_model.py, NeMo v2.0.0: grad_reduce_in_fp32 =
#     grad_sync_dtype == 'fp32', default fp32; apex distributed_fused_adam: default the state dtype, fp32).  The
#     dgxc-benchmarking yamls set bf16 (llama3.1 8b/70b/405b, gpt3_175b_hydra, nemotron4-340b-synth, grok1_314b @
#     143b90dd, 8f5cbb37, 0b71cfda) except nemotron4-15b-synth (@ 0b71cfda: none, fp32); the Framework Launcher's
#     *_fp8_performance.yaml set bf16 (NeMo-Framework-Launcher 1e46ac6c "gpt pretrain configs with fp8 + bf16
#     grad"); its 2023 predefined gpt3 configs set none (@ f854ec2f: fp32)
#   anything else (MLPerf's NeMo, unread): the profile the row names
_DEEPSEEK_BEFORE_NEMO24 = re.compile(r"deepseek.*nemo 25\.0[0-4]")
_NEMO1_BF16_GRADS = re.compile(r"dgxc-benchmarking|_fp8_performance\.yaml")
_NEMO1_FP32_GRADS = re.compile(r"nemotron/readme_15b")


def gradient_dtype(row: dict) -> str | None:
    """'bf16' or 'fp32': the gradient buffers the script that ran a NeMo or Megatron-Bridge row keeps and reduces;
    None where the row's own runtime profile says it (any other framework, or a script not read)."""
    if framework(row) != "nemo":
        return None
    text = (row["model"] + " " + row["source"]).lower()
    if _nemo2(row):
        return "fp32" if _DEEPSEEK_BEFORE_NEMO24.search(text) and _precision(row) == "bf16" else "bf16"
    if _NEMO1_FP32_GRADS.search(text):
        return "fp32"
    return "bf16" if _NEMO1_BF16_GRADS.search(text) else None


def runtime_name(row: dict) -> str:
    """The runtime profile a row is costed under: its own, or megatron-bridge (megatron's, with bf16 gradient
    buffers) for a Megatron-Core row whose script keeps its gradients in bf16 (`gradient_dtype`)."""
    if row["runtime"] == "megatron" and gradient_dtype(row) == "bf16":
        return "megatron-bridge"
    return row["runtime"]


# Tensor-parallel communication overlap (Megatron-Core --tp-comm-overlap, Transformer Engine userbuffers) of a NeMo or
# Megatron-Bridge row with tp > 1 whose notes state none, read in the recipe or yaml that ran it: on, except
#   Megatron-Bridge Qwen3-235B-A22B: qwen3_235b_a22b_h100/_b200 CommOverlapConfig(tp_comm_overlap=False)
#     (hardware/data/recipes/nemo-qwen3-235b-a22b-h100-bf16.yaml cites it); its Llama 3.1 405B and Llama 3 70B
#     configs set True (nemo-llama31-405b-h100-bf16.yaml, nemo-llama3-70b-h100-bf16.yaml)
#   NeMo 2.x DeepSeek-V3 before v2.4 (7a8f1cc7 deepseek_v3.py: no MegatronCommOverlapCallback with tp overlap) and
#     Llama 3 8B (llama3_8b.py pretrain_performance_optimizations: MegatronCommOverlapCallback(tp_comm_overlap=
#     False), d2b21556 and b4148d21); llama3_70b, llama31_405b, nemotron4_15b, nemotron4_340b and llama4_e128 set
#     True at those commits (v2.1.0's fine-tuning recipes for 70B and 405B too), the grok1 script at 6f2c6fda too
#   the NeMo Framework Launcher's *_fp8_performance.yaml (ub_tp_comm_overlap: False, @ 949f53b3 / b1a59070); its 2023
#     gpt3/175b.yaml sets True (@ f854ec2f); the dgxc NeMo 1.x yamls set it (llama3.1_70b/405b.yaml and
#     gpt3_175b_hydra.yaml true @ 143b90dd) or their configure.sh does (nemotron, grok1: model.ub_tp_comm_overlap=True)
# Any other framework: off unless the notes say "comm overlap on" or AsyncTP.
_TP_OVERLAP_OFF = re.compile(r"qwen3-235b|deepseek-v3|llama 3 8b|_fp8_performance\.yaml")
_TP_OVERLAP_STATED_OFF = re.compile(r"no tp comm overlap|tp_comm_overlap false|comm overlap off")


def tp_overlap(row: dict, tp: int) -> bool:
    """Whether a row overlaps its tensor-parallel communication: as its notes say, else its framework's default
    (on for the NeMo and Megatron-Bridge recipes read, but those listed above)."""
    notes = (row["notes"] + " " + row["zero_fsdp"] + " " + row["precision"]).lower()
    if tp == 1 or _TP_OVERLAP_STATED_OFF.search(notes):
        return False
    if "comm overlap on" in notes or "asynctp" in row["model"].lower() + notes:
        return True
    return framework(row) == "nemo" and not _TP_OVERLAP_OFF.search((row["model"] + " " + row["source"]).lower())


# Data-parallel overlap of a Megatron-LM row whose notes quote its launch flags (five or more `--flags`): Megatron-LM's
# defaults unless they are among them.  --overlap-grad-reduce and --overlap-param-gather are store_true flags, off by
# default (megatron/training/arguments.py _add_distributed_args, core_v0.6.0 through core_v0.16.1): without them the
# gradients are reduced after the last backward and the distributed optimizer's parameters gathered after the step
# (Strategy.dp_overlap off; the first alone: grad).  NeMo and Megatron-Bridge rows, and rows that quote no flags,
# keep the profile's overlap (their recipes set both flags: hardware/data/runtimes/megatron.yaml `overlap`).
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]+")


def dp_overlap(row: dict) -> str:
    """The Strategy.dp_overlap a row ran with (on unless its quoted Megatron-LM flags leave the overlap out)."""
    flags = set(_FLAG.findall(row["notes"]))
    if not row["runtime"].startswith("megatron") or framework(row) == "nemo" or len(flags) < 5:
        return "on"
    if "--overlap-grad-reduce" not in flags:
        return "off"
    return "on" if "--overlap-param-gather" in flags else "grad"


# The attention kernel a row ran (Kernels.attention_kernel, hardware/data/attention.yaml), where its notes or its
# framework's release say so; the profile's otherwise:
#   a row naming its attention library: Megatron-DeepSpeed's --use-flash-attn-triton -> flash_triton (flash-attn's
#     Triton kernel, measured on A100 in the flash-attention README's plot); FlashAttention-3 -> flash3;
#     FlashAttention-2 -> flash2 (FlagPerf's Megatron-Core README lists 'flash attention 2' among its optimizations,
#     where the megatron profile's default is Transformer Engine's cuDNN attention); FlashAttention-4 -> cudnn.
#     FlashAttention-4 publishes no table as text; its paper puts it at or above cuDNN 9.13 on B200 (up to 1.3x
#     forward), so cuDNN's B200 measurement (tests/data/terms/attention.csv) stands for it as the nearest lower bound
#   torchtitan before October 2025: its attention called F.scaled_dot_product_attention in PyTorch's default order,
#     flash first (torchtitan commit 9dec370 models/llama/model.py), until torchtitan #1196 (3b85aa31f, 2025-05-14,
#     "Use cudnn backend on B200") put cuDNN first on compute capability 10.0 only; #1776 (6a3a9da95, 2025-10-09,
#     in v0.2.0) put cuDNN first on every device, as the torchtitan profiles (0.2.2) say.  A torchtitan row whose
#     notes or source date the run before October 2025 (a date, a dated benchmark file, an arXiv id before 2510)
#     runs flash2 off Blackwell
_FLASH_TRITON = re.compile(r"flash-attn-triton|flash_attn_triton")
_FLASH2 = re.compile(r"flash ?attention[- ]2\b|flash-attn 2\b|\bfa2\b")
_FLASH3 = re.compile(r"flashattention-3|flash-attn-3|flash_attn_3|\bfa3\b")
_FLASH4 = re.compile(r"flashattention-4|flash-attn-4|flash_attn_4|\bfa4\b")
_BEFORE_OCT_2025 = re.compile(r"_2024\d\d_|_20250\d_|\b2024\b|\b2025-0\d\b|commit 9dec370|"
                              r"arxiv:? ?(?:2[0-4]\d\d|250\d)\.\d|"
                              r"(?:january|february|march|april|may|june|july|august|september) 2025")
BLACKWELL = ("b200", "gb200")  # compute capability 10.0 (catalog device names)


def attention_kernel(row: dict, device: str, profile_kernel: str) -> str:
    """The attention kernel a row ran on `device` (catalog name): as its notes name it, else as the torchtitan
    release that ran it chose, else `profile_kernel`."""
    text = (row["model"] + " " + row["precision"] + " " + row["notes"]).lower()
    if _FLASH_TRITON.search(text):
        return "flash_triton"
    if _FLASH4.search(text):
        return "cudnn"
    if _FLASH3.search(text):
        return "flash3"
    if _FLASH2.search(text):
        return "flash2"
    dated = (row["notes"] + " " + row["source"]).lower()
    if row["runtime"].startswith("torchtitan") and device not in BLACKWELL and _BEFORE_OCT_2025.search(dated):
        return "flash2"
    return profile_kernel


# Kernels of the model code a row ran where its notes say it is not the code the runtime profile describes: a row
# whose notes say the model has no flash attention runs without it (the s^2 scores materialised), and one whose
# model runs HuggingFace's "eager attention" runs eager element-wise kernels too (transformers' GPT2Attention with
# attn_implementation "eager": matmul, softmax and dropout as separate PyTorch ops, no fusions)
_NO_FLASH = re.compile(r"\bno flash attention\b")
_EAGER_MODEL = re.compile(r"\beager attention\b")


def model_kernels(row: dict) -> tuple[bool, bool]:
    """(flash attention allowed, fused kernels allowed) for a row's model code (`Job.flash_attention`,
    `Job.fused_kernels`): both unless its notes say otherwise."""
    notes = row["notes"].lower()
    return not _NO_FLASH.search(notes), not _EAGER_MODEL.search(notes)


# FP8 parameters (Job.fp8_params) of an FP8 row: where its configuration says so (MLPerf NeMo packages' FP8_PARAMS=True
# or FP8_PARAM_GATHER=True in config_common*.sh, NeMo yamls' fp8_params true, Megatron-LM's --fp8-param-gather), and
# for the NeMo 2.x recipe API and Megatron-Bridge, whose FP8 precision recipes set them: NeMo
# nemo/collections/llm/recipes/precision/mixed_precision.py bf16_with_fp8_mixed `cfg.fp8_params = True` since
# 3e251a04 (2024-09-19, 'FP8 plugin recipes'), fp8_param_gather = True from 9d4e41e5 (2025-04-10), the current-scaling
# and MXFP8 recipes from 082e7e39 (2025-04-18); Megatron-Bridge src/megatron/bridge/training/mixed_precision.py (its
# delayed, current-scaling and MXFP8 recipes: fp8_param_gather = True).  A NeMo 2.x container running NeMo 1.x's
# megatron_gpt_pretraining.py on a yaml (Google's gpu-recipes) keeps the yaml's setting (default false).
_FP8_PARAMS = re.compile(r"fp8_params(?:=| )true|fp8_param_gather=true|fp8-param-gather")
_NEMO1_SCRIPT = re.compile(r"megatron_gpt_pretraining\.py")


def fp8_params(row: dict) -> bool:
    """Whether an FP8 row's weights were FP8 tensors (`Job.fp8_params`): its notes quote the setting, or it ran
    NeMo 2.x's recipe API or Megatron-Bridge at FP8."""
    if _precision(row) not in FP8_PRECISIONS:
        return False
    notes = row["notes"].lower()
    recipe_api = framework(row) == "nemo" and _nemo2(row) and not _NEMO1_SCRIPT.search(notes)
    return bool(_FP8_PARAMS.search(notes)) or recipe_api


# A chunked loss (`Loss.chunks` / `Loss.chunk_tokens`): torchtitan's ChunkedCELoss (components/loss.py,
# Config.num_chunks, default 8) and its successor ChunkedLossWrapper (Config.chunk_len, default 8,192 tokens:
# docs/chunked_loss.md) run the output projection and the loss chunk by chunk, forward and backward, before the
# decoder's backward.  A row whose notes name it gets the chunk count or length they state, else the default count.
_CHUNK_TOKENS = re.compile(r"chunked loss \(([\d,]+)-token chunks\)")
_NUMBER_WORDS = {"two": 2, "four": 4, "eight": 8, "sixteen": 16}
_CHUNKS = re.compile(rf"chunkedceloss \((\d+) chunks\)|(\d+|{'|'.join(_NUMBER_WORDS)}) loss chunks")
DEFAULT_LOSS_CHUNKS = 8


def loss_chunking(row: dict) -> dict:
    """The `Loss` fields of a row's chunked loss (chunks or chunk_tokens), {} when its notes name none."""
    notes = row["notes"].lower()
    if match := _CHUNK_TOKENS.search(notes):
        return {"chunk_tokens": int(match.group(1).replace(",", ""))}
    if match := _CHUNKS.search(notes):
        count = match.group(1) or match.group(2)
        return {"chunks": int(count) if count.isdigit() else _NUMBER_WORDS[count]}
    if "chunkedceloss" in notes:
        return {"chunks": DEFAULT_LOSS_CHUNKS}
    return {}


def _recompute_options(row: dict, blocks_per_chunk: int) -> list[dict]:
    """Recompute settings to try, cheapest first; the first that fits is used."""
    text = row["act_recompute"].lower()
    if "sac" in text:  # torchtitan's per-op SAC: the torchtitan profiles' own selective policy
        return [dict(recompute="selective")]
    for mode in ("selective", "full", "none"):
        if mode in text:
            return [dict(recompute=mode)]
    default = unpublished_recompute(row)
    if default is not None:
        return [dict(recompute=default)]
    partial = [dict(recompute="full", recompute_layers=(k,)) for k in range(1, blocks_per_chunk)]
    return [dict(recompute="none"), dict(recompute="selective"), *partial, dict(recompute="full")]


def build_case(row: dict) -> Case:
    """The job and strategy of one published row, under the row's runtime profile (`runtime_name`)."""
    runtime = load_runtime(runtime_name(row))
    cluster = _cluster(row)
    kernel = attention_kernel(row, load_catalog().node_device(cluster.pools[0].node).name,
                              runtime.kernels.attention_kernel)
    if kernel != runtime.kernels.attention_kernel:
        kernels = runtime.kernels.model_copy(update={"attention_kernel": kernel})
        runtime = runtime.model_copy(update={"kernels": kernels})
    if chunking := loss_chunking(row):
        runtime = runtime.model_copy(update={"loss": runtime.loss.model_copy(update=chunking)})
    model = _model(row, runtime.name)
    # the job allows flash attention and fused kernels unless the row's model code has neither (`model_kernels`); the
    # runtime profile says whether the framework has them
    routing = "balanced" if "balanced routing" in row["notes"].lower() else "learned"
    flash, fused = model_kernels(row)
    job = Job(model=model, cluster=cluster, global_batch=int(row["global_batch_seqs"]),
              seq_len=int(row["seq_len"]), precision=_precision(row), runtime=runtime, moe_routing=routing,
              flash_attention=flash, fused_kernels=fused, fp8_params=fp8_params(row))
    base = _base_strategy(row)
    if base["vpp"] > 1:
        base["split"] = _interleaved_split(model.num_blocks, base["pp"], base["vpp"])
    else:
        base["split"] = _megatron_split(row, model.num_blocks, base["pp"])
    blocks_per_chunk = max(1, model.num_blocks // (base["pp"] * base["vpp"]))
    strategy = None
    for option in _recompute_options(row, blocks_per_chunk):
        strategy = Strategy(**option, **base)
        if evaluate(job, strategy).memory.fits:
            break
    return Case(row=row, job=job, strategy=strategy)


def read_rows(tier: str = "A", path: Path = CSV_PATH) -> list[dict]:
    """The rows of `tier` ('all': every row) of `path` (default tests/data/published_runs.csv), in file order."""
    with Path(path).open(newline="") as handle:
        return [row for row in csv.DictReader(handle) if tier == "all" or row["tier"] == tier]


def load_cases(tier: str = "A", path: Path = CSV_PATH) -> list[Case]:
    """Every row of the given tier ('all': every tier) of `path` as a Case."""
    return [build_case(row) for row in read_rows(tier, path)]


def check_rows(rows: list[dict]) -> list[tuple[str, str]]:
    """(id, reason) for every row that does not build into a job and a strategy; nothing else is reported,
    so a holdout can be checked without being scored (no prediction, error or memory verdict leaves here)."""
    failures = []
    for row in rows:
        try:
            build_case(row)
        except (KeyError, ValueError, StopIteration, TypeError) as exc:  # ValidationError is a ValueError
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            failures.append((row.get("id", "?"), f"{type(exc).__name__}: {reason}"))
    return failures


@dataclass(frozen=True)
class Result:
    case: Case
    estimate: Estimate

    @property
    def error(self) -> float | None:
        """Relative error of predicted vs published tokens/s per GPU (None: nothing published)."""
        if self.case.published is None:
            return None
        return self.estimate.tokens_per_s_per_gpu / self.case.published - 1.0

    @property
    def inside_interval(self) -> bool | None:
        """Whether the published throughput lies inside the estimate's prediction interval (None: nothing
        published): the published step time, step_time_s x predicted / published tokens/s, within [low_s, high_s]."""
        if self.case.published is None:
            return None
        step = self.estimate.step_time_s * self.estimate.tokens_per_s_per_gpu / self.case.published
        return self.estimate.interval.low_s <= step <= self.estimate.interval.high_s

    @property
    def peak_gib(self) -> float:
        """Predicted peak HBM per GPU (the fullest stage), GiB."""
        return self.estimate.memory.peak_bytes / GIB

    @property
    def compared_peak_gib(self) -> float:
        """The predicted peak as the published figure counts it (`PEAK_KINDS`), GiB: the fullest stage's."""
        kind = self.case.published_peak_kind
        fixed = load_catalog().constant("memory_reserve_bytes")  # outside PyTorch: CUDA context and NCCL
        outside = {"device": lambda st: 0.0, "reserved": lambda st: fixed, "allocated": lambda st: st.reserve_bytes}
        return max(st.peak_bytes - outside[kind](st) for st in self.estimate.memory.per_stage) / GIB

    @property
    def memory_error(self) -> float | None:
        """Relative error of the predicted peak, counted as the published one is, against it (None: nothing
        published)."""
        published = self.case.published_peak_gib
        return None if published is None else self.compared_peak_gib / published - 1.0


def run(tier: str = "A", catalog: Catalog | None = None, path: Path = CSV_PATH) -> list[Result]:
    """Evaluate every row of the tier ('all': every tier) of `path`, with `catalog`'s constants (default
    constants.yaml); the cases are built with constants.yaml's either way."""
    return evaluate_cases(load_cases(tier, path), catalog)


def evaluate_cases(cases: list[Case], catalog: Catalog | None = None) -> list[Result]:
    """Evaluate fixed cases with `catalog`'s constants (default: constants.yaml)."""
    return [Result(case, evaluate(case.job, case.strategy, catalog=catalog)) for case in cases]


def with_constants(values: dict[str, float], catalog: Catalog | None = None) -> Catalog:
    """A copy of the catalog (default: the built-in one) with these constants' values replaced."""
    catalog = catalog or load_catalog()
    unknown = sorted(set(values) - set(catalog.constants))
    if unknown:
        raise KeyError(f"unknown constants {unknown}; known: {', '.join(sorted(catalog.constants))}")
    constants = dict(catalog.constants)
    for name, value in values.items():
        constants[name] = constants[name].model_copy(update={"value": float(value)})
    return catalog.model_copy(update={"constants": constants})


def parse_constants(text: str) -> dict[str, float]:
    """'name=value,name=value' -> {name: value}."""
    values = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"expected name=value, got {item!r}")
        values[name.strip()] = float(value)
    return values


# ----------------------------------------------------------------------------- groupings


def source_key(row: dict) -> str:
    """The publication or repository a row comes from: the arXiv id or the owner/repo its `source` starts
    with ('arXiv 2104.04473', 'NVIDIA/dgxc-benchmarking', 'pytorch/torchtitan', ...).  Rows of one paper
    share a key whatever table they come from (SC21 Tables 1 and 2 are both 'arXiv 2104.04473')."""
    text = row["source"].strip()
    match = re.match(r"arXiv (\d{4}\.\d{4,5})", text)
    if match:
        return f"arXiv {match.group(1)}"
    match = re.match(r"([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)", text)
    if match:
        return match.group(1)
    return text.split(";")[0].split()[0] if text else "?"


def source_document(row: dict) -> tuple[str, ...]:
    """The document a row's `source` starts with, as the strings that name it: ('2201.11990',) for an arXiv
    paper, (owner/repo, path) for a file of a repository, (url,) for a web page.  Finer than `source_key`:
    two files of one repository, or two papers, are two documents."""
    text = row["source"].strip()
    for pattern in (r"arXiv (\d{4}\.\d{4,5})", r"(https?://[^\s;,]+)", r"([A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+) ([^\s;,]+)"):
        match = re.match(pattern, text)
        if match:
            return match.groups()
    raise ValueError(f"row {row.get('id', '?')}: source {text[:60]!r} names no arXiv paper, repository file or URL")


def cites(document: tuple[str, ...], text: str) -> bool:
    """Whether a source text names `document` (every string of it appears)."""
    return all(part in text for part in document)


_DEVICE_FAMILIES = ("MI300X", "B200", "H200", "H100", "A100", "L4")


def device_family(row: dict) -> str:
    """GPU family of a row's gpu_type: A100, H100, MI300X, ... (the gpu_type itself when none matches)."""
    return next((family for family in _DEVICE_FAMILIES if family in row["gpu_type"]), row["gpu_type"])


# model size ranges of the "size" grouping, by the model's total parameters (MoE: every expert counted): upper
# bound (exclusive) and label; the last range is open.  Decades, so a reader can place any model without a table.
SIZE_RANGES = ((1e9, "<1B"), (1e10, "1B-10B"), (1e11, "10B-100B"), (float("inf"), ">=100B"))


def size_range(params: float) -> str:
    """The SIZE_RANGES label of a model with `params` parameters."""
    return next(label for bound, label in SIZE_RANGES if params < bound)


GROUPINGS = {
    "source": lambda case: source_key(case.row),
    "device": lambda case: device_family(case.row),
    "family": lambda case: parallel_family(case.strategy),
    "runtime": lambda case: case.runtime,
    "sequence": lambda case: seq_range(case.job.seq_len),
    "size": lambda case: size_range(case.job.model.params),
}


def print_grouped(results: list[Result], by: str, kind: str = "throughput", out=sys.stdout) -> None:
    """Median and max |error| of `kind` ('throughput' or 'memory') per value of grouping `by` (GROUPINGS)."""
    key = GROUPINGS[by]
    value = (lambda r: r.error) if kind == "throughput" else (lambda r: r.memory_error)
    groups: dict[str, list[Result]] = {}
    for r in results:
        if value(r) is not None:
            groups.setdefault(key(r.case), []).append(r)
    what = "tokens/s per GPU" if kind == "throughput" else "peak HBM per GPU"
    print(f"\n{what} error by {by}", file=out)
    header = f"{by:<26} {'n':>3} {'median |err|':>12} {'max |err|':>10}  rows"
    print(header, file=out)
    print("-" * len(header), file=out)
    for name in sorted(groups):
        members = groups[name]
        median, worst = _stats([value(r) for r in members])
        ids = ",".join(r.case.row["id"] for r in members)
        print(f"{name:<26} {len(members):>3} {median:>12.1%} {worst:>10.1%}  {ids}", file=out)


def _stats(errors: list[float]) -> tuple[float, float]:
    absolute = [abs(e) for e in errors]
    return statistics.median(absolute), max(absolute)


def summary(results: list[Result]) -> tuple[float, float]:
    """(median, max) absolute relative error of the rows that publish a throughput."""
    return _stats([r.error for r in results if r.error is not None])


def memory_summary(results: list[Result]) -> tuple[float, float]:
    """(median, max) absolute relative error of predicted vs published peak HBM, on the rows that publish it."""
    return _stats([r.memory_error for r in results if r.memory_error is not None])


def error_groups(results: list[Result], kind: str = "throughput") -> list[tuple[str, str, list[float]]]:
    """(runtime, row set, errors) for every runtime and row set (ids < 200, > 200, all), then 'all'
    runtimes; `kind` is 'throughput' or 'memory'.  Groups without errors are left out."""
    value = (lambda r: r.error) if kind == "throughput" else (lambda r: r.memory_error)
    sets = (("< 200", lambda r: not r.case.new), ("> 200", lambda r: r.case.new), ("all", lambda r: True))
    runtimes = sorted({r.case.runtime for r in results})
    out = []
    for runtime in (*runtimes, "all"):
        for label, keep in sets:
            errors = [value(r) for r in results
                      if (runtime == "all" or r.case.runtime == runtime) and keep(r) and value(r) is not None]
            if errors:
                out.append((runtime, label, errors))
    return out


def print_groups(results: list[Result], kind: str = "throughput", out=sys.stdout) -> None:
    """The per-runtime error summary of `kind` ('throughput' or 'memory')."""
    what = "tokens/s per GPU" if kind == "throughput" else "peak HBM per GPU"
    print(f"\n{what} error by runtime (rows ids < 200: in-sample; > 200: added since, out of sample)",
          file=out)
    header = f"{'runtime':<22} {'rows':<8} {'n':>3} {'median |err|':>12} {'max |err|':>10}"
    print(header, file=out)
    print("-" * len(header), file=out)
    for runtime, label, errors in error_groups(results, kind):
        median, worst = _stats(errors)
        print(f"{runtime:<22} {label:<8} {len(errors):>3} {median:>12.1%} {worst:>10.1%}", file=out)


def print_table(results: list[Result], out=sys.stdout) -> None:
    header = (f"{'id':>3} {'model':<44} {'runtime':<22} {'gpus':>5} {'strategy':<34} {'published':>9} "
              f"{'predicted':>9} {'error':>7} {'mfu':>5} fits {'peak GiB':>8} {'as publ.':>8} {'publ.':>7} "
              f"{'mem err':>7}")
    print(header, file=out)
    print("-" * len(header), file=out)
    for r in results:
        s = r.case.strategy
        rc = s.recompute + (f"x{s.recompute_layers}" if s.recompute_layers else "")
        short = f"tp{s.tp} pp{s.pp} dp{s.dp} cp{s.cp} mbs{s.mbs} v{s.vpp} z{s.zero} {rc}"
        published = f"{r.case.published:>9.1f}" if r.case.published is not None else f"{'-':>9}"
        error = f"{r.error:>+7.1%}" if r.error is not None else f"{'-':>7}"
        peak = r.case.published_peak_gib
        # the predicted peak counted as the published one is (d: device, r: reserved, a: allocated)
        memory = (f"{r.compared_peak_gib:>8.1f} {peak:>6.1f}{r.case.published_peak_kind[0]} {r.memory_error:>+7.1%}"
                  if peak is not None else f"{'-':>8} {'-':>7} {'-':>7}")
        print(f"{r.case.row['id']:>3} {r.case.row['model'][:44]:<44} {r.case.runtime:<22} {r.estimate.num_gpus:>5} "
              f"{short:<34} {published} {r.estimate.tokens_per_s_per_gpu:>9.1f} {error} "
              f"{r.estimate.mfu:>5.1%} {'yes' if r.estimate.memory.fits else 'NO ':<4} {r.peak_gib:>8.1f} {memory}",
              file=out)
    median, worst = summary(results)
    scored = sum(r.error is not None for r in results)
    print(f"\nrows {len(results)} ({scored} with a published throughput)  median |error| {median:.1%}  "
          f"max |error| {worst:.1%}", file=out)
    inside = [r.inside_interval for r in results if r.inside_interval is not None]
    if inside:
        coverage = results[0].estimate.interval.coverage
        print(f"{coverage:.0%} prediction interval holds {sum(inside)} of {len(inside)} published throughputs",
              file=out)
    with_memory = sum(r.memory_error is not None for r in results)
    if with_memory:
        median, worst = memory_summary(results)
        print(f"peak HBM: {with_memory} rows publish it  median |error| {median:.1%}  max |error| {worst:.1%}",
              file=out)
    print_groups(results, "throughput", out)
    if any(r.memory_error is not None for r in results):
        print_groups(results, "memory", out)


def print_check(rows: list[dict], path: Path, out=sys.stdout) -> int:
    """Print which rows of `path` do not build (`check_rows`); 0 when every row builds, else 1."""
    failures = check_rows(rows)
    for row_id, reason in failures:
        print(f"{path}: row {row_id}: {reason}", file=out)
    print(f"{path}: {len(rows) - len(failures)} of {len(rows)} rows build", file=out)
    return 1 if failures else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier", default="A", help="row tier: A (default), B, or all")
    parser.add_argument("--csv", type=Path, help="write the rows as CSV")
    parser.add_argument("--compile", action="store_true", help="also compile every row and compare")
    parser.add_argument("--time-limit", type=float, default=60.0, help="compile time limit per row (default 60 s)")
    parser.add_argument("--ids", help="only these row ids, comma-separated")
    parser.add_argument("--constants", help="cost with these constant values: name=value,... (the cases, and "
                        "the recompute setting they pick by memory, stay those of constants.yaml)")
    parser.add_argument("--groups", action="store_true", help="also print the errors per source, device family, "
                        "parallelism family, sequence range and model size")
    parser.add_argument("--runs", type=Path, default=CSV_PATH, help="the runs file (default "
                        "tests/data/published_runs.csv; the frozen holdouts are tests/data/holdout*_runs.csv)")
    parser.add_argument("--check", action="store_true", help="only build every row (all tiers) and list the "
                        "rows that do not build; prints no prediction and no error (for the frozen holdout)")
    args = parser.parse_args()
    if args.check:
        sys.exit(print_check(read_rows("all", args.runs), args.runs))
    catalog = with_constants(parse_constants(args.constants)) if args.constants else None
    results = run(args.tier, catalog, args.runs)
    if args.ids:
        wanted = {i.strip() for i in args.ids.split(",")}
        results = [r for r in results if r.case.row["id"] in wanted]
    print_table(results)
    if args.groups:
        for by in ("source", "device", "family", "sequence", "size"):
            print_grouped(results, by)
    if args.compile:
        print()
        progress = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
        from published_compile import compile_rows, print_compile_table  # the compiler's half of the bench

        print_compile_table(compile_rows([r.case for r in results], args.time_limit, progress))
    if args.csv:
        with args.csv.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["id", "model", "runtime", "strategy", "published", "predicted", "error", "mfu", "fits",
                             "peak_gib", "published_peak_gib", "memory_error", "published_peak_kind",
                             "compared_peak_gib"])
            for r in results:
                optional = lambda value, fmt: "" if value is None else format(value, fmt)  # noqa: E731
                writer.writerow([r.case.row["id"], r.case.row["model"], r.case.runtime, r.estimate.strategy_spec,
                                 optional(r.case.published, "g"), f"{r.estimate.tokens_per_s_per_gpu:.2f}",
                                 optional(r.error, ".4f"), f"{r.estimate.mfu:.4f}", r.estimate.memory.fits,
                                 f"{r.peak_gib:.2f}", optional(r.case.published_peak_gib, "g"),
                                 optional(r.memory_error, ".4f"),
                                 r.case.published_peak_kind if r.case.published_peak_gib is not None else "",
                                 f"{r.compared_peak_gib:.2f}" if r.case.published_peak_gib is not None else ""])


if __name__ == "__main__":
    main()
