"""Routing statistics (`--routing FILE`) and expert placement: the input's one-line errors, EPLB against its
published example, planner's program against brute force, and the placement in the cost model."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from models import load_model
from planner import api
from planner.api import load_job
from planner.cli import cli as main
from planner.cost import evaluate
from planner.cost.memory import expert_params_per_rank
from planner.emit.check import check_target
from planner.errors import PlannerInputError
from planner.routing import placement as pl
from planner.routing.stats import RoutingStats, load_routing
from planner.strategy import parse_strategy
from planner.validation import check_strategy

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "routing"
TRACES = {"mixtral-8x7b": ["zipf-mixtral.yaml", "mixtral-8x7b-layers.json"],
          "deepseek-v3": ["zipf-deepseek-v3.yaml", "deepseek-v3-layers.json"]}


def _write(tmp_path: Path, doc: dict, name: str = "routing.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


# ---------------------------------------------------------------- the input


@pytest.mark.parametrize("layer, field, needle", [
    ({"layer": 0, "shares": [0.5, 0.2, 0.1, 0.1, 0.05, 0.0, 0.0, 0.0]}, "layers.0", "sum to 0.95, not 1"),
    ({"layer": 32, "shares": [0.125] * 8}, "layers[0].layer", "unknown layer 32"),
    ({"layer": 0, "tokens": [10, 5, -1, 3, 3, 3, 3, 3]}, "layers.0", "tokens[2] is -1"),
    ({"layer": 0, "shares": [0.125] * 8, "replicas": [3, 3, 2, 2, 2, 2, 1, 1]}, "layers[0].replicas",
     "16 replicas, more than the 8 experts + redundant_slots 4 slots"),
    ({"layer": 0, "tokens": [1] * 7}, "layers[0].tokens", "7 experts, mixtral-8x7b has 8"),
    ({"layer": 0, "shares": [0.6, 0.4, 0, 0, 0, 0, 0, 0]}, "layers[0]", "more than 1/top_k = 0.500"),
])
def test_malformed_trace_is_one_line_exit_2(tmp_path: Path, layer: dict, field: str, needle: str) -> None:
    path = _write(tmp_path, {"source": "test", "redundant_slots": 4, "layers": [layer]})
    result = CliRunner().invoke(main, ["estimate", "mixtral-8x7b", "dgx-h100:1", "-b", "8", "-s", "1024",
                                       "--strategy", "ep=8", "--routing", str(path)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in result.output
    assert str(path) in lines[0] and field in lines[0] and needle in lines[0], lines[0]


def test_routing_and_forced_balance_exclude_each_other(tmp_path: Path) -> None:
    path = EXAMPLES / "zipf-mixtral.yaml"
    result = CliRunner().invoke(main, ["estimate", "mixtral-8x7b", "dgx-h100:1", "-b", "8", "-s", "1024",
                                       "--routing", str(path), "--moe-routing", "balanced"])
    assert result.exit_code == 2 and "--moe-routing balanced" in result.output


def test_routing_on_a_dense_model_is_refused() -> None:
    with pytest.raises(PlannerInputError, match="no mixture-of-experts layers"):
        load_routing(EXAMPLES / "zipf-mixtral.yaml", load_model("llama3-8b"))


def test_tokens_are_normalised_to_shares() -> None:
    stats = RoutingStats(source="t", layers=[{"layer": 0, "tokens": [3, 1, 0, 0]}])
    assert stats.layer_shares(4) == ((0.75, 0.25, 0.0, 0.0),)


def test_zipf_shares_by_hand() -> None:
    # s = 1 over 3 experts: weights 1, 1/2, 1/3, total 11/6 -> 6/11, 3/11, 2/11 in some order of ids
    shares = RoutingStats(source="t", synthetic={"exponent": 1.0}).layer_shares(3)[0]
    assert sorted(shares, reverse=True) == pytest.approx([6 / 11, 3 / 11, 2 / 11])


@pytest.mark.parametrize("model", sorted(TRACES))
def test_examples_load(model: str) -> None:
    graph = load_model(model)
    for name in TRACES[model]:
        stats = load_routing(EXAMPLES / name, graph)
        assert stats.source


# ---------------------------------------------------------------- placements


def test_contiguous_ratio_by_hand() -> None:
    # ranks hold {0, 1} and {2, 3}: 0.4 + 0.3 = 0.7 of the load against a mean of 0.5
    assert pl.contiguous(4, 2).ratio((0.4, 0.3, 0.2, 0.1)) == pytest.approx(1.4)


def test_eplb_matches_its_published_example() -> None:
    """deepseek-ai/EPLB's README: 2 layers x 12 experts, 16 replicas, 4 groups, 2 nodes, 8 GPUs; its printed
    phy2log, two physical experts per GPU."""
    weight = [[90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
              [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27]]
    published = [[5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                 [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1]]
    for loads, phy2log in zip(weight, published):
        shares = tuple(w / sum(loads) for w in loads)
        placed = pl.eplb(shares, ep=8, physical=16, groups=4, nodes=2)
        assert [sorted(r) for r in placed.ranks] == [sorted(phy2log[2 * g:2 * g + 2]) for g in range(8)]


def test_replicate_minimises_the_largest_replica_load() -> None:
    shares = (0.45, 0.25, 0.15, 0.1, 0.05)
    best = min(max(s / c for s, c in zip(shares, counts))
               for counts in itertools.product(range(1, 5), repeat=5) if sum(counts) == 9)
    counts = pl.replicate(shares, 9)
    assert sum(counts) == 9 and max(s / c for s, c in zip(shares, counts)) == pytest.approx(best)


def _brute_force(shares: tuple[float, ...], counts: list[int], ep: int) -> float:
    """Smallest busiest-rank ratio over every placement of `counts` replicas on distinct ranks, equal slots."""
    slots = sum(counts) // ep
    best = float("inf")
    for choice in itertools.product(*(itertools.combinations(range(ep), c) for c in counts)):
        held = [0] * ep
        load = [0.0] * ep
        for e, ranks in enumerate(choice):
            for r in ranks:
                held[r] += 1
                load[r] += shares[e] / counts[e]
        if all(h == slots for h in held):
            best = min(best, max(load) * ep)
    return best


@pytest.mark.parametrize("shares, ep, physical", [
    ((0.3, 0.2, 0.15, 0.12, 0.1, 0.08, 0.03, 0.02), 4, 12),
    ((0.35, 0.05, 0.2, 0.1, 0.1, 0.2), 3, 9),
    ((0.22, 0.21, 0.2, 0.13, 0.12, 0.12), 2, 6),
])
def test_program_is_exact_on_small_layers(shares: tuple[float, ...], ep: int, physical: int) -> None:
    counts = pl.replicate(shares, physical)
    start = pl.eplb(shares, ep, physical, groups=1, nodes=1)
    placed = pl.program(shares, ep, counts, start)
    assert placed.counts(len(shares)) == counts
    assert placed.ratio(shares) == pytest.approx(_brute_force(shares, counts, ep), abs=1e-5)


@pytest.mark.parametrize("model, ep", [("mixtral-8x7b", 2), ("mixtral-8x7b", 4), ("mixtral-8x7b", 8),
                                       ("deepseek-v3", 8), ("deepseek-v3", 16), ("deepseek-v3", 32)])
def test_planner_never_worse_than_eplb_and_better_than_contiguous(model: str, ep: int) -> None:
    graph = load_model(model)
    for name in TRACES[model]:
        stats = load_routing(EXAMPLES / name, graph)
        summary = pl.placement_summary(stats, graph.num_experts, ep, max(1, ep // 8))
        for layer in summary.layers:
            shares = stats.layer_shares(graph.num_experts)[summary.layers.index(layer)]
            # the ratio is the placement's, recomputed from its map
            placed = pl.ExpertPlacement(tuple(tuple(r) for r in layer.ranks))
            assert placed.ratio(shares) == pytest.approx(layer.max_load_ratio)
            assert len({len(r) for r in layer.ranks}) == 1 and len(layer.ranks) == ep
            assert layer.max_load_ratio <= layer.eplb_max_load_ratio + 1e-12
        assert summary.max_load_ratio < summary.contiguous_max_load_ratio


def test_placement_is_deterministic() -> None:
    graph = load_model("deepseek-v3")
    stats = load_routing(EXAMPLES / "deepseek-v3-layers.json", graph)
    first = pl._summarise(stats, graph.num_experts, 32, 4)
    again = pl._summarise(stats, graph.num_experts, 32, 4)
    assert first.model_dump_json() == again.model_dump_json()


# ---------------------------------------------------------------- the cost model


def test_replicas_add_their_expert_memory() -> None:
    # mixtral: 8 experts + 8 redundant slots on ep = 8 ranks: 2 slots a rank, twice the routed experts' params
    plain = load_job("mixtral-8x7b", "dgx-h100:1", batch=8, seq_len=1024)
    routed = load_job("mixtral-8x7b", "dgx-h100:1", batch=8, seq_len=1024,
                      routing=EXAMPLES / "zipf-mixtral.yaml")
    s = check_strategy(plain, parse_strategy("ep=8"))
    layer = next(layer for layer in plain.model.layers if layer.moe is not None)
    assert expert_params_per_rank(layer, s, routed) == pytest.approx(2 * expert_params_per_rank(layer, s, plain))


def test_placement_ratio_replaces_the_constant(tmp_path: Path) -> None:
    """Balanced shares with no redundant slots: every placement has ratio 1, so the estimate equals forced
    balanced routing's; a skewed contiguous placement costs more than planner's."""
    even = _write(tmp_path, {"source": "t", "synthetic": {"exponent": 0.0}})
    balanced = load_job("mixtral-8x7b", "dgx-h100:1", batch=8, seq_len=1024, moe_routing="balanced")
    routed = load_job("mixtral-8x7b", "dgx-h100:1", batch=8, seq_len=1024, routing=even)
    spec = "ep=8,tp=1,pp=1,zero=3"
    assert evaluate(routed, check_strategy(routed, parse_strategy(spec))).step_time_s == pytest.approx(
        evaluate(balanced, check_strategy(balanced, parse_strategy(spec))).step_time_s)
    skewed = load_job("mixtral-8x7b", "dgx-h100:1", batch=8, seq_len=1024, routing=EXAMPLES / "zipf-mixtral.yaml")
    s = check_strategy(skewed, parse_strategy(spec))
    ours = evaluate(skewed, s)
    contiguous = evaluate(skewed.model_copy(update={"expert_placement_policy": "contiguous"}), s)
    assert ours.breakdown.compute_s < contiguous.breakdown.compute_s
    assert ours.breakdown.ep_comm_s <= contiguous.breakdown.ep_comm_s


def test_compile_json_reports_the_placements() -> None:
    # expert parallelism fixed: with the H100's capacity as CUDA reports it (#28) the optimum is dp=32 ZeRO-3
    # without EP, which places no experts
    result = CliRunner().invoke(main, ["compile", "mixtral-8x7b", "dgx-h100:4", "-b", "256", "-s", "4096",
                                       "--routing", str(EXAMPLES / "zipf-mixtral.yaml"), "--time-limit", "30",
                                       "--fix", "ep=8", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    moe = data["moe"]
    assert moe["ep"] == data["strategy"]["ep"]
    assert moe["max_load_ratio"] <= moe["eplb_max_load_ratio"]
    assert moe["max_load_ratio"] < moe["contiguous_max_load_ratio"]
    assert moe["step_time_s"] == pytest.approx(data["step_time_s"])
    assert len(data["plan"]["moe"]["layers"]) == 1 and data["plan"]["job"]["routing"]["source"].startswith("synthetic")


# ---------------------------------------------------------------- Megatron


def test_megatron_relabelling_reproduces_the_plans_placement(tmp_path: Path) -> None:
    """Without redundant slots the placement is a relabelling: Megatron's contiguous slots filled in
    expert_placement.json's order carry the plan's busiest-rank ratio, recomputed here from the shares."""
    routing = _write(tmp_path, {"source": "t", "synthetic": {"exponent": 1.2, "seed": 3}}, "zipf.json")
    out = tmp_path / "plan"
    result = CliRunner().invoke(main, ["compile", "mixtral-8x7b", "dgx-h100:1", "-b", "16", "-s", "2048",
                                       "--routing", str(routing), "--fix", "tp=1,pp=2,ep=4,zero=1",
                                       "--target", "megatron", "-o", str(out), "--time-limit", "20"])
    assert result.exit_code == 0, result.output
    plan = json.loads((out / "plan.json").read_text())
    doc = json.loads((out / "megatron" / "expert_placement.json").read_text())
    shares = RoutingStats(source="t", synthetic={"exponent": 1.2, "seed": 3}).layer_shares(8)[0]
    order, ep = doc["layers"][0]["order"], doc["expert_model_parallel_size"]
    assert sorted(order) == list(range(8)) and ep == 4
    busiest = max(sum(shares[e] for e in order[r * 2:(r + 1) * 2]) for r in range(ep)) * ep
    assert busiest == pytest.approx(plan["moe"]["max_load_ratio"])
    assert busiest < pl.contiguous(8, 4).ratio(shares)
    assert "Expert placement" in (out / "report.md").read_text()


def test_megatron_refuses_replicas_it_cannot_hold() -> None:
    """A plan with replicas: Megatron's files are costed without them, and refused (slower)."""
    job = load_job("mixtral-8x7b", "dgx-h100:4", batch=256, seq_len=4096, routing=EXAMPLES / "zipf-mixtral.yaml")
    compiled = api.compile(job, fixed={"tp": 2, "pp": 4, "ep": 8, "zero": 1}, time_limit=30)
    assert compiled.plan.moe.redundant_slots == 8  # replicas repay their cost here
    check = check_target(compiled.plan, compiled.job, "megatron")
    assert check.status == "refused" and "holds no expert replicas" in " ".join(check.reasons)


