"""Plan for the data: packing, per-bucket context parallelism and balancing, against the best static plan.

For each candidate strategy (the compiled plan and the best plan at every fixed context-parallel degree) the
step's sequences (planner.data.profile.step_lengths) are laid out five ways, every one priced micro-batch by
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
multiple, kept when the step gets faster); the plan is the fastest layout of all, so it never loses to a
static one.  Its certificate: the step time against the bound of its own micro-batches (their rank-seconds
spread evenly, never less than the longest).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hardware import Catalog
from planner.data.balance import Packed, lower_bound, min_degree, pack, schedule
from planner.data.cost import MicroCost, MicroCoster, pipeline_seconds
from planner.data.profile import DataProfile, step_lengths
from planner.data.result import Bucket, CostFit, DataPlan, StaticLayout
from planner.job import Job
from planner.strategy import Strategy


def _pipeline_loads(coster: MicroCoster, packed: Sequence[Packed], costs: Sequence[MicroCost],
                    groups: Sequence[int]) -> list[float]:
    """Each data rank's pipeline seconds, from the micro-batches its group runs."""
    per_rank: list[list[MicroCost]] = [[] for _ in range(coster.data_ranks)]
    for p, cost, first in zip(packed, costs, groups):
        for r in range(first, first + p.cp):
            per_rank[r].append(cost)
    return [pipeline_seconds(c, coster.strategy.vpp) for c in per_rank]


def static_rows(lengths: Sequence[int], row: int) -> list[list[int]]:
    """The sequences packed whole, in order, into rows of `row` tokens (next fit: one that does not fit opens
    the next row)."""
    rows: list[list[int]] = [[]]
    left = row
    for n in lengths:
        if n > left:
            rows.append([])
            left = row
        rows[-1].append(n)
        left -= n
    return [r for r in rows if r]


