"""Peak-memory terms beyond the model states and the Korthikanti activations (issue 15, the memory target).

Each test isolates one term by comparing a runtime profile with the same profile that lacks it, and checks the
bytes against numbers worked out from the model's published sizes; the loss's bytes per logit are checked
against tests/bench/loss_memory.py's measurement of the loss code the runtimes run.
"""

from __future__ import annotations

import sys

import pytest

from benches import load_bench
from conftest import make_job
from models.transformer import build_transformer, gpt
from planner.cost import evaluate
from planner.profile import Loss, LossBytes, RuntimeProfile, load_runtime
from planner.strategy import Strategy

LLAMA3_8B_VOCAB = 128256  # Meta Llama 3 8B config.json vocab_size


def _without_loss_terms(runtime: RuntimeProfile, **loss) -> RuntimeProfile:
    """`runtime` with its loss replaced (the default: Megatron's in-place fp32 logits, 4 bytes kept, no more)."""
    return runtime.model_copy(update={"loss": Loss(**loss)})


def _activations(job, strategy: Strategy, stage: int = -1) -> float:
    return evaluate(job, strategy).memory.per_stage[stage].activations_bytes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads peak resident memory from /proc")
def test_loss_bytes_per_logit_are_the_measured_ones():
    torch = pytest.importorskip("torch")
    if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
        pytest.skip("torch.distributed with gloo is not available")
    bench = load_bench("loss_memory")
    # a projection 8 wide, not the bench's 64: the bytes per logit are the loss's (the projection's inputs are
    # alive before the measurement starts), and CPU's bf16 matmul at width 64 was three quarters of the time
    eager, parallel = bench.run(["eager", "vocab-parallel"], tokens=512, vocab=32768, one_process=True, hidden=8)
    assert "error" not in eager and "error" not in parallel, (eager, parallel)
    # torch's eager cross entropy on bf16 logits: fp32 log-probabilities kept, 12 bytes at the backward
    # (saved log-probabilities + the fp32 gradient in + the fp32 gradient out); vocab-parallel: 16
    for name in ("planner", "torchtitan-eager", "torchtitan-eager-loss"):
        loss = load_runtime(name).loss
        assert loss.whole_vocab.saved == pytest.approx(eager["kept"], abs=0.1), name
        assert loss.whole_vocab.peak == pytest.approx(eager["peak"], abs=0.1), name
    for name in ("torchtitan-eager", "torchtitan-eager-loss"):
        loss = load_runtime(name).loss
        assert loss.vocab_parallel.saved == pytest.approx(parallel["kept"], abs=0.1), name
        assert loss.vocab_parallel.peak == pytest.approx(parallel["peak"], abs=0.1), name


def test_the_eager_loss_adds_its_gradients_of_the_logits_to_the_peak():
    # llama3-8b, one micro-batch of 1 x 8192 tokens per GPU, no recompute: the loss's backward holds 12 bytes per
    # logit where the in-place loss holds the 4 it keeps, so the peak grows by 8 x 8192 x 128256 bytes (8.4 GB)
    job = make_job("llama3-8b", "dgx-h100:1", batch=8, seq=8192)
    strategy = Strategy(zero=3)
    eager = load_runtime("torchtitan-eager")
    grown = _activations(job.on(eager), strategy) - _activations(job.on(_without_loss_terms(eager)), strategy)
    assert grown == pytest.approx(8 * 8192 * LLAMA3_8B_VOCAB, rel=1e-9)
    # tensor parallelism splits the vocabulary, and the vocab-parallel loss holds 16 bytes per local logit
    tp = Strategy(zero=3, tp=8, dp=1)
    grown = _activations(job.on(eager), tp) - _activations(job.on(_without_loss_terms(eager)), tp)
    assert grown == pytest.approx(12 * 8192 * LLAMA3_8B_VOCAB / 8, rel=1e-9)


