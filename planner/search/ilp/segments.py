"""What a stage can hold: runs of identical blocks (segments), the contents a stage of n blocks can take,
and the facts about placement variants the tables and their floors share."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from models.graph import Layer, ModelGraph


@dataclass(frozen=True)
class Segment:
    """A run of identical transformer blocks."""

    start: int  # first block index
    size: int  # blocks in the run
    layers: tuple[Layer, ...]  # the layers of one block (a sample)

    @property
    def end(self) -> int:
        return self.start + self.size


def block_segments(model: ModelGraph) -> list[Segment]:
    """Consecutive identical blocks, in order."""
    segments: list[Segment] = []
    for index, layers in sorted(model.blocks().items()):
        key = tuple(layer.model_dump_json(exclude={"name", "block"}) for layer in layers)
        if segments and _segment_key(segments[-1]) == key:
            last = segments[-1]
            segments[-1] = Segment(start=last.start, size=last.size + 1, layers=last.layers)
        else:
            segments.append(Segment(start=index, size=1, layers=tuple(layers)))
    return segments


def _segment_key(segment: Segment) -> tuple:
    return tuple(layer.model_dump_json(exclude={"name", "block"}) for layer in segment.layers)


def fixed_layers(model: ModelGraph) -> tuple[tuple[Layer, ...], tuple[Layer, ...]]:
    """(layers before the first block, layers after the last block)."""
    head: list[Layer] = []
    tail: list[Layer] = []
    seen_block = False
    for layer in model.layers:
        if layer.block is not None:
            seen_block = True
        elif seen_block:
            tail.append(layer)
        else:
            head.append(layer)
    return tuple(head), tuple(tail)


@lru_cache(maxsize=None)
def stage_contents(segment_bounds: tuple[tuple[int, int], ...], length: int) -> tuple[tuple[int, ...], ...]:
    """Distinct per-segment counts of a contiguous run of `length` blocks, over every start."""
    total = segment_bounds[-1][1]
    seen: dict[tuple[int, ...], None] = {}
    for start in range(0, total - length + 1):
        end = start + length
        counts = tuple(max(0, min(end, hi) - max(start, lo)) for lo, hi in segment_bounds)
        seen.setdefault(counts, None)
    return tuple(seen)


def variants_key(variants: tuple[dict, ...]) -> tuple:
    """A hashable form of placement variants (cache keys)."""
    return tuple(tuple(sorted(v.items())) for v in variants)


def offloads(variant: dict) -> bool:
    """Whether a placement variant moves state off the GPU (optimizer or weights)."""
    return variant.get("offload", "none") != "none"


def offload_pays(variant: dict, recompute: int, plain: int | None) -> bool:
    """Whether a variant's option at `recompute` blocks can be on the Pareto front: one with offload only where
    the same content without offload needs more recomputation (`plain`: its fewest, None when it does not fit).
    At equal recomputation offload only adds time: a weight fetch per micro-batch, and PCIe transfers and CPU
    Adam for what HBM would update (tests/test_certificate_oracle.py holds the search to every runtime's whole
    space, offload included)."""
    return not offloads(variant) or plain is None or recompute < plain
