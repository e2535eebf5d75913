"""Fixed per-kernel and per-collective overheads: measured kernel counts, priced per runtime, visible on small
models and micro-batches, invisible on large ones, and the same in `evaluate` and the compiler's tables."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from benches import load_bench
from conftest import make_job
from hardware import load_catalog
from models.graph import LayerKind
from planner.cost import evaluate
from planner.cost.launches import launch_overhead, load_kernel_launches
from planner.profile import load_runtime
from planner.search.compile import compile_job
from planner.search.exhaustive import exhaustive_optimum
from planner.search.result import CompileOptions
from planner.search.space import SpaceOptions
from planner.strategy import Strategy

DATA = Path(__file__).resolve().parents[1] / "hardware" / "data"
KERNELS = yaml.safe_load((DATA / "kernels.yaml").read_text())
CONSTANTS = yaml.safe_load((DATA / "constants.yaml").read_text())
OVERHEADS = ("kernel_launch_seconds", "graph_kernel_launch_seconds", "collective_launch_seconds")


def without_overheads():
    """The catalog with every fixed per-kernel and per-collective cost at zero."""
    catalog = load_catalog()
    constants = dict(catalog.constants)
    for name in OVERHEADS:
        constants[name] = constants[name].model_copy(update={"value": 0.0})
    return catalog.model_copy(update={"constants": constants})


def overhead_share(job, strategy) -> float:
    """Share of the step the fixed overheads take."""
    with_them = evaluate(job, strategy).step_time_s
    return 1.0 - evaluate(job, strategy, catalog=without_overheads()).step_time_s / with_them


def test_the_eager_table_is_what_the_runtime_dispatches():
    counts = load_bench("kernel_counts").eager_counts()
    table = load_kernel_launches().eager
    assert {kind.value for kind in table} == set(counts)
    for kind, (forward, backward) in counts.items():
        assert (table[LayerKind(kind)].forward, table[LayerKind(kind)].backward) == (forward, backward), kind


@pytest.mark.parametrize(("runtime", "table", "each"), [
    ("torchtitan-eager", "eager", "kernel_launch_seconds"),
    ("torchtitan", "fused", "kernel_launch_seconds"),
    ("megatron-cudagraphs", "fused", "graph_kernel_launch_seconds"),
])
def test_each_runtime_pays_its_kernels_at_its_launch_cost(runtime, table, each):
    job = make_job("llama3-8b", "dgx-h100:1", runtime=load_runtime(runtime))
    seconds = CONSTANTS[each]["value"]
    for layer in job.model.layers[:3]:  # embedding, attention, mlp
        counted = KERNELS[table][layer.kind.value]
        assert launch_overhead(layer, job, load_catalog()) == pytest.approx(
            (counted["forward"] * seconds, counted["backward"] * seconds))


def test_fusion_and_graphs_cut_the_overhead():
    per_block = {name: sum(sum(launch_overhead(layer, make_job("llama3-8b", runtime=load_runtime(name)),
                                               load_catalog())) for layer in make_job().model.layers[1:3])
                 for name in ("torchtitan-eager", "torchtitan", "megatron-cudagraphs")}
    assert per_block["torchtitan-eager"] > 3 * per_block["torchtitan"] > 3 * 2 * per_block["megatron-cudagraphs"]


def test_small_models_and_micro_batches_feel_it_large_ones_do_not():
    eager = load_runtime("torchtitan-eager")
    tiny = overhead_share(make_job("tiny-llama", "dgx-h100:1", batch=8, seq=256, runtime=eager), Strategy(dp=8))
    small, larger = (overhead_share(make_job("gpt2-xl", "dgx-h100:1", batch=32 * mbs, seq=1024, runtime=eager),
                                    Strategy(dp=8, mbs=mbs, zero=1)) for mbs in (1, 8))
    large = overhead_share(make_job("llama3-70b", "dgx-h100:8", batch=64, seq=8192, runtime=load_runtime("megatron")),
                           Strategy(tp=8, pp=4, dp=2, zero=1, recompute="full"))
    assert tiny > 0.5  # a 64-wide model's kernels are all overhead
    assert small > 0.15  # GPT-2 XL, 1,024 tokens per micro-batch: 135 launches per block against ~0.4 ms of work
    assert larger < small / 3  # eight times the tokens per launch
    assert large < 0.01  # a 70B model's kernels run for milliseconds


def test_the_compiler_optimises_the_same_overheads():
    # where the launches dominate, the compiler's tables and evaluate must still agree, and the exhaustive
    # optimum over evaluate is what the compiler certifies
    job = make_job("tiny-llama", "dgx-h100:1", batch=16, seq=256, runtime=load_runtime("torchtitan-eager"))
    space = SpaceOptions(max_mbs=4, max_vpp=1, max_cp=1, zero_stages=(0, 1), fixed={"tp": 1, "pp": 1})
    best, best_time = exhaustive_optimum(job, space)
    result = compile_job(job, CompileOptions(space=space))
    assert result.estimate.step_time_s == pytest.approx(best_time, rel=1e-6), (result.strategy.spec(), best.spec())
    assert abs(result.certificate.objective - result.estimate.step_time_s) / result.estimate.step_time_s <= 0.005
    assert result.strategy.mbs == 2  # the largest micro-batch per rank: fewer launches per token
