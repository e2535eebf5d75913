"""A small reference Llama-style model built from a `TransformerConfig`.

The layout follows torchtitan's llama3 model so its parallelisation plans
read the same way: `tok_embeddings`, `layers` (an `nn.ModuleDict` keyed by
the block index as a string, so a pipeline stage keeps only its own blocks),
`norm` and an untied `output` head.  Each block is

    h = x + attention(attention_norm(x))      # GQA, RoPE, causal
    out = h + feed_forward(ffn_norm(h))       # SwiGLU: w2(silu(w1 h) * w3 h)

Parameters match `models.transformer.build_transformer` exactly (an RMSNorm
in front of each attention and MLP, a final norm, no biases), which
tests/test_runtime.py asserts for tiny-llama.  Dropping stage pieces sets
them to None (embedding, norm, head) or deletes them from `layers`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from models.transformer import TransformerConfig
from planner.plan.runnable import config_problem
from planner.runtime.materialize import init_weights


def supported(cfg: TransformerConfig) -> None:
    """ValueError naming the field when `cfg` is not a Llama-style decoder this model builds."""
    problem = config_problem(cfg)
    if problem is not None:
        raise ValueError(problem)


def rope_tables(head_dim: int, max_positions: int, theta: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, (max_positions, head_dim // 2) each."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), freqs)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """Rotate pairs (x[..., ::2], x[..., 1::2]) of x (batch, seq, heads, head_dim) at positions offset.."""
    seq = x.shape[1]
    if cos.dim() == 3:  # (batch, seq, head_dim / 2): each token's own position (packed documents restart at 0)
        cos, sin = cos[:, :, None, :].to(x.dtype), sin[:, :, None, :].to(x.dtype)
    else:
        cos, sin = cos[offset:offset + seq, None, :].to(x.dtype), sin[offset:offset + seq, None, :].to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """Each token's position inside its document, for rows of document indices that are non-decreasing."""
    seq = documents.shape[1]
    index = torch.arange(seq, device=documents.device).expand_as(documents)
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[:, 1:] = documents[:, 1:] != documents[:, :-1]
    first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - first


