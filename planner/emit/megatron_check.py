"""Our own re-implementation of the Megatron-LM argument rules that a plan can break.

Megatron-LM checks its arguments in `megatron/training/arguments.py`
(`validate_args`) and in `TransformerConfig.__post_init__`; a wrong set
fails minutes into a job, after the container has started on every node.
`check_megatron_args` runs the same rules offline on the argument dict the
emitter writes (keys are the flag names without the leading dashes, e.g.
"tensor-model-parallel-size"; store-true flags map to True) and returns one
message per broken rule, [] when the set is valid.

Flags: every key must be a `pretrain_gpt.py` flag of Megatron-LM core_v0.16.1
(`FLAGS`: the flags planner writes, with the type or choices its argparse
parser gives them; read off `add_megatron_arguments` of that release) and its
value must parse as that type.  tests/test_megatron_lm_parser.py checks FLAGS against the actions of
Megatron-LM's own parser (vendored in tests/data/megatron_lm_core_v0.16.1/) and runs its parse_args and
validate_args on what the emitter writes.

Rules (Megatron-LM core_v0.16.1; most date from core_r0.12):

* world_size % (tp * pp * cp) == 0; dp = world_size / (tp * pp * cp).
* global batch % (micro batch * dp) == 0 (the micro-batch calculator).
* --sequence-parallel needs tp > 1 (Megatron silently turns it off; we refuse).
* attention heads % tp == 0 and query groups % tp == 0 (TransformerConfig).
* seq_length % (2 * cp) == 0 with context parallelism (load-balanced causal split).
* interleaved pipeline (--num-layers-per-virtual-pipeline-stage N): pp > 1
  (pp > 2 without --overlap-p2p-communication in older releases; overlap is
  the default since core_r0.9) and num_layers % (pp * N) == 0; not combined
  with uneven first/last stages.
* layers per stage: num_layers % pp == 0, or with
  --decoder-first/last-pipeline-num-layers the remaining layers divide evenly
  over the remaining stages.
* experts: num_experts % ep == 0.
* --recompute-num-layers <= layers per pipeline stage (per virtual stage
  with interleaving); --recompute-method needs --recompute-granularity full.
* --use-distributed-optimizer needs dp > 1 to shard anything (warning-level:
  not reported).
* --overlap-param-gather needs --use-distributed-optimizer and
  --overlap-grad-reduce; --optimizer-cpu-offload needs
  --use-precision-aware-optimizer; --tp-comm-overlap needs --sequence-parallel.
* --use-megatron-fsdp needs --ckpt-format fsdp_dtensor, and fsdp_dtensor needs
  --use-megatron-fsdp (validate_args).
* --num-query-groups takes effect only with --group-query-attention, which
  excludes --multi-latent-attention; --swiglu excludes --squared-relu.
* max-position-embeddings >= seq-length; min-lr <= lr.
* experts: world size % (expert-tensor-parallel-size x ep x pp) == 0 (the
  expert groups of parallel_state); moe-router-topk <= num-experts; a top-1
  softmax router needs --moe-router-pre-softmax; the expert bias needs the
  sigmoid score; --moe-router-group-topk needs --moe-router-num-groups;
  --moe-layer-freq lists one entry per layer.
* --overlap-moe-expert-parallel-comm (TransformerConfig.__post_init__): ep > 1,
  no full recompute, a virtual pipeline size with pp > 1 (--num-layers-per-virtual-pipeline-stage or a
  --pipeline-model-parallel-layout of more than pp chunks), and
  with it --delay-wgrad-compute as the MoE README pairs them.
"""

from __future__ import annotations

import re
from typing import Any

# pretrain_gpt.py flags planner writes, by the type argparse parses them as (core_v0.16.1)
_INT = ("context-parallel-size", "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers",
        "eval-interval", "eval-iters", "expert-model-parallel-size", "expert-tensor-parallel-size",
        "ffn-hidden-size", "global-batch-size", "hidden-size", "kv-channels", "kv-lora-rank", "lr-warmup-iters",
        "make-vocab-size-divisible-by", "max-position-embeddings", "micro-batch-size", "moe-ffn-hidden-size",
        "moe-router-group-topk", "moe-router-num-groups", "moe-router-topk", "moe-shared-expert-intermediate-size",
        "num-attention-heads", "num-distributed-optimizer-instances", "num-experts", "num-layers",
        "num-layers-per-virtual-pipeline-stage", "num-query-groups", "pipeline-model-parallel-size",
        "q-lora-rank", "qk-head-dim", "qk-pos-emb-head-dim", "recompute-num-layers", "rotary-base",
        "save-interval", "seq-length", "tensor-model-parallel-size", "train-iters", "v-head-dim")