def static_layouts(coster: MicroCoster, lengths: Sequence[int], end: float) -> list[StaticLayout]:
    """The strategy's static layouts of the step (padding, unmasked packing, packing), priced."""
    job, s = coster.job, coster.strategy
    spec, seq, mbs, dp, cp = s.spec(), job.seq_len, s.mbs, s.dp, s.cp
    full = coster.cost([seq] * mbs, cp)

    def uniform(micro: int) -> float:
        return micro * full.busiest + full.fill / s.vpp + end

    padded = math.ceil(len(lengths) / (dp * mbs))  # micro-batches per replica, one sequence per row
    out = [StaticLayout(layout="pad", strategy=spec, cp=cp, step_time_s=uniform(padded), fits=full.fits),
           StaticLayout(layout="pack-unmasked", strategy=spec, cp=cp,
                        step_time_s=uniform(job.global_batch // (dp * mbs)), fits=full.fits)]
    rows = static_rows(lengths, seq)
    micro = [sum(rows[i:i + mbs], []) for i in range(0, len(rows), mbs)]
    per_replica = math.ceil(len(micro) / dp)
    costs = [coster.cost(m, cp, row=seq * mbs) for m in micro]
    replicas = [pipeline_seconds(costs[r * per_replica:(r + 1) * per_replica], s.vpp) for r in range(dp)]
    out.append(StaticLayout(layout="pack", strategy=spec, cp=cp, step_time_s=max(replicas) + end,
                            fits=all(c.fits for c in costs)))
    return out


def _degree_rule(budget: int, ranks: int, factors: dict[int, int]):
    def degree(length: int) -> int:
        c = min_degree(length, budget)
        return min(ranks, c * factors.get(c, 1))
    return degree


def _hybrid(coster: MicroCoster, lengths: Sequence[int], budget: int, factors: dict[int, int], end: float
            ) -> tuple[float, float, list[Packed], list[MicroCost]]:
    """(step seconds, bound seconds, micro-batches, their costs) of the hybrid layout under `factors`."""
    packed = pack(lengths, budget, _degree_rule(budget, coster.data_ranks, factors))
    costs = [coster.cost([lengths[i] for i in p.members], p.cp) for p in packed]
    if not all(c.fits for c in costs):
        return math.inf, math.inf, packed, costs
    degrees, busiest = [p.cp for p in packed], [c.busiest for c in costs]
    plan = schedule(degrees, busiest, coster.data_ranks)
    loads = _pipeline_loads(coster, packed, costs, plan.groups)
    fill = min(c.fill for c in costs) / coster.strategy.vpp
    return max(loads) + end, lower_bound(degrees, busiest, coster.data_ranks) + fill + end, packed, costs


def choose_factors(coster: MicroCoster, lengths: Sequence[int], budget: int, end: float) -> dict[int, int]:
    """Per bucket (its smallest degree), the multiple of it the bucket runs on: coordinate descent."""
    ranks = coster.data_ranks
    buckets = sorted({min_degree(n, budget) for n in lengths if min_degree(n, budget) > 1}, reverse=True)
    factors: dict[int, int] = {}
    best = _hybrid(coster, lengths, budget, factors, end)[0]
    for c in buckets:
        f = 2
        while c * f <= ranks:
            trial = {**factors, c: f}
            step = _hybrid(coster, lengths, budget, trial, end)[0]
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


def plan_data(job: Job, profile: DataProfile, candidates: Sequence[Strategy], catalog: Catalog
              ) -> tuple[DataPlan, int]:
    """The data plan of `job` (at its seq_len and batch) on `profile` over the resolved candidate strategies,
    and the index of the candidate it runs (the hybrid layout's strategy, or the best static layout's)."""
    lengths = step_lengths(profile, job.global_batch * job.seq_len)
    statics: list[tuple[StaticLayout, int]] = []
    hybrids = []
    for k, s in enumerate(candidates):
        coster = MicroCoster(job, s, catalog)
        end = coster.step_end()
        statics += [(layout, k) for layout in static_layouts(coster, lengths, end)]
        budget = job.seq_len * s.mbs // s.cp
        factors = choose_factors(coster, lengths, budget, end)
        step, bound, packed, _ = _hybrid(coster, lengths, budget, factors, end)
        hybrids.append((step, bound, k, coster, budget, factors, packed))
    fitting = [x for x in statics if x[0].fits] or statics
    baseline, base_k = min(fitting, key=lambda x: x[0].step_time_s)
    step, bound, k, coster, budget, factors, packed = min(hybrids, key=lambda h: (h[0], h[2]))
    notes = [f"modality {m.kind}: its encoder {m.encoder} is not priced (its {m.tokens_per_item} tokens per item are, "
             "in the language model)" for m in profile.modalities if m.encoder]
    common = dict(profile=profile.name, source=profile.source, sequences=len(lengths), tokens=sum(lengths),
                  notes=notes,
                  baseline=f"{baseline.layout} {baseline.strategy}", baseline_step_time_s=baseline.step_time_s,
                  static=[x for x, _ in statics])
    if step >= baseline.step_time_s:  # the static layout stays: the plan never loses to it
        s = candidates[base_k]
        coster = MicroCoster(job, s, catalog)
        return DataPlan(**common, layout="static-" + baseline.layout, strategy=s.spec(),
                        token_budget=job.seq_len * s.mbs // s.cp, bucket_factors={}, buckets=[], micro_batches=0,
                        step_time_s=baseline.step_time_s, bound_s=baseline.step_time_s, gap=0.0, speedup=1.0,
                        cost_fit=fit_costs(coster, job.seq_len * s.mbs // s.cp, [s.cp])), base_k
    return DataPlan(**common, layout="hybrid", strategy=coster.strategy.spec(), token_budget=budget,
                    bucket_factors={str(c): f for c, f in sorted(factors.items())},
                    buckets=_buckets(lengths, packed, budget), micro_batches=len(packed),
                    step_time_s=step, bound_s=bound, gap=(step - bound) / step if step else 0.0,
                    speedup=baseline.step_time_s / step,
                    cost_fit=fit_costs(coster, budget, [p.cp for p in packed])), k
