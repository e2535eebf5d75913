"""Kernels one layer launches per micro-batch, forward and backward, by layer kind: the counts of
hardware/data/kernels.yaml, measured.

    python tests/bench/kernel_counts.py              # eager PyTorch (about 2 s)
    python tests/bench/kernel_counts.py --compiled   # also torch.compile's fused kernels (about 2 minutes)

The layers are the planner runtime's own modules (planner/runtime/model.py, torchtitan's Llama 3 layout:
RMSNorm, GQA attention with RoPE and scaled_dot_product_attention, SwiGLU; planner/runtime/dlrm_layers.py for the
recommendation layers), in bf16 on a small configuration on CPU (kernel counts do not depend on the sizes):

  attention   pre-norm + attention + residual add     (LayerKind.ATTENTION)
  mlp         pre-norm + SwiGLU feed-forward + residual (LayerKind.MLP)
  norm        the final RMSNorm                        (LayerKind.NORM)
  head        output projection + cross-entropy loss   (LayerKind.HEAD; its backward seeds the loss gradient)
  embedding   token embedding                          (LayerKind.EMBEDDING)
  dense       one DLRM MLP layer: Linear + ReLU        (LayerKind.DENSE)
  interaction DLRM's dot interaction of 26 pooled tables (LayerKind.INTERACTION)

eager: every aten operator the layer dispatches (a TorchDispatchMode below autograd) that does work: all
but views of their inputs and bare allocations (empty, empty_like, ...).  Eager PyTorch on a GPU launches
about one kernel per such operator; where a GPU build has a fused kernel the CPU build decomposes (RMSNorm:
recent CUDA builds dispatch one _fused_rms_norm, the CPU build pow, mean, add, rsqrt, mul, mul and the
casts), the GPU launches fewer, so the eager counts are an upper estimate by the norm's share.

compiled: torch.compile (Inductor, this build's CPU backend standing in for the GPU's Triton backend: the
same scheduler decides which operators fuse) of the layer's forward and AOTAutograd backward; every call the
generated wrapper makes to a generated kernel, an extern kernel (mm, addmm, bmm) or an aten fallback
(scaled_dot_product_attention) is one kernel.  Transformer Engine's fused modules (Megatron) are counted as
this: a GEMM per projection, one fused kernel per group of element-wise work.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from models.transformer import llama  # noqa: E402
from planner.runtime.dlrm_layers import dot_interaction, mlp  # noqa: E402
from planner.runtime.model import TransformerBlock, rope_tables  # noqa: E402
from planner.runtime.parallelize import loss_fn  # noqa: E402

ALLOCATIONS = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}
KINDS = ("embedding", "attention", "mlp", "norm", "head", "dense", "interaction")
DTYPE = torch.bfloat16
BATCH, SEQ, TABLES = 2, 64, 26


def launches_work(func) -> bool:
    """An operator that computes: not a view of its inputs (its returns alias them without writing), not a
    bare allocation."""
    if func.overloadpacket.__name__ in ALLOCATIONS:
        return False
    returns = func._schema.returns
    views = all(r.alias_info is not None and not r.alias_info.is_write for r in returns)
    return not (returns and views)


class OperatorCount(TorchDispatchMode):
    """Counts the operators that do work, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if launches_work(func):
            self.ops[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def layers() -> dict[str, tuple[Callable[[], torch.Tensor], list[torch.Tensor]]]:
    """kind -> (the layer's forward as a closure, the tensors it differentiates)."""
    torch.manual_seed(0)
    cfg = llama(name="count", num_layers=1, hidden=256, heads=4, kv_heads=2, ffn=512, vocab=1000, max_positions=SEQ)
    block = TransformerBlock(cfg).to(DTYPE)
    cos, sin = rope_tables(cfg.head_dim, SEQ)
    x = torch.randn(BATCH, SEQ, cfg.hidden, dtype=DTYPE, requires_grad=True)
    norm = nn.RMSNorm(cfg.hidden, eps=1e-5).to(DTYPE)
    head = nn.Linear(cfg.hidden, cfg.vocab, bias=False).to(DTYPE)
    embedding = nn.Embedding(cfg.vocab, cfg.hidden).to(DTYPE)
    tokens = torch.randint(0, cfg.vocab, (BATCH, SEQ))
    labels = torch.randint(0, cfg.vocab, (BATCH, SEQ))
    dense = mlp([512], 256, last_relu=True).to(DTYPE)
    rows = torch.randn(BATCH * SEQ, 256, dtype=DTYPE, requires_grad=True)
    pooled = [torch.randn(BATCH * SEQ, 64, dtype=DTYPE, requires_grad=True) for _ in range(TABLES)]
    bottom = torch.randn(BATCH * SEQ, 64, dtype=DTYPE, requires_grad=True)
    return {
        "embedding": (lambda: embedding(tokens), list(embedding.parameters())),
        "attention": (lambda: x + block.attention(block.attention_norm(x), cos, sin), [x]),
        "mlp": (lambda: x + block.feed_forward(block.ffn_norm(x)), [x]),
        "norm": (lambda: norm(x), [x]),
        "head": (lambda: loss_fn(head(x), labels), [x]),
        "dense": (lambda: dense(rows), [rows]),
        "interaction": (lambda: dot_interaction(bottom, pooled), [bottom, *pooled]),
    }


def _backward(out: torch.Tensor) -> None:
    out.backward(None if out.dim() == 0 else torch.ones_like(out))


def eager_counts() -> dict[str, tuple[int, int]]:
    """kind -> (forward, backward) operators that do work, eager PyTorch."""
    out = {}
    for kind, (forward, _) in layers().items():
        fwd, bwd = OperatorCount(), OperatorCount()
        with fwd:
            y = forward()
        grad = None if y.dim() == 0 else torch.ones_like(y)
        with bwd:
            y.backward(grad)
        out[kind] = (sum(fwd.ops.values()), sum(bwd.ops.values()))
    return out


_CALL = re.compile(r"^\s*(?:\w+ = )?(cpp_fused_\w+|triton_\w+\.run|extern_kernels\.\w+|torch\.ops\.\w+\.\w+\.\w+)\(")


def wrapper_calls(code: str) -> int:
    """Kernels the generated wrapper's call() launches."""
    body = code[code.find("def call("):]
    return sum(1 for line in body.splitlines() if _CALL.match(line))


def compiled_counts() -> dict[str, tuple[int, int]]:
    """kind -> (forward, backward) kernels under torch.compile."""
    from torch._inductor.utils import run_and_get_code

    out = {}
    for kind, (forward, _) in layers().items():
        torch._dynamo.reset()
        compiled = torch.compile(forward)
        _, codes = run_and_get_code(lambda: _backward(compiled()))
        counts = [wrapper_calls(code) for code in codes]
        out[kind] = (counts[0], counts[1] if len(counts) > 1 else 0)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compiled", action="store_true", help="also count torch.compile's kernels (slow)")
    args = parser.parse_args(argv)
    tables = {"eager": eager_counts()}
    if args.compiled:
        tables["fused"] = compiled_counts()
    print(f"torch {torch.__version__}; kernels per layer per micro-batch (forward, backward)")
    for name, counts in tables.items():
        print(f"{name}:")
        for kind in KINDS:
            forward, backward = counts[kind]
            print(f"  {kind}: {{forward: {forward}, backward: {backward}}}")


if __name__ == "__main__":
    main()
