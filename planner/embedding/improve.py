"""Local search over options and placement, on the cost model's own step.

The relaxed program chooses options against averages (every rank carries
the mean load); placed, its choice can leave lumpy units on a few ranks: a
column shard of a tiny table costs its holder the same all-to-all as a
large one's.  Here, while it helps, one table at a time takes another option
of the space and a new place for its units:

    step = max_r lookup[r] + max(max_r send[r], max_r receive[r]) + syncs

(evaluate.py's embedding terms; the dense terms do not move).  The tables
tried each round (`_candidates`) are those with a unit on a rank that
attains the lookup or the send maximum, the replicas (whose syncs add up),
and, when the receive side sets the all-to-all, the tables whose replica
would sync for less than they cost every receiver.  For each, every option
of its space is tried (a smaller cache level of a type only while memory
held the larger one off a better rank).  A table's units go where the step
grows least (column shards on distinct ranks, one after another; a
table-row-wise table on the best node), within every rank's HBM and every
node's host DRAM.  The best move of the round is taken when it lowers the
step, or keeps it and lowers the sum of squared per-rank loads (so
plateaus, several ranks at the maximum, are left one rank at a time); that
order is strict, so the search ends.  Deterministic: ties break on table,
option and rank order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.embedding.evaluate import EmbeddingCostModel, TablePlacement
from planner.embedding.options import ALL_RANKS, ShardingType, TableOption

MAX_ROUNDS = 400  # moves at most (each strictly improves; this caps the work on huge jobs)
CANDIDATE_TABLES = 8  # tables tried per round from each term that sets the step, largest share first
EPS = 1e-12  # seconds: smaller step changes are ties
_RELATIVE = 1e-9  # smaller relative changes of the squared loads are ties


class _Costs:
    """Per (table, option): per-rank unit arrays (lookup, send, HBM), per-node host bytes, receive, sync."""

    def __init__(self, model: EmbeddingCostModel):
        self.model = model
        sites = model.sites
        self.pool = np.array([s.pool for s in sites.ranks])
        self.node = np.array([s.node for s in sites.ranks])
        self.pools = len(model.job.cluster.pools)
        self._cache: dict[tuple[int, TableOption], tuple] = {}

    def of(self, t: int, option: TableOption) -> tuple:
        """(lookup, send, hbm, host) per rank as if every rank held a unit, receive per rank, sync seconds."""
        key = (t, option)
        if key not in self._cache:
            costs = self.model.costs
            units = [costs.unit(t, option, p) for p in range(self.pools)]
            per_pool = np.array([[u.lookup_s, u.send_s, u.hbm_bytes, u.host_bytes,
                                  costs.receive_s(t, option, p)] for p, u in enumerate(units)])
            lookup, send, hbm, host, receive = per_pool[self.pool].T
            sync = costs.dp_sync_s(t) if option.kind == ShardingType.DATA_PARALLEL else 0.0
            self._cache[key] = (lookup, send, hbm, host, receive, sync)
        return self._cache[key]


@dataclass(frozen=True)
class _Base:
    """The state around a table being re-placed (its own units removed)."""

    lookup: float  # slowest rank's lookups
    send: float  # slowest sender
    receive: float  # slowest receiver with the table's new option
    fixed: float  # syncs with the table's new option
    squares: float  # sum of squared per-rank lookup and send seconds


@dataclass(frozen=True)
class _Placed:
    """A table's units placed: the score after, the ranks, and whether memory kept a unit off a better rank."""

    score: tuple[float, float]
    ranks: tuple[int, ...]
    constrained: bool


