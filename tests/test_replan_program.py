"""The migration as a term of the compile's CP-SAT programs (planner/replan/program_term.py,
planner/search/ilp/surcharge.py).

The checks are against independent paths: the exact migration of planner.replan.migration (the term must
never exceed it, and equals it when the busiest port is a receiving one), and a brute force over every split
with `evaluate` (the program's optimum must equal the least step + amortised migration).

Scenario: llama3-8b (32 blocks) under planner's runtime, batch 96 x 4096 tokens.  The old plan, tp=2 x pp=4 x
dp=4 (ZeRO-1, split 9/8/8/7) on four DGX H100 nodes, loses its last node, which held the whole last stage:
that stage's state is read from the checkpoint by whichever new ranks hold its blocks.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from hardware import load_catalog, load_cluster
from models import load_model
from planner.cost import evaluate
from planner.job import Job
from planner.profile import load_runtime
from planner.replan.layout import moving_terms, strategy_layout
from planner.replan.migration import cluster_rates, plan_migration
from planner.replan.nodes import map_nodes
from planner.replan.program_term import MigrationSurcharge
from planner.search.compile import compile_job
from planner.search.ilp.tables import NS
from planner.search.result import CompileOptions
from planner.search.space import SpaceOptions
from planner.strategy import parse_strategy
from planner.validation import check_strategy

BLOCKS = 32


class Scene:
    def __init__(self, old_nodes: int, old_spec: str, new_nodes: int, nic: float | None = None,
                 runtime: str = "planner"):
        self.model = load_model("llama3-8b")
        self.runtime = load_runtime(runtime)
        self.catalog = load_catalog()
        self.old_cluster, self.new_cluster = (load_cluster(f"dgx-h100:{old_nodes}"),
                                              load_cluster(f"dgx-h100:{new_nodes}"))
        self.job = Job(model=self.model, cluster=self.new_cluster, global_batch=96, seq_len=4096, runtime=self.runtime)
        old_job = self.job.model_copy(update={"cluster": self.old_cluster})
        self.old = strategy_layout(self.model, self.old_cluster, check_strategy(old_job, parse_strategy(old_spec)))
        self.nodes = map_nodes(self.old_cluster, self.new_cluster)
        self.rates = cluster_rates(self.new_cluster, self.catalog, None)
        if nic is not None:  # a slower fabric than the preset's
            self.rates = replace(self.rates, nic=(nic,) * new_nodes)
        self.terms = moving_terms(self.runtime)

    def surcharge(self, steps: int) -> MigrationSurcharge:
        return MigrationSurcharge(self.old, self.job, self.nodes, self.rates, self.terms, steps)

    def exact(self, strategy) -> float:
        new = strategy_layout(self.model, self.new_cluster, check_strategy(self.job, strategy))
        return plan_migration(self.old, new, self.terms, self.nodes, self.rates, self.model, moves=False).moved.seconds


@pytest.fixture(scope="module")
def lost_node() -> Scene:
    return Scene(4, "tp=2,pp=4,dp=4,zero=1,split=9/8/8/7", 3)


def _ranges(split: tuple[int, ...]) -> list[range]:
    edges = [0]
    for n in split:
        edges.append(edges[-1] + n)
    return [range(a, b) for a, b in zip(edges, edges[1:])]


def _random_split(rng: random.Random, pp: int) -> tuple[int, ...]:
    cuts = sorted(rng.sample(range(1, BLOCKS), pp - 1))
    edges = [0, *cuts, BLOCKS]
    return tuple(b - a for a, b in zip(edges, edges[1:]))


@pytest.mark.parametrize("spec", ["tp=2,pp=4,dp=3,zero=1", "tp=2,pp=2,dp=6,zero=1", "tp=4,pp=2,dp=3,zero=3",
                                  "tp=1,pp=3,dp=8,zero=2"])
def test_the_term_never_exceeds_the_exact_migration(lost_node, spec):
    # one step left: the term is the migration itself, in nanoseconds
    config = check_strategy(lost_node.job, parse_strategy(spec))
    table = lost_node.surcharge(1).table(config, 1)
    rng = random.Random(spec)
    for _ in range(4):
        split = _random_split(rng, config.pp)
        term = table.value(_ranges(split)) / NS
        exact = lost_node.exact(config.model_copy(update={"split": split}))
        assert term <= exact * (1 + 1e-9)
        # here the busiest port is a node's checkpoint reads, a receiving port: the term is exact
        assert term == pytest.approx(exact, rel=1e-6)


def test_the_program_finds_the_least_step_plus_amortised_migration_of_every_split(lost_node):
    # brute force over the 31 splits of one configuration, each costed by evaluate and the term's table
    fixed = {"tp": 2, "pp": 2, "dp": 6, "cp": 1, "mbs": 1, "vpp": 1, "zero": 1, "shard": "full",
             "recompute": "none"}
    for steps in (1, 30):
        surcharge = lost_node.surcharge(steps)
        result = compile_job(lost_node.job, CompileOptions(space=SpaceOptions(fixed=fixed), runners_up=0),
                             catalog=lost_node.catalog, surcharge=surcharge)
        config = result.strategy
        table = surcharge.table(config, 1)
        totals = []
        for first in range(1, BLOCKS):
            strategy = config.model_copy(update={"split": (first, BLOCKS - first)})
            estimate = evaluate(lost_node.job, strategy, catalog=lost_node.catalog)
            if estimate.memory.fits:
                totals.append(estimate.step_time_s + table.value(_ranges((first, BLOCKS - first))) / NS)
        assert result.certificate.status == "OPTIMAL"
        assert result.certificate.objective == pytest.approx(min(totals), rel=1e-7)


@pytest.fixture(scope="module")
def unchanged() -> Scene:
    # the same two nodes before and after, the old split off balance (20/12): keeping it moves nothing, and
    # moving a block to the other node sends its state (weights, fp32 master weights and Adam moments) over a
    # 10 Gb/s Ethernet; under Megatron's runtime (planner's keeps all 96 micro-batches' logits on the last stage,
    # which does not fit without recompute)
    return Scene(2, "tp=8,pp=2,dp=1,zero=0,split=20/12", 2, nic=1.25e9, runtime="megatron")


def test_few_steps_left_keep_the_old_boundaries_many_move_them(unchanged):
    fixed = {"tp": 8, "pp": 2, "dp": 1, "cp": 1, "mbs": 1, "vpp": 1, "zero": 0, "recompute": "none"}
    options = CompileOptions(space=SpaceOptions(fixed=fixed), runners_up=0)
    fastest = compile_job(unchanged.job, options, catalog=unchanged.catalog).strategy
    assert fastest.split != (20, 12)  # otherwise there is nothing to trade
    few = compile_job(unchanged.job, options, catalog=unchanged.catalog, surcharge=unchanged.surcharge(1)).strategy
    many = compile_job(unchanged.job, options, catalog=unchanged.catalog,
                       surcharge=unchanged.surcharge(10_000_000)).strategy
    assert few.split == (20, 12) and unchanged.exact(few) == 0.0
    assert many.split == fastest.split and unchanged.exact(many) > 0.0
