"""Our own re-implementation of the Megatron-LM argument rules that a plan can break.

Megatron-LM checks its arguments in `megatron/training/arguments.py`
(`validate_args`) and in `TransformerConfig.__post_init__`; a wrong set
fails minutes into a job, after the container has started on every node.
`check_megatron_args` runs the same rules offline on the argument dict the
emitter writes (keys are the flag names without the leading dashes, e.g.
"tensor-model-parallel-size"; store-true flags map to True) and returns one
message per broken rule, [] when the set is valid.

Rules (Megatron-LM core_r0.12 era):

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
"""

from __future__ import annotations

from typing import Any


def _int(args: dict[str, Any], key: str, default: int | None = 1) -> int | None:
    value = args.get(key, default)
    return None if value is None else int(value)


def check_megatron_args(args: dict[str, Any], world_size: int) -> list[str]:
    """Messages for every Megatron rule `args` breaks on `world_size` GPUs ([] when valid)."""
    errors: list[str] = []
    tp = _int(args, "tensor-model-parallel-size")
    pp = _int(args, "pipeline-model-parallel-size")
    cp = _int(args, "context-parallel-size")
    ep = _int(args, "expert-model-parallel-size")
    mbs = _int(args, "micro-batch-size")
    gbs = _int(args, "global-batch-size", None)
    layers = _int(args, "num-layers", None)
    heads = _int(args, "num-attention-heads", None)
    groups = _int(args, "num-query-groups", None)
    seq = _int(args, "seq-length", None)
    experts = _int(args, "num-experts", None)
    vpp_layers = _int(args, "num-layers-per-virtual-pipeline-stage", None)
    first = _int(args, "decoder-first-pipeline-num-layers", None)
    last = _int(args, "decoder-last-pipeline-num-layers", None)

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
    recompute_layers = _int(args, "recompute-num-layers", None)
    if recompute_layers is not None:
        if method is None:
            errors.append("--recompute-num-layers needs --recompute-method uniform|block")
        if per_stage is not None and recompute_layers > per_stage:
            errors.append(f"recompute-num-layers ({recompute_layers}) exceeds the layers per pipeline "
                          f"{'virtual ' if vpp_layers else ''}stage ({per_stage})")
    precisions = [flag for flag in ("bf16", "fp16") if args.get(flag)]
    if len(precisions) > 1:
        errors.append("--bf16 and --fp16 are mutually exclusive")
    return errors