class _State:
    """Per-rank loads and free memory of a plan, with the step's embedding terms."""

    def __init__(self, model: EmbeddingCostModel, costs: _Costs, placements: list[TablePlacement]):
        sites = model.sites
        world = sites.world
        self.model, self.costs = model, costs
        self.lookup, self.send, self.receive = np.zeros(world), np.zeros(world), np.zeros(world)
        self.hbm_left = np.array([model.hbm_budget(s.pool) for s in sites.ranks])
        self.host_left = np.array([sites.host_capacity(n) for n in range(sites.num_nodes)])
        self.sync = 0.0
        # ranks are numbered node by node, so a node's ranks are one slice (evaluate.py, sites.py)
        self.node_start = np.array([ranks[0] for ranks in sites.node_ranks])
        self.placements: dict[int, TablePlacement] = {}
        self.on_rank: list[set[int]] = [set() for _ in range(world)]  # tables with a unit on one rank or node
        self.everywhere: set[int] = set()  # row-wise and data-parallel tables
        for p in placements:
            self.add(p, 1.0)

    def add(self, p: TablePlacement, sign: float) -> None:
        """Add (sign 1) or remove (sign -1) a table's units."""
        lookup, send, hbm, host, receive, sync = self.costs.of(p.table, p.option)
        for rank in p.ranks:  # a rank may hold two column shards of a table
            self.lookup[rank] += sign * lookup[rank]
            self.send[rank] += sign * send[rank]
            self.hbm_left[rank] -= sign * hbm[rank]
            self.host_left[self.costs.node[rank]] -= sign * host[rank]
        self.receive += sign * receive
        self.sync += sign * sync
        spread = p.option.kind in ALL_RANKS
        if sign > 0:
            self.placements[p.table] = p
            if spread:
                self.everywhere.add(p.table)
            else:
                for rank in p.ranks:
                    self.on_rank[rank].add(p.table)
        else:
            del self.placements[p.table]
            self.everywhere.discard(p.table)
            if not spread:
                for rank in p.ranks:
                    self.on_rank[rank].discard(p.table)

    def score(self) -> tuple[float, float]:
        """(step's embedding seconds, sum of squared per-rank lookup and send seconds)."""
        step = self.lookup.max() + max(self.send.max(), self.receive.max()) + self.sync
        return step, float(np.dot(self.lookup, self.lookup) + np.dot(self.send, self.send))

    def place(self, t: int, option: TableOption) -> _Placed | None:
        """Where table t's units go under `option` on the current state (t removed), and the score after."""
        lookup, send, hbm, host, receive, sync = self.costs.of(t, option)
        base = _Base(self.lookup.max(), self.send.max(), float((self.receive + receive).max()), self.sync + sync,
                     float(np.dot(self.lookup, self.lookup) + np.dot(self.send, self.send)))
        if option.kind in ALL_RANKS:
            return self._whole(lookup, send, hbm, host, base)
        if option.kind == ShardingType.TABLE_ROW_WISE:
            return self._node(lookup, send, hbm, host, base)
        return self._singles(option.shards, lookup, send, hbm, host, base)

    def _whole(self, lookup, send, hbm, host, base: _Base) -> _Placed | None:
        """A unit on every rank (row-wise, data-parallel)."""
        if np.any(hbm > self.hbm_left) or np.any(np.add.reduceat(host, self.node_start) > self.host_left + EPS):
            return None
        new_l, new_s = self.lookup + lookup, self.send + send
        step = new_l.max() + max(new_s.max(), base.receive) + base.fixed
        return _Placed((step, float(np.dot(new_l, new_l) + np.dot(new_s, new_s))), tuple(range(len(lookup))), False)

    def _node(self, lookup, send, hbm, host, base: _Base) -> _Placed | None:
        """A unit on every GPU of the node where the step grows least (table-row-wise)."""
        starts = self.node_start
        new_l, new_s = self.lookup + lookup, self.send + send
        fits = np.minimum.reduceat((hbm <= self.hbm_left).astype(float), starts) > 0.0
        fits &= np.add.reduceat(host, starts) <= self.host_left + EPS
        if not fits.any():
            return None
        # the step if the table sits on node n: the node's new maxima against the other ranks' old ones
        step = (np.maximum(base.lookup, np.maximum.reduceat(new_l, starts))
                + np.maximum(np.maximum(base.send, np.maximum.reduceat(new_s, starts)), base.receive) + base.fixed)
        grow = np.add.reduceat(new_l * new_l - self.lookup * self.lookup + new_s * new_s - self.send * self.send,
                               starts)
        n, free = _pick(step, grow, fits)
        ranks = np.flatnonzero(self.costs.node == n)
        return _Placed((float(step[n]), base.squares + float(grow[n])), tuple(int(r) for r in ranks), n != free)

    def _singles(self, count, lookup, send, hbm, host, base: _Base) -> _Placed | None:
        """`count` one-rank units on distinct ranks, each where the step grows least."""
        lk, sd = self.lookup.copy(), self.send.copy()
        hbm_left, host_left = self.hbm_left.copy(), self.host_left.copy()
        node = self.costs.node
        chosen: list[int] = []
        constrained = False
        for _ in range(count):
            new_l, new_s = lk + lookup, sd + send
            step = np.maximum(lk.max(), new_l) + np.maximum(np.maximum(sd.max(), new_s), base.receive)
            grow = new_l * new_l - lk * lk + new_s * new_s - sd * sd
            ok = (hbm <= hbm_left) & (host <= host_left[node] + EPS)
            ok[chosen] = False
            if not ok.any():
                return None
            r, free = _pick(step, grow, ok)
            constrained |= r != free
            chosen.append(r)
            lk[r], sd[r] = new_l[r], new_s[r]
            hbm_left[r] -= hbm[r]
            host_left[node[r]] -= host[r]
        step = lk.max() + max(sd.max(), base.receive) + base.fixed
        return _Placed((step, float(np.dot(lk, lk) + np.dot(sd, sd))), tuple(sorted(chosen)), constrained)