@pytest.mark.parametrize(("schedule", "vpp", "held"), [("interleaved", 2, 1), ("gpipe", 1, 4), ("1f1b", 1, 1)])
def test_the_last_stage_keeps_the_losses_of_the_micro_batches_between_their_forward_and_backward(schedule, vpp, held):
    # llama3-8b, pp=2 x dp=4, 4 micro-batches of 1 x 4096 tokens: the last (virtual) stage runs each micro-batch's
    # backward right after its forward under 1F1B and interleaving, so it keeps one micro-batch's fp32
    # log-probabilities (4 bytes per logit) even where interleaving keeps 1.5 stages of block activations; GPipe
    # keeps all four
    job = make_job("llama3-8b", "dgx-h100:1", batch=16, seq=4096).on(load_runtime("reference"))
    strategy = Strategy(pp=2, dp=4, vpp=vpp, schedule=schedule)
    none = job.on(_without_loss_terms(job.runtime, whole_vocab=LossBytes(saved=0.0, peak=0.0)))
    kept = _activations(job, strategy) - _activations(none, strategy)
    assert kept == pytest.approx(held * 4 * 4096 * LLAMA3_8B_VOCAB, rel=1e-9)


def test_the_pipeline_schedule_keeps_every_micro_batchs_logits_until_the_step_returns_them():
    # torchtitan before #1922 (the Dec 2024 benchmarks): torch.distributed.pipelining's last stage appends each
    # micro-batch's bf16 logits to output_chunks; 4 micro-batches of 1 x 4096 tokens, 2 bytes per logit
    job = make_job("llama3-8b", "dgx-h100:1", batch=16, seq=4096)
    strategy = Strategy(pp=2, dp=4, zero=3)
    runtime = load_runtime("torchtitan-eager-loss")
    without = runtime.model_copy(update={"loss": runtime.loss.model_copy(update={"pipeline_outputs": 0.0})})
    kept = _activations(job.on(runtime), strategy) - _activations(job.on(without), strategy)
    assert kept == pytest.approx(4 * 2 * 4096 * LLAMA3_8B_VOCAB, rel=1e-9)
    assert _activations(job.on(runtime), strategy, stage=0) == _activations(job.on(without), strategy, stage=0)


def test_native_amp_keeps_a_16_bit_copy_of_every_matmul_weight_until_backward():
    # GPT 2.7B as flash-attention's training runs it (rows 201-204): fp32 weights, every matmul casts its own fp16
    # copy and saves it for backward: 2 bytes per parameter of every projection and of the tied output matrix
    # (the token table), none of the learned positions and of the final LayerNorm
    h, layers, vocab, positions = 2560, 32, 50264, 1024
    model = build_transformer(gpt(name="gpt3-2.7b", num_layers=layers, hidden=h, heads=32, vocab=vocab,
                                  max_positions=positions))
    job = make_job(model, "dgx-a100-80g:1", batch=32, seq=1024, precision="fp16")
    strategy = Strategy(dp=8, mbs=4, zero=1)
    ddp = load_runtime("pytorch-ddp")
    without = ddp.model_copy(update={"kernels": ddp.kernels.model_copy(update={"autocast_weight_copy_bytes": 0.0})})
    copies = _activations(job.on(ddp), strategy) - _activations(job.on(without), strategy)
    assert copies == pytest.approx(2 * (model.params - positions * h - 2 * h), rel=1e-9)


@pytest.mark.parametrize(("strategy", "directions"), [
    (Strategy(pp=4, dp=2, zero=1), [1, 2, 2, 1]),  # the first stage receives gradients only, the last activations
    (Strategy(pp=2, vpp=2, dp=4, zero=1, schedule="interleaved"), [3, 3]),  # two chunks each, less the two ends
])
def test_torch_pipelining_keeps_a_receive_buffer_per_micro_batch_direction_and_chunk(strategy, directions):
    # llama3-8b on 8 H100s, 16 micro-batches of 1 x 4096 tokens: torch.distributed.pipelining allocates each
    # stage's receive buffers for every micro-batch when the schedule starts (stage.py _prepare_forward_infra,
    # _prepare_backward_infra): 4096 x 4096 hidden x 2 bytes (bf16) each, kept for the step
    job = make_job("llama3-8b", "dgx-h100:1", batch=16 * strategy.dp, seq=4096)
    titan = load_runtime("torchtitan")
    per_transfer = titan.model_copy(update={"pipelining": titan.pipelining.model_copy(
        update={"receive_buffers": "per_transfer"})})
    m = 16
    for stage, count in enumerate(directions):
        held = _activations(job.on(titan), strategy, stage) - _activations(job.on(per_transfer), strategy, stage)
        assert held == pytest.approx(count * m * 4096 * 4096 * 2, rel=1e-9), stage
    # Megatron allocates per transfer: nothing held beyond the activations in flight
    assert load_runtime("megatron").pipelining.receive_buffers == "per_transfer"


