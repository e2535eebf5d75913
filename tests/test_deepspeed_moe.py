"""DeepSpeed MoE under the deepspeed runtime (issue 27): what DeepSpeed's MoE layer refuses, how its
capacity-padded dispatch is priced, and the `moe` section the deepspeed target hands the trainer.

Expected values come from DeepSpeed itself (deepspeed.moe.layer.MoE's signature and defaults, its
DeepSpeedConfig) or are worked out by hand from sharded_moe.py's capacity rule
C = max(ceil(tokens / experts * capacity_factor * k), min_capacity)."""

from __future__ import annotations

import inspect
import json
import os

import pytest
from click.testing import CliRunner

os.environ.setdefault("DS_ACCELERATOR", "cpu")
moe_layer = pytest.importorskip("deepspeed.moe.layer")

from hardware import load_catalog, load_cluster  # noqa: E402
from models import load_model  # noqa: E402
from planner.cli import cli  # noqa: E402
from planner.cost.evaluate import evaluate, refusals  # noqa: E402
from planner.job import Job  # noqa: E402
from planner.profile import load_runtime  # noqa: E402
from planner.strategy import parse_strategy  # noqa: E402
from planner.validation import check_strategy  # noqa: E402

DEEPSPEED = load_runtime("deepspeed")


def _job(model: str = "mixtral-8x7b", routing: str = "learned") -> Job:
    return Job(model=load_model(model), cluster=load_cluster("dgx-h100:4"), global_batch=256, seq_len=4096,
               runtime=DEEPSPEED, moe_routing=routing)


def test_capacity_defaults_are_deepspeeds_own():
    capacity = DEEPSPEED.expert_capacity
    assert capacity is not None
    defaults = inspect.signature(moe_layer.MoE).parameters
    assert capacity.capacity_factor == defaults["capacity_factor"].default
    assert capacity.min_capacity == defaults["min_capacity"].default
    assert defaults["drop_tokens"].default is True  # what the profile prices: padding and dropping


@pytest.mark.parametrize("tokens, k, experts, ratio", [
    (4096, 2, 8, 1.0),  # C = ceil(4096 / 8 * 1.0 * 2) = 1024, the mean: no padding
    (10, 2, 8, 1.6),  # C = ceil(2.5) = 3 < min_capacity 4: 4 x 8 slots for 20 routed tokens
    (100, 1, 64, 2.56),  # C = ceil(1.5625) = 2 < 4: 4 x 64 slots for 100 tokens
])
def test_capacity_ratio_by_hand(tokens, k, experts, ratio):
    assert DEEPSPEED.expert_capacity.load_ratio(tokens, k, experts) == pytest.approx(ratio)


def test_padded_buffer_replaces_the_busiest_rank():
    """Dropless (the profile without expert_capacity) waits on the busiest rank, constants.yaml's
    moe_routing_imbalance times the mean; DeepSpeed's padded 4096-token micro-batch moves exactly the mean."""
    strategy = parse_strategy("ep=8,mbs=1,zero=2,recompute=full")
    dropless = DEEPSPEED.model_copy(update={"expert_capacity": None})
    padded = evaluate(_job(), strategy).breakdown.ep_comm_s
    busiest = evaluate(_job().on(dropless), strategy).breakdown.ep_comm_s
    assert padded > 0
    assert busiest == pytest.approx(padded * load_catalog().constant("moe_routing_imbalance"), rel=1e-9)
    balanced = evaluate(_job(routing="balanced").on(dropless), strategy).breakdown.ep_comm_s
    assert balanced == pytest.approx(padded, rel=1e-9)


@pytest.mark.parametrize("model, spec, refusal", [
    ("mixtral-8x7b", "ep=8,zero=3", "zero=3 with mixture-of-experts layers"),
    ("mixtral-8x7b", "ep=8,pp=2,zero=1", "pipeline parallelism with mixture-of-experts layers"),
    ("mixtral-8x7b", "ep=8,zero=1,ep_overlap=on", "ep_overlap"),
    ("deepseek-v3", "ep=8,zero=1", "mixture-of-experts models with shared experts"),
])
def test_what_deepspeeds_moe_refuses(model, spec, refusal):
    job = _job(model)
    assert refusal in refusals(job, check_strategy(job, parse_strategy(spec)))


def test_what_deepspeeds_moe_runs():
    job = _job()
    for spec in ("ep=8,zero=1", "ep=2,zero=2", "ep=1,zero=0", "ep=4,zero=1,offload=optimizer"):
        assert refusals(job, check_strategy(job, parse_strategy(spec))) == [], spec