def _pick(step: np.ndarray, grow: np.ndarray, ok: np.ndarray) -> tuple[int, int]:
    """The index of least step (then least growth of squared loads, then lowest index) among `ok`, and the same
    among those not held back by memory only (`ok` also excludes ranks already taken; same answer then)."""
    def best(mask: np.ndarray) -> int:
        masked = np.where(mask, step, np.inf)
        ties = np.flatnonzero(masked <= masked.min() + EPS)
        return int(ties[np.argmin(grow[ties])])

    return best(ok), best(np.isfinite(step))


def _better(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Score a is strictly better than b: a lower step, or the same step and fewer squared loads."""
    if a[0] < b[0] - EPS:
        return True
    return a[0] <= b[0] + EPS and a[1] < b[1] * (1.0 - _RELATIVE)


def _candidates(state: _State, replicable: set[int], limit: int) -> list[int]:
    """Tables tried this round, `limit` from each term that sets the step, largest share first: units on the
    slowest lookup ranks; units on the slowest senders (when they set the all-to-all); tables every rank
    receives whose replica (`replicable`: data parallel is in their space) would sync for less (when the
    receivers set it); replicas, whose syncs add up."""
    send_max, recv_max = state.send.max(), state.receive.max()
    top_l = np.flatnonzero(state.lookup >= state.lookup.max() - EPS)
    top_s = np.flatnonzero(state.send >= send_max - EPS) if send_max >= recv_max - EPS else top_l[:0]
    shares: list[dict[int, float]] = [{}, {}, {}, {}]
    for t in sorted(state.everywhere.union(*(state.on_rank[r] for r in top_l.tolist() + top_s.tolist()))):
        lookup, send, _, _, _, sync = state.costs.of(t, state.placements[t].option)
        shares[0][t] = float(lookup[top_l].sum())
        shares[1][t] = float(send[top_s].sum())
        shares[3][t] = sync
    if recv_max >= send_max - EPS:
        for t in sorted(replicable.difference(state.everywhere)):
            receive = state.costs.of(t, state.placements[t].option)[4]
            shares[2][t] = float(receive.max()) - state.costs.model.costs.dp_sync_s(t)
    out: dict[int, None] = {}
    for share in shares:
        ranked = sorted((t for t, w in share.items() if w > 0.0), key=lambda t: (-share[t], t))
        out.update(dict.fromkeys(ranked[:limit]))
    return list(out)


def _table_moves(state: _State, t: int, options: list[TableOption]) -> tuple[_Placed, TableOption] | None:
    """The best new option and place of table t (its units removed from the state)."""
    best: tuple[_Placed, TableOption] | None = None
    skip: set[tuple[ShardingType, int]] = set()
    for option in options:  # within a type, cache levels come largest first (options.py)
        kind = (option.kind, option.shards)
        if kind in skip:
            continue
        placed = state.place(t, option)
        if placed is None:
            continue
        if not placed.constrained:
            # a smaller cache only adds lookup time; it helps only where memory held the units back
            skip.add(kind)
        if best is None or _better(placed.score, best[0].score):
            best = (placed, option)
    return best


def improve(model: EmbeddingCostModel, space: list[list[TableOption]], placements: list[TablePlacement],
            max_rounds: int = MAX_ROUNDS) -> list[TablePlacement]:
    """A plan at least as fast as `placements` under the cost model (each table keeps to its `space` options)."""
    state = _State(model, _Costs(model), placements)
    replicable = {t for t, options in enumerate(space) if any(o.kind == ShardingType.DATA_PARALLEL for o in options)}
    for _ in range(max_rounds):
        current = state.score()
        best: tuple[tuple[float, float], TablePlacement] | None = None
        for t in _candidates(state, replicable, CANDIDATE_TABLES):
            old = state.placements[t]
            state.add(old, -1.0)
            found = _table_moves(state, t, space[t])
            state.add(old, 1.0)
            if found is None:
                continue
            placed, option = found
            if _better(placed.score, current) and (best is None or _better(placed.score, best[0])):
                best = (placed.score, TablePlacement(t, option, placed.ranks))
        if best is None:
            break
        state.add(state.placements[best[1].table], -1.0)
        state.add(best[1], 1.0)
    return [state.placements[t] for t in sorted(state.placements)]