def test_fsdp2_under_a_pipeline_makes_its_sharded_gradients_after_the_peak():
    # torchtitan, llama3-8b pp=2 x dp=4 zero=1: the schedule defers FSDP2's reduce-scatter to the last
    # micro-batch and zero_grad frees the sharded gradients before the next step, so the peak leaves them out;
    # without pipeline parallelism FSDP2 reduce-scatters every micro-batch and they are alive at the peak
    job = make_job("llama3-8b", "dgx-h100:1", batch=16, seq=4096).on(load_runtime("torchtitan"))
    piped = evaluate(job, Strategy(pp=2, dp=4, zero=1)).memory.per_stage[0]
    parts = piped.weights_bytes + piped.grads_bytes + piped.optimizer_bytes + piped.activations_bytes \
        + piped.buffers_bytes + piped.reserve_bytes
    assert piped.grads_bytes > 0 and piped.peak_bytes == pytest.approx(parts - piped.grads_bytes, rel=1e-12)
    flat = evaluate(job, Strategy(dp=8, zero=1)).memory.per_stage[0]
    assert flat.peak_bytes == pytest.approx(flat.weights_bytes + flat.grads_bytes + flat.optimizer_bytes
                                            + flat.activations_bytes + flat.buffers_bytes + flat.reserve_bytes,
                                            rel=1e-12)


@pytest.mark.parametrize(("name", "seq", "hidden", "blocks", "block_wins"), [
    ("llama3-8b", 4096, 4096, 32, False),  # a 128K vocabulary: the loss's bytes outweigh a block's
    ("gpt3-175b", 2048, 12288, 96, True),  # a 50K vocabulary and 12288-wide blocks: the recomputed block wins
])
def test_a_recomputed_block_is_rematerialised_whole_after_the_loss_freed_its_logits(name, seq, hidden, blocks,
                                                                                    block_wins):
    # Megatron (the model graph's Korthikanti count), one stage, every block recomputed, one micro-batch, tp=1:
    # the forward keeps every block's input (2 x seq x hidden B), the final norm's input and the head's and the
    # loss's bytes; the backward of the last block holds the earlier inputs and the whole block again (its
    # attention's and MLP's saves, the first of which is that block's input: counted once)
    from models import load_model
    job = make_job(name, "dgx-a100-80g:1" if name.startswith("gpt") else "dgx-h100:1", batch=8,
                   seq=seq).on(load_runtime("megatron"))
    model = load_model(name)
    whole = sum(layer.saved_activation_bytes(1, seq) for layer in model.layers[1:3])
    checkpoint = 2 * seq * hidden
    rows = {recompute: _activations(job, Strategy(dp=8, zero=1, recompute=recompute), 0)
            for recompute in ("full", "none")}
    head_and_norm = rows["none"] - blocks * whole  # what no recompute keeps beyond the blocks (with the loss's)
    forward = blocks * checkpoint + head_and_norm
    backward = (blocks - 1) * checkpoint + whole
    assert rows["full"] == pytest.approx(max(forward, backward), rel=1e-9)
    assert (backward > forward) is block_wins


def test_the_planner_runtime_saves_autocasts_copies_only_where_it_runs_autocast():
    # zero 0 runs under torch.autocast (no FSDP2 units), zero >= 1 under FSDP2's MixedPrecisionPolicy; at fp32
    # neither casts
    job = make_job("llama3-8b", "dgx-h100:1", batch=8, seq=4096).on(load_runtime("planner"))
    plain = job.runtime.model_copy(update={"activations": job.runtime.activations.model_copy(
        update={"autocast": None})})
    amp, fsdp = Strategy(tp=8, dp=1, zero=0), Strategy(tp=8, dp=1, zero=1)
    model = load_model_params("llama3-8b")
    assert _activations(job, amp, 0) - _activations(job.on(plain), amp, 0) > 2 * model / 8  # weight copies and more
    assert _activations(job, fsdp, 0) == _activations(job.on(plain), fsdp, 0)
    fp32 = job.runtime.model_copy(update={"activations": job.runtime.activations.model_copy(
        update={"compute_bytes": 4.0})})
    fp32_plain = fp32.model_copy(update={"activations": fp32.activations.model_copy(update={"autocast": None})})
    assert _activations(job.on(fp32), amp, 0) == _activations(job.on(fp32_plain), amp, 0)


