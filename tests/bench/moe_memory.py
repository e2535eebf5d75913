"""What torchtitan's mixture-of-experts layer saves for its backward, per token: a measurement of its own code.

    python tests/bench/moe_memory.py            # two of the zoo's MoE models at their real widths (~40 s on CPU)
    python tests/bench/moe_memory.py --tokens 512

torchtitan 0.2.2's `models/moe/moe.py` MoE (the version the torchtitan runtime profiles read) runs one forward on
CPU under `torch.autograd.graph.saved_tensors_hooks`, and every tensor autograd saves is counted once by its
storage (the layer's parameters and its input left out: the block keeps the input whatever the layer saves).
The experts run in the layer's for-loop path (`use_grouped_mm=False`: `torch._grouped_mm` and the index-padding
Triton kernel are GPU-only); the grouped path saves the same tensors (the routed input for w1 and w3, the SiLU
input, the SiLU output and w3's output for their product, the product for w2).  Two CPU shims, neither changing
what is saved: the Triton kernel module is replaced by a stub it never calls, and `torch.histc` counts integer
expert ids through a float copy (CPU has no integer histogram).

Printed per model: the measured bytes per token by tensor (routed: one row per token and chosen expert), and
what the planner's model graph saves for the same layer without recompute (`planner.cost.memory.saved_bytes`,
under the torchtitan profile), with their ratio.  The model graph counts Megatron-Core's MoE layer; torchtitan's
differs in two places the table shows: it keeps the routed outputs in fp32 for the router-score product
(`score_before_experts` False: a bmm over `routed_output_unsorted.float()`; True: the routed input cast to fp32),
and the four expert-width tensors of SwiGLU per routed token.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hardware import load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from models.graph import LayerKind  # noqa: E402
from planner.cost.memory import saved_bytes  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.profile import load_runtime  # noqa: E402
from planner.strategy import Strategy  # noqa: E402

# (zoo model, score_before_experts: False, as torchtitan's Qwen3 and DeepSeek-V3 models run it; Llama 4 scores the
# routed inputs instead, the same bytes).  Models whose experts fit a few GB of CPU memory at their real widths
# (DeepSeek-V3's 256 experts of 7168 x 2048 would take 22 GB): the bytes per token do not depend on the expert count
# but for the router's scores (4 bytes per expert).
MODELS = (("qwen3-30b-a3b", False), ("mixtral-8x7b", False))


def _torchtitan_moe():
    """torchtitan 0.2.2's MoE classes, importable on CPU (see the module docstring's shims)."""
    import torch

    stub = types.ModuleType("torchtitan.models.moe.kernels")

    def generate_permute_indices(*args, **kwargs):
        raise RuntimeError("GPU-only kernel: the measurement runs the for-loop experts, which do not call it")

    stub.generate_permute_indices = generate_permute_indices
    sys.modules.setdefault("torchtitan.models.moe.kernels", stub)
    histc = torch.histc

    def integer_histc(input, *args, **kwargs):  # noqa: A002 (torch's parameter name)
        if input.is_floating_point():
            return histc(input, *args, **kwargs)
        return histc(input.float(), *args, **kwargs).to(input.dtype)  # what the CUDA op returns

    torch.histc = integer_histc
    from torchtitan.models.moe.moe import MoE, MoEArgs

    return MoE, MoEArgs


def measure(layer, tokens: int, score_before: bool) -> dict[str, float]:
    """Bytes per token torchtitan's MoE saves for `layer`'s shape, by tensor group."""
    import torch

    moe_class, args_class = _torchtitan_moe()
    shape = layer.moe_shape
    args = args_class(num_experts=shape.num_experts, num_shared_experts=shape.shared_experts, top_k=shape.top_k,
                      use_grouped_mm=False, score_before_experts=score_before, load_balance_coeff=None)
    torch.manual_seed(0)
    with torch.device("meta"):
        moe = moe_class(args, dim=layer.hidden, hidden_dim=shape.expert_ffn)
    moe = moe.to_empty(device="cpu").to(torch.bfloat16)
    with torch.no_grad():
        for param in moe.parameters():
            param.normal_(0.0, 0.02)
    x = torch.randn(1, tokens, layer.hidden, dtype=torch.bfloat16, requires_grad=True)
    skip = {p.untyped_storage().data_ptr() for p in moe.parameters()} | {x.untyped_storage().data_ptr()}
    saved: dict[int, tuple[int, tuple[int, ...], torch.dtype]] = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in skip:
            saved[storage.data_ptr()] = (storage.nbytes(), tuple(tensor.shape), tensor.dtype)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        moe(x)
    groups: dict[str, float] = {}
    for nbytes, dims, dtype in saved.values():
        group = _group(dims, dtype, layer.hidden, shape.expert_ffn, tokens)
        groups[group] = groups.get(group, 0.0) + nbytes / tokens
    return groups


def _group(dims: tuple[int, ...], dtype, hidden: int, ffn: int, tokens: int) -> str:
    """A readable name for a saved tensor: its width and whether it has a row per routed token."""
    if len(dims) == 1:  # the routing's index and score vectors, one entry per routed token
        return f"routed vector {str(dtype).removeprefix('torch.')}"
    width = {hidden: "hidden", ffn: "expert ffn"}.get(dims[-1], f"width {dims[-1]}")
    routed = dims[0] != tokens or len(dims) == 3
    return f"{'routed ' if routed else ''}{width} {str(dtype).removeprefix('torch.')}"


def moe_layer(name: str):
    """The first MoE layer of zoo model `name`."""
    return next(layer for layer in load_model(name).layers if layer.kind == LayerKind.MOE)


def measure_apart(name: str, tokens: int, score_before: bool, timeout: float = 600.0) -> dict[str, float]:
    """`measure` of zoo model `name`'s MoE layer in a fresh interpreter: its shims (the Triton stub, the integer
    histogram) and torchtitan's import stay out of the calling process."""
    cmd = [sys.executable, __file__, "--worker", name, "--tokens", str(tokens)] + (["--score-before"] * score_before)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode:
        raise RuntimeError((done.stderr.strip().splitlines() or ["no output"])[-1])
    return json.loads(done.stdout.strip().splitlines()[-1])


def modelled(layer, job: Job, tokens: int) -> float:
    """Bytes per token the planner's model graph saves for the layer without recompute."""
    strategy = Strategy(mbs=1)
    return saved_bytes(layer, job.model_copy(update={"seq_len": tokens}), strategy, "none") / tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=256, help="tokens of the measured forward (default 256)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # measure one zoo model here, print JSON
    parser.add_argument("--score-before", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(measure(moe_layer(args.worker), args.tokens, args.score_before)))
        return 0
    runtime = load_runtime("torchtitan")
    print(f"{'model':<16} {'saved tensor group':<32} {'bytes/token':>12}")
    print("-" * 62)
    for name, score_before in MODELS:
        layer = moe_layer(name)
        job = Job(model=load_model(name), cluster=load_cluster("dgx-h100:1"), global_batch=8, seq_len=args.tokens,
                  runtime=runtime)
        groups = measure_apart(name, args.tokens, score_before)
        for group, per_token in sorted(groups.items(), key=lambda item: -item[1]):
            print(f"{name:<16} {group:<32} {per_token:>12,.0f}")
        total, model = sum(groups.values()), modelled(layer, job, args.tokens)
        print(f"{name:<16} {'measured, all':<32} {total:>12,.0f}")
        print(f"{name:<16} {'model graph (recompute none)':<32} {model:>12,.0f}   measured/model {total / model:.2f}")
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
