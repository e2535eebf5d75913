"""The runtime profiles' memory formulas against the frameworks' own calculators.

hardware/data/runtimes/*.yaml say, per framework, which per-parameter states a GPU
holds and how sharded weights are gathered; `planner.cost.evaluate` turns that into
bytes.  Here those bytes are compared with numbers computed without the cost model:

* DeepSpeed's own estimators (`estimate_zero2_model_states_mem_needs`,
  `estimate_zero3_model_states_mem_needs`), run from the installed package's source;
* Megatron-LM's `megatron/training/theoretical_memory_usage.py`, re-stated below;
* megatron-core's `TransformerConfig` (and its local attention), where installed, for
  the megatron profile's config-level claims;
* FSDP2's state at rest (torchtitan and planner's own runtime), counted by hand.

Parameter counts come from each model's published configuration (`Dense` below), not
from `models/`, and every expected value is computed here; the cost model is only
asked for its per-stage report.  docs/cost-model.md ("Runtime profiles against the
frameworks' calculators") lists the measured numbers.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from hardware import load_cluster
from models import load_model
from models.transformer import build_transformer, gpt
from planner.cost import evaluate
from planner.job import Job
from planner.profile import load_runtime
from planner.strategy import parse_strategy

REL = 1e-9


# --------------------------------------------------------------------------- independent parameter counts


@dataclass(frozen=True)
class Dense:
    """A dense decoder's sizes as its model card / paper gives them."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    gated: bool  # SwiGLU: three matrices
    norm_size: int  # 1: RMSNorm (weight), 2: LayerNorm (weight and bias)
    untied: bool  # separate output matrix
    biases: bool = False  # biases on every linear layer but the output head
    positions: int = 0  # rows of a learned position table

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    # Megatron-LM's own terms (theoretical_memory_usage.py: no biases, no position table)
    def attention(self) -> float:
        q = self.heads * self.head_dim
        return 2 * self.hidden * self.hidden * (1 + self.kv_heads / self.heads) * (q / self.hidden)

    def mlp(self) -> float:
        return 2 * self.hidden * self.ffn * (1.5 if self.gated else 1.0)

    def norms(self) -> float:  # the two per-block norms
        return 2 * self.hidden * self.norm_size

    def final_norm(self) -> float:
        return self.norm_size * self.hidden

    def embedding(self) -> float:
        return self.hidden * self.vocab

    # what the file leaves out: tp-split biases (QKV, fc1) and replicated ones (projection, fc2) per block
    def split_biases(self) -> float:
        return (self.heads + 2 * self.kv_heads) * self.head_dim + self.ffn if self.biases else 0

    def replicated_biases(self) -> float:
        return 2 * self.hidden if self.biases else 0

    def total(self) -> float:
        block = self.attention() + self.mlp() + self.norms() + self.split_biases() + self.replicated_biases()
        emb = self.embedding() * (2 if self.untied else 1)
        return self.layers * block + self.final_norm() + emb + self.positions * self.hidden

    def largest_layer(self) -> float:
        """The largest of the embedding, one block's attention (with its norm) and one block's MLP (with its
        norm): the cost model's gather unit.  DeepSpeed's `model_to_params` takes the largest module's own
        parameters instead; for the models used here both are the vocab x hidden table."""
        half_norm = self.norms() / 2
        q = self.heads * self.head_dim
        attn_biases = q + 2 * self.kv_heads * self.head_dim + self.hidden if self.biases else 0
        attn = self.attention() + half_norm + attn_biases
        mlp = self.mlp() + half_norm + (self.ffn + self.hidden if self.biases else 0)
        return max(self.embedding() + self.positions * self.hidden, attn, mlp)


# Meta-Llama-3-8B config.json (huggingface.co/meta-llama/Meta-Llama-3-8B): 8.03B parameters
LLAMA3_8B = Dense(layers=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, gated=True,
                  norm_size=1, untied=True)
# GPT-3 175B (Brown et al. 2020, Table 2.1), GPT-2 vocabulary, tied head, learned positions, biases
GPT3_175B = Dense(layers=96, hidden=12288, heads=96, kv_heads=96, ffn=4 * 12288, vocab=50257, gated=False,
                  norm_size=2, untied=False, biases=True, positions=2048)


