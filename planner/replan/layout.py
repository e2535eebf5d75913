"""Where a plan's training state lives: each rank on a physical GPU, and the share of every layer's state
each rank holds.

A layer's state (per state term: 16-bit weights, fp32 master weights, Adam moments, as the runtime profile
lists them) is modelled as the flat range [0, P) of its P parameters: its dense part [0, D) first, then
the routed experts of a MoE layer [D, P) (X = P - D parameters, E experts of X / E each, in expert order;
`Layer.routed_params`).  The dense part (attention, MLP, and a MoE layer's router, norm and shared
experts) is laid out by the strategy:

* pipeline: stage i holds the layers of its blocks (its chunks with vpp > 1: Megatron's interleaved
  layout), the layers before the first block on the first stage and those after the last on the last;
* tensor parallel: a tp-splittable layer's split part [0, D - R) is cut into tp contiguous shares, rank t
  taking share t; its R replicated parameters (norms, routers, row-parallel biases:
  `tp_replicated_params`) [D - R, D) are held whole by every tp rank; a layer that does not split is
  held whole by every tp rank;
* ZeRO / FSDP: a term sharded at the strategy's ZeRO stage (its `sharded_from_zero`) is cut again: the
  shard group's k-th rank keeps the k-th contiguous share of its tp piece (the split share followed by
  the replicated part); shard=full shards over dp x cp, shard=node over the dp ranks inside one node
  (x cp); a term not sharded is held whole by every data-parallel replica.

The routed experts follow expert parallelism as Megatron-Core runs it (megatron/core/parallel_state.py,
expert rank order tp-ep-dp-pp: cp folds into the expert groups):

* the fold: within a stage, with f = (dp index x cp + cp index) x tp + tp index, a rank's etp index is
  f mod etp, its ep index j = (f div etp) mod ep and its expert-dp index f div (etp x ep) (with etp = tp,
  the default: ep consecutive ranks of the dp x cp ranks with the same tp index);
* expert parallel: ep index j holds the E / ep whole experts [j E / ep, (j + 1) E / ep) (ep = 1: all);
* expert tensor parallel: etp index t holds the t-th contiguous share of each of its experts (none split
  with etp = 1 or when the layer does not split);
* ZeRO: a sharded term is cut over the expert-data-parallel group, the ranks of the stage with the same
  etp and ep index (tp x cp x dp / (etp x ep) of them; with shard=node, those inside the node's shard
  group: planner.cost.memory.expert_shard_degree): its k-th rank, k = (expert-dp index) mod that size,
  keeps the k-th contiguous share of its local experts' shares laid end to end (Megatron's distributed
  optimizer over the expert buffer).

`Segment.classes` names who holds a range: (tp index, shard index) for the dense part, (etp index, expert
shard index, ep index) for the routed experts.

What this approximates: frameworks cut each tensor (FSDP2 and DTensor by rows or columns, DeepSpeed and
Megatron's distributed optimizer over a flat buffer of the stage), not the layer's flattened state, so
the bytes each rank holds are exact up to padding, but which old rank holds which bytes of a new rank's
share is the contiguous-range picture, not the framework's.  Offloaded state counts as held by its rank
(it sits in the host memory of the rank's node).  Gradients are not state: they are rebuilt by the next
step.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Literal

from models.graph import ModelGraph
from planner.cost.layout import split_blocks
from planner.cost.memory import expert_shard_degree
from planner.plan.build import rank_location, stage_chunks, stage_spans
from planner.plan.schema import Plan, RankSpan
from planner.profile import RuntimeProfile
from planner.strategy import Strategy
from hardware import Cluster


MovedKind = Literal["weights", "optimizer"]  # the state terms a migration moves (gradients are recomputed)


@dataclass(frozen=True)
class StateTerm:
    """One per-parameter state term the runtime keeps and a migration moves."""

    name: str
    kind: MovedKind
    bytes_per_param: float
    sharded_from_zero: int | None  # lowest ZeRO stage that shards it over the shard group; None: never

    def sharded(self, zero: int) -> bool:
        return self.sharded_from_zero is not None and zero >= self.sharded_from_zero


def moving_terms(runtime: RuntimeProfile) -> tuple[StateTerm, ...]:
    """The runtime's weight and optimizer terms (what a checkpoint holds and a migration moves)."""
    return tuple(StateTerm(t.name, t.kind, t.bytes_per_param, t.sharded_from_zero)
                 for t in runtime.states if t.kind == "weights" or t.kind == "optimizer")


@dataclass(frozen=True)
class RankSite:
    """A rank, its parallel indices and the GPU it runs on (node numbered in its own cluster)."""

    rank: int
    stage: int
    tp: int
    cp: int
    dp: int
    node: int
    local: int


