"""megatron-core 0.16.1's configs and GPT model built from the flags planner writes for pretrain_gpt.py.

`core_config(args)` does what Megatron-LM core_v0.16.1 does between argparse and the model
(megatron/training/arguments.py: the parts of `validate_args` that change config fields, then
`core_transformer_config_from_args`), for the flags planner emits, and returns megatron-core's own
`TransformerConfig` or `MLATransformerConfig`: its __post_init__ runs Megatron's model checks.
Every flag must be classified below (a config field, a GPTModel argument, or a training-loop flag), so a
new flag fails here until someone says where Megatron reads it.

CPU-only differences, each one a refusal of megatron-core 0.16.1 without a GPU or Transformer Engine
(none changes a size):
* apply_rope_fusion is forced off: TransformerConfig raises "apply_rope_fusion is not available. Please
  install TE >= 1.4" (pretrain_gpt.py turns it on unless --no-rope-fusion);
* `gpt_model_params` swaps the all-to-all token dispatcher for allgather: MoEAlltoAllTokenDispatcher
  creates a torch.cuda.Stream() in its constructor ("torch.cuda.Stream requires CUDA support"); a
  dispatcher holds no parameters.  It builds experts as SequentialMLP, not grouped GEMMs (the grouped
  kernels need Transformer Engine or grouped_gemm; the same expert weights), and Nemotron's LayerNorm
  without --apply-layernorm-1p (torch's LayerNorm asserts "zero_centered_gamma not supported"; the same
  weight and bias);
* `gpt_model_params` refuses multi-latent attention: MLASelfAttention needs Transformer Engine
  (`isinstance(self.linear_proj, TELinear)` with TELinear None, and the local DotProductAttention takes no
  k_channels), so DeepSeek-V3 is checked at the config level only.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from typing import Any

import torch
import torch.nn.functional as F

warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex are not installed.*")

from megatron.core.activations import squared_relu  # noqa: E402
from megatron.core.transformer import MLATransformerConfig, TransformerConfig  # noqa: E402
from megatron.core.transformer.enums import AttnBackend, LayerType  # noqa: E402,F401 (LayerType: tests read layouts)

# flag -> TransformerConfig field where argparse's dest is the field (core_transformer_config_from_args
# copies every args attribute named like a field)
SAME = ("tensor-model-parallel-size", "pipeline-model-parallel-size", "context-parallel-size",
        "expert-model-parallel-size", "expert-tensor-parallel-size", "sequence-parallel", "tp-comm-overlap",
        "num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "kv-channels", "normalization",
        "attention-dropout", "hidden-dropout", "init-method-std", "add-qkv-bias", "qk-layernorm",
        "multi-latent-attention", "q-lora-rank", "kv-lora-rank", "qk-head-dim", "qk-pos-emb-head-dim",
        "v-head-dim", "rotary-base", "rotary-percent", "rope-type", "moe-ffn-hidden-size", "moe-router-topk",
        "moe-shared-expert-intermediate-size", "moe-token-dispatcher-type", "moe-grouped-gemm",
        "moe-router-dtype", "moe-router-load-balancing-type", "moe-aux-loss-coeff", "moe-router-score-function",
        "moe-router-enable-expert-bias", "moe-router-topk-scaling-factor", "moe-router-num-groups",
        "moe-router-group-topk", "moe-router-pre-softmax", "overlap-moe-expert-parallel-comm", "delay-wgrad-compute",
        "moe-flex-dispatcher-backend",
        "recompute-granularity", "recompute-method",
        "recompute-num-layers", "bf16", "fp16", "fp8-recipe", "pipeline-model-parallel-layout")
# flag -> field under another name (argparse dest differs, or core_transformer_config_from_args renames)
RENAMED = {"norm-epsilon": "layernorm_epsilon", "num-experts": "num_moe_experts",
           "fp8-param-gather": "fp8_param",  # arguments.py core_transformer_config_from_args: kw_args['fp8_param']
           "apply-layernorm-1p": "layernorm_zero_centered_gamma", "fp8-format": "fp8",
           "decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
           "decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage"}
# store_false flags: field set to False
NEGATED = {"disable-bias-linear": "add_bias_linear", "no-masked-softmax-fusion": "masked_softmax_fusion",
           "no-bias-dropout-fusion": "bias_dropout_fusion", "no-rope-fusion": "apply_rope_fusion",
           "no-gradient-accumulation-fusion": "gradient_accumulation_fusion"}
# read by the GPTModel builder (gpt_builders.py) or by pretrain_gpt's tokenizer, not the config
MODEL = ("seq-length", "max-position-embeddings", "position-embedding-type", "untie-embeddings-and-output-weights",
         "use-rope-scaling", "make-vocab-size-divisible-by", "tokenizer-type")
# handled below: activation, GQA, interleaving, MoE pattern, window, attention backend, fusions
SPECIAL = ("swiglu", "squared-relu", "group-query-attention", "num-query-groups",
           "num-layers-per-virtual-pipeline-stage", "moe-layer-freq", "window-size", "attention-backend",
           "no-bias-gelu-fusion", "no-bias-swiglu-fusion")
# the training loop, optimizer, data and checkpoints: no config field
TRAINING = ("micro-batch-size", "global-batch-size", "use-distributed-optimizer", "num-distributed-optimizer-instances",
            "overlap-grad-reduce", "overlap-param-gather", "optimizer-cpu-offload", "optimizer-offload-fraction",
            "use-precision-aware-optimizer", "optimizer", "lr", "min-lr", "lr-decay-style", "lr-warmup-iters",
            "weight-decay", "clip-grad", "adam-beta1", "adam-beta2", "adam-eps", "train-iters", "split",
            "eval-iters", "eval-interval", "ckpt-format", "save", "load", "save-interval", "data-path",
            "tokenizer-model", "use-megatron-fsdp", "data-parallel-sharding-strategy")


def parse_args_txt(text: str) -> dict[str, Any]:
    """args.txt (one `--flag [value]` per line) as flag -> value, True for a bare flag."""
    args: dict[str, Any] = {}
    for line in text.splitlines():
        flag, _, value = line.partition(" ")
        assert flag.startswith("--") and flag[2:] not in args, line
        args[flag[2:]] = value or True
    return args


def _number(value: Any) -> int | float | str:
    text = str(value)
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _layer_pattern(text: str) -> list[int] | int:
    if text.isdigit():
        return int(text)
    assert re.fullmatch(r"[\d\[\]()+*,]+", text), text  # what Megatron's _eval_pattern admits
    return eval(text, {"__builtins__": {}}, {})  # noqa: S307 -- digits and list operators only


def core_config(args: dict[str, Any]) -> TransformerConfig:
    """megatron-core's TransformerConfig (MLATransformerConfig with --multi-latent-attention) of `args`."""
    unknown = set(args) - set(SAME) - set(RENAMED) - set(NEGATED) - set(MODEL) - set(SPECIAL) - set(TRAINING)
    assert not unknown, f"flags with no known place in Megatron: {sorted(unknown)}"
    kw: dict[str, Any] = {}
    for flag in SAME:
        if flag in args:
            kw[flag.replace("-", "_")] = True if args[flag] is True else _number(args[flag])
    for flag, field in RENAMED.items():
        if flag in args:
            kw[field] = True if args[flag] is True else _number(args[flag])
    for flag, field in NEGATED.items():
        if flag in args:
            kw[field] = False
    # validate_args: --sequence-parallel is dropped at tp=1; every linear bias includes Q/K/V
    if kw.get("tensor_model_parallel_size", 1) == 1:
        kw["sequence_parallel"] = False
    if kw.get("add_bias_linear", True):
        kw["add_qkv_bias"] = True
    # core_transformer_config_from_args: activation, its bias fusion, query groups, pipeline dtype
    if args.get("swiglu"):
        kw.update(activation_func=F.silu, gated_linear_unit=True,
                  bias_activation_fusion=not args.get("no-bias-swiglu-fusion"))
    else:  # validate_args turns the gelu fusion off without biases
        kw["bias_activation_fusion"] = kw.get("add_bias_linear", True) and not args.get("no-bias-gelu-fusion")
    if args.get("squared-relu"):
        kw["activation_func"] = squared_relu
    kw["num_query_groups"] = int(args["num-query-groups"]) if args.get("group-query-attention") else None
    kw["masked_softmax_fusion"] = kw.get("masked_softmax_fusion", True)
    dtype = torch.half if args.get("fp16") else torch.bfloat16 if args.get("bf16") else torch.float
    kw.update(params_dtype=dtype, pipeline_dtype=dtype)
    chunk = args.get("num-layers-per-virtual-pipeline-stage")
    if chunk is not None:  # validate_args: vpp = layers per stage / layers per virtual stage
        vpp = int(args["num-layers"]) // int(args["pipeline-model-parallel-size"]) // int(chunk)
        kw["virtual_pipeline_model_parallel_size"] = vpp if vpp > 1 else None
    if "moe-layer-freq" in args:
        kw["moe_layer_freq"] = _layer_pattern(str(args["moe-layer-freq"]))
    if "window-size" in args:
        kw["window_size"] = tuple(int(v) for v in str(args["window-size"]).split(","))
    if "attention-backend" in args:
        kw["attention_backend"] = AttnBackend[str(args["attention-backend"])]
    kw["apply_rope_fusion"] = False  # CPU: no Transformer Engine (module docstring)
    cls = MLATransformerConfig if args.get("multi-latent-attention") else TransformerConfig
    # like core_transformer_config_from_args, pass what the class has: RoPE settings are MLA config fields,
    # and GPTModel arguments otherwise
    fields = {f.name for f in dataclasses.fields(cls)}
    assert set(kw) - fields <= {"rotary_base", "rotary_percent", "rope_type"}, set(kw) - fields
    return cls(**{key: value for key, value in kw.items() if key in fields})