def test_named_megatron_target_searches_without_replicas(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["compile", "mixtral-8x7b", "dgx-h100:2", "-b", "32", "-s", "2048",
                                       "--routing", str(EXAMPLES / "zipf-mixtral.yaml"),
                                       "--fix", "tp=1,pp=2,ep=8,zero=1", "--target", "megatron",
                                       "-o", str(tmp_path / "plan"), "--time-limit", "20"])
    assert result.exit_code == 0, result.output
    assert "megatron holds no expert replicas" in result.stderr
    plan = json.loads((tmp_path / "plan" / "plan.json").read_text())
    assert plan["moe"]["redundant_slots"] == 0 and (tmp_path / "plan" / "megatron" / "expert_placement.json").exists()


def test_routing_bench_ratio_grid_renders() -> None:
    from benches import load_bench

    rows = load_bench("routing").ratio_rows()
    assert rows
    for row in rows:  # contiguous, EPLB, planner columns: planner never worse than EPLB
        assert float(row[7]) <= float(row[6].split()[0]) + 1e-3


def test_compile_keeps_the_better_of_replicas_and_none() -> None:
    """The plan is the faster of the search with the file's redundant slots and the search without them."""
    from planner.plan.moe import without_replicas
    from planner.search.compile import compile_job

    job = load_job("mixtral-8x7b", "dgx-h100:2", batch=32, seq_len=2048, routing=EXAMPLES / "zipf-mixtral.yaml")
    fixed = {"tp": 1, "pp": 2, "ep": 8, "zero": 1}
    compiled = api.compile(job, fixed=fixed, time_limit=20)
    options = api._options(job, (), fixed, "time", None, 10, None, "always")
    with_slots = compile_job(job, options).estimate.step_time_s
    without = compile_job(without_replicas(job), options).estimate.step_time_s
    assert compiled.plan.time.step_time_s == pytest.approx(min(with_slots, without))
    assert (compiled.plan.moe.redundant_slots == 0) == (without < with_slots)


