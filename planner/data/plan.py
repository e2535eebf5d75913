"""Plan for the data: packing, per-bucket context parallelism and balancing, against the best static plan.

For each candidate strategy (the compiled plan and the best plan at every fixed context-parallel degree) the
step's sequences (planner.data.profile.step_lengths) are laid out four ways, every one priced micro-batch by
micro-batch through the one cost model (planner.data.cost):

* static padding: each sequence alone in a row of seq_len tokens, attention over the whole padded row;
* static packing, unmasked: rows of seq_len tokens attending across documents (what compile's own estimate
  of the strategy assumes);
* static packing: the sequences packed whole, in data order, into rows of seq_len tokens (a sequence that does
  not fit starts the next row; the rest is padding, as packed SFT datasets of fixed shape are), a document mask
  in each row, every row on the strategy's fixed cp, each data-parallel replica a contiguous slice of the rows
  (no sequence is cut: cutting, as pretraining's GPTDataset does, would change the data the plan is
  compared on);
* hybrid (the plan): a token budget per rank and micro-batch (the strategy's own, seq_len x mbs / cp, so no
  rank holds more activations than the static plan's), each length bucket on its own context-parallel degree
  (short sequences packed on one rank, long ones split; a bucket may take a larger degree than it needs when
  that balances better), the micro-batches balanced over the cp x dp data ranks (planner.data.balance).

The bucket degrees are chosen by coordinate descent over the buckets (longest first, every power-of-two
multiple, kept when the step gets faster), on the fastest strategy the token budget may also halve or quarter
(`smaller_budgets`); the plan is the fastest layout of all, so it never loses to a static one.  Its
certificate: the step time against the bound of its own micro-batches (their rank-seconds spread evenly,
never less than the longest).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hardware import Catalog
from planner.data.balance import Packed, lower_bound, min_degree, pack, schedule
from planner.data.cost import MicroCost, MicroCoster, pipeline_seconds
from planner.data.encoder import Encoders, Placement, encoders_for
from planner.data.profile import DataProfile, step_lengths
from planner.data.result import Bucket, CostFit, DataPlan, StaticLayout
from planner.job import Job
from planner.strategy import Strategy


@dataclass
class Layouts:
    """One candidate strategy's pricing of the step: its coster, the step's sequences, what follows the
    pipeline's flush, and its encoders (None: no priced encoder)."""

    coster: MicroCoster
    lengths: Sequence[int]
    end: float
    encoders: Encoders | None

    @property
    def vpp(self) -> int:
        return self.coster.strategy.vpp

    def priced(self, members: Sequence[int], lengths: Sequence[int], cp: int, row: int = 0,
               encoded: bool = True) -> MicroCost:
        """A micro-batch of these samples (`lengths`: the pieces it runs), its co-located encoders unless
        `encoded` is False."""
        cost = self.coster.cost(lengths, cp, row=row)
        if self.encoders is None or not encoded:
            return cost
        return self.coster.with_extra(cost, self.encoders.colocated(members))

    def replicas(self, micro: list[list[int]], costs: list[MicroCost], per_replica: int) -> float:
        """The step of static micro-batches dealt out in contiguous slices to the data-parallel replicas."""
        dp = self.coster.strategy.dp
        return max(pipeline_seconds(costs[r * per_replica:(r + 1) * per_replica], self.vpp)
                   for r in range(dp)) + self.end


def rows_of(lengths: Sequence[int], row: int, cut: bool) -> list[list[int]]:
    """The samples (indices) of each row of `row` tokens, in order: whole samples, next fit (`cut` False), or
    the samples starting in each row when the stream is cut at row boundaries (`cut` True)."""
    rows: list[list[int]] = [[]]
    left = row
    for i, n in enumerate(lengths):
        if cut:
            if left == 0:
                rows.append([])
                left = row
            rows[-1].append(i)
            while n > left:  # the sample runs on into the next rows
                n -= left
                rows.append([])
                left = row
            left -= n
            continue
        if n > left:
            rows.append([])
            left = row
        rows[-1].append(i)
        left -= n
    return [r for r in rows if r] if not cut else rows