_FLOAT = ("adam-beta1", "adam-beta2", "adam-eps", "attention-dropout", "clip-grad", "hidden-dropout",
          "init-method-std", "lr", "min-lr", "moe-aux-loss-coeff", "moe-router-topk-scaling-factor", "norm-epsilon",
          "optimizer-offload-fraction", "rotary-percent", "weight-decay")
_TRUE = ("add-qkv-bias", "apply-layernorm-1p", "bf16", "delay-wgrad-compute", "disable-bias-linear", "fp16",
         "fp8-param-gather",
         "group-query-attention", "overlap-moe-expert-parallel-comm",
         "moe-grouped-gemm", "moe-router-enable-expert-bias", "moe-router-pre-softmax", "multi-latent-attention",
         "no-bias-dropout-fusion", "no-bias-gelu-fusion", "no-bias-swiglu-fusion", "no-gradient-accumulation-fusion",
         "no-masked-softmax-fusion",
         "no-rope-fusion", "optimizer-cpu-offload", "overlap-grad-reduce", "overlap-param-gather", "qk-layernorm",
         "sequence-parallel", "squared-relu", "swiglu", "tp-comm-overlap", "untie-embeddings-and-output-weights",
         "use-distributed-optimizer", "use-megatron-fsdp", "use-precision-aware-optimizer", "use-rope-scaling")
_STR = ("data-path", "load", "pipeline-model-parallel-layout", "save", "split", "tokenizer-model")
_CHOICES: dict[str, tuple[str, ...]] = {
    "attention-backend": ("flash", "fused", "unfused", "local", "auto"),
    "ckpt-format": ("torch", "torch_dist", "torch_dcp", "fsdp_dtensor"),
    "data-parallel-sharding-strategy": ("no_shard", "optim", "optim_grads", "optim_grads_params"),
    "fp8-format": ("e4m3", "hybrid"),
    "fp8-recipe": ("tensorwise", "delayed", "mxfp8", "blockwise", "custom"),
    "lr-decay-style": ("constant", "linear", "cosine", "inverse-square-root", "WSD"),
    "moe-router-dtype": ("fp32", "fp64"),
    "moe-router-load-balancing-type": ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"),
    "moe-flex-dispatcher-backend": ("deepep", "hybridep"),
    "moe-router-score-function": ("softmax", "sigmoid"),
    "moe-token-dispatcher-type": ("allgather", "alltoall", "flex"),
    "normalization": ("LayerNorm", "RMSNorm"),
    "optimizer": ("adam", "sgd", "muon", "dist_muon"),
    "position-embedding-type": ("learned_absolute", "rope", "mrope", "relative", "none"),
    "recompute-granularity": ("full", "selective"),
    "recompute-method": ("uniform", "block"),
    "rope-type": ("rope", "yarn"),
    "tokenizer-type": ("BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",
                       "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer",
                       "MultimodalTokenizer", "NullTokenizer", "NullMultimodalTokenizer", "SFTTokenizer"),
}
# flag -> "int" | "float" | "true" (store_true / store_false) | "str" | "pattern" (a layer list expression)
# | "pair" ("left,right") | its choices
FLAGS: dict[str, str | tuple[str, ...]] = {
    **{flag: "int" for flag in _INT}, **{flag: "float" for flag in _FLOAT}, **{flag: "true" for flag in _TRUE},
    **{flag: "str" for flag in _STR}, **_CHOICES, "moe-layer-freq": "pattern", "window-size": "pair",
}
_PATTERN = re.compile(r"^[\d\[\]()+*,]+$")  # what Megatron's _eval_pattern admits


def layer_pattern(value: Any) -> list[int] | int | None:
    """A --moe-layer-freq value as Megatron reads it: an int N (every N-th layer), or the list a pattern
    such as ([0]*3+[1]*58) evaluates to; None when it is neither."""
    text = str(value)
    if text.isdigit():
        return int(text)
    if not _PATTERN.match(text) or "**" in text:  # digits and list operators only, no exponent blow-up
        return None
    try:
        result = eval(text, {"__builtins__": {}}, {})  # noqa: S307 -- the charset admits list arithmetic only
    except (SyntaxError, TypeError, ValueError):
        return None
    return result if isinstance(result, list) and all(isinstance(v, int) for v in result) else None