def test_compile_writes_deepspeeds_moe_arguments(tmp_path):
    out = tmp_path / "plan"
    result = CliRunner().invoke(cli, ["compile", "mixtral-8x7b", "dgx-h100:4", "-b", "256", "-s", "4096",
                                      "--target", "deepspeed", "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = json.loads((out / "plan.json").read_text())
    strategy = parse_strategy(plan["strategy_spec"])
    assert strategy.pp == 1 and strategy.zero <= 2
    pipeline = json.loads((out / "deepspeed" / "pipeline.json").read_text())
    moe = pipeline["moe"]
    # every key is one of MoE's own keyword arguments (bind raises on any other)
    inspect.signature(moe_layer.MoE).bind(hidden_size=4096, expert=None, **moe["layer"])
    assert moe["layer"]["num_experts"] == 8 and moe["layer"]["k"] == 2
    assert moe["layer"]["ep_size"] == strategy.ep == pipeline["expert_parallel_size"]
    assert 8 % strategy.ep == 0 and strategy.data_parallel % strategy.ep == 0
    assert moe["blocks"] == list(range(32)) and moe["expert_ffn"] == 14336
    assert '--pipeline "$here/pipeline.json"' in (out / "deepspeed" / "launch.sh").read_text()
    assert "## Mixture of experts" in (out / "deepspeed" / "README.md").read_text()


def test_deepspeed_2021_stays_dense():
    """The SC21 profile runs Megatron-LM v1.1.5's dense GPT: no MoE layer to run."""
    assert not load_runtime("deepspeed-2021").space.moe


def test_padded_slots_add_expert_activations():
    """tiny-mixtral (hidden 64, 4 experts of width 128, top-2) at 8 tokens per micro-batch: C = ceil(8 / 4 x 2) =
    4 = min_capacity, so 4 x 4 = 16 slots for 16 routed tokens (no padding); at 4 tokens C = max(2, 4) = 4, 16
    slots for 8 routed tokens: the experts save twice the graph's routed bytes.  Each visited expert saves
    gate, up and product, 3 x 128 x 2 bytes per token (models/transformer.py _ffn_act_split)."""
    from planner.cost.memory import padded_expert_bytes

    model = load_model("tiny-mixtral")
    layer = next(layer for layer in model.layers if layer.moe is not None)
    job = Job(model=model, cluster=load_cluster("cpu:1"), global_batch=8, seq_len=8, runtime=DEEPSPEED)
    assert padded_expert_bytes(layer, job, parse_strategy("mbs=1")) == 0.0
    short = job.model_copy(update={"seq_len": 4})
    assert padded_expert_bytes(layer, short, parse_strategy("mbs=1")) == pytest.approx(4 * 2 * 3 * 128 * 2)
    dropless = short.on(DEEPSPEED.model_copy(update={"expert_capacity": None}))
    assert padded_expert_bytes(layer, dropless, parse_strategy("mbs=1")) == 0.0


def test_a_model_deepspeed_cannot_run_is_searched_elsewhere():
    """--target deepspeed: Mixtral is searched under the deepspeed runtime; DeepSeek-V3 (a shared expert) under
    Megatron's, with a note, as a runtime without MoE sends any MoE model there."""
    from planner.emit import primary_runtime

    assert primary_runtime(("deepspeed",), True) == ("deepspeed", None)
    name, note = primary_runtime(("deepspeed",), True, shared_experts=True)
    assert name == "megatron"
    assert note == ("searched under the megatron runtime: deepspeed cannot run mixture-of-experts models with "
                    "shared experts")
    assert primary_runtime(("torchtitan",), True) == (
        "megatron", "searched under the megatron runtime: torchtitan cannot run mixture-of-experts models")


def test_search_space_under_deepspeed_for_an_moe_job():
    """narrow_to_runtime: ZeRO 0-2, no pipelined stage at all (so no pp > 1), no expert folding or all-to-all
    overlap; a dense job keeps DeepSpeed's ZeRO-3 and its pipelines."""
    from planner.search.space import SpaceOptions, global_configs, limits_note, narrow_to_runtime

    moe = _job("tiny-mixtral").model_copy(update={"cluster": load_cluster("cpu:1"), "global_batch": 8,
                                                  "seq_len": 64})
    space = narrow_to_runtime(SpaceOptions(), DEEPSPEED, moe)
    assert space.zero_stages == (0, 1, 2) and space.zero_stages_pipelined == ()
    assert not space.ep_overlap and not space.expert_folding and space.max_tp == 1
    assert "no pipeline parallelism" in limits_note(space)
    configs = list(global_configs(moe, space))
    assert configs and {s.pp for s in configs} == {1} and max(s.zero for s in configs) == 2
    assert {s.ep for s in configs} == {1, 2, 4}  # the 4 experts over the 8 ranks' divisors
    dense = moe.model_copy(update={"model": load_model("tiny-llama")})
    assert 3 in narrow_to_runtime(SpaceOptions(), DEEPSPEED, dense).zero_stages