def ddp_config(args: dict[str, Any]):
    """megatron-core's DistributedDataParallelConfig as pretrain_gpt.py fills it (training.py get_model: the
    args named like its fields; bf16 reduces gradients in fp32 unless --grad-reduce-in-bf16)."""
    from megatron.core.distributed import DistributedDataParallelConfig

    return DistributedDataParallelConfig(
        overlap_grad_reduce=bool(args.get("overlap-grad-reduce")),
        overlap_param_gather=bool(args.get("overlap-param-gather")),
        use_distributed_optimizer=bool(args.get("use-distributed-optimizer")),
        num_distributed_optimizer_instances=int(args.get("num-distributed-optimizer-instances", 1)),
        grad_reduce_in_fp32=bool(args.get("bf16")))


def optimizer_config(args: dict[str, Any]):
    """megatron-core's OptimizerConfig of `args` (training.py get_megatron_optimizer_config: the args named
    like its fields)."""
    from megatron.core.optimizer import OptimizerConfig

    names = ("optimizer", "lr", "min-lr", "weight-decay", "adam-beta1", "adam-beta2", "adam-eps", "clip-grad",
             "optimizer-offload-fraction")
    flags = ("bf16", "fp16", "use-distributed-optimizer", "overlap-param-gather", "optimizer-cpu-offload",
             "use-precision-aware-optimizer")
    kw = {name.replace("-", "_"): _number(args[name]) for name in names if name in args}
    kw.update({flag.replace("-", "_"): bool(args.get(flag)) for flag in flags})
    return OptimizerConfig(**kw)