def _value_error(flag: str, value: Any) -> str | None:
    """Why `value` does not parse as `flag`'s type, or None."""
    kind = FLAGS[flag]
    if kind == "true":
        return None if value is True else f"--{flag} takes no value (got {value!r})"
    if isinstance(kind, tuple):
        return None if str(value) in kind else f"--{flag} must be one of {', '.join(kind)} (got {value!r})"
    try:
        if kind == "int":
            int(str(value))
        elif kind == "float":
            float(str(value))
    except ValueError:
        return f"--{flag} needs {'an int' if kind == 'int' else 'a number'} (got {value!r})"
    if kind == "pattern" and layer_pattern(value) is None:
        return f"--{flag} {value} is not an int or a layer list expression such as ([0]*3+[1]*58)"
    if kind == "pair" and not re.fullmatch(r"-?\d+,-?\d+", str(value)):
        return f"--{flag} needs two ints 'left,right' (got {value!r})"
    return None


def _flag_errors(args: dict[str, Any]) -> list[str]:
    errors = []
    for flag, value in args.items():
        if flag not in FLAGS:
            errors.append(f"--{flag} is not a pretrain_gpt.py flag planner knows for Megatron-LM core_v0.16.1")
        else:
            errors += [e for e in [_value_error(flag, value)] if e]
    return errors


def _int(args: dict[str, Any], key: str, default: int = 1) -> int:
    """A numeric argument, `default` when absent (Megatron's default for the degrees and sizes read here)."""
    value = args.get(key)
    return default if value is None else int(value)


def _given(args: dict[str, Any], key: str) -> int | None:
    """A numeric argument without a default: None when absent."""
    value = args.get(key)
    return None if value is None else int(value)


