"""Expert parallelism in the re-plan's state layout: each rank holds num_experts / ep whole experts (split
over tp), their sharded state shards over the expert-data-parallel group, and a migration moves exactly
the expert bytes whose holder changes.

Hand-worked numbers use tiny-mixtral, mixtral-8x7b scaled down (the spec below): 4 blocks of attention
(12,352 parameters, one 64-weight norm that tp replicates) and MoE (8 experts of 3 x 64 x 32 = 6,144 each:
49,152 routed; router 64 x 8 = 512 and norm 64 replicated: 49,728 in all), embedding and head 16,384 each,
final norm 64: 281,152 parameters.  Megatron's runtime keeps bf16 weights (2 B, whole on every rank) and
fp32 master weights + Adam moments (12 B, sharded by its distributed optimizer, zero=1)
(hardware/data/runtimes/megatron.yaml).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import typing
from pathlib import Path

import pytest
from click.testing import CliRunner

from hardware import load_catalog, load_cluster
from models import load_model
from planner.cli import cli
from planner.cost.evaluate import evaluate
from planner.job import Job
from planner.profile import load_runtime
from planner.replan.layout import moving_terms, strategy_layout
from planner.replan.migration import cluster_rates, plan_migration, unrecoverable_bytes
from planner.replan.nodes import map_nodes
from planner.strategy import parse_strategy
from planner.validation import check_strategy

SPEC = """zoo: mixtral-8x7b
overrides: {name: tiny-mixtral, num_layers: 4, hidden: 64, heads: 4, kv_heads: 2, ffn: 128, vocab: 256,
            max_positions: 256, moe: {expert_ffn: 32}}