def padded_vocab(tokenizer_vocab: int, args: dict[str, Any]) -> int:
    """The vocabulary rows Megatron builds (megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding)."""
    multiple = int(args["make-vocab-size-divisible-by"]) * int(args["tensor-model-parallel-size"])
    return int(math.ceil(tokenizer_vocab / multiple) * multiple)


# ---------------------------------------------------------------- the model itself (run in a subprocess)

# parallel flags set to 1 to count the whole model on one rank
_WHOLE = {"tensor-model-parallel-size": 1, "pipeline-model-parallel-size": 1, "context-parallel-size": 1,
          "expert-model-parallel-size": 1, "expert-tensor-parallel-size": 1}
_STAGED = ("sequence-parallel", "tp-comm-overlap", "decoder-first-pipeline-num-layers",
           "decoder-last-pipeline-num-layers", "num-layers-per-virtual-pipeline-stage",
           "pipeline-model-parallel-layout")


def gpt_model_params(args: dict[str, Any], tokenizer_vocab: int) -> int:
    """Parameters of the GPTModel pretrain_gpt.py builds from `args` (megatron-core's local layer specs, on
    the meta device, on one rank); needs torch.distributed and parallel_state initialized (`main`)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec

    assert not args.get("multi-latent-attention"), "MLA needs Transformer Engine (module docstring)"
    whole = {k: v for k, v in args.items() if k not in _STAGED}
    whole.update(_WHOLE)
    if "num-experts" in args:  # CPU: no CUDA stream for all-to-all, no grouped-GEMM kernel (same weights)
        whole.update({"moe-token-dispatcher-type": "allgather"})
        whole.pop("moe-grouped-gemm", None)
    whole.pop("apply-layernorm-1p", None)  # CPU: torch's LayerNorm has no 1 + gamma form (same weights)
    config = core_config(whole)
    config.use_cpu_initialization, config.perform_initialization = True, False
    if "num-experts" in args:
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=config.normalization)
    else:
        spec = get_gpt_layer_local_spec(normalization=config.normalization, qk_layernorm=config.qk_layernorm)
    with torch.device("meta"):
        model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=padded_vocab(tokenizer_vocab, args),
                         max_sequence_length=int(args["max-position-embeddings"]),
                         position_embedding_type=str(args["position-embedding-type"]),
                         rotary_percent=float(args.get("rotary-percent", 1.0)),
                         rotary_base=int(args.get("rotary-base", 10000)),
                         rope_scaling=bool(args.get("use-rope-scaling")),
                         share_embeddings_and_output_weights=not args.get("untie-embeddings-and-output-weights"))
    return sum(p.numel() for p in model.parameters())


def main() -> None:
    """stdin: JSON {name: [args.txt text, tokenizer vocabulary]}; stdout: JSON {name: parameters}."""
    import json
    import sys
    import tempfile

    import torch.distributed as dist
    from megatron.core import parallel_state

    cases = json.load(sys.stdin)
    with tempfile.TemporaryDirectory() as folder:  # a file store: no port to pick
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
        parallel_state.initialize_model_parallel(1, 1)
        counts = {name: gpt_model_params(parse_args_txt(text), vocab) for name, (text, vocab) in cases.items()}
        dist.destroy_process_group()
    print(json.dumps(counts))


if __name__ == "__main__":
    main()