def load_model_params(name: str) -> float:
    from models import load_model
    return float(load_model(name).params)


# Llama 3 8B's parameters from its published config.json (hidden 4096, 32 layers, 32 heads / 8 KV heads of 128,
# intermediate 14336, vocab 128256, untied embedding and output layer): 8,030,261,248, Meta's "8.03B"
_H, _KV, _FFN, _LAYERS = 4096, 8 * 128, 14336, 32
LLAMA3_8B_PARAMS = (2 * LLAMA3_8B_VOCAB * _H                                            # embedding + output layer
                    + _LAYERS * (2 * _H * _H + 2 * _H * _KV + 3 * _H * _FFN + 2 * _H)  # q, o; k, v; MLP; 2 norms
                    + _H)                                                                # final norm


@pytest.mark.parametrize("runtime, grad_bytes", [("megatron", 4), ("megatron-bridge", 2)])
def test_main_gradients_are_fp32_in_megatron_lm_and_bf16_in_megatron_bridge(runtime, grad_bytes):
    # Megatron-LM with --bf16 accumulates and reduces gradients in fp32 (arguments.py forces
    # accumulate_allreduce_grads_in_fp32): 4 B per parameter; Megatron-Bridge's performance recipes set
    # ddp.grad_reduce_in_fp32 = False, so megatron-core's grad buffer takes the parameters' bf16: 2 B.  The
    # distributed optimizer (zero 1) shards the optimizer, not the gradient buffer: whole on each of the 8 ranks.
    assert LLAMA3_8B_PARAMS == 8_030_261_248
    job = make_job("llama3-8b", "dgx-h100:1", 8, 8192).on(load_runtime(runtime))
    stage = evaluate(job, Strategy(dp=8, zero=1)).memory.per_stage[0]
    assert stage.grads_bytes == pytest.approx(LLAMA3_8B_PARAMS * grad_bytes, rel=1e-9)
    # weights stay bf16 (2 B) and the optimizer 12 B sharded over 8 under both
    assert stage.weights_bytes == pytest.approx(LLAMA3_8B_PARAMS * 2, rel=1e-9)
    assert stage.optimizer_bytes == pytest.approx(LLAMA3_8B_PARAMS * 12 / 8, rel=1e-9)


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_megatron_bridge_reduces_gradients_in_bf16(precision):
    from planner.cost.comm import grad_reduce_bytes

    # the bytes each gradient element puts on the wire: the grad buffer's dtype, fp32 (4) in Megatron-LM with
    # bf16 or fp8 compute, bf16 (2) in Bridge's recipes (FP8 keeps bf16 parameters and gradients)
    job = make_job("llama3-8b", "dgx-h100:1", 8, 8192, precision=precision)
    assert grad_reduce_bytes(job.on(load_runtime("megatron"))) == 4
    assert grad_reduce_bytes(job.on(load_runtime("megatron-bridge"))) == 2
    # Megatron FSDP (zero 3) under Bridge shards the bf16 gradient buffer over the 8 data-parallel ranks
    sharded = evaluate(job.on(load_runtime("megatron-bridge")), Strategy(dp=8, zero=3)).memory.per_stage[0]
    assert sharded.grads_bytes == pytest.approx(LLAMA3_8B_PARAMS * 2 / 8, rel=1e-9)