@dataclass(frozen=True)
class Segment:
    """A contiguous parameter range of one layer and the classes holding it: (tp index, shard index) in the
    dense part, (tp index, expert shard index, ep index) in the routed experts."""

    lo: float
    hi: float
    classes: tuple[tuple[int, ...], ...]


@dataclass
class StateLayout:
    """The state layout of one strategy on one cluster (see the module docstring)."""

    strategy: Strategy
    ranks: tuple[RankSite, ...]
    layer_stage: tuple[int, ...]  # stage holding model.layers[i]
    layer_shape: tuple[tuple[int, int, bool], ...]  # (params, tp-replicated params, tp-splittable) per layer
    stage_gpus_per_node: tuple[int, ...]  # GPUs per node of each stage's pool (shard=node groups)
    # (routed-expert params X, routed experts E) per layer, (0, 0) for a layer without; () for a model without
    layer_experts: tuple[tuple[float, int], ...] = ()
    # (stage, sharded) -> class -> the ranks of that class, in rank order; a class is (tp index, shard index)
    # for the dense part and (tp index, expert shard index, ep index) for the routed experts
    _holders: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        experts = any(x for x, _ in self.layer_experts)
        for site in self.ranks:
            for sharded in (False, True):
                table = self._holders.setdefault((site.stage, sharded), {})
                table.setdefault((site.tp, self.shard_class(site, sharded)), []).append(site)
                if experts:
                    key = (self._expert_fold(site)[0], self.expert_shard_class(site, sharded), self.ep_index(site))
                    table.setdefault(key, []).append(site)

    # -------------------------------------------------------------- sharding

    def shard_group(self, stage: int) -> int:
        """Ranks one ZeRO/FSDP shard group spans on `stage` (planner.cost.layout.shard_degree)."""
        s = self.strategy
        if s.shard == "full":
            return s.data_parallel * s.cp
        in_node = max(1, self.stage_gpus_per_node[stage] // (s.tp * s.cp))
        return max(1, min(s.data_parallel, in_node)) * s.cp

    def shard_class(self, site: RankSite, sharded: bool) -> int:
        """The rank's index in its shard group (0 when the term is not sharded)."""
        if not sharded:
            return 0
        s = self.strategy
        per_dp = self.shard_group(site.stage) // s.cp
        return (site.dp % per_dp) * s.cp + site.cp

    def _expert_fold(self, site: RankSite) -> tuple[int, int, int]:
        """(etp, ep, expert-dp) index of the rank: Megatron-Core folds a stage's tp x cp x dp ranks (tp fastest,
        then cp, then dp) into etp, then ep, then expert data parallelism."""
        s = self.strategy
        flat = (site.dp * s.cp + site.cp) * s.tp + site.tp
        return flat % s.expert_tp, (flat // s.expert_tp) % s.ep, flat // (s.expert_tp * s.ep)

    def ep_index(self, site: RankSite) -> int:
        """The rank's expert-parallel index (with etp = tp: ep consecutive ranks of the stage's dp x cp ranks)."""
        return self._expert_fold(site)[1]

    def expert_shard_group(self, stage: int) -> int:
        """Ranks one shard group of routed-expert state spans on `stage` (planner.cost.memory.expert_shard_degree)."""
        return expert_shard_degree(self.strategy, self.shard_group(stage))

    def expert_shard_class(self, site: RankSite, sharded: bool) -> int:
        """The rank's index in its routed-expert shard group (0 when the term is not sharded)."""
        if not sharded:
            return 0
        return self._expert_fold(site)[2] % self.expert_shard_group(site.stage)

    def _etp(self, layer: int) -> int:
        """Ways expert tensor parallelism splits each routed expert of `layer`."""
        return self.strategy.expert_tp if self.layer_shape[layer][2] and self.strategy.expert_tp > 1 else 1

    def etp_class(self, site: RankSite, layer: int) -> int:
        """The rank's share of each of its routed experts (0 when they are held whole)."""
        return self._expert_fold(site)[0] if self._etp(layer) > 1 else 0

    def tp_class(self, site: RankSite, layer: int) -> int:
        """The rank's tensor-parallel share of `layer` (0 when the layer is held whole by every tp rank)."""
        _, _, splittable = self.layer_shape[layer]
        return site.tp if splittable and self.strategy.tp > 1 else 0

    def _tp(self, layer: int) -> int:
        """Ways tensor parallelism splits `layer` (1: every tp rank holds it whole)."""
        return self.strategy.tp if self.layer_shape[layer][2] and self.strategy.tp > 1 else 1

    def _experts(self, layer: int) -> tuple[float, int]:
        return self.layer_experts[layer] if self.layer_experts else (0.0, 0)

    def pieces(self, site: RankSite, layer: int, sharded: bool) -> tuple[tuple[float, float], ...]:
        """The parameter ranges of `layer` the rank holds of a term (sharded or not)."""
        params, replicated, _ = self.layer_shape[layer]
        routed, experts = self._experts(layer)
        tp = self._tp(layer)
        group = self.shard_group(site.stage) if sharded else 1
        out = _piece(params - routed, replicated if tp > 1 else 0, tp, self.tp_class(site, layer), group,
                     self.shard_class(site, sharded))
        if routed:
            egroup = self.expert_shard_group(site.stage) if sharded else 1
            out += _expert_piece(params - routed, routed, experts, self.strategy.ep, self._etp(layer),
                                 self.ep_index(site), self.etp_class(site, layer), egroup,
                                 self.expert_shard_class(site, sharded))
        return out

    def segments(self, layer: int, sharded: bool) -> tuple[Segment, ...]:
        """[0, P) of `layer` cut where the holders change, each piece with the classes that hold it."""
        params, replicated, _ = self.layer_shape[layer]
        routed, experts = self._experts(layer)
        tp = self._tp(layer)
        stage = self.layer_stage[layer]
        out = _segments(params - routed, replicated if tp > 1 else 0, tp, self.shard_group(stage) if sharded else 1)
        if routed:
            egroup = self.expert_shard_group(stage) if sharded else 1
            out += _expert_segments(params - routed, routed, experts, self.strategy.ep, self._etp(layer), egroup)
        return out

    def holders(self, stage: int, sharded: bool, classes: tuple[tuple[int, ...], ...],
                layer: int) -> list[RankSite]:
        """Ranks of `stage` holding any of `classes` of `layer`, in rank order."""
        table = self._holders[(stage, sharded)]
        whole = self._tp(layer) == 1
        out: list[RankSite] = []
        for tp_class, *rest in classes:
            # a layer held whole by every tp rank: all tp indices qualify
            for t in (range(self.strategy.tp) if whole else (tp_class,)):
                out.extend(table.get((t, *rest), ()))
        return sorted(set(out), key=lambda s: s.rank)

    def stage_layers(self, stage: int) -> list[int]:
        """Indices of the layers `stage` holds, in model order."""
        return [i for i, s in enumerate(self.layer_stage) if s == stage]

    def state_bytes(self, site: RankSite, terms: tuple[StateTerm, ...]) -> float:
        """Bytes of state the rank holds."""
        total = 0.0
        for layer in self.stage_layers(site.stage):
            for term in terms:
                held = sum(hi - lo for lo, hi in self.pieces(site, layer, term.sharded(self.strategy.zero)))
                total += held * term.bytes_per_param
        return total


@lru_cache(maxsize=4096)
def _piece(params: float, replicated: int, tp: int, t: int, group: int, k: int) -> tuple[tuple[float, float], ...]:
    split = params - replicated
    share = split / tp
    length = share + replicated  # the tp piece: split share t, then the replicated part
    lo, hi = k * length / group, (k + 1) * length / group
    out = []
    if lo < share:  # the part inside the split share
        out.append((t * share + lo, t * share + min(hi, share)))
    if hi > share and replicated:  # the part inside the replicated range
        out.append((split + max(lo, share) - share, split + hi - share))
    return tuple((a, b) for a, b in out if b > a)


@lru_cache(maxsize=4096)
def _segments(params: float, replicated: int, tp: int, group: int) -> tuple[Segment, ...]:
    split = params - replicated
    holders: dict[tuple[float, float], list[tuple[int, int]]] = {}
    for t in range(tp):
        for k in range(group):
            for piece in _piece(params, replicated, tp, t, group, k):
                holders.setdefault(piece, []).append((t, k))
    out = [Segment(lo, hi, tuple(sorted(classes))) for (lo, hi), classes in holders.items()]
    out.sort(key=lambda seg: (seg.lo, seg.hi))
    assert not out or (out[0].lo == 0 and abs(out[-1].hi - params) <= 1e-9 * max(1, params)), (params, split)
    return tuple(out)


@lru_cache(maxsize=4096)
def _expert_piece(base: float, routed: float, experts: int, ep: int, tp: int, j: int, t: int, group: int,
                  k: int) -> tuple[tuple[float, float], ...]:
    """Ranges of [base, base + routed) that ep index j, tp index t, expert shard k holds (module docstring).
    Exact arithmetic, so that neighbouring classes meet at the same float."""
    local = experts // ep  # experts per ep index
    share = Fraction(routed) / (experts * tp)  # one expert's tp share
    length = local * share  # the rank's shares laid end to end
    lo, hi = k * length / group, (k + 1) * length / group
    out = []
    for i in range(int(lo // share), min(local, -(-hi // share))):
        a, b = max(lo, i * share), min(hi, (i + 1) * share)
        if b > a:
            # expert j * local + i, its share t, less the share's offset among the rank's shares
            start = Fraction(base) + ((j * local + i) * tp + t) * share - i * share
            out.append((float(start + a), float(start + b)))
    return tuple(out)


@lru_cache(maxsize=4096)
def _expert_segments(base: float, routed: float, experts: int, ep: int, tp: int, group: int) -> tuple[Segment, ...]:
    """The routed experts' ranges, each with the one class that holds it (every parameter has one class)."""
    out = [Segment(lo, hi, ((t, k, j),))
           for j in range(ep) for t in range(tp) for k in range(group)
           for lo, hi in _expert_piece(base, routed, experts, ep, tp, j, t, group, k)]
    out.sort(key=lambda seg: (seg.lo, seg.hi))
    assert out[0].lo == float(base) and out[-1].hi == float(Fraction(base) + Fraction(routed)), (base, routed)
    return tuple(out)


def overlapping(segments: tuple[Segment, ...], lo: float, hi: float) -> list[tuple[Segment, float]]:
    """(segment, overlap in parameters) of every segment meeting [lo, hi)."""
    starts = [seg.lo for seg in segments]
    index = max(0, bisect.bisect_right(starts, lo) - 1)
    out = []
    while index < len(segments) and segments[index].lo < hi:
        seg = segments[index]
        overlap = min(hi, seg.hi) - max(lo, seg.lo)
        if overlap > 0:
            out.append((seg, overlap))
        index += 1
    return out


# ---------------------------------------------------------------- building layouts


def _layer_shapes(model: ModelGraph) -> tuple[tuple[int, int, bool], ...]:
    return tuple((layer.params, layer.tp_replicated_params if layer.tp_splittable else 0, layer.tp_splittable)
                 for layer in model.layers)


def _layer_experts(model: ModelGraph) -> tuple[tuple[float, int], ...]:
    """(routed-expert params, routed experts) per layer; () when no layer has routed experts."""
    out = tuple((layer.routed_params, layer.moe_shape.num_experts) if layer.routed_params else (0.0, 0)
                for layer in model.layers)
    return out if any(x for x, _ in out) else ()


def _layer_stages(model: ModelGraph, pp: int, chunks: list[list[list[int]]], v_shape: bool = False) -> tuple[int, ...]:
    """Stage of every layer: blocks by the stages' chunks, pre-block layers on stage 0, post-block on the last
    (in a V, zbv and dualpipev, on stage 0 too)."""
    owner = {block: stage for stage, stage_chunks_ in enumerate(chunks)
             for first, last in stage_chunks_ for block in range(first, last + 1)}
    out, seen_block = [], False
    for layer in model.layers:
        if layer.block is not None:
            seen_block = True
            out.append(owner[layer.block])
        else:
            out.append(pp - 1 if seen_block and not v_shape else 0)
    return tuple(out)


def _sites(strategy: Strategy, spans: list[list[RankSpan]]) -> tuple[RankSite, ...]:
    s = strategy
    out = []
    for stage, stage_spans_ in enumerate(spans):
        for span in stage_spans_:
            for rank in range(span.first_rank, span.last_rank + 1):
                node, local = rank_location(span, rank)
                out.append(RankSite(rank=rank, stage=stage, tp=rank % s.tp, cp=(rank // s.tp) % s.cp,
                                    dp=(rank // (s.tp * s.cp)) % s.data_parallel, node=node, local=local))
    return tuple(sorted(out, key=lambda site: site.rank))


def plan_layout(plan: Plan, model: ModelGraph) -> StateLayout:
    """The layout plan.json records: its stages' chunks and rank spans."""
    strategy = plan.single_strategy
    spans = [stage.ranks.spans for stage in plan.stages]
    chunks = [stage.chunks for stage in plan.stages]
    return StateLayout(strategy=strategy, ranks=_sites(strategy, spans),
                       layer_stage=_layer_stages(model, strategy.pp, chunks, strategy.v_shape),
                       layer_shape=_layer_shapes(model),
                       stage_gpus_per_node=tuple(stage.ranks.spans[0].gpus_per_node for stage in plan.stages),
                       layer_experts=_layer_experts(model))


def strategy_layout(model: ModelGraph, cluster: Cluster, strategy: Strategy) -> StateLayout:
    """The layout a resolved strategy would have on `cluster` (what build_plan would write)."""
    spans = stage_spans(cluster, strategy)
    blocks = split_blocks(model.num_blocks, strategy.pp, strategy.split)
    chunks = [stage_chunks(strategy, i, [b[0], b[-1]] if b else []) for i, b in enumerate(blocks)]
    return StateLayout(strategy=strategy, ranks=_sites(strategy, spans),
                       layer_stage=_layer_stages(model, strategy.pp, chunks, strategy.v_shape),
                       layer_shape=_layer_shapes(model),
                       stage_gpus_per_node=tuple(s[0].gpus_per_node for s in spans),
                       layer_experts=_layer_experts(model))