def _job(model: str, cluster: str, batch: int, seq: int) -> Job:
    return Job(model=load_model(model), cluster=load_cluster(cluster), global_batch=batch, seq_len=seq)


def _stages(job: Job, spec: str, runtime: str):
    est = evaluate(job, parse_strategy(spec), load_runtime(runtime))
    return est, est.memory.per_stage


def _states(r) -> float:
    return r.weights_bytes + r.grads_bytes + r.optimizer_bytes


def test_independent_counts_match_the_zoo():
    """The hand counts above are the models the cost model builds (guards the counts, not the cost model)."""
    assert math.isclose(LLAMA3_8B.total(), load_model("llama3-8b").params, rel_tol=REL)
    assert math.isclose(GPT3_175B.total(), load_model("gpt3-175b").params, rel_tol=REL)
    assert LLAMA3_8B.total() == 8_030_261_248  # Meta-Llama-3-8B's published count


# --------------------------------------------------------------------------- 1. DeepSpeed


def _deepspeed_function(module: str, name: str):
    """`name` from the installed DeepSpeed's `module`, compiled from that file's own source.

    The estimators are pure arithmetic; executing their definitions from the installed file
    avoids `import deepspeed` (about 7 s: torch, triton, op builders) and runs exactly the
    code DeepSpeed ships."""
    try:
        spec = importlib.util.find_spec("deepspeed")
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        pytest.skip("deepspeed is not installed")
    path = Path(spec.origin).parent.joinpath(*module.split(".")).with_suffix(".py")
    tree = ast.parse(path.read_text(), filename=str(path))
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    assert node is not None, f"{name} not found in {path}"
    namespace: dict = {}
    exec(compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec"), namespace)
    return namespace[name]


@pytest.fixture(scope="module")
def ds_estimators():
    zero2 = _deepspeed_function("runtime.zero.stage_1_and_2", "estimate_zero2_model_states_mem_needs")
    zero3 = _deepspeed_function("runtime.zero.stage3", "estimate_zero3_model_states_mem_needs")
    return importlib.metadata.version("deepspeed"), zero2, zero3


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_deepspeed_zero_1_2_3_against_its_estimators(ds_estimators, nodes):
    """llama3-8b, tp=1, pp=1 on `nodes` DGX H100s (d = 8 x nodes), DeepSpeed profile.

    DeepSpeed since PR #5099 (April 2024; 0.19.8 installed) estimates ZeRO-2 without offload as
    E2 = 2P + 18P/d (16-bit weights whole; 16-bit and fp32 gradients, fp32 master and Adam
    moments over d) and ZeRO-3 as E3 = 4L + 18P/d (L: largest layer, gathered 16-bit
    weight and gradient).  The profile models DeepSpeed as implemented:

    * ZeRO-2 = E2 exactly (stage_1_and_2.py keeps this rank's 16-bit gradient partition,
      averaged_gradients, and the fp32 gradient of its optimizer partition).
    * ZeRO-1 = E2 + 2P - 2P/d: stage 1 keeps every 16-bit .grad until the step (the
      estimator is ZeRO-2's; before PR #5099 it was 4P + 16P/d, which ZeRO-1 matched).
    * ZeRO-3 = E3 + 2P/d + 4L: the 16-bit gradient partition (stage3.py
      grad_partitions_flat_buffer) the estimator leaves out, and the gathered buffer holds
      the running and the prefetched layer, 2L x (2 + 2) B, where the estimator counts one.

    Measured (P = 8.030e9, L = 5.253e8; GB = 1e9; ours vs estimator, model states: weights +
    gradients + optimizer + gathered buffers):
      d=8:  ZeRO-1 48.18 vs 34.13, ZeRO-2 34.13 vs 34.13, ZeRO-3 24.28 vs 20.17 GB
      d=16: ZeRO-1 40.15 vs 25.09, ZeRO-2 25.09 vs 25.09, ZeRO-3 14.24 vs 11.14 GB
      d=32: ZeRO-1 36.14 vs 20.58, ZeRO-2 20.58 vs 20.58, ZeRO-3  9.22 vs  6.62 GB
    """
    _, zero2, zero3 = ds_estimators
    job = _job("llama3-8b", f"dgx-h100:{nodes}", 64, 4096)
    d = 8 * nodes
    P, L = LLAMA3_8B.total(), LLAMA3_8B.largest_layer()
    for zero in (1, 2, 3):
        est, (r,) = _stages(job, f"tp=1,pp=1,zero={zero}", "deepspeed")
        assert est.strategy["dp"] == d
        assert math.isclose(r.params, P, rel_tol=REL)  # parameters per GPU before ZeRO (pp=1, tp=1)
        ours = _states(r) + r.buffers_bytes
        if zero < 3:
            _, estimate = zero2(total_params=P, num_gpus_per_node=8, num_nodes=nodes, cpu_offload=False)
            expected = estimate + (2 * P - 2 * P / d if zero == 1 else 0.0)
            assert r.buffers_bytes == 0.0
        else:
            _, estimate, largest = zero3(total_params=P, largest_layer_params=L, num_gpus_per_node=8,
                                         num_nodes=nodes, cpu_offload=False, cpu_offload_params=False)
            assert math.isclose(r.buffers_bytes, 2 * largest, rel_tol=REL)  # 2 layers x (2 + 2) B = 2 x 4L
            expected = estimate + 2 * P / d + 4 * L
        assert math.isclose(ours, expected, rel_tol=REL), (zero, d, ours / 1e9, estimate / 1e9)


@pytest.mark.parametrize("offload", ["optimizer", "all"])
@pytest.mark.parametrize("nodes", [1, 2])
def test_deepspeed_zero3_offload_against_its_estimator(ds_estimators, offload, nodes):
    """ZeRO-3 with offload_optimizer (offload=optimizer) and offload_param too (offload=all), llama3-8b.

    Estimator, GPU: 4L + 2P/d (16-bit weight partition) with the optimizer offloaded, 4L with
    the parameters too; host, per node with additional_buffer_factor=1: 16P/nodes and
    18P/nodes (zero_init).  Ours: HBM = estimator + 4L (the prefetched layer, as without
    offload).  The 16-bit gradient partition moves with the optimizer (with offload_optimizer,
    stage3.py sets self.device to the CPU and allocates grad_partitions_flat_buffer there), so
    host = estimator + 2P/nodes: the estimator leaves that partition out, as without offload.

    Measured, HBM: d=8 offload=optimizer ours 6.21 vs 4.11 GB, offload=all 4.20 vs 2.10 GB;
    d=16 5.21 vs 3.11 GB and 4.20 vs 2.10 GB.  Host per node: d=8 144.5 vs 128.5 GB and 160.6 vs
    144.5 GB; d=16 72.3 vs 64.2 GB and 80.3 vs 72.3 GB.
    """
    _, _, zero3 = ds_estimators
    job = _job("llama3-8b", f"dgx-h100:{nodes}", 64, 4096)
    P, L = LLAMA3_8B.total(), LLAMA3_8B.largest_layer()
    est, (r,) = _stages(job, f"tp=1,pp=1,zero=3,offload={offload},offload_device=cpu", "deepspeed")
    cpu, gpu, _ = zero3(total_params=P, largest_layer_params=L, num_gpus_per_node=8, num_nodes=nodes,
                        cpu_offload=True, cpu_offload_params=offload == "all", zero_init=True,
                        additional_buffer_factor=1.0)
    ours = _states(r) + r.buffers_bytes
    assert math.isclose(ours, gpu + 4 * L, rel_tol=REL), (ours / 1e9, gpu / 1e9)
    host = est.memory.host.dram_bytes
    assert math.isclose(host, cpu + 2 * P / nodes, rel_tol=REL), (host / 1e9, cpu / 1e9)


# --------------------------------------------------------------------------- 2. Megatron-LM


def megatron_bytes_per_param(distributed_optimizer: bool, dp: int) -> float:
    """bf16 weights 2, fp32 main gradients 4, fp32 main weights 4, Adam 8: 18 B; the distributed
    optimizer shards the last 12 over dp (theoretical_memory_usage.py, num_bytes_per_parameter)."""
    return 6 + 12 / dp if distributed_optimizer else 18.0


def megatron_most_loaded_params(c: Dense, tp: int, pp: int) -> float:
    """Megatron-LM's "most loaded model shard" (compute_weight_and_optimizer_memory, dense models):
    1/pp of the blocks and the embedding, tp-split, plus the replicated norms; the final norm is counted
    in the block, so 1/pp of it; an untied output matrix only when pp = 1."""
    split = (c.attention() + c.mlp()) * c.layers / pp + c.embedding()
    replicated = (c.norms() * c.layers + c.final_norm()) / pp
    params = split / tp + replicated
    if c.untied and pp == 1:
        params += c.embedding() / tp
    return params


def first_stage_params(c: Dense, tp: int, pp: int) -> float:
    """What stage 0 really holds: Megatron's count with the final norm on the last stage (pp > 1), plus what
    the file leaves out: biases (QKV and fc1 biases split, projection and fc2 biases replicated) and the
    learned position table (replicated, on the first stage).  A tied head is not on stage 0 when pp > 1."""
    params = megatron_most_loaded_params(c, tp, pp)
    if pp > 1:
        params -= c.final_norm() / pp
    params += c.layers / pp * (c.split_biases() / tp + c.replicated_biases()) + c.positions * c.hidden
    return params


def megatron_activation_bytes(*, s: int, b: int, h: int, ffn: int, layers: int, vocab: int, tp: int, pp: int,
                              m: int) -> float:
    """Megatron-LM compute_activation_memory (sequence parallel + selective recompute), first stage.

    Per block s b h (18 + 4 ffn / h) (Korthikanti et al. 2022, Table 2: 34 sbh at ffn = 4h); the first
    1F1B stage holds pp micro-batches of layers/pp blocks, i.e. `layers` blocks' worth; plus, per micro-batch
    in flight, the token ids (8 B each) and the embedding dropout mask (1 B per element); scaled by
    min(1, m / pp) when fewer micro-batches than stages; with pp = 1 also the output layer's input and the
    fp32 logits, 4 s b h (1 + v / h); all divided by tp (tensor and sequence parallelism).  No interleaving
    here (the file's vpp factor is not restated)."""
    total = s * b * h * (18 + 4 * ffn / h) * layers
    total += 8 * s * b * pp + s * b * h * pp
    if pp > 1:
        total *= min(1.0, m / pp)
    else:
        total += 4 * s * b * h * (1 + vocab / h)
    return total / tp


@pytest.mark.parametrize("model,dense,cluster,pp", [
    ("llama3-8b", LLAMA3_8B, "dgx-h100:2", 1),
    ("llama3-8b", LLAMA3_8B, "dgx-h100:8", 4),
    ("gpt3-175b", GPT3_175B, "dgx-h100:2", 1),
    ("gpt3-175b", GPT3_175B, "dgx-h100:8", 4),
])
def test_megatron_weights_and_optimizer_bytes(model, dense, cluster, pp):
    """Stage 0's weights + gradients + optimizer = 18 B (zero=0) or 6 + 12/dp B (zero=1, the distributed
    optimizer) per parameter, exactly, tp=8, dp=2.

    What is compared: stage 0's parameters per GPU (`params` of the report) against Megatron-LM's
    most-loaded-shard count (theoretical_memory_usage.py) corrected for what that file simplifies: its
    final norm is 1/pp on every stage (ours: whole, on the last stage); it leaves out biases and the learned
    position table (GPT-3 has both).  The embedding is counted once on stage 0 whether tied or not; an
    untied head adds v h / tp on stage 0 only with pp = 1 (Megatron likewise); a tied head with pp > 1 is a
    second copy on the last stage (planner's `tied_params`; Megatron's file does not report that stage).
    Vocabularies are unpadded on both sides (Megatron pads v to a multiple of 128 tp; the cost model does
    not: 128256 -> 129024 for llama3 at tp=8, +0.04% of stage 0).

    Measured (parameters per GPU of stage 0): llama3-8b pp=1 1.00402e9 (Megatron's file: equal), pp=4
    2.83836e8 (file: +1024, its 1/pp share of the final norm); gpt3-175b pp=1 2.18538e10 (file 2.18252e10,
    -0.13%: biases and positions), pp=4 5.54021e9 (file 5.51420e9, -0.47%).  Bytes = 18.000 (zero=0) and
    12.000 (zero=1, dp=2) per parameter to 1e-9, e.g. llama3-8b pp=1 18.07 / 12.05 GB.
    """
    tp, dp = 8, 2
    job = _job(model, cluster, 64, 2048)
    params = first_stage_params(dense, tp, pp)
    for zero in (0, 1):
        est, stages = _stages(job, f"tp={tp},pp={pp},sp=on,zero={zero}", "megatron")
        assert est.strategy["dp"] == dp
        r = stages[0]
        assert math.isclose(r.params, params, rel_tol=REL), (r.params, params)
        expected = megatron_bytes_per_param(zero == 1, dp) * params
        assert math.isclose(_states(r), expected, rel_tol=REL), (_states(r) / 1e9, expected / 1e9)
        assert r.buffers_bytes == 0.0  # whole 16-bit weights: nothing gathered
    # Megatron's own count is within its simplifications of the real stage
    file_count = megatron_most_loaded_params(dense, tp, pp)
    leftout = dense.layers / pp * (dense.split_biases() / tp + dense.replicated_biases()) \
        + dense.positions * dense.hidden + dense.final_norm()
    assert abs(params - file_count) <= leftout


@pytest.mark.parametrize("pp,batch", [(1, 64), (4, 64), (4, 2)])
def test_megatron_activations_gpt3(pp, batch):
    """Stage 0's activations for GPT-3 175B (dropout on, as Megatron trains it), s=2048, mbs=1, tp=8,
    sequence parallel, selective recompute, on 32 H100s (dp = 4 / pp), megatron profile.

    Both sides count Korthikanti's 34 sbh per block (ours: attention 13 sbh incl. its norm, MLP 21 sbh;
    all split by SP) and the same 1F1B in-flight count min(pp, m).  They differ only at the ends:
    Megatron counts the int64 token ids (8 s b per micro-batch in flight, / tp) which the cost model leaves
    out; with pp = 1 Megatron counts 4 s b h / tp for the output layer's input where the cost model keeps
    the final norm's input whole (2 s b h: the final norm is not a tensor-parallel layer, though under
    Megatron's SP it runs on a sequence shard) plus the head's input 2 s b h / tp.  So
    |ours - Megatron| <= 8 s b pp / tp + 2 s b h + 4 s b h / tp, asserted, and below 1%.

    Measured: pp=1 (m=16) ours 10.379 GB vs Megatron 10.335 GB (+44 MB, +0.43%); pp=4 (m=64) 10.280 GB
    vs 10.280 GB (-8 KB: the token ids); pp=4 with m=2 (fewer micro-batches than stages) 5.140 GB vs
    5.140 GB (-4 KB).  (With Megatron's padded vocabulary, 51200 at tp=8, pp=1 is +0.42%.)
    """
    job = Job(model=build_transformer(gpt(name="gpt3-175b", num_layers=96, hidden=12288, heads=96,
                                          max_positions=2048, dropout=True)),
              cluster=load_cluster("dgx-h100:4"), global_batch=batch, seq_len=2048)
    tp, s, b, h = 8, 2048, 1, 12288
    est, stages = _stages(job, f"tp={tp},pp={pp},mbs={b},sp=on,recompute=selective,zero=1", "megatron")
    m = est.micro_batches
    assert m == batch // (32 // (tp * pp))
    theirs = megatron_activation_bytes(s=s, b=b, h=h, ffn=4 * h, layers=96, vocab=50257, tp=tp, pp=pp, m=m)
    ours = stages[0].activations_bytes
    bound = 8 * s * b * pp / tp + 2 * s * b * h + 4 * s * b * h / tp
    assert abs(ours - theirs) <= bound, (ours / 1e9, theirs / 1e9)
    assert abs(ours - theirs) / theirs < 0.01, (ours / 1e9, theirs / 1e9)


# --------------------------------------------------------------------------- 3. megatron-core config checks


@pytest.fixture(scope="module")
def mcore():
    """megatron-core's TransformerConfig and local DotProductAttention (skip when not installed).

    megatron.core wraps its fusions in torch.compile at import time, which imports torch._dynamo
    and inductor (about 4 s on CPU); these checks build configs only, so the import runs with
    torch.compile as a pass-through (megatron's jit_fuser stays a no-op in this process; no other
    test module imports megatron.core)."""
    torch = pytest.importorskip("torch")

    def _eager(model=None, **_):
        return model if model is not None else (lambda fn: fn)

    with mock.patch.object(torch, "compile", _eager):
        pytest.importorskip("megatron.core")
        from megatron.core.transformer.dot_product_attention import DotProductAttention
        from megatron.core.transformer.enums import AttnMaskType
        from megatron.core.transformer.transformer_config import TransformerConfig
    return torch, TransformerConfig, DotProductAttention, AttnMaskType


def _accepts(make) -> bool:
    try:
        make()
    except (ValueError, AssertionError):
        return False
    return True


@pytest.mark.parametrize("split,vpp", [
    ((8, 8, 8, 8), 1),
    ((9, 8, 8, 7), 1),  # only the ends differ: --decoder-first/last-pipeline-num-layers
    ((6, 8, 8, 10), 1),
    ((4, 8, 8, 12), 1),
    ((8, 8, 8, 8), 2),
    ((9, 8, 8, 7), 2),  # ends not divisible by vpp: the explicit layout (issue #27)
    ((10, 8, 8, 6), 2),
    ((15, 16, 16, 15), 4),
])
def test_megatron_core_pipeline_splits(mcore, split, vpp):
    """split: ends (only the first and last stage may differ) as megatron-core checks it: TransformerConfig
    with num_layers_in_first/last_pipeline_stage, or with vpp > 1 and uneven chunks the explicit
    pipeline_model_parallel_layout planner's emitter writes (planner.chunks), accepts a split exactly when
    the profile can express it."""
    from planner.chunks import even_chunks, layout_string

    torch, TransformerConfig, _, _ = mcore
    strategy = parse_strategy(f"tp=2,pp={len(split)},vpp={vpp}")
    profile_ok = not load_runtime("megatron").cannot_express(strategy, split_blocks=split)
    middle = split[1]
    config = dict(num_layers=sum(split), hidden_size=256, num_attention_heads=8, tensor_model_parallel_size=2,
                  sequence_parallel=True, pipeline_model_parallel_size=len(split), pipeline_dtype=torch.bfloat16,
                  virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None)
    if vpp > 1 and not even_chunks(split, vpp):
        config["pipeline_model_parallel_layout"] = layout_string(split, vpp)
    else:
        if split[0] != middle:
            config["num_layers_in_first_pipeline_stage"] = split[0]
        if split[-1] != middle:
            config["num_layers_in_last_pipeline_stage"] = split[-1]
    assert _accepts(lambda: TransformerConfig(**config)) == profile_ok, (split, vpp, profile_ok)


@pytest.mark.parametrize("split", [(8, 9, 8, 7), (8, 8, 9, 7), (7, 9, 8, 8)])
def test_megatron_core_rejects_uneven_middle_stages(mcore, split):
    """The profile refuses an uneven middle stage, and the first/last arguments cannot say it: with the
    first and last counts set, megatron-core divides the remaining layers evenly over the middle stages
    and refuses when they do not divide (as here; when they do, it builds an even middle, not the split
    asked for).  (megatron-core 0.16 also has pipeline_model_parallel_layout,
    which takes any split, e.g. 'Et*8|t*9|t*8|t*7L'; the profile describes core_r0.12, which has only the
    first/last arguments.)"""
    torch, TransformerConfig, _, _ = mcore
    assert load_runtime("megatron").cannot_express(parse_strategy("tp=2,pp=4"), split_blocks=split)
    make = lambda: TransformerConfig(  # noqa: E731
        num_layers=sum(split), hidden_size=256, num_attention_heads=8, tensor_model_parallel_size=2,
        sequence_parallel=True, pipeline_model_parallel_size=4, pipeline_dtype=torch.bfloat16,
        num_layers_in_first_pipeline_stage=split[0], num_layers_in_last_pipeline_stage=split[-1])
    assert not _accepts(make)


def test_megatron_core_context_parallel_needs_te_attention(mcore):
    """context_parallel: true, context_parallel_needs_flash: true.  TransformerConfig accepts cp=2 (with tp=2,
    SP and selective recompute); megatron-core's own (non-Transformer-Engine) DotProductAttention refuses
    cp > 1 ("Context parallelism is only supported by TEDotProductAttention!") and builds with cp = 1."""
    _, TransformerConfig, DotProductAttention, AttnMaskType = mcore
    profile = load_runtime("megatron")
    cp = parse_strategy("tp=2,cp=2,sp=on,recompute=selective")
    assert not profile.cannot_express(cp, flash_attention=True)
    assert profile.cannot_express(cp, flash_attention=False) == ["context parallelism without fused attention"]

    config = TransformerConfig(num_layers=4, hidden_size=256, num_attention_heads=8, tensor_model_parallel_size=2,
                               context_parallel_size=2, sequence_parallel=True, recompute_granularity="selective")
    assert config.context_parallel_size == 2 and config.recompute_modules == ["core_attn"]

    class _Group:
        def size(self):
            return 1

    class _Groups:
        tp = _Group()

    def local_attention(cp: int):
        cfg = TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, context_parallel_size=cp)
        return DotProductAttention(cfg, layer_number=1, attn_mask_type=AttnMaskType.causal,
                                   attention_type="self", pg_collection=_Groups())

    assert _accepts(lambda: local_attention(1))
    with pytest.raises(AssertionError, match="TEDotProductAttention"):
        local_attention(2)