def check_megatron_args(args: dict[str, Any], world_size: int) -> list[str]:
    """Messages for every Megatron rule `args` breaks on `world_size` GPUs ([] when valid)."""
    errors = _flag_errors(args)
    if errors:  # the rules below read the values as numbers
        return errors
    tp = _int(args, "tensor-model-parallel-size")
    pp = _int(args, "pipeline-model-parallel-size")
    cp = _int(args, "context-parallel-size")
    ep = _int(args, "expert-model-parallel-size")
    mbs = _int(args, "micro-batch-size")
    gbs = _given(args, "global-batch-size")
    layers = _given(args, "num-layers")
    heads = _given(args, "num-attention-heads")
    groups = _given(args, "num-query-groups")
    seq = _given(args, "seq-length")
    experts = _given(args, "num-experts")
    vpp_layers = _given(args, "num-layers-per-virtual-pipeline-stage")
    first = _given(args, "decoder-first-pipeline-num-layers")
    last = _given(args, "decoder-last-pipeline-num-layers")

    model_ranks = tp * pp * cp
    dp = None
    if world_size % model_ranks:
        errors.append(f"world size ({world_size}) is not divisible by tensor-model-parallel-size ({tp}) x "
                      f"pipeline-model-parallel-size ({pp}) x context-parallel-size ({cp}) = {model_ranks}")
    else:
        dp = world_size // model_ranks
    if gbs is not None and dp is not None and gbs % (mbs * dp):
        errors.append(f"global-batch-size ({gbs}) is not divisible by micro-batch-size ({mbs}) x "
                      f"data-parallel size ({dp}) = {mbs * dp}")
    if args.get("sequence-parallel") and tp == 1:
        errors.append("--sequence-parallel needs tensor-model-parallel-size > 1 (it is 1)")
    if heads is not None and heads % tp:
        errors.append(f"num-attention-heads ({heads}) is not divisible by tensor-model-parallel-size ({tp})")
    if groups is not None and groups % tp:
        errors.append(f"num-query-groups ({groups}) is not divisible by tensor-model-parallel-size ({tp})")
    if seq is not None and cp > 1 and seq % (2 * cp):
        errors.append(f"seq-length ({seq}) is not divisible by 2 x context-parallel-size ({cp}) = {2 * cp}")
    if experts is not None and experts % ep:
        errors.append(f"num-experts ({experts}) is not divisible by expert-model-parallel-size ({ep})")
    if experts is None and ep > 1:
        errors.append(f"expert-model-parallel-size ({ep}) > 1 needs --num-experts")

    per_stage: int | None = None
    layout = args.get("pipeline-model-parallel-layout")
    if layout is not None:
        errors += _layout_errors(str(layout), pp, layers, first, last, vpp_layers)
        chunks = _unrolled(str(layout)).split("|")
        per_stage, first = max(c.count("t") for c in chunks), None  # the recompute bound is per chunk
        last = vpp_layers = None
        layers = None  # the layout, not an even division, places the layers
    if layers is not None:
        if first is not None or last is not None:
            rest = layers - (first or 0) - (last or 0)
            middle = pp - (first is not None) - (last is not None)
            if pp < 2:
                errors.append("--decoder-first/last-pipeline-num-layers need pipeline-model-parallel-size > 1")
            elif rest < 0 or (middle == 0 and rest) or (middle > 0 and rest % middle):
                errors.append(f"num-layers ({layers}) minus decoder-first ({first}) and decoder-last ({last}) "
                              f"pipeline layers = {rest} does not divide evenly over the other {middle} stages")
            elif middle > 0:
                per_stage = max(rest // middle, first or 0, last or 0)
            else:
                per_stage = max(first or 0, last or 0)
        elif layers % pp:
            errors.append(f"num-layers ({layers}) is not divisible by pipeline-model-parallel-size ({pp})")
        else:
            per_stage = layers // pp
    if vpp_layers is not None:
        if pp < 2:
            errors.append(f"--num-layers-per-virtual-pipeline-stage needs pipeline-model-parallel-size > 1 "
                          f"(it is {pp})")
        elif layers is not None and layers % (pp * vpp_layers):
            errors.append(f"num-layers ({layers}) is not divisible by pipeline-model-parallel-size ({pp}) x "
                          f"num-layers-per-virtual-pipeline-stage ({vpp_layers}) = {pp * vpp_layers}")
        if first is not None or last is not None:
            errors.append("--num-layers-per-virtual-pipeline-stage cannot be combined with "
                          "--decoder-first/last-pipeline-num-layers (uneven stages)")
        per_stage = vpp_layers

    granularity = args.get("recompute-granularity")
    method = args.get("recompute-method")
    if method is not None and granularity != "full":
        errors.append(f"--recompute-method {method} needs --recompute-granularity full (it is {granularity})")
    if granularity not in (None, "full", "selective"):
        errors.append(f"--recompute-granularity must be full or selective, not {granularity!r}")
    recompute_layers = _given(args, "recompute-num-layers")
    if recompute_layers is not None:
        if method is None:
            errors.append("--recompute-num-layers needs --recompute-method uniform|block")
        if per_stage is not None and recompute_layers > per_stage:
            errors.append(f"recompute-num-layers ({recompute_layers}) exceeds the layers per pipeline "
                          f"{'virtual ' if vpp_layers else ''}stage ({per_stage})")
    precisions = [flag for flag in ("bf16", "fp16") if args.get(flag)]
    if len(precisions) > 1:
        errors.append("--bf16 and --fp16 are mutually exclusive")
    return errors + _switch_errors(args) + _moe_errors(args, world_size, pp)


def _unrolled(layout: str) -> str:
    """A layout string with its `x*n` and `(...)*n` repetitions written out, as Megatron-Core unrolls them."""
    text = layout.replace(",", "")
    text = re.sub(r"\(([^)]+)\)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)
    return re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), text)


def _layout_errors(layout: str, pp: int, layers: int | None, first, last, vpp_layers) -> list[str]:
    """Megatron's checks of --pipeline-model-parallel-layout (arguments.py validate_args and
    PipelineParallelLayerLayout.validate_layer_layout)."""
    errors = []
    if first is not None or last is not None or vpp_layers is not None:
        errors.append("--pipeline-model-parallel-layout cannot be combined with --decoder-first/last-pipeline-"
                      "num-layers or --num-layers-per-virtual-pipeline-stage")
    flat = _unrolled(layout)
    chunks = flat.split("|")
    if len(chunks) % pp:
        errors.append(f"the layout's {len(chunks)} stages do not divide by pipeline-model-parallel-size ({pp})")
    if set(flat) - set("EtLm|"):
        errors.append(f"the layout holds characters other than E, t, m, L: {sorted(set(flat) - set('EtLm|'))}")
    body = flat.replace("|", "")
    if not body.startswith("E") or not body.endswith("L") or body.count("E") != 1 or body.count("L") != 1:
        errors.append("the layout must start with the embedding (E) and end with the loss (L), each once")
    if layers is not None and body.count("t") != layers:
        errors.append(f"the layout holds {body.count('t')} decoder layers, num-layers is {layers}")
    return errors