def test_a_chunked_loss_keeps_no_logits_and_one_chunks_share_of_its_peak():
    # torchtitan's ChunkedCELoss (num_chunks 8) runs the head and the loss chunk by chunk, forward and backward,
    # before the decoder's backward: nothing per logit is kept, and at its peak one chunk's logits are alive.  Over
    # one micro-batch of 8,192 tokens at Llama 3 8B's vocabulary, torchtitan's compiled loss (2 bytes per logit
    # kept, 4 at its peak) keeps 2 x 8192 x 128256 bytes unchunked, none chunked, and its peak adds 4 / 8 per logit.
    from models.graph import LayerKind
    from planner.cost.memory import saved_bytes, transient_bytes
    from planner.strategy import parse_strategy
    runtime = load_runtime("torchtitan")
    plain = make_job("llama3-8b", "dgx-h100:1", batch=8, seq=8192).on(runtime)
    chunked = plain.on(runtime.model_copy(update={"loss": runtime.loss.model_copy(update={"chunks": 8})}))
    by_tokens = plain.on(runtime.model_copy(update={"loss": runtime.loss.model_copy(update={"chunk_tokens": 2048})}))
    strategy = parse_strategy("zero=3")
    head = next(layer for layer in plain.model.layers if layer.kind == LayerKind.HEAD)
    logits = 8192 * LLAMA3_8B_VOCAB
    kept = saved_bytes(head, plain, strategy, "none") - saved_bytes(head, chunked, strategy, "none")
    assert kept == pytest.approx(2.0 * logits, rel=1e-9)
    assert transient_bytes(head, plain, strategy) == pytest.approx(2.0 * logits, rel=1e-9)
    assert transient_bytes(head, chunked, strategy) == pytest.approx(4.0 / 8 * logits, rel=1e-9)
    # chunks of 2,048 tokens over the micro-batch's 8,192: a quarter alive at once
    assert transient_bytes(head, by_tokens, strategy) == pytest.approx(4.0 / 4 * logits, rel=1e-9)
    # a chunk as long as the micro-batch is no chunking at all
    whole = runtime.loss.model_copy(update={"chunk_tokens": 8192})
    assert whole.bytes(1, 8192.0) == runtime.loss.whole_vocab


def test_the_bench_reads_a_rows_chunked_loss():
    bench = load_bench("published_runs")
    notes = {"notes": "Loss 'ChunkedCELoss', PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"}
    assert bench.loss_chunking(notes) == {"chunks": 8}  # torchtitan's default num_chunks
    assert bench.loss_chunking({"notes": "Selective activation checkpointing; Eight loss chunks;"}) == {"chunks": 8}
    assert bench.loss_chunking({"notes": "ChunkedCELoss (4 chunks)"}) == {"chunks": 4}
    assert bench.loss_chunking({"notes": "Chunked loss (8,192-token chunks) is used"}) == {"chunk_tokens": 8192}
    assert bench.loss_chunking({"notes": "loss compiled, no chunking stated"}) == {}


def test_torchtitan_moe_layers_save_what_its_code_saves():
    # tests/bench/moe_memory.py measures torchtitan 0.2.2's MoE at Qwen3-30B-A3B's widths (hidden 2048, top 8 of 128
    # experts of width 768): per routed token the input (2 B x hidden), four expert-width tensors (4 x 2 B x 768),
    # the outputs in fp32 (4 B x hidden), the top-k score and id (4 + 8 B) and two sorted index vectors (16 B);
    # per token the router's fp32 scores (4 B x 128) and, beside the measurement, the layer's input kept by the gate
    from models.graph import LayerKind
    from planner.cost.memory import saved_bytes
    from planner.strategy import parse_strategy
    tokens = 4096
    job = make_job("qwen3-30b-a3b", "dgx-h100:1", batch=8, seq=tokens).on(load_runtime("torchtitan"))
    layer = next(layer for layer in job.model.layers if layer.kind == LayerKind.MOE)
    strategy = parse_strategy("zero=3")
    per_routed = 2 * 2048 + 4 * 2 * 768 + 4 * 2048 + 4 + 8 + 16
    per_token = 8 * per_routed + 4 * 128 + 2 * 2048
    assert saved_bytes(layer, job, strategy, "none") == pytest.approx(tokens * per_token, rel=1e-9)
    # per-op SAC keeps none of it (no _grouped_mm in its save list, the gate force-recomputed, no shared experts)
    assert saved_bytes(layer, job, strategy, "selective") == 0.0
    assert saved_bytes(layer, job, strategy, "full") == 0.0