def test_megatron_core_recompute_settings(mcore):
    """selective_recompute: true and recompute_layers: uniform.  megatron-core takes selective recompute
    without a layer count, and full recompute only with a method and one recompute_num_layers (an int for
    every stage: 'block' recomputes the first k blocks of each stage, the profile's recompute_layers=k); it
    refuses full recompute without them and selective recompute with a count."""
    torch, TransformerConfig, _, _ = mcore
    profile = load_runtime("megatron")
    assert not profile.cannot_express(parse_strategy("tp=2,pp=4,recompute=selective"))
    assert not profile.cannot_express(parse_strategy("tp=2,pp=4,recompute=full,recompute_layers=2"))
    assert profile.cannot_express(parse_strategy("tp=2,pp=4,recompute=full,recompute_layers=2/3/2/2"))
    base = dict(num_layers=32, hidden_size=256, num_attention_heads=8, tensor_model_parallel_size=2,
                sequence_parallel=True, pipeline_model_parallel_size=4, pipeline_dtype=torch.bfloat16)
    assert _accepts(lambda: TransformerConfig(**base, recompute_granularity="selective"))
    assert _accepts(lambda: TransformerConfig(**base, recompute_granularity="full", recompute_method="block",
                                              recompute_num_layers=2))
    assert not _accepts(lambda: TransformerConfig(**base, recompute_granularity="full"))
    assert not _accepts(lambda: TransformerConfig(**base, recompute_granularity="selective", recompute_num_layers=2))


