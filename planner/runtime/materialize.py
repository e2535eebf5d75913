"""Meta-device construction and per-rank materialization: no rank ever holds the whole model.

The trainer builds the reference model under `torch.device("meta")` (shapes only, no storage), applies
the plan's passes (pipeline split, tensor parallel, activation checkpointing, FSDP2) to the meta model,
and only then gives each rank's parameters storage (`to_empty`) and values (`init_weights`): a rank
allocates its own shards and nothing else.

`init_weights` is deterministic given the seed and does not depend on the layout.  Every parameter is
named by its place in the whole model (`layers.3.attention.wq.weight`, wrappers' prefixes dropped),
its rows are cut into fixed blocks of about BLOCK_ELEMENTS values, and block b is drawn from a CPU
generator seeded with (seed, name, b): Linear and Embedding weights Normal(0, 0.02), norm weights 1.
A rank draws only the blocks its shard's rows fall in (the shard's global offset comes from its
DTensor placements: TP's and FSDP2's dim-0 and dim-1 splits, strided ones included) and copies its
part of them: the same value lands on the same global element whatever the split, and the largest
temporary is one block, not a whole parameter or model.

`InitMemory` measures that: the peak of live tensor bytes (non-meta storages created while it is
active, each counted once until freed) on this rank while the model is built and materialized.
"""

from __future__ import annotations

import hashlib
import math
import weakref
from collections.abc import Iterator, Sequence

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

BLOCK_ELEMENTS = 1 << 16  # values per generator block (256 KiB in fp32): bounds init's temporary memory
INIT_STD = 0.02  # Normal(0, 0.02) for Linear and Embedding weights (GPT-2 / Llama reference init)
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def canonical_name(name: str) -> str:
    """A parameter's name in the whole model: wrapper prefixes (activation checkpointing, compile) dropped."""
    for prefix in _WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _block_seed(seed: int, name: str, block: int) -> int:
    digest = hashlib.blake2b(f"{seed}:{name}:{block}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1  # a non-negative 63-bit generator seed


def _local_box(param: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """(this rank's local tensor, the global offset of its first element) of a parameter or DTensor."""
    if not isinstance(param, DTensor):
        return param, (0,) * param.dim()
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local = param._local_tensor
    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    if tuple(shape) != tuple(local.shape):
        raise RuntimeError(f"local shard {tuple(local.shape)} is not the box {tuple(shape)} its placements give")
    return local, tuple(offset)


@torch.no_grad()
def fill_normal(param: torch.Tensor, name: str, *, seed: int, std: float = INIT_STD) -> int:
    """Fill this rank's part of `param` with its Normal(0, std) values; returns the largest block's bytes."""
    local, offset = _local_box(param)
    rows = local.shape[0] if local.dim() else 0
    if local.numel() == 0 or rows == 0:
        return 0
    full = tuple(param.shape)
    per_row = math.prod(full[1:])
    rows_per_block = max(1, BLOCK_ELEMENTS // max(per_row, 1))
    first, last = offset[0], offset[0] + rows  # global rows [first, last) live here
    largest = 0
    for block in range(first // rows_per_block, (last - 1) // rows_per_block + 1):
        start = block * rows_per_block
        count = min(rows_per_block, full[0] - start)
        gen = torch.Generator().manual_seed(_block_seed(seed, name, block))
        values = torch.empty((count, *full[1:]), dtype=torch.float32).normal_(0.0, std, generator=gen)
        largest = max(largest, values.numel() * values.element_size())
        lo, hi = max(start, first), min(start + count, last)
        piece = values[lo - start:hi - start]
        for dim in range(1, local.dim()):  # the other dims: this shard's columns
            piece = piece.narrow(dim, offset[dim], local.shape[dim])
        local[lo - first:hi - first].copy_(piece)
        del values, piece
    return largest


def _named_leaf_params(module: nn.Module) -> Iterator[tuple[str, nn.Module, torch.Tensor]]:
    for mod_name, mod in module.named_modules():
        for pname, param in mod.named_parameters(recurse=False):
            yield canonical_name(f"{mod_name}.{pname}" if mod_name else pname), mod, param


@torch.no_grad()
def init_weights(module: nn.Module, *, seed: int, prefix: str = "") -> int:
    """Initialize every parameter of `module` (sharded or not) that has storage; returns the largest
    temporary block in bytes.  `prefix` names the module's place in the whole model (e.g. `layers.3.`)."""
    largest = 0
    for name, owner, param in _named_leaf_params(module):
        if param.device.type == "meta":
            continue
        if isinstance(owner, nn.RMSNorm):
            (param._local_tensor if isinstance(param, DTensor) else param).fill_(1.0)
        elif isinstance(owner, (nn.Linear, nn.Embedding)):
            largest = max(largest, fill_normal(param, prefix + name, seed=seed))
        else:
            raise TypeError(f"{prefix}{name}: no initializer for a {type(owner).__name__} parameter")
    return largest


def materialize(chunks: Sequence[nn.Module], *, device: torch.device, seed: int,
                buffer_device: torch.device | None = None) -> int:
    """Give the meta chunks storage on `device` and their initial values; returns the largest init block.
    `buffer_device`: where the buffers go when it is not `device` (parameters offloaded to the host, the
    rotary tables on the GPU that computes with them)."""
    largest = 0
    for chunk in chunks:
        chunk.to_empty(device=device)
        if buffer_device is not None and buffer_device != device:
            for module in chunk.modules():
                for name, buf in module._buffers.items():
                    if buf is not None:
                        module._buffers[name] = torch.empty_like(buf, device=buffer_device)
        largest = max(largest, init_weights(chunk, seed=seed))
        init_buffers = getattr(chunk, "init_buffers", None)
        if init_buffers is not None:
            init_buffers()
    return largest


# ---------------------------------------------------------------- measuring


class InitMemory(TorchDispatchMode):
    """Peak bytes of the tensors alive at once (non-meta storages created while active, each once)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self._sizes: dict[int, int] = {}

    def _track(self, t: torch.Tensor) -> None:
        if t.device.type == "meta" or isinstance(t, DTensor):
            return
        st = t.untyped_storage()
        key = id(st)
        size = st.nbytes()
        old = self._sizes.get(key)
        if old is None:
            weakref.finalize(st, self._freed, key)
        self._sizes[key] = size
        self.live += size - (old or 0)
        self.peak = max(self.peak, self.live)

    def _freed(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t is DTensor for t in types):
            return NotImplemented  # DTensor runs its local ops, which come back here
        out = func(*args, **(kwargs or {}))
        tree_map_only(torch.Tensor, self._track, out)
        return out
