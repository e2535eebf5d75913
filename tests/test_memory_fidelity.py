"""Memory ground truth (issue 15, item 1): the planner runtime's measured memory per rank vs the cost model.

Two tiny-llama plans on cpu:1 (4 ranks) run 2 steps under `python -m planner.runtime.train --measure-memory`
(planner/runtime/memory_probe.py measures the last one; tests/bench/memory_fidelity.py builds, runs and
predicts, and prints the whole grid).  The states at rest agree and are held to the issue's bar (3%); the
components that do not agree yet are held to the factor documented below, so the test fails when the
runtime or the cost model changes either side:

* activations per micro-batch: measured / predicted is the runtime's own per-layer formula
  (memory_fidelity.runtime_saved_bytes, fp32 with eager RMSNorm, SiLU, GQA-expanded K/V, SDPA's
  logsumexp, all-gathered norm outputs under sequence parallelism, logits gathered to the whole vocab)
  over the cost model's (Korthikanti et al., 16-bit): the measurement equals the runtime formula exactly;
* FSDP2's gathered buffers: zero 3 measures (root unit + one block) weights and (head + final norm + one
  block) unsharded gradients where the profile's `layers` policy charges 2 x the largest layer; under
  pipeline parallelism zero 1/2 keep the stage gathered for the step as the profile says (exact);
* micro-batches in flight: exactly the cost model's 1F1B count.
"""

from __future__ import annotations


import pytest

torch = pytest.importorskip("torch")

from ports import MULTIPROCESS  # noqa: E402
from benches import load_bench

BAR = 0.03  # the bar: each component within 3%


def _bench():
    return load_bench("memory_fidelity")


def _gloo_ok() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_gloo_available()


# measured / predicted of what does not agree yet, per (spec, stage); see the module docstring and
# tests/bench/memory_fidelity.py for the derivation
KNOWN = {
    # tp=2 with sequence parallelism (the default), FSDP2 zero 3 over dp=2, m=4 micro-batches of 1 x 64 tokens
    ("tp=2,dp=2,zero=3", 0): {"act/mb": 2.933, "buffers": 1.251},
    # 1F1B over 2 stages, FSDP2 zero 1 over dp=2: the stage stays gathered for the step (buffers agree)
    ("pp=2,dp=2,zero=1", 0): {"act/mb": 2.784, "buffers": 1.000},
    ("pp=2,dp=2,zero=1", 1): {"act/mb": 2.400, "buffers": 1.000},
}
IN_FLIGHT = {("pp=2,dp=2,zero=1", 0): 2.0, ("pp=2,dp=2,zero=1", 1): 1.0, ("tp=2,dp=2,zero=3", 0): 1.0}


def _zero3_buffers(config, tp: int, dp: int) -> float:
    """FSDP2 zero 3's gathered peak on one rank (tp splits all but the norms): the root unit's weights
    (embedding, final norm, head: FSDP2 does not reshard the root after forward) and one block's, with
    the head and final norm's unsharded gradients (reduce-scattered with the root, after the last block)
    and one block's, 4 bytes each."""
    h, f, v = config.hidden, config.ffn, config.vocab
    qkvo = h * config.heads * config.head_dim * 2 + h * config.kv_heads * config.head_dim * 2
    block = (qkvo + 3 * h * f) / tp + 2 * h
    head_norm = v * h / tp + h
    root = v * h / tp + head_norm
    return 4.0 * (root + block + head_norm + block)


@MULTIPROCESS
@pytest.mark.skipif(not _gloo_ok(), reason="torch.distributed with gloo is not available")
@pytest.mark.parametrize("spec", ["tp=2,dp=2,zero=3", "pp=2,dp=2,zero=1"])
def test_measured_memory_matches_the_cost_model_or_its_known_factor(tmp_path, spec):
    bench = _bench()
    job, plan = bench.build_plan("tiny-llama", 8, 64, spec)
    assert plan.job.num_gpus == 4 and plan.strategy.pipeline_schedule == "1f1b"
    measured = bench.run_plan(plan, tmp_path, steps=2, timeout=180)
    assert sorted(measured) == [0, 1, 2, 3]
    predicted = bench.predict(job, plan)
    config = bench.transformer_config("tiny-llama")
    s = plan.strategy
    for rank, mem in measured.items():
        stage = bench.stage_of(plan, rank)
        got, want = bench.measured_components(mem), predicted[stage]
        where = (spec, rank, stage)
        # the states at rest agree: the bar
        for component in ("weights", "grads", "optimizer"):
            assert got[component] == pytest.approx(want[component], rel=BAR), (where, component)
        assert got["weights"] == want["weights"]  # exactly the plan's parameters, fp32
        # AdamW's moments (8 bytes per parameter) and one fp32 `step` per parameter tensor
        tensors = sum(1 for _ in plan_param_tensors(plan, stage))
        assert got["optimizer"] == want["optimizer"] + 4 * tensors, where
        # micro-batches in flight: the 1F1B count
        assert got["in-flight"] == IN_FLIGHT[(spec, stage)], where
        # activations: the runtime's own formula, exactly; the cost model by the known factor
        formula = bench.runtime_stage_saved(plan, job, stage, config)
        assert mem["saved_per_microbatch"] == pytest.approx(sum(formula.values()), rel=1e-3), where
        known = KNOWN[(spec, stage)]
        assert got["act/mb"] / want["act/mb"] == pytest.approx(known["act/mb"], rel=BAR), where
        assert got["activations"] == pytest.approx(got["act/mb"] * IN_FLIGHT[(spec, stage)], rel=1e-3), where
        # FSDP2's gathered weights and unsharded gradients at their peak
        assert got["buffers"] / want["buffers"] == pytest.approx(known["buffers"], rel=BAR), where
        if s.zero == 3 and s.pp == 1:
            assert got["buffers"] == pytest.approx(_zero3_buffers(config, s.tp, s.dp), rel=1e-3), where
        else:  # held for the step: the stage's weights and gradients, unsharded
            assert got["buffers"] == pytest.approx(plan.stages[stage].params_per_gpu * 8, rel=1e-3), where


def plan_param_tensors(plan, stage: int):
    """The parameter tensors of `stage` (each has its own AdamW `step`): 9 per block, embedding, norm, head."""
    first, last = plan.stages[stage].blocks
    yield from range(9 * (last - first + 1))
    if stage == 0:
        yield "tok_embeddings"
    if stage == len(plan.stages) - 1:
        yield from ("norm", "output")