def test_estimate_json_has_the_placements() -> None:
    result = CliRunner().invoke(main, ["estimate", "mixtral-8x7b", "dgx-h100:4", "-b", "256", "-s", "4096",
                                       "--strategy", "tp=2,pp=4,cp=2,ep=8,etp=1,vpp=2",
                                       "--routing", str(EXAMPLES / "mixtral-8x7b-layers.json"), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    moe = data["moe"]
    assert moe["step_time_s"] == pytest.approx(data["step_time_s"]) and moe["ep"] == 8
    assert moe["max_load_ratio"] <= moe["eplb_max_load_ratio"] < moe["contiguous_max_load_ratio"]
    assert moe["contiguous_step_time_s"] > moe["step_time_s"]


def test_compare_costs_megatron_with_its_contiguous_placement() -> None:
    job = load_job("mixtral-8x7b", "dgx-h100:4", batch=256, seq_len=4096, routing=EXAMPLES / "zipf-mixtral.yaml")
    [row] = api.compare_baselines(job, only=("megatron",))
    s = check_strategy(job, parse_strategy(row.spec))
    contiguous = evaluate(job.model_copy(update={"expert_placement_policy": "contiguous"}), s)
    planners = evaluate(job, s)
    assert row.step_time_s == pytest.approx(contiguous.step_time_s)
    assert planners.step_time_s < contiguous.step_time_s
