"""Virtual-pipeline chunks: how a stage's transformer blocks fall into its model chunks (vpp > 1).

When every stage holds the same number of blocks and it divides by vpp, each stage holds vpp equal chunks
(Megatron's --num-layers-per-virtual-pipeline-stage, torchtitan's looped schedules).  Otherwise the
embedding and the loss count as one layer each, as
Megatron-Core counts them (`--account-for-embedding-in-pipeline-split`, `--account-for-loss-in-pipeline-
split`, and the recipes' explicit `--pipeline-model-parallel-layout`): the first stage's slots are its blocks
plus the embedding, the last stage's its blocks plus the loss, spread evenly over the stage's chunks (the
extra slots on its earlier chunks); the embedding takes the first slot of chunk 0 and the loss the last slot
of the last chunk.  So Llama 3.1 405B's 126 blocks on pp=8 x vpp=8 run 15/16/.../16/15, chunks 1+2x7 on the
first stage and 2x7+1 on the last (NeMo's LLAMA31_405B recipe), and DeepSeek-V3's 61 on pp=8 x vpp=4 run
7/8x6/6 with chunks 1,2,2,2 and 2,2,2,0 (the loss alone in the last chunk).
"""

from __future__ import annotations


def even_chunks(split: tuple[int, ...], vpp: int) -> bool:
    """Whether every stage holds the same blocks and they divide into vpp equal chunks (no accounting)."""
    return len(set(split)) == 1 and split[0] % vpp == 0


def stage_chunks(blocks: int, vpp: int, first: bool, last: bool, even: bool) -> tuple[int, ...]:
    """Blocks in each of a stage's `vpp` chunks, in the order the stage runs them (`even`: even_chunks of the
    whole split; otherwise the first stage also holds the embedding's slot and the last the loss's)."""
    if vpp == 1:
        return (blocks,)
    if even:
        return (blocks // vpp,) * vpp
    lead, trail = int(first), int(last)
    slots = blocks + lead + trail
    sizes = [slots // vpp + (v < slots % vpp) for v in range(vpp)]
    for v in range(vpp):  # the embedding's slot, from the front
        taken = min(lead, sizes[v])
        sizes[v], lead = sizes[v] - taken, lead - taken
    for v in reversed(range(vpp)):  # the loss's slot, from the back
        taken = min(trail, sizes[v])
        sizes[v], trail = sizes[v] - taken, trail - taken
    return tuple(sizes)


def split_chunks(split: tuple[int, ...], vpp: int) -> list[tuple[int, ...]]:
    """stage_chunks of every stage of `split`."""
    even = even_chunks(split, vpp)
    return [stage_chunks(n, vpp, s == 0, s == len(split) - 1, even) for s, n in enumerate(split)]


def accounted_split(blocks: int, pp: int, vpp: int) -> tuple[int, ...] | None:
    """Megatron's split of `blocks` over pp x vpp chunks with the embedding and the loss counted as one layer
    each, spread evenly in chunk order (chunk c = virtual stage v x pp + stage s; the extra slots on the
    earlier chunks): each stage's blocks, or None when some chunk would hold no block and no layer."""
    chunks, slots = pp * vpp, blocks + 2
    if slots < chunks:
        return None
    sizes = [slots // chunks + (c < slots % chunks) for c in range(chunks)]
    per_stage, start = [0] * pp, 0
    for c, size in enumerate(sizes):
        decoders = max(0, min(start + size, 1 + blocks) - max(start, 1))  # slot 0 is the embedding
        per_stage[c % pp] += decoders
        start += size
    return tuple(per_stage)


def layout_string(split: tuple[int, ...], vpp: int, tail: str = "") -> str:
    """Megatron-Core's --pipeline-model-parallel-layout of `split` (E embedding, t a block, L the loss;
    `tail`: what precedes the loss in the last chunk, e.g. MTP modules 'm'), chunks in Megatron's order."""
    chunks = split_chunks(split, vpp)
    pp, parts = len(split), []
    for c in range(pp * vpp):
        v, s = divmod(c, pp)
        text = ("E" if c == 0 else "") + (f"t*{chunks[s][v]}" if chunks[s][v] else "")
        parts.append(text + (tail + "L" if c == pp * vpp - 1 else ""))
    return "|".join(parts)