def _switch_errors(args: dict[str, Any]) -> list[str]:
    """Flags that need, or exclude, another flag; sequence and learning-rate bounds."""
    errors = []
    needs = [("overlap-param-gather", "use-distributed-optimizer"), ("overlap-param-gather", "overlap-grad-reduce"),
             ("optimizer-cpu-offload", "use-precision-aware-optimizer"), ("tp-comm-overlap", "sequence-parallel"),
             ("num-query-groups", "group-query-attention")]
    errors += [f"--{flag} needs --{other}" for flag, other in needs if args.get(flag) and not args.get(other)]
    if args.get("use-megatron-fsdp") and args.get("ckpt-format", "torch_dist") != "fsdp_dtensor":
        errors.append("--use-megatron-fsdp needs --ckpt-format fsdp_dtensor")
    if args.get("ckpt-format") == "fsdp_dtensor" and not args.get("use-megatron-fsdp"):
        errors.append("--ckpt-format fsdp_dtensor needs --use-megatron-fsdp")
    if args.get("fp8-param-gather") and not (args.get("use-distributed-optimizer") or args.get("use-megatron-fsdp")):
        # arguments.py validate_args: 'only supported with distributed optimizer, torch fsdp2, megatron fsdp'
        errors.append("--fp8-param-gather needs --use-distributed-optimizer or --use-megatron-fsdp")
    if args.get("fp8-param-gather") and args.get("optimizer-cpu-offload") and args.get("fp8-recipe",
                                                                                        "delayed") != "delayed":
        errors.append("--fp8-param-gather with --optimizer-cpu-offload needs --fp8-recipe delayed")
    excludes = [("group-query-attention", "multi-latent-attention"), ("swiglu", "squared-relu")]
    errors += [f"--{a} and --{b} are mutually exclusive" for a, b in excludes if args.get(a) and args.get(b)]
    seq, positions = _given(args, "seq-length"), _given(args, "max-position-embeddings")
    if seq is not None and positions is not None and positions < seq:
        errors.append(f"max-position-embeddings ({positions}) is below seq-length ({seq})")
    if "lr" in args and float(args.get("min-lr", 0.0)) > float(args["lr"]):
        errors.append(f"min-lr ({args['min-lr']}) exceeds lr ({args['lr']})")
    return errors


def _moe_errors(args: dict[str, Any], world_size: int, pp: int) -> list[str]:
    """Expert groups, router settings and the MoE layer pattern."""
    errors: list[str] = []
    experts = _given(args, "num-experts")
    if experts is None:
        return errors
    ep = _int(args, "expert-model-parallel-size")
    etp = _given(args, "expert-tensor-parallel-size") or _int(args, "tensor-model-parallel-size")
    if world_size % (etp * ep * pp):
        errors.append(f"world size ({world_size}) is not divisible by expert-tensor-parallel-size ({etp}) x "
                      f"expert-model-parallel-size ({ep}) x pipeline-model-parallel-size ({pp}) = {etp * ep * pp}")
    topk = _int(args, "moe-router-topk", 2)
    if topk > experts:
        errors.append(f"moe-router-topk ({topk}) exceeds num-experts ({experts})")
    score = args.get("moe-router-score-function", "softmax")
    if topk == 1 and score == "softmax" and not args.get("moe-router-pre-softmax"):
        errors.append("a top-1 softmax router needs --moe-router-pre-softmax")
    if args.get("moe-router-enable-expert-bias") and score != "sigmoid":
        errors.append("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid")
    if args.get("moe-router-group-topk") is not None and args.get("moe-router-num-groups") is None:
        errors.append("--moe-router-group-topk needs --moe-router-num-groups")
    if args.get("overlap-moe-expert-parallel-comm"):
        if ep == 1:
            errors.append("--overlap-moe-expert-parallel-comm needs expert-model-parallel-size > 1")
        if args.get("recompute-granularity") == "full":
            errors.append("--overlap-moe-expert-parallel-comm excludes --recompute-granularity full")
        # Megatron-Core asserts a virtual pipeline size, which an explicit layout of more than pp chunks also sets
        chunks = len(_unrolled(str(args["pipeline-model-parallel-layout"])).split("|")) \
            if args.get("pipeline-model-parallel-layout") is not None else 0
        if pp > 1 and args.get("num-layers-per-virtual-pipeline-stage") is None and chunks <= pp:
            errors.append("--overlap-moe-expert-parallel-comm with pipeline parallelism needs "
                          "--num-layers-per-virtual-pipeline-stage or a layout of more than pp chunks")
    pattern, layers = layer_pattern(args.get("moe-layer-freq", 1)), _given(args, "num-layers")
    if isinstance(pattern, list) and layers is not None and len(pattern) != layers:
        errors.append(f"moe-layer-freq lists {len(pattern)} layers, num-layers is {layers}")
    return errors
