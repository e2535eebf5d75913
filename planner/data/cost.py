"""What one packed micro-batch costs, through the one cost model (planner.cost).

A micro-batch of documents with lengths L_i, run by a context-parallel group of `cp` data ranks (cp = 1: one
rank), is the cost model's micro-batch of one row of T = sum L_i tokens (rounded up to a multiple of 2 cp: the
load-balanced causal split pads each row so) whose attention term counts sum(L_i^2) / T keys per token
(`Job.attention_span`: variable-length flash kernels with a document mask, FlashAttention's varlen API,
Transformer Engine's THD format).  Every linear term (GEMMs, element-wise work, TP and CP traffic, ZeRO gathers
per micro-batch) scales with T, the attention core with sum(L_i^2), as `planner.cost.compute` prices them.

A data rank's micro-batches run through the pipeline one after another; with per-stage times t[j][i]
(micro-batch j, stage i) and v interleaved chunks the pipeline takes
    sum_j max_i t[j][i] + max_j (sum_i t[j][i] - max_i t[j][i]) / v,
which is `evaluate`'s m max t + (sum t - max t) / v when the micro-batches are equal.  The step adds what
`evaluate` puts after the pipeline's flush for the strategy (data-parallel sync, barrier, optimizer), the same
for every layout of the data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hardware import Catalog
from planner.cost import evaluate, micro_batches, stage_cost
from planner.cost.layout import place_stages
from planner.job import Job
from planner.strategy import Strategy
from planner.validation import check_strategy


@dataclass(frozen=True)
class MicroCost:
    """One packed micro-batch on its data ranks."""

    stages: tuple[float, ...]  # seconds of each pipeline stage
    fits: bool  # every stage's memory fits at this micro-batch's tokens
    forward: float = 0.0  # the stages' forward compute seconds (a frozen encoder runs only these)

    @property
    def busiest(self) -> float:
        return max(self.stages)

    @property
    def fill(self) -> float:
        """The stages' seconds beyond the busiest (pipeline fill and drain)."""
        return sum(self.stages) - max(self.stages)


def padded_tokens(tokens: int, cp: int) -> int:
    """A row's tokens rounded up to a multiple of 2 cp (the load-balanced causal split's chunks)."""
    unit = 2 * cp
    return max(unit, -(-tokens // unit) * unit)


@dataclass
class MicroCoster:
    """Prices packed micro-batches of one strategy (cached by (cp, tokens, sum of squared lengths))."""

    job: Job
    strategy: Strategy  # resolved; its cp x dp ranks are the data ranks
    catalog: Catalog
    _cache: dict[tuple[int, int, int], MicroCost] = field(default_factory=dict)

    @property
    def data_ranks(self) -> int:
        """Ranks that hold a micro-batch each (one tp x pp model replica each): cp x dp."""
        return self.strategy.cp * self.strategy.dp

    def cost(self, lengths: tuple[int, ...] | list[int], cp: int, row: int = 0) -> MicroCost:
        """The micro-batch of documents `lengths` on a context-parallel group of `cp` ranks; `row`: its tokens
        when it is padded to a fixed shape (the padding runs through every linear term, attends nothing)."""
        tokens = padded_tokens(max(row, sum(lengths)), cp)
        squares = sum(n * n for n in lengths)
        key = (cp, tokens, squares)
        if key not in self._cache:
            self._cache[key] = self._price(cp, tokens, squares)
        return self._cache[key]

    def _price(self, cp: int, tokens: int, squares: int) -> MicroCost:
        dp = self.data_ranks // cp
        # as many micro-batches per replica as the strategy's own step: the pipeline's in-flight activations
        # and the interleaved schedule's rule (micro-batches % pp) are those of the run
        per_replica = micro_batches(self.job, self.strategy)
        job = self.job.model_copy(update={"seq_len": tokens, "attention_span": min(float(tokens), squares / tokens),
                                          "global_batch": dp * per_replica})
        variant = self.strategy.model_copy(update={"cp": cp, "dp": dp, "mbs": 1})
        s = check_strategy(job, variant)
        costs = [stage_cost(job, s, stage, self.catalog) for stage in place_stages(job, s, self.catalog)]
        return MicroCost(stages=tuple(c.microbatch for c in costs), fits=all(c.memory.fits_hbm for c in costs),
                         forward=sum(c.sums.forward for c in costs))

    def with_extra(self, cost: MicroCost, seconds: float) -> MicroCost:
        """`cost` with `seconds` more on its first stage (co-located encoders run before the first layer)."""
        if not seconds:
            return cost
        return MicroCost(stages=(cost.stages[0] + seconds, *cost.stages[1:]), fits=cost.fits, forward=cost.forward)

    def step_end(self) -> float:
        """Seconds after the pipeline's flush (data-parallel sync, barrier, update): `evaluate`'s step less its
        pipeline, for the strategy on its own job."""
        est = evaluate(self.job, self.strategy, catalog=self.catalog)
        job, s = self.job, self.strategy
        costs = [stage_cost(job, s, stage, self.catalog) for stage in place_stages(job, s, self.catalog)]
        times = [c.microbatch for c in costs]
        pipeline = micro_batches(job, s) * max(times) + (sum(times) - max(times)) / s.vpp
        return est.step_time_s - pipeline


def pipeline_seconds(costs: list[MicroCost], vpp: int) -> float:
    """A data rank's micro-batches through the pipeline, one after another (the formula above)."""
    if not costs:
        return 0.0
    return sum(c.busiest for c in costs) + max(c.fill for c in costs) / vpp