class _GatherSequence(torch.autograd.Function):
    """All-gather along the sequence dim (1) over a group; backward sums the gradient and keeps the
    local slice (an all-reduce, since gloo has no reduce-scatter)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group, ctx.rank, ctx.size = group, dist.get_rank(group), dist.get_world_size(group)
        parts = [torch.empty_like(x) for _ in range(ctx.size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.chunk(ctx.size, dim=1)[ctx.rank], None


class Attention(nn.Module):
    """Grouped-query attention; head counts are read from the (possibly TP-sharded) weights.

    Context parallel (cp_group set by the runtime): each rank holds one contiguous chunk of the
    sequence, all-gathers K and V over the group (Llama 3's all-gather CP; the same bytes as a
    ring) and attends its queries, at their global positions, to the whole causal prefix.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        h, d = cfg.hidden, cfg.head_dim
        self.head_dim = d
        self.wq = nn.Linear(h, cfg.heads * d, bias=False)
        self.wk = nn.Linear(h, cfg.kv_heads * d, bias=False)
        self.wv = nn.Linear(h, cfg.kv_heads * d, bias=False)
        self.wo = nn.Linear(cfg.heads * d, h, bias=False)
        self.cp_group: dist.ProcessGroup | None = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """`mask` (batch, 1, seq, seq), True where a query may attend: packed documents' own causal blocks
        (planner.runtime.sampler); None: one causal sequence."""
        b, s, _ = x.shape
        d = self.head_dim
        offset = s * dist.get_rank(self.cp_group) if self.cp_group is not None else 0
        q = self.wq(x).view(b, s, -1, d)  # -1: local heads under tensor parallelism
        k = self.wk(x).view(b, s, -1, d)
        v = self.wv(x).view(b, s, -1, d)
        q, k = apply_rope(q, cos, sin, offset), apply_rope(k, cos, sin, offset)
        if self.cp_group is not None:
            k, v = _GatherSequence.apply(k, self.cp_group), _GatherSequence.apply(v, self.cp_group)
            positions = torch.arange(k.shape[1], device=x.device)
            mask = positions[None, :] <= positions[offset:offset + s, None]
        repeat = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                             attn_mask=mask, is_causal=mask is None)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU MLP: w1 gate, w3 up, w2 down."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.w3 = nn.Linear(cfg.hidden, cfg.ffn, bias=False)
        self.w2 = nn.Linear(cfg.ffn, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: attention then feed-forward, each with its own RMSNorm."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.attention_norm = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.attention = Attention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        # the mask only when there is one: tensor parallelism's PrepareModuleInput counts the inputs
        normed = self.attention_norm(x)
        h = x + (self.attention(normed, cos, sin) if mask is None else self.attention(normed, cos, sin, mask))
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Embedding, blocks keyed by index, final norm, untied head; any piece may be dropped (None).

    Built on a real device it is initialized at once (materialize.init_weights: the same values for
    the same seed however the model is later split); built under `torch.device("meta")` it has shapes
    only, and materialize.materialize gives each rank's shards storage and values after the plan's
    passes."""

    def __init__(self, cfg: TransformerConfig, *, seed: int = 0):
        super().__init__()
        supported(cfg)
        self.config = cfg
        self.tok_embeddings: nn.Module | None = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(cfg) for i in range(cfg.num_layers)})
        self.norm: nn.Module | None = nn.RMSNorm(cfg.hidden, eps=1e-5)
        self.output: nn.Module | None = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        self.rope_positions: int | None = None  # the sequence length trained on (the runtime sets it)
        self.register_buffer("rope_cos", torch.empty(cfg.max_positions, cfg.head_dim // 2), persistent=False)
        self.register_buffer("rope_sin", torch.empty(cfg.max_positions, cfg.head_dim // 2), persistent=False)
        if self.rope_cos.device.type != "meta":  # under torch.device("meta"): materialize.py fills them later
            self.init_buffers()
            init_weights(self, seed=seed)

    def init_buffers(self) -> None:
        """The rotary tables (not parameters: not sharded, not saved), on the buffers' device."""
        cos, sin = rope_tables(self.config.head_dim, self.config.max_positions)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def rope_rows(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary tables' first `rope_positions` rows (the job's sequence; every row without it), in `h`'s
        dtype, once per forward.
        Passing the whole max_positions tables would let FSDP2's mixed precision (cast_forward_inputs) cast
        them at every block, and every block's backward keep its own copy (measured: 2 x max_positions x
        head_dim / 2 bf16 per layer and micro-batch, tests/bench/memory_fidelity.py --precision bf16); here
        the blocks share one copy, or a view of the buffers when no cast is needed."""
        rows = self.rope_positions or self.config.max_positions
        return self.rope_cos[:rows].to(h.dtype), self.rope_sin[:rows].to(h.dtype)

    def keep_blocks(self, first: int, last: int, *, first_stage: bool, last_stage: bool) -> None:
        """Keep blocks first..last (inclusive; last < first keeps none), the embedding only on
        the first stage and the norm and head only on the last."""
        for key in list(self.layers.keys()):
            if not first <= int(key) <= last:
                del self.layers[key]
        if not first_stage:
            self.tok_embeddings = None
        if not last_stage:
            self.norm = None
            self.output = None

    def forward(self, tokens: torch.Tensor, documents: torch.Tensor | None = None) -> torch.Tensor:
        """Token ids (first stage) or hidden states (later stages) -> hidden states or logits.  `documents`
        (batch, seq): each token's document index in a packed row (positions restart and attention stays
        inside each document: variable-length attention); None: each row is one sequence."""
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        cos, sin = self.rope_rows(h)
        mask = None
        if documents is not None:
            positions = document_positions(documents)
            cos, sin = cos[positions], sin[positions]
            causal = torch.ones(documents.shape[1], documents.shape[1], dtype=torch.bool,
                                device=documents.device).tril()
            mask = ((documents[:, :, None] == documents[:, None, :]) & causal)[:, None]
        for block in self.layers.values():
            h = block(h, cos, sin) if mask is None else block(h, cos, sin, mask)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h