"""
EXPERT = 3 * 64 * 32  # one expert's parameters
MOE_LAYERS = 4
WEIGHT, OPTIMIZER = 2, 12  # bytes per parameter (bf16 weights; fp32 master + two Adam moments)


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny-mixtral.yaml"
    path.write_text(SPEC)
    return path


@pytest.fixture(scope="module")
def model(spec_file):
    graph = load_model(str(spec_file))
    assert graph.params == 281_152 and graph.num_experts == 8  # the sizes the docstring works from
    return graph


def _layout(model, cluster: str, spec: str, runtime: str = "megatron"):
    c = load_cluster(cluster)
    job = Job(model=model, cluster=c, global_batch=32, seq_len=64, runtime=load_runtime(runtime))
    strategy = check_strategy(job, parse_strategy(spec))
    return job, strategy, strategy_layout(model, c, strategy)


def _migration(model, old_spec: str, new_spec: str):
    _, _, old = _layout(model, "cpu:1", old_spec)
    _, _, new = _layout(model, "cpu:1", new_spec)
    c = load_cluster("cpu:1")
    nodes = map_nodes(c, c, None)
    terms = moving_terms(load_runtime("megatron"))
    migration = plan_migration(old, new, terms, nodes, cluster_rates(c, load_catalog(), None), model)
    assert unrecoverable_bytes(old, terms, nodes) == 0
    return migration, {total.link: total.bytes for total in migration.links}


# ---------------------------------------------------------------- what each rank holds


def test_a_rank_holds_its_experts_whole_and_their_optimizer_state_over_expert_data_parallel(model):
    # tp=2, dp=4, ep=4 on 8 GPUs: ep = dp, so each expert group spans the data-parallel ranks and the expert
    # data-parallel group is one rank.  Per rank: dense 8,192 (embedding / 2) + 4 x (12,288 / 2 + 64) +
    # 4 x 576 (router + norm) + 64 (final norm) + 8,192 (head / 2) = 43,584, its optimizer state over dp=4;
    # experts 4 layers x 2 experts x 6,144 / 2 = 24,576, their optimizer state whole.
    _, _, layout = _layout(model, "dgx-h100:1", "tp=2,pp=1,dp=4,ep=4,zero=1")
    dense, experts = 43_584, MOE_LAYERS * 2 * EXPERT // 2
    expected = WEIGHT * (dense + experts) + OPTIMIZER * (dense / 4 + experts)
    terms = moving_terms(load_runtime("megatron"))
    assert {layout.state_bytes(site, terms) for site in layout.ranks} == {expected}


@pytest.mark.parametrize("runtime, spec", [
    ("megatron", "tp=2,pp=2,dp=4,ep=4,zero=1"),
    ("megatron", "tp=2,pp=2,dp=2,cp=2,ep=4,zero=1"),  # cp folds into the expert groups (dp alone is 2 < ep)
    ("megatron", "tp=1,pp=2,dp=8,ep=2,zero=1"),
    ("megatron", "tp=2,pp=1,dp=4,cp=2,ep=8,zero=0"),
    ("reference", "tp=2,pp=2,dp=4,ep=2,zero=3,shard=node"),
    ("reference", "tp=1,pp=1,dp=16,ep=4,zero=3,shard=node"),
    ("reference", "tp=4,pp=1,dp=4,ep=4,zero=3,shard=node"),  # a node's shard group (2) splits the expert group
    ("reference", "tp=2,pp=1,dp=8,ep=8,zero=2,shard=full"),
])
def test_every_rank_holds_what_the_memory_model_counts(model, runtime, spec):
    # two paths: the layout's parameter ranges per rank, planner.cost.memory's per-stage state bytes
    job, strategy, layout = _layout(model, "dgx-h100:2", spec, runtime)
    terms = moving_terms(job.runtime)
    memory = evaluate(job, strategy).memory.per_stage
    for site in layout.ranks:
        stage = memory[site.stage]
        assert layout.state_bytes(site, terms) == pytest.approx(stage.weights_bytes + stage.optimizer_bytes,
                                                                rel=1e-12), site


def _megatron_rank_generator():
    """megatron.core.parallel_state.RankGenerator as installed, read from its source: the module imports
    torch (seconds), the class and the function it calls are plain Python."""
    spec = importlib.util.find_spec("megatron")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("megatron-core is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / "core" / "parallel_state.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    wanted = {"generate_masked_orthogonal_rank_groups", "RankGenerator"}
    tree.body = [node for node in tree.body
                 if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in wanted]
    assert {node.name for node in tree.body} == wanted, path
    namespace: dict = {"List": typing.List, "Optional": typing.Optional}
    exec(compile(tree, str(path), "exec"), namespace)
    return namespace["RankGenerator"]


@pytest.mark.parametrize("spec", ["tp=2,pp=2,dp=2,cp=2,ep=4", "tp=1,pp=2,dp=4,cp=2,ep=2",
                                  "tp=2,pp=1,dp=4,cp=2,ep=8", "tp=2,pp=2,dp=4,ep=2"])
def test_expert_groups_are_megatron_cores(model, spec):
    # Megatron-Core's own rank generator for the expert layers (parallel_state.initialize_model_parallel:
    # expert tp = tp, cp = 1, expert dp = world / (tp x ep x pp), its default order): its ep groups are the
    # ranks of one stage with the same tp index and expert shard index, its expert dp groups those with the
    # same tp index and ep index
    _, s, layout = _layout(model, "dgx-h100:2", spec + ",zero=1")
    generator = _megatron_rank_generator()(tp=s.tp, ep=s.ep, dp=s.dp * s.cp // s.ep, pp=s.pp, cp=1,
                                             order="tp-cp-ep-dp-pp")
    ours: dict[str, dict[tuple, list[int]]] = {"ep": {}, "dp": {}}
    for site in layout.ranks:
        edp = (site.dp * s.cp + site.cp) // s.ep  # with shard=full the expert shard index is the edp index
        assert layout.expert_shard_class(site, True) == edp
        ours["ep"].setdefault((site.stage, site.tp, edp), []).append(site.rank)
        ours["dp"].setdefault((site.stage, site.tp, layout.ep_index(site)), []).append(site.rank)
    for group in ("ep", "dp"):
        assert sorted(ours[group].values()) == sorted(generator.get_ranks(group)), group


# ---------------------------------------------------------------- migrations between ep degrees


def test_ep2_to_ep4_moves_the_experts_a_rank_did_not_hold(model):
    # dp=4 on one 4-GPU node, zero=0 (every rank holds its experts' whole state).  ep=2: ranks 0 and 2 hold
    # experts 0-3, ranks 1 and 3 experts 4-7.  ep=4: rank r holds experts 2r and 2r+1: rank 0 (0-1) and
    # rank 3 (6-7) hold theirs already, rank 1 (2-3) and rank 2 (4-5) take two experts each from a neighbour.
    migration, links = _migration(model, "dp=4,ep=2,zero=0", "dp=4,ep=4,zero=0")
    moved = 2 * 2 * EXPERT * MOE_LAYERS * (WEIGHT + OPTIMIZER)
    assert links["nvlink"] == moved == 1_376_256
    assert links["fabric"] == links["storage"] == 0
    assert {m.to_rank for m in migration.moves if m.link == "nvlink"} == {1, 2}
    assert links["local"] == migration.state_bytes - moved
    assert min(m.bytes for m in migration.moves) >= EXPERT  # no sliver moves from rounding


def test_ep2_to_ep4_under_the_distributed_optimizer(model):
    # zero=1: the bf16 weights move as above (2 ranks x 2 experts).  The optimizer state shards over the
    # expert data-parallel group: ep=2 (2 ranks each) gives rank 0 experts 0-1, rank 1 4-5, rank 2 2-3,
    # rank 3 6-7; ep=4 (1 rank each) gives rank r experts 2r, 2r+1: ranks 1 and 2 swap theirs over NVLink.
    migration, links = _migration(model, "dp=4,ep=2,zero=1", "dp=4,ep=4,zero=1")
    weights = 2 * 2 * EXPERT * MOE_LAYERS * WEIGHT
    optimizer = 2 * 2 * EXPERT * MOE_LAYERS * OPTIMIZER
    assert links["nvlink"] == weights + optimizer
    by_kind = {kind: sum(m.bytes for m in migration.moves if m.link == "nvlink" and m.kind == kind)
               for kind in ("weights", "optimizer")}
    assert by_kind == {"weights": weights, "optimizer": optimizer}
    # one holder of each optimizer shard; the weights have two (ranks 0 and 2, 1 and 3 under ep=2)
    assert {(m.from_rank, m.to_rank) for m in migration.moves if m.kind == "optimizer" and m.link == "nvlink"} \
        == {(2, 1), (1, 2)}


def test_ep2_to_ep1_gives_every_rank_the_experts_it_lacked(model):
    # ep=1: every rank holds all 8 experts; under ep=2 it held 4 of them, so it takes the other 4.
    _, links = _migration(model, "dp=4,ep=2,zero=0", "dp=4,ep=1,zero=0")
    assert links["nvlink"] == 4 * 4 * EXPERT * MOE_LAYERS * (WEIGHT + OPTIMIZER) == 5_505_024
    assert links["fabric"] == links["storage"] == 0


# ---------------------------------------------------------------- the command


def test_replan_of_a_moe_plan_after_losing_a_node(spec_file, tmp_path):
    # Old: pp=2 x dp=4, ep=4, zero=1 on two 4-GPU nodes (stage 0 = embedding + blocks 0-1 on node 0, stage 1
    # = blocks 2-3 + final norm + head on node 1); rank r of stage 0 holds experts 2r, 2r+1 (expert data
    # parallel = 1 rank: their optimizer state whole) and quarter r of the dense optimizer state.  Node 1
    # leaves.  New: pp=1 x dp=4, ep=2 (new rank r: experts 4(r%2)..4(r%2)+3; optimizer state of experts
    # 4(r%2) + 2(r//2) and the next).
    # Blocks 0-1, per MoE layer: weights rank 0 keeps 0-1 and takes 2-3, rank 1 takes 4-7, rank 2 takes 0-3,
    # rank 3 keeps 6-7 and takes 4-5 (4 kept, 12 over NVLink); optimizer ranks 0 and 3 keep theirs, rank 1
    # takes 4-5 and rank 2 takes 2-3 (4 kept, 4 over NVLink).  Blocks 2-3: all 16 + 8 from the checkpoint.
    # Dense state of stage 0 (embedding 16,384 + 2 x 12,352 + 2 x 576 = 42,240) stays where it is (dp=4 as
    # before); stage 1's (2 x 12,352 + 2 x 576 + 64 + 16,384 = 42,304) comes from the checkpoint.
    old = tmp_path / "old"
    result = CliRunner().invoke(cli, ["compile", str(spec_file), "cpu:2", "-b", "16", "-s", "64", "--fix",
                                      "tp=1,pp=2,dp=4,ep=4,zero=1,vpp=1", "--target", "megatron", "-o", str(old)])
    assert result.exit_code == 0, result.output
    new = tmp_path / "new"
    result = CliRunner().invoke(cli, ["replan", str(old / "plan.json"), "cpu:1", "--model", str(spec_file),
                                      "--fix", "tp=1,pp=1,ep=2,zero=1", "--steps-left", "10", "-o", str(new)])
    assert result.exit_code == 0, result.output
    migration = json.loads((new / "migration.json").read_text())
    assert "ep=2" in migration["new_strategy"] and "ep=4" in migration["old_strategy"]
    links = {total["link"]: total["bytes"] for total in migration["links"]}
    dense0, dense1 = 42_240, 42_304
    per_rank_dense = WEIGHT + OPTIMIZER / 4  # weights whole, optimizer a quarter, on each of 4 ranks
    assert links["local"] == 4 * per_rank_dense * dense0 + 2 * EXPERT * (4 * WEIGHT + 4 * OPTIMIZER)
    assert links["nvlink"] == 2 * EXPERT * (12 * WEIGHT + 4 * OPTIMIZER)
    assert links["storage"] == 4 * per_rank_dense * dense1 + 2 * EXPERT * (16 * WEIGHT + 8 * OPTIMIZER)
    assert links["fabric"] == 0
    assert "ep 4 -> 2" in (new / "megatron" / "reshard.sh").read_text()
