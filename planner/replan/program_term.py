"""The migration as a term of the compile's programs (planner.search.ilp.surcharge).

For a configuration (tp, pp, cp, dp, ZeRO, ...) the new ranks' GPUs do not depend on the split, and the
bytes a rank must receive for a block do not depend on which other blocks its stage holds.  So, for every
stage s, block b and port, the load b puts on the port when it sits on s is a table entry, and the
migration of a split is the busiest port's load: a linear max the program minimises next to the step time,
divided by steps_left (seconds per step).

The ports are the receiving side of planner.replan.migration's time: each new GPU's NVLink in (bytes a
holder on its node sends), each new node's NICs in (bytes from other nodes or the checkpoint), and the
checkpoint reads (bytes no surviving GPU holds: each node's, or the one aggregate port with
--checkpoint-bandwidth), at the same achieved rates.  The senders' ports and the choice between the peer
and the storage route are left out; either can only make the exact migration (evaluated on every
candidate after the search) slower, so the term is a lower bound of it and the certificate's bound stays
a bound.
"""

from __future__ import annotations

from collections import defaultdict

from planner.fields import fields_with
from planner.job import Job
from planner.replan.layout import RankSite, StateLayout, StateTerm, overlapping, strategy_layout
from planner.replan.migration import Rates, receive_link, surviving_holders
from planner.replan.nodes import NodeMap
from planner.search.ilp.surcharge import SurchargeTable
from planner.search.ilp.tables import NS
from planner.strategy import Strategy

_LAYOUT_FIELDS = fields_with("layout")  # what a rank's share depends on (planner.fields)


class MigrationSurcharge:
    """The amortised migration from `old` of every configuration of `job` (a Surcharge)."""

    def __init__(self, old: StateLayout, job: Job, nodes: NodeMap, rates: Rates, terms: tuple[StateTerm, ...],
                 steps_left: int):
        self.old, self.job, self.nodes, self.rates, self.terms = old, job, nodes, rates, terms
        self.steps_left = steps_left
        self._alive = surviving_holders(old, nodes)
        self._layer_block = [layer.block for layer in job.model.layers]
        blocks = [b for b in self._layer_block if b is not None]
        self._base = min(blocks) if blocks else 0
        self._first_layer = {}  # block -> its first layer
        for layer, block in reversed(list(enumerate(self._layer_block))):
            self._first_layer[block] = layer
        self._loads: dict[tuple, tuple[StateLayout, dict[int, dict[int | None, dict[str, float]]]]] = {}

    def table(self, config: Strategy, scale: int) -> SurchargeTable | None:
        """The configuration's ports; None on a mixed cluster (the program picks each stage's pool, so a
        stage's GPUs are not known before it is solved)."""
        if len(self.job.cluster.pools) > 1:
            return None
        new, loads = self._rank_loads(config)
        ports: dict[tuple, dict[tuple[int, int], float]] = defaultdict(lambda: defaultdict(float))
        fixed: dict[tuple, float] = defaultdict(float)
        interleaved = config.vpp > 1  # the split is even: every block's stage is known
        for site in new.ranks:
            for block, by_link in loads[site.rank].items():
                stage = new.layer_stage[self._first_layer[block]] if interleaved and block is not None else site.stage
                if stage != site.stage:
                    continue
                for port, seconds in self._port_seconds(site, by_link):
                    if block is None or interleaved:
                        fixed[port] += seconds
                    else:
                        ports[port][site.stage, block - self._base] += seconds
        unit = NS * scale / self.steps_left  # program units per second of migration
        out: dict[tuple, int] = {}
        for port in sorted(set(ports) | set(fixed)):
            entry = tuple(sorted((key, int(value * unit)) for key, value in ports[port].items() if value * unit >= 1))
            out[entry] = max(out.get(entry, 0), int(fixed[port] * unit))
        return SurchargeTable(ports=tuple(dict(entry) for entry in out), constants=tuple(out.values()))

    # ------------------------------------------------------------------ receive loads

    def _rank_loads(self, config: Strategy) -> tuple[StateLayout, dict[int, dict[int | None, dict[str, float]]]]:
        """(the configuration's layout, per new rank: per block (None: the layers outside blocks its stage
        holds) the bytes it receives per link class, as if its stage held every block)."""
        key = tuple(getattr(config, name) for name in _LAYOUT_FIELDS)
        if key not in self._loads:
            new = strategy_layout(self.job.model, self.job.cluster, config)
            cache: dict[tuple, dict[str, float]] = {}
            loads: dict[int, dict[int | None, dict[str, float]]] = {}
            for site in new.ranks:
                per_block: dict[int | None, dict[str, float]] = defaultdict(lambda: defaultdict(float))
                for layer, block in enumerate(self._layer_block):
                    if block is None and new.layer_stage[layer] != site.stage:
                        continue  # embedding and head stay on the first and last stage
                    shape_key = (site.rank, self.old.layer_stage[layer], self.old.layer_shape[layer])
                    if shape_key not in cache:
                        cache[shape_key] = self._receive(site, layer, new)
                    for link, nbytes in cache[shape_key].items():
                        per_block[block][link] += nbytes
                loads[site.rank] = per_block
            self._loads[key] = (new, loads)
        return self._loads[key]

    def _receive(self, site: RankSite, layer: int, new: StateLayout) -> dict[str, float]:
        """Bytes of `layer` the rank receives per link class."""
        gpu = (site.node, site.local)
        old_stage = self.old.layer_stage[layer]
        out: dict[str, float] = defaultdict(float)
        for term in self.terms:
            sharded_old = term.sharded(self.old.strategy.zero)
            segments = self.old.segments(layer, sharded_old)
            for lo, hi in new.pieces(site, layer, term.sharded(new.strategy.zero)):
                for segment, overlap in overlapping(segments, lo, hi):
                    holders = self._alive(old_stage, sharded_old, segment.classes, layer)
                    out[receive_link(holders, gpu)] += overlap * term.bytes_per_param
        return out

    def _port_seconds(self, site: RankSite, by_link: dict[str, float]):
        """(port, seconds) of one rank's receive bytes: its NVLink in, its node's NICs in, the storage."""
        rates = self.rates
        if by_link.get("nvlink"):
            yield ("GPU", site.node, site.local), by_link["nvlink"] / rates.nvlink[site.node]
        remote = by_link.get("fabric", 0.0) + by_link.get("storage", 0.0)
        if remote:
            yield ("node", site.node, None), remote / rates.nic[site.node]
        if by_link.get("storage"):
            port, rate = rates.storage_port(site.node)
            yield port, by_link["storage"] / rate
