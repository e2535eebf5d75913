"""The runtime profile's activations section (`RuntimeProfile.activations`), without running the runtime.

planner's own runtime lists what its eager model saves for backward, tensor by tensor
(hardware/data/runtimes/planner.yaml); tests/bench/memory_fidelity.py derives the same bytes in closed
form from the runtime's autograd graph (`runtime_saved_bytes`, which tests/test_memory_fidelity.py and the
bench hold to the measurement, ratio 1.0000) and predicts with the profile at fp32, as the bench runs it.
Here the profile's per-layer bytes must equal that formula on every layer kind under tp, sequence
parallelism, cp and full recompute; the bf16 bytes follow from the per-tensor dtypes counted by hand; and a
runtime without the section keeps the model graph's (Korthikanti) count.
"""

from __future__ import annotations

import math

import pytest

from benches import load_bench
from hardware import load_cluster
from models import load_model
from models.graph import LayerKind
from models.zoo import get_entry
from planner.cost import evaluate
from planner.cost.memory import autocast_copy_bytes, logits_per_microbatch, saved_bytes
from planner.job import Job
from planner.profile import load_runtime
from planner.strategy import parse_strategy

KINDS = {LayerKind.EMBEDDING: "embedding", LayerKind.ATTENTION: "attention", LayerKind.MLP: "mlp",
         LayerKind.NORM: "final_norm", LayerKind.HEAD: "head"}
SEQ = 64


def _job(runtime) -> Job:
    return Job(model=load_model("tiny-llama"), cluster=load_cluster("cpu:1"), global_batch=8, seq_len=SEQ).on(runtime)


@pytest.mark.parametrize("spec", ["dp=4", "tp=2,dp=2", "tp=2,dp=2,sp=off", "cp=2,dp=2", "cp=2,tp=2",
                                  "tp=4,mbs=2", "dp=4,recompute=full", "tp=2,dp=2,recompute=full"])
def test_planner_profile_saves_what_the_runtime_formula_says(spec):
    bench = load_bench("memory_fidelity")
    job = _job(bench.fp32_runtime())
    cfg = get_entry("tiny-llama").config
    s = parse_strategy(spec)
    for layer in job.model.layers:
        kind = KINDS[layer.kind]
        # full recompute checkpoints the blocks; the embedding, final norm and head run as they are
        recompute = "full" if s.recompute == "full" and layer.block is not None else "none"
        got = saved_bytes(layer, job, s, recompute)
        want = bench.runtime_saved_bytes(
            kind, hidden=cfg.hidden, ffn=cfg.ffn, heads=cfg.heads, head_dim=cfg.head_dim, vocab=cfg.vocab,
            mbs=s.mbs, seq_len=SEQ, tp=s.tp, sp=s.sequence_parallel, cp=s.cp,
            checkpointed=recompute == "full")
        assert math.isclose(got, want, rel_tol=1e-12), (spec, layer.name, got, want)


def test_bf16_saves_keep_the_norm_statistics_and_logsumexp_in_fp32():
    """tiny-llama attention at tp=1, bf16: RMSNorm's upcast input, x * rstd and rstd (2h + 1) and SDPA's
    logsumexp (a per token) in fp32; the linears' input (h), Q, the expanded K and V and the output
    (4 a d) in bf16, as FSDP2's mixed precision runs them (zero >= 1).  MLP: the norm in fp32, its output h and
    four ffn-wide tensors in bf16.  Under torch.autocast (zero 0) each of wk, wv and w3 casts the norm's output
    again, apply_rope casts cos and sin rows for q and for k (2 d per row), and every matmul saves a 2-byte copy
    of its weight (measured: tests/bench/memory_fidelity.py --precision bf16)."""
    job = _job(load_runtime("planner"))
    cfg = get_entry("tiny-llama").config
    h, a, d, f = cfg.hidden, cfg.heads, cfg.head_dim, cfg.ffn
    s = parse_strategy("dp=4,zero=1")
    by_kind = {layer.kind: layer for layer in job.model.layers}
    attention_layer, mlp_layer = by_kind[LayerKind.ATTENTION], by_kind[LayerKind.MLP]
    attention = saved_bytes(attention_layer, job, s, "none")
    assert attention == pytest.approx(SEQ * (4 * (2 * h + 1) + 4 * a + 2 * (h + 4 * a * d)), rel=1e-12)
    mlp = saved_bytes(mlp_layer, job, s, "none")
    assert mlp == pytest.approx(SEQ * (4 * (2 * h + 1) + 2 * (h + 4 * f)), rel=1e-12)
    amp = parse_strategy("dp=4,zero=0")
    assert saved_bytes(attention_layer, job, amp, "none") == pytest.approx(
        attention + SEQ * 2 * (2 * h + 2 * d) + 2 * attention_layer.params, rel=1e-12)
    assert saved_bytes(mlp_layer, job, amp, "none") == pytest.approx(mlp + SEQ * 2 * h + 2 * mlp_layer.params,
                                                                     rel=1e-12)


def test_the_planner_head_keeps_every_logit_of_the_vocabulary_on_each_tp_rank():
    """The runtime gathers the logits to Replicate() before its loss, so tp does not divide them."""
    job = _job(load_runtime("planner"))
    head = next(layer for layer in job.model.layers if layer.kind == LayerKind.HEAD)
    vocab = get_entry("tiny-llama").config.vocab
    for tp in (1, 2, 4):
        assert logits_per_microbatch(head, job, parse_strategy(f"tp={tp}")) == SEQ * vocab


@pytest.mark.parametrize("runtime", ["reference", "megatron", "torchtitan", "deepspeed", "pytorch-ddp"])
def test_a_runtime_without_the_section_keeps_the_graph_count(runtime):
    profile = load_runtime(runtime)
    # torchtitan's section lists its MoE layers only (tests/bench/moe_memory.py): attention and MLP keep the graph's
    assert profile.activations is None or not {LayerKind.ATTENTION, LayerKind.MLP} & set(profile.activations.layers)
    job = _job(profile)
    s = parse_strategy("tp=2,dp=2")
    for layer in job.model.layers:
        if layer.kind in (LayerKind.ATTENTION, LayerKind.MLP):
            want = layer.saved_activation_bytes(s.mbs, SEQ, tp=2, sequence_parallel=True, flash_attention=job.flash)
            want += autocast_copy_bytes(layer, job, s)  # native AMP's weight copies (pytorch-ddp), as before
            assert saved_bytes(layer, job, s, "none") == pytest.approx(want, rel=1e-12), (runtime, layer.name)


def test_planner_keeps_the_vocab_parallel_embedding_gradient_whole_under_tp_without_fsdp():
    """tiny-llama tp=2 dp=2: zero 0 holds fp32 gradients of every parameter a rank holds, plus the other half
    of the embedding table (vocab x hidden / 2 x 4 bytes, measured by tests/bench/memory_fidelity.py:
    395.5k = 362.8k + 32.8k); FSDP2 (zero 1) reduce-scatters it into its shard like every other gradient."""
    job = _job(load_runtime("planner"))
    cfg = get_entry("tiny-llama").config
    whole = evaluate(job, parse_strategy("tp=2,dp=2,zero=0")).memory.per_stage[0]
    assert whole.grads_bytes == pytest.approx(whole.weights_bytes + 4 * cfg.vocab * cfg.hidden / 2, rel=1e-12)
    sharded = evaluate(job, parse_strategy("tp=2,dp=2,zero=1")).memory.per_stage[0]
    assert sharded.grads_bytes == pytest.approx(sharded.weights_bytes, rel=1e-12)