# --------------------------------------------------------------------------- 4. FSDP2 (torchtitan, planner)


@pytest.mark.parametrize("runtime", ["torchtitan", "planner"])
def test_fsdp2_states_at_rest(runtime):
    """FSDP2 keeps fp32 parameter shards (no separate master copy), fp32 gradient shards and Adam's two
    fp32 moments: 16 B per parameter over the sharding group for zero >= 1, whole (DDP) for zero 0.
    llama3-8b, tp=1, pp=1, 16 H100s (d = 16).  Measured: 8.03 GB for zero 1-3, 128.48 GB for zero 0;
    buffers torchtitan 17.11 GB (zero 1/2), 4.20 GB (zero 3); planner 18.16 GB (zero 1/2: the stage and the
    head's gradient) and 4.20 GB (zero 3).

    Gathered buffers at pp=1 (torchtitan's layer units): zero 3 (reshard after forward) the running and
    the prefetched layer, 2 L x (gathered weight + unsharded gradient bytes), bf16 2 + 2 (mixed precision
    param_dtype); zero 1/2 (no reshard after forward) the stage's weights through a micro-batch, one
    layer's gradients at a time: P x w + L x g.  planner's runtime (2 + 2 as well) has block units and a root
    unit (embedding, final norm, head) that FSDP2 keeps gathered and reduce-scatters after the whole
    backward (measured: tests/bench/memory_fidelity.py): zero 3 gathers the root and, for a block's backward,
    that block B; zero 1/2 the stage.  The head's and the final norm's unsharded gradients are held
    throughout, with either a block's (weights and gradients under zero 3) or, at the end, the embedding's."""
    job = _job("llama3-8b", "dgx-h100:2", 64, 4096)
    c = LLAMA3_8B
    P, L, d = c.total(), c.largest_layer(), 16
    w = g = 2.0  # both gather bf16 copies (MixedPrecisionPolicy param_dtype) and make bf16 unsharded gradients
    block = c.attention() + c.mlp() + c.norms()
    root = 2 * c.embedding() + c.final_norm()  # embedding, final norm and the untied head
    head_norm = c.embedding() + c.final_norm()
    for zero in (0, 1, 2, 3):
        _, (r,) = _stages(job, f"tp=1,pp=1,zero={zero}", runtime)
        expected = 16 * P / (d if zero >= 1 else 1)
        assert math.isclose(_states(r), expected, rel_tol=REL), (runtime, zero, _states(r) / 1e9)
        assert math.isclose(r.weights_bytes, 4 * P / (d if zero else 1), rel_tol=REL)
        if runtime == "torchtitan":
            buffers = {0: 0.0, 1: P * w + L * g, 2: P * w + L * g, 3: 2 * L * (w + g)}[zero]
        else:
            stage_held = P * w + max(block, c.embedding()) * g  # zero 1/2: the stage stays gathered
            per_block = root * w + max(block * (w + g), c.embedding() * g)  # zero 3: the root and one block
            buffers = {0: 0.0, 1: stage_held, 2: stage_held, 3: per_block}[zero] + (zero > 0) * head_norm * g
        assert math.isclose(r.buffers_bytes, buffers, rel_tol=REL), (runtime, zero, r.buffers_bytes / 1e9)