def static_layouts(ctx: Layouts) -> list[StaticLayout]:
    """The strategy's static layouts of the step (padding, unmasked packing, packing), priced."""
    job, s, lengths = ctx.coster.job, ctx.coster.strategy, ctx.lengths
    spec, seq, mbs, dp, cp = s.spec(), job.seq_len, s.mbs, s.dp, s.cp
    out = []
    # pad: a row per sample; pack-unmasked: the global batch's rows, cut, attending across documents
    padded = [[i] for i in range(len(lengths))]
    cut = rows_of(lengths, seq, cut=True) + [[] for _ in range(job.global_batch)]
    for layout, rows, count in (("pad", padded, len(padded)), ("pack-unmasked", cut, job.global_batch)):
        micro = [sum(rows[i:i + mbs], []) for i in range(0, count, mbs)]
        costs = [ctx.priced(m, [seq] * mbs, cp) for m in micro]
        step = ctx.replicas(micro, costs, math.ceil(len(micro) / dp))
        out.append(StaticLayout(layout=layout, strategy=spec, cp=cp, step_time_s=step, fits=costs[0].fits))
    rows = rows_of(lengths, seq, cut=False)
    micro = [sum(rows[i:i + mbs], []) for i in range(0, len(rows), mbs)]
    costs = [ctx.priced(m, [lengths[i] for i in m], cp, row=seq * mbs) for m in micro]
    out.append(StaticLayout(layout="pack", strategy=spec, cp=cp, fits=all(c.fits for c in costs),
                            step_time_s=ctx.replicas(micro, costs, math.ceil(len(micro) / dp))))
    return out


def _degree_rule(budget: int, ranks: int, factors: dict[int, int]):
    def degree(length: int) -> int:
        c = min_degree(length, budget)
        return min(ranks, c * factors.get(c, 1))
    return degree


@dataclass(frozen=True)
class Hybrid:
    """A priced hybrid layout."""

    step: float
    bound: float
    packed: list[Packed]
    placement: Placement | None  # where the encoders run (None: no priced encoder)


def _hybrid_under(ctx: Layouts, packed: list[Packed], placement: Placement | None) -> Hybrid:
    ranks, lengths = ctx.coster.data_ranks, ctx.lengths
    costs = [ctx.priced(p.members, [lengths[i] for i in p.members], p.cp, encoded=placement == "co-located")
             for p in packed]
    if not all(c.fits for c in costs):
        return Hybrid(step=math.inf, bound=math.inf, packed=packed, placement=placement)
    degrees, busiest = [p.cp for p in packed], [c.busiest for c in costs]
    plan = schedule(degrees, busiest, ranks)
    per_rank: list[list[MicroCost]] = [[] for _ in range(ranks)]
    for p, cost, first in zip(packed, costs, plan.groups):
        for r in range(first, first + p.cp):
            per_rank[r].append(cost)
    extra = ctx.encoders.spread(ranks) if placement == "spread" else 0.0
    fill = min(c.fill for c in costs) / ctx.vpp
    step = max(pipeline_seconds(c, ctx.vpp) for c in per_rank) + extra + ctx.end
    return Hybrid(step=step, bound=lower_bound(degrees, busiest, ranks) + fill + extra + ctx.end, packed=packed,
                  placement=placement)


def hybrid(ctx: Layouts, budget: int, factors: dict[int, int]) -> Hybrid:
    """The hybrid layout under `factors`, its encoders where they run faster."""
    packed = pack(ctx.lengths, budget, _degree_rule(budget, ctx.coster.data_ranks, factors))
    placements: tuple[Placement | None, ...] = ("co-located", "spread") if ctx.encoders else (None,)
    return min((_hybrid_under(ctx, packed, p) for p in placements), key=lambda h: h.step)


def choose_factors(ctx: Layouts, budget: int) -> dict[int, int]:
    """Per bucket (its smallest degree), the multiple of it the bucket runs on: coordinate descent."""
    ranks = ctx.coster.data_ranks
    buckets = sorted({min_degree(n, budget) for n in ctx.lengths if min_degree(n, budget) > 1}, reverse=True)
    factors: dict[int, int] = {}
    best = hybrid(ctx, budget, factors).step
    for c in buckets:
        f = 2
        while c * f <= ranks:
            trial = {**factors, c: f}
            step = hybrid(ctx, budget, trial).step
            if step < best:
                best, factors = step, trial
            f *= 2
    return factors


