"""Three recipe families the cost model used to refuse (#27): torchtitan's per-op selective activation
checkpointing and every-k-th-block checkpointing, Megatron FSDP (zero 2/3 under the megatron runtime), and
FSDP1 with tensor parallelism.  Expected values are counted by hand from what the frameworks save and shard
(the profile sections name the code); the emitters' files are checked by the frameworks' own parsers in
tests/test_emit_torchtitan.py and tests/test_megatron_lm_parser.py."""

from __future__ import annotations

import pytest

from conftest import make_job
from models import build_transformer
from models.graph import LayerKind
from models.transformer import llama
from planner.api import estimate, load_job
from planner.cost import evaluate
from planner.cost.memory import saved_bytes
from planner.cost.stage import kept_before_last_recompute
from planner.errors import PlannerInputError
from planner.profile import load_runtime
from planner.strategy import Strategy, parse_strategy

DONE_WHEN = [  # issue #27's commands
    ("llama3-8b", "dgx-h100:1", 8, 8192, "torchtitan", "zero=3,recompute=selective"),
    ("llama3-8b", "dgx-h100:1", 128, 8192, "megatron", "zero=3"),
    ("llama3-70b", "dgx-a100-80g:16", 1024, 4096, "pytorch-fsdp", "tp=8,zero=3,recompute=full"),
]


def _tiny(layers: int = 2):
    """hidden 64, 4 query heads of 16, 2 key/value heads (kv width 32), SwiGLU ffn 128."""
    return build_transformer(llama(name="tiny-sac", num_layers=layers, hidden=64, heads=4, kv_heads=2, ffn=128,
                                   vocab=256))


@pytest.mark.parametrize("model, cluster, batch, seq, runtime, spec", DONE_WHEN)
def test_the_issues_commands_score(model, cluster, batch, seq, runtime, spec):
    job = load_job(model, cluster, batch=batch, seq_len=seq)
    result = estimate(job, spec, runtime=runtime)
    assert result.memory.fits and result.step_time_s > 0


def test_op_sac_keeps_the_hand_count_of_a_tiny_llama():
    """Per token of one block, bf16 (2 B) and fp32 (4 B): the block input (64 x 2), wq's output (64 x 2), wv's
    (32 x 2), SDPA's output (64 x 2) and logsumexp (4 heads x 4), w1's output (128 x 2), w2's (64 x 2):
    848 B.  Under tp=2 with sequence parallelism: the input 64, wq 64, wv 32, SDPA 64 + 8, wo's reduce-scatter
    64, w1 128, w2's whole-width partial sum 128, its reduce-scatter 64: 616 B."""
    job = make_job(_tiny(), "dgx-h100:1", batch=8, seq=32).on(load_runtime("torchtitan"))
    block = [layer for layer in job.model.layers if layer.block == 0]
    assert [layer.kind for layer in block] == [LayerKind.ATTENTION, LayerKind.MLP]
    for strategy, per_token in ((Strategy(), 848), (Strategy(tp=2), 616)):
        kept = sum(saved_bytes(layer, job, strategy, "selective") for layer in block)
        assert kept == per_token * 32


def test_op_sac_sits_between_no_recompute_and_full_recompute():
    job = load_job("llama3-8b", "dgx-h100:1", batch=8, seq_len=8192, runtime="torchtitan")
    runs = {mode: estimate(job, f"zero=3,recompute={mode}") for mode in ("none", "selective", "full")}
    acts = {mode: r.memory.per_stage[0].activations_bytes for mode, r in runs.items()}
    assert acts["full"] < acts["selective"] < acts["none"]
    # it redoes 3 of a block's 7 GEMMs (wk, wo, w3) and the element-wise work, not the attention core
    assert 0 < runs["selective"].breakdown.recompute_s < runs["full"].breakdown.recompute_s
    assert runs["none"].step_time_s < runs["selective"].step_time_s < runs["full"].step_time_s


@pytest.mark.parametrize("runtime, spec", [("torchtitan", "zero=3"), ("pytorch-fsdp", "zero=3"),
                                           ("pytorch-fsdp", "tp=8,zero=3")])
def test_every_kth_block_costs_between_none_and_full(runtime, spec):
    job = load_job("llama3-70b", "dgx-a100-80g:16", batch=1024, seq_len=4096, runtime=runtime)
    runs = [estimate(job, f"{spec},recompute={mode}") for mode in ("none", "full,recompute_every=2", "full")]
    acts = [r.memory.per_stage[0].activations_bytes for r in runs]
    assert acts[0] > acts[1] > acts[2]
    # 40 of the 80 identical blocks recompute: half of full recompute's seconds
    assert runs[1].breakdown.recompute_s == pytest.approx(runs[2].breakdown.recompute_s / 2, rel=1e-9)
    assert runs[0].step_time_s < runs[1].step_time_s < runs[2].step_time_s