def test_torchtitan_pipelined_fsdp_holds_the_stage_for_the_step():
    """torchtitan with pp > 1: torch.distributed.pipelining turns off reshard-after-backward and gradient
    sync until the last micro-batch (stage.py backward_maybe_with_nosync / perform_reduce_grad), so a
    pipelined FSDP2 stage holds its gathered bf16 weights for the whole step, and FSDP2 accumulates the
    unsharded gradients in its fp32 reduce dtype while sync is off (_fsdp_param.py
    to_accumulated_grad_if_needed): buffers = P_stage x (2 + 4) for zero 1-3, with the bf16 gradient of a block
    and of the root unit's head and final norm made before it is added to the accumulator (measured on the
    planner runtime's identical FSDP2 units: tests/bench/memory_fidelity.py --precision bf16).  pp=1 keeps the per-layer
    buffer, 2 L (2 + 2), for zero 3.  llama3-8b, pp=2 on 16 H100s (d = 8): stage 0 = embedding + 16 blocks,
    stage 1 = 16 blocks + final norm + head (4.015e9 parameters each).  Measured, zero 1-3: 24.09 GB of
    buffers per stage (pp=1, zero 3: 4.20 GB), states 8.03 GB."""
    job = _job("llama3-8b", "dgx-h100:2", 64, 4096)
    c = LLAMA3_8B
    block = c.attention() + c.mlp() + c.norms()
    per_stage = [c.embedding() + 16 * block, 16 * block + c.final_norm() + c.embedding()]
    running = [block, block + c.final_norm() + c.embedding()]  # a block's bf16 gradient, and the head's and norm's
    for zero in (1, 2, 3):
        est, stages = _stages(job, f"tp=1,pp=2,zero={zero}", "torchtitan")
        assert est.strategy["dp"] == 8
        for r, P, unit in zip(stages, per_stage, running):
            assert math.isclose(r.params, P, rel_tol=REL)
            assert math.isclose(r.buffers_bytes, P * (2 + 4) + unit * 2, rel_tol=REL), (zero, r.stage,
                                                                                          r.buffers_bytes / 1e9)
            assert math.isclose(_states(r), 16 * P / 8, rel_tol=REL)
    _, (flat,) = _stages(job, "tp=1,pp=1,zero=3", "torchtitan")
    assert math.isclose(flat.buffers_bytes, 2 * c.largest_layer() * (2 + 2), rel_tol=REL)