def fit_costs(coster: MicroCoster, budget: int, degrees: Sequence[int]) -> list[CostFit]:
    """Per degree, a least-squares fit of the cost model's micro-batch seconds to fixed + per token x T + per
    squared token x sum(L^2): what the trainer's sampler balances with (it meets lengths the plan did not)."""
    out = []
    for c in sorted(set(degrees)):
        rows, ys = [], []
        for share in (0.25, 0.5, 1.0):
            tokens = max(2 * c, int(budget * c * share))
            for docs in (1, 4, 16):
                part = max(1, tokens // docs)
                lengths = [part] * docs
                t = sum(lengths)
                rows.append([1.0, t, sum(n * n for n in lengths)])
                ys.append(coster.cost(lengths, c).busiest)
        a = np.array(rows)
        scale = a.max(axis=0)
        coef = np.linalg.lstsq(a / scale, np.array(ys), rcond=None)[0] / scale
        out.append(CostFit(cp=c, fixed_s=float(coef[0]), per_token_s=float(coef[1]),
                           per_token_squared_s=float(coef[2])))
    return out


def _buckets(lengths: Sequence[int], packed: Sequence[Packed], budget: int) -> list[Bucket]:
    by_cp: dict[int, list[int]] = {}
    micro: dict[int, int] = {}
    for p in packed:
        by_cp.setdefault(p.cp, []).extend(lengths[i] for i in p.members)
        micro[p.cp] = micro.get(p.cp, 0) + 1
    return [Bucket(cp=c, min_tokens=min(v), max_tokens=max(v), sequences=len(v), tokens=sum(v),
                   micro_batches=micro[c]) for c, v in sorted(by_cp.items())]


def smaller_budgets(ctx: Layouts, best: Hybrid, budget: int, factors: dict[int, int]
                    ) -> tuple[Hybrid, int, dict[int, int]]:
    """The token budget: the strategy's own (the most a rank may hold) or a half or a quarter of it, whichever
    gives the faster step (finer micro-batches balance better; each costs its own gathers and launches, and
    long sequences need higher degrees).  Tried on the chosen strategy only."""
    for divisor in (2, 4):
        smaller = budget // divisor
        if smaller < 2 * ctx.coster.data_ranks:
            break
        trial_factors = choose_factors(ctx, smaller)
        trial = hybrid(ctx, smaller, trial_factors)
        if trial.step < best.step:
            return trial, smaller, trial_factors
    return best, budget, factors


def plan_data(job: Job, profile: DataProfile, candidates: Sequence[Strategy], catalog: Catalog
              ) -> tuple[DataPlan, int]:
    """The data plan of `job` (at its seq_len and batch) on `profile` over the resolved candidate strategies,
    and the index of the candidate it runs (the hybrid layout's strategy, or the best static layout's)."""
    lengths = step_lengths(profile, job.global_batch * job.seq_len)
    statics: list[tuple[StaticLayout, int]] = []
    hybrids: list[tuple[Hybrid, int, Layouts, int, dict[int, int]]] = []
    notes: list[str] = []
    for k, s in enumerate(candidates):
        coster = MicroCoster(job, s, catalog)
        encoders, left_out = encoders_for(job, s, profile, lengths, catalog)
        notes += [n for n in left_out if n not in notes]
        ctx = Layouts(coster=coster, lengths=lengths, end=coster.step_end(), encoders=encoders)
        statics += [(layout, k) for layout in static_layouts(ctx)]
        budget = job.seq_len * s.mbs // s.cp
        factors = choose_factors(ctx, budget)
        hybrids.append((hybrid(ctx, budget, factors), k, ctx, budget, factors))
    fitting = [x for x in statics if x[0].fits] or statics
    baseline, base_k = min(fitting, key=lambda x: x[0].step_time_s)
    best, k, ctx, budget, factors = min(hybrids, key=lambda h: (h[0].step, h[1]))
    best, budget, factors = smaller_budgets(ctx, best, budget, factors)
    common = dict(profile=profile.name, source=profile.source, sequences=len(lengths), tokens=sum(lengths),
                  notes=notes, baseline=f"{baseline.layout} {baseline.strategy}",
                  baseline_step_time_s=baseline.step_time_s, static=[x for x, _ in statics])
    if best.step >= baseline.step_time_s:  # the static layout stays: the plan never loses to it
        s = candidates[base_k]
        budget = job.seq_len * s.mbs // s.cp
        return DataPlan(**common, layout="static-" + baseline.layout, strategy=s.spec(), token_budget=budget,
                        bucket_factors={}, buckets=[], micro_batches=0,
                        encoder_placement="co-located" if hybrids[base_k][2].encoders else None,
                        step_time_s=baseline.step_time_s, bound_s=baseline.step_time_s, gap=0.0, speedup=1.0,
                        cost_fit=fit_costs(MicroCoster(job, s, catalog), budget, [s.cp])), base_k
    return DataPlan(**common, layout="hybrid", strategy=ctx.coster.strategy.spec(), token_budget=budget,
                    bucket_factors={str(c): f for c, f in sorted(factors.items())},
                    buckets=_buckets(lengths, best.packed, budget), micro_batches=len(best.packed),
                    encoder_placement=best.placement, step_time_s=best.step, bound_s=best.bound,
                    gap=(best.step - best.bound) / best.step if best.step else 0.0,
                    speedup=baseline.step_time_s / best.step,
                    cost_fit=fit_costs(ctx.coster, budget, [p.cp for p in best.packed])), k