def test_every_kth_block_peak_holds_the_blocks_before_the_last_recomputed_one():
    """Five blocks, every 2nd recomputed: blocks 2 and 4 (counted from 1).  When the backward recomputes
    block 4, blocks 1 and 3 still hold everything they saved (block 5's are freed): two blocks' saves."""
    job = make_job(_tiny(5), "dgx-h100:1", batch=8, seq=32).on(load_runtime("torchtitan"))
    strategy = Strategy(dp=8, recompute="full", recompute_every=2)
    blocks = tuple(range(5))
    modes = [(layer, strategy.layer_recompute(layer.block, 0, blocks)) for layer in job.model.layers]
    assert [b for b in blocks if any(m == "full" for layer, m in modes if layer.block == b)] == [1, 3]
    one_block = sum(saved_bytes(layer, job, strategy, "none") for layer in job.model.layers if layer.block == 0)
    assert kept_before_last_recompute(modes, job, strategy) == 2 * one_block
    first_two = evaluate(job, strategy.model_copy(update={"recompute_every": None, "recompute_layers": (2,)}))
    spread = evaluate(job, strategy)
    assert spread.memory.per_stage[0].activations_bytes >= first_two.memory.per_stage[0].activations_bytes


def test_megatron_fsdp_shards_what_its_buffers_shard():
    """optim_grads_params over 8 ranks: bf16 weights 2/8, fp32 main gradients 4/8, fp32 main weights and Adam
    moments 12/8 bytes per parameter; optim_grads (zero 2) keeps the weights whole."""
    job = load_job("llama3-8b", "dgx-h100:1", batch=128, seq_len=8192, runtime="megatron")
    params = job.model.params
    for zero, weights in ((3, 2 / 8), (2, 2.0)):
        stage = estimate(job, f"zero={zero}").memory.per_stage[0]
        assert stage.weights_bytes == pytest.approx(params * weights, rel=1e-12)
        assert stage.grads_bytes == pytest.approx(params * 4 / 8, rel=1e-12)
        assert stage.optimizer_bytes == pytest.approx(params * 12 / 8, rel=1e-12)
    assert estimate(job, "zero=3").memory.per_stage[0].buffers_bytes > 0  # each layer gathered for compute
    assert estimate(job, "zero=2").memory.per_stage[0].buffers_bytes == 0


def test_fsdp1_with_tensor_parallelism_shards_over_both():
    """tp=8 x FSDP over 16: each rank's fp32 shard holds 1/128 of the weights (the norms, replicated over tp,
    are under 0.01% of llama3-70b)."""
    job = load_job("llama3-70b", "dgx-a100-80g:16", batch=1024, seq_len=4096, runtime="pytorch-fsdp")
    result = estimate(job, "tp=8,zero=3,recompute=full")
    assert result.memory.per_stage[0].weights_bytes == pytest.approx(job.model.params * 4 / 128, rel=1e-3)
    assert result.breakdown.tp_comm_s > 0


@pytest.mark.parametrize("runtime, spec, refusal", [
    ("megatron", "zero=3,pp=2", "zero=3 with pipeline parallelism"),
    ("megatron", "recompute=full,recompute_every=2", "recompute_every=2"),
    ("pytorch-fsdp", "zero=3,recompute=selective", "recompute=selective"),
])
def test_what_the_frameworks_still_cannot_run_is_refused(runtime, spec, refusal):
    job = load_job("llama3-8b", "dgx-h100:2", batch=64, seq_len=4096)
    with pytest.raises(PlannerInputError, match=refusal):
        estimate(job, spec, runtime=runtime)


@pytest.mark.parametrize("spec, message", [
    ("recompute_every=2", "recompute_every needs recompute=full"),
    ("recompute=full,recompute_every=2,recompute_layers=3", "give one"),
])
def test_recompute_every_is_checked(spec, message):
    with pytest.raises(PlannerInputError, match=message):
        parse_strategy(spec)
    assert parse_strategy("recompute=full,recompute_every=3").spec().count("recompute_every=3") == 1


def test_the_search_tries_torchtitans_op_sac_under_flash_attention():
    """Megatron's selective recompute saves nothing under flash attention, so the search leaves it out; torchtitan's
    per-op policy keeps less than a block saves, so its configurations include it."""
    from planner.search.space import SpaceOptions, global_configs, narrow_to_runtime

    job = load_job("llama3-8b", "dgx-h100:1", batch=8, seq_len=8192)
    for runtime, tried in (("torchtitan", {"none", "selective"}), ("megatron", {"none"})):
        on = job.on(load_runtime(runtime))
        space = narrow_to_runtime(SpaceOptions(), on.runtime, on)
        # the base modes (every k-th block recomputed is a family of its own: tests/test_recompute_every_search.py)
        assert {c.recompute for c in global_configs(on, space) if c.recompute_every is None} == tried
