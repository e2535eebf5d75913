"""Every cached computation of the search reads only what planner.fields declares it reads.

The search serves a cached quantity (communicators, layer sums, transfers, bounds, stage sums, slot
profiles) to every configuration that agrees on its declared reads.  Here each computation runs from
an empty cache, under every built-in runtime, on dense and MoE strategies that exercise each field,
with a strategy that records what it is asked for (tests/reads.py); a read the declaration leaves out
fails, naming the reader, the runtime and the strategy.  The zero stage was such a read once: the
planner runtime's autocast saves depend on it, the layer sums' key left it out, and a ZeRO-0 table
served a ZeRO-3 configuration (issue 25).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hardware import load_catalog, load_cluster
from models import MoEConfig, build_transformer
from models.transformer import llama
from planner.cost import micro_batches
from planner.cost.comm import p2p_seconds
from planner.cost.layout import stage_comms
from planner.cost.stage import compose_stage, layer_busy, sum_layers
from planner.fields import FIELD_ROLES, Reader, fields_with, reads
from planner.job import Job
from planner.profile import load_runtime
from planner.replan.layout import strategy_layout
from planner.search.ilp.segments import fixed_layers
from planner.search.ilp.tables import TableBuilder
from planner.search.space import SpaceOptions, placement_variants
from planner.strategy import Strategy, parse_strategy
from planner.validation import check_strategy
from reads import RecordingComms, paused, record, recording

RUNTIMES = sorted(p.stem for p in (Path(__file__).parents[1] / "hardware" / "data" / "runtimes").glob("*.yaml"))
DENSE = build_transformer(llama(name="dense", num_layers=4, hidden=256, heads=8, kv_heads=2, ffn=768, vocab=1024))
MOE = build_transformer(llama(name="moe", num_layers=4, hidden=256, heads=8, kv_heads=2, ffn=768, vocab=1024,
                              moe=MoEConfig(num_experts=8, top_k=2, expert_ffn=256, first_dense_layers=1)))
DENSE_SPECS = ["tp=2,pp=2,zero=1", "tp=2,pp=4,vpp=1,zero=0", "pp=2,vpp=2,zero=1", "zero=3,regather=host",
               "tp=2,zero=3,offload=all", "pp=2,zero=1,offload=optimizer,offload_device=nvme",
               "tp=2,zero=3,offload=optimizer,offload_ratio=0.5", "tp=2,zero=2,shard=node", "cp=2,zero=3",
               "tp=2,sp=off,zero=3,tp_overlap=on,recompute=selective", "pp=2,schedule=gpipe,recompute=full",
               "pp=4,zero=3,mbs=2", "tp=2,zero=1,dp_overlap=off", "pp=2,zero=1,dp_overlap=grad"]
MOE_SPECS = ["tp=2,ep=4,zero=1", "tp=2,ep=2,etp=1,zero=1,pp=2", "ep=2,ep_overlap=on,zero=3",
             "tp=2,pp=2,vpp=2,ep=2,ep_overlap=on", "tp=2,ep=4,zero=1,dispatcher=deepep"]


def _jobs(runtime: str):
    profile = load_runtime(runtime)
    for model, specs in ((DENSE, DENSE_SPECS), (MOE, MOE_SPECS)):
        job = Job(model=model, cluster=load_cluster("dgx-h100:2"), global_batch=32, seq_len=512, runtime=profile)
        for spec in specs:
            yield job, check_strategy(job, parse_strategy(spec))


def _builder(job: Job) -> TableBuilder:
    """A builder with empty caches whose communicators note what their shapes read."""
    builder = TableBuilder(job, load_catalog())

    def comms(strategy, site):
        with paused():
            shapes = stage_comms(job, strategy, site)
        return RecordingComms(shapes, strategy, min(p.node.gpus_per_node for p in site.pools))

    builder.comms = comms
    return builder


def _computations(job: Job, strategy: Strategy):
    """(reader, a function of the recording strategy that runs what the reader caches)."""
    catalog = load_catalog()
    pools = list(job.cluster.pools)
    m = micro_batches(job, strategy)
    before, after = fixed_layers(job.model)
    blocks = [layer for layer in job.model.layers if layer.block is not None]
    variants = placement_variants(job, strategy, SpaceOptions(), offload=True)

    def groups_of(r, stage):
        builder = _builder(job)
        return builder.comms(r, builder.site(stage, tuple(pools)))

    last = strategy.pp - 1  # the test's own reads go to the plain strategy
    per_stage = (len(job.model.blocks()) // strategy.pp,)

    def layer_sums(r):
        site = _builder(job).site(last, tuple(pools))
        for mode in ("none", "selective", "full"):
            sum_layers([(layer, mode) for layer in (*before, *blocks, *after)], job, r, site, groups_of(r, last),
                       catalog)

    def layer_times(r, experts: bool):
        site = _builder(job).site(last, tuple(pools))
        for mode in ("none", "selective", "full"):
            for layer in (*before, *blocks, *after):
                if (layer.moe is not None) == experts:
                    layer_busy(layer, job, r, site, groups_of(r, last), catalog, mode)

    def compose(r):
        builder = _builder(job)
        for stage in {0, last}:
            site = builder.site(stage, tuple(pools))
            with paused():
                sums = builder.stage_sums(stage, per_stage, 1, strategy, site)
            for cheapest in (False, True):
                compose_stage(job, r, site, groups_of(r, stage), sums, m, catalog, cheapest_transfers=cheapest)

    return {
        Reader.COMMS: lambda r: stage_comms(job, r, _builder(job).site(0, tuple(pools))),
        Reader.LAYER_SUMS: layer_sums,
        Reader.LAYER_TIMES: lambda r: layer_times(r, experts=False),
        Reader.EXPERT_TIMES: lambda r: layer_times(r, experts=True),
        Reader.P2P: lambda r: p2p_seconds(float(job.model.hidden), job, r, groups_of(r, 0), catalog),
        Reader.COMPOSE: compose,
        Reader.WORK: lambda r: _builder(job)._work_by_layer_group(r, pools[0]),
        Reader.LOWER: lambda r: _builder(job).lower_bound(r, pools, m),
        # the cached part: the key holds whether the stage is the first and the last
        Reader.STAGE_SUMS: lambda r: [_builder(job)._stage_sums(first, last_, per_stage, 1, r,
                                                                _builder(job).site(0, tuple(pools)))
                                      for first in (False, True) for last_ in (False, True)],
        Reader.PROFILE: lambda r: _builder(job)._slot_profile(r, pools[0], m, variants=variants),
    }


def _inputs(view: str, strategy: Strategy) -> set[str]:
    """The fields a declared view (a property) reads."""
    with record(views=frozenset()) as names:
        getattr(recording(strategy), view)
    return names


def _undeclared(names: set[str], reader: Reader, strategy: Strategy) -> set[str]:
    """The names read that the reader's key does not determine: neither declared nor a view of declared fields."""
    key = set(reads(reader))
    return {name for name in names if name not in key and not _inputs(name, strategy) <= key}


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_every_cached_computation_reads_only_what_it_declares(runtime):
    checked = 0
    for job, strategy in _jobs(runtime):
        for reader, compute in _computations(job, strategy).items():
            with record() as names:
                compute(recording(strategy))
            undeclared = _undeclared(names, reader, strategy)
            assert not undeclared, (f"{reader.value} reads {sorted(undeclared)} under {runtime} for {strategy.spec()} "
                                    f"({job.model.name}): declare them in planner/fields.py")
            checked += 1
    assert checked == len(Reader) * (len(DENSE_SPECS) + len(MOE_SPECS))


def test_layout_reads_only_the_layout_fields():
    """Which state a rank holds (re-planning's cache of per-rank loads) depends on the layout fields alone."""
    layout = set(fields_with("layout"))
    for job, strategy in _jobs("planner"):
        with record(views=frozenset()) as names:
            strategy_layout(job.model, job.cluster, recording(strategy))
        assert names <= layout, f"{strategy.spec()}: the layout reads {sorted(names - layout)}"


def test_every_field_is_declared_once():
    assert list(FIELD_ROLES) == list(Strategy.model_fields)


def test_the_recorder_sees_a_read_the_declaration_leaves_out():
    """A control: a computation that reads zero while its reader does not declare it is caught."""
    strategy = recording(Strategy(tp=2, dp=2, zero=3))
    with record() as names:
        _ = strategy.pipelined, strategy.zero, strategy.sequence_parallel
    assert names == {"pipelined", "zero", "sequence_parallel"}
    assert "zero" not in reads(Reader.COMMS)
    with record(views=frozenset()) as names:
        _ = strategy.pipelined
        copy = strategy.model_copy(update={"pp": 2})
        _ = copy.pp, copy.tp
    assert names == {"pp", "tp"}  # pipelined is read through pp; the copy's pp was chosen, its tp was not
